"""Self-Forcing adapter: the chunk-cached loop against one block-causal full forward, LongLive's
sink + window against its ring buffer and a banded mask, the 16-bit cache against no
quantization, the whole sampler against a recomputing one, and generation end to end.

All on CPU in float32 with the tiny random configuration; nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("diffusers")

from jbkv_cli.kvcache import ChunkKVCache
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models import loop, registry
from jbkv_cli.models.base import Video
from jbkv_cli.models.contract import VideoModel
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.wan.attention import ChunkContext, cached_self_attention
from jbkv_cli.models.wan.rope import shifted_rotary
from jbkv_cli.models.wan.self_forcing import model as sf
from jbkv_cli.models.wan.self_forcing.components import tiny_components
from jbkv_cli.models.wan.self_forcing.schedule import FewStepSchedule, denoising_step_list
from jbkv_cli.models.wan.tiny import TINY_TEXT_DIM
from jbkv_cli.utils.errors import JbkvError

pytestmark = pytest.mark.slow

ATOL = 1e-5  # fp32: one forward, chunk loop with cache vs full forward under a mask
K = 3  # latent frames per chunk (Self-Forcing's num_frame_per_block)
TOKENS = 4  # tokens per latent frame at 32x32 pixels (4x4 latents, 2x2 patches)
INT2 = KVSpec.build("rtn", bits=2)
INT2_TAYLOR = KVSpec.build("rtn", bits=2, correction="taylor")


@pytest.fixture(scope="module")
def tiny():
    return tiny_components(seed=0)


@pytest.fixture(scope="module")
def tiny_model():
    return sf.load_model(config="tiny-random", device="cpu")


def _inputs(num_chunks: int):
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, K * num_chunks, 4, 4, generator=g)
    text = torch.randn(1, 8, TINY_TEXT_DIM, generator=g)
    per_chunk = [0.0, 937.5, 250.0, 625.0, 833.3, 0.0][:num_chunks]
    return latents, text, per_chunk


def block_mask(num_chunks: int, window: int | None = None, sink: int = 0) -> torch.Tensor:
    """``[L, L]`` bool: query chunk q sees itself, the sinks before it and the last ``window``
    finished chunks after the sinks (every earlier chunk when ``window`` is None)."""
    chunk = torch.arange(num_chunks).repeat_interleave(K * TOKENS)
    q, k = chunk[:, None], chunk[None, :]
    earlier = k < q
    recent = k >= torch.clamp(q - (window if window is not None else num_chunks), min=sink)
    return (k == q) | (earlier & ((k < sink) | recent))


def _chunk_loop(transformer, latents, text, per_chunk, caches):
    """jbkv's path: one chunk per forward at its own timestep, each forward commits its K/V."""
    context = ChunkContext(caches=caches, commit=True)
    outs = []
    with cached_self_attention(transformer, context):
        for c, t in enumerate(per_chunk):
            context.frame_offset = c * K
            x = latents[:, :, c * K : (c + 1) * K]
            outs.append(transformer(x, torch.tensor([t]), text, return_dict=False)[0])
    return torch.cat(outs, dim=2)


# --------------------------------------------------------------------------- schedule


def test_self_forcing_schedule_is_the_warped_shifted_table():
    assert denoising_step_list(4) == (1000, 750, 500, 250)
    schedule = FewStepSchedule.build(4, 5.0)
    # σ = 5s/(1 + 4s) at s = 1, 0.75, 0.5, 0.25 (float32 table), t = 1000 σ
    assert schedule.sigmas == pytest.approx((1.0, 0.9375, 5 / 6, 0.625), abs=1e-7)
    assert schedule.timesteps == pytest.approx((1000.0, 937.5, 2500 / 3, 625.0), abs=1e-4)


def test_self_forcing_shifted_rotary_rows_of_the_wan_table(tiny):
    rope = tiny.transformer.rope
    x = torch.zeros(1, 16, 9, 4, 4)
    full_cos, full_sin = rope(x)
    cos, sin = shifted_rotary(rope, x[:, :, 3:6], 3)
    rows = slice(3 * TOKENS, 6 * TOKENS)
    assert torch.equal(cos, full_cos[:, rows]) and torch.equal(sin, full_sin[:, rows])


