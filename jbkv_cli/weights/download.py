"""Fetch one manifest entry: resumable download, size and pin checks, atomic move (or unpack).

1. Before anything is created: the destination must stay inside its root once symlinks are
   followed, and an archive must not have to replace an item jbkv did not unpack
   (:mod:`~jbkv_cli.weights.unpack`).
2. Bytes stream into ``<dest>.part`` with ``urllib`` (no extra dependency). If a ``.part`` is
   there, the request asks for the rest (``Range: bytes=N-``); a server that answers 200
   instead of 206 (or a ``file://`` mirror) restarts it from zero, and so does a 206 for another
   range. A 416 (nothing left to send) means the ``.part`` is complete only when the server's
   ``Content-Range: bytes */N`` says the file has exactly its length; a longer (stale) or
   unsized ``.part`` is discarded and the file downloaded again.
3. Sizes are checked wherever they are known: the file's total (``Content-Range`` or
   ``Content-Length``) against the pinned size before the body is read, and the bytes received
   against that total after it. A file whose size disagrees is never installed.
4. The finished ``.part`` is checked against the entry's pin (SHA-256, its prefix, or size).
   A mismatch deletes it and raises one line naming the URL: a bad file never lands.
5. ``os.replace`` moves it onto the destination (atomic on one file system); an archive is
   unpacked by :func:`~jbkv_cli.weights.unpack.unpack_zip` and then deleted.

Every failure is one :class:`~jbkv_cli.utils.errors.JbkvError` line naming the URL (or the local
file). The ``.part`` is kept only when the network failed (refused, reset, timed out, a body
cut short, a garbled reply, an HTTP error), so the next ``fetch`` resumes it; a pin or size
mismatch, a local write error and an archive that cannot be unpacked delete it.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from jbkv_cli import __version__
from jbkv_cli.metrics.vbench_weights import cache_roots
from jbkv_cli.utils.errors import JbkvError, shown
from jbkv_cli.weights.manifest import WeightEntry, outside_root
from jbkv_cli.weights.status import CHUNK, check_file, sha256_of
from jbkv_cli.weights.unpack import UnpackError, check_items, unpack_zip

TIMEOUT_S = 60
ProgressFn = Callable[[int, int | None], None]
"""Called as ``progress(bytes_done, bytes_total_or_None)`` while downloading."""
WarnFn = Callable[[str], None]

# What the network side of urllib can raise: OSError covers sockets, timeouts, TLS and
# URLError/HTTPError; HTTPException covers BadStatusLine, IncompleteRead, LineTooLong…;
# ValueError covers malformed URLs (http.client.InvalidURL, a bad port, IDNA).
_NETWORK_ERRORS = (OSError, http.client.HTTPException, ValueError)


class _Restart(Exception):
    """The ``.part`` cannot be resumed: discard it and download from byte 0."""


class _PinMismatch(Exception):
    """The server's size for the file disagrees with the pinned size (the message says how)."""


class _WriteError(Exception):
    """Writing the ``.part`` failed (a local problem, not the network's)."""


def fetch_entry(
    entry: WeightEntry,
    roots: Mapping[str, Path] | None = None,
    *,
    mirror: str | None = None,
    progress: ProgressFn | None = None,
    warn: WarnFn | None = None,
) -> Path:
    """Download ``entry`` (from ``mirror`` if given), check it, put it in place; return where.

    ``warn`` receives one-line warnings (archive members outside the entry's items, ignored).
    Every failure is a :class:`JbkvError` of one line; a local file-system error names the file.
    """
    try:
        return _fetch(entry, dict(roots or cache_roots()), mirror, progress, warn)
    except OSError as exc:  # local: a read-only cache, a full disk while unpacking…
        where = f" {exc.filename}" if exc.filename else ""
        raise JbkvError(f"{entry.name}: cannot write{where}: {_reason(exc)}") from None


