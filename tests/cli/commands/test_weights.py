"""``jbkv weights status|fetch`` through the installed console script, against a local server."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.installed import run_jbkv

pytestmark = pytest.mark.slow

PAYLOAD = b"alexnet weights, for tests only\n" * 40_000


@pytest.fixture
def env(tmp_path: Path, local_server) -> dict[str, str]:
    """An environment whose caches live in tmp_path and whose manifest points at the server."""
    (local_server.root / "alexnet.pth").write_bytes(PAYLOAD)
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    files = [
        {
            "name": "alexnet",
            "group": "lpips",
            "used_by": "LPIPS",
            "url": f"{local_server.url}/alexnet.pth",
            "root": "torch_hub",
            "path": "checkpoints/alexnet.pth",
            "sha256": digest,
            "hash_source": "test",
        },
        {
            "name": "broken",
            "group": "vbench",
            "used_by": "a test of a mismatch",
            "url": f"{local_server.url}/alexnet.pth",
            "mirror_name": "broken.pth",
            "root": "vbench",
            "path": "broken.pth",
            "sha256": "0" * 64,
            "hash_source": "test",
        },
    ]
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"files": files}))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JBKV_", "TORCH_", "VBENCH_"))}
    return base | {
        "HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(tmp_path / "home" / ".cache"),
        "TORCH_HOME": str(tmp_path / "torch"),
        "JBKV_WEIGHTS_MANIFEST": str(manifest),
        "COLUMNS": "250",
    }


def jbkv(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run_jbkv("weights", *args, environ=env)


def test_status_then_fetch_lpips(env, tmp_path):
    before = jbkv(env, "status")
    assert before.returncode == 0, before.stderr
    assert "alexnet" in before.stdout and "missing" in before.stdout
    assert str(tmp_path / "torch" / "hub" / "checkpoints") in before.stdout.replace("\n", "")

    fetched = jbkv(env, "fetch", "lpips")
    assert fetched.returncode == 0, fetched.stderr
    target = tmp_path / "torch" / "hub" / "checkpoints" / "alexnet.pth"
    assert target.read_bytes() == PAYLOAD
    assert "sha256 checked" in fetched.stderr

    after = jbkv(env, "status", "lpips")
    assert after.returncode == 0 and "present" in after.stdout and "verified" in after.stdout
    again = jbkv(env, "fetch", "lpips")
    assert again.returncode == 0 and "present at" in again.stderr


def test_mismatch_exits_1_with_one_line_and_leaves_nothing(env, tmp_path):
    result = jbkv(env, "fetch", "broken")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not match its pin" in errors[0]
    assert not list((tmp_path / "home" / ".cache" / "vbench").glob("broken.pth*"))


def test_corrupt_file_is_reported_then_replaced(env, tmp_path):
    target = tmp_path / "torch" / "hub" / "checkpoints" / "alexnet.pth"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"truncated")
    status = jbkv(env, "status")
    assert status.returncode == 0 and "corrupt" in status.stdout
    fetched = jbkv(env, "fetch", "alexnet")
    assert fetched.returncode == 0 and "corrupt" in fetched.stderr
    assert target.read_bytes() == PAYLOAD


@pytest.mark.parametrize("how", ["option", "environment"])
def test_mirror(env, local_server, tmp_path, how):
    (local_server.root / "mirror").mkdir()
    (local_server.root / "mirror" / "alexnet.pth").write_bytes(PAYLOAD)
    (local_server.root / "alexnet.pth").unlink()  # upstream is gone: only the mirror has it
    mirror = f"{local_server.url}/mirror"
    if how == "option":
        result = jbkv(env, "fetch", "lpips", "--mirror", mirror)
    else:
        result = jbkv(env | {"JBKV_WEIGHTS_MIRROR": mirror}, "fetch", "lpips")
    assert result.returncode == 0, result.stderr
    assert [p for p, _, _ in local_server.requests] == ["/mirror/alexnet.pth"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fetch", "nonsense"], "unknown target 'nonsense'"),
        (["fetch", "lpips", "--mirror", "/no/scheme"], "--mirror"),
    ],
)
def test_usage_errors_exit_2(env, args, message):
    result = jbkv(env, *args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_network_error_names_the_url(env, tmp_path):
    result = jbkv(env, "fetch", "lpips", "--mirror", "http://127.0.0.1:9/m")
    assert result.returncode == 1
    assert "cannot download http://127.0.0.1:9/m/alexnet.pth" in result.stderr


# --- issue 22 -----------------------------------------------------------------------------------

DREAMSIM_ITEMS = {
    "dino_vitb16_pretrain.pth": b"dino",
    "open_clip_vitb16_pretrain.pth.tar": b"open clip",
    "clip_vitb16_pretrain.pth.tar": b"clip",
    "ensemble_lora/adapter_config.json": b"{}",
}


def _dreamsim_archive(www: Path, extra: dict[str, bytes]) -> None:
    """The shipped entry's archive on a flat mirror: the real items plus ``extra`` members."""
    with zipfile.ZipFile(www / "dreamsim_ensemble_checkpoint.zip", "w") as zf:
        for name, data in {**DREAMSIM_ITEMS, **extra}.items():
            zf.writestr(name, data)


