"""Scale-out under ``torchrun``: the process group and the split of the work list.

``torchrun --nproc-per-node N -m jbkv_cli quantize-eval …`` starts N copies of the command
(ranks). Each one calls :func:`setup`, which joins the ``torch.distributed`` process group
(gloo on a CPU; on a GPU ``cpu:gloo,cuda:nccl`` with the rank on ``cuda:LOCAL_RANK``) and leaves
everything else as it was. Then:

- rank 0 alone writes what all ranks share (the manifest) and decides what is left to do
  (:func:`from_rank0` broadcasts its result, or its error);
- every rank takes its share of that list (:func:`shard`: round-robin, deterministic) and writes
  only its own files into the shared run directory;
- a rank that needs another rank's file (a reference video, to score against) waits for it
  (:func:`wait_until`);
- the ranks meet again (:func:`wait_for_peers`, then :func:`gather`) and rank 0 merges and prints
  (the others' stdout and stderr consoles are muted; their one-line errors still show).

Run as one process (no ``WORLD_SIZE`` above 1 in the environment), every helper here is the
identity and no process group exists, so single-process runs are exactly what they were.

Failures never hang: a rank that fails prints its one-line error (prefixed ``rank R/N:``), leaves
a note in the process group's store and exits; ``torchrun`` then stops the other ranks, and a rank
that is waiting for its peers sees the note and stops too. Collectives time out after
``JBKV_DIST_TIMEOUT`` seconds (default 1800). Waiting for the others to finish their share can
legitimately take hours, so that wait times out only when *no* rank has made progress (a chunk
generated, a pair scored, a VBench line) for that long.

torch is imported by the functions that join or use a process group, not with this module, which
the CLI imports at start-up (``jbkv --help`` or a usage error needs no torch).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from jbkv_cli.utils.console import mute, warn
from jbkv_cli.utils.errors import JbkvError, UsageError
from jbkv_cli.utils.lifecycle import describe, rank_tag

T = TypeVar("T")
R = TypeVar("R")

TIMEOUT_ENV = "JBKV_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0
POLL_S = 0.25
BEAT_EVERY_S = 1.0
_FAILED = "jbkv/failed"
_BEAT = "jbkv/beat"


@dataclass(frozen=True)
class Launch:
    """Where this process sits in a ``torchrun`` job (from the environment it sets)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def launch() -> Launch | None:
    """The job this process belongs to, or None for a single process (no ``WORLD_SIZE`` > 1)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        rank = int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except (KeyError, ValueError) as exc:
        raise UsageError(
            f"WORLD_SIZE is set but RANK/LOCAL_RANK are missing or not integers ({exc}); "
            "start jbkv with torchrun"
        ) from None
    if not 0 <= rank < world:
        raise UsageError(f"RANK={rank} is outside WORLD_SIZE={world}")
    return Launch(rank, world, local, local_world)


def only_rank0_reports() -> bool:
    """For a command whose whole output is one report (``report``): True alone or on rank 0.

    Reads only the environment (no process group is joined), so ``torchrun … report RUN``
    prints its table once: rank 0 reports, the other ranks mute their consoles and should
    return (exit 0) without doing the work again.
    """
    job = launch()
    if job is None or job.rank == 0:
        return True
    mute()
    return False


def timeout_seconds() -> float:
    """``$JBKV_DIST_TIMEOUT`` (seconds), else 1800; a bad value is a usage error."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


class _State:
    """The process group this process joined (one per process)."""

    job: Launch | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    cuda: bool = False
    failed: bool = False
    waits: int = 0
    last_beat: float = 0.0


_state = _State()


def active() -> bool:
    """True once :func:`setup` joined a process group of more than one rank."""
    return _state.job is not None


def rank() -> int:
    return _state.job.rank if _state.job else 0


def world_size() -> int:
    return _state.job.world_size if _state.job else 1


def is_main() -> bool:
    """Rank 0, or a single process: the one that merges, prints and writes shared files."""
    return rank() == 0


