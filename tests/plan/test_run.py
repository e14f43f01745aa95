"""A model's plan on the embedded model: what the plan predicts for the stored cache is what a
real CPU run records, its split adds up, the phases run in order, and the budgets."""

from __future__ import annotations

import pytest

from jbkv_cli.kvcache import FULL_PRECISION, KVSpec
from jbkv_cli.models.cases import Case
from jbkv_cli.models.registry import load_model
from jbkv_cli.plan.budget import RESERVE, Budget, GiB
from jbkv_cli.plan.run import plan_model

pytestmark = pytest.mark.slow  # a model end to end, twice per variant (docs/testing.md)

PROMPT = "a red circle moves right on a dark background"
OPTIONS = {"num_chunks": 3}
SPECS = [FULL_PRECISION, KVSpec.build("rtn", 2), KVSpec.build("quarot", 2, correction="taylor")]


@pytest.fixture(scope="module")
def plan():
    return plan_model("tiny", OPTIONS, SPECS, Case(PROMPT), budgets=[Budget("1GiB", GiB)])


@pytest.fixture(scope="module")
def recorded() -> list[int]:
    """``kv_cache_bytes`` of a real CPU run of each variant, same settings."""
    model = load_model("tiny", **OPTIONS, device="cpu")
    return [model.generate(PROMPT, 0, spec).kv_cache_bytes for spec in SPECS]


def test_the_cache_a_run_records(plan, recorded):
    assert [v.kv_cache_bytes for v in plan.variants] == recorded
    # what the device holds under "cache" after the commits: the stored codes and steps, exactly
    assert plan.variants[1].stored == recorded[1]
    # and QuaRot's random signs, which its first commit copies to the device once and jbkv
    # keeps there for every layer (one float32 per channel of the head dim, 64)
    assert plan.variants[2].stored == recorded[2] + 64 * 4
    # a 16-bit cache keeps compact copies of the model's K/V views: their own bytes, no more
    assert plan.variants[0].stored == recorded[0]


def test_the_peak_is_its_split_and_its_largest_phase(plan):
    for v in plan.variants:
        p = v.peak
        assert p.total == sum(p.weights.values()) + p.cache + p.attention + p.activations
        assert p.total == max(s.total for _, s in v.phases)
        assert [n for n, _ in v.phases] == ["setup", "chunk 1", "chunk 2", "chunk 3", "decode"]
        assert p.weights == {"model": plan.components["model"]}  # the DiT, float32


def test_int2_needs_less_than_the_16_bit_cache(plan):
    ref, int2, _ = plan.variants
    assert int2.peak.cache < ref.peak.cache
    assert int2.peak.total < ref.peak.total


def test_budgets_fit_and_the_longest_video(plan):
    for v in plan.variants:
        assert v.fits == {"1GiB": v.peak.total + RESERVE <= GiB}
        g = v.growth
        assert (g.n1, g.n2) == (3, 4)  # the second length: one chunk more
        assert v.longest["1GiB"] == g.longest(Budget("1GiB", GiB))


def test_the_peak_does_not_depend_on_the_steps():
    """Every denoising step runs forwards of the same shapes: one step plans the same peak."""
    specs = [KVSpec.build("rtn", 2, correction="taylor")]
    plans = [plan_model("tiny", {"num_chunks": 2, "steps": s}, specs, Case(PROMPT)) for s in (1, 4)]
    assert plans[0].variants[0].peak == plans[1].variants[0].peak


def test_the_longest_video_grows_with_the_loop_not_with_setup():
    """MAGI-1's shape: setup (its encoders) is the peak at both lengths while the loop grows:
    the longest video follows the loop's growth, and is 0 where setup itself does not fit."""
    from jbkv_cli.plan.run import Split, VariantPlan, _with_budgets

    def plan(loop: int) -> VariantPlan:
        setup, chunk = Split(18 * GiB, {}, 0, 0, 0), Split(loop, {}, 0, 0, 0)
        return VariantPlan("v", "v", setup, [("setup", setup), ("chunk 0", chunk)], 0, 0, 0.0)

    budgets = [Budget("24", 24 * GiB), Budget("18", 18 * GiB)]
    out = _with_budgets(
        plan(10 * GiB), plan(12 * GiB), {"num_chunks": 4}, {"num_chunks": 5}, budgets
    )
    assert out.growth.per_chunk == 2 * GiB
    assert out.longest == {"24": 4 + (23 - 10) // 2, "18": 0}
