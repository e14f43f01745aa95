"""Evaluate the videos of a run directory with VBench, in its environment, and summarize.

Input: a run directory (``RUN/videos/<variant>/<prompt>-<index>.mp4``; each subfolder of
``RUN/videos`` is a variant) or a plain folder of ``.mp4`` files (one variant, named after the
folder). Only H.264 deliveries named ``<stem>-<index>.mp4`` are evaluated; lossless copies in
other containers or with other names are ignored.

Per variant, the videos are linked into a work folder (VBench writes its clips next to the
videos), the runner evaluates one dimension at a time, and its raw JSON is kept:

    OUT/vbench/<mode>/<variant>/videos/           links + VBench's split_clip/ etc.
    OUT/vbench/<mode>/<variant>/results/<dim>_eval_results.json
    OUT/vbench/<mode>/<variant>/runner.log
    OUT/vbench.json                               summary (atomic write)

``OUT`` defaults to ``RUN/metrics``. A dimension whose raw result exists for the same set of
videos is not recomputed (``force`` recomputes).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jbkv_cli.metrics.vbench_clips import clip_record
from jbkv_cli.metrics.vbench_env import RUNNER, VBenchEnv, runner_environ
from jbkv_cli.metrics.vbench_scores import (
    DIMENSIONS,
    DimensionScore,
    parse_dimension,
    totals_from_dimensions,
)
from jbkv_cli.metrics.vbench_weights import missing_weights
from jbkv_cli.utils import distributed
from jbkv_cli.utils.atomic import write_text_atomic
from jbkv_cli.utils.errors import JbkvError

MODES = ("long_custom_input", "long_vbench_standard", "custom_input", "vbench_standard")
# Documented as usable on custom videos (VBench README; VBench-Long README §3.2), plus
# temporal_flickering, which is pure pixel arithmetic (its official protocol keeps static clips).
CUSTOM_DIMENSIONS: tuple[str, ...] = (
    "subject_consistency",
    "background_consistency",
    "motion_smoothness",
    "dynamic_degree",
    "aesthetic_quality",
    "imaging_quality",
    "temporal_flickering",
)
# Need auxiliary info from VBench's prompt list: never valid on custom input.
NEEDS_STANDARD_PROMPTS: tuple[str, ...] = (
    "object_class",
    "multiple_objects",
    "scene",
    "appearance_style",
    "color",
    "spatial_relationship",
)
_VIDEO_NAME = re.compile(r"^(?P<prompt>.+)-(?P<index>\d+)\.mp4$")


@dataclass
class VBenchConfig:
    """How to run VBench on a run directory."""

    dimensions: tuple[str, ...] = CUSTOM_DIMENSIONS
    mode: str = "long_custom_input"
    device: str = "auto"
    dev_flag: bool = True
    static_filter: bool = False
    clip_length_config: str = "clip_length_mix.yaml"
    imaging_quality_preprocessing_mode: str = "longer"

    def validate(self) -> None:
        if self.mode not in MODES:
            raise JbkvError(f"unknown VBench mode {self.mode!r}; one of {', '.join(MODES)}")
        unknown = [d for d in self.dimensions if d not in DIMENSIONS]
        if unknown:
            raise JbkvError(f"unknown VBench dimension(s): {', '.join(unknown)}")
        if not self.dimensions:
            raise JbkvError("no VBench dimension selected")
        if self.mode in ("long_custom_input", "custom_input"):
            bad = [d for d in self.dimensions if d in NEEDS_STANDARD_PROMPTS]
            if bad:
                raise JbkvError(
                    f"{', '.join(bad)} need VBench's standard prompts; use "
                    "--mode long_vbench_standard with videos named after them"
                )
        if self.static_filter and self.mode != "long_vbench_standard":
            raise JbkvError("the static filter needs --mode long_vbench_standard")
        if self.static_filter and self.device == "cpu":
            raise JbkvError("the static filter runs on CUDA only (VBench hard-codes it)")

    def settings(self) -> dict[str, Any]:
        """What changes a dimension's value (the dimension list and device aside)."""
        return {
            "mode": self.mode,
            "dev_flag": self.dev_flag,
            "static_filter": self.static_filter,
            "clip_length_config": self.clip_length_config,
            "imaging_quality_preprocessing_mode": self.imaging_quality_preprocessing_mode,
        }

    @property
    def long_mode(self) -> bool:
        return self.mode.startswith("long_")


