"""An exclusive lock between processes (and threads) around a short read-modify-write.

:func:`locked` holds ``fcntl.flock`` on a hidden lock file for the length of a ``with`` block and
deletes the file before letting go, so a run folder keeps no lock file between commands (and a
lock file a killed process left is taken over and deleted by the next one). Deleting a lock file
others may be waiting on is safe because a waiter that gets the lock checks that the path still
names the file it locked, and starts over when it does not.

Locks are per open file, so two threads of one process exclude each other as two processes do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from jbkv_cli.utils.atomic import FILE_MODE
from jbkv_cli.utils.errors import JbkvError


@contextlib.contextmanager
def locked(path: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) inside the block.

    ``on_wait`` is called once when another holder makes this one wait (a test seam: it lets a
    test see that a second writer is blocked, instead of sleeping and hoping).
    """
    fd = _acquire(Path(path), on_wait)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # still holding the lock: waiters see the path is gone and retry
        os.close(fd)  # releases the lock


def _acquire(path: Path, on_wait: Callable[[], None] | None) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError as exc:
            raise JbkvError(f"cannot create the lock file {path}: {exc.strerror or exc}") from exc
        try:
            _lock(fd, path, on_wait)
            if _same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder before us deleted it: lock the new one


def _lock(fd: int, path: Path, on_wait: Callable[[], None] | None) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise JbkvError(f"cannot lock {path}: {exc.strerror or exc}") from exc
    if on_wait is not None:
        on_wait()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        raise JbkvError(f"cannot lock {path}: {exc.strerror or exc}") from exc


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)
