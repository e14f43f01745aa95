"""``--plan`` on generate and quantize-eval, and quantize-eval's refusal on a CUDA device its
grid does not fit (the device's memory stood in by a small budget: no GPU here)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import jbkv_cli.plan.job as job
from jbkv_cli.cli.app import app
from jbkv_cli.plan.budget import Budget

pytestmark = pytest.mark.slow  # the embedded model planned end to end (docs/testing.md)

runner = CliRunner()
GRID = ["--bits", "2", "--quantizers", "rtn", "--corrections", "none", "--num-chunks", "2"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_quantize_eval_plan_prints_and_creates_nothing(tmp_path):
    out = tmp_path / "runs"
    result = invoke("quantize-eval", *GRID, "--plan", "--out", out)
    assert result.exit_code == 0, result.output
    assert "16-bit reference" in result.output and "INT2 rtn g32" in result.output
    assert not out.exists()


def test_generate_plan_prints_its_variant_and_the_reference(tmp_path):
    out = tmp_path / "run"
    result = invoke("generate", "--bits", "2", "--num-chunks", "2", "--plan", "--out", out)
    assert result.exit_code == 0, result.output
    assert "16-bit reference" in result.output and "INT2 rtn g32" in result.output
    assert not out.exists()


def test_a_grid_that_cannot_fit_the_gpu_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(job, "device_budget", lambda device: Budget("Tiny GPU", 2**20))
    out = tmp_path / "runs"
    result = invoke("quantize-eval", *GRID, "--out", out)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert "tiny 16-bit reference needs" in lines[-1] and "Tiny GPU has 0.0 GiB" in lines[-1]
    assert "--force" in lines[-1]
    assert not out.exists()


def test_force_skips_the_plan(tmp_path, monkeypatch):
    def never(device):
        raise AssertionError("planned despite --force")

    monkeypatch.setattr(job, "device_budget", never)
    # --json onto a folder: refused after the (skipped) check, before anything runs
    result = invoke("quantize-eval", *GRID, "--force", "--out", tmp_path / "r", "--json", tmp_path)
    assert result.exit_code == 2, result.output
