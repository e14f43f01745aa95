"""A run directory written from numbers, no model: the report's inputs at any size, in seconds.

:func:`write_run` makes what ``quantize-eval`` leaves on disk for the report to read: the
manifest, every variant's ``variant.json`` (real KV specs from the sweep grid), one record per
video (prompt, seed, cache bytes, time, diagnostics) and one fidelity score per video, with
empty files where the ``.mkv``/``.mp4`` lie (the report checks that they exist, never opens
them). Scores are drawn from a fixed seed: PSNR falls with fewer bits, the correction adds a
small gain, and a video effect shared across variants makes the pairing matter.

Used by the report-statistics tests and by ``benchmarks/report_stats.py`` (a frontier-sized
run: 127 variants × 10 videos).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.run.directory import RunDir, video_name
from jbkv_cli.run.experiment import build_matrix

SETTINGS = {"dtype": "float32", "tokens_per_chunk": 16, "num_chunks": 4}


def frontier_specs() -> list[KVSpec]:
    """The ``--frontier`` grid's specs (bits 2-4 × group sizes × every method × none/taylor)."""
    from jbkv_cli.quant.registry import method_names

    specs = build_matrix([2, 3, 4], method_names(), ["none", "taylor"], [16, 32, 64, 128])
    return [s for s in specs if not s.is_reference]


def write_run(
    root: Path, specs: list[KVSpec], prompts: list[str], seed: int = 0
) -> tuple[RunDir, dict[str, dict[str, float]]]:
    """The run at ``root`` with the reference and ``specs``, one video per prompt (seed 0).

    Returns the run and ``{variant: {video name: psnr}}`` (what was written, for checks)."""
    rng = random.Random(seed)
    run = RunDir.create_or_resume(root, "tiny", dict(SETTINGS))
    run.register(list(prompts), [0])
    video_effect = {p: rng.gauss(0.0, 1.0) for p in prompts}
    written: dict[str, dict[str, float]] = {}
    for spec in [FULL_PRECISION, *specs]:
        vid = run.ensure_variant(spec)
        corrected = spec.correction_.active
        level = 30.0 + 6.0 * spec.bits + rng.gauss(0.0, 1.0) + (0.3 if corrected else 0.0)
        written[vid] = {}
        for prompt in prompts:
            name = video_name(prompt, 0)
            paths = run.paths(vid, name)
            for key in ("lossless", "mp4"):
                paths[key].write_bytes(b"")
            ref = spec.is_reference
            delta = None if ref else 0.05 / spec.bits + rng.gauss(0.0, 0.002)
            record = {
                "prompt": prompt,
                "seed": 0,
                "index": 0,
                "kv_cache_bytes": 1000 * (16 if ref else spec.bits + 1),
                "seconds": 1.0 + rng.random(),
                "diagnostics": {} if ref else {"delta_ps": delta, "jsd": abs(delta) / 10},
            }
            paths["record"].write_text(json.dumps(record))
            if ref:
                continue
            psnr = min(99.0, level + video_effect[prompt] + rng.gauss(0.0, 0.3))
            written[vid][name] = psnr
            score = {"psnr": psnr, "psnr_pooled": psnr, "ssim": 0.9, "lpips": None}
            folder = run.root / "metrics" / "fidelity" / vid
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.json").write_text(json.dumps(score))
    return RunDir.open(root), written
