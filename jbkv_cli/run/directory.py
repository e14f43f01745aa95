"""Run directories: what was generated, with which settings, and what is finished.

Layout::

    RUN/manifest.json                       model, settings, prompts, seeds, versions, hardware
                                            (and ``cases``: the inputs of every case that is
                                            more than a prompt, by name, with its plan and the
                                            SHA-256 of its files; ``inputs``: the model's files
                                            and their SHA-256, :mod:`jbkv_cli.run.fingerprints`)
    RUN/videos/<variant>/variant.json       the KVSpec of that variant
    RUN/videos/<variant>/<prompt>-<i>.mkv   lossless copy (bit-exact uint8 frames)
    RUN/videos/<variant>/<prompt>-<i>.mp4   H.264 for people and VBench ({prompt}-{index} naming)
    RUN/videos/<variant>/<prompt>-<i>.json  the record; written last, so it marks the video done
    RUN/metrics/fidelity/<variant>/<prompt>-<i>.json   one video's paired scores vs the reference
    RUN/metrics/fidelity/<variant>.json     a variant's scores as older runs kept them
                                            (read, never rewritten; a per-video file wins)

Every file is written atomically (temp file + rename). A video counts as finished only when its
record exists, is a valid record and its files are present, so an interrupted run resumes where
it stopped, and a directory made with other settings, or from files that have changed since,
is refused instead of being overwritten or mixed (:func:`check_inputs`).

Damaged files (checked by :mod:`jbkv_cli.run.schema` as they are read): a damaged manifest or
``variant.json`` stops the command with one line naming the file and the field; a damaged video
record makes that video unfinished and a damaged score makes it unscored, each with one warning
naming the file and the field, so a resumed run (or ``report --score``) makes or scores it again.

The manifest's read-modify-writes (creating it, registering prompts and seeds) hold a lock on
``RUN/.manifest.lock`` (:mod:`jbkv_cli.utils.locks`), so two commands starting on one folder at once
both keep their registrations.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
import unicodedata
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from jbkv_cli import __version__
from jbkv_cli.kvcache.spec import LEGACY_REFERENCE_ID, REFERENCE_ID, KVSpec
from jbkv_cli.models.base import Video
from jbkv_cli.models.cases import Case
from jbkv_cli.run.fingerprints import Fingerprint, case_change, case_digests, change
from jbkv_cli.run.schema import SCORE_CHECKS, manifest_problem, record_problem
from jbkv_cli.utils.atomic import (
    check_writable_dir,
    is_temp,
    max_name_bytes,
    remove_stale_temps,
    write_text_atomic,
)
from jbkv_cli.utils.console import warn
from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.jsonio import read_json
from jbkv_cli.utils.locks import locked
from jbkv_cli.utils.video import read_video, write_video_lossless, write_video_mp4

MANIFEST = "manifest.json"
MANIFEST_LOCK = ".manifest.lock"
LOSSLESS_SUFFIX = ".mkv"


def _test_seam(event: str) -> None:
    """Called at ``"read"`` (the manifest was read, not yet written back) and ``"waiting"``
    (another process holds the manifest's lock); tests replace it to force a race."""


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
    """A run file's JSON; anything else (a FIFO or device in its place, a huge or deep file,
    ``NaN``) is one ``cannot read PATH: reason`` line (:mod:`jbkv_cli.utils.jsonio`)."""
    return read_json(path)


def _write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def _damaged(path: Path, what: str, problem: str) -> JbkvError:
    return JbkvError(f"{path} is not a jbkv {what}: {problem} (damaged or edited?)")


def parse_manifest(data: Any, path: Path) -> dict[str, Any]:
    """``data`` if it has the shape of a run manifest; else a one-line :class:`JbkvError`
    naming the file and the field."""
    problem = manifest_problem(data)
    if problem:
        raise _damaged(path, "manifest", problem)
    return data


def parse_record(data: Any, path: Path) -> dict[str, Any]:
    """``data`` if it has the shape of a video record; else a one-line :class:`JbkvError`
    naming the file and the field."""
    problem = record_problem(data)
    if problem:
        raise _damaged(path, "video record", problem)
    return data


def parse_spec(data: Any, path: Path) -> KVSpec:
    """The :class:`KVSpec` stored in ``variant.json``; a one-line error when it is not one."""
    try:
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        return KVSpec.from_dict({k: v for k, v in data.items() if k != "dtype"})
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        reason = " ".join(str(exc).split())[:100] or type(exc).__name__
        raise _damaged(path, "variant", reason) from exc


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
        self._checked: dict[Path, tuple[tuple[int, int, int], str | None]] = {}  # record verdicts
        self._loaded: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}  # valid ones
        self._warned: set[Path] = set()

    @classmethod
    def open(cls, root: Path) -> RunDir:
        """Open an existing run directory (for report, fidelity, vbench)."""
        path = Path(root) / MANIFEST
        if not path.is_file():
            raise JbkvError(f"{root} is not a jbkv run directory (no {MANIFEST})")
        return cls(Path(root), parse_manifest(_read_json(path), path))

    @classmethod
    def create_or_resume(
        cls,
        root: Path,
        model: str,
        settings: dict[str, Any],
        inputs: Fingerprint | None = None,
    ) -> RunDir:
        """Start a run in ``root``, or resume it if it was made by the same model and settings
        from the same files (``inputs``: the model's, :mod:`jbkv_cli.run.fingerprints`; a run that
        kept none gets them now).

        Checked again under the manifest's lock, so of two commands starting at once on a new
        folder one creates the manifest and the other resumes it (or is refused, for other
        settings). Resuming deletes the temp files a killed process left behind (see
        :func:`~jbkv_cli.utils.atomic.remove_stale_temps`).
        """
        root = Path(root)
        check_run_dir(root, model, settings, inputs)
        path = root / MANIFEST
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JbkvError(f"cannot create --out {root}: {exc.strerror or exc}") from exc
        with _manifest_lock(root):
            check_run_dir(root, model, settings, inputs)
            if path.exists():
                manifest = parse_manifest(_read_json(path), path)
                if inputs is not None and "inputs" not in manifest:
                    manifest["inputs"] = inputs
                    _write_json(path, manifest)
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
            if inputs is not None:
                manifest["inputs"] = inputs
            _write_json(path, manifest)
        return cls(root, manifest)

    # --- prompts and seeds --------------------------------------------------------------------

    def register(self, prompts: list[Case | str], seeds: list[int]) -> None:
        """Add cases (or prompts) and seeds (linear time); a seed's index (its position) names
        its videos. ``prompts`` keeps every case's name; a case that is more than a prompt is
        also kept under ``cases`` with its plan (the first plan registered stays). A name
        registered before with other inputs is a :class:`UsageError`.

        A read-modify-write of the manifest on disk under its lock: what another command
        registered meanwhile is kept, and this run's seed positions are the ones on disk.
        """
        path = self.root / MANIFEST
        cases = [Case.of(p) for p in prompts]
        with _manifest_lock(self.root):
            manifest = parse_manifest(_read_json(path), path) if path.is_file() else self.manifest
            _test_seam("read")
            changed = _register_cases(manifest, cases, self.root) or not path.is_file()
            prompts = [c.name for c in cases]
            for key, new in (("prompts", prompts), ("seeds", seeds)):
                known = manifest[key]
                seen = set(known)
                added = [x for x in dict.fromkeys(new) if x not in seen]
                if added:
                    known.extend(added)
                    changed = True
            if changed:
                _write_json(path, manifest)
        self.manifest = manifest
        self._seed_index = {}

    def case(self, name: str) -> Case:
        """The registered case of ``name`` (with its plan); a prompt-only one when the run
        keeps no inputs for it."""
        data = self.manifest.get("cases", {}).get(name)
        return Case(name) if data is None else Case.from_dict(data)

    def check_case_files(self, case: Case) -> None:
        """Refuse (exit 1, naming the file) when a file of ``case`` (a case read back from the
        manifest, with the digests the run kept) is no longer the one the run was made from."""
        if case.sha256:
            now = replace(case, sha256=case_digests(case))
            _refuse_changed_files(
                self.root, [now], {case.name: {**case.to_dict(), "sha256": case.sha256}}
            )

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
        """The video's files are all there and its record is a valid record (a damaged one
        makes the video unfinished: one warning, and a resumed run makes it again)."""
        paths = self.paths(vid, name)
        if not all(p.is_file() for p in paths.values()):
            return False
        record = paths["record"]
        cached = self._checked.get(record)
        if cached is not None and cached[0] == _stamp(record):
            return cached[1] is None
        return self._load_record(record) is not None

    def save_video(self, vid: str, name: str, video: Video, record: dict[str, Any]) -> None:
        """Write the lossless copy, the mp4, then the record (which marks the video done)."""
        paths = self.paths(vid, name)
        write_video_lossless(paths["lossless"], video.frames, video.fps)
        write_video_mp4(paths["mp4"], video.frames, video.fps)
        _write_json(paths["record"], record)

    def load_frames(self, vid: str, name: str) -> torch.Tensor:
        frames, _ = read_video(self.paths(vid, name)["lossless"])
        return frames

    def record(self, vid: str, name: str) -> dict[str, Any] | None:
        """The record of one finished video, or None (missing or damaged: :meth:`is_done`)."""
        return (
            self._load_record(self.paths(vid, name)["record"]) if self.is_done(vid, name) else None
        )

    def records(self, vid: str) -> list[dict[str, Any]]:
        """Records of the finished videos of one variant, in file-name order (damaged ones
        left out, with a warning: see :meth:`is_done`)."""
        d = self.variant_dir(vid)
        out = []
        for path in sorted(d.glob("*.json")):
            if path.name == "variant.json" or path.name.startswith("."):
                continue
            name = path.stem
            paths = self.paths(vid, name)
            if not (paths["lossless"].is_file() and paths["mp4"].is_file()):
                continue
            record = self._load_record(path)
            if record is None:
                continue
            if video_name(record["prompt"], record["index"]) != name:
                raise JbkvError(
                    f"{path} records prompt {record['prompt'][:40]!r} index "
                    f"{record['index']}, which its file name does not match (renamed?)"
                )
            out.append(record)
        return out

    def _load_record(self, path: Path) -> dict[str, Any] | None:
        """The record at ``path``, or None (and one warning) when it is missing or damaged.
        The verdict is kept until the file changes (:meth:`is_done` polls finished videos), and
        so is a valid record (the report reads each one several times): callers read the dict
        returned, never modify it."""
        stamp = _stamp(path)
        if stamp is None:
            return None
        kept = self._loaded.get(path)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        try:
            data = _read_json(path)
            problem = record_problem(data)
        except JbkvError as exc:
            data, problem = None, str(exc).removeprefix(f"cannot read {path}: ")
        self._checked[path] = (stamp, problem)
        if problem:
            self._warn_once(
                path, f"{problem}; the video counts as not finished (a resumed run makes it again)"
            )
            return None
        self._loaded[path] = (stamp, data)
        return data

    # --- metrics ------------------------------------------------------------------------------

    def metrics_path(self, kind: str, vid: str) -> Path:
        """A variant's scores as one file (older runs; read, never rewritten)."""
        return self.root / "metrics" / kind / f"{vid}.json"

    def score_path(self, kind: str, vid: str, name: str) -> Path:
        """One video's scores: ``metrics/<kind>/<variant>/<video name>.json``."""
        return self.root / "metrics" / kind / vid / f"{name}.json"

    def read_metrics(self, kind: str, vid: str) -> dict[str, Any]:
        """Video name -> scores of one variant: its per-video files over the entries of the
        variant's file of older runs. A damaged entry is left out (one warning naming the file
        and the field): the video counts as unscored, so a resumed run scores it again."""
        folder = self.root / "metrics" / kind / vid
        files = sorted(folder.glob("*.json")) if folder.is_dir() else []
        files = [p for p in files if not p.name.startswith(".")]
        skip = {p.stem for p in files}
        out = self.read_score_map(self.metrics_path(kind, vid), skip=skip, kind=kind)
        for path in files:
            entry = self.read_score_file(path, kind)
            if entry is not None:
                out[path.stem] = entry
        return out

    def read_score_file(self, path: Path, kind: str = "fidelity") -> dict[str, Any] | None:
        """One video's scores of ``kind`` from ``path``, or None (one warning) when it is
        damaged (:data:`~jbkv_cli.run.schema.SCORE_CHECKS`)."""
        try:
            entry = _read_json(path)
        except JbkvError as exc:
            self._warn_once(path, f"{exc}; {self._rescored}", prefix=False)
            return None
        problem = SCORE_CHECKS[kind](entry)
        if problem:
            self._warn_once(path, f"{problem}; {self._rescored}")
            return None
        return entry

    def read_score_map(
        self, path: Path, skip: set[str] | frozenset = frozenset(), kind: str = "fidelity"
    ) -> dict[str, Any]:
        """Video name -> scores from a file holding many (a variant's file of older runs, or a
        rank's shard): damaged entries, or a damaged file, left out with one warning; entries
        named in ``skip`` (superseded by newer files) are neither checked nor returned."""
        if not path.is_file():
            return {}
        try:
            data = _read_json(path)
        except JbkvError as exc:
            self._warn_once(path, f"{exc}; its scores count as missing ({self._rescored})", False)
            return {}
        if not isinstance(data, dict):
            self._warn_once(
                path, f"not a JSON object; its scores count as missing ({self._rescored})"
            )
            return {}
        out, bad = {}, []
        for name, entry in data.items():
            if name in skip:
                continue
            problem = SCORE_CHECKS[kind](entry)
            if problem:
                bad.append((name, problem))
            else:
                out[name] = entry
        if bad:
            name, problem = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            self._warn_once(path, f"entry {shown(name, 40)}: {problem}{more}; {self._rescored}")
        return out

    @property
    def _rescored(self) -> str:
        return f"scored again by `jbkv report {self.root} --score` or a resumed run"

    def write_score(self, kind: str, vid: str, name: str, entry: dict[str, Any]) -> None:
        """Save one video's scores (atomically, in its own file: writes grow linearly with the
        videos, and ranks never share a file)."""
        _write_json(self.score_path(kind, vid, name), entry)

    def _warn_once(self, path: Path, message: str, prefix: bool = True) -> None:
        if path in self._warned:
            return
        self._warned.add(path)
        warn(f"{path}: {message}" if prefix else message)


