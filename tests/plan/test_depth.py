"""The plan from two shortened traces equals the plan that traces every block: on a stack of toy
blocks, and on every model at a reduced config of six blocks (Matrix-Game-2.0: ten, two runs of
five, with the ActionModule and without; every variant, every period; on the embedded model
16-bit and QuaRot + signed (its signs shared by every layer), budgets and the longest video (a
second length, its window full); on the others the fewest steps and RTN + taylor: every step runs
the same forward, and the variant commits through the quantized path; on Self-Forcing with Deep
Forcing and on SkyReels-V2 with FlowCache, whose layers decide alike, over three chunks, the
third deciding)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from jbkv_cli.kvcache import FULL_PRECISION, KVSpec
from jbkv_cli.models.cases import Case
from jbkv_cli.plan.blocks import RegionHooks, block_runs, region_of, shorten, shortening
from jbkv_cli.plan.budget import Budget, GiB
from jbkv_cli.plan.depth import NotExact, extrapolate_periods
from jbkv_cli.plan.device import PlanDevice, PlanTracker
from jbkv_cli.prune.registry import build_pruner


class Toy(torch.nn.Module):
    """A block that computes a transient and, when it commits, keeps a cache tensor."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor, kept: list | None) -> torch.Tensor:
        h = self.lin(x).relu()
        if kept is not None:
            kept.append(torch.empty(3, 40, device=x.device))
        return x + h


class Wide(Toy):
    """A block of another kind (a second run)."""

    def __init__(self, width: int) -> None:
        super().__init__(width)
        self.extra = torch.nn.Linear(width, 2 * width)

    def forward(self, x: torch.Tensor, kept: list | None) -> torch.Tensor:
        return super().forward(x, kept) + self.extra(x)[:, : x.shape[1]]


def _stack(depths: tuple[int, int]) -> torch.nn.ModuleList:
    torch.manual_seed(0)
    return torch.nn.ModuleList(
        [Toy(16) for _ in range(depths[0])] + [Wide(16) for _ in range(depths[1])]
    )


def _generate(blocks: torch.nn.ModuleList, tracker: PlanTracker) -> None:
    """Three chunks of two denoising passes and a commit pass; each commit keeps a tensor per
    block, the window drops the oldest chunk's."""
    kept: list = []
    for chunk in range(1, 4):
        for commit in (False, False, True):
            x = torch.ones(5, 16, device="cuda")
            for block in blocks:
                x = block(x, kept if commit else None)
            del x
        if chunk > 1:
            del kept[: len(blocks)]  # a window of two chunks
        tracker.mark(f"chunk {chunk}")


def _periods(depths: tuple[int, int], removed: int) -> tuple[list, list]:
    with PlanDevice() as device:
        tracker = device.tracker
        blocks = _stack(depths).to("cuda")
        runs = block_runs(blocks)
        kept = shorten(blocks, runs, removed)
        RegionHooks(blocks, kept, tracker)
        tracker.trace = []
        tracker.reset_peak()
        _generate(blocks, tracker)
        return tracker.periods, tracker.trace


@pytest.mark.parametrize("depths", [(9, 0), (7, 8)])
def test_two_short_traces_give_the_full_depths_periods(depths):
    stack = _stack(depths)
    runs = block_runs(stack)
    assert [r.length for r in runs] == [d for d in depths if d]
    t = shortening(runs)
    mids = {i: r.length - 2 for i, r in enumerate(runs)}
    full, _ = _periods(depths, 0)
    _, a = _periods(depths, t)
    _, b = _periods(depths, t - 1)
    assert extrapolate_periods(a, b, t, mids) == full
    assert len({p.total for _, p in full}) > 1  # the cache grows: the periods differ


