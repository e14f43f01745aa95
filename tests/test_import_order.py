"""Imports flow one way: the low modules (errors, lifecycle, console) never pull in the
distributed layer, the model code or the commands above them (issue 29.3: console.py and
distributed.py used to import each other)."""

from __future__ import annotations

import subprocess
import sys

import pytest

LOW = {
    "jbkv_cli.utils.errors": {"jbkv_cli.utils.console", "jbkv_cli.utils.distributed"},
    "jbkv_cli.utils.lifecycle": {"jbkv_cli.utils.console", "jbkv_cli.utils.distributed"},
    "jbkv_cli.utils.console": {
        "jbkv_cli.utils.distributed",
        "jbkv_cli.cli.commands",
        "jbkv_cli.models",
    },
}


@pytest.mark.parametrize("module", sorted(LOW))
def test_a_low_module_imports_nothing_above_it(module):
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    above = {m for m in loaded if any(m == a or m.startswith(a + ".") for a in LOW[module])}
    assert not above, f"{module} imports {sorted(above)}"
