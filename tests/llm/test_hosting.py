"""Oracles of jbkv's hosting in transformers, on tiny random Llama / Mistral / Qwen2 models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from jbkv_cli.attention import attend
from jbkv_cli.attention.attend import BACKENDS, CachedKV
from jbkv_cli.attention.correction import jensen_bias
from jbkv_cli.kvcache import FULL_PRECISION, KVSpec
from jbkv_cli.llm import hosting
from jbkv_cli.llm.hosting import JbkvCache, JbkvLayer, jbkv_attention
from jbkv_cli.llm.prefill import chunk_nll, prefill_prefix, score_example
from jbkv_cli.quant import quantize_kv
from jbkv_cli.quant.queries import QueryStats
from tests.llm.conftest import VOCAB, tiny_lm

INT2 = KVSpec.build("rtn", 2, correction="none")
INT2_TAYLOR = KVSpec.build("rtn", 2, correction="taylor")


def _ids(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_full_precision_cache_and_chunks_equal_one_full_forward(arch):
    """fp32: prefill in three uneven chunks through a full-precision jbkv cache == one forward
    of the stock model (SDPA, no cache), every logit within 1e-5."""
    model = tiny_lm(arch)
    ids = _ids(90)
    with torch.no_grad():
        full = model(input_ids=ids[None]).logits[0]
        hosting.host(model)
        cache = JbkvCache.for_model(model, FULL_PRECISION)
        parts = [
            model(input_ids=ids[None, a:b], cache=cache, use_cache=True).logits[0]
            for a, b in ((0, 37), (37, 61), (61, 90))
        ]
    assert cache.get_seq_length() == 90
    assert (torch.cat(parts) - full).abs().max() <= 1e-5


def test_hosted_chunks_equal_transformers_eager_attention(arch):
    """Oracle independent of SDPA: transformers' own eager attention (matmul, its causal mask,
    softmax) over the whole sequence == jbkv's hosted attention prefilling it in chunks
    through a full-precision cache (fp32; 1e-5 covers the order of the float sums)."""
    model = tiny_lm(arch)
    ids = _ids(96, seed=5)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = model(input_ids=ids[None]).logits[0]
        hosting.host(model)
        cache = JbkvCache.for_model(model, FULL_PRECISION)
        parts = [
            model(input_ids=ids[None, a:b], cache=cache, use_cache=True).logits[0]
            for a, b in ((0, 50), (50, 51), (51, 96))
        ]
    assert (torch.cat(parts) - eager).abs().max() <= 1e-5
    _, results = score_example(model, ids.tolist(), 50, [FULL_PRECISION])
    by_eager = -eager[50:-1].double().log_softmax(-1).gather(-1, ids[51:, None])[:, 0]
    assert (results[FULL_PRECISION].nll - by_eager).abs().max() <= 1e-5


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_stock_attention_reads_the_dequantized_cache(arch, impl):
    """What a jbkv layer returns is ``[dequantized cache | chunk]``: transformers' stock
    attention (SDPA, eager) over it equals jbkv attention with no correction."""
    model = tiny_lm(arch)
    ids = _ids(70)
    hosting.host(model)
    prefix = prefill_prefix(model, ids[:40])
    jbkv = chunk_nll(model, prefix, ids, INT2, diagnostics=False)
    model.set_attn_implementation(impl)
    try:
        stock = chunk_nll(model, prefix, ids, INT2, diagnostics=False)
    finally:
        hosting.host(model)
    assert (stock.nll - jbkv.nll).abs().max() <= 1e-5
    exact = chunk_nll(model, prefix, ids, FULL_PRECISION, diagnostics=False)
    assert (exact.nll - jbkv.nll).abs().max() > 1e-4  # INT2 changed something


def test_zero_steps_are_exactly_the_uncorrected_path(arch):
    """Δ = 0: the corrected model's logits are bit-identical to the uncorrected ones."""
    model = tiny_lm(arch)
    hosting.host(model)
    ids = _ids(60)
    prefix = prefill_prefix(model, ids[:40])
    logits = {}
    for spec in (INT2, INT2_TAYLOR):
        cache = JbkvCache.for_model(model, spec)
        for layer, k, v in zip(cache.layers, prefix.keys, prefix.values, strict=True):
            layer.commit(k, v)
            layer.store.read().k_step.zero_()  # the view attention reads: all steps 0
        with torch.no_grad():
            out = model(input_ids=ids[None, 40:], cache=cache, use_cache=True)
        logits[spec] = out.logits
    assert torch.equal(logits[INT2], logits[INT2_TAYLOR])


