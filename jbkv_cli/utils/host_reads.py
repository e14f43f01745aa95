"""Reading tensor values on the host: only where it is free, never per layer, step or chunk.

Reading a value of a tensor that lives on an accelerator (``bool(t)``, ``.item()``, ``int(t)``,
``.tolist()``, a shape that depends on the values: ``nonzero``, boolean-mask indexing,
``torch.unique``) waits for every kernel queued before it: one such read per layer and chunk
stalls the device as often. On a CPU tensor the same read costs nothing. So the hot path
(commit, read, attend, quantize, correct, prune) reads values only through this module:

**Checks** (finite keys, steps within FP8's range): a 0-d bool tensor ``ok`` handed to
:func:`require`, which

- on a CPU tensor checks at once (raises ``ValueError``);
- on any other device, inside :func:`deferred_checks` (each generated video runs in one,
  :mod:`jbkv_cli.run.experiment`), ORs the failure into a flag on the device; the block's exit
  reads the flags once and raises the first failed check's ``ValueError`` (with the worst
  offending ``value`` when one was given), so a bad input fails the video with the same
  message, at its end instead of at the first bad chunk;
- on any other device outside such a block (library use), queues ``torch._assert_async(ok)``:
  the device aborts the process if it fails.

**Shortcuts** that skip work a value makes unnecessary (no step set: no correction; every token
kept: no mask): :func:`maybe_any` and :func:`surely_all` read the value on a CPU and, elsewhere,
answer as if the shortcut did not apply. A shortcut may only skip work whose result it does not
change, so both answers give the same output.

**Copies to the device.** A blocking copy between the host and a device waits for the device as
a read does (CUDA synchronizes the stream before a copy from pageable memory). Constants made on
the CPU (a rotation's signs, a codebook, a table) are copied to a device once and kept there
(:func:`device_copy`, :func:`kept`): the first call on a device copies, the next ones reuse;
constants made from a few integers (a RoPE pair's channel indices) are kept by that key
(:func:`device_constant`); small values a loop computes on the host are kept by value
(:func:`device_values`), those it knows before it starts (a sampler's whole schedule) copied
together ahead (:func:`prefetch_values`).
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

MAX_KEPT = 512  # constants kept on devices (least recently used dropped first)
_KEPT: OrderedDict[tuple, tuple[weakref.ref | None, Any]] = OrderedDict()


def on_host(t: torch.Tensor) -> bool:
    """Whether reading ``t``'s values is free (a CPU tensor)."""
    return t.device.type == "cpu"


def maybe_any(t: torch.Tensor) -> bool:
    """``bool(t.any())`` on a CPU tensor; True elsewhere (unknown without a host read)."""
    return not on_host(t) or bool(t.any())


def surely_all(t: torch.Tensor) -> bool:
    """``bool(t.all())`` on a CPU tensor; False elsewhere (unknown without a host read)."""
    return on_host(t) and bool(t.all())


def _message(message: str, value: torch.Tensor | float | None) -> str:
    return message if value is None else message.format(value=float(value))


@dataclass
class DeferredChecks:
    """Failure flags (and worst values) per message and device, read once by :meth:`verify`."""

    flags: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor | None]] = field(
        default_factory=dict
    )

    def note(self, ok: torch.Tensor, message: str, value: torch.Tensor | None = None) -> None:
        """Record check ``ok`` (0-d bool) without reading it; ``value`` (0-d, formatted into
        ``message`` as ``{value}``) is kept at its largest over the failed checks."""
        key = (message, str(ok.device))
        bad = ~ok.reshape(())
        worst = None if value is None else torch.where(bad, value.reshape(()).float(), -torch.inf)
        held = self.flags.get(key)
        if held is not None:
            bad = bad | held[0]
            if worst is not None and held[1] is not None:
                worst = torch.maximum(worst, held[1])
        self.flags[key] = (bad, worst)

    def verify(self) -> None:
        """Raise the first failed check's ``ValueError`` (reads each flag once)."""
        for (message, _), (bad, worst) in self.flags.items():
            if bool(bad):
                raise ValueError(_message(message, worst))


_ACTIVE: contextvars.ContextVar[DeferredChecks | None] = contextvars.ContextVar(
    "jbkv_deferred_checks", default=None
)


