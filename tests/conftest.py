"""Shared fixtures: a local HTTP server (127.0.0.1 only, with byte ranges, and raw replies
``http.server`` cannot send) for tests that download (``jbkv weights``) or load pages in a browser
(the HTML report). Never the network."""

from __future__ import annotations

import fcntl
import http.server
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# Under pytest-xdist the workers share the machine's cores: one thread each, for the worker and
# every jbkv it starts (torch's intra-op threads spin-wait when they outnumber the free cores:
# a 12-video evaluation beside another worker took 7.0 CPU-s at 2 threads, 4.0 at 1). A value
# the caller set stays.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    """The files holding a ``slow`` test run first: ``--dist loadfile`` hands files to the
    workers in this order, so a long file never starts last while the other worker idles (the
    order within and among files is otherwise kept; every worker collects the same order).
    ``cuda``-marked tests skip themselves where no CUDA GPU is (``make gpu-check`` runs them on
    one)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
    marked = [item for item in items if "cuda" in item.keywords]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make gpu-check runs it)")
    for item in marked:
        item.add_marker(skip)


Reply = Callable[[dict[str, str]], bytes]
"""A raw route: the request's headers (names lower-case) -> the exact bytes written before the
server closes the connection (a garbled status line, a body cut short, a redirect loop…)."""


@dataclass
class LocalServer:
    """A folder served on ``url``, except the paths in ``routes``, which answer raw bytes;
    ``requests`` logs (path, Range header, status), status None for a raw route."""

    root: Path
    url: str
    requests: list[tuple[str, str | None, int | None]] = field(default_factory=list)
    ranges: bool = True
    routes: dict[str, Reply] = field(default_factory=dict)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` plus ``Range: bytes=N-`` (206), as browsers and resumable
    downloads use it; quiet."""

    server_state: LocalServer

    def do_GET(self):
        reply = self.server_state.routes.get(self.path)
        if reply is None:
            return super().do_GET()
        self.server_state.requests.append((self.path, self.headers.get("Range"), None))
        self.wfile.write(reply({k.lower(): v for k, v in self.headers.items()}))
        self.wfile.flush()
        self.close_connection = True
        return None

    def send_head(self):
        state = self.server_state
        path = Path(self.translate_path(self.path))
        header = self.headers.get("Range")
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", header or "")
        if not (state.ranges and match and path.is_file()):
            self._status = 200
            return super().send_head()
        size = path.stat().st_size
        start = int(match.group(1))
        end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
        if start >= size:
            self._status = 416
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        f = path.open("rb")
        f.seek(start)
        self._status = 206
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._left = end - start + 1
        return f

    def copyfile(self, source, outputfile):
        left = getattr(self, "_left", None)
        if left is None:
            return super().copyfile(source, outputfile)
        while left > 0 and (block := source.read(min(1 << 16, left))):
            outputfile.write(block)
            left -= len(block)
        return None

    def log_request(self, code="-", size="-"):
        status = int(code) if str(code).isdigit() else getattr(self, "_status", 0)
        self.server_state.requests.append((self.path, self.headers.get("Range"), status))

    def log_message(self, format, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    """A client that hangs up early (a download refused after its headers) is no error here."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture
def local_server(tmp_path: Path) -> Iterator[LocalServer]:
    """Serve ``tmp_path / "www"`` on http://127.0.0.1:<free port>/ for one test."""
    root = tmp_path / "www"
    root.mkdir()
    state = LocalServer(root, "")
    handler = type("Handler", (_Handler,), {"server_state": state})

    def factory(*args, **kwargs):
        return handler(*args, directory=str(root), **kwargs)

    server = _QuietServer(("127.0.0.1", 0), factory)
    state.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


TINY_PROMPTS = (
    "a red circle moves right on a dark background",
    "a blue square moves up on a gray background",
)


def _shared_root(tmp_path_factory) -> Path:
    """The temp folder every worker of this session sees (pytest-xdist gives each worker its
    own base folder under one parent; without xdist, this process's base folder)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _build_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(folder)`` run once per session whatever the number of workers (the first
    worker that needs it builds it under a file lock, into a temp name renamed when done; the
    others wait for it), then copied into this worker's own temp folder: a test may write into
    its copy (a report, a resume) without racing another worker."""
    shared = _shared_root(tmp_path_factory)
    done = shared / f"shared-{name}"
    with open(shared / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            building = shared / f".building-{name}"
            shutil.rmtree(building, ignore_errors=True)
            building.mkdir()
            build(building)
            building.rename(done)
    mine = tmp_path_factory.mktemp(name)
    shutil.copytree(done, mine, dirs_exist_ok=True, symlinks=True)
    return mine


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A finished quantize-eval run on the embedded model: 2 prompts x seed 0, reference +
    INT4/INT2 x none/taylor (RTN), plots, no LPIPS (about 55 s of CPU, once per session:
    every worker gets its own copy)."""

    def build(folder: Path) -> None:
        from typer.testing import CliRunner

        from jbkv_cli.cli.app import app

        prompts = folder / "p.txt"
        prompts.write_text("\n".join(TINY_PROMPTS) + "\n")
        args = ["quantize-eval", "--prompts", str(prompts), "--seeds", "0", "--bits", "2,4"]
        args += ["--quantizers", "rtn", "--corrections", "none,taylor", "--no-lpips"]
        result = CliRunner().invoke(app, [*args, "--out", str(folder)])
        assert result.exit_code == 0, result.output

    return _build_once(tmp_path_factory, "tiny-run", build) / "tiny"


@pytest.fixture(autouse=True, scope="session")
def _digest_cache_in_a_temp_folder(tmp_path_factory):
    """jbkv's digest cache (``jbkv_cli/run/fingerprints.py``) in a temp folder for this process
    and every ``jbkv`` it starts: the suite never writes the user's ``~/.cache/jbkv``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JBKV_CACHE_DIR", str(tmp_path_factory.mktemp("jbkv-cache")))
        yield
