"""The working-bytes accounting (jbkv_cli.attention.memory) against the tensors one attend call
really allocates: a TorchDispatchMode counts every fresh storage an op returns and, through a
finalizer on the storage, when it is freed, so it sees the bytes alive at the call's peak."""

from __future__ import annotations

import weakref
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.attention.attend import CachedKV, attend
from jbkv_cli.attention.memory import (
    ReadShape,
    attend_nbytes,
    cuda_peak,
    metering,
    read_bytes,
    shape_of,
    view_nbytes,
)

TOLERANCE = 0.03  # relative: what the accounting leaves out ([..., G] temporaries, scalars)


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the storages ops allocated inside the mode that are alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live -= self.seen.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        known = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in known or key in self.seen or storage.nbytes() == 0:
                continue  # a view of an input, or already counted
            self.seen[key] = storage.nbytes()
            self.live += storage.nbytes()
            weakref.finalize(storage, self._free, key)
        self.peak = max(self.peak, self.live)
        return out


def _view(gqa: bool, dtype: torch.dtype, *, signed=False, pruned=False, refs=False, lc=96):
    g = torch.Generator().manual_seed(0)
    b, hkv, d, groups = 1, 2, 32, 2
    hq = 2 * hkv if gqa else hkv

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    q, kc, vc = rand(b, hq, 24, d), rand(b, hkv, 24, d), rand(b, hkv, 24, d)
    view = CachedKV(rand(b, hkv, lc, d), rand(b, hkv, lc, d))
    step = 0.1 + torch.rand(b, hkv, lc, groups, generator=g)
    view.k_step = step.to(torch.float8_e4m3fn).float()  # FP8 steps, as the methods store them
    if signed:
        view.k_step2 = view.k_step.square()
        view.k_unshrink = 1 + torch.rand(b, hkv, lc, 1, generator=g)
    if pruned:
        view.valid = torch.rand(b, hkv, lc, generator=g) > 0.2
    if refs:
        view.k_ref, view.v_ref = rand(b, hkv, lc, d).float(), rand(b, hkv, lc, d).float()
    return q, kc, vc, view


def _measure(q, kc, vc, view, **kw) -> int:
    mode = LiveBytes()
    with mode:
        out = attend(q, kc, vc, view, scale=q.shape[-1] ** -0.5, **kw)
    assert out.shape == q.shape
    return mode.peak


FORMS = {"none": None, "taylor": "taylor", "signed": "variance", "exact": "exact"}
FORMS["bias-only"] = "exact"
CASES = [  # (backend, correction, path the accounting takes)
    ("fused", "none", "plain"),
    ("fused", "taylor", "fused"),
    ("fused", "signed", "fused"),
    ("reference", "taylor", "reference"),
    ("fused", "exact", "masked"),
    ("fused", "bias-only", "masked"),
]


@pytest.mark.parametrize("backend,correction,path", CASES)
@pytest.mark.parametrize(
    "gqa,dtype,pruned", [(True, torch.float32, False), (False, torch.bfloat16, True)]
)
def test_attend_accounting_matches_allocations(backend, correction, path, gqa, dtype, pruned):
    q, kc, vc, view = _view(gqa, dtype, signed=correction == "signed", pruned=pruned)
    measured = _measure(q, kc, vc, view, correction=correction, backend=backend)
    form = FORMS[correction]
    with metering() as meter:
        attend(q, kc, vc, view, scale=0.2, correction=correction, backend=backend)
    assert meter.peak.path == path  # the path attend reports is the one it took
    accounted = attend_nbytes(shape_of(q, kc, view, form == "exact"), path, form)
    assert meter.peak.attend == accounted
    assert abs(accounted - measured) <= TOLERANCE * measured, (accounted, measured)


