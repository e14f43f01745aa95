"""Inputs jbkv must refuse before it creates anything, through the installed ``jbkv``.

Prompts (every prompt of every model is checked before a run folder exists), prompt files
(UTF-8 with or without a byte-order mark, lines split on ``\\n``/``\\r\\n`` only), the longest
accepted prompt on a host with a long name, option values (typed and bounded, usage errors
naming the option and its range) and the JSON files a user names (regular files only, a size
cap, no ``RecursionError``). Each case checks the exit code, exactly one line on stderr, and an
untouched working folder. Cases run concurrently (each start-up imports torch).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jbkv_cli.run.directory import MAX_PROMPT_BYTES
from tests.installed import run_in_process, run_jbkv

pytestmark = pytest.mark.slow

TINY = ["--num-chunks", "2", "--steps", "1"]
TINY_PROMPT = "a red circle moves right on a dark background"
FREE_TEXT = {
    name: ["-m", name, "-o", "config=tiny-random"]
    for name in ("magi1", "self-forcing", "skyreels-v2")
}
LONG_HOST = "h" * 64


def run(
    *args: object, cwd: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """The installed ``jbkv`` with ``args``; ``timeout`` turns a blocked read into a failure."""
    return run_jbkv(*args, cwd=cwd, env={"COLUMNS": "120", **(env or {})}, timeout=timeout)


def run_all(cases: list[tuple], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Each case ``(args, code, needles[, env])`` run in ``cwd``: in this process
    (``tests/installed.py``'s ``run_in_process``), the first case and those with an environment
    of their own through the installed ``jbkv``, which must answer the same."""
    done = []
    for i, case in enumerate(cases):
        env = case[3] if len(case) > 3 else None
        if env is not None:
            done.append(run(*case[0], cwd=cwd, env=env))
            continue
        here = run_in_process(*case[0], cwd=cwd, columns=120)
        if i == 0:
            there = run(*case[0], cwd=cwd)
            same = (there.returncode, there.stdout, there.stderr)
            assert same == (here.returncode, here.stdout, here.stderr), case[0]
        done.append(here)
    return done


