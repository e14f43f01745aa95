"""QuantVideoGen's cache policy in :class:`ChunkKVCache` (``jbkv_cli/kvcache/spans.py``,
``jbkv_cli/quant/qvg_policy.py``): when spans are due (upstream's triggers, restated here), which
chunks are 16-bit when, one codebook per span, the bytes held at every commit, spans held until
their last chunk leaves, keep-recent and sink-keep, the K rule and the per-model defaults."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.kvcache.spans import SpanSlice
from jbkv_cli.prune.registry import build_pruner, pruner_names
from jbkv_cli.quant.policy import SpanPolicy
from jbkv_cli.quant.qvg import QVG
from jbkv_cli.quant.qvg_policy import effective_centroids
from jbkv_cli.quant.tensor import RawTensor

L, H, D = 64, 2, 64  # tokens per chunk, heads, head dim


def _chunk(serial: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + serial)
    return torch.randn(1, H, L, D, generator=g), torch.randn(1, H, L, D, generator=g)


def _qvg_bytes(tokens: int, k_eff: int, bits: int = 2, block: int = 64) -> int:
    """What QVG holds for one role of a span of ``tokens`` tokens (1 stage): codes, FP8 scales,
    uint8 ids, BF16 centroids."""
    return H * (tokens * D * bits // 8 + tokens * D // block + tokens + 2 * k_eff * D)


def _state(cache: ChunkKVCache) -> dict[int, str]:
    """Per chunk held (commit index): ``R`` exact, ``S`` read through a span."""
    out = {}
    for c in cache.chunks:
        part = c.sides["key"].parts[0]
        out[c.serial] = "S" if isinstance(part, SpanSlice) else "R"
        assert isinstance(part, SpanSlice | RawTensor)
    return out


# --- when a span is due: upstream's triggers ---------------------------------------------------


def _self_forcing_trigger(chunk_index: int, factor: int) -> tuple[int, int] | None:
    """``causal_inference.py:341–354``: before chunk ``c``, if not (c < F or c % F != 0), the
    chunks [c − F, c) are quantized."""
    if chunk_index < factor or chunk_index % factor != 0:
        return None
    return chunk_index - factor, chunk_index


def _lingbot_trigger(chunk_id: int, qf: int, keep_recent: int) -> tuple[int, int] | None:
    """``LingBot-v2/wan/image2video.py:703–707``: if chunk_id >= qf + keep_recent and
    (chunk_id − keep_recent) % qf == 0, quantize [chunk_id − qf − keep_recent, chunk_id −
    keep_recent)."""
    if chunk_id >= qf + keep_recent and (chunk_id - keep_recent) % qf == 0:
        return chunk_id - qf - keep_recent, chunk_id - keep_recent
    return None


@pytest.mark.parametrize(("span", "recent"), [(8, 0), (2, 0), (1, 0), (1, 1), (3, 2), (8, 1)])
def test_spans_are_due_when_upstreams_triggers_fire(span, recent):
    """Upstream checks before generating chunk ``c``, i.e. once ``c`` chunks are committed."""
    policy = SpanPolicy(span, recent)
    for c in range(60):
        index = policy.due(c)
        got = None if index is None else (index * span, (index + 1) * span)
        assert got == _lingbot_trigger(c, span, recent), c
        if recent == 0:
            assert got == _self_forcing_trigger(c, span), c


# --- which chunks are 16-bit when, and the bytes -----------------------------------------------


def test_self_forcing_spans_of_8_chunks_and_the_bytes_at_every_commit(monkeypatch):
    """N = 8, no eviction (upstream's script): chunks stay 16-bit until their span of 8 is
    committed, then all 8 are stored by one quantize call over their 512 tokens (one codebook
    per (batch, head)); bytes at each commit are the raw chunks plus each span once."""
    calls = []
    real = QVG._quantize

    def counting(self, x, role):
        calls.append((role, x.shape[-2]))
        return real(self, x, role)

    monkeypatch.setattr(QVG, "_quantize", counting)
    spec = KVSpec.build("qvg", 2, 64, "taylor", span_chunks=8, keep_recent_chunks=0)
    cache = ChunkKVCache(spec)
    raw = 2 * H * L * D * 4  # K and V of one fp32 chunk
    k_eff = effective_centroids(256, 8 * L, None)  # 512 < 16·256 tokens: L/64 = 8
    assert k_eff == 8
    chunks = [_chunk(i) for i in range(18)]
    for i, (k, v) in enumerate(chunks):
        cache.commit(k, v)
        spans, waiting = (i + 1) // 8, (i + 1) % 8
        assert _state(cache) == {s: "S" if s < 8 * spans else "R" for s in range(i + 1)}
        assert cache.nbytes == waiting * raw + spans * 2 * _qvg_bytes(8 * L, k_eff), i
        assert len(calls) == 2 * spans  # keys and values, once per span
    assert calls == [("key", 8 * L), ("value", 8 * L)] * 2
    first = [cache.stored(i, "key") for i in range(8)]
    assert len({id(p.span) for p in first}) == 1  # one span object, one codebook
    (tensor,) = {id(p.span): p.span.tensor for p in first}.values()
    assert tensor.centroids.shape == (1, H, 1, k_eff, D)
    # reading a chunk of the span is reading its tokens of the span quantized as one tensor
    together = QVG(2).quantize(torch.cat([k for k, _ in chunks[:8]], -2), "key").dequantize()
    torch.testing.assert_close(cache.read(last=None).k[..., : 8 * L, :], together)
    # the most held: one span and 7 chunks waiting for the next one (after the 15th commit)
    assert cache.peak_nbytes == 2 * _qvg_bytes(8 * L, k_eff) + 7 * raw


def test_a_span_is_quantized_over_what_is_still_held_and_kept_until_its_last_chunk_leaves():
    """N = 4, window 2: when span [0, 4) is due, chunks 1–3 are held (jbkv quantizes before it
    evicts, as upstream clamps to its window, which counts the chunk being written); the span
    is then held whole, with chunk 1's codes, until chunk 3 is evicted (upstream's
    ``evict_range``)."""
    spec = KVSpec.build("qvg", 2, 64, span_chunks=4)
    cache = ChunkKVCache(spec, window=2)
    raw = 2 * H * L * D * 4
    span = 2 * _qvg_bytes(3 * L, effective_centroids(256, 3 * L, None))
    expected = {  # commit -> (held chunks and their state, bytes)
        0: ({0: "R"}, raw),
        1: ({0: "R", 1: "R"}, 2 * raw),
        2: ({1: "R", 2: "R"}, 2 * raw),
        3: ({2: "S", 3: "S"}, span),
        4: ({3: "S", 4: "R"}, span + raw),
        5: ({4: "R", 5: "R"}, 2 * raw),
    }
    for i in range(6):
        cache.commit(*_chunk(i))
        state, held = expected[i]
        assert _state(cache) == state, i
        assert cache.nbytes == held, i
        if i == 3:
            assert cache.stored(0, "key").span.tensor.shape[-2] == 3 * L


def test_lingbot_v2_keep_recent_and_sink_keep():
    """``quant_factor=1, keep_recent_chunks=1, sink_keep_chunks=1`` with 2 sink chunks and a
    window of 2: chunk 0 (the first sink chunk) stays 16-bit for good; chunk 1 (the other sink
    chunk) and every later chunk ``c`` are quantized once chunk ``c + 1`` is committed, each as
    its own span; sinks are never evicted."""
    spec = KVSpec.build(
        "qvg", 2, 64, span_chunks=1, keep_recent_chunks=1, sink_keep_chunks=1, sink_chunks=2
    )
    cache = ChunkKVCache(spec, window=2)
    for i in range(6):
        cache.commit(*_chunk(i))
        held = [s for s in range(i + 1) if s < 2 or s >= i - 1]
        assert _state(cache) == {s: "S" if 1 <= s < i else "R" for s in held}, i
    spans = {id(cache.stored(j, "key").span) for j in range(1, cache.num_chunks - 1)}
    assert len(spans) == cache.num_chunks - 2  # per chunk: its own codebook
    view = cache.read()
    assert torch.equal(view.k[..., :L, :], _chunk(0)[0])  # the kept sink, exact
    assert (view.k_step[..., :L, :] == 0).all() and (view.k_step[..., L : 2 * L, :] > 0).all()


def test_sink_and_later_chunks_never_share_a_span():
    """A span crossing the sink boundary is split (upstream: the sink part its own span)."""
    spec = KVSpec.build("qvg", 2, 64, span_chunks=4, sink_keep_chunks=1, sink_chunks=2)
    cache = ChunkKVCache(spec)
    for i in range(4):
        cache.commit(*_chunk(i))
    assert _state(cache) == {0: "R", 1: "S", 2: "S", 3: "S"}
    assert cache.stored(1, "key").span.serials == (1,)
    assert cache.stored(2, "key").span.serials == (2, 3)


def test_without_sink_keep_every_sink_chunk_stays_16bit():
    """sink_keep None (jbkv's rule for every method): sinks exact whatever the span."""
    cache = ChunkKVCache(KVSpec.build("qvg", 2, 64, span_chunks=2, sink_chunks=1), window=4)
    for i in range(4):
        cache.commit(*_chunk(i))
    assert _state(cache) == {0: "R", 1: "S", 2: "S", 3: "S"}
    assert cache.stored(1, "key").span.serials == (1,)  # span [0, 2) without its sink chunk
    assert torch.equal(cache.read().k[..., :L, :], _chunk(0)[0])


def test_bias_only_sets_the_steps_when_the_span_is_due():
    spec = KVSpec.build("qvg", 2, 64, bias_only=True, span_chunks=2)
    cache = ChunkKVCache(spec)
    (k0, v0), (k1, v1) = _chunk(0), _chunk(1)
    cache.commit(k0, v0)
    view = cache.read()
    assert torch.equal(view.k, k0) and (view.k_step == 0).all()
    cache.commit(k1, v1)
    view = cache.read()
    assert torch.equal(view.k, torch.cat([k0, k1], -2)) and (view.k_step > 0).all()
    together = QVG(2).quantize(torch.cat([k0, k1], -2), "key")
    assert torch.equal(view.k_step, together.step)


# --- the K rule and the per-model defaults -----------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "cap", "k_eff"),
    [(256, None, 4), (4095, None, 63), (4096, None, 256), (37440, None, 256), (4096, 64, 64)],
)
def test_k_rule(tokens, cap, k_eff):
    """K = 256 where a span gives each centroid ≥ 16 tokens, else L/64; an explicit cap wins."""
    assert effective_centroids(256, tokens, cap) == k_eff


