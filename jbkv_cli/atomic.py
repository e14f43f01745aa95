"""Atomic file writes: write a hidden temp file next to the target, then ``os.replace``.

A reader sees either the old file or the complete new one, never a partial file. On any
exception (``KeyboardInterrupt`` included) the temp file is removed and the target untouched.
Temp names start with ``.`` and end in ``.tmp<suffix>`` so directory scans can skip them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path in ``path``'s directory; on success it is renamed onto ``path``.

    The temp file keeps ``path``'s suffix (some writers pick a format from it). The parent
    directory is created if needed.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=f".tmp{target.suffix}"
    )
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding=encoding)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
