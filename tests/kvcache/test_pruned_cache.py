"""The cache with a pruner: per-head kept tokens, masked reads, bytes of what is kept (the
mechanics with forcing-kv-history's layer state; forcing-kv's own at the end)."""

from dataclasses import replace

import pytest
import torch

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.kvcache.pruned import check_prunable, take_tokens
from jbkv_cli.prune import ForcingKV, ForcingKVHistory
from jbkv_cli.prune import ForcingKVHistoryLayer as ForcingKVLayer
from jbkv_cli.prune.forcing_kv import Budget, SharedSelection
from jbkv_cli.prune.forcing_kv import ForcingKVLayer as FaithfulLayer
from jbkv_cli.quant import build_method

T, D, F = 8, 64, 2  # tokens per frame, head dim, frames per chunk


def _chunk(seed: int, heads: int = 2):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, F * T, D, generator=g) for _ in range(2))


def _cache(spec, kinds=("static", "dynamic"), window=2, retention=0.25, **kw):
    layer = ForcingKVLayer(kinds, T, anchor_frames=1, segments=4, retention=retention)
    return ChunkKVCache(spec, window, pruning=layer, **kw)


def _attend(cache, seed=99, heads=2):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, 4, D, generator=g) for _ in range(3))
    return cache.attend(q, k, v, scale=D**-0.5)


@pytest.mark.parametrize("method", [None, "rtn", "quarot"])
def test_pruning_that_keeps_everything_equals_no_pruning_bit_for_bit(method):
    spec_kw = {"correction": "taylor"} if method else {}
    plain_spec = KVSpec.build(method, 2, **spec_kw) if method else KVSpec()
    pruned_spec = (
        KVSpec.build(method, 2, pruner=ForcingKVHistory(), **spec_kw)
        if method
        else KVSpec(pruner=ForcingKVHistory())
    )
    plain = ChunkKVCache(plain_spec, window=2)
    pruned = _cache(pruned_spec, kinds=("dynamic", "dynamic"), retention=1.0)
    for i in range(4):
        plain.commit(*_chunk(i))
        pruned.commit(*_chunk(i))
        a, b = plain.read(), pruned.read()
        # bit for bit by construction: RTN and QuaRot's fast Walsh–Hadamard transform are
        # elementwise (no matrix product whose kernel depends on the row count), the reads
        # have one shape, so attention runs one computation twice
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v) and b.valid.all()
        assert (a.k_step is None) == (b.k_step is None)
        assert a.k_step is None or torch.equal(a.k_step, b.k_step)
        assert torch.equal(_attend(plain), _attend(pruned))


def test_kept_tokens_follow_the_rules_and_nbytes_counts_only_them():
    cache = _cache(KVSpec(pruner=ForcingKVHistory()))
    cache.commit(*_chunk(0))
    valid = cache.read().valid[0]
    # static: the anchor frame only; dynamic: 1 of 4 segments of frame 0 + the anchor
    assert valid[0].tolist() == [False] * T + [True] * T
    assert valid[1, :T].sum() == 2 and valid[1, T:].all()
    kept = int(valid.sum())
    index_bytes = 2 * kept  # int16 positions
    means = 4 * D * 4  # the dynamic head's pending anchor: 4 segment means (float32)
    assert cache.nbytes == kept * D * 4 * 2 + index_bytes + means
    by_kind = cache.nbytes_by_kind()
    assert by_kind["static"] == T * (D * 4 * 2 + 2)
    assert by_kind["dynamic"] == (T + 2) * (D * 4 * 2 + 2) + means
    assert sum(by_kind.values()) == cache.nbytes


