"""The weights manifest: what each file is, where it comes from, where it goes, how it is checked.

The shipped manifest is ``manifest.json`` beside this module; ``$JBKV_WEIGHTS_MANIFEST`` (or the
``path`` argument) replaces it, which is how tests point jbkv at a local server. Destinations are
relative to the cache roots VBench and torch resolve (:func:`~jbkv_cli.metrics.vbench_weights.
cache_roots`: ``torch_hub`` = ``$TORCH_HOME/hub``, ``vbench`` = ``$VBENCH_CACHE_DIR`` or
``~/.cache/vbench``, ``clip`` = ``~/.cache/clip``, ``home_cache`` = ``~/.cache``), so a fetched
file lies exactly where the loaders look for it.

A mirror (``--mirror URL`` or ``$JBKV_WEIGHTS_MIRROR``) is flat: every file is read from
``<mirror>/<mirror_name>`` (the last segment of the upstream URL's path unless the manifest
names it), over ``http(s)://`` or ``file://``.

Every ``path`` and ``provides`` is relative and stays inside its root: an absolute one, or one
with ``..``, is refused when the manifest loads; one that leads outside its root through a
symlink on disk is refused by :func:`outside_root` before anything is fetched. Names and mirror
names are single file-name tokens (they become part of ``.part`` and record file names).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote, unquote, urlparse

from jbkv_cli.metrics.vbench_weights import cache_roots
from jbkv_cli.utils.errors import JbkvError, shown
from jbkv_cli.utils.jsonio import read_json

MANIFEST_ENV = "JBKV_WEIGHTS_MANIFEST"
MIRROR_ENV = "JBKV_WEIGHTS_MIRROR"
SHIPPED_MANIFEST = Path(__file__).with_name("manifest.json")
GROUPS = ("lpips", "vbench", "llm")
_HEX = re.compile(r"[0-9a-f]+")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class WeightEntry:
    """One downloadable file (or zip archive) of the manifest.

    ``sha256``: the full pinned digest; ``sha256_prefix``: only a published prefix (torch.hub
    file names carry 8 hex digits); neither: checked by ``size`` when pinned, else unverified.
    ``unpack == "zip"``: the download is an archive unpacked into ``path`` (dropping
    ``strip_components`` leading folders); ``provides`` lists what must exist afterwards. An
    archive creates only its :meth:`items`: the folder ``path`` (whole), or, when ``path`` is
    ``""`` (unpacked into the root itself, as DreamSim into ``~/.cache``), the top-level names
    of ``provides``; nothing else in the root is ever touched.
    """

    name: str
    group: str
    used_by: str
    url: str
    root: str
    path: str
    sha256: str | None = None
    sha256_prefix: str | None = None
    size: int | None = None
    hash_source: str = ""
    mirror_name: str | None = None
    unpack: str | None = None
    strip_components: int = 0
    provides: tuple[str, ...] = ()

    @property
    def file_name(self) -> str:
        """The name on a mirror: ``mirror_name``, else the last segment of the URL's path."""
        return self.mirror_name or unquote(PurePosixPath(urlparse(self.url).path).name)

    @property
    def pinned(self) -> str:
        """How a download is checked: ``sha256``, ``sha256 prefix``, ``size`` or ``nothing``."""
        if self.sha256:
            return "sha256"
        if self.sha256_prefix:
            return "sha256 prefix"
        return "size" if self.size is not None else "nothing"

    def destination(self, roots: Mapping[str, Path] | None = None) -> Path:
        """The file (or, for an archive, the folder) where the loaders look for it."""
        base = (roots or cache_roots())[self.root]
        return base / self.path if self.path else base

    def required_paths(self, roots: Mapping[str, Path] | None = None) -> list[Path]:
        """What must exist for the entry to count as present."""
        if self.unpack is None:
            return [self.destination(roots)]
        base = (roots or cache_roots())[self.root]
        return [base / p for p in self.provides]

    def items(self, roots: Mapping[str, Path] | None = None) -> list[Path]:
        """What an archive may create (and later replace): its own folder ``path``, or, for
        one unpacked into the root itself, the top-level name of each ``provides`` path."""
        base = (roots or cache_roots())[self.root]
        if self.path:
            return [base / self.path]
        tops = dict.fromkeys(PurePosixPath(p).parts[0] for p in self.provides)
        return [base / top for top in tops]

    def record_path(self, roots: Mapping[str, Path] | None = None) -> Path:
        """Where jbkv records what it unpacked for this archive (to know what it may replace)."""
        base = (roots or cache_roots())[self.root]
        return base / f".jbkv-{self.name}.unpacked.json"

    def part_path(self, roots: Mapping[str, Path] | None = None) -> Path:
        """Where a partial download is kept (and resumed from)."""
        if self.unpack is None:
            dest = self.destination(roots)
            return dest.with_name(dest.name + ".part")
        base = (roots or cache_roots())[self.root]
        return base / f".jbkv-{self.name}-{self.file_name}.part"

    def source_url(self, mirror: str | None = None) -> str:
        """The URL to download from: upstream, or ``<mirror>/<file_name>``."""
        if not mirror:
            return self.url
        return mirror.rstrip("/") + "/" + quote(self.file_name)