@pytest.mark.parametrize("backend", ["fused", "flex"])
def test_zero_steps_in_each_backend(backend):
    """Past the shortcut, each backend with Δ = 0 computes the uncorrected attention."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 9, 32, generator=g) for _ in range(3))
    kc, vc = torch.randn(1, 2, 13, 32, generator=g), torch.randn(1, 2, 13, 32, generator=g)
    k, v = k[:, :2], v[:, :2]
    cached = CachedKV(kc, vc, torch.zeros(1, 2, 13, 1))
    out = BACKENDS[backend](q, k, v, cached, 0.2, -1.0, causal=True)
    plain = attend(q, k, v, CachedKV(kc, vc), scale=0.2, correction="none", causal=True)
    assert (out - plain).abs().max() <= 1e-6


def _dense_reference(q, k_cur, v_cur, cached: CachedKV, scale: float) -> torch.Tensor:
    """softmax(τ q kᵀ + M) v with a dense float mask M [B, Hq, Lq, Lk]: −b on cached columns,
    −inf on current keys after each query (the paper's dense form), GQA by repetition."""
    lc, lq = cached.num_tokens, q.shape[-2]
    rep = q.shape[-3] // k_cur.shape[-3]
    k = torch.cat([cached.k, k_cur], -2).repeat_interleave(rep, -3)
    v = torch.cat([cached.v, v_cur], -2).repeat_interleave(rep, -3)
    mask = torch.zeros(*q.shape[:-1], lc + lq)
    mask[..., :lc] = -jensen_bias(q, cached.k_step, scale, "taylor", cached.rotation)
    later = torch.ones(lq, lq, dtype=torch.bool).triu(1)
    mask[..., lc:] = mask[..., lc:].masked_fill(later, float("-inf"))
    return ((scale * q @ k.transpose(-1, -2)) + mask).softmax(-1) @ v


@pytest.mark.parametrize("backend", ["fused", "flex", "reference"])
@pytest.mark.parametrize("scheme", ["rtn", "quarot"])
def test_corrected_attention_equals_dense_float_mask(backend, scheme):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 6, 21, 64, generator=g)
    kc, vc = torch.randn(1, 2, 35, 64, generator=g), torch.randn(1, 2, 35, 64, generator=g)
    k, v = torch.randn(1, 2, 21, 64, generator=g), torch.randn(1, 2, 21, 64, generator=g)
    cached = CachedKV.from_quantized(
        quantize_kv(kc, 2, 32, scheme, seed=1), quantize_kv(vc, 2, 32, scheme, seed=1)
    )
    ref = _dense_reference(q, k, v, cached, 0.125)
    out = attend(q, k, v, cached, scale=0.125, correction="taylor", backend=backend, causal=True)
    assert (out - ref).abs().max() <= 1e-5
    plain = attend(q, k, v, cached, scale=0.125, correction="none", causal=True)
    assert (plain - ref).abs().max() > 1e-3  # the bias mattered


def test_causal_blocks_agree():
    """The blocked causal path gives the same result for any block size."""
    from jbkv_cli.attention.attend import causal_sdpa

    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 30, 16, generator=g)
    k, v = torch.randn(1, 2, 50, 16, generator=g), torch.randn(1, 2, 50, 16, generator=g)
    whole = causal_sdpa(q, k, v, 20, 0.25, block=30)
    for block in (1, 7, 29):
        assert (causal_sdpa(q, k, v, 20, 0.25, block=block) - whole).abs().max() <= 1e-6


def test_model_attention_equals_dense_reference_per_layer(arch):
    """Inside the model: every layer's jbkv attention output equals the dense float-mask
    reference computed from the same query and the layer's stored cache."""
    model = tiny_lm(arch)
    hosting.host(model)
    ids = _ids(64)
    prefix = prefill_prefix(model, ids[:40])
    cache = JbkvCache.for_model(model, INT2_TAYLOR)
    for layer, k, v in zip(cache.layers, prefix.keys, prefix.values, strict=True):
        layer.commit(k, v)
    seen = []

    def spy(module, query, key, value, mask, **kwargs):
        layer = cache.layers[module.layer_idx]
        out, _ = jbkv_attention(module, query, key, value, mask, **kwargs)
        ref = _dense_reference(
            query, layer.current.k, layer.current.v, layer.store.read(), kwargs["scaling"]
        )
        seen.append((out - ref.transpose(1, 2)).abs().max().item())
        return out, None

    from transformers import AttentionInterface

    AttentionInterface.register("jbkv-spy", spy)
    model.set_attn_implementation("jbkv-spy")
    with torch.no_grad():
        model(input_ids=ids[None, 40:], cache=cache, use_cache=True)
    hosting.host(model)
    assert len(seen) == 2 and max(seen) <= 1e-5


