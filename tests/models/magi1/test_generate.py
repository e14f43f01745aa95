"""End to end on the tiny random configuration: generate(), 16-bit vs INT2 + correction, 3-CFG."""

from dataclasses import replace

import pytest
import torch

from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.base import Video
from jbkv_cli.models.contract import VideoModel
from jbkv_cli.models.magi1 import load_model
from jbkv_cli.models.magi1.config import TINY_DIT, TINY_SCHEDULE
from jbkv_cli.models.magi1.dit import plain_attend
from jbkv_cli.models.magi1.kv import cache_attend, make_caches
from jbkv_cli.models.magi1.sampler import Sampler
from jbkv_cli.models.magi1.schedule import plan_forwards
from jbkv_cli.models.magi1.text import build_text_condition
from jbkv_cli.models.magi1.tiny import tiny_dit


@pytest.fixture(scope="module")
def model():
    return load_model(config="tiny-random", seed=0, device="cpu", attention_backend="reference")


def test_protocol_and_settings(model):
    assert isinstance(model, VideoModel)
    s = model.settings
    assert (s["steps"], s["num_chunks"], s["frames"], s["window"]) == (4, 3, 24, 1)
    assert s["dtype"] == "float32"


def test_generate_full_precision_and_int2_corrected(model):
    calls = []
    ref = model.generate(
        "a red ball", 1, FULL_PRECISION, progress=lambda d, t: calls.append((d, t))
    )
    assert isinstance(ref, Video)
    assert ref.frames.shape == (24, 32, 32, 3) and ref.frames.dtype == torch.uint8
    assert calls == [(1, 3), (2, 3), (3, 3)]
    again = model.generate("a red ball", 1, FULL_PRECISION)
    assert torch.equal(ref.frames, again.frames)
    q = model.generate("a red ball", 1, KVSpec.build("rtn", bits=2, correction="taylor"))
    assert q.frames.shape == ref.frames.shape
    assert 0 < q.kv_cache_bytes < ref.kv_cache_bytes
    # 2 layers x (k+v) x 1 chunk x 2 heads x 8 tokens x 32 dims x 4 bytes
    assert ref.kv_cache_bytes == 2 * 2 * 2 * 8 * 32 * 4
    other = model.generate("a blue ball", 1, FULL_PRECISION)
    assert not torch.equal(other.frames, ref.frames)


def test_same_noise_for_every_kv_spec(model):
    a = model.sample_latents("x", 3, FULL_PRECISION)
    b = model.sample_latents("x", 3, KVSpec.build("rtn", bits=4, correction="none"))
    # chunk 0 never reads the cache before it is finished: identical in both runs
    cw = TINY_SCHEDULE.chunk_width
    assert torch.equal(a.latents[:, :, :cw], b.latents[:, :, :cw])
    assert not torch.equal(a.latents, b.latents)


def test_options_validation():
    from jbkv_cli.utils.errors import JbkvError

    with pytest.raises(JbkvError, match="multiple"):
        load_model(config="tiny-random", height=20)
    with pytest.raises(JbkvError, match="steps"):
        load_model(config="tiny-random", steps=3)
    m = load_model(config="tiny-random", steps=8, num_chunks=2, window=2, kv_range="3,3")
    assert m.settings["steps"] == 8 and m.settings["noise2clean_kvrange"] == [3, 3]


def test_three_cfg_base_path_commits_null_caption_refresh():
    cfg = replace(TINY_DIT, distill=False)
    sched = replace(TINY_SCHEDULE, cfg_number=3)
    dit = tiny_dit(cfg, seed=4).eval()
    n, cw, c, length = 3, sched.chunk_width, cfg.caption_channels, cfg.caption_max_length
    emb = torch.randn(1, length, c, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(1, length, dtype=torch.long)
    mask[0, :4] = 1
    text = build_text_condition(emb, mask, dit.y_embedder.null_caption_embedding, n, None)
    caches = make_caches(FULL_PRECISION, cfg.num_layers, window=n)
    noise = torch.randn(1, 4, n * cw, 4, 4, generator=torch.Generator().manual_seed(1))
    res = Sampler(dit, sched, attend=cache_attend("reference")).sample(
        noise, plan_forwards(n, sched), text, caches
    )
    assert torch.isfinite(res.latents).all()
    sink = []
    dit(
        res.latents[:, :, :cw],
        torch.tensor([[sched.clean_t]]),
        text.null[:1][None],
        text.null_mask[:1][None],
        caption_dropped=True,
        slice_point=0,
        kv_chunks=[1],
        attend=plain_attend,
        kv_sink=sink,
    )
    lc = cw * 4
    torch.testing.assert_close(caches[0].read().k[:, :, :lc], sink[0][0], atol=1e-5, rtol=1e-5)
