"""Atomic writes: file modes follow the umask, killed writers' temp files are cleaned on resume,
and output folders are checked before long work (jbkv_cli/utils/atomic.py)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from jbkv_cli.utils import atomic
from jbkv_cli.utils.atomic import (
    check_writable_dir,
    check_writable_file,
    is_temp,
    remove_stale_temps,
    write_text_atomic,
)
from jbkv_cli.utils.errors import JbkvError, UsageError


def test_finished_files_follow_the_umask_not_mkstemp(tmp_path):
    code = (
        "import os, sys; os.umask(int(sys.argv[2], 8)); "
        "from jbkv_cli.utils.atomic import write_text_atomic; write_text_atomic(sys.argv[1], 'x')"
    )
    for umask, want in (("022", 0o644), ("002", 0o664), ("077", 0o600)):
        path = tmp_path / f"f{umask}.txt"
        subprocess.run([sys.executable, "-c", code, str(path), umask], check=True, timeout=900)
        assert stat.S_IMODE(path.stat().st_mode) == want, umask


def test_temp_names_identify_their_writer(tmp_path):
    seen = []
    with atomic.atomic_path(tmp_path / "v.mkv") as tmp:
        seen.append(tmp)
        assert is_temp(tmp) and tmp.name.startswith(".v.mkv.~") and tmp.suffix == ".mkv"
        assert f"~{os.getpid()}~" in tmp.name
    assert not seen[0].exists()
    assert not is_temp(tmp_path / "v.mkv") and not is_temp(tmp_path / ".hidden")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temps_are_removed_and_live_ones_kept(tmp_path):
    host = atomic._HOST
    dead = tmp_path / "videos" / "bf16" / f".a-0.mkv.~{host}~{_dead_pid()}~abc.tmp.mkv"
    live = tmp_path / f".a-0.json.~{host}~{os.getpid()}~def.tmp.json"
    other_old = tmp_path / ".a-1.mp4.~otherhost~123~ghi.tmp.mp4"
    other_new = tmp_path / ".a-2.mp4.~otherhost~123~jkl.tmp.mp4"
    mine = tmp_path / ".notes.txt"
    for p in (dead, live, other_old, other_new, mine):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")
    old = time.time() - 2 * atomic.STALE_OTHER_HOST_SECONDS
    os.utime(other_old, (old, old))
    assert remove_stale_temps(tmp_path) == 2
    assert not dead.exists() and not other_old.exists()
    assert live.exists() and other_new.exists() and mine.exists()


def test_write_failure_is_one_line_naming_the_file(tmp_path, monkeypatch):
    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "_fsync", full)
    target = tmp_path / "report" / "results.json"
    with pytest.raises(JbkvError, match=r"cannot write .*results.json: No space left on device"):
        write_text_atomic(target, "{}")
    assert list(target.parent.iterdir()) == []


def test_writable_checks_create_nothing(tmp_path):
    check_writable_dir(tmp_path / "a" / "b", "--out")
    check_writable_file(tmp_path / "x" / "r.json", "--json")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is not a directory"):
        check_writable_dir(tmp_path / "file" / "sub", "--out")
    with pytest.raises(UsageError, match="is a directory"):
        check_writable_file(tmp_path, "--json")


def test_read_only_folder_is_refused_before_work(tmp_path, monkeypatch):
    import tempfile

    def read_only(*_a, **_k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(JbkvError, match=r"cannot write --json .*Read-only file system"):
        check_writable_file(tmp_path / "r.json", "--json")


def test_stale_temps_of_one_target_are_removed_and_nothing_else(tmp_path):
    """What ``convert-checkpoint`` runs before writing: only its own target's leftovers go."""
    from jbkv_cli.utils.atomic import remove_stale_temps_of

    host, dead = atomic._HOST, _dead_pid()
    target = tmp_path / "g[1].safetensors"  # glob characters in the name are taken literally
    stale = tmp_path / f".g[1].safetensors.~{host}~{dead}~abc.tmp.safetensors"
    live = tmp_path / f".g[1].safetensors.~{host}~{os.getpid()}~def.tmp.safetensors"
    other = tmp_path / f".g1.safetensors.~{host}~{dead}~ghi.tmp.safetensors"
    nested = tmp_path / "sub" / f".g[1].safetensors.~{host}~{dead}~jkl.tmp.safetensors"
    for p in (stale, live, other, nested):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")
    assert remove_stale_temps_of(target) == 1
    assert not stale.exists() and live.exists() and other.exists() and nested.exists()
    assert remove_stale_temps_of(tmp_path / "nowhere" / "x.safetensors") == 0


def test_a_pause_point_waits_for_a_signal_then_goes_on(tmp_path):
    """The test seam of jbkv_cli/utils/lifecycle.py (deterministic signal tests): at the named point
    the process writes the file and waits; a start-up-mode signal ends the wait."""
    code = (
        "import os, signal, sys\n"
        "from jbkv_cli.utils import lifecycle, atomic\n"
        "lifecycle.install()\n"
        "with atomic.atomic_path(sys.argv[1]) as tmp:\n"
        "    tmp.write_text('x')\n"
        "print(lifecycle.pending())\n"
    )
    mark, target = tmp_path / "mark", tmp_path / "out.txt"
    env = {**os.environ, "JBKV_TEST_PAUSE": "writing:out.*", "JBKV_TEST_PAUSE_FILE": str(mark)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(target)], env=env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 900
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mark.read_text() == "writing\n" and not target.exists()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0 and out == f"{int(signal.SIGTERM)}\n"  # noted, not raised
    assert target.read_text() == "x"
