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
  it (4 Euler steps from noise, given the true previous chunks at context noise 0.1; a clip's
  first chunk stays the truth, having no context to be sampled from): the cache's errors of one
  generated chunk, not of a one-step prediction (600 steps: 1,844 s on one thread).

None is shipped (numbers in docs/models.md). ``sampled-context`` is the one that keeps the fp32
reference valid for longer than the shipped weights by more than the noise of 40 videos; with
``--steps 1200`` it keeps 90% valid after 64 chunks and 87.5% after 128 (the shipped weights:
77.5% and 55%).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import torch

from jbkv_cli.models.tiny.model import TinyDiT
from jbkv_cli.models.tiny.train import TrainConfig, lr_at, make_batch, train
from jbkv_cli.models.tiny.weights_io import load_weights, save_weights

LONG = TrainConfig(steps=600, lr=3e-4, warmup=20, max_offset=12)
VARIANTS = ("long-clips", "ctx-noise", "own-context", "sampled-context")


@torch.no_grad()
def one_step(model: TinyDiT, b: dict, gen: torch.Generator, noise: tuple[float, float]):
    """Each chunk's x0 predicted in one step from the truth noised to ``t ~ U(noise)``."""
    x0 = b["x0"]
    lo, hi = noise
    t = lo + (hi - lo) * torch.rand(x0.shape[:2], generator=gen)
    noised = (1 - t[..., None, None]) * x0 + t[..., None, None] * torch.randn(
        x0.shape, generator=gen
    )
    return model.forward_train(noised, None, t, None, b["words"])


@torch.no_grad()
def sampled(model: TinyDiT, b: dict, gen: torch.Generator, steps: int = 4, ctx: float = 0.1):
    """Each chunk sampled as generation does (``steps`` Euler steps from noise), given the
    true previous chunks at context noise ``ctx``; a clip's first chunk stays the truth."""
    x0 = b["x0"]
    bsz, n = x0.shape[:2]
    tc = torch.full((bsz, n - 1), ctx)
    clean = (1 - ctx) * x0[:, :-1] + ctx * torch.randn(x0[:, :-1].shape, generator=gen)
    x = torch.randn(x0.shape, generator=gen)
    grid = [1.0 - k / steps for k in range(steps + 1)]
    for t, t_next in pairwise(grid):
        pred = model.forward_train(clean, x, tc, torch.full((bsz, n), t), b["words"])
        x = pred + (t_next / t) * (x - pred)
    pred[:, 0] = x0[:, 0]
    return pred


def own_context(init: TinyDiT, tc: TrainConfig, context) -> TinyDiT:
    """``tc``'s schedule with each clip's context replaced by ``context(model, batch, gen)``,
    the training model's own version of it (module docstring); returns the EMA weights."""
    torch.manual_seed(300)
    model = copy.deepcopy(init).requires_grad_(True).train()
    ema = copy.deepcopy(model).requires_grad_(False)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "words" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "words" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": rest, "weight_decay": 0}],
        lr=tc.lr,
        betas=(0.9, 0.99),
    )
    gen = torch.Generator().manual_seed(301)
    for step in range(tc.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        b = make_batch(model.cfg, tc, gen)
        x0, t_ctx = b["x0"], b["t_ctx"]
        own = context(model, b, gen)
        eps = torch.randn(x0.shape, generator=gen)
        clean = (1 - t_ctx[..., None, None]) * own + t_ctx[..., None, None] * eps
        pred = model.forward_train(clean[:, :-1], b["noisy"], t_ctx[:, :-1], b["t"], b["words"])
        per_chunk = (pred - x0).square().mean((2, 3))
        loss = (per_chunk * b["weight"]).sum() / b["weight"].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        with torch.no_grad():
            d = min(tc.ema, (1 + step) / (10 + step))
            for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
                pe.lerp_(pm, 1 - d)
        if (step + 1) % 50 == 0:
            print(json.dumps({"step": step + 1, "loss": round(loss.item(), 6)}), flush=True)
    return ema.eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=LONG.steps)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    init = load_weights()
    long = replace(LONG, steps=args.steps)
    start = time.time()
    if args.variant == "own-context":
        model = own_context(init, long, lambda m, b, g: one_step(m, b, g, (0.25, 0.5)))
    elif args.variant == "sampled-context":
        model = own_context(init, long, sampled)
    else:
        noise = 0.4 if args.variant == "ctx-noise" else LONG.ctx_noise_max
        tc = replace(long, ctx_noise_max=noise, threads=args.threads)
        model, _ = train(init.cfg, tc, seed=200, log_every=50, init=init)
    seconds = round(time.time() - start, 1)
    save_weights(
        model, args.out, {"variant": args.variant, "steps": args.steps, "seconds": seconds}
    )
    print(f"wrote {args.out} ({args.variant}, {seconds} s)")


if __name__ == "__main__":
    main()
