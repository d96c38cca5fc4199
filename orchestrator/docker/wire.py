"""The Engine API's hot path without docker-py: container listings and execs.

Every command hp runs in a node goes through here (`hp exec`, and each Slurm command hp
runs in a controller), and so does every listing of a cluster's containers; engine.py
does the rest through docker-py. Why a client of hp's own for these: importing docker-py
takes 0.1 s (requests, urllib3, charset_normalizer...), more than a whole `docker exec`
(0.06 s on the 2-core machine), and `hp exec` is held to 1.5x of one (issue 23). This
module imports only json, os, _socket and threading; socket (tcp), ssl (TLS) and subprocess
(ssh) when used. The local socket is reached through _socket, the C module the socket
module wraps: that module's import (selectors, array, its enum conversions of every
constant) is 3.6 ms of a quick `hp exec`'s 60 (medians of 60 imports, 6 December).

`Endpoint` is one engine's address: unix://PATH, tcp://HOST:PORT (TLS with a `Tls`),
ssh://[USER@]HOST[:PORT] (the system's ssh running `docker system dial-stdio` on the
host, as docker-py's use_ssh_client does). Paths are unversioned: the engine answers in
its own API version, whose listing and exec documents have kept their shape since 1.24.

An exec's start is hijacked: its answer's headers are followed by the raw stream on the
same connection. The bytes read with the headers are kept and handed out first (docker-py
lost them: docker/docker-py#2042, seen as `scontrol --json` output without its start).

Errors: `Unreachable` (nothing answers at the address, or the connection went away),
`ApiError` (the engine's own answer: status and message), `Broken` (a timeout or an answer
that is not HTTP). engine.py turns them into hp's errors (errors.py); they carry no
orchestrator type, so the quick `hp exec` (cli/quick.py) loads nothing more.
"""

from __future__ import annotations

import _socket
import json
import os
import threading

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
DEFAULT_TIMEOUT_S = 60.0  # per request, as docker-py's
STREAM_STDOUT, STREAM_STDERR = 1, 2
_MAX_HEAD = 64 << 10  # an answer's status line and headers, at most


class Unreachable(Exception):
    """Nothing answers at the endpoint's address, or the connection went away."""


class Broken(Exception):
    """The engine did not answer in time, or its answer is not HTTP."""


