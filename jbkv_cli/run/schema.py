"""What the files of a run folder must hold, checked where they are read.

Each check is a pure function returning None for good data, or a short phrase naming the first
bad field (``'psnr' is not a number in [0, 100] (got 'x')``) that the reader puts after the
file's path, so a damaged file is one line naming the file and the field instead of a
``TypeError`` or an ``OverflowError`` later on. Numbers must be finite and inside a range
that keeps every mean and standard error finite (squares of 1e308 overflow).

What a reader does with a problem is its own choice (:mod:`jbkv_cli.run.directory`): a damaged manifest or
variant file stops the command; a damaged video record makes that video unfinished and a damaged
score makes it unscored, so a resumed run makes or scores it again.
"""

from __future__ import annotations

import math
from typing import Any

from jbkv_cli.metrics.psnr import PSNR_CAP_DB

BIG = 1e12  # bound of diagnostics, timings and other unbounded measurements
MAX_INT = 2**62  # bound of byte counts (an int beyond a float's range cannot be averaged)
MAX_COUNT = 10**7  # bound of frame counts, chunk lengths and indices
_SLACK = 1e-6  # float rounding at the ends of a range (an SSIM of 1 + 2e-16)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def _number(x: Any, lo: float, hi: float) -> bool:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    # compare before isfinite: math.isfinite(10**400) raises OverflowError
    return lo <= x <= hi and math.isfinite(x)


def _integer(x: Any, lo: int, hi: int) -> bool:
    return type(x) is int and lo <= x <= hi


def _bad(key: str, what: str, value: Any) -> str:
    return f"{key!r} is not {what} (got {_shown(value)})"


def _numbers(value: Any, lo: float, hi: float) -> bool:
    return isinstance(value, list) and all(_number(x, lo, hi) for x in value)


# --- manifest ------------------------------------------------------------------------------------


