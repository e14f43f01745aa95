"""Offline head profiling for Forcing-KV: frame-level attention mass, static/dynamic classes.

While a model generates with a full-precision cache, :class:`FrameMassProbe` measures for every
denoising step of every chunk that reads a cache, per layer and query head, the mean over the
chunk's queries of the softmax mass on each key frame:

    m_f = mean_q Σ_{i ∈ frame f} softmax(τ q·k)_i        f ∈ {current chunk, cached frames}

A head's *local mass* is the share on the current chunk and the ``A`` most recent cached frames
(the transition anchors): ``ℓ = m_current + Σ_{r=1..A} m_(r)`` (``(r)``: the r-th most recent
cached frame). Averaged over every call, ``ℓ ≥ threshold`` makes the head **static** (it attends
to the current chunk and the anchors), otherwise **dynamic** (it reads the older history).

A KV head's class is that of the mean ``ℓ`` over the query heads that read it (GQA; equal for
MHA). The profile also keeps ``m`` by recency per head, and the agreement of the classification
made from each (prompt, seed) alone and from each denoising step alone with the overall one (the
paper's stability claim, measured).

MAGI-1 denoises several chunks per forward: each chunk's cache read is one record, its
"current" mass is on the forward's in-flight chunks it reads, and its step is the forward's step
in its stage.

The JSON file (:data:`FORMAT`) is what :class:`~jbkv_cli.prune.forcing_kv.ForcingKV` reads;
:func:`load_profile` validates it before any work and names the file in its one-line error.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.jsonio import FileReadError, parse_json, read_bytes

FORMAT = "jbkv-head-profile/1"
KINDS = ("static", "dynamic")
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_ANCHOR_FRAMES = 1
DEFAULT_THRESHOLD = 0.75


class ProfileError(ValueError):
    """A head-profile file that cannot be used (the message names the file)."""


@dataclass(frozen=True)
class HeadProfile:
    """The classes a pruner reads: ``heads[layer][kv_head]`` in :data:`KINDS`."""

    model: str
    anchor_frames: int
    threshold: float
    heads: tuple[tuple[str, ...], ...]

    @property
    def layers(self) -> int:
        return len(self.heads)

    def counts(self) -> dict[str, int]:
        return {k: sum(h.count(k) for h in self.heads) for k in KINDS}


def default_profile_path(model: str) -> Path:
    """The profile shipped for ``model`` (it may not exist)."""
    return PROFILES_DIR / f"{model}.json"


def _fail(path: Path | str, why: str) -> ProfileError:
    return ProfileError(f"{path} is not a usable head profile: {why}")


def parse_profile(doc: Any, path: Path | str = "<profile>") -> HeadProfile:
    """The :class:`HeadProfile` of a decoded JSON document; :class:`ProfileError` otherwise."""
    if not isinstance(doc, dict):
        raise _fail(path, "not a JSON object")
    if doc.get("format") != FORMAT:
        raise _fail(path, f"'format' must be {FORMAT!r}, got {doc.get('format')!r}")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise _fail(path, "'model' must be a model name")
    anchor = doc.get("anchor_frames")
    if type(anchor) is not int or anchor < 1:
        raise _fail(path, f"'anchor_frames' must be an integer >= 1, got {anchor!r}")
    threshold = doc.get("threshold")
    if not isinstance(threshold, int | float) or isinstance(threshold, bool):
        raise _fail(path, f"'threshold' must be a number, got {threshold!r}")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise _fail(path, "'layers' must be a non-empty list")
    heads = []
    for i, layer in enumerate(layers):
        kinds = layer.get("heads") if isinstance(layer, dict) else None
        if not isinstance(kinds, list) or not kinds or any(k not in KINDS for k in kinds):
            raise _fail(path, f"layer {i}: 'heads' must be a non-empty list of static/dynamic")
        if heads and len(kinds) != len(heads[0]):
            raise _fail(path, f"layer {i} has {len(kinds)} heads, layer 0 has {len(heads[0])}")
        heads.append(tuple(kinds))
    return HeadProfile(model, anchor, float(threshold), tuple(heads))


def load_profile(path: Path | str) -> HeadProfile:
    """Read and validate a profile file (:class:`ProfileError` naming ``path``)."""
    return read_profile(path)[0]


def read_profile(path: Path | str) -> tuple[HeadProfile, bytes]:
    """The validated profile in ``path`` and the bytes it was read from (for its digest).

    Only a regular file of at most :data:`~jbkv_cli.jsonio.MAX_JSON_BYTES` is read (a FIFO or
    ``/dev/zero`` is refused without blocking); bad UTF-8, bad or too deeply nested JSON and a
    wrong shape are one :class:`ProfileError` naming ``path``.
    """
    try:
        data = read_bytes(path, "head profile")
        doc = parse_json(data, path, "head profile")
    except FileReadError as exc:
        raise _fail(path, exc.reason) from None
    return parse_profile(doc, path), data


# --- measuring ----------------------------------------------------------------------------------


def frame_mass(
    q: torch.Tensor,
    k_cached: torch.Tensor,
    k_cur: torch.Tensor,
    scale: float,
    frame_tokens: int,
    block: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean softmax mass per key frame: ``(current [B, Hq], cached [B, Hq, Fc])``.

    ``q [B, Hq, Lq, D]``, ``k_cached [B, Hkv, Fc·T, D]`` (oldest frame first), ``k_cur`` the
    current chunk's keys; GQA by head ratio; computed in float32, ``block`` queries at a time.
    """
    rep = q.shape[-3] // k_cached.shape[-3]
    k = torch.cat([k_cached, k_cur], -2).float().repeat_interleave(rep, dim=-3)
    lc = k_cached.shape[-2]
    if lc % frame_tokens:
        raise ValueError(f"{lc} cached tokens are not whole frames of {frame_tokens}")
    cur = q.new_zeros(q.shape[:-2], dtype=torch.float32)
    cached = q.new_zeros((*q.shape[:-2], lc // frame_tokens), dtype=torch.float32)
    for start in range(0, q.shape[-2], block):
        p = (scale * q[..., start : start + block, :].float() @ k.transpose(-1, -2)).softmax(-1)
        cur += p[..., lc:].sum((-1, -2))
        cached += p[..., :lc].unflatten(-1, (-1, frame_tokens)).sum((-1, -3))
    return cur / q.shape[-2], cached / q.shape[-2]


@dataclass
class _Record:
    sample: int
    layer: int
    chunk: int
    step: int
    current: torch.Tensor  # [Hq]
    recent: torch.Tensor  # [Hq, Fc], most recent cached frame first


class _ProbedCache:
    """Passes every call to ``cache`` and measures the frame mass of each attention read."""

    def __init__(self, cache, probe: FrameMassProbe, layer: int) -> None:
        self.cache, self.probe, self.layer = cache, probe, layer

    def commit(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.commit(k, v)

    def attend(self, q, k_cur, v_cur, scale, last=None, backend=None):
        self.probe.observe(self.layer, q, k_cur, self.cache.read(last), scale)
        return self.cache.attend(q, k_cur, v_cur, scale, last=last, backend=backend)

    def __getattr__(self, name: str):
        return getattr(self.cache, name)


@dataclass
class FrameMassProbe:
    """Collects frame masses while a model generates (see the module docstring).

    The model's chunk loop calls :meth:`wrap` on its caches, :meth:`at` before each forward
    (``step=None`` for passes that are not denoising steps, e.g. a refresh pass: not measured),
    and the caller :meth:`begin_sample` before each (prompt, seed).
    """

    frame_tokens: int
    records: list[_Record] = field(default_factory=list)
    samples: list[tuple[str, int]] = field(default_factory=list)
    _chunk: int = 0
    _step: int | None = None

    def begin_sample(self, prompt: str, seed: int) -> None:
        self.samples.append((prompt, seed))

    def wrap(self, caches: list) -> list:
        return [_ProbedCache(c, self, i) for i, c in enumerate(caches)]

    def at(self, chunk: int, step: int | None) -> None:
        self._chunk, self._step = chunk, step

    def observe(self, layer: int, q, k_cur, cached, scale: float) -> None:
        if self._step is None or cached is None or cached.num_tokens == 0:
            return
        cur, frames = frame_mass(q, cached.k, k_cur, scale, self.frame_tokens)
        record = _Record(
            len(self.samples) - 1,
            layer,
            self._chunk,
            self._step,
            cur.mean(0).cpu(),  # mean over the batch
            frames.mean(0).flip(-1).cpu(),
        )
        self.records.append(record)


# --- classifying --------------------------------------------------------------------------------


def local_mass(record: _Record, anchor_frames: int) -> torch.Tensor:
    """``ℓ [Hq]``: mass on the current chunk and the ``anchor_frames`` most recent frames."""
    return record.current + record.recent[:, :anchor_frames].sum(-1)


def _kv_mean(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Mean over the query heads of each KV head: ``[..., Hq] -> [..., Hkv]``."""
    return x.unflatten(-1, (kv_heads, -1)).mean(-1)


def classify(local: torch.Tensor, threshold: float) -> list[list[str]]:
    """``[layers, heads]`` local masses -> classes."""
    return [["static" if x >= threshold else "dynamic" for x in row] for row in local.tolist()]


def _mean_local(records: list[_Record], layers: int, anchor: int, kv_heads: int) -> torch.Tensor:
    """Mean ``ℓ`` per (layer, KV head) over ``records`` (NaN where a layer has none)."""
    sums = defaultdict(list)
    for r in records:
        sums[r.layer].append(_kv_mean(local_mass(r, anchor), kv_heads))
    out = torch.full((layers, kv_heads), float("nan"))
    for layer, xs in sums.items():
        out[layer] = torch.stack(xs).mean(0)
    return out


def _agreement(
    groups: dict[Any, list[_Record]],
    overall: list[list[str]],
    shape: tuple[int, int, int],
    threshold: float,
) -> dict[str, Any]:
    """Share of (group, layer, head) whose class from the group alone equals the overall one;
    ``worst``: the lowest share of one group."""
    same = total = 0
    worst = 1.0
    for recs in groups.values():
        local = _mean_local(recs, *shape)
        ok = ~local.isnan()
        classes = classify(local.nan_to_num(0.0), threshold)
        match = [
            c == o
            for row_c, row_o, row_ok in zip(classes, overall, ok.tolist(), strict=True)
            for c, o, k in zip(row_c, row_o, row_ok, strict=True)
            if k
        ]
        same += sum(match)
        total += len(match)
        if match:
            worst = min(worst, sum(match) / len(match))
    return {"groups": len(groups), "agreement": same / total if total else None, "worst": worst}


def summarize(
    probe: FrameMassProbe,
    layers: int,
    kv_heads: int,
    anchor_frames: int = DEFAULT_ANCHOR_FRAMES,
    threshold: float = DEFAULT_THRESHOLD,
) -> dict[str, Any]:
    """The profile's measured part: classes, local masses, frame masses and stability."""
    if not probe.records:
        raise ValueError("no attention read a cache: nothing to profile (more chunks?)")
    args = (layers, anchor_frames, kv_heads)
    local = _mean_local(probe.records, *args)
    if local.isnan().any():
        raise ValueError("some layers never read a cache")
    heads = classify(local, threshold)
    out_layers = []
    for layer in range(layers):
        recs = [r for r in probe.records if r.layer == layer]
        depth = max(r.recent.shape[-1] for r in recs)
        by_recency = []
        for d in range(depth):
            xs = [r.recent[:, d] for r in recs if r.recent.shape[-1] > d]
            by_recency.append(torch.stack(xs).mean(0))
        current = torch.stack([r.current for r in recs]).mean(0)
        out_layers.append(
            {
                "heads": heads[layer],
                "local_mass": [round(x, 4) for x in local[layer].tolist()],
                "current_mass": [round(x, 4) for x in current.tolist()],
                "frame_mass": [
                    [round(float(m[h]), 4) for m in by_recency] for h in range(current.shape[0])
                ],
            }
        )
    by_sample = defaultdict(list)
    by_step = defaultdict(list)
    for r in probe.records:
        by_sample[r.sample].append(r)
        by_step[r.step].append(r)
    flat = local.flatten()
    margin = (flat - threshold).abs().min().item()
    return {
        "anchor_frames": anchor_frames,
        "threshold": threshold,
        "counts": {k: sum(row.count(k) for row in heads) for k in KINDS},
        "min_margin": round(margin, 4),
        "layers": out_layers,
        "stability": {
            "samples": _agreement(by_sample, heads, args, threshold),
            "steps": _agreement(by_step, heads, args, threshold),
        },
        "calls": len(probe.records),
    }


def profile_document(
    model: str,
    settings: dict[str, Any],
    probe: FrameMassProbe,
    measured: dict[str, Any],
    command: str,
) -> dict[str, Any]:
    """The JSON document :func:`load_profile` reads back."""
    return {
        "format": FORMAT,
        "model": model,
        "command": command,
        "statistic": (
            "local mass = mean softmax mass on the current chunk + the anchor_frames most recent "
            "cached frames, averaged over queries, denoising steps, chunks reading a cache, "
            "layers' calls, prompts and seeds; static when >= threshold (per KV head: mean over "
            "its query heads). frame_mass[h]: mass per cached frame, most recent first; "
            "current_mass: on the current chunk."
        ),
        "settings": settings,
        "samples": [{"prompt": p, "seed": s} for p, s in probe.samples],
        **measured,
    }
