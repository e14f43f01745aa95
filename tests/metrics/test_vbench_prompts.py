"""The VBench-Long 30% subset against its rule; the loader generate uses."""

import math

import pytest

from jbkv_cli.metrics.vbench_prompts import (
    ceil_fraction,
    first_fraction_subset,
    load_subset_file,
    load_vbench_subset,
)
from jbkv_cli.metrics.vbench_scores import DIMENSIONS
from jbkv_cli.utils.errors import JbkvError


def test_ceil_fraction_is_integer_exact():
    # 0.3 * 85 = 25.5 -> 26 (Python round() would also give 26; 0.3*90 = 27 exactly)
    assert [ceil_fraction(n) for n in (72, 85, 86, 90, 93, 100, 75)] == [22, 26, 26, 27, 28, 30, 23]
    assert all(ceil_fraction(n) == math.ceil(3 * n / 10) for n in range(500))


def test_rule_on_a_small_list():
    full = [
        {"prompt_en": "p0", "dimension": ["a"]},
        {"prompt_en": "p1", "dimension": ["b", "a"]},
        {"prompt_en": "p2", "dimension": ["a"]},
        {"prompt_en": "p3", "dimension": ["b"]},
        {"prompt_en": "p4", "dimension": ["b"]},
        {"prompt_en": "p5", "dimension": ["a"]},
    ]
    # a: 4 entries -> ceil(1.2) = 2 (p0, p1); b: 3 entries -> ceil(0.9) = 1 (p1)
    entries, chosen = first_fraction_subset(full, dimensions=("a", "b"))
    assert [e["prompt_en"] for e in entries] == ["p0", "p1"]
    assert chosen == {"a": [0, 1], "b": [1]}
    assert entries[1]["selected_for"] == ["a", "b"]
    assert entries[1]["dimension"] == ["b", "a"]


def test_shipped_subset_follows_the_rule():
    doc = load_subset_file("vbench-long-30")
    entries = doc["entries"]
    assert doc["source"]["md5"] == "893fde62c4472b74d8da0adcb3281307"  # vbench 0.1.5
    assert len(entries) == doc["num_entries"] == 287
    per_dim = doc["per_dimension"]
    assert set(per_dim) == set(DIMENSIONS)
    for d in DIMENSIONS:
        chosen = [e for e in entries if d in e["selected_for"]]
        assert len(chosen) == ceil_fraction(per_dim[d]["total"]) == per_dim[d]["chosen"]
        # the chosen ones are the first entries of that dimension within the subset
        with_d = [e for e in entries if d in e["dimension"]]
        assert with_d[: len(chosen)] == chosen
        assert all(d in e["dimension"] for e in chosen)
    assert per_dim["temporal_flickering"] == {"total": 75, "chosen": 23}
    assert per_dim["subject_consistency"] == {"total": 72, "chosen": 22}


def test_loader():
    prompts = load_vbench_subset("vbench-long-30")
    assert len(prompts) == 287
    assert len({p.prompt for p in prompts}) == 287
    first = prompts[0]
    prompt, dims, samples = first  # unpacks as a plain tuple
    assert prompt == "In a still frame, a stop sign"
    assert dims == ("temporal_flickering",) and samples == 25
    by_prompt = {p.prompt: p for p in prompts}
    assert by_prompt["a person swimming in ocean"].samples_per_prompt == 5
    assert all("_" not in p.prompt and "/" not in p.prompt for p in prompts)

    smoke = load_vbench_subset("vbench-smoke")
    covered = {d for p in smoke for d in p.dimensions}
    assert covered == set(DIMENSIONS)
    assert all(p.samples_per_prompt == 1 for p in smoke)


def test_unknown_subset():
    with pytest.raises(JbkvError, match="unknown VBench prompt subset"):
        load_vbench_subset("nope")