def check_refusals(cases: list[tuple], work: Path) -> None:
    """Every case exits with its code and one ``error:`` line holding each needle, and the
    working folder stays empty (no --out folder, no manifest)."""
    for case, r in zip(cases, run_all(cases, work), strict=True):
        args, code, needles = case[:3]
        label = [str(a)[:40] for a in args[:8]]
        assert r.returncode == code, (label, r.returncode, r.stderr[-2000:])
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (label, r.stderr[-2000:])
        for needle in needles:
            assert needle in lines[0], (label, needle, lines[0])
        assert "Traceback" not in r.stdout + r.stderr
    assert sorted(p.name for p in work.iterdir()) == [], "a refused command created files"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """An empty working folder (the commands' cwd; --out goes inside)."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """Hostile input files beside the working folder."""
    folder = tmp_path / "in"
    folder.mkdir()
    os.mkfifo(folder / "fifo")
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (folder / "nan.json").write_text('{"format": NaN}')
    with open(folder / "huge.json", "wb") as f:  # sparse: larger than the cap, nothing written
        f.truncate(65 * 2**20)
    (folder / "nul.txt").write_bytes(b"a cat\x00plays piano\n")
    (folder / "latin1.txt").write_bytes(b"caf\xe9 au lait\n")
    for code in ("0085", "000C", "2028", "2029"):
        text = f"a dog runs{chr(int(code, 16))}on the beach\n"
        (folder / f"sep-{code}.txt").write_text(text, encoding="utf-8")
    return folder


# --- item 9: every prompt of every model is checked before anything is created -----------------


def test_bad_prompts_of_free_text_models_are_refused_before_the_run_folder(work, inputs):
    cases = []
    for flags in FREE_TEXT.values():
        for bad in (["--prompt", "a/b"], ["--prompt", "x" * 10_000]):
            cases.append((["generate", *flags, *bad, "--out", "out"], 2, ["prompt"]))
        nul = ["--prompts", inputs / "nul.txt"]
        cases.append((["generate", *flags, *nul, "--out", "out"], 2, ["U+0000"]))
    evaluate = ["quantize-eval", *FREE_TEXT["self-forcing"], "--prompt", "ok", "--prompt", "a/b"]
    cases.append(([*evaluate, "--out", "out"], 2, ["'a/b'"]))
    check_refusals(cases, work)


# --- item 10: prompt files are UTF-8 lines ----------------------------------------------------


def test_line_separators_inside_a_prompt_line_are_refused_by_name(work, inputs):
    """``str.splitlines`` would have cut each of these lines into two prompts."""
    flags = FREE_TEXT["self-forcing"]
    cases = [
        (["generate", *flags, "--prompts", inputs / f"sep-{c}.txt", "--out", "out"], 2, [f"U+{c}"])
        for c in ("0085", "000C", "2028", "2029")
    ]
    check_refusals(cases, work)


def test_unreadable_prompt_files_are_one_line_naming_the_file(work, inputs):
    cases = [
        (["generate", "--prompts", inputs / "latin1.txt", "--out", "out"], 1, ["not UTF-8"]),
        (["generate", "--prompts", inputs / "fifo", "--out", "out"], 1, ["a FIFO"]),
        (["generate", "--prompts", "/dev/zero", "--out", "out"], 1, ["a character device"]),
    ]
    cases = [(a, code, [*n, str(a[2])]) for a, code, n in cases]
    check_refusals(cases, work)


def test_a_byte_order_mark_and_crlf_lines_are_not_part_of_the_prompts(tmp_path, work):
    prompts = tmp_path / "bom.txt"
    second = "a blue square moves left on a light background"
    prompts.write_bytes(f"\ufeff{TINY_PROMPT}\r\n{second}\r\n".encode())
    r = run("generate", "--prompts", prompts, *TINY, "--out", "out", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    names = sorted(p.name for p in (work / "out" / "videos" / "reference").glob("*.json"))
    assert names == sorted([f"{TINY_PROMPT}-0.json", f"{second}-0.json", "variant.json"])


# --- item 11: the longest accepted prompt is written on a host with a long name ---------------


def _long_host_env(tmp_path: Path) -> dict[str, str]:
    """``PYTHONPATH`` with a ``sitecustomize`` that makes ``socket.gethostname`` return
    :data:`LONG_HOST` (64 characters) in every jbkv process."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        f"import socket\nsocket.gethostname = lambda: {LONG_HOST!r}\n"
    )
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def test_the_longest_prompt_is_written_on_a_host_with_a_64_character_name(tmp_path, work):
    env = _long_host_env(tmp_path)
    probe = subprocess.run(
        [sys.executable, "-c", "import socket; print(socket.gethostname())"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=900,
    )
    assert probe.stdout.strip() == LONG_HOST  # the hook is active in child processes
    longest = "é" * (MAX_PROMPT_BYTES // 2) + "a" * (MAX_PROMPT_BYTES % 2)  # bytes, not chars
    assert len(longest.encode()) == MAX_PROMPT_BYTES
    flags = [*FREE_TEXT["self-forcing"], "--num-chunks", "1", "--steps", "1"]
    r = run("generate", *flags, "--prompt", longest, "--out", "out", cwd=work, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    videos = work / "out" / "videos" / "reference"
    for suffix in (".mkv", ".mp4", ".json"):
        assert (videos / f"{longest}-0{suffix}").is_file(), suffix
    assert not [p for p in videos.iterdir() if p.name.startswith(".")]  # no temp file left
    too_long = run("generate", *flags, "--prompt", longest + "a", "--out", "o2", cwd=work, env=env)
    assert too_long.returncode == 2 and len(too_long.stderr.splitlines()) == 1, too_long.stderr
    assert f"> {MAX_PROMPT_BYTES}" in too_long.stderr and not (work / "o2").exists()


# --- item 13: option values are typed and bounded ---------------------------------------------


def test_option_values_are_usage_errors_naming_the_option_and_its_range(work):
    quarot = ["generate", "-q", "quarot", "-b", "2", *TINY]
    seed_range = "quarot.seed must be an integer in 0..4294967295"
    cases = [
        ([*quarot, "-M", "quarot.seed=abc"], [seed_range, "'abc'"]),
        ([*quarot, "-M", "quarot.seed=nan"], [seed_range, "'nan'"]),
        ([*quarot, "-M", "quarot.seed=1e400"], [seed_range, "'1e400'"]),
        ([*quarot, "-M", "quarot.seed=-1"], [seed_range]),
        ([*quarot, "-M", "quarot.seed=1.0"], [seed_range]),
        ([*quarot, "-M", "quarot.block_size=0"], ["quarot.block_size must be a power of two"]),
        ([*quarot, "-M", "quarot.block_size=24"], ["power of two in 2..4096"]),
        ([*quarot, "-M", "quarot.bits=4"], ["unknown quarot option 'bits'"]),
        (["generate", "-q", "quantwm", "-b", "2", "-M", "quantwm.rank=nan"], ["quantwm.rank"]),
        (["generate", "-q", "quantwm-qsac", "-b", "2", "-M", "quantwm-qsac.rank=4"], ["use rank"]),
        (["generate", "-q", "kivi", "-b", "2", "-M", "kivi.residual=-32"], ["0..1048576"]),
        (["generate", "-q", "qvg", "-b", "2", "-M", "qvg.centroids=257"], ["1..256"]),
        (["quantize-eval", "-M", "quarot.seed=abc"], [seed_range]),
        (
            ["generate", "--pruner", "forcing-kv", "-M", "forcing-kv.sim_retention_ratio=true"],
            ["forcing-kv.sim_retention_ratio must be a number in [0, 1]", "'true'"],
        ),
        (
            ["generate", "--pruner", "forcing-kv", "-M", "forcing-kv.num_frame_patch=0"],
            ["1..65536"],
        ),
        (["generate", "--pruner", "forcing-kv", "-M", "forcing-kv.ar_start=x"], ["ar_start"]),
        (
            ["generate", "--pruner", "forcing-kv-history", "-M", "forcing-kv-history.segments=0"],
            ["1..65536"],
        ),
        (
            ["generate", "--pruner", "forcing-kv", "-M", f"forcing-kv.profile_sha256={'0' * 64}"],
            ["unknown forcing-kv option 'profile_sha256'"],
        ),
        (
            ["generate", "--pruner", "flowcache", "-M", "flowcache.kernel_size=4"],
            ["flowcache.kernel_size must be odd, got 4"],
        ),
        (
            ["generate", "--pruner", "flowcache-corrected", "-M", "flowcache-corrected.preset=x"],
            ["flowcache-corrected.preset must be one of magi1, vbench, physicsiq, skyreels-v2"],
        ),
        (["generate", "--window", "0", *TINY], ["tiny: window must be an integer in 1..1024"]),
        (["generate", "--window", "-1", *TINY], ["--window"]),
        (["generate", "--num-chunks", "1000000000"], ["tiny: num_chunks", "1..1024"]),
        (["generate", "--steps", "1000000"], ["tiny: steps must be an integer in 1..1000"]),
        (["generate", "-o", "ctx_noise=1", *TINY], ["ctx_noise must be a number in [0, 1)"]),
        (["generate", "-o", "steps=abc"], ["tiny: steps", "'abc'"]),
        (["generate", "-o", "colour=red"], ["unknown tiny option 'colour'"]),
        (
            ["generate", *FREE_TEXT["self-forcing"], "--prompt", "x", "--num-chunks", "1000000000"],
            ["self-forcing: num_chunks must be an integer in 1..1024"],
        ),
        (
            ["generate", *FREE_TEXT["self-forcing"], "--prompt", "x", "--num-chunks", "20"],
            ["rotary table", "1..10"],
        ),
        (
            ["generate", *FREE_TEXT["skyreels-v2"], "--prompt", "x", "-o", "guidance=nan"],
            ["skyreels-v2: guidance must be a number in [0, 100]"],
        ),
        (
            ["generate", *FREE_TEXT["magi1"], "--prompt", "x", "--steps", "1000000"],
            ["magi1: steps must be an integer in 1..1000"],
        ),
        (
            ["generate", *FREE_TEXT["magi1"], "--prompt", "x", "-o", "offload=maybe"],
            ["magi1: offload must be true or false"],
        ),
    ]
    check_refusals([([*a, "--out", "out"], 2, n) for a, n in cases], work)


# --- item 14: files a user names are read safely ----------------------------------------------


def test_user_named_json_files_are_regular_bounded_and_flat_enough(work, inputs):
    pruned = ["generate", "--pruner", "forcing-kv", "--out", "out", "-M"]
    cases = []
    for name, why in (
        ("fifo", "not a regular file (a FIFO)"),
        ("deep.json", "nested too deeply"),
        ("huge.json", "larger than 64 MiB"),
        ("nan.json", "NaN is not a JSON number"),
    ):
        path = inputs / name
        cases.append(([*pruned, f"forcing-kv.profile={path}"], 2, [str(path), why]))
        if name != "nan.json":  # a baseline checks its own values, the manifest its fields
            cases.append((["report", work / "norun", "--baseline", path], 1, [str(path), why]))
            manifest = {"JBKV_WEIGHTS_MANIFEST": str(path)}
            cases.append((["weights", "status"], 1, [str(path), why], manifest))
    dev_zero = "/dev/zero"
    cases.append(([*pruned, f"forcing-kv.profile={dev_zero}"], 2, ["a character device"]))
    cases.append((["report", "norun", "--baseline", dev_zero], 1, ["a character device"]))
    check_refusals(cases, work)