def _register_cases(manifest: dict[str, Any], cases: list[Case], root: Path) -> bool:
    """Record ``cases`` that are more than a prompt in ``manifest['cases']`` (created only when
    needed, so a run of prompts keeps its old manifest); True when the manifest changed. A name
    registered before with other inputs (or as a bare prompt) is a :class:`UsageError`."""
    known: dict[str, Any] = manifest.get("cases", {})
    prompts = set(manifest["prompts"])
    changed = False
    for case in cases:
        stored = known.get(case.name)
        if stored is None and (case.prompt_only or case.name not in prompts):
            if case.prompt_only:
                continue
            entry = case.to_dict()
            for key, value in (("plan", case.plan), ("sha256", case.sha256)):
                if value is not None:
                    entry[key] = value
            known[case.name] = entry
            manifest["cases"] = known
            changed = True
            continue
        old = Case(case.name) if stored is None else Case.from_dict(stored)
        if old != case:
            raise UsageError(
                f"{root} holds case {shown(case.name)} made from other inputs "
                f"({_case_difference(old, case)}); give this case another id or use another --out"
            )
        _refuse_changed_files(root, [case], {case.name: stored} if stored else {})
        for key, value in (("plan", case.plan), ("sha256", case.sha256)):
            if stored is not None and key not in stored and value is not None:
                stored[key] = value  # kept from now on (a run of an older version had none)
                changed = True
    return changed


