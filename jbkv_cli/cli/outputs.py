"""Where a command may write a file the user names (``--json``, ``--csv``, ``--out``).

:func:`check_output_file` is the one check every such option goes through before anything
runs. Besides :func:`~jbkv_cli.utils.atomic.check_writable_file` (a file path in a writable folder) it
refuses a path that would overwrite what jbkv reads back:

- anything inside a run directory (one with a jbkv ``manifest.json``, or one the command is
  about to make) except under its ``report/`` folder: the manifest, records, videos and scores
  are what resume, ``report`` and the gate read;
- every input the command reads: a file (a ``--data`` or prompt file, a case file and each
  image or actions file it names, a head profile, a weights file), the same file under another
  name (a hard link) too, and anything inside an input folder (``fidelity REF TEST``, a model
  or weights folder) or a hard link to a file in it;
- a path that one of those lies under (the file would have to be a folder).

Paths are compared after resolving symlinks, so a link into a run folder is refused too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from jbkv_cli.utils.atomic import check_writable_file
from jbkv_cli.utils.errors import JbkvError, UsageError
from jbkv_cli.utils.jsonio import read_json

MANIFEST = "manifest.json"
REPORT = "report"


def check_output_file(
    path: str | os.PathLike[str],
    flag: str,
    *,
    runs: Iterable[str | os.PathLike[str]] = (),
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> None:
    """Raise :class:`UsageError` unless ``path`` may take a file written by this command.

    ``runs``: run directories the command makes or resumes (they need not exist yet);
    ``inputs``: the files and folders it reads. Run directories above ``path`` are found on
    their own.
    """
    target = Path(path)
    check_writable_file(target, flag)  # a folder, or an unwritable place, is said as such first
    resolved = target.resolve()
    shown = f"{target}" if resolved == target.absolute() else f"{target} (-> {resolved})"
    for run in [*map(Path, runs), *_runs_above(resolved)]:
        root = run.resolve()
        if _inside(resolved, root / REPORT) and resolved != root / REPORT:
            continue
        if _inside(resolved, root):
            raise UsageError(
                f"{flag} {shown} is inside the run directory {run}, whose files jbkv reads "
                f"back; write it outside the run (or under {run / REPORT})"
            )
        if _inside(root, resolved):
            raise UsageError(f"{flag} {shown} would have to be a folder: the run {run} is in it")
    given = list(map(Path, inputs))
    for item in given:
        root = item.resolve()
        if root.is_dir() and _inside(resolved, root):
            raise UsageError(
                f"{flag} {shown} is inside the input folder {item}; write it elsewhere"
            )
        if resolved == root or _same_file(resolved, root):
            raise UsageError(
                f"{flag} {shown} would overwrite {item}, which this command reads; write it "
                "elsewhere"
            )
        if _inside(root, resolved):
            raise UsageError(f"{flag} {shown} would have to be a folder: the input {item} is in it")
    linked = _linked_into(resolved, [p for p in given if p.is_dir()])
    if linked is not None:
        raise UsageError(
            f"{flag} {shown} is a hard link to {linked}, which this command reads; write it "
            "elsewhere"
        )


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _same_file(a: Path, b: Path) -> bool:
    """One file under two names (a hard link); False when either is absent."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _linked_into(path: Path, folders: list[Path]) -> Path | None:
    """The file in one of ``folders`` that ``path`` is a hard link to (looked for only when
    ``path`` has more than one name), else None."""
    try:
        st = path.stat()
    except OSError:
        return None
    if st.st_nlink < 2:
        return None
    for folder in folders:
        for candidate in folder.rglob("*"):
            try:
                other = candidate.stat(follow_symlinks=False)
            except OSError:
                continue
            if (other.st_ino, other.st_dev) == (st.st_ino, st.st_dev):
                return candidate
    return None


def _runs_above(path: Path) -> list[Path]:
    """Run directories ``path`` lies in (a folder holding a jbkv manifest)."""
    return [p for p in path.parents if _is_run(p)]


def _is_run(folder: Path) -> bool:
    manifest = folder / MANIFEST
    try:
        if not manifest.is_file():
            return False
        if (folder / "videos").is_dir():
            return True
        from jbkv_cli.run.schema import manifest_problem  # (torch, via the PSNR cap)

        return manifest_problem(read_json(manifest)) is None
    except (OSError, JbkvError):
        return False
