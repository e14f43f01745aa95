"""No model folder's code ever runs (``jbkv_cli/utils/pretrained.py``).

Each loader is given a folder whose ``config.json`` or ``tokenizer_config.json`` names a Python
file in ``auto_map`` (a type transformers does not know). The file writes a marker when it is
imported. With ``trust_remote_code`` unset, transformers asks on stdin and runs it on "y". Every
case here answers "y\\ny\\n" on stdin and checks four things: the marker is absent, nothing is
copied into the modules cache, the exit code is 1, and the one line names the folder. Loaders
that the CLI reaches (``llm-prefill --model`` folder or hub id, SkyReels-V2 ``--weights``,
Self-Forcing's ``$JBKV_SELF_FORCING_DIR``, Rolling Forcing ``--weights``) run the CLI: the hub
id through the installed ``jbkv`` (its Hugging Face cache is found from ``HF_HOME``, which
transformers reads once, when it is imported) with stdin a real pipe, the others in this
process, one of them through the installed ``jbkv`` as well. The MAGI-1 T5 and HY-WorldPlay ByT5 and Qwen loaders need whole official weight folders
to be reached from the CLI, so they are called in-process.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import jbkv_cli
from jbkv_cli.llm.models import EMBEDDED_DIR, load_lm, load_tokenizer
from jbkv_cli.llm.tiny.tokenizer import build_tokenizer
from jbkv_cli.utils.pretrained import CustomCodeError, from_pretrained
from tests.installed import run_in_process, run_jbkv

PROBE = "jbkv_probe"  # the module a poisoned folder ships
ANSWER = "y\ny\n"  # what a pipe into jbkv says when transformers asks


def _probe_source(marker: Path) -> str:
    """A module that writes ``marker`` when imported, then defines what its auto_map names (so
    that, were it run, loading would go on as a real custom model)."""
    return (
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast\n"
        "class ProbeConfig(LlamaConfig):\n"
        "    model_type = 'jbkv-probe'\n"
        "class ProbeForCausalLM(LlamaForCausalLM):\n"
        "    config_class = ProbeConfig\n"
        "class ProbeTokenizer(PreTrainedTokenizerFast):\n"
        "    pass\n"
    )


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes, indent=2))


def poison(folder: Path, marker: Path, *parts: str) -> Path:
    """``folder`` asking for its own code in each of ``parts``: ``config`` (an unknown model
    type whose classes ``auto_map`` names) and ``tokenizer`` (an unknown tokenizer class,
    likewise). transformers reads a tokenizer's ``auto_map`` only when the folder's config is
    not of a type it knows, so a loader that reads a model's config too gets both."""
    (folder / f"{PROBE}.py").write_text(_probe_source(marker))
    if "config" in parts:
        _edit_json(
            folder / "config.json",
            model_type="jbkv-probe",
            architectures=["ProbeForCausalLM"],
            auto_map={
                "AutoConfig": f"{PROBE}.ProbeConfig",
                "AutoModelForCausalLM": f"{PROBE}.ProbeForCausalLM",
            },
        )
    if "tokenizer" in parts:
        _edit_json(
            folder / "tokenizer_config.json",
            tokenizer_class="ProbeTokenizer",
            auto_map={"AutoTokenizer": [f"{PROBE}.ProbeTokenizer", None]},
        )
    return folder


def _copied(modules: Path) -> list[Path]:
    """Copies of the probe module in transformers' modules cache ``modules``."""
    return list(modules.rglob(f"{PROBE}*.py")) if modules.exists() else []


def _refused(proc, marker: Path, modules: Path, folder: object) -> None:
    assert not marker.exists(), f"the folder's code ran: {proc.stderr}"
    assert not _copied(modules), _copied(modules)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert str(folder) in lines[0] and "own Python code" in lines[0], lines[0]


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "MARKER"


@pytest.fixture
def answered(monkeypatch, tmp_path) -> Path:
    """In-process: stdin says "y", and transformers' modules cache is a fresh folder (returned),
    so a copy would be seen and nothing reaches the user's cache."""
    import transformers.dynamic_module_utils as dmu

    modules = tmp_path / "hf_modules"
    monkeypatch.setattr(sys, "stdin", io.StringIO(ANSWER))
    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(modules))
    return modules


def _assert_in_process(call, folder: Path, marker: Path, modules: Path) -> None:
    with pytest.raises(CustomCodeError) as info:
        call()
    assert str(folder) in str(info.value) and "\n" not in str(info.value)
    assert not marker.exists() and not _copied(modules)


# --- the package: one way in --------------------------------------------------------------------


def test_every_from_pretrained_in_jbkv_goes_through_the_helper():
    """A ``.from_pretrained(`` call anywhere else would be a loader without the guard."""
    package = Path(jbkv_cli.__file__).parent
    helper = package / "pretrained.py"
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == helper:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "from_pretrained"
            ):
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    assert found == []


