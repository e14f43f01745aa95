"""``jbkv weights status|fetch`` through the installed console script, against a local server."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PAYLOAD = b"alexnet weights, for tests only\n" * 40_000
JBKV = Path(sys.executable).with_name("jbkv")


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
    return subprocess.run(
        [str(JBKV), "weights", *args], env=env, capture_output=True, text=True, timeout=120
    )


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