def setup(device: str | None = None) -> None:
    """Join the process group when started by ``torchrun``; a no-op for one process.

    ``device``: the command's device choice (None or ``auto``: CUDA when available). On CUDA the
    rank's default device becomes ``cuda:LOCAL_RANK`` (ranks share GPUs round-robin when a node
    has fewer GPUs than ranks), so models and metrics that ask for ``"cuda"`` land there.
    Idempotent: later calls (``quantize-eval --vbench`` runs ``vbench run``) do nothing.
    """
    job = launch()
    if job is None or active():
        return
    import torch

    timeout = timeout_seconds()
    want_cuda = device is None or device == "auto" or str(device).startswith("cuda")
    cuda = want_cuda and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(job.local_rank % torch.cuda.device_count())
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    try:
        _dist().init_process_group(
            backend, rank=job.rank, world_size=job.world_size, timeout=timedelta(seconds=timeout)
        )
    except (RuntimeError, ValueError) as exc:
        raise JbkvError(f"cannot join the torchrun process group: {_first_line(exc)}") from exc
    _state.job, _state.timeout, _state.cuda = job, timeout, cuda
    atexit.register(_shutdown)
    if job.rank != 0:
        mute()
    elif cuda and job.local_world_size > torch.cuda.device_count():
        warn(
            f"{job.local_world_size} ranks per node share {torch.cuda.device_count()} GPU(s) "
            "round-robin"
        )


def child_env() -> dict[str, str]:
    """Environment for subprocesses (the VBench runner) that pins them to this rank's GPU."""
    if not (active() and _state.cuda):
        return {}
    import torch

    index = torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in visible.split(",")] if visible else None
    return {"CUDA_VISIBLE_DEVICES": ids[index] if ids else str(index)}


# --- splitting the work -----------------------------------------------------------------------


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of ``items``: every ``world_size``-th item from position ``rank``.

    Deterministic and disjoint: every rank that sees the same list takes a different share and
    together they take every item once. One process takes the whole list, in order.
    """
    return list(items[rank() :: world_size()])


def from_rank0(fn: Callable[[], T], what: str) -> T:
    """Run ``fn`` on rank 0 only and hand its result to every rank.

    For what exactly one process may do (write the manifest, decide what is left to do). When
    ``fn`` fails on rank 0, rank 0 raises its error and the other ranks exit with the same code
    without repeating the line (:class:`PeerFailed`).
    """
    if not active():
        return fn()
    payload: list[Any] = [None]
    if is_main():
        try:
            payload[0] = ("ok", fn())
        except Exception as exc:
            code = exc.exit_code if isinstance(exc, JbkvError) else 1
            payload[0] = ("error", code)
            _collective(what, lambda: _dist().broadcast_object_list(payload, src=0))
            raise
    _collective(what, lambda: _dist().broadcast_object_list(payload, src=0))
    status, value = payload[0]
    if status == "error":
        raise PeerFailed(value)
    return value


def gather(obj: T, what: str) -> list[T]:
    """Every rank's ``obj``, indexed by rank, on every rank (``[obj]`` for one process)."""
    if not active():
        return [obj]
    parts: list[Any] = [None] * world_size()
    _collective(what, lambda: _dist().all_gather_object(parts, obj))
    return parts


def map_sharded(fn: Callable[[T], R], items: Sequence[T], what: str) -> list[R]:
    """``[fn(x) for x in items]``, each rank computing its share; every rank gets all results."""
    if not active():
        return [fn(x) for x in items]
    indices = shard(range(len(items)))
    mine = []
    for i in indices:
        mine.append((i, fn(items[i])))
        beat()
    wait_for_peers(what)
    results: list[Any] = [None] * len(items)
    for part in gather(mine, what):
        for i, value in part:
            results[i] = value
    return results


# --- waiting without hanging ------------------------------------------------------------------


class PeerFailed(JbkvError):
    """Another rank failed and printed why; this rank exits with its code and no line."""

    quiet = True

    def __init__(self, exit_code: int) -> None:
        super().__init__("another rank failed")
        self.exit_code = exit_code


def beat() -> None:
    """Tell waiting ranks this one is making progress (at most once a second; no-op alone)."""
    if not active():
        return
    now = time.monotonic()
    if now - _state.last_beat < BEAT_EVERY_S:
        return
    _state.last_beat = now
    _store_call("progress", lambda s: s.add(_BEAT, 1))


def wait_for_peers(what: str) -> None:
    """Return when every rank has called this (the same number of times); no-op alone.

    Polls the process group's store instead of a blocking barrier: the wait may last as long as
    the slowest rank's share, so it gives up only when a rank reports a failure or when no rank
    has made progress (:func:`beat`) for ``JBKV_DIST_TIMEOUT`` seconds.
    """
    if not active():
        return
    _state.waits += 1
    key = f"jbkv/wait/{_state.waits}"
    _store_call(what, lambda s: (s.set(f"{key}/{rank()}", "1"), s.add(key, 1)))

    def stalled() -> str:
        missing = [
            r
            for r in range(world_size())
            if not _store_call(what, lambda s, r=r: s.check([f"{key}/{r}"]))
        ]
        return f"rank(s) {', '.join(map(str, missing))}"

    wait_until(
        lambda: int(_store_call(what, lambda s: s.add(key, 0))) >= world_size(), what, stalled
    )


