"""Per-rank metric files, so that no two ranks of a torchrun job ever write the same file.

``RUN/metrics/<kind>/<variant>.json`` holds every score of a variant and is rewritten whole, so
under torchrun each rank writes the scores it computed to its own shard instead, and rank 0
merges the shards after the ranks meet::

    RUN/metrics/shards/<kind>/<variant>/rank<r>.json    one rank's new scores, until merged

A merge rewrites the variant's file (atomically) and then deletes the shards it read, so a kill
at any moment leaves either the shards or their merged copy, and merging again is harmless.
Shards left by a killed job are merged before the next job (of any world size) plans its work.
One process writes the variant's file directly, as it always has.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from jbkv_cli import distributed
from jbkv_cli.runs import RunDir

SHARDS = "shards"


def save_scores(run: RunDir, kind: str, vid: str, scores: dict[str, Any]) -> None:
    """Add ``scores`` (video name -> entry) to the variant's metrics, or to this rank's shard."""
    if not distributed.active():
        run.write_metrics(kind, vid, run.read_metrics(kind, vid) | scores)
        return
    shard = (_shard_kind(kind, vid), f"rank{distributed.rank()}")
    run.write_metrics(*shard, run.read_metrics(*shard) | scores)


def merge_shards(run: RunDir, kind: str) -> int:
    """Fold every rank's shard into its variant's metrics file; return how many were merged."""
    root = run.metrics_path(f"{SHARDS}/{kind}", "x").parent
    if not root.is_dir():
        return 0
    merged = 0
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        vid = folder.name
        shards = sorted(p for p in folder.glob("rank*.json") if not p.name.startswith("."))
        if not shards:
            continue
        scores = run.read_metrics(kind, vid)
        for path in shards:
            scores |= run.read_metrics(_shard_kind(kind, vid), path.stem)
        run.write_metrics(kind, vid, scores)
        for path in shards:
            path.unlink(missing_ok=True)
        _remove_empty(folder)
        merged += len(shards)
    _remove_empty(root)
    _remove_empty(root.parent)
    return merged


def _shard_kind(kind: str, vid: str) -> str:
    """The shard folder as a metrics "kind", so :class:`RunDir` reads and writes shards as it
    does metrics (atomic writes, one-line errors for damaged files)."""
    return f"{SHARDS}/{kind}/{vid}"


def _remove_empty(folder: Path) -> None:
    # Not empty (another kind's shards, a temp file of a live writer) or gone: leave it.
    with contextlib.suppress(OSError):
        folder.rmdir()