# --------------------------------------------------------------------------- oracles


def test_self_forcing_chunk_loop_equals_block_causal_full_forward(tiny, masked_forward):
    transformer = tiny.transformer
    latents, text, per_chunk = _inputs(4)
    with torch.no_grad():
        full = masked_forward(transformer, latents, text, per_chunk, K, block_mask(4))
        caches = [ChunkKVCache(FULL_PRECISION) for _ in transformer.blocks]
        loop = _chunk_loop(transformer, latents, text, per_chunk, caches)
    print(f"max |loop - full| = {(loop - full).abs().max().item():.2e}")
    torch.testing.assert_close(loop, full, atol=ATOL, rtol=0)
    assert all(c.num_chunks == 4 for c in caches)


@pytest.mark.parametrize(("window", "sink"), [(2, 1), (1, 0), (1, 2)])
def test_self_forcing_sink_and_window_equal_a_banded_mask(tiny, window, sink, masked_forward):
    """LongLive's cache: sinks keep their absolute RoPE frames, the window slides past them."""
    transformer = tiny.transformer
    latents, text, per_chunk = _inputs(6)
    spec = KVSpec(sink_chunks=sink)
    with torch.no_grad():
        full = masked_forward(transformer, latents, text, per_chunk, K, block_mask(6, window, sink))
        caches = [ChunkKVCache(spec, window) for _ in transformer.blocks]
        loop = _chunk_loop(transformer, latents, text, per_chunk, caches)
    print(f"window {window} sink {sink}: max |loop - full| = {(loop - full).abs().max():.2e}")
    torch.testing.assert_close(loop, full, atol=ATOL, rtol=0)
    assert all(c.num_chunks == sink + window for c in caches)


def _ring_buffer(num_chunks: int, k: int, local_attn_size: int, sink_size: int):
    """Frames each chunk attends to besides itself, by the index arithmetic of LongLive v1.0's
    ``CausalWanSelfAttention.forward`` (``wan/modules/causal_model.py``) in units of frames:
    roll out the oldest non-sink frames when a new chunk overflows the buffer, then attend to
    ``buffer[:sink]`` + ``buffer[max(sink, end − (local − sink)) : end]``."""
    buffer: list[int | None] = [None] * local_attn_size
    global_end = local_end = 0
    seen = []
    for c in range(num_chunks):
        start, end = c * k, (c + 1) * k
        if end > global_end and k + local_end > local_attn_size:
            evicted = k + local_end - local_attn_size
            rolled = local_end - evicted - sink_size
            kept = buffer[sink_size + evicted : sink_size + evicted + rolled]
            buffer[sink_size : sink_size + rolled] = kept
            local_end += end - global_end - evicted
        else:
            local_end += end - global_end
        buffer[local_end - k : local_end] = list(range(start, end))
        if sink_size:
            lo = max(sink_size, local_end - (local_attn_size - sink_size))
            attended = buffer[:sink_size] + buffer[lo:local_end]
        else:
            attended = buffer[max(0, local_end - local_attn_size) : local_end]
        seen.append(sorted({f for f in attended if f is not None and f < start}))
        global_end = end
    return seen


@pytest.mark.parametrize(("local_attn_size", "sink_size"), [(12, 3), (9, 0), (15, 3), (12, 6)])
def test_self_forcing_cache_keeps_what_longlives_ring_buffer_keeps(local_attn_size, sink_size):
    window, sink = sf.window_from_frames(local_attn_size, sink_size, K)
    cache = ChunkKVCache(KVSpec.build("rtn", 2, sink_chunks=sink), window)
    expected = _ring_buffer(10, K, local_attn_size, sink_size)
    for c in range(10):
        view = cache.read()
        frames = [] if view is None else sorted({int(f) for f in view.v[0, 0, :, 0].tolist()})
        assert frames == expected[c], f"chunk {c}"
        frame_ids = torch.arange(c * K, (c + 1) * K).repeat_interleave(TOKENS).float()
        ids = frame_ids.view(1, 1, -1, 1).expand(1, 2, -1, 32)
        cache.commit(ids.clone(), ids.clone())  # constant per token: INT2 stores it exactly


