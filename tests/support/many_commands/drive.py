"""Test driver for ``tests/cli/test_startup.py``: many ``jbkv`` command lines in one fresh
interpreter, each through the app the console script runs (``jbkv_cli.cli.app.main``).

    python drive.py '[["--help"], ["generate", "--steps", "0"]]'

Prints one JSON list: per command line its exit code, its stdout, its stderr lines and the modules it
imported that no earlier command line had (``sys.modules`` before and after), so a start-up
check of many commands costs one interpreter instead of one each.
"""

import contextlib
import io
import json
import sys


def one(args: list[str]) -> dict:
    before = set(sys.modules)
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["jbkv", *args]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            from jbkv_cli.cli.app import main

            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return {
        "args": args,
        "code": code,
        "stdout": out.getvalue(),
        "stderr": err.getvalue().splitlines(),
        "modules": sorted(set(sys.modules) - before),
    }


if __name__ == "__main__":
    results = [one(args) for args in json.loads(sys.argv[1])]
    sys.stdout.write(json.dumps(results))
