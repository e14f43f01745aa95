"""Matrix-Game-2.0's sampler in bf16 (tiny random configuration, CPU): with
``precision=upstream`` its latents are upstream's — SkyworkAI/Matrix-Game
``Matrix-Game-2/inference.py`` draws bf16 noise, ``utils/wan_wrapper.py`` computes x₀ in
float64 and casts it back to the flow's bf16, the scheduler's ``add_noise`` mixes with a float32
σ and returns ``type_as(noise)`` — stated here step by step around the DiT's own calls; with
``fp32-accum`` they stay float32 and the video differs."""

from __future__ import annotations

import torch

from jbkv_cli.kvcache import FULL_PRECISION
from jbkv_cli.models.seeding import noise_generator

BF16 = torch.bfloat16


def _run(precision: str, case_folder, inputs):
    from jbkv_cli.models.cases import Case
    from jbkv_cli.models.wan.matrix_game import load_model

    model = load_model(config="tiny-random", device="cpu", dtype="bfloat16", precision=precision)
    image, actions = inputs(case_folder, model.config.num_frames)
    case = Case("a red room", str(image), str(actions), "c1")
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    hook = model.dit.register_forward_hook(lambda m, a, out: calls.append((a[0], out)))
    try:
        with torch.no_grad():
            latents, _ = model.generate_latents(
                model.conditions(case), 0, case.name, FULL_PRECISION
            )
    finally:
        hook.remove()
    return model, latents, calls


def upstream_chunks(model, calls):
    """Upstream's ``CausalInferencePipeline.inference`` arithmetic around the recorded DiT calls
    (its inputs checked, its flows used): per chunk the steps, then the clean pass's input."""
    s, sched = model.config, model.schedule
    generator = noise_generator(0, "c1")
    shape = (1, 16, s.chunk_frames, s.height // 8, s.width // 8)
    calls = iter(calls)
    out = []
    for c in range(s.num_chunks):
        x = torch.randn(shape, generator=generator).to(BF16)
        for i, sigma in enumerate(sched.sigmas):
            seen, flow = next(calls)
            assert torch.equal(seen, x), (c, i)
            x0 = (x.double() - torch.tensor(sigma).double() * flow.double()).to(flow.dtype)
            if i + 1 < len(sched):
                noise = torch.randn(shape, generator=generator).to(BF16)
                nxt = torch.tensor([sched.sigmas[i + 1]], dtype=torch.float32).reshape(-1, 1, 1, 1)
                x = ((1 - nxt) * x0 + nxt * noise).type_as(noise)
        if c + 1 < s.num_chunks:
            seen, _ = next(calls)  # the clean pass, at t = 0
            assert torch.equal(seen, x0), c
        out.append(x0)
    assert next(calls, None) is None
    return torch.cat(out, dim=2)


def test_upstream_precision_keeps_upstreams_bf16_latents(tmp_path, inputs):
    model, ours, calls = _run("upstream", tmp_path, inputs)
    assert ours.dtype == BF16 and all(out.dtype == BF16 for _, out in calls)
    assert torch.equal(ours, upstream_chunks(model, calls))  # the same ops, in the same order
    _, precise, _ = _run("fp32-accum", tmp_path, inputs)
    assert precise.dtype == torch.float32
    rel = (ours.float() - precise).norm() / precise.norm()
    print(f"upstream vs fp32-accum: rel-L2 {rel:.2e}")
    assert rel > 1e-3
