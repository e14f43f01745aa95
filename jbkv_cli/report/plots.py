"""PNG figures from a run directory (matplotlib, Agg): the paper's Figs. 1, 4 and 5 in spirit.

- ``frontier.png``: PSNR, SSIM and |ΔP_S| against measured effective bits per method ± correction,
  each series' Pareto front drawn, the overall front circled (:mod:`jbkv_cli.report.frontier`).
- ``delta_ps_hist.png``: per-query ΔP_S, uncorrected vs corrected (INT2 when present).
- ``frames.png``: reference / INT4 / INT2 / INT2+correction at a few time points.
- ``drift.png``: PSNR and SSIM per chunk, per variant, mean ± SE over videos (drift over time);
  with the long-horizon data (:mod:`jbkv_cli.report.horizon`) also the floor, each variant's
  median divergence chunk and each correction's paired gain per chunk with its 95% CI.
- ``attention_error.png``: ΔP_S and the bias share per layer × denoising step (one variant).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from jbkv_cli.metrics.psnr import PSNR_CAP_DB
from jbkv_cli.report.drift import drift_series
from jbkv_cli.report.frontier import METRICS, frontier_points, pareto_front
from jbkv_cli.report.horizon import horizon_section
from jbkv_cli.report.memory import error_grid
from jbkv_cli.report.results import ResultRow
from jbkv_cli.run.directory import RunDir, video_name
from jbkv_cli.utils.atomic import atomic_path
from jbkv_cli.utils.errors import JbkvError


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` atomically; a failure (a full disk) is one line naming it."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    except OSError as exc:
        raise JbkvError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)
    return path


def frontier_plot(rows: list[ResultRow], path: Path) -> Path | None:
    """PSNR, SSIM and |ΔP_S| against measured effective bits: one series per method ± correction
    (markers; its own Pareto front as the line), the overall Pareto front circled in black."""
    panels = [(m, frontier_points(rows, m)) for m in METRICS]
    panels = [(m, pts) for m, pts in panels if pts]
    if not panels:
        return None
    # one panel per row at full width: at 120 dpi each is ~960 px wide, read at 100% zoom
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.0, 3.6 * len(panels)), squeeze=False)
    series = sorted({p.series for _, pts in panels for p in pts})
    # one colour per method (its corrected series share it: squares, dashed front)
    methods = sorted({name.split(" + ")[0] for name in series})
    palette = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    for ax, (metric, pts) in zip(axes[:, 0], panels, strict=True):
        higher = METRICS[metric]
        for name in series:
            mine = [p for p in pts if p.series == name]
            if not mine:
                continue
            color = palette(methods.index(name.split(" + ")[0]) % palette.N)
            dashed = " + " in name
            ax.scatter(
                [p.effective_bits for p in mine],
                [p.value for p in mine],
                color=color,
                marker="s" if dashed else "o",
                s=22,
                label=name,
            )
            own = pareto_front([(p.effective_bits, p.value) for p in mine], higher)
            ax.plot(
                [mine[j].effective_bits for j in own],
                [mine[j].value for j in own],
                "--" if dashed else "-",
                color=color,
                linewidth=1.2,
            )
        best = pareto_front([(p.effective_bits, p.value) for p in pts], higher)
        ax.scatter(
            [pts[j].effective_bits for j in best],
            [pts[j].value for j in best],
            s=110,
            facecolors="none",
            edgecolors="k",
            linewidths=1.2,
            label="Pareto front",
        )
        pruned = any(r.pruner != "none" for r in rows)
        per = "element of the unpruned cache" if pruned else "cached element"
        ax.set_xlabel(f"effective bits per {per} (measured)")
        ax.set_ylabel(
            {"psnr": "PSNR vs reference (dB) ↑", "ssim": "SSIM ↑", "delta_ps": "|ΔP_S| ↓"}[metric]
        )
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle("Storage–quality frontier (solid: uncorrected, dashed: corrected)", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)


def delta_ps_hist(run: RunDir, rows: list[ResultRow], path: Path) -> Path | None:
    with_samples = []
    for r in rows:
        if r.is_reference or not r.full:
            continue
        samples = [x for rec in run.records(r.variant) for x in rec.get("delta_ps_samples", [])]
        if samples:
            with_samples.append((r, samples))
    if not with_samples:
        return None
    low = min(r.bits for r, _ in with_samples)
    chosen = [(r, s) for r, s in with_samples if r.bits == low]
    fig, ax = plt.subplots(figsize=(6, 4))
    lo = min(min(s) for _, s in chosen)
    hi = max(max(s) for _, s in chosen)
    bins = torch.linspace(lo, hi, 60).tolist()
    for r, s in chosen:
        ax.hist(
            s,
            bins=bins,
            histtype="step",
            linewidth=1.5,
            density=True,
            label=f"{r.label} (mean {sum(s) / len(s):+.4f})",
        )
    ax.axvline(0, color="k", linewidth=0.8)
    ax.set_xlabel("ΔP_S per query (attention mass on cached tokens, variant − full precision)")
    ax.set_ylabel("density")
    ax.set_title(f"Attention stolen by INT{low} cached keys")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def frame_strip(run: RunDir, rows: list[ResultRow], path: Path, times: int = 5) -> Path | None:
    def pick(bits: int, corrected: bool) -> ResultRow | None:
        for r in rows:
            if (
                r.bits == bits
                and r.corrected == corrected
                and r.keys
                and r.values
                and not r.bias_only
            ):
                return r
        return None

    chosen = [r for r in (pick(16, False), pick(4, False), pick(2, False), pick(2, True)) if r]
    refs = run.records(run.reference)
    if len(chosen) < 2 or not refs:
        return None
    name = video_name(refs[0]["prompt"], refs[0]["index"])
    videos = []
    for r in chosen:
        if run.is_done(r.variant, name):
            videos.append((r.label, run.load_frames(r.variant, name)))
    if len(videos) < 2:
        return None
    t_total = videos[0][1].shape[0]
    ts = torch.linspace(0, t_total - 1, times).round().long().tolist()
    fig, axes = plt.subplots(
        len(videos), len(ts), figsize=(1.6 * len(ts), 1.7 * len(videos)), squeeze=False
    )
    for i, (label, frames) in enumerate(videos):
        for j, t in enumerate(ts):
            ax = axes[i][j]
            ax.imshow(frames[t].numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"frame {t}", fontsize=8)
            if j == 0:
                ax.set_ylabel(label, fontsize=7)
    fig.suptitle(refs[0]["prompt"], fontsize=9)
    return save_figure(fig, path)


def drift_plot(run: RunDir, rows: list[ResultRow], path: Path) -> Path | None:
    """PSNR and SSIM per chunk (x) per variant: the mean line and a ± SE band.

    Chunks identical to the reference in every video (PSNR at the cap) are drawn as triangles on
    the top edge so the cap does not squash the scale.
    """
    drift = drift_series(run, rows)
    if not drift["variants"]:
        return None
    unit = drift["unit"]
    horizon = horizon_section(run, rows) if unit == "chunk" else None
    gains = [d for d in (horizon or {}).get("delays", []) if d["gain_per_chunk"]]
    panels = 3 if gains else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7, 3 * panels), sharex=True)
    capped_any = False
    for i, v in enumerate(drift["variants"]):
        color = f"C{i % 10}"
        style = "--" if v["corrected"] else "-"
        for ax, metric in zip(axes[:2], ("psnr", "ssim"), strict=True):
            pts = v[metric]
            x = [p["chunk"] for p in pts]
            y = [p["mean"] for p in pts]
            e = [p["se"] or 0.0 for p in pts]
            if metric == "psnr":
                capped = [(xi, yi) for xi, yi in zip(x, y, strict=True) if yi >= PSNR_CAP_DB]
                capped_any |= bool(capped)
                keep = [j for j, yi in enumerate(y) if yi < PSNR_CAP_DB]
                x, y, e = [x[j] for j in keep], [y[j] for j in keep], [e[j] for j in keep]
            ax.plot(x, y, style, color=color, marker="o", markersize=3, label=v["label"])
            lo = [a - b for a, b in zip(y, e, strict=True)]
            hi = [a + b for a, b in zip(y, e, strict=True)]
            ax.fill_between(x, lo, hi, color=color, alpha=0.15, linewidth=0)
    if capped_any:
        top = axes[0].get_ylim()[1]
        for i, v in enumerate(drift["variants"]):
            xs = [p["chunk"] for p in v["psnr"] if p["mean"] >= PSNR_CAP_DB]
            axes[0].plot(xs, [top] * len(xs), "^", color=f"C{i % 10}", clip_on=False)
        axes[0].set_title(
            f"▲ identical to the reference in every video (PSNR capped at {PSNR_CAP_DB:g} dB)",
            fontsize=8,
            loc="right",
        )
    if horizon:
        _horizon_marks(axes, drift, horizon, gains)
    axes[0].set_ylabel("PSNR vs reference (dB)")
    axes[1].set_ylabel("SSIM vs reference")
    per = f"chunk ({drift['chunk_frames']} frames)" if unit == "chunk" else "frame"
    axes[-1].set_xlabel(f"{per}; mean ± SE over videos" + ("; gain: 95% CI" if gains else ""))
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Drift over time", fontsize=10)
    return save_figure(fig, path)


def _horizon_marks(axes, drift: dict[str, Any], horizon: dict[str, Any], gains: list) -> None:
    """The long-horizon parts of the drift figure (:mod:`jbkv_cli.report.horizon`): the floor
    (reference vs reference, mean ± SE per chunk) as a gray band, each variant's median
    divergence chunk as a dotted vertical line, and (third panel) each correction's paired PSNR
    gain per chunk with its 95% CI band, over the videos whose baseline has not diverged."""
    floor = [p for p in horizon["floor"]["per_chunk"] if p["mean"] is not None]
    if floor:
        x = [p["chunk"] for p in floor]
        y = [p["mean"] for p in floor]
        e = [p["se"] or 0.0 for p in floor]
        axes[0].plot(x, y, ":", color="gray", label="floor: reference vs reference")
        lo = [a - b for a, b in zip(y, e, strict=True)]
        hi = [a + b for a, b in zip(y, e, strict=True)]
        axes[0].fill_between(x, lo, hi, color="gray", alpha=0.2, linewidth=0)
    colour = {v["variant"]: f"C{i % 10}" for i, v in enumerate(drift["variants"])}
    for v in horizon["variants"]:
        median = (v.get("divergence") or {}).get("median")
        if median is not None and v["variant"] in colour:
            for ax in axes[:2]:
                ax.axvline(median, color=colour[v["variant"]], linestyle=":", linewidth=1)
    if not gains:
        return
    ax = axes[2]
    for d in gains:
        pts = [g for g in d["gain_per_chunk"] if g.get("ci95")]
        if not pts:
            continue
        x = [g["chunk"] for g in pts]
        y = [g["mean"] for g in pts]
        color = colour.get(d["variant"], "C0")
        ax.plot(x, y, "--", color=color, marker="o", markersize=3, label=d["label"])
        lo = [g["ci95"][0] for g in pts]
        hi = [g["ci95"][1] for g in pts]
        ax.fill_between(x, lo, hi, color=color, alpha=0.15, linewidth=0)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_ylabel("PSNR gain vs uncorrected (dB)")
    ax.set_title("paired, over videos whose baseline has not diverged", fontsize=8, loc="right")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def attention_error_heatmap(run: RunDir, rows: list[ResultRow], path: Path) -> Path | None:
    """ΔP_S and the bias share (:mod:`jbkv_cli.attention.bias_share`) per layer × denoising
    step of one variant: the uncorrected one at the lowest bits with both keys and values
    quantized (what a correction would start from), else the first with data."""
    grids = [(r, error_grid(run.records(r.variant))) for r in rows if r.bias_share is not None]
    grids = [(r, g) for r, g in grids if g]
    if not grids:
        return None
    uncorrected = sorted(
        (r.bits, i) for i, (r, _) in enumerate(grids) if r.full and not r.corrected
    )
    row, grid = grids[uncorrected[0][1]] if uncorrected else grids[0]
    layers = sorted({k[0] for k in grid})
    steps = sorted({k[1] for k in grid})
    nan = float("nan")
    panels = (
        ("ΔP_S (mean per query)", 0, "RdBu_r"),
        ("bias share of the keys' attention error", 1, "viridis"),
    )
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.35 * len(layers) + 2.2), squeeze=False)
    for ax, (title, index, cmap) in zip(axes[0], panels, strict=True):
        values = [[nan] * len(steps) for _ in layers]
        for (layer, step), cell in grid.items():
            v = cell[index]
            values[layers.index(layer)][steps.index(step)] = nan if v is None else v
        data = torch.tensor(values)
        finite = data[data.isfinite()]
        if index == 0 and finite.numel():
            bound = float(finite.abs().max()) or 1.0
            image = ax.imshow(data, cmap=cmap, vmin=-bound, vmax=bound, aspect="auto")
        else:
            image = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(steps)), [str(s) for s in steps], fontsize=7)
        ax.set_yticks(range(len(layers)), [str(la) for la in layers], fontsize=7)
        ax.set_xlabel("denoising step (read since the layer's last commit)")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"Where the attention error comes from: {row.label}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def make_plots(run: RunDir, rows: list[ResultRow], out_dir: Path) -> list[Path]:
    made = [
        frontier_plot(rows, out_dir / "frontier.png"),
        delta_ps_hist(run, rows, out_dir / "delta_ps_hist.png"),
        frame_strip(run, rows, out_dir / "frames.png"),
        drift_plot(run, rows, out_dir / "drift.png"),
        attention_error_heatmap(run, rows, out_dir / "attention_error.png"),
    ]
    return [p for p in made if p is not None]
