"""``--model hy-worldplay`` through the installed ``jbkv``: the tiny random config end to end
(generate with a 2-bit corrected cache, resume, the memory plan kept in the manifest and read
back by every variant, quantize-eval), and every bad input as one line on stderr, exit 2 (1
for missing weights), with nothing created."""

import json
import subprocess
from functools import partial
from pathlib import Path

import pytest
from PIL import Image

from tests.installed import run_jbkv, run_refusal

pytestmark = pytest.mark.slow

TINY = ["--model", "hy-worldplay", "-o", "config=tiny-random", "-o", "num_chunks=2"]


jbkv = partial(run_jbkv, columns=120, env={"OMP_NUM_THREADS": "1"})
refused = partial(run_refusal, columns=120, env={"OMP_NUM_THREADS": "1"})
"""A refusal in this process; ``installed=True`` checks the installed ``jbkv`` answers the same."""


def image(path: Path) -> Path:
    Image.new("RGB", (24, 16), (200, 40, 90)).save(path)
    return path


def bomb(path: Path, side: int) -> Path:
    """A PNG whose header says ``side`` x ``side`` pixels (its data is one pixel's): what a
    decompression bomb looks like to Pillow before it decodes anything."""
    import struct
    import zlib

    Image.new("RGB", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", side, side)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17]))
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    path.write_bytes(bytes(data))
    return path


def case_file(folder: Path, rows: list[str], header: str = "image_name,caption,pose") -> Path:
    path = folder / "cases.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def one_line_error(r: subprocess.CompletedProcess, code: int, needle: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One tiny generate with INT2 rtn +taylor (and the reference)."""
    folder = tmp_path_factory.mktemp("hyw")
    image(folder / "1.png")
    cases = case_file(folder, ["1.png,a red house by the sea,w-7"])
    r = jbkv(
        "generate", *TINY, "--cases", cases, "--bits", "2", "--correct", "--out", "run", cwd=folder
    )
    assert r.returncode == 0, r.stderr
    return folder


def test_hy_worldplay_generate_end_to_end(run_dir):
    run = run_dir / "run"
    manifest = json.loads((run / "manifest.json").read_text())
    case = manifest["cases"]["1-w-7"]
    assert manifest["prompts"] == ["1-w-7"]
    assert case["prompt"] == "a red house by the sea" and case["trajectory"] == "w-7"
    assert case["plan"]["memory"] == [[], [0, 1, 2, 3]]
    for variant in ("reference", "int2-rtn-g32-taylor"):
        assert (run / "videos" / variant / "1-w-7-0.mkv").is_file()
        record = json.loads((run / "videos" / variant / "1-w-7-0.json").read_text())
        assert record["frames"][:3] == [29, 16, 16]
        # the causal VAE's first chunk is 13 frames, the next 16 (drift is per chunk, not frame)
        assert (record["info"]["first_chunk_frames"], record["info"]["frames_per_chunk"]) == (
            13,
            16,
        )
        assert record["info"]["memory"] == case["plan"]["memory"]
        assert set(record["info"]["kv_cache_bytes_by_branch"]) == {"text", "rope", "prope"}
    q = json.loads((run / "videos" / "int2-rtn-g32-taylor" / "1-w-7-0.json").read_text())
    ref = json.loads((run / "videos" / "reference" / "1-w-7-0.json").read_text())
    assert q["kv_cache_bytes"] < ref["kv_cache_bytes"]
    assert (
        q["info"]["kv_cache_bytes_by_branch"]["text"]
        == ref["info"]["kv_cache_bytes_by_branch"]["text"]
    )


def test_hy_worldplay_every_variant_reads_the_kept_plan(run_dir):
    """The plan is computed once and kept: a new variant of the case reads the manifest's
    index lists (here edited by hand), not a recomputed one."""
    manifest_path = run_dir / "run" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["cases"]["1-w-7"]["plan"]["memory"] = [[], [0, 2]]
    manifest_path.write_text(json.dumps(manifest))
    cases = run_dir / "cases.csv"
    r = jbkv("generate", *TINY, "--cases", cases, "--bits", "4", "--out", "run", cwd=run_dir)
    assert r.returncode == 0, r.stderr
    assert "1 videos generated, 1 already done" in " ".join((r.stdout + r.stderr).split())
    record = json.loads((run_dir / "run" / "videos" / "int4-rtn-g32" / "1-w-7-0.json").read_text())
    assert record["info"]["memory"] == [[], [0, 2]]


def test_hy_worldplay_quantize_eval_end_to_end(tmp_path):
    image(tmp_path / "1.png")
    cases = case_file(tmp_path, ["1.png,a quiet street,w-7"])
    r = jbkv(
        "quantize-eval", "--model", "hy-worldplay", "--model-option", "config=tiny-random",
        "--num-chunks", "2", "--steps", "1", "--cases", cases, "--quantizers", "rtn",
        "--bits", "2", "--corrections", "none,taylor", "--no-lpips", "--no-plots",
        "--json", "rows.json", "--out", "qe", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())
    text = json.dumps(rows)
    assert "INT2 rtn g32 +taylor" in text and "psnr" in text
    scores = tmp_path / "qe" / "hy-worldplay" / "metrics" / "fidelity" / "int2-rtn-g32-taylor"
    assert (scores / "1-w-7-0.json").is_file()


BAD = [
    # (rows, extra options, needle)
    (["1.png,a house,w-31"], [], "has 32 latents (125 frames); this run makes 8"),
    (["1.png,a house,jump-3"], [], "unknown action 'jump'"),
    (["1.png,a house,poses.json"], [], "pose JSON 'poses.json' is not a file"),
    (["1.png,a house,broken.json"], [], "cannot read pose JSON"),
    (["2.png,a house,w-7"], [], "image '2.png' is not a file"),
    (["garbage.png,a house,w-7"], [], "cannot read image"),
    # past twice Pillow's MAX_IMAGE_PIXELS (it raised DecompressionBombError, which escaped)
    (["bomb.png,a house,w-7"], [], "could be decompression bomb"),
    # past it (Pillow only warned, on stderr, and then decoded)
    (["big.png,a house,w-7"], [], "could be decompression bomb"),
    (["1.png,a house,w-7"], ["-o", "frames=30"], "frames must be 4 * latents - 3"),
    (["1.png,,w-7"], [], "empty prompt"),
]
# through the installed jbkv too: the first, and Pillow's warnings (stderr of a real process)
INSTALLED_BAD = (0, 6, 7)


@pytest.mark.parametrize(("rows", "extra", "needle"), BAD)
def test_hy_worldplay_bad_inputs_are_one_line_usage_errors(tmp_path, rows, extra, needle):
    image(tmp_path / "1.png")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "garbage.png").write_bytes(b"not a png")
    bomb(tmp_path / "bomb.png", 20_000)
    bomb(tmp_path / "big.png", 10_000)
    cases = case_file(tmp_path, rows)
    # quantize-eval checks cases through the same path (_case_items): two of them suffice
    commands = ("generate", "quantize-eval") if rows[0].endswith(("w-31", "broken.json")) else ()
    installed = BAD.index((rows, extra, needle)) in INSTALLED_BAD
    for command in commands or ("generate",):
        r = refused(
            command, *TINY, *extra, "--cases", cases, "--out", "out",
            cwd=tmp_path, installed=installed and command == "generate",
        )  # fmt: skip
        one_line_error(r, 2, needle)
        assert not (tmp_path / "out").exists()


