"""A plan at the real depth from two traces of few blocks.

A transformer's blocks are identical: each run (:mod:`jbkv_cli.plan.blocks`) of ``n`` blocks is
traced twice, with ``n − t`` blocks (trace A: the first, ``n − t − 2`` middle ones, the last)
and with ``n − t + 1`` (trace B), every other part of the model as it is. A *moment* is the
tracker's state after an allocation: its total and its bytes by label. Every moment outside
the middle blocks occurs once in each trace, in the same order: the two traces match moment for
moment. What is alive at such a moment depends on the depth only through what each block
holds — its weights, its caches, what it hands on — the same bytes for every block, so each
integer (the total, each label's bytes) is a line in the number of middle blocks:
``v(t) = v_A + t·(v_B − v_A)``, exact at the real depth.

The moments inside the middle blocks of one pass through a run repeat per block: the k-th
middle block's moment ``m`` is ``v_m + (k − 1)·D_m``, where ``D_m`` is what one block leaves
behind (its committed cache; 0 in a denoising pass), read from trace B's first two middle
blocks, and ``v_m`` the line above through trace A's and B's first middle block. Over the
``M`` middle blocks of the real depth, moment ``m`` is largest in the last (``D_m > 0``) or the
first; so each period's peak at the real depth is the largest of these values over its
moments, and on a tie the earliest, as the tracker keeps it (:mod:`jbkv_cli.plan.tracker`).

This is exact *by construction* when the traces match (:class:`NotExact` otherwise: the same
periods, moments per region and middle blocks per pass) and the blocks of a run do the same
work: the same shapes, the same caches, nothing that depends on the layer's index. A pruner's
per-layer plan breaks that (each layer keeps its own heads), as does a per-layer ``--bits``
spec (each layer its widths): such variants are traced at the real depth (:mod:`jbkv_cli.plan.run`). The stored-cache samples after each commit pass and the
caches' bytes at each pass are lines too, taken moment for moment the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jbkv_cli.plan.tracker import MARK, RESET, Peak

Labels = dict[str, int]
Moment = tuple[Any, int, Labels]  # (region, total, bytes by label)


class NotExact(Exception):
    """The two traces do not match (module docstring): the plan needs the real depth."""


def periods_of(trace: Sequence[tuple]) -> list[tuple[str, list[Moment]]]:
    """The periods of a trace slice that starts at a reset: each period's name and its
    moments, the first being what was live when it began; a period closed under the name of
    the one before it extends that one (as :meth:`MemoryTracker.mark` keeps them)."""
    periods: list[tuple[str, list[Moment]]] = []
    current: list[Moment] | None = None
    for entry in trace:
        if entry[0] == MARK and len(entry) == 2:
            if current is None:
                raise NotExact("a mark before the trace began")
            if periods and periods[-1][0] == entry[1]:
                periods[-1] = (entry[1], periods[-1][1] + current)
            else:
                periods.append((entry[1], current))
            current = None
        elif entry[0] == RESET and len(entry) == 1:
            current = None
        elif current is None:
            current = [entry]
        else:
            current.append(entry)
    return periods


def line(a: int, b: int, t: int) -> int:
    """``a + t·(b − a)``: the value at the real depth from trace A's ``a`` and B's ``b``."""
    return a + t * (b - a)


def _labels(a: Labels, b: Labels, t: int, d: Labels | None = None, k: int = 0) -> Labels:
    out = {}
    for key in {**a, **b, **(d or {})}:
        v = line(a.get(key, 0), b.get(key, 0), t) + k * (d or {}).get(key, 0)
        if v < 0:
            raise NotExact(f"label {key} extrapolates to {v} bytes")
        if v:
            out[key] = v
    return out


def _delta(x: Labels, y: Labels) -> Labels:
    return {key: y.get(key, 0) - x.get(key, 0) for key in {**x, **y}}


def _is_mid(region: Any) -> bool:
    return isinstance(region, tuple) and len(region) == 3 and region[1] == "mid"


def _items(moments: list[Moment]) -> list[tuple[str, Any, list[list[Moment]]]]:
    """Moments grouped: ``("group", region, [moments])`` for a stretch in one region outside
    the middle blocks, ``("mids", run, [moments per middle block])`` for one pass's middle
    blocks of a run."""
    items: list[tuple[str, Any, list[list[Moment]]]] = []
    for m in moments:
        region = m[0]
        last = items[-1] if items else None
        if _is_mid(region):
            run, k = region[0], region[2]
            if last and last[0] == "mids" and last[1] == run:
                blocks = last[2]
                if k == blocks[-1][0][0][2]:
                    blocks[-1].append(m)
                    continue
                if k == blocks[-1][0][0][2] + 1:
                    blocks.append([m])
                    continue
            items.append(("mids", run, [[m]]))
        elif last and last[0] == "group" and last[1] == region:
            last[2][0].append(m)
        else:
            items.append(("group", region, [[m]]))
    return items


def extrapolate_period(a: list[Moment], b: list[Moment], t: int, mids: dict[int, int]) -> Peak:
    """The period's peak at the real depth (module docstring) from its moments in trace A and
    in trace B; ``mids``: each run's middle blocks at the real depth."""
    ia, ib = _items(a), _items(b)
    if [(kind, key) for kind, key, _ in ia] != [(kind, key) for kind, key, _ in ib]:
        raise NotExact("the traces pass through the blocks differently")
    best: Peak | None = None
    for (kind, key, ga), (_, _, gb) in zip(ia, ib, strict=True):
        if kind == "group":
            if len(ga[0]) != len(gb[0]):
                raise NotExact(f"{len(ga[0])} and {len(gb[0])} moments in region {key}")
            candidates = [
                Peak(line(x[1], y[1], t), _labels(x[2], y[2], t))
                for x, y in zip(ga[0], gb[0], strict=True)
            ]
        else:
            if len(gb) != len(ga) + 1 or any(len(g) != len(ga[0]) for g in (*ga, *gb)):
                raise NotExact(f"the middle blocks of run {key} differ between the traces")
            count = mids[key]
            candidates = []
            found = []
            for x, y, z in zip(ga[0], gb[0], gb[1], strict=True):
                shift = z[1] - y[1]
                k = count - 1 if shift > 0 else 0  # the last middle block, or the first
                total = line(x[1], y[1], t) + k * shift
                found.append((total, k, Peak(total, _labels(x[2], y[2], t, _delta(y[2], z[2]), k))))
            if found:
                top = max(total for total, _, _ in found)
                k_first = min(k for total, k, _ in found if total == top)
                candidates = [p for total, k, p in found if total == top and k == k_first][:1]
        for peak in candidates:
            if sum(peak.by_label.values()) != peak.total:
                raise NotExact("a moment's labels do not add up to its total")
            if best is None or peak.total > best.total:
                best = peak
    if best is None:
        raise NotExact("an empty period")
    return best


def extrapolate_periods(
    a: Sequence[tuple], b: Sequence[tuple], t: int, mids: dict[int, int]
) -> list[tuple[str, Peak]]:
    """Every period's peak at the real depth from the two traces' slices of one generation."""
    if not any(_is_mid(m[0]) for m in a if len(m) == 3):
        raise NotExact("no middle block ran")
    pa, pb = periods_of(a), periods_of(b)
    if [name for name, _ in pa] != [name for name, _ in pb]:
        raise NotExact("the traces close different periods")
    return [
        (name, extrapolate_period(ma, mb, t, mids))
        for (name, ma), (_, mb) in zip(pa, pb, strict=True)
    ]


def extrapolate_max(a: Sequence[int], b: Sequence[int], t: int) -> int:
    """The largest of samples taken at the same moments of both traces, at the real depth."""
    if len(a) != len(b):
        raise NotExact(f"{len(a)} and {len(b)} samples")
    return max((line(x, y, t) for x, y in zip(a, b, strict=True)), default=0)
