"""A stand-in Docker engine on a unix socket for the tests of docker/wire.py and of the
DockerEngine calls that go through it (listings, execs): a real HTTP server that answers
each Engine API request wire.py makes with what this machine's dockerd 20.10 answered to
the same call (tests/fixtures/docker-20.10-*.json, README-docker.md), and records what it
was asked. Each answer is written the way the engine writes it (an exec's start: the
hijack's headers then the multiplexed stream; `eager`: both in one write, as the engine
does for a quick command)."""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fx(name: str) -> Any:
    return json.loads((FIXTURES / f"docker-20.10-{name}.json").read_text())


def frame(stream: int, data: bytes) -> bytes:
    """One frame of Docker's multiplexed exec stream (1: stdout, 2: stderr)."""
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


@dataclass
class Asked:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]


@dataclass
class Answers:
    """What the engine answers: a status and a JSON document per call, the frames of an
    exec's start (bytes, or a callable given the exec's input, for one that echoes it)."""

    containers: list[dict] = field(default_factory=list)
    exec_create: tuple[int, Any] = (201, {"Id": "e1"})
    frames: bytes | Callable[[bytes], bytes] = b""
    start_status: tuple[int, Any] | None = None  # an exec start the engine refuses
    exec_inspect: dict = field(default_factory=lambda: {"ExitCode": 0})
    eager: bool = False  # the hijack's headers and the whole stream in one write
    chunked: bool = False  # JSON answers in chunked transfer encoding
    close_after: bool = False  # `Connection: close` on every answer
    step: int = 0  # the stream written this many bytes at a time (0: at once)


class _UnixHttp(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class SocketEngine:
    def __init__(self, path: Path, answers: Answers | None = None):
        self.url = f"unix://{path}"
        self.answers = answers or Answers()
        self.asked: list[Asked] = []
        self.stdin: list[bytes] = []
        self.connections = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                engine.connections += 1

            def _json(self, status: int, doc: Any) -> None:
                a = engine.answers
                body = json.dumps(doc).encode()
                head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                if a.close_after:
                    head += "Connection: close\r\n"
                    self.close_connection = True
                if a.chunked:
                    mid = len(body) // 2
                    payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:mid], body[mid:]) if p)
                    self.wfile.write(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + payload + b"0\r\n\r\n")
                else:
                    self.wfile.write(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)

            def _record(self) -> Asked:
                u = urlsplit(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                a = Asked(
                    self.command,
                    unquote(u.path),
                    parse_qs(u.query),
                    json.loads(raw) if raw else None,
                    dict(self.headers),
                )
                engine.asked.append(a)
                return a

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                a = self._record()
                if a.path == "/containers/json":
                    self._json(200, engine.answers.containers)
                elif a.path.startswith("/exec/") and a.path.endswith("/json"):
                    self._json(200, engine.answers.exec_inspect)
                else:
                    self._json(404, {"message": f"page not found: {a.path}"})

            def do_POST(self) -> None:  # noqa: N802
                a = self._record()
                ans = engine.answers
                if a.path.endswith("/exec") and a.path.startswith("/containers/"):
                    self._json(*ans.exec_create)
                elif a.path.endswith("/start"):
                    if ans.start_status is not None:
                        self._json(*ans.start_status)
                        return
                    head = b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\n"
                    head += b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
                    given = b""
                    if callable(ans.frames):  # an exec with input: read it all, then answer
                        self.wfile.write(head)
                        self.wfile.flush()
                        given = self.rfile.read()
                        engine.stdin.append(given)
                        out = ans.frames(given)
                        head = b""
                    else:
                        out = ans.frames
                    if ans.eager or not ans.step:
                        self.wfile.write(head + out)
                    else:
                        self.wfile.write(head)
                        for i in range(0, len(out), ans.step):
                            self.wfile.write(out[i : i + ans.step])
                            self.wfile.flush()
                    self.close_connection = True
                elif a.path.endswith("/resize"):
                    self.send_response(201)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._json(404, {"message": f"page not found: {a.path}"})

            def log_message(self, *_: Any) -> None:
                pass

        self._srv = _UnixHttp(str(path), Handler)
        threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def called(self, method: str, suffix: str) -> list[Asked]:
        return [a for a in self.asked if a.method == method and a.path.endswith(suffix)]

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
