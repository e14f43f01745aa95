"""``jbkv fidelity REF TEST``: PSNR/SSIM/LPIPS of test videos against reference videos."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from jbkv_cli.cli.outputs import check_output_file
from jbkv_cli.metrics.folders import check_video_folder
from jbkv_cli.utils import distributed
from jbkv_cli.utils.atomic import write_text_atomic
from jbkv_cli.utils.console import err, out, plain, warn
from jbkv_cli.utils.errors import UsageError

if TYPE_CHECKING:  # torch: imported once the options are checked
    from jbkv_cli.metrics.fidelity import FidelityResult, VideoScores
    from jbkv_cli.metrics.perceptual import LpipsAlex

CSV_FIELDS = (
    "name",
    "ref_path",
    "test_path",
    "frames",
    "skipped_frames",
    "height",
    "width",
    "psnr",
    "psnr_pooled",
    "identical_frames",
    "ssim",
    "lpips",
)


def fidelity_command(
    ref: Path,
    test: Path,
    skip_frames: int = 0,
    json_path: Path | None = None,
    csv_path: Path | None = None,
    min_psnr: float | None = None,
    min_ssim: float | None = None,
    max_lpips: float | None = None,
    allow_missing: bool = False,
    no_lpips: bool = False,
    chunk_frames: int | None = None,
) -> int:
    """Score, print, write JSON/CSV; return 1 if a video violates a threshold, else 0.

    SSIM and LPIPS run on CUDA when available (same values up to float rounding), else CPU.
    """
    if max_lpips is not None and no_lpips:
        raise UsageError("--max-lpips needs LPIPS, but --no-lpips was given")
    for flag, value in (
        ("--min-psnr", min_psnr),
        ("--min-ssim", min_ssim),
        ("--max-lpips", max_lpips),
    ):
        if value is not None and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}")
    for flag, path in (("--json", json_path), ("--csv", csv_path)):
        if path is not None:
            check_output_file(path, flag, inputs=(ref, test))
    if json_path is not None and csv_path is not None and json_path.resolve() == csv_path.resolve():
        raise UsageError(f"--json and --csv name the same file {json_path}")
    check_video_folder(ref, "reference")
    check_video_folder(test, "test")
    import torch

    from jbkv_cli.metrics.fidelity import compare_dirs
    from jbkv_cli.metrics.fidelity_stats import fidelity_statistics
    from jbkv_cli.metrics.perceptual import load_lpips

    distributed.setup()  # under torchrun: each rank scores a share of the pairs
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lpips: bool | LpipsAlex = not no_lpips
    if max_lpips is not None:
        lpips = load_lpips(device)
    result = compare_dirs(
        ref,
        test,
        skip_frames=skip_frames,
        allow_missing=allow_missing,
        lpips=lpips,
        device=device,
        chunk_frames=chunk_frames,
    )
    violations = threshold_violations(result.videos, min_psnr, min_ssim, max_lpips)
    if not distributed.is_main():
        # Rank 0 prints, writes and returns the exit code; a failing exit here could make
        # torchrun stop rank 0 before it has.
        return 0

    # the files first: a failure while printing cannot lose them
    if json_path is not None:
        payload = result.to_dict()
        payload["thresholds"] = {"min_psnr": min_psnr, "min_ssim": min_ssim, "max_lpips": max_lpips}
        payload["violations"] = violations
        payload["statistics"] = fidelity_statistics(result.videos)
        write_text_atomic(json_path, json.dumps(payload, indent=2) + "\n")
    if csv_path is not None:
        write_text_atomic(csv_path, results_csv(result.videos))
    for warning in result.warnings:
        warn(warning)
    out.print(results_table(result))
    if violations:
        err.print(plain(f"{len(violations)} threshold violation(s):", "red"), highlight=False)
        for line in violations:
            err.print(f"  {line}", highlight=False, soft_wrap=True)
        return 1
    return 0


def threshold_violations(
    videos: list[VideoScores],
    min_psnr: float | None,
    min_ssim: float | None,
    max_lpips: float | None,
) -> list[str]:
    """One line per (video, metric) outside its threshold."""
    lines = []
    for v in videos:
        if min_psnr is not None and v.psnr < min_psnr:
            lines.append(f"{v.name}: PSNR {v.psnr:.2f} dB < {min_psnr}")
        if min_ssim is not None and v.ssim < min_ssim:
            lines.append(f"{v.name}: SSIM {v.ssim:.4f} < {min_ssim}")
        if max_lpips is not None and v.lpips is not None and v.lpips > max_lpips:
            lines.append(f"{v.name}: LPIPS {v.lpips:.4f} > {max_lpips}")
    return lines


def results_table(result: FidelityResult) -> Table:
    """Per-video rows plus a mean ± SE row."""
    from jbkv_cli.metrics.psnr import PSNR_CAP_DB

    with_lpips = any(v.lpips is not None for v in result.videos)
    table = Table(title=plain(f"fidelity: {result.test_dir} vs {result.ref_dir}"))
    table.add_column("video")
    table.add_column("frames", justify="right")
    table.add_column("PSNR dB", justify="right")
    table.add_column("SSIM", justify="right")
    if with_lpips:
        table.add_column("LPIPS", justify="right")
    table.add_column("identical", justify="right")
    for v in result.videos:
        row = [plain(v.name), str(v.frames), f"{v.psnr:.2f}", f"{v.ssim:.4f}"]
        if with_lpips:
            row.append("—" if v.lpips is None else f"{v.lpips:.4f}")
        table.add_row(*row, str(v.identical_frames))
    agg = result.aggregate
    row = [
        f"mean ± SE (n={agg['psnr']['n']})",
        "",
        _mean_se(agg["psnr"], 2),
        _mean_se(agg["ssim"], 4),
    ]
    if with_lpips:
        row.append(_mean_se(agg["lpips"], 4))
    table.add_section()
    table.add_row(*row, "", style="bold")
    lpips = "AlexNet, [-1, 1]" if with_lpips else result.lpips_status
    if lpips.startswith("LPIPS unavailable"):
        lpips = "unavailable (see warning)"
    table.caption = plain(
        f"skip_frames={result.skip_frames}; per-frame PSNR capped at {PSNR_CAP_DB:g} dB "
        f"(identical frames); LPIPS: {lpips}"
    )
    return table


def results_csv(videos: list[VideoScores]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for v in videos:
        data = v.to_dict(per_frame=False)
        writer.writerow({k: "" if data[k] is None else data[k] for k in CSV_FIELDS})
    return buffer.getvalue()


def _mean_se(stats: dict[str, float | int | None], digits: int) -> str:
    if stats["mean"] is None:
        return "—"
    if stats["se"] is None:
        return f"{stats['mean']:.{digits}f}"
    return f"{stats['mean']:.{digits}f} ± {stats['se']:.{digits}f}"


def register(app: typer.Typer) -> None:
    """Add ``fidelity`` to ``app``."""

    @app.command("fidelity")
    def fidelity(
        ref: Annotated[Path, typer.Argument(help="Folder of reference videos (e.g. BF16).")],
        test: Annotated[Path, typer.Argument(help="Folder of test videos, same relative names.")],
        skip_frames: Annotated[
            int, typer.Option("--skip-frames", min=0, help="Drop the first N frames of both.")
        ] = 0,
        json_path: Annotated[
            Path | None, typer.Option("--json", help="Write full results (per frame) here.")
        ] = None,
        csv_path: Annotated[
            Path | None, typer.Option("--csv", help="Write one row per video here.")
        ] = None,
        min_psnr: Annotated[
            float | None, typer.Option("--min-psnr", help="Fail if a video's PSNR is lower.")
        ] = None,
        min_ssim: Annotated[
            float | None, typer.Option("--min-ssim", help="Fail if a video's SSIM is lower.")
        ] = None,
        max_lpips: Annotated[
            float | None, typer.Option("--max-lpips", help="Fail if a video's LPIPS is higher.")
        ] = None,
        allow_missing: Annotated[
            bool, typer.Option("--allow-missing", help="Skip videos without a partner.")
        ] = False,
        no_lpips: Annotated[bool, typer.Option("--no-lpips", help="Do not compute LPIPS.")] = False,
        chunk_frames: Annotated[
            int | None,
            typer.Option(
                "--chunk-frames",
                min=1,
                help="Frames per generated chunk for the per-chunk (drift) scores in --json "
                "(default: from the jbkv records beside the test videos, else 1).",
            ),
        ] = None,
    ) -> None:
        """PSNR, SSIM and LPIPS of TEST videos against REF videos, paired by relative name.

        Prints one row per video and the mean ± standard error; exits 1 if a threshold fails.
        """
        code = fidelity_command(
            ref,
            test,
            skip_frames=skip_frames,
            json_path=json_path,
            csv_path=csv_path,
            min_psnr=min_psnr,
            min_ssim=min_ssim,
            max_lpips=max_lpips,
            allow_missing=allow_missing,
            no_lpips=no_lpips,
            chunk_frames=chunk_frames,
        )
        if code:
            raise typer.Exit(code)