def discover_variants(path: Path) -> dict[str, list[Path]]:
    """Variant name → its ``<prompt>-<index>.mp4`` videos (sorted)."""
    if not path.is_dir():
        raise JbkvError(f"not a directory: {path}")
    videos_dir = path / "videos"

    def mp4s(folder: Path) -> list[Path]:
        return sorted(p for p in folder.iterdir() if p.is_file() and _VIDEO_NAME.match(p.name))

    if videos_dir.is_dir():
        variants = {d.name: mp4s(d) for d in sorted(videos_dir.iterdir()) if d.is_dir()}
        if mp4s(videos_dir):
            variants.setdefault(videos_dir.name, mp4s(videos_dir))
    elif mp4s(path):
        variants = {path.resolve().name: mp4s(path)}
    else:
        variants = {
            d.name: mp4s(d) for d in sorted(path.iterdir()) if d.is_dir() and d.name != "metrics"
        }
    variants = {k: v for k, v in variants.items() if v}
    if not variants:
        raise JbkvError(f"no videos named <prompt>-<index>.mp4 under {path}")
    for name, videos in variants.items():
        bad = [v.name for v in videos if "_" in v.stem]
        if bad:
            raise JbkvError(
                f"variant {name}: VBench groups clips by the text before '_', so video names "
                f"must not contain '_' (e.g. {bad[0]})"
            )
    return variants


def default_out_dir(path: Path) -> Path:
    return path / "metrics"


