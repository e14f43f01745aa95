"""Run directories: what was generated, with which settings, and what is finished.

Layout (design.md §5)::

    RUN/manifest.json                       model, settings, prompts, seeds, versions, hardware
    RUN/videos/<variant>/variant.json       the KVSpec of that variant
    RUN/videos/<variant>/<prompt>-<i>.mkv   lossless copy (bit-exact uint8 frames)
    RUN/videos/<variant>/<prompt>-<i>.mp4   H.264 for people and VBench ({prompt}-{index} naming)
    RUN/videos/<variant>/<prompt>-<i>.json  the record; written last, so it marks the video done
    RUN/metrics/fidelity/<variant>.json     paired scores against the reference variant

Every file is written atomically (temp file + rename). A video counts as finished only when its
record exists and its files are present, so an interrupted run resumes where it stopped, and a
directory made with other settings is refused instead of being overwritten.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import torch

from jbkv_cli import __version__
from jbkv_cli.atomic import (
    check_writable_dir,
    max_name_bytes,
    remove_stale_temps,
    write_text_atomic,
)
from jbkv_cli.errors import JbkvError, UsageError, shown
from jbkv_cli.kvcache.spec import LEGACY_REFERENCE_ID, REFERENCE_ID, KVSpec
from jbkv_cli.models.base import Video
from jbkv_cli.video import read_video, write_video_lossless, write_video_mp4

MANIFEST = "manifest.json"
LOSSLESS_SUFFIX = ".mkv"


def variant_id(spec: KVSpec) -> str:
    """A file-safe name that determines the spec, e.g. ``int2-quarot-g32-taylor``."""
    return spec.variant_id


def video_name(prompt: str, index: int) -> str:
    """VBench's naming: ``{prompt}-{index}``."""
    return f"{prompt}-{index}"


# A video's files are {prompt}-{index}{suffix}; the longest suffix is the record's, and an index
# of up to INDEX_DIGITS digits (a million seeds in one run folder) is provided for. The longest
# prompt is then what the atomic writer's temp name of that file leaves of NAME_MAX on any host.
LONGEST_SUFFIX = max((LOSSLESS_SUFFIX, ".mp4", ".json"), key=len)
INDEX_DIGITS = 6
MAX_PROMPT_BYTES = max_name_bytes(LONGEST_SUFFIX) - len("-") - INDEX_DIGITS - len(LONGEST_SUFFIX)
_NOT_IN_NAMES = ("Cc", "Cs", "Zl", "Zp")  # controls (NUL, line breaks, …), surrogates, separators


def check_prompt(prompt: str) -> str:
    """The prompt, stripped, if it can name a file (``{prompt}-{index}``); else a usage error.

    Refused: ``/`` and ``\\``, a leading ``.``, control characters (NUL, line breaks, U+0085,
    tabs, …), line and paragraph separators (U+2028, U+2029), bytes that were not UTF-8 on the
    command line (surrogates), and more than :data:`MAX_PROMPT_BYTES` UTF-8 bytes.
    """
    prompt = prompt.strip()
    if not prompt:
        raise UsageError("empty prompt")
    bad = next((c for c in prompt if unicodedata.category(c) in _NOT_IN_NAMES), None)
    if bad is not None:
        raise UsageError(
            f"prompt {shown(prompt)} cannot name a file: it holds U+{ord(bad):04X} (no control "
            "characters, line breaks or text that is not UTF-8)"
        )
    if any(c in prompt for c in "/\\") or prompt.startswith("."):
        raise UsageError(f"prompt {shown(prompt)} cannot name a file (no '/', '\\' or leading '.')")
    size = len(prompt.encode())
    if size > MAX_PROMPT_BYTES:
        raise UsageError(
            f"prompt {shown(prompt)} is too long to name a file "
            f"({size} bytes of UTF-8 > {MAX_PROMPT_BYTES})"
        )
    return prompt


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())[:120]
        raise JbkvError(f"cannot read {path}: {reason}") from exc


def _write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def _expect(ok: bool, path: Path, what: str) -> None:
    if not ok:
        raise JbkvError(f"{path} is not a jbkv {what} (damaged or edited?)")


def parse_manifest(data: Any, path: Path) -> dict[str, Any]:
    """``data`` if it has the shape of a run manifest; else a one-line :class:`JbkvError`."""
    _expect(isinstance(data, dict), path, "manifest")
    _expect(isinstance(data.get("model"), str), path, "manifest")
    _expect(isinstance(data.get("settings"), dict), path, "manifest")
    for key, kind in (("prompts", str), ("seeds", int)):
        items = data.get(key)
        _expect(isinstance(items, list) and all(type(x) is kind for x in items), path, "manifest")
    return data


