"""Finding and loading HY-WorldPlay's weights (offline, safetensors only, strict).

One folder (``--weights DIR`` or ``$JBKV_HYWORLDPLAY_DIR``) holds the layout upstream's
``download_models.py`` builds (the HunyuanVideo-1.5 folder with the encoders copied in) plus
HY-WorldPlay's AR-distilled action model::

    DIR/ar_distilled_action_model/diffusion_pytorch_model.safetensors   (or model.safetensors)
    DIR/transformer/480p_i2v/config.json
    DIR/vae/{config.json, diffusion_pytorch_model.safetensors}
    DIR/text_encoder/llm/                Qwen2.5-VL-7B-Instruct (config, tokenizer, safetensors)
    DIR/text_encoder/byt5-small/         google/byt5-small (config.json; its weights unused)
    DIR/text_encoder/Glyph-SDXL-v2/assets/{color_idx.json, multilingual_10-lang_idx.json}
    DIR/text_encoder/Glyph-SDXL-v2/checkpoints/byt5_model.safetensors
    DIR/vision_encoder/siglip/{image_encoder/, feature_extractor/}   FLUX.1-Redux-dev (gated)

Without either, the Hugging Face cache: the newest snapshot of ``tencent/HunyuanVideo-1.5``
(into which ``download_models.py`` copies the encoders) for everything but the action model,
and of ``tencent/HY-WorldPlay`` for ``ar_distilled_action_model/``. What is missing is listed
in one :class:`~jbkv_cli.utils.errors.WeightsNotFoundError`, each item with where it comes from.

Glyph-SDXL-v2 ships ``byt5_model.pt``, a pickle: jbkv never unpickles at load time, so it is
converted once (``jbkv convert-checkpoint byt5_model.pt --glyph``, :func:`convert_glyph`).
FP8 or other quantized checkpoints (float8/int8 tensors, ``weight_scale``/``input_scale``
keys: upstream's ``use_fp8_gemm`` path) are refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from jbkv_cli.models.hy_worldplay.config import OFFICIAL, DiTConfig
from jbkv_cli.models.safetensors_io import check_state_dict, open_safetensors
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError
from jbkv_cli.utils.jsonio import read_json

ENV_VAR = "JBKV_HYWORLDPLAY_DIR"
HF_BASE = "tencent/HunyuanVideo-1.5"
HF_WORLDPLAY = "tencent/HY-WorldPlay"
DIT_DIR = "ar_distilled_action_model"
DIT_FILES = ("diffusion_pytorch_model.safetensors", "model.safetensors")
GLYPH = "text_encoder/Glyph-SDXL-v2"
QUANT_KEYS = ("weight_scale", "input_scale", "smooth_scale", "weight_zero_point")
QUANT_DTYPES = ("F8_E4M3", "F8_E5M2", "I8", "U8", "I4", "U4")
SOURCES = {
    "dit": f"{HF_WORLDPLAY} ({DIT_DIR}/)",
    "dit_config": f"{HF_BASE} (transformer/480p_i2v/)",
    "vae": f"{HF_BASE} (vae/)",
    "qwen": "Qwen/Qwen2.5-VL-7B-Instruct",
    "byt5": "google/byt5-small",
    "glyph": "AI-ModelScope/Glyph-SDXL-v2 (ModelScope); convert byt5_model.pt with "
    "`jbkv convert-checkpoint byt5_model.pt --glyph`",
    "siglip": "black-forest-labs/FLUX.1-Redux-dev (gated: request access on Hugging Face)",
}


@dataclass(frozen=True)
class WeightPaths:
    dit: Path
    dit_config: Path
    vae: Path
    qwen: Path
    byt5: Path
    glyph: Path
    siglip: Path


def _snapshots(repo: str) -> list[Path]:
    hub = os.environ.get("HF_HUB_CACHE")
    if hub is None:
        home = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
        hub = str(Path(home) / "hub")
    snaps = Path(hub) / ("models--" + repo.replace("/", "--")) / "snapshots"
    if not snaps.is_dir():
        return []
    return sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)


def _dit_file(root: Path) -> Path:
    for name in DIT_FILES:
        if (root / DIT_DIR / name).is_file():
            return root / DIT_DIR / name
    return root / DIT_DIR / DIT_FILES[0]


def layout(base: Path, worldplay: Path) -> WeightPaths:
    return WeightPaths(
        dit=_dit_file(worldplay),
        dit_config=base / "transformer" / "480p_i2v" / "config.json",
        vae=base / "vae",
        qwen=base / "text_encoder" / "llm",
        byt5=base / "text_encoder" / "byt5-small",
        glyph=base / GLYPH,
        siglip=base / "vision_encoder" / "siglip",
    )


def missing(paths: WeightPaths) -> list[str]:
    """What of ``paths`` is not there, each with where to get it."""
    need = {
        "dit": [paths.dit],
        "dit_config": [paths.dit_config],
        "vae": [paths.vae / "config.json", paths.vae / "diffusion_pytorch_model.safetensors"],
        "qwen": [paths.qwen / "config.json"],
        "byt5": [paths.byt5 / "config.json"],
        "glyph": [
            paths.glyph / "assets" / "color_idx.json",
            paths.glyph / "assets" / "multilingual_10-lang_idx.json",
            paths.glyph / "checkpoints" / "byt5_model.safetensors",
        ],
        "siglip": [
            paths.siglip / "image_encoder" / "config.json",
            paths.siglip / "feature_extractor" / "preprocessor_config.json",
        ],
    }
    out = []
    for part, files in need.items():
        absent = [f for f in files if not f.is_file()]
        if absent:
            out.append(f"{', '.join(map(str, absent))} (from {SOURCES[part]})")
    return out


def _roots(weights: str | Path | None) -> tuple[list[tuple[Path, Path]], str]:
    if weights is not None:
        root = Path(weights).expanduser()
        return [(root, root)], "--weights"
    if os.environ.get(ENV_VAR):
        root = Path(os.environ[ENV_VAR]).expanduser()
        return [(root, root)], f"${ENV_VAR}"
    bases, plays = _snapshots(HF_BASE), _snapshots(HF_WORLDPLAY)
    pairs = [(b, p) for b in bases for p in plays] or [(b, b) for b in bases]
    return pairs, f"the Hugging Face cache ({HF_BASE} + {HF_WORLDPLAY})"


def locate(weights: str | Path | None = None) -> WeightPaths:
    """The weight files; one :class:`WeightsNotFoundError` lists everything missing. The
    action model is checked for quantized tensors (header only)."""
    roots, source = _roots(weights)
    if not roots:
        raise WeightsNotFoundError(
            f"HY-WorldPlay weights not found: pass --weights DIR, set ${ENV_VAR}, or download "
            f"{HF_BASE} and {HF_WORLDPLAY} into the Hugging Face cache (upstream's "
            "download_models.py); see docs/models.md"
        )
    first: list[str] | None = None
    for base, play in roots:
        paths = layout(base, play)
        absent = missing(paths)
        if not absent:
            refuse_quantized(paths.dit)
            return paths
        first = first or absent
    raise WeightsNotFoundError(
        f"HY-WorldPlay weights incomplete in {source} ({roots[0][0]}); missing: "
        + "; ".join(first or [])
    )


def refuse_quantized(path: Path) -> None:
    """A :class:`JbkvError` when the checkpoint holds FP8/integer weights or their scales."""
    with open_safetensors(path) as fh:
        for name in fh.keys():  # noqa: SIM118
            dtype = fh.get_slice(name).get_dtype()
            if name.endswith(QUANT_KEYS) or dtype in QUANT_DTYPES:
                raise JbkvError(
                    f"{path} is a quantized checkpoint ({name}: {dtype}); jbkv runs the BF16 "
                    f"{DIT_DIR} only (its KV cache is what jbkv quantizes)"
                )


def check_dit_config(path: Path, cfg: DiTConfig = OFFICIAL) -> None:
    """The 480p i2v config must describe the architecture jbkv builds."""
    raw = read_json(path, "HunyuanVideo-1.5 transformer config", finite=False)
    if not isinstance(raw, dict):
        raise JbkvError(f"{path} is not a JSON object")
    expect = {
        "hidden_size": cfg.hidden_size,
        "heads_num": cfg.heads_num,
        "mm_double_blocks_depth": cfg.mm_double_blocks_depth,
        "mm_single_blocks_depth": 0,
        "in_channels": cfg.in_channels,
        "rope_dim_list": list(cfg.rope_dim_list),
        "text_states_dim": cfg.text_states_dim,
        "vision_states_dim": cfg.vision_states_dim,
    }
    wrong = [f"{k}={raw[k]!r} (jbkv: {v!r})" for k, v in expect.items() if k in raw and raw[k] != v]
    if wrong:
        raise JbkvError(f"{path} is not the 480p i2v transformer jbkv ports: " + ", ".join(wrong))


def load_strict(model: nn.Module, path: Path, what: str) -> nn.Module:
    """All tensors of ``path`` into ``model`` (meta-built), strict, upstream names."""
    with open_safetensors(path) as fh:
        state = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    check_state_dict(model, state, what)
    model.load_state_dict(state, strict=True, assign=True)
    return model


GLYPH_PREFIX = "module.text_tower.encoder."


def glyph_state(raw: dict) -> dict[str, torch.Tensor]:
    """The ByT5 encoder stack's tensors of Glyph-SDXL-v2's checkpoint: ``state_dict`` entries
    under ``module.text_tower.encoder.``, prefix stripped (upstream's ``create_byt5``), or the
    file's tensors as they are when it has no ``state_dict``."""
    if "state_dict" in raw:
        sd = raw["state_dict"]
        return {k[len(GLYPH_PREFIX) :]: v for k, v in sd.items() if k.startswith(GLYPH_PREFIX)}
    return {k: v for k, v in raw.items() if isinstance(v, torch.Tensor)}


def convert_glyph(src: Path, dst: Path) -> int:
    """Write Glyph-SDXL-v2's ``byt5_model.pt`` as safetensors (read with
    ``torch.load(weights_only=True)``: no pickle code runs); checked and written as
    ``convert-checkpoint`` writes (never over a file it did not write; atomic). Returns the
    tensor count."""
    from safetensors.torch import save_file

    from jbkv_cli.models.wan.self_forcing.checkpoint import check_conversion
    from jbkv_cli.utils.atomic import atomic_path, remove_stale_temps_of

    check_conversion(src, dst)
    try:
        raw = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable checkpoint is one line
        raise JbkvError(f"cannot read {src}: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(raw, dict):
        raise JbkvError(f"{src} does not hold a state dict")
    state = {k: v.detach().contiguous().clone() for k, v in glyph_state(raw).items()}
    if not state:
        raise JbkvError(f"{src} holds no ByT5 encoder tensors ({GLYPH_PREFIX}*)")
    remove_stale_temps_of(dst)
    try:
        with atomic_path(dst) as tmp:
            save_file(state, str(tmp), metadata={"source": src.name, "jbkv": "convert-checkpoint"})
    except OSError as exc:
        raise JbkvError(f"cannot write {dst}: {exc.strerror or exc}") from exc
    return len(state)
