"""The five parts of a SkyReels-V2 diffusion-forcing model, from disk or built tiny in memory.

A diffusers-format directory (e.g. the Hugging Face repo
``Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers``) holds ``transformer/``, ``vae/``,
``text_encoder/`` (UMT5), ``tokenizer/`` and ``scheduler/``. It is found, in order, at the
``weights=`` option (a directory, or a repo id looked up in the Hugging Face cache), at
``$JBKV_SKYREELS_DIR``, or in the Hugging Face cache under the default repo id. Nothing is ever
downloaded (``local_files_only``); a missing or malformed directory raises one
:class:`WeightsNotFoundError` listing every missing part.

``tiny_components()`` builds diffusers' tiny test configuration with random weights (tiny
transformer, tiny Wan VAE, tiny UMT5 encoder, a character-level tokenizer made in code), so the
whole generation path runs on a CPU in tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.models.wan.tiny import TINY_MAX_SEQUENCE_LENGTH, tiny_parts
from jbkv_cli.models.wan.tiny import TINY_TEXT_DIM as TINY_TEXT_DIM  # re-exported
from jbkv_cli.models.wan.weights import hf_cache_snapshot, load_parts, transformer_config
from jbkv_cli.models.wan.weights import missing_parts as shared_missing_parts
from jbkv_cli.utils.errors import WeightsNotFoundError
from jbkv_cli.utils.pretrained import from_pretrained

DEFAULT_REPO_ID = "Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers"
ENV_VAR = "JBKV_SKYREELS_DIR"
TRANSFORMER_CLASS = "SkyReelsV2Transformer3DModel"

# part -> (files that must all exist, groups of which at least one file must exist)
_REQUIRED: dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = {
    "transformer": (("config.json",), (("*.safetensors", "*.bin"),)),
    "vae": (("config.json",), (("*.safetensors", "*.bin"),)),
    "text_encoder": (("config.json",), (("*.safetensors", "*.bin"),)),
    "tokenizer": ((), (("tokenizer.json", "spiece.model"),)),
    "scheduler": (("scheduler_config.json",), ()),
}


@dataclass
class Components:
    """Transformer, VAE, text encoder, tokenizer and scheduler of one SkyReels-V2 model."""

    transformer: Any
    vae: Any
    text_encoder: Any
    tokenizer: Any
    scheduler: Any
    source: str  # a directory, or "tiny-random"
    max_sequence_length: int = 512


# --------------------------------------------------------------------------- finding weights


def resolve_weights_dir(weights: str | os.PathLike | None) -> Path:
    """Where the weights are: ``weights``, else ``$JBKV_SKYREELS_DIR``, else the HF cache."""
    if weights is None:
        weights = os.environ.get(ENV_VAR) or None
    if weights is not None:
        path = Path(weights).expanduser()
        if path.is_dir():
            return path
        name = str(weights)
        if name.count("/") == 1 and not path.exists():
            snapshot = hf_cache_snapshot(name)
            if snapshot is not None:
                return snapshot
        raise WeightsNotFoundError(
            f"SkyReels-V2 weights not found: {name} is neither a directory nor a repo id in the "
            f"Hugging Face cache; download {DEFAULT_REPO_ID} (e.g. `hf download {DEFAULT_REPO_ID}`) "
            "and pass its directory with --weights"
        )
    snapshot = hf_cache_snapshot(DEFAULT_REPO_ID)
    if snapshot is None:
        raise WeightsNotFoundError(
            f"SkyReels-V2 weights not found: pass a diffusers-format directory (weights=... / "
            f"--weights), set ${ENV_VAR}, or put {DEFAULT_REPO_ID} in the Hugging Face cache "
            f"(`hf download {DEFAULT_REPO_ID}`); nothing is downloaded automatically"
        )
    return snapshot


def missing_parts(root: Path) -> list[str]:
    """Every required file absent under ``root``, as ``part/file`` (``a|b``: any of them)."""
    return shared_missing_parts(root, _REQUIRED)


def check_weights_dir(root: Path) -> None:
    """Raise one :class:`WeightsNotFoundError` naming everything missing or malformed."""
    missing = missing_parts(root)
    if missing:
        raise WeightsNotFoundError(
            f"incomplete SkyReels-V2 weights directory {root}: missing {', '.join(missing)} "
            f"(expected the diffusers layout of {DEFAULT_REPO_ID})"
        )
    transformer_config(
        root,
        TRANSFORMER_CLASS,
        f"a SkyReels-V2 diffusion-forcing checkpoint such as {DEFAULT_REPO_ID}",
    )


def load_components(root: Path, dtype: torch.dtype) -> Components:
    """Load all five parts from a checked diffusers-format directory, offline.

    The transformer and text encoder in ``dtype``; the VAE in float32 (as the reference
    pipeline's example does).
    """
    import diffusers
    import transformers

    check_weights_dir(root)
    offline = {"local_files_only": True}
    loaders = {  # the tokenizer first: a folder asking to run its code is refused before weights
        "tokenizer": lambda: from_pretrained(
            transformers.AutoTokenizer, root / "tokenizer", **offline
        ),
        "transformer": lambda: from_pretrained(
            diffusers.SkyReelsV2Transformer3DModel,
            root,
            subfolder="transformer",
            torch_dtype=dtype,
            **offline,
        ),
        "vae": lambda: from_pretrained(
            diffusers.AutoencoderKLWan, root, subfolder="vae", torch_dtype=torch.float32, **offline
        ),
        "text_encoder": lambda: from_pretrained(
            transformers.UMT5EncoderModel, root / "text_encoder", dtype=dtype, **offline
        ),
        "scheduler": lambda: from_pretrained(
            diffusers.UniPCMultistepScheduler, root, subfolder="scheduler", **offline
        ),
    }
    parts = load_parts(loaders, "SkyReels-V2", root)
    for part in ("transformer", "vae", "text_encoder"):
        parts[part].eval().requires_grad_(False)
    return Components(**parts, source=str(root))


# --------------------------------------------------------------------------- tiny, in memory


def tiny_components(seed: int = 0, dtype: torch.dtype = torch.float32) -> Components:
    """diffusers' tiny SkyReels-V2 test configuration with random weights (float32, CPU).

    Transformer as in diffusers' tests (patch (1, 2, 2), 2 heads, 2 layers, ffn 32, cross-attn
    norm, RMS q/k norm across heads, rope_max_seq_len 32) except ``attention_head_dim = 32``
    (12 upstream), so that the default quantization group g = 32 divides the head dim. Wan VAE
    as in diffusers' pipeline tests (base_dim 3, z_dim 16, 8x spatial, 4x temporal). A 2-layer
    UMT5 encoder of width 32. Transformer and text encoder in ``dtype`` (the VAE stays float32).
    The global RNG is left untouched.
    """
    import diffusers

    transformer, vae, text_encoder, tokenizer = tiny_parts(
        diffusers.SkyReelsV2Transformer3DModel, seed, dtype
    )
    scheduler = diffusers.UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0
    )
    return Components(
        transformer=transformer,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        source="tiny-random",
        max_sequence_length=TINY_MAX_SEQUENCE_LENGTH,
    )


def save_components(components: Components, root: Path) -> None:
    """Write ``components`` in the diffusers directory layout (used by tests)."""
    components.transformer.save_pretrained(root / "transformer")
    components.vae.save_pretrained(root / "vae")
    components.text_encoder.save_pretrained(root / "text_encoder")
    components.tokenizer.save_pretrained(root / "tokenizer")
    components.scheduler.save_pretrained(root / "scheduler")
