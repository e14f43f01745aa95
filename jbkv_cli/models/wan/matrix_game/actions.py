"""Matrix-Game-2.0's per-frame action input: the file format, read and checked before
anything is created.

An actions file is JSON, one entry per *video* frame (``4·(latent frames − 1) + 1`` of them,
upstream's ``num_frames`` — 597 for the default 150 latent frames)::

    {"keyboard": [[1, 0, 0, 0], [1, 0, 0, 0], ...],
     "mouse":    [[0.0, 0.1], [0.0, 0.1], ...]}

``keyboard`` rows have the checkpoint's ``keyboard_dim_in`` entries (universal: W, S, A, D as
0/1 — upstream's ``KEYBOARD_IDX``; GTA: 2; TempleRun: 7), ``mouse`` rows two numbers (the
camera's pitch and yaw deltas; upstream's keys I/K/J/L give ±0.1, ``CAM_VALUE``); a model
without a mouse (TempleRun) takes no ``mouse``. Values are finite numbers with
``|x| ≤ 1000``. A case names its actions file in the case file's ``pose``/``trajectory``
column (a ``.json`` path, looked up next to the case file: :mod:`jbkv_cli.models.cases`).
Upstream's inference pipeline reads the same two tensors (``conditional_dict["keyboard_cond"]``
``[1, num_frames, keyboard_dim]`` and ``["mouse_cond"]`` ``[1, num_frames, 2]``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.jsonio import MAX_TEXT_BYTES, read_json

MAX_ABS = 1000.0


@dataclass(frozen=True)
class Actions:
    """Per-video-frame actions: ``keyboard`` ``[1, N, kd]``, ``mouse`` ``[1, N, 2]`` or None."""

    keyboard: torch.Tensor
    mouse: torch.Tensor | None


def _rows(data: object, key: str, width: int, frames: int, where: str) -> torch.Tensor:
    rows = data.get(key) if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise UsageError(f"{where}: {key!r} must be a list of per-frame rows")
    if len(rows) != frames:
        raise UsageError(f"{where}: {key!r} has {len(rows)} rows; the video has {frames} frames")
    for n, row in enumerate(rows):
        ok = isinstance(row, list) and len(row) == width
        ok = ok and all(
            isinstance(x, int | float)
            and not isinstance(x, bool)
            and math.isfinite(x)
            and abs(x) <= MAX_ABS
            for x in row
        )
        if not ok:
            raise UsageError(
                f"{where}: {key!r} row {n} must be {width} finite numbers (|x| <= {MAX_ABS:g}), "
                f"got {shown(json.dumps(row))}"
            )
    return torch.tensor(rows, dtype=torch.float32)[None]


def read_actions(path: str, case: str, frames: int, keyboard_dim: int, mouse_dim: int) -> Actions:
    """The actions file at ``path`` for a video of ``frames`` frames; one usage error naming
    the case for any problem (module docstring)."""
    where = f"case {shown(case)}: actions {path}"
    if not path.endswith(".json"):
        raise UsageError(f"{where}: an actions file is a .json file (see docs/models.md)")
    try:  # the bounded reader: a FIFO, a 100,000-deep document or a 5,000-digit number is
        # one line; NaN and infinities pass here, for the row check to name their row
        data = read_json(path, "actions file", MAX_TEXT_BYTES, finite=False)
    except JbkvError as exc:
        raise UsageError(f"case {shown(case)}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where}: must be a JSON object with 'keyboard' (and 'mouse')")
    extra = sorted(set(data) - {"keyboard", "mouse"})
    if extra:
        raise UsageError(f"{where}: unknown key {shown(extra[0])} (keyboard, mouse)")
    keyboard = _rows(data, "keyboard", keyboard_dim, frames, where)
    if mouse_dim == 0:
        if "mouse" in data:
            raise UsageError(f"{where}: this checkpoint takes no mouse actions")
        return Actions(keyboard, None)
    return Actions(keyboard, _rows(data, "mouse", mouse_dim, frames, where))


def write_actions(path, keyboard: list[list[float]], mouse: list[list[float]] | None) -> None:
    """Write an actions file (tests, examples)."""
    data: dict = {"keyboard": keyboard}
    if mouse is not None:
        data["mouse"] = mouse
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
