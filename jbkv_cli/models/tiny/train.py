"""Train the tiny model from a seed on the CPU.

    python -m jbkv_cli.models.tiny.train --out PATH --seed 0 [--stages 1,2] [--init WEIGHTS]
    python -m jbkv_cli.models.tiny.train --out LONG --seed 0 --stages 3 --init PATH

Each step renders a batch of fresh procedural clips of ``window + 2`` chunks and trains every
chunk at once with one block-causal forward over a clean copy and a noisy copy of the clip
(:meth:`TinyDiT.forward_train`). Per chunk: noise level ``t ~ U(0, 1)`` for the noisy copy,
context noise ``t_c ~ U(0, ctx_max)`` for the clean copy (teacher forcing with noise augmentation,
so that generation can read its own, imperfect chunks from the cache); loss ``||x0_hat - x0||^2``.
AdamW, linear warm-up then cosine decay, gradient clipping, an EMA of the weights (saved).

Clips are cut at a random chunk offset of a longer rendered video, so training covers the whole
default video (the start, the bounce off the far wall, the way back) and not only its first
chunks; half the noise levels sit on the sampler's grid ``1, 3/4, 1/2, 1/4``, where generation
evaluates the model. The shipped weights come from the first two stages of :data:`RECIPE` (the
second a short fine-tune that trains the first chunk, made from the prompt alone, more often);
the shipped long-rollout weights (``tiny-long.safetensors``, what ``quantize-eval --horizon``
runs) from its third, which trains on the model's own sampled context.
Training is deterministic given the seed (single process, fixed threads); ``--init`` starts
from existing weights (``--stages 2 --init stage1.safetensors`` resumes after stage 1, and a
run that starts after stage 1 needs it);
``--minutes`` only caps the wall time per stage (then fewer steps run, and the log says so).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from itertools import pairwise
from pathlib import Path

import torch

from jbkv_cli.models.tiny.data import VOCAB, DataConfig, random_prompts, render
from jbkv_cli.models.tiny.model import TinyConfig, TinyDiT, patchify
from jbkv_cli.models.tiny.weights_io import load_weights, save_weights
from jbkv_cli.utils.errors import JbkvError


@dataclass
class TrainConfig:
    """Optimisation settings."""

    steps: int = 5200
    batch_size: int = 4
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ema: float = 0.99
    ctx_noise_max: float = 0.2
    extra_chunks: int = 2  # clip length = window + extra_chunks chunks
    threads: int = 2
    max_offset: int = 4  # clips start at a random chunk 0..max_offset of the rendered video
    grid_prob: float = 0.5  # share of noise levels drawn from the sampler's grid 1, 1-1/S, ..
    grid_steps: int = 4  # S
    start_prob: float = 0.25  # extra share of clips that start with the video (offset 0)
    context: str = "true"  # the context copy: the clip's true chunks, or "sampled" (see train)
    sampled_ctx_noise: float = 0.1  # "sampled": context noise of the truth it samples from


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr_ratio * lr``."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_batch(cfg: TinyConfig, tc: TrainConfig, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Render a batch and noise it: x0, clean copy, noisy copy, their noise levels, and the
    per-chunk loss weights.

    Each clip of ``n = window + extra_chunks`` chunks is cut from a random chunk offset
    ``o <= max_offset`` of a longer video (``o = 0`` forced with probability ``start_prob``),
    so training sees the whole video (bounces, the way back) and not only its start. A clip cut
    at ``o > 0`` has no context for its first chunk, which is then ambiguous: its loss weight is 0 (it still serves as context for the others).
    A share ``grid_prob`` of the noise levels is drawn from the sampler's grid.
    """
    b, n, lc = tc.batch_size, cfg.window + tc.extra_chunks, cfg.chunk_len
    prompts = random_prompts(b, gen)
    total = n + tc.max_offset
    data = DataConfig(image_size=cfg.image_size, num_frames=total * cfg.frames_per_chunk)
    video = render(prompts, data, gen) * 2 - 1
    x0 = patchify(video, cfg.patch_size).reshape(b, total, lc, cfg.patch_dim)
    offset = torch.randint(tc.max_offset + 1, (b,), generator=gen)
    offset = torch.where(torch.rand(b, generator=gen) < tc.start_prob, 0, offset)
    index = offset[:, None] + torch.arange(n)
    x0 = x0.gather(1, index[..., None, None].expand(b, n, lc, cfg.patch_dim))
    weight = torch.ones(b, n)
    weight[:, 0] = (offset == 0).float()
    t = torch.rand(b, n, generator=gen)
    grid = 1.0 - torch.randint(tc.grid_steps, (b, n), generator=gen) / tc.grid_steps
    t = torch.where(torch.rand(b, n, generator=gen) < tc.grid_prob, grid, t)
    t_ctx = tc.ctx_noise_max * torch.rand(b, n, generator=gen)
    eps = torch.randn(x0.shape, generator=gen)
    eps_ctx = torch.randn(x0.shape, generator=gen)
    noisy = (1 - t[..., None, None]) * x0 + t[..., None, None] * eps
    clean = (1 - t_ctx[..., None, None]) * x0 + t_ctx[..., None, None] * eps_ctx
    words = torch.tensor([p.token_ids for p in prompts])
    return {
        "x0": x0,
        "clean": clean,
        "noisy": noisy,
        "t": t,
        "t_ctx": t_ctx,
        "words": words,
        "weight": weight,
    }