def test_nll_equals_a_hand_computation_from_the_logits(arch):
    """The chunk's NLL: −log softmax of the logits at positions A..A+B−1, at tokens A+1..A+B
    (log-softmax written out), for the exact reference and for a quantized variant."""
    model = tiny_lm(arch)
    ids = _ids(73)
    a = 41
    hosting.host(model)
    _, results = score_example(model, ids.tolist(), a, [FULL_PRECISION, INT2_TAYLOR])
    with torch.no_grad():
        full = model(input_ids=ids[None]).logits[0].double()
        prefix = prefill_prefix(model, ids[:a])
        cache = JbkvCache.for_model(model, INT2_TAYLOR)
        for layer, k, v in zip(cache.layers, prefix.keys, prefix.values, strict=True):
            layer.commit(k, v)
        quant = model(input_ids=ids[None, a:-1], cache=cache, use_cache=True).logits[0].double()

    def by_hand(logits, targets):
        top = logits.max(-1, keepdim=True).values
        logz = top[:, 0] + (logits - top).exp().sum(-1).log()
        return logz - logits.gather(-1, targets[:, None])[:, 0]

    targets = ids[a + 1 :]
    assert (results[FULL_PRECISION].nll - by_hand(full[a:-1], targets)).abs().max() <= 1e-5
    assert (results[INT2_TAYLOR].nll - by_hand(quant, targets)).abs().max() <= 1e-5
    assert results[FULL_PRECISION].nll.shape == (73 - a - 1,)


def test_diagnostics_record_the_prefix_attention(arch):
    model = tiny_lm(arch)
    hosting.host(model)
    ids = _ids(80)
    _, results = score_example(model, ids.tolist(), 48, [FULL_PRECISION, INT2, INT2_TAYLOR])
    assert results[FULL_PRECISION].diagnostics is None
    unc, cor = results[INT2].diagnostics, results[INT2_TAYLOR].diagnostics
    assert unc["jsd"] > 0 and cor["jsd"] > 0
    assert 0 < unc["p_s_ref"] < 1 and 0 < cor["p_s"] < 1
    assert results[INT2].kv_cache_bytes < results[FULL_PRECISION].kv_cache_bytes / 8


def test_sliding_window_shorter_than_the_keys_is_refused():
    model = tiny_lm("mistral", sliding_window=16)
    hosting.host(model)
    with pytest.raises(ValueError, match="sliding-window"), torch.no_grad():
        model(input_ids=_ids(40)[None])


def test_padding_mask_is_refused():
    with pytest.raises(ValueError, match="unpadded"):
        jbkv_attention(
            torch.nn.Module(),
            torch.zeros(1, 2, 3, 8),
            torch.zeros(1, 2, 3, 8),
            torch.zeros(1, 2, 3, 8),
            torch.zeros(1, 1, 3, 3),
        )


def test_no_jbkv_cache_is_exact_causal_attention():
    """Called without a jbkv layer (a DynamicCache), earlier keys are an exact prefix."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 16, generator=g)
    k, v = torch.randn(1, 2, 12, 16, generator=g), torch.randn(1, 2, 12, 16, generator=g)
    out, _ = jbkv_attention(torch.nn.Module(), q, k, v, None, scaling=0.25)
    kx, vx = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    mask = torch.ones(5, 12, dtype=torch.bool).tril(7)
    ref = F.scaled_dot_product_attention(q, kx, vx, attn_mask=mask, scale=0.25)
    assert (out - ref.transpose(1, 2)).abs().max() <= 1e-6


@pytest.mark.slow  # end to end
def test_every_registry_method_and_correction_runs():
    """Every method of the registry, with every CLI correction, stores the prefix and scores
    the chunk; quantized methods store less than the reference, and the correction moves the
    prefix's attention mass (ΔP_S) for every method that quantizes keys."""
    from jbkv_cli.cli.options import CLI_CORRECTIONS
    from jbkv_cli.quant.registry import METHODS

    model = tiny_lm("llama")
    hosting.host(model)
    specs = [FULL_PRECISION]
    for name, cls in METHODS.items():
        specs += [KVSpec.build(name, min(cls.SUPPORTED_BITS), 32, c) for c in CLI_CORRECTIONS]
    _, results = score_example(model, _ids(200).tolist(), 160, specs)
    ref = results[FULL_PRECISION]
    for spec in specs[1:]:
        r = results[spec]
        assert torch.isfinite(r.nll).all(), spec.label
        assert r.kv_cache_bytes < ref.kv_cache_bytes, spec.label
        if spec.correction != "none":
            unc = results[KVSpec(spec.key, spec.value, "none")]
            assert r.diagnostics["delta_ps"] != unc.diagnostics["delta_ps"], spec.label


