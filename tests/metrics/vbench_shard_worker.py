"""One rank of ``jbkv vbench run`` under torchrun with VBench itself replaced by a stub.

Run by ``tests/metrics/test_vbench_sharding.py`` as
``torchrun --nproc-per-node 2 vbench_shard_worker.py RUN MARKERS``. The stub stands in for
``run_variant`` (which needs the VBench environment): it records which rank evaluated which
variant (a file ``MARKERS/<variant>.rank<r>``) and returns a score derived from the variant's
name, so the test can check the split and the merged summary.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from jbkv_cli.metrics import vbench_job, vbench_run
from jbkv_cli.metrics.vbench_scores import DimensionScore
from jbkv_cli.utils import distributed


def fake_run_variant(env, videos, work, config, on_event=None, force=False):
    markers = Path(sys.argv[2])
    markers.mkdir(exist_ok=True)
    (markers / f"{work.name}.rank{distributed.rank()}").write_text(str(len(videos)))
    result = vbench_run.VariantResult()
    for d in config.dimensions:
        if on_event:
            on_event("start", {"dimension": d})
        score = 0.5 + len(work.name) / 100
        result.dimensions[d] = DimensionScore(d, score, {v.stem: score for v in videos}, 1)
        if on_event:
            on_event("done", {"dimension": d})
    return result


def main() -> None:
    vbench_run.run_variant = fake_run_variant
    vbench_job.require_env = lambda root: SimpleNamespace(key="stub", info={})
    vbench_job.require_weights = lambda *a, **k: None
    from jbkv_cli.cli.app import app

    app(["vbench", "run", sys.argv[1], "-d", "temporal_flickering", "--device", "cpu"])


if __name__ == "__main__":
    main()
