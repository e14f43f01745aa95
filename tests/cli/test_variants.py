"""jbkv_cli/cli/variants.py: a method the user gives no group size runs at its source's
(QVG and QuantWM g = 64, the others 32); ``--group-size(s)`` still chooses."""

from __future__ import annotations

from jbkv_cli.cli.variants import CacheFlags, SweepFlags


def _groups(specs) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for s in specs:
        if s.method is not None:
            out.setdefault(s.method.name, set()).add(s.method.group_size)
    return out


def test_the_sweep_takes_each_methods_own_group_size():
    sweep = SweepFlags(quantizers="rtn,quarot,kivi,qvg,quantwm,quantwm-base,turboquant-mse")
    assert _groups(sweep.specs()) == {
        "rtn": {32},
        "quarot": {32},
        "kivi": {32},
        "qvg": {64},
        "quantwm": {64},
        "quantwm-base": {64},
        "turboquant-mse": {32},
    }
    chosen = SweepFlags(quantizers="rtn,qvg,quantwm", group_sizes="32,128")
    assert _groups(chosen.specs()) == {"rtn": {32, 128}, "qvg": {32, 128}, "quantwm": {32, 128}}
    assert _groups(SweepFlags(quantizers="qvg", frontier=True).specs()) == {
        "qvg": {16, 32, 64, 128}
    }


def test_generate_takes_the_methods_own_group_size():
    assert CacheFlags(quantizer="qvg", bits=2).spec().key.group_size == 64
    assert CacheFlags(quantizer="quantwm", bits=2).spec().key.group_size == 64
    assert CacheFlags(quantizer="rtn", bits=2).spec().key.group_size == 32
    assert CacheFlags(quantizer="qvg", bits=2, group_size=16).spec().key.group_size == 16
