"""``jbkv_cli.report.job``: the report of a run folder in one call (no Typer), on runs written
from numbers (``tests/synthetic_run.py``): every refusal comes before anything is written, and
the JSON result is built once for every output that shows it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jbkv_cli.report import table
from jbkv_cli.report.job import VIDEO, ReportRequest, build_report, render
from jbkv_cli.run.directory import RunDir
from jbkv_cli.run.experiment import build_matrix
from jbkv_cli.utils.errors import JbkvError, UsageError
from tests.synthetic_run import write_run

PROMPTS = ["a synthetic prompt 0", "a synthetic prompt 1", "a synthetic prompt 2"]


@pytest.fixture
def run(tmp_path) -> Path:
    specs = [s for s in build_matrix([2], ["rtn"], ["none", "taylor"], [32]) if not s.is_reference]
    return write_run(tmp_path / "run", specs, PROMPTS)[0].root


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``root``."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")
    }


def _refused(request: ReportRequest, error: type[Exception], match: str) -> None:
    root = request.run_dir.parent
    before = _tree(root)
    with pytest.raises(error, match=match):
        build_report(request)
    assert _tree(root) == before, "a refused report created or changed files"


@pytest.mark.parametrize("fmt", ["html", "json"])
@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"tolerance": "psnr=nan"}, UsageError, "psnr"),
        ({"baseline": "missing.json"}, JbkvError, "missing.json"),
        ({"fmt": "xml"}, UsageError, "--format must be table, md, json, csv or html, got 'xml'"),
    ],
)
def test_refusals_write_nothing(run, fmt, changes, error, match):
    """Neither the page, the figures, nor the scores: ``html`` and ``--score`` write, so their
    checks come first."""
    if "baseline" in changes:
        changes = {"baseline": run.parent / changes["baseline"]}
    request = ReportRequest(run, fmt=fmt, plots=True, score=True, lpips=False)
    _refused(ReportRequest(**{**request.__dict__, **changes}), error, match)


def test_a_folder_that_is_no_run_is_refused(tmp_path):
    (tmp_path / "nothing").mkdir()
    _refused(ReportRequest(tmp_path / "nothing"), JbkvError, "not a jbkv run directory")


def _llm_run(root: Path) -> Path:
    RunDir.create_or_resume(root, "tiny", {"kind": "llm-prefill", "seed": 0})
    return root


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"fmt": "csv"}, "--format for an llm-prefill run must be table, md or json, got 'csv'"),
        ({"fmt": "html"}, "--format for an llm-prefill run must be table, md or json"),
        ({"score": True}, "--score is for video runs"),
        ({"tolerance": "nll=-1"}, "nll"),
    ],
)
def test_llm_runs_refuse_what_they_cannot_show(tmp_path, changes, match):
    run = _llm_run(tmp_path / "llm")
    _refused(
        ReportRequest(**{**ReportRequest(run, plots=True).__dict__, **changes}), UsageError, match
    )


def _count_to_json(monkeypatch) -> list:
    calls: list = []
    real = table.to_json
    monkeypatch.setattr(table, "to_json", lambda *a: calls.append(a) or real(*a))
    return calls


def _own_baseline(run: Path) -> Path:
    baseline = run.parent / "baseline.json"
    data = table.to_json(RunDir.open(run), table.build_rows(RunDir.open(run)))
    baseline.write_text(json.dumps(data))
    return baseline


def test_the_json_result_is_built_once_for_the_text_and_the_gate(run, monkeypatch):
    """One call of ``to_json`` serves ``render`` and the gate; the gate against the run's own
    result passes and says what it compared."""
    baseline = _own_baseline(run)
    calls = _count_to_json(monkeypatch)
    built = build_report(ReportRequest(run, fmt="json", baseline=baseline))
    assert len(calls) == 1
    assert built.kind == VIDEO and built.fmt == "json"
    assert json.loads(render(built)) == json.loads(baseline.read_text())
    assert built.gate is not None and built.gate.problems == []
    assert built.gate.summary.startswith("2 variants × 3 videos")
    assert built.figures == [] and built.page is None
    assert not (run / "report").exists()  # json alone writes nothing


def test_the_page_and_its_figures_share_that_one_result(tiny_run, tmp_path, monkeypatch):
    run = Path(shutil.copytree(tiny_run, tmp_path / "tiny"))
    shutil.rmtree(run / "report")
    baseline = _own_baseline(run)
    calls = _count_to_json(monkeypatch)
    built = build_report(ReportRequest(run, fmt="html", baseline=baseline))
    assert len(calls) == 1
    assert built.page == run / "report" / "index.html" and built.page.is_file()
    assert built.figures and all(p.parent == run / "report" for p in built.figures)
    assert all(p.is_file() for p in built.figures)  # the page shows them: made with it
    assert built.gate is not None and built.gate.problems == []
    assert render(built) == f"{built.page}\n"


def test_text_formats_and_the_unscored_list(run):
    built = build_report(ReportRequest(run, fmt="md"))
    assert built.unscored == [] and built.figures == [] and built.page is None
    md = render(built)
    assert md.startswith("| variant |") and "| INT2 rtn g32 +taylor |" in md
    csv = render(build_report(ReportRequest(run, fmt="csv"))).splitlines()
    assert csv[0].startswith("variant,") and [r.split(",")[0] for r in csv[1:]] == [
        "reference",
        "int2-rtn-g32",
        "int2-rtn-g32-taylor",
    ]
    for record in (run / "metrics" / "fidelity").glob("int2-rtn-g32/*.json"):
        record.unlink()  # that variant's videos are no longer scored
    assert build_report(ReportRequest(run, fmt="md")).unscored == ["int2-rtn-g32"]
