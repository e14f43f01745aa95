"""Device-kept copies (``jbkv_cli/utils/host_reads.py``): a constant or a host value reaches a
device once, on the fake CUDA device (``jbkv_cli/utils/fake_cuda.py``, copies counted); on the
CPU the helpers hand back what they were given."""

from __future__ import annotations

import torch

from jbkv_cli.utils.fake_cuda import FakeCuda
from jbkv_cli.utils.host_reads import (
    device_constant,
    device_copy,
    device_values,
    prefetch_values,
)


def test_values_prefetched_together_are_not_copied_again():
    with FakeCuda() as cuda:
        a, b = torch.tensor([1.0, 2.0]), torch.tensor([[3.0], [4.0]])
        steps = torch.tensor([0.5], dtype=torch.float64)
        prefetch_values([a, b, a.clone(), steps], "cuda")
        assert cuda.count() == 2  # one copy per dtype
        got = [
            device_values(a.clone(), "cuda:0"),
            device_values(b, "cuda"),
            device_values(steps, "cuda"),
        ]
        assert cuda.count() == 2  # by value, "cuda" as "cuda:0"
        assert [(t.shape, t.dtype, t.device.type) for t in got] == [
            (a.shape, a.dtype, "cuda"),
            (b.shape, b.dtype, "cuda"),
            (steps.shape, steps.dtype, "cuda"),
        ]
        device_values(torch.tensor([5.0]), "cuda")  # a value not prefetched
        device_values(torch.tensor([5.0]), "cuda")
        prefetch_values([a, b], "cuda")  # all there already
        assert cuda.count() == 3


def test_constants_are_copied_once_per_device_and_key():
    made = []

    def make() -> torch.Tensor:
        made.append(1)
        return torch.arange(4)

    with FakeCuda() as cuda:
        signs = torch.ones(8)
        for _ in range(3):
            device_copy(signs, "cuda", torch.bfloat16)
            device_constant(("test", 4), make, "cuda:0")
            device_constant(("test", 4), make, "cuda")
        assert cuda.count() == 2 and len(made) == 1
        device_constant(("test", 5), make, "cuda")
        assert cuda.count() == 3 and len(made) == 2


def test_on_the_cpu_the_values_are_what_was_given():
    t = torch.tensor([1.0, 2.0])
    assert device_values(t, "cpu") is t
    prefetch_values([t], "cpu")  # nothing to do
    assert torch.equal(
        device_constant(("test", 2), lambda: torch.arange(2), "cpu"), torch.arange(2)
    )
    assert device_copy(t, "cpu", torch.float64).dtype == torch.float64