ContextFn = Callable[[TinyDiT, dict[str, torch.Tensor], torch.Generator], torch.Tensor]
"""``(training model, batch, generator) -> x0-like chunks`` that replace a batch's context."""


@torch.no_grad()
def sampled_context(
    model: TinyDiT,
    b: dict[str, torch.Tensor],
    gen: torch.Generator,
    steps: int = 4,
    ctx: float = 0.1,
) -> torch.Tensor:
    """Each chunk of the batch's clips as generation makes it: ``steps`` Euler steps
    ``x <- x0_hat + (t'/t)(x - x0_hat)`` on the grid ``1, 1 - 1/steps, .., 0`` from fresh noise,
    given the clip's true previous chunks at context noise ``ctx``; the last ``x0_hat`` of each
    chunk. A clip's first chunk stays the truth (it has no context to be sampled from)."""
    x0 = b["x0"]
    bsz, n = x0.shape[:2]
    t_ctx = torch.full((bsz, n - 1), ctx)
    clean = (1 - ctx) * x0[:, :-1] + ctx * torch.randn(x0[:, :-1].shape, generator=gen)
    x = torch.randn(x0.shape, generator=gen)
    grid = [1.0 - k / steps for k in range(steps + 1)]
    for t, t_next in pairwise(grid):
        pred = model.forward_train(clean, x, t_ctx, torch.full((bsz, n), t), b["words"])
        x = pred + (t_next / t) * (x - pred)
    pred[:, 0] = x0[:, 0]
    return pred


def train(
    cfg: TinyConfig,
    tc: TrainConfig,
    seed: int,
    minutes: float | None = None,
    log_every: int = 25,
    log_file: Path | None = None,
    checkpoint: Callable[[TinyDiT, int], None] | None = None,
    checkpoint_every: int = 50,
    init: TinyDiT | None = None,
    context_fn: ContextFn | None = None,
) -> tuple[TinyDiT, dict]:
    """Train from scratch, or from ``init``'s weights; returns the EMA model and a JSON-able log.

    With ``tc.context == "sampled"`` each step's context copy is the training model's own
    sample of every chunk (:func:`sampled_context`, no gradient through it), context-noised as
    usual: training then sees the errors a rollout's cache holds, against clean targets.
    ``context_fn`` replaces the context the same way by another function (``tc.context`` then
    only labels it in the log)."""
    if context_fn is None and tc.context == "sampled":
        context_fn = partial(sampled_context, steps=tc.grid_steps, ctx=tc.sampled_ctx_noise)
    elif context_fn is None and tc.context != "true":
        raise ValueError(f"context must be 'true' or 'sampled', not {tc.context!r}")
    torch.set_num_threads(tc.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(seed)
    model = TinyDiT(cfg)
    if init is not None:
        model.load_state_dict(init.state_dict())
        model.requires_grad_(True).train()
    ema = copy.deepcopy(model).requires_grad_(False)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "words" not in name else no_decay).append(p)
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": tc.weight_decay},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=tc.lr,
        betas=(0.9, 0.99),
    )
    gen = torch.Generator().manual_seed(seed + 1)
    start = time.time()
    history, window_losses = [], []
    step = 0
    stopped_early = False
    for step in range(tc.steps):
        if minutes is not None and time.time() - start > 60 * minutes:
            stopped_early = True
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        b = make_batch(cfg, tc, gen)
        clean = b["clean"]
        if context_fn is not None:
            own = context_fn(model, b, gen)
            t_ctx = b["t_ctx"][..., None, None]
            clean = (1 - t_ctx) * own + t_ctx * torch.randn(own.shape, generator=gen)
        pred = model.forward_train(
            clean[:, :-1], b["noisy"], b["t_ctx"][:, :-1], b["t"], b["words"]
        )
        per_chunk = (pred - b["x0"]).square().mean((2, 3))
        loss = (per_chunk * b["weight"]).sum() / b["weight"].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        with torch.no_grad():
            d = min(tc.ema, (1 + step) / (10 + step))
            for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
                pe.lerp_(pm, 1 - d)
        window_losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == tc.steps:
            entry = {
                "step": step + 1,
                "loss": sum(window_losses) / len(window_losses),
                "lr": lr_at(step, tc),
                "seconds": round(time.time() - start, 1),
            }
            history.append(entry)
            window_losses = []
            line = json.dumps(entry)
            print(line, flush=True)
            if log_file is not None:
                with open(log_file, "a") as fh:
                    fh.write(line + "\n")
        if checkpoint is not None and (step + 1) % checkpoint_every == 0:
            checkpoint(ema, step + 1)
    else:
        step = tc.steps
    log = {
        "seed": seed,
        "steps": step if stopped_early else tc.steps,
        "stopped_early_by_minutes": stopped_early,
        "final_loss": history[-1]["loss"] if history else None,
        "wall_seconds": round(time.time() - start, 1),
        "threads": tc.threads,
        "torch": torch.__version__,
        "params": sum(p.numel() for p in model.parameters()),
        "tokens_per_step": tc.batch_size * (2 * (cfg.window + tc.extra_chunks) - 1) * cfg.chunk_len,
        "model_config": cfg.to_dict(),
        "train_config": asdict(tc),
        "vocab": list(VOCAB),
        "history": history,
    }
    return ema.eval(), log


