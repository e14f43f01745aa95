"""How often the tiny model's videos follow their prompts, over the whole video.

python benchmarks/tiny_quality.py [--weights PATH] [--seeds 0,1,2,3] [--prompts FILE|all]
                                   [--steps 4] [--ctx-noise 0.1] [--sink 0]

Full-precision generations of every prompt x seed, checked by
:func:`jbkv_cli.models.tiny.check.check_video` (colour, start of the motion, shape kept in
every frame, motion kept in every chunk). Prints the pass rate of each check and writes
``benchmarks/results/tiny_quality.json``. With ``--num-chunks`` beyond the 8 the model was
trained on, each video also gets ``valid_through``: the last chunk ``c`` whose prefix (chunks
``1..c``) still passes the check, and the summary the share of videos still valid at chunks
8, 16, 32, 64, ... (long-horizon decay of the reference itself).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from jbkv_cli.cli.options import parse_seeds, read_prompts
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.tiny import load_model
from jbkv_cli.models.tiny.check import check_video
from jbkv_cli.models.tiny.data import all_prompts

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ("colour_ok", "starts_ok", "shape_ok", "moving_ok", "ok")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", type=Path, default=None)
    ap.add_argument("--prompts", default="tiny", help="prompt file, named set, or 'all'")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--num-chunks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ctx-noise", type=float, default=0.1)
    ap.add_argument("--sink", type=int, default=0, help="sink chunks kept besides the window")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "tiny_quality.json"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(
        weights=args.weights,
        num_chunks=args.num_chunks,
        steps=args.steps,
        ctx_noise=args.ctx_noise,
        sink=args.sink,
    )
    if args.prompts == "all":
        prompts = [p.text for p in all_prompts()]
    else:
        prompts = read_prompts(args.prompts, None, "tiny")
    seeds = parse_seeds(args.seeds)
    rows = []
    for prompt in prompts:
        for seed in seeds:
            frames = model.generate(prompt, seed, KVSpec()).frames
            check = check_video(frames, prompt)
            rows.append({"prompt": prompt, "seed": seed, **check.to_dict()})
            rows[-1]["valid_through"] = _valid_through(frames, prompt, model.settings)
            if not check.ok:
                failed = [k for k in CHECKS[:-1] if not getattr(check, k)]
                print(f"FAIL {prompt!r} seed {seed}: {', '.join(failed)}")
    rates = {k: sum(r[k] for r in rows) / len(rows) for k in CHECKS}
    marks = [c for c in (8, 16, 32, 64, 128, 256, 512, 1024) if c <= args.num_chunks]
    still = {c: sum(r["valid_through"] >= c for r in rows) / len(rows) for c in marks}
    summary = {
        "videos": len(rows),
        "num_chunks": args.num_chunks,
        "weights": model.settings["weights_sha256"],
        "pass_rate": rates,
        "still_valid_at_chunk": still,
    }
    print(json.dumps(summary, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**summary, "rows": rows}, indent=1) + "\n")


def _valid_through(frames: torch.Tensor, prompt: str, settings: dict) -> int:
    """The last chunk whose prefix passes the check (0: not even the first two chunks)."""
    per = settings["frames_per_chunk"]
    valid = 0
    for c in range(2, settings["num_chunks"] + 1):  # the check needs two chunks to see motion
        if not check_video(frames[: c * per], prompt, per).ok:
            break
        valid = c
    return valid


if __name__ == "__main__":
    main()
