"""Summary statistics over independent units (videos, prompts): mean ± standard error."""

from __future__ import annotations

import math
from collections.abc import Iterable


def aggregate(values: Iterable[float]) -> dict[str, float | int | None]:
    """Mean and standard error of the mean of ``values``.

    mean = (1/n) Σ xᵢ,  SE = s / √n  with the sample standard deviation
    s = √(Σ (xᵢ − mean)² / (n − 1)). Returns ``{"mean", "se", "n"}``; ``se`` is None for n = 1,
    ``mean`` and ``se`` are None for n = 0. Non-finite values raise ``ValueError`` (an ``inf``
    would make the aggregate meaningless).
    """
    xs = [float(v) for v in values]
    if any(not math.isfinite(x) for x in xs):
        raise ValueError(f"aggregate needs finite values, got {xs}")
    n = len(xs)
    if n == 0:
        return {"mean": None, "se": None, "n": 0}
    mean = math.fsum(xs) / n
    if n == 1:
        return {"mean": mean, "se": None, "n": 1}
    variance = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return {"mean": mean, "se": math.sqrt(variance / n), "n": n}
