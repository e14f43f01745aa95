"""Unpack a downloaded zip archive into the items its manifest entry declares, and nothing else.

An archive creates only :meth:`WeightEntry.items <jbkv_cli.weights.manifest.WeightEntry.items>`:
its own folder (``path``, whole), or, for an archive unpacked into the root itself (DreamSim
into ``~/.cache``), the top-level names of ``provides``. Members outside those items are
**ignored**: never extracted, listed in one warning by the caller. So an archive that also
holds ``huggingface/…`` or ``torch/…`` cannot reach ``~/.cache/huggingface``.

Existing items are replaced only when jbkv put exactly them there: after moving items into
place jbkv writes ``<root>/.jbkv-<name>.unpacked.json`` with a fingerprint of each (every path
inside it, its type, size and modification time). An item that is missing from that record, or
that changed since (a file added, edited or removed; a folder put there by someone else), is
refused in one line and nothing is moved.

The archive is extracted into a hidden ``.jbkv-unpack-*`` folder beside the items (same file
system, so moving is a rename), checked against ``provides``, and only then moved in; that
folder is removed on every exit, failures and Ctrl-C included. Members with an absolute path
or ``..`` are refused; symlink members become regular files holding the link text.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from jbkv_cli.utils.atomic import write_text_atomic
from jbkv_cli.weights.manifest import WeightEntry

CHUNK = 1 << 20
STAGING_PREFIX = ".jbkv-unpack-"


class UnpackError(Exception):
    """An archive that cannot be unpacked safely; the message is one line, without the URL."""


def unpack_zip(entry: WeightEntry, archive: Path, roots: dict[str, Path]) -> list[str]:
    """Unpack ``archive`` into ``entry``'s items; return the member names it ignored.

    Raises :class:`UnpackError` (nothing moved) for an unsafe or broken archive, one that does
    not provide what the entry lists, or an existing item jbkv did not put there.
    """
    base = roots[entry.root]
    items = entry.items(roots)
    record = _read_record(entry.record_path(roots))
    _check_replaceable(items, base, record)
    parent = items[0].parent if entry.path else base
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=parent, prefix=STAGING_PREFIX))
    try:
        staging = work / "new"
        staging.mkdir()
        allowed = None if entry.path else {item.name for item in items}
        ignored = _extract(archive, staging, entry.strip_components, allowed)
        absent = [p for p in entry.provides if not _staged(staging, entry, p).exists()]
        if absent:
            raise UnpackError(f"the archive does not provide {', '.join(absent)}")
        moves = [(staging, items[0])] if entry.path else [(staging / i.name, i) for i in items]
        _check_replaceable(items, base, record)  # again: the extraction may have taken long
        try:
            for i, (new, final) in enumerate(moves):
                _move_into_place(new, final, work / f"old-{i}")
                record[_key(final, base)] = _fingerprint(final)
        finally:
            _write_record(entry, roots, record)
        return ignored
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_items(entry: WeightEntry, roots: dict[str, Path]) -> None:
    """Raise :class:`UnpackError` now if unpacking ``entry`` would have to replace an item jbkv
    did not put there (so nothing is downloaded in vain)."""
    record = _read_record(entry.record_path(roots))
    _check_replaceable(entry.items(roots), roots[entry.root], record)


def _staged(staging: Path, entry: WeightEntry, provided: str) -> Path:
    """Where ``provided`` (relative to the root) lies in the staging folder."""
    inside = PurePosixPath(provided).relative_to(PurePosixPath(entry.path or "."))
    return staging.joinpath(*inside.parts)


def _extract(archive: Path, staging: Path, strip: int, allowed: set[str] | None) -> list[str]:
    """Write the members under ``allowed`` top-level names (all when None) into ``staging``."""
    ignored: list[str] = []
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                name = info.filename
                parts = PurePosixPath(name).parts[strip:]
                if name.startswith("/") or ".." in PurePosixPath(name).parts:
                    raise UnpackError(f"unsafe member {name!r} (absolute or with '..')")
                if not parts:
                    continue
                if allowed is not None and parts[0] not in allowed:
                    ignored.append(name)
                    continue
                _write_member(zf, info, staging.joinpath(*parts))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error) as exc:
        raise UnpackError(f"not a readable zip archive ({_one_line(exc)})") from None
    except (NotImplementedError, RuntimeError) as exc:  # a compression method, an encryption
        raise UnpackError(f"cannot read the archive ({_one_line(exc)})") from None
    except OSError as exc:
        raise UnpackError(f"cannot unpack into {staging.parent}: {_one_line(exc)}") from None
    return ignored


def _write_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    if info.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with zf.open(info) as src, target.open("wb") as out:
        shutil.copyfileobj(src, out, CHUNK)


def _check_replaceable(items: list[Path], base: Path, record: dict[str, str]) -> None:
    """Refuse (one line) when an existing item is not exactly what jbkv unpacked there."""
    foreign = [
        item
        for item in items
        if os.path.lexists(item) and record.get(_key(item, base)) != _fingerprint(item)
    ]
    if foreign:
        names = ", ".join(str(p) for p in foreign)
        raise UnpackError(
            f"{names} already exist(s) and jbkv did not unpack it there (or it changed since); "
            "nothing was moved: move it away, then fetch again"
        )


def _move_into_place(new: Path, final: Path, trash: Path) -> None:
    """Rename ``new`` onto ``final``; a previous ``final`` (jbkv's own) goes to ``trash``."""
    moved_old = False
    if os.path.lexists(final):
        os.rename(final, trash)
        moved_old = True
    try:
        os.rename(new, final)
    except BaseException:
        if moved_old:
            with contextlib.suppress(OSError):
                os.rename(trash, final)
        raise


def _fingerprint(item: Path) -> str:
    """A digest of every path inside ``item`` with its type, size and modification time (the
    folders' own times left out: renames change them)."""
    digest = hashlib.sha256()
    for path in [item, *_walk(item)]:
        st = os.lstat(path)
        rel = path.relative_to(item).as_posix()
        if stat.S_ISDIR(st.st_mode):
            digest.update(f"d {rel}\n".encode(errors="surrogateescape"))
        else:
            line = f"{stat.S_IFMT(st.st_mode):o} {rel} {st.st_size} {st.st_mtime_ns}\n"
            digest.update(line.encode(errors="surrogateescape"))
    return digest.hexdigest()


def _walk(item: Path) -> list[Path]:
    if not item.is_dir() or item.is_symlink():
        return []
    found: list[Path] = []
    for root, dirs, files in os.walk(item):
        dirs.sort()
        found += [Path(root) / name for name in sorted(dirs + files)]
    return found


def _key(item: Path, base: Path) -> str:
    return item.relative_to(base).as_posix()


def _read_record(path: Path) -> dict[str, str]:
    """What jbkv unpacked for this entry (item → fingerprint); empty when absent or damaged,
    which only makes jbkv refuse to replace more."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, dict):
        return {}
    return {k: v for k, v in items.items() if isinstance(k, str) and isinstance(v, str)}


def _write_record(entry: WeightEntry, roots: dict[str, Path], record: dict[str, str]) -> None:
    doc = {"entry": entry.name, "items": record}
    write_text_atomic(entry.record_path(roots), json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())