def wait_until(
    ready: Callable[[], bool], what: str, stalled: Callable[[], str] | None = None
) -> None:
    """Return once ``ready()`` is true (polled), e.g. a file another rank is writing exists.

    Gives up when a rank reports a failure, or when no rank has made progress (:func:`beat`) for
    ``JBKV_DIST_TIMEOUT`` seconds; ``stalled()`` names whom that error blames (by default no
    one: "no rank made progress"). Alone, nobody else can make ``ready()`` true: false is an error at once.
    """
    if not active():
        if not ready():
            raise JbkvError(f"{what}: no other process can make it")
        return
    last, since = None, time.monotonic()
    while not ready():
        note = _failure_note()
        if note:
            raise JbkvError(f"stopped while {what}: {note} (see its error)")
        beats = int(_store_call(what, lambda s: s.add(_BEAT, 0)))
        if beats != last:
            last, since = beats, time.monotonic()
        elif time.monotonic() - since > _state.timeout:
            who = f"{stalled()} made no" if stalled else "no rank made"
            raise JbkvError(
                f"timed out while {what}: {who} progress for {_state.timeout:.0f} s "
                f"(hung?; raise {TIMEOUT_ENV} if one step takes longer)"
            )
        time.sleep(POLL_S)


def abort(exc: BaseException) -> None:
    """Called by the CLI when this rank fails: tell the others, and ``torchrun``.

    Leaves a note in the store (ranks waiting for their peers stop on it) and writes the
    one-line error to ``$TORCHELASTIC_ERROR_FILE``, so torchrun's failure summary shows it
    instead of "<N/A>". No more collectives, and the group is not destroyed (that could wait
    on peers): the process exits and ``torchrun`` stops the others.
    """
    if isinstance(exc, PeerFailed):
        _state.failed = True
        return
    _write_error_file(exc)
    if not active() or _state.failed:
        return
    _state.failed = True
    # The store may be gone with the rank that hosted it; then there is nothing to tell.
    with contextlib.suppress(Exception):
        store = _dist().distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=5))
        store.compare_set(_FAILED, "", f"rank {rank()}/{world_size()} failed")


def _write_error_file(exc: BaseException) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    if isinstance(exc, KeyboardInterrupt):
        text = describe(exc)
    elif isinstance(exc, JbkvError):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    data = {"message": f"{rank_tag()}{' '.join(text.split())[:500]}", "timestamp": int(time.time())}
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(data), encoding="utf-8")


def _failure_note() -> str | None:
    if not _store_call("checking the other ranks", lambda s: s.check([_FAILED])):
        return None
    return _store_call("checking the other ranks", lambda s: s.get(_FAILED)).decode()


def _store_call(what: str, call: Callable[[Any], T]) -> T:
    return _collective(what, lambda: call(_dist().distributed_c10d._get_default_store()))


def _collective(what: str, call: Callable[[], T]) -> T:
    """``call()``; a lost peer or a timeout becomes one line saying where and why."""
    try:
        return call()
    except (RuntimeError, ValueError) as exc:  # DistError, DistBackendError, DistNetworkError
        _state.failed = True
        text = _first_line(exc)
        if "timeout" in text.lower() or "timed out" in text.lower():
            raise JbkvError(
                f"timed out after {_state.timeout:.0f} s while {what} "
                f"(another rank hung or is slow; raise {TIMEOUT_ENV})"
            ) from exc
        note = None
        with contextlib.suppress(Exception):
            note = _failure_note_quick()
        if note:
            raise JbkvError(f"stopped while {what}: {note} (see its error)") from exc
        raise JbkvError(
            f"lost contact with the other ranks while {what} (one failed or was killed): {text}"
        ) from exc


def _failure_note_quick() -> str | None:
    store = _dist().distributed_c10d._get_default_store()
    store.set_timeout(timedelta(seconds=5))
    return store.get(_FAILED).decode() if store.check([_FAILED]) else None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n", 1)[0].split())
    return (text or type(exc).__name__)[:200]


def _dist() -> Any:
    """``torch.distributed``, imported on first use (see the module docstring)."""
    import torch.distributed as dist

    return dist


def _shutdown() -> None:
    """At exit after success: leave the group cleanly (after a failure, just exit)."""
    if active() and not _state.failed and _dist().is_initialized():
        with contextlib.suppress(Exception):
            _dist().destroy_process_group()
