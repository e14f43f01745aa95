"""Test hook for ``tests/run/test_fault_injection.py``: ``kill -9`` at an exact write.

Put this folder on ``PYTHONPATH`` and set ``JBKV_TEST_KILL_AT=N:before`` (or ``N:after``) and
``JBKV_TEST_KILL_MATCH=SUBSTRING``: the process sends itself SIGKILL just before (or just after)
its N-th ``os.replace`` onto a path containing SUBSTRING, the last step of each atomic write. So
a test kills a command between two given writes, or with one write complete but not yet in
place, deterministically instead of at a moment it hopes for.
"""

import os
import signal

_AT = os.environ.get("JBKV_TEST_KILL_AT", "")
_MATCH = os.environ.get("JBKV_TEST_KILL_MATCH", "")

if _AT and _MATCH:
    _n, _, _when = _AT.partition(":")
    _count = [0]
    _replace = os.replace

    def _replace_then_maybe_die(src, dst, *args, **kwargs):
        hit = _MATCH in os.fspath(dst)
        if hit:
            _count[0] += 1
        last = hit and _count[0] == int(_n)
        if last and _when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = _replace(src, dst, *args, **kwargs)
        if last:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    os.replace = _replace_then_maybe_die
