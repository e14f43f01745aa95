"""The tracker counts what a hand computation says: fresh storages under the open label, views
and in-place results nothing, freed storages back out, the peak and its split, periods."""

from __future__ import annotations

import gc

import torch

from jbkv_cli.plan.tracker import OTHER, MemoryTracker
from jbkv_cli.utils.fake_cuda import FakeCuda


def test_fresh_storages_under_their_label_and_the_peak_split():
    with FakeCuda(), MemoryTracker() as tracker:
        with tracker.label("cache"):
            k = torch.empty(4, 8, device="cuda")  # 4·8·4 = 128 bytes
        y = torch.empty(16, device="cuda", dtype=torch.bfloat16)  # 16·2 = 32 bytes
        assert tracker.live == {"cache": 128, OTHER: 32}
        view, same = k.view(32), k.add_(1)  # a view and an in-place result: nothing new
        assert tracker.total == 160
        z = k * 2  # 128 bytes more
        assert tracker.total == 288
        del k, view, same
        gc.collect()
        assert "cache" not in tracker.live  # the storage died with its last tensor
        del z, y
        gc.collect()
        assert tracker.total == 0
        assert tracker.peak.total == 288
        assert tracker.peak.by_label == {"cache": 128, OTHER: 160}


def test_host_and_meta_tensors_are_not_device_memory():
    with FakeCuda(), MemoryTracker() as tracker:
        host = torch.ones(1000)
        meta = torch.empty(1000, device="meta")
        assert tracker.total == 0
        moved = host.to("cuda")  # 4,000 bytes on the device
        assert tracker.total == 4000
        del meta, moved


def test_periods_keep_their_own_peak_and_a_repeated_name_extends_one():
    with FakeCuda(), MemoryTracker() as tracker:
        a = torch.empty(100, device="cuda", dtype=torch.uint8)
        del a
        gc.collect()
        first = tracker.mark("chunk 1")  # peak 100, nothing live after it
        b = torch.empty(30, device="cuda", dtype=torch.uint8)
        tracker.mark("chunk 2")
        c = torch.empty(50, device="cuda", dtype=torch.uint8)
        tracker.mark("chunk 2")  # the same chunk again: the higher of the two stays
        assert first.total == 100
        assert [(n, p.total) for n, p in tracker.periods] == [("chunk 1", 100), ("chunk 2", 80)]
        del b, c


def test_adopt_counts_existing_tensors_and_relabel_moves_them():
    with FakeCuda():
        w = torch.empty(10, device="cuda")  # made before the tracker: not seen
        with MemoryTracker() as tracker:
            assert tracker.total == 0
            tracker.adopt([w, w.view(2, 5)], "weights:dit")  # one storage, once
            assert tracker.live == {"weights:dit": 40}
            x = torch.empty(5, device="cuda")
            tracker.relabel([x], "cache")
            assert tracker.live == {"weights:dit": 40, "cache": 20}
            tracker.reset_peak()
            assert tracker.peak.total == 60
