"""Video I/O: bit-exact lossless round trip, readable mp4, atomic writes, clear read errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from jbkv_cli.utils import video
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.video import read_video, write_video_lossless, write_video_mp4


def _frames(t: int = 5, h: int = 37, w: int = 50, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (t, h, w, 3), generator=g, dtype=torch.uint8)


def _smooth_frames(t: int = 6, h: int = 48, w: int = 64) -> torch.Tensor:
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    frames = [
        torch.stack(((xx * 4 + i * 8) % 256, (yy * 5) % 256, (xx + yy + 3 * i) % 256), dim=-1)
        for i in range(t)
    ]
    return torch.stack(frames).to(torch.uint8)


@pytest.mark.parametrize("suffix", [".mkv", ".npz"])
@pytest.mark.parametrize("fps", [24.0, 16.0, 24000 / 1001])
def test_lossless_round_trip_is_bit_exact(tmp_path: Path, suffix: str, fps: float) -> None:
    frames = _frames()
    path = write_video_lossless(tmp_path / f"v{suffix}", frames, fps)
    decoded, decoded_fps = read_video(path)
    assert decoded.dtype == torch.uint8
    assert torch.equal(decoded, frames)
    assert decoded_fps == pytest.approx(fps, rel=1e-9)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"v{suffix}"]


def test_lossless_accepts_numpy_and_extreme_values(tmp_path: Path) -> None:
    frames = np.zeros((3, 16, 18, 3), dtype=np.uint8)
    frames[1] = 255
    frames[2, ::2] = 128
    decoded, _ = read_video(write_video_lossless(tmp_path / "v.mkv", frames, 8))
    assert np.array_equal(decoded.numpy(), frames)


def test_lossless_rejects_other_suffixes_and_bad_frames(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.mkv or \.npz"):
        write_video_lossless(tmp_path / "v.mp4", _frames(), 24)
    with pytest.raises(ValueError, match="uint8"):
        write_video_lossless(tmp_path / "v.mkv", _frames().float(), 24)
    with pytest.raises(ValueError, match="fps"):
        write_video_lossless(tmp_path / "v.mkv", _frames(), 0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size", [(48, 64), (37, 51)])
def test_mp4_is_readable_h264(tmp_path: Path, size: tuple[int, int]) -> None:
    h, w = size
    frames = _smooth_frames(h=h, w=w)
    path = write_video_mp4(tmp_path / "v.mp4", frames, 12)
    decoded, fps = read_video(path)
    assert fps == pytest.approx(12.0)
    assert decoded.shape == (6, h + h % 2, w + w % 2, 3)
    error = (decoded[:, :h, :w].float() - frames.float()).abs().mean()
    assert error < 6.0  # lossy (yuv420p, crf 18), but close on smooth content
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert stream.codec_context.pix_fmt == "yuv420p"


class _Boom(Exception):
    pass


@pytest.mark.parametrize("interrupt", [_Boom, KeyboardInterrupt])
def test_failed_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]
) -> None:
    original = video.av.VideoFrame.from_ndarray
    calls = {"n": 0}

    def failing(array: np.ndarray, format: str) -> object:
        calls["n"] += 1
        if calls["n"] == 3:
            raise interrupt()
        return original(array, format=format)

    monkeypatch.setattr(video.av.VideoFrame, "from_ndarray", failing)
    for writer, name in [(write_video_lossless, "a.mkv"), (write_video_mp4, "a.mp4")]:
        calls["n"] = 0
        with pytest.raises(interrupt):
            writer(tmp_path / name, _frames(), 24)
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_video_lossless(tmp_path / "a.mkv", _frames(seed=1), 24)
    before = target.read_bytes()

    def failing(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(video.av.VideoFrame, "from_ndarray", failing)
    with pytest.raises(KeyboardInterrupt):
        write_video_lossless(target, _frames(seed=2), 24)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["a.mkv"]


def _expect_read_error(path: Path, match: str) -> None:
    with pytest.raises(JbkvError, match=match) as info:
        read_video(path)
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message


def test_missing_and_empty_files(tmp_path: Path) -> None:
    _expect_read_error(tmp_path / "nope.mkv", "not found")
    for name in ["e.mkv", "e.mp4", "e.npz"]:
        (tmp_path / name).write_bytes(b"")
        _expect_read_error(tmp_path / name, "empty")


def test_garbage_files(tmp_path: Path) -> None:
    for name in ["g.mkv", "g.mp4", "g.npz"]:
        (tmp_path / name).write_bytes(b"not a video at all " * 50)
        _expect_read_error(tmp_path / name, "cannot read video")


@pytest.mark.parametrize("suffix", [".mkv", ".mp4", ".npz"])
def test_truncated_files(tmp_path: Path, suffix: str) -> None:
    frames = _frames(t=6, h=40, w=48)
    writer = write_video_mp4 if suffix == ".mp4" else write_video_lossless
    data = writer(tmp_path / f"full{suffix}", frames, 24).read_bytes()
    for i, cut in enumerate([len(data) // 2, 300]):
        path = tmp_path / f"cut{i}{suffix}"
        path.write_bytes(data[:cut])
        _expect_read_error(path, "cannot read video")


def test_corrupted_lossless_payload_is_detected(tmp_path: Path) -> None:
    data = bytearray(write_video_lossless(tmp_path / "v.mkv", _frames(t=6), 24).read_bytes())
    start = len(data) // 3
    data[start : start + 64] = bytes(b ^ 0xFF for b in data[start : start + 64])
    path = tmp_path / "bad.mkv"
    path.write_bytes(bytes(data))
    _expect_read_error(path, "cannot read video")


_ENCODE_TWICE = """
import hashlib, sys, torch
from jbkv_cli.utils import video
from jbkv_cli.models.registry import load_model
from jbkv_cli.kvcache.spec import KVSpec
model = load_model("tiny", num_chunks=2, steps=2)
prompt = "a red circle moves right on a dark background"
frames = model.generate(prompt, 0, KVSpec.build("rtn", 2)).frames
write = video.write_video_mp4 if sys.argv[1] == ".mp4" else video.write_video_lossless
for i in range(2):
    path = sys.argv[2] + str(i) + sys.argv[1]
    write(path, frames, 8)
    print(hashlib.sha256(open(path, "rb").read()).hexdigest())