def test_hy_worldplay_needs_an_image_and_text_models_refuse_one(tmp_path):
    image(tmp_path / "1.png")
    r = refused(
        "generate", *TINY, "--prompt", "a house", "--out", "out", cwd=tmp_path, installed=True
    )
    one_line_error(r, 2, "hy-worldplay needs an image")
    cases = case_file(tmp_path, ["1.png,a house,w-7"])
    r = refused(
        "generate", "--model", "tiny", "--cases", cases, "--out", "out",
        cwd=tmp_path, installed=False,
    )  # fmt: skip
    one_line_error(r, 2, "model 'tiny' takes a prompt only; case '1-w-7' has an image")
    r = refused(
        "generate", *TINY, "--cases", cases, "--prompt", "x", "--out", "out",
        cwd=tmp_path, installed=False,
    )  # fmt: skip
    one_line_error(r, 2, "--cases lists the prompts")
    assert not (tmp_path / "out").exists()


def test_hy_worldplay_missing_weights_are_one_error_listing_them(tmp_path):
    image(tmp_path / "1.png")
    cases = case_file(tmp_path, ["1.png,a house,w-63"])
    (tmp_path / "w").mkdir()
    r = jbkv(
        "generate", "--model", "hy-worldplay", "--weights", "w", "--cases", cases,
        "--out", "out", cwd=tmp_path,
    )  # fmt: skip
    one_line_error(r, 1, "HY-WorldPlay weights incomplete")
    for needle in ("ar_distilled_action_model", "Qwen/Qwen2.5-VL-7B-Instruct", "gated"):
        assert needle in r.stderr
    assert not (tmp_path / "out").exists()


def test_hy_worldplay_refuses_pruning_and_profiling_in_one_line(tmp_path):
    """Its memory is re-selected every chunk, so it has no head layout: Forcing-KV and
    profile-heads are usage errors, checked before anything is created."""
    image(tmp_path / "1.png")
    cases = case_file(tmp_path, ["1.png,a house,w-7"])
    for args in (
        ["generate", *TINY, "--cases", cases, "--pruner", "forcing-kv", "--out", "out"],
        ["profile-heads", *TINY, "--cases", cases, "--out", "p.json"],
    ):
        r = refused(*args, cwd=tmp_path, installed=args[0] == "generate")
        assert r.returncode == 2, (args[0], r.returncode, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.png", "cases.csv"]


def test_hy_worldplay_pillows_warnings_stay_off_stderr(tmp_path):
    """A palette image with its transparency in bytes makes Pillow warn as it is converted to
    RGB (two lines on stderr); reading it is jbkv's, so the refusal of the next row is the only
    line."""
    palette = Image.new("P", (24, 16))
    palette.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] * 80)
    palette.save(tmp_path / "p.png", transparency=bytes([0, 128, 255]))
    image(tmp_path / "1.png")
    cases = case_file(tmp_path, ["p.png,a house,w-7", "1.png,a lake,w-31"])
    r = jbkv("generate", *TINY, "--cases", cases, "--out", "out", cwd=tmp_path)
    one_line_error(r, 2, "has 32 latents")
    assert not (tmp_path / "out").exists()
