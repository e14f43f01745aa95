"""The installed ``jbkv`` run as a subprocess: exit codes, stderr and the entry point as a user
meets them (``CliRunner`` hides exit-code and entry-point bugs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

JBKV = str(Path(sys.executable).with_name("jbkv"))


def run_jbkv(
    *args: object,
    cwd: Path,
    columns: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 900,
    stdin: str | None = None,
) -> subprocess.CompletedProcess:
    """``jbkv ARGS`` in ``cwd`` with its output captured: ``JBKV_DEBUG`` unset (errors stay one
    line), ``columns`` the terminal width, ``env`` added to this process's environment, ``stdin``
    what a pipe into it says (None: no pipe, stdin inherited)."""
    full = {**os.environ, **(env or {})}
    full.pop("JBKV_DEBUG", None)
    if columns is not None:
        full["COLUMNS"] = str(columns)
    argv = [JBKV, *map(str, args)]
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, env=full, timeout=timeout, input=stdin
    )
