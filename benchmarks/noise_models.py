"""Which kind of error each method makes, from its stored tensors, and what each correction leaves.

For every registered method (INT2 unless ``--bits``) on two kinds of keys:

- **real**: the embedded model's cached keys and the queries that read them, recorded while it
  generates (an observer on an INT8 RTN run: ``cached.k_ref`` holds the exact cached keys, so
  these are the model's own keys; the trajectory is the nearly lossless INT8 one);
- **gaussian**: seeded Gaussian keys and queries with per-channel scales (as
  ``tests/attention/test_signed_correction.py`` draws them).

Each chunk (256 tokens of one layer on the model) is stored by the method as the cache would,
and per group of channels, over its tokens: ``Cov(e, k)/Var(e)`` and ``Cov(e, k̂)/Var(e)``
(``e = k̂ − k``; additive noise ≈ (0, 1), centroid type ≈ (−1, 0); the two differ by 1),
reported as the mean over chunks, heads and groups with the range; then with the real queries,
the cached log-partition shift the stored keys cause and what ``taylor``, ``signed`` and its
two ablations (``signed-excess``, ``signed-unshrink``) leave
(:mod:`jbkv_cli.attention.partition`), means over observed calls.

    python benchmarks/noise_models.py [--prompts 2] [--calls 24] [--bits 2]

Writes ``benchmarks/results/noise_models.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from jbkv_cli.attention import CachedKV
from jbkv_cli.attention.correction import get_correction, jensen_bias
from jbkv_cli.attention.partition import log_partition_shift
from jbkv_cli.kvcache import KVSpec
from jbkv_cli.models.registry import load_model
from jbkv_cli.quant import METHODS, build_method
from jbkv_cli.quant.noise import MIXED, error_covariances, measure_noise
from jbkv_cli.quant.queries import QueryStats
from jbkv_cli.quant.tensor import UNSHRINK, Segmented, resolve_rule, signed_terms

CORRECTIONS = ("none", "taylor", "signed", "signed-excess", "signed-unshrink")


@dataclass
class Capture:
    """An observer recording, every ``every``-th call of each layer, the queries (at most
    ``queries`` of them, strided) and the exact cached keys they read."""

    every: int = 4
    queries: int = 32
    calls: list[tuple[int, torch.Tensor, torch.Tensor, float]] = field(default_factory=list)

    def observe(self, q, k_cur, v_cur, cached: CachedKV, scale, correction, layer=None, step=None):
        stride = max(1, -(-q.shape[-2] // self.queries))
        keys = cached.k_ref.detach().float().clone()
        self.calls.append((layer or 0, q[..., ::stride, :].detach().float().clone(), keys, scale))


def real_calls(prompts: int, chunk: int) -> tuple[list, int]:
    """``(calls, chunk tokens)`` recorded on the embedded model."""
    model = load_model("tiny")
    texts = [p for p in Path("prompts/tiny.txt").read_text().splitlines() if p.strip()]
    rec = Capture()
    for text in texts[:prompts]:
        model.generate(text, 0, KVSpec.build("rtn", 8), observer=rec)
    return rec.calls, int(model.settings.get("tokens_per_chunk", chunk))


def gaussian_calls(n: int, chunk: int, dim: int = 64, seed: int = 0) -> list:
    """``n`` synthetic calls: two chunks of channel-scaled Gaussian keys, queries like them."""
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(seed + i)
        scale = torch.exp(torch.randn(dim, generator=g) * 0.5)
        keys = torch.randn(1, 2, 2 * chunk, dim, generator=g) * scale
        out.append((0, torch.randn(1, 2, 32, dim, generator=g) * scale * 0.5, keys, 1 / 8))
    return out


def store(method, keys: torch.Tensor, chunk: int, history: QueryStats | None):
    """The keys' chunks stored by ``method`` (with the query history if it needs one)."""
    parts = []
    for start in range(0, keys.shape[-2], chunk):
        x = keys[..., start : start + chunk, :]
        t = method.quantize(x, "key", history) if method.needs_queries else method.quantize(x)
        parts.append((x, t))
    return parts


