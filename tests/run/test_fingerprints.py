"""Input fingerprints (jbkv_cli/run/fingerprints.py): SHA-256 of files streamed in blocks, the digest
cache (what it trusts, what it refuses to trust, what it never touches), folders expanded by
role, and the phrases that name what changed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from jbkv_cli.models.cases import Case
from jbkv_cli.run import fingerprints as fp
from jbkv_cli.run.directory import RunDir
from jbkv_cli.utils.errors import JbkvError

BIG = fp.CACHED_MIN_BYTES + 12_345  # cached, and not a whole number of read blocks


@pytest.fixture(autouse=True)
def cache_here(tmp_path, monkeypatch):
    monkeypatch.setenv(fp.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The paths the hasher reads (each call of ``_hash_open``)."""
    seen: list[str] = []
    real = fp._hash_open

    def counting(path):
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(fp, "_hash_open", counting)
    return seen


@pytest.fixture
def settled(monkeypatch):
    """Files count as written long before they are hashed (the racy rule is tested apart)."""
    monkeypatch.setattr(fp, "RACY_NS", -(10**18))


def _write(path: Path, size: int, byte: int) -> Path:
    path.write_bytes(bytes([byte]) * size)
    return path


def _next_tick(path: Path) -> None:
    """Return once the kernel's file clock has moved past ``path``'s ctime (a probe file is
    touched until its ctime differs), so a write now gets a later ctime: an event, not a sleep."""
    probe = path.with_name(".tick")
    then = path.stat().st_ctime_ns
    for _ in range(10**7):
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > then:
            return
    raise AssertionError("the file clock did not move")


