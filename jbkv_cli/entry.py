"""The console script ``jbkv`` and ``python -m jbkv_cli``.

Importing the CLI pulls in torch and friends, which takes seconds; a Ctrl-C during that start-up
must still be one line and exit 130. A ``KeyboardInterrupt`` raised *inside* an extension
module's import (torch's pybind11 callbacks) aborts the process from C++ (``terminate called
after throwing … KeyboardInterrupt``, signal 6), so during the imports SIGINT only sets a flag;
the interrupt is honoured as soon as they finish, before any command starts. (The package's
``__init__`` is lazy for the same reason.)
"""

from __future__ import annotations

import signal
import sys

_START_UP_INTERRUPTED = "error: interrupted during start-up; nothing was written\n"


def main() -> None:
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: interrupted.append(signum))
    try:
        from jbkv_cli.cli import main as cli_main
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        sys.stderr.write(_START_UP_INTERRUPTED)
        sys.exit(130)
    cli_main()