def parse_record(data: Any, path: Path) -> dict[str, Any]:
    """``data`` if it has the shape of a video record; else a one-line :class:`JbkvError`."""
    _expect(isinstance(data, dict), path, "video record")
    ok = (
        isinstance(data.get("prompt"), str)
        and type(data.get("seed")) is int
        and type(data.get("index")) is int
        and data["index"] >= 0
        and type(data.get("kv_cache_bytes")) is int
        and _is_number(data.get("seconds"))
        and isinstance(data.get("diagnostics"), dict | None)
    )
    _expect(ok, path, "video record")
    diag = data.get("diagnostics") or {}
    _expect(all(v is None or _is_number(v) for v in diag.values()), path, "video record")
    return data


def parse_spec(data: Any, path: Path) -> KVSpec:
    """The :class:`KVSpec` stored in ``variant.json``; a one-line error when it is not one."""
    try:
        if not isinstance(data, dict):
            raise TypeError("not an object")
        return KVSpec.from_dict({k: v for k, v in data.items() if k != "dtype"})
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise JbkvError(f"{path} is not a jbkv variant (damaged or edited?)") from exc


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def environment() -> dict[str, Any]:
    """Versions, git revision and hardware, for the manifest."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return {
        "jbkv": __version__,
        "git_revision": rev or None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


class RunDir:
    """A run directory bound to one model and its settings."""

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.manifest = manifest
        self._seed_index: dict[int, int] = {}

    @classmethod
    def open(cls, root: Path) -> RunDir:
        """Open an existing run directory (for report, fidelity, vbench)."""
        path = Path(root) / MANIFEST
        if not path.is_file():
            raise JbkvError(f"{root} is not a jbkv run directory (no {MANIFEST})")
        return cls(Path(root), parse_manifest(_read_json(path), path))

    @classmethod
    def create_or_resume(cls, root: Path, model: str, settings: dict[str, Any]) -> RunDir:
        """Start a run in ``root``, or resume it if it was made by the same model and settings.

        Resuming deletes the temp files a killed process left behind (see
        :func:`~jbkv_cli.atomic.remove_stale_temps`).
        """
        root = Path(root)
        check_run_dir(root, model, settings)
        path = root / MANIFEST
        if path.exists():
            manifest = parse_manifest(_read_json(path), path)
            remove_stale_temps(root)
            return cls(root, manifest)
        manifest = {
            "model": model,
            "settings": settings,
            "reference_dtype": settings.get("dtype"),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "environment": environment(),
            "seeds": [],
            "prompts": [],
        }
        run = cls(root, manifest)
        _write_json(path, manifest)
        return run

    # --- prompts and seeds --------------------------------------------------------------------

    def register(self, prompts: list[str], seeds: list[int]) -> None:
        """Add prompts and seeds (linear time); a seed's index (its position) names its videos."""
        changed = False
        for key, new in (("prompts", prompts), ("seeds", seeds)):
            known = self.manifest[key]
            added = [x for x in dict.fromkeys(new) if x not in set(known)]
            if added:
                known.extend(added)
                changed = True
        if changed:
            _write_json(self.root / MANIFEST, self.manifest)

    def index_of(self, seed: int) -> int:
        """The position of ``seed`` in the manifest (it names the seed's videos)."""
        seeds = self.manifest["seeds"]
        if len(self._seed_index) != len(seeds):
            self._seed_index = {s: i for i, s in enumerate(seeds)}
        return self._seed_index[seed]

    # --- variants -----------------------------------------------------------------------------

    @property
    def reference(self) -> str:
        """The reference variant's folder: ``reference``, or ``bf16`` in runs made before
        jbkv 0.2 (which named it so whatever its dtype)."""
        videos = self.root / "videos"
        legacy = (videos / LEGACY_REFERENCE_ID).is_dir() and not (videos / REFERENCE_ID).is_dir()
        return LEGACY_REFERENCE_ID if legacy else REFERENCE_ID

    def variant_dir(self, vid: str) -> Path:
        return self.root / "videos" / vid

    def ensure_variant(self, spec: KVSpec) -> str:
        """The folder id of ``spec`` (created with its ``variant.json`` if new). The reference's
        ``variant.json`` also records the dtype it ran in."""
        vid = self.reference if spec.is_reference else variant_id(spec)
        path = self.variant_dir(vid) / "variant.json"
        if path.exists():
            stored = parse_spec(_read_json(path), path)
            if stored != spec:
                raise JbkvError(f"{path} holds a different KV spec than {spec.label!r}")
        else:
            data = spec.to_dict()
            if spec.is_reference:
                data["dtype"] = self.manifest["settings"].get("dtype")
            _write_json(path, data)
        return vid

    def variants(self) -> dict[str, KVSpec]:
        """Every variant present, in table order: the reference, then per quantizer (rtn,
        quarot) and bit width (high to low) the full variant, its ablations, its corrections."""
        out: dict[str, KVSpec] = {}
        base = self.root / "videos"
        if not base.is_dir():
            return out
        for path in sorted(base.glob("*/variant.json")):
            out[path.parent.name] = parse_spec(_read_json(path), path)
        return dict(sorted(out.items(), key=lambda kv: kv[1].sort_key()))

    # --- videos -------------------------------------------------------------------------------

    def paths(self, vid: str, name: str) -> dict[str, Path]:
        d = self.variant_dir(vid)
        return {
            "lossless": d / f"{name}{LOSSLESS_SUFFIX}",
            "mp4": d / f"{name}.mp4",
            "record": d / f"{name}.json",
        }

    def is_done(self, vid: str, name: str) -> bool:
        return all(p.is_file() for p in self.paths(vid, name).values())

    def save_video(self, vid: str, name: str, video: Video, record: dict[str, Any]) -> None:
        """Write the lossless copy, the mp4, then the record (which marks the video done)."""
        paths = self.paths(vid, name)
        write_video_lossless(paths["lossless"], video.frames, video.fps)
        write_video_mp4(paths["mp4"], video.frames, video.fps)
        _write_json(paths["record"], record)

    def load_frames(self, vid: str, name: str) -> torch.Tensor:
        frames, _ = read_video(self.paths(vid, name)["lossless"])
        return frames

    def records(self, vid: str) -> list[dict[str, Any]]:
        """Records of the finished videos of one variant, in file-name order."""
        d = self.variant_dir(vid)
        out = []
        for path in sorted(d.glob("*.json")):
            if path.name == "variant.json" or path.name.startswith("."):
                continue
            name = path.stem
            if self.is_done(vid, name):
                record = parse_record(_read_json(path), path)
                if video_name(record["prompt"], record["index"]) != name:
                    raise JbkvError(
                        f"{path} records prompt {record['prompt'][:40]!r} index "
                        f"{record['index']}, which its file name does not match (renamed?)"
                    )
                out.append(record)
        return out

    # --- metrics ------------------------------------------------------------------------------

    def metrics_path(self, kind: str, vid: str) -> Path:
        return self.root / "metrics" / kind / f"{vid}.json"

    def read_metrics(self, kind: str, vid: str) -> dict[str, Any]:
        path = self.metrics_path(kind, vid)
        if not path.is_file():
            return {}
        data = _read_json(path)
        _expect(
            isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()),
            path,
            f"{kind} metrics file",
        )
        return data

    def write_metrics(self, kind: str, vid: str, data: dict[str, Any]) -> None:
        _write_json(self.metrics_path(kind, vid), data)


def check_run_dir(root: Path, model: str, settings: dict[str, Any]) -> None:
    """Raise unless ``root`` can hold (or already holds) a run of ``model`` with ``settings``.

    Creates nothing: commands call it before their long work, and a refused command leaves no
    folder behind.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise UsageError(f"--out {root} exists and is not a directory")
    path = root / MANIFEST
    if path.exists():
        manifest = parse_manifest(_read_json(path), path)
        if manifest["model"] != model or manifest["settings"] != settings:
            diff = _describe_difference(manifest, model, settings)
            raise UsageError(
                f"{root} was made with different settings ({diff}); "
                "use another --out directory to keep both"
            )
    elif root.exists() and any(root.iterdir()):
        raise UsageError(f"--out {root} is not empty and is not a jbkv run directory")
    check_writable_dir(root, "--out")


def _describe_difference(manifest: dict[str, Any], model: str, settings: dict[str, Any]) -> str:
    if manifest.get("model") != model:
        return f"model {manifest.get('model')!r}, now {model!r}"
    old = manifest.get("settings", {})
    keys = sorted(set(old) | set(settings))
    diffs = [
        f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in keys if old.get(k) != settings.get(k)
    ]
    return ", ".join(diffs[:4])
