"""Atomic file writes: write a hidden temp file next to the target, then ``os.replace``.

A reader sees either the old file or the complete new one, never a partial file. On any
exception (``KeyboardInterrupt`` included) the temp file is removed and the target untouched.
Finished files get the mode a plain ``open()`` would give them (``0666 & ~umask``, e.g. 0644),
not ``mkstemp``'s 0600, so run folders can be shared and served.

Temp names are ``.{name}.~{host}~{pid}~{random}.tmp{suffix}``: hidden (directory scans skip
them), keeping the target's suffix (some writers pick a format from it), and naming the process
that writes them, so :func:`remove_stale_temps` can delete what a killed process left behind
without touching the files of a live one (another rank of the same run, say). ``{host}`` is 8
hex digits of the host name's SHA-256, ``{pid}`` at most :data:`PID_DIGITS` digits and
``{random}`` 8 hex digits, so a temp name is at most :func:`temp_overhead` bytes longer than its
target whatever the host is called: :func:`max_name_bytes` is the longest target name whose
temp name still fits in ``NAME_MAX`` (255 bytes), which is what bounds prompts (file names).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import secrets
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from jbkv_cli.utils import lifecycle
from jbkv_cli.utils.errors import JbkvError, UsageError

NAME_MAX = 255  # bytes of one file name (Linux, macOS, most filesystems)
HOST_CHARS = 8
PID_DIGITS = 10  # any 32-bit process id
TOKEN_CHARS = 8


def host_tag(hostname: str) -> str:
    """The host part of temp names: :data:`HOST_CHARS` hex digits of the name's SHA-256 (any
    host name, however long, gives a name of the same length)."""
    return hashlib.sha256(hostname.encode("utf-8", "surrogateescape")).hexdigest()[:HOST_CHARS]


_HOST = host_tag(socket.gethostname())
_TEMP = re.compile(r"^\..+\.~(?P<host>[A-Za-z0-9_-]+)~(?P<pid>\d+)~[^.]*\.tmp(\.[^.]*)?$")
STALE_OTHER_HOST_SECONDS = 24 * 3600


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path in ``path``'s directory; on success it is renamed onto ``path``.

    The parent directory is created if needed. OSErrors propagate (callers name the file).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temp(target)
    try:
        lifecycle.test_point("writing", target.name)
        yield tmp
        os.chmod(tmp, FILE_MODE)
        _fsync(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def temp_overhead(suffix: str) -> int:
    """Bytes a temp name adds to a target name ending in ``suffix`` (at most)."""
    fixed = len(".") + len(".~") + HOST_CHARS + len("~") + PID_DIGITS + len("~") + TOKEN_CHARS
    return fixed + len(".tmp") + len(suffix.encode())


def max_name_bytes(suffix: str) -> int:
    """The longest target name (UTF-8 bytes) ending in ``suffix`` that :func:`atomic_path` can
    write on any host: its temp name is then at most ``NAME_MAX`` bytes."""
    return NAME_MAX - temp_overhead(suffix)


def _create_temp(target: Path) -> Path:
    """Create (``O_EXCL``, mode 0600) and return a new temp file for ``target``."""
    while True:
        token = secrets.token_hex(TOKEN_CHARS // 2)
        tmp = target.with_name(f".{target.name}.~{_HOST}~{os.getpid()}~{token}.tmp{target.suffix}")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return tmp
        except FileExistsError:
            continue


def write_text_atomic(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically; a failure is one line naming ``path``."""
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding=encoding)
    except OSError as exc:
        raise JbkvError(f"cannot write {path}: {exc.strerror or exc}") from exc


def check_writable_dir(path: str | os.PathLike[str], what: str) -> None:
    """Raise unless files can be created in ``path`` (or, when it does not exist yet, in its
    nearest existing ancestor). Probes with a temp file, so a read-only mount is caught too;
    creates nothing that stays."""
    target = Path(path)
    probe = target
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UsageError(f"{what} {target}: {probe} is not a directory")
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".jbkv-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise JbkvError(f"cannot write {what} {target}: {exc.strerror or exc}") from exc


def check_writable_file(path: str | os.PathLike[str], what: str) -> None:
    """Raise unless ``path`` can be written atomically: not a directory, its folder writable."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{what} {target} is a directory; give a file path")
    check_writable_dir(target.parent, what)


def is_temp(path: Path) -> bool:
    """True for a temp file made by :func:`atomic_path`."""
    return _TEMP.match(path.name) is not None


def remove_stale_temps(root: Path) -> int:
    """Delete temp files under ``root`` whose writer is gone; return how many.

    A temp file of this host is stale when its process no longer exists; one of another host
    (a shared filesystem) when it is older than a day.
    """
    return _remove_stale(Path(root).rglob(".*.tmp*"))


def remove_stale_temps_of(path: str | os.PathLike[str]) -> int:
    """Delete the stale temp files of one target (what a killed writer of ``path`` left next to
    it); return how many. Other files in its folder are not looked at."""
    target = Path(path)
    if not target.parent.is_dir():
        return 0
    return _remove_stale(target.parent.glob(f".{glob.escape(target.name)}.~*~*~*.tmp*"))


def _remove_stale(candidates: Iterable[Path]) -> int:
    removed = 0
    for path in candidates:
        m = _TEMP.match(path.name)
        if m is None or not path.is_file():
            continue
        stale = False
        if m["host"] == _HOST:
            stale = not _alive(int(m["pid"]))
        else:
            with contextlib.suppress(OSError):
                stale = time.time() - path.stat().st_mtime > STALE_OTHER_HOST_SECONDS
        if stale:
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