def manifest_problem(data: Any) -> str | None:
    """Why ``data`` is not a run manifest (``RUN/manifest.json``), or None."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if not isinstance(data.get("model"), str):
        return _bad("model", "a string", data.get("model"))
    if not isinstance(data.get("settings"), dict):
        return _bad("settings", "an object", data.get("settings"))
    prompts, seeds = data.get("prompts"), data.get("seeds")
    if not (isinstance(prompts, list) and all(type(p) is str for p in prompts)):
        return _bad("prompts", "a list of strings", prompts)
    if not (isinstance(seeds, list) and all(_integer(s, 0, 2**64) for s in seeds)):
        return _bad("seeds", "a list of non-negative integers", seeds)
    for key, items in (("prompts", prompts), ("seeds", seeds)):
        if len(set(items)) != len(items):
            return f"{key!r} lists an entry twice"
    return _cases_problem(data.get("cases", {}), set(prompts)) or _inputs_problem(
        data.get("inputs", {})
    )


def _sha256(x: Any) -> bool:
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)


def _inputs_problem(inputs: Any) -> str | None:
    """``inputs`` (optional): file key -> ``{"path", "sha256"}`` (:mod:`jbkv_cli.run.fingerprints`)."""
    if not isinstance(inputs, dict):
        return _bad("inputs", "an object", inputs)
    for key, entry in inputs.items():
        ok = isinstance(entry, dict) and isinstance(entry.get("path"), str)
        if not (ok and _sha256(entry.get("sha256"))):
            return _bad(f"inputs.{key}", "an object with a 'path' and a 'sha256'", entry)
    return None


def _cases_problem(cases: Any, prompts: set[str]) -> str | None:
    """``cases`` (optional): case name -> its inputs, every name a registered prompt."""
    if not isinstance(cases, dict):
        return _bad("cases", "an object", cases)
    for name, case in cases.items():
        if name not in prompts:
            return f"'cases' holds {_shown(name)}, which 'prompts' does not list"
        if not (isinstance(case, dict) and isinstance(case.get("prompt"), str)):
            return _bad(f"cases.{name}", "an object with a 'prompt'", case)
        for key in ("image", "trajectory", "id"):
            if not isinstance(case.get(key), str | None):
                return _bad(f"cases.{name}.{key}", "a string or null", case.get(key))
        digests = case.get("sha256", {})
        if not (isinstance(digests, dict) and all(map(_sha256, digests.values()))):
            return _bad(f"cases.{name}.sha256", "an object of SHA-256 digests", digests)
    return None


# --- video records -------------------------------------------------------------------------------


def record_problem(data: Any) -> str | None:
    """Why ``data`` is not a video record (``RUN/videos/<variant>/<name>.json``), or None.

    Required: ``prompt``, ``seed``, ``index``, ``kv_cache_bytes``, ``seconds``; every other field
    a reader uses is checked when present (records of older versions lack some).
    """
    if not isinstance(data, dict):
        return "not a JSON object"
    checks = (
        ("prompt", isinstance(data.get("prompt"), str), "a string"),
        ("seed", _integer(data.get("seed"), 0, 2**64), "a non-negative integer"),
        ("index", _integer(data.get("index"), 0, MAX_COUNT), "a non-negative integer"),
        ("kv_cache_bytes", _integer(data.get("kv_cache_bytes"), 0, MAX_INT), "a byte count"),
        ("seconds", _number(data.get("seconds"), 0, BIG), "a number of seconds"),
    )
    for key, ok, what in checks:
        if not ok:
            return _bad(key, what, data.get(key))
    return _optional_record_fields(data)


def _optional_record_fields(data: dict[str, Any]) -> str | None:
    diag = data.get("diagnostics")
    if not isinstance(diag, dict | None):
        return _bad("diagnostics", "an object or null", diag)
    for key, value in (diag or {}).items():
        if value is not None and not _number(value, -BIG, BIG):
            return _bad(f"diagnostics.{key}", f"a number in [-{BIG:g}, {BIG:g}]", value)
    frames = data.get("frames")
    if frames is not None and not (
        isinstance(frames, list)
        and len(frames) == 4
        and all(_integer(x, 0, MAX_COUNT) for x in frames)
    ):
        return _bad("frames", "a list of 4 frame dimensions", frames)
    fps = data.get("fps")
    if fps is not None and not _number(fps, 1e-3, 1e4):
        return _bad("fps", "a frame rate in [0.001, 10000]", fps)
    samples = data.get("delta_ps_samples")
    if samples is not None and not _numbers(samples, -1.0 - _SLACK, 1.0 + _SLACK):
        return _bad("delta_ps_samples", "a list of numbers in [-1, 1]", samples)
    return (
        _memory_problem(data)
        or _compression_problem(data.get("compression"))
        or _info_problem(data.get("info"))
    )


def _compression_problem(held: Any) -> str | None:
    """``compression`` (kvcache/coverage.py): null, or token-row counts."""
    if held is None:
        return None
    if not isinstance(held, dict):
        return _bad("compression", "an object or null", held)
    for key, value in held.items():
        if not _integer(value, 0, MAX_INT):
            return _bad(f"compression.{key}", "a count of token-rows", value)
    ok = held.get("compressed", 0) <= held.get("held", 0) and held.get("kept", 0) <= held.get(
        "unpruned", 0
    )
    return None if ok else _bad("compression", "compressed <= held and kept <= unpruned", held)


_WORKING_INTS = ("read", "view", "attend", "with_diagnostics", "diagnostics", "reads")


def _memory_problem(data: dict[str, Any]) -> str | None:
    """``working_bytes``, ``cuda_memory`` (attention/memory.py) and ``attention_error``
    (attention/bias_share.py), each optional: byte counts, sums of squared errors, cells."""
    working = data.get("working_bytes")
    if working is not None:
        if not isinstance(working, dict):
            return _bad("working_bytes", "an object or null", working)
        for key in _WORKING_INTS:
            if key in working and not _integer(working[key], 0, MAX_INT):
                return _bad(f"working_bytes.{key}", "a byte count", working[key])
        paths = working.get("paths", {})  # reads per attention path (older records: absent)
        if not (
            isinstance(paths, dict)
            and all(type(k) is str and _integer(n, 0, MAX_INT) for k, n in paths.items())
        ):
            return _bad("working_bytes.paths", "an object of read counts by path", paths)
    cuda = data.get("cuda_memory")
    if cuda is not None:
        if not isinstance(cuda, dict):
            return _bad("cuda_memory", "an object or null", cuda)
        for key, value in cuda.items():
            if not _integer(value, 0, MAX_INT):
                return _bad(f"cuda_memory.{key}", "a byte count", value)
    return _attention_error_problem(data.get("attention_error"))


def _attention_error_problem(err: Any) -> str | None:
    if err is None:
        return None
    if not isinstance(err, dict):
        return _bad("attention_error", "an object with 'layers' and 'cells'", err)
    layers = err.get("layers")
    ok = (
        isinstance(layers, list)
        and all(
            isinstance(e, list)
            and len(e) in (7, 8)  # E_corr (8th) since corrections report what they remove
            and _integer(e[0], -1, MAX_COUNT)
            and _numbers([*e[1:3], e[6]], 0, BIG)
            and (len(e) == 7 or e[7] is None or _number(e[7], 0, BIG))
            and _integer(e[3], 0, MAX_INT)
            and _numbers(e[4], 0, BIG)
            and _numbers(e[5], 0, BIG)
            and len(e[4]) == len(e[5])
            for e in layers
        )
    )
    if not ok:
        return _bad(
            "attention_error.layers",
            "[[layer, E_quant, E_bias, n, [..], [..], E_left, E_corr]]",
            layers,
        )
    cells = err.get("cells")
    ok = isinstance(cells, list) and all(
        isinstance(c, list)
        and len(c) == 7
        and all(_integer(x, -1, MAX_COUNT) for x in c[:2])
        and _integer(c[2], 1, MAX_COUNT)
        and _number(c[3], -BIG, BIG)
        and _numbers(c[4:], 0, BIG)
        for c in cells
    )
    return None if ok else _bad("attention_error.cells", "[[layer, step, calls, ...]]", cells)


def _info_problem(info: Any) -> str | None:
    if info is None:
        return None
    if not isinstance(info, dict):
        return _bad("info", "an object or null", info)
    for key in ("frames_per_chunk", "num_chunks"):
        value = info.get(key)
        if value is not None and not _integer(value, 1, MAX_COUNT):
            return _bad(f"info.{key}", "a positive integer", value)
    for key in ("kv_cache_bytes_by_head", "kv_cache_bytes_by_cache"):
        split = info.get(key)
        if split is not None and not (
            isinstance(split, dict) and all(_integer(v, 0, MAX_INT) for v in split.values())
        ):
            return _bad(f"info.{key}", "an object of byte counts", split)
    return None


# --- fidelity scores -----------------------------------------------------------------------------

_PSNR = (-_SLACK, PSNR_CAP_DB + _SLACK, f"[0, {PSNR_CAP_DB:g}]")
_SSIM = (-1.0 - _SLACK, 1.0 + _SLACK, "[-1, 1]")
_LPIPS = (-_SLACK, 100.0, "[0, 100]")
_RANGES = {"psnr": _PSNR, "psnr_pooled": _PSNR, "ssim": _SSIM, "lpips": _LPIPS}
_COUNTS = {"first_chunk": 0, "chunk_frames": 1, "first_chunk_frames": 1, "skipped_frames": 0}


def score_problem(entry: Any) -> str | None:
    """Why ``entry`` is not one video's fidelity score (``metrics/fidelity/…``), or None.

    Required: ``psnr`` and ``ssim``; ``lpips`` (null when not computed), the per-frame and
    per-chunk lists and their chunk counters are checked when present.
    """
    if not isinstance(entry, dict):
        return "not a JSON object"
    for key in ("psnr", "ssim"):
        lo, hi, span = _RANGES[key]
        if not _number(entry.get(key), lo, hi):
            return _bad(key, f"a number in {span}", entry.get(key))
    for key in ("psnr_pooled", "lpips"):
        lo, hi, span = _RANGES[key]
        value = entry.get(key)
        if value is not None and not _number(value, lo, hi):
            return _bad(key, f"a number in {span} or null", value)
    for metric in ("psnr", "ssim", "lpips"):
        lo, hi, span = _RANGES[metric]
        for suffix in ("_per_frame", "_per_chunk"):
            value = entry.get(metric + suffix)
            if value is not None and not _numbers(value, lo, hi):
                return _bad(metric + suffix, f"a list of numbers in {span}", value)
    for key, lo in _COUNTS.items():
        value = entry.get(key)
        if value is not None and not _integer(value, lo, MAX_COUNT):
            return _bad(key, f"an integer in [{lo}, {MAX_COUNT}]", value)
    status = entry.get("lpips_status")
    if status is not None and not isinstance(status, str):
        return _bad("lpips_status", "a string or null", status)
    return None


def prompt_problem(entry: Any) -> str | None:
    """Why ``entry`` is not one video's prompt check (``metrics/prompt/…``), or None: a
    ``valid_per_chunk`` list of booleans (the model's
    :meth:`~jbkv_cli.models.contract.VideoModel.follows_prompt`), its ``chunk_frames`` and the
    check's ``check_version`` (absent: 1)."""
    if not isinstance(entry, dict):
        return "not a JSON object"
    valid = entry.get("valid_per_chunk")
    if not (
        isinstance(valid, list) and len(valid) <= MAX_COUNT and all(type(v) is bool for v in valid)
    ):
        return _bad("valid_per_chunk", "a list of true/false", valid)
    frames = entry.get("chunk_frames")
    if not _integer(frames, 1, MAX_COUNT):
        return _bad("chunk_frames", f"an integer in [1, {MAX_COUNT}]", frames)
    version = entry.get("check_version", 1)
    if not _integer(version, 1, MAX_COUNT):
        return _bad("check_version", f"an integer in [1, {MAX_COUNT}]", version)
    return None


