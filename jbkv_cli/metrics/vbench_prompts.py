"""VBench prompt subsets: the rule that derives them, and the loader ``generate`` uses.

The VBench-Long evaluation subset takes, for each of the 16 dimensions ``d`` with ``N_d``
entries in ``VBench_full_info.json`` (file order), the first ``⌈0.3 · N_d⌉`` of them (integer
arithmetic: ``(3·N_d + 9) // 10``), and keeps the union of the chosen entries in file order.
On vbench 0.1.5 that is 287 entries.

VBench names videos ``{prompt}-{index}.mp4`` and expects 5 samples per prompt, 25 for the
temporal-flickering prompts (which belong to that dimension only).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from jbkv_cli.metrics.vbench_scores import DIMENSIONS
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.resources import PROMPTS_DIR

SUBSETS: dict[str, str] = {
    "vbench-long-30": "vbench_long_30.json",
    "vbench-smoke": "vbench_smoke.json",
}
SAMPLES_PER_PROMPT = 5
SAMPLES_OVERRIDES: dict[str, int] = {"temporal_flickering": 25}


class VBenchPrompt(NamedTuple):
    """One prompt to generate: its text, its VBench dimensions, how many samples VBench expects."""

    prompt: str
    dimensions: tuple[str, ...]
    samples_per_prompt: int


def ceil_fraction(n: int, numerator: int = 3, denominator: int = 10) -> int:
    """``⌈n · numerator / denominator⌉`` in integers (no float rounding)."""
    return -(-n * numerator // denominator)


def first_fraction_subset(
    full_info: Sequence[dict[str, Any]],
    dimensions: Sequence[str] = DIMENSIONS,
    numerator: int = 3,
    denominator: int = 10,
) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """Entries of ``full_info`` in the first ``⌈fraction · N_d⌉`` of any dimension ``d``.

    Returns the chosen entries (file order, each with ``selected_for``: the dimensions that chose
    it) and, per dimension, the chosen indices into ``full_info``.
    """
    chosen: dict[str, list[int]] = {}
    for dim in dimensions:
        idx = [i for i, e in enumerate(full_info) if dim in e["dimension"]]
        chosen[dim] = idx[: ceil_fraction(len(idx), numerator, denominator)]
    selected_for: dict[int, list[str]] = {}
    for dim, idx in chosen.items():
        for i in idx:
            selected_for.setdefault(i, []).append(dim)
    entries = [dict(full_info[i], selected_for=selected_for[i]) for i in sorted(selected_for)]
    return entries, chosen


def first_per_dimension(
    full_info: Sequence[dict[str, Any]], dimensions: Sequence[str] = DIMENSIONS
) -> list[dict[str, Any]]:
    """The first entry of every dimension (union, file order): a smoke set covering all 16."""
    selected_for: dict[int, list[str]] = {}
    for dim in dimensions:
        i = next(i for i, e in enumerate(full_info) if dim in e["dimension"])
        selected_for.setdefault(i, []).append(dim)
    return [dict(full_info[i], selected_for=selected_for[i]) for i in sorted(selected_for)]


def samples_for(dimensions: Sequence[str], default: int = SAMPLES_PER_PROMPT) -> int:
    """Samples VBench expects for a prompt with these dimensions."""
    return max([default] + [SAMPLES_OVERRIDES[d] for d in dimensions if d in SAMPLES_OVERRIDES])


def subset_path(name: str) -> Path:
    """Path of a named subset (``vbench-long-30``, ``vbench-smoke``) or of a JSON file."""
    if name in SUBSETS:
        return PROMPTS_DIR / SUBSETS[name]
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        return path
    raise JbkvError(f"unknown VBench prompt subset {name!r}; known: {', '.join(SUBSETS)}")


def load_subset_file(name: str) -> dict[str, Any]:
    """The subset document (entries in ``VBench_full_info.json`` form plus metadata)."""
    path = subset_path(name)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as e:
        raise JbkvError(f"VBench prompt subset file missing: {path}") from e


def load_vbench_subset(name: str) -> list[VBenchPrompt]:
    """Unique prompts of a subset, in file order, with dimensions and samples per prompt.

    A prompt listed under several entries (two VBench prompts appear twice) is returned once
    with the union of its dimensions. Videos are to be named ``{prompt}-{index}.mp4`` for
    ``index < samples_per_prompt``.
    """
    doc = load_subset_file(name)
    default = int(doc.get("samples_per_prompt", SAMPLES_PER_PROMPT))
    overrides = doc.get("samples_per_prompt_overrides", SAMPLES_OVERRIDES)
    dims: dict[str, list[str]] = {}
    for entry in doc["entries"]:
        seen = dims.setdefault(entry["prompt_en"], [])
        seen.extend(d for d in entry["dimension"] if d not in seen)
    return [
        VBenchPrompt(
            prompt,
            tuple(ds),
            max([default] + [int(overrides[d]) for d in ds if d in overrides]),
        )
        for prompt, ds in dims.items()
    ]
