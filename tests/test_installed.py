"""The installed-``jbkv`` runner stays folded: ``tests/installed.py`` is the only test module that
puts ``jbkv`` first on a ``subprocess`` command line or builds the path of the ``jbkv`` script.
(``Popen`` is left to the tests that signal or kill the process, with ``JBKV`` from there.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
RUNNERS = {"run", "call", "check_call", "check_output"}  # subprocess's blocking runners


def _is_jbkv(node: ast.expr) -> bool:
    """``JBKV``, ``jbkv``, ``str(jbkv)`` or a literal ending in ``jbkv``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str":
        return bool(node.args) and _is_jbkv(node.args[0])
    if isinstance(node, ast.Name):
        return node.id.lower() == "jbkv"
    return isinstance(node, ast.Constant) and str(node.value).endswith("jbkv")


def _first_word(node: ast.expr, lists: dict[str, ast.expr]) -> ast.expr | None:
    """The first element of a command line: a list literal, ``[*a, …]``, ``a + b``, or a name
    bound to one of these in the module."""
    if isinstance(node, ast.Name) and node.id in lists:
        return _first_word(lists[node.id], {})
    if isinstance(node, ast.BinOp):
        return _first_word(node.left, lists)
    if isinstance(node, ast.List) and node.elts:
        first = node.elts[0]
        return _first_word(first.value, lists) if isinstance(first, ast.Starred) else first
    return None


def own_jbkv_runners(source: str) -> list[int]:
    """Line numbers where ``source`` runs ``jbkv`` through ``subprocess`` itself or builds the
    script's path (``….with_name("jbkv")``, ``… / "jbkv"``)."""
    tree = ast.parse(source)
    lists = {
        target.id: node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            is_runner = node.func.attr in RUNNERS and isinstance(node.func.value, ast.Name)
            is_runner = is_runner and node.func.value.id == "subprocess"
            first = _first_word(node.args[0], lists) if is_runner and node.args else None
            if first is not None and _is_jbkv(first):
                found.append(node.lineno)
            if node.func.attr == "with_name" and node.args and _is_jbkv(node.args[0]):
                found.append(node.lineno)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_jbkv(node.right):
            found.append(node.lineno)
    return sorted(found)


def test_only_installed_py_runs_the_installed_jbkv():
    offenders = {
        str(path.relative_to(TESTS)): lines
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != "installed.py" and (lines := own_jbkv_runners(path.read_text()))
    }
    assert offenders == {}, f"use tests/installed.py's run_jbkv instead: {offenders}"


@pytest.mark.parametrize(
    "source",
    [
        'subprocess.run([JBKV, "report"], capture_output=True)',
        'argv = [jbkv, "generate"]\nsubprocess.run(argv)',
        'subprocess.check_output([str(jbkv), *args] + ["--help"])',
        'subprocess.run(["/venv/bin/jbkv", "--help"])',
        'JBKV = str(Path(sys.executable).with_name("jbkv"))',
        'jbkv = BIN / "jbkv"',
    ],
)
def test_a_wrapper_of_its_own_is_found(source):
    assert own_jbkv_runners(source) == [source.count("\n") + 1]


@pytest.mark.parametrize(
    "source",
    [
        'run_jbkv("report", run, cwd=tmp_path)',
        'subprocess.run([sys.executable, "-m", "jbkv_cli", "--help"])',
        'subprocess.run([TORCHRUN, "--standalone", "-m", "jbkv_cli"])',
        'subprocess.Popen([JBKV, "generate"])',  # signal tests start it themselves
    ],
)
def test_the_runner_and_other_programs_are_not_flagged(source):
    assert own_jbkv_runners(source) == []
