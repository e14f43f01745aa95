"""The Jensen-bias correction (arXiv 2605.26266): what to subtract from cached-key scores.

A cached key quantized with per-group steps ``Δ_ij`` carries uniform noise
``ε_ic ~ U[−Δ/2, Δ/2]``, so its score ``ŝ_i = s_i + δ_i`` has ``E[δ_i] = 0`` but

    E[exp(δ_i)] = Π_c sinh(α_ic) / α_ic > 1,     α_ic = τ q_c Δ_i,g(c) / 2,

which inflates the cached tokens' share of the softmax. Subtracting ``b_i`` from ``ŝ_i`` removes
it in expectation:

    exact:   b_i = Σ_c log(sinh α_ic / α_ic)
    taylor:  b_i = (τ²/24) Σ_j Δ_ij² ‖q_j‖²      (second order; q_j = the query on group j)

Shapes: ``q [..., Hq, Lq, D]``, ``step [..., Hkv, Lk, G]`` with ``G = D/g``; GQA maps query
head ``h`` to KV head ``h // (Hq/Hkv)``. With a rotation ``R`` the noise lives in the rotated
basis, so ``q`` is replaced by ``R q`` before grouping.

**Not every quantizer adds noise: the signed correction.** Both forms above assume *additive*
noise, ``k̂ = k + e`` with ``e`` independent of ``k``. Write ``e = k̂ − k`` for any method and
``w_i`` for the softmax of the true scores over the cached tokens. The shift of the cached
log-partition is

    Δ log Z = log Σ_i exp(τ q·k̂_i) − log Σ_i exp(τ q·k_i) = log Σ_i w_i exp(τ q·e_i)
            ≈ τ E_w[q·e] + (τ²/2) Var_w(q·e)                  (second order in τ q·e)

- *Additive* (``e`` independent of ``k``): the weights ``w`` do not see ``e``, so ``E_w[q·e] =
  E[q·e] = 0`` and ``Δ log Z ≈ (τ²/2) qᵀ Var(e) q > 0``: ``E exp(q·k̂)`` is inflated; subtract
  ``b`` (for uniform noise ``Var(e) = Δ²/12`` per channel: the paper's taylor ``b``).
- *Centroid type* (``k = k̂ + e'``, ``e' = −e`` uncorrelated with the stored ``k̂``: Lloyd–Max
  codebooks, k-means centroids, TurboQuant's MSE variant): the same sum written from the stored
  side, ``Δ log Z = −log Σ_i ŵ_i exp(τ q·e'_i)`` with ``ŵ`` the softmax of the stored scores,
  which do not see ``e'``; so ``Δ log Z ≈ −(τ²/2) qᵀ Var(e') q < 0``: the true partition sum
  ``E exp(q·(k̂ + e')) ≥ exp(q·k̂)``, the stored keys *under*-state it, and the variance term must
  be *added*. Subtracting ``b`` doubles the error.
- *In general* the weights tilt the key distribution along ``q``; to first order in the tilt
  ``E_w[q·e] ≈ q·E[e] + τ qᵀ Cov(e, k) q`` (for Gaussian keys Stein's lemma gives this
  first-order coefficient exactly, ``Cov(e, k) = E[∂e/∂k] Var(k)``; the higher orders of the
  tilt remain unless ``e`` is linear in ``k``), and ``Var(e) = Cov(e, k̂) − Cov(e, k)``, so

      Δ log Z ≈ τ q·E[e] + (τ²/2) qᵀ [Cov(e, k̂) + Cov(e, k)] q
              = τ q·E[e] + (τ²/2) qᵀ [Var(k̂) − Var(k)] q,

  ``+Var(e)`` for additive noise, ``−Var(e')`` for centroid noise, and for a *mixed* quantizer
  (a dead zone shrinks small values to 0, the outer codes round outward) whatever its error
  energy ``‖e‖² = e·k̂ − e·k`` splits into: the additive part ``e·k̂`` and the centroid part
  ``−e·k``.

*The excess rule* takes this second-order term as it stands, per channel: ``ŝ_i − b_i`` with
``b_i = (τ²/2) Σ_j s_ij ‖q_j‖²``, ``s = Var(k̂) − Var(k)`` (additive: ``+Δ²/12``, taylor's ``b``;
centroid: ``−Var(cell)``, so the variance term is added; mixed: measured).

*The unshrink rule.* A per-coordinate codebook satisfies the centroid condition coordinate by
coordinate, not jointly: real keys are correlated across coordinates (and have a mean), and
then ``Cov(e'_c, k̂_c') ≠ 0`` for ``c ≠ c'``, which a per-channel ``s`` cannot express. A model
that keeps those terms is the regression on the true key, ``k̂ = a k + n`` with ``n``
independent of ``k``: for TurboQuant-MSE ``E[k̂ | k] = (1 − ρ) k`` on average over its random
rotation (``ρ`` the codebook's relative MSE, :mod:`jbkv_cli.quant.turboquant`); for the one
seeded rotation a run uses it holds only approximately (each key's gain scatters around
``1 − ρ``). Where the model holds, ``u k̂ = k + n/a`` (``u = 1/a``) is additive again, and to
second order

    log Σ_i exp(u τ q·k̂_i − (τ²/2) qᵀ Var(n/a) q) ≈ log Σ_i exp(τ q·k_i),

whatever the keys' covariance and mean; how well a quantizer fits the linear model decides how
much is left, and unshrinking multiplies the stored keys' noise by ``u`` too. Check on isotropic
keys (``Var(k) = σ²I``, mean score ``μ``, ``V = τ²σ²‖q‖²``): the true scores have variance
``V``, the stored ones ``ŝ = a s + m`` have ``(1 − ρ)²V + ρ(1 − ρ)V = (1 − ρ)V``, so ``Δ log Z
≈ −ρμ − ρV/2``; the corrected scores ``u ŝ − ρV/(2(1 − ρ))`` have mean ``μ − ρV/(2(1 − ρ))``
and variance ``V/(1 − ρ)``, i.e. the log-partition of the true ones: for zero-mean keys the
rule *adds* ``ρV/2 = (τ²/2) qᵀ Var(e') q``, what the excess rule adds. For keys whose variance
is concentrated along ``q`` the shift is ``−ρ(2 − ρ)(τ²/2) qᵀ Var(k) q`` (plus the mean term
``−ρ τ q·E[k]``), which a per-channel variance cannot express (on the embedded model's keys,
TurboQuant-MSE at INT2: measured shift −0.40, this model −0.41, the per-coordinate cell
variance alone −0.10; ``docs/corrections.md``).

So the signed rules score every cached key as

    excess:    τ q·k̂_i − b_i,         b_i = (τ²/24) Σ_j w_ij ‖q_j‖²,  w = 12 s
    unshrink:  u_i τ q·k̂_i − b_i,     b_i = (τ²/24) Σ_j w_ij ‖q_j‖²,  w = 12 v

with ``s`` and ``v`` (the variance of ``u k̂ − k``) per channel of group ``j``, carried in units
of a uniform step² (``excess_step2`` / ``noise_step2``) from the method's declared noise model
(:mod:`jbkv_cli.quant.noise`): additive noise gives ``u = 1``, ``w = Δ²`` under both (then
``signed`` *is* ``taylor``, operation for operation, so bit for bit); centroid noise
(TurboQuant-MSE, from its codebook and stored norms, nothing extra stored) ``w = −Δ²`` (excess)
or ``u = 1/(1 − ρ)``, ``v = ρ/(1 − ρ)·‖k‖²/d`` (unshrink); mixed noise is measured when the
chunk is stored (QVG, QuantWM: per chunk, head and group ``κ_j = s_j / mean(Δ²/12)``, FP8,
counted in the bytes, ``w = κ_j Δ_ij²``, negative where the centroid part wins; the unshrink rule
also measures the gain ``a`` per chunk and head, FP16, and ``κ`` of ``v``). Both terms are
bilinear in ``(q, k̂)``: the fused kernel carries ``b`` in the same ``G`` extra channels as
taylor and ``u`` as a scale of the cached keys. ``signed`` reads, per declared noise model, the
rule that left the smaller attention-output error where the two differ
(:data:`~jbkv_cli.quant.tensor.DECLARED_RULE`; measured in ``docs/corrections.md``); the other
rule is its ablation. Not corrected: the first-order term ``τ q·E[e]`` of a biased additive
quantizer, and terms beyond second order (the diagnostics measure what is left:
:mod:`jbkv_cli.attention.partition`).

Corrections by name (:data:`CORRECTIONS`), each a small frozen :class:`Correction`:

- ``none``: scores as the quantized keys give them.
- ``taylor`` (default): subtract the second-order bias; a bilinear form, so it rides inside any
  attention kernel as extra channels (:func:`augment_taylor`).
- ``exact``: subtract ``Σ_c log(sinh α/α)``.
- ``signed``: each method's declared noise model under its rule (above; the same fused form as
  taylor).
- ``signed-excess``, ``signed-unshrink`` (ablations of ``signed``): one rule for every method.
- ``bias-only`` (an ablation): keep the cache in full precision but *add* the exact bias the
  method's steps predict, isolating the Jensen bias from the rounding noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.utils.host_reads import device_copy, on_host


@dataclass(frozen=True)
class Correction:
    """What to do to cached scores: ``sign · b`` added, with ``b`` in the ``form`` given.

    ``quantizes``: whether the cache stores quantized keys (False for the bias-only ablation,
    whose cache stays exact while the predicted bias is injected). ``ablation``: not offered by
    ``--corrections`` (it is an ``--ablations`` choice).
    """

    name: str
    form: str | None = None  # "taylor", "exact", "variance" (signed) or None (nothing added)
    sign: float = -1.0
    quantizes: bool = True
    ablation: bool = False
    summary: str = ""
    rule: str = "declared"  # variance form: excess, unshrink or each method's (quant/tensor.py)

    @property
    def active(self) -> bool:
        return self.form is not None

    @property
    def id(self) -> str:
        """The variant-id part (``taylor``, ``biasonly``; empty for ``none``)."""
        return "" if self.name == "none" else self.name.replace("-", "")


CORRECTIONS: dict[str, Correction] = {
    c.name: c
    for c in (
        Correction("none", summary="no correction"),
        Correction("taylor", "taylor", summary="subtract (τ²/24) Σ_j Δ_ij² ‖q_j‖²"),
        Correction("exact", "exact", summary="subtract Σ_c log(sinh α_ic / α_ic)"),
        Correction(
            "signed",
            "variance",
            summary="each method's declared noise model, the rule that won on error",
        ),
        Correction(
            "signed-excess",
            "variance",
            rule="excess",
            summary="ablation: subtract (τ²/2) Σ_j s_ij ‖q_j‖², s = Var(k̂) − Var(k), no unshrink",
        ),
        Correction(
            "signed-unshrink",
            "variance",
            rule="unshrink",
            summary="ablation: u τ q·k̂ − (τ²/2) Σ_j v_ij ‖q_j‖², u = 1/gain, v = Var(u k̂ − k)",
        ),
        Correction(
            "bias-only",
            "exact",
            sign=1.0,
            quantizes=False,
            ablation=True,
            summary="exact cache, predicted bias added (ablation)",
        ),
    )
}
FORMS = ("none", "taylor", "exact", "variance")


def get_correction(name: str | Correction) -> Correction:
    """The correction registered as ``name`` (``ValueError`` when unknown)."""
    if isinstance(name, Correction):
        return name
    if name not in CORRECTIONS:
        raise ValueError(f"correction must be one of {tuple(CORRECTIONS)}, got {name!r}")
    return CORRECTIONS[name]


def _expand_kv_heads(t: torch.Tensor, q_heads: int) -> torch.Tensor:
    """Repeat a ``[..., Hkv, L, X]`` tensor to ``Hq`` heads (GQA)."""
    kv_heads = t.shape[-3]
    if q_heads % kv_heads:
        raise ValueError(f"query heads ({q_heads}) must be a multiple of KV heads ({kv_heads})")
    return t.repeat_interleave(q_heads // kv_heads, dim=-3) if q_heads != kv_heads else t


def query_basis(q: torch.Tensor, rotation: RandomHadamard | None = None) -> torch.Tensor:
    """``q`` in the basis the key noise lives in: float32, rotated (``R q``) under a rotation."""
    return q.float() if rotation is None else rotation.rotate(q.float())


def group_sq_norms(q: torch.Tensor, groups: int, rotation: RandomHadamard | None = None):
    """``‖q_j‖²`` per group: ``[..., Lq, D] -> [..., Lq, G]`` (float32, rotated if asked; a
    reduction, so no squared copy of ``q`` is made)."""
    grouped = query_basis(q, rotation).unflatten(-1, (groups, -1))
    return torch.linalg.vector_norm(grouped, dim=-1).square()


def taylor_bias(
    q: torch.Tensor, step: torch.Tensor, scale: float, rotation: RandomHadamard | None = None
) -> torch.Tensor:
    """``b_i = (τ²/24) Σ_j Δ_ij² ‖q_j‖²``: ``[..., Hq, Lq, D] × [..., Hkv, Lk, G] -> [..., Hq, Lq, Lk]``."""
    qn2 = group_sq_norms(q, step.shape[-1], rotation)  # [..., Hq, Lq, G]
    d2 = _expand_kv_heads(step.float().square(), q.shape[-3])  # [..., Hq, Lk, G]
    return (scale * scale / 24.0) * (qn2 @ d2.transpose(-1, -2))


def variance_bias(
    q: torch.Tensor, noise_step2: torch.Tensor, scale: float, rotation=None
) -> torch.Tensor:
    """``b_i = (τ²/2) Σ_j v_ij ‖q_j‖² = (τ²/24) Σ_j w_ij ‖q_j‖²`` (``w = 12 v``, the keys'
    ``noise_step2``): ``[..., Hq, Lq, D] × [..., Hkv, Lk, G] -> [..., Hq, Lq, Lk]`` (the signed
    correction's variance term; ``w`` may be negative, then ``b`` is). With ``w = Δ²`` it is
    :func:`taylor_bias`, operation for operation."""
    qn2 = group_sq_norms(q, noise_step2.shape[-1], rotation)
    w = _expand_kv_heads(noise_step2.float(), q.shape[-3])
    return (scale * scale / 24.0) * (qn2 @ w.transpose(-1, -2))


def bilinear_channels(
    form: str,
    step: torch.Tensor,
    noise_step2: torch.Tensor | None,
    scale: float,
    sign: float = -1.0,
) -> torch.Tensor:
    """The extra key channels ``[..., Lc, G]`` of a bilinear correction: ``τ q'·k'`` gains
    ``τ Σ_j ‖q_j‖² c_ij`` with ``c = sign·(τ/24)·Δ²`` (taylor) or ``sign·(τ/24)·w`` (signed,
    ``w`` the keys' ``noise_step2``: ``Δ²`` for additive noise, so the same channels)."""
    if form == "taylor":
        return (sign * scale / 24.0) * step.float().square()
    if form == "variance":
        if noise_step2 is None:
            raise ValueError(NO_NOISE_VAR)
        return (sign * scale / 24.0) * noise_step2.float()
    raise ValueError(f"{form!r} is not a bilinear correction (taylor, variance)")


NO_NOISE_VAR = (
    "the signed correction needs every quantized cached key's excess variance; a method with "
    "mixed noise has it only when stored through a cache with the signed correction "
    "(jbkv_cli.quant.noise.measure_noise)"
)


def log_sinhc(a: torch.Tensor) -> torch.Tensor:
    """``log(sinh(a)/a)``, even in ``a``, stable for tiny and huge ``|a|``.

    Series ``a²/6 − a⁴/180 + a⁶/2835 − a⁸/37800`` for ``|a| < 0.5`` (error < 1e-9 relative),
    else ``|a| − log(2|a|) + log1p(−exp(−2|a|))``.
    """
    a = a.abs()
    a2 = a * a
    series = a2 * (1 / 6 - a2 * (1 / 180 - a2 * (1 / 2835 - a2 / 37800)))
    big = a.clamp_min(0.5)
    asymptotic = big - torch.log(2 * big) + torch.log1p(-torch.exp(-2 * big))
    return torch.where(a < 0.5, series, asymptotic)


def exact_bias(
    q: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    rotation: RandomHadamard | None = None,
    max_elements: int = 1 << 24,
    fp8: bool = False,
) -> torch.Tensor:
    """``b_i = Σ_c log(sinh α_ic / α_ic)``, ``α_ic = τ q_c Δ_i,g(c) / 2`` -> ``[..., Hq, Lq, Lk]``.

    Steps stored in FP8 E4M3 take at most 127 distinct values, so the bias is a table lookup:
    per query and group ``j``, ``T_j[v] = Σ_{c∈j} log sinhc(τ q_c v / 2)`` over the 127 values,
    then ``b_i = Σ_j T_j[Δ_ij]`` — exact, and ``O(Lq·D·127 + Lq·Lk·G)`` instead of
    ``O(Lq·Lk·D)`` transcendental evaluations. Other steps use :func:`exact_bias_direct`.
    ``fp8``: the steps are FP8 values by their storage format
    (:attr:`~jbkv_cli.quant.tensor.QuantizedTensor.steps_fp8`); otherwise they are read to find
    out on a CPU, and take the direct form elsewhere (a read there is a host sync). On a CPU the
    table holds only the values present (``torch.unique``; a shape read from the values), elsewhere
    all 127: each entry is the same function of ``q`` and its value, so the bias is the same.
    """
    codes = _fp8_codes(step, fp8)
    if codes is None:
        return exact_bias_direct(q, step, scale, rotation, max_elements)
    qf = query_basis(q, rotation)
    groups = step.shape[-1]
    if on_host(codes):
        present = torch.unique(codes)  # the V ≤ 127 step values actually stored
        values = _FP8_VALUES[present].to(q.device)  # [V]
        lut = torch.zeros(127, dtype=torch.long, device=q.device)
        lut[present] = torch.arange(present.numel(), device=q.device)
        codes = lut[codes]
    else:
        values = device_copy(_FP8_VALUES, q.device)  # [127]: a code is its own index
    codes = _expand_kv_heads(codes, q.shape[-3])  # [..., Hq, Lk, G] indices into values
    lead, lq, lk = q.shape[:-2], q.shape[-2], step.shape[-2]
    qg = qf.reshape(-1, lq, groups, q.shape[-1] // groups)  # [N, Lq, G, g]
    cg = codes.reshape(-1, lk, groups)  # [N, Lk, G]
    out = torch.empty(qg.shape[0], lq, lk, dtype=torch.float32, device=q.device)
    block = max(1, max_elements // max(1, q.shape[-1] * values.numel()))
    for n in range(qg.shape[0]):
        for start in range(0, lq, block):
            qb = qg[n, start : start + block]  # [b, G, g]
            table = log_sinhc(0.5 * scale * qb.unsqueeze(-1) * values).sum(-2)  # [b, G, V]
            acc = table[:, 0].index_select(-1, cg[n, :, 0])
            for j in range(1, groups):
                acc += table[:, j].index_select(-1, cg[n, :, j])
            out[n, start : start + block] = acc
    return out.reshape(*lead, lq, lk)


_FP8_VALUES = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def _fp8_codes(step: torch.Tensor, fp8: bool = False) -> torch.Tensor | None:
    """The FP8 E4M3 bit patterns of ``step`` (int64), or None if a step is not an FP8 value
    (``fp8``: known to be; else read on a CPU, and None elsewhere: unknown without a sync)."""
    if step.numel() == 0 or not (fp8 or on_host(step)):
        return None
    s8 = step.float().to(torch.float8_e4m3fn)
    if not fp8 and (
        bool((step < 0).any())
        or bool((step > 448).any())
        or not torch.equal(s8.float(), step.float())
    ):
        return None
    return s8.view(torch.uint8).long()


def exact_bias_direct(
    q: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    rotation: RandomHadamard | None = None,
    max_elements: int = 1 << 24,
) -> torch.Tensor:
    """:func:`exact_bias` for any steps, evaluated channel by channel.

    Materialises ``[Lq_block, Lk, D]`` per head block, so it is processed in query blocks of at
    most ``max_elements`` elements.
    """
    qf = query_basis(q, rotation)
    groups = step.shape[-1]
    d = _expand_kv_heads(step.float(), q.shape[-3])  # [..., Hq, Lk, G]
    qg = qf.unflatten(-1, (groups, -1))  # [..., Hq, Lq, G, g]
    lq, lk, dim = q.shape[-2], d.shape[-2], q.shape[-1]
    heads = max(1, q[..., 0, 0].numel())
    block = max(1, min(lq, max_elements // max(1, heads * lk * dim)))
    out = []
    for start in range(0, lq, block):
        qb = qg[..., start : start + block, :, :]  # [..., Hq, b, G, g]
        alpha = 0.5 * scale * qb.unsqueeze(-3) * d.unsqueeze(-1).unsqueeze(-4)  # [.., b, Lk, G, g]
        out.append(log_sinhc(alpha).sum((-1, -2)))  # [..., Hq, b, Lk]
    return torch.cat(out, dim=-2)


def jensen_bias(
    q: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    method: str = "taylor",
    rotation: RandomHadamard | None = None,
    noise_step2: torch.Tensor | None = None,
    fp8: bool = False,
) -> torch.Tensor:
    """The bias ``b`` to subtract from cached scores: ``[..., Hq, Lq, D], [..., Hkv, Lk, G]``
    -> ``[..., Hq, Lq, Lk]``; ``method`` is a form: ``taylor``, ``exact``, ``variance`` (the
    signed correction, which reads ``noise_step2`` ``[..., Hkv, Lk, G]``) or ``none`` (zeros).
    ``fp8``: the steps are FP8 values by their storage format (:func:`exact_bias`)."""
    if method not in FORMS:
        raise ValueError(f"method must be one of {FORMS}, got {method!r}")
    if q.shape[-1] % step.shape[-1]:
        raise ValueError(
            f"step has {step.shape[-1]} groups, which does not divide the head dim {q.shape[-1]}"
        )
    if method == "taylor":
        return taylor_bias(q, step, scale, rotation)
    if method == "exact":
        return exact_bias(q, step, scale, rotation, fp8=fp8)
    if method == "variance":
        if noise_step2 is None:
            raise ValueError(NO_NOISE_VAR)
        return variance_bias(q, noise_step2, scale, rotation)
    shape = (*q.shape[:-1], step.shape[-2])
    return torch.zeros(shape, dtype=torch.float32, device=q.device)


CHANNEL_MULTIPLE = 8  # fused head dims are padded to this: SDPA's fast CUDA kernels need it


def fused_width(head_dim: int, groups: int, multiple: int = CHANNEL_MULTIPLE) -> int:
    """The head dim of the fused form: ``W = ⌈(D + G) / m⌉ · m``, the ``D`` channels, the ``G``
    correction channels and zeros up to a multiple of ``m`` (``m = 1``: no zeros).

    The zeros change no score (``q'·k'`` gains ``0 · 0``) and no output (``v'`` is zero there,
    and the output is sliced back to ``D``); the SDPA scale is passed explicitly, so it stays
    the original ``τ`` rather than ``1/√W``. Why 8: FlashAttention needs ``q``, ``k`` and ``v``
    of one head dim and SDPA copies each to a multiple of 8 when it is not; the
    memory-efficient kernel (the one that takes a mask) needs the ``q``/``k`` and the ``v``
    head dims each a multiple of 8 in 16-bit (4 in float32) and otherwise falls back to the
    math kernel, which materializes every score; cuDNN's needs multiples of 8 too.
    """
    if head_dim < 1 or groups < 0 or multiple < 1:
        raise ValueError(f"head_dim {head_dim}, groups {groups}, multiple {multiple}")
    return -(-(head_dim + groups) // multiple) * multiple


def augment_taylor(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    rotation: RandomHadamard | None = None,
    sign: float = -1.0,
    multiple: int = CHANNEL_MULTIPLE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The augmented-channel form of the Taylor correction (no ``[Lq, Lk]`` tensor)::

        q' = [q, ‖q_1‖², …, ‖q_G‖², 0, …]
        k' = [k̂, −Δ_i1²·τ/24, …, −Δ_iG²·τ/24, 0, …]   (zeros for the trailing unquantized keys)
        v' = [v, 0, …, 0]
        τ q'·k' = τ q·k̂ − (τ²/24) Σ_j Δ_ij² ‖q_j‖²

    ``k``/``v`` are ``[..., Hkv, Lc + Lcur, D]`` with the ``Lc = step.shape[-2]`` cached keys
    first. ``sign=+1`` adds the bias instead (the bias-only ablation). Returns ``(q', k', v')``
    with head dim :func:`fused_width` ``(D, G, multiple)``; attend with ``scale=τ`` and slice
    the output back to ``D``.
    """
    lc = step.shape[-2]
    return build_augmented(
        q,
        k[..., :lc, :],
        v[..., :lc, :],
        k[..., lc:, :],
        v[..., lc:, :],
        step,
        scale,
        rotation,
        sign,
        multiple=multiple,
    )


def build_augmented(
    q: torch.Tensor,
    k_cached: torch.Tensor,
    v_cached: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    rotation: RandomHadamard | None = None,
    sign: float = -1.0,
    channels: torch.Tensor | None = None,
    multiple: int = CHANNEL_MULTIPLE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`augment_taylor` from the cached and current parts, one allocation per tensor
    (the ``[cached | current]`` concatenation, the extra channels and the padding are written
    together). ``channels`` ``[..., Lc, G]``: the extra key channels of another bilinear
    correction (:func:`bilinear_channels`; default: taylor's from ``step`` and ``sign``)."""
    k_aug, v_aug = augment_keys(
        k_cached, v_cached, k_cur, v_cur, step, scale, sign, channels, multiple
    )
    return augment_queries(q, step.shape[-1], rotation, multiple), k_aug, v_aug


def augment_queries(
    q: torch.Tensor,
    groups: int,
    rotation: RandomHadamard | None = None,
    multiple: int = CHANNEL_MULTIPLE,
) -> torch.Tensor:
    """``q' = [q, ‖q_1‖², …, ‖q_G‖², 0, …]`` (the query side of :func:`augment_taylor`, head
    dim :func:`fused_width`); a caller that attends in query blocks augments one block at a
    time."""
    d = q.shape[-1]
    norms = group_sq_norms(q, groups, rotation)  # before q' exists: its float32 copy of q is freed
    q_aug = q.new_empty((*q.shape[:-1], fused_width(d, groups, multiple)))
    q_aug[..., :d] = q
    q_aug[..., d : d + groups] = norms
    q_aug[..., d + groups :] = 0
    return q_aug


def augment_keys(
    k_cached: torch.Tensor,
    v_cached: torch.Tensor,
    k_cur: torch.Tensor,
    v_cur: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    sign: float = -1.0,
    channels: torch.Tensor | None = None,
    multiple: int = CHANNEL_MULTIPLE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k'``, ``v'`` of :func:`augment_taylor`: ``[cached | current]`` with ``G`` extra
    channels (taylor's, or ``channels``) and zeros up to :func:`fused_width`, each written
    once. ``v'`` is as wide as ``k'``: FlashAttention takes one head dim for ``q``, ``k`` and
    ``v`` (the memory-efficient and cuDNN kernels would take a narrower ``v``)."""
    groups, lc, d = step.shape[-1], step.shape[-2], k_cur.shape[-1]
    width = fused_width(d, groups, multiple)
    shape = (*k_cur.shape[:-2], lc + k_cur.shape[-2], width)
    k_aug = k_cur.new_empty(shape)
    k_aug[..., :lc, :d] = k_cached
    k_aug[..., lc:, :d] = k_cur
    if channels is None:
        k_aug[..., :lc, d : d + groups] = (sign * scale / 24.0) * step.float().square()
    else:
        k_aug[..., :lc, d : d + groups] = channels
    k_aug[..., :lc, d + groups :] = 0
    k_aug[..., lc:, d:] = 0
    v_aug = v_cur.new_empty(shape)
    v_aug[..., :lc, :d] = v_cached
    v_aug[..., lc:, :d] = v_cur
    v_aug[..., d:] = 0
    return k_aug, v_aug
