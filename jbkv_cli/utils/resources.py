"""Where the package's data files live, so they work from a checkout and from an installed wheel.

``PROMPTS_DIR`` holds the named prompt sets (``tiny.txt``, ``tiny-ci.txt``, the VBench subsets);
the repository's top-level ``prompts/`` is a link to it.
"""

from __future__ import annotations

from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "prompts"
