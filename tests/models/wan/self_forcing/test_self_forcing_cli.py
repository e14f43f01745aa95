"""``jbkv generate / quantize-eval / convert-checkpoint`` with ``--model self-forcing`` on the
tiny random configuration: once through the installed ``jbkv`` in a subprocess, the rest through
Typer's CliRunner. CPU only; nothing is downloaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.installed import JBKV, run_jbkv

pytest.importorskip("diffusers")

from jbkv_cli.cli.app import app
from jbkv_cli.utils.video import read_video

pytestmark = pytest.mark.slow

TINY = ["--model", "self-forcing", "-o", "config=tiny-random", "--device", "cpu"]
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def installed_run(tmp_path_factory):
    """``jbkv generate --bits 2 --correct`` by the installed entry point, in a subprocess."""
    if not Path(JBKV).is_file():
        pytest.skip(f"no installed jbkv next to {sys.executable}")
    out = tmp_path_factory.mktemp("sf") / "run"
    argv = ["generate", *TINY, "--bits", "2", "--correct", "--prompt", "a cat"]
    result = run_jbkv(*argv, "--out", out)
    assert result.returncode == 0, result.stderr
    return out, result


def test_self_forcing_generate_int2_taylor_through_the_installed_jbkv(installed_run):
    out, result = installed_run
    assert "2 videos generated" in result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"] == "self-forcing"
    assert manifest["settings"]["timesteps"] == [1000.0, 937.5, 833.3333, 625.0]
    for variant in ("reference", "int2-rtn-g32-taylor"):
        frames, fps = read_video(out / "videos" / variant / "a cat-0.mkv")
        assert frames.shape == (33, 32, 32, 3) and frames.dtype == torch.uint8 and fps == 16
    record = json.loads((out / "videos" / "int2-rtn-g32-taylor" / "a cat-0.json").read_text())
    assert record["info"]["kv"] == "INT2 rtn g32 +taylor" and record["kv_cache_bytes"] > 0


def test_self_forcing_generate_16bit_reuses_the_reference(installed_run):
    out, _ = installed_run
    result = invoke("generate", *TINY, "--bits", "16", "--prompt", "a cat", "--out", out)
    assert result.exit_code == 0, result.output
    assert "0 videos generated, 1 already done" in result.output


def test_self_forcing_quantize_eval_small(tmp_path):
    result = invoke(
        "quantize-eval",
        *TINY,
        "--prompt",
        "a cat",
        "--bits",
        "2",
        "--quantizers",
        "rtn",
        "--corrections",
        "none,taylor",
        "--no-lpips",
        "--no-plots",
        "--out",
        tmp_path,
    )
    assert result.exit_code == 0, result.output
    assert "INT2 rtn g32 +taylor" in result.output and "taylor on INT2 rtn g32" in result.output
    results = json.loads((tmp_path / "self-forcing" / "report" / "results.json").read_text())
    assert {row["variant"] for row in results["rows"]} >= {"int2-rtn-g32", "int2-rtn-g32-taylor"}


def test_self_forcing_unknown_precision_is_one_usage_line(tmp_path):
    """Through the installed jbkv: exit 2, one line naming the choices, nothing written."""
    if not Path(JBKV).is_file():
        pytest.skip(f"no installed jbkv next to {sys.executable}")
    argv = ["generate", *TINY, "-o", "precision=half", "--prompt", "a cat"]
    result = run_jbkv(*argv, "--out", tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: self-forcing: precision must be one of upstream, fp32-accum, got 'half'"
    ]
    assert list(tmp_path.iterdir()) == []


def test_self_forcing_missing_weights_exit_1_with_one_line(tmp_path):
    result = invoke("generate", "--model", "self-forcing", "--weights", tmp_path, "--prompt", "x")
    assert result.exit_code == 1
    assert "self-forcing-dmd weights not found" in result.output
    assert result.output.count("\n") == 1


def test_self_forcing_convert_checkpoint_command(tmp_path):
    state = {"model.patch_embedding.bias": torch.arange(4.0)}
    torch.save(
        {"generator": state, "generator_ema": {k: -v for k, v in state.items()}}, tmp_path / "g.pt"
    )
    result = invoke("convert-checkpoint", tmp_path / "g.pt")
    assert result.exit_code == 0, result.output
    from safetensors.torch import load_file

    converted = load_file(str(tmp_path / "g.safetensors"))
    assert torch.equal(converted["patch_embedding.bias"], -torch.arange(4.0))
    assert (
        invoke(
            "convert-checkpoint", tmp_path / "g.pt", tmp_path / "raw.safetensors", "--no-ema"
        ).exit_code
        == 0
    )
    assert torch.equal(
        load_file(str(tmp_path / "raw.safetensors"))["patch_embedding.bias"], torch.arange(4.0)
    )
    bad = invoke("convert-checkpoint", tmp_path / "g.pt", tmp_path / "x.bin")
    assert bad.exit_code == 2 and ".safetensors" in bad.output
    assert invoke("convert-checkpoint", tmp_path / "none.pt").exit_code == 2
