"""After KVQuant (Hooper et al., NeurIPS 2024, arXiv 2401.18079; code SqueezeAILab/KVQuant
@57a23835, its simulated-quantization path ``quant/``): non-uniform codes, keys per channel
before RoPE, values per token, dense-and-sparse outliers, exact first tokens, optional Q-Norm.

With ``b`` bits, outlier fraction ``f`` (the source's ``1 − sparsity_threshold``, default 1%:
its "nuq-1%" recipe) and ``t = 1 − f/2`` (``SimQuant.quantize``), per stored chunk ``x [..., L,
D]`` whose first ``F`` tokens are kept exact (``first_tokens``) and whose other tokens ``y`` are
coded:

- **Keys, per channel** ``c`` (over the tokens of ``y``): thresholds ``u_c`` = the ``t``
  percentile, ``l_c`` = the ``1 − t`` percentile (linear interpolation, as ``np.percentile``);
  outliers are the entries ``y_ic > u_c`` or ``y_ic < l_c`` (``get_outliers``).
- **Values, per token** ``i`` (over its channels of every KV head, the source's ``v_proj``
  row; online as its ``dynamicquantization``): outliers are ``y_ic ≥`` the token's ``t`` quantile or ``≤`` its
  ``1 − t`` quantile (``get_outliers_dynamic``); ``u_i``, ``l_i`` are the max and min of the
  token with its outliers replaced by its median (``quant_fn_nuq_recon``).
- **Normalise** (offset and half-range)::

      o = (u + l)/2,   r = (u − l)/2,   z = (y − o)/r ∈ [−1, 1] for every non-outlier

- **Codebook** (NUQ): ``2^b`` centroids by k-means over the non-outlier ``z`` of the chunk, one
  codebook pooled over heads, tokens and channels (the source: one per layer and projection),
  ``iters`` = 50 Lloyd rounds (the source's ``max_iter=50``; :mod:`jbkv_cli.quant.nuq`).
  Codes: the nearest centroid. Q-Norm (``qnorm``): ``ẑ = s·c[code] + o_q`` with the mean and
  standard deviation of the non-outlier ``z`` (:func:`~jbkv_cli.quant.nuq.qnorm`).
- **Read back**: ``ŷ = r ẑ + o``; outliers and the first ``F`` tokens exactly as stored.

Stored (:meth:`KVQuantTensor.stored`, what the bytes count): packed ``b``-bit codes of every
coded token ``[..., L−F, D·b/8]``; ``u``, ``l`` in FP16 rounded outward (keys ``[..., 1, D]``,
values ``[B, 1, L−F, 1]``); the codebook and its cells' variances, FP16 ``[R, 2^b]`` each (``R``:
the batch); Q-Norm's ``(s, o_q)`` FP16 ``[R, 2]``; the **sparse outlier list**: per key channel
``K = ⌈(n−1)f/2⌉ + (n−1−⌊(n−1)t⌋)`` token indices and values, per value token ``K`` indices
into its ``H·D`` channels and values (indices uint8 up to 256 positions, int16 up to 32,767,
else int32; ``n`` the tokens for keys, ``H·D`` for values, with ``≥``/``≤`` counts); the first
tokens ``[..., F, D]``. Exact entries are kept in the cache's dtype when it is 16-bit
(exactly), else FP16 (the source's).

Noise model (what the corrections read; per element, ``step [..., L, D]``, ``G = D``): a coded
entry's error is its cell's, **centroid type** (k-means centroids are their cells' means):
``step_ic = r · √(12 v_{code})`` (``v`` the cell's variance of the chunk's ``z``, stored;
``× s`` under Q-Norm); outliers and first tokens are exact, step 0. Keys are cached before RoPE
(``layout``, the source's hooks sit on ``k_proj``; on a model whose cache cannot, after
RoPE unless ``layout=pre-rope`` was asked for): their per-channel steps split RoPE pairs, so
the correction takes the pair terms (:mod:`jbkv_cli.attention.rope`). The excess rule reads
``−step²`` (``Var(k̂) − Var(k) = −v`` per cell). The unshrink rule's gain model ``k̂ = a k + n``
does not fit a code with per-channel offsets (``u k̂`` would scale the offsets too, rotated per
position before RoPE), so KVQuant declares ``a = 1`` and gives that rule the same ``w = −step²``.
Q-Norm stretches the reconstruction back toward the data's spread, which moves the noise
toward additive: with ``qnorm`` the tensor declares ``mixed`` noise, measured at commit
(:func:`~jbkv_cli.quant.noise.measure_noise`).

Differences from the source (why "after KVQuant"):

- **Calibration in-run, per chunk** (the default; issue 37's fallback when no calibration
  artifact is given). The source calibrates the keys' thresholds and both codebooks offline
  (16 × 2048 tokens of wikitext2) and keeps them fixed; jbkv calibrates every chunk on its own
  tokens as it is stored: the keys' per-channel thresholds and the codebooks of keys and values
  (the source fits the values' codebook on per-channel normalised calibration data and applies
  it per token; jbkv fits it on the per-token normalised values it codes). A chunk's codes
  depend on that chunk only (causal), and its thresholds, codebook and Q-Norm are stored with it
  and counted.
- **Or from an artifact** (``calibration``: a ``jbkv calibrate`` file,
  :mod:`jbkv_cli.quant.kvquant_calibration`): the same fit, once per layer, on the keys (before
  RoPE where the model's caches can) and values the 16-bit reference commits for a few prompts
  and seeds; a cache's method is bound to its layer's tables (:meth:`KVQuant.at_layer`), which
  are counted once per layer (:meth:`KVQuant.table_nbytes`), not per chunk. The noise model is
  then the artifact's cell variances. With fixed thresholds the entries beyond them vary in
  number per channel; the source lists them all (a sparse matrix of data-dependent size), jbkv
  keeps the in-run list size, the top and bottom ``K`` per channel (:func:`split_keys_fixed`:
  no host read), and codes what lies beyond it clipped at the outer centroids (the source's
  ``--cap_outliers`` clips the same way), with the coded cell's step. The values' ranges stay
  per token. The file's SHA-256 is a field (``calibration_sha256``: the variant record and id
  carry it; a changed file is refused).
- **Fixed outlier counts** (in-run calibration). With thresholds from the chunk itself the outliers of a channel
  (keys) or token (values) are exactly its top and bottom ``K`` entries when values are
  distinct, so the sparse list has a size known from the shape (no host read); tied values at
  a threshold, which the source's comparisons would all take, are split by position.
- **k-means**: plain (KVQuant weights it by the Fisher diagonal of an LM loss, which a video
  model has no counterpart of), initialised at the data's ``(j + ½)/k`` quantiles instead of
  sklearn's seeded k-means++, always ``iters`` rounds (sklearn may stop earlier).
- **First tokens** are the first ``F`` tokens of each stored chunk (the source's row slice of
  one forward, whose first rows are the sequence's attention sink); a video's sink is its
  first chunk, kept exact whole by ``--sink-chunks``. Default 0, as the source's
  ``--first_few_fp16`` default (−1, off); its DBRX checkpoints use 1.
- Thresholds are stored in FP16 rounded outward, so every non-outlier stays in ``[−1, 1]``.
- Not reproduced: ``--cap_outliers``, the NormalFloat (``--nf``) and uniform alternatives, the
  deployment kernels (fused pre-RoPE Q·K on packed codes).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import torch

from jbkv_cli.quant.groupwise import pack_codes, round_fp16, unpack_codes
from jbkv_cli.quant.kmeans import MAX_ITERS
from jbkv_cli.quant.method import KVMethod, Role
from jbkv_cli.quant.nuq import (
    cell_variance,
    encode,
    fit_codebook,
    lower_count,
    lower_count_inclusive,
    percentile,
    qnorm,
    upper_count,
    upper_count_inclusive,
)
from jbkv_cli.quant.tensor import CENTROID, MIXED, QuantizedTensor, compact
from jbkv_cli.utils.fields import option

if TYPE_CHECKING:
    from jbkv_cli.quant.kvquant_calibration import Calibration

LAYOUTS = ("pre-rope", "post-rope")
KVQUANT_BITS = (2, 3, 4)
MAX_FIRST_TOKENS = 2**20
MAX_LAYERS = 4096
DEFAULT_OUTLIERS = 0.01
DEFAULT_ITERS = 50  # the source's KMeans(max_iter=50)
TABLE_DTYPE = torch.float16  # thresholds, codebook, cell variances, Q-Norm


def file_sha256(path: str) -> str:
    """The SHA-256 of a file (hex), read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def _calibration(path: str, sha256: str | None) -> Calibration:
    """A calibration file, read once per (path, digest) (:mod:`~jbkv_cli.quant.kvquant_calibration`)."""
    from jbkv_cli.quant.kvquant_calibration import load_calibration

    return load_calibration(path)


