"""A model's repeated blocks, kept few for a fast plan: runs of identical blocks, their
shortening, and the region of the block stack each moment of the trace falls in.

    runs = block_runs(blocks)              # [Run(start=0, length=30)] for a Wan transformer
    kept = shorten(blocks, runs, added=27) # 3 blocks: the first, one middle, the last
    hooks = RegionHooks(blocks, kept, tracker)  # tracker.region follows the forward

A *run* is a stretch of consecutive blocks of one kind (the same class and the same child
modules: Matrix-Game-2.0's blocks with an ActionModule are one run, those without another).
:func:`shorten` removes ``added`` middle blocks from every run, keeping its first block, its
last and at least one between (a run of fewer than three blocks is kept whole, and then the plan
is not shortened: :func:`shortening`). While the shortened model runs, the tracker's
``region`` names where the forward is: ``None`` outside the stack, else ``(run, "first")``,
``(run, "mid", k)`` (the k-th middle block, from 1) or ``(run, "last")``, from the first call of
the block or of a module inside it until the next block's (what runs between two blocks
belongs to the one before), back to ``None`` after the last block of the stack returns when it
is called as a module (else the last block's region lasts until the next pass). A layer's cache
committed outside every block (the embedded model commits each layer's chunk after the pass)
runs in its layer's region while it commits (:func:`commit_regions`), so that per-layer work
repeats with the middle blocks as the work inside them does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jbkv_cli.kvcache import ChunkKVCache

MIN_KEPT = 3  # first, one middle, last


@dataclass(frozen=True)
class Run:
    """Blocks ``start`` .. ``start + length - 1`` of the stack, all of one kind."""

    start: int
    length: int


def _kind(block: torch.nn.Module) -> tuple:
    return (type(block), tuple(name for name, child in block.named_children() if child is not None))


def block_runs(blocks: torch.nn.ModuleList) -> list[Run]:
    """The runs of identical blocks in ``blocks``, in order (module docstring)."""
    runs: list[Run] = []
    kinds = [_kind(b) for b in blocks]
    for i, kind in enumerate(kinds):
        if runs and kinds[i - 1] == kind:
            runs[-1] = Run(runs[-1].start, runs[-1].length + 1)
        else:
            runs.append(Run(i, 1))
    return runs


def shortening(runs: Sequence[Run]) -> int:
    """``t``, the middle blocks every run loses in the first of a plan's two traces (each run
    keeps at least :data:`MIN_KEPT`); the second loses ``t − 1``. 0: some run is too short."""
    return max(0, min(r.length for r in runs) - MIN_KEPT) if runs else 0


def shorten(blocks: torch.nn.ModuleList, runs: Sequence[Run], removed: int) -> list[Run]:
    """Remove ``removed`` middle blocks from every run of ``blocks`` in place (the last
    middle ones: each run keeps its first blocks and its last); returns the runs kept."""
    kept: list[torch.nn.Module] = []
    out: list[Run] = []
    for run in runs:
        members = list(blocks)[run.start : run.start + run.length]
        if removed:
            members = members[: run.length - 1 - removed] + members[-1:]
        out.append(Run(len(kept), len(members)))
        kept += members
    for key in list(blocks._modules):
        del blocks._modules[key]
    for i, block in enumerate(kept):
        blocks._modules[str(i)] = block
    return out


def region_of(runs: Sequence[Run], index: int) -> tuple:
    """The region of block ``index`` (module docstring)."""
    for r, run in enumerate(runs):
        if run.start <= index < run.start + run.length:
            k = index - run.start
            if k == 0:
                return (r, "first")
            if k == run.length - 1:
                return (r, "last")
            return (r, "mid", k)
    raise IndexError(index)


class RegionHooks:
    """Forward hooks that keep ``tracker.region`` (module docstring): a pre-hook on every block
    and on every module inside it, since a model may run a block's parts without calling the
    block (Self-Forcing's upstream forward)."""

    def __init__(self, blocks: torch.nn.ModuleList, runs: Sequence[Run], tracker: Any) -> None:
        self.handles = []
        last = len(blocks) - 1
        for i, block in enumerate(blocks):
            enter = _enter(tracker, region_of(runs, i))
            for module in block.modules():
                self.handles.append(module.register_forward_pre_hook(enter))
            if i == last:
                self.handles.append(block.register_forward_hook(_leave(tracker)))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _enter(tracker: Any, region: tuple):
    def hook(module: torch.nn.Module, args: Any) -> None:
        tracker.region = region

    return hook


def _leave(tracker: Any):
    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        tracker.region = None

    return hook


@contextlib.contextmanager
def commit_regions(runs: Sequence[Run], tracker: Any) -> Iterator[None]:
    """While open, a :class:`~jbkv_cli.kvcache.ChunkKVCache` of layer ``i`` (its ``layer``)
    that commits outside every block (``tracker.region`` None) does so in block ``i``'s region,
    then the region is None again; a commit inside a block keeps that block's region."""
    original = ChunkKVCache.commit
    depth = sum(run.length for run in runs)

    def commit(self: ChunkKVCache, *args: Any, **kwargs: Any) -> None:
        layer = getattr(self, "layer", None)
        if tracker.region is not None or not isinstance(layer, int) or not 0 <= layer < depth:
            return original(self, *args, **kwargs)
        tracker.region = region_of(runs, layer)
        try:
            return original(self, *args, **kwargs)
        finally:
            tracker.region = None

    ChunkKVCache.commit = commit
    try:
        yield
    finally:
        ChunkKVCache.commit = original
