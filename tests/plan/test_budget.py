"""Budgets: sizes and GPU names, the fit rule and the longest video, by hand."""

from __future__ import annotations

import pytest

from jbkv_cli.models.limits import MAX_CHUNKS
from jbkv_cli.plan.budget import RESERVE, Budget, GiB, Growth, fits, parse_budget, parse_budgets
from jbkv_cli.utils.errors import UsageError


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("80GiB", 80 * GiB),
        ("24GB", 24 * 10**9),
        ("512 MiB", 512 * 2**20),
        ("1.5TiB", int(1.5 * 2**40)),
        ("H100", 80 * GiB),
        ("rtx-4090", 24 * GiB),
        ("a100-40gb", 40 * GiB),
    ],
)
def test_sizes_and_names(text, size):
    assert parse_budget(text).bytes == size


@pytest.mark.parametrize("text", ["80", "80 apples", "0GiB", "H1000", "", "-5GB"])
def test_anything_else_is_a_usage_error_naming_the_forms(text):
    with pytest.raises(UsageError, match="--gpu-memory must be a size with a unit"):
        parse_budget(text)


def test_a_comma_list_in_order_without_repeats():
    assert [b.name for b in parse_budgets("24GiB, 80GiB,24GiB")] == ["24GiB", "80GiB"]
    with pytest.raises(UsageError, match="empty"):
        parse_budgets(" , ")


def test_fits_keeps_the_reserve():
    budget = Budget("b", 10 * GiB)
    assert fits(10 * GiB - RESERVE, budget)
    assert not fits(10 * GiB - RESERVE + 1, budget)


def test_longest_video_from_two_lengths():
    # 4 chunks: 20 GiB, 5 chunks: 22 GiB -> 2 GiB a chunk; 30 GiB leaves 29 GiB: 8 chunks
    growth = Growth(4, 20 * GiB, 5, 22 * GiB)
    assert growth.per_chunk == 2 * GiB
    assert growth.longest(Budget("30", 30 * GiB)) == 8
    assert growth.longest(Budget("21", 21 * GiB)) == 4  # room 20 GiB: exactly 4 chunks
    assert growth.longest(Budget("8", 8 * GiB)) == 0  # not even one (clamped)


def test_a_peak_that_does_not_grow_fits_any_length():
    flat = Growth(7, 10 * GiB, 8, 10 * GiB)
    assert flat.longest(Budget("80", 80 * GiB)) == MAX_CHUNKS
    assert flat.longest(Budget("8", 8 * GiB)) == 0
    shrinking = Growth(7, 10 * GiB, 8, 9 * GiB)  # a peak that falls counts as flat
    assert shrinking.per_chunk == 0
