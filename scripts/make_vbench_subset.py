"""Regenerate prompts/vbench_long_30.json and prompts/vbench_smoke.json from VBench's own list.

The source is ``vbench/VBench_full_info.json`` as shipped in the ``vbench`` wheel (946 entries).
By default it is read from the VBench environment that ``jbkv vbench setup`` built; pass
``--full-info PATH`` to use another copy (e.g. from ``pip download vbench==0.1.5``).

    python scripts/make_vbench_subset.py [--full-info PATH] [--out-dir prompts]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from jbkv_cli.metrics.vbench_prompts import (
    PROMPTS_DIR,
    SAMPLES_OVERRIDES,
    SAMPLES_PER_PROMPT,
    ceil_fraction,
    first_fraction_subset,
    first_per_dimension,
)
from jbkv_cli.metrics.vbench_scores import DIMENSIONS

RULE_30 = (
    "for each of the 16 VBench dimensions d, the first ceil(0.3 * N_d) entries of "
    "VBench_full_info.json whose 'dimension' list contains d (file order); the union of the "
    "chosen entries, kept in file order"
)
RULE_SMOKE = "the first entry of each of the 16 dimensions; union kept in file order"


def _source_from_env() -> Path:
    from jbkv_cli.metrics.vbench_env import require_env

    env = require_env()
    vbench_dir = env.info.get("check", {}).get("vbench_dir")
    if not vbench_dir:
        out = subprocess.run(
            [str(env.python), "-c", "import os, vbench; print(os.path.dirname(vbench.__file__))"],
            check=True,
            capture_output=True,
            text=True,
        )
        vbench_dir = out.stdout.strip()
    return Path(vbench_dir) / "VBench_full_info.json"


def _vbench_version(path: Path) -> str | None:
    for meta in path.parent.parent.glob("vbench-*.dist-info/METADATA"):
        for line in meta.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _doc(name: str, rule: str, entries: list[dict[str, Any]], source: dict[str, Any], **extra):
    return {
        "name": name,
        "rule": rule,
        "source": source,
        **extra,
        "num_entries": len(entries),
        "num_unique_prompts": len({e["prompt_en"] for e in entries}),
        "entries": entries,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full-info", type=Path, default=None)
    ap.add_argument("--out-dir", type=Path, default=PROMPTS_DIR)
    args = ap.parse_args()
    path = args.full_info or _source_from_env()
    raw = path.read_bytes()
    full_info = json.loads(raw)
    source = {
        "package": "vbench",
        "version": _vbench_version(path),
        "file": "vbench/VBench_full_info.json",
        "md5": hashlib.md5(raw).hexdigest(),
        "entries": len(full_info),
    }

    entries, chosen = first_fraction_subset(full_info)
    per_dim = {
        d: {"total": sum(d in e["dimension"] for e in full_info), "chosen": len(chosen[d])}
        for d in DIMENSIONS
    }
    assert all(v["chosen"] == ceil_fraction(v["total"]) for v in per_dim.values())
    long30 = _doc(
        "vbench-long-30",
        RULE_30,
        entries,
        source,
        fraction="3/10",
        rounding="ceil",
        samples_per_prompt=SAMPLES_PER_PROMPT,
        samples_per_prompt_overrides=SAMPLES_OVERRIDES,
        per_dimension=per_dim,
    )
    smoke = _doc(
        "vbench-smoke",
        RULE_SMOKE,
        first_per_dimension(full_info),
        source,
        samples_per_prompt=1,
        samples_per_prompt_overrides={},
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for doc, fname in ((long30, "vbench_long_30.json"), (smoke, "vbench_smoke.json")):
        (args.out_dir / fname).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        print(f"{fname}: {doc['num_entries']} entries, {doc['num_unique_prompts']} prompts")


if __name__ == "__main__":
    main()
