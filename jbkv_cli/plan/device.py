"""The plan's device: fake CUDA (:class:`~jbkv_cli.utils.fake_cuda.FakeCuda`) with a
:class:`~jbkv_cli.plan.tracker.MemoryTracker` that labels what it counts.

    with PlanDevice() as device:
        model = entry.plan_model(**options)     # modules built on meta, placed on "cuda"
        device.adopt_weights(model)             # weights per component
        video = model.generate(case, seed, spec)
    device.tracker.peak, device.tracker.periods

Labels (the split of the peak, ``docs/plan.md``):

- ``weights:NAME``: the parameters and buffers of each component (a top-level module the
  adapter holds: the DiT, the VAE, the text encoder, ...), counted when the plan adopts them
  after the build and whenever the model moves a component onto the device for its phase;
- ``cache``: what :meth:`ChunkKVCache.commit <jbkv_cli.kvcache.ChunkKVCache.commit>` allocates
  (the stored codes, steps, exact tokens and a pruner's state, plus its short-lived temporaries)
  and, after each commit pass, every tensor the caches hold (:func:`held_tensors`: a 16-bit
  cache keeps the model's own K/V, allocated outside its commit);
- ``attention``: what a cache read and its attention allocate
  (:meth:`~jbkv_cli.kvcache.ChunkKVCache.attend` and ``read``: the dequantized window and the
  attend path's tensors, the working bytes of :mod:`jbkv_cli.attention.memory`) and the outputs
  of every SDPA kernel (the current chunk's and the cross-attention's);
- ``activations``: everything else (latents, hidden states, text embeddings, the VAE's
  activations, the outputs of attention once they are projected).

A module moved to the host (``module.to("cpu")``: a phase's offload) goes to ``meta`` instead,
so no weight is ever allocated on the host; modules are converted by replacing their tensors
(fake parameters cannot be swapped in place), tied ones once. SDPA runs the kernel a GPU would
(:mod:`jbkv_cli.plan.sdpa`). The chunk loop's books (:class:`~jbkv_cli.models.loop.LoopCaches`)
close a period of the tracker when they are built (``setup``: text and image encoding) and
after every chunk (``chunk N``); the first call of the ``vae`` component after the loop starts
``decode`` (:meth:`begin` with ``loop_only`` stops the generation there, :class:`LoopDone`), and
:meth:`finish` closes it. After each commit pass the bytes under ``cache`` are sampled
(``cache_samples``), with what the books' caches hold (``passes``), and the books' peak kept
(``recorded``: what a run records as ``kv_cache_bytes``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from jbkv_cli.kvcache import ChunkKVCache
from jbkv_cli.models.loop import LoopCaches
from jbkv_cli.plan.sdpa import gpu_kernels
from jbkv_cli.plan.tracker import UNTRACKED, MemoryTracker
from jbkv_cli.utils.fake_cuda import FakeCuda

CACHE = "cache"
ATTENTION = "attention"
WEIGHTS = "weights:"
SETUP, DECODE = "setup", "decode"
DECODER = "vae"  # the component whose first call after the loop starts the decode


class LoopDone(Exception):
    """Raised where the decode would start when the device was told to stop there."""


# the aten kernels whose outputs are attention's (SDPA and what it dispatches to)
_ATTENTION_OPS = (
    "scaled_dot_product",
    "_flash_attention",
    "_efficient_attention",
    "flex_attention",
)


class PlanTracker(MemoryTracker):
    """A tracker that counts the outputs of attention kernels under ``attention`` (unless a
    cache label is open: a commit's own attention is the cache's)."""

    def _op_label(self, func) -> str:
        label = self.current
        if label != CACHE and any(name in func.__name__ for name in _ATTENTION_OPS):
            return ATTENTION
        return label


def components(model: Any) -> dict[str, torch.nn.Module]:
    """The top-level modules ``model`` holds, by name: attributes (of the adapter, of its
    dataclasses and plain objects, of dicts) that are modules, not inside another one; a name is
    the attribute's, the one above it for ``model`` (``text_encoder.model`` -> ``text_encoder``).
    """
    found: dict[str, torch.nn.Module] = {}
    _walk(model, "", found, set(), 0)
    return found


def _walk(obj: Any, name: str, found: dict, seen: set[int], depth: int) -> None:
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        if any(m is obj for m in found.values()):
            return
        key = name or type(obj).__name__
        while key in found:
            key += "_"
        found[key] = obj
        return
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items()]
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("jbkv_cli"):
        items = list(vars(obj).items())
    else:
        return
    for key, value in items:
        if key.startswith("_") and not isinstance(value, torch.nn.Module):
            continue
        _walk(value, name if key == "model" and name else key, found, seen, depth + 1)


_NOT_HELD = frozenset({"observer", "spec", "_view", "policies", "layer"})


def held_tensors(caches: list) -> list[torch.Tensor]:
    """Every tensor the caches hold (their chunks' stored tensors, a pruner's state, RoPE
    tables, query statistics), found through their attributes: a full-precision cache keeps the
    model's own K/V tensors, which were allocated outside its commit."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    for cache in caches:
        _collect(cache, found, seen, 0)
    return found


