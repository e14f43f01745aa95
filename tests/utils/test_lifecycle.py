"""A command's first import of torch is start-up again (:func:`lifecycle.uninterrupted`): a
signal during it is noted and raised as it ends, and its failure is start-up's one line.

Each case runs in a fresh Python (the handler is process-wide), with a stand-in module in place
of torch (:data:`lifecycle.GUARDED`) that signals its own process while it is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(body: str, tmp_path: Path, module: str = "") -> list[str]:
    """``body`` after the handler is installed and ``fake`` is guarded (its source: ``module``);
    its stdout lines."""
    (tmp_path / "fake.py").write_text(textwrap.dedent(module))
    script = "import os, signal\nfrom jbkv_cli.utils import lifecycle\n"
    script += "lifecycle.GUARDED = ('fake',)\nlifecycle.install()\n" + textwrap.dedent(body)
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("JBKV_DEBUG", None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


SIGNALLING = """
import os, signal
os.kill(os.getpid(), signal.SIGTERM)
print("imported to the end", flush=True)
"""


def test_a_signal_during_a_guarded_import_is_raised_when_it_ends(tmp_path):
    body = """
    with lifecycle.command():
        try:
            import fake
            print("after the import")
        except lifecycle.Interrupted as exc:
            print("interrupted", exc.signum)
    """
    assert run(body, tmp_path, SIGNALLING) == ["imported to the end", "interrupted 15"]


def test_the_same_signal_elsewhere_in_the_command_raises_at_once(tmp_path):
    body = """
    with lifecycle.command():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            print("not reached")
        except lifecycle.Interrupted as exc:
            print("interrupted", exc.signum)
    """
    assert run(body, tmp_path) == ["interrupted 15"]


def test_a_failure_with_a_signal_pending_stands_and_the_signal_is_dropped(tmp_path):
    body = """
    with lifecycle.command():
        try:
            with lifecycle.uninterrupted():
                os.kill(os.getpid(), signal.SIGINT)
                raise ValueError("failed")
        except ValueError as exc:
            print("failure", exc, lifecycle.pending())
    """
    assert run(body, tmp_path) == ["failure failed None"]


def test_at_start_up_the_signal_stays_pending_for_the_entry_point(tmp_path):
    body = """
    import fake
    print("pending", lifecycle.pending())
    """
    assert run(body, tmp_path, SIGNALLING) == ["imported to the end", "pending 15"]


@pytest.mark.parametrize("debug", [False, True])
def test_a_guarded_import_that_fails_is_start_ups_one_line(tmp_path, debug):
    failing = "raise ImportError('libfake.so: failed to map segment from shared object')\n"
    body = f"""
    os.environ.pop("JBKV_DEBUG", None)
    if {debug}:
        os.environ["JBKV_DEBUG"] = "1"
    with lifecycle.command():
        try:
            import fake
        except Exception as exc:
            print(type(exc).__name__, "|", exc)
    """
    lines = run(body, tmp_path, failing)
    if debug:  # the failure itself, for its traceback
        assert lines == ["ImportError | libfake.so: failed to map segment from shared object"]
    else:
        assert lines == [
            "StartUpFailed | cannot start jbkv: ImportError: libfake.so: failed to map segment "
            "from shared object (out of memory: is a memory limit such as `ulimit -v` too low?)"
        ]
