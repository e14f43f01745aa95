"""The two rules of the signed correction, per centroid and mixed method: which leaves less error.

A method whose stored keys are not "true key plus independent noise" gets one of two second-order
rules (``jbkv_cli/attention/correction.py``):

- **excess** (``signed-excess``): ``ŝ − (τ²/2) Σ_j s_ij ‖q_j‖²`` with ``s = Var(k̂) − Var(k)``
  per channel (centroid noise: ``−Var(cell)``, so the variance term is *added*; mixed: measured
  at commit);
- **unshrink** (``signed-unshrink``): ``u ŝ − (τ²/2) Σ_j v_ij ‖q_j‖²`` with ``u = 1/a`` the
  inverse gain of ``k̂ ≈ a k + n`` and ``v = Var(u k̂ − k)`` (TurboQuant-MSE: ``a = 1 − ρ`` of
  its codebook; mixed: ``a`` measured at commit).

``signed`` reads, per declared noise model, the rule that wins here (``DECLARED_RULE`` in
``jbkv_cli/quant/tensor.py``). On additive noise (turboquant-prod) the two are one computation.

Two parts (``--part synthetic|model|all``):

- **synthetic**: 16 draws of two 128-token chunks of Gaussian keys, isotropic and with
  per-channel scales (``tests/attention/test_signed_correction.py``'s), stored by the method
  through a ``ChunkKVCache`` (INT2 g32), 32 queries, τ = 1/8: per draw the cached
  log-partition shift, what each correction leaves of it, and what it removes of the keys'
  attention-output error ``1 − Σ‖softmax(ŝ + a)V − o‖² / Σ‖softmax(ŝ)V − o‖²`` (exact values;
  :mod:`jbkv_cli.attention.bias_share`); mean ± SE over draws.
- **model**: ``jbkv quantize-eval`` on the embedded model, INT2 g32, every method × ``none``,
  ``taylor``, ``signed-excess``, ``signed-unshrink`` on 10 prompts × ``--seeds`` (one process,
  one thread): per variant ``Δlog Z`` left (``lp_left``), the keys' attention-output error
  removed (``correction_removed``), and the PSNR gain paired per video against the uncorrected
  variant; mean ± SE over videos.

    python benchmarks/signed_rules.py [--part all] [--seeds 0-3] [--draws 16]

Writes ``benchmarks/results/signed_rules.json`` and prints both tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.quant import METHODS

MODEL_METHODS = (
    "turboquant-mse",
    "turboquant-prod",
    "qvg",
    "quantwm",
    "quantwm-qsac",
    "quantwm-psac",
    "quantwm-base",
)
RULES = ("signed-excess", "signed-unshrink")
CORRECTIONS = ("none", "taylor", *RULES)
D, CHUNK, QUERIES, TAU = 64, 128, 32, 1 / 8


def _draw(seed: int, isotropic: bool):
    """Two chunks of keys and values, queries, current keys and values (seeded)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.ones(D) if isotropic else torch.exp(torch.randn(D, generator=g) * 0.5)

    def keys(n):
        return torch.randn(1, 1, n, D, generator=g) * scale

    chunks = [(keys(CHUNK), torch.randn(1, 1, CHUNK, D, generator=g)) for _ in range(2)]
    q = torch.randn(1, 1, QUERIES, D, generator=g) * scale * (1.0 if isotropic else 0.5)
    return chunks, q, keys(QUERIES), torch.randn(1, 1, QUERIES, D, generator=g)


def _mean_se(xs: list[float]) -> dict[str, float]:
    t = torch.tensor(xs, dtype=torch.float64)
    return {"mean": float(t.mean()), "se": float(t.std() / len(xs) ** 0.5)}


def synthetic(method: str, correction: str, isotropic: bool, draws: int) -> dict:
    """Shift, what the correction leaves, and the error it removes, per draw (last call)."""
    shift, left, removed = [], [], []
    for seed in range(draws):
        chunks, q, k_cur, v_cur = _draw(seed, isotropic)
        rec = AttentionRecorder(max_queries=QUERIES, noise_model=False, every=1)
        seeded = {"seed": seed} if "seed" in {f.name for f in fields(METHODS[method])} else {}
        cache = ChunkKVCache(KVSpec.build(method, 2, 32, correction, **seeded), observer=rec)
        for k, v in chunks:  # the second commit sees a query history (QuantWM's PSAC)
            cache.commit(k, v)
            cache.attend(q, k_cur, v_cur, TAU)
        _, s, predicted = rec.partition[-1]
        e = rec.errors[-1]
        shift.append(s)
        left.append(s - predicted)
        removed.append(0.0 if e[7] is None else 1.0 - sum(e[7]) / sum(e[3]))
    return {"shift": _mean_se(shift), "left": _mean_se(left), "removed": _mean_se(removed)}


