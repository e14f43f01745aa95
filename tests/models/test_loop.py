"""The chunk loops' shared bookkeeping (:mod:`jbkv_cli.models.loop`): the one definition of peak
cache bytes (the most all caches hold together right after a commit pass, its splits from that
moment), the probe and commit switch around a commit pass, progress, and the info fields."""

from __future__ import annotations

import json

import pytest
import torch

from jbkv_cli.kvcache import FULL_PRECISION, ChunkKVCache, KVSpec
from jbkv_cli.models.loop import UNPRUNED, LoopCaches, bytes_by_kind
from jbkv_cli.prune import ForcingKV
from jbkv_cli.prune.profile import FORMAT

B, H, D = 1, 2, 4
TOKEN = B * H * D * 4 * 2  # one token's float32 key and value, every head


def commit(cache: ChunkKVCache, tokens: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, H, tokens, D, generator=g)
    cache.commit(k, torch.randn(k.shape, generator=g))


def test_peak_is_what_all_caches_hold_together_after_a_pass_not_each_layers_own_peak():
    # window 1: each pass replaces what a layer holds; layer a peaks at pass 1, layer b at pass 2
    a, b = ChunkKVCache(FULL_PRECISION, 1), ChunkKVCache(FULL_PRECISION, 1)
    books = LoopCaches({"a": [a], "b": [b]}, chunks=2)
    for tokens_a, tokens_b in ((4, 1), (1, 4)):
        commit(a, tokens_a)
        commit(b, tokens_b)
        books.committed()
    assert books.peak.total == 5 * TOKEN  # the most held at once
    assert a.peak_nbytes + b.peak_nbytes == 8 * TOKEN  # the sum of peaks counts more
    # a tie keeps the later moment's split
    assert books.facts(split="by_part")["by_part"] == {"a": TOKEN, "b": 4 * TOKEN}


def test_the_peak_is_sampled_only_when_told_a_pass_committed():
    cache = ChunkKVCache(FULL_PRECISION, 1)
    books = LoopCaches({"main": [cache]}, chunks=3)
    commit(cache, 8)  # held, never sampled: the window then drops it
    commit(cache, 2)
    books.committed()
    assert books.facts() == {"kv_cache_bytes": 2 * TOKEN}


class Probe:
    def __init__(self) -> None:
        self.told: list[tuple[int, int | None]] = []
        self.wrapped: list[list] = []

    def wrap(self, caches: list) -> list:
        self.wrapped.append(caches)
        return [("probed", c) for c in caches]

    def at(self, chunk: int, step: int | None) -> None:
        self.told.append((chunk, step))


class Switch:
    commit = False


def test_commit_pass_tells_the_probe_switches_the_context_and_samples_after():
    main, side = [ChunkKVCache(FULL_PRECISION, 2)], [ChunkKVCache(FULL_PRECISION, 2)]
    probe, switch, seen = Probe(), Switch(), []
    books = LoopCaches(
        {"main": main, "side": side},
        chunks=2,
        probe=probe,
        progress=lambda done, total: seen.append((done, total)),
        probed=["main"],
    )
    assert books.layers() == [("probed", main[0])] and books.layers("side") == side
    assert probe.wrapped == [main]
    books.at(0, 3)
    with books.commit_pass(0, switch):
        assert switch.commit
        commit(main[0], 3)
        assert books.peak.total == 0  # not sampled inside the pass
    assert not switch.commit and books.peak.total == 3 * TOKEN
    books.chunk_done(1)
    with pytest.raises(RuntimeError), books.commit_pass(1, switch):
        commit(side[0], 5)
        raise RuntimeError("the forward failed")
    assert not switch.commit and books.peak.total == 3 * TOKEN  # a failed pass is not counted
    assert probe.told == [(0, 3), (0, None), (1, None)] and seen == [(1, 2)]


def test_facts_fields_views_and_split():
    cache = ChunkKVCache(FULL_PRECISION, 1)
    plain = LoopCaches({"main": [cache]}, chunks=1)
    assert plain.facts() == {"kv_cache_bytes": 0}
    viewed = LoopCaches({"main": [cache]}, chunks=1, views=True)
    assert viewed.facts() == {"kv_cache_bytes": 0, "kv_view_bytes": 0}
    commit(cache, 3)
    viewed.committed()
    cache.attend(torch.randn(B, H, 2, D), *(torch.randn(B, H, 2, D) for _ in range(2)), 0.5)
    viewed.measure_views()
    facts = viewed.facts(split="kv_cache_bytes_by_cache")
    assert facts == {
        "kv_cache_bytes": 3 * TOKEN,
        "kv_view_bytes": cache.working_nbytes,
        "kv_cache_bytes_by_cache": {"main": 3 * TOKEN},
    }
    assert cache.working_nbytes == 3 * TOKEN  # the dequantized window: keys and values


def test_build_makes_one_probed_stack_per_branch():
    probe = Probe()
    books = LoopCaches.build(
        KVSpec.build("rtn", bits=2),
        3,
        model="test",
        heads={"layers": 2, "kv_heads": H, "frame_tokens": 4},
        chunks=1,
        probe=probe,
        branches=("cond", "uncond"),
    )
    assert list(books.parts) == ["cond", "uncond"] and len(books.caches) == 4
    assert [c.layer for c in books.parts["uncond"]] == [0, 1]
    assert books.parts["cond"][0] is not books.parts["uncond"][0]
    assert [len(w) for w in probe.wrapped] == [2, 2]
    assert all(c.window == 3 and c.spec.quantized for c in books.caches)


def test_by_head_splits_the_peak_by_class_and_counts_unpruned_caches(tmp_path):
    doc = {"format": FORMAT, "rule": "forcing-kv", "model": "test", "threshold": 0.8}
    layers = [{"heads": ["static", "dynamic"]}, {"heads": ["dynamic", "static"]}]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc | {"layers": layers}))
    spec = KVSpec.build(pruner=ForcingKV(profile=str(path)))
    pruned = LoopCaches.build(
        spec, None, model="test", heads={"layers": 2, "kv_heads": H, "frame_tokens": 6}, chunks=4
    )
    action = ChunkKVCache(FULL_PRECISION, 1)
    books = LoopCaches({"main": pruned.caches, "action": [action]}, chunks=4)
    for c in range(4):
        for i, cache in enumerate(pruned.caches):
            commit(cache, 3 * 6, seed=10 * c + i)
        commit(action, 2, seed=c)
        books.committed()
    facts = books.facts()
    split = facts["kv_cache_bytes_by_head"]
    assert split == bytes_by_kind(books.caches) and {"static", "dynamic"} <= set(split)
    assert sum(split.values()) == facts["kv_cache_bytes"] == sum(c.nbytes for c in books.caches)
    assert split[UNPRUNED] >= action.nbytes == 2 * TOKEN
    assert bytes_by_kind([action]) == {}  # no cache prunes: no split
