"""How long the clips are that VBench-Long scores each dimension on (VBench issue #186).

VBench-Long splits every video into clips before scoring, and the clip length is not the one
its ``clip_length_mix.yaml`` gives the dimension being scored. Upstream's rule
(Vchitect/VBench@43b208f, ``vbench2_beta_long/__init__.py`` ``VBenchLong.preprocess`` and
``vbench2_beta_long/utils.py`` ``get_duration_from_json``):

- ``long_vbench_standard``: a video of prompt P is split at the *largest* clip length over all
  the dimensions P belongs to in ``VBench_full_info.json``, once per video folder (later
  dimensions reuse the split). The imaging- and aesthetic-quality prompts are
  overall-consistency prompts too (10 s), so those two dimensions are scored on 10-second clips,
  not the 2 s the YAML lists for them (issue #186);
- ``long_custom_input``: every video is split into 2-second clips, whatever the dimension
  (``preprocess`` overrides the length with 2);
- the short modes do not split.

The vbench 0.1.5 wheel ``jbkv vbench setup`` installs has the same two rules. jbkv runs
upstream's code unchanged (``vbench_runner.py`` passes ``clip_length_config``), so it
reproduces upstream's behaviour, 10 s in ``long_vbench_standard``; :func:`dimension_clip_seconds`
computes, from the same rule, what each scored dimension's clips were, and ``vbench.json``
records it (``clip_seconds``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from jbkv_cli.metrics.vbench_env import LONG_CONFIGS
from jbkv_cli.metrics.vbench_prompts import SUBSETS, load_subset_file

CUSTOM_CLIP_SECONDS = 2.0  # long_custom_input: preprocess's fixed duration


@cache
def clip_lengths(config: str = "clip_length_mix.yaml") -> dict[str, float]:
    """Dimension -> clip seconds of one of VBench-Long's clip-length files (jbkv ships them)."""
    files = json.loads(LONG_CONFIGS.read_text())["files"]
    return {d: float(s) for d, s in files[config]["values"].items()}


def clip_seconds(
    mode: str, prompt_dimensions: Iterable[str], lengths: dict[str, float]
) -> float | None:
    """The clip length a video is split at: its prompt's dimensions (the union over its entries
    in ``VBench_full_info.json``) and the mode decide (module docstring); None: not split."""
    if mode == "long_custom_input":
        return CUSTOM_CLIP_SECONDS
    if mode != "long_vbench_standard":
        return None
    values = [lengths[d] for d in set(prompt_dimensions) if d in lengths]
    return max(values) if values else None


def dimension_clip_seconds(
    mode: str,
    dimensions: Sequence[str],
    entries: Iterable[dict[str, Any]],
    config: str = "clip_length_mix.yaml",
) -> dict[str, list[float]]:
    """Per scored dimension, the clip lengths of the videos it is scored on: in
    ``long_vbench_standard`` those of the prompts listing it (``entries``: ``VBench_full_info``
    entries, ``{"prompt_en", "dimension"}``); one length for every dimension in
    ``long_custom_input``; {} in the short modes."""
    lengths = clip_lengths(config)
    if mode == "long_custom_input":
        return {d: [CUSTOM_CLIP_SECONDS] for d in dimensions}
    if mode != "long_vbench_standard":
        return {}
    union: dict[str, set[str]] = {}
    for e in entries:
        union.setdefault(e["prompt_en"], set()).update(e["dimension"])
    out: dict[str, set[float]] = {d: set() for d in dimensions}
    for dims in union.values():
        seconds = clip_seconds(mode, dims, lengths)
        for d in dims & set(dimensions):
            if seconds is not None:
                out[d].add(seconds)
    return {d: sorted(s) for d, s in out.items() if s}


def subset_entries() -> list[dict[str, Any]]:
    """The ``VBench_full_info`` entries of jbkv's prompt subsets (each with its full dimension
    list): the prompts ``long_vbench_standard`` videos are generated from."""
    return [e for name in SUBSETS for e in load_subset_file(name)["entries"]]


def clip_record(
    mode: str, dimensions: Sequence[str], config: str = "clip_length_mix.yaml"
) -> dict[str, Any]:
    """``vbench.json``'s ``clip_seconds``: the rule and each dimension's clip lengths (none
    for a clip-length file jbkv does not ship)."""
    known = config in json.loads(LONG_CONFIGS.read_text())["files"]
    seconds = dimension_clip_seconds(mode, dimensions, subset_entries(), config) if known else {}
    return {"rule": CLIP_RULE, "config": config, "dimensions": seconds}


CLIP_RULE = (
    "VBench-Long's split (Vchitect/VBench@43b208f): long_vbench_standard splits a video at the "
    "largest clip length of clip_length_mix.yaml over all its prompt's dimensions (imaging and "
    "aesthetic quality share prompts with overall consistency: 10 s, issue #186); "
    "long_custom_input at 2 s for every dimension; prompts outside jbkv's subsets not counted"
)