def test_a_folder_of_a_known_type_loads_and_its_auto_map_is_ignored(tmp_path, marker, answered):
    """``model_type: llama`` beside an ``auto_map``: transformers' own class, nothing run."""
    folder = shutil.copytree(EMBEDDED_DIR, tmp_path / "m")
    (folder / f"{PROBE}.py").write_text(_probe_source(marker))
    _edit_json(folder / "config.json", auto_map={"AutoConfig": f"{PROBE}.ProbeConfig"})
    from transformers import AutoConfig

    config = from_pretrained(AutoConfig, folder)
    assert type(config).__name__ == "LlamaConfig" and not marker.exists()


# --- in-process loaders -------------------------------------------------------------------------


@pytest.mark.parametrize("part", ["config", "tokenizer"])
def test_llm_loader_refuses_custom_code(tmp_path, marker, answered, part):
    folder = poison(shutil.copytree(EMBEDDED_DIR, tmp_path / "m"), marker, part)
    _assert_in_process(lambda: load_lm(str(folder), "float32", "cpu"), folder, marker, answered)
    if part == "tokenizer":
        _assert_in_process(lambda: load_tokenizer(str(folder)), folder, marker, answered)


def _tokenizer_folder(folder: Path, marker: Path) -> Path:
    """A saved tokenizer and a T5 config, both asking for their own code."""
    from transformers import T5Config

    build_tokenizer().save_pretrained(folder)
    T5Config(d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2, vocab_size=218).save_pretrained(
        folder
    )
    return poison(folder, marker, "config", "tokenizer")


def test_magi1_t5_loader_refuses_custom_code(tmp_path, marker, answered):
    from jbkv_cli.models.magi1.text import load_t5

    folder = _tokenizer_folder(tmp_path / "t5", marker)
    _assert_in_process(lambda: load_t5(folder, 16), folder, marker, answered)


def _hy_paths(tmp_path: Path, **given: Path):
    from jbkv_cli.models.hy_worldplay.checkpoint import WeightPaths

    names = ("dit", "dit_config", "vae", "qwen", "byt5", "glyph", "siglip")
    return WeightPaths(**{n: given.get(n, tmp_path / "absent" / n) for n in names})


def test_hy_worldplay_byt5_loader_refuses_custom_code(tmp_path, marker, answered):
    from jbkv_cli.models.hy_worldplay.loaders import load_byt5

    folder = _tokenizer_folder(tmp_path / "byt5", marker)
    paths = _hy_paths(tmp_path, byt5=folder)
    _assert_in_process(lambda: load_byt5(paths, torch.float32), folder, marker, answered)


