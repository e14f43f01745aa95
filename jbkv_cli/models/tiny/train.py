"""Train the tiny model from a seed on the CPU.

    python -m jbkv_cli.models.tiny.train --out PATH --seed 0 [--steps N] [--minutes M]

Each step renders a batch of fresh procedural clips of ``window + 2`` chunks and trains every
chunk at once with one block-causal forward over a clean copy and a noisy copy of the clip
(:meth:`TinyDiT.forward_train`). Per chunk: noise level ``t ~ U(0, 1)`` for the noisy copy,
context noise ``t_c ~ U(0, ctx_max)`` for the clean copy (teacher forcing with noise augmentation,
so that generation can read its own, imperfect chunks from the cache); loss ``||x0_hat - x0||^2``.
AdamW, linear warm-up then cosine decay, gradient clipping, an EMA of the weights (saved).
Training is deterministic given the seed and the step count (single process, fixed threads);
``--minutes`` only caps the wall time (then fewer steps run, and the log says so).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from jbkv_cli.models.tiny.data import VOCAB, DataConfig, random_prompts, render
from jbkv_cli.models.tiny.model import TinyConfig, TinyDiT, patchify
from jbkv_cli.models.tiny.weights_io import save_weights


@dataclass
class TrainConfig:
    """Optimisation settings."""

    steps: int = 1900
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


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr_ratio * lr``."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_batch(cfg: TinyConfig, tc: TrainConfig, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Render a batch and noise it: x0, clean copy, noisy copy and their noise levels."""
    n = cfg.window + tc.extra_chunks
    prompts = random_prompts(tc.batch_size, gen)
    data = DataConfig(image_size=cfg.image_size, num_frames=n * cfg.frames_per_chunk)
    video = render(prompts, data, gen) * 2 - 1
    x0 = patchify(video, cfg.patch_size).reshape(tc.batch_size, n, cfg.chunk_len, cfg.patch_dim)
    t = torch.rand(tc.batch_size, n, generator=gen)
    t_ctx = tc.ctx_noise_max * torch.rand(tc.batch_size, n, generator=gen)
    eps = torch.randn(x0.shape, generator=gen)
    eps_ctx = torch.randn(x0.shape, generator=gen)
    noisy = (1 - t[..., None, None]) * x0 + t[..., None, None] * eps
    clean = (1 - t_ctx[..., None, None]) * x0 + t_ctx[..., None, None] * eps_ctx
    words = torch.tensor([p.token_ids for p in prompts])
    return {"x0": x0, "clean": clean, "noisy": noisy, "t": t, "t_ctx": t_ctx, "words": words}


def train(
    cfg: TinyConfig,
    tc: TrainConfig,
    seed: int,
    minutes: float | None = None,
    log_every: int = 25,
    log_file: Path | None = None,
    checkpoint: Callable[[TinyDiT, int], None] | None = None,
    checkpoint_every: int = 50,
) -> tuple[TinyDiT, dict]:
    """Train from scratch; returns the EMA model and a JSON-able log."""
    torch.set_num_threads(tc.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(seed)
    model = TinyDiT(cfg)
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
        pred = model.forward_train(
            b["clean"][:, :-1], b["noisy"], b["t_ctx"][:, :-1], b["t"], b["words"]
        )
        loss = F.mse_loss(pred, b["x0"])
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output .safetensors path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--minutes", type=float, default=None, help="wall-time cap")
    ap.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    ap.add_argument("--threads", type=int, default=TrainConfig.threads)
    ap.add_argument("--width", type=int, default=TinyConfig.width)
    ap.add_argument("--depth", type=int, default=TinyConfig.depth)
    ap.add_argument("--lr", type=float, default=TrainConfig.lr)
    args = ap.parse_args(argv)
    cfg = TinyConfig(width=args.width, depth=args.depth)
    tc = TrainConfig(steps=args.steps, batch_size=args.batch_size, threads=args.threads, lr=args.lr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.out.with_suffix(".ckpt.safetensors")

    def checkpoint(ema: TinyDiT, step: int) -> None:
        save_weights(ema, ckpt_path, {"steps": step, "partial": True})

    log_file = args.out.with_suffix(".log.jsonl")
    log_file.unlink(missing_ok=True)
    model, log = train(cfg, tc, args.seed, args.minutes, log_file=log_file, checkpoint=checkpoint)
    save_weights(model, args.out, log)
    print(f"wrote {args.out} (final loss {log['final_loss']:.4f}, {log['wall_seconds']} s)")


if __name__ == "__main__":
    main()
