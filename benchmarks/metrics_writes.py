"""Bytes written to save fidelity scores one video at a time: per-video files vs the old scheme.

A run scores each video as soon as it is made and saves the score at once (so a kill loses at
most that one). jbkv used to save it by rewriting the variant's whole metrics file
(``metrics/fidelity/<variant>.json``), so saving N scores wrote 1 + 2 + … + N entries: bytes
growing with N². jbkv now writes one file per video (:mod:`jbkv_cli.run.shards`): N entries.

For N = 100 and 1,000 synthetic scores (shaped like real ones: per-frame and per-chunk PSNR and
SSIM of ``--frames`` frames) this saves them one by one through the real code
(:func:`~jbkv_cli.run.shards.save_scores`) and through an emulation of the old scheme (add
the entry to the variant's scores, rewrite its file atomically), counts the bytes each one commits
(the size of every file renamed into place) and prints both ratios, 1,000 vs 100: about 10 for
linear growth, about 100 for quadratic. It then extrapolates both to a paper-scale variant
(1,435 videos of 81 frames). Writes ``benchmarks/results/metrics_writes.json``.

    .venv/bin/python benchmarks/metrics_writes.py [--frames 16] [--dir /dev/shm]

The files go to a temp folder under ``--dir`` (default ``/dev/shm`` where it exists: bytes do
not depend on the disk, and the old scheme's 0.8 GB of rewrites stays off the real one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from jbkv_cli.run.directory import RunDir
from jbkv_cli.run.shards import save_scores
from jbkv_cli.utils.atomic import write_text_atomic

COUNTS = (100, 1000)
PAPER = (1435, 81)  # videos per variant, frames per video
RESULTS = Path(__file__).parent / "results" / "metrics_writes.json"
VID = "int2-rtn-g32"


def entry(name: str, frames: int, rng: random.Random) -> dict[str, Any]:
    """A score shaped like ``VideoScores.to_dict(per_frame=True)`` (chunks of 4 frames)."""
    psnr = [rng.uniform(20, 60) for _ in range(frames)]
    ssim = [rng.uniform(0.5, 1.0) for _ in range(frames)]
    chunks = max(1, frames // 4)
    return {
        "name": name,
        "ref_path": "ref",
        "test_path": "test",
        "frames": frames,
        "skipped_frames": 0,
        "height": 480,
        "width": 832,
        "psnr": sum(psnr) / frames,
        "psnr_pooled": min(psnr),
        "identical_frames": 0,
        "ssim": sum(ssim) / frames,
        "lpips": None,
        "psnr_per_frame": psnr,
        "ssim_per_frame": ssim,
        "lpips_per_frame": None,
        "chunk_frames": 4,
        "first_chunk": 0,
        "psnr_per_chunk": psnr[:chunks],
        "ssim_per_chunk": ssim[:chunks],
        "lpips_per_chunk": None,
        "lpips_status": "disabled (--no-lpips)",
    }


def save_old(run: RunDir, name: str, score: dict[str, Any], held: dict[str, Any]) -> None:
    """The old scheme: add the score to the variant's scores and rewrite the whole file. (The old
    code read the file back first; ``held`` keeps it in memory instead: that cost time, not
    bytes written.)"""
    held[name] = score
    write_text_atomic(run.metrics_path("fidelity", VID), json.dumps(held, indent=2) + "\n")


def save_new(run: RunDir, name: str, score: dict[str, Any], held: dict[str, Any]) -> None:
    """jbkv now: the score in its own file (``held`` unused)."""
    save_scores(run, "fidelity", VID, {name: score})


class Committed:
    """Counts the bytes of every file renamed into place (the last step of an atomic write)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.files = 0
        self._replace = os.replace

    def __enter__(self) -> Committed:
        def replace(src, dst, *args, **kwargs):
            self.bytes += os.path.getsize(src)
            self.files += 1
            return self._replace(src, dst, *args, **kwargs)

        os.replace = replace
        return self

    def __exit__(self, *exc) -> None:
        os.replace = self._replace


def measure(save: Callable, count: int, frames: int, base: Path) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(dir=base, prefix="jbkv-writes-"))
    try:
        run = RunDir(root, {"model": "tiny", "settings": {}, "prompts": [], "seeds": []})
        rng = random.Random(0)
        scores = [(f"prompt {i}-0", entry(f"prompt {i}-0", frames, rng)) for i in range(count)]
        start = time.perf_counter()
        held: dict[str, Any] = {}
        with Committed() as c:
            for name, score in scores:
                save(run, name, score, held)
        seconds = time.perf_counter() - start
        assert len(run.read_metrics("fidelity", VID)) == count
        return {"bytes": c.bytes, "files": c.files, "seconds": seconds}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=16, help="frames per synthetic video")
    shm = Path("/dev/shm")
    parser.add_argument("--dir", type=Path, default=shm if shm.is_dir() else None)
    args = parser.parse_args()
    base = args.dir or Path(tempfile.gettempdir())
    results: dict[str, dict[int, dict[str, float]]] = {"old": {}, "new": {}}
    for scheme, save in (("new", save_new), ("old", save_old)):
        for n in COUNTS:
            results[scheme][n] = measure(save, n, args.frames, base)
    lo, hi = COUNTS
    ratio = {s: results[s][hi]["bytes"] / results[s][lo]["bytes"] for s in results}
    # paper scale, from the size of one entry of PAPER[1] frames in each scheme's format
    one = entry("x" * 60 + "-0", PAPER[1], random.Random(0))
    new_entry = len(json.dumps(one, indent=2)) + 1
    old_entry = len(json.dumps({"x": one}, indent=2)) - 4
    paper_n = PAPER[0]
    paper = {"new": paper_n * new_entry, "old": paper_n * (paper_n + 1) // 2 * old_entry}

    table = Table(title=f"bytes written saving N scores one at a time ({args.frames} frames each)")
    for col in ("scheme", *(f"N = {n:,}" for n in COUNTS), f"ratio {hi:,}/{lo:,}", "seconds"):
        table.add_column(col, justify="left" if col == "scheme" else "right")
    names = {"old": "old: rewrite the variant's file", "new": "new: one file per video"}
    for s in ("old", "new"):
        cells = [f"{results[s][n]['bytes'] / 1e6:,.2f} MB" for n in COUNTS]
        secs = " / ".join(f"{results[s][n]['seconds']:.1f}" for n in COUNTS)
        table.add_row(names[s], *cells, f"{ratio[s]:.1f}", secs)
    console = Console()
    console.print(table)
    console.print(
        f"paper scale ({paper_n:,} videos of {PAPER[1]} frames per variant): old "
        f"{paper['old'] / 1e9:.1f} GB, new {paper['new'] / 1e6:.1f} MB",
        highlight=False,
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "frames": args.frames,
        "counts": list(COUNTS),
        "results": {s: {str(n): v for n, v in r.items()} for s, r in results.items()},
        "ratio": ratio,
        "paper_scale_bytes": paper,
        "platform": platform.platform(),
    }
    write_text_atomic(RESULTS, json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
