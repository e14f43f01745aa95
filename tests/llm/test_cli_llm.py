"""``jbkv llm-prefill`` and ``jbkv report`` of its runs, through the installed ``jbkv`` (and
``torchrun``) in subprocesses: exit codes, one-line errors, resume, refusal, the gate.

A ``jbkv llm-prefill`` process spends most of its CPU importing torch and transformers and
loading the model (a run with nothing left to score still takes about 9 CPU-s on the tiny
Llama), so the Llama is run once (the ``llama`` fixture) and tests that need a finished run copy
it. Refusals that answer from arguments and files run in this process (``tests/installed.py``'s
``run_in_process``); each such test runs one of its cases through the installed ``jbkv`` too,
which must answer byte for byte the same."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from jbkv_cli.llm.models import EMBEDDED_DIR
from jbkv_cli.llm.tiny.corpus import eval_document
from jbkv_cli.llm.tiny.tokenizer import build_tokenizer
from tests.installed import run_in_process, run_jbkv
from tests.llm.conftest import tiny_lm

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
TORCHRUN = str(BIN / "torchrun")
SMALL = ["--bins", "64-128,128-192", "--chunk-sizes", "16,48", "--examples", "2"]
SMALL += ["--bits", "2", "--quantizers", "rtn", "--corrections", "none,taylor"]
VARIANTS = 3  # reference, INT2, INT2 + taylor
JOBS = 2 * 2 * 2  # bins x chunk sizes x examples


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return env | {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "HF_HUB_OFFLINE": "1"}


def jbkv(*args, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess:
    return run_jbkv(*args, cwd=cwd, environ=_env(home or cwd), timeout=600)


def here(*args, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess:
    """:func:`jbkv` in this process, for a command that answers from its arguments and files."""
    home = home or cwd
    return run_in_process(
        *args, cwd=cwd, env={"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    )


def same(proc: subprocess.CompletedProcess, *args, cwd: Path, home: Path | None = None) -> None:
    """``proc`` (:func:`here`'s) is what the installed ``jbkv`` answers to ``args``."""
    there = jbkv(*args, cwd=cwd, home=home)
    expected = (there.returncode, there.stdout, there.stderr)
    assert (proc.returncode, proc.stdout, proc.stderr) == expected, args


def _one_line_error(proc: subprocess.CompletedProcess, code: int, text: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert text in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    """Tiny random Llama / Mistral / Qwen2 folders (the embedded tokenizer) and a JSONL file."""
    root = tmp_path_factory.mktemp("llm")
    out = {}
    for arch in ("llama", "mistral", "qwen2"):
        folder = root / arch
        tiny_lm(arch).save_pretrained(folder)
        build_tokenizer().save_pretrained(folder)
        out[arch] = folder
    data = root / "docs.jsonl"
    with data.open("w") as f:
        for i in range(5):
            f.write(json.dumps({"id": f"doc {i}", "text": eval_document(3, i, 300)}) + "\n")
    out["data"] = data
    return out


def llama_args(assets, run: Path, json_path: Path) -> list:
    """``jbkv llm-prefill`` on the tiny Llama: SMALL, one process on the CPU, plots and --json."""
    args = ["llm-prefill", "--model", assets["llama"], "--data", assets["data"], *SMALL]
    return [*args, "--device", "cpu", "--out", run, "--json", json_path]


class Made(NamedTuple):
    run: Path
    json: Path
    proc: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def llama(assets, tmp_path_factory) -> Made:
    """The Llama's one full run (:func:`llama_args`), its --json file and what it printed: what
    the end-to-end test checks, the report, the gate and the two-rank comparison read, and the
    resume and full-disk tests copy (none of them writes into it)."""
    cwd = tmp_path_factory.mktemp("llama-run")
    made = jbkv(*llama_args(assets, cwd / "run", cwd / "result.json"), cwd=cwd)
    assert made.returncode == 0, made.stderr
    return Made(cwd / "run", cwd / "result.json", made)


@pytest.fixture(scope="module")
def llama_run(llama) -> Path:
    return llama.run


def test_end_to_end_resume_and_refusal(assets, llama, tmp_path):
    """The fixture's run made everything; a copy of it resumes with nothing to do, refuses a
    --json over its manifest and other settings, and scores again only a deleted record."""
    first = llama.proc
    assert f"{JOBS * VARIANTS} (example, variant) jobs scored, 0 already done" in first.stderr
    assert len(list(llama.run.glob("variants/*/c*.json"))) == JOBS * VARIANTS
    result = json.loads(llama.json.read_text())
    assert result["kind"] == "llm-prefill" and result["reference_dtype"] == "float32"
    report = llama.run / "report"
    assert (report / "nll.png").is_file() and (report / "table.md").is_file()
    assert "ΔNLL vs ref" in first.stdout and "reference (float32)" in first.stdout

    run = shutil.copytree(llama.run, tmp_path / "run")
    args = llama_args(assets, run, tmp_path / "result.json")
    records = sorted(run.glob("variants/*/c*.json"))
    again = jbkv(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"0 (example, variant) jobs scored, {JOBS * VARIANTS} already done" in again.stderr

    manifest = (run / "manifest.json").read_bytes()
    over = [*map(str, args[:-1]), str(run / "manifest.json")]  # --json over the run's manifest
    _one_line_error(here(*over, cwd=tmp_path), 2, "inside the run directory")
    assert (run / "manifest.json").read_bytes() == manifest

    records[0].unlink()  # as if killed before that record was written
    resumed = jbkv(*args, cwd=tmp_path)
    assert "1 (example, variant) jobs scored" in resumed.stderr, resumed.stderr
    assert json.loads((tmp_path / "result.json").read_text())["rows"] == result["rows"]

    before = sorted(p.name for p in run.rglob("*"))
    other = here(*[a if a != "2" else "3" for a in map(str, args)], cwd=tmp_path)
    _one_line_error(other, 2, "was made with different settings")
    assert sorted(p.name for p in run.rglob("*")) == before


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_runs_on_mistral_and_qwen2(assets, tmp_path, arch):
    proc = jbkv(
        "llm-prefill", "--model", assets[arch], "--data", assets["data"], *SMALL,
        "--out", tmp_path / "run", "--no-plots", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "run").glob("variants/*/c*.json"))) == JOBS * VARIANTS


def test_report_and_gate(llama_run, tmp_path):
    run = llama_run
    shown = here("report", run, "--format", "json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    same(shown, "report", run, "--format", "json", cwd=tmp_path)
    data = json.loads(shown.stdout)
    assert data["kind"] == "llm-prefill" and len(data["jobs"]) == JOBS
    baseline = tmp_path / "baseline.json"
    baseline.write_text(shown.stdout)
    passed = here("report", run, "--baseline", baseline, cwd=tmp_path)
    assert passed.returncode == 0 and "gate passed" in passed.stderr, passed.stderr

    better = json.loads(shown.stdout)
    for row in better["rows"]:
        if row["variant"] != "reference":
            row["nll"]["mean"] -= 1.0  # a baseline the run is now much worse than
    baseline.write_text(json.dumps(better))
    failed = here("report", run, "--baseline", baseline, cwd=tmp_path)
    assert failed.returncode == 1 and "gate failed" in failed.stderr
    assert "NLL" in failed.stderr and "Traceback" not in failed.stderr
    bad_tol = here("report", run, "--baseline", baseline, "--tolerance", "psnr=1", cwd=tmp_path)
    _one_line_error(bad_tol, 2, "--tolerance")


BAD = [
    (["--bins", "9-3"], "bad --bins"),
    (["--bins", "64-128,100-200"], "overlap"),
    (["--chunk-sizes", "0"], "bad --chunk-sizes"),
    (["--bits", "5"], "bad --bits"),
    (["--quantizers", "nope"], "bad --quantizers"),
    (["--backend", "dense"], "--backend"),
    (["--data", "missing.jsonl"], "is neither longbench-pro"),
    (["--model", "no/such/dir"], "is neither 'tiny'"),
    (["--bins", "400-500", "--chunk-sizes", "64"], "positions"),
    (["--data", "synthetic"], "embedded LM"),
    (["--seed", "4294967296"], "--seed"),
    (["--bins", ""], "bad --bins ''"),  # an empty value is not "the default"
    (["--chunk-sizes", ""], "bad --chunk-sizes ''"),
    (["--data", ""], "--data is empty"),
]


@pytest.mark.parametrize(("extra", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_and_creates_nothing(assets, tmp_path, extra, message):
    """In this process; the first case through the installed ``jbkv`` as well."""
    args = {"--model": str(assets["llama"]), "--data": str(assets["data"])}
    for key, value in zip(extra[::2], extra[1::2], strict=True):
        args[key] = value
    flat = ["llm-prefill", *(x for kv in args.items() for x in kv), "--out", tmp_path / "run"]
    proc = here(*flat, cwd=tmp_path)
    _one_line_error(proc, 2, message)
    assert not (tmp_path / "run").exists()
    if (extra, message) == BAD[0]:
        same(proc, *flat, cwd=tmp_path)
        assert not (tmp_path / "run").exists()


def test_longbench_pro_not_fetched_says_how(assets, tmp_path):
    proc = here(
        "llm-prefill", "--model", assets["llama"], "--data", "longbench-pro",
        "--out", tmp_path / "run", cwd=tmp_path, home=tmp_path,
    )  # fmt: skip
    _one_line_error(proc, 1, "jbkv weights fetch longbench-pro")
    assert not (tmp_path / "run").exists()


def test_two_ranks_give_the_records_of_one_process(assets, llama_run, tmp_path):
    base = ["llm-prefill", "--model", assets["llama"], "--data", assets["data"], *SMALL]
    base += ["--no-plots", "--device", "cpu"]  # llama_run's options (its plots aside)
    two = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "jbkv_cli", *map(str, base),
         "--out", str(tmp_path / "two")],
        capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path) | {"JBKV_DIST_TIMEOUT": "120"},
        timeout=600,
    )  # fmt: skip
    assert two.returncode == 0, two.stderr
    assert "per rank: 12, 12" in two.stderr
    ranks = set()
    for path in sorted(llama_run.glob("variants/*/c*.json")):
        a = json.loads(path.read_text())
        b = json.loads((tmp_path / "two" / path.relative_to(llama_run)).read_text())
        ranks.add(b["rank"])
        assert a["nll"] == b["nll"] and a["kv_cache_bytes"] == b["kv_cache_bytes"]
    assert ranks == {0, 1}


@pytest.mark.skipif(not (EMBEDDED_DIR / "config.json").is_file(), reason="embedded LM not built")
def test_embedded_lm_runs_with_nothing_downloaded(tmp_path):
    proc = jbkv(
        "llm-prefill", "--examples", "1", "--bins", "128-256", "--chunk-sizes", "32",
        "--bits", "2", "--quantizers", "rtn", "--out", tmp_path / "run", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "tiny · teacher-forced NLL" in proc.stdout


def test_longbench_pro_fetched_from_a_mirror_then_used_english_only(assets, tmp_path, local_server):
    """`jbkv weights fetch longbench-pro` (the shipped manifest's entry, read from a local
    mirror: nothing leaves 127.0.0.1) puts the file where `--data longbench-pro` reads it; only
    its English records become examples."""
    records = [
        {"id": f"en-{i}", "language": "English", "context": eval_document(5, i, 300)}
        for i in range(3)
    ] + [{"id": "zh-0", "language": "Chinese", "context": eval_document(6, 0, 300)}]
    (local_server.root / "longbench_pro.json").write_text(json.dumps(records))
    fetched = jbkv("weights", "fetch", "longbench-pro", "--mirror", local_server.url, cwd=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    run = tmp_path / "run"
    proc = jbkv(
        "llm-prefill", "--model", assets["llama"], "--data", "longbench-pro",
        "--bins", "64-128", "--chunk-sizes", "16", "--examples", "4", "--bits", "2",
        "--quantizers", "rtn", "--corrections", "none", "--no-plots", "--out", run, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    used = {json.loads(p.read_text())["document"] for p in run.glob("variants/*/c*.json")}
    assert len(used) == 3 and all("en-" in d for d in used), used
    assert "fewer than 4" in proc.stderr  # 3 English records for 4 asked


def test_a_hub_id_is_not_downloaded_offline(assets, tmp_path):
    """A hub id goes to transformers; with the hub offline (as every test runs) it is one line
    and exit 1, and nothing is created: tests never download a model."""
    proc = jbkv(
        "llm-prefill", "--model", "nobody-jbkv/no-such-model", "--data", assets["data"],
        "--out", tmp_path / "run", cwd=tmp_path,
    )  # fmt: skip
    _one_line_error(proc, 1, "cannot load --model 'nobody-jbkv/no-such-model'")
    assert not (tmp_path / "run").exists()


class _Payload:
    """A pickle that would create a file if its code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _damage(folder: Path, how: str, sentinel: Path) -> str:
    """Damage a copy of a model folder; return the file the error must name."""
    import pickle

    config = folder / "config.json"
    if how == "pickle":
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"x": _Payload(sentinel)}, 2))
        return "pytorch_model.bin"
    if how == "cut safetensors":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
        return "model.safetensors"
    settings = json.loads(config.read_text())
    if how == "zero heads":
        settings["num_attention_heads"] = 0
    else:  # weights of head dim 32 under a config of head dim 16
        settings["head_dim"] = 16
    config.write_text(json.dumps(settings))
    return "config.json"


DAMAGED = ["pickle", "cut safetensors", "zero heads", "other head dim"]


def test_a_damaged_model_folder_is_one_line_naming_the_file(assets, tmp_path):
    """Each used to escape in transformers' or torch's words: a raw ``UnpicklingError`` (after
    torch's own warning), ``SafetensorError`` or ``ZeroDivisionError`` without a file, or
    transformers' 11-line load report. Now: exit 1, one line naming the file, nothing created,
    and the pickle's code never ran. In this process; the pickle through the installed ``jbkv``
    as well."""
    sentinel = tmp_path / "pickle-code-ran"

    def one(how: str) -> tuple[str, subprocess.CompletedProcess]:
        folder = tmp_path / how.replace(" ", "-")
        shutil.copytree(assets["llama"], folder)
        named = _damage(folder, how, sentinel)
        args = ["llm-prefill", "--model", folder, "--data", assets["data"], *SMALL]
        args += ["--out", tmp_path / f"run-{folder.name}"]
        proc = here(*args, cwd=tmp_path)
        if how == DAMAGED[0]:
            same(proc, *args, cwd=tmp_path)
        return str(folder / named), proc

    results = [one(how) for how in DAMAGED]
    for how, (named, proc) in zip(DAMAGED, results, strict=True):
        _one_line_error(proc, 1, named)
        assert "cannot load" in proc.stderr or "whole number" in proc.stderr, (how, proc.stderr)
    assert "posix.system" in results[0][1].stderr  # what the pickle asked for, refused
    assert "head_dim" in results[3][1].stderr and "[64, 64]" in results[3][1].stderr
    assert not sentinel.exists(), "the pickle's code ran"
    assert not list(tmp_path.glob("run-*")), "a refused model left a run folder"


ENOSPC_HOOK = (
    Path(__file__).parents[1] / "support" / "enospc"
)  # sitecustomize: ENOSPC for chosen names


def test_a_full_disk_during_the_report_names_the_file(assets, llama_run, tmp_path):
    """A disk full for one report file: one line naming it, exit 1, no partial file left. The
    plot's failure was ``OSError: [Errno 28] No space left on device``, without a path. Each
    target's run is a copy of the finished run without its report, so the command scores
    nothing and its first writes are the report's (as at the end of a first run)."""
    from concurrent.futures import ThreadPoolExecutor

    targets = ["nll.png", "results.json", "table.md", "rows.json"]

    def one(target: str) -> subprocess.CompletedProcess:
        run = shutil.copytree(llama_run, tmp_path / target)
        shutil.rmtree(run / "report")
        hook = os.pathsep.join(p for p in (str(ENOSPC_HOOK), os.environ.get("PYTHONPATH")) if p)
        env = _env(tmp_path) | {"PYTHONPATH": hook, "JBKV_TEST_ENOSPC": target}
        argv = llama_args(assets, run, run / "report" / "rows.json")
        return run_jbkv(*argv, cwd=tmp_path, environ=env, timeout=600)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, targets))
    for target, proc in zip(targets, results, strict=True):
        path = tmp_path / target / "report" / target
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert errors == [f"error: cannot write {path}: No space left on device"], proc.stderr
        assert not path.exists(), target
        hidden = [p for p in (tmp_path / target).rglob(".*") if p.is_file()]
        assert not hidden, f"temp files left: {hidden}"


def test_a_load_report_is_one_warning_line(assets, tmp_path):
    """A folder whose weights lack a tensor loads (transformers initialises it at random) with
    one warning line naming it, where transformers printed its load report table."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "llama"
    shutil.copytree(assets["llama"], folder)
    state = load_file(folder / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    proc = jbkv(
        "llm-prefill", "--model", folder, "--data", assets["data"], "--bins", "64-128",
        "--chunk-sizes", "16", "--examples", "1", "--bits", "2", "--quantizers", "rtn",
        "--corrections", "none", "--no-plots", "--out", tmp_path / "run", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "LlamaForCausalLM" in ln]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("warning: transformers: LlamaForCausalLM from ")
    assert "MISSING model.layers.1.mlp.up_proj.weight" in warnings[0]
    assert "LOAD REPORT" not in proc.stderr and "|" not in proc.stderr
