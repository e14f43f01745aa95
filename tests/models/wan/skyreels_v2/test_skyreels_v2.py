"""SkyReels-V2 adapter: chunk-cached loop vs diffusers' block-causal full forward, cache paths,
end-to-end generation on the tiny random configuration, and weight-directory errors.

All on CPU in float32 with random weights; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from jbkv_cli.kvcache import ChunkKVCache
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models import loop, registry
from jbkv_cli.models.base import Video
from jbkv_cli.models.contract import VideoModel
from jbkv_cli.models.wan.skyreels_v2 import components as comp
from jbkv_cli.models.wan.skyreels_v2 import model as sky
from jbkv_cli.models.wan.skyreels_v2.attention import (
    CachedSelfAttnProcessor,
    ChunkContext,
    chunk_attention,
    shifted_rotary,
)
from jbkv_cli.utils.errors import JbkvError, WeightsNotFoundError

pytestmark = pytest.mark.slow

ATOL = 1e-5  # fp32: chunk loop with cache vs one full forward
K = 2  # latent frames per chunk in these tests
INT2 = KVSpec.build("rtn", bits=2)
INT2_TAYLOR = KVSpec.build("rtn", bits=2, correction="taylor")


@pytest.fixture(scope="module")
def tiny():
    return comp.tiny_components(seed=0)


@pytest.fixture(scope="module")
def tiny_model():
    return sky.load_model(config="tiny-random", device="cpu")


def _inputs(num_chunks: int = 3):
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, K * num_chunks, 4, 4, generator=g)
    text = torch.randn(1, 8, comp.TINY_TEXT_DIM, generator=g)
    per_chunk = torch.tensor([0, 417, 999, 250])[:num_chunks]
    timesteps = per_chunk.repeat_interleave(K).unsqueeze(0)  # [1, F] per-frame timesteps
    return latents, text, timesteps


def _full_forward(transformer, latents, text, timesteps):
    """diffusers' own path: block-causal mask over all frames, per-frame timesteps."""
    transformer.register_to_config(num_frame_per_block=K)
    try:
        return transformer(
            latents, timesteps, text, enable_diffusion_forcing=True, return_dict=False
        )[0]
    finally:
        transformer.register_to_config(num_frame_per_block=1)


