"""What the cache stores for a pruned chunk: per (batch, KV head) *lane*, the positions of the
kept tokens (int16, int32 past 32,767 tokens) and their keys and values, stored by the
variant's methods (prune, then quantize what is kept).

Different heads keep different tokens, so each lane is stored on its own; an anchor frame's
tokens that a later decision drops are removed from the stored tensors (:func:`take_tokens`,
no re-quantization). :meth:`PrunedChunk.dense` lays the lanes back out over the chunk's
positions for attention, zeros where a token was dropped, with ``valid [B, Hkv, L]`` saying
which tokens are there. A decision may hold a token more than once (a count, not a bool:
Forcing-KV's upstream attends some tokens twice); the token is stored once and its lane keeps
the count (``copies``, uint8), which attention turns into ``ln count`` on the score
(:func:`~jbkv_cli.attention.attend.key_mask`). ``nbytes`` counts the stored tensors, the
positions and the counts.

**Off the CPU** how many tokens a lane keeps is a host read (``nonzero`` is a shape read from
the values), so a lane is stored at a *capacity* instead: the bound the pruner states without
reading its masks (:attr:`~jbkv_cli.prune.base.Decision.held`). Its kept tokens come first
(ascending), then dropped ones as padding; ``copies`` always holds the counts (0: padding) and
counts in the bytes, which are the bytes held: the kept tokens, the padding and the counts. A
padded lane reads back the same as an exact one (zeros where dropped). On a CPU lanes are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from jbkv_cli.prune.base import KVPruner
from jbkv_cli.quant.method import ROLES, KVMethod, Role
from jbkv_cli.quant.noise import MeasuredNoise
from jbkv_cli.quant.qvg import QVGTensor
from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.tensor import (
    DECLARED,
    GroupQuantized,
    QuantizedTensor,
    RawTensor,
    signed_terms,
)
from jbkv_cli.quant.turboquant import TurboQuantMSETensor, TurboQuantProdTensor
from jbkv_cli.utils.host_reads import maybe_any, on_host

Store = Callable[[Role, torch.Tensor], QuantizedTensor]
"""``store(role, x [n, D])``: how the cache stores kept tokens (a method, or exactly)."""


def take_tokens(t: QuantizedTensor, index: torch.Tensor) -> QuantizedTensor:
    """The tokens ``index`` (dim −2) of a stored tensor, codes and scales as stored.

    Formats that store each token on its own: :class:`RawTensor`, :class:`GroupQuantized` (RTN,
    QuaRot), :class:`QVGTensor` (its codebook is shared and kept), TurboQuant's tensors, and a
    :class:`MeasuredNoise` around one of these (its per-chunk ``κ`` is kept). ``TypeError``
    otherwise.
    """
    index = index.to(device=next(iter(t.stored().values())).device, dtype=torch.long)
    shape = torch.Size((*t.shape[:-2], index.numel(), t.shape[-1]))
    if isinstance(t, RawTensor):
        return RawTensor(t.data.index_select(-2, index))
    if isinstance(t, GroupQuantized):
        data, step, zero = (x.index_select(-2, index) for x in (t.data, t.step_fp8, t.zero))
        return replace(t, data=data, step_fp8=step, zero=zero, shape=shape)
    if isinstance(t, MeasuredNoise):
        return replace(t, inner=take_tokens(t.inner, index))
    if isinstance(t, TurboQuantProdTensor):
        rows = (t.codes, t.norm, t.signs, t.residual_norm)
        codes, norm, signs, gamma = (x.index_select(-2, index) for x in rows)
        return replace(t, codes=codes, norm=norm, signs=signs, residual_norm=gamma, shape=shape)
    if isinstance(t, TurboQuantMSETensor):
        codes, norm = (x.index_select(-2, index) for x in (t.codes, t.norm))
        return replace(t, codes=codes, norm=norm, shape=shape)
    if isinstance(t, QVGTensor):
        return replace(
            t,
            codes=t.codes.index_select(-2, index),
            scale=t.scale.index_select(-2, index),
            ids=t.ids.index_select(-1, index),
            shape=shape,
        )
    raise TypeError(f"tokens cannot be removed from a stored {type(t).__name__}")


def check_prunable(method: KVMethod, head_dim: int, pruner: KVPruner | None = None) -> None:
    """Raise ``ValueError`` unless ``method`` stores every token on its own, so that pruning
    can remove tokens from what it stored, and, for a ``pruner`` that re-phases its sink
    (``owns_buffer``), stores keys in their own basis (the rotation then carries the noise)."""
    if any(method.residual_tokens(role) for role in ROLES):
        raise ValueError(f"{method.label} keeps a full-precision residual of the newest tokens")
    x = torch.randn(4, head_dim, generator=torch.Generator().manual_seed(0))
    for role in ROLES:
        try:
            stored = method.quantize(x, role)
            take_tokens(stored, torch.tensor([1, 3]))
        except TypeError as exc:
            raise ValueError(f"{method.label} {role}s: {exc}") from None
        if (
            role == "key"
            and pruner is not None
            and pruner.owns_buffer
            and stored.rotation is not None
        ):
            raise ValueError(
                f"{method.label} stores keys in a rotated basis: {pruner.name}'s sink cannot be "
                "re-phased"
            )


def _index_dtype(length: int) -> torch.dtype:
    return torch.int16 if length <= torch.iinfo(torch.int16).max else torch.int32


def repeats(count: torch.Tensor) -> torch.Tensor | None:
    """``count`` as a lane's ``copies`` (uint8), or None when no token is held twice (read on a
    CPU only: elsewhere the counts are kept)."""
    return count.to(torch.uint8) if maybe_any(count > 1) else None


def held_first(count: torch.Tensor, capacity: int | None) -> torch.Tensor:
    """The positions a lane stores of ``count [n]`` (0: dropped): on a CPU the held ones,
    ascending; elsewhere ``capacity`` of them (the whole lane for None), the held ones first
    (module docstring), with no host read."""
    if on_host(count):
        return (count > 0).nonzero().flatten()
    n = count.numel() if capacity is None else min(capacity, count.numel())
    return torch.argsort((count == 0).to(torch.uint8), stable=True)[:n]


@dataclass
class Lane:
    """One (batch, KV head)'s kept tokens of a chunk: ``index [n]`` ascending positions,
    ``k``/``v`` ``[n, D]`` as stored (None when nothing is kept), ``copies [n]`` how many
    times attention reads each (None: once each). ``padded``: stored at a capacity (off the
    CPU, module docstring): kept positions first, then dropped ones with count 0."""

    index: torch.Tensor
    k: QuantizedTensor | None
    v: QuantizedTensor | None
    copies: torch.Tensor | None = None
    padded: bool = False

    @property
    def nbytes(self) -> int:
        held = self.index.numel() * self.index.element_size()
        if self.copies is not None:
            held += self.copies.numel() * self.copies.element_size()
        return held + sum(t.nbytes for t in (self.k, self.v) if t is not None)

    def counts(self) -> torch.Tensor:
        """``[n]`` uint8: the times each kept token is read."""
        if self.copies is not None:
            return self.copies
        return torch.ones(self.index.shape, dtype=torch.uint8, device=self.index.device)

    def drop(self, start: int, keep: torch.Tensor, capacity: int | None = None) -> None:
        """Apply ``keep`` (bool or counts) to the tokens at positions ``start + j``: a token
        with ``keep[j]`` 0 is removed, another is read ``keep[j]`` times (``capacity``: the
        most tokens the lane holds after it, for a padded lane)."""
        if keep.numel() == 0:
            return
        pos = self.index.long()
        rel = pos - start
        inside = (rel >= 0) & (rel < keep.numel())
        new = keep.to(pos.device)[rel.clamp(0, keep.numel() - 1)].to(torch.uint8)
        count = torch.where(inside, new, self.counts())
        rows = held_first(count, capacity)
        if self.padded and rows.numel() == pos.numel():  # no smaller capacity: same slots
            self.copies = count
            return
        self.copies = repeats(count[rows])
        if rows.numel() == pos.numel():
            return
        self.index = self.index[rows]
        if rows.numel() == 0:
            self.k = self.v = None
            return
        self.k, self.v = (take_tokens(t, rows) for t in (self.k, self.v))


class PrunedChunk:
    """A chunk stored per lane (see the module docstring).

    ``k``, ``v`` ``[B, Hkv, L, D]`` (exact, post-RoPE); ``keep [B, Hkv, L]`` the tokens stored
    (bool, or how many times each is read); ``store`` stores the kept tokens of a lane per role.
    """

    def __init__(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        keep: torch.Tensor,
        store: Store,
        held: tuple[int, ...] | None = None,
    ):
        self.shape, self.dtype, self.device = k.shape, k.dtype, k.device
        dtype = _index_dtype(k.shape[-2])
        padded = not on_host(keep)
        self.lanes: list[list[Lane]] = []
        for b in range(k.shape[0]):
            row = []
            for h in range(k.shape[1]):
                count = keep[b, h].to(torch.uint8)
                index = held_first(count, None if held is None else held[h])
                kept = [x[b, h].index_select(0, index) for x in (k, v)]
                stored = (
                    [store(r, x) for r, x in zip(ROLES, kept, strict=True)] if len(index) else []
                )
                lane = Lane(index.to(dtype), *(stored or (None, None)), padded=padded)
                lane.copies = count[index] if padded else repeats(keep[b, h][index])
                row.append(lane)
            self.lanes.append(row)

    def drop(self, start: int, keep: torch.Tensor, held: tuple[int, ...] | None = None) -> None:
        """Apply a later decision on positions ``start ..`` (``keep [B, Hkv, n]``; ``held``:
        per KV head the most tokens a lane holds after it, :attr:`Decision.held`)."""
        for b, row in enumerate(self.lanes):
            for h, lane in enumerate(row):
                lane.drop(start, keep[b, h], None if held is None else held[h])

    @property
    def counts(self) -> torch.Tensor:
        """``uint8 [B, Hkv, L]``: how many times attention reads each token (0: dropped)."""
        count = torch.zeros(self.shape[:-1], dtype=torch.uint8, device=self.device)
        for b, row in enumerate(self.lanes):
            for h, lane in enumerate(row):
                count[b, h, lane.index.long()] = lane.counts()
        return count

    @property
    def kept(self) -> torch.Tensor:
        """``bool [B, Hkv, L]``: the tokens held."""
        return self.counts > 0

    @property
    def repeated(self) -> bool:
        """Whether a token is read more than once."""
        return any(lane.copies is not None for row in self.lanes for lane in row)

    @property
    def steps_fp8(self) -> bool:
        """Every kept key's steps are FP8 values by format (QuantizedTensor.steps_fp8)."""
        keys = [lane.k for row in self.lanes for lane in row if lane.k is not None]
        return all(t.steps_fp8 for t in keys if t.quantized)

    @property
    def num_kept(self) -> int:
        """Tokens held over every (batch row, KV head) (off the CPU: the slots, padding
        included)."""
        return sum(len(lane.index) for row in self.lanes for lane in row)

    @property
    def nbytes(self) -> int:
        return sum(lane.nbytes for row in self.lanes for lane in row)

    def nbytes_by_head(self) -> list[int]:
        """Bytes held per KV head (over the batch)."""
        return [sum(row[h].nbytes for row in self.lanes) for h in range(self.shape[1])]

    def dense(
        self, groups: int, noise: bool = False, rule: str = DECLARED
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RandomHadamard | None, tuple | None]:
        """``(k, v [B, Hkv, L, D], step [B, Hkv, L, groups] float32, rotation, noise)``: the
        kept tokens dequantized at their positions, zeros elsewhere (steps: zero for exact ones);
        ``noise`` (when asked, else None) the keys' signed terms ``(w, u)`` under ``rule``
        (:func:`~jbkv_cli.quant.tensor.signed_terms`) laid out the same way (zeros and ones
        elsewhere; ``u`` None where no lane unshrinks), or ``(None, None)`` when a lane cannot
        say."""
        k = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        v = torch.zeros_like(k)
        step = torch.zeros((*self.shape[:-1], groups), dtype=torch.float32, device=self.device)
        var = torch.zeros_like(step) if noise else None
        gain = torch.ones_like(step[..., :1]) if noise else None
        shrinks = False
        rotation = None
        for b, row in enumerate(self.lanes):
            for h, lane in enumerate(row):
                if lane.k is None:
                    continue
                pos = lane.index.long().to(self.device)
                held = (lane.counts() > 0).unsqueeze(-1) if lane.padded else None
                k[b, h, pos] = _rows(lane.k.dequantize().to(self.dtype), held, self.device)
                v[b, h, pos] = _rows(lane.v.dequantize().to(self.dtype), held, self.device)
                if lane.k.step is not None:
                    step[b, h, pos] = _rows(lane.k.step, held, self.device)
                    rotation = rotation or lane.k.rotation
                if not noise:
                    continue
                lane_var, lane_u = signed_terms(lane.k, groups, rule)
                if lane_var is None or var is None:
                    var = None  # mixed noise not measured: the signed correction refuses
                    continue
                var[b, h, pos] = _rows(lane_var, held, self.device)
                if lane_u is not None:
                    gain[b, h, pos], shrinks = _rows(lane_u, held, self.device, 1.0), True
        return k, v, step, rotation, (var, gain if shrinks else None) if noise else None


def _rows(x: torch.Tensor, held: torch.Tensor | None, device, empty: float = 0.0) -> torch.Tensor:
    """A lane's rows on ``device``, ``empty`` on a padded lane's padding (``held`` False): a
    dropped token reads as it does from an exact lane."""
    x = x.to(device)
    return x if held is None else torch.where(held, x, empty)
