"""Input fingerprints: the files a run is made from, identified by their content.

A run folder pairs results made at different times, so they are comparable only when they were
made from the same inputs. A path does not say that (a file replaced in place keeps its path),
so a run keeps the SHA-256 of every file it reads, and a resume whose files differ is refused
with one line naming the file (exit 1) before anything is written:

- the model's files (a video model's ``input_paths``, :func:`jbkv_cli.models.registry.input_paths`;
  llm-prefill's model folder) in the manifest's ``inputs``: key -> ``{"path", "sha256"}``, a
  folder's files keyed ``role/relative path`` (:func:`expand`);
- each case's image and pose or actions JSON (:func:`case_digests`) in the manifest's
  ``cases.<name>.sha256`` and in each video's record.

A run made before jbkv kept these has none: its first resume records the files as they are then
(there is nothing older to compare them with).

**The digest cache.** Hashing reads a whole file (a model's weights are tens of GB), so the
digest of a file of at least :data:`CACHED_MIN_BYTES` is kept in ``file-digests.json`` in the
user's cache folder (``$JBKV_CACHE_DIR``, else ``$XDG_CACHE_HOME/jbkv``, else
``~/.cache/jbkv``), keyed by the file's real path and its stamp (size, ``mtime_ns``,
``ctime_ns``, inode, device). The user's cache rather than the run folder: one set of weights
serves many runs (every ``--out``, every model of a quantize-eval), and a new run folder should
not read 30 GB again.

The trade-off: a cached digest is trusted while the stamp is unchanged. Every write sets
``ctime`` (which, unlike ``mtime``, no unprivileged process can set back) and a replaced file
gets a new inode, so a same-size rewrite with its ``mtime`` restored is still seen. Missed is
a change the kernel does not stamp: a filesystem that keeps no ``ctime`` (some FUSE and network
mounts), a device written below the filesystem, a clock set back. A file whose ``ctime`` is
less than :data:`RACY_NS` before its hashing began is not cached (git's "racy" rule: a second
write in the same clock tick would leave its stamp unchanged), and smaller files (images, pose
and action files, configs) are hashed every time. The cache is only a cache: a damaged or
unreadable one is ignored, an unwritable folder means nothing is saved, and a file at its path
that jbkv did not write is neither used nor replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from jbkv_cli.models.cases import Case
from jbkv_cli.utils.errors import JbkvError, shown
from jbkv_cli.utils.jsonio import read_bytes

CACHE_ENV = "JBKV_CACHE_DIR"
CACHE_FILE = "file-digests.json"
CACHE_KIND = "jbkv file digests"
CACHED_MIN_BYTES = 1 << 20
RACY_NS = 2_000_000_000  # coarsest common timestamp tick (FAT: 2 s), with margin for the rest
MAX_ENTRIES = 20_000
BLOCK = 1 << 20

Fingerprint = dict[str, dict[str, str]]  # key -> {"path": ..., "sha256": ...}


def cache_dir() -> Path:
    """``$JBKV_CACHE_DIR``, else ``$XDG_CACHE_HOME/jbkv``, else ``~/.cache/jbkv``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "jbkv"


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _hash_open(path: Path) -> tuple[str, os.stat_result]:
    """SHA-256 of the regular file ``path`` (symlinks followed), streamed in blocks, and its
    stat from before the read; a FIFO or device is refused without blocking."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise JbkvError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JbkvError(f"cannot read {path}: not a regular file")
        digest = hashlib.sha256()
        while block := os.read(fd, BLOCK):
            digest.update(block)
        return digest.hexdigest(), st
    except OSError as exc:
        raise JbkvError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


class DigestCache:
    """File digests by real path and stamp, loaded from and saved to ``path`` (module
    docstring: what is trusted, what is not)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, list[Any]] = {}
        self.dirty = False
        self.ours = not os.path.lexists(path)  # else: True once it reads as jbkv's cache
        with contextlib.suppress(JbkvError, ValueError, RecursionError):
            data = json.loads(read_bytes(path, "digest cache"))
            if isinstance(data, dict) and data.get("kind") == CACHE_KIND:
                entries = data.get("entries")
                self.entries = entries if isinstance(entries, dict) else {}
                self.ours = True

    def digest(self, path: Path) -> str:
        """The SHA-256 of ``path``: from the cache when its stamp is the one cached, else read
        (and cached when the file is large and was not written within :data:`RACY_NS`)."""
        real = os.path.realpath(path)
        with contextlib.suppress(OSError):
            st = os.stat(real)
            kept = self.entries.get(real)
            if (
                st.st_size >= CACHED_MIN_BYTES
                and isinstance(kept, list)
                and len(kept) == 2
                and kept[0] == _stamp(st)
                and isinstance(kept[1], str)
            ):
                return kept[1]
        started = time.time_ns()
        digest, st = _hash_open(Path(real))
        with contextlib.suppress(OSError):
            after = os.stat(real)
            settled = max(after.st_ctime_ns, after.st_mtime_ns) < started - RACY_NS
            if st.st_size >= CACHED_MIN_BYTES and _stamp(after) == _stamp(st) and settled:
                self.entries.pop(real, None)
                self.entries[real] = [_stamp(st), digest]
                self.dirty = True
        return digest

    def save(self) -> None:
        """Write the cache (best effort, atomically): entries whose file is gone or changed
        are dropped, and the newest :data:`MAX_ENTRIES` kept."""
        if not (self.dirty and self.ours):
            return
        from jbkv_cli.utils.atomic import write_text_atomic

        kept = {}
        for real, entry in self.entries.items():
            with contextlib.suppress(OSError, TypeError, IndexError):
                if entry[0] == _stamp(os.stat(real)):
                    kept[real] = entry
        kept = dict(list(kept.items())[-MAX_ENTRIES:])
        text = json.dumps({"kind": CACHE_KIND, "entries": kept}) + "\n"
        with contextlib.suppress(OSError, JbkvError):
            write_text_atomic(self.path, text)
            self.dirty = False


