"""Reading files a user names (head profiles, baselines, prompt files, weight manifests) safely.

Any path on a command line may be a FIFO (``open`` blocks until a writer comes), a device
(``/dev/zero`` never ends), a huge file or a JSON document nested deeply enough to exhaust the
interpreter's recursion limit. :func:`read_bytes` opens without blocking, reads regular files
only and at most ``limit`` bytes; :func:`parse_json` decodes UTF-8 (a byte-order mark is
dropped) and JSON, refusing what :mod:`json` would otherwise turn into ``NaN``/``inf`` or a
``RecursionError``. Every failure is one :class:`FileReadError` naming the file and the cause.

Caps: :data:`MAX_JSON_BYTES` (64 MiB) for JSON documents, :data:`MAX_TEXT_BYTES` (16 MiB) for
text such as prompt files; callers may pass their own.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from jbkv_cli.utils.errors import JbkvError

MAX_JSON_BYTES = 64 * 2**20
MAX_TEXT_BYTES = 16 * 2**20


class FileReadError(JbkvError):
    """A file that cannot be used: ``path`` and the ``reason``, as one line (exit 1)."""

    def __init__(self, what: str, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"cannot read {what + ' ' if what else ''}{path}: {reason}")


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 and n % 2**20 == 0 else f"{n:,} bytes"


def read_bytes(path: str | os.PathLike[str], what: str = "", limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file (symlinks followed) of at most ``limit``
    bytes. A FIFO, device or directory is refused without blocking or reading it."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise FileReadError(what, path, exc.strerror or str(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileReadError(what, path, f"not a regular file ({_kind(info.st_mode)})")
        if info.st_size > limit:
            raise FileReadError(what, path, f"larger than {_size(limit)}")
        chunks, total = [], 0
        while block := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(block)
            total += len(block)
            if total > limit:  # the file grew while being read
                raise FileReadError(what, path, f"larger than {_size(limit)}")
        return b"".join(chunks)
    except OSError as exc:
        raise FileReadError(what, path, exc.strerror or str(exc)) from None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def decode_text(data: bytes, path: str | os.PathLike[str], what: str = "") -> str:
    """UTF-8 text of ``data`` without a leading byte-order mark; the first bad byte is named."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileReadError(what, path, f"not UTF-8 text (byte {exc.start})") from None


def read_text(path: str | os.PathLike[str], what: str = "", limit: int = MAX_TEXT_BYTES) -> str:
    """:func:`read_bytes` then :func:`decode_text`."""
    return decode_text(read_bytes(path, what, limit), path, what)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def parse_json(
    data: bytes | str, path: str | os.PathLike[str], what: str = "", *, finite: bool = True
) -> Any:
    """The JSON document in ``data`` (bytes: UTF-8, a byte-order mark dropped). With ``finite``
    (the default) ``NaN``, ``Infinity`` and numbers beyond a float's range are refused."""
    text = decode_text(data, path, what) if isinstance(data, bytes) else data
    hooks: dict[str, Any] = {"parse_constant": _no_constant, "parse_float": _finite}
    try:
        return json.loads(text, **(hooks if finite else {}))
    except json.JSONDecodeError as exc:
        raise FileReadError(
            what, path, f"invalid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise FileReadError(what, path, "invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # a hook's refusal, or an integer of more than 4300 digits
        reason = "an integer with too many digits" if "digits" in str(exc) else str(exc)
        raise FileReadError(what, path, f"invalid JSON ({reason[:120]})") from None


def read_json(
    path: str | os.PathLike[str],
    what: str = "",
    limit: int = MAX_JSON_BYTES,
    *,
    finite: bool = True,
) -> Any:
    """The JSON document in the regular file ``path`` (at most ``limit`` bytes); any problem is
    one :class:`FileReadError` naming ``path``."""
    return parse_json(read_bytes(path, what, limit), path, what, finite=finite)


__all__ = [
    "MAX_JSON_BYTES",
    "MAX_TEXT_BYTES",
    "FileReadError",
    "decode_text",
    "parse_json",
    "read_bytes",
    "read_json",
    "read_text",
]
