"""Output paths (``--json``, ``--csv``, ``profile-heads --out``, ``convert-checkpoint DST``) never
overwrite what jbkv reads.

``jbkv_cli/cli/outputs.py``: a file of a run directory (except under its ``report/``), a file the
command reads (the same file under another name too), a file of an input folder, or a path above
any of them is a usage error before anything runs; symlinks are resolved first. The CLI cases
run the installed ``jbkv``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from jbkv_cli.cli.outputs import check_output_file
from jbkv_cli.llm.models import EMBEDDED_DIR
from jbkv_cli.llm.tiny.corpus import eval_document
from jbkv_cli.models.tiny.weights_io import DEFAULT_WEIGHTS
from jbkv_cli.models.wan.self_forcing.components import _BASE_REQUIRED as BASE_REQUIRED
from jbkv_cli.models.wan.self_forcing.components import BASE_DIR
from jbkv_cli.prune.profile import default_profile_path
from jbkv_cli.utils.errors import UsageError
from tests.installed import run_in_process, run_jbkv
from tests.models.test_input_paths import fill_layout
from tests.models.wan.matrix_game.conftest import write_inputs

pytestmark = pytest.mark.slow

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


def test_input_files_are_protected_under_any_name(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    (tmp_path / "link.jsonl").symlink_to(data)
    os.link(data, tmp_path / "hard.jsonl")
    for target in (data, tmp_path / "link.jsonl", tmp_path / "hard.jsonl"):
        with pytest.raises(UsageError, match=r"would overwrite .*data\.jsonl, which this command"):
            check_output_file(target, "--json", inputs=[data])
    check_output_file(tmp_path / "beside.jsonl", "--json", inputs=[data])


def test_a_hard_link_to_a_file_of_an_input_folder_is_refused(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    os.link(model / "config.json", tmp_path / "out.json")
    with pytest.raises(UsageError, match=r"is a hard link to .*model/config\.json"):
        check_output_file(tmp_path / "out.json", "--json", inputs=[model])
    with pytest.raises(UsageError, match="inside the input folder"):
        check_output_file(model / "new.json", "--json", inputs=[model])
    (tmp_path / "alone.json").write_text("{}")  # one name only: no folder is searched
    check_output_file(tmp_path / "alone.json", "--json", inputs=[model])


def test_a_folder_named_like_a_run_without_a_jbkv_manifest_is_not_one(tmp_path):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "manifest.json").write_text('{"name": "an app"}')
    check_output_file(tmp_path / "web" / "x.json", "--json")


# --- through the installed jbkv ------------------------------------------------------------------


def _jbkv(args: list[object], cwd: Path) -> subprocess.CompletedProcess:
    return run_jbkv(*args, cwd=cwd)


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


# --- what a command reads is never its output (issue 33) -----------------------------------------


def _reads(tmp_path: Path) -> dict[str, Path]:
    """Every kind of input: a model folder (a copy of the embedded LM) and its data, a prompt
    file, a Matrix-Game-2 case file with its image and actions file, the tiny model's weights,
    a Forcing-KV head profile, a Self-Forcing weights folder (empty files: only located), and
    links to some of them."""
    model = shutil.copytree(EMBEDDED_DIR, tmp_path / "M")
    data = tmp_path / "D" / "data.jsonl"
    data.parent.mkdir()
    data.write_text(
        "".join(json.dumps({"text": eval_document(3, i, 300)}) + "\n" for i in range(3))
    )
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle moves right on a dark background\n")
    image, actions = write_inputs(tmp_path)
    cases = tmp_path / "cases.csv"
    cases.write_text("image,prompt,pose\n1.png,a red room,a.json\n")
    weights = Path(shutil.copy(DEFAULT_WEIGHTS, tmp_path / "tiny.safetensors"))
    profile = Path(shutil.copy(default_profile_path("tiny", "forcing-kv"), tmp_path / "p.json"))
    sf = tmp_path / "sf"
    fill_layout(sf / BASE_DIR, BASE_REQUIRED)
    (sf / "checkpoints").mkdir()
    (sf / "checkpoints" / "self_forcing_dmd.pt").write_bytes(b"")
    os.link(prompts, tmp_path / "prompts-hard.txt")
    os.link(model / "model.safetensors", tmp_path / "model-hard.safetensors")
    (tmp_path / "data-link.jsonl").symlink_to(data)
    return dict(
        model=model, data=data, prompts=prompts, image=image, actions=actions, cases=cases,
        weights=weights, profile=profile, sf=sf,
    )  # fmt: skip


def test_no_output_overwrites_what_its_command_reads(tmp_path):
    """``llm-prefill --json``, ``quantize-eval --json`` and ``profile-heads --out`` onto each of
    their inputs: exit 2, one line naming both, every file as it was, no run folder made."""
    r = _reads(tmp_path)
    runs = tmp_path / "runs"
    llm = ["llm-prefill", "--model", r["model"], "--data", r["data"], "--bins", "16-32"]
    llm += ["--chunk-sizes", "8", "--examples", "1", "--bits", "2", "--quantizers", "rtn"]
    llm += ["--corrections", "none", "--no-plots", "--out", runs / "llm"]
    qe = ["quantize-eval", "--seeds", "0", "--bits", "2", "--quantizers", "rtn", "--no-lpips"]
    qe += ["--no-plots", "--out", runs / "qe"]
    mg = ["-m", "matrix-game-2", "-o", "config=tiny-random", "--cases", r["cases"]]
    tiny = ["--prompts", r["prompts"]]
    profile = f"forcing-kv.profile={r['profile']}"
    generator = r["sf"] / "checkpoints" / "self_forcing_dmd.pt"  # found by its variable
    reads = "which this command reads"
    cases = [  # (arguments, what the one line says); the first nine are issue 33's
        ([*llm, "--json", r["data"]], reads),
        ([*llm, "--json", r["model"] / "config.json"], "inside the input folder"),
        ([*llm, "--json", r["model"] / "model.safetensors"], "inside the input folder"),
        ([*qe, *tiny, "--json", r["prompts"]], reads),
        ([*qe, *mg, "--json", r["cases"]], reads),
        ([*qe, *mg, "--json", r["actions"]], reads),
        ([*qe, *mg, "--json", r["image"]], reads),
        (["profile-heads", *tiny, "--out", r["prompts"]], reads),
        (["profile-heads", *mg, "--out", r["cases"]], reads),
        ([*llm, "--json", tmp_path / "data-link.jsonl"], reads),
        ([*llm, "--json", tmp_path / "model-hard.safetensors"], "hard link"),
        ([*qe, *tiny, "--json", tmp_path / "prompts-hard.txt"], reads),
        ([*qe, *tiny, "--weights", r["weights"], "--json", r["weights"]], reads),
        (
            [*qe, *tiny, "--pruners", "forcing-kv", "-M", profile, "--json", r["profile"]],
            reads,
        ),
        ([*qe, "-m", "self-forcing", "--prompt", "a cat", "--json", generator], reads),
    ]
    env = {"JBKV_SELF_FORCING_DIR": str(r["sf"]), "OMP_NUM_THREADS": "1"}
    before = _snapshot(tmp_path)
    # in this process, the first case also through the installed jbkv, which must answer the same
    results = [run_in_process(*c[0], cwd=tmp_path, env=env) for c in cases]
    installed = run_jbkv(*cases[0][0], cwd=tmp_path, env=env)
    assert (installed.returncode, installed.stderr) == (results[0].returncode, results[0].stderr)
    failed = []
    for (args, needle), proc in zip(cases, results, strict=True):
        lines = proc.stderr.splitlines()
        target = str(args[-1])
        if not (
            proc.returncode == 2
            and len(lines) == 1
            and lines[0].startswith("error: ")
            and needle in lines[0]
            and target in lines[0]
        ):
            failed.append(f"{target}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    assert not failed, "\n".join(failed)
    assert _snapshot(tmp_path) == before  # nothing written over, nothing made
    assert not runs.exists()
