"""KVQuant's calibration artifact (:mod:`jbkv_cli.quant.kvquant_calibration`, ``jbkv
calibrate``): the file round-trips, a calibrated method codes with the file's fixed tables,
outliers beyond the fixed thresholds are exact and counted, mismatches are refused in one line,
and the command runs end to end on the embedded model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.kvcache.spec import FULL_PRECISION, ExactPreRope
from jbkv_cli.quant.kvquant import KVQuant, file_sha256
from jbkv_cli.quant.kvquant_calibration import (
    CommitCollector,
    fit_calibration,
    load_calibration,
    save_calibration,
)
from tests.installed import run_in_process

PROMPT = "a red circle moves right on a dark background"
SMALL = ["--num-chunks", "2", "--steps", "1", "--prompt", PROMPT, "--seeds", "0"]


def _chunk(seed: int, tokens: int = 24, heads: int = 2, dim: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(dim, generator=g) * 0.5)
    return torch.randn(1, heads, tokens, dim, generator=g) * scale + torch.randn(dim, generator=g)


def _collector(layers: int = 2, chunks: int = 3) -> CommitCollector:
    c = CommitCollector()
    for layer in range(layers):
        for i in range(chunks):
            c.committed(layer, _chunk(100 * layer + 2 * i), _chunk(100 * layer + 2 * i + 1))
    c.committed(None, _chunk(7), _chunk(8))  # a cache outside the layer stack: left out
    return c


def _file(tmp_path: Path, bits: int = 2, model: str = "tiny") -> Path:
    meta = {"model": model, "bits": str(bits), "layout": "pre-rope"}
    cal = fit_calibration(KVQuant(bits=bits), _collector(), meta)
    path = tmp_path / f"cal{bits}.safetensors"
    save_calibration(cal, path)
    return path


def test_the_file_round_trips(tmp_path):
    """fit -> save -> load gives the same tables (FP16 stored as FP16: equal by construction)
    and the metadata; the layer outside the stack is left out."""
    cal = fit_calibration(KVQuant(bits=2), _collector(), {"model": "tiny", "bits": "2"})
    path = tmp_path / "c.safetensors"
    save_calibration(cal, path)
    back = load_calibration(path)
    assert len(back.layers) == len(cal.layers) == 2
    assert back.meta == cal.meta and back.meta["jbkv"] == "calibrate"
    for i in range(2):
        for role in ("key", "value"):
            a, b = cal.tables(i, role), back.tables(i, role)
            assert torch.equal(a.codebook, b.codebook) and torch.equal(a.cell_var, b.cell_var)
            assert a.codebook.shape == (4,)
        k = back.tables(i, "key")
        assert k.upper.shape == k.lower.shape == (2, 8) and bool((k.upper > k.lower).all())
        assert back.tables(i, "value").upper is None


@pytest.mark.parametrize("role", ["key", "value"])
def test_a_calibrated_method_codes_with_the_files_tables(tmp_path, role):
    """``calibration=FILE`` at layer 1 stores a chunk exactly as quantizing it with layer 1's
    tables passed directly (one code path: equal by construction), with the file's codebook,
    and keeps the fixed tables out of the per-chunk storage."""
    path = _file(tmp_path)
    method = KVSpec.build("kvquant", 2, calibration=str(path)).at_layer(1).key
    tables = load_calibration(path).tables(1, role)
    x = _chunk(55, tokens=30)
    got = method.quantize(x, role)
    want = KVQuant(bits=2).quantize_fixed(x, role, tables)
    assert torch.equal(got.dequantize(), want.dequantize())
    assert torch.equal(got.step, want.step)
    assert torch.equal(got.codebook[0], tables.codebook)
    assert "codebook" not in got.stored() and "cell_var" not in got.stored()
    assert ("upper" in got.stored()) == (role == "value")  # values' ranges stay per token
    unbound = KVSpec.build("kvquant", 2, calibration=str(path)).key
    with pytest.raises(ValueError, match="bound to a layer"):
        unbound.quantize(x, role)


def test_fixed_thresholds_range_the_codes_and_the_list_keeps_its_in_run_size(tmp_path):
    """Keys with the file's thresholds: the ranges are the file's (not stored per chunk), the
    sparse list is the in-run one (the top and bottom ``K`` of each channel, exact, step 0), and
    every coded entry reads back within its range (one beyond it is clipped: ``--cap_outliers``)."""
    path = _file(tmp_path)
    tables = load_calibration(path).tables(0, "key")
    x = (_chunk(77, tokens=40) * 1.5).half()  # wider than the calibration data; FP16: exact
    fixed = KVQuant(bits=2).quantize_fixed(x, "key", tables)
    in_run = KVQuant(bits=2).quantize(x, "key")
    up, lo = tables.upper[None, :, None, :], tables.lower[None, :, None, :]
    assert torch.equal(fixed.split.upper, up) and torch.equal(fixed.split.lower, lo)
    assert torch.equal(fixed.split.index, in_run.split.index)
    listed = fixed.outlier_mask()
    assert int(listed.sum()) == 2 * 8 * 2  # K = 1 + 1 per channel of 40 tokens at 1%, 2 heads
    assert torch.equal(fixed.dequantize()[listed], x[listed])
    assert bool((fixed.step[listed] == 0).all()) and bool((fixed.step[~listed] > 0).all())
    out = fixed.dequantize().float()
    assert bool(((out <= up.float()) & (out >= lo.float()))[~listed].all())  # codes in range
    assert {"upper", "lower", "codebook", "cell_var"}.isdisjoint(fixed.stored())
    assert fixed.nbytes < in_run.nbytes


def test_mismatched_bits_model_or_changed_file_are_refused_in_one_line(tmp_path):
    path = _file(tmp_path, bits=2)
    with pytest.raises(ValueError, match=r"made for 2 bits, not 4$"):
        KVSpec.build("kvquant", 4, calibration=str(path))
    method = KVQuant(bits=2, calibration=str(path))
    with pytest.raises(ValueError, match="made for model tiny, not self-forcing"):
        method.for_model("self-forcing")
    assert method.for_model("tiny") is method
    with pytest.raises(ValueError, match="changed"):
        KVQuant(bits=2, calibration=str(path), calibration_sha256="0" * 64)
    with pytest.raises(ValueError, match="has 2 layers, no layer 2"):
        method.at_layer(2)
    assert method.calibration_sha256 == file_sha256(str(path))
    assert method.variant_id.endswith("-cal" + method.calibration_sha256[:8])


def test_committed_keys_are_before_rope_in_a_pre_rope_cache():
    """The commit hook sees the keys as the cache stores them: the pre-RoPE reference commits
    other keys than the post-RoPE one, of the same norm per RoPE pair (a rotation), and the
    same values; the videos agree."""
    from jbkv_cli.cli.groups import load

    model = load("tiny", {"num_chunks": 2, "steps": 1})
    post, pre = CommitCollector(), CommitCollector()
    a = model.generate(PROMPT, 0, FULL_PRECISION, observer=post)
    b = model.generate(PROMPT, 0, ExactPreRope(), observer=pre)
    assert (a.frames.int() - b.frames.int()).abs().max() <= 1
    assert sorted(pre.keys) == [0, 1, 2, 3] and len(pre.keys[0]) == 2
    k_post, k_pre = post.keys[3][1], pre.keys[3][1]
    assert not torch.allclose(k_post, k_pre, atol=1e-3)
    pairs = lambda k: k.unflatten(-1, (2, -1)).square().sum(-2)  # noqa: E731 - (x_j, x_{j+D/2})
    torch.testing.assert_close(pairs(k_post), pairs(k_pre), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(post.values[3][1], pre.values[3][1], atol=1e-5, rtol=1e-5)


def test_calibrate_end_to_end_on_tiny(tmp_path):
    """``jbkv calibrate`` on the embedded model (2 chunks, 1 step, one prompt and seed): one
    file, the model's 4 layers, keys before RoPE; rewriting its own file is allowed; a run
    with it stores every chunk with its tables."""
    out = tmp_path / "tiny-int2.safetensors"
    args = ["calibrate", "--model", "tiny", "--bits", "2", *SMALL, "--out", out]
    done = run_in_process(*args)
    assert done.returncode == 0, done.stderr
    cal = load_calibration(out)
    assert len(cal.layers) == 4
    assert cal.meta["model"] == "tiny" and cal.meta["bits"] == "2"
    assert cal.meta["layout"] == "pre-rope" and json.loads(cal.meta["seeds"]) == [[0]]
    assert json.loads(cal.meta["prompts"]) == [PROMPT]
    assert run_in_process(*args).returncode == 0  # its own file: rewritten
    spec = KVSpec.build("kvquant", 2, calibration=str(out))
    assert spec.at_layer(3).key.layer == 3
    cache = ChunkKVCache(spec.at_layer(3))
    cache.commit(_chunk(1, dim=64), _chunk(2, dim=64))
    chunk = sum(p.nbytes for p in cache.chunks[0].sides.values())
    assert cache.nbytes == chunk + cal.nbytes_per_layer()[3]  # the tables once per layer
    cache.commit(_chunk(3, dim=64), _chunk(4, dim=64))
    assert (
        cache.nbytes
        == chunk
        + sum(p.nbytes for p in cache.chunks[1].sides.values())
        + (cal.nbytes_per_layer()[3])
    )


def test_calibrate_refuses_bad_input_before_writing(tmp_path):
    """An existing file jbkv did not write, a bad width, a bad suffix: one line, exit 2,
    nothing written or changed."""
    other = tmp_path / "mine.safetensors"
    other.write_bytes(b"not jbkv's")
    cases = [
        (["--bits", "2", "--out", other], "was not written by jbkv calibrate"),
        (["--bits", "5", "--out", tmp_path / "a.safetensors"], "--bits must be one of 2, 3, 4"),
        (["--bits", "2", "--out", tmp_path / "a.pt"], "must end in .safetensors"),
        (
            ["--bits", "2", "-M", "kvquant.calibration=x", "--out", tmp_path / "a.safetensors"],
            "does not go here",
        ),
    ]
    for extra, message in cases:
        done = run_in_process("calibrate", "--model", "tiny", *SMALL, *extra)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert other.read_bytes() == b"not jbkv's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.safetensors"]


def test_a_run_with_a_mismatched_file_is_refused_in_one_line(tmp_path):
    """``quantize-eval -M kvquant.calibration=FILE`` at other bits: one line, exit 2, no run."""
    path = _file(tmp_path, bits=2)
    args = ["quantize-eval", *SMALL, "--quantizers", "kvquant", "--bits", "4", "--no-lpips"]
    done = run_in_process(*args, "-M", f"kvquant.calibration={path}", "--out", tmp_path / "run")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: calibration {path} was made for 2 bits, not 4"
    assert not (tmp_path / "run").exists()


def test_matrix_games_action_caches_refuse_a_calibration(tmp_path):
    """Its action caches would read the video layers' tables: refused unless not quantized."""
    from jbkv_cli.models import registry
    from jbkv_cli.utils.errors import UsageError
    from tests.models.test_contract import TINY

    spec = KVSpec.build("kvquant", 2, calibration=str(_file(tmp_path, model="matrix-game-2")))
    settings = TINY["matrix-game-2"].settings
    model = registry.load_model("matrix-game-2", **settings)
    with pytest.raises(UsageError, match=r"set -o quantize_actions=false\)$"):
        model.resolve_kv(spec)
    model = registry.load_model("matrix-game-2", **settings, quantize_actions=False)
    assert model.resolve_kv(spec).key.calibration == spec.key.calibration
