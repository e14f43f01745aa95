"""The report's long-horizon section (jbkv_cli/report/horizon.py): end to end on the tiny model
with ``quantize-eval --horizon``, and on a copy of that run whose stored scores are replaced by
synthetic ones with known answers (divergence at known chunks, censoring, the still-valid
fraction, the paired delay and gain), in every report format."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from jbkv_cli.metrics.psnr import PSNR_CAP_DB
from jbkv_cli.models.tiny import TinyVideoModel
from jbkv_cli.models.tiny.weights_io import LONG_WEIGHTS
from jbkv_cli.report.horizon import horizon_section, still_valid
from jbkv_cli.report.table import HORIZON_CSV, build_rows
from jbkv_cli.run.directory import RunDir
from tests.installed import run_in_process

BLUE = "a blue square moves left on a light background"
RED = "a red circle moves right on a dark background"
BASE, CORR = "int2-rtn-g32", "int2-rtn-g32-taylor"
CAP = PSNR_CAP_DB
TINY_CHECK = TinyVideoModel.follows_prompt_version  # what the fixture's run stored

# Per video (name order): the uncorrected and corrected PSNR per chunk. The first chunk that
# reads the cache (chunk 1) is 36 dB in every baseline video; the floors are 20 dB (blue) and
# 24 dB (red), so the thresholds are 28 and 30 dB.
FLOORS = {BLUE: 20.0, RED: 24.0}
SERIES = {
    BASE: {
        f"{BLUE}-0": [CAP, 36, 32, 27, 21, 20],  # below 28 at chunk 3
        f"{BLUE}-1": [CAP, 36, 29, 28.5, 27.9, 20],  # chunk 4
        f"{RED}-0": [CAP, 36, 29.9, 29, 25, 24],  # below 30 at chunk 2
        f"{RED}-1": [CAP, 36, 35, 34, 33, 32],  # never: censored
    },
    CORR: {
        f"{BLUE}-0": [CAP, 36.5, 33, 29, 28.1, 27],  # chunk 5: 2 later
        f"{BLUE}-1": [CAP, 36.5, 30, 29, 28.5, 28.2],  # censored: later
        f"{RED}-0": [CAP, 37, 31, 30.5, 29, 25],  # chunk 4: 2 later
        f"{RED}-1": [CAP, 36.5, 35.5, 34.5, 33.5, 32.5],  # censored: a tie
    },
}
VALID = {  # the prompt check per chunk of the baseline's videos
    f"{BLUE}-0": [True, True, True, False, True, True],  # fails at 3 and stays failed
    f"{BLUE}-1": [True] * 6,
    f"{RED}-0": [True, False, True, True, True, True],
    f"{RED}-1": [True] * 6,
}


@pytest.fixture(scope="module")
def horizon_run(tmp_path_factory) -> Path:
    """``quantize-eval --horizon`` on the tiny model, 2 prompts x the preset's 2 seeds, 4
    chunks (about 30 s on 2 shared cores)."""
    prompts = tmp_path_factory.mktemp("prompts") / "p.txt"
    prompts.write_text(f"{RED}\n{BLUE}\n")
    out = tmp_path_factory.mktemp("horizon")
    args = ["quantize-eval", "--horizon", "--num-chunks", "4", "--prompts", str(prompts)]
    args += ["--bits", "2", "--quantizers", "rtn", "--corrections", "none,taylor"]
    r = run_in_process(*args, "--no-lpips", "--no-plots", "--out", str(out), cwd=out)
    assert r.returncode == 0, r.stderr
    return out / "tiny"


def _entry(psnr: list[float]) -> dict:
    mean = sum(psnr) / len(psnr)
    return {"psnr": mean, "ssim": 0.9, "psnr_per_chunk": psnr, "ssim_per_chunk": [0.9] * 6}


@pytest.fixture
def synthetic(horizon_run, tmp_path) -> Path:
    """A copy of the run with the scores of the module's tables."""
    run = tmp_path / "out" / "tiny"
    shutil.copytree(horizon_run, run)
    metrics = run / "metrics"
    for vid, videos in SERIES.items():
        for name, psnr in videos.items():
            (metrics / "fidelity" / vid / f"{name}.json").write_text(json.dumps(_entry(psnr)))
    for prompt, floor in FLOORS.items():
        entry = _entry([floor] * 6) | {"against": f"{prompt}-0"}
        (metrics / "floor" / "reference" / f"{prompt}-1.json").write_text(json.dumps(entry))
    for name, valid in VALID.items():
        entry = {"valid_per_chunk": valid, "chunk_frames": 4}
        (metrics / "prompt" / BASE / f"{name}.json").write_text(json.dumps(entry))
    return run


