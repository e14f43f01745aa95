"""Wall clock of ``torchrun --nproc-per-node 2`` vs one process: the same quantize-eval on the
embedded model, into fresh run directories, one run each.

    python benchmarks/distributed.py [--ranks 2] [--prompts tiny --seeds 0,1]

Three configurations, one after the other:

- one process with torch's default threads (one intra-op thread per core: what ``jbkv`` gets);
- one process with ``OMP_NUM_THREADS=1``;
- ``torchrun``, which gives each rank ``OMP_NUM_THREADS=1`` (its default with several ranks per
  node), so the ranks together use as many cores as the first configuration.

The speed-up of the ranks over the one-thread process is the scaling of sharding alone; over
the default process it is what a user gains. On a busy machine the default process can be far
slower than the one-thread one (its threads wait for each other at every small op while other
processes hold a core), so the load average before each run is recorded. Everything counts:
start-up of every process (torch import, model load), the process group, generation, paired
scoring and the report. All runs must give the same rows (timings aside), or the benchmark
fails. Prints a table and writes benchmarks/results/distributed.json.
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


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, load average just before) of ``cmd``; exits with its error if it fails."""
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=base | (env or {}), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])} … failed:\n{done.stderr[-2000:]}")
    return seconds, load


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
    jbkv = [str(BIN / "jbkv"), *work]
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(args.ranks)]
    threads = torch.get_num_threads()
    configs = [
        (f"1 process, {threads} threads", "default", jbkv, None),
        ("1 process, 1 thread", "one_thread", jbkv, {"OMP_NUM_THREADS": "1"}),
        (
            f"torchrun {args.ranks} ranks x 1 thread",
            "torchrun",
            [*torchrun, "-m", "jbkv_cli", *work],
            None,
        ),
    ]
    tmp = Path(tempfile.mkdtemp(prefix="jbkv-bench-dist-"))
    runs = {}
    try:
        for label, key, cmd, env in configs:
            seconds, load = _run([*cmd, "--out", key, "--json", f"{key}.json"], tmp, env)
            runs[key] = {"label": label, "seconds": seconds, "load_average_before": load}
            if _rows(tmp / f"{key}.json") != _rows(tmp / "default.json"):
                sys.exit(f"{label} gave different rows than one process")
        videos = len(list((tmp / "default").glob("*/videos/*/*-*.json")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    many = runs["torchrun"]["seconds"]
    print(f"{'configuration':36s} {'wall s':>8s} {'load':>6s}")
    for r in runs.values():
        print(f"{r['label']:36s} {r['seconds']:8.1f} {r['load_average_before']:6.2f}")
    for key in ("default", "one_thread"):
        runs[key]["torchrun_speedup"] = runs[key]["seconds"] / many
        print(f"torchrun vs {runs[key]['label']}: {runs[key]['torchrun_speedup']:.2f}x")
    print(f"{videos} videos, the same rows in all three runs")
    result = {
        "command": "jbkv " + " ".join(work),
        "videos": videos,
        "default_threads": threads,
        "torchrun_ranks": args.ranks,
        "torchrun_threads_per_rank": 1,
        "runs": runs,
        "same_rows": True,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
