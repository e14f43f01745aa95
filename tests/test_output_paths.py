"""Output paths (``--json``, ``--csv``, ``profile-heads --out``, ``convert-checkpoint DST``) never
overwrite what jbkv reads.

``jbkv_cli/outputs.py``: a file of a run directory (except under its ``report/``), a file of an
input folder, or a path above either is a usage error before anything runs; symlinks are
resolved first. The CLI cases run the installed ``jbkv``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from jbkv_cli.errors import UsageError
from jbkv_cli.outputs import check_output_file

JBKV = str(Path(sys.executable).with_name("jbkv"))
NAME = "a red circle moves right on a dark background-0"  # a video of conftest's tiny_run


@pytest.fixture
def run(tiny_run, tmp_path) -> Path:
    root = tmp_path / "out" / "tiny"
    shutil.copytree(tiny_run, root)
    return root


# --- the helper ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "relative",
    [
        "manifest.json",
        "videos/reference/variant.json",
        f"videos/int2-rtn-g32/{NAME}.json",
        f"metrics/fidelity/int2-rtn-g32/{NAME}.json",
        "metrics/new.json",
        "new.json",
        "report",  # the folder itself is not a file under it
    ],
)
def test_files_of_a_run_are_refused(run, relative):
    with pytest.raises(UsageError, match=r"inside the run directory|is a directory"):
        check_output_file(run / relative, "--json")


def test_report_folder_of_a_run_and_places_outside_are_allowed(run, tmp_path):
    check_output_file(run / "report" / "results.json", "--json")
    check_output_file(run / "report" / "new" / "x.json", "--json")
    check_output_file(tmp_path / "elsewhere.json", "--json")
    check_output_file(run.parent / "beside.json", "--json")  # beside the run, not in it


def test_a_run_the_command_is_about_to_make_is_protected(tmp_path):
    new = tmp_path / "new" / "tiny"
    with pytest.raises(UsageError, match="inside the run directory"):
        check_output_file(new / "manifest.json", "--json", runs=[new])
    with pytest.raises(UsageError, match="would have to be a folder"):
        check_output_file(tmp_path / "new", "--json", runs=[new])
    check_output_file(new / "report" / "r.json", "--json", runs=[new])


def test_input_folders_are_protected_whatever_they_hold(tmp_path):
    ref, test = tmp_path / "ref", tmp_path / "test"
    ref.mkdir()
    test.mkdir()
    for target in (ref / "a.json", test / "deep" / "x.csv"):
        with pytest.raises(UsageError, match="inside the input folder"):
            check_output_file(target, "--json", inputs=(ref, test))
    check_output_file(tmp_path / "out.json", "--json", inputs=(ref, test))


def test_symlinks_are_resolved(run, tmp_path):
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    with pytest.raises(UsageError, match=r"-> .*inside the run directory"):
        check_output_file(tmp_path / "link" / "manifest.json", "--json")
    (tmp_path / "file.json").symlink_to(run / "manifest.json")
    with pytest.raises(UsageError, match="inside the run directory"):
        check_output_file(tmp_path / "file.json", "--json")


def test_a_folder_named_like_a_run_without_a_jbkv_manifest_is_not_one(tmp_path):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "manifest.json").write_text('{"name": "an app"}')
    check_output_file(tmp_path / "web" / "x.json", "--json")


# --- through the installed jbkv ------------------------------------------------------------------


def _jbkv(args: list[object], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [JBKV, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=900
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_command_refuses_an_output_inside_a_run_or_an_input(run, tmp_path):
    ref, test = run / "videos" / "reference", run / "videos" / "int2-rtn-g32"
    plain = tmp_path / "plain"
    shutil.copytree(ref, plain / "ref", ignore=shutil.ignore_patterns("*.json", "*.mkv"))
    shutil.copytree(test, plain / "test", ignore=shutil.ignore_patterns("*.json", "*.mkv"))
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    torch.save({"generator": {"model.patch_embedding.weight": torch.ones(4)}}, tmp_path / "g.pt")
    qe = ["quantize-eval", "--seeds", "0", "--bits", "2", "--quantizers", "rtn", "--no-lpips"]
    cases = [
        ([*qe, "--out", run.parent, "--json", run / "manifest.json"], "inside the run"),
        (
            [*qe, "--out", tmp_path / "new", "--json", tmp_path / "new/tiny/r.json"],
            "inside the run",
        ),
        ([*qe, "--out", tmp_path / "new", "--json", tmp_path / "new"], "would have to be a folder"),
        (["fidelity", ref, test, "--json", test / f"{NAME}.json"], "inside the run"),
        (["fidelity", plain / "ref", plain / "test", "--csv", plain / "ref/x.csv"], "input folder"),
        (["fidelity", ref, test, "--json", tmp_path / "link/manifest.json"], "inside the run"),
        (["fidelity", ref, test, "--json", tmp_path / "a", "--csv", tmp_path / "a"], "same file"),
        (["profile-heads", "--out", run / "manifest.json"], "inside the run"),
        (["convert-checkpoint", tmp_path / "g.pt", run / "g.safetensors"], "inside the run"),
    ]
    before = _snapshot(tmp_path)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: _jbkv(c[0], tmp_path), cases))
    for (args, needle), r in zip(cases, results, strict=True):
        lines = r.stderr.splitlines()
        assert r.returncode == 2 and len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith("error: ") and needle in lines[0], (args, r.stderr)
    assert _snapshot(tmp_path) == before  # nothing written, nothing created
    assert not (tmp_path / "new").exists()


def test_an_output_in_the_runs_report_folder_is_written(run, tmp_path):
    ref, test = run / "videos" / "reference", run / "videos" / "int2-rtn-g32"
    target = run / "report" / "fidelity.json"
    r = _jbkv(["fidelity", ref, test, "--no-lpips", "--json", target], tmp_path)
    assert r.returncode == 0, r.stderr
    assert target.is_file()
