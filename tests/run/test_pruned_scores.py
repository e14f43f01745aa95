"""Scores of pruned and quantized videos against the same pruner's 16-bit video
(``metrics/pruned16``, jbkv_cli/run/pruned_base.py): which variant is whose baseline, the
scores on frames with a known PSNR, resume filling in only what is missing, a damaged file
scored again, and a baseline video made after its pair was scored."""

from __future__ import annotations

import json
import math

import pytest
import torch

from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.models.base import Video
from jbkv_cli.prune.registry import build_pruner
from jbkv_cli.run import directory as runs_module
from jbkv_cli.run.directory import RunDir, video_name
from jbkv_cli.run.experiment import Scoring, build_matrix, score_fidelity
from jbkv_cli.run.pruned_base import KIND, pruned_baselines

PROMPT = "a pruned prompt"
NAME = video_name(PROMPT, 0)
FLOW = build_pruner("flowcache")
INT2 = KVSpec.build("rtn", 2, 32, "none", pruner=FLOW)
INT2_TAYLOR = KVSpec.build("rtn", 2, 32, "taylor", pruner=FLOW)
UNPRUNED = KVSpec.build("rtn", 2, 32, "none")
BASE = KVSpec(pruner=FLOW)
# uint8 levels: the reference, the pruned 16-bit video, then each pruned + quantized one
LEVEL = {FULL_PRECISION: 50, BASE: 100, INT2: 110, INT2_TAYLOR: 104, UNPRUNED: 60}


def _psnr(a: int, b: int) -> float:
    """PSNR of two constant uint8 videos: 10·log10(255² / (a − b)²)."""
    return 10 * math.log10(255**2 / (a - b) ** 2)


def _write(run: RunDir, spec: KVSpec) -> str:
    vid = run.ensure_variant(spec)
    frames = torch.full((4, 32, 32, 3), LEVEL[spec], dtype=torch.uint8)
    record = {"prompt": PROMPT, "seed": 0, "index": 0, "kv_cache_bytes": 1000, "seconds": 1.0}
    run.save_video(vid, NAME, Video(frames=frames, fps=8.0), record)
    return vid


def _run(tmp_path, specs) -> tuple[RunDir, dict[KVSpec, str]]:
    run = RunDir.create_or_resume(tmp_path / "run", "tiny", {"dtype": "float32"})
    run.register([PROMPT], [0])
    return run, {s: _write(run, s) for s in [FULL_PRECISION, *specs]}


def test_each_pruned_quantized_variant_has_its_pruners_16_bit_one():
    specs = build_matrix([2], ["rtn"], ["none", "taylor"], [32], pruners=["none", "flowcache"])
    variants = {s.variant_id: s for s in specs}
    assert pruned_baselines(variants) == {
        INT2.variant_id: BASE.variant_id,
        INT2_TAYLOR.variant_id: BASE.variant_id,
    }
    other = build_pruner("flowcache", mix_lambda=0.5)  # other settings: not its baseline
    assert pruned_baselines({**variants, BASE.variant_id: KVSpec(pruner=other)}) == {}


def test_scores_against_the_pruned_16_bit_video_and_resume_fills_in_only_the_missing(tmp_path):
    run, vids = _run(tmp_path, [BASE, INT2, INT2_TAYLOR, UNPRUNED])
    score_fidelity(run, lpips=False, show_progress=False)
    for spec in (INT2, INT2_TAYLOR):
        entry = run.read_metrics(KIND, vids[spec])[NAME]
        assert entry["against"] == vids[BASE]
        assert entry["psnr"] == pytest.approx(_psnr(LEVEL[spec], LEVEL[BASE]), abs=1e-3)
        assert entry["psnr_per_chunk"]  # per chunk as the fidelity scores
        full = run.read_metrics("fidelity", vids[spec])[NAME]["psnr"]
        assert full == pytest.approx(_psnr(LEVEL[spec], LEVEL[FULL_PRECISION]), abs=1e-3)
    assert not (run.root / "metrics" / KIND / vids[UNPRUNED]).exists()  # no pruner
    assert not (run.root / "metrics" / KIND / vids[BASE]).exists()  # the baseline itself
    assert Scoring(run, lpips=False).missing() == []

    kept = run.score_path(KIND, vids[INT2_TAYLOR], NAME)
    kept_text = kept.read_text()
    run.score_path(KIND, vids[INT2], NAME).unlink()
    assert [p[:2] for p in Scoring(run, lpips=False).missing()] == [(vids[INT2], NAME)]
    kept.write_text(json.dumps({**json.loads(kept_text), "against": 7}))
    warnings: list[str] = []
    real = runs_module.warn
    runs_module.warn = warnings.append
    try:
        todo = {p[:2] for p in Scoring(run, lpips=False).missing()}
    finally:
        runs_module.warn = real
    assert todo == {(vids[INT2], NAME), (vids[INT2_TAYLOR], NAME)}
    assert any(str(kept) in w and "against" in w for w in warnings)
    fidelity = run.score_path("fidelity", vids[INT2], NAME)
    fidelity_text = fidelity.read_text()
    score_fidelity(run, lpips=False, show_progress=False)
    assert fidelity.read_text() == fidelity_text  # current: not scored again
    for spec in (INT2, INT2_TAYLOR):
        entry = run.read_metrics(KIND, vids[spec])[NAME]
        assert entry["psnr"] == pytest.approx(_psnr(LEVEL[spec], LEVEL[BASE]), abs=1e-3)
    assert json.loads(kept.read_text())["against"] == vids[BASE]


