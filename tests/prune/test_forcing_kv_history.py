"""Forcing-KV-history (jbkv's earlier pruner, ``forcing-kv-history``) on hand-built keys: which
tokens each head keeps, and when; its ids are those the runs of the earlier ``forcing-kv`` got."""

import pytest
import torch

from jbkv_cli.kvcache import KVSpec
from jbkv_cli.prune import ForcingKVHistory, build_pruner
from jbkv_cli.prune import ForcingKVHistoryLayer as ForcingKVLayer
from jbkv_cli.prune.forcing_kv_history import changed_segments, segment_ids, segment_means

T, D = 8, 16  # tokens per frame, head dim


def _frames(*values: torch.Tensor) -> torch.Tensor:
    """``[1, H, F·T, D]`` keys from per-frame ``[H, T, D]`` tensors."""
    return torch.cat(values, dim=-2)[None]


def _base(heads: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(heads, T, D, generator=g)


def test_segments_are_runs_of_consecutive_tokens():
    assert segment_ids(8, 4).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert segment_ids(10, 4).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="segments"):
        segment_ids(8, 9)
    k = torch.arange(2 * 8, dtype=torch.float32).reshape(1, 16, 1).expand(1, 16, 2)
    means = segment_means(k, segment_ids(8, 2))  # 2 frames x 2 segments
    assert means[..., 0].tolist() == [[[1.5, 5.5], [9.5, 13.5]]]


def test_changed_segments_keep_the_least_similar_ties_first():
    sim = torch.tensor([0.9, 0.1, 0.5, 0.1])
    assert changed_segments(sim, 0.5).tolist() == [False, True, False, True]
    assert changed_segments(sim, 0.25).tolist() == [False, True, False, False]
    assert changed_segments(sim, 0.0).sum() == 0 and changed_segments(sim, 1.0).all()
    assert changed_segments(torch.ones(8), 0.33).sum() == 3  # ⌈0.33 · 8⌉


def test_static_head_keeps_only_the_anchor_frames():
    layer = ForcingKVLayer(("static",), T, anchor_frames=1, segments=4)
    first = layer.commit(0, _frames(_base(1, 0), _base(1, 1), _base(1, 2)))
    # frames 0 and 1 left the anchors inside the chunk: dropped before storing
    assert first.keep[0, 0].tolist() == [False] * 2 * T + [True] * T
    assert first.settled == []
    second = layer.commit(1, _frames(_base(1, 3), _base(1, 4)))
    assert second.keep[0, 0].tolist() == [False] * T + [True] * T
    # the old anchor (chunk 0, frame 2) is distant history now: all of it goes
    [(serial, start, keep)] = second.settled
    assert (serial, start) == (0, 2 * T) and not keep.any()


def test_wider_anchor_spans_chunks():
    layer = ForcingKVLayer(("static",), T, anchor_frames=3, segments=4)
    first = layer.commit(0, _frames(_base(1, 0), _base(1, 1)))
    assert first.keep.all()
    second = layer.commit(1, _frames(_base(1, 2), _base(1, 3)))
    assert second.keep.all()
    [(serial, start, keep)] = second.settled
    assert (serial, start) == (0, 0) and not keep.any()


def test_dynamic_head_keeps_what_changes_and_drops_what_the_next_frame_repeats():
    heads = 2  # head 0 static, head 1 dynamic
    frame0 = _base(heads, 0)
    frame1 = frame0.clone()
    frame1[:, 2:4] = _base(heads, 1)[:, 2:4]  # segment 1 (of 4) changes between frames 0 and 1
    frame2 = frame1.clone()
    frame2[:, 6:8] = _base(heads, 2)[:, 6:8]  # then segment 3
    layer = ForcingKVLayer(("static", "dynamic"), T, anchor_frames=1, segments=4, retention=0.25)
    decision = layer.commit(0, _frames(frame0, frame1, frame2))
    seg = torch.arange(T) // 2
    assert decision.keep[0, 1, :T].tolist() == (seg == 1).tolist()  # frame 0: what frame 1 changed
    assert decision.keep[0, 1, T : 2 * T].tolist() == (seg == 3).tolist()
    assert decision.keep[0, 1, 2 * T :].all()  # the anchor
    assert not decision.keep[0, 0, : 2 * T].any() and decision.keep[0, 0, 2 * T :].all()
    # the anchor is decided against the first frame of the next chunk (segment 0 changes)
    frame3 = frame2.clone()
    frame3[:, 0:2] = _base(heads, 3)[:, 0:2]
    later = layer.commit(1, _frames(frame3))
    [(serial, start, keep)] = later.settled
    assert (serial, start) == (0, 2 * T)
    assert keep[0, 1].tolist() == (seg == 0).tolist() and not keep[0, 0].any()


