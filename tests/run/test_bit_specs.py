"""Separate key and value precision (issue 24 part 4): ``--bits K4V2,K2V16,4`` in quantize-eval,
``--key-bits/--value-bits`` in generate; ids, labels, the table, resume, bad specs. Per-layer and
1-bit specs (issue 37 part 4): ``K2V2@0-3+K2V1@4-``, ``asymkv:LK/LV``, one variant each; bad
ones refused in one line before anything is created."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.run.bit_specs import (
    BitPair,
    LayerBits,
    LayerRange,
    parse_bit_list,
    parse_bit_spec,
)
from jbkv_cli.run.experiment import build_matrix
from jbkv_cli.utils.errors import UsageError
from tests.installed import run_jbkv, run_refusal

SMALLEST = ["--num-chunks", "2", "--steps", "1", "--no-lpips", "--no-plots"]
PROMPT = ["--prompt", "a red circle moves right on a dark background"]


def _run(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return run_jbkv(*args, cwd=cwd, columns=200, timeout=300)


def test_specs_parse_to_key_and_value_widths():
    assert parse_bit_spec("4") == BitPair(4, 4)
    assert parse_bit_spec(" K4V2 ") == BitPair(4, 2) and parse_bit_spec("k2v16") == BitPair(2, 16)
    assert parse_bit_list("4,K4V4,K4V2") == [BitPair(4, 4), BitPair(4, 2)]  # 4 == K4V4
    assert [str(p) for p in parse_bit_list("K4V2,K2V16,4")] == ["K4V2", "K2V16", "4"]


@pytest.mark.parametrize(
    "text", ["", "16", "5", "K5V2", "K4", "V2K4", "K16V16", "K4V2x", "4.0", "0"]
)
def test_bad_specs_are_usage_errors(text):
    with pytest.raises(UsageError, match="--bits"):
        parse_bit_list(text)


def test_a_plain_width_keeps_todays_ids_and_pairs_say_both():
    plain = build_matrix([4], ["rtn"], ["none", "taylor"], [32])
    assert [s.variant_id for s in plain] == ["reference", "int4-rtn-g32", "int4-rtn-g32-taylor"]
    assert build_matrix(parse_bit_list("4"), ["rtn"], ["none", "taylor"], [32]) == plain
    ids = [s.variant_id for s in build_matrix(parse_bit_list("K4V2,K2V16,K16V2"), ["rtn"],
                                              ["none", "taylor"], [32])]  # fmt: skip
    assert ids == [
        "reference",
        "kint4-rtn-g32-vint2-rtn-g32",
        "kint4-rtn-g32-vint2-rtn-g32-taylor",
        "int2-rtn-g32-konly",  # K2V16 is the keys-only variant, one id for one behaviour
        "int2-rtn-g32-konly-taylor",
        "int2-rtn-g32-vonly",  # exact keys: nothing to correct
    ]
    mixed = KVSpec.build("rtn", 4, 32, "taylor", value_bits=2)
    assert mixed.key.bits == 4 and mixed.value.bits == 2
    assert mixed.label == "K INT4 rtn g32 / V INT2 rtn g32 +taylor"
    assert KVSpec.from_dict(json.loads(json.dumps(mixed.to_dict()))) == mixed
    # widths a method does not define are left out, per side (QVG: 2 and 4 bits)
    qvg = build_matrix(parse_bit_list("K3V2,K4V2"), ["qvg"], ["none"], [32])
    assert [s.variant_id for s in qvg] == ["reference", "kint4-qvg-g32-vint2-qvg-g32"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, says",
    [
        (["quantize-eval", "--bits", "K5V2"], "bad --bits: 'K5V2' has a side outside"),
        (["quantize-eval", "--bits", "K16V16"], "is the 16-bit reference"),
        (["quantize-eval", "--bits", "4,KV"], "'KV' is neither a width nor K<bits>V<bits>"),
        (["generate", "--key-bits", "5"], "--key-bits must be one of 1, 2, 3, 4, 8, 16, got 5"),
        (["generate", "--bits", "4", "--value-bits", "0"], "--value-bits must be one of"),
        (["generate", "--key-bits", "16", "--value-bits", "2", "--correct"], "quantized keys"),
        (["generate", "--key-bits", "4", "--value-bits", "2", "--ablation", "keys-only"], "one"),
        (["generate", "-q", "qvg", "--key-bits", "4", "--value-bits", "3"], "qvg supports bits"),
    ],
)
def test_bad_precision_is_one_usage_line_and_creates_nothing(tmp_path, args, says):
    out = tmp_path / "run"
    r = _run(*args, "--out", out, *PROMPT, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]
    assert "Traceback" not in r.stderr
    assert not out.exists()


@pytest.mark.slow
def test_mixed_variants_run_resume_and_report(tmp_path):
    """quantize-eval with K4V2 and a plain 2: the mixed variant has its id, label and bits cell;
    a second run resumes every video; generate --key-bits/--value-bits makes the same variant."""
    out = tmp_path / "runs"
    args = ["quantize-eval", "--bits", "K4V2,2", "--quantizers", "rtn", "--corrections",
            "none,taylor", *PROMPT, *SMALLEST, "--out", out, "--json", tmp_path / "r.json"]  # fmt: skip
    first = _run(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    rows = {r["variant"]: r for r in json.loads((tmp_path / "r.json").read_text())["rows"]}
    mixed = rows["kint4-rtn-g32-vint2-rtn-g32-taylor"]
    assert mixed["label"] == "K INT4 rtn g32 / V INT2 rtn g32 +taylor"
    assert mixed["bits"] == 4 and mixed["value_bits"] == 2
    assert rows["int2-rtn-g32"]["value_bits"] is None  # a plain width: today's row
    # K4V2 stores more than INT2 and less than INT4 would: between them in measured bytes
    assert rows["int2-rtn-g32"]["kv_cache_bytes"] < mixed["kv_cache_bytes"]
    assert mixed["lp_shift"]["mean"] is not None
    table = (out / "tiny" / "report" / "table.md").read_text()
    assert "K4V2" in table and "K INT4 rtn g32 / V INT2 rtn g32" in table
    again = _run(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "0 videos generated, 5 already done" in again.stderr
    gen = _run("generate", "--key-bits", "4", "--value-bits", "2", "--correct", *PROMPT,
               "--num-chunks", "2", "--steps", "1", "--out", out / "tiny", cwd=tmp_path)  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    assert "0 videos generated, 2 already done" in gen.stderr  # the same variant id, resumed


# --- per layer and 1 bit (issue 37.4) ---------------------------------------------------------


def test_per_layer_specs_parse_to_one_canonical_spec():
    spec = parse_bit_spec("K2V2@0-3+K2V1@4-")
    assert spec == LayerBits(
        None, ((LayerRange(0, 3), BitPair(2, 2)), (LayerRange(4), BitPair(2, 1)))
    )
    assert (str(spec), spec.id_part) == ("K2V2@0-3+K2V1@4-", "k2v2l0to3-k2v1l4up")
    assert [spec.at(i) for i in (0, 3, 4, 40)] == [BitPair(2, 2)] * 2 + [BitPair(2, 1)] * 2
    rule = parse_bit_spec("K4V4+K2V1@8-")  # "K2V1 in layers >= 8", K4V4 below
    assert (rule.default, rule.at(7), rule.at(8)) == (BitPair(4, 4), BitPair(4, 4), BitPair(2, 1))
    # one behaviour, one spec: sorted, adjacent equal ranges merged, one pair everywhere a pair
    assert str(parse_bit_spec("k1v1@8- + K2V2@4-7 + K2V2@0-3")) == "K2V2@0-7+K1V1@8-"
    assert parse_bit_spec("K2V1@0-") == BitPair(2, 1) and parse_bit_spec("1") == BitPair(1, 1)
    assert parse_bit_list("K2V2@0-3+K1V1@4-,K1V1@4-+K2V2@0-3,2") == [
        parse_bit_spec("K2V2@0-3+K1V1@4-"),
        BitPair(2, 2),
    ]


def test_asymkv_is_the_per_layer_spec_of_its_rule():
    """AsymKV-l_k/l_v: keys at 2 bits in the first l_k layers, values in the first l_v, 1 bit
    after (module docstring: after AsymKV)."""
    spec = parse_bit_spec("asymkv:16/0")
    assert str(spec) == "K1V1+K2V1@0-15"
    assert [spec.at(i) for i in (0, 15, 16, 31)] == [BitPair(2, 1)] * 2 + [BitPair(1, 1)] * 2
    both = parse_bit_spec("AsymKV:4/8")
    pairs = [both.at(i) for i in (0, 3, 4, 7, 8, 100)]
    assert pairs == [BitPair(2, 2)] * 2 + [BitPair(1, 2)] * 2 + [BitPair(1, 1)] * 2
    assert parse_bit_spec("asymkv:0/0") == BitPair(1, 1)


@pytest.mark.parametrize(
    "text, says",
    [
        ("K2V2@0-3+K2V1@3-", "layer ranges 0-3 and 3- overlap"),
        ("K2V2@2-5+K1V1@4", "layer ranges 2-5 and 4 overlap"),
        ("K2V2@5-2", "'5-2' ends before it starts"),
        ("K2V5@0-3", "'K2V5' has a side outside 1, 2, 3, 4, 8, 16"),
        ("K2V2@0-3+7@4-", "'7' is not a width"),
        ("K2V2+K1V1", "has two defaults"),
        ("K2V2@x", "'x' is not a layer range"),
        ("K2V2@", "'' is not a layer range"),
        ("K16V16@0-3+K16V16", "is the 16-bit reference"),
        ("asymkv:16", "neither a width nor K<bits>V<bits>"),
    ],
)
def test_bad_per_layer_specs_are_usage_errors(text, says):
    with pytest.raises(UsageError, match=r"^bad --bits: ") as err:
        parse_bit_list(text)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_per_layer_spec_is_one_variant_per_method_and_correction():
    layered = parse_bit_spec("K2V2@0-1+K2V1@2-")
    specs = build_matrix([layered], ["rtn", "qvg", "kivi"], ["none", "taylor"], None)
    ids = [s.variant_id for s in specs]
    assert ids == [  # QVG has no 1 bit: left out; KIVI at its g32, r128 default
        "reference",
        "k2v2l0to1-k2v1l2up-rtn-g32",
        "k2v2l0to1-k2v1l2up-rtn-g32-taylor",
        "k2v2l0to1-k2v1l2up-kivi-g32",
        "k2v2l0to1-k2v1l2up-kivi-g32-taylor",
    ]
    assert specs[2].label == "K2V2@0-1+K2V1@2- rtn g32 +taylor"
    assert not specs[2].taylor_outside  # 2-bit keys in every layer
    one = build_matrix([parse_bit_spec("asymkv:2/0"), 1], ["rtn"], ["taylor", "exact"], [32])
    assert [s.taylor_outside for s in one[1:]] == [True, False, True, False]
    values_only = build_matrix([parse_bit_spec("K16V2@0+K16V1")], ["rtn"], ["none", "taylor"], [32])
    assert [s.variant_id for s in values_only] == ["reference", "k16v1-k16v2l0-rtn-g32"]


@pytest.mark.parametrize(
    "args, says",
    [
        (["quantize-eval", "--bits", "2,K2V2@0-3+K2V1@2-"], "layer ranges 0-3 and 2- overlap"),
        (["quantize-eval", "--bits", "K2V2@0-9+K1V1"], "the model's layers 0-3"),
        (["quantize-eval", "--bits", "K2V9@1-"], "'K2V9' has a side outside"),
        (["quantize-eval", "--quantizers", "qvg,quantwm", "--bits", "asymkv:2/0"], "no chosen"),
        (["generate", "-q", "qvg", "--bits", "1"], "qvg supports bits 2, 4, got 1"),
        (["generate", "--bits", "K2V1@0-1"], "layer 2 has no width"),
        (["generate", "--bits", "K2V2@0-1+K1V1", "--key-bits", "2"], "leave out --key-bits"),
        (["generate", "--bits", "K2V2@0-1+K1V1", "--ablation", "keys-only"], "per-layer"),
    ],
)
def test_bad_per_layer_and_one_bit_specs_are_one_line_and_create_nothing(tmp_path, args, says):
    out = tmp_path / "run"
    installed = args[2] == "2,K2V2@0-3+K2V1@2-"  # the first: through the installed jbkv too
    done = run_refusal(*args, "--out", out, *PROMPT, *SMALLEST[:4], cwd=tmp_path,
                       installed=installed)  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done.stderr
    assert not out.exists()