def test_self_forcing_16bit_cache_is_bit_identical_to_plain_concat(tiny, plain_cache):
    transformer = tiny.transformer
    latents, text, per_chunk = _inputs(3)
    with torch.no_grad():
        plain = _chunk_loop(
            transformer, latents, text, per_chunk, [plain_cache() for _ in transformer.blocks]
        )
        jbkv = _chunk_loop(
            transformer,
            latents,
            text,
            per_chunk,
            [ChunkKVCache(FULL_PRECISION) for _ in transformer.blocks],
        )
    assert torch.equal(plain, jbkv)


def test_self_forcing_generate_16bit_equals_plain_loop(tiny_model, monkeypatch, plain_layer_caches):
    latents, _ = tiny_model.generate_latents("a red ball", 3, FULL_PRECISION)
    monkeypatch.setattr(loop, "layer_caches", plain_layer_caches)
    plain, _ = tiny_model.generate_latents("a red ball", 3, FULL_PRECISION)
    assert torch.equal(latents, plain)


def _recomputing_sampler(model, prompt: str, seed: int, masked_forward) -> torch.Tensor:
    """The sampler without a KV cache: every step runs the whole video so far, finished chunks
    as clean latents at t = 0 and the current chunk at t, under the block-causal mask."""
    s, transformer = model.config, model.components.transformer
    schedule = FewStepSchedule.build(s.steps, s.shift)
    text = model.encode_prompt(prompt)
    generator = noise_generator(seed, prompt)
    done: list[torch.Tensor] = []
    for c in range(s.num_chunks):
        x = torch.randn(1, 16, K, 4, 4, generator=generator)
        for i, (t, sigma) in enumerate(zip(schedule.timesteps, schedule.sigmas, strict=True)):
            video = torch.cat([*done, x], dim=2)
            mask = block_mask(c + 1, s.window)
            flow = masked_forward(transformer, video, text, [0.0] * c + [t], K, mask)[:, :, -K:]
            x0 = (x.double() - sigma * flow.double()).float()
            if i + 1 < len(schedule):
                noise = torch.randn(1, 16, K, 4, 4, generator=generator)
                x = (1 - schedule.sigmas[i + 1]) * x0 + schedule.sigmas[i + 1] * noise
        done.append(x0)
    return torch.cat(done, dim=2)


def test_self_forcing_generate_equals_a_recomputing_sampler(tiny_model, masked_forward):
    """The whole loop (cache, t = 0 clean-context commits, x₀/re-noise steps, noise order)."""
    with torch.no_grad():
        ours, _ = tiny_model.generate_latents("a red ball", 3, FULL_PRECISION)
        reference = _recomputing_sampler(tiny_model, "a red ball", 3, masked_forward)
    print(f"max |cached - recomputed| = {(ours - reference).abs().max():.2e}")
    torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------- generate


def test_self_forcing_generate_tiny_full_precision_is_a_video(tiny_model):
    assert isinstance(tiny_model, VideoModel)
    json.dumps(tiny_model.settings)
    done = []
    video = tiny_model.generate(
        "a red ball", 3, FULL_PRECISION, progress=lambda i, n: done.append((i, n))
    )
    assert isinstance(video, Video)
    assert video.frames.shape == (33, 32, 32, 3) and video.frames.dtype == torch.uint8
    assert done == [(1, 3), (2, 3), (3, 3)]
    # chunks of 3 latent frames decode to 12 frames, the first to 9: 9 + 12 + 12 = 33
    assert (video.info["first_chunk_frames"], video.info["frames_per_chunk"]) == (9, 12)
    # 2 layers x 2 cached chunks x (K and V) x [1, 2 heads, 12 tokens, 32] fp32
    assert video.kv_cache_bytes == 2 * 2 * 2 * (2 * 12 * 32) * 4
    assert video.info["timesteps"] == [1000.0, 937.5, 833.3333, 625.0]


