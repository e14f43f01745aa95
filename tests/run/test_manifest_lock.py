"""Two commands starting on one run folder at once both keep their registrations.

The manifest's read-modify-writes (creating it, adding prompts and seeds) hold an ``flock`` on
``RUN/.manifest.lock`` (``jbkv_cli/utils/locks.py``). The race is forced, not hoped for: a test seam
(``runs._test_seam``) holds the first writer between its read and its write until the second
one is either blocked on the lock or, without a lock, has read the same manifest.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jbkv_cli.run import directory as runs
from jbkv_cli.run.directory import MANIFEST, MANIFEST_LOCK, RunDir
from jbkv_cli.utils.locks import locked

SETTINGS = {"num_chunks": 2, "steps": 1}


def _forced_race(root: Path, monkeypatch) -> dict:
    """A registers ``pa``/seed 1 and B ``pb``/seed 2 on one run; A is held after its read until
    B waits for the lock (or, with no lock, has read too). Returns the manifest on disk."""
    first = RunDir.create_or_resume(root, "tiny", SETTINGS)
    second = RunDir.open(root)
    a_read, b_there = threading.Event(), threading.Event()

    def seam(event: str) -> None:
        me = threading.current_thread().name
        if me == "A" and event == "read":
            a_read.set()
            assert b_there.wait(60), "B never reached the lock"
        elif me == "B" and event in ("waiting", "read"):
            b_there.set()

    monkeypatch.setattr(runs, "_test_seam", seam)
    a = threading.Thread(name="A", target=first.register, args=(["pa"], [1]))
    b = threading.Thread(name="B", target=second.register, args=(["pb"], [2]))
    a.start()
    assert a_read.wait(60)
    b.start()
    a.join(60)
    b.join(60)
    assert not a.is_alive() and not b.is_alive()
    return json.loads((root / MANIFEST).read_text())


def test_forced_concurrent_registrations_both_survive(tmp_path, monkeypatch):
    manifest = _forced_race(tmp_path / "run", monkeypatch)
    assert sorted(manifest["prompts"]) == ["pa", "pb"]
    assert sorted(manifest["seeds"]) == [1, 2]
    assert not (tmp_path / "run" / MANIFEST_LOCK).exists()  # no lock file stays behind


def test_the_forced_race_loses_a_registration_without_the_lock(tmp_path, monkeypatch):
    """The seam really forces the race: with the lock taken out (the code before the fix),
    one of the two registrations is lost every time."""
    monkeypatch.setattr(runs, "_manifest_lock", lambda root: contextlib.nullcontext())
    manifest = _forced_race(tmp_path / "run", monkeypatch)
    assert manifest["prompts"] in (["pa"], ["pb"])


def test_two_threads_starting_a_new_run_at_once_keep_both_registrations(tmp_path):
    """First starts at once (a barrier), 200 times: one creates the manifest, the other resumes
    it; each registers its own prompt and seed; both are on disk, at the positions each run's
    videos are named by."""
    for i in range(200):
        root = tmp_path / f"run{i}"
        barrier = threading.Barrier(2)
        made: dict[str, RunDir | BaseException] = {}

        def start(me: str, seed: int, root=root, barrier=barrier, made=made) -> None:
            barrier.wait(30)
            try:
                run = RunDir.create_or_resume(root, "tiny", SETTINGS)
                run.register([f"prompt {me}"], [seed])
                made[me] = run
            except BaseException as exc:  # reported below, in the test's thread
                made[me] = exc

        threads = [threading.Thread(target=start, args=(m, s)) for m, s in (("a", 1), ("b", 2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        failed = [r for r in made.values() if isinstance(r, BaseException)]
        assert not failed and len(made) == 2, (i, failed)
        manifest = json.loads((root / MANIFEST).read_text())
        assert sorted(manifest["prompts"]) == ["prompt a", "prompt b"], i
        assert sorted(manifest["seeds"]) == [1, 2], i
        for me, seed in (("a", 1), ("b", 2)):
            assert made[me].index_of(seed) == manifest["seeds"].index(seed), i
        assert not (root / MANIFEST_LOCK).exists()


WORKER = """
import sys, time
from pathlib import Path
from jbkv_cli.run.directory import RunDir

base, me, seed, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
other = "b" if me == "a" else "a"
for i in range(n):
    (base / f"ready{i}.{me}").touch()
    while not (base / f"ready{i}.{other}").exists():  # both start iteration i together
        time.sleep(0.0005)
    run = RunDir.create_or_resume(base / f"run{i}", "tiny", {"num_chunks": 2, "steps": 1})
    run.register([f"prompt {me}"], [seed])
"""


@pytest.mark.slow  # end to end
def test_two_processes_starting_new_runs_at_once_keep_both_registrations(tmp_path):
    n = 40
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path), me, str(seed), str(n)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for me, seed in (("a", 1), ("b", 2))
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    for i in range(n):
        manifest = json.loads((tmp_path / f"run{i}" / MANIFEST).read_text())
        assert sorted(manifest["prompts"]) == ["prompt a", "prompt b"], i
        assert sorted(manifest["seeds"]) == [1, 2], i


def test_a_lock_file_left_by_a_killed_process_is_taken_over_and_removed(tmp_path):
    path = tmp_path / ".x.lock"
    path.write_text("")  # what kill -9 inside the block leaves
    with locked(path):
        assert path.exists()
    assert not path.exists()


def test_a_waiter_locks_the_new_file_when_the_holder_deleted_the_old_one(tmp_path):
    """Holder H deletes the lock file before letting go; waiter W, which opened the old file,
    must not take a lock nobody else can see: it starts over on the path's current file."""
    path = tmp_path / ".x.lock"
    order: list[str] = []
    waiting = threading.Event()

    def waiter() -> None:
        with locked(path, on_wait=waiting.set):
            order.append("W in")
            assert path.exists()
            order.append("W out")

    with locked(path):
        order.append("H in")
        w = threading.Thread(target=waiter)
        w.start()
        assert waiting.wait(30)
        order.append("H out")
    w.join(30)
    assert order == ["H in", "H out", "W in", "W out"]
    assert not path.exists()


@pytest.mark.parametrize("twice", [False, True])
def test_registering_is_idempotent(tmp_path, twice):
    run = RunDir.create_or_resume(tmp_path / "run", "tiny", SETTINGS)
    run.register(["p", "q"], [3, 1])
    if twice:
        RunDir.open(tmp_path / "run").register(["q", "p"], [1, 3, 3])
    manifest = json.loads((tmp_path / "run" / MANIFEST).read_text())
    assert manifest["prompts"] == ["p", "q"] and manifest["seeds"] == [3, 1]
