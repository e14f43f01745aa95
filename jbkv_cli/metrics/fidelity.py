"""Paired fidelity of test videos against reference videos: PSNR, SSIM, LPIPS.

Protocol (torchmetrics style: per-frame statistics first, then one reduction):

1. Both videos are decoded to uint8 RGB; frame count and size must match exactly (no
   truncation to the shorter one). The first ``skip_frames`` frames are dropped from both.
2. Per frame t: PSNR_t (peak 255, capped at ``PSNR_CAP_DB`` for identical frames), SSIM_t
   (Wang 2004, scikit-image settings), LPIPS_t (AlexNet, [−1, 1]) when available.
3. Per video: the mean over frames of each; also ``psnr_pooled`` = PSNR of the MSE pooled over
   all compared frames, and ``identical_frames`` = frames with MSE = 0.
4. Per chunk (drift): the mean over each chunk's frames (``*_per_chunk``, chunk ``first_chunk``
   first; :mod:`jbkv_cli.metrics.chunks`). ``chunk_frames`` comes from the caller or the
   ``.json`` record beside the test video; unknown -> 1 (per frame).
5. Across videos: mean ± standard error (``jbkv_cli.metrics.stats.aggregate``).

Videos in two folders are paired by their path relative to the folder, without the suffix
(``a/b.mkv`` pairs with ``a/b.mp4``). When one folder holds the same stem in several formats, the
first in ``VIDEO_SUFFIXES`` order (lossless first) is used and a warning says so.

Folders that jbkv wrote (every video has its record ``<name>.json`` beside it) are paired by
identity instead: (sub-folder, prompt, seed) from the records, because a file name carries the
seed's *position* in the command that made it (``{prompt}-{index}``), not the seed. A record
whose prompt and index do not match its file name (a renamed file) is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.metrics.chunks import chunk_frames_of, chunk_of, first_chunk_frames_of, per_chunk
from jbkv_cli.metrics.folders import check_video_folder
from jbkv_cli.metrics.perceptual import DESCRIPTION as LPIPS_DESCRIPTION
from jbkv_cli.metrics.perceptual import LpipsAlex, try_load_lpips
from jbkv_cli.metrics.psnr import PSNR_CAP_DB, mse_per_frame, psnr_from_mse
from jbkv_cli.metrics.ssim import SIGMA, ssim_per_frame, window_size
from jbkv_cli.metrics.stats import aggregate
from jbkv_cli.utils import distributed
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.video import VIDEO_SUFFIXES, read_video

METRICS = ("psnr", "psnr_pooled", "ssim", "lpips")
PROTOCOL = {
    "frames": "uint8 RGB, decoded with PyAV; counts and sizes must match",
    "psnr": f"per frame, peak 255, mean over frames; per-frame values capped at {PSNR_CAP_DB} dB "
    "(identical frames get the cap and are counted in identical_frames)",
    "psnr_pooled": "PSNR of the MSE pooled over all compared frames of a video (same cap)",
    "ssim": f"Wang 2004: Gaussian window sigma={SIGMA} ({window_size()}x{window_size()}), "
    "population covariance, data range 255, per channel then averaged, border cropped "
    "(scikit-image gaussian_weights=True), per frame, mean over frames",
    "lpips": f"{LPIPS_DESCRIPTION}, per frame, mean over frames",
    "per_chunk": "mean of the per-frame values over each chunk of chunk_frames frames, counted "
    "from frame 0 of the video (first_chunk = the first chunk with compared frames); "
    "chunk_frames 1 when the chunk length is unknown",
    "aggregate": "per-video means, then mean and standard error (sample std / sqrt(n)) over videos",
}


@dataclass
class VideoScores:
    """Scores of one (reference, test) pair over the compared frames."""

    name: str
    ref_path: str
    test_path: str
    frames: int
    skipped_frames: int
    height: int
    width: int
    psnr: float
    psnr_pooled: float
    identical_frames: int
    ssim: float
    lpips: float | None
    psnr_per_frame: list[float] = field(repr=False)
    ssim_per_frame: list[float] = field(repr=False)
    lpips_per_frame: list[float] | None = field(default=None, repr=False)
    chunk_frames: int = 1
    first_chunk: int = 0
    first_chunk_frames: int | None = None  # None: a full chunk (metrics/chunks.py)
    psnr_per_chunk: list[float] = field(default_factory=list, repr=False)
    ssim_per_chunk: list[float] = field(default_factory=list, repr=False)
    lpips_per_chunk: list[float] | None = field(default=None, repr=False)

    def to_dict(self, per_frame: bool = True) -> dict[str, Any]:
        data = asdict(self)
        if not per_frame:
            for key in ("psnr_per_frame", "ssim_per_frame", "lpips_per_frame"):
                data.pop(key)
        return data


@dataclass
class FidelityResult:
    """Per-video scores, their aggregates, and what was skipped or unavailable."""

    ref_dir: str
    test_dir: str
    skip_frames: int
    videos: list[VideoScores]
    aggregate: dict[str, dict[str, float | int | None]]
    lpips_status: str
    warnings: list[str] = field(default_factory=list)
    protocol: dict[str, str] = field(default_factory=lambda: dict(PROTOCOL))

    def to_dict(self, per_frame: bool = True) -> dict[str, Any]:
        return {
            "ref_dir": self.ref_dir,
            "test_dir": self.test_dir,
            "skip_frames": self.skip_frames,
            "lpips_status": self.lpips_status,
            "aggregate": self.aggregate,
            "videos": [v.to_dict(per_frame) for v in self.videos],
            "warnings": list(self.warnings),
            "protocol": dict(self.protocol),
        }


def compare_videos(
    ref: str | Path | torch.Tensor,
    test: str | Path | torch.Tensor,
    skip_frames: int = 0,
    lpips: LpipsAlex | None = None,
    *,
    name: str | None = None,
    device: torch.device | str | None = None,
    chunk_frames: int | None = None,
    first_chunk_frames: int | None = None,
) -> VideoScores:
    """Score ``test`` against ``ref`` (paths, or uint8 frames [T, H, W, 3]).

    ``chunk_frames``: frames per generated chunk, for the per-chunk (drift) lists; None -> 1.
    ``first_chunk_frames``: frames of the first chunk when it is shorter (a causal VAE's;
    :mod:`jbkv_cli.metrics.chunks`); None -> a full chunk. Ignored when ``chunk_frames`` is None.
    """
    ref_frames, ref_label = _frames(ref, "ref")
    test_frames, test_label = _frames(test, "test")
    if ref_frames.shape[1:] != test_frames.shape[1:]:
        raise JbkvError(
            f"frame size differs: {ref_label} is {_size(ref_frames)}, "
            f"{test_label} is {_size(test_frames)}"
        )
    if ref_frames.shape[0] != test_frames.shape[0]:
        raise JbkvError(
            f"frame count differs: {ref_label} has {ref_frames.shape[0]}, "
            f"{test_label} has {test_frames.shape[0]}"
        )
    if skip_frames < 0:
        raise JbkvError(f"skip_frames must be >= 0, got {skip_frames}")
    chunk = 1 if chunk_frames is None else chunk_frames
    first = None if chunk_frames is None or first_chunk_frames == chunk else first_chunk_frames
    if chunk < 1 or (first is not None and first < 1):
        raise JbkvError(f"chunk_frames must be >= 1, got {chunk_frames} (first {first})")
    if skip_frames >= ref_frames.shape[0]:
        raise JbkvError(
            f"skip_frames={skip_frames} leaves no frames to compare in {ref_label} "
            f"({ref_frames.shape[0]} frames)"
        )
    height, width = ref_frames.shape[1:3]
    win = window_size()
    if height < win or width < win:
        raise JbkvError(
            f"SSIM needs frames of at least {win}x{win}: {ref_label} is {_size(ref_frames)}"
        )
    ref_frames = ref_frames[skip_frames:]
    test_frames = test_frames[skip_frames:]

    mse = mse_per_frame(ref_frames, test_frames)
    psnr_t = psnr_from_mse(mse)
    pooled = float(psnr_from_mse(mse.mean()))
    ssim_t = ssim_per_frame(ref_frames, test_frames, device=device)
    lpips_t = None
    if lpips is not None:
        try:
            lpips_t = lpips.per_frame(ref_frames, test_frames)
        except RuntimeError as exc:
            reason = " ".join(str(exc).split())[:160]
            raise JbkvError(f"LPIPS failed on {test_label}: {reason}") from exc
    return VideoScores(
        name=name or Path(test_label).stem,
        ref_path=ref_label,
        test_path=test_label,
        frames=int(ref_frames.shape[0]),
        skipped_frames=skip_frames,
        height=int(height),
        width=int(width),
        psnr=_mean(psnr_t),
        psnr_pooled=pooled,
        identical_frames=int((mse == 0).sum()),
        ssim=_mean(ssim_t),
        lpips=None if lpips_t is None else _mean(lpips_t),
        psnr_per_frame=psnr_t.tolist(),
        ssim_per_frame=ssim_t.tolist(),
        lpips_per_frame=None if lpips_t is None else lpips_t.tolist(),
        chunk_frames=chunk,
        first_chunk=chunk_of(skip_frames, chunk, first),
        first_chunk_frames=first,
        psnr_per_chunk=per_chunk(psnr_t, chunk, skip_frames, first),
        ssim_per_chunk=per_chunk(ssim_t, chunk, skip_frames, first),
        lpips_per_chunk=None if lpips_t is None else per_chunk(lpips_t, chunk, skip_frames, first),
    )


def compare_dirs(
    ref_dir: str | Path,
    test_dir: str | Path,
    *,
    skip_frames: int = 0,
    allow_missing: bool = False,
    lpips: bool | LpipsAlex = True,
    device: torch.device | str | None = None,
    chunk_frames: int | None = None,
) -> FidelityResult:
    """Pair videos of ``test_dir`` with ``ref_dir`` by relative stem and score every pair.

    ``lpips``: True loads LPIPS-AlexNet offline (unavailable -> a warning, no LPIPS column),
    False disables it, or pass a loaded ``LpipsAlex``. Missing partners raise ``JbkvError``
    unless ``allow_missing``, which skips them with a warning. ``chunk_frames`` None: read it
    from the jbkv record (``<name>.json``) beside each test video (with its first chunk's
    length), else 1 (per frame).
    """
    warnings: list[str] = []
    refs = _scan(Path(ref_dir), "reference", warnings)
    tests = _scan(Path(test_dir), "test", warnings)
    names = {k: k for k in tests}
    ref_ids, test_ids = _identities(refs), _identities(tests)
    if ref_ids is not None and test_ids is not None:
        ref_names = {ref_ids[k]: k for k in refs}
        names = {test_ids[k]: k for k in tests}
        refs = {ref_ids[k]: p for k, p in refs.items()}
        tests = {test_ids[k]: p for k, p in tests.items()}
        renamed = sum(ref_names[k] != names[k] for k in set(refs) & set(tests))
        if renamed:
            warnings.append(
                f"paired by (prompt, seed) from the jbkv records: {renamed} video(s) have "
                "different file names in the two folders"
            )
    only_ref = sorted(set(refs) - set(tests), key=str)
    only_test = sorted(set(tests) - set(refs), key=str)
    problems = [f"{_label(k)}: no test video in {test_dir}" for k in only_ref]
    problems += [f"{_label(k)}: no reference video in {ref_dir}" for k in only_test]
    if problems and not allow_missing:
        shown = "; ".join(problems[:5]) + (
            f"; … {len(problems) - 5} more" if len(problems) > 5 else ""
        )
        raise JbkvError(f"unpaired videos ({len(problems)}): {shown} (use --allow-missing to skip)")
    warnings.extend(f"skipped {p}" for p in problems)
    keys = sorted(set(refs) & set(tests), key=lambda k: names[k])
    if not keys:
        raise JbkvError(f"no video in {test_dir} has a partner in {ref_dir}")

    if lpips is True:
        scorer, lpips_status = try_load_lpips(device)
        if scorer is None:
            warnings.append(lpips_status)
    elif lpips is False:
        scorer, lpips_status = None, "disabled"
    else:
        scorer, lpips_status = lpips, LPIPS_DESCRIPTION

    def score(k) -> VideoScores:
        return compare_videos(
            refs[k],
            tests[k],
            skip_frames,
            scorer,
            name=names[k],
            device=device,
            **({"chunk_frames": chunk_frames} if chunk_frames else _recorded_chunks(tests[k])),
        )

    # Under torchrun each rank scores its share of the pairs and every rank gets all scores.
    videos = distributed.map_sharded(score, keys, "scoring the pairs")
    return FidelityResult(
        ref_dir=str(ref_dir),
        test_dir=str(test_dir),
        skip_frames=skip_frames,
        videos=videos,
        aggregate=aggregate_scores(videos),
        lpips_status=lpips_status,
        warnings=warnings,
    )


def aggregate_scores(videos: list[VideoScores]) -> dict[str, dict[str, float | int | None]]:
    """Mean ± SE over videos of each per-video metric (LPIPS over videos that have it)."""
    out = {}
    for metric in METRICS:
        values = [getattr(v, metric) for v in videos]
        out[metric] = aggregate(x for x in values if x is not None)
    return out


def _scan(root: Path, role: str, warnings: list[str]) -> dict[str, Path]:
    check_video_folder(root, role)
    found: dict[str, list[Path]] = {}
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if path.suffix.lower() in VIDEO_SUFFIXES and path.is_file():
            found.setdefault(relative.with_suffix("").as_posix(), []).append(path)
    if not found:
        raise JbkvError(f"no videos ({', '.join(VIDEO_SUFFIXES)}) found in {role} folder {root}")
    chosen = {}
    for key, paths in found.items():
        paths.sort(key=lambda p: VIDEO_SUFFIXES.index(p.suffix.lower()))
        chosen[key] = paths[0]
        if len(paths) > 1:
            ignored = ", ".join(p.name for p in paths[1:])
            warnings.append(f"{key}: using {paths[0]} (ignoring {ignored})")
    return chosen


Identity = tuple[str, str, int]


def _identities(files: dict[str, Path]) -> dict[str, Identity] | None:
    """``{name: (sub-folder, prompt, seed)}`` when every video has a jbkv record beside it
    (a folder jbkv wrote), else None (a plain folder of videos, paired by name)."""
    ids: dict[str, Identity] = {}
    for name, path in files.items():
        record = path.with_suffix(".json")
        if not record.is_file():
            return None
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return None
        if not (
            isinstance(data, dict)
            and isinstance(data.get("prompt"), str)
            and type(data.get("seed")) is int
            and type(data.get("index")) is int
        ):
            return None
        if f"{data['prompt']}-{data['index']}" != path.stem:
            raise JbkvError(
                f"{record} records prompt {data['prompt'][:40]!r} index {data['index']}, which "
                f"its video's name {path.name!r} does not match (renamed?)"
            )
        folder = name.rpartition("/")[0]
        ids[name] = (folder, data["prompt"], data["seed"])
    if len(set(ids.values())) != len(ids):
        return None
    return ids


def _label(key: str | Identity) -> str:
    if isinstance(key, str):
        return key
    folder, prompt, seed = key
    return f"{folder + '/' if folder else ''}{prompt[:40]} (seed {seed})"


def _recorded_chunks(video: Path) -> dict[str, int | None]:
    """``chunk_frames`` and ``first_chunk_frames`` from the jbkv record beside ``video``, if
    there is a readable one (else both None: per frame)."""
    try:
        record = json.loads(video.with_suffix(".json").read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        return {"chunk_frames": None, "first_chunk_frames": None}
    return {
        "chunk_frames": chunk_frames_of(record),
        "first_chunk_frames": first_chunk_frames_of(record),
    }


def _frames(source: str | Path | torch.Tensor, label: str) -> tuple[torch.Tensor, str]:
    if isinstance(source, torch.Tensor):
        if source.dtype != torch.uint8 or source.ndim != 4 or source.shape[-1] != 3:
            raise JbkvError(
                f"{label} frames must be uint8 [T, H, W, 3], got {source.dtype} {list(source.shape)}"
            )
        return source, label
    frames, _ = read_video(source)
    return frames, str(source)


def _size(frames: torch.Tensor) -> str:
    return f"{frames.shape[2]}x{frames.shape[1]}"


def _mean(values: torch.Tensor) -> float:
    mean = float(values.to(torch.float64).mean())
    if not math.isfinite(mean):
        raise JbkvError(f"non-finite metric value {mean}")
    return mean