def test_self_forcing_longer_video_starts_with_the_shorter_one(tiny_model):
    short, _ = tiny_model.generate_latents("a red ball", 3, FULL_PRECISION)
    longer = sf.SelfForcing(tiny_model.components, sf.replace(tiny_model.config, num_chunks=4))
    latents, _ = longer.generate_latents("a red ball", 3, FULL_PRECISION)
    assert torch.equal(latents[:, :, : short.shape[2]], short)
    other, _ = tiny_model.generate_latents("a red ball", 4, FULL_PRECISION)
    assert not torch.equal(other, short)


@pytest.mark.parametrize("spec", [INT2, INT2_TAYLOR], ids=["int2", "int2+taylor"])
def test_self_forcing_generate_int2_end_to_end(tiny_model, spec):
    video = tiny_model.generate("a red ball", 3, spec)
    assert video.frames.shape == (33, 32, 32, 3)
    full_bytes = 2 * 2 * 2 * (2 * 12 * 32) * 4
    assert 0 < video.kv_cache_bytes < full_bytes / 4
    assert video.info["kv"] == spec.label


def test_self_forcing_correction_changes_the_result_and_backends_agree(tiny_model):
    plain, _ = tiny_model.generate_latents("a red ball", 3, INT2)
    fused, _ = tiny_model.generate_latents("a red ball", 3, INT2_TAYLOR)
    assert not torch.equal(plain, fused)
    reference = sf.SelfForcing(
        tiny_model.components, sf.replace(tiny_model.config, attention_backend="reference")
    )
    dense, _ = reference.generate_latents("a red ball", 3, INT2_TAYLOR)
    torch.testing.assert_close(dense, fused, atol=1e-4, rtol=0)


def test_self_forcing_sink_stays_full_precision_in_generation(tiny_model):
    longlive = sf.SelfForcing(
        tiny_model.components, sf.replace(tiny_model.config, window=1, sink=1, num_chunks=4)
    )
    _, info = longlive.generate_latents("a red ball", 3, INT2)
    assert info["sink_chunks"] == 1
    chunk = 2 * 12 * 32 * 4  # one chunk's K (or V) of one layer in fp32
    # per layer at the peak: the fp32 sink (K+V) and one INT2 chunk (K+V), 2 layers
    assert 2 * 2 * chunk < info["kv_cache_bytes"] < 2 * 2 * chunk * 1.5
    with pytest.raises(ValueError, match="asks for 2 sink chunk"):
        longlive.generate_latents("a red ball", 3, KVSpec.build("rtn", 2, sink_chunks=2))


# --------------------------------------------------------------------------- options


def test_self_forcing_registry_builds_the_tiny_model():
    model = registry.load_model("self-forcing", config="tiny-random", num_chunks=2, steps=1)
    assert model.name == "self-forcing" and model.settings["num_frames"] == 21
    assert model.settings["timesteps"] == [1000.0]


def test_self_forcing_longlive_options_in_frames():
    model = sf.load_model(config="tiny-random", local_attn_size=12, sink_size=3, device="cpu")
    assert (model.config.window, model.config.sink) == (2, 1)
    assert (sf.PRESETS["longlive"]["window"], sf.PRESETS["longlive"]["sink"]) == (2, 1)
    assert sf.load_model(config="tiny-random", num_frames=45).config.num_chunks == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bogus": 1}, "unknown self-forcing option"),
        ({"config": "nope"}, "config must be one of"),
        ({"num_frames": 20}, "num_frames=20"),
        ({"num_frames": 21, "num_chunks": 3}, "disagree"),
        ({"height": 40}, "multiple of 16"),
        ({"window": -1}, "window"),
        ({"sink": -1}, "sink must be"),
        ({"steps": 0}, "steps must be"),
        ({"num_chunks": 11}, "rotary table"),
        ({"local_attn_size": 12}, "together"),
        ({"local_attn_size": 10, "sink_size": 3}, "whole chunks"),
        ({"local_attn_size": 12, "sink_size": 3, "window": 1}, "either"),
        ({"generator": "/x.pt"}, "tiny-random builds random weights"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"attention_backend": "magic"}, "attention_backend"),
    ],
)
def test_self_forcing_bad_options_fail_with_a_message(options, message):
    with pytest.raises(JbkvError, match=message):
        sf.load_model(config=options.pop("config", "tiny-random"), **options)
