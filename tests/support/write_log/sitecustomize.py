"""Test hook for ``tests/run/test_torchrun.py``: log every file a jbkv process commits.

Put this folder on ``PYTHONPATH`` and name a log file in ``JBKV_TEST_WRITE_LOG``: every
``os.replace`` (the last step of each atomic write) into a ``videos/`` or ``metrics/`` folder
appends one JSON line — the process's ``RANK``, the destination, and for a metrics file the
video names it holds — after the rename. Lines are appended with ``O_APPEND``, so the file is
one sequence of commits; one process's lines are in its program order.
"""

import json
import os

_LOG = os.environ.get("JBKV_TEST_WRITE_LOG")

if _LOG:
    _replace = os.replace

    def _logged_replace(src, dst, *args, **kwargs):
        path = os.fspath(dst)
        keys = None
        if "/metrics/" in path and path.endswith(".json"):
            try:
                with open(src, encoding="utf-8") as f:
                    keys = sorted(json.load(f))
            except (OSError, ValueError):
                keys = None
        _replace(src, dst, *args, **kwargs)
        if "/metrics/" in path or "/videos/" in path:
            line = json.dumps({"rank": os.environ.get("RANK", "0"), "path": path, "keys": keys})
            fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)

    os.replace = _logged_replace
