"""GPU memory budgets: ``--gpu-memory 80GiB`` or a GPU's name, whether a plan fits, and the
longest video that fits.

A budget is bytes with a unit (``80GiB``, ``24GB``, ``512MiB``; GB = 10⁹ bytes, GiB = 2³⁰) or
the name of a GPU (:data:`GPUS`: its memory as sold, in GiB). A variant **fits** when its
predicted peak plus :data:`RESERVE` (the CUDA context and what the caching allocator holds
beyond the tensors: its block rounding and fragmentation, which the plan does not see) is at
most the budget.

The **longest video** comes from the peaks at two lengths, ``n₁ < n₂`` chunks (of the phases
that grow with the video: every one but setup, :func:`jbkv_cli.plan.run._with_budgets`): the peak
grows linearly with the chunks past the window's fill, ``peak(n) = P₁ + (n − n₁)·(P₂ − P₁)/(n₂ − n₁)``,
and the longest is the largest ``n`` with ``peak(n) + RESERVE ≤ budget`` (``n ≤``
:data:`~jbkv_cli.models.limits.MAX_CHUNKS`; a peak that does not grow fits any length up to
that). A model whose window is still filling at ``n₁`` makes the slope steeper than it stays:
the answer is then conservative.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jbkv_cli.models.limits import MAX_CHUNKS
from jbkv_cli.utils.errors import UsageError, shown

GiB = 2**30
RESERVE = GiB  # beside the tensors: the CUDA context, the allocator's rounding and slack

# memory as sold, GiB (what a name given to --gpu-memory means)
GPUS: dict[str, int] = {
    "H200": 141,
    "H100": 80,
    "H100-NVL": 94,
    "A100-80GB": 80,
    "A100": 80,
    "A100-40GB": 40,
    "L40S": 48,
    "L40": 48,
    "A6000": 48,
    "6000-ADA": 48,
    "5090": 32,
    "4090": 24,
    "3090": 24,
    "A10G": 24,
    "A10": 24,
    "L4": 24,
    "T4": 16,
}

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)")


@dataclass(frozen=True)
class Budget:
    """A GPU memory budget: ``name`` as given (``80GiB``, ``H100``) and its ``bytes``."""

    name: str
    bytes: int


def parse_budget(text: str) -> Budget:
    """``80GiB``, ``24GB``, ``H100``, ``RTX-4090`` (case-insensitive) as a :class:`Budget`; any
    other text is a :class:`UsageError` naming the forms."""
    raw = text.strip()
    key = raw.upper().removeprefix("RTX").strip("- ")
    if key in GPUS:
        return Budget(raw, GPUS[key] * GiB)
    match = _SIZE.fullmatch(raw)
    if match and match.group(2).upper() in _UNITS:
        size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
        if size > 0:
            return Budget(raw, size)
    raise UsageError(
        f"--gpu-memory must be a size with a unit (80GiB, 24GB, 512MiB) or a GPU "
        f"({', '.join(GPUS)}), got {shown(text)}"
    )


def parse_budgets(text: str) -> list[Budget]:
    """A comma list of budgets (:func:`parse_budget`), in order, repeats dropped."""
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError("--gpu-memory is empty: give a size (80GiB) or a GPU name (H100)")
    return list(dict.fromkeys(parse_budget(t) for t in items))


def fits(peak: int, budget: Budget) -> bool:
    """Whether a predicted ``peak`` fits ``budget`` (with :data:`RESERVE`)."""
    return peak + RESERVE <= budget.bytes


@dataclass(frozen=True)
class Growth:
    """The peak at ``n1`` and ``n2`` chunks (``n1 < n2``), as the module docstring fits it."""

    n1: int
    peak1: int
    n2: int
    peak2: int

    @property
    def per_chunk(self) -> float:
        """Bytes the peak grows per chunk (0 when it does not grow)."""
        return max(0.0, (self.peak2 - self.peak1) / (self.n2 - self.n1))

    def peak(self, n: int) -> float:
        return self.peak1 + (n - self.n1) * self.per_chunk

    def longest(self, budget: Budget) -> int:
        """The most chunks whose peak fits ``budget`` (0: not even one; at most MAX_CHUNKS)."""
        room = budget.bytes - RESERVE
        if self.per_chunk == 0:
            return MAX_CHUNKS if self.peak1 <= room else 0
        n = self.n1 + int((room - self.peak1) // self.per_chunk)
        return max(0, min(MAX_CHUNKS, n))
