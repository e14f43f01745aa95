"""The parts of a Self-Forcing-family model, from disk or built tiny in memory.

Two downloads make a model (nothing is ever downloaded by jbkv):

* a **Wan2.1-T2V-1.3B base in diffusers format** (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``): the Wan
  VAE, the UMT5 encoder, its tokenizer and the transformer's ``config.json``. The base
  transformer's weights are not read: the generator replaces all of them;
* a **generator checkpoint** with upstream parameter names: Self-Forcing's
  ``checkpoints/self_forcing_dmd.pt`` (``gdhe17/Self-Forcing``), LongLive's
  ``models/longlive_base.pt`` + ``models/lora.pt`` (``Efficient-Large-Model/LongLive-1.3B``),
  or Causal-Forcing's ``chunkwise/causal_forcing.pt``, ``framewise/causal_forcing.pt``,
  ``causal-forcing++/framewise-{2,1}step.pt`` (``zhuhz22/Causal-Forcing``; its EMA keys carry
  ``model._fsdp_wrapped_module.``, stripped as upstream's ``inference.py`` does).
  A ``.safetensors`` file next to a ``.pt`` (same stem, made by ``jbkv convert-checkpoint``)
  is preferred.

Where, in order: the ``base`` / ``generator`` / ``lora`` options (a directory or cached repo id,
files); else a root directory (``weights=``, ``--weights``, ``$JBKV_SELF_FORCING_DIR``) laid out
as ``ROOT/Wan2.1-T2V-1.3B-Diffusers/``, ``ROOT/checkpoints/self_forcing_dmd.pt``,
``ROOT/models/{longlive_base,lora}.pt``, ``ROOT/chunkwise/causal_forcing.pt``, … (the repo's own
paths: what ``hf download … --local-dir ROOT`` makes); else
the Hugging Face cache of each repo. Everything missing is listed in one
:class:`WeightsNotFoundError`.

``tiny_components()`` builds a tiny random ``WanTransformer3DModel`` of the same architecture
with the tiny Wan VAE, UMT5 encoder and tokenizer, so the whole path runs on a CPU in tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.models.safetensors_io import check_state_dict, not_regular
from jbkv_cli.models.wan.self_forcing.checkpoint import (
    merge_lora,
    read_generator,
    read_lora,
    to_diffusers,
)
from jbkv_cli.models.wan.tiny import TINY_MAX_SEQUENCE_LENGTH, tiny_parts
from jbkv_cli.models.wan.weights import (
    WEIGHTS,
    Required,
    cast_keeping_fp32,
    hf_cache_snapshot,
    load_parts,
    missing_parts,
    transformer_config,
)
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError
from jbkv_cli.utils.pretrained import from_pretrained

ENV_VAR = "JBKV_SELF_FORCING_DIR"
BASE_REPO = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
BASE_DIR = "Wan2.1-T2V-1.3B-Diffusers"
TRANSFORMER_CLASS = "WanTransformer3DModel"
MAX_SEQUENCE_LENGTH = 512  # UMT5 tokens, as upstream's text encoder wrapper

# transformer/config.json of Wan-AI/Wan2.1-T2V-1.3B-Diffusers (= upstream wan_t2v_1_3B.py)
WAN_T2V_1_3B = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)

_BASE_REQUIRED: Required = {
    "transformer": (("config.json",), ()),
    "vae": (("config.json",), (WEIGHTS,)),
    "text_encoder": (("config.json",), (WEIGHTS,)),
    "tokenizer": ((), (("tokenizer.json", "spiece.model"),)),
}


@dataclass(frozen=True)
class Generator:
    """Where a family member's generator is published: HF repo and files inside it."""

    repo_id: str
    file: str
    lora: str | None = None


CAUSAL_FORCING_REPO = "zhuhz22/Causal-Forcing"
GENERATORS = {
    "self-forcing-dmd": Generator("gdhe17/Self-Forcing", "checkpoints/self_forcing_dmd.pt"),
    "longlive": Generator(
        "Efficient-Large-Model/LongLive-1.3B", "models/longlive_base.pt", "models/lora.pt"
    ),
    "causal-forcing-chunkwise": Generator(CAUSAL_FORCING_REPO, "chunkwise/causal_forcing.pt"),
    "causal-forcing-framewise": Generator(CAUSAL_FORCING_REPO, "framewise/causal_forcing.pt"),
    "causal-forcing-pp-2step": Generator(
        CAUSAL_FORCING_REPO, "causal-forcing++/framewise-2step.pt"
    ),
    "causal-forcing-pp-1step": Generator(
        CAUSAL_FORCING_REPO, "causal-forcing++/framewise-1step.pt"
    ),
    # tianweiy/CausVid: minimal_inference/autoregressive_inference.py reads
    # CHECKPOINT_FOLDER/model.pt["generator"] (strict, upstream names under "model.")
    "causvid": Generator("tianweiy/CausVid", "autoregressive_checkpoint/model.pt"),
    "causvid-warp-4step": Generator(
        "tianweiy/CausVid", "autoregressive_checkpoint_warp_4step_cfg2/model.pt"
    ),
    # TencentARC/RollingForcing README: checkpoints/rolling_forcing_dmd.pt, --use_ema
    "rolling-forcing": Generator("TencentARC/RollingForcing", "checkpoints/rolling_forcing_dmd.pt"),
    # thu-ml/Causal-Forcing long_video/README.md: run under Rolling Forcing's loop, --use_ema
    "causal-forcing-longvideo": Generator(CAUSAL_FORCING_REPO, "chunkwise/longvideo.pt"),
}


