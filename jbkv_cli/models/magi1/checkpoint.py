"""Finding and loading the official MAGI-1 weights (offline).

Layout of ``sand-ai/MAGI-1`` (a local clone, ``--weights DIR``, ``$JBKV_MAGI1_DIR``, or the
Hugging Face hub cache)::

    <root>/ckpt/magi/<variant>/<inference_weight[.distill]>/model.safetensors.index.json + shards
                                                            (or a single model.safetensors)
    <root>/ckpt/t5/t5-v1_1-xxl/{config.json, tokenizer files, weights}
    <root>/ckpt/vae/{config.json, diffusion_pytorch_model.safetensors}
    <root>/special_tokens.npz        (upstream GitHub example/assets/special_tokens.npz)

A root that holds ``magi/``, ``t5/`` and ``vae/`` directly (no ``ckpt/``) works as well.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from jbkv_cli.models.magi1.config import Magi1Variant
from jbkv_cli.models.safetensors_io import check_state_dict as check_keys
from jbkv_cli.models.safetensors_io import open_safetensors
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError
from jbkv_cli.utils.jsonio import read_json

ENV_VAR = "JBKV_MAGI1_DIR"
HF_REPO = "sand-ai/MAGI-1"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FP8_KEYS = ("weight_scale", "input_scale", "smooth_scale")


@dataclass(frozen=True)
class WeightPaths:
    dit: Path
    t5: Path
    vae: Path
    special_tokens: Path


def _hf_snapshots() -> list[Path]:
    hub = os.environ.get("HF_HUB_CACHE")
    if hub is None:
        home = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
        hub = str(Path(home) / "hub")
    snaps = Path(hub) / ("models--" + HF_REPO.replace("/", "--")) / "snapshots"
    if not snaps.is_dir():
        return []
    return sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)


def _layout(root: Path, variant: Magi1Variant) -> WeightPaths:
    base = root / "ckpt" if (root / "ckpt").is_dir() else root
    return WeightPaths(
        dit=base / "magi" / variant.name / variant.weight_subdir,
        t5=base / "t5",
        vae=base / "vae",
        special_tokens=root / "special_tokens.npz",
    )


def _missing(paths: WeightPaths) -> list[str]:
    out = []
    if not ((paths.dit / INDEX).is_file() or (paths.dit / SINGLE).is_file()):
        out.append(f"{paths.dit / INDEX} (or {SINGLE}) + shards")
    t5 = paths.t5 / "t5-v1_1-xxl" if (paths.t5 / "t5-v1_1-xxl").is_dir() else paths.t5
    if not (t5 / "config.json").is_file():
        out.append(f"{paths.t5 / 't5-v1_1-xxl' / 'config.json'} (+ tokenizer and weights)")
    for name in ("config.json", "diffusion_pytorch_model.safetensors"):
        if not (paths.vae / name).is_file():
            out.append(str(paths.vae / name))
    if not paths.special_tokens.is_file():
        out.append(f"{paths.special_tokens} (upstream example/assets/special_tokens.npz)")
    return out


def locate(variant: Magi1Variant, weights: str | Path | None = None) -> WeightPaths:
    """Resolve the weight files of ``variant``; one :class:`WeightsNotFoundError` lists what's missing."""
    if variant.fp8:
        raise JbkvError(
            f"MAGI-1 {variant.name} holds FP8-quantized weights (flashinfer kernels); "
            "jbkv supports the BF16 checkpoints only: use 4.5B_distill, 4.5B_base, 24B_distill or 24B_base"
        )
    if weights is not None:
        roots, source = [Path(weights).expanduser()], "--weights"
    elif os.environ.get(ENV_VAR):
        roots, source = [Path(os.environ[ENV_VAR]).expanduser()], f"${ENV_VAR}"
    else:
        roots, source = _hf_snapshots(), f"the Hugging Face cache of {HF_REPO}"
    if not roots:
        raise WeightsNotFoundError(
            f"MAGI-1 weights not found: pass --weights DIR, set ${ENV_VAR}, or download {HF_REPO} "
            "into the Hugging Face cache"
        )
    first_missing: list[str] | None = None
    for root in roots:
        paths = _layout(root, variant)
        missing = _missing(paths)
        if not missing:
            return paths
        first_missing = first_missing or missing
    raise WeightsNotFoundError(
        f"MAGI-1 {variant.name} weights incomplete in {source} ({roots[0]}); missing: "
        + "; ".join(first_missing or [])
    )


def shard_files(directory: Path) -> dict[str, Path]:
    """``{parameter name: file}`` from the index json, or every key of ``model.safetensors``."""
    index = directory / INDEX
    if index.is_file():
        doc = read_json(index, "checkpoint index", finite=False)  # a regular file, <= 64 MiB
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(f, str) for f in weight_map.values()
        ):
            raise WeightsNotFoundError(f"{index} has no 'weight_map' of parameter -> file")
        files = {name: directory / f for name, f in weight_map.items()}
        for f in set(files.values()):
            if not f.is_file():
                zst = f.with_name(f.name + ".zst")
                hint = f" (decompress {zst.name} with `zstd -d`)" if zst.is_file() else ""
                raise WeightsNotFoundError(f"checkpoint shard missing: {f}{hint}")
        return files
    single = directory / SINGLE
    if not single.is_file():
        raise WeightsNotFoundError(f"no {INDEX} or {SINGLE} in {directory}")
    with open_safetensors(single) as fh:
        return dict.fromkeys(fh.keys(), single)


def read_state_dict(directory: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a (possibly sharded) safetensors checkpoint, on the CPU."""
    files = shard_files(Path(directory))
    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, []).append(name)
    state = {}
    for f, names in by_file.items():
        with open_safetensors(f) as fh:
            available = set(fh.keys())
            for name in names:
                if name not in available:
                    raise JbkvError(f"index lists {name} in {f.name}, which does not hold it")
                state[name] = fh.get_tensor(name)
    return state


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Raise one :class:`JbkvError` on FP8 weights, missing/unexpected keys or shape mismatches."""
    if any(k.endswith(FP8_KEYS) for k in state):
        raise JbkvError(
            f"{what}: FP8-quantized checkpoint (weight_scale/input_scale keys) is not supported"
        )
    check_keys(model, state, what)


def load_strict(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> nn.Module:
    """Check, then ``load_state_dict(strict=True, assign=True)`` (works for meta-device models)."""
    check_state_dict(model, state, what)
    model.load_state_dict(state, strict=True, assign=True)
    return model
