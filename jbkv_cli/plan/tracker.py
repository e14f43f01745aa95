"""Live device bytes over time: which storages exist, under which label, and the peak.

    tracker = MemoryTracker()
    with tracker:                          # a TorchDispatchMode (inside FakeCuda: fake tensors)
        with tracker.label("cache"):
            k = torch.empty(4, 8, device="cuda")    # 4·8·4 = 128 bytes under "cache"
        y = torch.empty(16, device="cuda")           # 64 bytes under "activations"
    tracker.peak.total, tracker.peak.by_label        # 192, {"cache": 128, "activations": 64}

Every operation's outputs are inspected: a tensor on a tracked device (any but the CPU and
``meta``) whose storage the tracker has not seen is a fresh allocation of
``storage.nbytes()`` bytes, counted under the innermost :meth:`label` open at that moment
(:data:`OTHER` when none); views and in-place results share a seen storage and add nothing. A
finalizer on the storage subtracts its bytes when the last tensor on it dies, so ``live`` is what
a caching allocator would have handed out and not yet got back (its rounding to 512-byte blocks
and a kernel's internal workspace are not seen). The :class:`Peak` keeps the most live bytes at
once and the split by label at that moment (on a tie, the first); :meth:`mark` closes a
*period* (a chunk), keeping that period's own peak. Storages made before the tracker was entered
are not seen; :meth:`adopt` counts tensors that exist already (weights built before the run)
under a label, and :meth:`relabel` moves counted storages to another label.

Fresh storages are recognised by their ``StorageImpl`` (``_cdata``), which is stable while a
tensor holds it; PyTorch keeps one Python storage object per ``StorageImpl`` alive with it, so
the finalizer runs when the storage itself is freed.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

OTHER = "activations"  # bytes allocated under no label
MARK, RESET = "mark", "reset"  # the trace's entries that are not moments
UNTRACKED = ("cpu", "meta")  # device types whose storages are not device memory


@dataclass
class Peak:
    """The most bytes live at once (``total``) and their split ``by_label`` at that moment."""

    total: int = 0
    by_label: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "by_label": dict(self.by_label)}


def tracked(t: torch.Tensor) -> bool:
    """Whether ``t`` lives in device memory (not on the host, not ``meta``)."""
    return t.device.type not in UNTRACKED


class MemoryTracker(TorchDispatchMode):
    """Counts live device storages by label (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[str, int] = {}
        self.total = 0
        self.peak = Peak()
        self.period = Peak()  # since the last :meth:`mark`
        self.periods: list[tuple[str, Peak]] = []
        self._labels: list[str] = []
        self._seen: dict[int, tuple[str, int]] = {}  # storage key -> (label, bytes)
        self.region: Any = None  # where the forward is (jbkv_cli.plan.blocks), kept in trace
        self.trace: list[tuple] | None = None  # when a list: every moment and mark, in order

    # -- labels -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def label(self, name: str) -> Iterator[None]:
        """Count what is allocated inside the block under ``name`` (the innermost wins)."""
        self._labels.append(name)
        try:
            yield
        finally:
            self._labels.pop()

    @property
    def current(self) -> str:
        return self._labels[-1] if self._labels else OTHER

    def adopt(self, tensors: Iterable[torch.Tensor], name: str) -> None:
        """Count ``tensors``' storages (made before the tracker saw them) under ``name``;
        storages already counted move to ``name``."""
        tensors = [t for t in tensors if tracked(t)]
        for t in tensors:
            self._count(t.untyped_storage(), name)
        self.relabel(tensors, name)
        self._sample()

    def relabel(self, tensors: Iterable[torch.Tensor], name: str) -> None:
        """Move the counted storages of ``tensors`` to ``name`` (the peak is not revised)."""
        for t in tensors:
            if not tracked(t):
                continue
            key = t.untyped_storage()._cdata
            if key in self._seen and self._seen[key][0] != name:
                old, nbytes = self._seen[key]
                self._add(old, -nbytes)
                self._add(name, nbytes)
                self._seen[key] = (name, nbytes)

    # -- periods ------------------------------------------------------------------------------

    def mark(self, name: str) -> Peak:
        """Close the current period as ``name``: its peak is kept in ``periods`` and
        returned (a period closed under the name of the one before it extends that one: the
        higher peak of the two is kept); the next period starts at what is live now."""
        done = self.period
        if self.periods and self.periods[-1][0] == name:
            if self.periods[-1][1].total >= done.total:
                done = self.periods[-1][1]
            self.periods[-1] = (name, done)
        else:
            self.periods.append((name, done))
        self.period = Peak(self.total, dict(self.live))
        if self.trace is not None:
            self.trace.append((MARK, name))
            self._moment()
        return done

    def reset_peak(self) -> None:
        """Forget the peaks so far: from now, the peak starts at what is live."""
        self.peak = Peak(self.total, dict(self.live))
        self.period = Peak(self.total, dict(self.live))
        if self.trace is not None:
            self.trace.append((RESET,))
            self._moment()

    # -- counting -----------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        fresh = False
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and tracked(t):
                fresh |= self._count(t.untyped_storage(), self._op_label(func))
        if fresh:
            self._sample()
        return out

    def _op_label(self, func) -> str:
        return self.current

    def _count(self, storage: torch.UntypedStorage, name: str) -> bool:
        key = storage._cdata
        if key in self._seen:
            return False
        nbytes = storage.nbytes()
        self._seen[key] = (name, nbytes)
        self._add(name, nbytes)
        weakref.finalize(storage, self._free, key)
        return True

    def _add(self, name: str, nbytes: int) -> None:
        held = self.live.get(name, 0) + nbytes
        if held:
            self.live[name] = held
        else:
            self.live.pop(name, None)  # ``live`` names only the labels holding bytes
        self.total += nbytes

    def _free(self, key: int) -> None:
        found = self._seen.pop(key, None)
        if found is not None:
            self._add(found[0], -found[1])

    def _moment(self) -> None:
        self.trace.append((self.region, self.total, {k: v for k, v in self.live.items() if v}))

    def _sample(self) -> None:
        if self.trace is not None:
            self._moment()
        if self.total > self.peak.total:
            self.peak = Peak(self.total, {k: v for k, v in self.live.items() if v})
        if self.total > self.period.total:
            self.period = Peak(self.total, {k: v for k, v in self.live.items() if v})