def _fetch(
    entry: WeightEntry,
    roots: dict[str, Path],
    mirror: str | None,
    progress: ProgressFn | None,
    warn: WarnFn | None,
) -> Path:
    problem = outside_root(entry, roots)
    if problem:
        raise JbkvError(problem)
    if entry.unpack == "zip":
        try:
            check_items(entry, roots)
        except UnpackError as exc:
            raise JbkvError(f"{entry.name}: {exc}") from None
    url = entry.source_url(mirror)
    part = entry.part_path(roots)
    part.parent.mkdir(parents=True, exist_ok=True)
    try:
        digest = _download(url, part, entry.size, progress)
    except _PinMismatch as exc:
        raise JbkvError(f"{entry.name}: {url} does not match its pin ({exc}); deleted it") from None
    problem = check_file(entry, part, digest)
    if problem:
        part.unlink(missing_ok=True)
        raise JbkvError(f"{entry.name}: {url} does not match its pin ({problem}); deleted it")
    if entry.unpack == "zip":
        return _install_archive(entry, part, url, roots, warn)
    dest = entry.destination(roots)
    try:
        os.replace(part, dest)
    except OSError as exc:
        raise JbkvError(
            f"{entry.name}: cannot move the verified download onto {dest}: {_reason(exc)} "
            f"(kept as {part})"
        ) from None
    return dest


def _install_archive(
    entry: WeightEntry, part: Path, url: str, roots: dict[str, Path], warn: WarnFn | None
) -> Path:
    """Unpack the downloaded archive into the entry's items, then delete it (either way)."""
    try:
        ignored = unpack_zip(entry, part, roots)
    except UnpackError as exc:
        raise JbkvError(f"{entry.name}: cannot unpack {url}: {exc}; deleted it") from None
    except OSError as exc:
        where = f" into {exc.filename}" if exc.filename else ""
        raise JbkvError(
            f"{entry.name}: cannot unpack {url}{where}: {_reason(exc)}; deleted it"
        ) from None
    finally:
        part.unlink(missing_ok=True)
    if ignored and warn:
        names = ", ".join(shown(n, 40) for n in ignored[:3])
        more = f" and {len(ignored) - 3} more" if len(ignored) > 3 else ""
        warn(
            f"{entry.name}: ignored {len(ignored)} archive member(s) outside what the manifest "
            f"declares ({names}{more})"
        )
    return entry.destination(roots)


def _download(url: str, part: Path, size: int | None, progress: ProgressFn | None) -> str:
    """Complete ``part`` from ``url``; return the SHA-256 of the whole file."""
    offset = part.stat().st_size if part.is_file() else 0
    if size is not None and offset > size:
        part.unlink()
        offset = 0
    if size is not None and offset and offset == size:
        return sha256_of(part)
    try:
        return _transfer(url, part, offset, size, progress)
    except _Restart:
        part.unlink(missing_ok=True)
        return _transfer(url, part, 0, size, progress)


def _transfer(
    url: str, part: Path, offset: int, size: int | None, progress: ProgressFn | None
) -> str:
    """One request: write the body into ``part`` from ``offset``; return the file's SHA-256."""
    headers = {"User-Agent": f"jbkv/{__version__}"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S
        )
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and offset:
            if _range_total(exc.headers.get("Content-Range", "")) == offset:
                return sha256_of(part)  # nothing left to send: the .part is the whole file
            raise _Restart from None  # a .part longer than the file, or of unknown size
        raise JbkvError(f"cannot download {url}: {_http_reason(exc)}") from None
    except _NETWORK_ERRORS as exc:
        raise JbkvError(f"cannot download {url}: {_reason(exc)}") from None
    with response:
        start, total = _body_range(response, offset)
        if size is not None and total is not None and total != size:
            part.unlink(missing_ok=True)
            raise _PinMismatch(f"the server says {total} bytes, expected {size}")
        try:
            done, digest = _stream(response, part, start, total, progress)
        except _WriteError as exc:
            part.unlink(missing_ok=True)
            raise JbkvError(f"cannot write {part}: {_reason(exc.__cause__)}") from None
        except _NETWORK_ERRORS as exc:
            raise JbkvError(f"cannot download {url}: {_reason(exc)}{_kept(part)}") from None
    if total is not None and done < total:
        raise JbkvError(
            f"cannot download {url}: connection closed at {done} of {total} bytes{_kept(part)}"
        )
    if total is not None and done > total:
        part.unlink(missing_ok=True)
        raise JbkvError(f"cannot download {url}: sent {done} bytes, more than its {total}")
    return digest


