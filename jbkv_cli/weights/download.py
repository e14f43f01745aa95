"""Fetch one manifest entry: resumable download, pin check, atomic move (or unpack) into place.

1. Bytes stream into ``<dest>.part`` with ``urllib`` (no extra dependency). If a ``.part`` is
   there, the request asks for the rest (``Range: bytes=N-``); a server that answers 200
   instead of 206 (or a ``file://`` mirror) restarts it from zero.
2. The finished ``.part`` is checked against the entry's pin (SHA-256, its prefix, or size).
   A mismatch deletes it and raises one line naming the URL: a bad file never lands.
3. ``os.replace`` moves it onto the destination (atomic on one file system); an archive is
   unpacked into a hidden temp folder beside the destination, then moved in item by item.

Network failures keep the ``.part`` so the next ``fetch`` resumes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath

from jbkv_cli import __version__
from jbkv_cli.errors import JbkvError
from jbkv_cli.weights.manifest import WeightEntry
from jbkv_cli.weights.status import CHUNK, check_file, sha256_of

TIMEOUT_S = 60
ProgressFn = Callable[[int, int | None], None]
"""Called as ``progress(bytes_done, bytes_total_or_None)`` while downloading."""


def fetch_entry(
    entry: WeightEntry,
    roots: Mapping[str, Path] | None = None,
    *,
    mirror: str | None = None,
    progress: ProgressFn | None = None,
) -> Path:
    """Download ``entry`` (from ``mirror`` if given), check it, put it in place; return where."""
    url = entry.source_url(mirror)
    part = entry.part_path(roots)
    part.parent.mkdir(parents=True, exist_ok=True)
    digest = _download(url, part, entry.size, progress)
    problem = check_file(entry, part, digest)
    if problem:
        part.unlink(missing_ok=True)
        raise JbkvError(f"{entry.name}: {url} does not match its pin ({problem}); deleted it")
    dest = entry.destination(roots)
    if entry.unpack == "zip":
        try:
            _unpack_zip(part, dest, entry.strip_components)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise JbkvError(f"{entry.name}: cannot unpack {url}: {exc}") from exc
        part.unlink(missing_ok=True)
        absent = [str(p) for p in entry.required_paths(roots) if not p.exists()]
        if absent:
            raise JbkvError(f"{entry.name}: {url} did not provide {', '.join(absent)}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, dest)
    return dest


def _download(url: str, part: Path, size: int | None, progress: ProgressFn | None) -> str:
    """Complete ``part`` from ``url``; return the SHA-256 of the whole file."""
    offset = part.stat().st_size if part.is_file() else 0
    if size is not None and offset > size:
        part.unlink()
        offset = 0
    if size is not None and offset == size:
        return sha256_of(part)
    headers = {"User-Agent": f"jbkv/{__version__}"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            offset = _resume_offset(response, offset)
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length and length.isdigit() else size
            digest = hashlib.sha256()
            if offset:
                _hash_into(digest, part, offset)
            with part.open("r+b" if offset else "wb") as f:
                f.seek(offset)
                f.truncate()
                done = offset
                if progress:
                    progress(done, total)
                while block := response.read(CHUNK):
                    f.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress:
                        progress(done, total)
                f.flush()
                os.fsync(f.fileno())
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:
            return sha256_of(part)  # nothing left to send: the .part is already complete
        raise JbkvError(f"cannot download {url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise JbkvError(f"cannot download {url}: {_reason(exc.reason)}") from None
    except OSError as exc:
        raise JbkvError(f"cannot download {url}: {_reason(exc)}") from None
    if total is not None and done < total:
        raise JbkvError(f"cannot download {url}: connection closed at {done} of {total} bytes")
    return digest.hexdigest()


def _resume_offset(response, offset: int) -> int:
    """Where the body starts: ``offset`` if the server honoured the range, else 0."""
    if not offset or getattr(response, "status", None) != 206:
        return 0
    match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return offset if match and int(match.group(1)) == offset else 0


def _hash_into(digest, path: Path, length: int) -> None:
    with path.open("rb") as f:
        left = length
        while left and (block := f.read(min(CHUNK, left))):
            digest.update(block)
            left -= len(block)


def _unpack_zip(archive: Path, dest: Path, strip: int) -> None:
    """Unpack into a hidden temp folder in ``dest``, then move each top-level item into place."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".jbkv-unpack-") as tmp:
        staging = Path(tmp)
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                parts = PurePosixPath(info.filename).parts[strip:]
                if not parts:
                    continue
                if info.filename.startswith("/") or ".." in parts:
                    raise ValueError(f"unsafe member {info.filename!r}")
                target = staging.joinpath(*parts)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
        for item in staging.iterdir():
            final = dest / item.name
            if final.is_dir() and not final.is_symlink():
                shutil.rmtree(final)
            else:
                with contextlib.suppress(FileNotFoundError):
                    final.unlink()
            os.replace(item, final)


def _reason(exc: object) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())
