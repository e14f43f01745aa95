"""Video files: a bit-exact lossless copy for fidelity, an H.264 mp4 for people and VBench.

Formats written:

- ``.mkv``: FFV1 (level 3, per-slice CRCs) on ``bgr0`` pixels in Matroska. RGB is stored as is
  (no YUV conversion), so ``read_video`` returns the written uint8 frames bit for bit. The frame
  count and the SHA-256 of the frames (C-order bytes) are stored as container tags
  ``JBKV_FRAMES`` and ``JBKV_SHA256`` (written in the header), so a truncated or corrupted file
  is detected instead of silently decoding fewer frames or concealed errors. Containers are
  written bit-exact (no random segment UID, no date), so identical frames give identical files.
- ``.npz``: ``frames`` (uint8 [T, H, W, 3]) and ``fps``, zip-compressed; exact as well.
- ``.mp4``: H.264 (libx264, ``yuv420p``, CRF 18): lossy, for viewing and VBench. yuv420p
  needs even sizes: odd frames are padded by one replicated row/column at the bottom/right
  (nothing is rescaled), so the decoded mp4 can be one pixel larger than the input. The
  RGB → YUV conversion is done here, not by the encoder's scaler (whose output varied from run
  to run on identical frames): BT.601 limited range (the matrix decoders assume by default, and
  tagged as such in the stream), chroma the mean of each 2×2 block, rounded to nearest.
  x264's macroblock-tree rate control is off (``mbtree=0``): with it, the libx264 bundled with
  PyAV gave different bitstreams for identical frames from run to run (measured: 6 different
  files in 18 encodes of one tiny-model video; 1 in 18 with it off). So identical frames give
  byte-identical files, identical decoded frames and identical VBench scores.

All writes are atomic (temp file in the same directory, then rename); see ``jbkv_cli.utils.atomic``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import av.error
import numpy as np
import torch

from jbkv_cli.utils.atomic import atomic_path
from jbkv_cli.utils.errors import JbkvError

LOSSLESS_SUFFIXES = (".mkv", ".npz")
VIDEO_SUFFIXES = (".mkv", ".npz", ".mp4", ".mov", ".avi", ".webm", ".m4v", ".gif")
FRAMES_TAG = "JBKV_FRAMES"
SHA256_TAG = "JBKV_SHA256"
FFV1_OPTIONS = {"level": "3", "slicecrc": "1"}
# No random segment UIDs or dates in the container: identical frames give identical files.
BITEXACT = {"fflags": "+bitexact"}

PathLike = str | os.PathLike[str]


def write_video_lossless(path: PathLike, frames: torch.Tensor | np.ndarray, fps: float) -> Path:
    """Write uint8 RGB ``frames`` [T, H, W, 3] losslessly to ``path`` (``.mkv`` or ``.npz``)."""
    target = Path(path)
    array = _as_frames(frames)
    rate = _as_rate(fps)
    suffix = target.suffix.lower()
    if suffix not in LOSSLESS_SUFFIXES:
        raise ValueError(f"lossless video must end in .mkv or .npz, got {target}")
    with _writing(target) as tmp:
        if suffix == ".npz":
            with tmp.open("wb") as f:
                np.savez_compressed(f, frames=array, fps=np.float64(float(rate)))
        else:
            _encode(tmp, array, rate, "matroska", "ffv1", "bgr0", FFV1_OPTIONS, tag=_sha256(array))
    return target


@contextlib.contextmanager
def _writing(target: Path) -> Iterator[Path]:
    """:func:`atomic_path`, with a failed write reported as one line naming the file."""
    try:
        with atomic_path(target) as tmp:
            yield tmp
    except (OSError, av.error.FFmpegError) as exc:
        raise JbkvError(f"cannot write video {target}: {_reason(exc)}") from exc


def write_video_mp4(
    path: PathLike,
    frames: torch.Tensor | np.ndarray,
    fps: float,
    *,
    crf: int = 18,
    preset: str = "medium",
) -> Path:
    """Write uint8 RGB ``frames`` [T, H, W, 3] as H.264 yuv420p mp4 (odd sizes edge-padded)."""
    target = Path(path)
    array = _as_frames(frames)
    rate = _as_rate(fps)
    pad_h, pad_w = array.shape[1] % 2, array.shape[2] % 2
    if pad_h or pad_w:
        array = np.pad(array, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    options = {"crf": str(crf), "preset": preset, "x264-params": "mbtree=0"}
    with _writing(target) as tmp:
        _encode(tmp, rgb_to_yuv420p(array), rate, "mp4", "libx264", "yuv420p", options)
    return target


# BT.601 (SMPTE 170M) limited range, RGB in [0, 255] -> Y' in [16, 235], Cb/Cr in [16, 240]:
# rows are (219/255)·(0.299, 0.587, 0.114) and (224/255)·(B − Y')/1.772, (R − Y')/1.402, in
# fixed point with 16 fractional bits (integer arithmetic: the same result on every machine,
# unlike a float matrix product, whose BLAS kernel and threading can flip a rounding).
_FRAC = 16
_BT601 = np.rint(
    np.array(
        [
            [0.299, 0.587, 0.114],
            [-0.299 / 1.772, -0.587 / 1.772, 0.886 / 1.772],
            [0.701 / 1.402, -0.587 / 1.402, -0.114 / 1.402],
        ]
    )
    * np.array([[219.0], [224.0], [224.0]])
    / 255.0
    * (1 << _FRAC)
).astype(np.int64)


def rgb_to_yuv420p(frames: np.ndarray) -> np.ndarray:
    """uint8 RGB ``[T, H, W, 3]`` (even H, W) -> planar yuv420p ``[T, H·3/2, W]`` (PyAV layout).

    ``Y = 16 + 219·(0.299 R + 0.587 G + 0.114 B)/255``, ``Cb = 128 + 224·(B − Y')/(1.772·255)``,
    ``Cr = 128 + 224·(R − Y')/(1.402·255)`` (BT.601, limited range), with ``Y' = 0.299 R + …``;
    chroma is the mean of each 2×2 block; every plane is rounded to nearest, in integers.
    """
    t, h, w, _ = frames.shape
    if h % 2 or w % 2:
        raise ValueError(f"yuv420p needs even frame sizes, got {w}x{h}")
    rgb = frames.astype(np.int64)
    half = 1 << (_FRAC - 1)
    out = np.empty((t, h * 3 // 2, w), dtype=np.uint8)
    y = (rgb * _BT601[0]).sum(-1) + (16 << _FRAC) + half
    out[:, :h] = np.clip(y >> _FRAC, 0, 255)
    quarter = (h // 2) * (w // 2)
    chroma = out[:, h:].reshape(t, 2, quarter)
    for i in (1, 2):
        c = (rgb * _BT601[i]).sum(-1).reshape(t, h // 2, 2, w // 2, 2).sum(axis=(2, 4))
        c = (c + (4 * 128 << _FRAC) + 2 * half) >> (_FRAC + 2)  # mean of 4, rounded
        chroma[:, i - 1] = np.clip(c, 0, 255).reshape(t, quarter)
    return out


def read_video(path: PathLike) -> tuple[torch.Tensor, float]:
    """Decode ``path`` to (uint8 RGB frames [T, H, W, 3] on CPU, fps).

    ``.npz`` files without an ``fps`` entry report fps 0.0. Unreadable, corrupt, truncated or
    empty files raise ``JbkvError`` naming the file.
    """
    source = Path(path)
    if not source.is_file():
        raise JbkvError(f"video not found: {source}")
    if source.stat().st_size == 0:
        raise JbkvError(f"cannot read video {source}: the file is empty")
    if source.suffix.lower() == ".npz":
        array, fps = _read_npz(source)
    else:
        array, fps = _read_av(source)
    return torch.from_numpy(array), fps


def _encode(
    path: Path,
    frames: np.ndarray,
    rate: Fraction,
    container_format: str,
    codec: str,
    pix_fmt: str,
    options: dict[str, str],
    *,
    tag: str | None = None,
) -> None:
    """Encode ``frames``: RGB ``[T, H, W, 3]`` (written as ``rgb24``, the codec converts
    losslessly to ``bgr0``), or planar yuv420p ``[T, H·3/2, W]`` passed through unconverted.
    ``tag``: the frames' SHA-256, stored with the frame count in the container header."""
    yuv = pix_fmt == "yuv420p"
    height = frames.shape[1] * 2 // 3 if yuv else frames.shape[1]
    with av.open(str(path), mode="w", format=container_format, options=BITEXACT) as container:
        if tag is not None:
            container.metadata[FRAMES_TAG] = str(frames.shape[0])
            container.metadata[SHA256_TAG] = tag
        stream = container.add_stream(codec, rate=rate, options=options)
        stream.width = frames.shape[2]
        stream.height = height
        stream.pix_fmt = pix_fmt
        if yuv:
            ctx = stream.codec_context
            ctx.color_range = 1  # MPEG (limited) range
            ctx.colorspace = ctx.color_primaries = ctx.color_trc = 6  # SMPTE 170M = BT.601
        for frame in frames:
            data = np.ascontiguousarray(frame)
            video_frame = av.VideoFrame.from_ndarray(data, format=pix_fmt if yuv else "rgb24")
            container.mux(stream.encode(video_frame))
        container.mux(stream.encode(None))


def _read_av(path: Path) -> tuple[np.ndarray, float]:
    try:
        with av.open(str(path), mode="r") as container:
            if not container.streams.video:
                raise JbkvError(f"cannot read video {path}: no video stream")
            stream = container.streams.video[0]
            declared = _declared_frames(container, stream)
            checksum = container.metadata.get(SHA256_TAG)
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            decoded = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    except JbkvError:
        raise
    except Exception as exc:  # any failure to parse an untrusted file (FFmpeg, OS, ...)
        raise JbkvError(f"cannot read video {path}: {_reason(exc)}") from exc
    if not decoded:
        raise JbkvError(f"cannot read video {path}: no frames decoded")
    if declared is not None and len(decoded) < declared:
        raise JbkvError(
            f"cannot read video {path}: truncated or corrupt "
            f"(decoded {len(decoded)} of {declared} frames)"
        )
    if any(f.shape != decoded[0].shape for f in decoded):
        raise JbkvError(f"cannot read video {path}: frame size changes within the stream")
    array = np.stack(decoded)
    if checksum is not None and checksum.lower() != _sha256(array):
        raise JbkvError(f"cannot read video {path}: corrupt (frame checksum mismatch)")
    fps = float(rate) if rate else 0.0
    return array, fps


def _declared_frames(container: av.container.InputContainer, stream: av.VideoStream) -> int | None:
    tag = container.metadata.get(FRAMES_TAG)
    if tag is not None:
        try:
            return int(tag)
        except ValueError:
            raise JbkvError(f"cannot read video {container.name}: bad {FRAMES_TAG} tag") from None
    return stream.frames or None


def _read_npz(path: Path) -> tuple[np.ndarray, float]:
    try:
        with np.load(path, allow_pickle=False) as data:
            if "frames" not in data:
                raise JbkvError(f"cannot read video {path}: no 'frames' array in the .npz")
            array = data["frames"]
            fps = float(data["fps"]) if "fps" in data else 0.0
    except JbkvError:
        raise
    except Exception as exc:  # any failure to parse an untrusted file (zlib, zip, header, ...)
        raise JbkvError(f"cannot read video {path}: {_reason(exc)}") from exc
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3 or array.shape[0] == 0:
        raise JbkvError(
            f"cannot read video {path}: 'frames' must be uint8 [T, H, W, 3] with T >= 1, "
            f"got {array.dtype} {list(array.shape)}"
        )
    return array, fps


def _sha256(frames: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(frames).data).hexdigest()


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())


def _as_frames(frames: torch.Tensor | np.ndarray) -> np.ndarray:
    array = frames.detach().cpu().numpy() if isinstance(frames, torch.Tensor) else frames
    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3 or array.shape[0] == 0:
        raise ValueError(
            f"frames must be uint8 [T, H, W, 3] with T >= 1, got {array.dtype} {list(array.shape)}"
        )
    return array


def _as_rate(fps: float) -> Fraction:
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    return Fraction(fps).limit_denominator(10_000)
