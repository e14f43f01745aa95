"""What the paired statistics add to ``jbkv report``'s time on a frontier-sized run.

The frontier run of docs/report.md has 127 variants × 10 videos. This writes a run directory of
that size from numbers (``tests/synthetic_run.py``: manifest, specs, records, fidelity scores;
no model), then times, in one process and alternating, what ``jbkv report RUN`` does for
``--format table`` (rows, the table, the comparison lines) and ``--format json`` (rows, the JSON
document, serialized):

- **with** the statistics (the code as it is: every paired comparison with CI, t-test,
  Wilcoxon, Holm, videos needed; the method and reference comparison tables);
- **without**: the same code with the statistics taken out (the gains' summaries reduced to
  mean ± SE, no method or reference comparison tables), i.e. the report before them.

Timing: best of ``--repeats`` runs each, seconds, in-process (interpreter start and imports,
about a second more, are left out, so the ratio is an upper bound on what a user sees); the
whole command's wall time (``jbkv report RUN --format json`` in a subprocess, best of 3) is
printed beside it. Writes ``benchmarks/results/report_stats.json``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/report_stats.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/synthetic_run.py

import jbkv_cli.report.table as report
from jbkv_cli.metrics.stats import aggregate
from jbkv_cli.report.comparisons import comparison_lines
from jbkv_cli.run.directory import RunDir
from jbkv_cli.utils.atomic import write_text_atomic
from tests.synthetic_run import frontier_specs, write_run

RESULTS = Path(__file__).parent / "results" / "report_stats.json"
VARIANTS, VIDEOS = 127, 10  # the frontier run (docs/report.md)


@contextmanager
def without_statistics():
    """The report as it was before the statistics: mean ± SE gains, no comparison tables."""
    saved = (report.paired_summary, report.method_comparisons, report.reference_comparisons)
    report.paired_summary = aggregate
    report.method_comparisons = lambda *a, **k: []
    report.reference_comparisons = lambda *a, **k: []
    try:
        yield
    finally:
        report.paired_summary, report.method_comparisons, report.reference_comparisons = saved


def as_table(run: RunDir) -> None:
    console = Console(file=io.StringIO(), width=200)
    rows = report.build_rows(run)
    report.print_table(console, rows, "bench")
    for line in comparison_lines(report.to_json(run, rows)):
        console.print(line)


def as_json(run: RunDir) -> None:
    rows = report.build_rows(run)
    json.dumps(report.to_json(run, rows), indent=2)


def best(fn: Callable[[], None], repeats: int, stats: bool) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        if stats:
            fn()
        else:
            with without_statistics():
                fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prompts = [f"synthetic prompt {i}" for i in range(VIDEOS)]
        run, _ = write_run(Path(tmp) / "run", frontier_specs()[: VARIANTS - 1], prompts)
        assert len(run.variants()) == VARIANTS
        as_json(run)  # warm-up: caches, first reads
        cases = {}
        for name, fn in (("table", as_table), ("json", as_json)):
            with_s, without_s = [], []
            for _ in range(2):  # alternate, so drift of the machine's load hits both
                with_s.append(best(lambda f=fn: f(run), args.repeats, True))
                without_s.append(best(lambda f=fn: f(run), args.repeats, False))
            w, wo = min(with_s), min(without_s)
            cases[name] = {"with_s": w, "without_s": wo, "added": w / wo - 1}
        jbkv = str(Path(sys.executable).with_name("jbkv"))
        walls = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run(
                [jbkv, "report", str(run.root), "-f", "json"], check=True, capture_output=True
            )
            walls.append(time.perf_counter() - start)
        wall = min(walls)
    for name, c in cases.items():
        print(
            f"report --format {name}: {c['with_s']:.3f} s with the statistics, "
            f"{c['without_s']:.3f} s without: +{c['added']:.1%} in-process, "
            f"+{(c['with_s'] - c['without_s']) / wall:.1%} of the command's {wall:.2f} s"
        )
    payload = {
        "benchmark": "jbkv report with vs without the paired statistics",
        "run": f"synthetic, {VARIANTS} variants x {VIDEOS} videos (tests/synthetic_run.py)",
        "timing": f"best of {args.repeats} x 2 alternations, seconds, in-process",
        "command_wall_s": wall,
        "cases": cases,
        "added_of_command": {n: (c["with_s"] - c["without_s"]) / wall for n, c in cases.items()},
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    write_text_atomic(args.out, json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
