"""The process-group helpers and per-rank metric shards, in one process.

The torchrun jobs themselves (2 ranks on gloo) are in ``tests/test_torchrun.py``.
"""

from __future__ import annotations

import json

import pytest

from jbkv_cli import distributed
from jbkv_cli.errors import UsageError
from jbkv_cli.metric_shards import merge_shards, save_scores
from jbkv_cli.runs import RunDir

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", distributed.TIMEOUT_ENV)


@pytest.fixture
def no_torchrun(monkeypatch):
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def as_rank(monkeypatch):
    """Pretend to be rank ``r`` of ``w`` (the state :func:`distributed.setup` would leave)."""

    def set_rank(r: int, w: int) -> None:
        monkeypatch.setattr(distributed._state, "job", distributed.Launch(r, w, r, w))

    return set_rank


def test_one_process_has_no_group_and_every_helper_is_the_identity(no_torchrun):
    assert distributed.launch() is None and distributed.rank_tag() == ""
    distributed.setup("cpu")
    assert not distributed.active() and distributed.rank() == 0 and distributed.world_size() == 1
    assert distributed.shard([3, 1, 2]) == [3, 1, 2]
    assert distributed.from_rank0(lambda: "x", "testing") == "x"
    assert distributed.gather({"a": 1}, "testing") == [{"a": 1}]
    assert distributed.map_sharded(lambda x: x * x, [1, 2, 3], "testing") == [1, 4, 9]
    distributed.wait_for_peers("testing")
    distributed.beat()
    assert distributed.child_env() == {}


def test_launch_reads_torchrun_environment(no_torchrun, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert distributed.launch() == distributed.Launch(3, 4, 1, 2)
    assert distributed.rank_tag() == "rank 3/4: "
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.launch() is None  # torchrun --nproc-per-node 1: a plain single process
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK")
    with pytest.raises(UsageError, match="RANK"):
        distributed.launch()


def test_shards_are_disjoint_complete_and_balanced(as_rank):
    items = list(range(11))
    shares = []
    for r in range(3):
        as_rank(r, 3)
        shares.append(distributed.shard(items))
    assert sorted(x for share in shares for x in share) == items
    assert [len(s) for s in shares] == [4, 4, 3]
    assert shares[1] == [1, 4, 7, 10]


@pytest.mark.parametrize("value", ["0", "-5", "abc", "inf", "nan"])
def test_bad_timeout_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv(distributed.TIMEOUT_ENV, value)
    with pytest.raises(UsageError, match=distributed.TIMEOUT_ENV):
        distributed.timeout_seconds()


def test_timeout_default_and_override(monkeypatch):
    monkeypatch.delenv(distributed.TIMEOUT_ENV, raising=False)
    assert distributed.timeout_seconds() == distributed.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "90")
    assert distributed.timeout_seconds() == 90.0


def _run(tmp_path) -> RunDir:
    return RunDir(tmp_path, {"model": "tiny", "settings": {}, "prompts": [], "seeds": []})


def test_ranks_write_their_own_shards_and_rank0_merges_them(tmp_path, as_rank):
    run = _run(tmp_path)
    run.write_metrics("fidelity", "int2", {"old": {"psnr": 1.0}})
    for r, name in ((0, "a"), (1, "b"), (1, "c")):
        as_rank(r, 2)
        save_scores(run, "fidelity", "int2", {name: {"psnr": float(ord(name))}})
    shards = sorted(p.name for p in (tmp_path / "metrics/shards/fidelity/int2").iterdir())
    assert shards == ["rank0.json", "rank1.json"]
    assert set(run.read_metrics("fidelity", "int2")) == {"old"}  # untouched until the merge
    assert merge_shards(run, "fidelity") == 2
    assert set(run.read_metrics("fidelity", "int2")) == {"old", "a", "b", "c"}
    assert not (tmp_path / "metrics/shards").exists()
    assert merge_shards(run, "fidelity") == 0


def test_merge_after_a_kill_between_write_and_delete_is_harmless(tmp_path, as_rank):
    """A merge killed after rewriting the variant's file but before deleting the shards."""
    run = _run(tmp_path)
    as_rank(1, 2)
    save_scores(run, "fidelity", "int4", {"a": {"psnr": 2.0}})
    run.write_metrics("fidelity", "int4", {"a": {"psnr": 2.0}})
    assert merge_shards(run, "fidelity") == 1
    assert json.loads((tmp_path / "metrics/fidelity/int4.json").read_text()) == {"a": {"psnr": 2.0}}


def test_one_process_writes_the_variant_file_directly(tmp_path, no_torchrun):
    run = _run(tmp_path)
    save_scores(run, "fidelity", "int2", {"a": {"psnr": 1.0}})
    save_scores(run, "fidelity", "int2", {"b": {"psnr": 2.0}})
    assert set(run.read_metrics("fidelity", "int2")) == {"a", "b"}
    assert not (tmp_path / "metrics/shards").exists()
