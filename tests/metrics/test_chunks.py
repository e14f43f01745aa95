"""Per-chunk (drift) scores: chunk means and the chunk length of a record."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.metrics.chunks import (
    causal_vae_chunks,
    chunk_frames_of,
    chunk_of,
    first_chunk_frames_of,
    per_chunk,
)
from jbkv_cli.metrics.fidelity import compare_videos


def test_per_chunk_means_align_to_frame_zero():
    x = [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0]
    assert per_chunk(x, 2) == [2.0, 6.0, 10.0, 13.0]
    assert per_chunk(x, 3, skipped=1) == [2.0, 7.0, 12.0]  # frames 1-2 | 3-5 | 6-7
    assert per_chunk(x, 1) == x
    assert per_chunk([], 4) == []
    with pytest.raises(ValueError):
        per_chunk(x, 0)


def test_a_short_first_chunk_moves_every_boundary():
    """A causal VAE's chunks: 13 frames, then 16 (HY-WorldPlay); frame f's chunk."""
    x = torch.arange(45, dtype=torch.float64)  # 13 + 16 + 16
    assert per_chunk(x, 16, first_frames=13) == [6.0, 20.5, 36.5]
    assert per_chunk(x, 16) == [7.5, 23.5, 38.0]  # the old (frame 0-aligned) boundaries
    assert per_chunk(x[5:], 16, skipped=5, first_frames=13) == [8.5, 20.5, 36.5]
    assert per_chunk(x[20:], 16, skipped=20, first_frames=13) == [24.0, 36.5]
    assert [chunk_of(f, 16, 13) for f in (0, 12, 13, 28, 29)] == [0, 0, 1, 1, 2]
    assert chunk_of(torch.tensor([0, 12, 13, 29]), 4, 13).tolist() == [0, 0, 1, 5]
    assert per_chunk(x, 16, first_frames=16) == per_chunk(x, 16)
    with pytest.raises(ValueError):
        per_chunk(x, 16, first_frames=0)
    assert causal_vae_chunks(4, 4) == {"frames_per_chunk": 16, "first_chunk_frames": 13}
    assert causal_vae_chunks(1, 4) == {"frames_per_chunk": 4, "first_chunk_frames": 1}


def test_first_chunk_frames_of_reads_the_record_then_the_settings():
    assert (
        first_chunk_frames_of({"info": {"first_chunk_frames": 9}}, {"first_chunk_frames": 5}) == 9
    )
    assert first_chunk_frames_of({"info": {}}, {"first_chunk_frames": 5}) == 5
    for bad in (0, -1, True, "9", None):
        assert first_chunk_frames_of({"info": {"first_chunk_frames": bad}}) is None


def test_a_scored_pair_with_a_short_first_chunk():
    g = torch.Generator().manual_seed(1)
    ref = torch.randint(0, 256, (21, 16, 16, 3), generator=g, dtype=torch.uint8)
    test = ref.clone()
    test[5:] = test[5:] // 2  # chunk 0 (frames 0-4) exact, chunks 1, 2 damaged
    s = compare_videos(ref, test, chunk_frames=8, first_chunk_frames=5)
    assert (s.first_chunk, s.first_chunk_frames, len(s.psnr_per_chunk)) == (0, 5, 3)
    assert s.psnr_per_chunk[0] == 100.0 and max(s.psnr_per_chunk[1:]) < 100.0
    late = compare_videos(ref, test, skip_frames=6, chunk_frames=8, first_chunk_frames=5)
    assert late.first_chunk == 1 and len(late.psnr_per_chunk) == 2
    full = compare_videos(ref, test, chunk_frames=8, first_chunk_frames=8)
    assert full.first_chunk_frames is None and full.psnr_per_chunk[0] < 100.0


@pytest.mark.parametrize(
    ("record", "settings", "expected"),
    [
        ({"info": {"frames_per_chunk": 4}, "frames": [32, 32, 32, 3]}, None, 4),  # tiny
        ({"info": {}, "frames": [96, 720, 720, 3]}, {"num_chunks": 4}, 24),  # MAGI-1
        ({"info": {"num_chunks": 5}, "frames": [97, 544, 960, 3]}, None, None),  # SkyReels-V2
        ({}, None, None),
    ],
)
def test_chunk_frames_of(record, settings, expected):
    assert chunk_frames_of(record, settings) == expected


def test_compare_videos_records_per_chunk_scores():
    g = torch.Generator().manual_seed(0)
    ref = torch.randint(0, 256, (12, 16, 16, 3), generator=g, dtype=torch.uint8)
    test = ref.clone()
    test[4:] = (
        (test[4:].to(torch.int16) + torch.randint(-20, 21, test[4:].shape, generator=g))
        .clamp(0, 255)
        .to(torch.uint8)
    )
    s = compare_videos(ref, test, skip_frames=2, chunk_frames=4)
    assert s.chunk_frames == 4 and s.first_chunk == 0
    assert len(s.psnr_per_chunk) == 3 and len(s.ssim_per_chunk) == 3
    assert s.psnr_per_chunk[0] == 100.0 and s.ssim_per_chunk[0] == pytest.approx(1.0)
    assert s.psnr_per_chunk[1] == pytest.approx(sum(s.psnr_per_frame[2:6]) / 4)
    assert s.psnr_per_chunk[1] < 100.0
    default = compare_videos(ref, test)
    assert default.chunk_frames == 1 and default.psnr_per_chunk == default.psnr_per_frame
    assert "psnr_per_chunk" in s.to_dict() and "chunk_frames" in s.to_dict(per_frame=False)


def test_compare_dirs_reads_the_chunk_length_from_the_record_beside_the_video(tmp_path):
    import json

    from jbkv_cli.metrics.fidelity import compare_dirs
    from jbkv_cli.utils.video import write_video_lossless

    frames = torch.randint(0, 256, (8, 16, 16, 3), dtype=torch.uint8)
    for d in ("ref", "test"):
        write_video_lossless(tmp_path / d / "a-0.mkv", frames, 8.0)
    (tmp_path / "test" / "a-0.json").write_text(json.dumps({"info": {"frames_per_chunk": 4}}))
    result = compare_dirs(tmp_path / "ref", tmp_path / "test", lpips=False)
    assert result.videos[0].chunk_frames == 4 and len(result.videos[0].psnr_per_chunk) == 2
    forced = compare_dirs(tmp_path / "ref", tmp_path / "test", lpips=False, chunk_frames=2)
    assert len(forced.videos[0].psnr_per_chunk) == 4
    info = {"frames_per_chunk": 4, "first_chunk_frames": 1}  # a frame-wise causal-VAE model
    (tmp_path / "test" / "a-0.json").write_text(json.dumps({"info": info}))
    short = compare_dirs(tmp_path / "ref", tmp_path / "test", lpips=False).videos[0]
    assert short.first_chunk_frames == 1 and len(short.psnr_per_chunk) == 3  # 1 + 4 + 3
