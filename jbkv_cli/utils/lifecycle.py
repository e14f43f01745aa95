"""The process from start to exit: one handler for SIGINT, SIGTERM and SIGHUP, and start-up
failures as one line.

:func:`install` (the first thing :mod:`jbkv_cli.cli.entry` does) puts one handler on the three
signals, and it stays until the process exits. What it does depends on where the process is:

- **start-up** (imports, argument parsing): it only remembers the signal. A
  ``KeyboardInterrupt`` raised inside an extension module's import (torch's pybind11
  callbacks) aborts the process from C++ (``terminate called after throwing …``, signal 6), so
  nothing may be raised there. A signal that came during the imports is honoured when they end
  (one line, exit ``128 + N``); one that came while the arguments were parsed, as the command
  starts (:func:`command`). The CLI starts without torch: a command imports it once its
  options are checked, and that import is start-up again (:func:`install` puts
  :func:`uninterrupted` around the first import of each module of :data:`GUARDED`): a signal
  in it is raised as it ends, and a failure (a broken install, a memory cap) is the start-up's
  one line, ``cannot start jbkv: …``.
- **the command** (:func:`command`): it raises :class:`Interrupted`, a ``KeyboardInterrupt``
  carrying the signal, so SIGTERM and SIGHUP unwind exactly like Ctrl-C: progress displays stop
  drawing at once (:func:`on_interrupt`), every atomic write in progress removes its temp file
  (:func:`jbkv_cli.utils.atomic.atomic_path`), the CLI prints one line and exits 130 (SIGINT), 143
  (SIGTERM) or 129 (SIGHUP). While that unwinds, a second signal is ignored (under
  ``torchrun`` a rank gets the terminal's Ctrl-C and then the agent's own signal); a third one
  exits at once (a temp file may then be left; the next run removes it).
- **exit** (:func:`finished`: the command's outcome is known and was reported): a signal makes
  the process exit at once with that outcome's code, printing nothing more; after the last
  atexit handler the signals are ignored, so Python's finalization cannot turn one into a death
  by signal.

A signal that was ignored when the process started (``nohup``'s SIGHUP, a background job's
SIGINT) stays ignored.

Test seam (deterministic signal tests, no sleeps): with ``JBKV_TEST_PAUSE=POINT[:GLOB]`` and
``JBKV_TEST_PAUSE_FILE=PATH``, the first time the process reaches ``POINT`` (``start-up``: before
the imports; ``imported``: after them; ``command``: as the command starts; ``importing``: as a
command imports torch (:func:`uninterrupted`); ``writing``: an
atomic write's temp file exists, ``GLOB`` matching the target's name) it writes the point's name
to ``PATH`` (``PATH.rankR`` inside a torchrun job) and waits there until a signal arrives.
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import importlib.abc
import importlib.machinery
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from jbkv_cli.utils.errors import JbkvError

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# the extension modules the CLI imported at start-up before it imported them in the commands;
# an interrupt inside torch's import aborts the process from C++
GUARDED = ("torch", "numpy", "av")
PAUSE_ENV = "JBKV_TEST_PAUSE"
PAUSE_FILE_ENV = "JBKV_TEST_PAUSE_FILE"
PAUSE_LIMIT_S = 900.0  # a test seam: the test signals at once; only a hang guard
_MEMORY_HINTS = ("failed to map segment", "cannot allocate memory", "bad_alloc", "out of memory")


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP during a command, raised in the main thread by the handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signum_of(exc: BaseException) -> int:
    """The signal behind an interrupt (a plain ``KeyboardInterrupt`` is SIGINT)."""
    return int(getattr(exc, "signum", signal.SIGINT))


def exit_code_of(exc: BaseException) -> int:
    """``128 + N``: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP (what shells report)."""
    return 128 + signum_of(exc)


def describe(exc: BaseException) -> str:
    """``"interrupted (SIGTERM)"``: what the one-line message and torchrun's error file say."""
    return f"interrupted ({signal.Signals(signum_of(exc)).name})"


