"""Saving scores one video at a time writes bytes linear in the videos (issue 22, item 21).

jbkv used to rewrite a variant's whole metrics file per score: 1,000 scores wrote ~100
times the bytes of 100. Now each is its own file: ~10 times. ``benchmarks/metrics_writes.py``
measures both schemes at realistic sizes; this keeps the new one linear.
"""

from __future__ import annotations

import os

from jbkv_cli.run.directory import RunDir
from jbkv_cli.run.shards import save_scores


def _bytes_saving(tmp_path, count: int, monkeypatch) -> int:
    run = RunDir(
        tmp_path / f"run{count}", {"model": "t", "settings": {}, "prompts": [], "seeds": []}
    )
    written = [0]
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        written[0] += os.path.getsize(src)
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    for i in range(count):
        entry = {"psnr": 30.0 + i % 7, "ssim": 0.9, "psnr_per_frame": [30.0] * 8}
        save_scores(run, "fidelity", "int2", {f"video {i:04d}-0": entry})
    monkeypatch.setattr(os, "replace", real)
    assert len(run.read_metrics("fidelity", "int2")) == count
    return written[0]


def test_bytes_written_grow_linearly_with_the_scores(tmp_path, monkeypatch):
    small, large = (_bytes_saving(tmp_path, n, monkeypatch) for n in (40, 400))
    assert 9.5 <= large / small <= 10.5, (small, large)  # quadratic would be ~98
