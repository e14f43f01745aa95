"""QuantVideoGen on the Wan-family adapters (tiny random configs, CPU, float32): the pre-RoPE
layout against the post-RoPE one with a 16-bit cache (the oracle), and Self-Forcing's upstream
policy — pre-RoPE keys, spans of 8 chunks that stay 16-bit until full."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")

from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.wan.self_forcing import model as sf
from jbkv_cli.models.wan.skyreels_v2 import model as sky

PROMPT = "a red ball"
QVG = KVSpec.build("qvg", 2, 32, "taylor")  # the tiny transformer's heads have 32 channels


@pytest.fixture(scope="module")
def self_forcing():
    return sf.load_model(config="tiny-random", device="cpu")


def test_self_forcing_16bit_pre_rope_equals_post_rope(self_forcing):
    """Keys rotated on read with the table they would have been rotated with at commit: the
    same tensors, so the same video (bit for bit; the tolerance would allow fp32 rounding)."""
    post, _ = self_forcing.generate_latents(PROMPT, 3, FULL_PRECISION, layout="post-rope")
    pre, _ = self_forcing.generate_latents(PROMPT, 3, FULL_PRECISION, layout="pre-rope")
    torch.testing.assert_close(pre, post, atol=1e-6, rtol=0)


def test_skyreels_16bit_pre_rope_equals_post_rope():
    model = sky.load_model(config="tiny-random", device="cpu", num_chunks=3, steps=2)
    post, _ = model.generate_latents(PROMPT, 3, FULL_PRECISION)
    pre, _ = model.generate_latents(PROMPT, 3, FULL_PRECISION, layout="pre-rope")
    torch.testing.assert_close(pre, post, atol=1e-6, rtol=0)


def test_self_forcing_runs_qvg_as_upstream_pre_rope_spans_of_8(self_forcing):
    """10 chunks, no eviction: the first 8 chunks are generated reading a 16-bit cache (their
    span fills only when chunk 7 is committed), so they equal the reference; chunks 8 and 9
    read the quantized span. The peak is 7 chunks waiting, counted 16-bit."""
    long = sf.SelfForcing(
        self_forcing.components, sf.replace(self_forcing.config, num_chunks=10, window=None)
    )
    spec = long.resolve_kv(QVG)
    assert spec.label == "INT2 qvg g32 K≤L/64 N8 pre-RoPE +taylor"
    reference, ref_info = long.generate_latents(PROMPT, 3, FULL_PRECISION)
    latents, info = long.generate_latents(PROMPT, 3, QVG)
    k = long.config.chunk_frames
    assert torch.equal(latents[:, :, : 8 * k], reference[:, :, : 8 * k])
    assert not torch.equal(latents[:, :, 8 * k :], reference[:, :, 8 * k :])
    chunk = 2 * 2 * 2 * 12 * 32 * 4  # 2 layers × (K and V) × [1, 2 heads, 12 tokens, 32] fp32
    assert ref_info["kv_cache_bytes"] == 9 * chunk  # 9 committed chunks
    assert info["kv_cache_bytes"] == 7 * chunk


def test_self_forcing_default_video_is_too_short_for_a_span(self_forcing):
    """jbkv's 3-chunk tiny video (Self-Forcing's own: 7) never fills a span of 8: QVG's cache
    stays 16-bit, as upstream's would, and says so in its bytes."""
    video = self_forcing.generate(PROMPT, 3, QVG)
    reference = self_forcing.generate(PROMPT, 3, FULL_PRECISION)
    assert video.kv_cache_bytes == reference.kv_cache_bytes
    assert torch.equal(video.frames, reference.frames)
    assert video.info["kv"] == "INT2 qvg g32 K≤L/64 N8 pre-RoPE +taylor"
