"""``make gpu-check DRY=1``: the GPU check's script runs on a CPU under fake CUDA, so it works
the first time it meets a GPU (every kernel case at every model's real shapes without a host
sync, the embedded model's full-size run planned)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # every kernel case at full size, the embedded model planned

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("jbkv_gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_dry_run(tmp_path, monkeypatch):
    check = _script()
    # the script's steps, not the plan (tests/plan has it): the embedded model's run shortened
    monkeypatch.setitem(check.RUNS, "tiny", {"num_chunks": 2})
    out = tmp_path / "dry.json"
    assert (
        check.main(
            ["--dry", "--models", "tiny", "--kernels", ",".join(check.SHAPES), "--out", str(out)]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["dry"] is True and "skipped" in report["tests"]
    assert set(report["kernels"]) == set(check.SHAPES)
    for model, entry in report["kernels"].items():
        shape = check.SHAPES[model]
        for name, row in entry["cases"].items():
            assert "host_sync" not in row, (model, name, row)
            if name.endswith("flex"):  # fake CUDA cannot trace FlexAttention's operator
                assert "not_traced" in row or "output" in row
                continue
            assert row["output"] == [1, shape.q_heads, shape.queries, shape.head_dim]
            assert row["width"] % 8 == 0  # the corrected fused form: padded to a multiple of 8
    # 128 channels + 4 correction channels padded to 136: FlashAttention still takes it
    assert report["kernels"]["self-forcing"]["cases"]["int2+taylor fused"]["width"] == 136
    assert report["kernels"]["self-forcing"]["cases"]["int2+taylor fused"]["flash"] is True
    plans = report["plans"]["tiny"]["variants"]
    assert list(plans) == ["bf16", "int2", "int2+taylor", "int2+signed"]
    assert all(v["peak_bytes"] > 0 for v in plans.values())


def test_unknown_models_and_no_gpu_are_one_line(capsys):
    check = _script()
    assert check.main(["--dry", "--models", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert check.main(["--models", "tiny"]) == 1  # no CUDA here: says to run DRY=1
        assert "DRY=1" in capsys.readouterr().err