@dataclass(frozen=True)
class WeightPaths:
    base: Path
    generator: Path
    lora: Path | None


@dataclass
class Components:
    """Transformer (generator weights), VAE, UMT5 encoder and tokenizer of one model."""

    transformer: Any
    vae: Any
    text_encoder: Any
    tokenizer: Any
    source: str  # the generator file, or "tiny-random"
    max_sequence_length: int = MAX_SEQUENCE_LENGTH


# --------------------------------------------------------------------------- finding weights


def _prefer_safetensors(path: Path) -> Path:
    converted = path.with_suffix(".safetensors")
    return converted if converted.is_file() else path


def _base_dir(base: str | None, root: Path | None, missing: list[str]) -> Path | None:
    if base is not None:
        path = Path(base).expanduser()
        if path.is_dir():
            return path
        snapshot = hf_cache_snapshot(base) if base.count("/") == 1 else None
        if snapshot is None:
            missing.append(f"base {base} (neither a directory nor a repo id in the HF cache)")
        return snapshot
    if root is not None:
        return root / BASE_DIR
    snapshot = hf_cache_snapshot(BASE_REPO)
    if snapshot is None:
        missing.append(f"the diffusers-format base {BASE_REPO} (HF cache)")
    return snapshot


def _file(option: str | None, root: Path | None, repo_id: str, rel: str, missing: list[str]):
    if option is not None:
        path = Path(option).expanduser()
    elif root is not None:
        path = root / rel
    else:
        snapshot = hf_cache_snapshot(repo_id)
        if snapshot is None:
            missing.append(f"{rel} of {repo_id} (HF cache)")
            return None
        path = snapshot / rel
    path = _prefer_safetensors(path)
    problem = not_regular(path)
    if problem is not None:  # a FIFO, /dev/zero, a directory: not "missing", and never read
        raise JbkvError(f"weights {problem}")
    if not path.is_file():
        missing.append(str(path))
        return None
    return path


def weight_files(paths: WeightPaths) -> dict[str, Path]:
    """Role -> the files and folders :func:`load_components` reads (the base's transformer
    config, not its weights: the generator holds those; a LoRA when there is one)."""
    found = {
        "base/transformer/config.json": paths.base / "transformer" / "config.json",
        "base/vae": paths.base / "vae",
        "base/text_encoder": paths.base / "text_encoder",
        "base/tokenizer": paths.base / "tokenizer",
        "generator": paths.generator,
    }
    return found if paths.lora is None else found | {"lora": paths.lora}


def locate(
    config: str,
    weights: str | os.PathLike | None = None,
    base: str | None = None,
    generator: str | None = None,
    lora: str | None = None,
) -> WeightPaths:
    """Resolve base directory, generator and LoRA files; one error lists everything missing."""
    spec = GENERATORS[config]
    root_value = weights if weights is not None else os.environ.get(ENV_VAR) or None
    root = Path(root_value).expanduser() if root_value is not None else None
    if root is not None and not root.is_dir():
        raise WeightsNotFoundError(
            f"Self-Forcing weights directory {root} does not exist (from "
            f"{'--weights' if weights is not None else '$' + ENV_VAR})"
        )
    missing: list[str] = []
    base_dir = _base_dir(base, root, missing)
    if base_dir is not None and not base_dir.is_dir():
        missing.append(f"{base_dir}/ ({BASE_REPO}, diffusers format)")
    elif base_dir is not None:
        missing += [str(base_dir / p) for p in missing_parts(base_dir, _BASE_REQUIRED)]
    gen = _file(generator, root, spec.repo_id, spec.file, missing)
    lora_path = None
    if lora is not None or spec.lora is not None:
        lora_path = _file(lora, root, spec.repo_id, spec.lora or "", missing)
    if missing:
        raise WeightsNotFoundError(
            f"{config} weights not found: missing {'; '.join(missing)} — download "
            f"{BASE_REPO} and {spec.repo_id} (docs/models.md: Self-Forcing) and pass --weights DIR, set "
            f"${ENV_VAR}, or keep them in the Hugging Face cache; nothing is downloaded"
        )
    assert base_dir is not None and gen is not None
    return WeightPaths(base_dir, gen, lora_path)