def floor_problem(entry: Any) -> str | None:
    """Why ``entry`` is not one reference video's floor (``metrics/floor/…``: its fidelity
    score against the reference of the same prompt at the first seed), or None."""
    problem = score_problem(entry)
    if problem:
        return problem
    if not isinstance(entry.get("against"), str):
        return _bad("against", "a video name", entry.get("against"))
    if not isinstance(entry.get("psnr_per_chunk"), list):
        return _bad("psnr_per_chunk", "a list of numbers", entry.get("psnr_per_chunk"))
    return None


def pruned16_problem(entry: Any) -> str | None:
    """Why ``entry`` is not one video's score against its pruned 16-bit video
    (``metrics/pruned16/…``, :mod:`jbkv_cli.run.pruned_base`: a fidelity score and ``against``,
    the 16-bit variant), or None."""
    problem = score_problem(entry)
    if problem:
        return problem
    if not isinstance(entry.get("against"), str):
        return _bad("against", "a variant name", entry.get("against"))
    return None


SCORE_CHECKS = {
    "fidelity": score_problem,
    "prompt": prompt_problem,
    "floor": floor_problem,
    "pruned16": pruned16_problem,
}
"""Per kind of score (``metrics/<kind>/…``): its check."""


# --- VBench results ------------------------------------------------------------------------------