def test_a_baseline_made_after_its_pair_was_scored_is_scored_at_finish_or_resume(tmp_path):
    run, vids = _run(tmp_path, [INT2])
    run.ensure_variant(BASE)  # the 16-bit variant is in the run, its video not done yet
    scoring = Scoring(run, lpips=False)
    scoring.start([(vids[INT2], NAME, None, None)])  # scored now: its reference is done
    assert NAME in run.read_metrics("fidelity", vids[INT2])
    assert run.read_metrics(KIND, vids[INT2]) == {}
    _write(run, BASE)  # made later in the same job
    scoring.finish()
    entry = run.read_metrics(KIND, vids[INT2])[NAME]
    assert entry["psnr"] == pytest.approx(_psnr(LEVEL[INT2], LEVEL[BASE]), abs=1e-3)

    run.score_path(KIND, vids[INT2], NAME).unlink()  # a job that ended before: resume makes it
    assert (vids[INT2], NAME) in {p[:2] for p in Scoring(run, lpips=False).missing()}
    score_fidelity(run, lpips=False, show_progress=False)
    assert NAME in run.read_metrics(KIND, vids[INT2])


@pytest.mark.slow
def test_quantize_eval_with_a_pruner_scores_against_its_16_bit_video(tmp_path):
    """End to end on the embedded model (one prompt, about a minute of CPU): ``--pruners flowcache`` adds
    the 16-bit flowcache variant, each pruned INT2 video is scored against it during the run,
    and results.json and table.md carry the gain against it."""
    from typer.testing import CliRunner

    from jbkv_cli.cli.app import app
    from tests.conftest import TINY_PROMPTS

    prompts = tmp_path / "p.txt"
    prompts.write_text(TINY_PROMPTS[0] + "\n")
    args = ["quantize-eval", "--prompts", str(prompts), "--seeds", "0", "--bits", "2"]
    args += ["--quantizers", "rtn", "--corrections", "none,taylor", "--pruners", "flowcache"]
    args += ["--no-lpips", "--no-plots", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = RunDir.open(next((tmp_path / "out").iterdir()))
    name = video_name(TINY_PROMPTS[0], 0)
    base = KVSpec(pruner=FLOW).variant_id
    assert base in run.variants()
    for spec in (INT2, INT2_TAYLOR):
        entry = run.read_metrics(KIND, spec.variant_id)[name]
        assert entry["against"] == base and entry["psnr_per_chunk"]
        assert 0 < entry["psnr"] <= 100 and 0 < entry["ssim"] <= 1
    assert Scoring(run, lpips=False).missing() == []
    data = json.loads((run.root / "report" / "results.json").read_text())
    (gain,) = data["correction_gains"]
    assert gain["pruned16"] == base
    taylor = run.read_metrics(KIND, INT2_TAYLOR.variant_id)[name]["psnr"]
    plain = run.read_metrics(KIND, INT2.variant_id)[name]["psnr"]
    assert gain["psnr_gain_vs_pruned16"]["mean"] == pytest.approx(taylor - plain)
    assert "vs the pruned 16-bit cache" in result.output
    assert "PSNR dB vs " in (run.root / "report" / "table.md").read_text()
