"""``jbkv llm-prefill`` and the model it reads (issue 33, items 3 and 4), through the installed
``jbkv``: a model folder whose weights changed in place (a same-size fine-tune) is refused on
resume naming the file; a sliding window shorter than the keys and a NaN in the model's config
are refused before the run folder exists. The window is observed, not read from the config."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from jbkv_cli.llm.hosting import host, sliding_windows
from jbkv_cli.llm.tiny.corpus import eval_document
from jbkv_cli.llm.tiny.tokenizer import build_tokenizer
from tests.installed import run_in_process, run_jbkv, run_refusal
from tests.llm.conftest import tiny_lm

SMALL = ["--bins", "64-128", "--chunk-sizes", "16", "--examples", "2"]
SMALL += ["--quantizers", "rtn", "--corrections", "none", "--no-plots"]


def save(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("llm") / "docs.jsonl"
    with path.open("w") as f:
        for i in range(3):
            f.write(json.dumps({"id": f"doc {i}", "text": eval_document(3, i, 300)}) + "\n")
    return path


def one_line(proc, code: int, text: str) -> str:
    assert proc.returncode == code, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in proc.stderr
    assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.slow
def test_a_same_size_fine_tune_in_place_is_refused_on_resume(tmp_path, data):
    """The issue's case: fingerprinted by config and file sizes, a fine-tune saved over the
    model resumed into the old reference (INT4 ΔNLL +0.622 reported, −0.228 true)."""
    model = save(tiny_lm("llama", seed=0), tmp_path / "model")
    args = ["llm-prefill", "--model", model, "--data", data, *SMALL, "--out", tmp_path / "run"]
    first = run_jbkv(*args, "--bits", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    weights = model / "model.safetensors"
    before = sorted(p.name for p in (tmp_path / "run").rglob("*"))
    old = weights.stat()
    shutil.rmtree(model)
    save(tiny_lm("llama", seed=1), model)  # same architecture: same size, other weights
    assert weights.stat().st_size == old.st_size
    os.utime(weights, ns=(old.st_atime_ns, old.st_mtime_ns))
    again = run_in_process(*args, "--bits", "4", cwd=tmp_path)  # a refusal: from its files
    line = one_line(again, 1, f"{weights.resolve()} has changed since the run used it")
    assert "another --out" in line
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == before
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["inputs"])


def _nan_config(folder: Path) -> Path:
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'))
    assert "NaN" in config.read_text()
    return folder


BAD = [  # (model folder maker, exit code, text)
    (
        lambda d: save(tiny_lm("mistral", sliding_window=32), d),
        2,
        "sliding window of 32 tokens but the longest job reads 143 keys",
    ),
    (  # read_json refuses the NaN as it reads the file (check_fit's own check is the net)
        lambda d: _nan_config(save(tiny_lm("llama"), d)),
        1,
        "config.json: invalid JSON (NaN is not a JSON number)",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("make", "code", "text"), BAD, ids=["sliding-window", "nan-config"])
def test_a_model_jbkv_would_compute_wrongly_is_refused_before_the_run_folder_exists(
    tmp_path, data, make, code, text
):
    """Item 4: both were refused by the first job, after the manifest and variant files."""
    model = make(tmp_path / "model")
    run = tmp_path / "run"
    first = code == 2  # through the installed jbkv too (it must answer the same)
    proc = run_refusal("llm-prefill", "--model", model, "--data", data, *SMALL, "--out", run,
                       cwd=tmp_path, installed=first)  # fmt: skip
    one_line(proc, code, text)
    assert not run.exists()


@pytest.mark.parametrize(
    ("arch", "extra", "windows"),
    [
        ("llama", {}, set()),
        ("mistral", {}, set()),  # the test config sets no window
        ("mistral", {"sliding_window": 48}, {48}),
        ("qwen2", {"sliding_window": 40}, set()),  # use_sliding_window is off
        ("qwen2", {"sliding_window": 40, "use_sliding_window": True, "max_window_layers": 1}, {40}),
    ],
)
def test_sliding_windows_are_what_the_layers_hand_to_attention(arch, extra, windows):
    assert sliding_windows(host(tiny_lm(arch, **extra))) == windows
