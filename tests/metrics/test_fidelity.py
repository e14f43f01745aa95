"""PSNR/SSIM against scikit-image, pairing, errors, and LPIPS (unavailable and random-weights)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from jbkv_cli.metrics import perceptual
from jbkv_cli.metrics.fidelity import compare_dirs, compare_videos
from jbkv_cli.metrics.psnr import PSNR_CAP_DB, psnr_per_frame
from jbkv_cli.metrics.ssim import gaussian_taps, ssim_per_frame, window_size
from jbkv_cli.metrics.stats import aggregate
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.video import write_video_lossless, write_video_mp4

REL = 1e-6
ALEX_SHAPES = {0: (64, 3, 11, 11), 3: (192, 64, 5, 5), 6: (384, 192, 3, 3), 8: (256, 384, 3, 3)}
ALEX_SHAPES[10] = (256, 256, 3, 3)


def _video(t: int = 4, h: int = 40, w: int = 48, seed: int = 0) -> torch.Tensor:
    """Smooth content plus texture, so blur and shifts change it meaningfully."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    base = torch.stack((xx * 3.0, yy * 4.0, (xx + yy) * 2.0), dim=-1)
    frames = [base + 10 * i + 40 * torch.rand(h, w, 3, generator=g) for i in range(t)]
    return torch.stack(frames).clamp(0, 255).round().to(torch.uint8)


def _noise(v: torch.Tensor, sigma: float, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (
        (v.float() + sigma * torch.randn(v.shape, generator=g))
        .clamp(0, 255)
        .round()
        .to(torch.uint8)
    )


def _shift(v: torch.Tensor) -> torch.Tensor:
    return torch.roll(v, shifts=(1, 2), dims=(1, 2))


def _blur(v: torch.Tensor) -> torch.Tensor:
    x = v.permute(0, 3, 1, 2).float()
    x = torch.nn.functional.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)
    return x.round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


DISTORTIONS = {
    "noise": lambda v: _noise(v, 8.0),
    "strong_noise": lambda v: _noise(v, 60.0),
    "shift": _shift,
    "blur": _blur,
    "one_pixel": lambda v: _set_pixel(v.clone()),
}


def _set_pixel(v: torch.Tensor) -> torch.Tensor:
    v[:, 3, 5, 1] ^= 1
    return v