RECIPE: tuple[TrainConfig, ...] = (
    TrainConfig(),
    TrainConfig(steps=600, lr=3e-4, warmup=20, start_prob=0.5),
    TrainConfig(steps=1200, lr=3e-4, warmup=20, max_offset=12, context="sampled"),
)
"""The shipped weights' training. Stage 1: clips cut anywhere in the first 8 chunks, a quarter of
them forced to start with the video, since the first chunk (made from the prompt alone) is
trained only in clips cut at offset 0. Stage 2: a short fine-tune at a lower learning rate
with half the clips starting with the video. Stage 3 (the long-rollout weights, not the
default ones): clips cut anywhere in 16-chunk videos, so a rollout's bounce off the wall it
started from is seen, and the context sampled by the training model itself
(:func:`sampled_context`), so the errors its own chunks carry into the cache are seen. Stage
``k`` starts from stage ``k-1``'s EMA weights and seeds its data with ``seed + 100 (k - 1)``."""


def run_recipe(
    cfg: TinyConfig,
    seed: int,
    stages: list[int],
    init: TinyDiT | None = None,
    threads: int = 2,
    minutes: float | None = None,
    log_file: Path | None = None,
    checkpoint: Callable[[TinyDiT, int], None] | None = None,
) -> tuple[TinyDiT, dict]:
    """Run the given stages of :data:`RECIPE` (1-based) in order; returns the model and a log."""
    model, logs = init, []
    for k in stages:
        tc = replace(RECIPE[k - 1], threads=threads)
        print(f"stage {k}: {json.dumps(asdict(tc))}", flush=True)
        model, log = train(
            cfg,
            tc,
            seed + 100 * (k - 1),
            minutes,
            log_file=log_file,
            checkpoint=checkpoint,
            init=model,
        )
        logs.append({"stage": k, **log})
    assert model is not None
    last = logs[-1]
    summary = {
        "seed": seed,
        "stages": stages,
        "steps": sum(log["steps"] for log in logs),
        "final_loss": last["final_loss"],
        "wall_seconds": round(sum(log["wall_seconds"] for log in logs), 1),
        **{k: last[k] for k in ("threads", "torch", "params", "model_config", "vocab")},
        "stage_logs": logs,
    }
    return model, summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output .safetensors path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--stages",
        default="1,2",
        help="stages of the recipe to run (1,2: tiny.safetensors; 3 from it: tiny-long)",
    )
    ap.add_argument("--init", type=Path, default=None, help="start from these weights")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--minutes", type=float, default=None, help="wall-time cap per stage")
    args = ap.parse_args(argv)
    try:
        stages = [int(s) for s in args.stages.split(",")]
    except ValueError:
        stages = []
    if not stages or any(not 1 <= s <= len(RECIPE) for s in stages):
        ap.error(f"--stages takes a comma list of numbers in 1..{len(RECIPE)}")
    if stages != list(range(stages[0], stages[-1] + 1)):
        ap.error("--stages must be consecutive and in order (each starts from the one before)")
    if stages[0] > 1 and args.init is None:
        ap.error(
            f"--stages {args.stages} starts after stage 1: give --init (stage "
            f"{stages[0] - 1}'s weights)"
        )
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    try:
        init = load_weights(args.init) if args.init is not None else None
    except JbkvError as e:
        ap.error(str(e))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.out.with_suffix(".ckpt.safetensors")

    def checkpoint(ema: TinyDiT, step: int) -> None:
        save_weights(ema, ckpt_path, {"steps": step, "partial": True})

    log_file = args.out.with_suffix(".log.jsonl")
    log_file.unlink(missing_ok=True)
    cfg = init.cfg if init is not None else TinyConfig()
    model, log = run_recipe(
        cfg, args.seed, stages, init, args.threads, args.minutes, log_file, checkpoint
    )
    if args.init is not None:
        log["init"] = str(args.init)
    save_weights(model, args.out, log)
    ckpt_path.unlink(missing_ok=True)
    print(f"wrote {args.out} (final loss {log['final_loss']:.4f}, {log['wall_seconds']} s)")


if __name__ == "__main__":
    main()