def test_masked_accounting_over_two_query_blocks():
    q, kc, vc, view = _view(True, torch.float32)
    q = torch.cat([q] * 12, dim=-2)  # 288 queries: two blocks of the masked path
    measured = _measure(q, kc, vc, view, correction="exact")
    accounted = attend_nbytes(shape_of(q, kc, view, exact=True), "masked", "exact")
    assert abs(accounted - measured) <= TOLERANCE * measured, (accounted, measured)


def test_view_accounting_is_the_view_tensors():
    q, kc, _, view = _view(True, torch.bfloat16, signed=True, pruned=True, refs=True)
    tensors = (view.k, view.v, view.k_step, view.k_step2, view.k_unshrink, view.valid)
    held = sum(t.numel() * t.element_size() for t in (*tensors, view.k_ref, view.v_ref))
    assert view_nbytes(shape_of(q, kc, view)) == held


def test_diagnostics_accounting_matches_allocations():
    q, kc, vc, view = _view(True, torch.float32, refs=True)
    rec = AttentionRecorder(max_queries=32, every=1)
    mode = LiveBytes()
    with mode:
        rec.observe(q, kc, vc, view, 0.2, "taylor")
    accounted = read_bytes(shape_of(q, kc, view), "fused", "taylor", observed=24).diagnostics
    assert abs(accounted - mode.peak) <= TOLERANCE * mode.peak, (accounted, mode.peak)


def test_working_bytes_exceed_stored_for_a_window_dequantized_in_bf16():
    """At INT2 with 32-channel groups the cache stores ~2.5 bits a value; a read holds the
    BF16 window and the attend path's copies: many times the stored bytes."""
    s = ReadShape(1, 12, 12, 1560, 1560 * 6, 1560, 128, groups=4, compute_bytes=2, view_bytes=2)
    stored = 2 * 12 * 1560 * 6 * 128 * 2.5 / 8
    r = read_bytes(s, "fused", "taylor")
    assert r.view > 6 * stored and r.attend > r.view
    assert r.read == r.total == r.view + r.attend  # no diagnostics: nothing else


def test_cuda_peak_is_empty_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("measured on a CUDA machine (benchmarks/memory.py)")
    with cuda_peak() as peak:
        torch.ones(4)
    assert peak == {}


def test_cuda_peak_resets_per_block_and_states_what_was_resident(monkeypatch):
    """The CUDA code path with the allocator's calls stubbed (no GPU here): the peak is read
    after a reset at the block's start, the bytes resident before it are stated beside it."""
    calls = []
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: 100)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: 700)
    with cuda_peak() as peak:
        assert calls == ["sync", "reset"] and peak == {}
    assert peak == {"peak_bytes": 700, "resident_bytes": 100} and calls[-1] == "sync"


def test_fused_accounting_counts_the_padded_width():
    """The fused tensors are ``fused_width(D, G)`` wide: D = 64 with G = 2 or G = 8 both build
    72-wide ``q'``/``k'``/``v'``/output, so their accounting agrees; written out for G = 2."""
    s = ReadShape(1, 4, 2, 256, 1024, 256, 64, groups=2, compute_bytes=2)
    width = 72
    expected = 2 * 2 * 1280 * width * 2 + 2 * 4 * 256 * width * 2 + 4 * 256 * 4  # + lse
    assert attend_nbytes(s, "fused", "taylor") == expected
    assert attend_nbytes(replace(s, groups=8), "fused", "taylor") == expected


def test_meter_counts_reads_per_path():
    """What a video record keeps of the backend each read took (``working_bytes.paths``)."""
    q, kc, vc, view = _view(True, torch.float32)
    with metering() as meter:
        for backend, correction in [
            ("fused", "taylor"),
            ("fused", "none"),
            ("reference", "taylor"),
        ]:
            attend(q, kc, vc, view, scale=0.2, correction=correction, backend=backend)
        attend(q, kc, vc, view, scale=0.2, correction="taylor", backend="fused")
    assert meter.to_dict()["paths"] == {"fused": 2, "plain": 1, "reference": 1}
    assert meter.reads == 4