def test_anchor_tokens_leave_without_requantizing_the_survivors():
    cache = _cache(KVSpec.build("rtn", 2, pruner=ForcingKVHistory()))
    cache.commit(*_chunk(0))
    before = cache.read()
    held = cache.nbytes
    cache.commit(*_chunk(1))
    after = cache.read()
    first = after.valid[0, :, : F * T]
    # the static head dropped its old anchor; the dynamic head kept a quarter of it
    assert not first[0].any() and first[1, T:].sum() == 2
    survivors = first[1]  # the same stored codes dequantized elementwise: bit for bit
    assert torch.equal(after.k[0, 1, : F * T][survivors], before.k[0, 1][survivors])
    assert cache.nbytes < 2 * held
    per_token = 2 * (D * 2 // 8 + D // 32 * (1 + 2)) + 2  # k and v codes, FP8 Δ, BF16 z; index
    means = 4 * D * 4
    assert cache.nbytes == int(after.valid.sum()) * per_token + means


def test_prune_then_quantize_what_is_kept():
    k, v = _chunk(3)
    cache = _cache(KVSpec.build("rtn", 2, pruner=ForcingKVHistory()))
    cache.commit(k, v)
    view = cache.read()
    rtn = build_method("rtn", 2)
    for h in range(2):
        idx = view.valid[0, h].nonzero().flatten()
        alone = rtn.quantize(k[0, h, idx], "key")  # elementwise per group: bit for bit
        assert torch.equal(view.k[0, h, idx], alone.dequantize())
        assert torch.equal(view.k_step[0, h, idx], alone.step)
        assert (view.k[0, h][~view.valid[0, h]] == 0).all()
        assert (view.k_step[0, h][~view.valid[0, h]] == 0).all()


def test_eviction_and_sinks():
    spec = KVSpec.build("rtn", 2, sink_chunks=1, pruner=ForcingKVHistory())
    cache = _cache(spec, window=1)
    for i in range(3):
        cache.commit(*_chunk(i))
    view = cache.read()
    assert cache.num_chunks == 2 and view.valid[..., : F * T].all()  # the sink: never pruned
    assert torch.equal(view.k[..., : F * T, :], _chunk(0)[0])
    assert "unpruned" in cache.nbytes_by_kind()
    cache.reset()
    assert cache.nbytes == 0


def test_observer_sees_the_mass_pruning_moves():
    rec = AttentionRecorder(every=1)
    cache = _cache(KVSpec(pruner=ForcingKVHistory()), observer=rec)
    for i in range(2):
        cache.commit(*_chunk(i))
        _attend(cache, seed=i)
    summary = rec.summary()
    assert summary["delta_ps"] < 0  # dropped tokens carry no mass
    assert "noise_measured_var" not in summary  # nothing quantized


def test_spec_and_pruning_state_go_together():
    with pytest.raises(ValueError, match="pruning state"):
        ChunkKVCache(KVSpec(pruner=ForcingKVHistory()))
    with pytest.raises(ValueError, match="pruning state"):
        _cache(KVSpec())


def test_which_methods_can_be_pruned():
    for name in ("rtn", "rtn-nearest", "quarot", "qvg"):
        check_prunable(build_method(name, 2), D)
    with pytest.raises(ValueError, match="residual"):
        check_prunable(build_method("kivi", 2), D)
    with pytest.raises(ValueError, match="cannot be removed"):
        check_prunable(build_method("kivi", 2, residual=0), D)
    qvg = build_method("qvg", 2).quantize(torch.randn(128, D), "value")
    rows = torch.tensor([5, 70])
    taken = take_tokens(qvg, rows)
    # codes, scales and ids are copies (bit for bit); the dequantized rows sum the stages'
    # centroids over 2 tokens here and 128 there (a reduction whose order torch may pick per
    # shape): within 1e-6
    assert torch.equal(taken.codes, qvg.codes[rows]) and torch.equal(taken.ids, qvg.ids[:, rows])
    torch.testing.assert_close(taken.dequantize(), qvg.dequantize()[rows], rtol=0, atol=1e-6)


def test_signed_correction_reads_the_same_noise_model_through_pruned_lanes():
    """Keep-everything pruning: TurboQuant-MSE (per-token codes) reads exactly what the unpruned
    cache reads, unshrink and noise variance included; QVG lanes carry their measured κ."""
    plain = ChunkKVCache(KVSpec.build("turboquant-mse", 2, correction="signed"), window=2)
    spec = KVSpec.build("turboquant-mse", 2, correction="signed", pruner=ForcingKVHistory())
    pruned = _cache(spec, kinds=("dynamic", "dynamic"), retention=1.0)
    for i in range(3):
        plain.commit(*_chunk(i))
        pruned.commit(*_chunk(i))
    a, b = plain.read(), pruned.read()
    # the lanes rotate 16 tokens per matrix product where the plain cache rotates 32: the BLAS
    # may round those differently per CPU, so the tensors agree within float32 rounding
    close = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(a.k, b.k, **close)
    torch.testing.assert_close(a.k_step2, b.k_step2, **close)
    torch.testing.assert_close(a.k_unshrink, b.k_unshrink, **close)
    assert float(a.k_unshrink.min()) > 1
    torch.testing.assert_close(_attend(plain), _attend(pruned), **close)
    qvg = _cache(KVSpec.build("qvg", 2, correction="signed", pruner=ForcingKVHistory()))
    qvg.commit(*_chunk(0))
    view = qvg.read()
    assert view.k_step2 is not None and view.k_step2.shape == view.k_step.shape
    assert _attend(qvg).isfinite().all()


def _faithful(spec):
    """Two layers of forcing-kv: layer 0 unsplit, layer 1 (static, dynamic) decides."""
    budget = Budget(T, 1, 1, 1, None, 4, 0.33, 1)  # 4 patches of 2 tokens per frame
    shared = SharedSelection()
    kinds = ("static", "dynamic")
    return [
        ChunkKVCache(spec, None, pruning=FaithfulLayer(i, kinds, budget, shared, i == 1))
        for i in range(2)
    ]


def test_forcing_kv_keeps_the_same_tokens_at_16_and_2_bits_and_never_requantizes():
    """Decisions come from the exact keys; the buffer's survivors of an older frame keep the
    codes they were stored with."""
    runs = {}
    specs = {"fp": KVSpec(pruner=ForcingKV()), "int2": KVSpec.build("rtn", 2, pruner=ForcingKV())}
    for name, spec in specs.items():
        caches = _faithful(spec)
        views = []
        for i in range(4):  # 2-frame chunks: frames 2i, 2i + 1
            for cache in caches:
                cache.commit(*_chunk(i))
            views.append(caches[1].read())
        runs[name] = views
    for fp, int2 in zip(runs["fp"], runs["int2"], strict=True):
        assert torch.equal(fp.valid, int2.valid)
    # after chunk 2, the dynamic head keeps patches of frame 3 (chunk 1) picked at chunk 2 ...
    before, after = runs["int2"][2], runs["int2"][3]
    kept_then = before.valid[0, 1, F * T : 2 * F * T]
    assert kept_then.any()
    # ... and at chunk 3 the buffer is refilled from frames 5, 6 (chunks 2, 3): chunk 1 is gone
    assert not after.valid[0, :, F * T : 2 * F * T].any()
    survivors = after.valid[0, 1, 2 * F * T : 3 * F * T] & before.valid[0, 1, 2 * F * T :]
    got = after.k[0, 1, 2 * F * T : 3 * F * T][survivors]  # the same codes: bit for bit
    assert torch.equal(got, before.k[0, 1, 2 * F * T :][survivors])


class _Counting:
    """A scripted LayerPruning: chunk 0 keeps head 0 whole and head 1's first half twice, its
    second half not at all; chunk 1 keeps everything once and settles chunk 0's head 1 to
    once (Forcing-KV's multiplicity, :mod:`jbkv_cli.prune.forcing_kv`)."""

    kinds = ("static", "dynamic")

    def commit(self, serial, k):
        from jbkv_cli.prune.base import Decision

        length = k.shape[-2]
        keep = torch.ones(1, 2, length, dtype=torch.uint8)
        if serial == 0:
            keep[0, 1, : length // 2] = 2
            keep[0, 1, length // 2 :] = 0
            return Decision(keep, [])
        once = torch.ones(1, 2, length // 2, dtype=torch.uint8)
        return Decision(keep, [(0, 0, once)])

    def forget(self, serials):
        pass

    def nbytes_by_kind(self):
        return {}


@pytest.mark.parametrize("method", [None, "rtn"])
def test_a_token_held_twice_is_stored_once_and_attended_twice(method):
    pruner = ForcingKVHistory()  # the spec prunes; the scripted state decides
    spec = (
        KVSpec.build(method, 2, correction="taylor", pruner=pruner)
        if method
        else KVSpec(pruner=pruner)
    )
    cache = ChunkKVCache(spec, window=2, pruning=_Counting())
    k0, v0 = _chunk(0)
    cache.commit(k0, v0)
    view = cache.read()
    half = F * T // 2
    assert view.copies[0, 1].tolist() == [2] * half + [0] * half
    assert view.valid[0, 1].tolist() == [True] * half + [False] * half
    lane = cache.chunks[0].pruned.lanes[0][1]
    assert lane.index.numel() == half and lane.copies.tolist() == [2] * half
    plain = ChunkKVCache(replace(spec, pruner=None), window=2)
    plain.commit(k0, v0)
    stored = sum(lane.nbytes for lane in cache.chunks[0].pruned.lanes[0])
    assert stored == plain.nbytes * 3 // 4 + 2 * (F * T + half) + half  # positions, counts
    # head 1 reads its kept tokens twice: the same as the rows written out twice
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 4, D, generator=g) for _ in range(3))
    out = cache.attend(q, k, v, scale=D**-0.5)
    rows = torch.cat([view.k[0, 1, :half]] * 2 + [k[0, 1]])
    vals = torch.cat([view.v[0, 1, :half]] * 2 + [v[0, 1]])
    scores = D**-0.5 * q[0, 1] @ rows.T
    if view.k_step is not None:
        from jbkv_cli.attention import jensen_bias

        step = torch.cat([view.k_step[0, 1, :half]] * 2)[None, None]
        bias = jensen_bias(q[0, 1][None, None], step, D**-0.5, "taylor", view.rotation)
        scores[:, : 2 * half] -= bias[0, 0]
    assert torch.allclose(out[0, 1], scores.softmax(-1) @ vals, atol=2e-5)
    cache.commit(*_chunk(1))  # settles chunk 0's head 1 to once
    again = cache.read()
    assert again.copies is None and cache.chunks[0].pruned.lanes[0][1].copies is None
