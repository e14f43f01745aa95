"""``jbkv convert-checkpoint``: it never writes onto its input nor over a file it did not write,
writes atomically (no temp file after Ctrl-C or SIGTERM, modes follow the umask), and hostile
pickles are one line naming what they wanted. (An interrupted conversion:
``tests/cli/test_cli_contract.py``; a full disk: ``tests/run/test_fault_injection.py``.)

Special files and the umask go through the installed ``jbkv`` (a new process, with a timeout
should it read a FIFO); the rest runs in this process (``tests/installed.py``'s
``run_in_process``: a conversion answers from its arguments and files), each test with one case
through the installed ``jbkv`` as well, which must answer byte for byte the same.
"""

from __future__ import annotations

import collections
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from jbkv_cli.utils import atomic
from tests.installed import run_in_process, run_jbkv

pytestmark = pytest.mark.slow


def convert(*args: object, cwd: Path, umask: int | None = None) -> subprocess.CompletedProcess:
    return run_jbkv(
        "convert-checkpoint",
        *args,
        cwd=cwd,
        preexec_fn=None if umask is None else (lambda: os.umask(umask)),
    )


def here(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    """:func:`convert` in this process."""
    return run_in_process("convert-checkpoint", *args, cwd=cwd)


def same(r: subprocess.CompletedProcess, *args: object, cwd: Path) -> None:
    """``r`` (:func:`here`'s) is what the installed ``jbkv`` answers to ``args``."""
    there = convert(*args, cwd=cwd)
    assert (r.returncode, r.stdout, r.stderr) == (there.returncode, there.stdout, there.stderr)


def one_error(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def _generator_pt(path: Path) -> dict[str, torch.Tensor]:
    state = {"model.patch_embedding.bias": torch.arange(4.0)}
    torch.save({"generator": state, "generator_ema": state}, path)
    return state


def _files(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file of ``folder``: inode, mtime and bytes (symlinks by their target's)."""
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def test_dst_that_is_src_is_refused_before_anything_is_written(tmp_path):
    """No DST for a .safetensors SRC, DST = SRC, a symlink to SRC, a hard link of SRC."""
    _generator_pt(tmp_path / "g.pt")
    assert here("g.pt", cwd=tmp_path).returncode == 0  # g.safetensors, written by jbkv
    (tmp_path / "link.safetensors").symlink_to("g.safetensors")
    os.link(tmp_path / "g.safetensors", tmp_path / "hard.safetensors")
    (tmp_path / "sub").symlink_to(".")
    before = _files(tmp_path)
    cases = [
        ("g.safetensors",),
        ("g.safetensors", "g.safetensors"),
        ("g.safetensors", "./sub/g.safetensors"),
        ("g.safetensors", "link.safetensors"),
        ("g.safetensors", "hard.safetensors"),
        ("link.safetensors", "g.safetensors"),
    ]
    for case in cases:
        r = here(*case, cwd=tmp_path)
        assert r.returncode == 2, (case, r.stderr)
        assert "is the checkpoint being converted" in one_error(r), case
    same(r, *cases[-1], cwd=tmp_path)
    assert _files(tmp_path) == before


def test_a_file_it_did_not_write_is_not_overwritten(tmp_path):
    _generator_pt(tmp_path / "g.pt")
    theirs = tmp_path / "g.safetensors"
    theirs.write_bytes(b"someone else's file")
    r = here("g.pt", cwd=tmp_path)
    assert r.returncode == 2
    assert "was not written by convert-checkpoint" in one_error(r)
    same(r, "g.pt", cwd=tmp_path)
    assert theirs.read_bytes() == b"someone else's file"
    (tmp_path / "d.safetensors").mkdir()
    r = here("g.pt", "d.safetensors", cwd=tmp_path)
    assert r.returncode == 2 and "is not a regular file (a directory)" in one_error(r)
    theirs.unlink()
    assert here("g.pt", cwd=tmp_path).returncode == 0
    assert here("g.pt", "--no-ema", cwd=tmp_path).returncode == 0  # its own: rewritten


def test_a_source_that_is_not_a_regular_file_is_named_as_such(tmp_path):
    os.mkfifo(tmp_path / "fifo.pt")
    (tmp_path / "zero.pt").symlink_to("/dev/zero")
    for name, kind in (("fifo.pt", "a FIFO"), ("zero.pt", "a character device: /dev/zero")):
        r = convert(name, "out.safetensors", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert f"is not a regular file ({kind})" in one_error(r)
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664)])
def test_output_follows_the_umask(tmp_path, umask, mode):
    state = _generator_pt(tmp_path / "g.pt")
    r = convert("g.pt", cwd=tmp_path, umask=umask)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "g.safetensors"
    assert stat.S_IMODE(out.stat().st_mode) == mode
    assert torch.equal(load_file(str(out))["patch_embedding.bias"], *state.values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.pt", "g.safetensors"]


def test_a_killed_conversions_temp_file_is_removed_by_the_next(tmp_path):
    _generator_pt(tmp_path / "g.pt")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f".g.safetensors.~{atomic._HOST}~{dead.pid}~abc.tmp.safetensors"
    left.write_bytes(b"partial")
    other = tmp_path / f".other.json.~{atomic._HOST}~{dead.pid}~abc.tmp.json"  # not its own
    other.write_bytes(b"x")
    assert convert("g.pt", cwd=tmp_path).returncode == 0
    assert not left.exists() and other.exists()


class _Reduce:
    """Pickles as ``fn(*args)``: what a hostile checkpoint asks the unpickler to call."""

    def __init__(self, fn, args) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.mark.parametrize("fmt", ["torch.save", "pickle"])
def test_hostile_pickles_are_one_line_naming_what_they_wanted(tmp_path, fmt):
    """In this process; torch.save's first through the installed ``jbkv`` as well."""
    marker = tmp_path / "pwned"
    payloads = {
        "system.pt": _Reduce(os.system, (f"touch {marker}",)),
        "odict.pt": _Reduce(collections.OrderedDict, (5,)),
    }
    for name, obj in payloads.items():
        if fmt == "torch.save":
            torch.save(obj, tmp_path / name)
        else:
            (tmp_path / name).write_bytes(pickle.dumps(obj, protocol=2))
    r = here("system.pt", "a.safetensors", cwd=tmp_path)
    assert r.returncode == 1
    line = one_error(r)
    assert "system.pt needs pickle code to load (it asks for posix.system)" in line, line
    if fmt == "torch.save":
        same(r, "system.pt", "a.safetensors", cwd=tmp_path)
    r = here("odict.pt", "b.safetensors", cwd=tmp_path)
    assert r.returncode == 1
    line = one_error(r)
    assert line.startswith("error: cannot read checkpoint odict.pt: TypeError"), line
    assert not marker.exists(), "pickle code ran"
    assert not list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob(".*"))
