"""The installed ``jbkv`` run as a subprocess: exit codes, stderr and the entry point as a user
meets them (``CliRunner`` hides exit-code and entry-point bugs). The one place tests build a
``jbkv`` command line for ``subprocess.run`` (``tests/test_installed.py`` keeps it so)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

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
) -> subprocess.CompletedProcess:
    """``jbkv ARGS`` in ``cwd`` (None: this process's) with its output captured.

    The child's environment is ``environ`` (None: this process's) with ``env`` added, then
    ``JBKV_DEBUG`` removed (errors stay one line) and ``COLUMNS`` set to ``columns`` when given
    (the terminal width). ``stdin`` is what a pipe into it says (None: no pipe, stdin inherited);
    ``timeout`` turns a blocked command into a failure; ``check`` asserts exit 0 (the message is
    its stderr); ``preexec_fn`` runs in the child before ``jbkv`` (a umask, a memory cap)."""
    full = {**(os.environ if environ is None else environ), **(env or {})}
    full.pop("JBKV_DEBUG", None)
    if columns is not None:
        full["COLUMNS"] = str(columns)
    argv = [JBKV, *map(str, args)]
    done = subprocess.run(
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
