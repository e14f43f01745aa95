"""Every declared dependency earns its place: something in the project imports it, or it is
named below with the reason it is needed without a direct import (issue 29.2: `torchmetrics` was
declared and never imported)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
MODULE = {"scikit-image": "skimage", "protobuf": "google.protobuf", "pytest": "pytest"}
INDIRECT = {
    "sentencepiece": "transformers' T5/UMT5 tokenizers import it (MAGI-1, SkyReels-V2, Self-Forcing)",
    "protobuf": "transformers' sentencepiece tokenizers import it",
    "ruff": "a command (make lint), not a module",
    "pytest-xdist": "a pytest plugin (make test: -n JOBS --dist loadfile), not imported",
}


def _declared() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [
        d for ds in project["optional-dependencies"].values() for d in ds
    ]
    return [re.match(r"[A-Za-z0-9_.-]+", s).group(0).lower() for s in specs]


def _sources() -> str:
    files = [
        p for d in ("jbkv_cli", "benchmarks", "scripts", "tests") for p in (ROOT / d).rglob("*.py")
    ]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def test_every_declared_dependency_is_imported_or_explained():
    text = _sources()
    unused = []
    for name in _declared():
        if name in INDIRECT:
            continue
        module = MODULE.get(name, name.replace("-", "_"))
        if not re.search(rf"^\s*(import|from) {re.escape(module)}\b", text, re.M):
            unused.append(name)
    assert not unused, f"declared but never imported: {unused}"