def test_traces_that_do_not_match_are_refused():
    depths = (9, 0)
    t = shortening(block_runs(_stack(depths)))
    _, a = _periods(depths, t)
    _, b = _periods(depths, t - 1)
    with pytest.raises(NotExact):
        extrapolate_periods(a, a, t, {0: 7})  # no middle block more in B
    with pytest.raises(NotExact):
        extrapolate_periods(a, b[: len(b) // 2], t, {0: 7})


def test_regions_and_shortening():
    stack = _stack((6, 5))
    runs = block_runs(stack)
    assert shortening(runs) == 2
    kept = shorten(stack, runs, 2)
    assert [r.length for r in kept] == [4, 3] and len(stack) == 7
    assert [region_of(kept, i) for i in range(7)] == [
        (0, "first"),
        (0, "mid", 1),
        (0, "mid", 2),
        (0, "last"),
        (1, "first"),
        (1, "mid", 1),
        (1, "last"),
    ]


# -- every model that names its blocks, at six blocks ---------------------------------------

SPECS = [
    FULL_PRECISION,
    KVSpec.build("rtn", 2, correction="taylor"),
    KVSpec.build("quarot", 4, correction="signed"),
]
BUDGETS = [Budget("tight", GiB + 2**20), Budget("8GiB", 8 * GiB)]
PRUNED = {  # pruners whose layers decide alike (``layers_alike``), sized to decide at chunk 3
    "self-forcing": (
        "deep-forcing",
        {"buffer_frames": 6, "sink_frames": 1, "capacity_frames": 4, "recent_frames": 3},
    ),  # its tiny chunks: 3 frames
    "skyreels-v2": ("flowcache", {"clean_chunks": 1}),
}


def _six_layers(model: str, monkeypatch, tmp_path) -> dict:
    """Options of a reduced config of ``model`` with six blocks (patched in for the test), two
    chunks and the fewest denoising steps."""
    if model == "tiny":
        from jbkv_cli.models.tiny.model import TinyConfig, TinyDiT
        from jbkv_cli.models.tiny.weights_io import save_weights

        torch.manual_seed(0)
        path = tmp_path / "six.safetensors"
        save_weights(TinyDiT(TinyConfig(depth=6)), path, {})
        return {"weights": str(path), "num_chunks": 2, "steps": 1}
    if model == "magi1":
        import jbkv_cli.models.magi1 as magi1

        six = replace(magi1.TINY_VARIANT, dit=replace(magi1.TINY_VARIANT.dit, num_layers=6))
        monkeypatch.setattr(magi1, "TINY_VARIANT", six)
        return {"config": "tiny-random", "num_chunks": 2, "steps": 2}  # one per stage
    if model == "hy-worldplay":
        import jbkv_cli.models.hy_worldplay as hy

        monkeypatch.setattr(hy, "TINY", replace(hy.TINY, mm_double_blocks_depth=6))
        return {"config": "tiny-random", "num_chunks": 2, "steps": 1}
    if model == "matrix-game-2":  # two runs of five: with the ActionModule, without
        from jbkv_cli.models.wan.matrix_game import config

        dit = config.TINY.dit
        ten = replace(dit, layers=10, action=replace(dit.action, blocks=tuple(range(5))))
        monkeypatch.setitem(config.PRESETS, "tiny-random", replace(config.TINY, dit=ten))
        return {"config": "tiny-random", "num_chunks": 2}
    from jbkv_cli.models.wan.tiny import TINY_WAN_TRANSFORMER

    monkeypatch.setitem(TINY_WAN_TRANSFORMER, "num_layers", 6)
    return {"config": "tiny-random", "num_chunks": 2, "steps": 1}


def _document(plan) -> dict:
    out = plan.to_dict()
    out.pop("seconds")
    for v in out["variants"]:
        v.pop("seconds")
    return out


@pytest.mark.slow  # each model planned three times over (docs/testing.md)
@pytest.mark.parametrize(
    "model",
    [
        "tiny",
        "self-forcing",
        "rolling-forcing",
        "skyreels-v2",
        "magi1",
        "hy-worldplay",
        "matrix-game-2",
    ],
)
def test_the_fast_plan_is_the_full_trace(model, monkeypatch, tmp_path):
    from jbkv_cli.plan.job import default_case
    from jbkv_cli.plan.run import plan_model

    options = _six_layers(model, monkeypatch, tmp_path)
    specs, budgets = ([SPECS[0], SPECS[2]], BUDGETS) if model == "tiny" else ([SPECS[1]], [])
    if model in PRUNED:  # a pruner whose layers decide alike, deciding at chunk 3
        options["num_chunks"] = 3
        specs = [replace(SPECS[1], pruner=build_pruner(PRUNED[model][0], **PRUNED[model][1]))]
    lines: list[str] = []

    def case(opts: dict) -> Case:
        return default_case(model, tmp_path, opts)

    fast = plan_model(model, options, specs, case, budgets=budgets, progress=lines.append)
    full = plan_model(model, options, specs, case, budgets=budgets, full_depth=True)
    kept = 6 if model == "matrix-game-2" else 3  # three of each run
    assert any(f"· {kept} blocks" in line for line in lines)  # it was shortened
    assert not [line for line in lines if "tracing every block" in line]  # and extrapolated
    assert _document(fast) == _document(full)
    assert all(v.growth is not None for v in fast.variants) == bool(budgets)


def test_a_per_layer_spec_is_traced_at_the_real_depth(monkeypatch, tmp_path):
    """Its layers differ (here layers 3-5 beyond a shortened stack): every block is traced."""
    from jbkv_cli.plan.job import default_case
    from jbkv_cli.plan.run import plan_model
    from jbkv_cli.run.bit_specs import parse_bit_spec

    options = _six_layers("tiny", monkeypatch, tmp_path)
    spec = KVSpec.build("rtn", layers=parse_bit_spec("K2V2@0-2+K4V4@3-"))
    lines: list[str] = []
    plan = plan_model(
        "tiny", options, [spec], lambda o: default_case("tiny", tmp_path, o), progress=lines.append
    )
    assert lines and not [line for line in lines if "blocks" in line]
    assert plan.variants[0].kv_cache_bytes > 0