def evaluate(name: str, bits: int, calls: list, chunk: int) -> dict:
    """Classification and log-partition shifts of method ``name`` over ``calls``."""
    kw = {"seed": 0} if "seed" in {f.name for f in fields(METHODS[name])} else {}
    method = build_method(name, bits, 32, **kw)
    history: dict[int, QueryStats] = {}
    shares, shifts = [], {c: [] for c in CORRECTIONS}
    for layer, q, keys, scale in calls:
        hist = history.setdefault(layer, QueryStats())
        parts = store(method, keys, chunk, hist if not hist.empty else None)
        hist.update(q, keys.shape[-3])
        groups = parts[0][1].step.shape[-1]
        for x, t in parts:
            c = error_covariances(x, t, groups)
            shares.append(torch.stack([c.cov_e_k / c.var_e, c.cov_e_khat / c.var_e]).flatten(1))
        stored = Segmented([t for _, t in parts], groups)
        k_hat = stored.dequantize().float()
        s_hat = scale * q @ k_hat.transpose(-1, -2)
        s_ref = scale * q @ keys.transpose(-1, -2)
        for corr in CORRECTIONS:
            c = get_correction(corr)
            t = stored
            if c.form == "variance":  # the chunks' mixed noise measured as the cache would
                measured = [
                    measure_noise(x, p, resolve_rule(p, c.rule) == UNSHRINK)
                    if p.noise_model == MIXED
                    else p
                    for x, p in parts
                ]
                t = Segmented(measured, groups)
            added = None
            if c.form is not None:
                w, u = signed_terms(t, groups, c.rule)
                added = -jensen_bias(q, t.step, scale, c.form, t.rotation, w)
                if u is not None:
                    added = added + (u.transpose(-1, -2) - 1) * s_hat
            shift, predicted = log_partition_shift(s_hat, s_ref, added)
            shifts[corr].append(float((shift - predicted).mean()))
    cat = torch.cat(shares, dim=1)  # [2, groups over chunks and heads]
    row = {"declared": METHODS[name].noise_model}
    for i, key in enumerate(("cov_e_k", "cov_e_khat")):
        row[key] = {
            "mean": float(cat[i].mean()),
            "min": float(cat[i].min()),
            "max": float(cat[i].max()),
        }
    row["shift"] = sum(shifts["none"]) / len(shifts["none"])
    for corr in CORRECTIONS[1:]:
        row[f"{corr}_left"] = sum(shifts[corr]) / len(shifts[corr])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2, help="prompts of prompts/tiny.txt")
    parser.add_argument("--calls", type=int, default=24, help="observed calls used per kind")
    parser.add_argument("--bits", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/noise_models.json"))
    args = parser.parse_args()
    start = time.perf_counter()
    real, chunk = real_calls(args.prompts, 256)
    step = max(1, len(real) // args.calls)
    kinds = {"real": real[::step][: args.calls], "gaussian": gaussian_calls(args.calls, chunk)}
    rows = {
        kind: {
            name: evaluate(name, args.bits, calls, chunk)
            for name, cls in METHODS.items()
            if args.bits in cls.SUPPORTED_BITS
        }
        for kind, calls in kinds.items()
    }
    table = Table(
        title=f"Error type and log-partition shift per method, INT{args.bits} g32 "
        f"({args.calls} calls per kind; embedded model: {args.prompts} prompts)"
    )
    for col in ("method", "declared", "keys", "Cov(e,k)/Var(e)", "Cov(e,k̂)/Var(e)"):
        table.add_column(col, justify="left" if col in ("method", "declared", "keys") else "right")
    for col in ("Δlog Z", *(f"{c} leaves" for c in CORRECTIONS[1:])):
        table.add_column(col, justify="right")

    def share(s: dict) -> str:
        return f"{s['mean']:+.2f} [{s['min']:+.2f}, {s['max']:+.2f}]"

    for name in rows["real"]:
        for kind in ("real", "gaussian"):
            r = rows[kind][name]
            table.add_row(
                name if kind == "real" else "",
                r["declared"] if kind == "real" else "",
                kind,
                share(r["cov_e_k"]),
                share(r["cov_e_khat"]),
                f"{r['shift']:+.4f}",
                *(f"{r[f'{c}_left']:+.4f}" for c in CORRECTIONS[1:]),
            )
    Console(width=160).print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "torch": torch.__version__,
        "bits": args.bits,
        "calls": args.calls,
        "prompts": args.prompts,
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }
    args.out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
