"""DockerEngine (orchestrator/docker/engine.py) without an engine: docker-py's APIClient is
replaced by `Recorded`, a subclass whose calls that would reach the engine answer with
what this machine's dockerd 20.10 really answered (tests/fixtures/docker-20.10-*.json,
see tests/fixtures/README-docker.md), while its pure helpers (host config, networking
config) stay docker-py's own. Errors are docker-py's own exceptions, rebuilt from the
engine's recorded HTTP answers by docker-py's own constructor; a missing engine is a
real connection to a socket that does not exist."""

from __future__ import annotations

import base64
import io
import json
import socketserver
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker
import pytest
import requests
import urllib3
from socket_engine import Answers, SocketEngine, frame

from orchestrator.docker import engine as engine_mod
from orchestrator.docker.engine import UNPAUSE_TIMEOUT_S, DockerEngine, _exit_code
from orchestrator.docker.views import ContainerSpec, Event, ExecHandle
from orchestrator.errors import EngineError, EngineUnavailable, ObjectMissing
from orchestrator.gpu.wiring import GpuWiring

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NO_ENGINE = "unix:///nonexistent/hp-ut-docker.sock"


def fx(name: str) -> Any:
    return json.loads((FIXTURES / f"docker-20.10-{name}.json").read_text())


def b64(s: str) -> bytes:
    return base64.b64decode(s)


def recorded_error(call: str) -> docker.errors.APIError:
    """docker-py's exception for an answer the engine gave (built as docker-py builds it)."""
    rec = next(e for e in fx("errors") if e["call"] == call)
    resp = requests.Response()
    resp.status_code = rec["status_code"]
    resp._content = rec["body"].encode()
    resp.url = "http+docker://localhost/v1.41/recorded"
    resp.reason = "recorded"
    try:
        docker.errors.create_api_error_from_http_exception(requests.HTTPError(response=resp))
    except docker.errors.APIError as e:
        assert type(e).__name__ == rec["raised"], f"{call}: docker-py now raises {type(e).__name__}"
        return e
    raise AssertionError("create_api_error_from_http_exception raised nothing")


IO_METHODS = (
    "ping info create_network remove_network networks create_volume remove_volume volumes create_container "
    "put_archive get_archive start restart unpause kill remove_container containers inspect_container logs exec_create "
    "exec_start exec_inspect events inspect_image pull import_image_from_file build tag load_image _get _post wait"
).split()


class Recorded(docker.APIClient):
    """docker-py's APIClient whose engine calls answer from `answers` (a value, a callable,
    or an exception to raise) and are logged in `calls`."""

    def __init__(self, **answers: Any):
        super().__init__(base_url=NO_ENGINE, version="1.41")  # an explicit version: no I/O here
        self.answers = answers
        self.calls: list[tuple[str, tuple, dict]] = []

    def _answer(self, method: str, /, *args: Any, **kw: Any) -> Any:
        self.calls.append((method, args, kw))
        if method not in self.answers:
            raise AssertionError(f"unexpected engine call {method}{args}")
        a = self.answers[method]
        if isinstance(a, BaseException):
            raise a
        return a(*args, **kw) if callable(a) else a

    def called(self, name: str) -> list[tuple[tuple, dict]]:
        return [(a, k) for n, a, k in self.calls if n == name]


for _m in IO_METHODS:
    setattr(Recorded, _m, lambda self, *a, _n=_m, **kw: self._answer(_n, *a, **kw))


def engine(name: str = "", **answers: Any) -> tuple[DockerEngine, Recorded]:
    e = DockerEngine(name=name)
    api = Recorded(**answers)
    e._api = api
    return e, api


