"""Per-variant aggregates of what a video record keeps of memory and of the attention-error
split, for :func:`jbkv_cli.report.table.build_rows` and the heatmap (:func:`jbkv_cli.report.plots`).

Records hold ``working_bytes`` (:meth:`~jbkv_cli.attention.memory.WorkingMeter.to_dict`),
``cuda_memory`` (:func:`~jbkv_cli.attention.memory.cuda_peak`) and ``attention_error``
(:meth:`~jbkv_cli.attention.diagnostics.AttentionRecorder.attention_error`); runs made before
them lack the keys, and their rows show none of these numbers.
"""

from __future__ import annotations

from typing import Any

from jbkv_cli.attention.bias_share import explained, removed, share
from jbkv_cli.report.results import Stat


def _mean_int(values: list[Any]) -> int | None:
    xs = [v for v in values if type(v) is int]
    return round(sum(xs) / len(xs)) if xs else None


def memory_fields(records: list[dict[str, Any]]) -> dict[str, int | None]:
    """``kv_working_bytes``, ``cuda_peak_bytes``, ``cuda_resident_bytes``: means over videos."""
    working = [(r.get("working_bytes") or {}).get("read") for r in records]
    cuda = [r.get("cuda_memory") or {} for r in records]
    return {
        "kv_working_bytes": _mean_int(working),
        "cuda_peak_bytes": _mean_int([c.get("peak_bytes") for c in cuda]),
        "cuda_resident_bytes": _mean_int([c.get("resident_bytes") for c in cuda]),
    }


def bias_share_by_layer(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``{layer: {"share", "explained", "removed": Stat dicts over videos (removed: None
    without a correction), "heads": [mean share per head]}}``."""
    per_layer: dict[str, list[float]] = {}
    per_layer_explained: dict[str, list[float]] = {}
    per_layer_removed: dict[str, list[float | None]] = {}
    per_head: dict[str, list[list[float]]] = {}
    for r in records:
        layers = (r.get("attention_error") or {}).get("layers") or []
        for index, e_quant, e_bias, _, heads_quant, heads_bias, e_left, *rest in layers:
            layer = str(index)
            s = share(e_bias, e_quant)
            if s is not None:
                per_layer.setdefault(layer, []).append(s)
                per_layer_explained.setdefault(layer, []).append(explained(e_left, e_quant))
                e_corr = rest[0] if rest else None
                gone = None if e_corr is None else removed(e_corr, e_quant)
                per_layer_removed.setdefault(layer, []).append(gone)
            heads = [share(b, q) for b, q in zip(heads_bias, heads_quant, strict=True)]
            per_head.setdefault(layer, []).append(heads)
    if not per_layer:
        return None
    out = {}
    for layer in sorted(per_layer, key=int):
        stat = Stat.of(per_layer[layer])
        expl = Stat.of(per_layer_explained[layer])
        gone = Stat.of(per_layer_removed[layer])
        columns = zip(*per_head.get(layer, []), strict=False)
        heads = [Stat.of(list(c)) for c in columns]
        out[layer] = {
            "share": None if stat is None else stat.to_dict(),
            "explained": None if expl is None else expl.to_dict(),
            "removed": None if gone is None else gone.to_dict(),
            "heads": [None if h is None else round(h.mean, 6) for h in heads],
        }
    return out


def error_grid(records: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[float, float | None]]:
    """``{(layer, step): (mean ΔP_S, bias share)}`` over every video's observed calls (the share
    a ratio of sums, None where the stored keys caused no error)."""
    sums: dict[tuple[int, int], list[float]] = {}
    for r in records:
        cells = (r.get("attention_error") or {}).get("cells", [])
        for layer, step, calls, dps, eq, eb, _ in cells:
            cell = sums.setdefault((int(layer), int(step)), [0, 0.0, 0.0, 0.0])
            cell[0] += calls
            cell[1] += dps
            cell[2] += eq
            cell[3] += eb
    return {k: (c[1] / c[0], share(c[3], c[2])) for k, c in sums.items() if c[0]}
