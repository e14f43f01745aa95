"""The working bytes of one cache read: what attention materializes beside the stored cache.

A quantized cache *stores* codes and steps (``ChunkKVCache.nbytes``, from the stored tensors),
but every read dequantizes the window and the attend path builds more from it. This module
accounts, from the shapes of one read (:class:`ReadShape`, which :func:`~jbkv_cli.attention.attend`
reports to an active :class:`WorkingMeter`), the bytes that are live at the read's peak:

- **view**: what the cache's read returns (:class:`~jbkv_cli.attention.attend.CachedKV`): the
  dequantized keys and values of the window, their steps (float32 ``[B, Hkv, Lc, G]``), the
  signed correction's ``k_step2``/``k_unshrink``, the pruner's ``valid`` mask (and its
  ``copies`` when a token is held twice) and, while diagnostics are recorded, the
  full-precision copies ``k_ref``/``v_ref`` and the method's own noise model ``noise_ref``
  (counted with the copies);
- **attend**: the tensors :func:`~jbkv_cli.attention.attend` holds at its peak, per path:

  - ``plain`` (no correction): the ``[cached | current]`` keys and values, SDPA's output and
    log-sum-exp;
  - ``fused``: the augmented keys and values ``[B, Hkv, Lk, W]``, the augmented queries and
    output ``[B, Hq, Lq, W]`` with ``W`` the padded width
    (:func:`~jbkv_cli.attention.correction.fused_width`: ``D + G`` up to a multiple of 8), the
    log-sum-exp (signed: the un-shrunk keys and the extra channels);
  - ``flex``: the concatenated keys and values, ``‖q_j‖²``, the step² table, the pruning row and
    the kernel's output, log-sum-exp and row maxima — the compiled kernel's view (on CUDA); the
    CPU eager fallback also materializes the scores inside the higher-order op, which is not
    counted;
  - ``reference`` / ``masked`` (exact correction, bias-only ablation, RoPE pair terms): the
    concatenated keys and values, per query block the bias ``[B, Hq, b, Lc]`` (float32), the
    float mask ``[B, Hq, b, Lk]``, the GQA-expanded keys and values ``[B, Hq, Lk, D]``, every
    block's output and their concatenation (a second block adds the next bias while the
    previous block's tensors are still referenced);

  plus the pruner's additive mask ``[B, Hq, 1, Lk]`` when a token was dropped or is held
  twice;
- **diagnostics** (:mod:`jbkv_cli.attention.diagnostics`, every ``every``-th read, after attention
  returned its output): float32 copies of the quantized and exact ``[cached | current]`` keys and
  values (values expanded to the query heads), and per block of ``n`` observed queries a few
  float32 ``[B, Hq, n, Lk]`` score and probability tensors (:data:`DIAG_SCORE_TENSORS`).

A variant's **working bytes** are ``view + attend`` of its largest read (without the
diagnostics' copies: what the variant itself needs); a run that records diagnostics holds
``view + refs + max(attend, output + diagnostics)`` (the two phases of a read do not overlap),
kept beside it as ``with_diagnostics``.
Small tensors (``[..., G]`` temporaries freed before the peak, scalars) are left out; the test
(``tests/attention/test_memory.py``) checks the sum against the sizes of the tensors a
``TorchDispatchMode`` sees allocated and alive during one call, within 3 %. Not counted: a
kernel's internal workspace (invisible to the dispatcher, a few tiles), dequantization
temporaries freed before the view is returned, and the causal (LLM prefill) path, whose query
blocks the meter does not report.

On CUDA the measured peak (``torch.cuda.max_memory_allocated`` reset per video) is the third
number (:func:`cuda_peak`); it includes the model's weights and activations, so the bytes
allocated before the video started (``resident_bytes``, mostly the weights) are stated beside it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from jbkv_cli.attention.correction import fused_width
from jbkv_cli.utils.host_reads import on_host, surely_all

PATHS = ("plain", "fused", "flex", "reference", "masked")
MASKED_BLOCK = 256  # query rows per block of the masked path (attend.masked's default)
DIAG_SCORE_TENSORS = 7  # [B, Hq, n, Lk] float32 alive at once (the JSD of p̂ and p, scores held)
DIAG_BLOCK = 128
EXACT_MAX_ELEMENTS = 1 << 24  # correction.exact_bias's max_elements per table block
LUT_TEMPS = 7  # float32 temporaries of log_sinhc alive at once over one table block  # query rows per block of diagnostics.compare_attention


@dataclass(frozen=True)
class ReadShape:
    """The shapes and dtypes of one attention call over a cache read.

    ``compute_bytes``: element size of the queries and current keys (the attention dtype);
    ``view_bytes``: of the dequantized cached ``k``/``v``; ``ref_bytes``: of the full-precision
    copies (0: none, diagnostics off). Flags: which optional view tensors exist.
    """

    batch: int
    q_heads: int
    kv_heads: int
    queries: int
    cached: int
    current: int
    head_dim: int
    groups: int = 0  # key step groups G (0: no steps, nothing quantized)
    compute_bytes: int = 2
    view_bytes: int = 2
    ref_bytes: int = 0
    step2: bool = False
    unshrink: bool = False
    valid: bool = False  # the view carries a pruner's mask
    dropped: bool = False  # and a token is dropped or held twice (attention adds a mask)
    copies: bool = False  # the view carries the pruner's counts (uint8)
    step_values: int = 127  # distinct FP8 step values (the exact bias's table; ≤ 127)
    noise_ref: int = 0  # float32 values per cached token of the diagnostics' noise_ref

    @property
    def keys(self) -> int:
        return self.cached + self.current


def view_nbytes(s: ReadShape) -> int:
    """Bytes of the read's :class:`~jbkv_cli.attention.attend.CachedKV` (see the module)."""
    tokens = s.batch * s.kv_heads * s.cached
    total = 2 * tokens * s.head_dim * s.view_bytes
    total += tokens * s.groups * 4 * (1 + s.step2)  # steps, noise_step2 (float32)
    total += tokens * 4 * s.unshrink + tokens * s.valid  # unshrink float32, valid bool
    total += tokens * s.copies  # counts, uint8
    refs = 2 * tokens * s.head_dim * s.ref_bytes
    return total + (refs + tokens * 4 * s.noise_ref if s.ref_bytes else 0)


