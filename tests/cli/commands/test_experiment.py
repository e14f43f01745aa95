"""generate / quantize-eval / report through Typer's CliRunner, on real (tiny-config) models."""

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.utils.video import read_video

runner = CliRunner()
MAGI = ["--model", "magi1", "-o", "config=tiny-random", "--device", "cpu"]


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def magi_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r"
    result = invoke(
        "generate",
        *MAGI,
        "--bits",
        "2",
        "--correct",
        "--prompt",
        "a red ball",
        "--seeds",
        "0,1",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    return out, result


def test_generate_writes_lossless_mp4_record_and_manifest(magi_run):
    out, result = magi_run
    assert "4 videos generated" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"] == "magi1" and manifest["seeds"] == [0, 1]
    for vid in ("reference", "int2-rtn-g32-taylor"):
        for i in (0, 1):
            base = out / "videos" / vid / f"a red ball-{i}"
            frames, _ = read_video(base.with_suffix(".mkv"))
            assert frames.dtype == torch.uint8 and frames.shape[-1] == 3
            mp4, _ = read_video(base.with_suffix(".mp4"))
            assert mp4.shape == frames.shape
            record = json.loads(base.with_suffix(".json").read_text())
            assert record["seed"] == i and record["kv_cache_bytes"] > 0
    record = json.loads((out / "videos/int2-rtn-g32-taylor/a red ball-0.json").read_text())
    assert record["diagnostics"]["delta_ps"] is not None


def test_generate_resumes_and_skips_finished(magi_run):
    out, _ = magi_run
    before = {p: p.stat().st_mtime_ns for p in (out / "videos").rglob("*.mkv")}
    result = invoke(
        "generate",
        *MAGI,
        "--bits",
        "2",
        "--correct",
        "--prompt",
        "a red ball",
        "--seeds",
        "0,1",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    assert "0 videos generated, 4 already done" in result.output
    assert before == {p: p.stat().st_mtime_ns for p in (out / "videos").rglob("*.mkv")}


def test_changed_settings_into_existing_run_is_refused(magi_run):
    out, _ = magi_run
    result = invoke("generate", *MAGI, "--steps", "2", "--prompt", "a red ball", "--out", out)
    assert result.exit_code == 2
    assert "different settings" in result.output and "steps" in result.output


def test_interrupted_run_resumes_to_identical_results(tmp_path, monkeypatch):
    from jbkv_cli.models.magi1.model import Magi1VideoModel

    args = ["generate", *MAGI, "--bits", "4", "--prompt", "a cat", "--seeds", "0,1"]
    clean = tmp_path / "clean"
    assert invoke(*args, "--out", clean).exit_code == 0

    real, calls = Magi1VideoModel.generate, {"n": 0}

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(Magi1VideoModel, "generate", flaky)
    broken = tmp_path / "broken"
    result = invoke(*args, "--out", broken)
    assert result.exit_code == 130 and "interrupted" in result.output
    assert not [f for f in _files(broken) if ".tmp" in f]  # no half-written file
    done = [
        f
        for f in _files(broken)
        if f.endswith(".json") and "variant" not in f and "manifest" not in f
    ]
    assert len(done) == 2
    monkeypatch.setattr(Magi1VideoModel, "generate", real)
    result = invoke(*args, "--out", broken)
    assert result.exit_code == 0 and "2 videos generated, 2 already done" in result.output
    for f in _files(clean):
        if f.endswith(".mkv"):
            a, _ = read_video(clean / f)
            b, _ = read_video(broken / f)
            assert torch.equal(a, b), f


def test_full_disk_leaves_nothing_partial(tmp_path, monkeypatch):
    real_replace = os.replace

    def no_space(src, dst):
        if str(dst).endswith(".mp4"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", no_space)
    out = tmp_path / "full"
    result = invoke("generate", *MAGI, "--prompt", "a dog", "--out", out)
    assert result.exit_code == 1
    assert "No space left on device" in result.output and "Traceback" not in result.output
    files = _files(out)
    assert not [f for f in files if ".tmp" in f]
    assert not [f for f in files if f.endswith("-0.json")]  # the video is not marked done


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "--model", "sora", "--prompt", "x"], "unknown model"),
        (["generate", *MAGI, "--bits", "5", "--prompt", "x"], "bits must be one of"),
        (["generate", *MAGI, "--bits", "2", "-g", "48", "--prompt", "x"], "does not divide"),
        (["generate", *MAGI, "--quantizer", "gptq", "--bits", "2", "--prompt", "x"], "--quantizer"),
        (["generate", *MAGI, "--correct", "--prompt", "x"], "quantized cache"),
        (["generate", *MAGI, "--seeds", "a,b", "--prompt", "x"], "bad --seeds"),
        (["generate", *MAGI, "--prompts", "/nonexistent.txt"], "no prompt file"),
        (["generate", *MAGI, "--prompt", "a/b"], "cannot name a file"),
        (
            ["generate", "--model", "magi1", "-o", "config=huge", "--prompt", "x"],
            "magi1: config must be one of",
        ),
        (["generate", *MAGI, "-o", "nonsense", "--prompt", "x"], "KEY=VALUE"),
        (["quantize-eval", *MAGI, "--bits", "2,7", "--prompt", "x"], "bad --bits"),
        (["quantize-eval", *MAGI, "--quantizers", "rtn,gptq", "--prompt", "x"], "bad --quantizers"),
        (["report", "/nonexistent-run"], "not a jbkv run directory"),
        (["report", ".", "--format", "xml"], "--format"),
    ],
)
def test_bad_input_one_line_nonzero(args, message, tmp_path):
    result = invoke(*args, "--out", tmp_path / "o") if args[0] != "report" else invoke(*args)
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o" / "videos").exists()


