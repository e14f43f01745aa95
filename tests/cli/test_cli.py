import pytest
from typer.testing import CliRunner

from jbkv_cli.cli.app import app

runner = CliRunner()


def test_help_lists_every_subcommand():
    import typer.main

    registered = set(typer.main.get_command(app).commands)
    assert len(registered) >= 10  # generate, quantize-eval, fidelity, report, vbench, weights, …
    result = runner.invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    for command in registered:
        assert command in result.output, command


def test_attention_demo_is_labelled_synthetic():
    result = runner.invoke(app, ["attention-demo", "--cached", "64", "--current", "16"])
    assert result.exit_code == 0, result.output
    assert "Synthetic" in result.output and "not a video" in result.output
    assert "INT2 rtn g32" in result.output


@pytest.mark.parametrize("argv", [["--version"], ["-h"]])
def test_version_and_short_help(argv):
    assert runner.invoke(app, argv).exit_code == 0


def test_python_dash_m_entry_point():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "jbkv_cli", "--help"], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0 and "quantize-eval" in out.stdout
