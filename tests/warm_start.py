"""The installed ``jbkv`` started warm: a forked copy of one process that has imported torch.

A new interpreter spends about 4 CPU-seconds importing torch before ``jbkv`` reads its first
option, and the suite starts ``jbkv`` a few hundred times. :func:`run` instead asks a *zygote*
(this file run as a script, one per test process, started on first use) to fork; the child
takes the caller's working folder, environment, standard streams and ``argv``, then runs the
console script's entry point (``[project.scripts]`` ``jbkv``) and exits through the normal
interpreter's exit steps a caller can see (threads joined, atexit handlers, streams
flushed; not the finalization of every module) and its exit code. What the child shares with the zygote is torch's
import and nothing else: ``jbkv_cli``, transformers, diffusers and huggingface_hub are imported
by the child under its own environment, as a new process does, and the random generators a
fresh process seeds from the OS are re-seeded.

Not the same as a new interpreter, so :func:`usable` sends these to a real subprocess: a
different locale, ``PYTHON*``, thread-count or CUDA variable than the zygote's (the stream
encodings and torch's start-up read them), or a ``preexec_fn``. One ``PYTHON*`` difference is
taken warm: folders put in front of the zygote's ``PYTHONPATH`` (the test hooks under
``tests/support/``). The child puts them in front of ``sys.path`` as a new interpreter does and
imports the first ``sitecustomize`` among them before anything else runs; a hook patches what
``jbkv`` calls (``builtins.open``, ``os.replace``), not what torch's import read. What only a new interpreter
shows (the console script itself, start-up cost, warnings printed while torch imports,
signals) is tested with real subprocesses:
``tests/test_installed.py``, ``tests/cli/test_startup.py``, the signal and torchrun tests, and
any call with ``fresh=True`` (``JBKV_TEST_FRESH=1``: every call).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

# what torch or the interpreter read when they start: a child must start with the zygote's
_STARTUP = ("PYTHON", "LC_", "LANG", "OMP_", "MKL_", "CUDA", "TORCH", "PYTORCH")
_LAZY = ("TORCH_HOME",)  # read when used, not at start-up
_STATUS = struct.Struct("q")


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in env.items()
        if k.startswith(_STARTUP) and k not in _LAZY and k != "PYTHONPATH"
    }


def _path_prefix(env: Mapping[str, str], base: Mapping[str, str]) -> list[str] | None:
    """The folders ``env``'s ``PYTHONPATH`` puts in front of ``base``'s, or None where it
    differs otherwise (or names something that is not a folder)."""
    path, tail = env.get("PYTHONPATH", ""), base.get("PYTHONPATH", "")
    if path == tail:
        return []
    if tail and not path.endswith(os.pathsep + tail):
        return None
    extra = [p for p in path[: len(path) - len(tail)].split(os.pathsep) if p]
    return extra if extra and all(os.path.isdir(p) for p in extra) else None


# --- the client (the test process) -----------------------------------------------------------


class _Zygote:
    def __init__(self, script: str) -> None:
        self.folder = tempfile.mkdtemp(prefix="jbkv-zygote-")
        self.path = os.path.join(self.folder, "socket")
        self.env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.path, script],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=self.env,
        )
        atexit.register(self.close)

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for _ in range(6000):  # until the zygote has imported torch and listens
            try:
                sock.connect(self.path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                if self.proc.poll() is not None:
                    raise RuntimeError("the jbkv zygote exited at start-up") from None
                threading.Event().wait(0.01)
        raise RuntimeError("the jbkv zygote did not start")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        Path(self.path).unlink(missing_ok=True)
        os.rmdir(self.folder)


_zygote: _Zygote | None = None
_starting = threading.Lock()


def usable(env: Mapping[str, str], preexec_fn: object) -> bool:
    """Whether a warm start runs ``jbkv`` as a new interpreter would (module docstring)."""
    if preexec_fn is not None or os.environ.get("JBKV_TEST_FRESH") == "1":
        return False
    base = _zygote.env if _zygote is not None else os.environ
    return _startup_env(env) == _startup_env(base) and _path_prefix(env, base) is not None


def run(
    script: str,
    argv: list[str],
    cwd: Path | None,
    env: Mapping[str, str],
    stdin: str | None,
    timeout: float,
) -> subprocess.CompletedProcess:
    """``argv`` (``argv[0]``: the console script ``script``) in a forked child, its output
    captured as ``subprocess.run`` captures it (calls from several threads run side by side)."""
    global _zygote
    with _starting:
        if _zygote is None:
            _zygote = _Zygote(script)
    return _run(_zygote, argv, cwd, env, stdin, timeout)


def _run(zygote, argv, cwd, env, stdin, timeout) -> subprocess.CompletedProcess:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if stdin is not None else (0, -1)
    sock = zygote.connect()
    request = {"argv": argv, "cwd": str(cwd or os.getcwd()), "env": dict(env)}
    try:
        socket.send_fds(sock, [json.dumps(request).encode()], [in_r, out_w, err_w])
    finally:
        for fd in (out_w, err_w, *((in_r,) if stdin is not None else ())):
            os.close(fd)
    (pid,) = _STATUS.unpack(_recv(sock, _STATUS.size))
    data = {out_r: bytearray(), err_r: bytearray()}
    feeder = None
    if stdin is not None:
        feeder = threading.Thread(target=_feed, args=(in_w, stdin.encode()), daemon=True)
        feeder.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for fd in data:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                os.kill(pid, signal.SIGKILL)
                _recv(sock, _STATUS.size)
                for fd in data:
                    os.close(fd)
                sock.close()
                raise subprocess.TimeoutExpired(
                    argv, timeout, bytes(data[out_r]), bytes(data[err_r])
                )
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    data[key.fd] += chunk
                else:
                    sel.unregister(key.fd)
    (code,) = _STATUS.unpack(_recv(sock, _STATUS.size))
    sock.close()
    for fd in data:
        os.close(fd)
    if feeder is not None:
        feeder.join()
    return subprocess.CompletedProcess(argv, code, *(_text(data[fd]) for fd in (out_r, err_r)))


def _text(raw: bytearray) -> str:
    """What ``subprocess.run(text=True)`` makes of ``raw``: the locale's encoding, universal
    newlines."""
    text = bytes(raw).decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _feed(fd: int, payload: bytes) -> None:
    try:
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(payload)
    except BrokenPipeError:  # the child did not read it all, as a real pipe allows
        pass


def _recv(sock: socket.socket, size: int) -> bytes:
    buf = b""
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise RuntimeError("the jbkv zygote went away")
        buf += chunk
    return buf


# --- the zygote ----------------------------------------------------------------------------


def _serve(path: str, script: str) -> None:
    import torch  # the import every jbkv child shares

    threads = torch.get_num_threads()  # a new process's default: no pool is started here
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    server.settimeout(1.0)
    while True:
        _reap()
        if os.getppid() != parent:  # the test process is gone
            return
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        message, fds, _, _ = socket.recv_fds(conn, 1 << 22, 3)
        request = json.loads(message)
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:  # a supervisor per call: the zygote takes the next one meanwhile
            server.close()
            _supervise(conn, request, fds, script, threads)  # never returns
        for fd in fds:
            os.close(fd)
        conn.close()


def _reap() -> None:
    """Collect the supervisors that have finished."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _supervise(conn: socket.socket, request: dict, fds: list[int], script: str, threads: int):
    """Fork the ``jbkv`` child, tell the caller its pid, wait, tell its exit code."""
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(request, fds, script, threads)  # never returns
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(_STATUS.pack(pid))
        _, status = os.waitpid(pid, 0)
        conn.sendall(_STATUS.pack(os.waitstatus_to_exitcode(status)))
    finally:
        os._exit(0)


