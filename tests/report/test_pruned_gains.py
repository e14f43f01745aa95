"""The correction's gain on a pruned and quantized cache against the pruned 16-bit cache, next to
the gain against the full reference, in every output of `jbkv report` (terminal lines, JSON,
Markdown, HTML) and a damaged score file, on a run written from numbers (tests/synthetic_run.py) with scores against the
pruned 16-bit video written by hand (known paired statistics)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.metrics.paired import paired_summary
from jbkv_cli.report.comparisons import comparison_lines, comparisons_markdown
from jbkv_cli.report.html import render_page
from jbkv_cli.report.table import build_rows, to_json
from jbkv_cli.run import directory as runs_module
from jbkv_cli.run.directory import RunDir, video_name
from jbkv_cli.run.experiment import Scoring, build_matrix
from jbkv_cli.run.pruned_base import KIND
from tests.synthetic_run import write_run

PROMPTS = [f"a pruned synthetic prompt {i}" for i in range(6)]
NAMES = [video_name(p, 0) for p in PROMPTS]
PRUNED, PRUNED_TAYLOR = "int2-rtn-g32-flowcache", "int2-rtn-g32-flowcache-taylor"
# PSNR against the pruned 16-bit video: the correction gains 0.5 dB ± a known spread there
VS16 = {
    PRUNED: [30.0, 31.0, 29.5, 30.5, 32.0, 30.2],
    PRUNED_TAYLOR: [30.6, 31.4, 30.1, 30.9, 32.6, 30.6],
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    specs = build_matrix([2], ["rtn"], ["none", "taylor"], [32], pruners=["none", "flowcache"])
    run, written = write_run(tmp_path_factory.mktemp("pruned") / "run", specs[1:], PROMPTS)
    for vid, values in VS16.items():
        folder = run.root / "metrics" / KIND / vid
        folder.mkdir(parents=True)
        for name, psnr in zip(NAMES, values, strict=True):
            entry = {"psnr": psnr, "psnr_pooled": psnr, "ssim": 0.9, "lpips": None}
            (folder / f"{name}.json").write_text(json.dumps({**entry, "against": "flowcache"}))
    return run, written


@pytest.fixture(scope="module")
def data(run):
    opened = run[0]
    return to_json(opened, build_rows(opened))


def test_json_gain_against_the_pruned_16_bit_cache_beside_the_full_reference(run, data):
    _, written = run
    gains = {g["storage"]: g for g in data["correction_gains"]}
    assert set(gains) == {"int2-rtn-g32", PRUNED}
    plain = gains["int2-rtn-g32"]
    assert plain["pruned16"] is None and plain["psnr_gain_vs_pruned16"] is None
    g = gains[PRUNED]
    assert g["pruned16"] == "flowcache" and g["pruned16_label"]
    vs16 = [b - a for a, b in zip(VS16[PRUNED], VS16[PRUNED_TAYLOR], strict=True)]
    expect = paired_summary(vs16)
    got = g["psnr_gain_vs_pruned16"]
    assert got["mean"] == pytest.approx(0.5, abs=1e-9)  # the written gain
    for key in ("mean", "sd", "p_t", "p_wilcoxon"):
        assert got[key] == pytest.approx(expect[key]), key
    assert got["ci95"] == pytest.approx(expect["ci95"])
    assert got["p_holm"] == pytest.approx(expect["p_t"])  # one such gain: Holm leaves it
    full = [written[PRUNED_TAYLOR][n] - written[PRUNED][n] for n in NAMES]
    assert g["psnr_gain"]["mean"] == pytest.approx(paired_summary(full)["mean"])


def test_terminal_markdown_and_html_name_each_reference(run, data, tmp_path):
    label = next(g for g in data["correction_gains"] if g["pruned16"])["pruned16_label"]
    lines = comparison_lines(data)
    line = next(x for x in lines if "vs the pruned 16-bit cache" in x)
    assert "PSNR vs the full reference" in line and f"({label}) +0.50 ±" in line
    plain = next(x for x in lines if x.startswith("taylor on INT2 rtn g32:"))
    assert "vs the" not in plain  # unpruned: one gain, against the reference as before
    md = comparisons_markdown(data)
    assert f"| PSNR dB vs {label} | +0.50 |" in md
    assert "| PSNR dB vs the full reference |" in md
    page = render_page(run[0], data, tmp_path)
    assert "vs the pruned 16-bit cache" in page and f"PSNR dB vs {label}" in page
    table = CliRunner().invoke(app, ["report", str(run[0].root)], terminal_width=250).output
    assert "vs the pruned 16-bit cache" in table


def test_without_scores_against_it_the_gain_says_so(tmp_path):
    specs = build_matrix([2], ["rtn"], ["none", "taylor"], [32], pruners=["flowcache"])
    opened, _ = write_run(tmp_path / "run", specs[1:], PROMPTS[:3])
    data = to_json(opened, build_rows(opened))
    (g,) = data["correction_gains"]
    assert g["pruned16"] == "flowcache" and g["psnr_gain_vs_pruned16"] is None
    line = next(x for x in comparison_lines(data) if "pruned 16-bit" in x)
    assert line.endswith("no video has both scores")


HOSTILE = ("x", 1e308, float("nan"), 10**400, -5, None, [], {}, ["a"], True)


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_a_damaged_score_against_the_pruned_cache_is_left_out_with_a_warning(run, value, tmp_path):
    """Every field of one ``metrics/pruned16`` file set to a hostile value, one at a time, and
    the file cut short: the report (JSON, lines, Markdown, HTML) and resume planning read on,
    the video counts as unscored against it (a warning names the file) and is listed again."""
    opened = run[0]
    path = opened.score_path(KIND, PRUNED_TAYLOR, NAMES[0])
    original = path.read_text()
    entry = json.loads(original)
    damaged = [json.dumps({**entry, key: value}) for key in entry] + [original[:20]]
    warnings: list[str] = []
    rejected = 0
    real = runs_module.warn
    runs_module.warn = warnings.append
    try:
        for text in damaged:
            path.write_text(text)
            fresh = RunDir.open(opened.root)
            data = to_json(fresh, build_rows(fresh))
            assert comparison_lines(data) and comparisons_markdown(data)
            assert "vs the pruned 16-bit cache" in render_page(fresh, data, tmp_path)
            g = next(g for g in data["correction_gains"] if g["pruned16"])
            valid = fresh.read_metrics(KIND, PRUNED_TAYLOR)
            if NAMES[0] in valid:  # a value its check accepts (e.g. lpips null): still scored
                continue
            rejected += 1
            assert g["psnr_gain_vs_pruned16"]["n"] == len(NAMES) - 1
            todo = {p[:2] for p in Scoring(fresh, lpips=False).missing()}
            assert (PRUNED_TAYLOR, NAMES[0]) in todo
            assert any(str(path) in w for w in warnings), text
    finally:
        runs_module.warn = real
        path.write_text(original)
    assert rejected >= 2  # the cut file and against/psnr/ssim at least