@pytest.mark.slow
def test_quantize_eval_horizon_stores_checks_and_floors_and_reports_them(horizon_run):
    manifest = json.loads((horizon_run / "manifest.json").read_text())
    assert manifest["seeds"] == [0, 1] and manifest["settings"]["num_chunks"] == 4
    long = hashlib.sha256(LONG_WEIGHTS.read_bytes()).hexdigest()[:16]  # the preset's weights
    assert manifest["settings"]["weights_sha256"] == long
    metrics = horizon_run / "metrics"
    for vid in ("reference", BASE, CORR):  # every video checked against its prompt
        names = sorted(p.stem for p in (metrics / "prompt" / vid).glob("*.json"))
        assert names == sorted(f"{p}-{i}" for p in (RED, BLUE) for i in (0, 1))
        for p in (metrics / "prompt" / vid).glob("*.json"):
            entry = json.loads(p.read_text())
            assert len(entry["valid_per_chunk"]) == 4 and entry["chunk_frames"] == 4
    floors = sorted(p.stem for p in (metrics / "floor" / "reference").glob("*.json"))
    assert floors == [f"{BLUE}-1", f"{RED}-1"]  # seed index 1 against index 0
    floor = json.loads((metrics / "floor" / "reference" / f"{RED}-1.json").read_text())
    assert floor["against"] == f"{RED}-0" and len(floor["psnr_per_chunk"]) == 4
    assert all(10 < x < 40 for x in floor["psnr_per_chunk"])  # two samples: far from identical
    data = json.loads((horizon_run / "report" / "results.json").read_text())
    section = data["horizon"]
    assert section["floor"]["db"] is not None and set(section["floor"]["by_prompt"]) == {RED, BLUE}
    by_vid = {v["variant"]: v for v in section["variants"]}
    assert by_vid["reference"]["divergence"] is None
    assert [p["n"] for p in by_vid["reference"]["still_valid"]] == [4] * 4
    assert by_vid[BASE]["divergence"]["n"] == 4 and by_vid[BASE]["divergence"]["horizon"] == 4
    assert by_vid[CORR]["baseline"] == BASE
    (d,) = section["delays"]
    assert d["variant"] == CORR and d["n"] == 4 and len(d["gain_per_chunk"]) == 4
    assert "## Horizon" in (horizon_run / "report" / "table.md").read_text()


@pytest.mark.slow
def test_known_divergence_censoring_delay_gain_and_still_valid(synthetic):
    run = RunDir.open(synthetic)
    section = horizon_section(run, build_rows(run))
    assert section["floor"]["by_prompt"] == FLOORS and section["floor"]["db"] == 22.0
    by_vid = {v["variant"]: v for v in section["variants"]}
    base, corr = by_vid[BASE], by_vid[CORR]
    assert base["first_chunk_db"] == 36.0 and corr["first_chunk_db"] == 36.0  # the baseline's
    assert base["divergence"]["diverged"] == 3 and base["divergence"]["median"] == 3
    # survival after chunk c: diverged at 3 (blue-0), 4 (blue-1), 2 (red-0); red-1 censored
    assert base["divergence"]["survival"] == [1, 1, 0.75, 0.5, 0.25, 0.25]
    assert corr["divergence"]["diverged"] == 2 and corr["divergence"]["median"] == 5
    (d,) = section["delays"]
    assert (d["later"], d["earlier"], d["ties"]) == (3, 0, 1)
    assert d["median_difference"] == 2.0 and d["p_sign"] == pytest.approx(0.25)
    gains = d["gain_per_chunk"]
    assert [g["n"] for g in gains] == [4, 4, 3, 2, 1, 1]  # the baseline's videos not diverged
    assert gains[1]["mean"] == pytest.approx(0.625) and gains[1]["ci95"] is not None
    assert gains[2]["mean"] == pytest.approx((1 + 1 + 0.5) / 3)  # red-0 left at chunk 2
    valid = [p["fraction"] for p in base["still_valid"]]
    assert valid == [1, 0.75, 0.75, 0.5, 0.5, 0.5]


