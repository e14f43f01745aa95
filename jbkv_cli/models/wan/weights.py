"""Finding and loading a diffusers-format Wan directory (SkyReels-V2, Self-Forcing's base).

A local folder or a snapshot in the Hugging Face cache, never a download; which of its required
files are missing (all listed at once); its transformer config checked for the expected class;
each part loaded with any failure one :class:`WeightsNotFoundError`; the transformer cast to a
dtype while keeping diffusers' float32 islands, as ``from_pretrained(torch_dtype=...)`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.utils.errors import WeightsNotFoundError
from jbkv_cli.utils.jsonio import FileReadError, read_json
from jbkv_cli.utils.pretrained import CustomCodeError

# part -> (files that must all exist, groups of which at least one file must exist)
Required = dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]]

WEIGHTS = ("*.safetensors", "*.bin")


def hf_cache_snapshot(repo_id: str) -> Path | None:
    """The snapshot directory of ``repo_id`` in the local Hugging Face cache, if any."""
    from huggingface_hub import constants

    repo_dir = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    if snapshots.is_dir():
        found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None
    return None


def missing_parts(root: Path, required: Required) -> list[str]:
    """Every required file absent under ``root``, as ``part/file`` (``a|b``: any of them)."""
    missing: list[str] = []
    for part, (files, any_of) in required.items():
        folder = root / part
        for name in files:
            if not (folder / name).is_file():
                missing.append(f"{part}/{name}")
        for group in any_of:
            if not any(next(folder.glob(pattern), None) for pattern in group):
                missing.append(f"{part}/{'|'.join(group)}")
    return missing


def transformer_config(root: Path, class_name: str, expected: str) -> dict[str, Any]:
    """``root/transformer/config.json``; a malformed file or another ``_class_name`` is one
    :class:`WeightsNotFoundError` (``expected`` says what should be there)."""
    path = root / "transformer" / "config.json"
    try:
        config = read_json(path, finite=False)  # a regular file, at most 64 MiB
    except FileReadError as exc:
        raise WeightsNotFoundError(f"malformed {path}: {exc.reason}") from exc
    found = config.get("_class_name") if isinstance(config, dict) else None
    if found != class_name:
        raise WeightsNotFoundError(
            f"{path} describes {found!r}, not a {class_name}; expected {expected}"
        )
    return config


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_parts(loaders: dict[str, Callable[[], Any]], what: str, root: Path) -> dict[str, Any]:
    """Each part's loader run in turn; any failure one :class:`WeightsNotFoundError` naming
    ``what``, the part and its folder under ``root`` (a folder that asks to run its own code
    stays the :class:`~jbkv_cli.utils.pretrained.CustomCodeError` it is)."""
    parts: dict[str, Any] = {}
    for name, load in loaders.items():
        try:
            parts[name] = load()
        except CustomCodeError:
            raise
        except Exception as exc:  # any loader failure means a bad weights directory
            raise WeightsNotFoundError(
                f"could not load the {what} {name} from {root / name}: {first_line(exc)}"
            ) from exc
    return parts


def cast_keeping_fp32(transformer: Any, dtype: torch.dtype) -> None:
    """Cast parameters to ``dtype`` except those with a name part in ``_keep_in_fp32_modules``
    (rope, time embedder, the ``scale_shift_table`` modulation tables, norms), as
    ``from_pretrained(torch_dtype=...)`` does: it matches parameter names, so a table that is a
    parameter of a block (``blocks.0.scale_shift_table``) stays float32 too."""
    keep = set(getattr(transformer, "_keep_in_fp32_modules", None) or ())
    for name, param in transformer.named_parameters():
        target = torch.float32 if keep & set(name.split(".")) else dtype
        param.data = param.data.to(target)
