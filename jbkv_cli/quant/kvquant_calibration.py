"""KVQuant's calibration artifact: fixed per-layer tables fitted once on reference videos.

KVQuant (SqueezeAILab/KVQuant@57a23835) calibrates offline and keeps the tables fixed: the keys'
per-channel thresholds (the ``t`` / ``1 − t`` percentiles, before RoPE) and the codebooks of
keys and values. ``jbkv calibrate`` does the same on a video model: it runs the 16-bit reference
generation on a few prompts and seeds while a :class:`CommitCollector` keeps, per attention
layer, every key and value the caches commit (keys before RoPE on a model whose caches can hold
them so, :class:`~jbkv_cli.kvcache.spec.ExactPreRope`; else as cached, after RoPE), then fits
per layer exactly what :mod:`jbkv_cli.quant.kvquant` fits per chunk, pooled over every token
committed:

- keys: thresholds ``u``, ``l`` ``[H, D]`` per KV head and channel
  (:func:`~jbkv_cli.quant.kvquant.split_keys` over all tokens), then the codebook and its cells'
  variances over the non-outliers normalised by them;
- values: the codebook and cell variances over the per-token normalised non-outliers
  (:func:`~jbkv_cli.quant.kvquant.split_values`); their ranges stay per token, online.

File (safetensors, no pickle): tensors ``layer.{i}.{key|value}.{codebook|cell_var}`` ``[2^b]``
and ``layer.{i}.key.{upper|lower}`` ``[H, D]``, FP16; metadata ``jbkv = "calibrate"``,
``format``, ``model``, ``bits``, ``layout`` (the keys'), ``options`` (the method's, JSON),
``prompts``, ``seeds`` (JSON), ``version`` (jbkv's) and ``model_settings`` (JSON).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.quant.kvquant import (
    TABLE_DTYPE,
    FixedTables,
    KVQuant,
    exact_dtype,
    normalise,
    split_keys,
    split_values,
)
from jbkv_cli.quant.nuq import cell_variance, fit_codebook
from jbkv_cli.utils.errors import JbkvError, UsageError

FORMAT = 1
WRITER = "calibrate"  # metadata["jbkv"]: what wrote the file (never overwrite another's)
TABLES = ("codebook", "cell_var")
THRESHOLDS = ("upper", "lower")


class CalibrationMismatch(UsageError, ValueError):
    """A calibration file made for another model, bit width, layout or layer count: a usage
    error on the command line (one line, exit 2), a ``ValueError`` to library callers."""


@dataclass(frozen=True)
class Calibration:
    """The fitted tables: ``layers[i]`` maps ``key``/``value`` to the layer's
    :class:`~jbkv_cli.quant.kvquant.FixedTables`; ``meta`` the file's metadata (strings)."""

    layers: tuple[dict[str, FixedTables], ...]
    meta: dict[str, str]

    def tables(self, layer: int, role: str) -> FixedTables:
        return self.layers[layer][role]

    def nbytes(self, layer: int, role: str) -> int:
        """What one layer's fixed tables of ``role`` hold (a cache counts them once)."""
        return sum(
            t.numel() * t.element_size() for t in _tensors(self.tables(layer, role)).values()
        )

    def nbytes_per_layer(self) -> list[int]:
        """What each layer's fixed tables hold (counted once per layer, not per chunk)."""
        return [self.nbytes(i, "key") + self.nbytes(i, "value") for i in range(len(self.layers))]


def _tensors(t: FixedTables) -> dict[str, torch.Tensor]:
    out = {"codebook": t.codebook, "cell_var": t.cell_var}
    if t.upper is not None:
        out |= {"upper": t.upper, "lower": t.lower}
    return out


class CommitCollector:
    """An attention observer (:class:`~jbkv_cli.attention.diagnostics.AttentionObserver`) that
    only keeps what each layer's cache commits: ``keys[i]``, ``values[i]`` lists of
    ``[B, H, L, D]`` float32 CPU copies (caches without a layer index are left out)."""

    every = 2**62  # never asks for an attention call

    def __init__(self) -> None:
        self.keys: dict[int, list[torch.Tensor]] = {}
        self.values: dict[int, list[torch.Tensor]] = {}

    def observe(self, *args: Any, **kwargs: Any) -> None:
        """Attention calls are not what calibration reads."""

    def committed(self, layer: int | None, k: torch.Tensor, v: torch.Tensor) -> None:
        if layer is None:
            return
        self.keys.setdefault(layer, []).append(k.detach().float().cpu())
        self.values.setdefault(layer, []).append(v.detach().float().cpu())


def pooled(chunks: list[torch.Tensor]) -> torch.Tensor:
    """Chunks ``[B, H, L, D]`` as one ``[1, H, N, D]``: every token of every batch row."""
    x = torch.cat([c.transpose(0, 1).flatten(1, 2) for c in chunks], dim=1)
    return x.unsqueeze(0)


