"""A raw-socket HTTP server on 127.0.0.1 for replies ``http.server`` cannot send: a garbled
status line, a chunked body cut short, a redirect loop, a wrong ``Content-Length``…

Each route is ``path -> reply(headers) -> bytes``: the exact bytes written before the server
closes the connection. ``requests`` logs ``(path, Range header or None)`` in arrival order."""

from __future__ import annotations

import socketserver
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

Reply = Callable[[dict[str, str]], bytes]


@dataclass
class RawServer:
    url: str = ""
    routes: dict[str, Reply] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@pytest.fixture
def raw_server() -> Iterator[RawServer]:
    state = RawServer()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            request_line = self.rfile.readline().decode("latin-1").split()
            headers: dict[str, str] = {}
            while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                key, _, value = line.decode("latin-1").partition(":")
                headers[key.strip().lower()] = value.strip()
            path = request_line[1] if len(request_line) > 1 else ""
            state.requests.append((path, headers.get("range")))
            reply = state.routes.get(path)
            self.wfile.write(reply(headers) if reply else NOT_FOUND)
            self.wfile.flush()

    class Server(socketserver.ThreadingTCPServer):
        def handle_error(self, request, client_address):  # a client that hung up early
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
