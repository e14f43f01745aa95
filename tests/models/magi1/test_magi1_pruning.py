"""Forcing-KV-history (and forcing-kv end to end) on MAGI-1 (tiny random configuration, float32, CPU): the head layout, profiling
through the pipelined sampler, and oracles against the unpruned cache."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.magi1 import load_model
from jbkv_cli.prune import ForcingKVHistory
from jbkv_cli.prune.profile import FrameMassProbe

ATOL = 1e-5  # fp32: masked tokens against present ones changes only the order of sums
LAYOUT = {"layers": 2, "kv_heads": 2, "frame_tokens": 4}  # 32x32: 4x4 latents, 2x2 patches
CW = 2  # latent frames per chunk


@pytest.fixture(scope="module")
def model():
    return load_model(config="tiny-random", seed=0, device="cpu", attention_backend="reference")


def _spec(profile: str, **options) -> KVSpec:
    return KVSpec(pruner=ForcingKVHistory(profile=profile, segments=2, **options))


def test_magi1_head_layout(model):
    assert model.head_layout() == LAYOUT


def test_magi1_pruner_that_keeps_everything_is_the_unpruned_cache(
    model, head_profile, keep_everything
):
    kind, anchor, retention = keep_everything
    profile = head_profile("magi1", LAYOUT, kind, anchor)
    want = model.sample_latents("x", 3, FULL_PRECISION).latents
    got = model.sample_latents("x", 3, _spec(profile, retention=retention))
    torch.testing.assert_close(got.latents, want, atol=ATOL, rtol=0)
    assert sum(got.peak_bytes_by_kind.values()) == got.peak_cache_bytes > 0


def test_magi1_static_heads_keep_only_the_anchor_frames(model, head_profile):
    """All heads static with one anchor frame: the cache holds one frame of each chunk's
    tokens at most, and what the model produces changes."""
    profile = head_profile("magi1", LAYOUT, "static", 1)
    full = model.sample_latents("x", 3, FULL_PRECISION)
    pruned = model.sample_latents("x", 3, _spec(profile))
    assert pruned.peak_bytes_by_kind == {"static": pruned.peak_cache_bytes}
    # 2 layers x (k + v) x 2 heads x 4 tokens x 32 dims x 4 bytes + int16 positions
    assert pruned.peak_cache_bytes == 2 * 2 * 2 * 4 * 32 * 4 + 2 * 2 * 4 * 2
    assert pruned.peak_cache_bytes < full.peak_cache_bytes
    assert (pruned.latents - full.latents).abs().max() > 1e-3


def test_magi1_profile_reads_every_cache_read(model):
    probe = FrameMassProbe(LAYOUT["frame_tokens"])
    model.profile_heads("x", 0, probe)
    assert probe.records and {r.layer for r in probe.records} == {0, 1}
    for r in probe.records:
        assert r.recent.shape[0] == 4 and r.recent.shape[1] % CW == 0  # query heads x frames
        total = r.current + r.recent.sum(-1)
        torch.testing.assert_close(total, torch.ones_like(total), atol=1e-5, rtol=0)


def test_magi1_profile_heads_then_generate_with_forcing_kv(tmp_path):
    runner = CliRunner()
    model = ["-m", "magi1", "-o", "config=tiny-random", "--prompt", "x", "--seeds", "0"]
    path = tmp_path / "heads.json"
    result = runner.invoke(app, ["profile-heads", *model, "--out", str(path)])
    assert result.exit_code == 0, result.output
    args = ["generate", *model, "--bits", "2", "--correct", "--pruner", "forcing-kv"]
    args += ["-M", f"forcing-kv.profile={path}"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    records = list((tmp_path / "run/videos").glob("int2-*-forcingkv-*/x-0.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert sum(record["info"]["kv_cache_bytes_by_head"].values()) == record["kv_cache_bytes"]
