"""`jbkv fidelity --json`'s statistics: the scores' t intervals and the drift test, on fixed
per-video scores (no video decoded) and once through the command on three small videos."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from scipy import stats

from jbkv_cli.cli.commands.fidelity import fidelity_command
from jbkv_cli.metrics.fidelity_stats import fidelity_statistics
from jbkv_cli.metrics.psnr import PSNR_CAP_DB
from jbkv_cli.utils.video import write_video_lossless


def _video(psnr_chunks, ssim_chunks, lpips_chunks=None):
    mean = sum(psnr_chunks) / len(psnr_chunks)
    return SimpleNamespace(
        psnr=mean,
        psnr_pooled=mean,
        ssim=sum(ssim_chunks) / len(ssim_chunks),
        lpips=None,
        psnr_per_chunk=psnr_chunks,
        ssim_per_chunk=ssim_chunks,
        lpips_per_chunk=lpips_chunks,
    )


def test_drift_runs_from_the_first_chunk_below_the_cap_to_the_last():
    videos = [
        _video([PSNR_CAP_DB, 40.0, 35.0], [1.0, 0.95, 0.90]),  # chunk 0 identical: from 1
        _video([42.0, 38.0, 33.0], [0.97, 0.94, 0.89]),
        _video([PSNR_CAP_DB, 41.0, 37.5], [1.0, 0.96, 0.93]),
        _video([PSNR_CAP_DB, PSNR_CAP_DB, 30.0], [1.0, 1.0, 0.8]),  # only the last differs: out
    ]
    doc = fidelity_statistics(videos)
    drift = doc["drift"]
    assert (drift["videos"], drift["left_out"]) == (3, 1)
    psnr = drift["metrics"]["psnr"]
    diffs = [35.0 - 40.0, 33.0 - 42.0, 37.5 - 41.0]
    assert psnr["mean"] == pytest.approx(sum(diffs) / 3)
    assert psnr["p_t"] == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue)
    assert set(drift["metrics"]) == {"psnr", "ssim"}  # no LPIPS lists
    assert drift["metrics"]["ssim"]["p_holm"] >= drift["metrics"]["ssim"]["p_t"]
    scores = doc["scores"]["psnr"]
    values = [v.psnr for v in videos]
    lo, hi = stats.t.interval(0.95, 3, loc=scores["mean"], scale=stats.sem(values))
    assert scores["ci95"] == pytest.approx([lo, hi])
    assert doc["scores"]["lpips"]["n"] == 0 and doc["scores"]["lpips"]["ci95"] is None


def test_fidelity_json_carries_the_statistics(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "no-torch-home"))
    ref, test = tmp_path / "ref", tmp_path / "test"
    g = torch.Generator().manual_seed(0)
    for i in range(3):
        frames = (torch.rand(4, 16, 16, 3, generator=g) * 255).to(torch.uint8)
        noisy = frames.clone()
        noise = torch.randint(-20 - 5 * i, 21 + 5 * i, (2, 16, 16, 3), generator=g)
        noisy[2:] = (frames[2:].int() + noise).clamp(0, 255).to(torch.uint8)  # chunk 1 differs
        noisy[1, 0, 0, 0] ^= 1  # chunk 0 barely differs: below the cap
        write_video_lossless(ref / f"v{i}.mkv", frames, 8)
        write_video_lossless(test / f"v{i}.mkv", noisy, 8)
    out = tmp_path / "f.json"
    assert fidelity_command(ref, test, json_path=out, no_lpips=True, chunk_frames=2) == 0
    doc = json.loads(out.read_text())["statistics"]
    assert doc["scores"]["psnr"]["n"] == 3 and len(doc["scores"]["psnr"]["ci95"]) == 2
    drift = doc["drift"]["metrics"]["psnr"]
    assert doc["drift"]["videos"] == 3 and drift["mean"] < 0
    for key in ("ci95", "p_t", "p_wilcoxon", "p_holm", "significant", "videos_needed"):
        assert key in drift
