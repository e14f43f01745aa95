"""The pipelined schedule: upstream's examples and hand-checked KV-range tables."""

import pytest
import torch

from jbkv_cli.models.magi1.config import VARIANTS, ScheduleConfig
from jbkv_cli.models.magi1.schedule import (
    cfg_scales,
    distill_dt,
    generate_sequences,
    init_t,
    plan_forwards,
    required_window,
)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (  # Example 1: chunk_num=8, window_size=8
            (8, 8, 0),
            (
                [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7],
                [1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8],
                [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7],
                [1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 8, 8, 8, 8],
            ),
        ),
        (  # Example 2: chunk_num=8, window_size=4
            (8, 4, 0),
            (
                [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7],
                [1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8],
                [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3],
                [1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4],
            ),
        ),
        (  # Example 3: chunk_num=8, window_size=4, chunk_offset=2
            (8, 4, 2),
            (
                [2, 2, 2, 2, 3, 4, 5, 6, 7],
                [3, 4, 5, 6, 7, 8, 8, 8, 8],
                [0, 0, 0, 0, 0, 0, 1, 2, 3],
                [1, 2, 3, 4, 4, 4, 4, 4, 4],
            ),
        ),
        (  # Example 4: chunk_num=8, window_size=1
            (8, 1, 0),
            (
                [0, 1, 2, 3, 4, 5, 6, 7],
                [1, 2, 3, 4, 5, 6, 7, 8],
                [0, 0, 0, 0, 0, 0, 0, 0],
                [1, 1, 1, 1, 1, 1, 1, 1],
            ),
        ),
    ],
)
def test_upstream_examples(args, expected):
    assert generate_sequences(*args) == expected


def test_init_t():
    t = init_t(2)
    assert t.dtype == torch.float32
    # u = 0.5 -> x = 0.25 -> (x/3) / (1 - 2x/3) = 0.1
    torch.testing.assert_close(t, torch.tensor([0.0, 0.1, 1.0]))
    t16 = init_t(16)
    assert len(t16) == 17 and bool((t16.diff() > 0).all())


def test_distill_dt():
    assert distill_dt(16, 1.0) == 8.0
    assert distill_dt(64, 1.0) == 32.0
    assert distill_dt(12, 2.0) == 4.0


# Hand-derived: 4 chunks, window 4, 16 steps (4 per stage), kv ranges 5,4,3,2 by the chunk's
# own stage, 1 for the refresh chunk. (stage, first forward of stage?) -> absolute chunk ranges.
HAND_TABLE_4_CHUNKS = {
    (0, True): (0, [(0, 1)]),
    (1, True): (0, [(0, 1), (0, 2)]),
    (2, True): (0, [(0, 1), (0, 2), (0, 3)]),
    (3, True): (0, [(0, 1), (0, 2), (0, 3), (0, 4)]),
    (4, True): (0, [(0, 1), (0, 2), (0, 3), (0, 4)]),  # refresh chunk 0 + chunks 1..3
    (4, False): (1, [(0, 2), (0, 3), (0, 4)]),  # chunk 0 now read from the cache
    (5, True): (1, [(1, 2), (1, 3), (1, 4)]),  # refresh chunk 1
    (5, False): (2, [(1, 3), (1, 4)]),
    (6, True): (2, [(2, 3), (2, 4)]),  # refresh chunk 2
    (6, False): (3, [(2, 4)]),
}


def test_kv_range_table_distill():
    sched = VARIANTS["4.5B_distill"].schedule
    plans = plan_forwards(4, sched)
    assert len(plans) == 4 * 7
    for p in plans:
        first = p.denoise_idx == 0
        key = (p.stage, first or p.stage < 4)
        slice_point, ranges = HAND_TABLE_4_CHUNKS[key]
        assert p.slice_point == slice_point, p
        assert [p.kv_range(j) for j in range(p.num_forward_chunks)] == ranges, p
        assert p.refresh == (first and p.stage >= 4)
    # steady state reads exactly one finished chunk from the cache
    assert required_window(4, sched) == 1
    assert required_window(12, sched) == 1


def test_kv_range_table_long_video():
    sched = VARIANTS["4.5B_distill"].schedule
    plans = plan_forwards(8, sched)
    steady = [p for p in plans if p.stage == 7 and p.denoise_idx == 1]
    assert len(steady) == 1
    p = steady[0]
    assert (p.chunk_start, p.chunk_end, p.slice_point) == (4, 8, 4)
    assert [p.kv_range(j) for j in range(4)] == [(3, 5), (3, 6), (3, 7), (3, 8)]
    assert [p.num_cached(j) for j in range(4)] == [1, 1, 1, 1]


def test_window_cap_limits_cached_chunks_only():
    sched = ScheduleConfig(num_steps=8, window_size=2, noise2clean_kvrange=(4, 4))
    full = plan_forwards(5, sched)
    capped = plan_forwards(5, sched, max_cached=1)
    for a, b in zip(full, capped, strict=True):
        for j in range(a.num_forward_chunks):
            assert b.num_cached(j) == min(a.num_cached(j), 1)
            assert b.kv_range(j)[1] == a.kv_range(j)[1]
            assert b.first_current(j) == a.first_current(j)


def test_cfg_scales_buckets():
    sched = VARIANTS["4.5B_base"].schedule
    assert cfg_scales(0.0, sched) == (1.5, 7.5)
    assert cfg_scales(0.05, sched) == (1.5, 7.5)
    assert cfg_scales(0.35, sched) == (1.0, 0.0)
    assert cfg_scales(0.9999, sched) == (1.0, 0.0)
