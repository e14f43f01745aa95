"""Separate key and value precision (issue 24 part 4): ``--bits K4V2,K2V16,4`` in quantize-eval,
``--key-bits/--value-bits`` in generate; ids, labels, the table, resume, bad specs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.run.bit_specs import BitPair, parse_bit_list, parse_bit_spec
from jbkv_cli.run.experiment import build_matrix
from jbkv_cli.utils.errors import UsageError
from tests.installed import run_jbkv

pytestmark = pytest.mark.slow

SMALLEST = ["--num-chunks", "2", "--steps", "1", "--no-lpips", "--no-plots"]
PROMPT = ["--prompt", "a red circle moves right on a dark background"]


def _run(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return run_jbkv(*args, cwd=cwd, columns=200, timeout=300)


def test_specs_parse_to_key_and_value_widths():
    assert parse_bit_spec("4") == BitPair(4, 4)
    assert parse_bit_spec(" K4V2 ") == BitPair(4, 2) and parse_bit_spec("k2v16") == BitPair(2, 16)
    assert parse_bit_list("4,K4V4,K4V2") == [BitPair(4, 4), BitPair(4, 2)]  # 4 == K4V4
    assert [str(p) for p in parse_bit_list("K4V2,K2V16,4")] == ["K4V2", "K2V16", "4"]


@pytest.mark.parametrize("text", ["", "16", "5", "K5V2", "K4", "V2K4", "K16V16", "K4V2x", "4.0"])
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


@pytest.mark.parametrize(
    "args, says",
    [
        (["quantize-eval", "--bits", "K5V2"], "bad --bits: 'K5V2' has a side outside"),
        (["quantize-eval", "--bits", "K16V16"], "is the 16-bit reference"),
        (["quantize-eval", "--bits", "4,KV"], "'KV' is neither a width nor K<bits>V<bits>"),
        (["generate", "--key-bits", "5"], "--key-bits must be one of 2, 3, 4, 8, 16, got 5"),
        (["generate", "--bits", "4", "--value-bits", "1"], "--value-bits must be one of"),
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
