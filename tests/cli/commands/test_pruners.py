"""``--pruners`` / ``--pruner`` and ``profile-heads`` on the embedded model (small settings)."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jbkv_cli.cli.app import app
from jbkv_cli.prune import load_profile
from tests.installed import run_in_process, run_jbkv

PROMPT = "a red circle moves right on a dark background"
SMALL = ["--prompt", PROMPT, "--seeds", "0", "--num-chunks", "3", "--steps", "1"]


@pytest.fixture(scope="module")
def pruned_run(tmp_path_factory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("pruned")
    args = ["quantize-eval", *SMALL, "--quantizers", "rtn", "--bits", "2"]
    args += ["--pruners", "none,forcing-kv,forcing-kv-history", "--corrections", "none,taylor"]
    args += ["--no-lpips", "--no-plots", "--out", str(out), "--json", str(out / "r.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out / "tiny", json.loads((out / "r.json").read_text()), result.output


@pytest.mark.slow  # end to end
def test_quantize_eval_rows_carry_the_pruner(pruned_run):
    _, data, output = pruned_run
    rows = {r["variant"]: r for r in data["rows"]}
    assert list(rows) == [
        "reference",
        "int2-rtn-g32",
        "int2-rtn-g32-taylor",
        "forcingkv",
        "int2-rtn-g32-forcingkv",
        "int2-rtn-g32-forcingkv-taylor",
        "fkv",
        "int2-rtn-g32-fkv",
        "int2-rtn-g32-fkv-taylor",
    ]
    pruners = {"none", "forcing-kv", "forcing-kv-history"}
    assert {r["pruner"] for r in rows.values()} == pruners
    assert rows["reference"]["kv_ratio"] == 1.0 and rows["reference"]["pruner"] == "none"
    int2 = rows["int2-rtn-g32"]
    # the shipped profiles: forcing-kv's (upstream's rule) finds no static head on this model
    for short, title, kinds in (
        ("forcingkv", "Forcing-KV", {"unsplit", "dynamic"}),
        ("fkv", "Forcing-KV-history", {"static", "dynamic"}),
    ):
        fp = rows[short]
        assert fp["label"] == f"FP32 {title}" and fp["bits"] == 16
        assert 0 < fp["kv_ratio"] < 1
        pruned = rows[f"int2-rtn-g32-{short}-taylor"]
        assert pruned["kv_ratio"] < int2["kv_ratio"]
        assert pruned["storage"] == f"int2-rtn-g32-{short}"
        for r in (fp, pruned):
            split = r["kv_bytes_by_head"]
            assert set(split) == kinds and sum(split.values()) == r["kv_cache_bytes"]
        assert pruned["psnr"]["mean"] > 10 and fp["psnr"]["mean"] > pruned["psnr"]["mean"]
    gains = {g["storage"] for g in data["correction_gains"]}
    assert gains == {"int2-rtn-g32", "int2-rtn-g32-forcingkv", "int2-rtn-g32-fkv"}
    assert "Forcing-KV" in output and "KV/ref" in output and "dynamic heads" in output


def test_report_rebuilds_the_pruned_rows(pruned_run):
    run, data, _ = pruned_run
    result = CliRunner().invoke(app, ["report", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rows"] == data["rows"]
    page = (run / "report" / "index.html").read_text()
    assert "INT2 rtn g32 Forcing-KV +taylor" in page
    assert "INT2 rtn g32 Forcing-KV-history +taylor" in page
    table = (run / "report" / "table.md").read_text()
    assert "| FP32 Forcing-KV | none + forcing-kv | 32 |" in table  # stored as the model gave it
    assert "| FP32 Forcing-KV-history | none + forcing-kv-history | 32 |" in table


@pytest.mark.slow  # end to end
def test_generate_with_a_pruner(tmp_path):
    base = ["generate", *SMALL, "--bits", "2", "-q", "rtn", "--correct", "--out", str(tmp_path)]
    for pruner, option, folder, stored in (
        (
            "forcing-kv",
            "sim_retention_ratio=0.5",
            "int2-rtn-g32-forcingkv-r50-taylor",
            {
                "name": "forcing-kv",
                "sink_size": 1,
                "spatial_context_length": 1,
                "temporal_context_length": 1,
                "dynamic_context_length": None,
                "num_frame_patch": None,
                "sim_retention_ratio": 0.5,
                "ar_start": 1,
                "profile": None,
                "profile_sha256": None,
            },
        ),
        (
            "forcing-kv-history",
            "retention=0.5",
            "int2-rtn-g32-fkv-r50-taylor",
            {
                "name": "forcing-kv-history",
                "anchor_frames": None,
                "segments": 8,
                "retention": 0.5,
                "profile": None,
                "profile_sha256": None,
            },
        ),
    ):
        args = [*base[:-1], str(tmp_path / pruner), "--pruner", pruner, "-M", f"{pruner}.{option}"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        spec = json.loads((tmp_path / pruner / "videos" / folder / "variant.json").read_text())
        assert spec["pruner"] == stored
    reference = tmp_path / "forcing-kv/videos/reference/variant.json"
    assert "pruner" not in json.loads(reference.read_text())


@pytest.mark.slow  # end to end
def test_profile_heads_writes_a_profile_the_pruner_reads(tmp_path):
    path = tmp_path / "heads.json"
    result = CliRunner().invoke(app, ["profile-heads", *SMALL, "--out", str(path)])
    assert result.exit_code == 0, result.output
    profile = load_profile(path)
    assert (profile.rule, profile.threshold, profile.anchor_frames) == ("forcing-kv", 0.8, None)
    doc = json.loads(path.read_text())
    assert doc["samples"] == [{"prompt": PROMPT, "seed": 0}]
    assert doc["command"].startswith(
        "jbkv profile-heads --model tiny --rule forcing-kv --last-frames 4 --skip-frames 1 "
        "--threshold 0.8"
    )
    assert set(doc["stability"]) == {"samples", "steps"}
    args = ["generate", *SMALL, "--bits", "16", "--pruner", "forcing-kv"]
    args += ["-M", f"forcing-kv.profile={path}", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # jbkv's earlier rule, for forcing-kv-history
    old = tmp_path / "old.json"
    args = ["profile-heads", *SMALL, "--rule", "local-mass", "--anchor-frames", "2"]
    result = CliRunner().invoke(app, [*args, "--threshold", "0.6", "--out", str(old)])
    assert result.exit_code == 0, result.output
    profile = load_profile(old)
    assert (profile.rule, profile.threshold, profile.anchor_frames) == ("local-mass", 0.6, 2)
    command = json.loads(old.read_text())["command"]
    assert command.startswith("jbkv profile-heads --model tiny --rule local-mass --anchor-frames 2")
    args = ["generate", *SMALL, "--bits", "16", "--pruner", "forcing-kv-history"]
    args += ["-M", f"forcing-kv-history.profile={old}", "--out", str(tmp_path / "run2")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output


_jbkv = partial(run_jbkv, columns=120)


USAGE_ERRORS = [
    (["quantize-eval", "--pruners", "none,snapkv"], "bad --pruners"),
    (["generate", "--pruner", "snapkv"], "--pruner must be"),
    (["quantize-eval", "--pruners", "forcing-kv", "-M", "forcing-kv.profile=no.json"], "no.json"),
    (
        ["quantize-eval", "--pruners", "forcing-kv", "-M", "forcing-kv.sim_retention_ratio=2"],
        "sim_retention_ratio",
    ),
    (["generate", "--pruner", "forcing-kv", "-M", "forcing-kv.segments=8"], "segments"),
    (["generate", "--pruner", "forcing-kv", "-M", "forcing-kv.num_frame_patch=6"], "divide"),
    (
        [
            "quantize-eval",
            "--pruners",
            "forcing-kv-history",
            "-M",
            "forcing-kv-history.retention=2",
        ],
        "retention",
    ),
    (["generate", "--pruner", "forcing-kv", "--ablation", "keys-only"], "--ablation"),
    (["profile-heads", "--threshold", "1.5"], "--threshold"),
    (
        ["profile-heads", "--anchor-frames", "2"],
        "--anchor-frames does not go with --rule forcing-kv",
    ),
    (["profile-heads", "--rule", "local-mass", "--last-frames", "3"], "--last-frames does not go"),
    (["profile-heads", "--rule", "snapkv"], "--rule must be"),
    (["generate", "-b", "2", "-q", "kivi", "--pruner", "forcing-kv", *SMALL], "cannot prune"),
]


def test_an_adapter_without_a_head_layout_is_refused_in_one_line(tmp_path, monkeypatch):
    """A model registered without ``head_layout()``: pruning and profiling are usage errors."""
    import types
    from dataclasses import replace

    from jbkv_cli.models import registry
    from jbkv_cli.models.contract import VideoModelBase
    from jbkv_cli.models.tiny import ENTRY, load_model

    class Plain(VideoModelBase):
        def __init__(self, model):
            self.name, self.settings, self.generate = "plain", model.settings, model.generate

    module = types.ModuleType("jbkv_test_plain_model")
    module.ENTRY = replace(ENTRY, load_model=lambda **options: Plain(load_model(**options)))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry.MODELS, "plain", module.__name__)
    monkeypatch.chdir(tmp_path)
    base = ["-m", "plain", "--prompt", PROMPT, "--seeds", "0"]
    for args in (
        ["generate", *base, "--pruner", "forcing-kv", "--out", "o"],
        ["profile-heads", *base, "--out", "p.json"],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "states no head_layout()" in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def test_methods_that_cannot_drop_tokens_are_left_out_of_pruned_sweeps(capsys):
    from types import SimpleNamespace

    from jbkv_cli.cli.commands.experiment import _prunable_specs
    from jbkv_cli.run.experiment import build_matrix

    pruners = ["none", "forcing-kv", "forcing-kv-history"]
    specs = build_matrix([2], ["rtn", "kivi"], ["none"], [32], pruners=pruners)
    model = SimpleNamespace(name="tiny", settings={"head_dim": 64})
    kept = {s.variant_id for s in _prunable_specs(model, specs)}
    assert kept == {
        "reference",
        "forcingkv",
        "fkv",
        "int2-rtn-g32",
        "int2-kivi-g32",
        "int2-rtn-g32-forcingkv",
        "int2-rtn-g32-fkv",
    }
    err = capsys.readouterr().err
    assert "2 pruned variant(s) are left out" in err and "int2-kivi-g32-forcingkv" in err


def test_pre_rope_methods_are_left_out_of_pruned_sweeps_in_one_warning(capsys):
    """KVQuant caches keys before RoPE, which no pruned cache takes: its pruned variants are
    left out, named once; its unpruned ones stay, and a bad method option is still an error."""
    from jbkv_cli.run.experiment import build_matrix

    pruners = ["none", "flowcache"]
    specs = build_matrix([2], ["rtn", "kvquant"], ["none", "taylor"], [32], pruners=pruners)
    ids = {s.variant_id for s in specs}
    assert {"int2-kvquant-g32", "int2-kvquant-g32-taylor", "int2-rtn-g32-flowcache"} <= ids
    assert not [i for i in ids if "kvquant" in i and "flowcache" in i]
    err = capsys.readouterr().err
    assert err.count("left out of the sweep: kvquant+flowcache (e.g.") == 1, err
    assert "pre-RoPE key layout" in err
    with pytest.raises(ValueError, match="kvquant"):
        build_matrix(
            [2],
            ["kvquant"],
            ["none"],
            [32],
            options={"kvquant": {"iters": 0}},
            pruners=["flowcache"],
        )


def test_usage_errors_exit_2_with_one_line_and_create_nothing(tmp_path):
    """In this process (``run_in_process``), the first case also through the installed ``jbkv``,
    which must answer the same."""
    dirs = [tmp_path / str(i) for i in range(len(USAGE_ERRORS))]
    for d in dirs:
        d.mkdir()
    results = [
        run_in_process(*a, "--out", "o", cwd=d, columns=120)
        for (a, _), d in zip(USAGE_ERRORS, dirs, strict=True)
    ]
    installed = _jbkv(*USAGE_ERRORS[0][0], "--out", "o", cwd=dirs[0])
    assert (installed.returncode, installed.stderr) == (results[0].returncode, results[0].stderr)
    for (args, message), d, result in zip(USAGE_ERRORS, dirs, results, strict=True):
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert list(d.iterdir()) == [], args
