"""The CLI contract through the installed ``jbkv`` entry point, in subprocesses.

``CliRunner`` hides exit-code and entry-point bugs (it catches ``SystemExit`` itself), so here
every case runs the real console script: ``--help`` exits 0 with nothing on stderr, usage errors
exit 2 and known failures exit 1 with exactly one line on stderr, Ctrl-C exits 130 with one line,
and a refused command leaves nothing behind. Cases run concurrently (each start-up imports torch).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import typer

from jbkv_cli.cli import _click_classes

JBKV = str(Path(sys.executable).with_name("jbkv"))
TINY = ["--num-chunks", "2", "--steps", "1"]


def run(
    *args: object, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "120"}
    env.pop("JBKV_DEBUG", None)
    return subprocess.run(
        [JBKV, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def run_all(cases: list[tuple], cwd: Path) -> list[subprocess.CompletedProcess]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: run(*args, cwd=cwd), cases))


def interruptible(argv: list[str], cwd: Path) -> subprocess.Popen:
    """Start ``argv`` with SIGINT at its default (a shell's background job inherits it ignored,
    and Python keeps an ignored SIGINT ignored)."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_entry_point_is_installed():
    assert Path(JBKV).is_file(), "install jbkv (pip install -e .) to get the console script"


HELP = [
    (),
    ("generate",),
    ("quantize-eval",),
    ("fidelity",),
    ("report",),
    ("vbench",),
    ("vbench", "setup"),
    ("vbench", "status"),
    ("vbench", "run"),
    ("attention-demo",),
    ("weights",),
    ("weights", "status"),
    ("weights", "fetch"),
    ("convert-checkpoint",),
]


def test_every_help_exits_0_with_empty_stderr(tmp_path):
    results = run_all([(*c, "--help") for c in HELP], tmp_path)
    for case, r in zip(HELP, results, strict=True):
        assert r.returncode == 0, (case, r.stderr)
        assert r.stderr == "", (case, r.stderr)
        assert "Usage" in r.stdout, case


USAGE = [
    ("generate", "--bits", "abc"),
    ("generate", "--bits", "5"),
    ("generate", "--steps", "0"),
    ("generate", "--correction", "foo"),
    ("generate", "--quantizer", "nope"),
    ("generate", "--bogus"),
    ("generate", "--seeds", "x"),
    ("generate", "--seeds", "0-100000000"),
    ("generate", "--prompt", "a cat playing piano", *TINY),
    ("generate", "--prompt", "x" * 10_000, *TINY),
    ("generate", "--prompts", "no-such-set"),
    ("generate", "--prompts", "vbench-smoke", *TINY),
    ("generate", "-m", "nosuchmodel"),
    ("generate", "-o", "novalue"),
    ("quantize-eval", "--group-sizes", "0"),
    ("quantize-eval", "--bits", "2,5"),
    ("quantize-eval", "--quantizers", "rtn,zzz"),
    ("quantize-eval", "--group-sizes", "48", *TINY),
    ("fidelity",),
    ("fidelity", "a", "b", "--min-psnr", "nan"),
    ("report", "r", "--tolerance", "psnr=nan"),
    ("report", "r", "--tolerance", "psnr=-1"),
    ("report", "r", "--format", "xml"),
    ("weights", "fetch", "nosuchfile"),
    ("nosuchcommand",),
]


