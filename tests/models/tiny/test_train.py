"""The training recipe in small: clips cut mid-video, noise levels on the sampler's grid,
determinism, the sampled context of stage 3, argument errors and a short smoke run."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
import torch

from jbkv_cli.models.tiny import train as train_mod
from jbkv_cli.models.tiny.data import DataConfig, random_prompts, render
from jbkv_cli.models.tiny.model import TinyConfig, patchify
from jbkv_cli.models.tiny.train import (
    RECIPE,
    TrainConfig,
    make_batch,
    run_recipe,
    sampled_context,
    train,
)
from jbkv_cli.models.tiny.weights_io import DEFAULT_WEIGHTS, load_weights, save_weights

CFG = TinyConfig(depth=1, window=1, frames_per_chunk=1)
SMALL = TrainConfig(steps=3, batch_size=2, warmup=1, extra_chunks=1, threads=1, max_offset=3)


def test_clips_cut_mid_video_are_slices_of_the_whole_video() -> None:
    tc = replace(SMALL, batch_size=6)
    n = CFG.window + tc.extra_chunks
    batch = make_batch(CFG, tc, torch.Generator().manual_seed(3))
    # the same generator state renders the same full videos
    gen = torch.Generator().manual_seed(3)
    prompts = random_prompts(tc.batch_size, gen)
    data = DataConfig(num_frames=(n + tc.max_offset) * CFG.frames_per_chunk)
    full = patchify(render(prompts, data, gen) * 2 - 1, CFG.patch_size)
    full = full.reshape(tc.batch_size, n + tc.max_offset, CFG.chunk_len, CFG.patch_dim)
    offsets = []
    for k in range(tc.batch_size):
        match = [
            o for o in range(tc.max_offset + 1) if torch.equal(full[k, o : o + n], batch["x0"][k])
        ]
        assert len(match) == 1
        offsets.append(match[0])
        assert batch["weight"][k, 0] == float(match[0] == 0) and (batch["weight"][k, 1:] == 1).all()
    assert len(set(offsets)) > 1  # not all from the start
    grid = {1.0, 0.75, 0.5, 0.25}
    on_grid = sum(float(t) in grid for t in batch["t"].flatten())
    assert 0 < on_grid < batch["t"].numel()


def test_training_is_deterministic_given_the_seed() -> None:
    a, log_a = train(CFG, SMALL, seed=0)
    b, log_b = train(CFG, SMALL, seed=0)
    c, _ = train(CFG, SMALL, seed=1)
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y)
    assert [h["loss"] for h in log_a["history"]] == [h["loss"] for h in log_b["history"]]
    assert not torch.equal(next(iter(a.parameters())), next(iter(c.parameters())))


def test_stages_resume_exactly_from_saved_weights(tmp_path, monkeypatch) -> None:
    stage2 = replace(SMALL, lr=1e-3, start_prob=0.5)
    monkeypatch.setattr(train_mod, "RECIPE", (SMALL, stage2))
    both, log = run_recipe(CFG, seed=0, stages=[1, 2], threads=1)
    assert log["steps"] == 6 and [s["stage"] for s in log["stage_logs"]] == [1, 2]
    first, _ = run_recipe(CFG, seed=0, stages=[1], threads=1)
    save_weights(first, tmp_path / "stage1.safetensors", {})
    init = load_weights(tmp_path / "stage1.safetensors")
    resumed, _ = run_recipe(CFG, seed=0, stages=[2], init=init, threads=1)
    for a, b in zip(both.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_start_prob_makes_more_clips_start_with_the_video() -> None:
    tc = replace(SMALL, batch_size=400, max_offset=4, start_prob=0.0)
    starts = make_batch(CFG, tc, torch.Generator().manual_seed(0))["weight"][:, 0].mean()
    more = make_batch(CFG, replace(tc, start_prob=0.5), torch.Generator().manual_seed(0))
    # P(offset 0) = 1/5 uniform, 1/2 + 1/2 * 1/5 = 0.6 with start_prob 0.5; 400 clips: SE < 0.025
    assert (
        abs(float(starts) - 0.2) < 0.075 and abs(float(more["weight"][:, 0].mean()) - 0.6) < 0.075
    )


def test_cli_rejects_bad_arguments(tmp_path) -> None:
    missing = str(tmp_path / "missing.safetensors")
    bads = (["--stages", "4"], ["--stages", "x"], ["--threads", "0"], ["--init", missing])
    bads += (["--stages", "1,3"], ["--stages", "2,1"], ["--stages", "3"])  # 3 needs --init
    for bad in bads:
        with pytest.raises(SystemExit):
            train_mod.main(["--out", str(tmp_path / "w.safetensors"), *bad])
    assert not (tmp_path / "w.safetensors").exists()


def test_smoke_run_and_log() -> None:
    _, log = train(CFG, SMALL, seed=0, log_every=1)
    assert log["steps"] == 3 and len(log["history"]) == 3
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in log["history"])


def test_sampled_context_reads_only_the_true_chunks_before_each_chunk() -> None:
    """Chunk k is sampled given the truth of chunks < k: the first chunk is the truth itself,
    changing the last chunk's truth changes nothing, changing chunk 1's changes chunks >= 2."""
    model = load_weights()  # trained: a random model's zero-initialised output reads nothing
    b = make_batch(model.cfg, replace(SMALL, extra_chunks=2), torch.Generator().manual_seed(1))

    def run(x0: torch.Tensor) -> torch.Tensor:
        return sampled_context(model, {**b, "x0": x0}, torch.Generator().manual_seed(2), steps=3)

    base = run(b["x0"])
    assert base.shape == b["x0"].shape and torch.equal(base[:, 0], b["x0"][:, 0])
    last = b["x0"].clone()
    last[:, -1] += 1.0
    torch.testing.assert_close(run(last), base, rtol=0, atol=1e-6)
    second = b["x0"].clone()
    second[:, 1] += 1.0
    moved = run(second)
    torch.testing.assert_close(moved[:, :2], base[:, :2], rtol=0, atol=1e-6)
    assert (moved[:, 2:] - base[:, 2:]).abs().amax() > 1e-3


def test_sampled_context_training_is_deterministic_and_not_teacher_forcing() -> None:
    tc = replace(SMALL, context="sampled")
    a, log = train(CFG, tc, seed=0)
    b, _ = train(CFG, tc, seed=0)
    forced, _ = train(CFG, SMALL, seed=0)
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(next(iter(a.parameters())), next(iter(forced.parameters())))
    assert log["train_config"]["context"] == "sampled"
    calls = []
    train(
        CFG,
        replace(SMALL, context="mine"),
        seed=0,
        context_fn=lambda m, b, g: calls.append(1) or b["x0"],
    )
    assert len(calls) == SMALL.steps
    with pytest.raises(ValueError, match="context"):
        train(CFG, replace(SMALL, context="mine"), seed=0)


@pytest.mark.parametrize("name", ["tiny", "tiny-long"])
def test_the_shipped_weights_are_the_recipes(name) -> None:
    """Each shipped file's log names the recipe's stages as they are now (a stage changed
    without training the weights again fails here); the long weights are stage 3 of the
    default ones, seed 0. Fields a log predates must sit at their defaults."""
    log = json.loads(DEFAULT_WEIGHTS.with_name(f"{name}.json").read_text())
    assert log["seed"] == 0 and log["stages"] == ([1, 2] if name == "tiny" else [3])
    defaults = asdict(TrainConfig())
    for stage in log["stage_logs"]:
        recipe = asdict(replace(RECIPE[stage["stage"] - 1], threads=stage["threads"]))
        assert {k: recipe[k] for k in stage["train_config"]} == stage["train_config"]
        assert all(recipe[k] == defaults[k] for k in recipe.keys() - stage["train_config"])
    if name == "tiny-long":
        assert log["init"].endswith("weights/tiny.safetensors")