def _refuse_changed_files(
    root: Path,
    cases: Iterable[Case],
    known: dict[str, Any],
    recorded: Fingerprint | None = None,
    inputs: Fingerprint | None = None,
) -> None:
    """A :class:`JbkvError` naming the first file that differs from what the run at ``root``
    recorded: the model's (``recorded`` vs ``inputs``) or a case's (its entry in ``known``)."""
    problem = change(recorded, inputs) if recorded is not None and inputs is not None else None
    for case in cases:
        stored = known.get(case.name)
        if problem is not None or not stored or Case.from_dict(stored) != case:
            continue
        if isinstance(stored.get("sha256"), dict) and case.sha256 is not None:
            problem = case_change(case, stored["sha256"], case.sha256)
    if problem is not None:
        raise JbkvError(
            f"{problem}: resuming {root} would mix results of both; restore the file or use "
            "another --out"
        )


def check_inputs(
    root: Path, model: str, inputs: Fingerprint | None, cases: Iterable[Case] = ()
) -> None:
    """Refuse (exit 1, naming the file) when ``root`` holds a run of ``model`` made from other
    files than ``inputs`` (the model's fingerprint) or the files of ``cases`` (their
    ``sha256``). Creates nothing; no run there, or another model's, passes (what else is
    wrong with it :func:`check_run_dir` says)."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return
    manifest = parse_manifest(_read_json(path), path)
    if manifest["model"] == model:
        known = manifest.get("cases", {})
        _refuse_changed_files(Path(root), cases, known, manifest.get("inputs"), inputs)


def _case_difference(old: Case, new: Case) -> str:
    a, b = old.to_dict(), new.to_dict()
    diffs = [f"{k}: {shown(str(a[k]), 40)} -> {shown(str(b[k]), 40)}" for k in a if a[k] != b[k]]
    return ", ".join(diffs[:2])


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is replaced or rewritten (None: it is gone)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _manifest_lock(root: Path):
    return locked(root / MANIFEST_LOCK, on_wait=lambda: _test_seam("waiting"))


def _is_ours(path: Path) -> bool:
    """A file another jbkv command starting on the same folder may have there for a moment:
    the manifest's lock, a temp file of its writer, or its writability probe."""
    return path.name == MANIFEST_LOCK or path.name.startswith(".jbkv-probe-") or is_temp(path)


def check_run_dir(
    root: Path, model: str, settings: dict[str, Any], inputs: Fingerprint | None = None
) -> None:
    """Raise unless ``root`` can hold (or already holds) a run of ``model`` with ``settings``
    made from the files ``inputs`` fingerprints (:func:`check_inputs`).

    Creates nothing: commands call it before their long work, and a refused command leaves no
    folder behind.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise UsageError(f"--out {root} exists and is not a directory")
    path = root / MANIFEST
    # listed before the manifest is looked for: a command starting beside this one writes its
    # manifest before anything else, so what is listed without a manifest after it is not a run's
    entries = list(root.iterdir()) if root.is_dir() else []
    if path.exists():
        manifest = parse_manifest(_read_json(path), path)
        if manifest["model"] != model or manifest["settings"] != settings:
            diff = _describe_difference(manifest, model, settings)
            raise UsageError(
                f"{root} was made with different settings ({diff}); "
                "use another --out directory to keep both"
            )
        _refuse_changed_files(root, (), {}, manifest.get("inputs"), inputs)
    elif any(not _is_ours(p) for p in entries):
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
