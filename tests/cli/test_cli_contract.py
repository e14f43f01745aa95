"""The CLI contract through the installed ``jbkv`` entry point, in subprocesses.

``CliRunner`` hides exit-code and entry-point bugs (it catches ``SystemExit`` itself), so here
every case runs the real console script: ``--help`` exits 0 with nothing on stderr, usage errors
exit 2 and known failures exit 1 with exactly one line on stderr, Ctrl-C exits 130 with one line,
and a refused command leaves nothing behind. Cases run concurrently (each start-up imports torch).
The many usage errors run in this process (``run_in_process``: the same app, exit code and
streams), one of each kind through the installed script too, which must answer the same.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import typer

from jbkv_cli.cli.app import _click_classes
from tests.installed import JBKV, run_in_process, run_jbkv, run_refusal

pytestmark = pytest.mark.slow

TINY = ["--num-chunks", "2", "--steps", "1"]


def run(
    *args: object, cwd: Path | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    return run_jbkv(*args, cwd=cwd, columns=120, timeout=timeout)


def run_all(cases: list[tuple], cwd: Path) -> list[subprocess.CompletedProcess]:
    with ThreadPoolExecutor(max_workers=4) as pool:  # side by side (tests/warm_start.py)
        return list(pool.map(lambda args: run(*args, cwd=cwd), cases))


def _default_signals() -> None:
    """In the child: SIGINT, SIGTERM and SIGHUP at their defaults. A shell's background job
    inherits SIGINT ignored and a ``nohup`` run SIGHUP, and jbkv keeps an ignored signal ignored
    (as it should), so a test run started that way would wait for a signal that never lands."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def interruptible(argv: list[str], cwd: Path) -> subprocess.Popen:
    """Start ``argv`` with the interrupting signals at their defaults (:func:`_default_signals`)."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        preexec_fn=_default_signals,
    )


def test_entry_point_is_installed():
    assert Path(JBKV).is_file(), "install jbkv (pip install -e .) to get the console script"


# Every command's --help exits 0 with an empty stderr: tests/cli/test_startup.py (one interpreter
# for all of them, the console script for --help and --version).


def _reader_gone_at_once(args: tuple, cwd: Path) -> tuple[int, str]:
    """``jbkv ARGS`` with its stdout a pipe whose reader left before anything was written (what
    ``jbkv ARGS | head`` becomes once ``head`` has its lines): (exit code, stderr)."""
    env = {**os.environ, "COLUMNS": "120"}
    env.pop("JBKV_DEBUG", None)
    proc = subprocess.Popen(
        [JBKV, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=900), err


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A finished ``generate`` run (the reference, seed 0), which the report tests read
    (without --plots or --score: nothing is written into it)."""
    cwd = tmp_path_factory.mktemp("small-run")
    made = run("generate", "--seeds", "0", *TINY, "--out", "r", cwd=cwd)
    assert made.returncode == 0, made.stderr
    return cwd / "r"


def test_a_reader_that_leaves_early_is_not_a_failure(small_run, tmp_path):
    """``jbkv --help | head``: exit 0 and nothing on stderr. Rich's help screens and tables
    exited 1 on the broken pipe, and ``report --format json`` (click's echo) printed
    ``error: BrokenPipeError``."""
    cases = [
        ("--help",),
        ("llm-prefill", "--help"),
        ("--version",),
        ("report", small_run, "--format", "json"),
        ("report", small_run, "--format", "table"),
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: _reader_gone_at_once(c, tmp_path), cases))
    for case, (code, err) in zip(cases, results, strict=True):
        assert code == 0, (case, code, err)
        assert "error" not in err and "Broken" not in err, (case, err)
        if "--help" in case or "--version" in case:
            assert err == "", (case, err)


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


# one usage error of each kind through the installed jbkv too (a click error, one checked
# before the library loads, one after it, an unknown command): each must answer as in process
INSTALLED_USAGE = (0, 5, 8, 17, len(USAGE) - 1)


