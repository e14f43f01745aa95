"""`jbkv fidelity` through Typer: table, thresholds, JSON/CSV outputs, folder errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from jbkv_cli.cli.commands.fidelity import fidelity_command, register
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.video import write_video_lossless


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:
        """Second command so Typer keeps subcommand names."""

    return app


def _video(seed: int, t: int = 3, h: int = 32, w: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    base = torch.stack((xx * 5.0, yy * 6.0, (xx + yy) * 3.0), dim=-1)
    return (base + 30 * torch.rand(t, h, w, 3, generator=g)).clamp(0, 255).to(torch.uint8)


def _noisy(v: torch.Tensor, sigma: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return (v.float() + sigma * torch.randn(v.shape, generator=g)).clamp(0, 255).to(torch.uint8)


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "no-torch-home"))
    ref, test = tmp_path / "ref", tmp_path / "test"
    for name, seed, sigma in [("good", 0, 1.0), ("bad", 1, 40.0)]:
        v = _video(seed)
        write_video_lossless(ref / f"{name}.mkv", v, 16)
        write_video_lossless(test / f"{name}.mkv", _noisy(v, sigma), 16)
    return ref, test


def test_table_and_exit_zero(dirs: tuple[Path, Path]) -> None:
    ref, test = dirs
    result = CliRunner().invoke(_app(), ["fidelity", str(ref), str(test)])
    assert result.exit_code == 0, result.output
    assert "good" in result.output and "bad" in result.output
    assert "mean ± SE (n=2)" in result.output
    assert "LPIPS unavailable" in result.output  # warning on stderr, mixed into output


def test_thresholds_fail_and_list_offenders(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    ref, test = dirs
    out_json, out_csv = tmp_path / "out" / "f.json", tmp_path / "out" / "f.csv"
    args = ["fidelity", str(ref), str(test), "--min-psnr", "30", "--min-ssim", "0.5"]
    args += ["--json", str(out_json), "--csv", str(out_csv), "--no-lpips"]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 1, result.output
    assert "bad: PSNR" in result.output
    assert "good: PSNR" not in result.output
    data = json.loads(out_json.read_text())
    assert [v["name"] for v in data["videos"]] == ["bad", "good"]
    assert data["aggregate"]["psnr"]["n"] == 2
    assert data["violations"] and all(v.startswith("bad:") for v in data["violations"])
    assert data["lpips_status"] == "disabled"
    assert len(data["videos"][0]["psnr_per_frame"]) == 3
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["name"] for r in rows] == ["bad", "good"]
    assert rows[0]["lpips"] == ""
    assert float(rows[1]["psnr"]) > 30
    assert sorted(p.name for p in out_json.parent.iterdir()) == ["f.csv", "f.json"]


def test_skip_frames_option(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    ref, test = dirs
    out = tmp_path / "f.json"
    args = ["fidelity", str(ref), str(test), "--skip-frames", "2", "--json", str(out)]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    assert {v["frames"] for v in json.loads(out.read_text())["videos"]} == {1}


def test_max_lpips_without_weights_is_an_error(dirs: tuple[Path, Path]) -> None:
    ref, test = dirs
    with pytest.raises(JbkvError, match=r"alexnet-owt-7be5be79\.pth"):
        fidelity_command(ref, test, max_lpips=0.1)
    with pytest.raises(JbkvError, match="--no-lpips"):
        fidelity_command(ref, test, max_lpips=0.1, no_lpips=True)


def test_folder_errors(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    ref, _ = dirs
    (tmp_path / "empty").mkdir()
    runner = CliRunner()
    for other, message in [(tmp_path / "missing", "not found"), (tmp_path / "empty", "no videos")]:
        result = runner.invoke(_app(), ["fidelity", str(ref), str(other)])
        assert result.exit_code != 0
        assert isinstance(result.exception, JbkvError)
        assert message in str(result.exception)


def test_missing_partner_and_allow_missing(dirs: tuple[Path, Path]) -> None:
    ref, test = dirs
    (test / "bad.mkv").unlink()
    with pytest.raises(JbkvError, match="bad: no test video"):
        fidelity_command(ref, test, no_lpips=True)
    assert fidelity_command(ref, test, allow_missing=True, no_lpips=True) == 0
