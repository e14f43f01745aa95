"""Reading safetensors checkpoints: pickles refused, bad files and key mismatches as one line.

jbkv never executes pickle code from a checkpoint. A file saved by ``torch.save`` (a zip archive,
or a bare pickle) is recognised by its first bytes and refused with a hint to convert it; a file
that is not a well-formed safetensors file, or a truncated one, is a one-line error naming it.
Only regular files are read: a path (or symlink) to a directory, a FIFO or a device such as
``/dev/zero`` is refused as "not a regular file" before anything is read from it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from jbkv_cli.utils.errors import JbkvError

_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default format: a zip archive holding a pickle
_PICKLE_PROTOCOLS = range(2, 6)  # a bare pickle starts with b"\x80" and its protocol byte
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, from its ``st_mode``, in words (``"a FIFO"``)."""
    return next((name for test, name in _KINDS if test(mode)), "an unknown kind of file")


def not_regular(path: str | Path) -> str | None:
    """``"{path} is not a regular file (a FIFO)"`` when ``path`` (symlinks followed) exists and
    is not a regular file; None for a regular file or a missing path (callers word "not found"
    themselves). Reading a FIFO blocks forever and a device never ends, so nothing else is read.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    where = f": {os.path.realpath(path)}" if os.path.islink(path) else ""
    return f"{path} is not a regular file ({kind_of(mode)}{where})"


def check_safetensors(path: Path) -> None:
    """Raise :class:`JbkvError` unless ``path`` starts like a safetensors file.

    safetensors layout: an 8-byte little-endian header length ``N``, then ``N`` bytes of JSON
    starting with ``{``, then the tensor data.
    """
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise JbkvError(f"weights {path} is not a regular file ({kind_of(info.st_mode)})")
            head = os.read(fd, 9)
        finally:
            os.close(fd)
        size = info.st_size
    except OSError as exc:
        raise JbkvError(f"cannot read weights {path}: {exc.strerror or exc}") from exc
    if head.startswith(_ZIP_MAGIC) or (
        len(head) > 1 and head[0] == 0x80 and head[1] in _PICKLE_PROTOCOLS
    ):
        raise JbkvError(
            f"{path} is a pickle checkpoint (torch.save); jbkv refuses pickles because loading "
            "them runs code: convert it to safetensors"
        )
    if len(head) < 9:
        raise JbkvError(f"{path} is not a safetensors file ({size} bytes)")
    (header_len,) = struct.unpack("<Q", head[:8])
    if header_len + 8 > size or head[8:9] != b"{":
        raise JbkvError(f"{path} is not a safetensors file, or it is truncated")


@contextlib.contextmanager
def open_safetensors(path: str | Path) -> Iterator[Any]:
    """``safe_open(path)`` on the CPU after :func:`check_safetensors`; reading errors are one
    line naming the file."""
    path = Path(path)
    check_safetensors(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            yield handle
    except SafetensorError as exc:
        reason = " ".join(str(exc).split())[:200]
        raise JbkvError(f"cannot read weights {path}: {reason}") from exc


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Raise one :class:`JbkvError` listing missing, unexpected and wrongly shaped tensors."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(
        f"{k} {tuple(state[k].shape)} != {expected[k]}"
        for k in set(expected) & set(state)
        if tuple(state[k].shape) != expected[k]
    )
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
        if items:
            shown = ", ".join(items[:5]) + (f", … ({len(items)} in all)" if len(items) > 5 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise JbkvError(f"{what} does not match the model: " + "; ".join(problems))