def fit_role(method: KVQuant, x: torch.Tensor, role: str) -> FixedTables:
    """The fixed tables of one layer's ``role`` from its tokens ``x [1, H, N, D]``, fitted as
    :meth:`KVQuant.quantize_fixed` fits a chunk (module docstring)."""
    exact = exact_dtype(x.dtype)
    split = (split_keys if role == "key" else split_values)(x, method.outliers, exact)
    z, keep = normalise(x, split)
    k = 1 << method.bits
    zr, wr = z.reshape(1, -1), keep.reshape(1, -1)
    book = fit_codebook(zr, wr, k, method.iters).to(TABLE_DTYPE)
    var = cell_variance(zr, wr, book).to(TABLE_DTYPE)
    if role != "key":
        return FixedTables(book[0], var[0])
    upper, lower = (t.reshape(t.shape[-3], t.shape[-1]) for t in (split.upper, split.lower))
    return FixedTables(book[0], var[0], upper.contiguous(), lower.contiguous())


def fit_calibration(
    method: KVQuant, collector: CommitCollector, meta: dict[str, str]
) -> Calibration:
    """Fit every layer the collector saw (layers ``0 … n−1``, each with keys and values)."""
    layers = sorted(collector.keys)
    if not layers:
        raise JbkvError("calibration saw no committed chunk (nothing was cached)")
    if layers != list(range(len(layers))):
        raise JbkvError(f"calibration saw layers {layers}, not 0…{len(layers) - 1}")
    fitted = tuple(
        {
            "key": fit_role(method, pooled(collector.keys[i]), "key"),
            "value": fit_role(method, pooled(collector.values[i]), "value"),
        }
        for i in layers
    )
    return Calibration(fitted, {**meta, "jbkv": WRITER, "format": str(FORMAT)})


def to_tensors(cal: Calibration) -> dict[str, torch.Tensor]:
    """The file's tensors by name (module docstring)."""
    return {
        f"layer.{i}.{role}.{name}": t.contiguous()
        for i, layer in enumerate(cal.layers)
        for role, tables in layer.items()
        for name, t in _tensors(tables).items()
    }


def save_calibration(cal: Calibration, path: str | Path) -> None:
    """Write ``cal`` to ``path`` atomically (a temp file renamed into place)."""
    from safetensors.torch import save_file

    from jbkv_cli.utils.atomic import atomic_path

    with atomic_path(path) as tmp:
        save_file(to_tensors(cal), str(tmp), metadata=cal.meta)


def written_by_calibrate(path: str | Path) -> bool:
    """Whether ``path`` is a file ``jbkv calibrate`` wrote (what it may overwrite)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return (handle.metadata() or {}).get("jbkv") == WRITER
    except (SafetensorError, OSError, ValueError):
        return False


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration file (safetensors only: pickles refused); a one-line
    :class:`JbkvError` for a file ``jbkv calibrate`` did not write or a damaged one."""
    from jbkv_cli.models.safetensors_io import open_safetensors

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no calibration file {path}")
    with open_safetensors(path) as handle:
        meta = dict(handle.metadata() or {})
        if meta.get("jbkv") != WRITER:
            raise JbkvError(f"{path} is not a calibration file written by jbkv calibrate")
        if meta.get("format") != str(FORMAT):
            raise JbkvError(
                f"{path}: calibration format {meta.get('format')}, this jbkv reads {FORMAT}"
            )
        names = set(handle.keys())
        layers = []
        for i in range(len(names)):
            if f"layer.{i}.key.codebook" not in names:
                break
            layer = {}
            for role in ("key", "value"):
                parts = TABLES + (THRESHOLDS if role == "key" else ())
                if any(f"layer.{i}.{role}.{n}" not in names for n in parts):
                    raise JbkvError(f"{path}: layer {i} lacks its {role} tables")
                got = {n: handle.get_tensor(f"layer.{i}.{role}.{n}") for n in parts}
                layer[role] = FixedTables(**got)
            layers.append(layer)
    if not layers or len(to_tensors(Calibration(tuple(layers), meta))) != len(names):
        raise JbkvError(f"{path}: its tensors are not a calibration's layer tables")
    return Calibration(tuple(layers), meta)


def check_calibration(
    cal: Calibration, path: str | Path, *, model: str, bits: int, layers: int | None = None
) -> None:
    """Refuse (one line, :class:`UsageError`) a file made for another model, bit width or
    number of layers."""
    made = cal.meta.get("model")
    if made != model:
        raise UsageError(f"calibration {path} was made for model {made}, not {model}")
    if cal.meta.get("bits") != str(bits):
        raise UsageError(f"calibration {path} was made for {cal.meta.get('bits')} bits, not {bits}")
    if layers is not None and len(cal.layers) != layers:
        raise UsageError(f"calibration {path} has {len(cal.layers)} layers, the model {layers}")


def metadata(
    method: KVQuant,
    model: str,
    layout: str,
    prompts: list[str],
    seeds: list[int],
    settings: dict[str, Any],
) -> dict[str, str]:
    """The file's metadata (module docstring), all strings as safetensors keeps them."""
    from jbkv_cli import __version__

    return {
        "model": model,
        "bits": str(method.bits),
        "layout": layout,
        "options": json.dumps(method.options(), sort_keys=True),
        "prompts": json.dumps(prompts),
        "seeds": json.dumps(seeds),
        "version": __version__,
        "model_settings": json.dumps(settings, sort_keys=True, default=str),
    }
