"""What the installed ``jbkv`` imports before it answers (``PYTHONPROFILEIMPORTTIME``).

``jbkv --help``, every command's ``--help``, ``--version`` and a usage error that needs only the
command line answer without torch (seconds of start-up) and without the library modules that
import it: the command modules import those once the options are checked
(:mod:`jbkv_cli.cli.names` holds what the help and the checks need). ``jbkv report`` rebuilds
the run's variants (torch) but not the scoring stack or a model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.installed import run_jbkv

pytestmark = pytest.mark.slow

# torch and what comes with it; the library modules that import it
HEAVY = ("torch", "numpy", "av", "matplotlib", "transformers", "diffusers", "lpips")
LIBRARY = ("quant", "kvcache", "attention", "prune", "metrics.fidelity", "run.experiment")


def imported(*args: object, cwd: Path) -> tuple[set[str], list[str], int]:
    """The modules ``jbkv ARGS`` imported, its stderr lines other than the import times, and
    its exit code."""
    r = run_jbkv(*args, cwd=cwd, env={"PYTHONPROFILEIMPORTTIME": "1", "COLUMNS": "120"})
    modules, lines = set(), []
    for line in r.stderr.splitlines():
        if line.startswith("import time:"):
            modules.add(line.rsplit("|", 1)[-1].strip())
        else:
            lines.append(line)
    assert "jbkv_cli.cli.app" in modules, r.stderr[-2000:]  # the profile is on
    return modules, lines, r.returncode


DRIVER = Path(__file__).parents[1] / "support" / "many_commands" / "drive.py"


def driven(commands: list[list[str]], cwd: Path) -> list[dict]:
    """Each of ``commands`` through the app the console script runs, all in one fresh
    interpreter (``tests/support/many_commands/drive.py``): per command its ``code``, its
    ``stderr`` lines and the ``modules`` it imported first."""
    r = subprocess.run(
        [sys.executable, str(DRIVER), json.dumps(commands)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "120"},
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(r.stdout)
    assert "jbkv_cli.cli.app" in results[0]["modules"]  # the first imported the app
    return results


def heavy_in(modules: set[str]) -> list[str]:
    """The heavy packages and torch-importing jbkv modules among ``modules``."""
    roots = {m.split(".")[0] for m in modules}
    found = [m for m in HEAVY if m in roots]
    return found + sorted(m for m in modules for lib in LIBRARY if m.startswith(f"jbkv_cli.{lib}"))


def command_paths() -> list[list[str]]:
    """Every command and sub-command of the app, as its words (``["vbench", "run"]``)."""
    from typer.main import get_command

    from jbkv_cli.cli.app import app

    def walk(group, prefix: list[str]) -> list[list[str]]:
        found = []
        for name, command in sorted(group.commands.items()):
            found.append([*prefix, name])
            if hasattr(command, "commands"):
                found += walk(command, [*prefix, name])
        return found

    return walk(get_command(app), [])


def test_help_and_version_start_without_torch(tmp_path):
    paths = command_paths()
    assert ["generate"] in paths and ["vbench", "run"] in paths and ["weights", "fetch"] in paths
    for args in (["--help"], ["--version"]):  # the console script itself
        modules, lines, code = imported(*args, cwd=tmp_path)
        assert code == 0 and lines == [], (args, lines)
        assert heavy_in(modules) == [], args
    seen: set[str] = set()  # every command's help, in one interpreter
    for done in driven([[*p, "--help"] for p in paths], tmp_path):
        assert done["code"] == 0 and done["stderr"] == [], done
        assert "Usage" in done["stdout"], done["args"]
        seen |= set(done["modules"])
        assert heavy_in(seen) == [], done["args"]


USAGE_ERRORS = [
    (["generate", "--steps", "0"], "--steps"),  # a range (click)
    (["report", "run", "--format", "pdf"], "--format"),  # a choice (click)
    (["generate", "--no-such-option"], "--no-such-option"),
    (["generate", "-m", "no-such-model"], "unknown model"),
    (["generate", "--quantizer", "no-such"], "--quantizer"),
    (["generate", "--pruner", "no-such"], "--pruner"),
    (["generate", "-b", "2", "--ablation", "no-such"], "--ablation"),
    (["generate", "--correction", "no-such"], "--correction"),
    (["quantize-eval", "--corrections", "no-such"], "--corrections"),
    (["quantize-eval", "--quantizers", "rtn,no-such"], "--quantizers"),
    (["quantize-eval", "--pruners", "no-such"], "--pruners"),
    (["quantize-eval", "--group-sizes", "0"], "--group-sizes"),
    (["llm-prefill", "--quantizers", "no-such"], "--quantizers"),
    (["llm-prefill", "--backend", "no-such"], "--backend"),
    (["profile-heads", "--out", "p.json", "--rule", "no-such"], "--rule"),
    (["fidelity", "ref", "test", "--min-psnr", "nan"], "--min-psnr"),
    (["vbench", "run", "videos", "--mode", "no-such"], "--mode"),
]


def test_usage_errors_from_the_command_line_alone_start_without_torch(tmp_path):
    """Two through the console script (a click check, a jbkv one), every one through the app
    in one interpreter."""
    for args, needle in (USAGE_ERRORS[0], USAGE_ERRORS[3]):
        modules, lines, code = imported(*args, cwd=tmp_path)
        assert code == 2, (args, lines)
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
        assert heavy_in(modules) == [], args
    seen: set[str] = set()
    results = driven([args for args, _ in USAGE_ERRORS], tmp_path)
    for (args, needle), done in zip(USAGE_ERRORS, results, strict=True):
        lines = done["stderr"]
        assert done["code"] == 2, (args, lines)
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
        seen |= set(done["modules"])
        assert heavy_in(seen) == [], args
    assert list(tmp_path.iterdir()) == []


def test_missing_fidelity_folders_are_refused_without_torch(tmp_path):
    """``jbkv fidelity`` checks its two folders before it imports the scoring stack."""
    (tmp_path / "ref").mkdir()
    (tmp_path / "file.mp4").write_bytes(b"")
    for args, needle in (
        (["missing", "ref"], "reference folder not found"),
        (["ref", "missing"], "test folder not found"),
        (["ref", "file.mp4"], "test path is not a folder"),
    ):
        modules, lines, code = imported("fidelity", *args, cwd=tmp_path)
        assert code == 1 and len(lines) == 1 and needle in lines[0], lines
        assert heavy_in(modules) == [], args


def test_the_registries_names_reach_the_usage_errors(tmp_path):
    """The names a refusal lists come from :mod:`jbkv_cli.cli.names` (no registry imported
    here); tests/cli/test_names.py ties them to the registries."""
    from jbkv_cli.cli import names

    _, lines, _ = imported("quantize-eval", "--quantizers", "no-such", cwd=tmp_path)
    assert lines[0].endswith(f"allowed {', '.join(names.METHODS)}"), lines
    _, lines, _ = imported("quantize-eval", "--pruners", "no-such", cwd=tmp_path)
    assert lines[0].endswith(f"allowed {', '.join(('none', *names.PRUNERS))}"), lines


def test_report_imports_neither_a_model_nor_the_scoring_stack(tiny_run, tmp_path):
    """``jbkv report`` reads the run's JSON: its variants are rebuilt (quant, kvcache: torch),
    but no model, no video scoring (``run.experiment``, ``metrics.fidelity``, LPIPS) and, without
    ``--plots``, no matplotlib."""
    for fmt in ("table", "md", "json", "csv"):
        modules, lines, code = imported("report", tiny_run, "--format", fmt, cwd=tmp_path)
        assert code == 0, (fmt, lines)
        unwanted = ("jbkv_cli.models.tiny", "jbkv_cli.run.experiment", "jbkv_cli.metrics.fidelity")
        assert [m for m in unwanted if m in modules] == [], fmt
        assert {"matplotlib", "lpips", "transformers"} & {m.split(".")[0] for m in modules} == set()
