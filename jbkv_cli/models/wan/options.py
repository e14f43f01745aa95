"""The options every Wan-family adapter takes and the checks it makes of them: names and
configs, device / dtype / backend, frame size, frames against chunks and the rotary table."""

from __future__ import annotations

from typing import Any

import torch

from jbkv_cli.models import limits
from jbkv_cli.models.dtypes import dtype_from_name
from jbkv_cli.models.wan.tiny import TINY_WAN_TRANSFORMER
from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.fields import Spec

ATTENTION_BACKENDS = ("fused", "flex", "reference")

MAX_LATENT_FRAMES = 1024  # Wan 2.1's rotary table (rope_max_seq_len); tiny-random: its own

# The options both Wan-family adapters take (each adds its own); see jbkv_cli.models.limits.
WAN_OPTIONS: dict[str, Spec] = {
    "weights": limits.PATH,
    "device": limits.DEVICE,
    "dtype": limits.DTYPE,
    "attention_backend": Spec("str", choices=ATTENTION_BACKENDS),
    "init_seed": limits.SEED,
    "steps": limits.STEPS,
    "chunk_frames": Spec("int", lo=1, hi=MAX_LATENT_FRAMES),
    "num_chunks": limits.CHUNKS,
    "num_frames": Spec("int", lo=1, hi=4 * (MAX_LATENT_FRAMES - 1) + 1),
    "height": limits.SIDE,
    "width": limits.SIDE,
    "shift": Spec("float", lo=0, lo_open=True, hi=100),
    "fps": limits.FPS,
}


def rope_frames(config: str) -> int:
    """Latent frames the rotary table of ``config``'s transformer covers (tiny-random: the tiny
    transformer's; the released checkpoints: Wan 2.1's 1,024)."""
    return (
        TINY_WAN_TRANSFORMER["rope_max_seq_len"] if config == "tiny-random" else MAX_LATENT_FRAMES
    )


def check_latent_frames(model: str, config: str, chunk_frames: int, num_chunks: int) -> None:
    """Refuse more latent frames than the rotary table holds, before the model is built."""
    frames = rope_frames(config)
    if chunk_frames * num_chunks > frames:
        raise UsageError(
            f"{model}: {num_chunks} chunks of {chunk_frames} latent frames exceed the rotary "
            f"table of config {config} ({frames} latent frames): num_chunks must be in "
            f"1..{max(1, frames // chunk_frames)}"
        )


def checked_options(
    model: str, options: dict[str, Any], known: frozenset[str], configs: Any, default: str
) -> dict[str, Any]:
    """``options`` without None values and with ``config`` set (``default`` when absent);
    unknown option names or configs are one-line errors naming the choices."""
    options = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(
            f"unknown {model} option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    options.setdefault("config", default)
    if options["config"] not in configs:
        raise UsageError(
            f"unknown {model} config {options['config']!r}; choose: {', '.join(configs)}"
        )
    return options


def chunks_for_frames(num_frames: int, chunk_frames: int, num_chunks: int | None) -> int:
    """Whole chunks of ``chunk_frames`` latent frames for a ``num_frames``-frame video.

    The Wan VAE maps F latent frames to ``4·(F − 1) + 1`` frames, so ``num_frames`` must be
    ``4·(chunks·k − 1) + 1``; a ``num_chunks`` given as well must agree.
    """
    k = chunk_frames
    latent = (num_frames - 1) // 4 + 1
    if num_frames < 1 or (num_frames - 1) % 4 or latent % k:
        raise UsageError(
            f"num_frames={num_frames} is not 4·(chunks·{k} − 1) + 1 for whole chunks of {k} "
            f"latent frames (e.g. {4 * (5 * k - 1) + 1} for 5 chunks)"
        )
    if num_chunks is not None and int(num_chunks) != latent // k:
        raise UsageError(f"num_frames={num_frames} and num_chunks={num_chunks} disagree")
    return latent // k


def runtime_options(options: dict[str, Any]) -> tuple[str, str, str | None]:
    """``(device, dtype, attention_backend)`` from ``options``: cuda when available, bfloat16 on
    cuda and float32 on cpu, jbkv's default backend; unknown values are one-line errors."""
    device = str(options.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = str(options.get("dtype") or ("bfloat16" if device.startswith("cuda") else "float32"))
    dtype_from_name(dtype)
    backend = options.get("attention_backend")
    if backend is not None and backend not in ATTENTION_BACKENDS:
        raise UsageError(
            f"unknown attention_backend {backend!r}; choose: {', '.join(ATTENTION_BACKENDS)}"
        )
    return device, dtype, backend


def check_frame_size(values: dict[str, Any]) -> None:
    """``height``/``width`` in ``values`` become ints, positive multiples of 16 (VAE 8 × patch 2)."""
    for name in ("height", "width"):
        values[name] = int(values[name])
        if values[name] < 16 or values[name] % 16:
            raise UsageError(f"{name} must be a positive multiple of 16, got {values[name]}")