@pytest.mark.slow
def test_one_seed_has_no_floor_and_says_so(synthetic):
    shutil.rmtree(synthetic / "metrics" / "floor")
    run = RunDir.open(synthetic)
    section = horizon_section(run, build_rows(run))
    assert section["floor"]["db"] is None and "two seeds" in section["floor"]["note"]
    assert all(v["divergence"] is None for v in section["variants"]) and not section["delays"]
    base = next(v for v in section["variants"] if v["variant"] == BASE)
    assert base["still_valid"][-1]["fraction"] == 0.5  # the prompt check needs no floor
    r = run_in_process("report", synthetic, "--format", "md", cwd=synthetic.parent)
    assert r.returncode == 0 and "no floor: it needs two seeds" in r.stdout


@pytest.mark.slow
def test_the_section_in_every_format(synthetic):
    cwd = synthetic.parent
    out = {
        f: run_in_process("report", synthetic, "--format", f, cwd=cwd)
        for f in ("table", "md", "json", "csv", "html")
    }
    for fmt, r in out.items():
        assert r.returncode == 0, (fmt, r.stderr)
    assert json.loads(out["json"].stdout)["horizon"]["delays"][0]["later"] == 3
    for fmt in ("table", "md"):
        text = " ".join(out[fmt].stdout.split())
        assert "horizon: floor 22.00 dB" in text, fmt
        assert "INT2 rtn g32: median chunk 3 · 3/4 diverged within 6 chunks" in text, fmt
        assert "diverges later in 3, earlier in 0, tied 1 of 4 videos" in text, fmt
        assert "still valid chunk 5 50% (2/4)" in text, fmt
        assert "chunk 1 +0.62 dB" in text or "chunk 1 +0.63 dB" in text, fmt
    csv = {line.split(",")[0]: line.split(",")[-4:] for line in out["csv"].stdout.splitlines()}
    assert csv["variant"] == list(HORIZON_CSV)
    assert csv[BASE] == ["3", "3", "4", "0.5"] and csv["reference"][:3] == ["", "", ""]
    page = (synthetic / "report" / "index.html").read_text()
    assert "<h2>Long horizon</h2>" in page and 'id="horizon"' in page
    assert "median chunk 3 · 3/4 diverged within 6 chunks" in page
    assert "diverges later in 3, earlier in 0, tied 1 of 4 videos" in page


def test_still_valid_counts_a_video_out_from_its_first_failed_chunk():
    entries = {
        "a": {"valid_per_chunk": [True, False, True]},
        "b": {"valid_per_chunk": [True, True, True]},
        "c": {"valid_per_chunk": [True, True]},  # shorter: not counted at chunk 2
    }
    out = still_valid(entries)
    assert [p["fraction"] for p in out] == [1.0, 2 / 3, 0.5]
    assert [p["n"] for p in out] == [3, 3, 2]
    assert still_valid({}) == []