def _chunk_loop(transformer, latents, text, timesteps, caches, backend=None):
    """jbkv's path: one chunk per forward, each forward commits its K/V."""
    context = ChunkContext(caches=caches, commit=True, backend=backend)
    outs = []
    with chunk_attention(transformer, context):
        for c in range(latents.shape[2] // K):
            frames = slice(c * K, (c + 1) * K)
            context.frame_offset = c * K
            out = transformer(
                latents[:, :, frames],
                timesteps[:, frames],
                text,
                enable_diffusion_forcing=True,
                return_dict=False,
            )[0]
            outs.append(out)
    return torch.cat(outs, dim=2)


# --------------------------------------------------------------------------- RoPE offset


def test_shifted_rotary_is_the_full_table_rows(tiny):
    rope = tiny.transformer.rope
    x = torch.zeros(1, 16, 6, 4, 4)
    full_cos, full_sin = rope(x)
    cos0, sin0 = shifted_rotary(rope, x, 0)
    assert torch.equal(cos0, full_cos) and torch.equal(sin0, full_sin)
    tokens = 2 * 2 * 2  # 2 frames of 2x2 patches
    cos, sin = shifted_rotary(rope, x[:, :, 2:4], 2)
    assert torch.equal(cos, full_cos[:, 2 * 4 : 2 * 4 + tokens])
    assert torch.equal(sin, full_sin[:, 2 * 4 : 2 * 4 + tokens])
    with pytest.raises(ValueError, match="rotary table"):
        shifted_rotary(rope, x[:, :, :2], rope.max_seq_len - 1)


# --------------------------------------------------------------------------- the oracle


def test_chunk_loop_with_cache_equals_block_causal_full_forward(tiny):
    transformer = tiny.transformer
    latents, text, timesteps = _inputs()
    with torch.no_grad():
        full = _full_forward(transformer, latents, text, timesteps)
        caches = [ChunkKVCache(FULL_PRECISION) for _ in transformer.blocks]
        loop = _chunk_loop(transformer, latents, text, timesteps, caches)
    torch.testing.assert_close(loop, full, atol=ATOL, rtol=0)
    assert all(c.num_chunks == 3 for c in caches)


def test_window_matches_a_banded_block_mask(tiny):
    """window=1: chunk c sees chunks c-1 and c only; the full forward gets that mask."""
    transformer = tiny.transformer
    latents, text, timesteps = _inputs(num_chunks=4)
    block = torch.arange(4).repeat_interleave(K * 4)  # chunk id per token (4 tokens per frame)
    banded = (block[None, :] <= block[:, None]) & (block[None, :] >= block[:, None] - 1)

    class Banded:
        def __init__(self, stock):
            self.stock = stock

        def __call__(self, attn, hidden, enc=None, mask=None, rotary=None):
            return self.stock(attn, hidden, enc, banded[None, None], rotary)

    stock = [b.attn1.get_processor() for b in transformer.blocks]
    with torch.no_grad():
        try:
            for b, p in zip(transformer.blocks, stock, strict=True):
                b.attn1.set_processor(Banded(p))
            full = transformer(
                latents, timesteps, text, enable_diffusion_forcing=True, return_dict=False
            )[0]
        finally:
            for b, p in zip(transformer.blocks, stock, strict=True):
                b.attn1.set_processor(p)
        caches = [ChunkKVCache(FULL_PRECISION, window=1) for _ in transformer.blocks]
        loop = _chunk_loop(transformer, latents, text, timesteps, caches)
    torch.testing.assert_close(loop, full, atol=ATOL, rtol=0)


def test_16bit_cache_is_bit_identical_to_plain_concat(tiny, plain_cache):
    transformer = tiny.transformer
    latents, text, timesteps = _inputs()
    with torch.no_grad():
        plain = _chunk_loop(
            transformer, latents, text, timesteps, [plain_cache() for _ in transformer.blocks]
        )
        jbkv = _chunk_loop(
            transformer,
            latents,
            text,
            timesteps,
            [ChunkKVCache(FULL_PRECISION) for _ in transformer.blocks],
        )
    assert torch.equal(plain, jbkv)


def test_reading_forwards_leave_the_cache_alone(tiny):
    transformer = tiny.transformer
    latents, text, timesteps = _inputs(num_chunks=2)
    caches = [ChunkKVCache(INT2_TAYLOR) for _ in transformer.blocks]
    context = ChunkContext(caches=caches)
    with torch.no_grad(), chunk_attention(transformer, context):
        context.commit = True
        transformer(latents[:, :, :K], timesteps[:, :K], text, enable_diffusion_forcing=True)
        context.commit, context.frame_offset = False, K
        args = (latents[:, :, K:], timesteps[:, K:], text)
        first = transformer(*args, enable_diffusion_forcing=True, return_dict=False)
        second = transformer(*args, enable_diffusion_forcing=True, return_dict=False)
    assert all(c.num_chunks == 1 and c.committed == 1 for c in caches)
    assert torch.equal(first[0], second[0])


def test_processors_and_config_restored_even_on_error(tiny, plain_cache):
    transformer = tiny.transformer
    before = [b.attn1.get_processor() for b in transformer.blocks]
    cross = [b.attn2.get_processor() for b in transformer.blocks]
    context = ChunkContext(caches=[plain_cache() for _ in transformer.blocks])
    with pytest.raises(RuntimeError, match="boom"), chunk_attention(transformer, context):
        assert all(
            isinstance(b.attn1.processor, CachedSelfAttnProcessor) for b in transformer.blocks
        )
        assert [b.attn2.get_processor() for b in transformer.blocks] == cross
        raise RuntimeError("boom")
    assert [b.attn1.get_processor() for b in transformer.blocks] == before
    assert transformer.config.num_frame_per_block == 1
    assert not transformer.rope._forward_hooks


# --------------------------------------------------------------------------- generate


def test_generate_tiny_full_precision_is_a_video(tiny_model):
    assert isinstance(tiny_model, VideoModel)
    json.dumps(tiny_model.settings)
    done = []
    video = tiny_model.generate(
        "a red ball", 3, FULL_PRECISION, progress=lambda i, n: done.append((i, n))
    )
    assert isinstance(video, Video)
    assert video.frames.shape == (21, 32, 32, 3) and video.frames.dtype == torch.uint8
    assert done == [(1, 3), (2, 3), (3, 3)]
    # chunks of 2 latent frames decode to 8 frames, the first to 5: 5 + 8 + 8 = 21
    assert (video.info["first_chunk_frames"], video.info["frames_per_chunk"]) == (5, 8)
    # 2 CFG branches x 2 layers x 2 cached chunks x (K and V) x [1, 2 heads, 8 tokens, 32] fp32
    assert video.kv_cache_bytes == 2 * 2 * 2 * 2 * (2 * 8 * 32) * 4
    assert video.info["dtype"] == "float32" and video.info["cfg_branches"] == 2


def test_initial_noise_is_shared_and_prefix_stable(tiny_model):
    noise = tiny_model.initial_noise("a red ball", 3)
    assert torch.equal(noise, tiny_model.initial_noise("a red ball", 3))
    assert not torch.equal(noise, tiny_model.initial_noise("a red ball", 4))
    longer = sky.SkyReelsV2(tiny_model.components, sky.replace(tiny_model.config, num_chunks=5))
    assert torch.equal(longer.initial_noise("a red ball", 3)[:, :, : noise.shape[2]], noise)


def test_generate_16bit_cache_equals_plain_loop(tiny_model, monkeypatch, plain_layer_caches):
    latents, _ = tiny_model.generate_latents("a red ball", 3, FULL_PRECISION)
    monkeypatch.setattr(loop, "layer_caches", plain_layer_caches)
    plain, _ = tiny_model.generate_latents("a red ball", 3, FULL_PRECISION)
    assert torch.equal(latents, plain)


@pytest.mark.parametrize("spec", [INT2, INT2_TAYLOR], ids=["int2", "int2+taylor"])
def test_generate_int2_end_to_end(tiny_model, spec):
    video = tiny_model.generate("a red ball", 3, spec)
    assert video.frames.shape == (21, 32, 32, 3) and video.frames.dtype == torch.uint8
    full_bytes = 2 * 2 * 2 * 2 * (2 * 8 * 32) * 4
    assert 0 < video.kv_cache_bytes < full_bytes / 4
    assert video.info["kv"] == spec.label


def test_correction_changes_the_result_and_backends_agree(tiny_model):
    plain, _ = tiny_model.generate_latents("a red ball", 3, INT2)
    fused, _ = tiny_model.generate_latents("a red ball", 3, INT2_TAYLOR)
    assert not torch.equal(plain, fused)
    reference = sky.SkyReelsV2(
        tiny_model.components, sky.replace(tiny_model.config, attention_backend="reference")
    )
    dense, _ = reference.generate_latents("a red ball", 3, INT2_TAYLOR)
    torch.testing.assert_close(dense, fused, atol=1e-4, rtol=0)


def test_generate_matches_diffusers_diffusion_forcing_pipeline(tiny_model, monkeypatch):
    """The whole loop (cache, clean-context commits, CFG, UniPC) equals diffusers' recomputing
    pipeline with the same blocks denoised one after another (ar_step = steps)."""
    from diffusers import SkyReelsV2DiffusionForcingPipeline

    c, s = tiny_model.components, tiny_model.config
    pipe = SkyReelsV2DiffusionForcingPipeline(
        tokenizer=c.tokenizer,
        text_encoder=c.text_encoder,
        transformer=c.transformer,
        vae=c.vae,
        scheduler=c.scheduler,
    )
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        try:
            reference = pipe(
                prompt=None,  # embeddings given: the pipeline's own prompt cleaning needs ftfy
                prompt_embeds=tiny_model.encode_prompt("a red ball"),
                negative_prompt_embeds=tiny_model.encode_prompt(s.negative_prompt),
                num_inference_steps=s.steps,
                guidance_scale=s.guidance,
                height=s.height,
                width=s.width,
                num_frames=tiny_model.num_frames,
                ar_step=s.steps,
                causal_block_size=s.chunk_frames,
                max_sequence_length=c.max_sequence_length,
                generator=torch.Generator().manual_seed(0),
                output_type="latent",
            ).frames
        finally:
            c.transformer.register_to_config(num_frame_per_block=1)
    noise = torch.randn(reference.shape, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(tiny_model, "initial_noise", lambda prompt, seed: noise)
    ours, _ = tiny_model.generate_latents("a red ball", 0, FULL_PRECISION)
    torch.testing.assert_close(ours, reference, atol=5e-5, rtol=0)


def test_registry_builds_the_tiny_model():
    model = registry.load_model("skyreels-v2", config="tiny-random", num_chunks=2, steps=1)
    assert model.name == "skyreels-v2" and model.settings["num_frames"] == 13


# --------------------------------------------------------------------------- options & weights


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bogus": 1}, "unknown skyreels-v2 option"),
        ({"num_frames": 20}, "num_frames=20"),
        ({"num_frames": 17}, "num_frames=17"),  # 5 latent frames: not whole chunks of 2
        ({"height": 40}, "multiple of 16"),
        ({"window": 0}, "window"),
        ({"num_chunks": 20}, "rotary table"),
        ({"weights": "/x"}, "tiny-random builds random weights"),
        ({"dtype": "int8"}, "dtype must be one of"),
    ],
)
def test_bad_options_fail_with_a_message(options, message):
    with pytest.raises(JbkvError, match=message):
        sky.load_model(config="tiny-random", **options)


