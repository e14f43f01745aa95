"""Cache equivalence: chunk-by-chunk with the KV cache == one forward with the same ranges."""

import pytest
import torch

from jbkv_cli.attention import attention_backend
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.magi1.config import TINY_DIT, TINY_SCHEDULE
from jbkv_cli.models.magi1.dit import plain_attend
from jbkv_cli.models.magi1.kv import cache_attend, make_caches
from jbkv_cli.models.magi1.sampler import Sampler
from jbkv_cli.models.magi1.schedule import distill_dt, plan_forwards
from jbkv_cli.models.magi1.text import build_text_condition
from jbkv_cli.models.magi1.tiny import tiny_special_tokens

pytestmark = pytest.mark.slow

CW, H, W = TINY_SCHEDULE.chunk_width, 4, 4
L, C = TINY_DIT.caption_max_length, TINY_DIT.caption_channels


def _inputs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, TINY_DIT.in_channels, n * CW, H, W, generator=g)
    t = torch.rand(1, n, generator=g)
    y = torch.randn(1, n, L, C, generator=g)
    mask = torch.zeros(1, n, L, dtype=torch.long)
    for j in range(n):
        mask[0, j, : 5 + j] = 1
    return x, t, y, mask


@pytest.mark.parametrize("r", [2, 3])
def test_chunkwise_with_cache_equals_full_forward(tiny, r):
    n = 4
    x, t, y, mask = _inputs(n)
    full = tiny(
        x, t, y, mask, caption_dropped=False, slice_point=0, kv_chunks=[r] * n, distill_dt=8.0
    )
    caches = make_caches(FULL_PRECISION, TINY_DIT.num_layers, window=r - 1)
    attend = cache_attend("reference")
    for c in range(n):
        sl = slice(c * CW, (c + 1) * CW)
        out = tiny(
            x[:, :, sl],
            t[:, c : c + 1],
            y[:, c : c + 1],
            mask[:, c : c + 1],
            caption_dropped=False,
            slice_point=c,
            kv_chunks=[r],
            caches=caches,
            commit_first=True,
            distill_dt=8.0,
            attend=attend,
        )
        torch.testing.assert_close(out, full[:, :, sl], atol=1e-5, rtol=1e-5)
    assert all(cache.num_chunks == r - 1 for cache in caches)


def test_full_precision_cache_is_bit_identical_to_dense_oracle(tiny, plain_cache):
    n = 3
    x, t, y, mask = _inputs(n, seed=1)
    outs = []
    for caches in (make_caches(FULL_PRECISION, 2, window=2), [plain_cache(), plain_cache()]):
        attend = cache_attend()
        res = []
        for c in range(n):
            sl = slice(c * CW, (c + 1) * CW)
            res.append(
                tiny(
                    x[:, :, sl],
                    t[:, c : c + 1],
                    y[:, c : c + 1],
                    mask[:, c : c + 1],
                    caption_dropped=False,
                    slice_point=c,
                    kv_chunks=[3],
                    caches=caches,
                    commit_first=True,
                    distill_dt=8.0,
                    attend=attend,
                )
            )
        outs.append(torch.cat(res, dim=2))
    assert torch.equal(outs[0], outs[1])


def _text(tiny, n):
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(1, L, C, generator=g)
    mask = torch.zeros(1, L, dtype=torch.long)
    mask[0, :6] = 1
    special = tiny_special_tokens(C)
    return build_text_condition(emb, mask, tiny.y_embedder.null_caption_embedding, n, special)


def _sample(tiny, caches, sched=TINY_SCHEDULE, n=3, backend="reference"):
    noise = torch.randn(
        1, TINY_DIT.in_channels, n * CW, H, W, generator=torch.Generator().manual_seed(5)
    )
    sampler = Sampler(tiny, sched, attend=cache_attend(backend))
    with attention_backend(backend):
        return sampler.sample(noise, plan_forwards(n, sched), _text(tiny, n), caches)


def test_sampler_16bit_cache_equals_dense_oracle(tiny, plain_cache):
    a = _sample(tiny, make_caches(FULL_PRECISION, 2, window=2)).latents
    b = _sample(tiny, [plain_cache(), plain_cache()]).latents
    assert torch.equal(a, b)


def test_refresh_pass_is_what_the_cache_holds(tiny):
    n = 3
    caches = make_caches(FULL_PRECISION, 2, window=n)
    res = _sample(tiny, caches, n=n)
    text = _text(tiny, n)
    # chunks 0 .. n-2 were refreshed (the last chunk is never needed again)
    assert [c.num_chunks for c in caches] == [n - 1, n - 1]
    held = [c.read() for c in caches]
    lc = CW * (H // 2) * (W // 2)
    for chunk in range(n - 1):
        sink = []
        tiny(
            res.latents[:, :, chunk * CW : (chunk + 1) * CW],
            torch.tensor([[TINY_SCHEDULE.clean_t]]),
            text.null[:1][None],
            text.null_mask[:1][None],
            caption_dropped=False,
            slice_point=chunk,
            kv_chunks=[1],
            distill_dt=distill_dt(TINY_SCHEDULE.num_steps, 1.0),
            attend=plain_attend,
            kv_sink=sink,
        )
        for layer, (k, v) in enumerate(sink):
            sl = slice(chunk * lc, (chunk + 1) * lc)
            torch.testing.assert_close(held[layer].k[:, :, sl], k, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(held[layer].v[:, :, sl], v, atol=1e-5, rtol=1e-5)


def test_int2_cache_changes_output_and_correction_runs(tiny):
    ref = _sample(tiny, make_caches(FULL_PRECISION, 2, window=1)).latents
    spec = KVSpec.build("rtn", bits=2, correction="taylor")
    q = _sample(tiny, make_caches(spec, 2, window=1), backend="reference")
    fused = _sample(tiny, make_caches(spec, 2, window=1), backend="fused")
    assert not torch.equal(ref, q.latents)
    torch.testing.assert_close(q.latents, fused.latents, atol=1e-4, rtol=1e-4)
