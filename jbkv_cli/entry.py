"""The console script ``jbkv`` and ``python -m jbkv_cli``.

Importing the CLI pulls in torch and friends, which takes seconds; a Ctrl-C during that start-up
must still be one line and exit 130, so the import happens here, inside the handler. (The
package's ``__init__`` is lazy for the same reason.)
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from jbkv_cli.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted during start-up; nothing was written\n")
        sys.exit(130)
