"""Test hook for ``tests/run/test_fault_injection.py``: a full disk for chosen files only.

Put this folder on ``PYTHONPATH`` and list substrings of file names in ``JBKV_TEST_ENOSPC``
(comma-separated): every file whose name contains one of them and is opened for writing is
created, but its writes go to ``/dev/full``, which fails them with ``ENOSPC`` (``No space left
on device``) as a full disk does, in whatever layer writes (Python's ``open``, pathlib, PIL,
matplotlib); ``os.sendfile`` into such a file (``shutil.copyfile`` on Linux) fails the same way.
Temp files of jbkv's atomic writer carry their target's name, so ``report.css`` fails the
write of ``RUN/report/report.css`` wherever it happens.
"""

import builtins
import errno
import io
import os

_NAMES = [n for n in os.environ.get("JBKV_TEST_ENOSPC", "").split(",") if n]

if _NAMES:
    _open = builtins.open
    _sendfile = os.sendfile

    def _full(name) -> bool:
        return isinstance(name, str | bytes | os.PathLike) and any(
            n in os.path.basename(os.fsdecode(name)) for n in _NAMES
        )

    def _open_full(file, mode="r", *args, **kwargs):
        if _full(file) and any(c in mode for c in "wax+"):
            os.close(os.open(file, os.O_WRONLY | os.O_CREAT, 0o666))  # the file exists
            return _open("/dev/full", mode.replace("x", "w").replace("a", "w"), *args, **kwargs)
        return _open(file, mode, *args, **kwargs)

    def _sendfile_full(out_fd, in_fd, offset, count):
        try:
            target = os.readlink(f"/proc/self/fd/{out_fd}")
        except OSError:
            target = ""
        if _full(target) or target == "/dev/full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _sendfile(out_fd, in_fd, offset, count)

    builtins.open = _open_full
    io.open = _open_full
    os.sendfile = _sendfile_full