@pytest.mark.slow
def test_missing_prompt_checks_and_floors_are_made_again_and_nothing_else(horizon_run, tmp_path):
    """A run whose prompt check and floor files are gone (or damaged) is completed by scoring
    (a resumed quantize-eval) without scoring a pair again (nor one scored in an older run's
    variant file); without a check (``report --score``, no model) only the floor is made."""
    from jbkv_cli.run.experiment import Scoring

    run_dir = tmp_path / "tiny"
    shutil.copytree(horizon_run, run_dir)
    metrics = run_dir / "metrics"
    gone = [
        metrics / "prompt" / BASE / f"{RED}-1.json",
        metrics / "floor/reference" / f"{RED}-1.json",
    ]
    kept = {p: p.read_bytes() for p in gone}
    for p in gone:
        p.unlink()
    (metrics / "prompt" / "reference" / f"{BLUE}-0.json").write_text('{"valid_per_chunk": 3}')
    older = (
        metrics / "fidelity" / BASE
    )  # the baseline's scores in one file, as older runs kept them
    scores = {p.stem: json.loads(p.read_text()) for p in older.glob("*.json")}
    shutil.rmtree(older)
    (metrics / "fidelity" / f"{BASE}.json").write_text(json.dumps(scores))
    fidelity = {p: p.stat().st_mtime_ns for p in metrics.glob("fidelity/**/*.json")}

    run = RunDir.open(run_dir)
    bare = Scoring(run, lpips=False)  # no model: no prompt check
    bare.start(bare.missing())
    bare.finish()
    assert gone[1].read_bytes() == kept[gone[1]] and not gone[0].exists()

    calls = []

    def check(case, frames):
        calls.append(case.prompt)
        return [True] * 4

    scoring = Scoring(RunDir.open(run_dir), lpips=False, check=check, check_version=TINY_CHECK)
    pairs = scoring.missing()
    assert {p[1] for p in pairs} == {f"{RED}-1", f"{BLUE}-0"}
    scoring.start(pairs)
    scoring.finish()
    assert sorted(calls) == [BLUE, RED]  # the missing one and the damaged one, nothing else
    assert json.loads(gone[0].read_text())["valid_per_chunk"] == [True] * 4
    assert (
        json.loads((metrics / "prompt/reference" / f"{BLUE}-0.json").read_text())["chunk_frames"]
        == 4
    )
    assert {p: p.stat().st_mtime_ns for p in metrics.glob("fidelity/**/*.json")} == fidelity
    assert (
        Scoring(RunDir.open(run_dir), lpips=False, check=check, check_version=TINY_CHECK).missing()
        == []
    )


@pytest.mark.slow
def test_prompt_checks_of_another_version_are_made_again(horizon_run, tmp_path):
    """A model whose check changed (a new ``follows_prompt_version``) has every video's stored
    check made again, so a report never mixes two definitions; the same version, none."""
    from jbkv_cli.run.experiment import Scoring

    run_dir = tmp_path / "tiny"
    shutil.copytree(horizon_run, run_dir)
    stored = sorted((run_dir / "metrics" / "prompt").glob("*/*.json"))
    assert len(stored) == 12  # the reference and two variants, 4 videos each
    assert {json.loads(p.read_text())["check_version"] for p in stored} == {TINY_CHECK}
    calls = []

    def check(case, frames):
        calls.append(case.prompt)
        return [False] * 4

    same = Scoring(RunDir.open(run_dir), lpips=False, check=check, check_version=TINY_CHECK)
    assert same.missing() == []
    older = json.loads(stored[0].read_text())  # a variant's video: one pair
    stored[0].write_text(json.dumps({k: v for k, v in older.items() if k != "check_version"}))
    assert [p[:2] for p in same.missing()] == [(stored[0].parent.name, stored[0].stem)]
    first = Scoring(RunDir.open(run_dir), lpips=False, check=check, check_version=1)
    assert not first._unchecked({k: v for k, v in older.items() if k != "check_version"})
    newer = Scoring(RunDir.open(run_dir), lpips=False, check=check, check_version=TINY_CHECK + 1)
    newer.start(newer.missing())
    newer.finish()
    assert len(calls) == 12
    entry = {"valid_per_chunk": [False] * 4, "chunk_frames": 4, "check_version": TINY_CHECK + 1}
    assert all(json.loads(p.read_text()) == entry for p in stored)


# VBench-Long's subject consistency per 1-s clip (8 frames of 8 fps: 2 chunks of 4 frames) of
# the reference and the baseline; background consistency of one clip only (not over time).
CLIPS = {
    "reference": {f"{p}-{i}": [0.95, 0.95] for p in (RED, BLUE) for i in (0, 1)},
    BASE: {
        f"{RED}-0": [0.95, 0.90],
        f"{RED}-1": [0.94, 0.89],
        f"{BLUE}-0": [0.96, 0.91],
        f"{BLUE}-1": [0.95, None],  # its second clip not scored: left out of clip 1
    },
}