# --------------------------------------------------------------------------- loading


def build_transformer(
    config: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, what: str
) -> Any:
    """``WanTransformer3DModel(config)`` holding ``state`` (diffusers names), checked strictly
    (one error lists missing / unexpected / mis-shaped keys), cast to ``dtype`` except
    diffusers' float32 modules. Parameters are never randomly initialised first."""
    import accelerate
    import diffusers

    with accelerate.init_empty_weights(include_buffers=False):
        transformer = diffusers.WanTransformer3DModel.from_config(config)
    check_state_dict(transformer, state, what)
    transformer.load_state_dict(state, strict=True, assign=True)
    cast_keeping_fp32(transformer, dtype)
    return transformer.eval().requires_grad_(False)


def generator_state(
    paths: WeightPaths, ema: bool, lora_alpha: float | None
) -> dict[str, torch.Tensor]:
    """The generator's weights in diffusers names, LoRA merged when there is one."""
    state = read_generator(paths.generator, ema)
    if paths.lora is not None:
        lora = read_lora(paths.lora)
        rank = next(v.shape[0] for k, v in lora.items() if ".lora_A" in k)
        state = merge_lora(state, lora, float(lora_alpha if lora_alpha is not None else rank))
    return to_diffusers(state)


def load_components(
    paths: WeightPaths, dtype: torch.dtype, ema: bool, lora_alpha: float | None
) -> Components:
    """Load the base parts (offline) and the generator into a diffusers transformer."""
    import diffusers
    import transformers

    config = transformer_config(paths.base, TRANSFORMER_CLASS, BASE_REPO)
    transformer = build_transformer(
        config, generator_state(paths, ema, lora_alpha), dtype, f"generator {paths.generator}"
    )
    offline = {"local_files_only": True}
    loaders = {  # the tokenizer first: a folder asking to run its code is refused before weights
        "tokenizer": lambda: from_pretrained(
            transformers.AutoTokenizer, paths.base / "tokenizer", **offline
        ),
        "vae": lambda: from_pretrained(
            diffusers.AutoencoderKLWan,
            paths.base,
            subfolder="vae",
            torch_dtype=torch.float32,
            **offline,
        ),
        "text_encoder": lambda: from_pretrained(
            transformers.UMT5EncoderModel, paths.base / "text_encoder", dtype=dtype, **offline
        ),
    }
    parts = load_parts(loaders, "Wan base", paths.base)
    for name in ("vae", "text_encoder"):
        parts[name].eval().requires_grad_(False)
    return Components(transformer=transformer, **parts, source=str(paths.generator))


def save_base(components: Components, base: Path) -> None:
    """Write ``components``' Wan base parts in the diffusers layout ``load_components`` reads
    (the transformer's config only: its weights come from the generator; used by tests)."""
    components.transformer.save_config(base / "transformer")
    components.vae.save_pretrained(base / "vae")
    components.text_encoder.save_pretrained(base / "text_encoder")
    components.tokenizer.save_pretrained(base / "tokenizer")


# --------------------------------------------------------------------------- tiny, in memory


def tiny_components(seed: int = 0, dtype: torch.dtype = torch.float32) -> Components:
    """A tiny random ``WanTransformer3DModel`` (diffusers' Wan test config: patch (1, 2, 2),
    2 heads, 2 layers, ffn 32, cross-attn norm, RMS q/k norm across heads) with
    ``attention_head_dim = 32`` so that g = 32 divides it, plus the tiny Wan VAE, UMT5 encoder
    and tokenizer. Transformer and text encoder in ``dtype``; the global RNG is left untouched.
    """
    import diffusers

    transformer, vae, text_encoder, tokenizer = tiny_parts(
        diffusers.WanTransformer3DModel, seed, dtype
    )
    return Components(
        transformer=transformer,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        source="tiny-random",
        max_sequence_length=TINY_MAX_SEQUENCE_LENGTH,
    )


def planned_components(dtype: torch.dtype) -> Components:
    """Wan2.1-T2V-1.3B's transformer (:data:`WAN_T2V_1_3B`), VAE and UMT5-XXL at full size on
    ``meta``, for ``jbkv plan`` (:func:`~jbkv_cli.models.wan.planned.planned_parts`)."""
    import diffusers

    from jbkv_cli.models.wan.planned import planned_parts

    parts = planned_parts(diffusers.WanTransformer3DModel, WAN_T2V_1_3B, dtype, MAX_SEQUENCE_LENGTH)
    return Components(*parts, source="planned")