def test_usage_errors_exit_2_with_one_line_and_leave_nothing(tmp_path):
    results = run_all([(*c, "--out", "out") if c[0] == "generate" else c for c in USAGE], tmp_path)
    for case, r in zip(USAGE, results, strict=True):
        assert r.returncode == 2, (case[:4], r.returncode, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (case[:4], r.stderr)
        assert len(lines[0]) < 400, (case[:4], lines[0][:100])
        assert "Traceback" not in r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused command created files"


def test_too_many_seeds_is_refused_at_once(tmp_path):
    start = time.perf_counter()
    r = run("generate", "--seeds", "0-100000000", "--out", "o", cwd=tmp_path)
    assert r.returncode == 2 and "100,000,001 seeds" in r.stderr
    assert time.perf_counter() - start < 60


def test_known_failures_exit_1_with_one_line(tmp_path):
    run_dir = tmp_path / "notarun"
    run_dir.mkdir()
    bad_manifest = tmp_path / "broken"
    bad_manifest.mkdir()
    (bad_manifest / "manifest.json").write_text('{"model": 3')
    cases = [
        ("report", run_dir),
        ("report", bad_manifest),
        ("fidelity", tmp_path / "nope1", tmp_path / "nope2"),
        ("generate", "--weights", tmp_path / "missing.safetensors", *TINY, "--out", "o"),
    ]
    for case, r in zip(cases, run_all(cases, tmp_path), strict=True):
        assert r.returncode == 1, (case, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr


def test_pickle_weights_are_refused_by_name(tmp_path):
    import torch

    pt = tmp_path / "w.pt"
    torch.save({"w": torch.zeros(2)}, pt)
    r = run("generate", "--weights", pt, *TINY, "--out", "o", cwd=tmp_path)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert "pickle" in r.stderr and str(pt) in r.stderr
    assert not (tmp_path / "o").exists()


def test_ctrl_c_during_start_up_is_one_line_exit_130(tmp_path):
    """SIGINT at several moments of start-up (imports take over a second): never a traceback,
    and an interrupted start-up is one line with exit 130. (A library may swallow an interrupt
    inside its own import, and a late signal may miss start-up: those runs just finish, or die of
    the signal while the interpreter shuts down, silently.) An interrupt inside torch's own import
    once aborted the process from C++ (signal 6): that is what the deferral in ``entry.py`` fixes."""
    codes = []
    for delay in (0.15, 0.4, 0.8, 1.2, 1.6):
        proc = interruptible([JBKV, "quantize-eval", "--help"], tmp_path)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        codes.append(proc.returncode)
        assert "Traceback" not in err
        if proc.returncode == 130:
            assert len(err.splitlines()) == 1 and "interrupted" in err, err
        else:
            assert proc.returncode in (0, -signal.SIGINT) and err == "", (
                delay,
                proc.returncode,
                err,
            )
    assert 130 in codes, codes


def test_ctrl_c_during_a_run_keeps_finished_videos(tmp_path):
    proc = interruptible(
        [JBKV, "generate", "--bits", "2", "--seeds", "0-40", *TINY, "--out", "o"], tmp_path
    )
    records = tmp_path / "o" / "videos" / "reference"
    deadline = time.time() + 90
    while time.time() < deadline and len(list(records.glob("*-*.json"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "interrupted" in lines[0]
    done = list(records.glob("*-*.json"))
    assert done, "finished videos were lost"
    for record in done:  # every finished record has its videos; no temp file is left
        assert record.with_suffix(".mkv").is_file() and record.with_suffix(".mp4").is_file()
    assert not [p for p in (tmp_path / "o").rglob(".*") if p.is_file()]


def test_failed_threshold_and_gate_print_no_extra_error_line(tmp_path):
    import torch

    from jbkv_cli.video import write_video_lossless

    frames = torch.zeros(4, 16, 16, 3, dtype=torch.uint8)
    for folder, value in (("ref", 0), ("test", 40)):
        write_video_lossless(tmp_path / folder / "v.mkv", frames + value, 8)
    r = run("fidelity", "ref", "test", "--no-lpips", "--min-psnr", "30", cwd=tmp_path)
    assert r.returncode == 1
    assert "Exit" not in r.stderr and "v: PSNR" in r.stderr


def test_typer_classes_are_the_ones_typer_raises():
    usage, base = _click_classes()
    assert issubclass(typer.BadParameter, usage) and issubclass(usage, base)
