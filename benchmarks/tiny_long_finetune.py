"""Short fine-tunes of the embedded model's shipped weights for long rollouts (docs/models.md).

    python benchmarks/tiny_long_finetune.py --variant own-context --out /tmp/own.safetensors
    python benchmarks/tiny_quality.py --weights /tmp/own.safetensors --num-chunks 128 --seeds 0,1

Each variant runs 600 steps (``--steps``) at 3e-4 (20 warm-up, cosine) from ``tiny.safetensors``
on clips cut anywhere in 16-chunk videos (``max_offset`` 12: a long rollout meets the bounce off
the wall the shape started from every ~9 chunks, which 8-chunk videos never reach):

- ``long-clips``: that alone (``train`` with data seed 200);
- ``ctx-noise``: and context noise up to 0.4 instead of 0.2;
- ``own-context``: and the context copy is the model's own one-step x0 prediction of each chunk
  noised to ``t ~ U(0.25, 0.5)`` (teacher-forced, no gradient), then context-noised as usual, so
  training sees context with the model's own errors, as a rollout's cache holds, against clean
  targets (seeds 300 and 301);
- ``sampled-context``: as ``own-context``, but each context chunk is sampled as generation makes
  it (``train.sampled_context``: 4 Euler steps from noise, given the true previous chunks at
  context noise 0.1; a clip's first chunk stays the truth, having no context to be sampled
  from): the cache's errors of one generated chunk, not of a one-step prediction (600 steps:
  1,844 s on one thread). This is stage 3 of ``train.RECIPE`` (1200 steps), here with the
  seeds 300 and 301 it was measured with; the shipped ``tiny-long.safetensors`` is the
  recipe's, seeded 200 and 201 from seed 0.

Measured (docs/models.md): ``sampled-context`` is the one that keeps the fp32 reference valid for
longer than the shipped weights by more than the noise of 40 videos; with ``--steps 1200`` it
keeps 90% valid after 64 chunks and 87.5% after 128 (the shipped default weights: 77.5% and 55%).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from jbkv_cli.models.tiny.model import TinyDiT
from jbkv_cli.models.tiny.train import RECIPE, train
from jbkv_cli.models.tiny.weights_io import load_weights, save_weights

LONG = replace(RECIPE[2], steps=600, context="true")  # stage 3's schedule, teacher-forced
VARIANTS = ("long-clips", "ctx-noise", "own-context", "sampled-context")


@torch.no_grad()
def one_step(model: TinyDiT, b: dict, gen: torch.Generator) -> torch.Tensor:
    """Each chunk's x0 predicted in one step from the truth noised to ``t ~ U(0.25, 0.5)``."""
    x0 = b["x0"]
    t = 0.25 + 0.25 * torch.rand(x0.shape[:2], generator=gen)
    noised = (1 - t[..., None, None]) * x0 + t[..., None, None] * torch.randn(
        x0.shape, generator=gen
    )
    return model.forward_train(noised, None, t, None, b["words"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=LONG.steps)
    args = ap.parse_args()
    init = load_weights()
    tc = replace(LONG, steps=args.steps, threads=args.threads)
    start = time.time()
    if args.variant == "own-context":
        tc = replace(tc, context="one-step")
        model, _ = train(init.cfg, tc, seed=300, log_every=50, init=init, context_fn=one_step)
    elif args.variant == "sampled-context":
        tc = replace(tc, context="sampled")
        model, _ = train(init.cfg, tc, seed=300, log_every=50, init=init)
    else:
        tc = replace(tc, ctx_noise_max=0.4 if args.variant == "ctx-noise" else tc.ctx_noise_max)
        model, _ = train(init.cfg, tc, seed=200, log_every=50, init=init)
    seconds = round(time.time() - start, 1)
    save_weights(
        model, args.out, {"variant": args.variant, "steps": args.steps, "seconds": seconds}
    )
    print(f"wrote {args.out} ({args.variant}, {seconds} s)")


if __name__ == "__main__":
    main()
