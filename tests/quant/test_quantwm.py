"""QuantWM (arXiv 2609.26425): App. C.3's causal protocol, the format of Eq. 1–4 and App. D.1,
QSAC's rule (Eq. 9, 10, 14), PSAC (r = 8, INT8 rows, the row gate, dense/sparse layouts), the
Table 5 ablations, storage from the stored tensors and jbkv's calibrated PSAC steps.

Statistical claims use fixed seeds; each tolerance is stated next to its assertion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.quant import build_method
from jbkv_cli.quant.affine import quantize_affine
from jbkv_cli.quant.kmeans import Draws, kmeans
from jbkv_cli.quant.method import KVMethod
from jbkv_cli.quant.psac import layout_bytes, psac_rows
from jbkv_cli.quant.qsac import channel_weights, group_ranges, qsac_assign
from jbkv_cli.quant.quantwm import QuantWMTensor, quantwm_centroids
from jbkv_cli.quant.queries import QueryStats
from jbkv_cli.quant.tensor import RawTensor

B, H, L, D = 1, 2, 256, 64


def _keys(seed: int = 0, length: int = L) -> torch.Tensor:
    """Clustered keys: 4 centres per head plus noise (what video keys look like to k-means)."""
    g = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(B, H, 4, D, generator=g)
    pick = torch.randint(0, 4, (B, H, length), generator=g)
    base = centres.gather(2, pick.unsqueeze(-1).expand(-1, -1, -1, D))
    return base + 0.5 * torch.randn(B, H, length, D, generator=g)


def _queries(seed: int = 1, heads: int = 4, length: int = 128, rank: int = 8) -> torch.Tensor:
    """Queries whose energy lies mostly in a random ``rank``-dimensional subspace per KV head."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(B, H, D, rank, generator=g)).Q  # [B, H, D, r]
    coef = 4.0 * torch.randn(B, H, (heads // H) * length, rank, generator=g)
    q = coef @ basis.transpose(-1, -2) + 0.15 * torch.randn(B, H, coef.shape[2], D, generator=g)
    return q.reshape(B, heads, length, D)


def _stats(*qs: torch.Tensor) -> QueryStats:
    stats = QueryStats()
    for q in qs:
        stats.update(q, H)
    return stats


def _logit_mse(q: torch.Tensor, k: torch.Tensor, k_hat: torch.Tensor) -> float:
    qg = q.reshape(B, H, -1, D)
    return float((qg @ (k - k_hat.float()).transpose(-1, -2)).square().mean())


def _same_bytes(a, b) -> bool:
    sa, sb = a.stored(), b.stored()
    return sa.keys() == sb.keys() and all(
        torch.equal(sa[n].view(torch.uint8), sb[n].view(torch.uint8)) for n in sa
    )


# --- query statistics ----------------------------------------------------------------------


def test_query_stats_group_query_heads_like_sdpa_gqa():
    q = torch.randn(B, 4, 8, D)
    stats = _stats(q)
    # query heads 0, 1 read KV head 0; heads 2, 3 read KV head 1 (SDPA's enable_gqa)
    for h in range(H):
        qh = q[:, 2 * h : 2 * h + 2].reshape(-1, D)
        torch.testing.assert_close(stats.moment[0, h], qh.T @ qh)
        torch.testing.assert_close(stats.sensitivity()[0, h], qh.square().mean(0))
    assert stats.count == 16


def test_query_stats_absorb_adds_moments_and_counts():
    a, b = torch.randn(B, 4, 8, D), torch.randn(B, 4, 5, D)
    merged = _stats(a)
    merged.absorb(_stats(b))
    both = _stats(a, b)
    torch.testing.assert_close(merged.moment, both.moment)
    assert merged.count == both.count == 26
    empty = QueryStats()
    empty.absorb(QueryStats())
    assert empty.empty


def test_query_subspace_is_orthonormal_leading_and_signed():
    stats = _stats(_queries(rank=2))
    u = stats.subspace(2)
    assert u.shape == (B, H, D, 2)
    torch.testing.assert_close(u.transpose(-1, -2) @ u, torch.eye(2).expand(B, H, 2, 2))
    m = stats.moment / stats.count
    energy = (u.transpose(-1, -2) @ m @ u).diagonal(dim1=-2, dim2=-1).sum(-1)
    assert bool(
        (energy / m.diagonal(dim1=-2, dim2=-1).sum(-1) > 0.9).all()
    )  # 32 / (32 + 64·0.15²) = 0.957
    top = u.abs().argmax(-2, keepdim=True)
    assert bool((u.gather(-2, top) > 0).all())


def test_query_stats_refuse_mismatched_shapes():
    stats = _stats(torch.randn(B, 4, 8, D))
    with pytest.raises(ValueError, match="do not match earlier"):
        stats.update(torch.randn(B, 4, 8, 32), H)
    with pytest.raises(ValueError, match="do not group"):
        QueryStats().update(torch.randn(B, 3, 8, D), H)
    with pytest.raises(ValueError, match="do not fit keys"):
        build_method("quantwm", 2, 64).quantize(torch.randn(B, 4, L, D), "key", stats)


# --- causality (App. C.3) in the cache -------------------------------------------------------


@dataclass(frozen=True)
class _Spy(KVMethod):
    """Stores exactly and logs, per quantize call, the query statistics it was handed."""

    name: ClassVar[str] = "spy"
    needs_queries: ClassVar[bool] = True
    log: ClassVar[list[tuple[str, int, torch.Tensor | None]]] = []

    def _quantize(self, x, role, queries):
        moment = None if queries.empty else queries.moment.clone()
        self.log.append((role, queries.count, moment))
        return RawTensor(x)


def _chunk_queries(t: int) -> list[torch.Tensor]:
    """Chunk ``t``'s queries: two denoising steps and the refresh pass, all distinct."""
    return [_queries(100 * t + s, length=16) for s in range(3)]


def test_write_log_each_commit_saw_exactly_the_earlier_chunks_queries():
    _Spy.log.clear()
    cache = ChunkKVCache(KVSpec(_Spy(), _Spy()))
    for t in range(4):
        k = _keys(10 + t)
        *denoise, refresh = _chunk_queries(t)
        for q in denoise:
            cache.attend(q, k, k, scale=D**-0.5)
        cache.attend(refresh, k, k, scale=D**-0.5)  # the refresh pass, then its commit
        cache.commit(k, k)
    assert [(role, count) for role, count, _ in _Spy.log] == [
        (role, count) for count in (0, 96, 192, 288) for role in ("key", "value")
    ]  # 3 calls × 2 query heads per KV head × 16 queries per earlier chunk
    for t in range(1, 4):
        want = _stats(*(q for s in range(t) for q in _chunk_queries(s)))
        # the cache sums the moments chunk by chunk (pending, then absorbed), _stats call by
        # call: another association of float32 sums of entries up to ~900, so within 1e-6 of
        # the largest entry (a chunk's queries more or less would move them by hundreds)
        scale = float(want.moment.abs().max())
        for role, _, moment in _Spy.log[2 * t : 2 * t + 2]:
            torch.testing.assert_close(moment, want.moment, rtol=0, atol=1e-6 * scale, msg=role)


def test_first_chunk_gets_uniform_sensitivity_and_no_psac():
    """The issue's repro: one attend on an empty cache, then commit."""
    cache = ChunkKVCache(KVSpec.build("quantwm", 2))
    k = _keys()
    cache.attend(_queries(), k, k, scale=D**-0.5)
    cache.commit(k, k)
    got = cache.stored(0, "key")
    assert isinstance(got, QuantWMTensor) and got.psac is None
    assert not any(name.startswith("psac.") for name in got.stored())
    assert _same_bytes(got, build_method("quantwm", 2).quantize(k, "key"))  # w_c = 1


def test_a_chunk_is_stored_with_the_queries_of_earlier_chunks():
    qs = [_queries(s) for s in (1, 2, 3)]
    ks = [_keys(s) for s in (10, 11, 12)]
    cache = ChunkKVCache(KVSpec.build("quantwm", 2, 64))
    for q, k in zip(qs, ks, strict=True):
        cache.attend(q, k, k, scale=D**-0.5)
        cache.commit(k, k)
    method = build_method("quantwm", 2, 64)
    for i in range(3):
        assert _same_bytes(cache.stored(i, "key"), method.quantize(ks[i], "key", _stats(*qs[:i])))


def test_a_chunks_own_and_later_queries_never_change_what_it_stores():
    ks = [_keys(s) for s in (10, 11, 12, 13)]

    def run(third: torch.Tensor) -> ChunkKVCache:
        cache = ChunkKVCache(KVSpec.build("quantwm", 2, 64))
        for q, k in zip([_queries(1), _queries(2), third, _queries(4)], ks, strict=True):
            cache.attend(q, k, k, scale=D**-0.5)
            cache.commit(k, k)
        return cache

    a, b = run(_queries(3)), run(5 * _queries(7, rank=5))
    for i in range(3):  # chunk 2's own queries differ: chunks 0, 1 and 2 are stored alike
        assert _same_bytes(a.stored(i, "key"), b.stored(i, "key"))
    assert not torch.equal(a.stored(3, "key").dequantize(), b.stored(3, "key").dequantize())


# --- the format (Eq. 1–4, App. D.1) ----------------------------------------------------------


@pytest.mark.parametrize("bits", [2, 4])
def test_affine_residual_bound_integer_zero_points_and_scale_codes(bits):
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 37, 128, generator=g) * torch.rand(3, 37, 1, generator=g)
    rows[0, 5, :64] = 0.0  # an all-zero group: stored exactly
    rows[1, 7, 64:] = 0.25  # a constant group: its range is widened to hold 0
    t = quantize_affine(rows, bits, 64, rows.shape, torch.float32)
    m = (1 << bits) - 1
    err = (rows - t.rows()).abs()
    half = (t.rows_step / 2).repeat_interleave(64, -1)
    assert bool((err <= half * (1 + 1e-6) + 1e-7).all())  # |r − r̂| ≤ Δ/2 everywhere
    assert t.rows_step[0, 5, 0] == 0 and bool((t.rows()[0, 5, :64] == 0).all())
    z = t.zero_points()
    assert z.dtype == torch.uint8 and int(z.max()) <= m
    assert t.scale_codes.dtype == torch.uint8 and t.secondary.dtype == torch.float16
    assert t.secondary.shape == (3,) and int(t.scale_codes.max()) == 255  # each row's largest
    torch.testing.assert_close(
        t.rows_step, t.scale_codes.float() * t.secondary.float()[:, None, None]
    )
    # codes b bits, zero points b bits (37·2 per row, padded to bytes), scale codes 8 bits
    zero_bytes = -(-37 * 2 * bits // 8)
    assert t.nbytes == 3 * (37 * 128 * bits // 8 + zero_bytes + 37 * 2 + 2)


def test_keys_and_values_are_centroid_plus_affine_residual():
    k, stats = _keys(), _stats(_queries())
    for role in ("key", "value"):
        t = build_method("quantwm", 2, 64).quantize(k, role, stats)
        assert isinstance(t, QuantWMTensor) and t.num_centroids == 4  # L/64 cap at L = 256
        assert (t.psac is not None) == (role == "key")  # values: the same path without PSAC
        base = t.smoothing() + t.residual.rows()
        if role == "value":
            torch.testing.assert_close(t.dequantize().reshape(-1, L, D), base)
    v = build_method("quantwm", 2, 64).quantize(k, "value", stats)
    ids, cents = kmeans(k.reshape(-1, L, D), 4, 2, Draws(0))
    assert torch.equal(v.ids.long(), ids) and torch.equal(v.centroids, cents.bfloat16())


def test_k_is_256_for_real_chunks_and_capped_where_it_would_store_every_token():
    assert quantwm_centroids(256, 4680, 64) == (256, False)  # Self-Forcing: one chunk
    assert quantwm_centroids(256, 4096, 64) == (256, False)  # 16 tokens per centroid
    assert quantwm_centroids(256, 256, 64) == (4, True)  # the embedded model: L/64
    assert quantwm_centroids(256, 256, 0) == (256, False)  # no cap asked
    method = build_method("quantwm", 2, 64)
    assert method.storage_note(256) == "K=4: L/64 cap" and method.storage_note(4680) == ""


# --- QSAC (Eq. 9, 10, 14) --------------------------------------------------------------------


def test_channel_weights_are_the_normalised_diagonal_and_uniform_without_history():
    stats = _stats(_queries())
    w = channel_weights(stats, B * H, D)
    diag = stats.moment.diagonal(dim1=-2, dim2=-1).reshape(B * H, D)
    torch.testing.assert_close(w, diag / diag.mean(-1, keepdim=True))
    assert torch.equal(channel_weights(QueryStats(), B * H, D), torch.ones(B * H, D))


@pytest.mark.parametrize("candidates", [1, 4, 16])
def test_qsac_assignment_is_the_least_score_among_the_top_m_by_weighted_distance(candidates):
    """Eq. 14, stated independently: rank the centroids by ``Σ_c w_c (x_c − c_c)²``, keep the
    first M, take the one of least ``Σ_g (Σ_{c∈g} w_c) R_g²``."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 40, 64, generator=g)
    cents = torch.randn(2, 16, 64, generator=g)
    w = torch.rand(2, 64, generator=g) * 3
    got = qsac_assign(x, cents, w, 32, candidates, max_elements=5000)  # several blocks
    for n in range(2):
        for i in range(40):
            d = ((x[n, i] - cents[n]).square() * w[n]).sum(-1)
            top = d.argsort()[:candidates]
            wg = w[n].view(2, 32).sum(-1)
            score = [
                float((group_ranges(x[n, i] - cents[n, a], 32).square() * wg).sum()) for a in top
            ]
            assert int(got[n, i]) == int(top[min(range(len(score)), key=score.__getitem__)])


def test_qsac_first_chunk_and_flat_queries_weigh_channels_equally():
    k = _keys()
    alone = build_method("quantwm-qsac", 2, 64).quantize(k, "key")
    flat = QueryStats()
    flat.update(torch.eye(D).expand(B, 2 * H, D, D).contiguous(), H)  # M_cc equal: w_c = 1
    same = build_method("quantwm-qsac", 2, 64).quantize(k, "key", flat)
    assert _same_bytes(alone, same)


def _two_structures(seed: int) -> torch.Tensor:
    """Keys whose channels 0–31 and 32–63 fall into 4 clusters each, independently drawn: the
    second half's clusters are twice as far apart (what Euclidean k-means follows)."""
    g = torch.Generator().manual_seed(seed)
    halves = []
    for spread in (2.0, 4.0):
        centres = spread * torch.randn(B, H, 4, D // 2, generator=g)
        pick = torch.randint(0, 4, (B, H, L), generator=g)
        halves.append(centres.gather(2, pick.unsqueeze(-1).expand(-1, -1, -1, D // 2)))
    return torch.cat(halves, -1) + 0.3 * torch.randn(B, H, L, D, generator=g)


def test_qsac_lowers_the_error_in_the_channels_queries_read():
    """Queries read channels 0–31 10× harder. With the same K and residual format (g = 32),
    QSAC's clusters leave less sensitivity-weighted key error than Euclidean k-means (the
    ``quantwm-base`` format), which splits on the wider but unread structure of channels
    32–63."""
    ratios = []
    for seed in range(6):
        k = _two_structures(seed)
        scale = torch.cat([torch.full((32,), 10.0), torch.full((32,), 1.0)])
        q = torch.randn(B, 4, 128, D, generator=torch.Generator().manual_seed(100 + seed)) * scale
        stats = _stats(q)
        s = stats.sensitivity()  # [B, H, D]
        ours = build_method("quantwm-qsac", 2, 32).quantize(k, "key", stats)
        euclid = build_method("quantwm-base", 2, 32).quantize(k, "key")
        w_ours = float(((k - ours.dequantize()).square() * s.unsqueeze(-2)).mean())
        w_euclid = float(((k - euclid.dequantize()).square() * s.unsqueeze(-2)).mean())
        ratios.append(w_ours / w_euclid)
    assert max(ratios) < 0.6, ratios


# --- PSAC ------------------------------------------------------------------------------------


def test_psac_stores_rank_8_bf16_basis_int8_rows_with_fp16_scales():
    k, stats = _keys(), _stats(_queries())
    t = build_method("quantwm", 2, 64).quantize(k, "key", stats)
    p = t.psac
    assert p.basis.shape == (B * H, 8, D) and p.basis.dtype == torch.bfloat16
    assert p.codes.dtype == torch.int8 and p.scale.dtype == torch.float16
    torch.testing.assert_close(
        p.basis.float(), stats.subspace(8).reshape(B * H, D, 8).transpose(1, 2).bfloat16().float()
    )


def _axis_queries(rank: int = 8, count: int = 64) -> QueryStats:
    """Queries on the first ``rank`` coordinate axes only: ``U_r`` is exactly those axes."""
    g = torch.Generator().manual_seed(9)
    q = torch.zeros(B, 2 * H, count, D)
    q[..., :rank] = torch.randn(B, 2 * H, count, rank, generator=g) * torch.arange(
        rank + 1.0, 1.0, -1.0
    )
    return _stats(q)


def test_psac_row_gate_keeps_only_rows_that_lower_the_weighted_error():
    """Errors in span(U_r) are compensated (kept); errors orthogonal to it (C = 0) and zero
    errors gain nothing (gated off), so with 1/4 of the rows kept the sparse layout is chosen."""
    stats = _axis_queries()
    g = torch.Generator().manual_seed(4)
    error = torch.zeros(B * H, 64, D)
    error[:, :16, :8] = torch.randn(B * H, 16, 8, generator=g)  # in the subspace
    error[:, 16:48, 8:] = torch.randn(B * H, 32, D - 8, generator=g)  # orthogonal to it
    rows = psac_rows(error, stats, 8, 64)
    kept = rows.kept()
    assert bool(kept[:, :16].all()) and not bool(kept[:, 16:].any())
    assert rows.layout == "sparse" and rows.counts.tolist() == [16, 16]
    assert rows.index.dtype == torch.int16
    held = sum(
        t.numel() * t.element_size()
        for n, t in rows.stored().items()
        if n not in ("basis", "noise_scale")
    )
    assert (
        held == layout_bytes(B * H, 64, 32, 8)["sparse"] < layout_bytes(B * H, 64, 32, 8)["dense"]
    )
    left = error - rows.compensation()
    sigma = (stats.moment / stats.count).reshape(B * H, D, D)
    before, after = (((e @ sigma) * e).sum(-1) for e in (error, left))
    assert bool((after[:, :16] < 1e-3 * before[:, :16]).all())  # INT8 rows: ≤ 1/254 per coef
    torch.testing.assert_close(left[:, 16:], error[:, 16:])


def test_psac_dense_layout_when_most_rows_are_kept():
    stats = _axis_queries()
    error = torch.randn(B * H, 64, D, generator=torch.Generator().manual_seed(5))
    rows = psac_rows(error, stats, 8, 64)
    assert bool(rows.kept().all()) and rows.layout == "dense"
    assert rows.codes.shape == (B * H, 64, 8) and rows.scale.shape == (B * H, 64)


def test_psac_removes_the_logit_error_of_queries_in_the_subspace():
    k, q = _keys(), _queries()
    stats = _stats(q)
    plain = build_method("quantwm-base", 2, 64).quantize(k, "key")
    psac = build_method("quantwm-psac", 2, 64).quantize(k, "key", stats)
    u = stats.subspace(8)  # [B, H, D, 8]
    g = torch.Generator().manual_seed(5)
    q_in = (u @ torch.randn(B, H, 8, 512, generator=g)).transpose(-1, -2)  # queries in span(U)
    before = _logit_mse(q_in, k, plain.dequantize())
    after = _logit_mse(q_in, k, psac.dequantize())
    # left: INT8 rounding of the coefficients (≤ 1/254 of a row's largest) and the BF16 basis
    assert after < 0.01 * before
    q_new = _queries(seed=1, length=512)  # same subspace, fresh draws
    ratio = _logit_mse(q_new, k, psac.dequantize()) / _logit_mse(q_new, k, plain.dequantize())
    assert ratio < 0.1  # expected ≈ 0.04: the off-subspace share of the query energy


@pytest.mark.parametrize("name", ["quantwm-psac", "quantwm"])
def test_reported_steps_predict_the_score_noise_left_after_psac(name):
    """jbkv's calibrated steps (not the paper's): for fresh queries distributed like the
    history, the measured score-noise variance over the predicted ``(1/12) Σ_j step_ij²
    ‖q_j‖²`` is ≈ 1 with PSAC's ``Δ·√ρ`` steps, and far below 1 with the residual's raw steps
    (the over-correction it avoids)."""
    for seed in range(4):
        k, q = _keys(seed), _queries(seed + 1)
        t = build_method(name, 2, 32).quantize(k, "key", _stats(q))
        fresh = _queries(seed + 1, length=512).reshape(B, H, -1, D)
        measured = (fresh @ (k - t.dequantize().float()).transpose(-1, -2)).square().mean()
        qn2 = fresh.unflatten(-1, (2, 32)).square().sum(-1)  # [B, H, Lq, G]

        def predicted(step: torch.Tensor, qn2=qn2) -> torch.Tensor:
            return (qn2 @ step.square().transpose(-1, -2)).mean() / 12

        assert 0.75 < float(measured / predicted(t.step)) < 1.3
        assert float(measured / predicted(t.residual.step)) < 0.2


# --- ablations (Table 5), storage, ids ---------------------------------------------------------


def test_ablations_switch_exactly_one_technique():
    k, stats = _keys(), _stats(_queries())
    full, qsac, psac, base = (
        build_method(n, 2, 64).quantize(k, "key", stats)
        for n in ("quantwm", "quantwm-qsac", "quantwm-psac", "quantwm-base")
    )
    assert qsac.psac is None and base.psac is None and psac.psac is not None
    assert torch.equal(full.ids, qsac.ids) and torch.equal(psac.ids, base.ids)
    assert not torch.equal(full.ids, base.ids)  # QSAC clusters differently
    assert _same_bytes(full.residual, qsac.residual) and _same_bytes(psac.residual, base.residual)
    values = [
        build_method(n, 2, 64).quantize(k, "value", stats) for n in ("quantwm", "quantwm-base")
    ]
    assert _same_bytes(*values)
    assert not build_method("quantwm-base", 2).needs_queries


def test_storage_is_counted_from_the_stored_tensors():
    stats = _stats(_queries())
    k = _keys()
    residual = 2 + (2 + 8) / 64 + 16 / (L * D)  # codes, zero points, scale codes, FP16 scale
    codebook = 8 / D + 16 * 4 / L  # uint8 ids, 4 BF16 centroids
    psac = (8 * 8 + 16) / D + 16 * 8 / L + 16 / (L * D)  # dense rows, basis, noise scales
    for name, extra in (("quantwm", psac), ("quantwm-qsac", 0.0), ("quantwm-psac", psac)):
        t = build_method(name, 2, 64).quantize(k, "key", stats)
        assert t.psac is None or t.psac.layout == "dense"
        assert t.effective_bits == pytest.approx(residual + codebook + extra), name
        v = build_method(name, 2, 64).quantize(k, "value", stats)
        assert v.effective_bits == pytest.approx(residual + codebook), name


def test_deterministic_and_ids():
    stats = _stats(_queries())
    a = build_method("quantwm", 2, 64).quantize(_keys(), "key", stats).dequantize()
    b = build_method("quantwm", 2, 64).quantize(_keys(), "key", stats).dequantize()
    assert torch.equal(a, b)
    assert KVSpec.build("quantwm", 2, 64, "taylor").variant_id == "int2-quantwm-g64-taylor"
    assert build_method("quantwm", 2, 64, rank=4, candidates=256).variant_id == (
        "int2-quantwm-g64-m256-r4"
    )
    assert build_method("quantwm-psac", 2, 64, candidates=16).variant_id == "int2-quantwm-psac-g64"
    with pytest.raises(ValueError, match="rank must be"):
        build_method("quantwm", 2, 64, rank=0)
    with pytest.raises(ValueError, match="exceeds the head dim"):
        build_method("quantwm", 2, 64, rank=65).quantize(_keys(), "key")
    with pytest.raises(ValueError, match="supports bits 2, 4"):
        build_method("quantwm", 3, 64)


def test_quantize_eval_runs_quantwm_on_the_tiny_model(quick_eval, tmp_path):
    rows = quick_eval(
        "--quantizers", "quantwm", "--bits", "2", "--group-sizes", "64", "--corrections", "none"
    )
    row = rows["int2-quantwm-g64"]
    assert row["quantizer"] == "quantwm"
    assert row["label"] == "INT2 quantwm g64 (K=4: L/64 cap)"
    assert 2.5 < row["effective_bits"] < 4.0
    assert 15 < row["psnr"]["mean"] < 99
    assert 0.0 <= row["token_shift"]["mean"] <= 1.0
    page = next(tmp_path.rglob("report/index.html")).read_text()
    assert "top-1 shift" in page and "K=4: L/64 cap" in page
    assert json.loads((tmp_path / "r.json").read_text())["rows"][0]["token_shift"] is None
