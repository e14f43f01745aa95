"""The stored cache the plan predicts is what a real CPU run of the embedded model holds: the
16-bit reference, INT4 and INT2, with and without the taylor correction (the peak of the
caches' bytes over the run, ``kv_cache_bytes``, byte for byte)."""

from __future__ import annotations

import pytest

from jbkv_cli.kvcache import FULL_PRECISION, KVSpec
from jbkv_cli.models.cases import Case
from jbkv_cli.models.registry import load_model
from jbkv_cli.plan.run import plan_model

pytestmark = pytest.mark.slow  # five plans and five runs of the embedded model (about a minute)

PROMPT = "a red circle moves right on a dark background"
OPTIONS = {"num_chunks": 3, "steps": 1}  # the window (2) fills and slides; one step: same bytes
SPECS = [
    FULL_PRECISION,
    KVSpec.build("rtn", 4),
    KVSpec.build("rtn", 4, correction="taylor"),
    KVSpec.build("rtn", 2),
    KVSpec.build("rtn", 2, correction="taylor"),
]


@pytest.fixture(scope="module")
def plan():
    return plan_model("tiny", OPTIONS, SPECS, Case(PROMPT))


@pytest.fixture(scope="module")
def recorded() -> list[int]:
    """``kv_cache_bytes`` of a real CPU run of each variant, same settings."""
    model = load_model("tiny", **OPTIONS, device="cpu")
    return [model.generate(PROMPT, 0, spec).kv_cache_bytes for spec in SPECS]


def test_the_plans_stored_cache_is_a_real_runs(plan, recorded):
    """What the fake device holds under ``cache`` after the commits (storages, as a GPU holds
    them) equals what the real run's caches count: a 16-bit cache keeps compact copies, not
    views of the model's fused QKV projection (which would hold Q and K beside V)."""
    assert [v.stored for v in plan.variants] == recorded
    assert [v.kv_cache_bytes for v in plan.variants] == recorded
    ref, int4, _, int2, _ = recorded
    assert int2 < int4 < ref
    # the reference: K and V of the window's 2 chunks in 4 layers, each [1, 2 heads, 256 tokens,
    # 64 channels] in float32 (the tiny model's dtype on a GPU too): 2 MiB
    assert ref == 4 * 2 * 2 * (2 * 256 * 64 * 4)
