"""``jbkv report`` as one call: a run folder's rows, its JSON result (built once), the files.

:func:`build_report` checks the request whole (the format for the run's kind, the tolerances,
the baseline, the run folder, the folders it will write) before it writes anything; with
``score`` it then scores the videos not scored yet (the one case where report writes outside
RUN/report). It builds the rows and the JSON result once (the table's comparisons, the md and
json output, the HTML page and the gate all read that one result), writes the figures (and,
for ``html``, the page) and checks the gate. :func:`render` is the text of every format but
the Rich table, which the command prints.

A ``jbkv llm-prefill`` run (:func:`jbkv_cli.llm.run.is_llm_run`) has its own rows, result and
gate (:mod:`jbkv_cli.llm.report`, :mod:`jbkv_cli.llm.gate`) and the formats of
:data:`LLM_FORMATS`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jbkv_cli.utils import distributed
from jbkv_cli.utils.atomic import check_writable_dir
from jbkv_cli.utils.errors import UsageError, shown

FORMATS = ("table", "md", "json", "csv", "html")
LLM_FORMATS = ("table", "md", "json")
VIDEO, LLM = "video", "llm-prefill"


@dataclass(frozen=True)
class ReportRequest:
    """What ``jbkv report RUN`` is asked to do (the command's options, checked by
    :func:`build_report`)."""

    run_dir: Path
    fmt: str = "table"
    plots: bool = False
    baseline: Path | None = None
    tolerance: str | None = None
    score: bool = False
    lpips: bool = True


@dataclass(frozen=True)
class Gate:
    """The regression gate's outcome against ``baseline`` (passed when no problem)."""

    baseline: Path
    problems: list[str]
    summary: str


@dataclass(frozen=True)
class Report:
    """A run's report: its rows and JSON result, the files written, the gate's outcome.

    ``kind``: :data:`VIDEO` or :data:`LLM`; ``run``: a :class:`~jbkv_cli.run.directory.RunDir`
    or an :class:`~jbkv_cli.llm.run.LlmRun`; ``unscored``: variants with videos not scored
    yet (none listed when the request scored); ``page``: the HTML page (format ``html``)."""

    kind: str
    fmt: str
    run: Any
    rows: list[Any]
    data: dict[str, Any]
    figures: list[Path] = field(default_factory=list)
    page: Path | None = None
    unscored: list[str] = field(default_factory=list)
    gate: Gate | None = None


def build_report(request: ReportRequest) -> Report | None:
    """The report of ``request.run_dir`` (see the module docstring); None on the ranks of a
    ``torchrun`` job other than rank 0, which only score."""
    from jbkv_cli.llm.run import is_llm_run

    if request.fmt not in FORMATS:
        raise UsageError(
            f"--format must be {', '.join(FORMATS[:-1])} or {FORMATS[-1]}, got {shown(request.fmt)}"
        )
    if is_llm_run(request.run_dir):
        return _llm_report(request)
    return _video_report(request)


def _video_report(r: ReportRequest) -> Report | None:
    from jbkv_cli.report.gate import check_baseline, load_baseline, parse_tolerances
    from jbkv_cli.report.table import build_rows, to_json
    from jbkv_cli.run.directory import RunDir

    tol = parse_tolerances(r.tolerance)
    base = load_baseline(r.baseline) if r.baseline is not None else None
    run = RunDir.open(r.run_dir)
    report_dir = run.root / "report"
    if r.plots or r.fmt == "html":
        check_writable_dir(report_dir, "report folder")
    if r.score:
        check_writable_dir(run.root / "metrics", "metrics folder")
        from jbkv_cli.run.experiment import score_fidelity  # the metrics' models: only to score

        distributed.setup()  # under torchrun: each rank scores a share of the pairs
        score_fidelity(run, lpips=r.lpips)
    if not distributed.only_rank0_reports():  # under torchrun rank 0 alone reports
        return None
    rows = build_rows(run)
    data = to_json(run, rows)
    unscored = [  # listed only when the request did not score
        row.variant
        for row in rows
        if not r.score
        and not row.is_reference
        and row.videos
        and (row.psnr is None or row.psnr.n < row.videos)
    ]
    figures: list[Path] = []
    page = None
    if r.plots or r.fmt == "html":  # the HTML page shows the figures: made with it
        from jbkv_cli.report.plots import make_plots

        figures = make_plots(run, rows, report_dir)
    if r.fmt == "html":
        from jbkv_cli.report.html import write_html_report

        page = write_html_report(run, data, report_dir)
    gate = None
    if base is not None:
        result = check_baseline(data, base, tol)
        gate = Gate(r.baseline, [] if result.passed else result.problems, result.summary())
    return Report(VIDEO, r.fmt, run, rows, data, figures, page, unscored, gate)


def _llm_report(r: ReportRequest) -> Report:
    from jbkv_cli.llm.gate import check_baseline, load_baseline, parse_tolerances, summary
    from jbkv_cli.llm.report import build_rows, plot, to_json
    from jbkv_cli.llm.run import LlmRun

    if r.fmt not in LLM_FORMATS:
        raise UsageError(
            f"--format for an llm-prefill run must be {', '.join(LLM_FORMATS[:-1])} or "
            f"{LLM_FORMATS[-1]}, got {shown(r.fmt)}"
        )
    if r.score:
        raise UsageError("--score is for video runs; llm-prefill records already hold their NLL")
    tol = parse_tolerances(r.tolerance)
    base = load_baseline(r.baseline) if r.baseline is not None else None
    run = LlmRun.open(r.run_dir)
    if r.plots:
        check_writable_dir(run.root / "report", "report folder")
    rows = build_rows(run)
    data = to_json(run, rows)
    figures = [plot(rows, run.root / "report" / "nll.png")] if r.plots else []
    gate = None
    if base is not None:
        result = check_baseline(data, base, tol)
        gate = Gate(r.baseline, [] if result.passed else result.problems, summary(result))
    return Report(LLM, r.fmt, run, rows, data, [p for p in figures if p is not None], gate=gate)


def render(report: Report) -> str:
    """The text of ``report`` in its format, for stdout (``table`` is the command's Rich table:
    not here). md: the table, the paired comparisons and the horizon section; json: the result; csv: one row per
    variant; html: the page's path."""
    if report.fmt == "json":
        return json.dumps(report.data, indent=2) + "\n"
    if report.fmt == "html":
        return f"{report.page}\n"
    if report.kind == LLM:
        from jbkv_cli.llm.report import to_markdown as llm_markdown

        return llm_markdown(report.rows)
    from jbkv_cli.report.comparisons import comparisons_markdown
    from jbkv_cli.report.horizon import horizon_markdown
    from jbkv_cli.report.table import to_csv, to_markdown

    if report.fmt == "csv":
        return to_csv(report.rows, report.data.get("horizon"))
    if report.fmt == "md":
        md = to_markdown(report.rows) + comparisons_markdown(report.data)
        return md + horizon_markdown(report.data.get("horizon"))
    raise ValueError(f"no text rendering for format {report.fmt!r}")