def _collect(obj: Any, found: list, seen: set[int], depth: int) -> None:
    if id(obj) in seen or depth > 8:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        found.append(obj)
    elif isinstance(obj, list | tuple | set):
        for value in obj:
            _collect(value, found, seen, depth + 1)
    elif isinstance(obj, dict):
        for value in obj.values():
            _collect(value, found, seen, depth + 1)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("jbkv_cli"):
        for key, value in vars(obj).items():
            if key not in _NOT_HELD:
                _collect(value, found, seen, depth + 1)


def weight_bytes(parts: dict[str, torch.nn.Module]) -> dict[str, int]:
    """Each component's parameter and buffer bytes (each storage once), by name."""
    sizes = {}
    for name, module in parts.items():
        storages = {
            t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in _tensors(module)
        }
        sizes[name] = sum(storages.values())
    return sizes


def _tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


class PlanDevice:
    """Fake CUDA, the labelled tracker and the hooks of the module docstring."""

    def __init__(self) -> None:
        self.cuda = FakeCuda()
        self.tracker = PlanTracker()
        self.owner: dict[int, str] = {}  # module id -> its component's name
        self.cache_samples: list[int] = []
        self.passes: list[int] = []  # what the books' caches hold after each commit pass
        self.seconds: list[float] = []  # per closed period, as ``tracker.periods``
        self._since = time.perf_counter()
        self.loop_only = False
        self.recorded = 0  # the books' peak cache bytes in this generation (kv_cache_bytes)
        self.cache_at_decode = 0
        self._in_loop = self._decoding = False
        self._last_chunk = "loop"
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> PlanDevice:
        stack = self._stack
        stack.enter_context(self.cuda)
        stack.enter_context(self.tracker)
        stack.enter_context(torch.no_grad())
        stack.enter_context(gpu_kernels(lambda: self.tracker.label(ATTENTION)))
        stack.enter_context(_patched(torch.nn.Module, "to", self._module_to))
        stack.enter_context(_patched(torch.nn.Module, "_apply", _replacing_apply))
        label = self.tracker.label
        stack.enter_context(_patched(ChunkKVCache, "commit", _labelled(label, CACHE)))
        stack.enter_context(_patched(ChunkKVCache, "attend", _labelled(label, ATTENTION)))
        stack.enter_context(_patched(ChunkKVCache, "read", _labelled(label, ATTENTION)))
        stack.enter_context(_patched(LoopCaches, "__init__", self._books_built))
        stack.enter_context(_patched(LoopCaches, "committed", self._committed))
        stack.enter_context(_patched(LoopCaches, "chunk_done", self._chunk_done))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.__exit__(*exc)

    # -- weights ------------------------------------------------------------------------------

    def adopt_weights(self, model: Any) -> dict[str, int]:
        """Count every component's parameters and buffers now on the device under
        ``weights:NAME`` and start the peak here; returns each component's bytes in all (on the
        device or not), by name."""
        parts = components(model)
        for name, module in parts.items():
            for sub in module.modules():
                self.owner[id(sub)] = name
            self.tracker.adopt(_tensors(module), WEIGHTS + name)
            if name == DECODER:
                for sub in module.modules():
                    sub.register_forward_pre_hook(self._decoder_called)
        self.tracker.reset_peak()
        return weight_bytes(parts)

    def _module_to(self, original: Callable) -> Callable:
        def to(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
            device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
            if device is not None and device.type == "cpu" and _off_host(module):
                device = torch.device("meta")  # an offload: never onto the host (docstring)
                args, kwargs = (device,), {"dtype": dtype, "non_blocking": non_blocking}
            name = self.owner.get(id(module))
            label = self.tracker.current if name is None else WEIGHTS + name
            if device is not None and device.type not in UNTRACKED and _on_meta(module):
                placed = _placed(module, device, dtype, self.cuda.fake)
                self.tracker.adopt(placed, label)
                return module
            with self.tracker.label(label):
                return original(module, *args, **kwargs)

        return to

    # -- the loop's moments -------------------------------------------------------------------

    def begin(self, loop_only: bool = False) -> None:
        """Before a generation: its periods start now; ``loop_only``: stop it with
        :class:`LoopDone` where the decoder is first called after the loop."""
        self.loop_only = loop_only
        self.recorded = self.cache_at_decode = 0
        self._in_loop = self._decoding = False
        self._last_chunk = "loop"
        self.tracker.reset_peak()
        self._since = time.perf_counter()

    def _decoder_called(self, module: torch.nn.Module, args: Any) -> None:
        if not self._in_loop or self._decoding:
            return
        self._decoding = True
        self.cache_at_decode = self.tracker.live.get(CACHE, 0)
        self._mark(self._last_chunk)  # what ran since the last chunk is still the loop's
        if self.loop_only:
            raise LoopDone

    def _books_built(self, original: Callable) -> Callable:
        def init(books: LoopCaches, *args: Any, **kwargs: Any) -> None:
            original(books, *args, **kwargs)
            if not self._in_loop:
                self._in_loop = True
                self._mark(SETUP)

        return init

    def _committed(self, original: Callable) -> Callable:
        def committed(books: LoopCaches) -> None:
            original(books)
            self.tracker.relabel(held_tensors(books.caches), CACHE)
            self.cache_samples.append(self.tracker.live.get(CACHE, 0))
            self.passes.append(sum(c.nbytes for part in books.parts.values() for c in part))
            self.recorded = max(self.recorded, books.peak.total)

        return committed

    def _chunk_done(self, original: Callable) -> Callable:
        def chunk_done(books: LoopCaches, done: int) -> None:
            original(books, done)
            self._last_chunk = f"chunk {done}"
            self._mark(self._last_chunk)

        return chunk_done

    def finish(self) -> None:
        """Close the last period (``decode``: from the decoder's first call after the loop, or
        from the last chunk where no decoder was called)."""
        self._mark(DECODE if self._decoding or not self.loop_only else self._last_chunk)

    def _mark(self, name: str) -> None:
        now = time.perf_counter()
        self.tracker.mark(name)
        self.seconds.append(now - self._since)
        self._since = now


def _replacing_apply(original: Callable) -> Callable:
    """``Module._apply`` that puts each converted tensor in the module's place of the old one:
    torch swaps fake parameters in place, which a fake tensor (weakly referenced by its mode)
    refuses. A tensor two modules share (tied embeddings) is converted once and stays shared."""

    def apply(module: torch.nn.Module, fn: Callable, recurse: bool = True) -> torch.nn.Module:
        done: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for sub in module.modules() if recurse else [module]:
                for key, param in sub._parameters.items():
                    if param is not None:
                        if id(param) not in done:
                            new = fn(param)
                            if new is not param:
                                new = torch.nn.Parameter(new, param.requires_grad)
                            done[id(param)] = new
                        sub._parameters[key] = done[id(param)]
                for key, buffer in sub._buffers.items():
                    if buffer is not None:
                        if id(buffer) not in done:
                            done[id(buffer)] = fn(buffer)
                        sub._buffers[key] = done[id(buffer)]
        return module

    return apply


def _on_meta(module: torch.nn.Module) -> bool:
    tensors = _tensors(module)
    return bool(tensors) and all(t.device.type == "meta" for t in tensors)


def _placed(
    module: torch.nn.Module, device: torch.device, dtype: torch.dtype | None, fake: Any
) -> list[torch.Tensor]:
    """``module.to(device, dtype)`` for a module on ``meta``, each tensor made a fake device
    tensor of the same shape and strides directly (no operation dispatched: thousands of
    parameters move in milliseconds); returns the new tensors, each once (tied ones stay
    tied). What :meth:`Module.to` converts is converted: floating point tensors to ``dtype``."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    if device.index is None:
        device = torch.device(device.type, 0)
    done: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in done:
            kind = (
                dtype
                if dtype is not None and (t.is_floating_point() or t.is_complex())
                else t.dtype
            )
            with _disable_current_modes():
                elem = torch.empty_strided(t.shape, t.stride(), dtype=kind, device="meta")
            done[id(t)] = FakeTensor(fake, elem, device)
        return done[id(t)]

    for sub in module.modules():
        for key, param in sub._parameters.items():
            if param is not None:
                if id(param) not in done:
                    convert(param)
                    with _disable_current_modes():  # its detach: no moment in the trace
                        done[id(param)] = torch.nn.Parameter(done[id(param)], param.requires_grad)
                sub._parameters[key] = done[id(param)]
        for key, buffer in sub._buffers.items():
            if buffer is not None:
                sub._buffers[key] = convert(buffer)
    return list(done.values())


def _off_host(module: torch.nn.Module) -> bool:
    return any(t.device.type != "cpu" for t in _tensors(module))


def _labelled(label: Callable, name: str) -> Callable[[Callable], Callable]:
    def wrap(original: Callable) -> Callable:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            with label(name):
                return original(self, *args, **kwargs)

        return method

    return wrap


@contextlib.contextmanager
def _patched(owner: type, name: str, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """``owner.name`` replaced by ``wrap(original)`` inside the block."""
    original = owner.__dict__[name]
    setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)