"""


@pytest.mark.slow  # fresh interpreters
@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_video_bytes_are_reproducible_across_processes(tmp_path: Path, suffix: str) -> None:
    """Identical frames (a tiny-model video: x264's mb-tree rate control made these vary from
    run to run) give identical files, in one process and across processes (the RGB → YUV
    conversion is jbkv's, not the encoder scaler's; no random container UIDs)."""
    import subprocess
    import sys

    digests = set()
    for run in range(3):
        out = subprocess.run(
            [sys.executable, "-c", _ENCODE_TWICE, suffix, str(tmp_path / f"r{run}-")],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
        digests |= set(out.stdout.split())
    assert len(digests) == 1, digests
    frames = [read_video(p)[0] for p in sorted(tmp_path.glob(f"*{suffix}"))]
    assert all(torch.equal(frames[0], f) for f in frames[1:])


def test_rgb_to_yuv420p_is_bt601_limited_range() -> None:
    from jbkv_cli.utils.video import rgb_to_yuv420p

    gray = np.full((1, 2, 2, 3), 255, dtype=np.uint8)
    yuv = rgb_to_yuv420p(np.concatenate([gray * 0, gray]))
    assert yuv.shape == (2, 3, 2)
    assert (yuv[0, :2] == 16).all() and (yuv[1, :2] == 235).all()  # black and white luma
    assert (yuv[:, 2:] == 128).all()  # neutral chroma
    red = np.zeros((1, 2, 2, 3), dtype=np.uint8)
    red[..., 0] = 255
    y, cb, cr = rgb_to_yuv420p(red)[0].reshape(-1)[[0, 4, 5]]
    assert (y, cb, cr) == (81, 90, 240)  # Y = 16 + 219 · 0.299 = 81.48, Cr at its maximum
    with pytest.raises(ValueError, match="even"):
        rgb_to_yuv420p(np.zeros((1, 3, 2, 3), dtype=np.uint8))


def test_failed_video_write_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jbkv_cli.utils.video as video

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(video, "_encode", full)
    target = tmp_path / "v" / "a-0.mp4"
    with pytest.raises(JbkvError, match=r"cannot write video .*a-0.mp4: No space left"):
        video.write_video_mp4(target, np.zeros((2, 8, 8, 3), dtype=np.uint8), 8)
    assert list(target.parent.iterdir()) == []
