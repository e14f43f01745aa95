"""Runs VBench inside its own environment; executed there by path, never imported by jbkv.

    <vbench-env>/venv/bin/python vbench_runner.py REQUEST.json
    <vbench-env>/venv/bin/python vbench_runner.py --check

Standard library and the VBench environment's packages only (no jbkv imports). Events for the
parent are single lines ``@@jbkv {json}`` on stdout; everything else is VBench's own output.

For each requested dimension it calls ``VBench(device, full_info, out).evaluate(...)`` (short
modes) or ``VBenchLong(...).evaluate(...)`` (long modes) with one dimension, as upstream's
``evaluate_long.sh`` does, so ``out/<dimension>_eval_results.json`` holds that dimension's raw
result. Two local adjustments, both needed on current stacks:

- ``torchvision.io.write_video`` (gone from torchvision ≥ 0.26, used to write VBench-Long's
  clips) is provided by a PyAV implementation with the same signature and defaults
  (``libx264``, ``yuv420p``, integer frame rate).
- In ``long_vbench_standard`` the clip lists are built here: upstream takes the video suffix from
  the first directory entry, which may be its own ``split_clip`` folder, and then finds no clips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import traceback
from fractions import Fraction
from pathlib import Path
from typing import Any

EVENT = "@@jbkv "
LONG_MODES = ("long_custom_input", "long_vbench_standard")
SHORT_MODES = ("custom_input", "vbench_standard")


def emit(**event: Any) -> None:
    sys.stdout.write(EVENT + json.dumps(event) + "\n")
    sys.stdout.flush()


def write_video(
    filename: str,
    video_array: Any,
    fps: float,
    video_codec: str = "libx264",
    options: dict[str, Any] | None = None,
    **_unused: Any,
) -> None:
    """``torchvision.io.write_video`` for video only: uint8 ``[T, H, W, C]`` RGB frames to a file."""
    import av
    import numpy as np

    frames = np.asarray(video_array.cpu() if hasattr(video_array, "cpu") else video_array)
    frames = frames.astype(np.uint8, copy=False)
    rate = Fraction(fps).limit_denominator(1001)
    if rate.denominator == 1 or abs(float(rate) - round(float(rate))) < 1e-6:
        rate = Fraction(round(float(fps)))
    with av.open(filename, mode="w") as container:
        stream = container.add_stream(video_codec, rate=rate)
        stream.width = int(frames.shape[2])
        stream.height = int(frames.shape[1])
        stream.pix_fmt = "yuv420p" if video_codec != "libx264rgb" else "rgb24"
        if options:
            stream.options = {str(k): str(v) for k, v in options.items()}
        for img in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def install_shims() -> None:
    """Provide ``torchvision.io.write_video`` where torchvision no longer has it."""
    import torchvision.io

    if not hasattr(torchvision.io, "write_video"):
        torchvision.io.write_video = write_video


def seed_viclip_vocab() -> None:
    """Copy CLIP's BPE vocabulary (shipped in openai-clip) where VBench's ViCLIP reads it.

    VBench downloads the same file at import time of its ViCLIP tokenizer when it is absent.
    """
    cache = os.environ.get("VBENCH_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "vbench"
    )
    dst = Path(cache) / "ViCLIP" / "bpe_simple_vocab_16e6.txt.gz"
    if dst.is_file():
        return
    import clip

    src = Path(clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def check() -> None:
    """Import everything VBench-Long needs and report versions."""
    install_shims()
    import importlib.metadata as md

    import vbench
    import vbench2_beta_long
    import vbench2_beta_long.background_consistency
    import vbench2_beta_long.subject_consistency  # noqa: F401

    versions = {}
    for name in ("vbench", "torch", "torchvision", "numpy", "transformers", "av", "dreamsim"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    optional = {}
    for mod in ("detectron2",):
        try:
            __import__(mod)
            optional[mod] = True
        except Exception:
            optional[mod] = False
    emit(
        event="check",
        versions=versions,
        optional=optional,
        vbench_dir=os.path.dirname(vbench.__file__),
        write_video_shim=True,
    )


def _stems(videos_path: str) -> list[str]:
    return sorted(Path(f).stem for f in os.listdir(videos_path) if f.endswith(".mp4"))


def filtered_full_info(full_info: list[dict[str, Any]], stems: list[str]) -> list[dict[str, Any]]:
    """Entries of VBench's prompt list that have at least one ``{prompt}-{i}`` video."""
    prompts = {re.sub(r"-\d+$", "", s) for s in stems}
    return [e for e in full_info if e["prompt_en"] in prompts]


