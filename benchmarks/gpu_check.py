"""``make gpu-check``: what the day a GPU is lent should check, in one run (≤ 8 min on one
H100/H200, nothing downloaded), written to one JSON. ``make gpu-check DRY=1`` runs the same
steps on a CPU under fake CUDA (:mod:`jbkv_cli.utils.fake_cuda`): shapes and host syncs, no
timings, so the script works the first time it meets a GPU.

1. **tests**: the ``cuda``-marked tests (``pytest -m cuda``; skipped without a GPU);
2. **kernels**: jbkv's cached attention at each model's real shapes (:data:`SHAPES`: the
   largest read at its default settings), BF16 vs INT2 ``none`` / ``taylor`` / ``signed`` per
   backend (``fused``, ``flex``): milliseconds per call and the peak bytes on a GPU, the
   corrected fused form's width and whether FlashAttention takes it
   (``torch.backends.cuda.can_use_flash_attention``; dry: :func:`jbkv_cli.plan.sdpa.sdpa_kernel`);
3. **chunks**: every model at full size with random BF16 weights (:data:`RUNS`: its default
   configuration, fewer chunks and steps to fit the time), BF16 vs INT2 ``none`` / ``taylor`` /
   ``signed``: ``torch.cuda.max_memory_allocated`` against the plan (``jbkv plan``'s prediction,
   within :data:`TOLERANCE`) and seconds per chunk as ratios to BF16; dry: the plan and the host
   copies per chunk.

The GPU run compares with the plan of the same settings, read from the dry run's JSON when it
is there (``--plan``: computing every plan on the GPU machine's CPU costs minutes), else
computed.

    python benchmarks/gpu_check.py [--dry] [--models tiny,magi1,...] [--out FILE] [--plan FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TOLERANCE = 0.10  # |measured / planned − 1| allowed for the peak memory
REPEATS = 5  # timed attention calls per case (after one warm-up)


@dataclass(frozen=True)
class Shape:
    """One model's largest cached attention read at its default settings: query and KV heads,
    head dim, the chunk's queries (and current keys), the cached keys, the dtype it runs in."""

    q_heads: int
    kv_heads: int
    head_dim: int
    queries: int
    cached: int
    dtype: torch.dtype = torch.bfloat16


# tokens per latent frame = (H / 16)·(W / 16) at the default size (docs/models.md)
SHAPES: dict[str, Shape] = {
    "tiny": Shape(2, 2, 64, 256, 2 * 256, torch.float32),  # 2 chunks of 256 tokens
    "magi1": Shape(24, 8, 128, 6 * 45 * 45, 6 * 45 * 45),  # 720², one cached chunk
    "skyreels-v2": Shape(12, 12, 128, 5 * 34 * 60, 5 * 5 * 34 * 60),  # 544×960, 5 chunks
    "self-forcing": Shape(12, 12, 128, 3 * 30 * 52, 6 * 3 * 30 * 52),  # 480×832, 6 chunks
    "rolling-forcing": Shape(12, 12, 128, 5 * 3 * 30 * 52, 3 * 30 * 52),  # 5 blocks + sink
    "matrix-game-2": Shape(12, 12, 128, 3 * 22 * 40, 3 * 22 * 40),  # 352×640, 3 frames
    "hy-worldplay": Shape(16, 16, 128, 4 * 30 * 52, 20 * 30 * 52 + 1985),  # memory + text
}

# the full-size runs: default configurations, fewer chunks (and steps) to fit the time
RUNS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "magi1": {"num_chunks": 2, "steps": 4, "offload": "false"},
    "skyreels-v2": {"num_chunks": 2, "steps": 2},
    "self-forcing": {"num_chunks": 2},
    "rolling-forcing": {"num_chunks": 2},
    "matrix-game-2": {"num_chunks": 2},
    "hy-worldplay": {"num_chunks": 2, "steps": 2, "offload": "false"},
}

VARIANTS = (("bf16", None, "none"), ("int2", 2, "none"), ("int2+taylor", 2, "taylor"))
VARIANTS += (("int2+signed", 2, "signed"),)
BACKENDS = ("fused", "flex")


def specs() -> dict[str, Any]:
    from jbkv_cli.kvcache import FULL_PRECISION, KVSpec

    return {
        name: FULL_PRECISION if bits is None else KVSpec.build("rtn", bits, correction=corr)
        for name, bits, corr in VARIANTS
    }


# --------------------------------------------------------------------------- 1. tests


