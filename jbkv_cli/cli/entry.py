"""The console script ``jbkv`` and ``python -m jbkv_cli``.

Importing the CLI imports no torch (its commands import the library once their options are
checked: ``--help`` and usage errors answer in a fraction of a second). The signal handler of
:mod:`jbkv_cli.utils.lifecycle` is installed before anything else and stays until the process exits:
during the imports (and a command's first import of torch) SIGINT, SIGTERM and SIGHUP only set a
flag (an interrupt raised *inside* torch's import aborts the process from C++, signal 6), and
such a signal is honoured as soon as they finish: one line, exit ``128 + N``. An import that
fails (a broken install, a memory cap such as ``ulimit -v`` too low for torch's libraries) is
one line and exit 1, not a traceback (``JBKV_DEBUG=1`` shows it). (The package's ``__init__`` is
lazy for the same reasons.)
"""

from __future__ import annotations

import os
import sys

from jbkv_cli.utils import lifecycle


def main() -> None:
    lifecycle.install()
    lifecycle.test_point("start-up")
    try:
        from jbkv_cli.cli.app import exit_code_for
        from jbkv_cli.cli.app import main as cli_main
    except Exception as exc:  # any import failure is one line
        if os.environ.get("JBKV_DEBUG"):
            raise
        lifecycle.start_up_failed(exc)
    if lifecycle.pending() is not None:
        lifecycle.start_up_interrupted()
    lifecycle.test_point("imported")
    try:
        cli_main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        lifecycle.finished(code)
        raise
    except KeyboardInterrupt as exc:  # only if one escaped the command's own mapping
        code = exit_code_for(exc)
        lifecycle.finished(code)
        sys.exit(code)
    lifecycle.finished(0)