class _State:
    mode = "start-up"  # start-up | command | exit
    pending: int | None = None  # a signal that came during start-up
    raised: int | None = None  # the signal raised as Interrupted during the command
    repeats = 0  # signals that came while that interrupt unwound
    exit_code = 0  # the outcome, once known (mode "exit")
    paused = False


_state = _State()
_on_interrupt: list[Callable[[], None]] = []


def on_interrupt(hook: Callable[[], None]) -> None:
    """Call ``hook`` in the handler as a signal interrupts the command, before anything
    unwinds (:mod:`jbkv_cli.utils.progress` stops its displays there, so no frame follows the
    signal). A hook runs inside a signal handler: it must only set flags."""
    _on_interrupt.append(hook)


def install() -> None:
    """Put the handler on SIGINT, SIGTERM and SIGHUP (main thread; inherited SIG_IGN kept), and
    :func:`uninterrupted` around the first import of each module of :data:`GUARDED`."""
    for signum in SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _handle)
    atexit.register(_ignore_after_exit_handlers)  # registered first, so it runs last
    if _guard not in sys.meta_path:
        sys.meta_path.insert(0, _guard)


def _ignore_after_exit_handlers() -> None:
    """After the last atexit handler, with the outcome decided, ignore the three signals.

    Python's finalization then resets a Python-level handler to the default action, so a
    signal in the rest of it (freeing torch's modules can take a while) would kill the process
    by the signal (exit -15) instead of with its own code: under ``torchrun`` the agent sends
    SIGTERM to every rank as soon as one rank exits, and a rank already leaving with 143 was
    reported as killed. An ignored signal stays ignored through finalization."""
    if _state.mode != "exit":
        return
    for signum in SIGNALS:
        if signal.getsignal(signum) is _handle:
            signal.signal(signum, signal.SIG_IGN)


def _handle(signum: int, _frame: object) -> None:
    state = _state
    if state.mode == "exit":
        _exit_now(state.exit_code)
    if state.mode == "start-up":
        if state.pending is None:
            state.pending = signum
        return
    if state.raised is not None:  # an interrupt is unwinding: let it clean up
        state.repeats += 1
        if state.repeats >= 2:
            _write(
                f"error: {rank_tag()}interrupted again; exiting at once (a temp file may be "
                "left; the next run removes it)\n"
            )
            _exit_now(128 + state.raised)
        return
    state.raised = signum
    for hook in _on_interrupt:
        with contextlib.suppress(Exception):
            hook()
    raise Interrupted(signum)


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def pending() -> int | None:
    """The signal that came during start-up and was not acted on yet, if any."""
    return _state.pending


@contextlib.contextmanager
def command() -> Iterator[None]:
    """The command's body: signals raise :class:`Interrupted` (one that came while the
    arguments were parsed is raised as the body starts)."""
    state = _state
    state.raised, state.repeats = None, 0
    if state.pending is not None:
        state.raised, state.pending = state.pending, None
        raise Interrupted(state.raised)
    state.mode = "command"
    try:
        test_point("command")
        yield
    finally:
        if state.mode == "command":
            state.mode = "start-up"  # until finished(): the CLI is mapping the outcome


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """During the command, a block in which a signal is only remembered, as at start-up (an
    import that must not be interrupted); one that came is raised as :class:`Interrupted` as the
    block ends, or dropped if the block failed (the failure is the outcome, as in
    :func:`finished`). Elsewhere a no-op."""
    state = _state
    if state.mode != "command":
        yield
        return
    state.mode = "start-up"
    try:
        test_point("importing")
        yield
    finally:
        if state.mode == "start-up":
            state.mode = "command"
        signum, state.pending = state.pending, None
    if signum is not None:
        state.raised = signum
        for hook in _on_interrupt:
            with contextlib.suppress(Exception):
                hook()
        raise Interrupted(signum)


class StartUpFailed(JbkvError):
    """A module of :data:`GUARDED` failed to import during a command (exit 1, one line)."""