def test_hy_worldplay_qwen_loader_refuses_custom_code(tmp_path, marker, answered):
    """The Qwen folder (a tiny Qwen2.5-VL, which loads) with config and tokenizer asking for
    code."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel

    from jbkv_cli.models.hy_worldplay.loaders import load_encoders

    text = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=218,
        rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
    )
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16)
    torch.manual_seed(0)
    folder = tmp_path / "qwen"
    Qwen2_5_VLModel(Qwen2_5_VLConfig(text_config=text, vision_config=vision)).save_pretrained(
        folder
    )
    build_tokenizer().save_pretrained(folder)
    poison(folder, marker, "config", "tokenizer")
    paths = _hy_paths(tmp_path, qwen=folder)
    _assert_in_process(lambda: load_encoders(paths, "cpu", "cpu"), folder, marker, answered)


# --- through the installed jbkv -----------------------------------------------------------------


_spec = importlib.util.spec_from_file_location(
    "derive_keys",
    Path(__file__).parents[1] / "models" / "wan" / "self_forcing" / "fixtures" / "derive_keys.py",
)
derive_keys = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(derive_keys)
TINY_UPSTREAM = dict(
    dim=64, ffn_dim=32, freq_dim=256, text_dim=32, num_layers=2, in_dim=16, out_dim=16
) | {"patch": (1, 2, 2)}


def _wan_root(root: Path, marker: Path) -> Path:
    """ROOT/Wan2.1-T2V-1.3B-Diffusers (tiny, its tokenizer asking for code) and the Self-Forcing
    and Rolling Forcing generator checkpoints under ROOT/checkpoints."""
    from jbkv_cli.models.wan.self_forcing import components as comp
    from jbkv_cli.models.wan.self_forcing.checkpoint import diffusers_name, strip_wrappers

    tiny = comp.tiny_components(seed=0)
    base = root / comp.BASE_DIR
    comp.save_base(tiny, base)
    poison(base / "tokenizer", marker, "tokenizer")
    sd = tiny.transformer.state_dict()
    state = {
        k: sd[diffusers_name(strip_wrappers(k))].clone() for k in derive_keys.derive(TINY_UPSTREAM)
    }
    (root / "checkpoints").mkdir()
    for name in ("self_forcing_dmd.pt", "rolling_forcing_dmd.pt"):
        torch.save({"generator": state, "generator_ema": state}, root / "checkpoints" / name)
    return base / "tokenizer"


def _skyreels_root(root: Path, marker: Path) -> Path:
    from jbkv_cli.models.wan.skyreels_v2 import components as sky

    sky.save_components(sky.tiny_components(seed=0), root)
    poison(root / "tokenizer", marker, "tokenizer")
    return root / "tokenizer"


def _hub_cache(home: Path, repo: str, marker: Path) -> None:
    """``repo`` in an offline Hugging Face cache under ``home`` (refs/main -> a snapshot),
    its config asking for code."""
    cache = home / "hub" / ("models--" + repo.replace("/", "--"))
    commit = "0" * 40
    (cache / "refs").mkdir(parents=True)
    (cache / "refs" / "main").write_text(commit)
    snapshot = shutil.copytree(EMBEDDED_DIR, cache / "snapshots" / commit)
    poison(snapshot, marker, "config")


@pytest.mark.slow
def test_every_cli_loader_refuses_custom_code_whatever_stdin_says(tmp_path, monkeypatch):
    """Six folders, each with its own marker; stdin saying "y", ``HF_HOME`` a fresh folder (the
    modules cache lies under it). The hub id and the first folder through the installed
    ``jbkv`` (stdin a pipe), where the first must answer byte for byte as in this process; the
    others in this process (``run_in_process``, stdin a stream), with transformers' modules
    cache, which it fixes when it is imported, moved to the fresh folder too."""
    import transformers.dynamic_module_utils as dmu

    home = tmp_path / "hf"
    home.mkdir()
    markers = {n: tmp_path / f"MARKER-{n}" for n in ("cfg", "tok", "hub", "sky", "wan")}
    model_cfg = poison(shutil.copytree(EMBEDDED_DIR, tmp_path / "cfg"), markers["cfg"], "config")
    model_tok = poison(shutil.copytree(EMBEDDED_DIR, tmp_path / "tok"), markers["tok"], "tokenizer")
    _hub_cache(home, "jbkv-probe/remote-code", markers["hub"])
    sky_tok = _skyreels_root(tmp_path / "sky", markers["sky"])
    wan_tok = _wan_root(tmp_path / "wan", markers["wan"])
    data = tmp_path / "d.txt"
    data.write_text("key value " * 400)
    llm = ["llm-prefill", "--data", data, "--bins", "16-32", "--chunk-sizes", "8", "--no-plots"]
    video = ["--device", "cpu", "--prompt", "a cat", "-o", "height=32", "-o", "width=32"]
    video += ["-o", "num_chunks=2", "--no-reference"]
    sky = ["-o", "chunk_frames=2", "-o", "steps=1", "-o", "guidance=1.0", "--out", tmp_path / "r4"]
    rf = ["--out", tmp_path / "r6"]
    cases = [
        ([*llm, "--model", model_cfg, "--out", tmp_path / "r1"], {}, "cfg", model_cfg),
        ([*llm, "--model", model_tok, "--out", tmp_path / "r2"], {}, "tok", model_tok),
        (
            [*llm, "--model", "jbkv-probe/remote-code", "--out", tmp_path / "r3"],
            {},
            "hub",
            "jbkv-probe/remote-code",
        ),
        (
            ["generate", "-m", "skyreels-v2", "--weights", tmp_path / "sky", *video, *sky],
            {},
            "sky",
            sky_tok,
        ),
        (
            ["generate", "-m", "self-forcing", *video, "--out", tmp_path / "r5"],
            {"JBKV_SELF_FORCING_DIR": str(tmp_path / "wan")},
            "wan",
            wan_tok,
        ),
        (
            ["generate", "-m", "rolling-forcing", "--weights", tmp_path / "wan", *video, *rf],
            {},
            "wan",
            wan_tok,
        ),
    ]
    env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(home / "modules")}
    environ = dict(os.environ)  # as it is outside run_in_process, which changes os.environ

    def installed(case):
        args, extra, _, _ = case
        return run_jbkv(
            *args, cwd=tmp_path, environ=environ, env=env | extra, stdin=ANSWER, timeout=600
        )

    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(home / "modules"))
    with ThreadPoolExecutor(max_workers=2) as pool:  # meanwhile, the cases in this process
        running = [pool.submit(installed, case) for case in (cases[0], cases[2])]
        results = [
            run_in_process(*args, cwd=tmp_path, env=env | extra, stdin=ANSWER)
            for args, extra, _, _ in cases
            if "jbkv-probe/remote-code" not in args
        ]
        there = [r.result() for r in running]  # the first folder and the hub id
    answers = [(r.returncode, r.stdout, r.stderr) for r in (results[0], there[0])]
    assert answers[0] == answers[1], answers
    results.insert(2, there[1])
    failed = []  # every case's outcome, not only the first one's
    for (args, _, name, folder), proc in zip(cases, results, strict=True):
        try:
            _refused(proc, markers[name], home / "modules", folder)
        except AssertionError as exc:
            failed.append(f"{args[0]} {folder}: {str(exc).splitlines()[0]}")
    assert not failed, "\n".join(failed)
    assert not any((tmp_path / f"r{i}").exists() for i in range(1, 7))