def make_long_class() -> type:
    from vbench.utils import save_json
    from vbench2_beta_long import VBenchLong

    class JbkvVBenchLong(VBenchLong):
        def build_full_info_json(
            self, videos_path, name, dimension_list, prompt_list=(), mode="", **kwargs
        ):
            if mode != "long_vbench_standard":
                return super().build_full_info_json(
                    videos_path, name, dimension_list, list(prompt_list), mode=mode, **kwargs
                )
            with open(self.full_info_dir) as fh:
                full_info = json.load(fh)
            clips_root = os.path.join(videos_path, "split_clip")
            entries = []
            for entry in full_info:
                if not set(dimension_list) & set(entry["dimension"]):
                    continue
                entry = dict(entry, video_list=[])
                for i in range(kwargs["num_of_samples_per_prompt"]):
                    folder = os.path.join(clips_root, f"{entry['prompt_en']}-{i}")
                    if os.path.isdir(folder):
                        entry["video_list"] += [
                            os.path.join(folder, c)
                            for c in sorted(os.listdir(folder))
                            if c.endswith(".mp4")
                        ]
                entries.append(entry)
            path = os.path.join(self.output_path, name + "_full_info.json")
            save_json(entries, path)
            return path

    return JbkvVBenchLong


def evaluate(req: dict[str, Any]) -> int:
    install_shims()
    import torch

    device = req.get("device", "auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    mode = req["mode"]
    videos_path = req["videos_path"]
    out = req["output_path"]
    os.makedirs(out, exist_ok=True)

    import vbench

    full_info_src = os.path.join(os.path.dirname(vbench.__file__), "VBench_full_info.json")
    with open(full_info_src) as fh:
        full_info = filtered_full_info(json.load(fh), _stems(videos_path))
    full_info_path = os.path.join(out, "full_info.json")
    with open(full_info_path, "w") as fh:
        json.dump(full_info, fh)
    emit(event="info", device=device, prompts_matched=len(full_info))

    if mode in LONG_MODES:
        cls = make_long_class()
    elif mode in SHORT_MODES:
        cls = vbench.VBench
    else:
        raise SystemExit(f"unknown mode {mode}")

    failures = 0
    dims = req["dimensions"]
    for i, dim in enumerate(dims):
        emit(event="start", dimension=dim, index=i, total=len(dims))
        t0 = time.perf_counter()
        try:
            if dim in ("temporal_style", "overall_consistency"):
                seed_viclip_vocab()
            bench = cls(torch.device(device), full_info_path, out)
            kwargs: dict[str, Any] = {
                "imaging_quality_preprocessing_mode": req.get(
                    "imaging_quality_preprocessing_mode", "longer"
                )
            }
            if mode in LONG_MODES:
                dev = bool(req.get("dev_flag", True))
                import vbench2_beta_long

                configs = os.path.join(os.path.dirname(vbench2_beta_long.__file__), "configs")
                kwargs.update(
                    sb_clip2clip_feat_extractor="dinov2" if dev else "dino",
                    bg_clip2clip_feat_extractor="dreamsim" if dev else "clip",
                    clip_length_config=req.get("clip_length_config", "clip_length_mix.yaml"),
                    w_inclip=1.0,
                    w_clip2clip=0.0,
                    use_semantic_splitting=bool(req.get("use_semantic_splitting", False)),
                    slow_fast_eval_config=os.path.join(configs, "slow_fast_params.yaml"),
                    dev_flag=dev,
                    sb_mapping_file_path=os.path.join(configs, "subject_mapping_table.yaml"),
                    bg_mapping_file_path=os.path.join(configs, "background_mapping_table.yaml"),
                    num_of_samples_per_prompt=int(req.get("num_of_samples_per_prompt") or 5),
                    static_filter_flag=bool(req.get("static_filter", False))
                    and dim == "temporal_flickering",
                )
            bench.evaluate(
                videos_path=videos_path,
                name=dim,
                prompt_list=[],
                dimension_list=[dim],
                local=False,
                read_frame=False,
                mode=mode,
                **kwargs,
            )
            result = os.path.join(out, f"{dim}_eval_results.json")
            emit(event="done", dimension=dim, result=result, seconds=time.perf_counter() - t0)
        except Exception as e:
            failures += 1
            traceback.print_exc()
            emit(event="error", dimension=dim, message=f"{type(e).__name__}: {e}"[:500])
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        check()
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as fh:
        return evaluate(json.load(fh))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