@contextlib.contextmanager
def deferred_checks() -> Iterator[DeferredChecks]:
    """``with deferred_checks():`` accelerator checks inside the block are read at its exit (not
    when the block is left by an exception: that one propagates)."""
    checks = DeferredChecks()
    token = _ACTIVE.set(checks)
    try:
        yield checks
    finally:
        _ACTIVE.reset(token)
    checks.verify()


def require(ok: torch.Tensor, message: str, value: torch.Tensor | None = None) -> None:
    """Check ``ok`` (a 0-d bool tensor) as the module docstring says; ``message`` is the
    ``ValueError``'s text, with ``{value}`` (a format spec allowed) filled from ``value``."""
    if on_host(ok):
        if not bool(ok):
            raise ValueError(_message(message, value))
        return
    checks = _ACTIVE.get()
    if checks is not None:
        checks.note(ok, message, value)
    else:
        torch._assert_async(ok, _message(message, None if value is None else float("nan")))


def kept(key: tuple, make: Callable[[], Any], owner: torch.Tensor | None = None) -> Any:
    """``make()``, computed once per ``key`` and kept (at most :data:`MAX_KEPT` entries, least
    recently used dropped first); ``owner``: the entry holds only while that tensor lives (a
    key made from its ``id``)."""
    hit = _KEPT.get(key)
    if hit is not None and (hit[0] is None or hit[0]() is owner):
        _KEPT.move_to_end(key)
        return hit[1]
    value = make()
    _KEPT[key] = (None if owner is None else weakref.ref(owner), value)
    while len(_KEPT) > MAX_KEPT:
        _KEPT.popitem(last=False)
    return value


def _indexed(device: torch.device | str) -> torch.device:
    """``device`` as tensors on it name it (``cuda`` is ``cuda:0``, or the current device): the
    key a kept copy is found by. No copy, no host read (an empty tensor names it)."""
    device = torch.device(device)
    if device.type == "cpu" or device.index is not None:
        return device
    return torch.empty(0, device=device).device


def device_copy(
    t: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``t.to(device, dtype)`` for a constant made on the CPU: on the CPU a plain conversion,
    elsewhere copied once per (tensor, device, dtype) and kept (module docstring)."""
    device = _indexed(device)
    if device.type == "cpu" or t.device == device:
        return t.to(device=device, dtype=dtype)
    key = ("copy", id(t), str(device), dtype)
    return kept(key, lambda: t.to(device=device, dtype=dtype), owner=t)


def device_constant(
    key: tuple, make: Callable[[], torch.Tensor], device: torch.device | str
) -> torch.Tensor:
    """``make()`` (a CPU tensor that depends only on ``key``, hashable values) on ``device``: on
    the CPU made at each call, elsewhere made and copied once per (``key``, device) and kept."""
    device = _indexed(device)
    if device.type == "cpu":
        return make()
    return kept(("constant", *key, str(device)), lambda: make().to(device))


def _values_key(t: torch.Tensor, device: torch.device) -> tuple:
    raw = t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes()
    return ("values", t.dtype, tuple(t.shape), raw, str(device))


def device_values(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A small tensor the host computed (a schedule's timesteps, step sizes), on ``device``: on
    the CPU itself, elsewhere copied once per distinct value and kept (a loop that repeats its
    values, as a sampler's steady state does, copies nothing more; the values of a pipeline's
    fill and drain, which it does not repeat, are copied ahead by :func:`prefetch_values`)."""
    device = _indexed(device)
    if device.type == "cpu":
        return t
    return kept(_values_key(t, device), lambda: t.to(device))


def prefetch_values(values: Iterable[torch.Tensor], device: torch.device | str) -> None:
    """Copy small host tensors that a loop will hand to :func:`device_values` (a sampler's
    whole schedule, known before its first step) to ``device`` ahead, in one copy per dtype, so
    that those calls copy nothing. Nothing on the CPU."""
    device = _indexed(device)
    if device.type == "cpu":
        return
    todo = {_values_key(t, device): t.detach() for t in values}
    todo = {key: t for key, t in todo.items() if key not in _KEPT}
    for dtype in dict.fromkeys(t.dtype for t in todo.values()):
        group = [(key, t) for key, t in todo.items() if t.dtype == dtype]
        flat = torch.cat([t.reshape(-1) for _, t in group]).to(device)
        start = 0
        for key, t in group:
            piece = flat[start : start + t.numel()].view(t.shape)
            kept(key, lambda piece=piece: piece)
            start += t.numel()


def forget_kept() -> None:
    """Drop every kept device copy (tests that run under a fake device)."""
    _KEPT.clear()
