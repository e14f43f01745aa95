"""ChunkKVCache: one layer's cache of finished chunks, quantized once at commit.

    cache = ChunkKVCache(KVSpec(quantizer="rtn", bits=2, correction="taylor"), window=3)
    cache.commit(k, v)                          # k, v: [B, Hkv, L_chunk, D], post-RoPE, clean
    out = cache.attend(q, k_cur, v_cur, scale)  # q: [B, Hq, Lq, D] over [cached | current]

A committed chunk is quantized once (per :class:`~jbkv_cli.quant.spec.KVSpec`) and never touched
again; eviction drops whole chunks. The first ``spec.sink_chunks`` chunks stay in full precision
and are never evicted (attention sinks); the window counts the other chunks. ``nbytes`` is what
the stored tensors hold (packed codes, FP8 steps, BF16 zeros). Reads dequantize the window into
a working buffer (a production kernel would dequantize on the fly). ``keep_view`` decides whether
that buffer is kept until the next commit (fast: denoising steps re-read the same window) or
dropped after each call (memory: only one layer's window is ever dequantized); the default keeps
it on CPU and drops it on GPU, where memory is what quantization is for and dequantizing is
cheap. A kept buffer is reported apart as ``working_nbytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jbkv_cli.attention.attend import CachedKV, attend
from jbkv_cli.attention.diagnostics import active_recorder
from jbkv_cli.quant.quantizers import quantize_kv
from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.spec import FULL_PRECISION, KVSpec
from jbkv_cli.quant.tensor import QuantizedTensor


@dataclass
class _Chunk:
    k: QuantizedTensor
    v: QuantizedTensor
    sink: bool
    bias_step: torch.Tensor | None = None  # bias-only ablation: the Δ this quantizer would use
    k_ref: torch.Tensor | None = None  # full-precision copies, kept only for diagnostics
    v_ref: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class ChunkKVCache:
    """A sliding window of committed chunks for one attention layer."""

    def __init__(
        self,
        spec: KVSpec = FULL_PRECISION,
        window: int | None = None,
        keep_view: bool | None = None,
    ) -> None:
        if window is not None and window < 0:
            raise ValueError(f"window must be >= 0 chunks or None, got {window}")
        self.spec = spec
        self.window = window
        self.keep_view = keep_view
        self._calls = 0
        self.chunks: list[_Chunk] = []
        self.committed = 0
        self.peak_nbytes = 0
        self._view: tuple[tuple[int, int | None], CachedKV | None] | None = None

    def _store(self, x: torch.Tensor, quantize: bool) -> QuantizedTensor:
        s = self.spec
        if not quantize:
            return quantize_kv(x, 16, s.group_size, "none")
        return quantize_kv(
            x, s.bits, s.group_size, s.quantizer, seed=s.rotation_seed, block_size=s.rotation_block
        )

    def commit(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one finished chunk's post-RoPE ``k``, ``v`` ``[B, Hkv, L, D]``."""
        if k.ndim != 4 or k.shape != v.shape:
            raise ValueError(
                f"k and v must both be [B, Hkv, L, D], got {tuple(k.shape)}, {tuple(v.shape)}"
            )
        if (
            self.chunks
            and k.shape[:2] + k.shape[3:]
            != self.chunks[-1].k.shape[:2] + self.chunks[-1].k.shape[3:]
        ):
            raise ValueError(f"chunk shape {tuple(k.shape)} does not match the cache's chunks")
        s = self.spec
        sink = self.committed < s.sink_chunks
        quantize = s.bits < 16 and not s.bias_only and not sink
        chunk = _Chunk(
            self._store(k, quantize and s.keys), self._store(v, quantize and s.values), sink
        )
        if s.bias_only and s.bits < 16 and not sink:
            chunk.bias_step = self._store(k, True).step
        if active_recorder() is not None:
            chunk.k_ref, chunk.v_ref = k.detach().clone(), v.detach().clone()
        self.chunks.append(chunk)
        self.committed += 1
        self._evict()
        self._view = None
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)

    def _evict(self) -> None:
        if self.window is None:
            return
        regular = [c for c in self.chunks if not c.sink]
        drop = {id(c) for c in regular[: max(0, len(regular) - self.window)]}
        self.chunks = [c for c in self.chunks if id(c) not in drop]

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    @property
    def num_tokens(self) -> int:
        return sum(c.k.shape[-2] for c in self.chunks)

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored chunks (codes, steps, zero points or raw values)."""
        return sum(c.nbytes for c in self.chunks)

    @property
    def working_nbytes(self) -> int:
        """Bytes of the dequantized working buffer of the last read (0 when none)."""
        if self._view is None or self._view[1] is None:
            return 0
        view = self._view[1]
        return sum(t.numel() * t.element_size() for t in (view.k, view.v))

    def reset(self) -> None:
        self.chunks, self.committed, self._view = [], 0, None

    def _selected(self, last: int | None) -> list[_Chunk]:
        regular = [c for c in self.chunks if not c.sink]
        if last is not None:
            regular = regular[len(regular) - last :] if last > 0 else []
        return [c for c in self.chunks if c.sink] + regular

    def read(self, last: int | None = None) -> CachedKV | None:
        """The sinks plus the last ``last`` chunks (default: the whole window), dequantized."""
        if last is not None and last < 0:
            raise ValueError(f"last must be >= 0 chunks or None, got {last}")
        key = (self.committed, last)
        if self._view is not None and self._view[0] == key:
            return self._view[1]
        chunks = self._selected(last)
        view = self._assemble(chunks) if chunks else None
        keep = self.keep_view
        if keep is None:
            keep = not chunks or chunks[0].k.data.device.type == "cpu"
        self._view = (key, view) if keep else None
        return view

    def _assemble(self, chunks: list[_Chunk]) -> CachedKV:
        def cat(ts):
            return torch.cat(ts, dim=-2)

        k = cat([c.k.dequantize() for c in chunks])
        v = cat([c.v.dequantize() for c in chunks])
        steps = [c.bias_step if c.bias_step is not None else c.k.step for c in chunks]
        step = None
        if any(s is not None for s in steps):
            groups = k.shape[-1] // self.spec.group_size
            step = cat(
                [
                    s
                    if s is not None
                    else k.new_zeros((*c.k.shape[:-1], groups), dtype=torch.float32)
                    for s, c in zip(steps, chunks, strict=True)
                ]
            )
        rotation = next((c.k.rotation for c in chunks if c.k.rotation is not None), None)
        if self.spec.bias_only and self.spec.quantizer == "quarot":
            rotation = RandomHadamard(
                k.shape[-1], self.spec.rotation_block, self.spec.rotation_seed
            )
        view = CachedKV(k, v, step, rotation, inject=self.spec.bias_only)
        if all(c.k_ref is not None for c in chunks):
            view.k_ref = cat([c.k_ref for c in chunks])
            view.v_ref = cat([c.v_ref for c in chunks])
        return view

    def attend(
        self,
        q: torch.Tensor,
        k_cur: torch.Tensor,
        v_cur: torch.Tensor,
        scale: float,
        last: int | None = None,
        backend: str | None = None,
    ) -> torch.Tensor:
        """Attention of ``q`` over ``[cached (last chunks) | current]`` with the spec's correction."""
        cached = self.read(last)
        correction = self.spec.correction
        out = attend(q, k_cur, v_cur, cached, scale=scale, correction=correction, backend=backend)
        rec = active_recorder()
        self._calls += 1
        if (
            rec is not None
            and cached is not None
            and cached.k_ref is not None
            and cached.k_step is not None
            and self._calls % rec.every == 0
        ):
            rec.observe(q, k_cur, v_cur, cached, scale, correction)
        return out
