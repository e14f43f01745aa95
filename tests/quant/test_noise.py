"""The signed correction's two rules, as each stored tensor gives them (``jbkv_cli/quant/noise.py``,
``quant/tensor.py``): the excess rule's ``w = 12 (Var(k̂) − Var(k))`` with its sign, the unshrink
rule's gain and the variance of ``k̂/a − k``, measured where the noise is mixed; fixed seeds,
tolerances stated per test."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.quant import quantize_kv
from jbkv_cli.quant.noise import excess_variance, measure_noise
from jbkv_cli.quant.tensor import (
    DECLARED_RULE,
    EXCESS,
    MIXED,
    UNSHRINK,
    QuantizedTensor,
    signed_terms,
)

D = 64


def _keys(tokens: int = 2048, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 2, tokens, D, generator=torch.Generator().manual_seed(seed))


def test_each_rule_reads_what_the_declared_model_gives():
    """Additive (RTN): both rules read ``w = Δ²``, no unshrink (taylor's numbers). Centroid
    (TurboQuant-MSE): the excess rule reads ``−Δ²`` (the cell variances, added) and no unshrink;
    the unshrink rule ``u = 1/(1 − ρ)`` and ``w = 12 ρ/(1 − ρ) ‖k‖²/d``."""
    x = _keys()
    rtn = quantize_kv(x, 2, 32, "rtn")
    for rule in (EXCESS, UNSHRINK):
        w, u = signed_terms(rtn, 2, rule)
        assert torch.equal(w, rtn.step.square()) and u is None  # the same floats: bit for bit
    tq = quantize_kv(x, 2, 32, "turboquant-mse")
    w, u = signed_terms(tq, 2, EXCESS)
    assert u is None and torch.equal(w, -tq.step.square())
    w, u = signed_terms(tq, 2, UNSHRINK)
    rho = tq.relative_mse
    torch.testing.assert_close(u, torch.full_like(u, 1 / (1 - rho)))
    want = 12 * rho / (1 - rho) * tq.norm.float().square() / D
    torch.testing.assert_close(w, want.expand_as(w))
    assert DECLARED_RULE[tq.noise_model] in (EXCESS, UNSHRINK)


def test_a_centroid_quantizers_excess_variance_is_minus_its_cell_variance():
    """Measured ``Var(k̂) − Var(k)`` of TurboQuant-MSE on Gaussian keys (2,048 tokens per head)
    is the declared ``−Δ²/12`` (its mean cell variance) within 5%."""
    x = _keys()
    tq = quantize_kv(x, 2, 32, "turboquant-mse")
    measured = float(excess_variance(x, tq, 2).mean())
    declared = float(tq.excess_step2.mean()) / 12
    assert declared < 0 and abs(measured / declared - 1) < 0.05, (measured, declared)


@dataclass
class _Linear(QuantizedTensor):
    """A mixed-noise stand-in whose stored keys are ``a·k + n`` exactly (known a and Var(n))."""

    k_hat: torch.Tensor
    steps: torch.Tensor
    noise_model = MIXED

    def __post_init__(self) -> None:
        self.shape, self.dtype = self.k_hat.shape, self.k_hat.dtype

    def stored(self) -> dict[str, torch.Tensor]:
        return {"k_hat": self.k_hat}

    def dequantize(self) -> torch.Tensor:
        return self.k_hat

    @property
    def step(self) -> torch.Tensor:
        return self.steps


@pytest.mark.parametrize("gain,noise", [(0.8, 0.3), (1.1, 0.2)])
def test_mixed_noise_is_measured_for_either_rule(gain, noise):
    """Stored keys ``k̂ = a k + n`` (unit-variance k, independent n): the excess rule measures
    ``s = (a² − 1) + σ_n²`` per channel, the unshrink rule the gain ``a`` (FP16) and ``v =
    σ_n²/a²``; the FP8 κ rounds to 1/16 relative, so both within 7% (the gain within 1%)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 8192, D, generator=g)
    k_hat = gain * x + noise * torch.randn(x.shape, generator=g)
    steps = torch.full((1, 2, 8192, 2), 0.5)
    stored = _Linear(k_hat, steps)
    excess = measure_noise(x, stored)
    w, u = signed_terms(excess, 2, EXCESS)
    assert u is None
    want = gain**2 - 1 + noise**2
    assert abs(float(w.mean()) / 12 / want - 1) < 0.07, (float(w.mean()) / 12, want)
    shrunk = measure_noise(x, stored, unshrink=True)
    w, u = signed_terms(shrunk, 2, UNSHRINK)
    assert abs(float(shrunk.gain.float().mean()) / gain - 1) < 0.01
    torch.testing.assert_close(u, (1 / shrunk.gain.float()).expand_as(u))
    want = noise**2 / gain**2
    assert abs(float(w.mean()) / 12 / want - 1) < 0.07, (float(w.mean()) / 12, want)
    assert signed_terms(shrunk, 2, EXCESS)[0] is None  # measured for the other rule only


def test_what_is_measured_is_counted_only_when_the_variant_reads_it():
    """QVG's κ: one FP8 byte per (chunk, head, group) under a signed rule that reads it, plus
    an FP16 gain per (chunk, head) under ``signed-unshrink``; measured but not stored for the
    diagnostics of an uncorrected variant."""
    k, v = _keys(256)[..., :128, :], _keys(256, 1)[..., :128, :]
    sizes = {}
    for correction in ("none", "signed", "signed-excess", "signed-unshrink"):
        cache = ChunkKVCache(KVSpec.build("qvg", 2, 32, correction), observer=_NoObserver())
        cache.commit(k, v)
        sizes[correction] = cache.nbytes
    heads, groups = 2, D // 32
    assert sizes["signed"] == sizes["signed-excess"] == sizes["none"] + heads * groups
    assert sizes["signed-unshrink"] == sizes["none"] + heads * groups + heads * 2


class _NoObserver:
    every = 1_000_000

    def observe(self, *args, **kwargs) -> None:
        raise AssertionError("not called")
