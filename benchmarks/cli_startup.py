"""CPU seconds of one ``jbkv`` that answers without working: ``--help``, a command's ``--help``,
usage errors, and ``jbkv report`` of a finished run.

The test suite starts the installed ``jbkv`` hundreds of times, mostly for answers like these,
so their start-up is most of its time. Each invocation runs ``--repeat`` times (default 5) as a
child process; the script prints, per invocation, the median user and system CPU seconds of the
child (``os.wait4``: what ``/usr/bin/time -f "%U %S"`` shows) and the median wall clock, and
writes them to ``benchmarks/results/cli_startup.json``. CPU time, not wall clock, is the number
to compare on a shared machine. Without ``--run`` it first makes a small run on the embedded
model (2 prompts, INT2/INT4 RTN with and without the correction, no LPIPS, no plots).

    .venv/bin/python benchmarks/cli_startup.py [--repeat 5] [--run RUN] [--before TREE]

It runs the ``jbkv`` beside this interpreter. ``--before TREE`` also runs another checkout's code
(``PYTHONPATH=TREE``, same environment), each repeat one A/B pair, and prints the ratio of the
CPU seconds (this tree / TREE): how docs/benchmarks.md compares before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JBKV = str(Path(sys.executable).with_name("jbkv"))


def invocations(run: Path) -> dict[str, list[str]]:
    """Label -> arguments."""
    return {
        "jbkv --help": ["--help"],
        "jbkv quantize-eval --help": ["quantize-eval", "--help"],
        "usage error (click: --steps 0)": ["generate", "--steps", "0"],
        "usage error (--corrections bogus)": ["quantize-eval", "--corrections", "bogus"],
        "jbkv report RUN --format md": ["report", str(run), "--format", "md"],
        "jbkv report RUN (table)": ["report", str(run)],
    }


def measure(
    args: list[str], cwd: Path, tree: Path | None = None
) -> tuple[float, float, float, int]:
    """(user s, system s, wall s, exit code) of one ``jbkv ARGS`` (``tree``: that checkout's
    code on ``PYTHONPATH``)."""
    env = {**os.environ, "COLUMNS": "120"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    start = time.perf_counter()
    child = subprocess.Popen(
        [JBKV, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime, usage.ru_stime, wall, child.returncode


def make_run(folder: Path) -> Path:
    prompts = folder / "prompts.txt"
    prompts.write_text(
        "a red circle moves right on a dark background\n"
        "a blue square moves up on a gray background\n"
    )
    args = ["quantize-eval", "--prompts", str(prompts), "--seeds", "0", "--bits", "2,4"]
    args += ["--quantizers", "rtn", "--corrections", "none,taylor", "--no-lpips", "--no-plots"]
    subprocess.run(
        [JBKV, *args, "--out", str(folder / "runs")], check=True, capture_output=True, cwd=folder
    )
    return folder / "runs" / "tiny"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--run", type=Path, help="a finished run folder (default: make one)")
    parser.add_argument("--before", type=Path, help="another checkout to compare (A/B pairs)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cli_startup.json")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run = a.run.resolve() if a.run else make_run(work)
        rows = {}
        for label, args in invocations(run).items():
            pairs = [
                (measure(args, work, ROOT), a.before and measure(args, work, a.before))
                for _ in range(a.repeat)
            ]
            samples = [p[0] for p in pairs]
            user, system, wall = (statistics.median(s[i] for s in samples) for i in range(3))
            codes = sorted({s[3] for s in samples})
            rows[label] = {"user_s": user, "system_s": system, "wall_s": wall, "exit": codes}
            line = f"{label:38} CPU {user + system:6.2f} s  wall {wall:6.2f} s  exit {codes}"
            if a.before:
                ratios = [(p[0][0] + p[0][1]) / (p[1][0] + p[1][1]) for p in pairs]
                before = statistics.median(p[1][0] + p[1][1] for p in pairs)
                rows[label] |= {"before_cpu_s": before, "cpu_ratio": statistics.median(ratios)}
                line += f"  before {before:6.2f} s  ratio {statistics.median(ratios):.3f}"
            print(line, flush=True)
    result = {
        "repeat": a.repeat,
        "before": str(a.before or ""),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "medians": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
