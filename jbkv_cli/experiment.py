"""The experiment: generate every (variant, prompt, seed) into a run, then score it.

Data flows one way: matrix of KVSpecs -> model.generate (with an attention recorder as its
observer) -> run directory -> paired fidelity against the reference variant -> rows for the
report.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.console import err
from jbkv_cli.errors import JbkvError
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.metrics.chunks import chunk_frames_of
from jbkv_cli.metrics.fidelity import compare_videos
from jbkv_cli.metrics.perceptual import try_load_lpips
from jbkv_cli.models.base import VideoModel
from jbkv_cli.prune.registry import build_pruner
from jbkv_cli.quant.registry import METHODS
from jbkv_cli.runs import RunDir, check_prompt, video_name

HISTOGRAM_SAMPLES = 2000
ABLATIONS: dict[str, dict[str, bool]] = {
    "keys-only": {"values": False},
    "values-only": {"keys": False},
    "bias-only": {"bias_only": True},
}


def build_matrix(
    bits: Iterable[int],
    quantizers: Iterable[str],
    corrections: Iterable[str],
    group_sizes: Iterable[int],
    ablations: Iterable[str] = (),
    options: dict[str, dict[str, Any]] | None = None,
    pruners: Iterable[str] = ("none",),
) -> list[KVSpec]:
    """The reference plus every quantized combination, then the ablations (uncorrected).

    ``options``: per method or pruner name, options passed to it (e.g. ``{"quarot":
    {"seed": 1}}``). Combinations a method does not define (bits it does not support) are left
    out. Each pruner other than ``none`` adds its 16-bit pruned variant and prunes every
    quantized combination (not the ablations).
    """
    options = options or {}
    chosen = [None if p == "none" else build_pruner(p, **options.get(p, {})) for p in pruners]
    specs = [FULL_PRECISION, *(KVSpec(pruner=p) for p in chosen if p is not None)]
    for q in quantizers:
        for g in group_sizes:
            for b in bits:
                if b not in METHODS[q].SUPPORTED_BITS:
                    continue
                kw = options.get(q, {})
                for p in chosen:
                    for c in corrections:
                        specs.append(KVSpec.build(q, b, g, c, pruner=p, **kw))
                for a in ablations:
                    specs.append(KVSpec.build(q, b, g, "none", **ABLATIONS[a], **kw))
    return list(dict.fromkeys(specs))


@dataclass
class GenerationSummary:
    generated: int = 0
    skipped: int = 0
    seconds: float = 0.0
    peak_kv_bytes: int = 0


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=False) as progress:
        yield progress


def generate_all(
    model: VideoModel,
    run: RunDir,
    specs: list[KVSpec],
    items: list[tuple[str, list[int]]],
    *,
    diagnostics: bool = True,
    show_progress: bool = True,
) -> GenerationSummary:
    """Generate every (variant, prompt, seed) of ``items`` = [(prompt, seeds)] that is missing;
    finished videos are skipped (resumable). The reference goes first for each (prompt, seed)."""
    items = [(check_prompt(p), seeds) for p, seeds in items]
    run.register([p for p, _ in items], sorted({s for _, seeds in items for s in seeds}))
    vids = [run.ensure_variant(s) for s in specs]
    pairs = list(zip(specs, vids, strict=True))
    jobs = [(s, v, p, seed) for p, seeds in items for seed in seeds for s, v in pairs]
    summary = GenerationSummary()
    with _progress(show_progress) as progress:
        videos_task = progress.add_task("videos", total=len(jobs)) if progress else None
        chunk_task = progress.add_task("chunks", total=1) if progress else None
        for spec, vid, prompt, seed in jobs:
            name = video_name(prompt, run.index_of(seed))
            if run.is_done(vid, name):
                summary.skipped += 1
            else:
                if progress:
                    progress.update(videos_task, description=f"{vid} · {name[:40]}")
                    progress.reset(chunk_task)
                record = _generate_one(
                    model, run, spec, vid, name, prompt, seed, diagnostics, progress, chunk_task
                )
                summary.generated += 1
                summary.seconds += record["seconds"]
                summary.peak_kv_bytes = max(summary.peak_kv_bytes, record["kv_cache_bytes"])
            if progress:
                progress.advance(videos_task)
    return summary


def _generate_one(model, run, spec, vid, name, prompt, seed, diagnostics, progress, task):
    def on_chunk(done: int, total: int) -> None:
        if progress is not None:
            progress.update(task, completed=done, total=total)

    rec = AttentionRecorder() if diagnostics and not spec.is_reference else None
    start = time.perf_counter()
    try:
        video = model.generate(prompt, seed, spec, progress=on_chunk, observer=rec)
    except ValueError as exc:
        raise JbkvError(f"{spec.label} on {model.name}: {exc}") from exc
    seconds = time.perf_counter() - start
    diag_seconds = rec.seconds if rec is not None else 0.0
    record: dict[str, Any] = {
        "prompt": prompt,
        "seed": seed,
        "index": run.index_of(seed),
        "variant": vid,
        "spec": spec.to_dict(),
        "seconds": seconds - diag_seconds,  # generation alone
        "diagnostics_seconds": diag_seconds,
        "kv_cache_bytes": int(video.kv_cache_bytes),
        "frames": list(video.frames.shape),
        "fps": video.fps,
        "info": video.info,
        "diagnostics": None,
    }
    if rec is not None:
        record["diagnostics"] = rec.summary()
        dps = rec.delta_ps()
        if dps.numel() > HISTOGRAM_SAMPLES:
            idx = torch.linspace(0, dps.numel() - 1, HISTOGRAM_SAMPLES).long()
            dps = dps[idx]
        record["delta_ps_samples"] = [round(float(x), 6) for x in dps]
    run.save_video(vid, name, video, record)
    return record


def score_fidelity(run: RunDir, *, lpips: bool = True, show_progress: bool = True) -> str:
    """Paired PSNR/SSIM/LPIPS of every finished video against the reference; resumable.

    Per-chunk (drift) scores use each video's chunk length (:func:`chunk_frames_of`).

    Returns the LPIPS status line (its description, or why it is unavailable).
    """
    scorer, status = try_load_lpips() if lpips else (None, "disabled (--no-lpips)")
    reference = run.reference
    refs = {r["prompt"] + f"-{r['index']}": r for r in run.records(reference)}
    settings = run.manifest.get("settings", {})
    todo = []
    chunk_frames: dict[tuple[str, str], int | None] = {}
    for vid in run.variants():
        if vid == reference:
            continue
        done = run.read_metrics("fidelity", vid)
        for rec in run.records(vid):
            name = video_name(rec["prompt"], rec["index"])
            if name in refs and (name not in done or _stale(done[name], scorer)):
                todo.append((vid, name))
                chunk_frames[vid, name] = chunk_frames_of(rec, settings)
    ref_cache: dict[str, torch.Tensor] = {}
    with _progress(show_progress and bool(todo)) as progress:
        task = progress.add_task("fidelity", total=len(todo)) if progress else None
        for vid in dict.fromkeys(v for v, _ in todo):
            scores = run.read_metrics("fidelity", vid)
            for v, name in todo:
                if v != vid:
                    continue
                if name not in ref_cache:
                    ref_cache[name] = run.load_frames(reference, name)
                s = compare_videos(
                    ref_cache[name],
                    run.load_frames(vid, name),
                    0,
                    scorer,
                    name=name,
                    chunk_frames=chunk_frames.get((vid, name)),
                )
                scores[name] = s.to_dict(per_frame=True) | {"lpips_status": status}
                if progress:
                    progress.advance(task)
            run.write_metrics("fidelity", vid, scores)
    return status


def _stale(entry: dict[str, Any], scorer) -> bool:
    """Recompute an entry that lacks LPIPS when LPIPS has become available."""
    return scorer is not None and entry.get("lpips") is None