def test_decisions_use_segment_means_of_each_batch_element():
    layer = ForcingKVLayer(("dynamic",), T, anchor_frames=1, segments=2, retention=0.5)
    a = _base(1, 0)
    b = a.clone()
    b[:, :4] += 3.0  # first half changes in batch element 0
    c = a.clone()
    c[:, 4:] -= 3.0  # second half in batch element 1
    keys = torch.stack([torch.cat([a, b], -2), torch.cat([a, c], -2)])  # [2, 1, 2T, D]
    keep = layer.commit(0, keys).keep
    assert keep[0, 0, :T].tolist() == [True] * 4 + [False] * 4
    assert keep[1, 0, :T].tolist() == [False] * 4 + [True] * 4


def test_forget_drops_pending_state_and_its_bytes():
    layer = ForcingKVLayer(("dynamic",), T, anchor_frames=1, segments=4)
    layer.commit(0, _frames(_base(1, 0), _base(1, 1)))
    assert layer.nbytes_by_kind() == {"dynamic": 4 * D * 4}  # one anchor frame's segment means
    layer.forget({0})
    assert layer.nbytes_by_kind() == {}


def test_chunk_must_be_whole_frames_and_match_the_profile():
    layer = ForcingKVLayer(("static", "dynamic"), T, anchor_frames=1)
    with pytest.raises(ValueError, match="whole frames"):
        layer.commit(0, torch.randn(1, 2, T + 1, D))
    with pytest.raises(ValueError, match="KV heads"):
        layer.commit(0, torch.randn(1, 3, T, D))


def test_pruner_options_ids_and_labels():
    assert ForcingKVHistory().variant_id == "fkv"
    assert ForcingKVHistory().label == "Forcing-KV-history"
    p = build_pruner("forcing-kv-history", anchor_frames=2, segments=4, retention=0.5)
    assert p.variant_id == "fkv-a2-s4-r50"
    for bad in ({"anchor_frames": 0}, {"segments": 0}, {"retention": 1.5}):
        with pytest.raises(ValueError):
            ForcingKVHistory(**bad)
    with pytest.raises(ValueError, match="does not take"):
        build_pruner("forcing-kv-history", window=3)
    with pytest.raises(ValueError, match="unknown pruner"):
        build_pruner("snapkv")


def test_kvspec_with_a_pruner():
    fkv = ForcingKVHistory()
    pruned16 = KVSpec(pruner=fkv)
    assert not pruned16.is_reference and not pruned16.quantized
    assert (pruned16.label, pruned16.variant_id, pruned16.storage_id) == (
        "16-bit Forcing-KV-history",
        "fkv",
        "fkv",
    )
    spec = KVSpec.build("rtn", 2, correction="taylor", pruner=fkv)
    assert spec.label == "INT2 rtn g32 Forcing-KV-history +taylor"
    assert spec.variant_id == "int2-rtn-g32-fkv-taylor" and spec.storage_id == "int2-rtn-g32-fkv"
    for s in (pruned16, spec):
        assert KVSpec.from_dict(s.to_dict()) == s
    plain = KVSpec.build("rtn", 2, correction="taylor")
    assert "pruner" not in plain.to_dict() and plain.variant_id == "int2-rtn-g32-taylor"
    order = sorted([spec, pruned16, plain, KVSpec()], key=KVSpec.sort_key)
    assert order == [KVSpec(), plain, pruned16, spec]
    with pytest.raises(ValueError, match="bias-only"):
        KVSpec.build("rtn", 2, bias_only=True, pruner=fkv)
    with pytest.raises(ValueError, match="needs a key method"):
        KVSpec(correction="taylor", pruner=fkv)
