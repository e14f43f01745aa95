"""Checking a state dict against a model before a strict load: one line naming what is wrong."""

from __future__ import annotations

import torch
from torch import nn

from jbkv_cli.errors import JbkvError

SHOWN = 5  # names listed per kind of problem; the count says how many in all


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f", … ({len(items)} in all)" if len(items) > SHOWN else "")


def state_dict_problems(
    expected: dict[str, tuple[int, ...]], state: dict[str, torch.Tensor]
) -> list[str]:
    """``missing: …``, ``unexpected: …``, ``wrong shape: …`` (first few names of each), or []."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(
        f"{k} {tuple(state[k].shape)} != {expected[k]}"
        for k in set(expected) & set(state)
        if tuple(state[k].shape) != tuple(expected[k])
    )
    return [
        f"{label}: {_listed(items)}"
        for label, items in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("wrong shape", wrong),
        )
        if items
    ]


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Raise one :class:`JbkvError` on missing/unexpected keys or shape mismatches."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = state_dict_problems(expected, state)
    if problems:
        raise JbkvError(f"{what} does not match the model: " + "; ".join(problems))
