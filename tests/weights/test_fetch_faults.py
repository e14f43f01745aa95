"""Faulty servers and stale ``.part`` files (issue 22, items 3 and 17): one line naming the URL,
the other entries go on, a file whose size disagrees is never installed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from jbkv_cli.metrics.vbench_weights import cache_roots
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.weights import entry_status, fetch_entry
from jbkv_cli.weights.manifest import WeightEntry
from tests.installed import run_jbkv

PAYLOAD = bytes(range(256)) * 40  # 10,240 bytes


def response(status: str, body: bytes = b"", **headers: str) -> bytes:
    """A well-formed HTTP/1.1 reply (``headers`` with ``_`` for ``-``), connection closing."""
    lines = [f"HTTP/1.1 {status}", "Connection: close"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _roots(tmp_path: Path) -> dict[str, Path]:
    return cache_roots({"HOME": str(tmp_path / "home"), "TORCH_HOME": str(tmp_path / "torch")})


def _entry(url: str, name: str = "blob", **kw) -> WeightEntry:
    base = {
        "name": name,
        "group": "lpips",
        "used_by": "tests",
        "url": url,
        "root": "torch_hub",
        "path": f"checkpoints/{name}.pth",
    }
    return WeightEntry(**{**base, **kw})


def _garbled(_h: dict[str, str]) -> bytes:
    return b"HTTQ/9 ??? nonsense\r\n\r\n"


def _cut_chunked(_h: dict[str, str]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    return head + b"2800\r\n" + PAYLOAD[:3000]  # promises 10,240 bytes, sends 3,000


def _loop(_h: dict[str, str]) -> bytes:
    return response("302 Found", Location="/loop.pth", Content_Length="0")


def _short_then_ranges(headers: dict[str, str]) -> bytes:
    """First a Content-Length the body does not reach; then honours ``Range: bytes=N-``."""
    if "range" not in headers:
        return response("200 OK", PAYLOAD[:4000], Content_Length=str(len(PAYLOAD)))
    start = int(headers["range"].removeprefix("bytes=").rstrip("-"))
    body = PAYLOAD[start:]
    crange = f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}"
    return response(
        "206 Partial Content", body, Content_Length=str(len(body)), Content_Range=crange
    )


def _whole(_h: dict[str, str]) -> bytes:
    return response("200 OK", PAYLOAD, Content_Length=str(len(PAYLOAD)))


# --- one failure, one line naming the URL -----------------------------------------------------


@pytest.mark.parametrize(
    ("path", "reply", "cause"),
    [
        ("/garbled.pth", _garbled, "bad reply (BadStatusLine"),
        ("/cut.pth", _cut_chunked, "the body was cut short"),
        ("/loop.pth", _loop, "redirect loop"),
    ],
)
def test_http_client_failures_are_one_line_naming_the_url(
    tmp_path, local_server, path, reply, cause
):
    local_server.routes[path] = reply
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}{path}")
    with pytest.raises(JbkvError) as exc:
        fetch_entry(entry, roots)
    message = str(exc.value)
    assert message.startswith(f"cannot download {local_server.url}{path}: {cause}")
    assert "\n" not in message and "\r" not in message
    assert not entry.destination(roots).exists()


def test_a_cut_body_keeps_the_part_and_the_next_fetch_resumes_it(tmp_path, local_server):
    local_server.routes["/blob.pth"] = _short_then_ranges
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth", sha256=hashlib.sha256(PAYLOAD).hexdigest())
    with pytest.raises(
        JbkvError,
        match=r"connection closed at 4000 of 10240 bytes; the \.part \(4000 bytes\) is kept",
    ):
        fetch_entry(entry, roots)
    assert entry.part_path(roots).read_bytes() == PAYLOAD[:4000]
    assert entry_status(entry, roots).state == "partial"
    fetch_entry(entry, roots)
    assert entry.destination(roots).read_bytes() == PAYLOAD
    assert local_server.requests == [("/blob.pth", None, None), ("/blob.pth", "bytes=4000-", None)]


# --- sizes ------------------------------------------------------------------------------------


def test_a_stale_part_longer_than_the_file_is_discarded(tmp_path, local_server):
    """The server answers 416 with ``Content-Range: bytes */N``, N shorter than the .part: that
    .part is not the file (it used to be installed as complete, and status said present)."""
    (local_server.root / "blob.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth")  # unpinned: nothing else would catch it
    part = entry.part_path(roots)
    part.parent.mkdir(parents=True)
    part.write_bytes(PAYLOAD + b"stale tail")
    fetch_entry(entry, roots)
    assert entry.destination(roots).read_bytes() == PAYLOAD
    assert not part.exists()
    n = len(PAYLOAD) + len(b"stale tail")
    assert local_server.requests == [("/blob.pth", f"bytes={n}-", 416), ("/blob.pth", None, 200)]


def test_a_416_without_the_size_starts_over(tmp_path, local_server):
    def reply(headers: dict[str, str]) -> bytes:
        if "range" in headers:
            return response("416 Range Not Satisfiable", Content_Length="0")
        return _whole(headers)

    local_server.routes["/blob.pth"] = reply
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth")
    entry.part_path(roots).parent.mkdir(parents=True)
    entry.part_path(roots).write_bytes(PAYLOAD[:100])  # cannot tell: complete or not
    fetch_entry(entry, roots)
    assert entry.destination(roots).read_bytes() == PAYLOAD


def test_a_complete_unpinned_part_is_kept_when_the_server_confirms_its_size(tmp_path, local_server):
    (local_server.root / "blob.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth")
    entry.part_path(roots).parent.mkdir(parents=True)
    entry.part_path(roots).write_bytes(PAYLOAD)
    fetch_entry(entry, roots)
    assert entry.destination(roots).read_bytes() == PAYLOAD
    assert [status for _, _, status in local_server.requests] == [416]


def test_a_206_for_another_range_starts_over(tmp_path, local_server):
    def reply(headers: dict[str, str]) -> bytes:
        if "range" in headers:  # ignores the asked offset, sends from byte 7
            body = PAYLOAD[7:]
            crange = f"bytes 7-{len(PAYLOAD) - 1}/{len(PAYLOAD)}"
            return response("206 Partial Content", body, Content_Range=crange)
        return _whole(headers)

    local_server.routes["/blob.pth"] = reply
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth")
    entry.part_path(roots).parent.mkdir(parents=True)
    entry.part_path(roots).write_bytes(PAYLOAD[:100])
    fetch_entry(entry, roots)
    assert entry.destination(roots).read_bytes() == PAYLOAD


def test_a_server_size_that_disagrees_with_the_pin_is_refused_before_the_body(
    tmp_path, local_server
):
    local_server.routes["/blob.pth"] = _whole
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth", size=len(PAYLOAD) + 1)
    with pytest.raises(JbkvError, match=r"the server says 10240 bytes, expected 10241"):
        fetch_entry(entry, roots)
    assert not entry.part_path(roots).exists() and not entry.destination(roots).exists()


def test_a_local_write_error_names_the_part_and_deletes_it(tmp_path, local_server, monkeypatch):
    from jbkv_cli.weights import download

    (local_server.root / "blob.pth").write_bytes(PAYLOAD)
    roots = _roots(tmp_path)
    entry = _entry(f"{local_server.url}/blob.pth")

    def full_disk(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(download.os, "fsync", full_disk)
    with pytest.raises(JbkvError, match=r"cannot write .*blob\.pth\.part: No space left on device"):
        fetch_entry(entry, roots)
    assert not entry.part_path(roots).exists() and not entry.destination(roots).exists()


# --- the CLI: every failure one line, the other entries go on ----------------------------------


@pytest.mark.slow
def test_cli_reports_each_failure_once_and_fetches_the_rest(tmp_path, local_server):
    routes = {"/garbled.pth": _garbled, "/cut.pth": _cut_chunked, "/loop.pth": _loop}
    local_server.routes.update(routes, **{"/good.pth": _whole})
    files = [
        {**_entry(f"{local_server.url}{p}", name=p[1:-4]).__dict__, "provides": []}
        for p in [*routes, "/good.pth"]
    ]
    files[-1]["sha256"] = hashlib.sha256(PAYLOAD).hexdigest()
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"files": files}))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JBKV_", "TORCH_", "XDG_"))}
    env = base | {
        "HOME": str(tmp_path / "home"),
        "TORCH_HOME": str(tmp_path / "torch"),
        "JBKV_WEIGHTS_MANIFEST": str(manifest),
    }
    result = run_jbkv("weights", "fetch", "all", environ=env)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 3 and len(lines) == 4, result.stderr  # 3 errors, 1 success
    for path, line in zip(routes, errors, strict=True):
        assert f"{local_server.url}{path}" in line
        assert result.stderr.count(f"{local_server.url}{path}") == 1  # nothing listed twice
    assert (tmp_path / "torch" / "hub" / "checkpoints" / "good.pth").read_bytes() == PAYLOAD