def _vbench(clips: dict, seconds: list[float]) -> dict:
    def dims(per_clip: dict) -> dict:
        one = {"score": 0.9, "se": None, "n_videos": len(per_clip)}
        return {
            "subject_consistency": one | {"per_clip": per_clip},
            "background_consistency": one | {"per_clip": {v: [0.9] for v in per_clip}},
        }

    return {
        "settings": {"mode": "long_custom_input"},
        "clip_seconds": {"dimensions": {"subject_consistency": seconds}},
        "variants": {vid: {"dimensions": dims(c), "totals": {}} for vid, c in clips.items()},
    }


@pytest.mark.slow
def test_vbench_consistency_per_clip_against_the_reference(synthetic):
    (synthetic / "metrics" / "vbench.json").write_text(json.dumps(_vbench(CLIPS, [1.0])))
    run = RunDir.open(synthetic)
    (entry,) = horizon_section(run, build_rows(run))["vbench"]  # background: one clip
    assert entry["dimension"] == "subject_consistency" and entry["clip_seconds"] == 1.0
    assert [c["chunks"] for c in entry["clips"]] == [[0, 1], [2, 3]]
    ref, base = entry["variants"]
    assert ref["variant"] == "reference" and ref["vs_reference"] is None
    assert [p["mean"] for p in ref["per_clip"]] == pytest.approx([0.95, 0.95])
    assert [p["n"] for p in base["per_clip"]] == [4, 3]
    first, second = base["vs_reference"]
    assert first["mean"] == pytest.approx(0.0) and first["n"] == 4
    assert second["mean"] == pytest.approx((-0.05 - 0.06 - 0.04) / 3) and second["n"] == 3
    lo, hi = second["ci95"]
    assert lo < second["mean"] < hi < 0  # every video lost consistency in its second clip
    r = run_in_process("report", synthetic, "--format", "md", cwd=synthetic.parent)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0, r.stderr
    assert (
        "VBench subject_consistency per 1-s clip (chunks 0–1, chunks 2–3), INT2 rtn g32: "
        "0.950 (Δ +0.000 [" in text
    )
    assert "0.900 (Δ -0.050 [" in text
    r = run_in_process("report", synthetic, "--format", "html", cwd=synthetic.parent)
    assert r.returncode == 0, r.stderr
    page = (synthetic / "report" / "index.html").read_text()
    assert "VBench subject_consistency per 1-s clip" in page and "0.900 (Δ -0.050 [" in page


@pytest.mark.slow
def test_vbench_over_time_alone_makes_the_section(synthetic):
    """A real model has no prompt check, and one seed has no floor: VBench's clips remain."""
    shutil.rmtree(synthetic / "metrics" / "prompt")
    shutil.rmtree(synthetic / "metrics" / "floor")
    two_lengths = _vbench(CLIPS, [2.0, 10.0])  # prompts split at two lengths: no chunk spans
    (synthetic / "metrics" / "vbench.json").write_text(json.dumps(two_lengths))
    run = RunDir.open(synthetic)
    section = horizon_section(run, build_rows(run))
    assert all(v["divergence"] is None and v["still_valid"] is None for v in section["variants"])
    (entry,) = section["vbench"]
    assert entry["clip_seconds"] is None and [c["chunks"] for c in entry["clips"]] == [None] * 2
    r = run_in_process("report", synthetic, "--format", "md", cwd=synthetic.parent)
    assert r.returncode == 0 and "per clip (clip 0, clip 1), INT2 rtn g32" in r.stdout
    r = run_in_process("report", synthetic, "--format", "html", cwd=synthetic.parent)
    assert r.returncode == 0, r.stderr
    page = (synthetic / "report" / "index.html").read_text()
    assert "<h2>Long horizon</h2>" in page and 'id="horizon"' not in page
    single = {vid: {v: x[:1] for v, x in c.items()} for vid, c in CLIPS.items()}
    (synthetic / "metrics" / "vbench.json").write_text(json.dumps(_vbench(single, [2.0])))
    assert horizon_section(run, build_rows(run)) is None  # one clip: nothing over time