def run_synthetic(draws: int) -> dict:
    out: dict = {}
    for kind, iso in (("isotropic", True), ("scaled", False)):
        for method in MODEL_METHODS:
            for corr in CORRECTIONS:
                out.setdefault(kind, {}).setdefault(method, {})[corr] = synthetic(
                    method, corr, iso, draws
                )
                print(f"synthetic {kind} {method} {corr} done", file=sys.stderr, flush=True)
    return out


def run_model(seeds: str, root: Path) -> dict:
    """``quantize-eval`` through the installed CLI; per method and correction the numbers."""
    json_path = root / "signed_rules_model.json"
    cmd = [
        str(Path(sys.executable).with_name("jbkv")),
        "quantize-eval",
        "--bits",
        "2",
        "--quantizers",
        ",".join(MODEL_METHODS),
        "--corrections",
        ",".join(CORRECTIONS),
        "--prompts",
        "tiny",
        "--seeds",
        seeds,
        "--no-lpips",
        "--no-plots",
        "--out",
        str(root / "runs"),
        "--json",
        str(json_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    doc = json.loads(json_path.read_text())
    gains = {(g["quantizer"], g["correction"]): g["psnr_gain"] for g in doc["correction_gains"]}
    out: dict = {}
    for r in doc["rows"]:
        if r["quantizer"] not in MODEL_METHODS:
            continue
        stat = {
            k: r.get(k) for k in ("psnr", "lp_shift", "lp_left", "correction_removed", "bias_share")
        }
        gain = gains.get((r["quantizer"], r["correction"]))
        stat["psnr_gain"] = None if gain is None else {"mean": gain["mean"], "se": gain["se"]}
        stat["videos"] = r["videos"]
        out.setdefault(r["quantizer"], {})[r["correction"]] = stat
    return out


def _cell(stat: dict | None, digits: int = 3) -> str:
    if not stat:
        return "—"
    se = stat.get("se")
    return f"{stat['mean']:+.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def print_tables(result: dict) -> None:
    console = Console(width=200)
    for kind, rows in result.get("synthetic", {}).items():
        table = Table(title=f"Gaussian keys ({kind}), INT2 g32: Δlog Z left / error removed")
        table.add_column("method", justify="left")
        table.add_column("Δlog Z", justify="right")
        for corr in CORRECTIONS[1:]:
            table.add_column(f"{corr} left", justify="right")
            table.add_column(f"{corr} removed", justify="right")
        for method, by_corr in rows.items():
            cells = [method, _cell(by_corr["none"]["shift"], 4)]
            for corr in CORRECTIONS[1:]:
                cells += [_cell(by_corr[corr]["left"], 4), _cell(by_corr[corr]["removed"])]
            table.add_row(*cells)
        console.print(table)
    rows = result.get("model")
    if rows:
        table = Table(title="Embedded model, INT2 g32: Δlog Z left / error removed / PSNR gain")
        table.add_column("method", justify="left")
        table.add_column("Δlog Z", justify="right")
        for corr in CORRECTIONS[1:]:
            for what in ("left", "removed", "dB"):
                table.add_column(f"{corr} {what}", justify="right")
        for method, by_corr in rows.items():
            cells = [method, _cell(by_corr["none"]["lp_shift"])]
            for corr in CORRECTIONS[1:]:
                c = by_corr[corr]
                cells += [
                    _cell(c["lp_left"]),
                    _cell(c["correction_removed"]),
                    _cell(c["psnr_gain"], 2),
                ]
            table.add_row(*cells)
        console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("synthetic", "model", "all"), default="all")
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--seeds", default="0-3")
    parser.add_argument("--work", type=Path, default=Path("runs/signed_rules"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/signed_rules.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    result: dict = {"torch": torch.__version__, "draws": args.draws, "seeds": args.seeds}
    if args.part in ("synthetic", "all"):
        result["synthetic"] = run_synthetic(args.draws)
    if args.part in ("model", "all"):
        args.work.mkdir(parents=True, exist_ok=True)
        result["model"] = run_model(args.seeds, args.work)
    result["seconds"] = time.perf_counter() - start
    print_tables(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