def threshold(f: float) -> float:
    """The source's ``t = 1 − (1 − s)/2`` for sparsity threshold ``s = 1 − f``."""
    return 1.0 - f / 2.0


def exact_dtype(dtype: torch.dtype) -> torch.dtype:
    """What exact entries are kept in: the cache's dtype when 16-bit, else FP16."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16


def codebook_rows(x: torch.Tensor) -> int:
    """Codebooks per chunk: one per batch element of ``[B, Hkv, L, D]`` (pooled over heads,
    tokens and channels, as the source pools a layer's heads), one for fewer dims."""
    return x.shape[0] if x.ndim >= 4 else 1


@dataclass
class OutlierSplit:
    """The dense-and-sparse split of the coded tokens ``y [..., n, D]``: outlier positions
    ``index`` and exact ``value`` along ``dim`` (keys: tokens, ``[..., K, D]``; values: the
    channels of a token, ``[..., n, K]``, of all heads together when ``pooled``: ``[B, n, K]``
    over ``H·D``), and the ranges ``upper``, ``lower`` (FP16, outward) of the non-outliers."""

    index: torch.Tensor
    value: torch.Tensor
    upper: torch.Tensor
    lower: torch.Tensor
    dim: int
    pooled: bool = False

    def scatter(self, t: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``t [..., n, D]`` with the outliers' entries replaced by ``values``."""
        view = token_view(t) if self.pooled else t
        out = view.scatter(self.dim, self.index.long(), values.to(view.dtype))
        return out.unflatten(-1, (t.shape[1], t.shape[3])).transpose(1, 2) if self.pooled else out


def token_view(y: torch.Tensor) -> torch.Tensor:
    """``[B, H, n, D] -> [B, n, H·D]``: each token's channels of every head in one row (the
    source's ``v_proj`` output, whose per-token statistics span the heads)."""
    return y.transpose(1, 2).flatten(-2)


def _index_dtype(n: int) -> torch.dtype:
    return torch.uint8 if n <= 256 else torch.int16 if n <= 32767 else torch.int32


def split_keys(y: torch.Tensor, f: float, exact: torch.dtype) -> OutlierSplit:
    """Keys: per channel over tokens, outliers strictly beyond the ``t`` / ``1 − t``
    percentiles (their fixed counts: :func:`~jbkv_cli.quant.nuq.upper_count`), thresholds the
    percentiles."""
    n = y.shape[-2]
    if n == 0:  # every token of the chunk is exact
        none = y.new_zeros((*y.shape[:-2], 1, y.shape[-1]), dtype=TABLE_DTYPE)
        empty = compact(y.to(exact))  # no view of the chunk kept
        return OutlierSplit(y.new_zeros(y.shape, dtype=torch.uint8), empty, none, none, -2)
    t = threshold(f)
    ys, order = y.float().sort(dim=-2)
    hi, lo = (upper_count(n, t), lower_count(n, t)) if f > 0 else (0, 0)
    pos = torch.cat([order[..., :lo, :], order[..., n - hi :, :]], dim=-2)
    upper = round_fp16(percentile(ys, t, dim=-2).unsqueeze(-2), up=True)
    lower = round_fp16(percentile(ys, 1.0 - t, dim=-2).unsqueeze(-2), up=False)
    value = y.gather(-2, pos).to(exact)
    return OutlierSplit(pos.to(_index_dtype(n)), value, upper, lower, -2)


def split_values(y: torch.Tensor, f: float, exact: torch.dtype) -> OutlierSplit:
    """Values: per token over its channels (of every head of ``[B, H, n, D]``: the source's
    ``v_proj`` rows), outliers at or beyond the ``t`` / ``1 − t`` quantiles (fixed counts:
    :func:`~jbkv_cli.quant.nuq.upper_count_inclusive`); the range is that of the token with its
    outliers replaced by its (lower) median."""
    pooled = y.ndim == 4
    view = token_view(y) if pooled else y
    d = view.shape[-1]
    t = threshold(f)
    ys, order = view.float().sort(dim=-1)
    hi, lo = (upper_count_inclusive(d, t), lower_count_inclusive(d, t)) if f > 0 else (0, 0)
    hi, lo = min(hi, d - 1), min(lo, d - 1 - min(hi, d - 1))  # keep one entry coded
    pos = torch.cat([order[..., :lo], order[..., d - hi :]], dim=-1)
    median = ys[..., (d - 1) // 2 : (d - 1) // 2 + 1]
    top = torch.maximum(ys[..., d - 1 - hi : d - hi], median)
    bottom = torch.minimum(ys[..., lo : lo + 1], median)
    top, bottom = round_fp16(top, up=True), round_fp16(bottom, up=False)
    if pooled:  # [B, n, 1] -> [B, 1, n, 1]: broadcast over the heads
        top, bottom = top.unsqueeze(1), bottom.unsqueeze(1)
    value = view.gather(-1, pos).to(exact)
    return OutlierSplit(pos.to(_index_dtype(d)), value, top, bottom, -1, pooled)


def split_keys_fixed(
    y: torch.Tensor, upper: torch.Tensor, lower: torch.Tensor, f: float, exact: torch.dtype
) -> OutlierSplit:
    """Keys with fixed per-channel thresholds ``upper``, ``lower`` ``[H, D]`` (a calibration
    artifact's) as their ranges. The sparse list keeps the in-run counts (the top and bottom
    ``K`` of each channel, :func:`split_keys`): a size known from the shape, no host read. An
    entry beyond the thresholds that the list cannot hold (a channel with more than ``K``) is
    coded at the nearest centroid, clipped as the source's ``--cap_outliers`` clips; a listed
    entry within them is kept exact all the same."""
    n = y.shape[-2]
    if n == 0:
        return split_keys(y, f, exact)
    heads, dim = upper.shape
    shape = (*(1,) * (y.ndim - 3), heads, 1, dim) if y.ndim >= 3 else (1, dim)
    split = split_keys(y, f, exact)
    split.upper = upper.to(y.device, TABLE_DTYPE).reshape(shape)
    split.lower = lower.to(y.device, TABLE_DTYPE).reshape(shape)
    return split


def normalise(y: torch.Tensor, split: OutlierSplit) -> tuple[torch.Tensor, torch.Tensor]:
    """``z = (y − o)/r`` (module docstring; 0 where ``r = 0``) and the weight of each entry
    in the codebook's fit, 0 at outliers: ``[..., n, D]`` float32 each."""
    upper, lower = split.upper.float(), split.lower.float()
    half = (upper - lower) / 2
    z = torch.where(half > 0, (y.float() - (upper + lower) / 2) / half.clamp_min(1e-30), 0.0)
    z = z.expand(y.shape) if z.shape != y.shape else z
    keep = split.scatter(torch.ones_like(z), torch.zeros_like(split.value, dtype=z.dtype))
    return z, keep


@dataclass(frozen=True)
class FixedTables:
    """One layer's and role's calibrated tables: ``codebook``, ``cell_var`` ``[2^b]`` and, for
    keys, per-channel thresholds ``upper``, ``lower`` ``[H, D]`` (None for values, whose ranges
    are per token, online)."""

    codebook: torch.Tensor
    cell_var: torch.Tensor
    upper: torch.Tensor | None = None
    lower: torch.Tensor | None = None


@dataclass
class KVQuantTensor(QuantizedTensor):
    """What KVQuant stores for one chunk (module docstring): ``first`` tokens exact, then the
    coded tokens' packed ``codes``, the split (ranges and sparse outliers), the ``codebook`` and
    ``cell_var`` ``[R, 2^b]`` and Q-Norm's ``norm`` ``[R, 2]`` (None: off)."""

    first: torch.Tensor
    codes: torch.Tensor
    split: OutlierSplit
    codebook: torch.Tensor
    cell_var: torch.Tensor
    norm: torch.Tensor | None
    shape: torch.Size
    dtype: torch.dtype
    bits: int
    fixed: bool = False  # the tables came from a calibration artifact (not stored per chunk)

    def stored(self) -> dict[str, torch.Tensor]:
        """Per-chunk storage; with ``fixed`` tables the codebook, cell variances and the keys'
        thresholds belong to the artifact (counted once per layer there), the values' per-token
        ranges stay per chunk."""
        out = {"first": self.first, "codes": self.codes}
        if not (self.fixed and self.split.dim == -2):  # keys' fixed thresholds: the artifact's
            out |= {"upper": self.split.upper, "lower": self.split.lower}
        if not self.fixed:
            out |= {"codebook": self.codebook, "cell_var": self.cell_var}
        out |= {"outlier_index": self.split.index, "outlier_value": self.split.value}
        return out if self.norm is None else {**out, "qnorm": self.norm}

    @property
    def noise_model(self) -> str:  # type: ignore[override]
        return CENTROID if self.norm is None else MIXED

    @property
    def coded_shape(self) -> torch.Size:
        return torch.Size((*self.shape[:-2], self.shape[-2] - self.first.shape[-2], self.shape[-1]))

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """``[..., n, D]`` -> ``[R, ·]`` (one row per codebook)."""
        return t.reshape(self.codebook.shape[0], -1)

    def indices(self) -> torch.Tensor:
        """The codebook index of every coded entry ``[..., L−F, D]`` (int64)."""
        return unpack_codes(self.codes, self.bits, self.shape[-1]).long()

    def _per_code(self, table: torch.Tensor) -> torch.Tensor:
        """``table [R, k]`` read at every coded entry: ``[..., n, D]`` float32."""
        codes = self.indices()
        return table.float().gather(-1, self._rows(codes)).reshape(codes.shape)

    def _scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-Norm's ``(s, o_q)`` broadcast over ``[R, ·]`` rows (1, 0 when off)."""
        if self.norm is None:
            one = torch.ones(self.codebook.shape[0], 1, device=self.codes.device)
            return one, torch.zeros_like(one)
        n = self.norm.float()
        return n[:, :1], n[:, 1:]

    def _exact(self, coded: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``coded`` with the outliers' entries replaced by ``values``."""
        return self.split.scatter(coded, values)

    def _with_first(self, coded: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        return torch.cat([first.to(coded.dtype), coded], dim=-2)

    def dequantize(self) -> torch.Tensor:
        s, o = self._scale()
        shape = self.coded_shape
        z = self._rows(self._per_code(self.codebook)) * s + o
        upper, lower = self.split.upper.float(), self.split.lower.float()
        y = z.reshape(shape) * ((upper - lower) / 2) + (upper + lower) / 2
        y = self._exact(y, self.split.value.float())
        return self._with_first(y, self.first.float()).to(self.dtype)

    @property
    def step(self) -> torch.Tensor:
        """``r · s · √(12 v_code)`` per coded entry, 0 at outliers and first tokens:
        ``[..., L, D]`` float32."""
        s, _ = self._scale()
        shape = self.coded_shape
        cell = (12 * self._rows(self._per_code(self.cell_var))).sqrt() * s
        half = (self.split.upper.float() - self.split.lower.float()) / 2
        step = self._exact(cell.reshape(shape) * half, torch.zeros_like(self.split.value.float()))
        return self._with_first(step, torch.zeros_like(self.first, dtype=torch.float32))

    @property
    def noise_step2(self) -> torch.Tensor | None:
        """The unshrink rule with ``a = 1`` (module docstring): ``−step²`` (None if mixed)."""
        return None if self.norm is not None else self.excess_step2

    def outlier_mask(self) -> torch.Tensor:
        """Which entries of the coded tokens ``[..., L−F, D]`` are in the sparse list."""
        mask = torch.zeros(self.coded_shape, dtype=torch.bool, device=self.codes.device)
        return self.split.scatter(mask, torch.ones_like(self.split.index, dtype=torch.bool))

    @property
    def num_centroids(self) -> int:
        return self.codebook.shape[-1]


@dataclass(frozen=True)
class KVQuant(KVMethod):
    """``outliers``: the fraction kept exact as a sparse list (the source's ``1 −
    sparsity_threshold``; 0: none, min-max ranges); ``first_tokens``: each chunk's first tokens
    kept exact; ``qnorm``: Q-Norm; ``iters``: k-means rounds; ``layout``: keys cached before
    RoPE (the source) or after (None: before, where the model's cache can, else after);
    ``calibration``: a ``jbkv calibrate`` file of fixed tables (None: per chunk), with its
    ``calibration_sha256`` and the ``layer`` a cache binds (both set by jbkv).
    ``group_size`` is not used (steps per channel)."""

    name: ClassVar[str] = "kvquant"
    summary: ClassVar[str] = (
        "after KVQuant: non-uniform k-means codes calibrated per chunk, keys per channel "
        "before RoPE, values per token, 1% outliers kept exact as a sparse list"
    )
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = KVQUANT_BITS
    noise_model: ClassVar[str] = CENTROID
    UNUSED_OPTIONS: ClassVar[tuple[str, ...]] = ("group_size",)

    outliers: float = option(DEFAULT_OUTLIERS, "float", lo=0, hi=0.5, note="fraction exact")
    first_tokens: int = option(0, "int", lo=0, hi=MAX_FIRST_TOKENS)
    qnorm: bool = option(False, "bool")
    iters: int = option(DEFAULT_ITERS, "int", lo=1, hi=MAX_ITERS)
    layout: str | None = option(
        None, "str", choices=LAYOUTS, optional=True, note="keys; none: pre-rope where the cache can"
    )
    calibration: str | None = option(
        None, "str", optional=True, note="a jbkv calibrate file; none: per chunk"
    )
    calibration_sha256: str | None = option(None, "str", optional=True, cli=False)
    layer: int | None = option(None, "int", lo=0, hi=MAX_LAYERS, optional=True, cli=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.calibration is None:
            if self.calibration_sha256 is not None or self.layer is not None:
                raise ValueError("kvquant.calibration_sha256 and layer go with a calibration")
            return
        digest = file_sha256(self.calibration)
        if self.calibration_sha256 not in (None, digest):
            raise ValueError(
                f"calibration {self.calibration} changed: sha256 {digest[:12]}…, recorded "
                f"{self.calibration_sha256[:12]}…"
            )
        object.__setattr__(self, "calibration_sha256", digest)
        cal = _calibration(self.calibration, digest)
        made = cal.meta.get("bits")
        if made != str(self.bits):
            raise ValueError(
                f"calibration {self.calibration} was made for {made} bits, not {self.bits}"
            )
        layout = cal.meta.get("layout")
        if self.layout is not None and layout != self.layout:
            raise ValueError(
                f"calibration {self.calibration} holds {layout} keys, not {self.layout}"
            )

    def for_model(
        self, model: str, chunk_tokens: int | None = None, *, pruned: bool = False
    ) -> KVQuant:
        """Itself, once a calibration file is checked to be ``model``'s (``ValueError``)."""
        if self.calibration is not None:
            made = _calibration(self.calibration, self.calibration_sha256).meta.get("model")
            if str(made).partition(":")[0] != model.partition(":")[0]:
                from jbkv_cli.quant.kvquant_calibration import CalibrationMismatch

                raise CalibrationMismatch(
                    f"calibration {self.calibration} was made for model {made}, not {model}"
                )
        return self

    def at_layer(self, layer: int) -> KVQuant:
        """Bound to ``layer``'s tables when calibrated by a file (itself otherwise)."""
        if self.calibration is None:
            return self
        cal = _calibration(self.calibration, self.calibration_sha256)
        if layer >= len(cal.layers):
            raise ValueError(
                f"calibration {self.calibration} has {len(cal.layers)} layers, no layer {layer}"
            )
        return replace(self, layer=layer)

    def check(self, head_dim: int) -> None:
        per_byte = 8 if self.bits == 3 else 8 // self.bits
        if head_dim % per_byte:
            raise ValueError(f"INT{self.bits} packing needs a head dim divisible by {per_byte}")

    def step_groups(self, head_dim: int, role: Role = "key") -> int:
        return head_dim

    def key_layout(self) -> str:
        return self.layout or "pre-rope"

    def without_pre_rope(self) -> KVQuant | None:
        """Post-RoPE keys where the layout was left to the model (None: pre-rope asked for)."""
        if self.layout is None:
            return replace(self, layout="post-rope")
        return self if self.layout == "post-rope" else None

    def table_nbytes(self, role: Role) -> int:
        """The calibration's tables of this layer and ``role``, counted once per layer."""
        if self.calibration is None or self.layer is None:
            return 0
        return _calibration(self.calibration, self.calibration_sha256).nbytes(self.layer, role)

    def _quantize(self, x: torch.Tensor, role: Role) -> KVQuantTensor:
        if self.calibration is None:
            return self.quantize_fixed(x, role, None)
        if self.layer is None:
            raise ValueError(
                f"{self.label}: a calibrated method is bound to a layer first (at_layer): this "
                "cache is not one of a model's layer stack"
            )
        cal = _calibration(self.calibration, self.calibration_sha256)
        return self.quantize_fixed(x, role, cal.tables(self.layer, role))

    def quantize_fixed(
        self, x: torch.Tensor, role: Role, tables: FixedTables | None
    ) -> KVQuantTensor:
        """Store ``x``: calibrated on the chunk itself (``tables`` None, the default), or with
        a calibration artifact's fixed ``tables`` (keys' thresholds, the role's codebook and
        cell variances; :mod:`jbkv_cli.quant.kvquant_calibration`), which are then not stored
        with the chunk."""
        exact = exact_dtype(x.dtype)
        f = min(self.first_tokens, x.shape[-2])
        first, y = compact(x[..., :f, :].to(exact)), x[..., f:, :]  # no view of x kept
        rows, k = codebook_rows(x), 1 << self.bits
        if role == "key" and tables is not None:
            split = split_keys_fixed(y, tables.upper, tables.lower, self.outliers, exact)
        else:
            split = (split_keys if role == "key" else split_values)(y, self.outliers, exact)
        z, keep = normalise(y, split)
        zr, wr = z.reshape(rows, -1), keep.reshape(rows, -1)
        if tables is not None:
            book = tables.codebook.to(x.device, TABLE_DTYPE).reshape(1, k).expand(rows, k)
        elif zr.shape[-1] == 0:  # every token exact: nothing to fit
            book = torch.zeros(rows, k, device=x.device).to(TABLE_DTYPE)
        else:
            book = fit_codebook(zr, wr, k, self.iters).to(TABLE_DTYPE)
        codes = encode(zr, book) if zr.shape[-1] else zr.to(torch.uint8)
        if tables is not None:
            var = tables.cell_var.to(x.device, TABLE_DTYPE).reshape(1, k).expand(rows, k)
        else:
            var = cell_variance(zr, wr, book) if zr.shape[-1] else book.float()
        norm = None
        if self.qnorm:
            recon = book.float().gather(-1, codes.long())
            s, o = qnorm(zr, wr, recon)
            norm = torch.cat([s, o], dim=-1).to(TABLE_DTYPE)
        return KVQuantTensor(
            first, pack_codes(codes.reshape(y.shape), self.bits), split, book,
            var.to(TABLE_DTYPE), norm, x.shape, x.dtype, self.bits, tables is not None,
        )  # fmt: skip

    def extra_id(self) -> list[str]:
        parts = (
            [] if self.outliers == DEFAULT_OUTLIERS else [f"o{self.outliers:g}".replace(".", "p")]
        )
        parts += [f"first{self.first_tokens}"] if self.first_tokens else []
        parts += ["qnorm"] if self.qnorm else []
        parts += [f"it{self.iters}"] if self.iters != DEFAULT_ITERS else []
        parts += [f"cal{self.calibration_sha256[:8]}"] if self.calibration_sha256 else []
        return parts + ([self.layout.replace("-", "")] if self.layout is not None else [])