def outside_root(entry: WeightEntry, roots: Mapping[str, Path] | None = None) -> str | None:
    """Why ``entry`` would write outside its root once symlinks on disk are followed (one line,
    naming the entry), or None when it stays inside.

    jbkv writes in the folder that holds the destination (the ``.part``, then a rename onto the
    destination itself, which replaces a symlink there rather than following it), so that
    folder, resolved, must lie inside the resolved root.
    """
    base = (roots or cache_roots())[entry.root]
    real_base = base.resolve()
    targets = entry.items(roots) if entry.unpack else [entry.destination(roots)]
    for target in targets:
        real = target.parent.resolve()
        if not real.is_relative_to(real_base):
            return (
                f"{entry.name}: {target.parent} leads to {real}, outside its root {real_base} "
                "(a symlink on the way); refused"
            )
    return None


def resolve_mirror(mirror: str | None) -> str | None:
    """``--mirror`` if given, else ``$JBKV_WEIGHTS_MIRROR``; must be an http(s) or file URL."""
    value = mirror or os.environ.get(MIRROR_ENV) or None
    if value is not None and urlparse(value).scheme not in ("http", "https", "file"):
        raise ValueError(f"mirror {value!r} is not an http://, https:// or file:// URL")
    return value


def load_manifest(path: str | os.PathLike[str] | None = None) -> list[WeightEntry]:
    """Entries of ``path``, else of ``$JBKV_WEIGHTS_MANIFEST``, else of the shipped manifest."""
    source = Path(path or os.environ.get(MANIFEST_ENV) or SHIPPED_MANIFEST)
    doc = read_json(source, "weights manifest")  # a regular file of at most 64 MiB
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        raise JbkvError(f"weights manifest {source} has no 'files' list")
    entries = [_entry(item, source, i) for i, item in enumerate(files)]
    names = [e.name for e in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise JbkvError(f"weights manifest {source}: duplicate name(s) {', '.join(duplicates)}")
    return entries


def select(entries: list[WeightEntry], targets: Iterable[str]) -> list[WeightEntry]:
    """Entries named by ``targets``: a group (lpips, vbench), ``all``, or an entry's name."""
    chosen: dict[str, WeightEntry] = {}
    for target in targets:
        if target == "all":
            picked = entries
        elif target in GROUPS:
            picked = [e for e in entries if e.group == target]
        else:
            picked = [e for e in entries if e.name == target]
            if not picked:
                names = ", ".join(e.name for e in entries)
                raise ValueError(
                    f"unknown target {target!r}; use lpips, vbench, all or one of: {names}"
                )
        chosen.update((e.name, e) for e in picked)
    return list(chosen.values())


def _entry(item: Any, source: Path, index: int) -> WeightEntry:
    where = f"weights manifest {source}, entry {index}"
    if not isinstance(item, dict):
        raise JbkvError(f"{where}: not an object")
    known = set(WeightEntry.__dataclass_fields__)
    unknown = sorted(set(item) - known)
    if unknown:
        raise JbkvError(f"{where}: unknown field(s) {', '.join(unknown)}")
    missing = [k for k in ("name", "group", "used_by", "url", "root", "path") if k not in item]
    if missing:
        raise JbkvError(f"{where}: missing field(s) {', '.join(missing)}")
    wrong = _wrong_types(item)
    if wrong:
        raise JbkvError(f"{where}: wrong type for {', '.join(wrong)}")
    entry = WeightEntry(**{**item, "provides": tuple(item.get("provides", ()))})
    problem = _problem(entry)
    if problem:
        raise JbkvError(f"{where} ({entry.name}): {problem}")
    return entry


_STRINGS = ("name", "group", "used_by", "url", "root", "path", "hash_source")
_OPTIONAL_STRINGS = ("sha256", "sha256_prefix", "mirror_name", "unpack")


def _wrong_types(item: dict[str, Any]) -> list[str]:
    """The fields of ``item`` whose JSON type is wrong (strings, counts, a list of strings)."""
    wrong = [k for k in _STRINGS if k in item and not isinstance(item[k], str)]
    wrong += [k for k in _OPTIONAL_STRINGS if not isinstance(item.get(k, ""), str | None)]
    for key in ("size", "strip_components"):
        value = item.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            wrong.append(key)
    provides = item.get("provides", [])
    if not isinstance(provides, list) or not all(isinstance(p, str) for p in provides):
        wrong.append("provides")
    return wrong


def _problem(e: WeightEntry) -> str | None:
    if not _NAME.fullmatch(e.name):
        return f"name {shown(e.name)} must be letters, digits, '.', '_' or '-'"
    if e.group not in GROUPS:
        return f"group must be one of {', '.join(GROUPS)}"
    if e.root not in cache_roots({}):
        return f"root must be one of {', '.join(cache_roots({}))}"
    if urlparse(e.url).scheme not in ("http", "https", "file"):
        return "url must be http://, https:// or file://"
    if e.sha256 is not None and (len(e.sha256) != 64 or not _HEX.fullmatch(e.sha256)):
        return "sha256 must be 64 lowercase hex digits or null"
    if e.sha256_prefix is not None and not _HEX.fullmatch(e.sha256_prefix):
        return "sha256_prefix must be lowercase hex digits or null"
    if e.size is not None and e.size < 0:
        return "size must be a byte count or null"
    if e.strip_components < 0:
        return "strip_components must be 0 or more"
    if e.unpack not in (None, "zip"):
        return "unpack must be null or 'zip'"
    if e.unpack and not e.provides:
        return "an archive must list what it provides"
    return _path_problem(e) or _mirror_name_problem(e)


def _path_problem(e: WeightEntry) -> str | None:
    """``path`` and ``provides`` must be relative, without ``..``, and (for an archive) name
    what it unpacks into; a plain file needs a file name."""
    for p in (e.path, *e.provides):
        pure = PurePosixPath(p)
        if pure.is_absolute() or ".." in pure.parts or "\0" in p:
            return f"{shown(p)} must be a relative path that stays inside its root"
    if e.unpack is None and not PurePosixPath(e.path).parts:
        return "a file's path must name the file"
    if e.unpack and any(not PurePosixPath(p).parts for p in e.provides):
        return "provides must name files or folders, not the root"
    own = PurePosixPath(e.path).parts
    if own and any(PurePosixPath(p).parts[: len(own)] != own for p in e.provides):
        return f"what an archive provides must lie inside its folder {e.path!r}"
    return None


def _mirror_name_problem(e: WeightEntry) -> str | None:
    name = e.file_name
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return "cannot name the file on a mirror (a single file name); set mirror_name"
    return None