def test_out_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "stuff.txt").write_text("mine")
    result = invoke("generate", *MAGI, "--prompt", "x", "--out", tmp_path)
    assert result.exit_code == 2 and "not a jbkv run directory" in result.output


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    root = tmp_path_factory.mktemp("qe")
    js = root / "result.json"
    result = invoke(
        "quantize-eval",
        *MAGI,
        "--bits",
        "2,4",
        "--quantizers",
        "rtn",
        "--corrections",
        "none,taylor",
        "--prompt",
        "a red ball",
        "--seeds",
        "0,1",
        "--out",
        root / "runs",
        "--json",
        js,
        "--no-lpips",
    )
    assert result.exit_code == 0, result.output
    return root, js, result


@pytest.mark.slow  # end to end
def test_quantize_eval_json_schema_and_table(evaluated):
    root, js, result = evaluated
    data = json.loads(js.read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    assert set(rows) == {
        "reference",
        "int2-rtn-g32",
        "int2-rtn-g32-taylor",
        "int4-rtn-g32",
        "int4-rtn-g32-taylor",
    }
    for key in (
        "variant",
        "quantizer",
        "bits",
        "group_size",
        "effective_bits",
        "corrected",
        "psnr",
        "ssim",
        "lpips",
        "delta_ps",
        "noise_z_mean",
        "kv_cache_bytes",
        "seconds",
    ):
        assert key in rows["int2-rtn-g32"]
    int2 = rows["int2-rtn-g32"]
    assert int2["noise_z_mean"]["n"] == 2 and rows["reference"]["noise_z_mean"] is None
    assert set(int2["psnr"]) == {"mean", "se", "n"} and int2["psnr"]["n"] == 2
    assert int2["lpips"] is None
    assert int2["effective_bits"] == pytest.approx(2.75, rel=1e-6)
    assert rows["int4-rtn-g32"]["psnr"]["mean"] > int2["psnr"]["mean"]
    assert "INT2 rtn g32 +taylor" in result.output and "PSNR" in result.output
    assert (root / "runs/magi1/report/frontier.png").is_file()
    assert (root / "runs/magi1/report/frames.png").is_file()


def test_report_rebuilds_same_rows_without_recomputing(evaluated):
    root, js, _ = evaluated
    run = root / "runs/magi1"
    result = invoke("report", run, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == json.loads(js.read_text())["rows"]
    md = invoke("report", run, "--format", "md")
    assert md.exit_code == 0 and md.stdout.startswith("| variant")
    csv = invoke("report", run, "--format", "csv")
    assert csv.exit_code == 0 and csv.stdout.splitlines()[0].startswith("variant,label")
    assert len(csv.stdout.splitlines()) == 6


def test_regression_gate(evaluated, tmp_path):
    root, js, _ = evaluated
    run = root / "runs/magi1"
    passed = invoke("report", run, "--baseline", js)
    assert passed.exit_code == 0
    assert "gate passed: 4 variants × 2 videos, psnr/ssim/delta_ps" in passed.output
    empty = tmp_path / "empty.json"
    empty.write_text('{"rows": []}')
    assert invoke("report", run, "--baseline", empty).exit_code == 1
    reference_only = json.loads(js.read_text())
    reference_only["rows"] = reference_only["rows"][:1]
    empty.write_text(json.dumps(reference_only))
    result = invoke("report", run, "--baseline", empty)
    assert result.exit_code == 1 and "no quantized variant" in result.output
    assert invoke("report", run, "--baseline", js, "--tolerance", "psnr=nan").exit_code == 2
    worse = json.loads(js.read_text())
    for r in worse["rows"]:
        if r["variant"] == "int2-rtn-g32":
            r["psnr"]["mean"] += 5.0
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(worse))
    result = invoke("report", run, "--baseline", path)
    assert result.exit_code == 1
    assert "int2-rtn-g32: psnr" in result.output
    assert invoke("report", run, "--baseline", path, "--tolerance", "psnr=6").exit_code == 0
    assert invoke("report", run, "--tolerance", "psnr").exit_code != 0


def test_skyreels_tiny_generate_with_and_without_correction(tmp_path):
    for extra in ([], ["--correct"]):
        result = invoke(
            "generate",
            "--model",
            "skyreels-v2",
            "-o",
            "config=tiny-random",
            "--device",
            "cpu",
            "--bits",
            "2",
            *extra,
            "--prompt",
            "a boat",
            "--out",
            tmp_path / "sky",
            "--no-diagnostics",
        )
        assert result.exit_code == 0, result.output
    videos = sorted((tmp_path / "sky/videos").rglob("*.mkv"))
    assert [p.parent.name for p in videos] == ["int2-rtn-g32", "int2-rtn-g32-taylor", "reference"]
