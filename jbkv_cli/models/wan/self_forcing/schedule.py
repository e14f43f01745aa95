"""Self-Forcing's few-step sampler: the shifted flow-matching table, warped timesteps, x₀, re-noise.

Facts from guandeh17/Self-Forcing @33593df (``utils/scheduler.py: FlowMatchScheduler``,
``utils/wan_wrapper.py``, ``pipeline/causal_inference.py``, ``configs/self_forcing_dmd.yaml``):

* the table: ``FlowMatchScheduler(shift, sigma_min=0, extra_one_step=True)`` set to 1000 steps,

      s_j = linspace(1, 0, 1001)[j],   σ_j = shift·s_j / (1 + (shift − 1)·s_j),   t_j = 1000·σ_j,

  for j = 0 … 999, in float32, with ``timestep_shift = 5.0``;
* ``warp_denoising_step``: the configured ``denoising_step_list = [1000, 750, 500, 250]``
  indexes the table (with t = 0 appended) at ``1000 − t``, so the model sees
  t = 1000, 937.5, 833.3, 625 (σ = 1, 0.9375, 0.8333, 0.625);
* CausVid (tianweiy/CausVid @ca21150, ``causvid/models/wan/causal_inference.py``,
  ``wan_wrapper.py``, ``flow_match.py``): the same table with ``shift = 8.0`` (hard-coded in
  ``WanDiffusionWrapper``); ``configs/wan_causal_dmd.yaml`` lists [1000, 757, 522] *unwarped*
  (``warp_denoising_step: false``): the model sees t = 1000, 757, 522 themselves and x₀ / the
  re-noise use σ of the table entry whose timestep is nearest to t (``argmin |t_j − t|``, the
  first on a tie); ``wan_causal_dmd_warp_4step_cfg2.yaml`` warps [1000, 750, 500, 250];
* each step the generator predicts the flow ``v`` and ``x₀ = x_t − σ_t v`` (float64, rounded to
  the latents' dtype); before the next step ``x ← (1 − σ_next) x₀ + σ_next ε`` with fresh
  Gaussian noise ε (float32, rounded to the latents' dtype); the last step's x₀ is the chunk. The clean-context pass then runs the chunk at ``context_noise`` = t = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TRAIN_STEPS = 1000
SELF_FORCING_STEPS = (1000, 750, 500, 250)


def shifted_table(shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(σ, t)`` float32 ``[1001]``: the 1000-entry training table plus σ = t = 0 at index 1000."""
    s = torch.linspace(1.0, 0.0, TRAIN_STEPS + 1, dtype=torch.float32)[:-1]
    sigma = shift * s / (1 + (shift - 1) * s)
    zero = torch.zeros(1, dtype=torch.float32)
    return torch.cat([sigma, zero]), torch.cat([sigma * TRAIN_STEPS, zero])


def denoising_step_list(steps: int) -> tuple[int, ...]:
    """``round(1000·(1 − i/N))`` for i < N: (1000, 750, 500, 250) for N = 4, Self-Forcing's list."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return tuple(round(TRAIN_STEPS * (1 - i / steps)) for i in range(steps))


@dataclass(frozen=True)
class FewStepSchedule:
    """The warped timesteps a chunk is denoised at and their σ (float32 values as Python floats)."""

    timesteps: tuple[float, ...]
    sigmas: tuple[float, ...]

    @classmethod
    def build(
        cls,
        steps: int,
        shift: float,
        step_list: tuple[int, ...] | None = None,
        warp: bool = True,
    ) -> FewStepSchedule:
        """``step_list`` (else :func:`denoising_step_list` of ``steps``) warped through the
        table, or with ``warp=False`` taken as the model's timesteps with the nearest entry's σ."""
        sigma, t = shifted_table(shift)
        listed = tuple(step_list) if step_list is not None else denoising_step_list(steps)
        if warp:
            index = torch.tensor([TRAIN_STEPS - s for s in listed])
            return cls(tuple(t[index].tolist()), tuple(sigma[index].tolist()))
        given = torch.tensor(listed, dtype=torch.float32)
        index = (t[:TRAIN_STEPS, None] - given[None]).abs().argmin(dim=0)
        return cls(tuple(float(s) for s in listed), tuple(sigma[index].tolist()))

    def __len__(self) -> int:
        return len(self.timesteps)


def to_x0(x_t: torch.Tensor, flow: torch.Tensor, sigma: float) -> torch.Tensor:
    """``x₀ = x_t − σ v`` computed in float64, returned in ``x_t``'s dtype."""
    return (x_t.double() - sigma * flow.double()).to(x_t.dtype)


def renoise(x0: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """``(1 − σ) x₀ + σ ε``: the input of the next step, at noise level σ, computed in float32
    (σ is a float32 table value) and returned in ``x₀``'s dtype, as upstream's ``add_noise``
    (``sample.type_as(noise)``, noise and latents in one dtype)."""
    return ((1 - sigma) * x0.float() + sigma * noise.float()).to(x0.dtype)
