"""The whole path for real: build (or reuse) the VBench env, run VBench-Long on synthetic
H.264 videos through `jbkv vbench run`, and check temporal_flickering against its definition.

Building the env the first time takes minutes (cached afterwards under $JBKV_VBENCH_ENV or
~/.cache/jbkv/vbench-env); set JBKV_SKIP_VBENCH_ENV=1 to skip these tests.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from jbkv_cli.cli.commands.vbench import register
from jbkv_cli.metrics.vbench_env import setup_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("JBKV_SKIP_VBENCH_ENV") == "1", reason="JBKV_SKIP_VBENCH_ENV=1"
    ),
]
REPO = Path(__file__).resolve().parents[2]
FPS, FRAMES, SIZE = 8, 40, 64  # 5 s at 8 fps -> two 2-s clips + one padded tail clip


@pytest.fixture(scope="session")
def vbench_env():
    env, _built = setup_env()
    return env


def _frames(seed: int, jitter: float) -> np.ndarray:
    """A square drifting over a gradient, plus per-frame noise (the 'flicker')."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    base = np.stack([xx * 3, yy * 3, (xx + yy) * 2], axis=-1).astype(np.float64)
    out = []
    for t in range(FRAMES):
        f = base.copy()
        x0 = 8 + t % 32
        f[20:36, x0 : x0 + 16] = (230, 40, 40)
        f += rng.normal(0.0, jitter, size=f.shape)
        out.append(np.clip(f, 0, 255).astype(np.uint8))
    return np.stack(out)


def _write_h264(path: Path, frames: np.ndarray) -> None:
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=FPS)
        s.width, s.height, s.pix_fmt = SIZE, SIZE, "yuv420p"
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def _decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def flicker_score(frames: np.ndarray) -> float:
    """VBench's definition: (255 − mean_t mean|f_t − f_{t+1}|) / 255."""
    f = frames.astype(np.float64)
    return float((255.0 - np.abs(np.diff(f, axis=0)).mean()) / 255.0)


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None: ...

    register(app)
    return app


def test_temporal_flickering_end_to_end(vbench_env, tmp_path):
    run = tmp_path / "run"
    variants = {"bf16": 2.0, "int2": 12.0}
    for i, (variant, jitter) in enumerate(variants.items()):
        d = run / "videos" / variant
        d.mkdir(parents=True)
        for k in range(2):
            _write_h264(d / f"a red square-{k}.mp4", _frames(10 * i + k, jitter))
        (d / "a red square-0.npz").write_bytes(b"lossless copy, ignored")
    (run / "manifest.json").write_text("{}")

    args = ["vbench", "run", str(run), "-d", "temporal_flickering", "--device", "cpu"]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, (res.output, res.exception)
    assert "temporal_flickering" in res.output and "partial" in res.output

    doc = json.loads((run / "metrics" / "vbench.json").read_text())
    assert doc["settings"]["mode"] == "long_custom_input"
    for variant in variants:
        v = doc["variants"][variant]
        tf = v["dimensions"]["temporal_flickering"]
        clips_root = run / "metrics/vbench/long_custom_input" / variant / "videos/split_clip"
        per_video, per_clip, all_clips = {}, {}, []
        for video in sorted(clips_root.iterdir()):
            clips = sorted(video.glob("*.mp4"))
            assert len(clips) == 3  # 16 + 16 + (8 + 8 borrowed) frames
            scores = []
            for clip in clips:
                frames = _decode(clip)
                assert frames.shape == (2 * FPS, SIZE, SIZE, 3)
                scores.append(flicker_score(frames))
            per_video[video.name] = float(np.mean(scores))
            per_clip[video.name] = scores  # in time order: the clips' file names sort so
            all_clips += scores
        assert tf["n_clips"] == 6 and tf["n_videos"] == 2
        # same clip files: VBench decodes with OpenCV, this with PyAV (seen: agree to ~1e-8)
        assert tf["score"] == pytest.approx(np.mean(all_clips), abs=1e-6)
        assert tf["per_video"] == pytest.approx(per_video, abs=1e-6)
        assert set(tf["per_clip"]) == set(per_clip)
        for name, scores in per_clip.items():
            assert tf["per_clip"][name] == pytest.approx(scores, abs=1e-6)
        assert tf["se"] is not None
        assert Path(tf["raw"]).is_file()
        assert v["totals"]["partial"] and "temporal_flickering" not in v["totals"]["missing"]
        assert v["totals"]["total"] is None and v["totals"]["quality"] is not None
    scores = {n: doc["variants"][n]["dimensions"]["temporal_flickering"]["score"] for n in variants}
    assert scores["bf16"] > scores["int2"]

    # a second run reuses the raw results
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output


def test_shipped_subsets_regenerate_from_vbench(vbench_env, tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "scripts/make_vbench_subset.py"), "--out-dir", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for name in ("vbench_long_30.json", "vbench_smoke.json"):
        assert json.loads((tmp_path / name).read_text()) == json.loads(
            (REPO / "prompts" / name).read_text()
        )


def test_setup_is_idempotent_and_fast(vbench_env):
    import time

    t0 = time.perf_counter()
    env, built = setup_env()
    assert not built and env.path == vbench_env.path
    assert time.perf_counter() - t0 < 10
    versions = env.info["check"]["versions"]
    assert versions["vbench"] == "0.1.5" and versions["numpy"].startswith("1.")
    assert versions["transformers"] == "4.33.2"


def test_quantize_eval_vbench_end_to_end(vbench_env, tmp_path):
    """The README's flow in one command on the embedded model: generate, score, VBench
    (dimensions without weights), then the tables; VBench's value equals the definition
    computed on the very clip frames VBench scored."""
    from jbkv_cli.cli.app import app as jbkv_app

    res = CliRunner().invoke(
        jbkv_app,
        [
            "quantize-eval",
            "--vbench",
            "--prompt",
            "a red circle moves right on a dark background",
            "--seeds",
            "0,1",
            "--bits",
            "2",
            "--quantizers",
            "rtn",
            "--corrections",
            "none",
            "--num-chunks",
            "4",
            "--steps",
            "2",
            "--no-lpips",
            "--no-plots",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "VBench" in res.output and "flickering" in res.output
    run = tmp_path / "tiny"
    rows = json.loads((run / "report" / "results.json").read_text())["rows"]
    assert rows[1]["vbench"]["dimensions"]["temporal_flickering"]["n"] == 2
    doc = json.loads((run / "metrics" / "vbench.json").read_text())
    assert set(doc["variants"]) == {"reference", "int2-rtn-g32"}
    for variant, v in doc["variants"].items():
        tf = v["dimensions"]["temporal_flickering"]
        clips_root = run / "metrics/vbench/long_custom_input" / variant / "videos/split_clip"
        scores = [
            flicker_score(_decode(clip))
            for video in sorted(clips_root.iterdir())
            for clip in sorted(video.glob("*.mp4"))
        ]
        assert tf["n_videos"] == 2 and tf["n_clips"] == len(scores) >= 2
        assert tf["score"] == pytest.approx(np.mean(scores), abs=1e-6)
    for fmt in ("table", "md", "csv"):  # the report with VBench columns (it used to crash)
        res = CliRunner().invoke(jbkv_app, ["report", str(run), "--format", fmt])
        assert res.exit_code == 0, (fmt, res.output)
    table = CliRunner().invoke(jbkv_app, ["report", str(run)]).output
    assert "VBench" in table and "flickering" in table
