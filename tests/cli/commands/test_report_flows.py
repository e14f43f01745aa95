"""Flows a new user hits after `generate`/`quantize-eval`: reports with VBench results, tables
at ordinary terminal widths, the reference folder's name, scoring on demand, scoped model
options."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from rich.console import Console
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.report.results import ResultRow, Stat
from jbkv_cli.report.table import build_rows, print_table
from jbkv_cli.run.directory import RunDir

TINY = ["--num-chunks", "2", "--steps", "1"]
PROMPT = "a red circle moves right on a dark background"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("flows")
    result = invoke(
        "quantize-eval",
        "--quantizers",
        "rtn,rtn-nearest",
        "--prompt",
        PROMPT,
        "--seeds",
        "0,1",
        *TINY,
        "--no-lpips",
        "--no-plots",
        "--out",
        root,
    )
    assert result.exit_code == 0, result.output
    return root / "tiny"


def _with_vbench(run, tmp_path):
    """A copy of the run with VBench results for two dimensions, one of them missing for one
    variant, and one variant not scored at all."""
    copy = tmp_path / "vb"
    shutil.copytree(run, copy)
    variants = [p.name for p in (copy / "videos").iterdir()]
    doc = {"settings": {"mode": "long_custom_input"}, "variants": {}}
    for i, vid in enumerate(sorted(variants)[:-1]):
        dims = {"temporal_flickering": {"score": 0.97 - 0.01 * i, "se": 0.002, "n_videos": 2}}
        if i % 2 == 0:
            dims["subject_consistency"] = {"score": 0.93, "se": None, "n_videos": 2}
        totals = {"quality": 0.8 + 0.01 * i, "quality_se": None, "semantic": None, "total": None}
        doc["variants"][vid] = {"dimensions": dims, "totals": totals | {"partial": True}}
    (copy / "metrics").mkdir(exist_ok=True)
    (copy / "metrics" / "vbench.json").write_text(json.dumps(doc))
    return copy


@pytest.mark.slow  # end to end
def test_every_report_format_with_partial_vbench_results(run, tmp_path):
    vb = _with_vbench(run, tmp_path)
    for fmt in ("table", "md", "json", "csv"):
        result = invoke("report", vb, "--format", fmt)
        assert result.exit_code == 0, (fmt, result.output)
    table = invoke("report", vb).output
    assert "VBench" in table and "temporal" in table and "flickering" in table
    md = invoke("report", vb, "--format", "md").stdout
    vb_lines = md.split("\n\n")[1].splitlines()
    assert vb_lines[0].startswith("| variant | subject_consistency | temporal_flickering")
    assert len(vb_lines) == 2 + len(list((vb / "videos").iterdir())) - 1  # variants in rows
    assert "*" in vb_lines[2] and " — " in md  # partial totals marked, missing dims shown as —


def _rows() -> list[ResultRow]:
    labels = [
        ("reference", "FP32"),
        ("int4-rtn-nearest-g32", "INT4 rtn-nearest g32"),
        ("int2-rtn-nearest-g32-taylor", "INT2 rtn-nearest g32 +taylor"),
        ("int2-quarot-g32-rs3-taylor", "INT2 quarot g32 rs3 +taylor"),
    ]
    rows = []
    for i, (vid, label) in enumerate(labels):
        ref = vid == "reference"
        rows.append(
            ResultRow(
                variant=vid,
                label=label,
                quantizer="none" if ref else vid.split("-")[1],
                bits=16 if ref else int(vid[3]),
                group_size=None if ref else 32,
                effective_bits=32.0 if ref else 2.75 + i,
                corrected="taylor" in vid,
                correction="taylor" if "taylor" in vid else "none",
                keys=True,
                values=True,
                bias_only=False,
                psnr=None if ref else Stat(36.4321 + i, 0.9512, 10),
                ssim=None if ref else Stat(0.8794 + 0.01 * i, 0.0206, 10),
                lpips=None if ref else Stat(0.1234, 0.0101, 10),
                delta_ps=None if ref else Stat(0.0463 - 0.01 * i, 0.0007, 10),
                kv_cache_bytes=180_000 + i,
                seconds=Stat(0.46, 0.02, 10),
                videos=10,
            )
        )
    return rows


@pytest.mark.parametrize("width", [80, 100, 160, 200])
def test_tables_are_readable_at_ordinary_widths(width):
    console = Console(width=width, record=True, force_terminal=False)
    rows = _rows()
    print_table(console, rows, "tiny · a title")
    text = console.export_text()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    for r in rows:
        assert r.label in text  # every name whole
        if r.psnr:
            assert f"{r.psnr.mean:.2f}" in text and f"{r.delta_ps.mean:+.4f}" in text
    lines = [ln for ln in text.splitlines() if "INT2 rtn-nearest" in ln]
    assert len(lines) == 1  # one line per row, nothing folded
    if width >= 160:
        assert "± " in text  # room for the full mean ± SE
    if width == 200:
        assert "scheme" in text and "corrected" in text
    if width <= 100:
        assert "scheme" not in text  # the label says it


def test_reference_folder_is_named_for_what_it_holds(run):
    ref = run / "videos" / "reference"
    assert ref.is_dir() and not (run / "videos" / "bf16").exists()
    assert json.loads((ref / "variant.json").read_text())["dtype"] == "float32"
    assert json.loads((run / "manifest.json").read_text())["reference_dtype"] == "float32"
    assert build_rows(RunDir.open(run))[0].label == "FP32"


def test_run_folders_with_a_bf16_reference_stay_readable_and_resumable(run, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(run, old)
    (old / "videos" / "reference").rename(old / "videos" / "bf16")
    spec = json.loads((old / "videos" / "bf16" / "variant.json").read_text())
    legacy = {"quantizer": "none", "bits": 16, "group_size": 32, "correction": "none"}
    (old / "videos" / "bf16" / "variant.json").write_text(json.dumps(legacy | {"keys": True}))
    assert spec["key"] is None
    first = invoke("report", old, "--format", "json")
    assert first.exit_code == 0, first.output
    rows = json.loads(first.stdout)["rows"]
    assert rows[0]["variant"] == "bf16" and rows[1]["psnr"]["n"] == 2
    more = invoke(
        "generate",
        "--bits",
        "2",
        "--prompt",
        PROMPT,
        "--seeds",
        "2",
        *TINY,
        "--no-diagnostics",
        "--out",
        old,
    )
    assert more.exit_code == 0, more.output
    assert not (old / "videos" / "reference").exists()
    assert len(list((old / "videos" / "bf16").glob("*.mkv"))) == 3


def test_report_after_generate_says_how_to_score_and_scores_on_demand(tmp_path):
    out = tmp_path / "g"
    assert invoke("generate", "--bits", "2", "--prompt", PROMPT, *TINY, "--out", out).exit_code == 0
    plain = invoke("report", out)
    assert plain.exit_code == 0 and f"jbkv report {out} --score" in plain.output
    scored = invoke("report", out, "--score", "--no-lpips", "--format", "json")
    assert scored.exit_code == 0, scored.output
    rows = json.loads(scored.stdout)["rows"]
    assert rows[1]["psnr"]["n"] == 1 and "--score" not in scored.stderr
    again = invoke("report", out)
    assert "--score" not in again.output  # scored once, kept


def test_model_scoped_options(tmp_path):
    result = invoke(
        "quantize-eval",
        "-m",
        "tiny",
        "-m",
        "magi1",
        "-o",
        "magi1.config=tiny-random",
        "-o",
        "num_chunks=2",
        "--bits",
        "2",
        "--quantizers",
        "rtn",
        "--corrections",
        "none",
        "--prompt",
        PROMPT,
        "--steps",
        "2",
        "--device",
        "cpu",
        "--no-lpips",
        "--no-plots",
        "--out",
        tmp_path,
    )
    assert result.exit_code == 0, result.output
    settings = json.loads((tmp_path / "magi1" / "manifest.json").read_text())["settings"]
    assert settings["num_chunks"] == 2 and (tmp_path / "tiny" / "manifest.json").is_file()
    bad = invoke("quantize-eval", "-o", "sora.config=x", "--out", tmp_path / "bad")
    assert bad.exit_code == 2 and "unknown model 'sora'" in bad.output
    assert not (tmp_path / "bad").exists()
    assert re.search(r"magi1", result.output)


def test_correction_gains_keep_method_options_apart(tmp_path):
    """KIVI with two residual lengths: each corrected variant is paired with its own uncorrected
    one, and labelled with its option."""
    common = ["--prompt", PROMPT, *TINY, "--no-lpips", "--no-plots", "--out", tmp_path]
    common += ["--json", tmp_path / "r.json"]
    result = invoke("quantize-eval", "--quantizers", "kivi", "--bits", "2,4", *common)
    assert result.exit_code == 0, result.output
    again = invoke(
        "quantize-eval", "--quantizers", "kivi", "-M", "kivi.residual=0", "--bits", "2,4", *common
    )
    assert again.exit_code == 0, again.output
    gains = json.loads((tmp_path / "r.json").read_text())["correction_gains"]
    pairs = {(g["label"], g["gap_to"]) for g in gains if g["bits"] == 2}
    assert pairs == {
        ("INT2 kivi g32", "int4-kivi-g32"),
        ("INT2 kivi g32 r0", "int4-kivi-g32-r0"),
    }
    assert "taylor on INT2 kivi g32 r0:" in again.output
