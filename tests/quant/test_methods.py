"""The method layer: the registry, method objects, variant specs, and adding a method from
outside the package (a toy method registered here and run through ``quantize-eval``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from jbkv_cli.kvcache import KVSpec
from jbkv_cli.quant import METHODS, KVMethod, RawTensor, build_method, register_method
from jbkv_cli.quant.method import Role
from jbkv_cli.quant.quarot import QuaRot
from jbkv_cli.quant.rtn import RTN, RTNNearest
from jbkv_cli.quant.tensor import GroupQuantized


def test_registry_order_and_names_come_from_the_classes():
    assert list(METHODS)[:3] == ["rtn", "rtn-nearest", "quarot"]
    assert all(cls.name == name for name, cls in METHODS.items())
    assert isinstance(build_method("quarot", 4, 16, seed=3), QuaRot)
    with pytest.raises(ValueError, match="unknown method 'gptq'"):
        build_method("gptq", 2)
    with pytest.raises(ValueError, match="does not take these options"):
        build_method("rtn", 2, 32, seed=3)
    with pytest.raises(ValueError, match="supports bits 1, 2, 3, 4, 8"):
        RTN(bits=5)


def test_methods_own_labels_and_ids():
    assert RTN(2, 32).variant_id == "int2-rtn-g32" and RTN(2, 32).label == "INT2 rtn g32"
    assert RTNNearest(4, 64).variant_id == "int4-rtn-nearest-g64"
    assert QuaRot(2, 32, seed=3, block_size=16).variant_id == "int2-quarot-g32-rs3-rb16"
    assert QuaRot(2, 32).to_dict() == {
        "name": "quarot",
        "bits": 2,
        "group_size": 32,
        "seed": 0,
        "block_size": None,
    }


def test_variant_ids_of_jbkv_0_1_run_folders_are_unchanged():
    """Old run folders stay readable: their flat variant.json parse to the same variant ids."""
    flat = {
        "quantizer": "rtn",
        "bits": 2,
        "group_size": 32,
        "correction": "taylor",
        "keys": True,
        "values": False,
        "bias_only": False,
        "rotation_seed": 0,
        "rotation_block": None,
        "sink_chunks": 0,
    }
    assert KVSpec.from_dict(flat).variant_id == "int2-rtn-g32-konly-taylor"
    bias = dict(flat, values=True, correction="none", bias_only=True, quantizer="quarot")
    assert KVSpec.from_dict(bias).variant_id == "int2-quarot-g32-biasonly"
    ref = dict(flat, quantizer="none", bits=16, correction="none", values=True)
    assert KVSpec.from_dict(ref).variant_id == "reference"  # its folder is found by RunDir
    for spec in (KVSpec.from_dict(flat), KVSpec.from_dict(bias), KVSpec()):
        assert KVSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_mixed_key_and_value_methods():
    spec = KVSpec(RTN(2, 32), RTN(4, 32), "taylor")
    assert spec.variant_id == "kint2-rtn-g32-vint4-rtn-g32-taylor"
    assert spec.label == "K INT2 rtn g32 / V INT4 rtn g32 +taylor"
    with pytest.raises(ValueError, match="needs a key method"):
        KVSpec(None, RTN(2, 32), "taylor")


def test_nearest_grid_clips_and_covering_grid_does_not():
    """At INT4 a step rounded down to the nearest FP8 value (up to 1/16 short) leaves the top
    of the range up to 15/16 of a step beyond the grid: clipped, error above Δ/2."""
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(0)) * 3
    for method, clipped in ((RTN(4, 32), False), (RTNNearest(4, 32), True)):
        qt = method.quantize(x)
        assert isinstance(qt, GroupQuantized)
        step = qt.step.repeat_interleave(32, dim=-1)
        over = ((x - qt.dequantize()).abs() > step / 2 + 1e-6).any()
        assert bool(over) == clipped, method.name


@dataclass(frozen=True)
class Truncate(KVMethod):
    """A toy method for the test: keep the top ``bits`` mantissa-free integer part (x rounded to
    a step of 2^-bits·4), stored exactly as float16 — enough to exercise the whole pipeline."""

    name: ClassVar[str] = "toy-truncate"
    summary: ClassVar[str] = "test-only toy method"
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (2, 4)

    def _quantize(self, x: torch.Tensor, role: Role) -> RawTensor:
        step = 4.0 / (1 << self.bits)
        return RawTensor((torch.round(x / step) * step).to(torch.float16).to(x.dtype))


def test_a_method_registered_from_outside_runs_through_quantize_eval(quick_eval):
    register_method(Truncate)
    try:
        rows = quick_eval(
            "--quantizers", "rtn,toy-truncate", "--bits", "2", "--corrections", "none"
        )
        toy = rows["int2-toy-truncate-g32"]
        assert toy["quantizer"] == "toy-truncate" and toy["psnr"]["mean"] > 10
        assert list(rows) == [
            "reference",
            "int2-rtn-g32",
            "int2-toy-truncate-g32",
        ]  # registry order
    finally:
        METHODS.pop("toy-truncate", None)


def test_one_bit_codes_where_a_method_supports_them_and_a_refusal_elsewhere():
    """1 bit (two levels per group): the group-wise RTN family and KIVI (as AsymKV runs it);
    every other method refuses it with its supported widths (issue 37.4)."""
    one = [name for name, cls in METHODS.items() if 1 in cls.SUPPORTED_BITS]
    assert one == ["rtn", "rtn-nearest", "quarot", "kivi"]
    for name, cls in METHODS.items():
        group = cls.default_group_size()
        if name in one:
            assert build_method(name, 1, group).bits == 1
            continue
        with pytest.raises(ValueError, match=rf"^{name} supports bits [0-9, ]+, got 1$"):
            build_method(name, 1, group)
