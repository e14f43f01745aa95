"""A run is made from files identified by content (jbkv_cli/run/fingerprints.py): replace a case's
image, its pose or actions file, or the model's weights in place and a resume is refused with
one line naming the file (exit 1) before anything is written. Through the installed ``jbkv``,
on the tiny random configurations (issue 33, items 3 and 4)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from functools import partial
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.installed import run_in_process, run_jbkv, run_refusal

pytestmark = pytest.mark.slow

jbkv = partial(run_jbkv, columns=160, env={"OMP_NUM_THREADS": "1"})
# a refused resume answers from its arguments and files: in this process, the Matrix-Game-2.0
# image case through the installed jbkv too (it must answer the same)
refusal = partial(run_refusal, columns=160, env={"OMP_NUM_THREADS": "1"})
in_process = partial(run_in_process, columns=160, env={"OMP_NUM_THREADS": "1"})
MATRIX_GAME = ["generate", "-m", "matrix-game-2", "-o", "config=tiny-random"]
HY_WORLDPLAY = ["generate", "-m", "hy-worldplay", "-o", "config=tiny-random", "-o", "num_chunks=2"]


def refused(r, path: Path) -> None:
    """Exit 1, one line naming ``path`` as changed, no traceback."""
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert (
        lines[0].startswith(f"error: {path.resolve()}")
        and "has changed since the run used it" in lines[0]
    )


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of the run folder, by relative path, with its bytes."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def write_actions(folder: Path, seed: int) -> None:
    from tests.models.wan.matrix_game.conftest import write_inputs

    write_inputs(folder, seed=seed)


@pytest.fixture(scope="module")
def matrix_game_run(tmp_path_factory) -> Path:
    """A Matrix-Game-2.0 run of one case (image + actions file): reference and INT2."""
    folder = tmp_path_factory.mktemp("mg2")
    write_actions(folder, seed=0)
    (folder / "cases.csv").write_text("image,prompt,pose\n1.png,a red room,a.json\n")
    r = jbkv(*MATRIX_GAME, "--cases", "cases.csv", "--bits", "2", "--out", "run", cwd=folder)
    assert r.returncode == 0, r.stderr
    return folder


def _copy(folder: Path, tmp_path: Path) -> Path:
    """The run and its inputs under ``tmp_path``, its manifest's case paths moved with them
    (a case is named by its files' paths too: the case file resolves them there)."""
    copy = tmp_path / "w"
    shutil.copytree(folder, copy)
    manifest = copy / "run" / "manifest.json"
    text = manifest.read_text()
    manifest.write_text(text.replace(str(folder.resolve()), str(copy.resolve())))
    return copy


def _replace_image(folder: Path) -> Path:
    Image.new("RGB", (48, 32), (10, 200, 30)).save(folder / "1.png")
    return folder / "1.png"


def _replace_actions(folder: Path) -> Path:
    image = (folder / "1.png").read_bytes()
    write_actions(folder, seed=1)  # rewrites both: keep the image
    (folder / "1.png").write_bytes(image)
    return folder / "a.json"


@pytest.mark.parametrize("replace", [_replace_image, _replace_actions], ids=["image", "actions"])
def test_matrix_game_resume_from_a_replaced_case_file_is_refused(
    matrix_game_run, tmp_path, replace
):
    """The issue's case: the report mixed both inputs (INT2 PSNR 22.97 dB; 46.23 dB clean)."""
    folder = _copy(matrix_game_run, tmp_path)
    before = snapshot(folder / "run")
    path = replace(folder)
    args = (*MATRIX_GAME, "--cases", "cases.csv", "--bits", "4", "--out", "run")
    refused(refusal(*args, cwd=folder, installed=replace is _replace_image), path)
    assert snapshot(folder / "run") == before


def test_a_run_that_kept_no_digests_gets_them_on_resume_then_holds_them(matrix_game_run, tmp_path):
    """Runs of earlier versions: the first resume records the files as they are."""
    folder = _copy(matrix_game_run, tmp_path)
    manifest_path = folder / "run" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    kept = manifest["cases"]["1-a"].pop("sha256")
    del manifest["inputs"]
    manifest_path.write_text(json.dumps(manifest))
    r = in_process(*MATRIX_GAME, "--cases", "cases.csv", "--bits", "4", "--out", "run", cwd=folder)
    assert r.returncode == 0, r.stderr
    manifest = json.loads(manifest_path.read_text())
    assert manifest["cases"]["1-a"]["sha256"] == kept and manifest["inputs"] == {}
    record = json.loads((folder / "run" / "videos" / "int4-rtn-g32" / "1-a-0.json").read_text())
    assert record["case"]["sha256"] == kept
    path = _replace_actions(folder)
    r = in_process(*MATRIX_GAME, "--cases", "cases.csv", "--bits", "3", "--out", "run", cwd=folder)
    refused(r, path)


def _pose(path: Path, spec: str) -> Path:
    from jbkv_cli.models.hy_worldplay.trajectory import pose_string_to_json

    path.write_text(json.dumps(pose_string_to_json(spec)))
    return path


def test_hy_worldplay_changed_pose_file_is_refused_before_anything_is_written(tmp_path):
    """Item 4: the kept memory plan's check used to refuse a changed pose file only inside
    generation, after the new variant's folder existed; now nothing is written. (An image is
    checked as Matrix-Game-2.0's is, above.)"""
    Image.new("RGB", (24, 16), (200, 40, 90)).save(tmp_path / "1.png")
    pose = _pose(tmp_path / "p.json", "w-7")
    (tmp_path / "cases.csv").write_text("image_name,caption,pose\n1.png,a red house,p.json\n")
    args = [*HY_WORLDPLAY, "--cases", "cases.csv", "--out", "run"]
    r = jbkv(*args, "--bits", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    before = snapshot(tmp_path / "run")
    _pose(pose, "d-7")
    refused(in_process(*args, "--bits", "4", cwd=tmp_path), pose)
    assert snapshot(tmp_path / "run") == before


def _self_forcing_weights(root: Path, shift: float) -> Path:
    """ROOT/Wan2.1-T2V-1.3B-Diffusers/ (tiny base) + ROOT/checkpoints/self_forcing_dmd.pt, its
    generator the tiny transformer's weights plus ``shift``, under upstream's names."""
    from jbkv_cli.models.wan.self_forcing import components as comp
    from jbkv_cli.models.wan.self_forcing.checkpoint import diffusers_name, strip_wrappers

    fixtures = (
        Path(__file__).parents[1]
        / "models"
        / "wan"
        / "self_forcing"
        / "fixtures"
        / "derive_keys.py"
    )
    spec = importlib.util.spec_from_file_location("derive_keys", fixtures)
    derive_keys = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive_keys)
    upstream = dict(dim=64, ffn_dim=32, freq_dim=256, text_dim=32, num_layers=2, in_dim=16)
    upstream |= {"out_dim": 16, "patch": (1, 2, 2)}
    tiny = comp.tiny_components(seed=0)
    base = root / comp.BASE_DIR
    if not base.is_dir():
        comp.save_base(tiny, base)
    sd = tiny.transformer.state_dict()
    ema = {k: sd[diffusers_name(strip_wrappers(k))] + shift for k in derive_keys.derive(upstream)}
    (root / "checkpoints").mkdir(exist_ok=True)
    path = root / "checkpoints" / "self_forcing_dmd.pt"
    torch.save({"generator_ema": ema}, path)
    return path


def test_self_forcing_resume_with_a_rewritten_generator_of_the_same_size_and_mtime_is_refused(
    tmp_path,
):
    """The generator was kept by path: a same-size checkpoint with its mtime restored resumed
    into the old reference."""
    pytest.importorskip("diffusers")
    generator = _self_forcing_weights(tmp_path / "w", shift=0.0)
    args = ["generate", "-m", "self-forcing", "--weights", "w", "--device", "cpu", "-o",
            "height=32", "-o", "width=32", "-o", "num_chunks=2", "--prompt", "a cat",
            "--out", "run"]  # fmt: skip
    r = jbkv(*args, "--bits", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    before, old = snapshot(tmp_path / "run"), generator.stat()
    _self_forcing_weights(tmp_path / "w", shift=0.01)
    os.utime(generator, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert generator.stat().st_size == old.st_size
    refused(in_process(*args, "--bits", "4", cwd=tmp_path), generator.resolve())
    assert snapshot(tmp_path / "run") == before