_TOTALS = ("quality", "semantic", "total")


def vbench_problem(doc: Any) -> str | None:
    """Why ``doc`` is not a VBench summary (``RUN/metrics/vbench.json``) as the report reads it
    (per variant: dimension scores with their SE and count, and the totals), or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    variants = doc.get("variants")
    if not isinstance(variants, dict | None):
        return _bad("variants", "an object", variants)
    for vid, v in (variants or {}).items():
        where = f"variants.{vid}"
        if not isinstance(v, dict):
            return _bad(where, "an object", v)
        dims = v.get("dimensions")
        if not isinstance(dims, dict | None):
            return _bad(f"{where}.dimensions", "an object", dims)
        for dim, x in (dims or {}).items():
            problem = _dimension_problem(x)
            if problem:
                return f"{where}.dimensions.{dim}: {problem}"
        totals = v.get("totals")
        if not isinstance(totals, dict | None):
            return _bad(f"{where}.totals", "an object", totals)
        for key in (*_TOTALS, *(f"{t}_se" for t in _TOTALS)):
            value = (totals or {}).get(key)
            if value is not None and not _number(value, -BIG, BIG):
                return _bad(f"{where}.totals.{key}", "a number or null", value)
    return None


def _dimension_problem(x: Any) -> str | None:
    if not isinstance(x, dict):
        return "not an object"
    for key in ("score", "se"):
        value = x.get(key)
        if value is not None and not _number(value, -BIG, BIG):
            return _bad(key, "a number or null", value)
    count = x.get("n_videos")
    if count is not None and not _integer(count, 0, MAX_INT):
        return _bad("n_videos", "a count or null", count)
    clips = x.get("per_clip")
    if not isinstance(clips, dict | None):
        return _bad("per_clip", "an object", clips)
    for video, values in (clips or {}).items():
        if not isinstance(values, list) or not all(
            v is None or _number(v, -BIG, BIG) for v in values
        ):
            return _bad(f"per_clip.{video}", "a list of numbers or nulls", values)
    return None
