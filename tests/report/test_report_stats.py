"""The paired statistics in every output of `jbkv report` (table, md, json, html), on a run
written from numbers (tests/synthetic_run.py), checked against the per-video values written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.metrics.paired import holm, paired_summary
from jbkv_cli.report.html import render_page
from jbkv_cli.run.directory import RunDir
from jbkv_cli.run.experiment import build_matrix
from tests.installed import run_jbkv
from tests.synthetic_run import write_run

pytestmark = pytest.mark.slow

PROMPTS = [f"a synthetic prompt {i}" for i in range(6)]
STATS = ("ci95", "p_t", "p_wilcoxon", "p_holm", "significant", "videos_needed")


def _specs() -> list[KVSpec]:
    """INT2 rtn/kivi/quarot ± taylor and INT4 rtn (one method at four bits: no comparison)."""
    two = build_matrix([2], ["rtn", "kivi", "quarot"], ["none", "taylor"], [32])
    four = build_matrix([4], ["rtn"], ["none"], [32])
    return [s for s in [*two, *four] if not s.is_reference]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats") / "run"
    return write_run(root, _specs(), PROMPTS)


def _report(run_root: Path, *args: str) -> subprocess.CompletedProcess:
    return run_jbkv("report", run_root, *args, timeout=120, check=True)


@pytest.fixture(scope="module")
def data(run):
    return json.loads(_report(run[0].root, "-f", "json").stdout)


def _diffs(written, a: str, b: str) -> list[float]:
    return [written[b][n] - written[a][n] for n in sorted(written[a])]


def test_json_gains_carry_the_paired_statistics_of_the_written_values(run, data):
    _, written = run
    gains = data["correction_gains"]
    assert {(g["quantizer"], g["bits"]) for g in gains} == {("rtn", 2), ("kivi", 2), ("quarot", 2)}
    for g in gains:
        storage = g["storage"]
        expect = paired_summary(_diffs(written, storage, f"{storage}-taylor"))
        got = g["psnr_gain"]
        assert all(k in got for k in STATS)
        for key in ("mean", "sd", "p_t", "p_wilcoxon", "videos_needed"):
            assert got[key] == pytest.approx(expect[key]), key
        assert got["ci95"] == pytest.approx(expect["ci95"])
    adjusted = holm([g["psnr_gain"]["p_t"] for g in gains])
    assert [g["psnr_gain"]["p_holm"] for g in gains] == pytest.approx(adjusted)
    assert all(g["psnr_gain"]["significant"] == (g["psnr_gain"]["p_holm"] < 0.05) for g in gains)


def test_json_compares_methods_at_matched_bits_against_the_best(run, data):
    _, written = run
    groups = {(g["bits"], g["correction"]): g for g in data["method_comparisons"]}
    assert set(groups) == {(2, "none"), (2, "taylor")}  # INT4 has one method: no comparison
    for g in groups.values():
        means = {v: sum(written[v].values()) for c in g["comparisons"] for v in (c["variant"],)}
        assert all(sum(written[g["best"]].values()) >= m for m in means.values())
        assert len(g["comparisons"]) == 2
        for c in g["comparisons"]:
            expect = paired_summary(_diffs(written, g["best"], c["variant"]))
            assert c["psnr_diff"]["mean"] == pytest.approx(expect["mean"])
            assert c["psnr_diff"]["p_t"] == pytest.approx(expect["p_t"])
    every = [c["psnr_diff"] for g in data["method_comparisons"] for c in g["comparisons"]]
    assert [s["p_holm"] for s in every] == pytest.approx(holm([s["p_t"] for s in every]))


def test_json_tests_delta_ps_against_the_reference(data):
    refs = data["reference_comparisons"]
    assert len(refs) == len(_specs()) and all(r["metric"] == "delta_ps" for r in refs)
    assert all(k in r["diff"] for r in refs for k in STATS)
    # ΔP_S is written as 0.05/bits + N(0, 0.002): far from 0 on every variant
    assert all(r["diff"]["significant"] for r in refs)


def test_table_md_and_html_show_the_statistics(run, data, tmp_path):
    root = run[0].root
    runner = CliRunner()  # in-process: the text is the point here, not the exit code
    table = runner.invoke(app, ["report", str(root)], terminal_width=200).output
    assert "95% CI (t)" in table  # the legend
    label = data["correction_gains"][0]["label"]
    line = next(x for x in table.splitlines() if f"taylor on {label}:" in x)
    assert "95% CI [" in line and "p_t " in line and "p_W " in line and "Holm " in line
    assert "videos for 80% power" in line
    assert "INT2 · none: best" in table and "ΔP_S ≠ 0 vs the reference" in table
    md = runner.invoke(app, ["report", str(root), "-f", "md"]).output
    section = md.split("Paired comparisons (", 1)[1].splitlines()
    rows = [x for x in section if x.startswith("| ")][1:]  # under the header
    n = len(data["correction_gains"]) + 4 + len(data["reference_comparisons"])
    assert len(rows) == n
    page = render_page(RunDir.open(root), data, tmp_path)
    assert "<h2>Paired comparisons</h2>" in page
    table_html = page.split('<table id="comparisons">', 1)[1].split("</table>", 1)[0]
    assert table_html.count("<tr") == n + 1  # and the header
    marked = sum(x.split("|")[-3].strip().endswith("*") for x in rows)  # the Holm column
    assert 0 < table_html.count('<tr class="significant">') == marked
