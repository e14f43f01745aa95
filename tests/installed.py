"""The installed ``jbkv`` run as a subprocess: exit codes, stderr and the entry point as a user
meets them (``CliRunner`` hides exit-code and entry-point bugs). The one place tests build a
``jbkv`` command line for ``subprocess.run`` (``tests/test_installed.py`` keeps it so)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from tests import warm_start

JBKV = str(Path(sys.executable).with_name("jbkv"))


def run_jbkv(
    *args: object,
    cwd: Path | None = None,
    columns: int | None = None,
    env: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    timeout: float = 900,
    stdin: str | None = None,
    check: bool = False,
    preexec_fn: Callable[[], object] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """``jbkv ARGS`` in ``cwd`` (None: this process's) with its output captured.

    The child's environment is ``environ`` (None: this process's) with ``env`` added, then
    ``JBKV_DEBUG`` removed (errors stay one line) and ``COLUMNS`` set to ``columns`` when given
    (the terminal width). ``stdin`` is what a pipe into it says (None: no pipe, stdin inherited);
    ``timeout`` turns a blocked command into a failure; ``check`` asserts exit 0 (the message is
    its stderr); ``preexec_fn`` runs in the child before ``jbkv`` (a umask, a memory cap).
    The child is started warm (:mod:`tests.warm_start`: a fork of a process that has imported
    torch, running the console script's entry point) unless ``fresh`` or the call needs a new
    interpreter (a ``preexec_fn``, another locale or start-up variable)."""
    full = {**(os.environ if environ is None else environ), **(env or {})}
    full.pop("JBKV_DEBUG", None)
    if columns is not None:
        full["COLUMNS"] = str(columns)
    argv = [JBKV, *map(str, args)]
    done = None
    if not fresh and warm_start.usable(full, preexec_fn):
        done = warm_start.run(JBKV, argv, cwd, full, stdin, timeout)
    done = done or subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full,
        timeout=timeout,
        input=stdin,
        preexec_fn=preexec_fn,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def run_in_process(
    *args: object,
    cwd: Path | None = None,
    columns: int | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess:
    """``jbkv ARGS`` through the same Typer app inside this process (Typer's ``CliRunner``), in
    ``cwd``, with ``env`` added to the environment and ``JBKV_DEBUG`` removed: the exit code,
    stdout and stderr :func:`run_jbkv` gets for a command that answers from its arguments and
    files (usage errors, refusals, ``report``), without a new interpreter importing torch (about
    3 s of CPU a call). ``stdin`` is what ``sys.stdin`` says meanwhile (an in-memory stream, not
    a pipe or a terminal; None: empty). Environment variables that a library reads once, when it
    is imported (``HF_HOME``, ``HF_HUB_OFFLINE``), keep this process's values. Not for signals,
    a real pipe or terminal on stdin, the console script or start-up: a test that uses it for
    many cases runs at least one of them through :func:`run_jbkv` as well, which must answer
    the same."""
    from typer.testing import CliRunner

    from jbkv_cli.cli.app import app

    extra: dict[str, str | None] = {"JBKV_DEBUG": None, **(env or {})}
    if columns is not None:
        extra["COLUMNS"] = str(columns)
    argv = [str(a) for a in args]
    with contextlib.chdir(cwd if cwd is not None else os.getcwd()):
        done = CliRunner().invoke(app, argv, input=stdin, env=extra, catch_exceptions=False)
    return subprocess.CompletedProcess(["jbkv", *argv], done.exit_code, done.stdout, done.stderr)


def run_refusal(
    *args: object,
    installed: bool,
    cwd: Path | None = None,
    columns: int | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``jbkv ARGS`` for a command refused from its arguments and files: :func:`run_in_process`,
    and with ``installed`` also :func:`run_jbkv`, which must answer with the same exit code,
    stdout and stderr. A parametrized test of refusals passes ``installed`` for one case (its
    first), so the console script is checked without every case paying a new interpreter."""
    done = run_in_process(*args, cwd=cwd, columns=columns, env=env)
    if installed:
        real = run_jbkv(*args, cwd=cwd, columns=columns, env=env)
        assert (real.returncode, real.stdout, real.stderr) == (
            done.returncode,
            done.stdout,
            done.stderr,
        ), "the installed jbkv answers otherwise than the same app in process"
    return done
