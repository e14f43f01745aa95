"""The run folder of ``jbkv llm-prefill``: like quantize-eval's, one record per finished job.

Layout::

    RUN/manifest.json                           model, settings (kind llm-prefill), versions
    RUN/variants/<variant>/variant.json         the KVSpec (the reference's also its dtype)
    RUN/variants/<variant>/c<B>-b<lo>-<hi>-<doc>.json
                                                one (example, chunk size, variant): NLL,
                                                storage, diagnostics; written last, atomically
    RUN/report/results.json, table.md, nll.png  rebuilt from the records

The manifest is :class:`~jbkv_cli.run.directory.RunDir`'s (written once by rank 0, resumed only with the
same model and settings, refused otherwise; stale temp files of killed writers are removed on
resume). A record exists only once complete (temp file + rename), so a killed run resumes at
the first missing (example, chunk size, variant); under torchrun every rank writes only the
records of its own examples.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from jbkv_cli.kvcache.spec import REFERENCE_ID, KVSpec
from jbkv_cli.run.directory import MANIFEST, RunDir, parse_spec
from jbkv_cli.utils.atomic import write_text_atomic
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.jsonio import read_json

KIND = "llm-prefill"
VARIANTS = "variants"


def is_llm_run(root: Path) -> bool:
    """True when ``root`` holds an ``llm-prefill`` run (its manifest says so)."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return False
    try:
        data = read_json(path)
    except JbkvError:
        return False
    return isinstance(data, dict) and (data.get("settings") or {}).get("kind") == KIND


def _read(path: Path) -> Any:
    """A run file's JSON; any problem is one ``cannot read PATH: reason`` line."""
    return read_json(path)


def _write(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def parse_record(data: Any, path: Path) -> dict[str, Any]:
    """``data`` if it has the shape of an llm-prefill record; else a one-line error."""
    ok = (
        isinstance(data, dict)
        and isinstance(data.get("document"), str)
        and isinstance(data.get("bin"), list)
        and len(data["bin"]) == 2
        and all(type(x) is int for x in data["bin"])
        and all(type(data.get(k)) is int and data[k] > 0 for k in ("chunk", "tokens"))
        and type(data.get("prefix")) is int
        and type(data.get("kv_cache_bytes")) is int
        and all(_number(data.get(k)) for k in ("nll", "nll_sum", "seconds"))
        and isinstance(data.get("diagnostics"), dict | None)
    )
    if ok:
        diag = data.get("diagnostics") or {}
        ok = all(v is None or _number(v) for v in diag.values())
    if not ok:
        raise JbkvError(f"{path} is not a jbkv llm-prefill record (damaged or edited?)")
    return data


class LlmRun:
    """An llm-prefill run folder (see the module docstring) over its :class:`RunDir` manifest."""

    def __init__(self, run: RunDir) -> None:
        self.dir = run
        self.root = run.root
        self.manifest = run.manifest

    @classmethod
    def open(cls, root: Path) -> LlmRun:
        run = RunDir.open(root)
        if (run.manifest.get("settings") or {}).get("kind") != KIND:
            raise JbkvError(f"{root} is not a jbkv llm-prefill run")
        return cls(run)

    @property
    def settings(self) -> dict[str, Any]:
        return self.manifest["settings"]

    def variant_dir(self, vid: str) -> Path:
        return self.root / VARIANTS / vid

    def ensure_variant(self, spec: KVSpec) -> str:
        """The folder of ``spec`` (made with its ``variant.json`` if new; refused if that file
        holds another spec)."""
        vid = REFERENCE_ID if spec.is_reference else spec.variant_id
        path = self.variant_dir(vid) / "variant.json"
        if path.exists():
            if parse_spec(_read(path), path) != spec:
                raise JbkvError(f"{path} holds a different KV spec than {spec.label!r}")
        else:
            data = spec.to_dict()
            if spec.is_reference:
                data["dtype"] = self.settings.get("dtype")
            _write(path, data)
        return vid

    def variants(self) -> dict[str, KVSpec]:
        """Every variant present, the reference first, then in the registry's table order."""
        found = {}
        for path in sorted((self.root / VARIANTS).glob("*/variant.json")):
            found[path.parent.name] = parse_spec(_read(path), path)
        return dict(sorted(found.items(), key=lambda kv: kv[1].sort_key()))

    def record_path(self, vid: str, key: str) -> Path:
        return self.variant_dir(vid) / f"{key}.json"

    def is_done(self, vid: str, key: str) -> bool:
        return self.record_path(vid, key).is_file()

    def save(self, vid: str, key: str, record: dict[str, Any]) -> None:
        _write(self.record_path(vid, key), record)

    def records(self, vid: str) -> dict[str, dict[str, Any]]:
        """The finished records of a variant, by job key."""
        out = {}
        for path in sorted(self.variant_dir(vid).glob("*.json")):
            if path.name == "variant.json" or path.name.startswith("."):
                continue
            record = parse_record(_read(path), path)
            out[path.stem] = record
        return out