# QuantWM with 8 centroids on 48-token chunks (head dim 32: g = 32)
QUANTWM = KVSpec.build("quantwm", 2, 32, centroids=8, tokens_per_centroid=0)


def _stored_key(layer: JbkvLayer, index: int) -> torch.Tensor:
    return layer.store.stored(index, "key").dequantize()


def test_quantwm_stores_each_chunk_with_earlier_chunks_queries_only(monkeypatch):
    """App. C.3 through the LLM path: three 48-token chunks prefilled through a QuantWM jbkv
    cache; chunk c is stored as QuantWM stores its keys with the queries of chunks < c (the
    first with none, so no PSAC), never with its own (the queries attention saw, recorded by a
    spy on ``JbkvLayer.attend``). Same inputs, same seeded clustering: within 1e-6."""
    model = tiny_lm("llama")
    hosting.host(model)
    seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    attend_ = JbkvLayer.attend

    def spy(self, query, scale):
        seen.setdefault(self.layer_idx, []).append((query.clone(), self.current.k.clone()))
        return attend_(self, query, scale)

    monkeypatch.setattr(JbkvLayer, "attend", spy)
    cache = JbkvCache.for_model(model, QUANTWM)
    ids = _ids(144, seed=3)
    with torch.no_grad():
        for a in (0, 48, 96):
            model(input_ids=ids[None, a : a + 48], cache=cache, use_cache=True)
    for layer in cache.layers:
        history = QueryStats()
        assert layer.store.stored(0, "key").psac is None  # no history: no PSAC
        for c in (0, 1):
            query, key = seen[layer.layer_idx][c]
            want = QUANTWM.key.quantize(key, "key", history).dequantize()
            assert (_stored_key(layer, c) - want).abs().max() <= 1e-6, (layer.layer_idx, c)
            history.update(query, key.shape[-3])


def test_quantwm_prefix_is_stored_with_no_history_then_its_queries_join():
    """``llm-prefill``'s prefix is the cache's first chunk: stored with no query history (its
    own queries only join the history after it), as a fresh cache stores its first chunk."""
    model = tiny_lm("llama")
    hosting.host(model)
    prefix = prefill_prefix(model, _ids(96, seed=4), queries=True)
    cache = JbkvCache.for_model(model, QUANTWM)
    for layer, k, v, q in zip(
        cache.layers, prefix.keys, prefix.values, prefix.queries, strict=True
    ):
        assert q.count == 96 * 2  # 4 query heads over 2 KV heads
        layer.commit(k, v, q)
        want = QUANTWM.key.quantize(k, "key", QueryStats()).dequantize()
        assert (_stored_key(layer, 0) - want).abs().max() <= 1e-6
        assert layer.store.queries.count == q.count and layer.store.pending.empty


def test_the_record_says_how_much_of_the_prefix_was_stored_compressed():
    """A 100-token prefix inside KIVI's 128-token residual is stored exact: its record says
    nothing was compressed; INT2 rtn compresses every row (2 layers × 2 KV heads × 100 tokens
    × keys and values); the reference records nothing."""
    model = tiny_lm("llama")
    hosting.host(model)
    ids = _ids(140)
    prefix = prefill_prefix(model, ids[:100])
    kivi = chunk_nll(model, prefix, ids, KVSpec.build("kivi", 2, 32), diagnostics=False)
    rtn = chunk_nll(model, prefix, ids, INT2, diagnostics=False)
    assert kivi.compression["compressed"] == 0 and kivi.compression["held"] == 800
    assert rtn.compression["compressed"] == rtn.compression["held"] == 800
    assert chunk_nll(model, prefix, ids, FULL_PRECISION, diagnostics=False).compression is None