# -- the engine ----------------------------------------------------------------------
def test_info_is_mapped_from_the_recorded_engine_and_fetched_once() -> None:
    raw = fx("info")["info"]
    e, api = engine(info=raw)
    i = e.info()
    assert (i.name, i.server_version, i.os, i.arch) == (
        "ut-host",
        "20.10.24+dfsg1",
        raw["OperatingSystem"],
        "x86_64",
    )
    assert i.cpus == 2 and i.memory_bytes == raw["MemTotal"] and i.memory_mib == raw["MemTotal"] // 2**20
    assert i.runtimes == ("io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "runc")
    assert (i.swarm_state, i.swarm_node_id, i.swarm_manager, i.cgroup_version) == ("inactive", "", False, "1")
    assert i.cdi_spec_dirs == ()
    assert e.info() is i and len(api.called("info")) == 1


def test_info_of_a_swarm_manager_and_of_an_engine_that_hides_its_cpus() -> None:
    raw = dict(fx("info")["info"])
    raw.update(
        NCPU=0,
        Swarm={"LocalNodeState": "active", "NodeID": "n1", "ControlAvailable": True},
        CDISpecDirs=["/etc/cdi"],
        Runtimes=None,
    )
    i = engine(info=raw)[0].info()
    assert i.cpus >= 1  # the local count stands in
    assert (i.swarm_state, i.swarm_node_id, i.swarm_manager) == ("active", "n1", True)
    assert i.cdi_spec_dirs == ("/etc/cdi",) and i.runtimes == ()


def test_ping_without_an_engine_is_engine_unavailable_with_how_to_start_one() -> None:
    e = DockerEngine()
    e._api = docker.APIClient(base_url=NO_ENGINE, version="1.41")  # a real connection attempt
    with pytest.raises(EngineUnavailable) as ei:
        e.ping()
    msg = str(ei.value)
    assert "cannot reach a Docker engine" in msg and "DOCKER_HOST" in msg and "docker.io" in msg
    assert ei.value.exit_code == 1


def test_the_client_is_made_lazily_and_a_missing_engine_names_where_it_was_looked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(EngineUnavailable, match="at unix:///nonexistent/hp-ut-docker.sock"):
        DockerEngine(base_url=NO_ENGINE).api  # noqa: B018
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/hp-ut-env.sock")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    monkeypatch.delenv("DOCKER_CERT_PATH", raising=False)
    e = DockerEngine()
    assert e._api is None  # nothing is reached before it is needed
    with pytest.raises(EngineUnavailable, match="hp-ut-env.sock"):
        e.ping()


class _UnixHttp(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def tiny_engine(tmp_path: Path) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    """A unix-socket HTTP server answering a ping (with the headers put in the dict it
    gives), /version (ApiVersion 1.40) and an empty container list; and the paths asked."""
    asked: list[str] = []
    ping_headers: dict[str, str] = {}

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            asked.append(self.path.split("?")[0])
            body, headers = b"[]", {"Content-Type": "application/json"}
            if self.path == "/_ping":
                body, headers = b"OK", {"Content-Type": "text/plain", **ping_headers}
            elif self.path == "/version":
                body = json.dumps({"ApiVersion": "1.40", "Version": "19.03.15"}).encode()
            self.send_response(200)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    path = tmp_path / "engine.sock"
    srv = _UnixHttp(str(path), Answer)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"unix://{path}", asked, ping_headers
    srv.shutdown()
    srv.server_close()


def test_the_engines_api_version_is_read_from_its_ping_not_from_version(tiny_engine: Any) -> None:
    """docker-py's "auto" asks /version (~10 ms of every command); the ping's API-Version
    header names the same version (~1 ms). Without the header: docker-py's own way."""
    url, asked, ping_headers = tiny_engine
    ping_headers["API-Version"] = "1.41"
    e = DockerEngine(url)
    assert e.networks() == [] and e.api.api_version == "1.41"
    assert asked == ["/_ping", "/v1.41/networks"]
    del ping_headers["API-Version"]
    asked.clear()
    e = DockerEngine(url)
    assert e.networks() == [] and e.api.api_version == "1.40"
    assert asked == ["/_ping", "/version", "/v1.40/networks"]
    ping_headers["API-Version"] = "1.12"
    with pytest.raises(EngineUnavailable, match="API version 1.12 is below 1.24"):
        DockerEngine(url).networks()


@pytest.mark.parametrize(
    "exc, kind, status",
    [
        (requests.exceptions.ConnectionError("refused"), EngineUnavailable, None),
        (docker.errors.DockerException("no context"), EngineUnavailable, None),
        (ConnectionResetError(104, "Connection reset by peer"), EngineUnavailable, None),
        (requests.exceptions.ReadTimeout("read timed out"), EngineError, 0),
        (urllib3.exceptions.ProtocolError("broken stream"), EngineError, 0),
    ],
)
def test_transport_failures_become_typed_errors(exc: BaseException, kind: type, status: int | None) -> None:
    e, _ = engine(start=exc)
    with pytest.raises(kind) as ei:
        e.start("c1")
    assert type(ei.value) is kind
    if status is not None:
        assert ei.value.status == status and str(ei.value).startswith("start c1: ")


RECORDED_API_ERRORS = [x["call"] for x in fx("errors") if x.get("status_code")]


@pytest.mark.parametrize("call", RECORDED_API_ERRORS)
def test_every_recorded_engine_error_maps_to_its_typed_error(call: str) -> None:
    err = recorded_error(call)
    rec = next(e for e in fx("errors") if e["call"] == call)
    with pytest.raises(EngineError) as ei:
        with engine_mod._errors("doing it"):
            raise err
    got = ei.value
    assert got.status == rec["status_code"]
    assert str(got) == f"doing it: {rec['explanation']}"[: len("doing it: ") + 300]
    assert isinstance(got, ObjectMissing) == (rec["status_code"] == 404)
    assert got.missing == (rec["status_code"] == 404) and got.conflict == (rec["status_code"] == 409)


def test_the_recorded_connection_error_is_what_a_real_missing_socket_raises() -> None:
    rec = next(e for e in fx("errors") if e["call"] == "ping(no engine)")
    with pytest.raises(requests.exceptions.ConnectionError) as ei:
        docker.APIClient(base_url=NO_ENGINE, version="1.41").ping()
    assert rec["raised"] == "requests.exceptions.ConnectionError"
    assert str(ei.value) == rec["str"]


# -- networks and volumes ------------------------------------------------------------
def test_networks_and_volumes_are_selected_by_label_and_mapped() -> None:
    nets, vols = fx("networks"), fx("volumes")
    e, api = engine("h1", networks=nets["networks"], volumes={"Volumes": vols["volumes"]["Volumes"], "Warnings": None})
    [n] = e.networks("ut-rec")
    assert api.called("networks")[0][1] == {"filters": nets["filters"]}
    assert (n.name, n.driver, n.host) == ("ut-rec-net", "bridge", "h1")
    assert n.id == nets["networks"][0]["Id"] and n.labels["io.hp.role"] == "network"
    [v] = e.volumes("ut-rec")
    assert api.called("volumes")[0][1] == {"filters": vols["filters"]}
    assert (v.name, v.labels["io.hp.role"], v.host) == ("ut-rec-home", "shared", "h1")
    e.networks()
    e.volumes()
    assert api.called("networks")[1][1] == {"filters": {"label": "io.hp.managed=1"}}  # every hp-managed one
    api.answers["volumes"] = {"Volumes": None, "Warnings": None}
    assert e.volumes() == []


def test_create_and_remove_networks_and_volumes() -> None:
    net_id = fx("networks")["networks"][0]["Id"]
    e, api = engine(
        create_network={"Id": net_id, "Warning": ""},
        remove_network=recorded_error("remove_network(missing)"),
        create_volume={"Name": "v"},
        remove_volume=recorded_error("remove_volume(in use)"),
    )
    assert e.create_network("ut-rec-net", {"a": "b"}) == net_id
    assert api.called("create_network")[0] == (
        ("ut-rec-net",),
        {"driver": "bridge", "labels": {"a": "b"}, "check_duplicate": True},
    )
    e.remove_network("ut-rec-nope")  # one that does not exist is no error
    e.create_volume("v", {"a": "b"})
    assert api.called("create_volume")[0][1] == {"name": "v", "labels": {"a": "b"}}
    with pytest.raises(EngineError, match="volume is in use") as ei:
        e.remove_volume("ut-rec-home")
    assert ei.value.status == 409
    api.answers["remove_volume"] = recorded_error("remove_network(missing)")  # a 404: gone already
    e.remove_volume("ut-rec-home")
    api.answers["create_network"] = recorded_error("create_network(duplicate)")
    with pytest.raises(EngineError, match="create network ut-rec-net: network with name ut-rec-net already exists"):
        e.create_network("ut-rec-net", {})


# -- containers ----------------------------------------------------------------------
def test_containers_are_mapped_from_the_recorded_list(tmp_path: Path) -> None:
    rec = fx("containers")
    srv = SocketEngine(tmp_path / "engine.sock", Answers(containers=rec["containers"]))
    e = DockerEngine(srv.url, name="h1")
    cs = {c.name: c for c in e.containers("ut-rec")}
    assert json.loads(srv.asked[0].query["filters"][0]) == rec["filters"] and srv.asked[0].query["all"] == ["1"]
    assert set(cs) == {"ut-rec-cpu-1", "ut-rec-check-cpu-1", "ut-rec-cpu-2"}
    node, chk, dead = cs["ut-rec-cpu-1"], cs["ut-rec-check-cpu-1"], cs["ut-rec-cpu-2"]
    assert node.id == rec["ids"]["node"] and node.host == "h1"
    assert node.running and not node.dead and node.exit_code == 0 and node.ip and node.ip.count(".") == 3
    assert (node.node, node.role, node.group, node.index, node.itype) == ("cpu-1", "worker", "cpu", 1, "cpu.nano")
    assert node.is_node and not chk.is_node  # a check container carries its node's labels, but is none
    assert chk.ip is None  # it lives in the node's network namespace: no network of its own
    assert dead.dead and not dead.running and dead.exit_code == 3 and dead.ip is None
    assert all(c.image.startswith("hp-worker:") for c in cs.values())
    assert all(len(c.created) == 20 and c.created.endswith("Z") for c in cs.values())
    e.containers("ut-rec", extra_labels={"io.hp.role": "worker"})
    assert json.loads(srv.asked[1].query["filters"][0]) == {"label": ["io.hp.cluster=ut-rec", "io.hp.role=worker"]}
    e.containers()
    assert json.loads(srv.asked[2].query["filters"][0]) == {"label": ["io.hp.managed=1"]}
    e.containers(extra_labels={"io.hp.managed": "0", "io.hp.role": "gpu-probe"})  # hp's helpers: their mark, not hp's
    assert json.loads(srv.asked[3].query["filters"][0]) == {"label": ["io.hp.managed=0", "io.hp.role=gpu-probe"]}
    assert e._api is None  # a listing loads no docker-py
    srv.close()


def test_inspect_maps_state_and_limits_in_the_engines_own_words() -> None:
    rec = fx("inspect")
    e, _ = engine("h1", inspect_container=lambda cid: {"n": rec["node"], "c": rec["check"], "x": rec["exited"]}[cid])
    node = e.inspect("n")
    assert node.name == "ut-rec-cpu-1" and node.image.startswith("hp-worker:") and node.host == "h1"
    assert node.labels["io.hp.node"] == "cpu-1"
    assert node.limits.nano_cpus == 250_000_000 and node.limits.granted_cpus == 0.25
    assert node.limits.memory_bytes == 256 * 2**20 and node.limits.memory_mib == 256
    assert node.state.running and node.state.status == "running"
    assert node.addresses == {"ut-rec-net": "192.168.144.2"}  # where a cluster's service is reached
    chk = e.inspect("c")
    assert (chk.limits.cpu_quota, chk.limits.cpu_period, chk.limits.granted_cpus) == (50000, 100000, 0.5)
    dead = e.inspect("x")
    assert not dead.state.running and dead.state.exit_code == 3 and not dead.state.oom_killed
    want = {
        k: rec["exited"]["State"][k]
        for k in ("Status", "Running", "ExitCode", "OOMKilled", "StartedAt", "FinishedAt", "Error")
    }
    assert dead.state.as_dict() == want
    assert dead.limits.granted_cpus is None and dead.limits.memory_mib is None
    assert dead.addresses == {}  # a stopped container has no address


def test_inspect_of_a_missing_container_is_object_missing() -> None:
    e, _ = engine(inspect_container=recorded_error("inspect_container(missing)"))
    with pytest.raises(ObjectMissing, match="inspect ut-rec-nope: No such container: ut-rec-nope"):
        e.inspect("ut-rec-nope")


NODE_SPEC = ContainerSpec(
    name="ut-rec-cpu-1",
    image="hp-worker:d8f7caa5c95b",
    labels={"io.hp.cluster": "ut-rec", "io.hp.node": "cpu-1"},
    hostname="cpu-1",
    network="ut-rec-net",
    environment={"HP_ROLE": "worker", "HP_X": "1"},
    volumes={"ut-rec-home": "/home"},
    cpu_limit=0.25,
    memory_bytes=256 * 2**20,
    command=["sleep", "300"],
    cap_add=["SYS_NICE"],
    devices=["/dev/fuse:/dev/fuse:rwm"],
    security_opt=["apparmor=unconfined"],
)
HOST_CONFIG_KEYS = (
    "NanoCpus",
    "Memory",
    "MemorySwap",
    "NetworkMode",
    "Devices",
    "CapAdd",
    "SecurityOpt",
    "Init",
    "Binds",
)


def created(api: Recorded, i: int = -1) -> tuple[tuple, dict]:
    return api.called("create_container")[i]


def test_create_container_builds_the_host_config_the_engine_recorded_for_the_same_spec() -> None:
    """The recording made this very spec through DockerEngine.create_container; the engine's
    inspect shows what it understood. The host config built now must say the same."""
    rec = fx("inspect")["node"]
    e, api = engine(create_container={"Id": rec["Id"], "Warnings": []})
    assert e.create_container(NODE_SPEC) == rec["Id"]
    (image,), kw = created(api)
    assert image == NODE_SPEC.image
    hc = kw["host_config"]
    for k in HOST_CONFIG_KEYS:
        assert hc.get(k) == rec["HostConfig"][k], k
    assert kw["name"] == "ut-rec-cpu-1" and kw["hostname"] == rec["Config"]["Hostname"] == "cpu-1"
    assert kw["command"] == rec["Config"]["Cmd"] == ["sleep", "300"]
    # hp publishes no port of any container (the recording made this spec with one, 8080, before issue 24)
    assert "ports" not in kw and not hc.get("PortBindings")
    assert kw["environment"] == {"HP_ROLE": "worker", "HP_X": "1"}
    assert {"HP_ROLE=worker", "HP_X=1"} <= set(rec["Config"]["Env"])
    assert kw["labels"] == NODE_SPEC.labels
    assert kw["networking_config"] == {"EndpointsConfig": {"ut-rec-net": {"Aliases": ["cpu-1"]}}}
    assert "cpu-1" in rec["NetworkSettings"]["Networks"]["ut-rec-net"]["Aliases"]
    assert hc["Sysctls"] == {"net.ipv4.neigh.eth0.retrans_time_ms": "50"}  # engine.NEIGHBOUR_SYSCTLS


def test_create_container_in_another_containers_network_with_a_cfs_quota() -> None:
    rec = fx("inspect")
    node_id = rec["node"]["Id"]
    e, api = engine(create_container={"Id": rec["check"]["Id"], "Warnings": []})
    spec = ContainerSpec(
        name="ut-rec-check-cpu-1",
        image="hp-worker:d8f7caa5c95b",
        labels={},
        hostname="ignored",
        network="also-ignored",
        network_of=node_id,
        cpu_quota=50000,
        cpu_period=100000,
        memory_bytes=128 * 2**20,
        command=["sleep", "300"],
        init=False,
    )
    e.create_container(spec)
    _, kw = created(api)
    for k in ("CpuQuota", "CpuPeriod", "Memory", "MemorySwap", "NetworkMode", "Init"):
        assert kw["host_config"].get(k) == rec["check"]["HostConfig"][k], k
    assert "NanoCpus" not in kw["host_config"] and "Sysctls" not in kw["host_config"]  # its node's namespace
    assert kw["hostname"] is None and kw["networking_config"] is None and "ports" not in kw


def test_create_container_limits_defaults_and_no_network() -> None:
    e, api = engine(create_container={"Id": "c", "Warnings": []})
    e.create_container(ContainerSpec(name="a", image="i", labels={}, cpu_quota=20000))
    hc = created(api)[1]["host_config"]
    assert (hc["CpuQuota"], hc["CpuPeriod"]) == (20000, 100000)  # the default CFS period
    assert "Memory" not in hc and "PortBindings" not in hc and "Devices" not in hc and "CapAdd" not in hc
    e.create_container(ContainerSpec(name="b", image="i", labels={}, cpu_quota=-1, network="n"))
    _, kw = created(api)
    assert "CpuQuota" not in kw["host_config"] and "NanoCpus" not in kw["host_config"]
    assert kw["networking_config"] == {"EndpointsConfig": {"n": {}}}  # no hostname: no alias


def test_create_container_wires_gpus_into_requests_devices_binds_and_environment() -> None:
    e, api = engine(create_container={"Id": "c", "Warnings": []})
    gpus = GpuWiring(
        mode="runtime",
        gpu_ids=("0", "1"),
        device_requests=({"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": [["gpu"]]},),
        devices=("/dev/nvidia0:/dev/nvidia0:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm"),
        binds=("/usr/lib/x86_64-linux-gnu/libcuda.so.1:/usr/lib/hp-gpu/libcuda.so.1:ro",),
        env={"NVIDIA_VISIBLE_DEVICES": "0,1", "HP_ROLE": "gpu-worker"},
    )
    spec = ContainerSpec(
        name="g",
        image="i",
        labels={},
        environment={"HP_ROLE": "worker", "A": "1"},
        volumes={"home": "/home"},
        binds=["/srv/data:/data:rw"],
        devices=["/dev/fuse:/dev/fuse:rwm"],
        gpus=gpus,
    )
    e.create_container(spec)
    _, kw = created(api)
    hc = kw["host_config"]
    assert hc["DeviceRequests"] == [
        {"Driver": "nvidia", "Count": 0, "DeviceIDs": ["0", "1"], "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert [d["PathOnHost"] for d in hc["Devices"]] == ["/dev/fuse", "/dev/nvidia0", "/dev/nvidiactl"]
    assert sorted(hc["Binds"]) == [
        "/srv/data:/data:rw",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1:/usr/lib/hp-gpu/libcuda.so.1:ro",
        "home:/home:rw",
    ]
    assert kw["environment"] == {"HP_ROLE": "gpu-worker", "A": "1", "NVIDIA_VISIBLE_DEVICES": "0,1"}
    assert spec.environment == {"HP_ROLE": "worker", "A": "1"} and spec.devices == ["/dev/fuse:/dev/fuse:rwm"]
    # device nodes only (no NVIDIA runtime, no CDI): no device request at all
    plain = GpuWiring(mode="devices", gpu_ids=("0",), devices=("/dev/nvidia0:/dev/nvidia0:rwm",))
    e.create_container(ContainerSpec(name="h", image="i", labels={}, gpus=plain))
    assert "DeviceRequests" not in created(api)[1]["host_config"]


def test_create_container_without_any_network() -> None:
    e, api = engine(create_container={"Id": "c", "Warnings": []})
    e.create_container(ContainerSpec(name="probe", image="i", labels={}, hostname="p", network="none"))
    _, kw = created(api)
    assert kw["host_config"]["NetworkMode"] == "none" and kw["networking_config"] is None


def test_create_container_errors_are_typed() -> None:
    e, api = engine(create_container=recorded_error("create_container(missing image)"))
    with pytest.raises(ObjectMissing, match="create container a: No such image: ut-rec-nope:1"):
        e.create_container(ContainerSpec(name="a", image="ut-rec-nope:1", labels={}))
    api.answers["create_container"] = recorded_error("create_container(name in use)")
    with pytest.raises(
        EngineError, match='create container ut-rec-cpu-1: Conflict. The container name "/ut-rec-cpu-1"'
    ) as ei:
        e.create_container(NODE_SPEC)
    assert ei.value.conflict and not isinstance(ei.value, ObjectMissing)


def answer(call: str | None) -> Any:
    """What the engine answers a raw POST: 204, or the recorded error of `call`."""

    def post(*_: Any, **__: Any) -> requests.Response:
        resp = requests.Response()
        if call is None:
            resp.status_code, resp._content = 204, b""
        else:
            rec = next(e for e in fx("errors") if e["call"] == call)
            resp.status_code, resp._content = rec["status_code"], rec["body"].encode()
        resp.url, resp.reason = "http+docker://localhost/v1.41/recorded", "recorded"
        return resp

    return post


def test_a_container_wedged_frozen_is_thawed_through_its_cgroup_then_restarted() -> None:
    """docker pause during an exec on Docker 20.10: the unpause never answers; hp thaws the
    container's freezer cgroup from a helper container of the same image, then goes on."""
    posts = [requests.exceptions.ReadTimeout("Read timed out. (read timeout=10)"), answer("unpause(not paused)")()]

    def post(*_: Any, **__: Any) -> Any:
        a = posts.pop(0)
        if isinstance(a, BaseException):
            raise a
        return a

    full = "4e6afb1515e2b6f8ea0c8365968dbb0b1eb482302dcd8b12c53b7033c457b810"
    listed = [{"Id": full, "Image": "hp-worker:abc", "Names": ["/hp-x-controller-1"], "State": "paused"}]
    e, api = engine(
        _post=post,
        containers=lambda all, filters: listed if filters in ({"id": full}, {"name": full}) else [],
        create_container={"Id": "h1"},
        start=None,
        wait={"StatusCode": 0},
        logs=b"thawed /cg/freezer/docker/" + full.encode() + b"/freezer.state\n",
        remove_container=None,
        restart=None,
    )
    e.restart(full, timeout=2)
    (img,), kw = api.called("create_container")[0]
    assert img == "hp-worker:abc" and kw["entrypoint"][:2] == ["sh", "-c"] and kw["entrypoint"][3:] == ["thaw", full]
    assert kw["host_config"]["Binds"] == ["/sys/fs/cgroup:/cg:rw"] and kw["host_config"]["NetworkMode"] == "none"
    assert kw["labels"]["io.hp.role"] == "thaw" and "io.hp.cluster" not in kw["labels"]
    assert api.called("remove_container") == [(("h1",), {"force": True, "v": False})]  # the helper, gone
    assert api.called("restart") == [((full,), {"timeout": 2})] and api.called("inspect_container") == []
    # a helper that finds no freezer to thaw: the reason, not a hang
    posts[:] = [requests.exceptions.ReadTimeout("Read timed out.")]
    api.answers.update(wait={"StatusCode": 3}, logs=b"no writable freezer cgroup for x under /sys/fs/cgroup\n")
    with pytest.raises(EngineError) as ei:
        e.restart(full, timeout=2)
    assert "could not be thawed" in str(ei.value) and "no writable freezer cgroup" in str(ei.value)


def test_a_slow_engine_gets_one_thaw_helper_never_a_chain_of_them() -> None:
    """An engine that times out every removal and unpause (a CI run's engine under load): the
    removal tries one thaw, the helper's own removal times out too and is not thawed in turn
    (a helper for the helper, for that helper...: one run left 306 of them)."""

    def timeout(*_: Any, **__: Any) -> Any:
        raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=60)")

    full = "4e6afb1515e2b6f8ea0c8365968dbb0b1eb482302dcd8b12c53b7033c457b810"
    listed = [{"Id": full, "Image": "hp-worker:abc", "Names": ["/hp-x-cpu-1"], "Labels": {}}]
    e, api = engine(
        _post=timeout,
        containers=lambda all, filters: listed if filters in ({"id": full}, {"name": full}) else [],
        create_container={"Id": "h1"},
        start=None,
        wait={"StatusCode": 0},
        logs=b"",
        remove_container=timeout,
    )
    with pytest.raises(EngineError, match="timed out"):
        e.remove_container(full)
    assert len(api.called("create_container")) == 1  # one helper, for the node
    assert [a for a, _ in api.called("remove_container")] == [(full,), ("h1",)]
    # a thaw helper is never thawed itself
    listed[0]["Labels"] = {"io.hp.role": "thaw"}
    with pytest.raises(EngineError, match="never thawed itself"):
        e.unfreeze(full)
    assert len(api.called("create_container")) == 1


def test_start_restart_kill_remove() -> None:
    e, api = engine(start=None, restart=None, kill=None, remove_container=None, _post=answer("unpause(not paused)"))
    e.start("c1")
    e.restart("c1", timeout=7)  # not frozen (20.10's 500 "is not paused"): restarted
    api.answers.update(_post=answer(None))
    e.restart("c1", timeout=7)  # frozen: thawed first
    api.answers.update(_post=answer("kill(stopped)"))
    e.restart("c1", timeout=7)  # a 409 (later engines' "not paused", or thawed meanwhile): restarted all the same
    assert [a[0] for a, _ in api.called("_post")] == ["http+docker://localhost/v1.41/containers/c1/unpause"] * 3
    assert all(k == {"timeout": UNPAUSE_TIMEOUT_S} for _, k in api.called("_post"))
    # never an inspect first: Docker 20.10 holds its exec lock while an exec starts in a
    # container that froze meanwhile, and every inspect of it waits for the thaw
    assert api.called("inspect_container") == []
    api.answers.update(_post=answer("pull(no registry)"))  # another 500: a real failure
    with pytest.raises(EngineError):
        e.restart("c1", timeout=7)
    api.answers.update(_post=answer(None))
    e.kill("c1")
    e.remove_container("c1")
    assert api.called("restart") == [(("c1",), {"timeout": 7})] * 3
    assert api.called("remove_container") == [(("c1",), {"force": True, "v": False})]  # never the volumes
    api.answers.update(kill=recorded_error("kill(stopped)"))
    e.kill("c1")  # not running: nothing to kill
    api.answers.update(
        kill=recorded_error("kill(missing)"), remove_container=recorded_error("inspect_container(missing)")
    )
    e.kill("c1")
    e.remove_container("c1")  # gone already: no error
    api.answers.update(kill=recorded_error("pull(no registry)"))  # a 500 is a real failure
    with pytest.raises(EngineError) as ei:
        e.kill("c1")
    assert ei.value.status == 500
    api.answers.update(start=recorded_error("start(missing)"))
    with pytest.raises(ObjectMissing, match="start ut-rec-nope"):
        e.start("ut-rec-nope")


def test_logs_are_decoded_with_the_tail_asked_for() -> None:
    logs = b64(fx("inspect")["exited_logs_b64"])
    e, api = engine(logs=logs + b"\xff")
    assert e.logs("c", tail=5) == "out\nerr\n\ufffd"
    assert api.called("logs")[0] == (("c",), {"stdout": True, "stderr": True, "tail": 5})


# -- files ---------------------------------------------------------------------------
def test_put_files_sends_one_tar_with_modes_and_owners() -> None:
    rec = fx("archive")["put_files"]
    e, api = engine(put_archive=True)
    files = {n: (c.encode(), 0o755 if n.endswith(".sh") else 0o644, 1000) for n, c in rec["files"].items()}
    e.put_files("c1", rec["directory"], files)
    [((cid, directory, data), _)] = api.called("put_archive")
    assert (cid, directory) == ("c1", "/tmp")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        got = {m.name: (tar.extractfile(m).read().decode(), m.mode, m.uid, m.gid) for m in tar}  # type: ignore[union-attr]
    assert got == {"ut-a.txt": ("alpha\n", 0o644, 1000, 1000), "ut-b.sh": ("#!/bin/sh\necho b\n", 0o755, 1000, 1000)}
    api.answers["put_archive"] = recorded_error("inspect_container(missing)")
    with pytest.raises(ObjectMissing, match="copy files into c1:/tmp"):
        e.put_files("c1", "/tmp", files)


def chunks_of(data: bytes, n: int = 7) -> Iterator[bytes]:
    return iter([data[i : i + n] for i in range(0, len(data), n)])


def test_get_file_and_get_dir_read_the_engines_tars() -> None:
    rec = fx("archive")
    f_tar, d_tar = b64(rec["file"]["tar_b64"]), b64(rec["dir"]["tar_b64"])
    e, api = engine(
        get_archive=lambda c, path: (chunks_of(f_tar if path == rec["file"]["path"] else d_tar), {"name": path})
    )
    assert e.get_file("c1", "/tmp/ut-a.txt") == b"alpha\n"
    # a folder: regular files only (no folders, no symlinks), named relative to it
    assert e.get_dir("c1", "/tmp/ut-dir") == {"one.log": b"one\n", "sub/two.log": b"two\n"}
    # a single file asked for as a folder (how logs reads slurm.conf): its own name
    assert e.get_dir("c1", "/tmp/ut-a.txt") == {"ut-a.txt": b"alpha\n"}
    assert e.get_file("c1", "/tmp/ut-dir") == b""  # a folder is not a file
    api.answers["get_archive"] = recorded_error("get_archive(missing path)")
    assert e.get_dir("c1", "/nonexistent/ut") == {}
    with pytest.raises(ObjectMissing, match="read c1:/nonexistent/ut: Could not find the file"):
        e.get_file("c1", "/nonexistent/ut")


def test_read_image_file_uses_a_throwaway_container_and_always_removes_it() -> None:
    rec = fx("images")
    tar = b64(rec["debian_version"]["tar_b64"])
    e, api = engine(
        create_container=rec["create_container"],
        get_archive=lambda c, p: (iter([tar]), rec["debian_version"]["stat"]),
        remove_container=None,
    )
    assert e.read_image_file("hp-worker:x", "/etc/debian_version") == b"13.8\n"  # Debian 13 (trixie)
    (image,), kw = created(api)
    assert image == "hp-worker:x" and kw == {"command": ["true"], "labels": {"io.hp.managed": "0"}}  # not hp's
    cid = rec["create_container"]["Id"]
    assert api.called("get_archive")[0][0] == (cid, "/etc/debian_version")
    assert api.called("remove_container")[0][0] == (cid,)
    api.answers["get_archive"] = recorded_error("get_archive(missing path)")
    with pytest.raises(ObjectMissing):
        e.read_image_file("hp-worker:x", "/nope")
    assert len(api.called("remove_container")) == 2  # removed on failure too
    api.answers["create_container"] = recorded_error("create_container(missing image)")
    with pytest.raises(ObjectMissing, match="read /x of image ut-rec-nope:1"):
        e.read_image_file("ut-rec-nope:1", "/x")


# -- exec (through wire.py: tests/unit/test_wire.py has the transport) -----------------
@pytest.fixture
def sock_engine(tmp_path: Path) -> Iterator[SocketEngine]:
    srv = SocketEngine(tmp_path / "engine.sock")
    yield srv
    srv.close()


def test_exec_collects_merged_output_and_the_exit_code(sock_engine: SocketEngine) -> None:
    rec = fx("exec")["plain"]
    sock_engine.answers = Answers(
        exec_create=(201, rec["exec_create"]),
        frames=frame(1, b"to-out\n") + frame(2, b"to-err\n"),
        exec_inspect=rec["exec_inspect"],
    )
    e = DockerEngine(sock_engine.url)
    res = e.exec("c1", rec["cmd"], user="hpuser", workdir="/home/hpuser", environment={"A": "1"})
    assert (res.exit_code, res.output) == (4, "to-out\nto-err\n")
    body = sock_engine.called("POST", "/exec")[0].body
    assert (body["Cmd"], body["User"], body["WorkingDir"], body["Env"], body["AttachStdin"]) == (
        rec["cmd"],
        "hpuser",
        "/home/hpuser",
        ["A=1"],
        False,
    )
    assert sock_engine.called("POST", "/start")[0].path == f"/exec/{rec['exec_create']['Id']}/start"
    sock_engine.answers.exec_inspect = {**rec["exec_inspect"], "ExitCode": None}  # still running / unknown
    assert e.exec("c1", ["true"]).exit_code == -1
    assert e._api is None  # an exec loads no docker-py


def test_an_execs_output_sent_with_the_headers_is_all_read(sock_engine: SocketEngine) -> None:
    """docker-py read a hijacked exec from under http.client's buffered reader, so what came
    with the headers was lost (docker/docker-py#2042: `scontrol --json` seen without its
    start); wire.py hands it out first."""
    stream = frame(1, b'{"nodes": [') + frame(2, b"warn\n") + frame(1, b"]}\n")
    sock_engine.answers = Answers(frames=stream, eager=True)
    e = DockerEngine(sock_engine.url)
    assert e.exec("c1", ["scontrol"]).output == '{"nodes": [warn\n]}\n'
    h = e.exec_stream("c1", ["scontrol"])
    assert list(h.chunks) == [(b'{"nodes": [', None), (None, b"warn\n"), (b"]}\n", None)]


def test_exec_with_stdin_writes_it_closes_input_and_demultiplexes_the_answer(sock_engine: SocketEngine) -> None:
    rec = fx("exec")["stdin"]
    raw = b64(rec["socket_raw_b64"])
    sock_engine.answers = Answers(
        exec_create=(201, rec["exec_create"]), frames=lambda given: raw, exec_inspect=rec["exec_inspect"]
    )
    e = DockerEngine(sock_engine.url)
    res = e.exec("c1", rec["cmd"], stdin=rec["stdin"].encode())
    assert (res.exit_code, res.output) == (5, "hello stdin\ndone\n")
    assert sock_engine.stdin == [b"hello stdin\n"]  # all of it, then the end of input
    assert sock_engine.called("POST", "/exec")[0].body["AttachStdin"] is True
    assert e.exec("c1", rec["cmd"], stdin=b"").output == "hello stdin\ndone\n" and sock_engine.stdin[-1] == b""


def test_exec_in_a_stopped_container_is_a_409_and_in_a_missing_one_object_missing(sock_engine: SocketEngine) -> None:
    errs = {r["call"]: r for r in fx("errors")}
    sock_engine.answers = Answers(exec_create=(409, json.loads(errs["exec_create(stopped)"]["body"])))
    e = DockerEngine(sock_engine.url)
    with pytest.raises(EngineError, match="run true in c1: Container .* is not running") as ei:
        e.exec("c1", ["true"])
    assert ei.value.status == 409 and type(ei.value) is EngineError
    sock_engine.answers = Answers(exec_create=(404, {"message": "No such container: nope"}))
    with pytest.raises(ObjectMissing, match="run true in nope: No such container"):
        e.exec_stream("nope", ["true"])


def test_exec_stream_yields_the_demuxed_chunks_and_its_exit_code(sock_engine: SocketEngine) -> None:
    rec = fx("exec")["stream"]
    chunks = [(b64(o) if o else None, b64(x) if x else None) for o, x in rec["chunks_b64"]]  # docker-py's demux
    raw = b"".join(frame(1, o) if o else frame(2, x or b"") for o, x in chunks)
    sock_engine.answers = Answers(
        exec_create=(201, rec["exec_create"]), frames=raw, step=3, exec_inspect=rec["exec_inspect"]
    )
    e = DockerEngine(sock_engine.url)
    h = e.exec_stream("c1", rec["cmd"], user="hpuser")
    assert h.id == rec["exec_create"]["Id"]
    assert list(h.chunks) == chunks  # frame by frame, though the engine wrote 3 bytes at a time
    assert e.exec_exit_code(h) == 0
    sock_engine.answers.exec_inspect = {"ExitCode": None}
    assert e.exec_exit_code(ExecHandle(iter(()), "x")) == -1


def test_an_exec_stream_left_early_closes_its_connection(sock_engine: SocketEngine) -> None:
    sock_engine.answers = Answers(frames=frame(1, b"a\n") * 100, step=16)
    h = DockerEngine(sock_engine.url).exec_stream("c1", ["yes"])
    assert next(iter(h.chunks)) == (b"a\n", None)
    h.chunks.close()  # type: ignore[attr-defined]  # a generator: the reader stops early


def test_execs_without_an_engine_are_engine_unavailable_with_how_to_start_one() -> None:
    e = DockerEngine(NO_ENGINE)
    with pytest.raises(EngineUnavailable, match="cannot reach a Docker engine.*hp-ut-docker.sock"):
        e.exec("c1", ["true"])
    with pytest.raises(EngineUnavailable, match="Start one"):
        e.containers("lab")


def test_exit_code_parsing() -> None:
    statuses = {c["Names"][0]: c["Status"] for c in fx("containers")["containers"]}
    assert _exit_code(statuses["/ut-rec-cpu-2"]) == 3
    assert _exit_code(statuses["/ut-rec-cpu-1"]) == 0  # "Up 1 second"
    assert _exit_code("Exited (137) 3 seconds ago") == 137
    assert _exit_code("Exited (x) 1 second ago") == -1
    assert _exit_code("Created") == 0


# -- events --------------------------------------------------------------------------
class RawEvents:
    def __init__(self, evs: list[dict], then: BaseException | None = None):
        self.evs, self.then, self.closed = evs, then, False

    def __iter__(self) -> Iterator[dict]:
        yield from self.evs
        if self.then is not None:
            raise self.then

    def close(self) -> None:
        self.closed = True


def test_events_become_event_views_with_only_hps_labels() -> None:
    rec = fx("events")
    raw = RawEvents(rec["events"])
    e, api = engine("h1", events=raw)
    stream = e.events("ut-rec")
    assert api.called("events")[0][1] == {"decode": True, "filters": rec["filters"]}
    evs = list(stream)
    assert all(isinstance(v, Event) for v in evs) and len(evs) == len(rec["events"])
    dies = [(v.node, v.exit_code) for v in evs if v.action == "die"]
    assert dies == [("cpu-2", 3), ("cpu-1", 137)]
    assert [v.action for v in evs][:2] == ["create", "start"]
    first, raw0 = evs[0], rec["events"][0]
    assert first.container == raw0["id"] and first.time == raw0["timeNano"] / 1e9 and first.host == "h1"
    assert first.labels and all(k.startswith("io.hp.") for k in first.labels)  # not image, name...
    assert first.role == "worker" and first.node == "cpu-1"
    assert all(v.exit_code is None for v in evs if v.action in ("create", "start", "kill"))
    stream.close()
    assert raw.closed
    e.events()
    assert api.called("events")[1][1]["filters"]["label"] == ["io.hp.managed=1"]


def test_events_of_older_engines_and_a_stream_that_breaks() -> None:
    old = [
        {
            "status": "die",
            "Actor": {"ID": "abc", "Attributes": {"io.hp.node": "n1", "exitCode": "-1"}},
            "time": 1700000000,
        },
        {"Action": "oom", "id": "def", "Actor": {"Attributes": {"exitCode": "x"}}},
        {"Action": "die", "id": "ghi"},
    ]
    e, api = engine(events=RawEvents(old, then=urllib3.exceptions.ProtocolError("Connection broken")))
    it = iter(e.events("c"))
    a, b, c = next(it), next(it), next(it)
    assert (a.action, a.container, a.node, a.exit_code, a.time) == ("die", "abc", "n1", -1, 1700000000.0)
    assert (b.action, b.container, b.exit_code, b.labels) == ("oom", "def", None, {})
    assert c.time > 1.7e9 and c.labels == {}  # no time in the event: now
    with pytest.raises(EngineError, match="event stream: "):
        next(it)
    api.answers["events"] = requests.exceptions.ConnectionError("refused")
    with pytest.raises(EngineUnavailable):
        e.events("c")
    engine_mod._Events(iter([]), "").close()  # a raw stream without close(): nothing to do


# -- images --------------------------------------------------------------------------
def test_image_id_pull_import_and_tag() -> None:
    rec = fx("images")
    e, api = engine(
        inspect_image=rec["inspect_image"],
        pull=recorded_error("pull(no registry)"),
        import_image_from_file={"status": "sha256:x"},
        tag=True,
    )
    assert e.image_id("hp-worker:x") == rec["inspect_image"]["Id"]
    api.answers["inspect_image"] = recorded_error("inspect_image(missing)")
    assert e.image_id("ut-rec-nope:1") is None
    with pytest.raises(EngineError, match="pull debian:trixie-slim: Get") as ei:
        e.pull("debian", "trixie-slim")
    assert ei.value.status == 500
    e.import_image(Path("/tmp/base.tar"), "hp-base", "1", ['CMD ["bash"]'])
    assert api.called("import_image_from_file")[0] == (
        ("/tmp/base.tar",),
        {"repository": "hp-base", "tag": "1", "changes": ['CMD ["bash"]']},
    )
    e.tag_image("sha256:x", "hp-worker", "latest")
    assert api.called("tag")[0][0] == ("sha256:x", "hp-worker", "latest")


def test_build_logs_each_line_and_a_failed_build_names_the_step_and_its_output() -> None:
    rec = fx("images")
    lines: list[str] = []
    e, api = engine(build=lambda **kw: iter(rec["build_ok"]))
    e.build_image(Path("/ctx"), "ut-rec-img:1", "worker", {"BASE": "b"}, lines.append)
    assert lines[-1] == "Successfully tagged ut-rec-img:1" and all(line == line.rstrip() and line for line in lines)
    assert api.called("build")[0][1] == {
        "path": "/ctx",
        "tag": "ut-rec-img:1",
        "target": "worker",
        "buildargs": {"BASE": "b"},
        "rm": True,
        "forcerm": True,
        "decode": True,
    }
    api.answers["build"] = lambda **kw: iter(rec["build_fail"])
    with pytest.raises(EngineError) as ei:
        e.build_image(Path("/ctx"), "ut-rec-img:2", None, {}, lambda s: None)
    msg = str(ei.value)
    assert msg.startswith(
        "building ut-rec-img:2 failed: The command '/bin/sh -c echo failing; exit 7' returned a non-zero code: 7"
    )
    assert "\nfailing" in msg  # the build's last lines come with it


def test_save_images_streams_one_tar_of_several_images() -> None:
    rec = fx("images")
    tar = b64(rec["save_tiny_b64"])

    class Body(io.BytesIO):
        _fp = SimpleNamespace(fp=SimpleNamespace(raw=SimpleNamespace()))  # where docker-py looks for the socket

    def get(url: str, **kw: Any) -> requests.Response:
        r = requests.Response()
        r.status_code, r.raw, r.url, r.reason = 200, Body(tar), url, "OK"
        return r

    e, api = engine(_get=get)
    out = list(e.save_images(["ut-rec-tiny:1", "hp-base:1"], chunk_size=1024))
    assert b"".join(out) == tar and len(out) == -(-len(tar) // 1024)
    (url,), kw = api.called("_get")[0]
    assert url.endswith("/v1.41/images/get") and kw == {
        "params": {"names": ["ut-rec-tiny:1", "hp-base:1"]},
        "stream": True,
    }
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        assert "manifest.json" in t.getnames()

    missing = next(x for x in fx("errors") if x["call"] == "save /images/get(missing) raw")

    def get404(url: str, **kw: Any) -> requests.Response:
        r = requests.Response()
        r.status_code, r._content, r.url, r.reason = 404, missing["body"].encode(), url, "Not Found"
        return r

    api.answers["_get"] = get404
    with pytest.raises(ObjectMissing, match="save images: reference does not exist"):
        list(e.save_images(["ut-rec-nope:1"]))


def test_load_images_reports_what_was_loaded_and_refuses_a_broken_tar() -> None:
    rec = fx("images")
    e, api = engine(load_image=lambda data, quiet: iter(rec["load_tiny"]))
    assert e.load_images(b"tar") == ["Loaded image: ut-rec-tiny:1"]
    assert api.called("load_image")[0] == ((b"tar",), {"quiet": True})
    api.answers["load_image"] = lambda data, quiet: iter(rec["load_not_a_tar"]["chunks"])
    with pytest.raises(
        EngineError, match=r"loading images failed: Error processing tar file\(exit status 1\): unexpected EOF"
    ):
        e.load_images(io.BytesIO(b"this is not a tar"))


# -- one-shot containers and followed logs -------------------------------------------
def test_run_once_returns_the_exit_code_and_output_and_always_removes_the_container() -> None:
    rec = fx("run-once")
    e, api = engine(
        create_container={"Id": "once1", "Warnings": []},
        start=None,
        wait=rec["wait_exit3"],
        logs=b"line-1\nerr-1\n",
        remove_container=None,
    )
    res = e.run_once(ContainerSpec(name="ut-once", image="i", labels={}), timeout=5)
    assert (res.exit_code, res.output) == (3, "line-1\nerr-1\n")
    assert api.called("wait")[0] == (("once1",), {"timeout": 5})
    assert api.called("remove_container") == [(("once1",), {"force": True, "v": False})]
    api.answers["start"] = recorded_error("start(missing)")
    with pytest.raises(ObjectMissing):
        e.run_once(ContainerSpec(name="ut-once", image="i", labels={}))
    assert len(api.called("remove_container")) == 2


def test_run_once_past_its_timeout_is_a_408_once_docker_py_says_read_timeout() -> None:
    e, api = engine(
        create_container={"Id": "once1", "Warnings": []},
        start=None,
        wait=requests.exceptions.ReadTimeout("Read timed out."),
        remove_container=None,
    )
    with pytest.raises(EngineError, match="ut-once did not finish within 2 s") as ei:
        e.run_once(ContainerSpec(name="ut-once", image="i", labels={}), timeout=2)
    assert ei.value.status == 408 and api.called("remove_container")


def test_run_once_past_its_timeout_as_docker_py_really_reports_it_is_a_408() -> None:
    rec = fx("run-once")["wait_timeout"]
    assert rec["raised"] == "requests.exceptions.ConnectionError"
    e, api = engine(
        create_container={"Id": "once1", "Warnings": []},
        start=None,
        wait=requests.exceptions.ConnectionError(rec["str"]),
        remove_container=None,
    )
    with pytest.raises(EngineError) as ei:
        e.run_once(ContainerSpec(name="ut-once", image="i", labels={}), timeout=1)
    assert ei.value.status == 408


def test_follow_logs_yields_lines_across_frames_and_closes_the_stream() -> None:
    rec = fx("run-once")
    frames = [b64(c) for c in rec["follow_logs_chunks_b64"]]
    # frames are not lines: split the recorded ones, and end on a line with no newline
    raw = RawEvents([frames[0][:3], frames[0][3:] + frames[1], b"no-newline"])  # type: ignore[list-item]
    e, api = engine(logs=raw)
    lines = e.follow_logs("c1", since=12.5)
    assert list(lines) == ["line-1", "err-1", "no-newline"]
    assert api.called("logs")[0] == (
        ("c1",),
        {"stdout": True, "stderr": True, "stream": True, "follow": True, "since": 12.5},
    )
    lines.close()
    assert raw.closed
    e.follow_logs("c1")
    assert api.called("logs")[1][1]["since"] is None
    broken = RawEvents([b"a\n"], then=urllib3.exceptions.ProtocolError("Connection broken"))  # type: ignore[list-item]
    api.answers["logs"] = broken
    it = iter(e.follow_logs("c1"))
    assert next(it) == "a"
    with pytest.raises(EngineError, match="logs of c1"):
        next(it)
    engine_mod._Lines(iter([]), "c").close()
    api.answers["logs"] = recorded_error("inspect_container(missing)")
    with pytest.raises(ObjectMissing, match="follow the logs of c1"):
        e.follow_logs("c1")
