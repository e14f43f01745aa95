"""The prompt checker on rendered ground truth (every prompt passes) and on broken videos
(each failure mode is caught by its own check)."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.models.tiny.check import check_chunks, check_video, chunk_paths
from jbkv_cli.models.tiny.data import BACKGROUNDS, DataConfig, all_prompts, render
from jbkv_cli.utils.errors import JbkvError


def frames_of(video: torch.Tensor) -> torch.Tensor:
    """``[T, 3, H, W]`` in [0, 1] -> ``[T, H, W, 3]`` uint8."""
    return (video * 255).round().to(torch.uint8).permute(0, 2, 3, 1)


@pytest.fixture(scope="module")
def rendered() -> tuple[list, torch.Tensor]:
    prompts = all_prompts()
    video = render(prompts, DataConfig(num_frames=32), torch.Generator().manual_seed(0))
    return prompts, video


def test_every_rendered_video_follows_its_prompt(rendered) -> None:
    prompts, video = rendered
    for prompt, v in zip(prompts, video, strict=True):
        check = check_video(frames_of(v), prompt.text)
        assert check.ok, (prompt.text, check)
        assert check.max_drift < 0.5 and 0.75 < check.min_area_ratio <= check.max_area_ratio < 1.25


def test_each_failure_is_caught(rendered) -> None:
    prompts, video = rendered
    i = next(
        k
        for k, p in enumerate(prompts)
        if p.text == "a red circle moves right on a dark background"
    )
    good = video[i]
    bg = BACKGROUNDS["dark"]
    text = prompts[i].text

    faded = good.clone()
    faded[20:] = bg  # the shape disappears after frame 20
    assert not check_video(frames_of(faded), text).shape_ok

    frozen = good.clone()
    frozen[12:] = good[12]  # the shape stops
    check = check_video(frames_of(frozen), text)
    assert check.shape_ok and not check.moving_ok

    wrong_way = good.flip(-1)  # mirrored: moves left
    assert not check_video(frames_of(wrong_way), text).starts_ok

    other_colour = check_video(frames_of(good), text.replace("red", "blue"))
    assert other_colour.colour == "red" and not other_colour.colour_ok

    # drifting across the motion axis
    drifting = torch.stack([f.roll(shifts=k // 4, dims=1) for k, f in enumerate(good)])
    assert not check_video(frames_of(drifting), text).moving_ok


def test_a_prompt_outside_the_grammar_is_an_error() -> None:
    video = torch.zeros(8, 32, 32, 3, dtype=torch.uint8)
    with pytest.raises(JbkvError, match="tiny model"):
        check_video(video, "a cat playing piano")


def test_check_chunks_on_ground_truth_and_the_chunk_each_failure_starts(rendered) -> None:
    """Per chunk of 4 frames: every rendered video passes every chunk; a broken one fails from
    the chunk its breakage starts in."""
    prompts, video = rendered
    for prompt, v in zip(prompts, video, strict=True):
        assert check_chunks(frames_of(v), prompt.text) == [True] * 8, prompt.text
    i = next(k for k, p in enumerate(prompts) if p.text.startswith("a red circle moves right"))
    good, text = video[i], prompts[i].text

    frozen = good.clone()
    frozen[12:] = good[12]  # stops at frame 12: chunk 3 (frames 12-15) no longer moves
    assert check_chunks(frames_of(frozen), text) == [True] * 3 + [False] * 5

    faded = good.clone()
    faded[20:] = BACKGROUNDS["dark"]  # gone from frame 20: chunk 5
    assert check_chunks(frames_of(faded), text) == [True] * 5 + [False] * 3

    recoloured = good.clone()
    shape = (good[24:] - BACKGROUNDS["dark"]).abs().amax(1, keepdim=True) > 0.25
    blue = torch.tensor([0.15, 0.30, 0.95])[None, :, None, None]
    recoloured[24:] = torch.where(shape, blue, good[24:])
    assert check_chunks(frames_of(recoloured), text) == [True] * 6 + [False] * 2  # blue: chunk 6

    wrong_way = good.flip(-1)  # moves left: the start fails (chunks 0 and 1)
    assert check_chunks(frames_of(wrong_way), text)[:2] == [False, False]
    assert check_chunks(frames_of(good[:6]), text) == [True]  # a partial last chunk left out


def test_a_chunks_path_counts_the_step_into_it() -> None:
    """A shape that turns around early at a wall (measured on the embedded model's long
    rollouts) moves 1.0 px within the chunk's own frames but 1.9 px over the chunk's time,
    counted from the previous chunk's last frame; a stalled shape stays below 1.2 px."""
    turn = torch.tensor([18.3, 19.3, 20.3, 21.3, 22.2, 22.6, 22.5, 22.0, 21.0, 19.9, 18.8, 17.7])
    assert chunk_paths(turn, 4).tolist() == pytest.approx([3.0, 1.9, 4.3], abs=1e-5)
    assert float(turn[4:8].diff().abs().sum()) < 1.2  # the old count: the turn was a stall
    stall = torch.tensor([17.3, 18.3, 19.3, 20.3, 20.4, 20.4, 20.5, 20.4])
    assert chunk_paths(stall, 4)[1] < 1.2
    assert chunk_paths(turn[:9], 4).shape == (2,) and chunk_paths(turn[:3], 4).shape == (0,)