def test_usage_errors_exit_2_with_one_line_and_leave_nothing(tmp_path):
    """Every case in this process (the same app, exit code and streams: ``run_in_process``),
    the kinds in :data:`INSTALLED_USAGE` through the installed ``jbkv`` as well."""
    cases = [(*c, "--out", "out") if c[0] == "generate" else c for c in USAGE]
    results = [run_in_process(*c, cwd=tmp_path, columns=120) for c in cases]
    installed = run_all([cases[i] for i in INSTALLED_USAGE], tmp_path)
    for i, r in zip(INSTALLED_USAGE, installed, strict=True):
        assert (r.returncode, r.stdout, r.stderr) == (
            results[i].returncode,
            results[i].stdout,
            results[i].stderr,
        ), USAGE[i][:4]
    for case, r in zip(USAGE, results, strict=True):
        assert r.returncode == 2, (case[:4], r.returncode, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (case[:4], r.stderr)
        assert len(lines[0]) < 400, (case[:4], lines[0][:100])
        assert "Traceback" not in r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused command created files"


def test_too_many_seeds_is_refused_without_listing_them(tmp_path):
    tracemalloc.start()
    try:
        r = run_refusal(
            "generate", "--seeds", "0-100000000", "--out", "o", cwd=tmp_path, installed=True
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.returncode == 2 and "100,000,001 seeds" in r.stderr
    assert not (tmp_path / "o").exists()
    assert peak < 64 * 2**20  # 10^8 seeds in a list take gigabytes


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


def interrupt_at(
    point: str, signum: int, argv: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``jbkv argv`` until it reaches ``point`` (``JBKV_TEST_PAUSE``: it writes a file
    there and waits), then send ``signum``; return (exit code, stdout, stderr). Synchronised on
    the file, never on a sleep: the signal lands at that point however busy the machine is."""
    marks = cwd.parent / f"{cwd.name}-marks"
    marks.mkdir(exist_ok=True)
    mark = marks / f"{point.replace(':', '-').replace('*', '')}-{signum}"
    env = {**os.environ, **(env or {}), "JBKV_TEST_PAUSE": point, "JBKV_TEST_PAUSE_FILE": str(mark)}
    env.pop("JBKV_DEBUG", None)
    proc = subprocess.Popen(
        [JBKV, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
        preexec_fn=_default_signals,
    )
    deadline = time.monotonic() + 900
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    reached = mark.exists()
    if reached:
        proc.send_signal(signum)
    else:
        proc.kill()
    out, err = proc.communicate(timeout=900)
    assert reached, f"never reached {point}: rc {proc.returncode}, {err[-500:]}"
    return proc.returncode, out, err


# importing the CLI; its imports done; the command starting; the command importing torch
POINTS = ("start-up", "imported", "command", "importing")
DEMO = ["attention-demo", "--cached", "8", "--current", "4"]


def _signals_at_every_point(tmp_path: Path, signums: list[int]) -> None:
    cases = [(point, signum) for signum in signums for point in POINTS]
    cwd = tmp_path / "work"
    cwd.mkdir()
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: interrupt_at(c[0], c[1], DEMO, cwd), cases))
    for (point, signum), (code, out, err) in zip(cases, results, strict=True):
        name = signal.Signals(signum).name
        assert code == 128 + signum, (point, name, code, err)
        assert out == "", (point, name, out)
        assert len(err.splitlines()) == 1 and err.startswith(f"error: interrupted ({name})"), (
            point,
            err,
        )
        if point == "start-up":
            assert "during start-up; nothing was written" in err
    assert list(cwd.iterdir()) == [], "an interrupted start-up created files"


def test_ctrl_c_during_start_up_is_one_line_exit_130(tmp_path):
    """SIGINT while the CLI's imports run, right after them, as the command starts and while
    the command imports torch (an interrupt raised inside torch's import aborted the process
    from C++, so the handler only notes it then): one line, exit 130, never a traceback. One
    handler is in place from the start to the exit, so there is no moment without it (the old
    handler was restored between the imports and the command)."""
    _signals_at_every_point(tmp_path, [signal.SIGINT])


def test_sigterm_and_sighup_are_ctrl_c_at_every_point(tmp_path):
    """What SLURM and Kubernetes send: one line, exit 143 (SIGTERM) or 129 (SIGHUP)."""
    _signals_at_every_point(tmp_path, [signal.SIGTERM, signal.SIGHUP])


def test_sigterm_while_a_video_is_written_leaves_no_temp_file(tmp_path):
    """The signal lands while the first .mkv's temp file exists: it is removed, the run keeps
    only complete videos, and the line says so."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    argv = ["generate", "--bits", "2", "--seeds", "0-1", *TINY, "--out", "o"]
    code, _, err = interrupt_at("writing:*.mkv", signal.SIGTERM, argv, cwd)
    assert code == 143, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert lines == [
        "error: interrupted (SIGTERM); completed files are kept, no partial file is left"
    ]
    assert "Traceback" not in err
    run = cwd / "o"
    assert not [p for p in run.rglob(".*") if p.is_file()], "the temp file was left"
    assert not list(run.rglob("*.mkv")), "the video being written was kept"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_conversion_leaves_no_temp_file(tmp_path, signum):
    """The signal lands while the output's temp file exists (``JBKV_TEST_PAUSE``): it is
    removed (the old code left a visible ``X.safetensors.tmp`` and claimed it was discarded)."""
    import torch

    cwd = tmp_path / "work"
    cwd.mkdir()
    torch.save({"generator": {"model.patch_embedding.bias": torch.zeros(4)}}, cwd / "g.pt")
    argv = ["convert-checkpoint", "g.pt", "out.safetensors"]
    code, _, err = interrupt_at("writing:out.safetensors", signum, argv, cwd)
    assert code == 128 + signum, err
    name = signal.Signals(signum).name
    assert err == (
        f"error: interrupted ({name}); completed files are kept, no partial file is left\n"
    )
    assert sorted(p.name for p in cwd.iterdir()) == ["g.pt"]


def test_start_up_under_a_memory_cap_is_one_line_exit_1(tmp_path):
    """``ulimit -v`` too low for torch's libraries: importing them fails (ImportError: failed
    to map segment) anywhere from about 50 MB to 2.9 GB of address space here; the command
    imports torch, and says so as start-up did (:class:`jbkv_cli.utils.lifecycle.StartUpFailed`). (Around 3 GB
    some caps end in C instead: std::bad_alloc aborts (rc 134), libgomp or OpenBLAS exit by
    themselves; nothing in Python can catch those.)"""
    import resource

    def capped(mib: int):
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))

        return limit

    for mib in (256, 1024):
        r = run_jbkv(*DEMO, cwd=tmp_path, preexec_fn=capped(mib))
        assert r.returncode == 1, (mib, r.returncode, r.stderr[-500:])
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: cannot start jbkv: "), (mib, lines)
        assert "ulimit -v" in lines[0] and len(lines[0]) < 400, lines[0]


def test_a_failing_import_of_the_cli_itself_is_one_line_exit_1(tmp_path):
    """The CLI starts without torch, so a memory cap now fails torch's import in the command
    (above); a failure in the CLI's own imports (here ``rich``'s, failed by a hook as a cap
    fails a library) is the same line, from the entry point."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import sys\n\n\n"
        "class Fail:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'rich':\n"
        "            raise ImportError('librich.so: failed to map segment from shared object')\n\n\n"
        "sys.meta_path.insert(0, Fail())\n"
    )
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    r = run_jbkv(*DEMO, cwd=tmp_path, env={"PYTHONPATH": path})
    assert r.returncode == 1, (r.returncode, r.stderr[-500:])
    assert r.stderr == (
        "error: cannot start jbkv: ImportError: librich.so: failed to map segment from shared "
        "object (out of memory: is a memory limit such as `ulimit -v` too low?)\n"
    )


def test_weights_that_are_not_regular_files_are_named_as_such(tmp_path):
    """A --weights symlink to /dev/zero, a FIFO or a directory: said what it is (reading would
    never end, or block), not "weights not found … train them"; nothing is created."""
    (tmp_path / "zero.safetensors").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.safetensors")
    (tmp_path / "dir.safetensors").mkdir()
    kinds = {"zero": "a character device: /dev/zero", "fifo": "a FIFO", "dir": "a directory"}
    cases = [("generate", "--weights", f"{k}.safetensors", *TINY, "--out", "o") for k in kinds]
    for kind, r in zip(kinds.values(), run_all(cases, tmp_path), strict=True):
        assert r.returncode == 1, (kind, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and f"is not a regular file ({kind})" in lines[0], lines
        assert "train" not in lines[0]
    assert not (tmp_path / "o").exists()


def test_report_under_torchrun_prints_on_rank_0_only(small_run, tmp_path):
    """``torchrun --nproc-per-node 2 -m jbkv_cli report RUN``: the table once, from rank 0
    (the environment torchrun sets is enough; ``report`` joins no process group)."""
    by_rank = []
    for rank in (0, 1):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
        r = run_jbkv("report", small_run, cwd=tmp_path, env={"COLUMNS": "120", **env})
        assert r.returncode == 0, (rank, r.stderr)
        by_rank.append(r)
    assert by_rank[0].stdout.count("variant") == 1, by_rank[0].stdout  # the table, once
    assert by_rank[1].stdout == "" and by_rank[1].stderr == ""


def test_ctrl_c_during_a_run_keeps_finished_videos(tmp_path):
    proc = interruptible(
        [JBKV, "generate", "--bits", "2", "--seeds", "0-40", *TINY, "--out", "o"], tmp_path
    )
    records = tmp_path / "o" / "videos" / "reference"
    deadline = time.time() + 90
    while time.time() < deadline and len(list(records.glob("*-*.json"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=900)
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

    from jbkv_cli.utils.video import write_video_lossless

    frames = torch.zeros(4, 16, 16, 3, dtype=torch.uint8)
    for folder, value in (("ref", 0), ("test", 40)):
        write_video_lossless(tmp_path / folder / "v.mkv", frames + value, 8)
    r = run("fidelity", "ref", "test", "--no-lpips", "--min-psnr", "30", cwd=tmp_path)
    assert r.returncode == 1
    assert "Exit" not in r.stderr and "v: PSNR" in r.stderr


def test_typer_classes_are_the_ones_typer_raises():
    usage, base = _click_classes()
    assert issubclass(typer.BadParameter, usage) and issubclass(usage, base)


def test_signals_are_ignored_after_the_last_exit_handler():
    """Python's finalization resets a Python handler to the default action, so a SIGTERM then
    (torchrun's agent signals every rank once one exits) killed a rank already leaving with 143
    (exit -15). After the last atexit handler, with the outcome decided, the signals are
    ignored; before the outcome is decided nothing changes."""
    code = (
        "import atexit, signal, sys\n"
        "from jbkv_cli.utils import lifecycle\n"
        "lifecycle.install()\n"
        "if sys.argv[1] == 'exit': lifecycle.finished(143)\n"
        "atexit._run_exitfuncs()\n"
        "print(*(signal.getsignal(s) is signal.SIG_IGN for s in lifecycle.SIGNALS))\n"
    )
    for mode, expected in (("exit", "True True True"), ("command", "False False False")):
        out = subprocess.run(
            [sys.executable, "-c", code, mode],
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=_default_signals,
            timeout=900,
        ).stdout.strip()
        assert out == expected, (mode, out)
