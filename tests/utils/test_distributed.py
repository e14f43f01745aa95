"""The process-group helpers and per-video score files, in one process.

The torchrun jobs themselves (2 ranks on gloo) are in ``tests/run/test_torchrun.py``.
"""

from __future__ import annotations

import json

import pytest

from jbkv_cli.run.directory import RunDir
from jbkv_cli.run.shards import merge_shards, save_scores
from jbkv_cli.utils import distributed
from jbkv_cli.utils.errors import JbkvError, UsageError

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


def _entry(psnr: float) -> dict:
    return {"psnr": psnr, "ssim": 0.9}


def _write(path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_ranks_write_one_file_per_video_over_the_old_variant_file(tmp_path, as_rank):
    """Each rank saves the videos it scored in their own files: no shared file, nothing to
    merge, every score readable at once; a variant file of an older run is read beneath."""
    run = _run(tmp_path)
    _write(tmp_path / "metrics/fidelity/int2.json", {"old": _entry(1.0), "a": _entry(2.0)})
    for r, name in ((0, "a"), (1, "b"), (1, "c")):
        as_rank(r, 2)
        save_scores(run, "fidelity", "int2", {name: _entry(float(ord(name)))})
    files = sorted(p.name for p in (tmp_path / "metrics/fidelity/int2").iterdir())
    assert files == ["a.json", "b.json", "c.json"]
    scores = run.read_metrics("fidelity", "int2")
    assert set(scores) == {"old", "a", "b", "c"} and scores["a"]["psnr"] == ord("a")
    assert json.loads((tmp_path / "metrics/fidelity/int2.json").read_text())["a"]["psnr"] == 2.0
    assert not (tmp_path / "metrics/shards").exists()
    assert merge_shards(run, "fidelity") == 0


def test_shards_of_an_older_version_are_moved_into_per_video_files(tmp_path, no_torchrun):
    """A killed torchrun job of an older jbkv left per-rank shards: they are moved (a score already
    in its own file is newer and kept), then deleted; a kill before the delete is harmless."""
    run = _run(tmp_path)
    shards = tmp_path / "metrics/shards/fidelity/int4"
    _write(shards / "rank0.json", {"a": _entry(2.0), "b": _entry(3.0)})
    _write(shards / "rank1.json", {"c": _entry(4.0)})
    save_scores(run, "fidelity", "int4", {"b": _entry(30.0)})
    assert merge_shards(run, "fidelity") == 2
    scores = run.read_metrics("fidelity", "int4")
    assert {k: v["psnr"] for k, v in scores.items()} == {"a": 2.0, "b": 30.0, "c": 4.0}
    assert not (tmp_path / "metrics/shards").exists()
    _write(shards / "rank0.json", {"a": _entry(2.0)})  # as a kill before the delete leaves it
    assert merge_shards(run, "fidelity") == 1
    assert run.read_metrics("fidelity", "int4") == scores


def test_one_process_writes_one_file_per_video(tmp_path, no_torchrun):
    run = _run(tmp_path)
    save_scores(run, "fidelity", "int2", {"a": _entry(1.0)})
    save_scores(run, "fidelity", "int2", {"b": _entry(2.0)})
    assert set(run.read_metrics("fidelity", "int2")) == {"a", "b"}
    assert json.loads((tmp_path / "metrics/fidelity/int2/a.json").read_text()) == _entry(1.0)
    assert not (tmp_path / "metrics/shards").exists()


class FakeClock:
    """Stands in for ``time`` inside :mod:`jbkv_cli.utils.distributed`: a sleep advances the clock by
    exactly its length, then lets ``peer`` act, so waits are deterministic and instant."""

    def __init__(self) -> None:
        self.now = 0.0
        self.peer = lambda: None

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.peer()


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(distributed, "time", fake)
    return fake


@pytest.fixture
def store(monkeypatch, as_rank):
    """Rank 0 of 2, with an in-process store standing in for the process group's."""
    import torch.distributed as dist

    hash_store = dist.HashStore()
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: hash_store)
    monkeypatch.setattr(distributed._state, "waits", 0)
    monkeypatch.setattr(distributed._state, "failed", False)
    monkeypatch.setattr(distributed._state, "timeout", 0.6)
    monkeypatch.setattr(distributed, "POLL_S", 0.02)
    monkeypatch.setattr(distributed, "BEAT_EVERY_S", 0.0)
    as_rank(0, 2)
    return hash_store


def test_a_peer_without_progress_times_out_naming_it(store, clock):
    with pytest.raises(JbkvError, match=r"timed out while testing: rank\(s\) 1 made no progress"):
        distributed.wait_for_peers("testing")
    assert 0.6 < clock.now < 0.7


def test_a_slow_peer_that_makes_progress_is_waited_for(store, clock):
    """2.5 timeouts in all, but never one without a beat: a beat every 0.1 s, then done."""
    polls = iter(range(10_000))

    def peer() -> None:
        n = next(polls)
        if n < 75 and n % 5 == 0:
            store.add("jbkv/beat", 1)
        elif n == 75:
            store.add("jbkv/wait/1", 1)

    clock.peer = peer
    distributed.wait_for_peers("testing")
    assert clock.now > 1.5 and int(store.add("jbkv/beat", 0)) == 15


def test_a_failed_peer_stops_the_wait_and_abort_leaves_the_note(store, as_rank):
    as_rank(1, 2)
    distributed.abort(JbkvError("disk full"))
    assert store.get("jbkv/failed") == b"rank 1/2 failed"
    as_rank(0, 2)
    distributed._state.failed = False
    with pytest.raises(JbkvError, match=r"stopped while testing: rank 1/2 failed"):
        distributed.wait_for_peers("testing")


def test_abort_writes_the_one_line_error_for_torchrun(tmp_path, monkeypatch, no_torchrun):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    distributed.abort(JbkvError("cannot write x: Is a directory"))
    assert json.loads(path.read_text())["message"] == "cannot write x: Is a directory"


def test_waiting_for_a_file_another_rank_makes(store, clock):
    """:func:`distributed.wait_until` returns once the file is there, as long as ranks beat."""
    polls = iter(range(10_000))
    there = {"ref": False}

    def peer() -> None:
        n = next(polls)
        if n % 5 == 0:
            store.add("jbkv/beat", 1)
        if n == 60:  # 1.2 s: two timeouts, but never one without progress
            there["ref"] = True

    clock.peer = peer
    distributed.wait_until(lambda: there["ref"], "waiting for a reference")
    assert there["ref"] and clock.now > 1.2


def test_waiting_for_a_file_stops_on_no_progress_and_on_a_failed_rank(store, clock, as_rank):
    with pytest.raises(JbkvError, match=r"timed out while waiting: no rank made progress for 1 s"):
        distributed.wait_until(lambda: False, "waiting")
    store.set("jbkv/failed", "rank 1/2 failed")
    with pytest.raises(JbkvError, match=r"stopped while waiting: rank 1/2 failed"):
        distributed.wait_until(lambda: False, "waiting")


def test_one_process_never_waits_for_a_file(no_torchrun):
    distributed.wait_until(lambda: True, "waiting")
    with pytest.raises(JbkvError, match="no other process can make it"):
        distributed.wait_until(lambda: False, "waiting")
