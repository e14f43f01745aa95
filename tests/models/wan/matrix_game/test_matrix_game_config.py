"""Each Matrix-Game-2.0 preset samples with its own ``inference_*.yaml`` schedule (SkyworkAI/
Matrix-Game, ``Matrix-Game-2/configs/inference_yaml/``: universal and gta_drive list
[1000, 666, 333], templerun [1000, 750, 500, 250], all ``warp_denoising_step: true`` with
``timestep_shift: 5.0``)."""

from __future__ import annotations

import pytest

from jbkv_cli.models.wan.matrix_game import _resolved
from jbkv_cli.models.wan.matrix_game.config import PRESETS
from jbkv_cli.models.wan.matrix_game.model import MatrixGame2
from jbkv_cli.models.wan.self_forcing.schedule import FewStepSchedule

UPSTREAM = {
    "universal": ((1000, 666, 333), True, 5.0),
    "gta": ((1000, 666, 333), True, 5.0),
    "templerun": ((1000, 750, 500, 250), True, 5.0),
    "tiny-random": ((1000, 666, 333), True, 5.0),  # universal's, on random weights
}


def test_every_preset_states_its_schedule():
    assert set(PRESETS) == set(UPSTREAM)
    for name, (steps, warp, shift) in UPSTREAM.items():
        preset = PRESETS[name]
        assert (preset.steps, preset.warp, preset.shift) == (steps, warp, shift), name


@pytest.mark.parametrize("name", ["universal", "gta", "templerun"])
def test_the_model_denoises_at_its_presets_warped_steps(name):
    settings, preset, _ = _resolved({"config": name, "device": "cpu"})
    model = MatrixGame2(None, None, None, preset, settings)  # the loop's schedule only
    steps, warp, shift = UPSTREAM[name]
    want = FewStepSchedule.build(len(steps), shift, steps, warp=warp)
    assert model.schedule == want
    assert len(model.settings["timesteps"]) == len(steps)
    if name == "templerun":  # warped [1000, 750, 500, 250] at shift 5, as Self-Forcing's
        assert model.schedule.timesteps == pytest.approx((1000.0, 937.5, 833.333, 625.0), abs=1e-2)
