"""After FlowCache (``jbkv_cli/prune/flowcache.py``): the score against a hand computation, the
GQA max, the kernel-7 pool, the redundancy identity, the budget rule, re-selection of earlier
kept tokens, no sink, stored bytes, the corrected ablation, options, and the tiny model's loop."""

from __future__ import annotations

import json
import math

import pytest
import torch

from jbkv_cli.attention.correction import taylor_bias
from jbkv_cli.kvcache import KVSpec, layer_caches
from jbkv_cli.prune import (
    FlowCache,
    FlowCacheCorrected,
    HeldKeys,
    build_pruner,
    pruner_from_record,
)
from jbkv_cli.prune.flowcache import (
    attention_mass,
    flowcache_budget,
    flowcache_score,
    group_logits,
    importance,
    max_pool,
    query_window,
    redundancy,
)
from tests.installed import run_jbkv

TOL = 1e-6  # float32 against float64 hand computations on O(1) values


def hand_score(q, k, scale, lam=0.07, kernel=7):
    """FlowCache's score with loops, in float64: ``q [Hq, Lq, D]``, ``k [Hkv, N, D]``."""
    q, k = q.double(), k.double()
    hq, lq, _ = q.shape
    hkv, n, _ = k.shape
    group = hq // hkv
    out = torch.zeros(hkv, n, dtype=torch.float64)
    for g in range(hkv):
        mass = torch.zeros(n, dtype=torch.float64)
        for j in range(lq):
            logits = [
                max(scale * float(q[g * group + m, j] @ k[g, i]) for m in range(group))
                for i in range(n)
            ]
            top = max(logits)
            e = [math.exp(x - top) for x in logits]
            mass += torch.tensor([x / sum(e) for x in e], dtype=torch.float64) / lq
        pooled = torch.tensor(
            [max(mass[max(0, i - kernel // 2) : i + kernel // 2 + 1]) for i in range(n)],
            dtype=torch.float64,
        )
        unit = [k[g, i] / (k[g, i].norm() + 1e-8) for i in range(n)]
        mean_cos = torch.tensor(
            [sum(float(unit[i] @ unit[j]) for j in range(n) if j != i) / n for i in range(n)],
            dtype=torch.float64,
        )
        red = mean_cos.softmax(-1)
        out[g] = lam * pooled - (1 - lam) * red
    return out


def test_the_score_is_the_hand_computation():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 8, generator=gen)
    k = torch.randn(1, 2, 11, 8, generator=gen)
    scale = 8**-0.5
    got = flowcache_score(importance(q, k, scale), redundancy(k))
    torch.testing.assert_close(got[0].double(), hand_score(q[0], k[0], scale), rtol=0, atol=TOL)


def test_gqa_takes_the_max_of_the_group_logits_before_the_softmax():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 5, 8, generator=gen)
    k = torch.randn(1, 2, 6, 8, generator=gen)
    per_head = 0.5 * q @ k.repeat_interleave(2, dim=1).transpose(-1, -2)  # [1, 4, 5, 6]
    want = per_head.unflatten(1, (2, 2)).amax(2)
    torch.testing.assert_close(group_logits(q, k, 0.5), want, rtol=0, atol=TOL)
    assert not torch.allclose(want, per_head.unflatten(1, (2, 2)).mean(2))  # a max, not a mean
    mass = attention_mass(q, k, 0.5)
    torch.testing.assert_close(mass, want.softmax(-1).mean(-2), rtol=0, atol=TOL)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        group_logits(q[:, :3], k, 0.5)


def test_the_mass_is_the_same_in_blocks_of_queries(monkeypatch):
    """Queries scored a few at a time (a block of 12 logits: two queries against 2 heads × 3
    tokens) give the mean of the whole score matrix's softmax, masked and biased."""
    import jbkv_cli.prune.flowcache as flowcache

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 7, 8, generator=gen)
    k = torch.randn(1, 2, 3, 8, generator=gen)
    valid = torch.tensor([[[True, False, True], [True, True, True]]])
    bias = torch.rand(1, 4, 7, 3, generator=gen)
    s = group_logits(q, k, 0.5, bias).masked_fill(~valid.unsqueeze(-2), float("-inf"))
    want = s.softmax(-1).mean(-2)
    monkeypatch.setattr(flowcache, "SCORE_ELEMENTS", 12)
    torch.testing.assert_close(attention_mass(q, k, 0.5, valid, bias), want, rtol=0, atol=TOL)


def test_the_pool_is_a_max_over_seven_neighbours():
    x = torch.zeros(2, 3, 16)
    x[1, 2, 5] = 1.0
    pooled = max_pool(x)
    assert pooled.shape == x.shape
    assert pooled[1, 2].nonzero().flatten().tolist() == list(range(2, 9))
    assert pooled.sum() == 7
    edge = torch.arange(10.0).flip(0)
    assert max_pool(edge).tolist() == [9, 9, 9, 9, 8, 7, 6, 5, 4, 3]
    with pytest.raises(ValueError, match="odd"):
        max_pool(x, 6)


def pairwise_redundancy(k: torch.Tensor) -> torch.Tensor:
    """The O(L²) form (upstream's commented-out one): cosines, diagonal 0, mean over L."""
    unit = k.double() / (k.double().norm(dim=-1, keepdim=True) + 1e-8)
    cos = unit @ unit.transpose(-1, -2)
    cos = cos - torch.diag_embed(torch.diagonal(cos, dim1=-2, dim2=-1))
    return cos.mean(dim=-2).softmax(dim=-1)


def test_redundancy_identity_equals_the_mean_pairwise_cosine():
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(2, 3, 23, 16, generator=gen) + 0.5  # a mean: cosines away from 0
    torch.testing.assert_close(redundancy(k).double(), pairwise_redundancy(k), rtol=0, atol=TOL)
    # over the valid tokens only: the pairwise form of the subset, 0 elsewhere
    valid = torch.rand(2, 3, 23, generator=gen) > 0.4
    got = redundancy(k, valid)
    for b in range(2):
        for h in range(3):
            sub = k[b, h, valid[b, h]]
            want = pairwise_redundancy(sub)
            torch.testing.assert_close(got[b, h, valid[b, h]].double(), want, rtol=0, atol=TOL)
            assert got[b, h, ~valid[b, h]].abs().sum() == 0


def test_query_granularity():
    q = torch.arange(100.0).reshape(1, 1, 100, 1)
    assert query_window(q, "token", 16).flatten().tolist() == list(range(50, 100))
    assert query_window(q, "frame", 16).flatten().tolist() == list(range(84, 100))
    assert query_window(q, "chunk", 16).shape[-2] == 100
    assert query_window(q[..., :10, :], "token", 16).shape[-2] == 10  # fewer than 50: all


def test_budget_rule():
    assert flowcache_budget(2 * 64, 64) == 64  # N = 5 on MAGI-1: one clean chunk kept
    assert flowcache_budget(3 * 64, 64) == 128  # N = 6: two
    assert flowcache_budget(64 + 10, 64) == 64  # never below one chunk


# --- through the cache ------------------------------------------------------------------------

D, L = 4, 4  # head dim, tokens per chunk (one-token frames)


def stack(pruner, spec_kw=None, window=None, kv_heads=1):
    spec = KVSpec.build(pruner=pruner, **(spec_kw or {}))
    (cache,) = layer_caches(spec, window, model="t", layers=1, kv_heads=kv_heads, frame_tokens=1)
    return cache


def along(*values: float) -> torch.Tensor:
    """A chunk of keys ``value · e0`` (importance grows with the value under ``q = e0``)."""
    k = torch.zeros(1, 1, len(values), D)
    k[..., 0] = torch.tensor(values)
    return k


def step(cache, k: torch.Tensor) -> None:
    """One chunk: an attention call (queries along e0) then the commit."""
    q = torch.zeros(1, 1, L, D)
    q[..., 0] = 1.0
    cache.attend(q, k, k, scale=1.0)
    cache.commit(k, k)


def held(cache) -> dict[int, list[int]]:
    """Per chunk serial, the positions its lane stores (batch 0, head 0)."""
    return {c.serial: c.pruned.lanes[0][0].index.tolist() for c in cache.chunks}


def test_earlier_kept_tokens_are_scored_again_and_the_first_chunk_is_not_protected():
    """Importance only (λ = 1, kernel 1), K = 1: each event keeps the top ``L`` of [held | new]."""
    cache = stack(FlowCache(mix_lambda=1.0, kernel_size=1))
    step(cache, along(3.0, 2.0, 1.0, 0.5))
    assert held(cache) == {0: [0, 1, 2, 3]}  # one chunk: no event
    step(cache, along(0.1, 0.2, 0.3, 0.4))
    assert held(cache) == {0: [0, 1, 2, 3], 1: []}  # budget max(8 − 4, 4) = 4
    step(cache, along(4.0, 3.5, 2.5, 2.2))
    assert held(cache) == {0: [0], 1: [], 2: [0, 1, 2]}  # 2, 1, 0.5 kept before, dropped now
    step(cache, along(5.0, 5.0, 5.0, 5.0))
    assert held(cache) == {0: [], 1: [], 2: [], 3: [0, 1, 2, 3]}  # no sink: chunk 0 emptied
    assert cache.chunks[0].pruned.lanes[0][0].k is None
    # what attention reads: exactly the kept tokens
    view = cache.read()
    assert view.valid.flatten().tolist() == [False] * 12 + [True] * 4


def test_two_clean_chunks_keep_two_chunks_worth():
    cache = stack(FlowCache(clean_chunks=2, mix_lambda=1.0, kernel_size=1))
    for values in ((1, 2, 3, 4), (5, 6, 7, 8), (0, 0, 0, 9)):
        step(cache, along(*values))
    assert held(cache) == {0: [1, 2, 3], 1: [0, 1, 2, 3], 2: [3]}  # the top 8 of 12


def test_each_head_and_batch_row_selects_on_its_own():
    cache = stack(FlowCache(mix_lambda=1.0, kernel_size=1), kv_heads=2)
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        k = torch.randn(2, 2, L, D, generator=gen)
        cache.attend(torch.randn(2, 4, L, D, generator=gen), k, k, scale=0.5)
        cache.commit(k, k)
    for b in range(2):
        for h in range(2):
            assert sum(len(c.pruned.lanes[b][h].index) for c in cache.chunks) == L
    lanes = [
        [c.pruned.lanes[b][h].index.tolist() for c in cache.chunks] for b in (0, 1) for h in (0, 1)
    ]
    assert len({str(x) for x in lanes}) > 1  # not one choice for all


def test_the_window_evicts_kept_tokens_and_the_count_follows():
    cache = stack(FlowCache(mix_lambda=1.0, kernel_size=1), window=1)
    step(cache, along(9, 9, 9, 9))
    step(cache, along(1, 1, 1, 1))  # keeps chunk 0's four; the window then evicts chunk 0
    assert held(cache) == {1: []}
    assert cache.pruning.bound == 4  # at most chunk 1's four: a bound, not read from the masks
    step(cache, along(2, 3, 4, 5))  # chunk 1's slots are padding: the new four win
    assert held(cache) == {2: [0, 1, 2, 3]}


def test_a_dropped_token_is_never_kept_again():
    """``K = 2`` and a history that holds fewer real tokens than the bound (a window evicted
    some): the budget (8) exceeds the 6 real candidates, and only those 6 are kept."""
    (layer,) = FlowCache(clean_chunks=2, mix_lambda=1.0, kernel_size=1).plans("t", 1, 1, 1)
    layer.observe(torch.ones(1, 1, L, D), 1.0)
    keys = [along(1, 2, 3, 4), along(5, 6, 7, 8), along(9, 10, 11, 12)]
    layer.rescore(0, keys[0], HeldKeys())
    layer.rescore(1, keys[1], HeldKeys((0,), (L,), keys[0], torch.ones(1, 1, L, dtype=torch.bool)))
    assert layer.bound == 2 * L  # no event yet
    valid = torch.tensor([[[False, True, False, False, False, False, True, False]]])
    held = HeldKeys((0, 1), (L, L), torch.cat(keys[:2], dim=-2) * valid[..., None], valid)
    decision = layer.rescore(2, keys[2], held)
    assert [(s, m.flatten().tolist()) for s, _, m in decision.settled] == [
        (0, [False, True, False, False]),
        (1, [False, False, True, False]),
    ]
    assert decision.keep.all()
    assert layer.bound == 2 * L and decision.held == {0: (L,), 1: (L,), 2: (L,)}


def test_storage_is_what_the_lanes_store_plus_the_queries():
    pruner = FlowCache()
    unpruned = layer_caches(
        KVSpec.build("rtn", 2, group_size=32), None, model="t", layers=1, kv_heads=2, frame_tokens=8
    )[0]
    gen = torch.Generator().manual_seed(4)
    cache = stack(pruner, {"quantizer": "rtn", "bits": 2, "group_size": 32}, kv_heads=2)
    for _ in range(5):
        k, v = torch.randn(2, 1, 2, 32, 64, generator=gen)
        q = torch.randn(1, 4, 32, 64, generator=gen)
        for c in (cache, unpruned):
            c.attend(q, k, v, scale=0.125)
            c.commit(k, v)
    stored = 0
    for c in cache.chunks:
        for lane in c.pruned.lanes[0]:
            stored += lane.index.numel() * lane.index.element_size()
            for t in (lane.k, lane.v):
                if t is not None:
                    stored += sum(x.numel() * x.element_size() for x in t.stored().values())
    queries = 1 * 4 * 1 * 64 * 4  # the last frame's query (frame_tokens 1), float32
    assert cache.nbytes == stored + queries
    assert cache.nbytes_by_kind() == {"scored": cache.nbytes}
    kept = [sum(len(c.pruned.lanes[0][h].index) for c in cache.chunks) for h in range(2)]
    assert kept == [32, 32]  # one chunk's worth per lane
    assert cache.nbytes - queries < unpruned.nbytes / 4  # 1 of 5 chunks' tokens


def test_corrected_equals_flowcache_with_exact_keys():
    gen = torch.Generator().manual_seed(5)
    caches = [stack(cls(), kv_heads=2) for cls in (FlowCache, FlowCacheCorrected)]
    for _ in range(5):
        k, v = torch.randn(2, 1, 2, 8, 16, generator=gen)
        q = torch.randn(1, 4, 8, 16, generator=gen)
        for c in caches:
            c.attend(q, k, v, scale=0.25)
            c.commit(k, v)
    a, b = ([c.pruned.kept for c in cache.chunks] for cache in caches)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert sum(int(x.sum()) for x in a) == 2 * 8  # pruned: one chunk's worth per head


def test_corrected_scores_subtract_the_taylor_bias_of_the_stored_steps():
    gen = torch.Generator().manual_seed(6)
    spec = {"quantizer": "rtn", "bits": 2, "group_size": 8}
    caches = [stack(cls(), spec, kv_heads=2) for cls in (FlowCache, FlowCacheCorrected)]
    k, v = torch.randn(2, 1, 2, 8, 16, generator=gen)
    q = torch.randn(1, 4, 8, 16, generator=gen)
    for c in caches:
        c.attend(q, k, v, scale=0.25)
        c.commit(k, v)
    plain, corrected = (c.pruning for c in caches)
    held = caches[1]._held_keys()
    assert held.step is not None and held.step.abs().sum() > 0
    new = torch.randn(1, 2, 8, 16, generator=gen)
    keys = torch.cat([held.k, new], dim=-2)
    valid = torch.cat([held.valid, torch.ones(1, 2, 8, dtype=torch.bool)], dim=-1)
    steps = torch.cat([held.step, torch.zeros(1, 2, 8, held.step.shape[-1])], dim=-2)
    bias = taylor_bias(corrected.queries, steps, 0.25)
    want = flowcache_score(
        importance(corrected.queries, keys, 0.25, 7, valid, bias), redundancy(keys, valid)
    )
    torch.testing.assert_close(corrected.score(keys, valid, steps), want, rtol=0, atol=0)
    assert not torch.allclose(plain.score(keys, valid, steps), want)


def test_the_correction_removes_the_bias_toward_large_step_tokens():
    """Zero-mean uniform key noise of steps 0.1 (half the tokens) and 1.5 (the other half): the
    importance mass on the large-step half, averaged over 200 noise draws (fixed seed), rises by
    ≈ 0.045 without the correction (SE ≈ 0.001) and moves by less than 0.01 with it."""
    gen = torch.Generator().manual_seed(0)
    n, d = 64, 32
    tau = d**-0.5
    k = torch.randn(1, 1, n, d, generator=gen)
    q = 1.5 * torch.randn(1, 2, 16, d, generator=gen)
    steps = torch.full((1, 1, n, 1), 0.1)
    steps[..., n // 2 :, :] = 1.5
    bias = taylor_bias(q, steps, tau)
    exact = attention_mass(q, k, tau)[..., n // 2 :].sum()
    plain, corrected = [], []
    for _ in range(200):
        noisy = k + (torch.rand(1, 1, n, d, generator=gen) - 0.5) * steps
        plain.append(attention_mass(q, noisy, tau)[..., n // 2 :].sum())
        corrected.append(attention_mass(q, noisy, tau, bias=bias)[..., n // 2 :].sum())
    shift_plain = torch.stack(plain).mean() - exact
    shift_corrected = torch.stack(corrected).mean() - exact
    assert shift_plain > 0.03
    assert abs(shift_corrected) < 0.01


# --- options ----------------------------------------------------------------------------------


def test_presets_options_ids_and_records():
    default = FlowCache()
    assert (default.clean_chunks, default.query_granularity) == (1, "frame")
    assert default.variant_id == "flowcache" and default.label == "after FlowCache"
    vbench = FlowCache(preset="vbench")
    assert (vbench.clean_chunks, vbench.query_granularity, vbench.preset) == (2, "chunk", None)
    assert vbench.variant_id == "flowcache-k2-qchunk"
    assert FlowCache(preset="physicsiq").query_granularity == "token"
    assert FlowCache(preset="skyreels-v2") == FlowCache(query_granularity="chunk")
    assert FlowCache(preset="vbench", clean_chunks=3).clean_chunks == 3  # an option wins
    odd = FlowCacheCorrected(mix_lambda=0.5, kernel_size=3, query_tokens=10)
    assert odd.variant_id == "flowcachecorr-qt10-l50-ks3"
    assert odd.label == "after FlowCache-corrected qt10 l50 ks3"
    for pruner in (vbench, odd):
        assert pruner_from_record(json.loads(json.dumps(pruner.to_dict()))) == pruner
    assert build_pruner("flowcache", preset="magi1") == default
    with pytest.raises(ValueError, match="odd"):
        FlowCache(kernel_size=4)
    with pytest.raises(ValueError, match="preset"):
        FlowCache(preset="nope")
    with pytest.raises(ValueError, match="mix_lambda"):
        FlowCache(mix_lambda=1.5)


def test_a_commit_with_no_queries_seen_is_refused_at_its_first_event():
    cache = stack(FlowCache())
    cache.commit(along(1, 2, 3, 4), along(1, 2, 3, 4))
    with pytest.raises(RuntimeError, match="no attention call"):
        cache.commit(along(1, 2, 3, 4), along(1, 2, 3, 4))


# --- the embedded model, end to end -----------------------------------------------------------


@pytest.mark.slow  # end to end through the installed jbkv
def test_generate_with_flowcache_on_the_tiny_model(tmp_path):
    prompt = "a red circle moves right on a dark background"
    small = ["--prompt", prompt, "--num-chunks", "3", "--steps", "1", "--device", "cpu"]
    for pruner in ("flowcache", "flowcache-corrected"):
        args = ["generate", *small, "--bits", "2", "--pruner", pruner, "--out", "run"]
        run_jbkv(*args, "-M", f"{pruner}.preset=vbench", cwd=tmp_path, check=True)
    videos = tmp_path / "run" / "videos"
    for variant in ("int2-rtn-g32-flowcache-k2-qchunk", "int2-rtn-g32-flowcachecorr-k2-qchunk"):
        record = json.loads((videos / variant / f"{prompt}-0.json").read_text())
        assert record["info"]["kv"].startswith("INT2 rtn g32 after FlowCache")
        assert set(record["info"]["kv_cache_bytes_by_head"]) == {"scored"}
        assert record["kv_cache_bytes"] > 0
        assert (videos / variant / f"{prompt}-0.mp4").stat().st_size > 0
