"""jbkv_cli.weights: manifest, resumable verified download, status — against a local server."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import pytest

from jbkv_cli.metrics import perceptual
from jbkv_cli.metrics.vbench_weights import WEIGHTS, cache_roots
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.weights import entry_status, fetch_entry, load_manifest, select
from jbkv_cli.weights.manifest import WeightEntry, resolve_mirror

PAYLOAD = bytes(range(256)) * 4099  # 1 MiB + a bit: more than one read block


def _roots(tmp_path: Path) -> dict[str, Path]:
    return cache_roots({"HOME": str(tmp_path / "home"), "TORCH_HOME": str(tmp_path / "torch")})


def _entry(url: str, **kw) -> WeightEntry:
    base = {
        "name": "blob",
        "group": "lpips",
        "used_by": "tests",
        "url": url,
        "root": "torch_hub",
        "path": "checkpoints/blob.pth",
        "sha256": hashlib.sha256(PAYLOAD).hexdigest(),
    }
    return WeightEntry(**{**base, **kw})


# --- the shipped manifest -----------------------------------------------------------------------


def test_shipped_manifest_loads_and_pins_only_what_is_published():
    entries = load_manifest()
    by_name = {e.name: e for e in entries}
    alex = by_name["alexnet"]
    assert alex.group == "lpips" and alex.url == perceptual.ALEXNET_URL
    assert alex.sha256 is None and alex.sha256_prefix == "7be5be79"  # torch.hub file-name suffix
    for name in ("clip-vit-b32", "clip-vit-l14"):  # openai-clip checks the URL's hash segment
        e = by_name[name]
        assert e.sha256 == urlparse(e.url).path.split("/")[-2]
    assert all(e.hash_source for e in entries)
    assert len({e.file_name for e in entries}) == len(entries)  # a flat mirror has no clashes


def test_alexnet_lands_where_lpips_looks(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    alex = select(load_manifest(), ["lpips"])
    assert [e.name for e in alex] == ["alexnet"]
    assert alex[0].destination() == perceptual.alexnet_checkpoint_path()


def test_every_downloadable_vbench_file_is_in_the_manifest(tmp_path):
    roots = _roots(tmp_path)
    provided = set()
    for e in select(load_manifest(), ["vbench"]):
        provided.update(str(p) for p in e.required_paths(roots))
        if e.unpack:
            provided.update(str(p.parent) for p in e.required_paths(roots))
    wanted = {
        str(roots[w.root] / w.path)
        for files in WEIGHTS.values()
        for w in files
        if w.root != "hf_hub"  # Hugging Face snapshots are not single files
    }
    assert wanted <= provided, sorted(wanted - provided)


def test_select_groups_names_and_unknown():
    entries = load_manifest()
    assert {e.group for e in select(entries, ["vbench"])} == {"vbench"}
    assert len(select(entries, ["all", "alexnet"])) == len(entries)
    with pytest.raises(ValueError, match="unknown target 'nope'"):
        select(entries, ["nope"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sha256": "abc"}, "sha256 must be 64"),
        ({"group": "other"}, "group must be one of"),
        ({"root": "nowhere"}, "root must be one of"),
        ({"url": "ftp://x/y"}, "url must be"),
        ({"path": "../../etc/passwd"}, "inside its root"),
        ({"surprise": 1}, "unknown field"),
        # item 2 of issue 22: absolute paths wrote outside every cache root
        ({"path": "/tmp/jbkv-escape/blob.pth"}, r"\(blob\): '/tmp/jbkv-escape/blob.pth' must be"),
        ({"path": "checkpoints/../../x.pth"}, "inside its root"),
        ({"path": ""}, "a file's path must name the file"),
        ({"unpack": "zip", "path": "", "provides": ["/etc/passwd"]}, "'/etc/passwd' must be"),
        ({"unpack": "zip", "path": "own", "provides": ["other/x"]}, "inside its folder 'own'"),
        ({"unpack": "zip", "path": "", "provides": ["."]}, "not the root"),
        ({"name": "../x"}, "name '../x' must be"),
        ({"mirror_name": "../../x.pth"}, "a single file name"),
        ({"path": 5}, "wrong type for path"),
        ({"provides": "abc"}, "wrong type for provides"),
        ({"size": True}, "wrong type for size"),
    ],
)
def test_bad_manifest_is_one_line_error(tmp_path, change, message):
    item = {**_entry("http://127.0.0.1:9/blob.pth").__dict__, "provides": [], **change}
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"files": [item]}))
    with pytest.raises(JbkvError, match=message) as exc:
        load_manifest(path)
    assert "\n" not in str(exc.value)


def test_mirror_must_be_a_url(monkeypatch):
    monkeypatch.setenv("JBKV_WEIGHTS_MIRROR", "http://127.0.0.1:1/m")
    assert resolve_mirror(None) == "http://127.0.0.1:1/m"
    assert resolve_mirror("file:///srv/w") == "file:///srv/w"
    with pytest.raises(ValueError, match="not an http"):
        resolve_mirror("/srv/weights")


# --- download -----------------------------------------------------------------------------------


def test_fetch_verifies_and_moves_into_place(tmp_path, local_server):
    (local_server.root / "blob.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth")
    seen = []
    path = fetch_entry(entry, roots, progress=lambda done, total: seen.append((done, total)))
    assert path == roots["torch_hub"] / "checkpoints" / "blob.pth"
    assert path.read_bytes() == PAYLOAD
    assert not entry.part_path(roots).exists()
    assert seen[-1] == (len(PAYLOAD), len(PAYLOAD))
    assert entry_status(entry, roots).state == "present"


def test_fetch_resumes_a_partial_download_with_a_range_request(tmp_path, local_server):
    (local_server.root / "blob.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth")
    part = entry.part_path(roots)
    part.parent.mkdir(parents=True)
    part.write_bytes(PAYLOAD[:300_000])
    status = entry_status(entry, roots)
    assert status.state == "partial" and "300000 bytes" in status.detail
    fetch_entry(entry, roots)
    assert entry.destination(roots).read_bytes() == PAYLOAD
    assert local_server.requests == [("/blob.pth", "bytes=300000-", 206)]


def test_fetch_restarts_when_the_server_ignores_ranges(tmp_path, local_server):
    local_server.ranges = False
    (local_server.root / "blob.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth")
    part = entry.part_path(roots)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"stale bytes from another file")
    fetch_entry(entry, roots)
    assert entry.destination(roots).read_bytes() == PAYLOAD
    assert local_server.requests == [("/blob.pth", "bytes=29-", 200)]


def test_a_complete_part_is_verified_without_downloading_again(tmp_path, local_server):
    (local_server.root / "blob.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth")
    entry.part_path(roots).parent.mkdir(parents=True)
    entry.part_path(roots).write_bytes(PAYLOAD)
    fetch_entry(entry, roots)
    assert entry.destination(roots).read_bytes() == PAYLOAD
    assert [status for _, _, status in local_server.requests] == [416]


@pytest.mark.parametrize(
    "pin",
    [
        {"sha256": "0" * 64},
        {"sha256": None, "sha256_prefix": "00000000"},
        {"sha256": None, "size": 12},
    ],
)
def test_mismatch_is_refused_and_deleted(tmp_path, local_server, pin):
    (local_server.root / "blob.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth", **pin)
    with pytest.raises(JbkvError, match=r"blob\.pth does not match its pin .*deleted it") as exc:
        fetch_entry(entry, roots)
    assert "\n" not in str(exc.value)
    assert not entry.destination(roots).exists()
    assert not entry.part_path(roots).exists()


def test_fetch_from_an_http_mirror(tmp_path, local_server):
    (local_server.root / "mirror").mkdir()
    (local_server.root / "mirror" / "blob.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry("http://127.0.0.1:9/upstream/path/blob.pth")  # never contacted
    fetch_entry(entry, roots, mirror=f"{local_server.url}/mirror/")
    assert entry.destination(roots).read_bytes() == PAYLOAD
    assert [path for path, _, _ in local_server.requests] == ["/mirror/blob.pth"]


def test_fetch_from_a_file_mirror(tmp_path):
    mirror = tmp_path / "airgap"
    mirror.mkdir()
    (mirror / "named.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry("http://127.0.0.1:9/blob.pth", mirror_name="named.pth")
    fetch_entry(entry, roots, mirror=mirror.as_uri())
    assert entry.destination(roots).read_bytes() == PAYLOAD


def test_http_and_connection_errors_name_the_url(tmp_path, local_server):
    roots = _roots(tmp_path)
    missing = _entry(f"{local_server.url}/missing.pth")
    with pytest.raises(
        JbkvError, match=rf"cannot download {local_server.url}/missing.pth: HTTP 404"
    ):
        fetch_entry(missing, roots)
    refused = _entry("http://127.0.0.1:9/blob.pth")  # discard port: nothing listens
    with pytest.raises(JbkvError, match=r"cannot download http://127\.0\.0\.1:9/blob\.pth: "):
        fetch_entry(refused, roots)
    assert not refused.destination(roots).exists()


def test_zip_entries_unpack_into_place(tmp_path, local_server):
    archive = local_server.root / "repo-main.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("repo-main/hubconf.py", "dependencies = []\n")
        zf.writestr("repo-main/models/net.py", "x = 1\n")
    roots = _roots(tmp_path)
    entry = _entry(
        f"{local_server.url}/repo-main.zip",
        sha256=hashlib.sha256(archive.read_bytes()).hexdigest(),
        path="owner_repo_main",
        unpack="zip",
        strip_components=1,
        provides=("owner_repo_main/hubconf.py",),
    )
    assert entry_status(entry, roots).state == "missing"
    dest = fetch_entry(entry, roots)
    assert (dest / "hubconf.py").is_file() and (dest / "models" / "net.py").is_file()
    assert entry_status(entry, roots).state == "present"
    assert not entry.part_path(roots).exists()
    assert [p.name for p in dest.iterdir() if p.name.startswith(".")] == []


def test_zip_that_does_not_provide_what_it_should_is_an_error(tmp_path, local_server):
    archive = local_server.root / "x.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("other.txt", "")
    entry = _entry(
        f"{local_server.url}/x.zip",
        sha256=None,
        path="x",
        unpack="zip",
        provides=("x/wanted.pth",),
    )
    roots = _roots(tmp_path)
    with pytest.raises(JbkvError, match=r"does not provide x/wanted\.pth"):
        fetch_entry(entry, roots)
    hub = roots["torch_hub"]
    assert sorted(p.name for p in hub.iterdir()) == []  # no folder, no .part, no staging


# --- status -------------------------------------------------------------------------------------


def test_status_states(tmp_path):
    roots = _roots(tmp_path)
    entry = _entry("http://127.0.0.1:9/blob.pth")
    assert entry_status(entry, roots).state == "missing"
    dest = entry.destination(roots)
    dest.parent.mkdir(parents=True)
    dest.write_bytes(PAYLOAD[:-1])
    status = entry_status(entry, roots)
    assert status.state == "corrupt" and "SHA-256" in status.detail
    assert entry_status(entry, roots, verify=False).state == "present"  # not hashed
    dest.write_bytes(PAYLOAD)
    assert entry_status(entry, roots).detail == "verified (sha256)"
    unpinned = _entry("http://127.0.0.1:9/blob.pth", sha256=None)
    assert entry_status(unpinned, roots).detail == "unverified: nothing pinned"


# --- archives create only their declared items (issue 22, item 1) -------------------------------


def _repo_zip(www: Path, files: dict[str, str], name: str = "repo-main.zip") -> WeightEntry:
    """A torch.hub-style branch archive (one top folder, stripped) and its entry."""
    with zipfile.ZipFile(www / name, "w") as zf:
        for rel, text in files.items():
            zf.writestr(f"repo-main/{rel}", text)
    return _entry(
        f"http://127.0.0.1:9/{name}",
        sha256=None,
        path="owner_repo_main",
        unpack="zip",
        strip_components=1,
        provides=("owner_repo_main/hubconf.py",),
    )


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".jbkv-unpack-"))


def test_a_repository_folder_is_replaced_whole_when_jbkv_unpacked_it(tmp_path, local_server):
    roots = _roots(tmp_path)
    entry = _repo_zip(local_server.root, {"hubconf.py": "v = 1\n", "old.py": ""})
    mirror = local_server.url
    dest = fetch_entry(entry, roots, mirror=mirror)
    assert sorted(p.name for p in dest.iterdir()) == ["hubconf.py", "old.py"]
    _repo_zip(local_server.root, {"hubconf.py": "v = 2\n"})
    fetch_entry(entry, roots, mirror=mirror)  # what --force does
    assert sorted(p.name for p in dest.iterdir()) == ["hubconf.py"]
    assert (dest / "hubconf.py").read_text() == "v = 2\n"
    assert _leftovers(roots["torch_hub"]) == []


def test_a_folder_jbkv_did_not_unpack_is_never_replaced(tmp_path, local_server):
    roots = _roots(tmp_path)
    entry = _repo_zip(local_server.root, {"hubconf.py": ""})
    theirs = entry.destination(roots)
    theirs.mkdir(parents=True)
    (theirs / "work.py").write_text("do not lose me\n")
    with pytest.raises(JbkvError, match="jbkv did not unpack it there") as exc:
        fetch_entry(entry, roots, mirror=local_server.url)
    assert "\n" not in str(exc.value)
    assert [p.name for p in theirs.iterdir()] == ["work.py"]
    assert local_server.requests == []  # refused before downloading anything


def test_a_damaged_record_only_makes_jbkv_refuse_more(tmp_path, local_server):
    roots = _roots(tmp_path)
    entry = _repo_zip(local_server.root, {"hubconf.py": ""})
    fetch_entry(entry, roots, mirror=local_server.url)
    entry.record_path(roots).write_text("{not json")
    with pytest.raises(JbkvError, match="jbkv did not unpack it there"):
        fetch_entry(entry, roots, mirror=local_server.url)
    assert (entry.destination(roots) / "hubconf.py").is_file()


@pytest.mark.parametrize(
    ("member", "message"),
    [("../evil.py", "unsafe member"), ("/abs/evil.py", "unsafe member")],
)
def test_unsafe_members_refuse_the_whole_archive(tmp_path, local_server, member, message):
    roots = _roots(tmp_path)
    entry = _repo_zip(local_server.root, {"hubconf.py": ""})
    with zipfile.ZipFile(local_server.root / "repo-main.zip", "a") as zf:
        zf.writestr(member, "boom")
    with pytest.raises(JbkvError, match=message):
        fetch_entry(entry, roots, mirror=local_server.url)
    hub = roots["torch_hub"]
    assert sorted(p.name for p in hub.iterdir()) == []  # no folder, no staging, no .part
    assert not (tmp_path / "evil.py").exists()


def test_a_broken_archive_is_one_line_and_leaves_nothing(tmp_path, local_server):
    roots = _roots(tmp_path)
    entry = _repo_zip(local_server.root, {"hubconf.py": ""})
    (local_server.root / "repo-main.zip").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(JbkvError, match=r"cannot unpack .*not a readable zip archive") as exc:
        fetch_entry(entry, roots, mirror=local_server.url)
    assert "\n" not in str(exc.value)
    assert sorted(p.name for p in roots["torch_hub"].iterdir()) == []


def test_ctrl_c_while_unpacking_moves_nothing_and_leaves_no_temp_folder(
    tmp_path, local_server, monkeypatch
):
    from jbkv_cli.weights import unpack

    roots = _roots(tmp_path)
    entry = _repo_zip(local_server.root, {"hubconf.py": "", "a.py": "", "b.py": ""})
    real = unpack._write_member
    calls = []

    def interrupted(*args):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(unpack, "_write_member", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch_entry(entry, roots, mirror=local_server.url)
    hub = roots["torch_hub"]
    assert _leftovers(hub) == [] and not entry.destination(roots).exists()
    assert not entry.record_path(roots).exists()


def test_members_outside_the_declared_items_are_ignored_with_a_warning(tmp_path, local_server):
    roots = _roots(tmp_path)
    with zipfile.ZipFile(local_server.root / "blob.zip", "w") as zf:
        zf.writestr("weights.pth", "w")
        zf.writestr("huggingface/README", "x")
        zf.writestr(".bashrc", "x")
    entry = _entry(
        f"{local_server.url}/blob.zip",
        sha256=None,
        root="home_cache",
        path="",
        unpack="zip",
        provides=("weights.pth",),
    )
    assert [p.name for p in entry.items(roots)] == ["weights.pth"]
    warnings: list[str] = []
    fetch_entry(entry, roots, warn=warnings.append)
    home = roots["home_cache"]
    assert sorted(p.name for p in home.iterdir()) == [".jbkv-blob.unpacked.json", "weights.pth"]
    assert len(warnings) == 1 and "ignored 2 archive member(s)" in warnings[0]
