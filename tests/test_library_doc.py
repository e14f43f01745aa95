"""The library page's Python examples run as written (the tour and "add your own method")."""

from __future__ import annotations

import re
from pathlib import Path

from jbkv_cli.quant import METHODS

LIBRARY = Path(__file__).resolve().parents[1] / "docs" / "library.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", LIBRARY.read_text(encoding="utf-8"), re.S)


def test_the_library_tour_runs():
    tour = next(b for b in _blocks() if "ChunkKVCache" in b)
    scope: dict = {}
    exec(compile(tour, "docs/library.md", "exec"), scope)
    assert scope["qt"].effective_bits == 2.75
    assert tuple(scope["b"].shape) == (1, 32, 256, 1024)
    assert scope["rec"].summary()["delta_ps"] is not None


def test_the_add_your_own_method_example_runs():
    example = next(b for b in _blocks() if "register_method(" in b)
    scope: dict = {}
    try:
        exec(compile(example, "docs/library.md", "exec"), scope)
        cls = METHODS["rtn-clip3"]
        qt = cls(bits=2, group_size=32, sigmas=2.5).quantize(__import__("torch").randn(4, 64))
        assert qt.step.shape == (4, 2)
    finally:
        METHODS.pop("rtn-clip3", None)