class ApiError(Exception):
    """The engine's answer to a request it refused: its HTTP status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class Tls:
    """TLS to a tcp:// engine: the CA that signed it, and the client's certificate and key
    (`verify`: check the engine's certificate and name, as docker-py's TLSConfig does)."""

    def __init__(self, ca: str | None, cert: str | None, key: str | None, verify: bool = True):
        self.ca, self.cert, self.key, self.verify = ca, cert, key, verify

    @classmethod
    def from_dir(cls, d: str, verify: bool = True) -> Tls:
        """ca.pem, cert.pem and key.pem in folder `d` (hp hosts add --tls-dir; DOCKER_CERT_PATH)."""
        return cls(os.path.join(d, "ca.pem"), os.path.join(d, "cert.pem"), os.path.join(d, "key.pem"), verify)

    def wrap(self, sock: _socket.socket, host: str) -> _socket.socket:
        import ssl

        if self.verify:
            ctx = ssl.create_default_context(cafile=self.ca)
        else:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx.wrap_socket(sock, server_hostname=host)


class _SshPipe:
    """A connection to an engine through `ssh HOST docker system dial-stdio`: the engine's
    socket on the far host, bridged to this process's pipes."""

    def __init__(self, user: str | None, host: str, port: str | None):
        import subprocess

        args = ["ssh", *(["-l", user] if user else []), *(["-p", port] if port else []), "--", host]
        try:
            self._p = subprocess.Popen(
                [*args, "docker system dial-stdio"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a ^C at the terminal is hp's to handle, not ssh's
            )
        except OSError as e:
            raise Unreachable(f"cannot run ssh: {e}") from None
        assert self._p.stdin is not None and self._p.stdout is not None
        self._in, self._out = self._p.stdin, self._p.stdout.fileno()

    def settimeout(self, t: float | None) -> None:
        pass  # a pipe has none: a silent far end is ssh's to time out (ServerAliveInterval)

    def sendall(self, data: bytes) -> None:
        self._in.write(data)
        self._in.flush()

    def recv(self, n: int) -> bytes:
        return os.read(self._out, n)

    def shutdown(self, how: int) -> None:
        self._in.close()

    def fileno(self) -> int:
        return self._out

    def close(self) -> None:
        for f in (self._in, self._p.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        self._p.kill()
        self._p.wait()


class Conn:
    """One connection to the engine, with what was read of it and not yet handed out."""

    def __init__(self, sock: _socket.socket | _SshPipe):
        self.sock = sock
        self._buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def end_input(self) -> None:
        """No more input from this side (an exec's stdin ends: SHUT_WR); its output may go on."""
        self.sock.shutdown(_socket.SHUT_WR)

    def recv(self, n: int = 65536) -> bytes:
        """What was read and not handed out yet, else one read ("" at the end)."""
        if self._buf:
            out, self._buf = self._buf[:n], self._buf[n:]
            return out
        return self.sock.recv(n)

    def held(self) -> bytes:
        """What was read with the answer's headers and not handed out yet, without waiting."""
        out, self._buf = self._buf, b""
        return out

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self._buf += chunk
        return bool(chunk)

    def line(self) -> bytes:
        while b"\r\n" not in self._buf:
            if len(self._buf) > _MAX_HEAD or not self._fill():
                raise Broken("the engine's answer ended before its headers did")
        out, _, self._buf = self._buf.partition(b"\r\n")
        return out

    def exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not self._fill():
                raise Broken("the engine's answer ended early")
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def head(self) -> tuple[int, dict[str, str]]:
        """An answer's status and headers (names in lower case)."""
        status = self.line().split(None, 2)
        if len(status) < 2 or not status[0].startswith(b"HTTP/") or not status[1].isdigit():
            raise Broken(f"the engine's answer is not HTTP: {b' '.join(status)[:80]!r}")
        headers = {}
        while line := self.line():
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return int(status[1]), headers

    def body(self, status: int, headers: dict[str, str]) -> bytes:
        if status in (204, 304) or status < 200:
            return b""
        if "chunked" in headers.get("transfer-encoding", ""):
            parts = []
            while size := int(self.line().split(b";")[0] or b"0", 16):
                parts.append(self.exactly(size))
                self.exactly(2)
            while self.line():  # trailers, then the empty line
                pass
            return b"".join(parts)
        if "content-length" in headers:
            return self.exactly(int(headers["content-length"]))
        out = [self._buf]  # until the engine closes the connection
        self._buf = b""
        while chunk := self.sock.recv(65536):
            out.append(chunk)
        return b"".join(out)

    def frames(self) -> _Frames:
        return _Frames(self)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Frames:
    """Docker's multiplexed stream (an exec without a terminal) as it comes: (stdout, None)
    or (None, stderr) per frame (a frame cut short by the end: what came of it; a torn
    header: nothing); the connection is closed at the end, or by `close`."""

    def __init__(self, conn: Conn):
        self._conn = conn

    def __iter__(self) -> _Frames:
        return self

    def close(self) -> None:
        self._conn.close()

    def __next__(self) -> tuple[bytes | None, bytes | None]:
        c = self._conn
        try:
            head = c.exactly(8)
            size = int.from_bytes(head[4:8], "big")
            try:
                data = c.exactly(size)
            except Broken:
                data = c.held()
                if not data:
                    raise
        except Broken:
            c.close()
            raise StopIteration from None
        except OSError as e:
            c.close()
            raise Unreachable(f"the exec's stream broke: {e}") from None
        return (None, data) if head[0] == STREAM_STDERR else (data, None)


def _quote(s: str) -> str:
    """A path segment or query value, percent-encoded (an exec id, a container's name)."""
    safe = "-_.~"
    return "".join(ch if ch.isalnum() and ch.isascii() or ch in safe else f"%{b:02X}" for ch in s for b in ch.encode())


class Endpoint:
    """One engine's address and its timeouts: `connect_timeout` for the connection and the
    first answer (a registered host that is down costs that, not 60 s), `timeout` for each
    answer after. Thread-safe; idle connections are kept for the next request."""

    def __init__(
        self,
        url: str,
        tls: Tls | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
    ):
        self.url = url
        self.tls = tls
        self.timeout = timeout or DEFAULT_TIMEOUT_S
        self.connect_timeout = connect_timeout or self.timeout
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in ("unix", "tcp", "http", "https", "ssh") or not rest:
            raise ValueError(f"not an engine address: {url!r} (unix://PATH, tcp://HOST:PORT or ssh://USER@HOST)")
        self.scheme = scheme
        if scheme == "unix":
            self.path = "/" + rest.lstrip("/")
            self.host, self.port, self.user = "localhost", 0, None
        else:
            userhost, _, _ = rest.partition("/")
            user, _, hostport = userhost.rpartition("@")
            host, _, port = hostport.rpartition(":") if hostport.count(":") == 1 else (hostport, "", "")
            self.user = user or None
            self.host = host.strip("[]")
            default = "22" if scheme == "ssh" else ("2376" if tls or scheme == "https" else "2375")
            self.port = int(port or default)
            self.path = ""
        self._idle: list[Conn] = []
        self._lock = threading.Lock()
        self._answered = False

    @classmethod
    def from_env(cls, timeout: float | None = None, connect_timeout: float | None = None) -> Endpoint:
        """The engine the environment names, as docker-py's kwargs_from_env reads it:
        DOCKER_HOST (default the local socket), DOCKER_TLS_VERIFY and DOCKER_CERT_PATH."""
        verify = bool(os.environ.get("DOCKER_TLS_VERIFY"))
        certs = os.environ.get("DOCKER_CERT_PATH") or None
        tls = None
        if verify or certs:
            tls = Tls.from_dir(certs or os.path.join(os.path.expanduser("~"), ".docker"), verify)
        return cls(os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET, tls, timeout, connect_timeout)

    # -- connections -------------------------------------------------------------------
    def _connect(self) -> Conn:
        try:
            if self.scheme == "ssh":
                return Conn(_SshPipe(self.user, self.host, str(self.port)))
            if self.scheme == "unix":
                s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
                s.settimeout(self.connect_timeout)
                try:
                    s.connect(self.path)
                except OSError:
                    s.close()
                    raise
            else:
                import socket

                s = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.tls is not None or self.scheme == "https":
                    s = (self.tls or Tls(None, None, None)).wrap(s, self.host)
        except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
            raise Unreachable(f"cannot connect to {self.url}: {e}") from None
        return Conn(s)

    def _take(self) -> tuple[Conn, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _keep(self, conn: Conn) -> None:
        with self._lock:
            if len(self._idle) < 8:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    # -- requests ----------------------------------------------------------------------
    def _send(self, method: str, path: str, body: object, upgrade: bool) -> tuple[Conn, int, dict[str, str]]:
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host if self.scheme != 'unix' else 'docker'}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        head += f"Content-Length: {len(data)}\r\n"
        if upgrade:
            head += "Connection: Upgrade\r\nUpgrade: tcp\r\n"
        msg = head.encode() + b"\r\n" + data
        for attempt in (0, 1):
            conn, reused = (self._connect(), False) if upgrade else self._take()
            # until the engine first answered, a wait of connect_timeout (a host that accepts
            # and never answers, as a stopped engine's kernel does, costs that), then timeout
            conn.sock.settimeout(self.timeout if self._answered else self.connect_timeout)
            try:
                conn.send(msg)
                status, headers = conn.head()
            except Broken as e:
                conn.close()
                # a kept connection the engine closed meanwhile (nothing came): once more
                if reused and attempt == 0 and "ended before" in str(e) and not conn._buf:
                    continue
                raise
            except TimeoutError:
                conn.close()
                raise Broken(f"{method} {path.split('?')[0]}: no answer within {self._wait():g} s") from None
            except OSError as e:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise Unreachable(f"{self.url}: {e}") from None
            self._answered = True
            conn.sock.settimeout(self.timeout)
            return conn, status, headers
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait(self) -> float:
        return self.timeout if self._answered else self.connect_timeout

    def request(self, method: str, path: str, body: object = None) -> object:
        """One request; its JSON answer (None when it has no body). ApiError for a status of 400 or more."""
        conn, status, headers = self._send(method, path, body, upgrade=False)
        try:
            raw = conn.body(status, headers)
        except TimeoutError:
            conn.close()
            raise Broken(f"{method} {path.split('?')[0]}: no answer within {self.timeout:g} s") from None
        except (Broken, OSError):
            conn.close()
            raise
        if headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            self._keep(conn)
        if status >= 400:
            raise ApiError(status, _message(raw))
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    # -- the calls ---------------------------------------------------------------------
    def containers(self, filters: dict[str, list[str]]) -> list[dict]:
        """Every container, running or not, that passes the engine's `filters` (as the
        docker CLI's --filter: {"label": ["KEY=VALUE", ...]}, {"name": [...]}...)."""
        flt = _quote(json.dumps(filters))
        doc = self.request("GET", f"/containers/json?all=1&filters={flt}")
        return doc if isinstance(doc, list) else []

    def exec_create(
        self,
        container: str,
        cmd: list[str],
        user: str = "root",
        workdir: str | None = None,
        environment: dict[str, str] | None = None,
        stdin: bool = False,
        tty: bool = False,
    ) -> str:
        body: dict[str, object] = {
            "AttachStdin": stdin,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": tty,
            "Cmd": list(cmd),
            "User": user,
        }
        if workdir:
            body["WorkingDir"] = workdir
        if environment:
            body["Env"] = [f"{k}={v}" for k, v in environment.items()]
        doc = self.request("POST", f"/containers/{_quote(container)}/exec", body)
        if not isinstance(doc, dict) or not isinstance(doc.get("Id"), str):
            raise Broken(f"exec create in {container}: no exec id in the answer")
        return doc["Id"]

    def exec_start(self, exec_id: str, tty: bool = False) -> Conn:
        """The exec started: its connection, the stream following (multiplexed frames
        without a terminal: Conn.frames; raw bytes with one). No timeout while it runs: a
        command may be quiet as long as it likes."""
        conn, status, headers = self._send(
            "POST", f"/exec/{_quote(exec_id)}/start", {"Detach": False, "Tty": tty}, upgrade=True
        )
        if status >= 400:
            try:
                raw = conn.body(status, headers)
            except (Broken, OSError):
                raw = b""
            conn.close()
            raise ApiError(status, _message(raw))
        conn.sock.settimeout(None)
        return conn

    def exec_inspect(self, exec_id: str) -> dict:
        doc = self.request("GET", f"/exec/{_quote(exec_id)}/json")
        return doc if isinstance(doc, dict) else {}

    def exec_exit_code(self, exec_id: str) -> int:
        """The exec's exit code; -1 while it runs or when the engine does not know it."""
        code = self.exec_inspect(exec_id).get("ExitCode")
        return code if isinstance(code, int) else -1

    def exec_resize(self, exec_id: str, height: int, width: int) -> None:
        self.request("POST", f"/exec/{_quote(exec_id)}/resize?h={int(height)}&w={int(width)}")


def _message(raw: bytes) -> str:
    """The engine's error message ({"message": ...}), or its answer's text."""
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            return doc["message"]
    except ValueError:
        pass
    return raw.decode(errors="replace").strip()[:500] or "(no message)"