def test_a_span_of_16_small_chunks_stores_256_centroids():
    cache = ChunkKVCache(KVSpec.build("qvg", 2, 64, span_chunks=16))
    for i in range(16):
        g = torch.Generator().manual_seed(i)
        cache.commit(torch.randn(1, 1, 256, D, generator=g), torch.randn(1, 1, 256, D, generator=g))
    assert cache.stored(0, "key").span.tensor.num_centroids == 256


def test_per_model_defaults_follow_upstreams_integrations():
    qvg = QVG(2)
    sf = qvg.for_model("self-forcing", 4680)  # 3 frames × 1,560 tokens
    assert (sf.span_chunks, sf.keep_recent_chunks, sf.sink_keep_chunks) == (8, 0, 0)
    assert sf.key_layout() == "pre-rope" and sf.tokens_per_centroid == 0
    assert sf.label == "INT2 qvg g64 K256 N8 pre-RoPE"
    assert sf.variant_id == "int2-qvg-g64-tpc0-n8-kr0-sk0-prerope"
    for model in ("self-forcing:longlive", "skyreels-v2", "magi1"):
        other = qvg.for_model(model, 4680)
        assert other.cache_policy() == SpanPolicy(1, 1, 1) and other.key_layout() == "post-rope"
    tiny = qvg.for_model("tiny", 256)
    assert tiny.cache_policy() == SpanPolicy() and tiny.key_layout() == "post-rope"
    assert tiny.label == "INT2 qvg g64 K≤L/64" and tiny.variant_id == "int2-qvg-g64"
    assert QVG(2, span_chunks=16).for_model("tiny", 256).label == "INT2 qvg g64 K256 N16"
    mine = QVG(2, span_chunks=2, layout="post-rope").for_model("self-forcing", 4680)
    assert (mine.span_chunks, mine.keep_recent_chunks, mine.layout) == (2, 0, "post-rope")
    assert sf.for_model("self-forcing", 4680) == sf  # idempotent
    spec = KVSpec.build("qvg", 2, 64, "taylor").for_model("self-forcing", 4680)
    assert KVSpec.from_dict(spec.to_dict()) == spec and spec.key_layout == "pre-rope"


