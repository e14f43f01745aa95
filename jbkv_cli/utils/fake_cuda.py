"""A fake CUDA device (tests, `jbkv plan`): device tensors have shapes and no values, CPU tensors stay real.

    with FakeCuda() as cuda:
        model = cuda.move(model)          # built on the CPU, its modules and tensors to "cuda"
        model.generate(...)               # a host read of a device value raises HostSync
    cuda.transfers                        # the blocking host <-> device copies, by call site

Inside the block every operation that touches a tensor on a non-CPU device (or makes one) runs
under :class:`~torch._subclasses.fake_tensor.FakeTensorMode`: nothing is allocated or computed,
and a read of a device value on the host — ``.item()``, ``bool(t)``, ``int(t)``, ``.tolist()``, a
shape that depends on the values (``nonzero``, boolean-mask indexing, ``torch.unique``) — raises
:class:`HostSync`. Operations on CPU tensors alone run for real, so the host's own work (a
scheduler's timesteps, a seeded CPU generator, a codebook) reads its values as it does on a
real machine, where such a read costs nothing. A copy between the host and the device (a
tensor made on the CPU and moved, or a device tensor moved to the CPU) is not a read, but a
blocking copy waits for the device as a read does: each one is recorded in ``transfers``
(operation, the last two ``jbkv_cli`` frames that asked for it) for the test to count per
chunk. A CPU tensor with more than one element mixed into a device operation is an implicit
copy and recorded too.
A device tensor copied to the host becomes a real CPU tensor of ones (its values are unknown;
the host may read them, as it may after a real copy, which is what the count is for).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from jbkv_cli.utils.host_reads import forget_kept

HostSync = (DataDependentOutputException, DynamicOutputShapeException)
"""What a host read of a fake device value raises."""


def _device(x: Any) -> torch.device | None:
    if isinstance(x, torch.device):
        return x
    if isinstance(x, str) and x.split(":")[0] in ("cuda", "cpu", "meta"):
        return torch.device(x)
    return None


def _sites() -> tuple[str, ...]:
    """The last two ``jbkv_cli`` frames that asked for the copy (not this module's, nor
    ``host_reads``'s helpers that make the copies they are asked for)."""
    frames = traceback.extract_stack()[:-3]
    inside = [
        f"{f.filename.split('jbkv_cli/')[-1]}:{f.lineno}"
        for f in frames
        if "jbkv_cli" in f.filename and not f.filename.endswith(_HELPERS)
    ]
    return tuple(inside[-2:])


_HELPERS = ("utils/fake_cuda.py", "utils/host_reads.py")


def _flatten(x: Any, into: list[Any]) -> None:
    """The leaves of an operation's arguments (tuples, lists and dicts of them), in order: what
    ``tree_leaves`` gives for them, without its per-node type lookups (every operation pays it)."""
    if isinstance(x, (tuple, list)):
        for v in x:
            _flatten(v, into)
    elif isinstance(x, dict):
        for v in x.values():
            _flatten(v, into)
    else:
        into.append(x)


_COPIES = ("to", "_to_copy", "copy_", "copy", "_copy_from")
_copy: dict[Any, bool] = {}


def _is_copy(func: Any) -> bool:
    """Whether ``func`` (an aten overload) copies between devices."""
    known = _copy.get(func)
    if known is None:
        known = _copy[func] = func.__name__.split(".")[0] in _COPIES
    return known


class FakeCuda(TorchDispatchMode):
    """The fake device (module docstring); ``transfers`` lists ``(op, sites)`` per copy."""

    def __init__(self) -> None:
        super().__init__()
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.transfers: list[tuple[str, tuple[str, ...]]] = []

    def __enter__(self) -> FakeCuda:
        forget_kept()  # device copies kept by jbkv are fake inside, stale outside
        self.fake.__enter__()  # beneath this mode: device ops land there; no CUDA call is made
        self._module_to = torch.nn.Module.to
        torch.nn.Module.to = _module_to(self._module_to)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        torch.nn.Module.to = self._module_to
        self.fake.__exit__(*exc)
        forget_kept()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves: list[Any] = []
        _flatten(args, leaves)
        _flatten(kwargs, leaves)
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        on_device = any(isinstance(t, FakeTensor) for t in tensors) or any(
            (d := _device(x)) is not None and d.type != "cpu" for x in leaves
        )
        if not on_device:
            with unset_fake_temporarily():
                return func(*args, **kwargs)  # the host's own work: real
        copy = _is_copy(func)
        host = [t for t in tensors if not isinstance(t, FakeTensor)]
        if any(copy or t.dim() > 0 for t in host):
            self.transfers.append((str(func), _sites()))  # host data into a device op
        if host:
            args, kwargs = tree_map(self._fakify, (args, kwargs))
        out = func(*args, **kwargs)
        from_device = any(t.device.type != "cpu" for t in tensors)
        if from_device and isinstance(out, torch.Tensor) and out.device.type == "cpu":
            self.transfers.append((str(func), _sites()))  # device data to the host
            if copy:  # the host holds it now, values unknown: ones stand in (see the docstring)
                with unset_fake_temporarily():
                    return torch.ones(out.shape, dtype=out.dtype)
        return out

    def _fakify(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor):
            return self.fake.from_tensor(x)
        return x

    def move(self, obj: Any, device: str = "cuda") -> Any:
        """``obj`` (a model built on the CPU) with every module and tensor it holds moved to the
        fake ``device`` and every ``device`` setting of ``"cpu"`` set to it (in place where it
        can be; returns the object)."""
        return _move(obj, device, set(), 0)

    def count(self) -> int:
        return len(self.transfers)


def _module_to(original):
    """``Module.to`` that leaves a module whose tensors are already there alone: a no-op on a
    real device, and fake parameters cannot be swapped for themselves."""

    def to(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = [*module.parameters(), *module.buffers()]
        there = device is None or all(t.device.type == device.type for t in tensors)
        if there and (
            dtype is None or all(t.dtype == dtype for t in tensors if t.is_floating_point())
        ):
            return module
        return original(module, *args, **kwargs)

    return to


_LEAVES = (str, int, float, bool, type(None), torch.dtype, torch.device, torch.Generator)


def _move(obj: Any, device: str, seen: set[int], depth: int) -> Any:
    if id(obj) in seen or depth > 8 or isinstance(obj, _LEAVES):
        return obj
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        if any(t.device.type == "cpu" for t in (*obj.parameters(), *obj.buffers())):
            obj.to(device)
        for module in obj.modules():  # tables kept as plain attributes, not buffers
            _move_attributes(module, device, seen, depth, only_tensors=True)
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(device) if obj.device.type == "cpu" else obj
    if isinstance(obj, dict):
        for key, value in list(obj.items()):
            obj[key] = (
                device
                if key == "device" and value == "cpu"
                else _move(value, device, seen, depth + 1)
            )
        return obj
    if isinstance(obj, list):
        obj[:] = [_move(v, device, seen, depth + 1) for v in obj]
        return obj
    if isinstance(obj, tuple):
        for value in obj:  # modules inside move in place
            _move(value, device, seen, depth + 1)
        return obj
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith(
        ("jbkv_cli", "diffusers", "transformers")
    ):
        _move_attributes(obj, device, seen, depth, only_tensors=False)
    return obj


def _move_attributes(obj: Any, device: str, seen: set[int], depth: int, only_tensors: bool) -> None:
    for key, value in list(vars(obj).items()):
        if only_tensors:
            plain = isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
            if plain and value.device.type == "cpu" and key not in obj._buffers:
                object.__setattr__(obj, key, value.to(device))
            continue
        if key == "device" and (value == "cpu" or value == torch.device("cpu")):
            new: Any = device if isinstance(value, str) else torch.device(device)
        else:
            new = _move(value, device, seen, depth + 1)
        if new is not value:
            object.__setattr__(obj, key, new)


def per_chunk(counts: Iterable[int]) -> list[int]:
    """Differences of cumulative counts taken after each chunk: what each chunk added."""
    counts = list(counts)
    return [b - a for a, b in zip([0, *counts], counts, strict=False)]
