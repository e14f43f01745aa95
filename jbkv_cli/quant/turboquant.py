"""After TurboQuant (Zandieh, Daliri, Hadian, Mirrokni, arXiv 2504.19874): rotate, then optimal
scalar codebooks per coordinate; the inner-product variant adds a 1-bit QJL sketch.

Per cached token ``x ∈ R^d`` (keys and values alike), with ``Π`` a random orthogonal matrix and
the ``b``-bit Lloyd–Max codebook ``c`` of :mod:`jbkv_cli.quant.lloyd_max` for a coordinate of a
uniform point on ``S^{d−1}``:

- ``turboquant-mse`` (the paper's Algorithm 1, ``TurboQuant_mse``)::

      n = ‖x‖ (FP16),  y = Π x / n,  idx_c = argmin_k |y_c − c_k|  (b bits, packed)
      x̂ = n · Πᵀ c[idx]

- ``turboquant-prod`` (Algorithm 2, ``TurboQuant_prod``; ``b`` bits in total): the MSE variant at
  ``b − 1`` bits, then the residual ``r = x − x̂_mse`` is sketched with ``S ∈ R^{d×d}``, entries
  i.i.d. ``N(0, 1)``::

      γ = ‖r‖ (FP16),  z = sign(S r) ∈ {±1}^d (1 bit each, packed; sign(0) = +1)
      x̂ = x̂_mse + (√(π/2) / d) · γ · Sᵀ z

  ``E_S[x̂] = x``: inner products ``⟨q, x̂⟩`` are unbiased (the paper's Theorem 2).

Storage (counted from the stored tensors): ``b + 16/d`` bits per element (MSE: codes + norm),
``b + 32/d`` (prod: codes + signs + two norms); 2.25 and 2.5 at INT2 on a head dim of 64.

Noise models (next to ``step``, see :mod:`jbkv_cli.quant.noise`), in the rotated basis
(``rotation`` is ``Π``, so the correction uses ``Π q``); nothing extra is stored for them:

- MSE: the Lloyd–Max centroid condition makes each coordinate's error uncorrelated with its
  stored value (**centroid** type): coordinate ``c`` of token ``i`` keeps the variance of its
  cell, ``σ²_ic = n_i² · Var(Y | idx_ic)`` (from the codebook). Over the random rotation the
  quantizer shrinks: ``E[x̂ | x] = (1 − ρ) x`` with ``ρ = d · E[(Y − c(Y))²]`` the codebook's
  relative MSE (0.115 at 2 bits, d = 64; by symmetry ``E_Π[x̂]`` is parallel to ``x``, with
  ``E[c(Y) Y] = E[c(Y)²] = 1/d − mse``; for one seeded rotation this holds approximately);
  so the unshrink rule reads ``unshrink = 1/(1 − ρ)`` and the unshrunk noise's variance
  ``ρ/(1 − ρ) · n_i²/d`` (``noise_step2`` is 12 times it), the excess rule ``excess_step2 =
  −step²``, the cells' variance with the centroid's sign (:mod:`jbkv_cli.attention.correction`).
- prod: ``x̂ − x = r̃ − r`` has mean 0 given ``x`` (**additive**), covariance
  ``(γ²/d)((π/2) I − r̂ r̂ᵀ)``; its average diagonal ``σ² = (γ²/d)(π/2 − 1/d)`` is every
  coordinate's variance (``noise_step2 = 12 σ²``; the ``r̂ r̂ᵀ`` term is spread evenly: jbkv
  does not store ``r̂``).

``step`` reports the uniform step with the error's variance per group, ``√(12 σ²_j)`` (MSE:
``σ²_j`` the mean cell variance of the group), so ``taylor`` and ``exact`` (uniform-noise forms)
and the noise-model diagnostics run on TurboQuant unchanged.

Choices where the paper leaves room, and why this is "after TurboQuant":

- **Rotation**: a dense Haar-random ``Π`` from the QR decomposition of a seeded Gaussian matrix
  (signs fixed by ``diag(R)``; float64 on the CPU, ``seed`` option, default 0), one per head dim
  and seed, shared by every token, head and layer; ``S`` is drawn next from the same generator.
  Neither is stored (regenerated from the seed), as QuaRot's rotation is not.
- **Norms**: the paper quantizes unit vectors and says to store the norm in floating point; jbkv
  stores ``‖x‖`` and ``γ`` as FP16 per token (``ValueError`` beyond FP16's range).
- **Codebook**: the exact sphere-coordinate density for the model's head dim (not its Gaussian
  limit), computed by the deterministic Lloyd–Max routine in :mod:`~jbkv_cli.quant.lloyd_max`.
- **Values** are stored by the same variant as keys.
- ``group_size`` does not change what is stored: it only sets the coordinate groups of the noise
  model the correction reads (``D / group_size`` step columns).
- Not reproduced: the paper's mixed-precision outlier-channel split (its 2.5- and 3.5-bit KV
  settings), kernels, and its nearest-neighbour experiments.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from jbkv_cli.quant.groupwise import check_group_size, pack_codes, unpack_codes
from jbkv_cli.quant.lloyd_max import Codebook, lloyd_max
from jbkv_cli.quant.method import KVMethod, Role
from jbkv_cli.quant.tensor import ADDITIVE, CENTROID, QuantizedTensor
from jbkv_cli.utils.fields import MAX_SEED, option
from jbkv_cli.utils.host_reads import device_copy, require

NORM_DTYPE = torch.float16
NORM_MAX = 65504.0
TURBOQUANT_BITS = (2, 3, 4)


@dataclass(frozen=True)
class RandomOrthogonal:
    """A seeded Haar-random orthogonal ``Π`` of ``dim`` channels and the QJL matrix ``S`` drawn
    after it (module docstring); ``rotate(x) = Π x``, ``unrotate(y) = Πᵀ y`` per row."""

    dim: int
    seed: int = 0
    matrix_: torch.Tensor = field(init=False, repr=False, compare=False)
    sketch: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        a = torch.randn(self.dim, self.dim, generator=gen, dtype=torch.float64)
        q, r = torch.linalg.qr(a)
        signs = torch.sign(torch.diagonal(r))
        q = q * torch.where(signs == 0, 1.0, signs)  # Haar: fix the QR's column signs
        s = torch.randn(self.dim, self.dim, generator=gen, dtype=torch.float64)
        object.__setattr__(self, "matrix_", q.float())
        object.__setattr__(self, "sketch", s.float())

    def matrix(self) -> torch.Tensor:
        """The dense ``[dim, dim]`` matrix ``Π``."""
        return self.matrix_

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """``x ↦ Π x`` over the last dim, in float32, returned in ``x.dtype``."""
        self._check(x)
        return (x.float() @ device_copy(self.matrix_, x.device).T).to(x.dtype)

    def unrotate(self, y: torch.Tensor) -> torch.Tensor:
        """``y ↦ Πᵀ y`` (the inverse rotation)."""
        self._check(y)
        return (y.float() @ device_copy(self.matrix_, y.device)).to(y.dtype)

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.dim:
            raise ValueError(f"rotation expects last dim {self.dim}, got {x.shape[-1]}")


@functools.lru_cache(maxsize=64)
def random_orthogonal(dim: int, seed: int = 0) -> RandomOrthogonal:
    """One shared :class:`RandomOrthogonal` per (dim, seed) (segments compare rotations by id)."""
    return RandomOrthogonal(dim, seed)


def _to_norm(x: torch.Tensor, what: str) -> torch.Tensor:
    worst = x.max() if x.numel() else x.new_zeros(())
    require(worst <= NORM_MAX, f"a {what} {{value:.4g}} exceeds FP16's range ({NORM_MAX:g})", worst)
    return x.to(NORM_DTYPE)


@dataclass
class TurboQuantMSETensor(QuantizedTensor):
    """``turboquant-mse``: packed codes ``[..., L, D·b/8]`` of ``Π x/‖x‖`` and FP16 norms
    ``[..., L, 1]``; ``bits`` of the codebook, ``group_size`` of the noise model."""

    codes: torch.Tensor
    norm: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    bits: int
    group_size: int
    rotation: RandomOrthogonal
    noise_model: ClassVar[str] = CENTROID  # Lloyd–Max centroids: s = −Var(cell)

    def stored(self) -> dict[str, torch.Tensor]:
        return {"codes": self.codes, "norm": self.norm}

    @property
    def codebook(self) -> Codebook:
        return lloyd_max(self.shape[-1], self.bits)

    def _indices(self) -> torch.Tensor:
        return unpack_codes(self.codes, self.bits, self.shape[-1]).long()

    def rotated_mse(self) -> torch.Tensor:
        """``n · c[idx]``: the MSE stage's reconstruction in the rotated basis (float32)."""
        centroids = device_copy(self.codebook.centroids, self.codes.device, torch.float32)
        return centroids[self._indices()] * self.norm.float()

    def coordinate_var(self) -> torch.Tensor:
        """``σ²_ic = n_i² Var(Y | idx_ic)`` ``[..., L, D]`` (rotated basis, float32)."""
        var = device_copy(self.codebook.cell_var, self.codes.device, torch.float32)
        return var[self._indices()] * self.norm.float().square()

    def _group_var(self) -> torch.Tensor:
        groups = self.shape[-1] // self.group_size
        return self.coordinate_var().unflatten(-1, (groups, -1)).mean(-1)

    @property
    def step(self) -> torch.Tensor:
        """The uniform step with each group's error variance, ``√(12 σ²_j)`` ``[..., L, G]``."""
        return (12 * self._group_var()).sqrt()

    @property
    def relative_mse(self) -> float:
        """``ρ = d · E[(Y − c(Y))²]``: the codebook's MSE relative to ``‖x‖²``."""
        return self.shape[-1] * self.codebook.mse

    @property
    def unshrink(self) -> torch.Tensor:
        """``1/(1 − ρ)`` per token ``[..., L, 1]``: ``E[x̂ | x] = (1 − ρ) x`` (module docstring)."""
        return torch.full_like(self.norm, 1.0 / (1.0 - self.relative_mse), dtype=torch.float32)

    @property
    def noise_step2(self) -> torch.Tensor:
        """``12 · ρ/(1 − ρ) · n_i²/d`` per coordinate: 12 × the unshrunk key's noise variance."""
        rho, d = self.relative_mse, self.shape[-1]
        var = self.norm.float().square() * (12 * rho / (1.0 - rho) / d)  # [..., L, 1]
        return var.expand(*var.shape[:-1], d // self.group_size)

    def dequantize(self) -> torch.Tensor:
        return self.rotation.unrotate(self.rotated_mse()).to(self.dtype)


@dataclass
class TurboQuantProdTensor(TurboQuantMSETensor):
    """``turboquant-prod``: the MSE stage at ``bits`` (= b − 1) plus packed QJL signs ``[..., L,
    D/8]`` and FP16 residual norms ``γ [..., L, 1]``."""

    signs: torch.Tensor = None  # type: ignore[assignment]
    residual_norm: torch.Tensor = None  # type: ignore[assignment]
    noise_model: ClassVar[str] = ADDITIVE  # unbiased sketch: E[x̂ | x] = x

    def stored(self) -> dict[str, torch.Tensor]:
        return {**super().stored(), "qjl_signs": self.signs, "residual_norm": self.residual_norm}

    def _group_var(self) -> torch.Tensor:
        d = self.shape[-1]
        var = self.residual_norm.float().square() * ((math.pi / 2 - 1 / d) / d)  # [..., L, 1]
        return var.expand(*var.shape[:-1], d // self.group_size)

    @property
    def unshrink(self) -> None:
        return None  # unbiased: a = 1

    @property
    def noise_step2(self) -> torch.Tensor:
        return 12 * self._group_var()

    def sketch_estimate(self) -> torch.Tensor:
        """``(√(π/2)/d) γ Sᵀ z`` ``[..., L, D]``: the residual's unbiased estimate (float32)."""
        d = self.shape[-1]
        z = unpack_codes(self.signs, 1, d).float() * 2 - 1
        s = device_copy(self.rotation.sketch, self.codes.device)
        return (math.sqrt(math.pi / 2) / d) * self.residual_norm.float() * (z @ s)

    def dequantize(self) -> torch.Tensor:
        mse = self.rotation.unrotate(self.rotated_mse())
        return (mse + self.sketch_estimate()).to(self.dtype)


@dataclass(frozen=True)
class TurboQuantMSE(KVMethod):
    """Random rotation + per-coordinate Lloyd–Max codes (``bits`` per coordinate), FP16 norm per
    token; ``seed`` of the rotation; ``group_size``: coordinates per noise-model group."""

    name: ClassVar[str] = "turboquant-mse"
    summary: ClassVar[str] = (
        "after TurboQuant (MSE): random rotation, Lloyd–Max codes per coordinate, FP16 norm"
    )
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = TURBOQUANT_BITS
    noise_model: ClassVar[str] = CENTROID
    sketch: ClassVar[bool] = False

    seed: int = option(0, "int", lo=0, hi=MAX_SEED)

    def check(self, head_dim: int) -> None:
        check_group_size(head_dim, self.group_size)
        if head_dim < 8 or head_dim % 8:
            raise ValueError(f"{self.name} packs codes in bytes: head dim must be a multiple of 8")

    @property
    def mse_bits(self) -> int:
        return self.bits - 1 if self.sketch else self.bits

    def _quantize(self, x: torch.Tensor, role: Role) -> TurboQuantMSETensor:
        rot = random_orthogonal(x.shape[-1], self.seed)
        xf = x.float()
        norm = _to_norm(xf.norm(dim=-1, keepdim=True), "token norm")
        n = norm.float()
        unit = torch.where(n > 0, xf / n.clamp_min(1e-30), 0.0)
        book = lloyd_max(x.shape[-1], self.mse_bits)
        idx = book.encode(rot.rotate(unit))
        mse = TurboQuantMSETensor(
            pack_codes(idx, self.mse_bits), norm, x.shape, x.dtype, self.mse_bits,
            self.group_size, rot,
        )  # fmt: skip
        if not self.sketch:
            return mse
        r = xf - rot.unrotate(mse.rotated_mse())
        gamma = _to_norm(r.norm(dim=-1, keepdim=True), "residual norm")
        signs = (r @ device_copy(rot.sketch, x.device).T >= 0).to(
            torch.uint8
        )  # sign(S r), sign(0) = +1
        return TurboQuantProdTensor(
            mse.codes, norm, x.shape, x.dtype, self.mse_bits, self.group_size, rot,
            pack_codes(signs, 1), gamma,
        )  # fmt: skip

    def extra_id(self) -> list[str]:
        return [f"ts{self.seed}"] if self.seed else []


@dataclass(frozen=True)
class TurboQuantProd(TurboQuantMSE):
    """:class:`TurboQuantMSE` at ``bits − 1`` plus a 1-bit QJL sketch of the residual and its
    FP16 norm: unbiased inner products."""

    name: ClassVar[str] = "turboquant-prod"
    summary: ClassVar[str] = (
        "after TurboQuant (inner product): MSE codes at b−1 bits + 1-bit QJL sketch of the residual"
    )
    noise_model: ClassVar[str] = ADDITIVE
    sketch: ClassVar[bool] = True
