"""Drift over time: per-chunk PSNR/SSIM per variant from a run directory."""

from __future__ import annotations

import json
import shutil

from jbkv_cli.metrics.psnr import PSNR_CAP_DB
from jbkv_cli.report.drift import drift_series
from jbkv_cli.report.table import build_rows
from jbkv_cli.run.directory import RunDir


def test_drift_series_per_chunk_mean_and_se(tiny_run):
    run = RunDir.open(tiny_run)
    drift = drift_series(run, build_rows(run))
    assert drift["unit"] == "chunk" and drift["chunk_frames"] == 4
    by_vid = {v["variant"]: v for v in drift["variants"]}
    assert set(by_vid) == {
        "int4-rtn-g32",
        "int4-rtn-g32-taylor",
        "int2-rtn-g32",
        "int2-rtn-g32-taylor",
    }
    int2, int4 = by_vid["int2-rtn-g32"], by_vid["int4-rtn-g32"]
    assert [p["chunk"] for p in int2["psnr"]] == list(range(8))
    first = int2["psnr"][0]
    assert first["mean"] == PSNR_CAP_DB and first["n"] == 2  # chunk 0 reads no cache: identical
    assert int2["ssim"][0]["mean"] == 1.0
    assert int2["psnr"][-1]["mean"] < int4["psnr"][-1]["mean"] < PSNR_CAP_DB
    assert int2["psnr"][-1]["se"] is not None
    assert (tiny_run / "report" / "drift.png").is_file()


def test_entries_without_per_chunk_lists_are_chunked_from_per_frame(tiny_run, tmp_path):
    copy = tmp_path / "old"
    shutil.copytree(tiny_run, copy)
    for path in (copy / "metrics" / "fidelity").glob("*.json"):
        data = json.loads(path.read_text())
        for entry in data.values():
            for key in ("chunk_frames", "first_chunk", "psnr_per_chunk", "ssim_per_chunk"):
                entry.pop(key, None)
        path.write_text(json.dumps(data))
    new, old = RunDir.open(tiny_run), RunDir.open(copy)
    assert drift_series(old, build_rows(old)) == drift_series(new, build_rows(new))
