"""``jbkv vbench run`` under ``torchrun --nproc-per-node 2``: each variant is evaluated by
exactly one rank and rank 0 writes the summary of all of them.

VBench itself needs its own environment, so the worker (``vbench_shard_worker.py``) replaces
``run_variant`` with a stub; the CLI, the process group, the split and the summary are real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
WORKER = Path(__file__).with_name("vbench_shard_worker.py")
VARIANTS = [
    "reference",
    "int2-rtn-g32",
    "int2-rtn-g32-taylor",
    "int4-rtn-g32",
    "int4-rtn-g32-taylor",
]


def test_vbench_run_shards_variants_across_ranks(tmp_path):
    run = tmp_path / "run"
    for vid in VARIANTS:
        folder = run / "videos" / vid
        folder.mkdir(parents=True)
        for i in range(2):
            (folder / f"a red circle moves right on a dark background-{i}.mp4").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            "--nproc-per-node",
            "2",
            str(WORKER),
            str(run),
            str(tmp_path / "m"),
        ],
        capture_output=True,
        text=True,
        env=env | {"JBKV_DIST_TIMEOUT": "900"},
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    markers = sorted(p.name for p in (tmp_path / "m").iterdir())
    by_variant = {m.rsplit(".rank", 1)[0]: int(m.rsplit(".rank", 1)[1]) for m in markers}
    assert len(markers) == len(VARIANTS) and sorted(by_variant) == sorted(VARIANTS)  # once each
    assert set(by_variant.values()) == {0, 1}  # both ranks worked
    summary = json.loads((run / "metrics" / "vbench.json").read_text())
    assert sorted(summary["variants"]) == sorted(VARIANTS)
    for vid in VARIANTS:
        score = summary["variants"][vid]["dimensions"]["temporal_flickering"]["score"]
        assert score == 0.5 + len(vid) / 100
    titles = [ln for ln in r.stdout.splitlines() if ln.startswith("VBench")]
    assert r.stdout.count("wrote ") == 1 and len(titles) == 1  # rank 0 alone prints
