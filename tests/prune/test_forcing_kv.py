"""Forcing-KV as its official code runs it, on hand-built keys: which tokens each (layer, head)
keeps after each chunk, the shared selection, the constant budget, the options and ids."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch

from jbkv_cli.kvcache import KVSpec, layer_caches
from jbkv_cli.prune import ForcingKV, ForcingKVHistory, build_pruner
from jbkv_cli.prune.forcing_kv import (
    deciding_layer,
    default_patches,
    kept_patches,
    least_similar,
    patch_scores,
)
from jbkv_cli.prune.profile import FORMAT

T, D, C = 6, 4, 3  # tokens per frame, head dim, frames per chunk (Self-Forcing's)


def profile(tmp_path, heads: list[list[str]], model: str = "test") -> str:
    doc = {"format": FORMAT, "rule": "forcing-kv", "model": model, "threshold": 0.8}
    path = tmp_path / f"{model}-{len(heads)}.json"
    path.write_text(json.dumps(doc | {"layers": [{"heads": h} for h in heads]}))
    return str(path)


def stack(tmp_path, heads, spec_kw=None, **options):
    pruner = ForcingKV(profile=profile(tmp_path, heads), **options)
    spec = KVSpec.build(pruner=pruner, **(spec_kw or {}))
    return layer_caches(spec, None, model="test", layers=len(heads), kv_heads=2, frame_tokens=T)


def kept(cache) -> dict[int, set[int]]:
    """Per KV head, the absolute token positions the cache holds (batch 0)."""
    out: dict[int, set[int]] = defaultdict(set)
    for chunk in cache.chunks:
        mask = chunk.pruned.kept[0]
        for h in range(mask.shape[0]):
            out[h] |= {chunk.serial * chunk.length + int(i) for i in mask[h].nonzero()}
    return dict(out)


def frames(*numbers: int) -> set[int]:
    return {f * T + t for f in numbers for t in range(T)}


def tokens(pairs: dict[int, list[int]]) -> set[int]:
    return {f * T + t for f, ts in pairs.items() for t in ts}


# --- the pure rules ---------------------------------------------------------------------------


def test_geometry_defaults_and_the_kept_count():
    assert default_patches(1560) == 6  # Self-Forcing 480x832: 260-token runs
    assert default_patches(64) == 8 and default_patches(4) == 4  # embedded, tiny random
    assert default_patches(2040) == 6 and default_patches(7) == 7
    assert kept_patches(18, 0.33) == 6  # upstream: round(3 * 6 * 0.33)
    assert kept_patches(32, 0.33) == 11 and kept_patches(18, 0.0) == 0
    assert kept_patches(18, 1.0) == 18


def test_patch_score_is_the_mean_per_token_cosine_of_co_located_tokens():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])  # 4 tokens, X = 2
    b = torch.tensor([[1.0, 0.0], [0.0, -1.0], [1.0, 0.0], [0.0, 3.0]])
    scores = patch_scores(torch.stack([a, b]), patches=2)  # runs of 2 tokens
    half = 2**-0.5
    torch.testing.assert_close(scores, torch.tensor([[(1 - 1) / 2, (half + 0) / 2]]))
    # not the cosine of the patch means (jbkv's earlier rule): that would be 1 for patch 0
    assert least_similar(torch.tensor([[0.5, 0.1], [0.1, 0.9]]), 2) == [1, 2]  # tie: earlier
    assert least_similar(torch.tensor([[0.3, 0.2, 0.1]]), 0) == []


def test_deciding_layer_is_layer_one_else_the_next_with_a_dynamic_head():
    assert deciding_layer((("dynamic",), ("static",), ("dynamic",))) == 2
    assert deciding_layer((("static",), ("dynamic",), ("dynamic",))) == 1
    assert deciding_layer((("dynamic",), ("static",))) is None


# --- the schedule on hand-built keys ------------------------------------------------------------


def _keys(layer: int, chunk: int, changed: dict[int, list[int]]) -> torch.Tensor:
    """``[1, 2, C·T, D]``: every frame repeats one base frame, except tokens ``changed[frame]``
    (absolute frame numbers), which are negated (cosine −1 with their neighbours). Layer 2 gets
    fresh random keys per frame instead, so its own similarities would pick other patches."""
    g = torch.Generator().manual_seed(layer)
    base = torch.randn(2, T, D, generator=g) + 3.0
    out = []
    for f in range(chunk * C, (chunk + 1) * C):
        x = base.clone()
        if layer == 2:
            x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(100 + f))
        for t in changed.get(f, []):
            x[:, t] = -x[:, t]
        out.append(x)
    return torch.cat(out, 1)[None]


def _run(caches, chunks: int, changed) -> list[list[dict[int, set[int]]]]:
    """Commit ``chunks`` chunks layer by layer (as a model's clean pass); kept after each."""
    history = []
    for s in range(chunks):
        for i, cache in enumerate(caches):
            k = _keys(i, s, changed)
            cache.commit(k, torch.randn_like(k))
        history.append([kept(c) for c in caches])
    return history


def test_upstream_schedule_sink_ring_and_overwritten_buffer(tmp_path):
    heads = [["static", "dynamic"], ["static", "dynamic"], ["dynamic", "static"]]
    caches = stack(tmp_path, heads)
    changed = {6: [0, 2], 7: [4]}  # frame 6 tokens 0, 2 and frame 7 token 4 change
    after = _run(caches, 4, changed)
    # chunk 0 (before the split): sink frame 0 + the last H = 1 frame after it, every head
    for layer in after[0]:
        assert layer == {0: frames(0, 2), 1: frames(0, 2)}
    # chunk 1 = ar_start: the split, no buffer yet; layer 0 keeps sink + 1 frame for good
    for layer in after[1]:
        assert layer == {0: frames(0, 5), 1: frames(0, 5)}
    # chunk 2: candidates frames 5, 6, 7 (boundary 8), 18 one-token patches, the 6 least
    # similar: 5:{0,2} (vs 6), 6:{0,2,4} (vs 7), 7:{4} (vs 8), decided at layer 1 from its
    # dynamic head and applied to layer 2's dynamic head (head 0) too
    buffer = tokens({5: [0, 2], 6: [0, 2, 4], 7: [4]})
    layer0, layer1, layer2 = after[2]
    assert layer0 == {0: frames(0, 8), 1: frames(0, 8)}
    assert layer1 == {0: frames(0, 8), 1: frames(0, 8) | buffer}
    assert layer2 == {0: frames(0, 8) | buffer, 1: frames(0, 8)}
    # chunk 3: the buffer is overwritten from frames 8, 9, 10: nothing of 5..7 is left
    for layer in after[3][1:]:
        dynamic = next(v for v in layer.values() if len(v) > 2 * T)
        assert len(dynamic) == 3 * T and dynamic & frames(5, 6, 7) == set()
        assert dynamic >= frames(0, 11) and len(dynamic & frames(8, 9, 10)) == T


def test_a_layer_one_without_dynamic_heads_hands_the_choice_to_the_next(tmp_path):
    heads = [["dynamic", "dynamic"], ["static", "static"], ["static", "dynamic"]]
    changed = {6: [1, 3], 7: [5, 0]}
    caches = stack(tmp_path, heads)
    _, layer1, layer2 = _run(caches, 3, changed)[2]
    assert layer1 == {0: frames(0, 8), 1: frames(0, 8)}
    # layer 2 decides from its own (random) keys: 6 one-token patches of frames 5..7
    assert len(layer2[1] - frames(0, 8)) == 6 and layer2[1] - frames(0, 8) <= frames(5, 6, 7)


def test_bytes_are_constant_once_the_ring_fills(tmp_path):
    heads = [["static", "dynamic"], ["static", "dynamic"], ["dynamic", "static"]]
    for spec_kw in ({}, {"quantizer": "rtn", "bits": 2, "group_size": 4}):
        caches = stack(tmp_path, heads, spec_kw)
        g = torch.Generator().manual_seed(0)
        held = []
        for _ in range(8):
            for cache in caches:
                k = torch.randn(1, 2, C * T, D, generator=g)
                cache.commit(k, torch.randn(k.shape, generator=g))
            held.append(sum(c.nbytes for c in caches))
        # chunks 0 and 1 hold sink + 1 frame per head (and the deciding layer its ring keys);
        # then the buffer is added, and stays
        assert held[1] == held[0] < held[2]
        assert len(set(held[2:])) == 1, held  # flat from the first buffer on


def test_the_deciding_layer_holds_its_ring_keys_as_dynamic_bytes(tmp_path):
    heads = [["static", "dynamic"], ["static", "dynamic"], ["dynamic", "static"]]
    caches = stack(tmp_path, heads)
    _run(caches, 3, {})
    assert caches[0].nbytes_by_kind() == {"unsplit": 2 * 2 * (2 * T * D) * 4 + 2 * 2 * 2 * T}
    ring = T * D * 4  # one frame x one dynamic head, float32, batch 0
    assert caches[1].pruning.nbytes_by_kind() == {"dynamic": ring}
    assert caches[2].pruning.nbytes_by_kind() == {}


def test_bigger_rings_a_later_split_and_no_sink(tmp_path):
    heads = [["static", "dynamic"], ["static", "dynamic"]]
    caches = stack(
        tmp_path,
        heads,
        sink_size=0,
        spatial_context_length=2,
        temporal_context_length=3,
        ar_start=2,
        sim_retention_ratio=0.5,
    )
    after = _run(caches, 4, {})
    assert after[0][1] == {0: frames(0, 1, 2), 1: frames(0, 1, 2)}  # H = 3 frames, no sink
    assert after[2][1] == {0: frames(7, 8), 1: frames(6, 7, 8)}  # the split at chunk 2
    static, dynamic = after[3][1][0], after[3][1][1]
    assert static == frames(10, 11)
    # candidates: the old ring 6, 7, 8 (boundary 9); half of their 18 patches in the buffer
    assert dynamic - frames(9, 10, 11) <= frames(6, 7, 8)
    assert len(dynamic - frames(9, 10, 11)) == 9


def test_two_frame_chunks_with_a_three_frame_ring(tmp_path):
    """``temporal_context_length`` above the chunk's frames: the ring spans chunks and the
    candidates are its oldest ``C`` frames (what leaves it)."""
    heads = [["static", "dynamic"], ["static", "dynamic"]]
    caches = stack(tmp_path, heads, temporal_context_length=3, ar_start=1)
    g = torch.Generator().manual_seed(0)
    for s in range(5):
        for cache in caches:
            k = torch.randn(1, 2, 2 * T, D, generator=g)  # 2 frames per chunk
            cache.commit(k, torch.randn(k.shape, generator=g))
        if s == 1:  # the split: dynamic ring = frames 1..3 (2 chunks), static ring = frame 3
            assert kept(caches[1]) == {0: frames(0, 3), 1: frames(0, 1, 2, 3)}
    # chunk 4 (frames 8, 9): the old ring 5, 6, 7 + the new frames; frames 5 and 6 leave it
    # (scored against 6 and 7); the ring is 7, 8, 9 now
    dynamic = kept(caches[1])[1]
    buffer = dynamic - frames(0, 7, 8, 9)
    assert buffer <= frames(5, 6) and len(buffer) == kept_patches(2 * 6, 0.33)


def test_options_ids_and_validation(tmp_path):
    assert ForcingKV().variant_id == "forcingkv" and ForcingKV().label == "Forcing-KV"
    p = build_pruner("forcing-kv", sink_size=2, ar_start=2, sim_retention_ratio=0.5)
    assert p.variant_id == "forcingkv-sink2-ar2-r50" and p.label == "Forcing-KV sink2 ar2 r50"
    for bad in ({"temporal_context_length": 4}, {"sim_retention_ratio": 1.5}, {"ar_start": -1}):
        with pytest.raises(ValueError, match="forcing-kv"):
            ForcingKV(**bad)
    with pytest.raises(ValueError, match="segments"):
        build_pruner("forcing-kv", segments=8)  # the earlier pruner's option, not this one's
    path = profile(tmp_path, [["static", "dynamic"]] * 2)
    with pytest.raises(ValueError, match="num_frame_patch=4 does not divide a frame's 6"):
        ForcingKV(profile=path, num_frame_patch=4).plans("test", 2, 2, T)
    (cache, _) = layer_caches(
        KVSpec(pruner=ForcingKV(profile=path, dynamic_context_length=2)),
        None,
        model="test",
        layers=2,
        kv_heads=2,
        frame_tokens=T,
    )
    with pytest.raises(ValueError, match=r"holds 12 patches .* round\(18 × 0.33\) = 6"):
        cache.commit(torch.randn(1, 2, C * T, D), torch.randn(1, 2, C * T, D))


def test_records_of_the_earlier_forcing_kv_read_as_forcing_kv_history():
    """Run folders written when `forcing-kv` was jbkv's earlier pruner keep their ids."""
    old = {
        "key": None,
        "value": None,
        "correction": "none",
        "sink_chunks": 0,
        "pruner": {
            "name": "forcing-kv",
            "anchor_frames": None,
            "segments": 8,
            "retention": 0.5,
            "profile": None,
            "profile_sha256": None,
        },
    }
    spec = KVSpec.from_dict(old)
    assert isinstance(spec.pruner, ForcingKVHistory) and spec.variant_id == "fkv-r50"
    assert spec.pruner.name == "forcing-kv-history"
    new = KVSpec.build("rtn", 2, pruner=ForcingKV(sink_size=2))
    assert KVSpec.from_dict(new.to_dict()) == new
    assert new.variant_id == "int2-rtn-g32-forcingkv-sink2"
