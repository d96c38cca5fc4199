"""The REST front: what `hp api NAME` points at, served by the cluster's agent on
127.0.0.1:<port>. Every request must carry X-SLURM-USER-TOKEN, an HS256 JWT signed with
the cluster's key and not expired: a missing, malformed, forged or expired token gets
401 with a JSON body and nothing else (slurmrestd itself is never asked). A good one is
passed to slurmrestd (at its address on the cluster's network; its port is published
nowhere, so this front is the only way in from the host; with registered hosts, whose
overlay network this host cannot reach, through a tunnel: an exec in slurmrestd's
container) as it came, and slurmrestd's answer (Slurm's own errors as JSON included) is
passed back as it came.

Standard library only (http.server, http.client): the front holds the key, slurmrestd's
container never does.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import jwt

log = logging.getLogger("hp.front")

MAX_BODY = 8 * 2**20  # a job script with its JSON: far less
UPSTREAM_TIMEOUT = 60.0
PROXY_USERS = ("root", "slurm")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}

Upstream = Callable[[bool], tuple[str, int]]  # (host, port) of slurmrestd; True: look it up again
# A whole HTTP exchange with slurmrestd through another channel (with registered hosts:
# an exec in its container, services/endpoints.py): the request's bytes in, the response's out.
Tunnel = Callable[[bytes], bytes]


class _Recorded:
    """A finished response's bytes as the socket http.client reads it from."""

    def __init__(self, data: bytes):
        self._data = data

    def makefile(self, *_: object, **__: object) -> io.BytesIO:
        return io.BytesIO(self._data)


def error_body(status: int, error: str, description: str) -> bytes:
    """A body in slurmrestd's own error shape."""
    return json.dumps(
        {"errors": [{"error": error, "error_number": status, "description": description}], "warnings": []}
    ).encode()


class Front(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, key: Callable[[], bytes], upstream: Upstream, tunnel: Tunnel | None = None):
        self.key = key
        self.upstream = upstream
        self.tunnel = tunnel
        super().__init__(("127.0.0.1", port), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def serve_in_thread(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, daemon=True, name="rest-front")
        t.start()
        return t


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Front

    def log_message(self, fmt: str, *args: object) -> None:  # the request line only: never a header
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None) -> None:
        self.send_response(status)
        for k, v in headers or [("Content-Type", "application/json")]:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _deny(self, why: str) -> None:
        self.close_connection = True
        self._send(
            401,
            error_body(401, why, "Authentication failure"),
            [("Content-Type", "application/json"), ("WWW-Authenticate", 'Bearer realm="hp slurmrestd"')],
        )

    def _any(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            return self._send(413, error_body(413, "request body too large or malformed", "Bad request"))
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            return self._send(411, error_body(411, "chunked requests are not accepted", "Bad request"))
        body = self.rfile.read(length) if length else None
        token = self.headers.get("X-SLURM-USER-TOKEN")
        why = "missing X-SLURM-USER-TOKEN" if not token else jwt.verify(self.server.key(), token)
        if why:
            return self._deny(why)
        assert token is not None
        user, owner = self.headers.get("X-SLURM-USER-NAME"), jwt.user_of(token)
        if user and owner not in (user, *PROXY_USERS):  # only root's and SlurmUser's tokens act for others
            return self._deny(f"the token is {owner!r}'s, not {user!r}'s")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
        try:
            status, reply_headers, payload = self._forward(body, headers)
        except (OSError, http.client.HTTPException) as e:
            return self._send(502, error_body(502, f"slurmrestd does not answer: {e}", "Bad gateway"))
        self._send(status, payload, reply_headers)

    def _forward(self, body: bytes | None, headers: dict[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        """Pass the request to slurmrestd (looked up again once when it does not answer:
        its container may have been re-created on another port)."""
        if self.server.tunnel is not None:
            return self._through_tunnel(self.server.tunnel, body, headers)
        for again in (False, True):
            conn = None
            try:
                host, port = self.server.upstream(again)
                conn = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT)
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                payload = r.read()
                keep = [(k, v) for k, v in r.getheaders() if k.lower() not in HOP_BY_HOP | {"content-length"}]
                return r.status, keep, payload
            except ConnectionError:
                if again:
                    raise
            finally:
                if conn is not None:
                    conn.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def _through_tunnel(
        self, tunnel: Tunnel, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """One request, `Connection: close`, as bytes through the tunnel; its response parsed."""
        lines = [f"{self.command} {self.path} HTTP/1.1", "Host: slurmrestd", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "content-length"]
        lines.append(f"Content-Length: {len(body or b'')}")
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        out = tunnel(raw)
        r = http.client.HTTPResponse(_Recorded(out), method=self.command)  # type: ignore[arg-type]
        r.begin()
        payload = r.read()
        keep = [(k, v) for k, v in r.getheaders() if k.lower() not in HOP_BY_HOP | {"content-length"}]
        return r.status, keep, payload

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = _any