def test_num_frames_sets_num_chunks():
    model = sky.load_model(config="tiny-random", num_frames=13, steps=1)
    assert model.settings["num_chunks"] == 2


def test_no_weights_anywhere(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.delenv(comp.ENV_VAR, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(WeightsNotFoundError, match=comp.DEFAULT_REPO_ID):
        sky.load_model()
    with pytest.raises(WeightsNotFoundError, match="neither a directory"):
        sky.load_model(weights=str(tmp_path / "nope"))


def test_empty_weights_dir_lists_every_part(tmp_path):
    with pytest.raises(WeightsNotFoundError) as err:
        sky.load_model(weights=str(tmp_path))
    message = str(err.value)
    assert "\n" not in message
    for part in ("transformer/config.json", "vae/", "text_encoder/", "tokenizer/", "scheduler/"):
        assert part in message


@pytest.fixture(scope="module")
def saved_tiny(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("skyreels")
    comp.save_components(tiny, root)
    return root


def test_loads_a_diffusers_directory(saved_tiny, monkeypatch):
    monkeypatch.setenv(comp.ENV_VAR, str(saved_tiny))
    model = sky.load_model(
        height=32, width=32, chunk_frames=2, num_chunks=2, steps=1, guidance=1.0, device="cpu"
    )
    assert model.settings["weights"] == str(saved_tiny)
    video = model.generate("a red ball", 0, FULL_PRECISION)
    assert video.frames.shape == (13, 32, 32, 3) and video.info["cfg_branches"] == 1


def test_malformed_weights_fail_with_a_message(saved_tiny, tmp_path):
    import shutil

    root = tmp_path / "w"
    shutil.copytree(saved_tiny, root)
    config = root / "transformer" / "config.json"
    good = config.read_text()
    config.write_text("{not json")
    with pytest.raises(WeightsNotFoundError, match="malformed"):
        sky.load_model(weights=str(root))
    config.write_text(json.dumps(json.loads(good) | {"_class_name": "WanTransformer3DModel"}))
    with pytest.raises(WeightsNotFoundError, match="not a SkyReelsV2Transformer3DModel"):
        sky.load_model(weights=str(root))
    config.write_text(good)
    (root / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(WeightsNotFoundError, match="could not load the SkyReels-V2 transformer"):
        sky.load_model(weights=str(root), device="cpu")
    assert Path(saved_tiny, "transformer", "config.json").read_text() == good


# --- Forcing-KV through the SkyReels-V2 loop (both CFG branches) ---------------------------------


def test_forcing_kv_static_anchors_of_one_chunk_equal_a_window_of_one_chunk(
    tiny_model, head_profile
):
    from jbkv_cli.prune import ForcingKVHistory

    layout = tiny_model.head_layout()
    assert layout == {
        "layers": len(tiny_model.components.transformer.blocks),
        "kv_heads": 2,
        "frame_tokens": 4,
    }
    profile = head_profile("skyreels-v2", layout, "static", K)
    spec = KVSpec(pruner=ForcingKVHistory(profile=profile, segments=2))
    got, info = tiny_model.generate_latents("a red ball", 3, spec)
    windowed = sky.load_model(config="tiny-random", device="cpu", window=1)
    want, _ = windowed.generate_latents("a red ball", 3, FULL_PRECISION)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert info["kv_cache_bytes_by_head"] == {"static": info["kv_cache_bytes"]}


def test_profile_heads_measures_both_cfg_branches(tiny_model):
    from jbkv_cli.prune.profile import FrameMassProbe, summarize

    probe = FrameMassProbe(tiny_model.head_layout()["frame_tokens"])
    tiny_model.profile_heads("a red ball", 0, probe)
    layers = tiny_model.head_layout()["layers"]
    steps = tiny_model.config.steps
    reading = tiny_model.config.num_chunks - 1  # every chunk but the first reads the cache
    assert len(probe.records) == 2 * layers * steps * reading  # conditional + unconditional
    measured = summarize(probe, layers, 2)
    assert measured["stability"]["steps"]["groups"] == steps