def test_hy_worldplay_and_matrix_game_have_stated_policies():
    """HY-WorldPlay: its upstream integration's rule (QUANT_FACTOR = 2: spans of 2 chunks, no
    keep-recent, every sink compressed, post-RoPE keys). Matrix-Game-2.0 (no QVG script): per
    chunk, jbkv's choice, said in the label (``N1``) for every preset."""
    hy = QVG(2).for_model("hy-worldplay")
    assert hy.cache_policy() == SpanPolicy(2, 0, 0) and hy.key_layout() == "post-rope"
    assert hy.label == "INT2 qvg g64 N2"
    for config in ("universal", "gta", "templerun", "tiny-random"):
        mg = QVG(2).for_model(f"matrix-game-2:{config}", 2640)  # 3 frames × 880 tokens
        assert mg.cache_policy() == SpanPolicy() and mg.key_layout() == "post-rope"
        assert mg.label == "INT2 qvg g64 K≤L/64 N1"


def test_pruned_variants_are_stored_per_chunk():
    pruner = build_pruner(pruner_names()[0])
    spec = KVSpec.build("qvg", 2, 64, pruner=pruner).for_model("self-forcing", 4680)
    assert spec.key.cache_policy() == SpanPolicy() and spec.key_layout == "post-rope"
    with pytest.raises(ValueError, match="not implemented for pruned caches"):
        KVSpec.build("qvg", 2, 64, pruner=pruner, span_chunks=2)
    with pytest.raises(ValueError, match="not implemented for pruned caches"):
        KVSpec.build("qvg", 2, 64, pruner=pruner, layout="pre-rope")