def _sk_ssim(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return np.array(
        [
            structural_similarity(
                x,
                y,
                gaussian_weights=True,
                sigma=1.5,
                use_sample_covariance=False,
                data_range=255,
                channel_axis=-1,
            )
            for x, y in zip(a.numpy(), b.numpy(), strict=True)
        ]
    )


def _sk_psnr(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return np.array(
        [
            peak_signal_noise_ratio(x, y, data_range=255)
            for x, y in zip(a.numpy(), b.numpy(), strict=True)
        ]
    )


def test_gaussian_window_matches_skimage_settings() -> None:
    taps = gaussian_taps()
    assert window_size() == taps.numel() == 11
    assert math.isclose(float(taps.sum()), 1.0, rel_tol=1e-15)
    assert torch.equal(taps, taps.flip(0))


@pytest.mark.parametrize("distortion", sorted(DISTORTIONS))
def test_psnr_and_ssim_match_skimage(distortion: str) -> None:
    ref = _video()
    test = DISTORTIONS[distortion](ref)
    np.testing.assert_allclose(psnr_per_frame(ref, test).numpy(), _sk_psnr(ref, test), rtol=REL)
    np.testing.assert_allclose(ssim_per_frame(ref, test).numpy(), _sk_ssim(ref, test), rtol=REL)


@pytest.mark.parametrize("tile", [64, 1000, 4096, 1 << 20])
def test_ssim_tiling_does_not_change_values(tile: int) -> None:
    ref = _video(t=3, h=33, w=70, seed=3)
    test = _noise(ref, 20.0)
    np.testing.assert_allclose(
        ssim_per_frame(ref, test, tile_elements=tile).numpy(), _sk_ssim(ref, test), rtol=REL
    )


def test_ssim_minimum_size_and_exact_window() -> None:
    ref = _video(t=2, h=11, w=11)
    test = _noise(ref, 30.0)
    np.testing.assert_allclose(ssim_per_frame(ref, test).numpy(), _sk_ssim(ref, test), rtol=REL)
    with pytest.raises(ValueError, match="11x11"):
        ssim_per_frame(ref[:, :10], test[:, :10])


def test_identical_videos_are_finite_and_flagged() -> None:
    ref = _video()
    scores = compare_videos(ref, ref.clone())
    assert scores.psnr == PSNR_CAP_DB
    assert scores.psnr_pooled == PSNR_CAP_DB
    assert scores.identical_frames == ref.shape[0]
    assert scores.ssim == pytest.approx(1.0, abs=1e-12)
    assert scores.lpips is None


def test_partly_identical_video_uses_cap_for_identical_frames() -> None:
    ref = _video(t=4)
    test = ref.clone()
    test[2:] = _noise(ref[2:], 10.0)
    scores = compare_videos(ref, test)
    expected = _sk_psnr(ref[2:], test[2:])
    assert scores.identical_frames == 2
    assert scores.psnr == pytest.approx((2 * PSNR_CAP_DB + expected.sum()) / 4, rel=REL)
    assert math.isfinite(scores.psnr_pooled) and scores.psnr_pooled < PSNR_CAP_DB


def test_skip_frames() -> None:
    ref = _video(t=5)
    test = _noise(ref, 10.0)
    scores = compare_videos(ref, test, skip_frames=2)
    assert scores.frames == 3 and scores.skipped_frames == 2
    assert scores.ssim == pytest.approx(_sk_ssim(ref[2:], test[2:]).mean(), rel=REL)
    with pytest.raises(JbkvError, match="leaves no frames"):
        compare_videos(ref, test, skip_frames=5)


def test_mismatched_videos_raise_naming_files(tmp_path: Path) -> None:
    ref = write_video_lossless(tmp_path / "ref.mkv", _video(t=4), 24)
    short = write_video_lossless(tmp_path / "short.mkv", _video(t=3), 24)
    small = write_video_lossless(tmp_path / "small.mkv", _video(t=4, w=46), 24)
    with pytest.raises(JbkvError, match="frame count") as info:
        compare_videos(ref, short)
    assert str(ref) in str(info.value) and str(short) in str(info.value)
    with pytest.raises(JbkvError, match="frame size") as info:
        compare_videos(ref, small)
    assert str(small) in str(info.value)


def _tree(root: Path, names: dict[str, torch.Tensor], writer=write_video_lossless) -> None:
    for name, frames in names.items():
        writer(root / name, frames, 16)


def test_compare_dirs_pairs_by_relative_stem(tmp_path: Path) -> None:
    a, b, c = _video(seed=0), _video(seed=1), _video(seed=2)
    _tree(tmp_path / "ref", {"a.mkv": a, "sub/b.npz": b, "c.mkv": c})
    _tree(tmp_path / "test", {"a.npz": a, "sub/b.mkv": _noise(b, 5.0), "c.mkv": _blur(c)})
    (tmp_path / "test" / "notes.txt").write_text("not a video")
    (tmp_path / "test" / ".c.mkv.abc.tmp.mkv").write_bytes(b"stale temp file")
    result = compare_dirs(tmp_path / "ref", tmp_path / "test", lpips=False)
    assert [v.name for v in result.videos] == ["a", "c", "sub/b"]
    assert result.videos[0].identical_frames == 4
    assert result.lpips_status == "disabled"
    assert result.warnings == []
    psnrs = [v.psnr for v in result.videos]
    agg = result.aggregate["psnr"]
    assert agg["n"] == 3
    assert agg["mean"] == pytest.approx(np.mean(psnrs), rel=1e-12)
    assert agg["se"] == pytest.approx(np.std(psnrs, ddof=1) / math.sqrt(3), rel=1e-12)
    assert result.aggregate["lpips"] == {"mean": None, "se": None, "n": 0}
    sk = _sk_ssim(b, _noise(b, 5.0)).mean()
    assert result.videos[2].ssim == pytest.approx(sk, rel=REL)


def test_compare_dirs_reads_mp4_and_prefers_lossless(tmp_path: Path) -> None:
    v = _video(h=32, w=48)
    _tree(tmp_path / "ref", {"x.mkv": v})
    _tree(tmp_path / "test", {"x.mp4": v}, writer=write_video_mp4)
    _tree(tmp_path / "test", {"x.mkv": v})
    result = compare_dirs(tmp_path / "ref", tmp_path / "test", lpips=False)
    assert result.videos[0].identical_frames == 4
    assert any("ignoring x.mp4" in w for w in result.warnings)
    (tmp_path / "test" / "x.mkv").unlink()
    lossy = compare_dirs(tmp_path / "ref", tmp_path / "test", lpips=False).videos[0]
    assert 25 < lossy.psnr < PSNR_CAP_DB and lossy.identical_frames == 0


def test_compare_dirs_missing_partners(tmp_path: Path) -> None:
    _tree(tmp_path / "ref", {"a.mkv": _video(), "b.mkv": _video(seed=1)})
    _tree(tmp_path / "test", {"a.mkv": _video(), "z.mkv": _video(seed=2)})
    with pytest.raises(JbkvError, match="unpaired videos") as info:
        compare_dirs(tmp_path / "ref", tmp_path / "test", lpips=False)
    assert "b: no test video" in str(info.value) and "z: no reference video" in str(info.value)
    result = compare_dirs(tmp_path / "ref", tmp_path / "test", allow_missing=True, lpips=False)
    assert [v.name for v in result.videos] == ["a"]
    assert len(result.warnings) == 2
    assert result.aggregate["ssim"]["se"] is None


def test_compare_dirs_folder_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _tree(tmp_path / "ref", {"a.mkv": _video()})
    with pytest.raises(JbkvError, match="not found"):
        compare_dirs(tmp_path / "nope", tmp_path / "ref", lpips=False)
    with pytest.raises(JbkvError, match="no videos"):
        compare_dirs(tmp_path / "ref", tmp_path / "empty", lpips=False)
    _tree(tmp_path / "other", {"b.mkv": _video()})
    with pytest.raises(JbkvError, match="no video in"):
        compare_dirs(tmp_path / "ref", tmp_path / "other", allow_missing=True, lpips=False)


def test_aggregate() -> None:
    assert aggregate([]) == {"mean": None, "se": None, "n": 0}
    assert aggregate([2.5]) == {"mean": 2.5, "se": None, "n": 1}
    out = aggregate([1.0, 2.0, 4.0])
    assert out["mean"] == pytest.approx(7 / 3)
    assert out["se"] == pytest.approx(np.std([1, 2, 4], ddof=1) / math.sqrt(3))
    with pytest.raises(ValueError):
        aggregate([1.0, math.inf])


def test_lpips_unavailable_without_alexnet_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    scorer, reason = perceptual.try_load_lpips()
    assert scorer is None
    assert "alexnet-owt-7be5be79.pth" in reason
    assert str(tmp_path / "torch" / "hub" / "checkpoints") in reason
    assert "run: jbkv weights fetch lpips" in reason
    assert "\n" not in reason
    assert not (tmp_path / "torch").exists()  # nothing downloaded or created
    _tree(tmp_path / "ref", {"a.mkv": _video()})
    result = compare_dirs(tmp_path / "ref", tmp_path / "ref")
    assert result.videos[0].lpips is None
    assert result.lpips_status == reason and reason in result.warnings


def _random_alexnet(torch_home: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    state = {}
    for index, shape in ALEX_SHAPES.items():
        state[f"features.{index}.weight"] = 0.05 * torch.randn(shape, generator=g)
        state[f"features.{index}.bias"] = 0.01 * torch.randn(shape[0], generator=g)
    path = torch_home / "hub" / "checkpoints" / perceptual.ALEXNET_FILE
    path.parent.mkdir(parents=True)
    torch.save(state, path)
    return path


def _upstream_lpips(checkpoint: Path, ref: torch.Tensor) -> list[float]:
    """Independent path: lpips' own constructor (it loads its heads), trunk copied by index."""
    import lpips

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = lpips.LPIPS(net="alex", pretrained=True, pnet_rand=True, verbose=False).eval()
    features = torch.load(checkpoint)
    slices = {0: 1, 3: 2, 6: 3, 8: 4, 10: 5}  # features index -> lpips slice holding it
    for key, number in slices.items():
        layer = getattr(getattr(model.net, f"slice{number}"), str(key))
        layer.weight.data.copy_(features[f"features.{key}.weight"])
        layer.bias.data.copy_(features[f"features.{key}.bias"])
    to_unit = lambda v: v.permute(0, 3, 1, 2).float() / 127.5 - 1  # noqa: E731
    with torch.no_grad():
        return model(to_unit(ref), to_unit(_noise(ref, 40.0))).flatten().tolist()


def test_lpips_random_weights_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    checkpoint = _random_alexnet(tmp_path / "torch")
    scorer = perceptual.load_lpips()
    assert scorer.checkpoint == checkpoint
    weight = scorer.model.net.slice1._modules["0"].weight
    assert torch.equal(weight, torch.load(checkpoint)["features.0.weight"])
    ref = _video(t=3, h=48, w=64)
    same = compare_videos(ref, ref.clone(), lpips=scorer)
    assert same.lpips_per_frame == [0.0, 0.0, 0.0]
    noisy = compare_videos(ref, _noise(ref, 40.0), lpips=scorer)
    assert noisy.lpips is not None and math.isfinite(noisy.lpips) and noisy.lpips > 0
    np.testing.assert_allclose(noisy.lpips_per_frame, _upstream_lpips(checkpoint, ref), rtol=1e-5)
    _tree(tmp_path / "ref", {"a.mkv": ref})
    result = compare_dirs(tmp_path / "ref", tmp_path / "ref")
    assert result.videos[0].lpips == 0.0
    assert result.aggregate["lpips"]["n"] == 1


def test_lpips_rejects_wrong_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    path = tmp_path / "torch" / "hub" / "checkpoints" / perceptual.ALEXNET_FILE
    path.parent.mkdir(parents=True)
    torch.save({"features.0.weight": torch.zeros(3)}, path)
    with pytest.raises(perceptual.LpipsUnavailableError, match=r"features\.0\.weight"):
        perceptual.load_lpips()
    path.write_bytes(b"garbage")
    with pytest.raises(perceptual.LpipsUnavailableError, match="cannot load"):
        perceptual.load_lpips()


def _jbkv_folder(root: Path, seeds: list[int], prompt: str = "a red ball") -> None:
    """A folder as jbkv writes it: ``{prompt}-{index}`` named by the seed's position."""
    import json

    for index, seed in enumerate(seeds):
        name = root / f"{prompt}-{index}"
        write_video_lossless(name.with_suffix(".mkv"), _video(seed=seed + 10), 8)
        record = {"prompt": prompt, "seed": seed, "index": index, "kv_cache_bytes": 0}
        name.with_suffix(".json").write_text(json.dumps(record))


def test_jbkv_folders_pair_by_prompt_and_seed_not_position(tmp_path: Path) -> None:
    """`--seeds 1` then `--seeds 0` into X, `--seeds 0,1` into Y: same videos, other names."""
    _jbkv_folder(tmp_path / "x", [1, 0])
    _jbkv_folder(tmp_path / "y", [0, 1])
    result = compare_dirs(tmp_path / "x", tmp_path / "y", lpips=False)
    assert [v.psnr for v in result.videos] == [PSNR_CAP_DB, PSNR_CAP_DB]
    assert any("paired by (prompt, seed)" in w and "2 video(s)" in w for w in result.warnings)
    plain_x, plain_y = tmp_path / "px", tmp_path / "py"
    for src, dst in ((tmp_path / "x", plain_x), (tmp_path / "y", plain_y)):
        dst.mkdir()
        for f in src.glob("*.mkv"):
            (dst / f.name).write_bytes(f.read_bytes())
    by_name = compare_dirs(plain_x, plain_y, lpips=False)  # plain folders: paired by name
    assert all(v.psnr < 40 for v in by_name.videos)


def test_a_renamed_jbkv_video_is_refused(tmp_path: Path) -> None:
    _jbkv_folder(tmp_path / "x", [0, 1])
    _jbkv_folder(tmp_path / "y", [0, 1])
    for ext in (".mkv", ".json"):
        (tmp_path / "y" / f"a red ball-1{ext}").rename(tmp_path / "y" / f"a red ball-7{ext}")
    with pytest.raises(JbkvError, match=r"does not match \(renamed\?\)"):
        compare_dirs(tmp_path / "x", tmp_path / "y", lpips=False)
