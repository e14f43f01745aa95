"""Per-chunk (drift) scores: chunk means and the chunk length of a record."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.metrics.chunks import chunk_frames_of, per_chunk
from jbkv_cli.metrics.fidelity import compare_videos


def test_per_chunk_means_align_to_frame_zero():
    x = [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0]
    assert per_chunk(x, 2) == [2.0, 6.0, 10.0, 13.0]
    assert per_chunk(x, 3, skipped=1) == [2.0, 7.0, 12.0]  # frames 1-2 | 3-5 | 6-7
    assert per_chunk(x, 1) == x
    assert per_chunk([], 4) == []
    with pytest.raises(ValueError):
        per_chunk(x, 0)


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
    from jbkv_cli.video import write_video_lossless

    frames = torch.randint(0, 256, (8, 16, 16, 3), dtype=torch.uint8)
    for d in ("ref", "test"):
        write_video_lossless(tmp_path / d / "a-0.mkv", frames, 8.0)
    (tmp_path / "test" / "a-0.json").write_text(json.dumps({"info": {"frames_per_chunk": 4}}))
    result = compare_dirs(tmp_path / "ref", tmp_path / "test", lpips=False)
    assert result.videos[0].chunk_frames == 4 and len(result.videos[0].psnr_per_chunk) == 2
    forced = compare_dirs(tmp_path / "ref", tmp_path / "test", lpips=False, chunk_frames=2)
    assert len(forced.videos[0].psnr_per_chunk) == 4
