"""MAGI-1 (SandAI) natively in PyTorch: the official BF16 checkpoints, jbkv's KV cache.

``load_model(**options)`` builds a :class:`~jbkv_cli.models.magi1.model.Magi1VideoModel`:

    config        "4.5B_distill" (default) | "4.5B_base" | "24B_distill" | "24B_base" | "tiny-random"
    weights       root of sand-ai/MAGI-1 (else $JBKV_MAGI1_DIR, else the Hugging Face cache)
    steps         denoising steps (default 16 for distill, 64 for base, 4 for tiny-random)
    height, width video size in pixels (multiples of 16; default 720x720, 24B 720x1280)
    num_chunks    chunks of 24 frames (default 4 = 96 frames)
    window        cached chunks per layer (default: what the kv ranges need, 1 for 5,4,3,2)
    kv_range      attention range per stage in chunks (default 5,4,3,2)
    device, dtype default cuda + bfloat16 when available, else cpu + float32
    attention_backend  fused | flex | reference (default: chosen per device, docs/library.md)
    offload       move T5 / DiT / VAE to the device only for their phase (default: on CUDA)
    nearly_clean_refine  distill models' extra context-free pass (default True)
    special_tokens path of special_tokens.npz (default <weights>/special_tokens.npz)
    seed          init seed of tiny-random
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.models import limits
from jbkv_cli.models.base import located
from jbkv_cli.models.contract import ModelEntry
from jbkv_cli.models.dtypes import dtype_from_name
from jbkv_cli.models.magi1.checkpoint import load_strict, locate, read_state_dict
from jbkv_cli.models.magi1.config import DEFAULT_VARIANT, TINY_VARIANT, VARIANTS, VAEConfig
from jbkv_cli.models.magi1.dit import VideoDiT
from jbkv_cli.models.magi1.layers import promote_high_precision
from jbkv_cli.models.magi1.model import GenerationSettings, Magi1VideoModel, with_schedule_overrides
from jbkv_cli.models.magi1.schedule import required_window
from jbkv_cli.models.magi1.text import SpecialTokens, T5TextEncoder, load_t5
from jbkv_cli.models.magi1.vae import ViTVAE
from jbkv_cli.models.t5_xxl import XXL_SHAPE
from jbkv_cli.utils.errors import JbkvError, UsageError
from jbkv_cli.utils.fields import Spec, parse_options
from jbkv_cli.utils.jsonio import read_json

__all__ = ["ENTRY", "OPTIONS", "Magi1VideoModel", "check_options", "input_paths", "load_model"]

OPTIONS: dict[str, Spec] = {
    "config": Spec("str", choices=(*VARIANTS, TINY_VARIANT.name)),
    "weights": limits.PATH,
    "steps": limits.STEPS,
    "height": limits.SIDE,
    "width": limits.SIDE,
    "num_chunks": limits.CHUNKS,
    "window": Spec("int", lo=1, hi=limits.MAX_CHUNKS),
    "kv_range": Spec("ints", lo=1, hi=limits.MAX_CHUNKS),
    "device": limits.DEVICE,
    "dtype": limits.DTYPE,
    "attention_backend": Spec("str", choices=("fused", "flex", "reference")),
    "offload": limits.FLAG,
    "nearly_clean_refine": limits.FLAG,
    "special_tokens": limits.PATH,
    "seed": limits.SEED,
}


def _kv_range(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    try:
        out = tuple(int(v) for v in value)
    except (TypeError, ValueError) as e:
        raise UsageError(f"kv_range must be chunk counts like 5,4,3,2, got {value!r}") from e
    if not out or min(out) < 1:
        raise UsageError(f"kv_range must be positive chunk counts, got {value!r}")
    return out


def _device_dtype(device: str | None, dtype: str | torch.dtype | None) -> tuple[str, torch.dtype]:
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {dev!r} requested but CUDA is not available")
    if dtype is None:
        dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    else:
        dt = dtype_from_name(dtype)
    return dev, dt


def _prepare(module: torch.nn.Module, device: str, dtype: torch.dtype, offload: bool):
    module = module.to(dtype)
    if isinstance(module, VideoDiT):
        promote_high_precision(module)
        module.compute_dtype = dtype
    return module.to("cpu" if offload else device).eval()


def _resolved(options: dict[str, Any]) -> tuple[Any, GenerationSettings, dict[str, Any]]:
    """``(variant, settings, options without None)`` from the options, each parsed by its
    declared type and bounds (:data:`OPTIONS`) first."""
    opt = parse_options(OPTIONS, options, "magi1", sep=": ", error=UsageError)
    name = str(opt.get("config", DEFAULT_VARIANT))
    if name == TINY_VARIANT.name:
        variant = TINY_VARIANT
    elif name in VARIANTS:
        variant = VARIANTS[name]
    else:
        known = ", ".join([*VARIANTS, TINY_VARIANT.name])
        raise UsageError(f"unknown MAGI-1 config {name!r}; choose one of: {known}")
    variant = with_schedule_overrides(variant, opt.get("steps"), _kv_range(opt.get("kv_range")))
    sched = variant.schedule
    device, dtype = _device_dtype(opt.get("device"), opt.get("dtype"))
    height = int(opt.get("height", variant.default_height))
    width = int(opt.get("width", variant.default_width))
    mult = sched.spatial_downsample_factor * variant.dit.patch_size
    if height % mult or width % mult or height <= 0 or width <= 0:
        raise UsageError(
            f"MAGI-1 video size must be a positive multiple of {mult}, got {height}x{width}"
        )
    num_chunks = int(opt.get("num_chunks", variant.default_num_chunks))
    if num_chunks < 1:
        raise UsageError(f"num_chunks must be >= 1, got {num_chunks}")
    window = int(opt.get("window", required_window(num_chunks, sched)))
    if window < 1:
        raise UsageError(f"window must be >= 1 chunk, got {window}")
    backend = opt.get("attention_backend")
    if backend is not None and backend not in ("fused", "flex", "reference"):
        raise UsageError(f"attention_backend must be fused, flex or reference, got {backend!r}")
    offload = bool(opt.get("offload", device.startswith("cuda")))
    settings = GenerationSettings(
        height=height,
        width=width,
        num_chunks=num_chunks,
        window=window,
        device=device,
        dtype=dtype,
        offload=offload,
        attention_backend=backend,
        nearly_clean_refine=bool(opt.get("nearly_clean_refine", True)),
    )
    return variant, settings, opt


def check_options(**options: Any) -> None:
    """Refuse what :func:`load_model` would refuse for these options (values, missing weight
    files) without building the model."""
    variant, _, opt = _resolved(options)
    if variant.name != TINY_VARIANT.name:
        locate(variant, opt.get("weights"))


def input_paths(**options: Any) -> dict[str, Path]:
    """Role -> the weight files and folders these options read (none for the tiny config);
    a ``special_tokens`` option replaces the located file."""
    variant, _, opt = _resolved(options)
    if variant.name == TINY_VARIANT.name:
        return {}
    found = located(locate(variant, opt.get("weights")))
    if opt.get("special_tokens"):
        found["special_tokens"] = Path(opt["special_tokens"])
    return found


def load_model(**options: Any) -> Magi1VideoModel:
    """Build MAGI-1 (see the module docstring for the options; None means "default")."""
    variant, settings, opt = _resolved(options)
    if variant.name == TINY_VARIANT.name:
        return _tiny(variant, settings, int(opt.get("seed", 0)))
    return _official(variant, settings, opt.get("weights"), opt.get("special_tokens"))


def _tiny(variant, settings: GenerationSettings, seed: int) -> Magi1VideoModel:
    from jbkv_cli.models.magi1.config import TINY_VAE
    from jbkv_cli.models.magi1.tiny import tiny_dit, tiny_special_tokens, tiny_t5, tiny_vae

    dev, dt, off = settings.device, settings.dtype, settings.offload
    dit = _prepare(tiny_dit(variant.dit, seed), dev, dt, off)
    vae = _prepare(tiny_vae(TINY_VAE, seed), dev, dt, off)
    t5 = tiny_t5(variant.dit.caption_channels, variant.dit.caption_max_length, seed)
    t5.to("cpu" if off else dev)
    special = tiny_special_tokens(variant.dit.caption_channels, seed)
    return Magi1VideoModel(variant, dit, vae, t5, special, settings)


# google/t5-v1_1-xxl's config.json (the encoder upstream's ckpt/t5/t5-v1_1-xxl holds)
T5_XXL = dict(XXL_SHAPE, vocab_size=32128, pad_token_id=0, eos_token_id=1)


def plan_model(**options: Any) -> Magi1VideoModel:
    """MAGI-1 as a GPU runs it (``cuda``, bfloat16 unless ``dtype`` says otherwise, offloaded
    phases unless ``offload=false``) at the configuration the options name, for ``jbkv plan``:
    every module built on ``meta`` (no weight allocated, none read: the DiT of ``config``,
    the VAE of :class:`~jbkv_cli.models.magi1.config.VAEConfig`'s published numbers, T5
    v1.1-XXL of :data:`T5_XXL` with a character tokenizer padding to the same 800 tokens, zero
    special tokens), then placed as :func:`load_model` places it; the plan's fake device turns
    the placement into shapes."""
    from transformers import T5Config, T5EncoderModel

    from jbkv_cli.models.magi1.config import TINY_VAE
    from jbkv_cli.models.magi1.text import MAX_DURATION_TOKENS
    from jbkv_cli.models.magi1.tiny import char_tokenizer, tiny_t5_config

    given = {k: v for k, v in options.items() if v is not None}
    variant, settings, opt = _resolved({**given, "device": "cpu"})
    dtype = dtype_from_name(opt.get("dtype", "bfloat16"))
    offload = bool(opt.get("offload", True))
    settings = replace(settings, device="cuda", dtype=dtype, offload=offload)
    tiny = variant.name == TINY_VARIANT.name
    t5_config = tiny_t5_config(variant.dit.caption_channels) if tiny else T5Config(**T5_XXL)
    with torch.device("meta"):
        dit = VideoDiT(variant.dit)
        vae = ViTVAE(TINY_VAE if tiny else VAEConfig())
        t5 = T5EncoderModel(t5_config)
    device = settings.device
    dit = _prepare(dit, device, dtype, offload)
    vae = _prepare(vae, device, dtype, offload)
    t5 = t5.to("cpu" if offload else device)
    text = T5TextEncoder(char_tokenizer(), t5, variant.dit.caption_max_length)
    channels = variant.dit.caption_channels
    special = SpecialTokens(torch.zeros(channels), torch.zeros(MAX_DURATION_TOKENS, channels))
    return Magi1VideoModel(variant, dit, vae, text, special, settings)


def load_vae(directory, device: str = "cpu", dtype: torch.dtype = torch.float32) -> ViTVAE:
    """Upstream's ``ViTVAE`` from ``config.json`` + ``diffusion_pytorch_model.safetensors``."""
    from pathlib import Path

    from safetensors.torch import load_file

    directory = Path(directory)
    raw = read_json(directory / "config.json", "MAGI-1 VAE config", finite=False)
    if not isinstance(raw, dict):
        raise JbkvError(f"{directory / 'config.json'} is not a JSON object")
    if raw.get("model_type", "vit") != "vit":
        raise JbkvError(f"unsupported MAGI-1 VAE model_type {raw.get('model_type')!r}")
    cfg = VAEConfig.from_dict(raw.get("ddconfig", raw))
    with torch.device("meta"):
        vae = ViTVAE(cfg)
    state = load_file(str(directory / "diffusion_pytorch_model.safetensors"))
    load_strict(vae, state, f"MAGI-1 VAE ({directory})")
    return vae.to(device, dtype).eval()


def load_dit(directory, cfg) -> VideoDiT:
    """The DiT from a (sharded) safetensors checkpoint, strict, with upstream key names."""
    with torch.device("meta"):
        dit = VideoDiT(cfg)
    return load_strict(dit, read_state_dict(directory), f"MAGI-1 DiT ({directory})")


def _official(variant, settings: GenerationSettings, weights, special_tokens) -> Magi1VideoModel:
    paths = locate(variant, weights)
    dev, dt, off = settings.device, settings.dtype, settings.offload
    dit = _prepare(load_dit(paths.dit, variant.dit), dev, dt, off)
    vae = load_vae(paths.vae, "cpu" if off else dev, dt)
    t5 = load_t5(paths.t5, variant.dit.caption_max_length, "cpu" if off else dev)
    special = SpecialTokens.from_npz(special_tokens or paths.special_tokens)
    return Magi1VideoModel(variant, dit, vae, t5, special, settings)


ENTRY = ModelEntry(
    load_model=load_model,
    check_options=check_options,
    input_paths=input_paths,
    plan_model=plan_model,
    plan_blocks=lambda model: model.dit.videodit_blocks.layers,
)