def attend_nbytes(s: ReadShape, path: str, form: str | None = None) -> int:
    """Bytes live at the peak of :func:`~jbkv_cli.attention.attend` on ``path`` (``form``: the
    correction's, ``variance`` for signed), beside the view."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    e, d, g = s.compute_bytes, s.head_dim, s.groups
    kv_rows, q_rows = s.batch * s.kv_heads, s.batch * s.q_heads
    concat = 2 * kv_rows * s.keys * d * e
    out = q_rows * s.queries * d * e
    lse = q_rows * s.queries * 4
    mask = q_rows * s.keys * e if s.dropped else 0
    unshrunk = kv_rows * s.cached * d * s.view_bytes if form == "variance" and s.unshrink else 0
    if path == "plain":
        return concat + out + lse + mask
    if path == "fused":
        w = fused_width(d, g)
        aug = 2 * kv_rows * s.keys * w * e + 2 * q_rows * s.queries * w * e
        channels = kv_rows * s.cached * g * 4 if form == "variance" else 0
        return aug + lse + mask + unshrunk + channels
    if path == "flex":
        d2 = kv_rows * s.cached * g * 4 if form != "variance" else 0
        prologue = q_rows * s.queries * g * 4 + d2 + kv_rows * s.cached * 4
        return concat + prologue + out + 2 * lse + unshrunk
    block = s.queries if path == "reference" else min(MASKED_BLOCK, s.queries)
    bias = q_rows * block * s.cached * 4
    per_block = bias + q_rows * block * s.keys * e + 2 * q_rows * s.keys * d * e
    extra = 2 * bias if s.queries > block else 0  # the next block's bias, the last still held
    peak = concat + mask + per_block + extra + 2 * out + unshrunk
    if form != "exact":
        return peak
    # the exact bias's table (correction.exact_bias): LUT_TEMPS float32 [rows, D, V] at once
    codes = 3 * kv_rows * s.cached * g * 8 + q_rows * s.cached * g * 8
    base = concat + mask + unshrunk + bias + codes

    def table(queries: int) -> int:
        rows = min(queries, EXACT_MAX_ELEMENTS // max(1, d * s.step_values))
        return LUT_TEMPS * rows * d * s.step_values * 4

    first = base + table(block)
    if s.queries <= block:
        return max(peak, first)
    last = s.queries - (s.queries - 1) // block * block  # rows of the last block
    # a later block's table while the previous block's tensors are still referenced
    later = base + table(block if s.queries > 2 * block else last) + per_block + out
    return max(peak, first, later)


def diagnostics_nbytes(s: ReadShape, observed: int) -> int:
    """Bytes :func:`~jbkv_cli.attention.diagnostics.compare_attention` holds for ``observed``
    queries (float32 windows and one block of scores), beside the view."""
    kv = s.batch * s.kv_heads * s.keys * s.head_dim * 4
    expanded = s.batch * s.q_heads * s.keys * s.head_dim * 4
    values = 2 * expanded + (2 * kv if s.q_heads != s.kv_heads else 0)
    scores = DIAG_SCORE_TENSORS * s.batch * s.q_heads * min(observed, DIAG_BLOCK) * s.keys * 4
    return 2 * kv + values + scores


@dataclass(frozen=True)
class ReadBytes:
    """One read's accounting: ``view`` (without the full-precision copies), ``refs`` (those
    copies), ``attend``, the attention ``output`` (alive while diagnostics run) and
    ``diagnostics`` (0 when not observed). ``read`` is what the variant itself needs;
    ``total`` what this read held with the diagnostics' share."""

    view: int
    attend: int
    output: int
    refs: int = 0
    diagnostics: int = 0
    path: str = "plain"

    @property
    def read(self) -> int:
        return self.view + self.attend

    @property
    def total(self) -> int:
        return self.view + self.refs + max(self.attend, self.output + self.diagnostics)


