"""Is a manifest entry present, missing, partially downloaded, or corrupt?

``corrupt`` means the file is there but fails its pin (SHA-256, its published prefix, or its
size). Files with nothing pinned, and unpacked archives, can only be ``present (unverified)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from jbkv_cli.weights.manifest import WeightEntry

CHUNK = 1 << 20


@dataclass(frozen=True)
class EntryStatus:
    """``state``: present, missing, partial or corrupt; ``detail``: why, in a few words."""

    entry: WeightEntry
    state: str
    path: Path
    detail: str = ""


def sha256_of(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def check_file(entry: WeightEntry, path: Path, digest: str | None = None) -> str | None:
    """Why ``path`` fails ``entry``'s pin (one line), or None if it passes or nothing is pinned.

    ``digest``: the file's SHA-256 if already known (saves reading it again).
    """
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        return f"size {size} bytes, expected {entry.size}"
    if entry.sha256 or entry.sha256_prefix:
        digest = digest or sha256_of(path)
        if entry.sha256 and digest != entry.sha256:
            return f"SHA-256 {digest}, expected {entry.sha256}"
        if entry.sha256_prefix and not digest.startswith(entry.sha256_prefix):
            return f"SHA-256 {digest[:16]}…, expected a digest starting {entry.sha256_prefix}"
    return None


def entry_status(
    entry: WeightEntry, roots: Mapping[str, Path] | None = None, *, verify: bool = True
) -> EntryStatus:
    """The state of one entry; ``verify=False`` skips hashing present files (size only)."""
    paths = entry.required_paths(roots)
    shown = entry.destination(roots)
    absent = [p for p in paths if not p.exists()]
    if absent:
        part = entry.part_path(roots)
        if part.is_file():
            return EntryStatus(entry, "partial", shown, f"{part.stat().st_size} bytes in {part}")
        return EntryStatus(entry, "missing", shown)
    if entry.unpack is not None:
        return EntryStatus(entry, "present", shown, "unpacked archive (unverified)")
    if not paths[0].is_file():
        return EntryStatus(entry, "corrupt", shown, "not a regular file")
    problem = check_file(
        entry if verify else replace(entry, sha256=None, sha256_prefix=None), paths[0]
    )
    if problem:
        return EntryStatus(entry, "corrupt", shown, problem)
    if not verify:
        detail = "not hashed (--no-verify)"
    elif entry.pinned == "nothing":
        detail = "unverified: nothing pinned"
    else:
        detail = f"verified ({entry.pinned})"
    return EntryStatus(entry, "present", shown, detail)
