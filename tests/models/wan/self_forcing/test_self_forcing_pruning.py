"""Forcing-KV-history (and forcing-kv end to end) on the Self-Forcing adapter (tiny random configuration, float32, CPU): the head
layout pruners read, profiling through the model's own chunk loop, and oracles against the
unpruned cache: a pruner that keeps every token changes nothing, and static heads that keep one
chunk of anchor frames are the unpruned cache with a window of one chunk. forcing-kv's own rule
is checked against upstream's code in tests/prune/test_forcing_kv_self_forcing.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("diffusers")

from jbkv_cli.cli.app import app
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.wan.heads import head_layout
from jbkv_cli.models.wan.self_forcing import model as sf
from jbkv_cli.prune import ForcingKV, ForcingKVHistory, load_profile
from jbkv_cli.prune.profile import FrameMassProbe

ATOL = 1e-5  # fp32: masked tokens against absent ones changes only the order of sums
K, TOKENS = 3, 4  # latent frames per chunk; tokens per latent frame at 32x32 pixels
PROMPT = "a red ball"
LAYOUT = {"layers": 2, "kv_heads": 2, "frame_tokens": TOKENS}


@pytest.fixture(scope="module")
def tiny_model():
    return sf.load_model(config="tiny-random", device="cpu")


def pruned(profile: str, **options) -> KVSpec:
    return KVSpec(pruner=ForcingKVHistory(profile=profile, segments=2, **options))


def test_self_forcing_head_layout():
    tiny = sf.load_model(config="tiny-random", device="cpu")
    assert tiny.head_layout() == LAYOUT
    # Wan2.1-T2V-1.3B at 480x832: 30 blocks of 12 heads, 60x104 latents in 2x2 patches
    transformer = SimpleNamespace(
        blocks=[None] * 30, config=SimpleNamespace(patch_size=(1, 2, 2), num_attention_heads=12)
    )
    vae = SimpleNamespace(config=SimpleNamespace(temperal_downsample=[False, True, True]))
    assert head_layout(transformer, vae, 480, 832) == {
        "layers": 30,
        "kv_heads": 12,
        "frame_tokens": 1560,
    }


def test_self_forcing_pruner_that_keeps_everything_is_the_unpruned_cache(
    tiny_model, head_profile, keep_everything
):
    kind, anchor, retention = keep_everything
    profile = head_profile("self-forcing", LAYOUT, kind, anchor)
    want, _ = tiny_model.generate_latents(PROMPT, 3, FULL_PRECISION)
    got, info = tiny_model.generate_latents(PROMPT, 3, pruned(profile, retention=retention))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert sum(info["kv_cache_bytes_by_head"].values()) == info["kv_cache_bytes"]


def test_self_forcing_static_heads_with_one_chunk_of_anchors_equal_a_window_of_one_chunk(
    tiny_model, head_profile
):
    """Static heads keep the ``A`` most recent frames; with ``A`` = one chunk that is exactly
    the unpruned cache holding one finished chunk."""
    profile = head_profile("self-forcing", LAYOUT, "static", K)
    windowed = sf.load_model(config="tiny-random", device="cpu", window=1)
    want, ref_info = windowed.generate_latents(PROMPT, 3, FULL_PRECISION)
    got, info = tiny_model.generate_latents(PROMPT, 3, pruned(profile))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    full, full_info = tiny_model.generate_latents(PROMPT, 3, FULL_PRECISION)
    assert (got - full).abs().max() > 1e-3  # pruning did change what the model saw
    split = info["kv_cache_bytes_by_head"]
    assert set(split) == {"static"} and split["static"] == info["kv_cache_bytes"]
    assert ref_info["kv_cache_bytes"] < info["kv_cache_bytes"] < full_info["kv_cache_bytes"]


@pytest.mark.slow  # end to end
def test_self_forcing_int2_with_forcing_kv_end_to_end(tiny_model, head_profile):
    """Prune, then quantize what is kept, with the correction. (At 4 tokens per frame the
    positions and segment means outweigh what INT2 pruning saves; FP32 pruning saves.)"""
    profile = head_profile("self-forcing", LAYOUT, "dynamic", 1)
    fkv = ForcingKVHistory(profile=profile, segments=2, retention=0.5)
    both = KVSpec.build("rtn", bits=2, correction="taylor", pruner=fkv)
    video = tiny_model.generate(PROMPT, 3, both)
    plain = tiny_model.generate(PROMPT, 3, KVSpec.build("rtn", bits=2, correction="taylor"))
    assert sum(video.info["kv_cache_bytes_by_head"].values()) == video.kv_cache_bytes > 0
    assert video.frames.shape == plain.frames.shape and video.info["kv"] == both.label
    assert not torch.equal(video.frames, plain.frames)
    full = tiny_model.generate(PROMPT, 3, FULL_PRECISION).kv_cache_bytes
    assert tiny_model.generate(PROMPT, 3, KVSpec(pruner=fkv)).kv_cache_bytes < 0.7 * full


def test_self_forcing_profile_reads_every_cached_frame(tiny_model):
    probe = FrameMassProbe(TOKENS)
    tiny_model.profile_heads(PROMPT, 0, probe)
    # chunks 1 and 2 read the cache at each of the 4 steps, in both blocks; clean passes do not
    assert len(probe.records) == 2 * 4 * 2
    assert {r.step for r in probe.records} == {0, 1, 2, 3}
    for r in probe.records:
        assert r.recent.shape == (2, K * r.chunk)  # query heads x cached frames
        total = r.current + r.recent.sum(-1)
        torch.testing.assert_close(total, torch.ones_like(total), atol=1e-5, rtol=0)


def test_self_forcing_profile_heads_then_quantize_eval_with_forcing_kv(tmp_path):
    runner = CliRunner()
    model = ["-m", "self-forcing", "-o", "config=tiny-random", "--prompt", PROMPT, "--seeds", "0"]
    path = tmp_path / "heads.json"
    result = runner.invoke(app, ["profile-heads", *model, "--out", str(path)])
    assert result.exit_code == 0, result.output
    profile = load_profile(path)
    assert profile.model == "self-forcing" and profile.layers == 2
    args = ["quantize-eval", *model, "--quantizers", "rtn", "--bits", "2"]
    args += ["--pruners", "none,forcing-kv", "--corrections", "none,taylor", "--no-lpips"]
    args += ["-M", f"forcing-kv.profile={path}"]
    args += ["--no-plots", "--out", str(tmp_path / "q"), "--json", str(tmp_path / "r.json")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {r["variant"]: r for r in json.loads((tmp_path / "r.json").read_text())["rows"]}
    digest = ForcingKV(profile=str(path)).variant_id
    assert set(rows) == {
        "reference",
        "int2-rtn-g32",
        "int2-rtn-g32-taylor",
        digest,
        f"int2-rtn-g32-{digest}",
        f"int2-rtn-g32-{digest}-taylor",
    }
    fkv = rows[digest]
    assert fkv["pruner"] == "forcing-kv" and 0 < fkv["kv_ratio"] < 1
    assert sum(fkv["kv_bytes_by_head"].values()) == fkv["kv_cache_bytes"]


def test_self_forcing_default_segments_that_do_not_fit_a_frame_are_a_usage_error(
    tmp_path, head_profile
):
    profile = head_profile("self-forcing", LAYOUT, "dynamic", 1)
    args = ["generate", "-m", "self-forcing", "-o", "config=tiny-random", "--prompt", PROMPT]
    for pruner, option, message in (
        ("forcing-kv-history", "segments=8", "segments must be in 1..4"),
        ("forcing-kv", "num_frame_patch=3", "num_frame_patch=3 does not divide a frame's 4"),
    ):
        given = [
            "--pruner",
            pruner,
            "-M",
            f"{pruner}.profile={profile}",
            "-M",
            f"{pruner}.{option}",
        ]
        result = CliRunner().invoke(app, [*args, *given, "--out", str(tmp_path / "o")])
        assert result.exit_code == 2
        assert message in result.output
        assert not (tmp_path / "o").exists()