def sha256_files(paths: Iterable[Path]) -> list[str]:
    """The SHA-256 of each file, through the digest cache (saved once at the end)."""
    cache = DigestCache(cache_dir() / CACHE_FILE)
    try:
        return [cache.digest(Path(p)) for p in paths]
    finally:
        cache.save()


def _visible(path: Path, top: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(top).parts)


def expand(roles: Mapping[str, Path | None]) -> dict[str, Path]:
    """Every file of ``roles`` (role -> a file or a folder; None left out): a file under its
    role, a folder's regular files (symlinks followed, hidden names skipped) as
    ``role/relative path``, sorted."""
    out: dict[str, Path] = {}
    for role, path in roles.items():
        if path is None:
            continue
        path = Path(path)
        if not path.is_dir():
            out[role] = path
            continue
        found = [p for p in path.rglob("*") if p.is_file() and _visible(p, path)]
        for p in sorted(found):
            out[f"{role}/{p.relative_to(path).as_posix()}"] = p
    return out


def fingerprint(files: Mapping[str, Path]) -> Fingerprint:
    """``{key: {"path": absolute path, "sha256": digest}}`` of ``files`` (key -> file)."""
    keys = list(files)
    digests = sha256_files(files[k] for k in keys)
    return {
        k: {"path": os.path.abspath(files[k]), "sha256": d}
        for k, d in zip(keys, digests, strict=True)
    }


def change(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """Why ``current`` is not the fingerprint ``recorded`` (the first file that changed,
    appeared or is gone, by path, as one phrase), or None when they match."""
    for key, now in current.items():
        then = recorded.get(key)
        if then is None:
            return f"{now['path']} is read now but was not when the run was made"
        if then["sha256"] != now["sha256"]:
            moved = "" if then["path"] == now["path"] else f" (then {then['path']})"
            return (
                f"{now['path']}{moved} has changed since the run used it (SHA-256 "
                f"{then['sha256'][:12]}…, now {now['sha256'][:12]}…)"
            )
    gone = next((v["path"] for k, v in recorded.items() if k not in current), None)
    return None if gone is None else f"{gone}, which the run was made from, is not read now"


_CASE_FILES = {"image": "image", "trajectory": "pose or actions file"}


def case_files(case: Case) -> dict[str, Path]:
    """The files of ``case``: its image and a pose or actions JSON (a trajectory that is a
    ``.json`` path); a pose string is no file."""
    files = {}
    if case.image is not None:
        files["image"] = Path(case.image)
    if case.trajectory is not None and case.trajectory.strip().endswith(".json"):
        files["trajectory"] = Path(case.trajectory.strip())
    return files


def case_digests(case: Case) -> dict[str, str]:
    """``{"image": sha256, "trajectory": sha256}`` of the case's files (:func:`case_files`)."""
    files = case_files(case)
    return dict(zip(files, sha256_files(files.values()), strict=True))


def with_digests(case: Case) -> Case:
    """``case`` with the digests of its files (unchanged when it has none)."""
    digests = case_digests(case)
    return replace(case, sha256=digests) if digests else case


def case_change(case: Case, recorded: Mapping[str, str], current: Mapping[str, str]) -> str | None:
    """Why the files of ``case`` differ from the digests ``recorded`` for it (one phrase naming
    the file), or None."""
    for what, digest in current.items():
        then = recorded.get(what)
        if then is not None and then != digest:
            path, role = case_files(case)[what], _CASE_FILES[what]
            return (
                f"{path} ({role} of case {shown(case.name)}) has changed since the run used it "
                f"(SHA-256 {then[:12]}…, now {digest[:12]}…)"
            )
    return None