def cuda_tests(gpu: bool) -> dict[str, Any]:
    """``pytest -m cuda`` (every test that needs a GPU), or why it was not run."""
    if not gpu:
        return {"skipped": "no CUDA device (the cuda-marked tests skip themselves)"}
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-n", "0", "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    tail = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
    return {"returncode": done.returncode, "summary": tail, "seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------- 2. kernels


def flash_eligible(dtype: torch.dtype, width: int, q_heads: int, kv_heads: int, gpu: bool):
    """Whether FlashAttention takes ``q``/``k``/``v`` of head dim ``width``: torch's own answer
    on a GPU, the rule (:func:`~jbkv_cli.plan.sdpa.sdpa_kernel`) otherwise."""
    from jbkv_cli.plan.sdpa import sdpa_kernel

    if not gpu:
        return sdpa_kernel(dtype, width, width, width, False) == "flash"
    q = torch.zeros(1, q_heads, 8, width, dtype=dtype, device="cuda")
    k = torch.zeros(1, kv_heads, 8, width, dtype=dtype, device="cuda")
    params = torch.backends.cuda.SDPAParams(q, k, k, None, 0.0, False, q_heads != kv_heads)
    return bool(torch.backends.cuda.can_use_flash_attention(params, False))


def _read_case(shape: Shape, spec, gpu: bool):
    """A cache holding ``shape.cached`` tokens of ``spec`` and a query chunk (random, drawn on
    the device: under fake CUDA a draw costs nothing, where one on the host and copied would
    fill gigabytes of values nobody reads)."""
    from jbkv_cli.kvcache import ChunkKVCache

    g = torch.Generator(device="cuda").manual_seed(0) if gpu else None

    def rand(heads: int, tokens: int) -> torch.Tensor:
        size = (1, heads, tokens, shape.head_dim)
        return torch.randn(size, generator=g, device="cuda", dtype=shape.dtype)

    cache = ChunkKVCache(spec, window=None)
    cache.commit(rand(shape.kv_heads, shape.cached), rand(shape.kv_heads, shape.cached))
    q = rand(shape.q_heads, shape.queries)
    kv = rand(shape.kv_heads, shape.queries)
    return cache, q, kv


def kernel_cases(models: list[str], gpu: bool) -> dict[str, Any]:
    """Per model and variant and backend: ms per call and peak bytes (GPU), or the call run
    under fake CUDA (dry: a host sync raises), with the fused width and flash eligibility."""
    from jbkv_cli.attention.correction import fused_width
    from jbkv_cli.utils.fake_cuda import FakeCuda

    out: dict[str, Any] = {}
    for model in models:
        shape = SHAPES[model]
        rows: dict[str, Any] = {}
        for name, spec in specs().items():
            backends = ("plain",) if spec.key is None or name == "int2" else BACKENDS
            for backend in backends:
                context = contextlib.nullcontext() if gpu else FakeCuda()
                with context:
                    cache, q, kv = _read_case(shape, spec, gpu)
                    call = _caller(cache, q, kv, None if backend == "plain" else backend)
                    row = _timed(call) if gpu else _dry(call)
                groups = 0 if spec.key is None else spec.key.step_groups(shape.head_dim, "key")
                width = fused_width(shape.head_dim, groups) if groups else shape.head_dim
                row["width"] = width
                row["flash"] = flash_eligible(
                    shape.dtype, width, shape.q_heads, shape.kv_heads, gpu
                )
                rows[f"{name} {backend}"] = row
        base = rows.get("bf16 plain", {}).get("ms")
        for row in rows.values():
            if base and row.get("ms"):
                row["time_vs_bf16"] = row["ms"] / base
        out[model] = {"shape": vars(shape) | {"dtype": str(shape.dtype)}, "cases": rows}
    return out


def _caller(cache, q, kv, backend: str | None) -> Callable[[], torch.Tensor]:
    scale = q.shape[-1] ** -0.5
    return lambda: cache.attend(q, kv, kv, scale, backend=backend)


def _timed(call: Callable[[], torch.Tensor]) -> dict[str, Any]:
    try:
        call()  # warm-up (and flex's compile)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    except (RuntimeError, torch.OutOfMemoryError) as exc:
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    peak = torch.cuda.max_memory_allocated() - start
    return {"ms": 1e3 * statistics.median(times), "peak_bytes": peak}


def _dry(call: Callable[[], torch.Tensor]) -> dict[str, Any]:
    from jbkv_cli.utils.fake_cuda import HostSync

    try:
        out = call()
    except HostSync as exc:
        return {"host_sync": str(exc).splitlines()[0][:200]}
    except NotImplementedError as exc:  # FlexAttention's higher-order op: the GPU run has it
        return {"not_traced": str(exc).splitlines()[0][:120]}
    return {"output": list(out.shape)}


# --------------------------------------------------------------------------- 3. chunks


@contextlib.contextmanager
def materialized(std: float = 0.02) -> Iterator[None]:
    """Modules that ``plan_model`` builds on ``meta`` get real storage where they are moved
    (random normal weights of ``std``: memory and time do not depend on the values)."""
    original = torch.nn.Module.to

    def to(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = [*module.parameters(), *module.buffers()]
        if device is not None and device.type != "meta" and any(t.is_meta for t in tensors):
            module.to_empty(device=device)
            with torch.no_grad():
                for t in [*module.parameters(), *module.buffers()]:
                    if t.is_floating_point():
                        t.normal_(0.0, std)
            return original(module, dtype) if dtype is not None else module
        return original(module, *args, **kwargs)

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = original


def planned(models: list[str], case_dir: Path) -> dict[str, Any]:
    """The plan of every run (:data:`RUNS`), per variant: the peak and the host copies per
    chunk the fake device counted."""
    from jbkv_cli.plan.job import default_case
    from jbkv_cli.plan.run import plan_model

    out: dict[str, Any] = {}
    for model in models:
        options = dict(RUNS[model])
        t0 = time.perf_counter()
        plan = plan_model(
            model, options, list(specs().values()), lambda o, m=model: default_case(m, case_dir, o)
        )
        out[model] = {
            "options": options,
            "seconds": time.perf_counter() - t0,
            "variants": {
                name: {
                    "peak_bytes": v.peak.total,
                    "peak": v.peak.to_dict(),
                    "phases": len(v.phases),
                }
                for name, v in zip(specs(), plan.variants, strict=True)
            },
        }
    return out


def measured(models: list[str], plans: dict[str, Any], case_dir: Path) -> dict[str, Any]:
    """Every run on the GPU: peak memory against the plan, seconds per chunk vs BF16."""
    from jbkv_cli.models.registry import entry
    from jbkv_cli.plan.job import default_case
    from jbkv_cli.utils.host_reads import deferred_checks

    out: dict[str, Any] = {}
    for model in models:
        options = dict(RUNS[model])
        case = default_case(model, case_dir, options)
        with materialized():
            adapter = entry(model).plan_model(**options)
        chunks = int(adapter.settings.get("num_chunks", 1))
        rows: dict[str, Any] = {}
        for index, (name, spec) in enumerate(specs().items()):
            if index == 0:
                _generate(adapter, case, spec)  # warm-up: encoders, kernels, allocator
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            note = _generate(adapter, case, spec, deferred_checks)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            peak = torch.cuda.max_memory_allocated()
            plan = plans.get(model, {}).get("variants", {}).get(name, {}).get("peak_bytes")
            row = {"peak_bytes": peak, "seconds_per_chunk": seconds / chunks}
            if plan:
                row |= {"planned_bytes": plan, "ratio": peak / plan}
                row["within_tolerance"] = abs(peak / plan - 1) <= TOLERANCE
            if note:
                row["note"] = note
            rows[name] = row
        base = rows["bf16"]["seconds_per_chunk"]
        for row in rows.values():
            row["time_vs_bf16"] = row["seconds_per_chunk"] / base
        out[model] = {"options": options, "variants": rows}
        del adapter
        torch.cuda.empty_cache()
    return out


def _generate(adapter, case, spec, checks=None) -> str | None:
    """One video; random weights may make a key non-finite, which the deferred checks report
    at the end (the measurement stands): returned as a note."""
    context = checks() if checks is not None else contextlib.nullcontext()
    try:
        with context:
            adapter.generate(case, 0, spec)
    except ValueError as exc:
        return f"random weights: {str(exc).splitlines()[0][:160]}"
    return None


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry", action="store_true", help="on a CPU under fake CUDA (no timings)")
    ap.add_argument("--models", default=",".join(RUNS), help="comma list (default: all)")
    ap.add_argument("--kernels", default=None, help="models of step 2 (default: --models)")
    ap.add_argument("--out", type=Path, default=None, help="the JSON (default: results/)")
    ap.add_argument("--plan", type=Path, default=RESULTS / "gpu_check_dry.json")
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.dry
    if not args.dry and not gpu:
        print("gpu-check: no CUDA device here; run `make gpu-check DRY=1`", file=sys.stderr)
        return 1
    models = [m for m in args.models.split(",") if m]
    kernels = models if args.kernels is None else [m for m in args.kernels.split(",") if m]
    unknown = sorted(set(models + kernels) - set(RUNS))
    if unknown:
        print(f"gpu-check: unknown model {unknown[0]!r} ({', '.join(RUNS)})", file=sys.stderr)
        return 2
    out = args.out or RESULTS / ("gpu_check_dry.json" if args.dry else "gpu_check.json")
    report: dict[str, Any] = {
        "dry": args.dry,
        "device": torch.cuda.get_device_name() if gpu else "cpu (fake CUDA)",
        "torch": torch.__version__,
    }
    t0 = time.perf_counter()
    report["tests"] = cuda_tests(gpu)
    report["kernels"] = kernel_cases(kernels, gpu)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="jbkv-gpu-check-") as folder:
        if args.dry:
            report["plans"] = planned(models, Path(folder))
        else:
            stored = json.loads(args.plan.read_text()) if args.plan.is_file() else {}
            plans = {
                m: p
                for m, p in stored.get("plans", {}).items()
                if m in models and p.get("options") == RUNS[m]
            }
            missing = [m for m in models if m not in plans]
            plans |= planned(missing, Path(folder)) if missing else {}
            report["plans"] = plans
            report["chunks"] = measured(models, plans, Path(folder))
    report["seconds"] = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"gpu-check: wrote {out} ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