def _body_range(response, offset: int) -> tuple[int, int | None]:
    """Where the body starts in the file and the file's total size (None: not said).

    A 206 for another range than ``offset``'s raises :class:`_Restart`; any other success
    starts at byte 0 (a server without ranges, a ``file://`` mirror).
    """
    length = response.headers.get("Content-Length", "")
    length = int(length) if length.strip().isdigit() else None
    if not offset or getattr(response, "status", None) != 206:
        return 0, length
    content_range = response.headers.get("Content-Range", "")
    match = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", content_range)
    if not match or int(match.group(1)) != offset:
        raise _Restart
    start, end = int(match.group(1)), int(match.group(2))
    total = int(match.group(3)) if match.group(3) != "*" else None
    if end < start or (total is not None and end >= total):
        raise _Restart
    if length is not None and length != end - start + 1:
        raise _Restart
    return start, total if total is not None else end + 1


def _stream(
    response, part: Path, start: int, total: int | None, progress: ProgressFn | None
) -> tuple[int, str]:
    """Append the body to ``part`` (truncated at ``start``); return (bytes in file, SHA-256).

    Network errors propagate as they are; a failure to write raises :class:`_WriteError`.
    """
    digest = hashlib.sha256()
    try:
        if start:
            _hash_into(digest, part, start)
        f = part.open("r+b" if start else "wb")
    except OSError as exc:
        raise _WriteError from exc
    with f:
        try:
            f.seek(start)
            f.truncate()
        except OSError as exc:
            raise _WriteError from exc
        done = start
        if progress:
            progress(done, total)
        while block := response.read(CHUNK):
            try:
                f.write(block)
            except OSError as exc:
                raise _WriteError from exc
            digest.update(block)
            done += len(block)
            if progress:
                progress(done, total)
        try:
            f.flush()
            os.fsync(f.fileno())
        except OSError as exc:
            raise _WriteError from exc
    return done, digest.hexdigest()


def _range_total(content_range: str) -> int | None:
    """N of ``Content-Range: bytes */N`` (or ``bytes A-B/N``); None when not said."""
    match = re.fullmatch(r"\s*bytes\s+(?:\*|\d+-\d+)/(\d+)\s*", content_range)
    return int(match.group(1)) if match else None


def _hash_into(digest, path: Path, length: int) -> None:
    with path.open("rb") as f:
        left = length
        while left and (block := f.read(min(CHUNK, left))):
            digest.update(block)
            left -= len(block)


def _kept(part: Path) -> str:
    """After a network failure: keep a ``.part`` with bytes in it (say so), drop an empty one."""
    try:
        size = part.stat().st_size
    except OSError:
        return ""
    if not size:
        part.unlink(missing_ok=True)
        return ""
    return f"; the .part ({size} bytes) is kept, fetch again to resume"


def _http_reason(exc: urllib.error.HTTPError) -> str:
    if 300 <= exc.code < 400:
        return f"redirect loop or too many redirects (last: HTTP {exc.code})"
    return f"HTTP {exc.code} {_reason(exc.reason)}"


def _reason(exc: object) -> str:
    """One line saying why: a socket's strerror, a URLError's reason, an http.client class."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        exc = exc.reason
    if isinstance(exc, http.client.IncompleteRead):
        return "the body was cut short (IncompleteRead)"
    if isinstance(exc, http.client.HTTPException) and not isinstance(exc, OSError):
        text = " ".join(str(exc).split())
        return f"bad reply ({type(exc).__name__}: {shown(text)})" if text else type(exc).__name__
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())[:300]
