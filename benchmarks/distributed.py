"""Wall clock of ``torchrun --nproc-per-node 2`` vs one process: the same quantize-eval on the
embedded model, into fresh run directories, one run each.

    python benchmarks/distributed.py [--ranks 2] [--prompts tiny --seeds 0,1]

Threads: the single process uses torch's default (one intra-op thread per physical core);
torchrun gives each rank ``OMP_NUM_THREADS=1`` (its default with several ranks per node), so
both configurations use the same cores. Everything counts: start-up of every process (torch
import, model load), the process group, generation, paired scoring and the report. The two
runs must give the same rows (timings aside), or the benchmark fails. Prints a table and writes
benchmarks/results/distributed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(cmd: list[str], cwd: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])} … failed:\n{done.stderr[-2000:]}")
    return seconds


def _rows(path: Path) -> list[dict]:
    rows = json.loads(path.read_text())["rows"]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--prompts", default="tiny")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/distributed.json")
    args = ap.parse_args()
    work = ["quantize-eval", "--prompts", args.prompts, "--seeds", args.seeds, "--bits", "2,4"]
    work += ["--quantizers", "rtn", "--corrections", "none,taylor", "--no-lpips", "--no-plots"]
    tmp = Path(tempfile.mkdtemp(prefix="jbkv-bench-dist-"))
    try:
        load = os.getloadavg()[0]
        one = _run([str(BIN / "jbkv"), *work, "--out", "one", "--json", "one.json"], tmp)
        torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(args.ranks)]
        many = _run(
            [*torchrun, "-m", "jbkv_cli", *work, "--out", "many", "--json", "many.json"], tmp
        )
        if _rows(tmp / "one.json") != _rows(tmp / "many.json"):
            sys.exit("the two runs gave different rows")
        videos = len(list((tmp / "one").glob("videos/*/*-*.json")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = one / many
    print(f"{'configuration':36s} {'wall s':>8s}")
    print(f"{'1 process, ' + str(torch.get_num_threads()) + ' threads':36s} {one:8.1f}")
    print(f"{f'torchrun {args.ranks} ranks x 1 thread':36s} {many:8.1f}")
    print(f"speed-up {ratio:.2f}x on {videos} videos (same rows)")
    result = {
        "command": "jbkv " + " ".join(work),
        "videos": videos,
        "one_process_seconds": one,
        "one_process_threads": torch.get_num_threads(),
        "torchrun_ranks": args.ranks,
        "torchrun_threads_per_rank": 1,
        "torchrun_seconds": many,
        "speedup": ratio,
        "same_rows": True,
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