def _child(request: dict, fds: list[int], script: str, threads: int) -> None:
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    os.chdir(request["cwd"])
    extra = _path_prefix(request["env"], os.environ) or []
    os.environ.clear()
    os.environ.update(request["env"])
    import random

    import torch

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", threads)))
    sys.argv = list(request["argv"])
    sys.path[0] = str(Path(script).parent)  # where a console script's interpreter looks first
    sys.path[1:1] = [os.path.abspath(p) for p in extra]
    if any(os.path.isfile(os.path.join(p, "sitecustomize.py")) for p in extra):
        sys.modules.pop("sitecustomize", None)
        import sitecustomize  # noqa: F401 (a test hook, as a new interpreter runs it)
    from importlib.metadata import entry_points

    (entry,) = entry_points(group="console_scripts", name="jbkv")
    main = entry.load()
    code: object = 0
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:  # as an interpreter dies of an uncaught one: by the signal
        _shutdown()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # an uncaught exception: its traceback, exit 1
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    _shutdown()
    os._exit(code or 0)


def _shutdown() -> None:
    """What an interpreter's exit does that a caller can see (non-daemon threads joined, the
    atexit handlers run, the standard streams flushed), without finalizing every module, which
    costs torch about a second."""
    import atexit as handlers

    threading._shutdown()
    handlers._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
