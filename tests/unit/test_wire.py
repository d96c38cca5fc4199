"""docker/wire.py, hp's own client of the Engine API's listings and execs, against a
stand-in engine on a unix socket (socket_engine.py: the recorded answers of dockerd
20.10), a TLS one on loopback, and an ssh that bridges to the stand-in: what it sends,
how it reads every shape of answer, and its errors in bounded time."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from socket_engine import Answers, SocketEngine, frame, fx

from orchestrator.docker import wire


@pytest.fixture
def eng(tmp_path: Path) -> Iterator[SocketEngine]:
    e = SocketEngine(tmp_path / "engine.sock")
    yield e
    e.close()


def endpoint(e: SocketEngine, **kw: float) -> wire.Endpoint:
    return wire.Endpoint(e.url, **kw)


# -- addresses -----------------------------------------------------------------------
def test_addresses_are_parsed_and_bad_ones_refused() -> None:
    u = wire.Endpoint("unix:///var/run/docker.sock")
    assert (u.scheme, u.path) == ("unix", "/var/run/docker.sock")
    t = wire.Endpoint("tcp://10.0.0.5:2375")
    assert (t.scheme, t.host, t.port) == ("tcp", "10.0.0.5", 2375)
    assert wire.Endpoint("tcp://h1", tls=wire.Tls(None, None, None)).port == 2376  # TLS: Docker's TLS port
    s = wire.Endpoint("ssh://ops@gpu1:2222")
    assert (s.scheme, s.user, s.host, s.port) == ("ssh", "ops", "gpu1", 2222)
    assert wire.Endpoint("ssh://gpu1").port == 22 and wire.Endpoint("ssh://gpu1").user is None
    for bad in ("", "docker.sock", "ftp://h", "unix://", "tcp:/h"):
        with pytest.raises(ValueError, match="not an engine address"):
            wire.Endpoint(bad)


def test_the_environment_names_the_engine_as_docker_py_reads_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for k in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(k, raising=False)
    e = wire.Endpoint.from_env(timeout=7, connect_timeout=2)
    assert (e.url, e.tls, e.timeout, e.connect_timeout) == (wire.DEFAULT_SOCKET, None, 7, 2)
    monkeypatch.setenv("DOCKER_HOST", "tcp://h1:2376")
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tmp_path))
    e = wire.Endpoint.from_env()
    assert e.tls is not None and e.tls.verify and e.tls.ca == str(tmp_path / "ca.pem")
    assert (e.tls.cert, e.tls.key) == (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert e.timeout == wire.DEFAULT_TIMEOUT_S == e.connect_timeout


# -- listings ------------------------------------------------------------------------
def test_a_listing_sends_the_filters_and_returns_the_engines_documents(eng: SocketEngine) -> None:
    rec = fx("containers")
    eng.answers.containers = rec["containers"]
    got = endpoint(eng).containers({"label": ["io.hp.cluster=ut-rec", "io.hp.role=worker"]})
    assert got == rec["containers"]
    (asked,) = eng.called("GET", "/containers/json")
    assert asked.query["all"] == ["1"]
    assert json.loads(asked.query["filters"][0]) == {"label": ["io.hp.cluster=ut-rec", "io.hp.role=worker"]}
    assert asked.path == "/containers/json"  # unversioned: the engine's own API version


@pytest.mark.parametrize("chunked", [False, True])
def test_answers_with_a_length_or_in_chunks_are_read_whole_and_the_connection_kept(
    eng: SocketEngine, chunked: bool
) -> None:
    eng.answers = Answers(containers=fx("containers")["containers"], chunked=chunked)
    ep = endpoint(eng)
    for _ in range(3):
        assert len(ep.containers({"label": ["a"]})) == 3
    assert eng.connections == 1  # one connection served all three


def test_an_answer_that_closes_the_connection_is_not_kept(eng: SocketEngine) -> None:
    eng.answers = Answers(close_after=True)
    ep = endpoint(eng)
    ep.containers({})
    ep.containers({})
    assert eng.connections == 2


def test_a_kept_connection_the_engine_closed_is_replaced_once(eng: SocketEngine) -> None:
    ep = endpoint(eng)
    ep.containers({})
    for c in ep._idle:  # the engine's side goes away while the connection idles
        c.sock.shutdown(socket.SHUT_RDWR)
    assert ep.containers({}) == []
    assert eng.connections == 2


# -- execs ---------------------------------------------------------------------------
def test_an_exec_is_created_as_asked_and_its_output_demultiplexed(eng: SocketEngine) -> None:
    rec = fx("exec")["plain"]
    eng.answers = Answers(
        exec_create=(201, rec["exec_create"]),
        frames=frame(1, b"to-out\n") + frame(2, b"to-err\n"),
        exec_inspect=rec["exec_inspect"],
    )
    ep = endpoint(eng)
    eid = ep.exec_create("hp-lab-login-1", rec["cmd"], "hpuser", "/home/hpuser", {"HOME": "/home/hpuser", "A": "1"})
    assert eid == rec["exec_create"]["Id"]
    (create,) = eng.called("POST", "/exec")
    assert create.path == "/containers/hp-lab-login-1/exec"
    assert create.body == {
        "AttachStdin": False,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
        "Cmd": rec["cmd"],
        "User": "hpuser",
        "WorkingDir": "/home/hpuser",
        "Env": ["HOME=/home/hpuser", "A=1"],
    }
    conn = ep.exec_start(eid)
    assert list(conn.frames()) == [(b"to-out\n", None), (None, b"to-err\n")]
    (start,) = eng.called("POST", "/start")
    assert start.body == {"Detach": False, "Tty": False} and start.headers["Upgrade"] == "tcp"
    assert ep.exec_exit_code(eid) == 4
    eng.answers.exec_inspect = {**rec["exec_inspect"], "ExitCode": None}  # still running / unknown
    assert ep.exec_exit_code(eid) == -1


def test_output_sent_with_the_hijacks_headers_is_all_read(eng: SocketEngine) -> None:
    """docker-py lost what the engine wrote with the headers (docker/docker-py#2042:
    `scontrol --json` seen without its start); wire hands it out first."""
    stream = frame(1, b'{"nodes": [') + frame(2, b"warn\n") + frame(1, b"]}\n")
    eng.answers = Answers(frames=stream, eager=True)
    conn = endpoint(eng).exec_start("e1")
    assert list(conn.frames()) == [(b'{"nodes": [', None), (None, b"warn\n"), (b"]}\n", None)]


def test_frames_split_across_reads_are_joined_and_a_torn_end_is_what_came(eng: SocketEngine) -> None:
    chunks = [
        (base64.b64decode(o) if o else None, base64.b64decode(x) if x else None)
        for o, x in fx("exec")["stream"]["chunks_b64"]
    ]
    raw = b"".join(frame(1, o) if o else frame(2, x or b"") for o, x in chunks)
    eng.answers = Answers(frames=raw, step=3)
    assert list(endpoint(eng).exec_start("e1").frames()) == chunks
    eng.answers = Answers(frames=frame(1, b"whole\n") + frame(2, b"cut short")[:-5])
    assert list(endpoint(eng).exec_start("e1").frames()) == [(b"whole\n", None), (None, b"cut ")]
    eng.answers = Answers(frames=frame(1, b"x") + b"\x01\x00\x00")  # a torn header: nothing of it
    assert list(endpoint(eng).exec_start("e1").frames()) == [(b"x", None)]
    eng.answers = Answers(frames=b"")
    assert list(endpoint(eng).exec_start("e1").frames()) == []


def test_an_execs_input_is_sent_and_ended_and_its_output_read_after(eng: SocketEngine) -> None:
    rec = fx("exec")["stdin"]
    raw = base64.b64decode(rec["socket_raw_b64"])
    eng.answers = Answers(frames=lambda given: raw if given == rec["stdin"].encode() else b"")
    ep = endpoint(eng)
    ep.exec_create("c1", rec["cmd"], stdin=True)
    assert eng.called("POST", "/exec")[0].body["AttachStdin"] is True
    conn = ep.exec_start("e1")
    conn.send(rec["stdin"].encode())
    conn.end_input()
    assert b"".join(o or e or b"" for o, e in conn.frames()) == b"hello stdin\ndone\n"
    assert eng.stdin == [b"hello stdin\n"]


def test_names_and_ids_are_quoted_in_paths(eng: SocketEngine) -> None:
    ep = endpoint(eng)
    ep.exec_create("a b/../c?d", ["true"])
    assert eng.asked[-1].path == "/containers/a b/../c?d/exec"  # one segment, decoded back as sent
    assert "%2F" in wire._quote("a/b") and wire._quote("hp-lab_1.x~") == "hp-lab_1.x~"


# -- errors --------------------------------------------------------------------------
def test_the_engines_refusals_are_api_errors_with_its_status_and_message(eng: SocketEngine) -> None:
    rec = {e["call"]: e for e in fx("errors")}["exec_create(stopped)"]
    eng.answers = Answers(exec_create=(409, json.loads(rec["body"])))
    with pytest.raises(wire.ApiError, match="is not running") as ei:
        endpoint(eng).exec_create("c1", ["true"])
    assert ei.value.status == 409
    eng.answers = Answers(start_status=(404, {"message": "No such exec instance: e9"}))
    with pytest.raises(wire.ApiError, match="No such exec instance") as ei:
        endpoint(eng).exec_start("e9")
    assert ei.value.status == 404


def test_no_engine_at_the_address_is_unreachable(tmp_path: Path) -> None:
    with pytest.raises(wire.Unreachable, match="nonexistent"):
        wire.Endpoint(f"unix://{tmp_path}/nonexistent.sock").containers({})
    with pytest.raises(wire.Unreachable):
        wire.Endpoint("tcp://127.0.0.1:9", connect_timeout=1).containers({})  # the discard port: refused


def _server(tmp_path: Path, answer: bytes | None) -> str:
    """A unix socket that accepts, reads a request, then answers `answer` (None: never)."""
    path = str(tmp_path / "odd.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.recv(65536)
            if answer is not None:
                c.sendall(answer)
                c.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"unix://{path}"


def test_an_answer_that_is_not_http_is_broken(tmp_path: Path) -> None:
    with pytest.raises(wire.Broken, match="not HTTP"):
        wire.Endpoint(_server(tmp_path, b"SSH-2.0-OpenSSH\r\n\r\n")).containers({})


def test_an_answer_cut_short_is_broken(tmp_path: Path) -> None:
    url = _server(tmp_path, b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n[{")
    with pytest.raises(wire.Broken, match="ended early"):
        wire.Endpoint(url).containers({})


def test_an_engine_that_accepts_and_never_answers_costs_the_connect_timeout(tmp_path: Path) -> None:
    url = _server(tmp_path, None)
    t0 = time.monotonic()
    with pytest.raises(wire.Broken, match="no answer within 0.3 s"):
        wire.Endpoint(url, timeout=30, connect_timeout=0.3).containers({})
    assert time.monotonic() - t0 < 3


# -- TLS and ssh ---------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_tls_to_an_engine_checks_its_certificate_and_sends_the_clients(tmp_path: Path) -> None:
    d = tmp_path / "tls"
    d.mkdir()

    def run(*a: str) -> None:
        subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=hp-ut-ca",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
    )
    for who, cn in (("server", "localhost"), ("cert", "client")):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={cn}",
            "-keyout",
            f"{who}-key.pem" if who == "server" else "key.pem",
            "-out",
            f"{who}.csr",
        )
        ext = d / f"{who}.ext"
        ext.write_text("subjectAltName=DNS:localhost\n" if who == "server" else "extendedKeyUsage=clientAuth\n")
        run(
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            ext.name,
            "-out",
            f"{who}.pem" if who == "server" else "cert.pem",
        )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(d / "ca.pem"))
    ctx.load_cert_chain(d / "server.pem", d / "server-key.pem")
    ctx.verify_mode = ssl.CERT_REQUIRED  # the engine asks for the client's certificate
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    seen: list[str] = []

    def serve() -> None:
        while True:
            try:
                raw, _ = srv.accept()
            except OSError:
                return
            try:
                with ctx.wrap_socket(raw, server_side=True) as c:
                    seen.append(c.getpeercert()["subject"][0][0][1])
                    c.recv(65536)
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")
            except ssl.SSLError:
                pass  # the client refused this engine's certificate

    threading.Thread(target=serve, daemon=True).start()
    ep = wire.Endpoint(f"tcp://localhost:{port}", wire.Tls.from_dir(str(d)))
    assert ep.containers({}) == [] and seen == ["client"]
    with pytest.raises(wire.Unreachable, match="certificate"):  # an engine signed by another CA
        other = tmp_path / "other"
        other.mkdir()
        shutil.copy(d / "server.pem", other / "ca.pem")
        tls = wire.Tls(str(other / "ca.pem"), None, None)
        wire.Endpoint(f"tcp://localhost:{port}", tls, connect_timeout=10).containers({})
    srv.close()


def test_ssh_runs_dial_stdio_on_the_host_and_speaks_through_it(
    eng: SocketEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in `ssh` on PATH records its arguments and bridges its stdio to the
    stand-in engine's socket, as `docker system dial-stdio` does on the far host."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ssh-args"
    sock = eng.url.removeprefix("unix://")
    ssh = bin_dir / "ssh"
    ssh.write_text(
        f"#!{sys.executable}\n"
        "import os, socket, sys, threading\n"
        f"open({str(log)!r}, 'a').write(repr(sys.argv[1:]) + '\\n')\n"
        f"s = socket.socket(socket.AF_UNIX); s.connect({sock!r})\n"
        "def up():\n"
        "    while d := os.read(0, 65536): s.sendall(d)\n"
        "    s.shutdown(socket.SHUT_WR)\n"
        "threading.Thread(target=up, daemon=True).start()\n"
        "while d := s.recv(65536): os.write(1, d)\n"
    )
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    eng.answers = Answers(containers=[{"Id": "c1"}], frames=frame(1, b"over ssh\n"))
    ep = wire.Endpoint("ssh://ops@gpu1:2222")
    assert ep.containers({}) == [{"Id": "c1"}]
    eid = ep.exec_create("c1", ["echo"])
    assert list(ep.exec_start(eid).frames()) == [(b"over ssh\n", None)]
    assert log.read_text().splitlines()[0] == repr(
        ["-l", "ops", "-p", "2222", "--", "gpu1", "docker system dial-stdio"]
    )
    ep.close()


def test_no_ssh_client_is_unreachable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(wire.Unreachable, match="cannot run ssh"):
        wire.Endpoint("ssh://gpu1").containers({})


def test_wire_imports_no_more_than_the_standard_librarys_light_modules() -> None:
    code = (
        "import sys; import orchestrator.docker.wire; "
        "heavy = [m for m in ('docker', 'requests', 'urllib3', 'ssl', 'subprocess', 'typing', 'dataclasses') "
        "if m in sys.modules]; assert not heavy, heavy"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