@pytest.fixture
def home_env(tmp_path: Path) -> dict[str, str]:
    """A scratch $HOME with the shipped manifest: every cache root under H/.cache."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JBKV_", "TORCH_", "VBENCH_", "XDG_", "HF_"))
    }
    return base | {"HOME": str(tmp_path / "H")}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_dreamsim_archive_cannot_touch_other_caches(home_env, local_server, tmp_path):
    """Issue 22, item 1: the archive also holds huggingface/README and torch/README; they used
    to replace ~/.cache/huggingface and ~/.cache/torch wholesale (rmtree, exit 0)."""
    cache = tmp_path / "H" / ".cache"
    theirs = {
        "huggingface/hub/models--bert-base-uncased/refs/main": b"abc123\n",
        "huggingface/token": b"secret\n",
        "torch/hub/checkpoints/alexnet-owt-7be5be79.pth": b"alexnet weights\n",
    }
    for rel, data in theirs.items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    _dreamsim_archive(local_server.root, {"huggingface/README": b"x", "torch/README": b"x"})

    result = jbkv(home_env, "fetch", "dreamsim", "--mirror", local_server.url)
    for rel, data in theirs.items():
        assert (cache / rel).is_file() and (cache / rel).read_bytes() == data, rel
    assert result.returncode == 0, result.stderr
    assert "ignored 2 archive member(s)" in result.stderr
    assert not (cache / "huggingface" / "README").exists()
    assert not (cache / "torch" / "README").exists()
    for rel, data in DREAMSIM_ITEMS.items():
        assert (cache / rel).read_bytes() == data
    assert not [p.name for p in cache.iterdir() if p.name.startswith(".jbkv-unpack-")]
    assert not list(cache.glob("*.part"))
    status = jbkv(home_env, "status", "dreamsim")
    assert status.returncode == 0 and "present" in status.stdout


def test_dreamsim_replaces_only_what_jbkv_unpacked(home_env, local_server, tmp_path):
    """--force replaces jbkv's own items; once someone changed one, nothing is moved."""
    cache = tmp_path / "H" / ".cache"
    _dreamsim_archive(local_server.root, {})
    assert jbkv(home_env, "fetch", "dreamsim", "--mirror", local_server.url).returncode == 0
    again = jbkv(home_env, "fetch", "dreamsim", "--mirror", local_server.url, "--force")
    assert again.returncode == 0, again.stderr

    (cache / "ensemble_lora" / "notes.txt").write_bytes(b"mine")
    before = _tree(cache)
    refused = jbkv(home_env, "fetch", "dreamsim", "--mirror", local_server.url, "--force")
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "ensemble_lora" in refused.stderr
    assert "jbkv did not unpack it there" in refused.stderr
    assert _tree(cache) == before


def test_an_item_jbkv_did_not_put_there_is_refused_before_downloading(
    home_env, local_server, tmp_path
):
    cache = tmp_path / "H" / ".cache"
    cache.mkdir(parents=True)
    (cache / "dino_vitb16_pretrain.pth").write_bytes(b"someone else's DINO")
    _dreamsim_archive(local_server.root, {})
    result = jbkv(home_env, "fetch", "dreamsim", "--mirror", local_server.url)
    assert result.returncode == 1
    assert result.stderr.startswith("error: dreamsim: ") and result.stderr.count("\n") == 1
    assert (cache / "dino_vitb16_pretrain.pth").read_bytes() == b"someone else's DINO"
    assert sorted(p.name for p in cache.iterdir()) == ["dino_vitb16_pretrain.pth"]
    assert local_server.requests == []


def test_a_stale_longer_part_is_not_installed(env, local_server, tmp_path):
    """Issue 22, item 3, through the CLI: unpinned entry, .part longer than the file (416)."""
    manifest = Path(env["JBKV_WEIGHTS_MANIFEST"])
    doc = json.loads(manifest.read_text())
    doc["files"][0]["sha256"] = None
    manifest.write_text(json.dumps(doc))
    target = tmp_path / "torch" / "hub" / "checkpoints" / "alexnet.pth"
    target.parent.mkdir(parents=True)
    target.with_name("alexnet.pth.part").write_bytes(PAYLOAD + b"left over from another file")
    assert "partial" in jbkv(env, "status", "alexnet").stdout
    result = jbkv(env, "fetch", "alexnet")
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == PAYLOAD
    assert not target.with_name("alexnet.pth.part").exists()


def test_an_absolute_manifest_path_is_refused(env, tmp_path):
    """Issue 22, item 2: an absolute path wrote outside every cache root."""
    manifest = Path(env["JBKV_WEIGHTS_MANIFEST"])
    doc = json.loads(manifest.read_text())
    outside = tmp_path / "outside" / "alexnet.pth"
    doc["files"][0]["path"] = str(outside)
    manifest.write_text(json.dumps(doc))
    result = jbkv(env, "fetch", "alexnet")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "(alexnet)" in result.stderr
    assert not (tmp_path / "outside").exists()


def test_a_path_through_a_symlink_out_of_its_root_is_refused(env, local_server, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    hub = tmp_path / "torch" / "hub"
    hub.mkdir(parents=True)
    (hub / "checkpoints").symlink_to(outside)
    result = jbkv(env, "fetch", "alexnet")
    assert result.returncode == 1
    assert result.stderr.startswith("error: alexnet: ") and result.stderr.count("\n") == 1
    assert "outside its root" in result.stderr
    assert list(outside.iterdir()) == [] and local_server.requests == []


@pytest.mark.parametrize(
    "launch",
    [
        {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"},
        {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"},
        {"WORLD_SIZE": "2"},  # RANK missing: not a torchrun environment at all
    ],
)
def test_fetch_refuses_to_run_under_torchrun(env, local_server, tmp_path, launch):
    """Issue 22, item 19: two ranks streamed into one .part and one of them failed."""
    result = jbkv(env | launch, "fetch", "lpips")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    if "RANK" in launch:
        assert f"rank {launch['RANK']}/2: " in result.stderr
        assert "not under torchrun" in result.stderr
    assert local_server.requests == []
    assert not (tmp_path / "torch").exists()