def read_bytes(s: ReadShape, path: str, form: str | None = None, observed: int = 0) -> ReadBytes:
    """The working bytes of one read (module docstring); ``observed`` queries of diagnostics."""
    output = s.batch * s.q_heads * s.queries * s.head_dim * s.compute_bytes
    diag = diagnostics_nbytes(s, observed) if observed else 0
    view = view_nbytes(replace(s, ref_bytes=0))
    refs = view_nbytes(s) - view
    return ReadBytes(view, attend_nbytes(s, path, form), output, refs, diag, path)


@dataclass
class WorkingMeter:
    """The largest reads of a generation (:func:`metering`): ``peak`` by :attr:`ReadBytes.read`
    (the variant's own working bytes), ``peak_total`` by :attr:`ReadBytes.total` (with the
    diagnostics' share), how many reads were accounted and, in ``paths``, how many took each
    path (:data:`PATHS`: the backend a corrected read ran on, or ``plain`` / ``masked``)."""

    peak: ReadBytes | None = None
    peak_total: ReadBytes | None = None
    reads: int = 0
    paths: dict[str, int] = field(default_factory=dict)
    _last: tuple[ReadShape, str, str | None] | None = field(default=None, repr=False)

    def add(self, s: ReadShape, path: str, form: str | None) -> None:
        self.reads += 1
        self.paths[path] = self.paths.get(path, 0) + 1
        self._last = (s, path, form)
        self._keep(read_bytes(s, path, form))

    def observed(self, queries: int) -> None:
        """The last read was also observed by diagnostics with ``queries`` queries."""
        if self._last is not None:
            s, path, form = self._last
            self._keep(read_bytes(s, path, form, observed=queries))

    def _keep(self, r: ReadBytes) -> None:
        if self.peak is None or r.read > self.peak.read:
            self.peak = r
        if self.peak_total is None or r.total > self.peak_total.total:
            self.peak_total = r

    def to_dict(self) -> dict[str, int | str | dict[str, int]] | None:
        """What a video record keeps (None when no read was accounted): ``read`` (the largest
        read of the variant itself, with its ``view``/``attend`` split and ``path``),
        ``with_diagnostics`` (the largest read with the diagnostics' copies) and ``paths``
        (reads per path)."""
        p, t = self.peak, self.peak_total
        if p is None or t is None:
            return None
        return {
            "read": p.read,
            "view": p.view,
            "attend": p.attend,
            "path": p.path,
            "with_diagnostics": t.total,
            "diagnostics": t.total - t.read,
            "reads": self.reads,
            "paths": dict(self.paths),
        }


_METER: contextvars.ContextVar[WorkingMeter | None] = contextvars.ContextVar(
    "jbkv_working_meter", default=None
)


@contextlib.contextmanager
def metering() -> Iterator[WorkingMeter]:
    """``with metering() as meter:`` every non-causal attention call over a cache inside the
    block is accounted in ``meter``."""
    meter = WorkingMeter()
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)


def active_meter() -> WorkingMeter | None:
    return _METER.get()


def shape_of(q: torch.Tensor, k_cur: torch.Tensor, cached, exact: bool = False) -> ReadShape:
    """The :class:`ReadShape` of ``attend(q, k_cur, ·, cached)`` (``cached`` a ``CachedKV``;
    ``exact``: count the distinct step values the exact bias tabulates)."""
    step = cached.k_step
    values = 127  # the exact bias's table off the CPU (correction.exact_bias)
    if exact and step is not None and on_host(step):
        values = max(1, int(torch.unique(step).numel()))
    valid = cached.valid
    ref = cached.k_ref
    return ReadShape(
        batch=int(torch.Size(q.shape[:-3]).numel()),
        q_heads=q.shape[-3],
        kv_heads=k_cur.shape[-3],
        queries=q.shape[-2],
        cached=cached.num_tokens,
        current=k_cur.shape[-2],
        head_dim=q.shape[-1],
        groups=0 if step is None else step.shape[-1],
        compute_bytes=q.element_size(),
        view_bytes=cached.k.element_size(),
        ref_bytes=0 if ref is None else ref.element_size(),
        step2=cached.k_step2 is not None,
        unshrink=cached.k_unshrink is not None,
        valid=valid is not None,
        dropped=valid is not None and (cached.copies is not None or not surely_all(valid)),
        copies=cached.copies is not None,
        step_values=values,
        noise_ref=sum(t.shape[-1] for t in cached.noise_ref if t is not None)
        if cached.noise_ref is not None
        else 0,
    )


@contextlib.contextmanager
def cuda_peak(device: torch.device | str | None = None) -> Iterator[dict[str, int]]:
    """``with cuda_peak() as peak:`` fills ``peak`` with ``peak_bytes`` (the CUDA allocator's
    ``max_memory_allocated`` since the block began) and ``resident_bytes`` (allocated when it
    began: the weights and anything else already resident); empty when CUDA is not in use."""
    out: dict[str, int] = {}
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        yield out
        return
    torch.cuda.synchronize(device)
    resident = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    yield out
    torch.cuda.synchronize(device)
    out["peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
    out["resident_bytes"] = int(resident)