class _Uninterrupted(importlib.abc.Loader):
    """A module's loader, running the module inside :func:`uninterrupted`; its failure is
    :class:`StartUpFailed` (``JBKV_DEBUG=1``: the failure itself, for the traceback)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with uninterrupted():
            try:
                self.loader.exec_module(module)
            except StartUpFailed:  # a guarded module inside this one: said once
                raise
            except Exception as exc:
                if os.environ.get("JBKV_DEBUG"):
                    raise
                raise StartUpFailed(f"cannot start jbkv: {one_line(exc)}") from exc

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, … for tracebacks
        return getattr(self.loader, name)


class _Guard(importlib.abc.MetaPathFinder):
    """Finds nothing itself; hands each module of :data:`GUARDED` an uninterrupted loader."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in GUARDED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Uninterrupted(spec.loader)
        return spec


_guard = _Guard()


def finished(code: int) -> None:
    """The outcome is known (and was printed): from now on a signal exits at once with
    ``code``. A signal still pending from start-up is dropped (the outcome stands)."""
    _state.mode, _state.exit_code, _state.pending = "exit", code, None


def rank_tag() -> str:
    """``"rank 1/4: "`` inside a torchrun job, from the environment alone, else ``""``."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ["RANK"]) if world > 1 else 0
    except (KeyError, ValueError):
        return ""
    return f"rank {rank}/{world}: " if world > 1 and 0 <= rank < world else ""


# --- start-up ---------------------------------------------------------------------------------


def start_up_interrupted() -> None:
    """One line and exit ``128 + N`` for a signal that came during the imports."""
    signum = _state.pending or signal.SIGINT
    name = signal.Signals(signum).name
    _write(f"error: {rank_tag()}interrupted ({name}) during start-up; nothing was written\n")
    sys.exit(128 + signum)


def start_up_failed(exc: BaseException) -> None:
    """One line and exit 1 for an import that failed (a broken install, a memory cap)."""
    try:
        text = f"error: {rank_tag()}cannot start jbkv: {one_line(exc)}\n"
    except Exception:  # out of memory while formatting: say at least that
        text = "error: cannot start jbkv (out of memory?)\n"
    _write(text)
    sys.exit(1)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An unexpected exception as one line: its type and first line (for an import failure, the
    innermost cause, where the library's name is), with a hint when memory ran out."""
    root = exc
    if isinstance(exc, ImportError):
        while (nxt := root.__cause__ or root.__context__) is not None and nxt is not root:
            root = nxt
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    text = f"{type(root).__name__}: {lines[0]}" if lines else type(root).__name__
    text = " ".join(text.split())[:limit]
    chain = f"{exc} {root}".lower()
    if isinstance(root, MemoryError) or any(h in chain for h in _MEMORY_HINTS):
        text += " (out of memory: is a memory limit such as `ulimit -v` too low?)"
    return text


def _write(text: str) -> None:
    """Write to stderr without Python's buffers (safe in a handler and when memory is short)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.write(2, text.encode("utf-8", "replace"))


# --- test seam --------------------------------------------------------------------------------


def test_point(name: str, detail: str = "") -> None:
    """Under ``JBKV_TEST_PAUSE``: announce reaching ``name`` and wait for a signal (see the
    module docstring). A no-op otherwise."""
    spec = os.environ.get(PAUSE_ENV)
    if not spec or _state.paused:
        return
    point, _, pattern = spec.partition(":")
    if point != name or (pattern and not fnmatch.fnmatchcase(detail, pattern)):
        return
    _state.paused = True
    path = os.environ.get(PAUSE_FILE_ENV)
    if path:
        tag = rank_tag()
        suffix = f".rank{os.environ['RANK']}" if tag else ""
        announce = path + suffix
        with open(announce + ".part", "w", encoding="utf-8") as f:
            f.write(name + "\n")
        os.replace(announce + ".part", announce)  # whole when it appears: tests poll for it
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while _state.pending is None and time.monotonic() < deadline:
        time.sleep(0.01)  # a signal runs the handler here: it raises, or sets ``pending``
