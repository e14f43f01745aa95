"""The llm-prefill report: NLL and paired ΔNLL per (variant, chunk size, length bin), from records.

A **cell** is (chunk size, bin); ``all`` pools a chunk size's bins. In each cell and for each
variant:

- ``nll``: mean ± SE over examples of the example's mean NLL over its chunk (nats per token);
- ``d_ref``: paired ΔNLL against the reference, ``nll(variant) − nll(reference)`` per example
  (only examples both have), mean ± SE;
- ``d_unc``: for a corrected variant, paired ΔNLL against the same storage uncorrected;
- ``delta_ps``, ``jsd``: the mean of the per-example diagnostics (ΔP_S: attention mass on the
  cached prefix, as the variant attends, minus with the exact prefix; JSD of attention rows);
- ``kv_ratio``: stored prefix bytes over the reference's, on the same examples.

Every SE is over examples (the independent units), never over tokens.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from jbkv_cli.kvcache.spec import REFERENCE_ID, KVSpec
from jbkv_cli.llm.run import KIND, LlmRun
from jbkv_cli.report.results import Stat
from jbkv_cli.utils.atomic import write_text_atomic

ALL = "all"


@dataclass(frozen=True)
class Row:
    """One (variant, chunk size, bin) of the report."""

    variant: str
    label: str
    chunk: int
    bin: str
    examples: int
    nll: Stat | None
    d_ref: Stat | None
    d_unc: Stat | None
    delta_ps: float | None
    jsd: float | None
    kv_ratio: float | None
    bits: int
    correction: str

    @property
    def is_reference(self) -> bool:
        return self.variant == REFERENCE_ID

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("nll", "d_ref", "d_unc"):
            d[k] = None if getattr(self, k) is None else getattr(self, k).to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        if not isinstance(d, dict):
            raise ValueError("a row is not an object")
        try:
            stats = {k: Stat.from_dict(d.get(k), f"row {k}") for k in ("nll", "d_ref", "d_unc")}
            return cls(
                variant=str(d["variant"]),
                label=str(d["label"]),
                chunk=int(d["chunk"]),
                bin=str(d["bin"]),
                examples=int(d["examples"]),
                delta_ps=d.get("delta_ps"),
                jsd=d.get("jsd"),
                kv_ratio=d.get("kv_ratio"),
                bits=int(d.get("bits", 16)),
                correction=str(d.get("correction", "none")),
                **stats,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a row lacks {exc}") from None


def _label(spec: KVSpec, dtype: str | None) -> str:
    return f"reference ({dtype})" if spec.is_reference else spec.label


def _uncorrected(spec: KVSpec) -> KVSpec | None:
    if spec.correction == "none" or spec.method is None:
        return None
    return KVSpec(spec.key, spec.value, "none", spec.sink_chunks, spec.pruner)


def _cell(record: dict[str, Any]) -> tuple[int, str]:
    lo, hi = record["bin"]
    return record["chunk"], f"{lo}-{hi}"


def _mean(values: list[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def build_rows(run: LlmRun) -> list[Row]:
    """Every (variant, chunk size, bin) row plus the pooled ``all`` bin per chunk size."""
    variants = run.variants()
    by_vid = {vid: run.records(vid) for vid in variants}
    ref = by_vid.get(REFERENCE_ID, {})
    dtype = run.settings.get("dtype")
    vid_of = {spec: vid for vid, spec in variants.items()}
    rows = []
    for vid, spec in variants.items():
        mine = by_vid[vid]
        unc = _uncorrected(spec)
        unc_records = by_vid.get(vid_of.get(unc), {}) if unc is not None else {}
        groups: dict[tuple[int, str], list[str]] = defaultdict(list)
        for key, rec in mine.items():
            chunk, name = _cell(rec)
            groups[(chunk, name)].append(key)
            groups[(chunk, ALL)].append(key)
        for (chunk, name), keys in sorted(groups.items(), key=lambda kv: _order(kv[0])):
            recs = [mine[k] for k in keys]
            d_ref = [mine[k]["nll"] - ref[k]["nll"] for k in keys if k in ref]
            d_unc = [mine[k]["nll"] - unc_records[k]["nll"] for k in keys if k in unc_records]
            ratio = [
                mine[k]["kv_cache_bytes"] / ref[k]["kv_cache_bytes"]
                for k in keys
                if k in ref and ref[k]["kv_cache_bytes"]
            ]
            diag = [r.get("diagnostics") or {} for r in recs]
            rows.append(
                Row(
                    variant=vid,
                    label=_label(spec, dtype),
                    chunk=chunk,
                    bin=name,
                    examples=len(recs),
                    nll=Stat.of([r["nll"] for r in recs]),
                    d_ref=None if spec.is_reference else Stat.of(d_ref),
                    d_unc=Stat.of(d_unc) if unc is not None else None,
                    delta_ps=_mean([d.get("delta_ps") for d in diag]),
                    jsd=_mean([d.get("jsd") for d in diag]),
                    kv_ratio=_mean(ratio),
                    bits=spec.bits,
                    correction=spec.correction,
                )
            )
    variant_order = list(variants)
    return sorted(rows, key=lambda r: (*_order((r.chunk, r.bin)), variant_order.index(r.variant)))


def _order(cell: tuple[int, str]) -> tuple[int, int]:
    chunk, name = cell
    return (chunk, 1 << 62 if name == ALL else int(name.split("-")[0]))


def jobs(run: LlmRun) -> list[list[Any]]:
    """The (chunk size, bin, document) jobs of the reference, sorted (what the gate matches)."""
    records = run.records(REFERENCE_ID) if (run.variant_dir(REFERENCE_ID)).is_dir() else {}
    return sorted(
        [[r["chunk"], "{}-{}".format(*r["bin"]), r["document"]] for r in records.values()]
    )


def to_json(run: LlmRun, rows: list[Row]) -> dict[str, Any]:
    return {
        "kind": KIND,
        "model": run.manifest["model"],
        "settings": run.settings,
        "reference_dtype": run.settings.get("dtype"),
        "environment": run.manifest.get("environment"),
        "jobs": jobs(run),
        "rows": [r.to_dict() for r in rows],
    }


def _fmt(s: Stat | None, digits: int = 3, signed: bool = False) -> str:
    if s is None:
        return "—"
    sign = "+" if signed else ""
    se = f" ± {s.se:.{digits}f}" if s.se is not None else ""
    return f"{s.mean:{sign}.{digits}f}{se}"


def _num(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


COLUMNS = ("chunk", "bin", "variant", "n", "NLL", "ΔNLL vs ref", "ΔNLL vs uncorr.", "ΔP_S", "JSD")
COLUMNS += ("KV ratio",)


def cells(r: Row) -> list[str]:
    return [
        str(r.chunk),
        r.bin,
        r.label,
        str(r.examples),
        _fmt(r.nll),
        _fmt(r.d_ref, signed=True),
        _fmt(r.d_unc, signed=True),
        _num(r.delta_ps, "+.4f"),
        _num(r.jsd, ".2e"),
        _num(r.kv_ratio, ".3f"),
    ]


def rich_table(rows: list[Row], title: str) -> Table:
    from jbkv_cli.utils.console import plain

    table = Table(title=plain(title), title_justify="left")
    for col in COLUMNS:
        table.add_column(
            col, justify="left" if col in ("bin", "variant") else "right", no_wrap=True
        )
    for i, r in enumerate(rows):
        values = cells(r)
        values[2] = plain(values[2])  # the variant label is read from the run folder
        last_of_chunk = i + 1 < len(rows) and rows[i + 1].chunk != r.chunk
        table.add_row(*values, end_section=last_of_chunk)
    return table


def to_markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path) -> Path | None:
    """ΔNLL vs the reference against chunk size, one line per quantized variant (mean ± SE),
    one panel per bin and the pooled one: the form of the paper's Figs. A9/A10."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quantized = [r for r in rows if not r.is_reference and r.d_ref is not None]
    if not quantized:
        return None
    bins = sorted({r.bin for r in quantized}, key=lambda b: _order((0, b)))
    fig, axes = plt.subplots(1, len(bins), figsize=(4.6 * len(bins), 3.8), squeeze=False)
    labels = list(dict.fromkeys(r.label for r in quantized))
    for ax, name in zip(axes[0], bins, strict=True):
        for label in labels:
            mine = sorted(
                (r for r in quantized if r.bin == name and r.label == label), key=lambda r: r.chunk
            )
            if not mine:
                continue
            ax.errorbar(
                [r.chunk for r in mine],
                [r.d_ref.mean for r in mine],
                yerr=[r.d_ref.se or 0.0 for r in mine],
                marker="o" if "+" not in label else "s",
                linestyle="-" if "+" not in label else "--",
                capsize=3,
                label=label,
            )
        ax.axhline(0.0, color="k", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("current-chunk size (tokens)")
        ax.set_title(f"prefix {name}" if name != ALL else "all bins")
    axes[0][0].set_ylabel("ΔNLL vs reference (nats/token)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    from jbkv_cli.report.plots import save_figure  # a full disk is one line naming the file

    return save_figure(fig, path)


def write_report(run: LlmRun, rows: list[Row], plots: bool = True) -> tuple[dict, list[Path]]:
    """RUN/report/results.json, table.md and (``plots``) nll.png; returns the JSON and files."""
    data = to_json(run, rows)
    folder = run.root / "report"
    write_text_atomic(folder / "results.json", json.dumps(data, indent=2) + "\n")
    write_text_atomic(folder / "table.md", to_markdown(rows))
    made = [folder / "results.json", folder / "table.md"]
    if plots:
        png = plot(rows, folder / "nll.png")
        if png is not None:
            made.append(png)
    return data, made
