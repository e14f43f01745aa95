"""The typed result of a run: one :class:`ResultRow` per variant, shared by the report, the plots,
the regression gate and the JSON (whose keys are :meth:`ResultRow.to_dict`'s).

Each metric is a :class:`Stat`, mean ± standard error over videos (paired with the reference of
the same prompt and seed for PSNR, SSIM and LPIPS), or None when there is nothing to aggregate.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, fields
from typing import Any

from jbkv_cli.metrics.stats import aggregate

REFERENCE_IDS = ("bf16", "reference")


@dataclass(frozen=True)
class Stat:
    """Mean, standard error (None for one value) and count."""

    mean: float
    se: float | None
    n: int

    @classmethod
    def of(cls, values: list[float | None]) -> Stat | None:
        """The aggregate of the finite values (None when there are none)."""
        xs = [v for v in values if v is not None and math.isfinite(v)]
        if not xs:
            return None
        agg = aggregate(xs)
        return cls(agg["mean"], agg["se"], agg["n"])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, what: str) -> Stat | None:
        if data is None:
            return None
        ok = isinstance(data, dict) and _finite(data.get("mean"))
        ok = ok and (data.get("se") is None or _finite(data["se"]))
        ok = ok and (data.get("n") is None or type(data["n"]) is int)
        if not ok:
            raise ValueError(f"{what} is not {{'mean': number, 'se': ..., 'n': ...}} or null")
        return cls(float(data["mean"]), data.get("se"), data.get("n") or 0)


METRICS = ("psnr", "ssim", "lpips", "delta_ps", "jsd", "out_mse", "noise_var_ratio")
METRICS += ("noise_z_mean", "seconds", "token_shift")
METRICS += ("lp_shift", "lp_predicted", "lp_left", "lp_ratio")
METRICS += ("bias_share", "bias_explained", "attn_err_quant", "attn_err_bias")
METRICS += ("correction_removed", "attn_err_corrected")


@dataclass(frozen=True)
class ResultRow:
    """One variant of a run (see :func:`jbkv_cli.report.table.build_rows`)."""

    variant: str
    label: str
    quantizer: str
    bits: int
    group_size: int | None
    effective_bits: float | None
    corrected: bool
    correction: str
    keys: bool
    values: bool
    bias_only: bool
    psnr: Stat | None = None
    ssim: Stat | None = None
    lpips: Stat | None = None
    lpips_status: str | None = None
    delta_ps: Stat | None = None
    jsd: Stat | None = None
    out_mse: Stat | None = None
    noise_var_ratio: Stat | None = None
    noise_z_mean: Stat | None = None  # mean of δ/σ over cached scores: 0 for zero-mean noise
    kv_cache_bytes: int | None = None
    seconds: Stat | None = None
    videos: int = 0
    vbench: dict[str, Any] | None = None
    storage: str | None = (
        None  # how the cache is stored, without the correction (KVSpec.storage_id)
    )
    pruner: str = "none"  # the KV pruner's name (none: every cached token kept)
    kv_ratio: float | None = None  # kv_cache_bytes / the reference's, measured
    kv_bytes_by_head: dict[str, int] | None = None  # pruned: peak bytes per head class
    kv_bytes_by_cache: dict[str, int] | None = None  # peak bytes per cache (main, mouse, ...)
    # the cached log-partition shift of the stored keys (attention/partition.py), per video the
    # mean over observed calls: measured, the part the correction predicts, what it leaves, and
    # Σ predicted / Σ measured (1: exact; > 1 over-corrects; < 0 the wrong sign)
    lp_shift: Stat | None = None
    lp_predicted: Stat | None = None
    lp_left: Stat | None = None
    lp_ratio: Stat | None = None
    value_bits: int | None = None  # the values' width when it differs from the keys' (``bits``)
    token_shift: Stat | None = None  # share of queries whose top-1 token changed (QuantWM T. 4)
    # memory beside kv_cache_bytes (attention/memory.py), means over videos: the largest cache
    # read's working bytes (view + what attention builds), its ratio to the reference's, and on
    # CUDA the allocator's peak per video with the bytes resident before it (the weights)
    kv_working_bytes: int | None = None
    working_ratio: float | None = None
    cuda_peak_bytes: int | None = None
    cuda_resident_bytes: int | None = None
    # the keys' attention error with the stored keys vs exact keys + the predicted bias
    # (attention/bias_share.py): the share per video, and per layer {share: Stat, heads: [mean]}
    bias_share: Stat | None = None
    bias_explained: Stat | None = None  # 1 − Σ‖ô − o_β‖² / Σ‖ô − o‖²: direction-aware
    attn_err_quant: Stat | None = None
    attn_err_bias: Stat | None = None
    # what the variant's correction removes, measured on the same calls: 1 − Σ‖ô_corr − o‖² /
    # Σ‖ô − o‖² (None without a correction), and its mean squared error per output element
    correction_removed: Stat | None = None
    attn_err_corrected: Stat | None = None
    bias_share_by_layer: dict[str, Any] | None = None
    # of the token-rows the caches held after each commit, the share stored compressed, and
    # the share of rows a pruner dropped (kvcache/coverage.py); None: not recorded (old runs)
    compressed_share: float | None = None
    pruned_share: float | None = None
    # widths per layer (``--bits K2V2@0-3+K2V1@4-``; None: one width for every layer), and
    # whether the taylor correction met 1-bit keys, outside its range (run/bit_specs.py)
    layer_bits: str | None = None
    taylor_outside: bool = False

    @property
    def is_reference(self) -> bool:
        return self.variant in REFERENCE_IDS

    @property
    def claims_compression(self) -> bool:
        """The label names a method storing cached keys or values (not the bias-only ablation,
        which keeps the cache exact by design)."""
        return self.quantizer != "none" and not self.bias_only

    @property
    def no_op(self) -> bool:
        """It compressed nothing its label claims: its method stored no held row compressed,
        or its pruner dropped no token."""
        return (self.claims_compression and self.compressed_share == 0) or (
            self.pruner != "none" and self.pruned_share == 0
        )

    @property
    def compression_mark(self) -> str | None:
        """What the row must say about compression it did not do: ``no-op: nothing
        compressed`` / ``nothing pruned``, or ``compressed 62%`` when part of what its caches
        held stayed exact (sinks, residual tails, chunks waiting for a span); None when all of
        it was compressed or nothing was recorded."""
        marks = []
        share = self.compressed_share
        if self.claims_compression and share is not None and share < 1:
            marks.append(
                "no-op: nothing compressed" if share == 0 else f"compressed {percent(share)}"
            )
        if self.pruner != "none" and self.pruned_share == 0:
            marks.append("no-op: nothing pruned")
        return "; ".join(marks) or None

    @property
    def full(self) -> bool:
        """Keys and values both stored by the method, no ablation."""
        return self.keys and self.values and not self.bias_only

    def mean(self, metric: str) -> float | None:
        stat = getattr(self, metric)
        return None if stat is None else stat.mean

    def to_dict(self) -> dict[str, Any]:
        """The fields, and ``compression_mark`` (derived; read back from the shares)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Stat) else value
        out["compression_mark"] = self.compression_mark
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ResultRow:
        """A row from its JSON form; ``ValueError`` naming the field when it is malformed."""
        if not isinstance(data, dict):
            raise ValueError("a row is not an object")
        variant = data.get("variant")
        if not isinstance(variant, str):
            raise ValueError("a row has no 'variant'")
        if type(data.get("videos")) is not int:
            raise ValueError(f"row {variant} has no 'videos' count")
        kw: dict[str, Any] = {}
        for f in fields(cls):
            value = data.get(f.name)
            if f.name in METRICS:
                value = Stat.from_dict(value, f"row {variant}: {f.name}")
            kw[f.name] = value
        for key, kind in (("label", str), ("quantizer", str), ("correction", str)):
            if not isinstance(kw[key], kind):
                kw[key] = "" if kw[key] is None else str(kw[key])
        for key in ("keys", "values"):
            kw[key] = True if kw[key] is None else bool(kw[key])
        kw["corrected"], kw["bias_only"] = bool(kw["corrected"]), bool(kw["bias_only"])
        kw["taylor_outside"] = kw["taylor_outside"] is True
        kw["layer_bits"] = kw["layer_bits"] if isinstance(kw["layer_bits"], str) else None
        kw["pruner"] = kw["pruner"] if isinstance(kw["pruner"], str) else "none"
        kw["bits"] = kw["bits"] if type(kw["bits"]) is int else 16
        kw["value_bits"] = kw["value_bits"] if type(kw["value_bits"]) is int else None
        for key in ("kv_working_bytes", "cuda_peak_bytes", "cuda_resident_bytes"):
            kw[key] = kw[key] if type(kw[key]) is int else None
        kw["working_ratio"] = kw["working_ratio"] if _finite(kw["working_ratio"]) else None
        for key in ("compressed_share", "pruned_share"):
            kw[key] = float(kw[key]) if _finite(kw[key]) and 0 <= kw[key] <= 1 else None
        by_layer = kw["bias_share_by_layer"]
        kw["bias_share_by_layer"] = by_layer if isinstance(by_layer, dict) else None
        return cls(**kw)


def percent(share: float) -> str:
    """``0.625`` -> ``62.5%``, rounded down to 0.1% (never 100% below 1, never 0% above 0)."""
    if 0 < share < 0.001:
        return "<0.1%"
    tenths = math.floor(share * 1000 + 1e-9)
    return f"{(min(tenths, 999) if share < 1 else tenths) / 10:g}%"


def _finite(x: Any) -> bool:
    # an int beyond a float's range is not finite here (math.isfinite would raise on it)
    return (
        isinstance(x, int | float)
        and not isinstance(x, bool)
        and abs(x) <= sys.float_info.max
        and math.isfinite(x)
    )