def fingerprint(videos: Sequence[Path]) -> str:
    """Changes when any video is added, removed or rewritten."""
    h = hashlib.sha256()
    for v in videos:
        st = v.stat()
        h.update(f"{v.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def stage_videos(videos: Sequence[Path], work: Path, salt: str = "") -> Path:
    """Link ``videos`` into ``work/videos``; changed videos or settings start the folder afresh."""
    stamp = work / "videos.fingerprint"
    fp = fingerprint(videos) + hashlib.sha256(salt.encode()).hexdigest()[:8]
    if work.exists() and (not stamp.is_file() or stamp.read_text().strip() != fp):
        shutil.rmtree(work)
    target = work / "videos"
    target.mkdir(parents=True, exist_ok=True)
    for v in videos:
        link = target / v.name
        if not link.exists():
            link.symlink_to(v.resolve())
    stamp.write_text(fp + "\n")
    return target


def num_samples(videos: Sequence[Path]) -> int:
    """Samples per prompt to look for: one more than the largest index present."""
    return 1 + max(int(m["index"]) for v in videos if (m := _VIDEO_NAME.match(v.name)))


Event = Callable[[str, dict[str, Any]], None]


@dataclass
class VariantResult:
    dimensions: dict[str, DimensionScore] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def run_variant(
    env: VBenchEnv,
    videos: Sequence[Path],
    work: Path,
    config: VBenchConfig,
    on_event: Event | None = None,
    force: bool = False,
) -> VariantResult:
    """Run the dimensions of ``config`` on one variant's videos; parse VBench's raw results."""
    on_event = on_event or (lambda _k, _e: None)
    videos_path = stage_videos(videos, work, json.dumps(config.settings(), sort_keys=True))
    results = work / "results"
    todo = [
        d for d in config.dimensions if force or not (results / f"{d}_eval_results.json").is_file()
    ]
    for d in config.dimensions:
        if d not in todo:
            on_event("cached", {"dimension": d})
    res = VariantResult()
    if todo:
        request = {
            **asdict(config),
            "dimensions": todo,
            "videos_path": str(videos_path),
            "output_path": str(results),
            "num_of_samples_per_prompt": num_samples(videos),
        }
        req_path = work / "request.json"
        write_text_atomic(req_path, json.dumps(request, indent=1))
        for d in todo:
            (results / f"{d}_eval_results.json").unlink(missing_ok=True)
        _spawn(env, req_path, work, work / "runner.log", on_event, res)
    for d in config.dimensions:
        path = results / f"{d}_eval_results.json"
        if d in res.errors:
            continue
        if not path.is_file():
            res.errors[d] = f"VBench wrote no result (see {work / 'runner.log'})"
            continue
        raw = json.loads(path.read_text())
        if d not in raw:
            res.errors[d] = f"{path.name} has no entry for {d}"
            continue
        res.dimensions[d] = parse_dimension(d, raw[d])
        res.raw[d] = str(path)
    return res


def _spawn(
    env: VBenchEnv, request: Path, cwd: Path, log_path: Path, on_event: Event, res: VariantResult
) -> None:
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            [str(env.python), str(RUNNER), str(request)],
            cwd=cwd,
            env=runner_environ(distributed.child_env()),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            distributed.beat()  # VBench's output is this rank's progress
            if line.startswith("@@jbkv "):
                event = json.loads(line[len("@@jbkv ") :])
                if event.get("event") == "error":
                    res.errors[event["dimension"]] = event["message"]
                on_event(event.get("event", ""), event)
        rc = proc.wait()
    if rc != 0 and not res.errors:
        raise JbkvError(f"VBench runner exited with code {rc} (see {log_path})")


def summarize(
    variants: dict[str, VariantResult],
    config: VBenchConfig,
    env: VBenchEnv,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``metrics/vbench.json`` document; merges dimensions of a previous compatible run."""
    settings = config.settings()
    doc: dict[str, Any] = {
        "settings": settings,
        "env": {"key": env.key, **env.info.get("check", {}).get("versions", {})},
        "score": (
            "per dimension: VBench's aggregate (mean over clips); se: over per-video means "
            "(clips regrouped by video). Quality/Semantic/Total: VBench's normalization and "
            "weights over the dimensions present; partial lists the missing ones."
        ),
        "clip_seconds": clip_record(config.mode, config.dimensions, config.clip_length_config),
        "variants": {},
    }
    prev_variants = {}
    if previous and previous.get("settings") == settings:
        prev_variants = previous.get("variants", {})
    for name in sorted(set(prev_variants) | set(variants)):
        old = prev_variants.get(name, {})
        dims = dict(old.get("dimensions", {}))
        errors = dict(old.get("errors", {}))
        if name in variants:
            v = variants[name]
            for d, s in v.dimensions.items():
                dims[d] = {**s.to_json(), "raw": v.raw.get(d)}
                errors.pop(d, None)
            for d, msg in v.errors.items():
                errors[d] = msg
                dims.pop(d, None)
        scores = {
            d: DimensionScore(d, x["score"], x.get("per_video", {}), x.get("n_clips", 0))
            for d, x in dims.items()
        }
        doc["variants"][name] = {
            "dimensions": {d: dims[d] for d in DIMENSIONS if d in dims},
            "errors": errors,
            "totals": totals_from_dimensions(scores).to_json(),
        }
    return doc


def check_weights(config: VBenchConfig) -> list[str]:
    """Dimensions of ``config`` whose weights are missing."""
    missing = missing_weights(
        config.dimensions, long_mode=config.long_mode, static_filter=config.static_filter
    )
    return sorted({m.dimension for m in missing}, key=DIMENSIONS.index)


def evaluate_path(
    path: Path,
    env: VBenchEnv,
    config: VBenchConfig,
    out_dir: Path | None = None,
    on_event: Callable[[str, str, dict[str, Any]], None] | None = None,
    force: bool = False,
) -> tuple[dict[str, Any], Path]:
    """Evaluate every variant under ``path``; write and return the summary and its path.

    Under torchrun each rank evaluates its share of the variants (each variant's work folder
    belongs to one rank) and rank 0 writes the summary; every rank returns it.
    """
    config.validate()
    path = path.resolve()
    variants = discover_variants(path)
    out_dir = (out_dir or default_out_dir(path)).resolve()
    results: dict[str, VariantResult] = {}
    for name in distributed.shard(list(variants)):
        work = out_dir / "vbench" / config.mode / name
        cb = (lambda kind, ev, _n=name: on_event(_n, kind, ev)) if on_event else None
        results[name] = run_variant(env, variants[name], work, config, cb, force)
    distributed.wait_for_peers("running VBench")
    parts = distributed.gather(results, "collecting the VBench results")
    results = {name: part[name] for name in variants for part in parts if name in part}
    summary_path = out_dir / "vbench.json"
    doc = distributed.from_rank0(
        lambda: _write_summary(summary_path, results, config, env), "writing the VBench summary"
    )
    return doc, summary_path


def _write_summary(
    summary_path: Path, results: dict[str, VariantResult], config: VBenchConfig, env: VBenchEnv
) -> dict[str, Any]:
    previous = None
    if summary_path.is_file():
        try:
            previous = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            previous = None
    doc = summarize(results, config, env, previous)
    write_text_atomic(summary_path, json.dumps(doc, indent=1) + "\n")
    return doc
