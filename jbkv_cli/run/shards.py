"""Where scores are saved: one file per video, so saving grows linearly with the videos.

Each score goes into its own file, written atomically::

    RUN/metrics/<kind>/<variant>/<video name>.json     one video's scores

Saving a score never rewrites another one (writing the whole variant's file after every video,
as jbkv did before, wrote bytes growing with the square of the videos per variant: about
6 GB of JSON for 1,435 videos of 81 frames, against 8 MB now; ``benchmarks/metrics_writes.py``). A kill at any moment loses at most the score being
written, whose temp file the next run deletes; and because each video is scored by exactly one
rank of a torchrun job, no two ranks ever write the same file, so nothing needs merging.

Runs made before keep working: ``RUN/metrics/<kind>/<variant>.json`` (all of a variant's scores)
is read under the per-video files (:meth:`RunDir.read_metrics`) and never rewritten, and the
per-rank shards a killed torchrun job of an older version left::

    RUN/metrics/shards/<kind>/<variant>/rank<r>.json    one rank's scores, never merged

are moved into per-video files by :func:`merge_shards` (rank 0, before a job plans its work),
which then deletes them; a kill in between leaves the shards, and moving them again is harmless.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from jbkv_cli.run.directory import RunDir

SHARDS = "shards"


def save_scores(run: RunDir, kind: str, vid: str, scores: dict[str, Any]) -> None:
    """Save ``scores`` (video name -> entry), each in its own file."""
    for name, entry in scores.items():
        run.write_score(kind, vid, name, entry)


def merge_shards(run: RunDir, kind: str) -> int:
    """Move the scores of old per-rank shards into per-video files (a score already in its own
    file is newer and kept), delete the shards; return how many shards were moved."""
    root = run.root / "metrics" / SHARDS / kind
    if not root.is_dir():
        return 0
    merged = 0
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        vid = folder.name
        shards = sorted(p for p in folder.glob("rank*.json") if not p.name.startswith("."))
        for path in shards:
            for name, entry in run.read_score_map(path).items():
                if not run.score_path(kind, vid, name).is_file():
                    run.write_score(kind, vid, name, entry)
            path.unlink(missing_ok=True)
            merged += 1
        _remove_empty(folder)
    _remove_empty(root)
    _remove_empty(root.parent)
    return merged


def _remove_empty(folder: Path) -> None:
    # Not empty (another kind's shards, a temp file of a live writer) or gone: leave it.
    with contextlib.suppress(OSError):
        folder.rmdir()