def test_the_digest_is_the_sha256_of_the_whole_file(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(os.urandom(BIG))
    assert fp.sha256_files([path]) == [hashlib.sha256(path.read_bytes()).hexdigest()]


def test_a_large_file_is_read_once_then_its_cached_digest_is_used(tmp_path, reads, settled):
    path = _write(tmp_path / "w.bin", BIG, 1)
    first = fp.sha256_files([path])
    assert fp.sha256_files([path]) == first and reads == [str(path)]
    cache = json.loads((tmp_path / "cache" / fp.CACHE_FILE).read_text())
    assert cache["kind"] == fp.CACHE_KIND and list(cache["entries"]) == [str(path.resolve())]


def test_a_same_size_rewrite_with_its_mtime_restored_is_read_again(tmp_path, reads, settled):
    """The issue's trap: size and mtime kept, content changed. ctime (set by every write, not
    settable by the writer) and the inode are in the key, so the cached digest is not used."""
    path = _write(tmp_path / "w.bin", BIG, 1)
    old = path.stat()
    first = fp.sha256_files([path])[0]
    _next_tick(path)
    with path.open("r+b") as f:  # in place: same inode
        f.write(b"\x02")
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (old.st_size, old.st_mtime_ns, old.st_ino)
    second = fp.sha256_files([path])[0]
    assert second != first and second == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(reads) == 2


def test_a_replaced_file_is_read_again(tmp_path, reads, settled):
    path = _write(tmp_path / "w.bin", BIG, 1)
    fp.sha256_files([path])
    _write(tmp_path / "new.bin", BIG, 3).replace(path)  # a new inode at the same path
    assert fp.sha256_files([path]) == [hashlib.sha256(path.read_bytes()).hexdigest()]


def test_a_file_written_just_now_is_not_cached(tmp_path, reads):
    """git's racy rule: a second write in the same clock tick would keep the stamp."""
    path = _write(tmp_path / "w.bin", BIG, 1)
    fp.sha256_files([path])
    fp.sha256_files([path])
    assert len(reads) == 2 and not (tmp_path / "cache" / fp.CACHE_FILE).exists()


def test_small_files_are_hashed_every_time(tmp_path, reads, settled):
    path = _write(tmp_path / "pose.json", 100, 1)
    fp.sha256_files([path])
    fp.sha256_files([path])
    assert len(reads) == 2


def test_a_foreign_file_at_the_cache_path_is_neither_used_nor_replaced(tmp_path, reads, settled):
    foreign = tmp_path / "cache" / fp.CACHE_FILE
    foreign.parent.mkdir()
    foreign.write_text('{"someone": "else"}')
    path = _write(tmp_path / "w.bin", BIG, 1)
    fp.sha256_files([path])
    fp.sha256_files([path])
    assert len(reads) == 2 and foreign.read_text() == '{"someone": "else"}'


@pytest.mark.parametrize("content", [b"{not json", b'{"kind": "jbkv file digests", "entries": 3}'])
def test_a_damaged_cache_is_ignored(tmp_path, settled, content, monkeypatch):
    cache = tmp_path / "cache" / fp.CACHE_FILE
    cache.parent.mkdir()
    cache.write_bytes(content)
    path = _write(tmp_path / "w.bin", BIG, 1)
    assert fp.sha256_files([path]) == [hashlib.sha256(path.read_bytes()).hexdigest()]


def test_an_unwritable_cache_folder_only_means_no_cache(tmp_path, settled, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv(fp.CACHE_ENV, str(blocker))
    path = _write(tmp_path / "w.bin", BIG, 1)
    assert fp.sha256_files([path]) == [hashlib.sha256(path.read_bytes()).hexdigest()]
    assert blocker.read_text() == "x"


def test_a_fifo_is_named_not_read(tmp_path):
    fifo = tmp_path / "weights.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(JbkvError, match=f"cannot read {fifo}: not a regular file"):
        fp.sha256_files([fifo])


def test_folders_expand_to_their_visible_files_by_role(tmp_path):
    (tmp_path / "vae" / "sub").mkdir(parents=True)
    (tmp_path / "vae" / ".cache").mkdir()
    for name in ("config.json", "sub/w.safetensors", ".cache/lock", ".hidden"):
        (tmp_path / "vae" / name).write_text(name)
    (tmp_path / "gen.pt").write_text("g")
    files = fp.expand({"vae": tmp_path / "vae", "generator": tmp_path / "gen.pt", "lora": None})
    assert files == {
        "vae/config.json": tmp_path / "vae" / "config.json",
        "vae/sub/w.safetensors": tmp_path / "vae" / "sub" / "w.safetensors",
        "generator": tmp_path / "gen.pt",
    }


def test_a_change_names_the_file(tmp_path):
    a, b = _write(tmp_path / "a", 10, 1), _write(tmp_path / "b", 10, 2)
    then = fp.fingerprint({"dit": a, "vae": b})
    assert fp.change(then, fp.fingerprint({"dit": a, "vae": b})) is None
    _write(b, 10, 3)
    assert fp.change(then, fp.fingerprint({"dit": a, "vae": b})).startswith(
        f"{b} has changed since the run used it (SHA-256 "
    )
    assert "is not read now" in fp.change(then, fp.fingerprint({"dit": a}))
    assert "was not when" in fp.change(fp.fingerprint({"dit": a}), then)


def test_a_case_file_replaced_while_the_run_goes_on_is_refused_before_its_next_video(tmp_path):
    """Each video checks its case's files against the digests the run kept (a file replaced
    after the run began would otherwise make some videos of the old file, some of the new)."""
    image, pose = _write(tmp_path / "1.png", 50, 1), _write(tmp_path / "p.json", 50, 2)
    case = fp.with_digests(Case("a room", str(image), str(pose), "c1"))
    assert set(case.sha256) == {"image", "trajectory"}
    run = RunDir.create_or_resume(tmp_path / "run", "hy-worldplay", {"dtype": "float32"}, {})
    run.register([case], [0])
    kept = run.case("c1")
    run.check_case_files(kept)
    _write(pose, 50, 3)
    with pytest.raises(JbkvError, match=f"{pose} \\(pose or actions file of case 'c1'\\)"):
        run.check_case_files(kept)
