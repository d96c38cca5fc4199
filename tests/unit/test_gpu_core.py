"""GPU nodes in the core, on the fakes and the real H200's nvidia-smi report
(tests/fixtures/gpu-h200/nvidia-smi-q.xml; fakes.gpu_host copies its <gpu> for hosts
with more GPUs): the provider's one-shot containers and log following (DockerEngine
against docker-py with no engine), discovery through the Provider and its cache,
GPU types in the catalogue, GPUs as capacity, refusals, node wiring, Gres and the
controller's gres.conf with its reconfigure before a GPU node starts."""

from __future__ import annotations

import calendar
import json

import pytest
from fakes import H200_UUID, gpu_host, h200_uuid, probe_output, spec_doc, world

from orchestrator.cluster.create import CreateOptions, create
from orchestrator.cluster.scaling import scale
from orchestrator.core import capacity
from orchestrator.core.context import Cluster
from orchestrator.docker.engine import DockerEngine
from orchestrator.docker.views import ContainerSpec, ExecResult
from orchestrator.errors import BadInput, EngineError, EngineUnavailable
from orchestrator.gpu import inventory
from orchestrator.gpu.gresconf import current_gres_conf
from orchestrator.gpu.inventory import HostGpuInfo, discover, parse_probe
from orchestrator.gpu.wiring import wire
from orchestrator.recovery import actions
from orchestrator.releases import DEFAULT
from orchestrator.spec.model import validate


def make(w, groups, name="lab", **top):
    spec = validate(spec_doc(name, groups, login=False, **top), w.env.catalogue)
    return create(w.env, spec, CreateOptions(timeout=5))


def gpu_world(tmp_path, n=1, runtime=False, cpus=16, memory_mib=131072):
    w = world(tmp_path, cpus=cpus, memory_mib=memory_mib, build=False)
    gpu_host(w.provider, n, runtime)
    w.env.images(DEFAULT).build(log=lambda s: None)
    return w


# -- DockerEngine, against docker-py with no engine -------------------------------------
class Api:
    """docker-py's APIClient for the host config, networking config and DeviceRequest
    it builds; the calls that would reach an engine are recorded instead."""

    def __init__(self):
        import docker

        self.real = docker.APIClient(base_url="unix:///nonexistent.sock", version="1.44")
        self.created = []
        self.calls = []
        self.wait_result = {"StatusCode": 0}
        self.log_bytes = b"out\n"

    def __getattr__(self, name):
        return getattr(self.real, name)

    def create_container(self, image, **kw):
        self.created.append((image, kw))
        return {"Id": "c" * 64}

    def start(self, cid):
        self.calls.append(("start", cid))

    def wait(self, cid, timeout=None):
        self.calls.append(("wait", timeout))
        if isinstance(self.wait_result, Exception):
            raise self.wait_result
        return self.wait_result

    def logs(self, cid, **kw):
        self.calls.append(("logs", kw.get("stream", False)))
        return iter([b"a", b"b\n{", b'"x": 1}\nlast']) if kw.get("stream") else self.log_bytes

    def remove_container(self, cid, **kw):
        self.calls.append(("remove", cid))


def engine() -> tuple[DockerEngine, Api]:
    e = DockerEngine()
    api = Api()
    e._api = api
    return e, api


def test_engine_applies_a_devices_mode_wiring(tmp_path):
    """The node's GPUs the no-toolkit way: device nodes, the driver's files read-only, env."""
    w = gpu_world(tmp_path)
    wiring = w.env.gpus().wiring([H200_UUID])
    e, api = engine()
    e.create_container(
        ContainerSpec("n", "img", {}, network="hp-lab", hostname="n", volumes={"vol": "/home"}, gpus=wiring)
    )
    _, kw = api.created[0]
    hc = kw["host_config"]
    assert [d["PathOnHost"] for d in hc["Devices"]] == [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1:/usr/lib/x86_64-linux-gnu/libcuda.so.1:ro" in hc["Binds"]
    assert "/usr/bin/nvidia-smi:/usr/bin/nvidia-smi:ro" in hc["Binds"]
    assert "vol:/home:rw" in hc["Binds"]
    assert kw["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "DeviceRequests" not in hc


def test_engine_applies_a_runtime_wiring_and_no_network(tmp_path):
    w = gpu_world(tmp_path, runtime=True)
    wiring = w.env.gpus().wiring([H200_UUID])
    assert wiring.mode == "runtime"
    e, api = engine()
    e.create_container(ContainerSpec("n", "img", {}, network="none", gpus=wiring, binds=["/dev:/host/dev:ro"]))
    _, kw = api.created[0]
    hc = kw["host_config"]
    assert hc["DeviceRequests"] == [
        {"Driver": "nvidia", "Count": 0, "DeviceIDs": [H200_UUID], "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert hc["NetworkMode"] == "none" and kw["networking_config"] is None
    assert hc["Binds"] == ["/dev:/host/dev:ro"]
    assert kw["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


def test_engine_run_once_waits_reads_and_removes():
    e, api = engine()
    api.wait_result = {"StatusCode": 3}
    res = e.run_once(ContainerSpec("probe", "img", {}, command=["true"]), timeout=7)
    assert (res.exit_code, res.output) == (3, "out\n")
    assert api.calls == [("start", "c" * 64), ("wait", 7), ("logs", False), ("remove", "c" * 64)]


def test_engine_run_once_past_its_timeout_is_an_error_and_removed():
    import requests

    e, api = engine()
    api.wait_result = requests.exceptions.ReadTimeout("read timed out")
    with pytest.raises(EngineError, match="did not finish within 2 s") as ei:
        e.run_once(ContainerSpec("probe", "img", {}), timeout=2)
    assert ei.value.status == 408 and api.calls[-1] == ("remove", "c" * 64)


def test_engine_follow_logs_gives_whole_lines():
    """Frames are not lines: they are joined and split (the last unterminated one too)."""
    e, api = engine()
    assert list(e.follow_logs("mon")) == ["ab", '{"x": 1}', "last"]


# -- discovery ----------------------------------------------------------------------------
def test_parse_probe_gives_host_paths_and_cdi_devices():
    text = (
        probe_output(
            ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps"),
            "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1",
            ("/usr/local/bin/nvidia-smi",),
        ).replace("==listing==\n", "==listing==\n/host/driver/lib64/libnvidia-ml.so.1\n")
        + "==cdi /host/cdi/0/nvidia.yaml==\n"
        + "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n- name: all\n"
    )
    # the cdi section comes after ==end== here: move ==end== last, as the script prints it
    text = text.replace("==end==\n", "") + "==end==\n"
    p = parse_probe(text, "/opt/nvidia", ["/etc/cdi"])
    assert p.devices == ("/dev/nvidia0", "/dev/nvidiactl")  # nvidia-caps is a folder of MIG nodes: not ours
    assert p.gpu_minors == [0] and p.binaries == ("/usr/local/bin/nvidia-smi",)
    assert p.listing == ("/opt/nvidia/lib64/libnvidia-ml.so.1",)
    assert p.cdi_devices == ("nvidia.com/gpu=0", "nvidia.com/gpu=all")
    assert parse_probe(text, None).cdi_devices is None  # no CDI folder looked at
    with pytest.raises(inventory.ProbeError, match="incomplete"):
        parse_probe("==machine==\nx86_64\n", None)


def test_discovery_on_a_host_without_gpus_runs_one_short_container_and_caches(tmp_path):
    w = world(tmp_path)
    p = w.provider
    runs = len(p.runs)
    info = w.env.gpus()
    assert info.gpus == () and "no NVIDIA GPU device" in info.why and info.source == "discovery"
    assert len(p.runs) == runs + 1  # step 1 only: nothing to ask nvidia-smi
    probe = p.runs[-1]
    assert probe.command[:2] == ["sh", "-c"] and probe.network == "none"
    assert "/dev:/host/dev:ro" in probe.binds and all(b.endswith(":ro") for b in probe.binds)
    assert probe.labels["io.hp.managed"] == "0"  # not one of hp's clusters' containers
    w.env.gpus()
    assert len(p.runs) == runs + 1  # cached in the store
    assert len(discover(p, w.env.store, refresh=True).ids) == 0 and len(p.runs) == runs + 2


def test_a_probe_left_by_a_killed_process_is_removed_by_the_next_discovery(tmp_path):
    """A process SIGKILLed between its probe's end and the probe's removal leaves it (exited,
    io.hp.managed=0: no cluster's, no capacity's). The next discovery removes exited ones older
    than a probe may live, never one a discovery beside it may still be reading."""
    w = world(tmp_path)
    p = w.provider
    image = "keep:probe"
    made = {}
    for n in ("old", "running"):
        made[n] = p.create_container(
            ContainerSpec(f"hp-gpu-probe-{n}", image, {"io.hp.managed": "0", "io.hp.role": "gpu-probe"})
        )
    p.start(made["running"])
    cluster_node = p.create_container(ContainerSpec("hp-x-cpu-1", image, {"io.hp.managed": "1", "io.hp.cluster": "x"}))
    created = calendar.timegm((2026, 1, 1, 0, 0, 0, 0, 0, 0))  # the fake's creation time of every container
    assert inventory.remove_left_probes(p, now=created + inventory.PROBE_TIMEOUT) == []  # may still be read
    assert inventory.remove_left_probes(p, now=created + 3 * inventory.PROBE_TIMEOUT) == ["hp-gpu-probe-old"]
    left = {c.name for c in p.containers(None, {"io.hp.managed": "0"})}
    assert left == {"hp-gpu-probe-running"} and cluster_node in {c.id for c in p.containers("x")}
    assert all(c.labels.get("io.hp.managed") == "1" for c in p.containers())  # hp's own: the probe is not


def test_discovery_of_the_h200_host_no_toolkit(tmp_path):
    w = gpu_world(tmp_path)
    info = w.env.gpus()
    assert info.ids == [H200_UUID] and info.gpus[0].model == "h200" and info.gpus[0].minor_number == 0
    assert info.mode == "devices" and "no nvidia runtime" in info.mode_why and info.driver_version == "580.159.04"
    assert {f.base for f in info.driver.files} == {"libnvidia-ml", "libcuda", "nvidia-smi"}
    smi = w.provider.runs[-1]  # step 2: every GPU, the way nodes get theirs
    assert smi.command == ["nvidia-smi", "-q", "-x"] and smi.gpus.mode == "devices"
    assert "/dev/nvidia0:/dev/nvidia0:rwm" in smi.gpus.devices
    again = HostGpuInfo.from_json(info.to_json())
    assert again == info
    assert info.summary().startswith("1 x h200")


def test_discovery_with_the_nvidia_runtime_asks_for_every_gpu(tmp_path):
    w = gpu_world(tmp_path, n=2, runtime=True)
    info = w.env.gpus()
    assert info.mode == "runtime" and info.ids == [h200_uuid(0), h200_uuid(1)]
    smi = w.provider.runs[-1]
    assert smi.gpus.device_requests[0] == {"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}


def test_discovery_says_why_gpus_cannot_be_used(tmp_path, monkeypatch):
    w = world(tmp_path)
    w.provider.run_handler = lambda spec: ExecResult(0, probe_output(("/dev/nvidia0", "/dev/nvidiactl")))
    info = w.env.gpus()
    assert info.gpus == () and "cannot be given to containers" in info.why and "missing" in info.why
    monkeypatch.setenv("HP_GPU_MODE", "runtime")
    info = discover(w.provider, w.env.store, refresh=True)
    assert "no 'nvidia' runtime" in info.why


def test_discovery_uses_the_last_result_when_the_engine_fails(tmp_path, monkeypatch):
    w = gpu_world(tmp_path)
    first = w.env.gpus()

    def down(spec):
        raise EngineUnavailable("fake engine down")

    w.provider.run_handler = down
    assert discover(w.provider, w.env.store, refresh=True) == first
    monkeypatch.setenv("HP_GPU_DISCOVERY_TTL", "0")
    assert discover(w.provider, w.env.store) == first
    w.env.store.put("gpu.discovery:fake", None)
    with pytest.raises(EngineUnavailable):
        discover(w.provider, w.env.store)


def test_hp_gpus_stands_in_for_discovery(tmp_path, monkeypatch):
    monkeypatch.setenv("HP_GPUS", "g0:h200,g1:h200")
    w = world(tmp_path)
    runs = len(w.provider.runs)
    info = w.env.gpus()
    assert info.ids == ["g0", "g1"] and info.source == "HP_GPUS" and not info.wired
    assert info.wiring(["g0"]) is None and len(w.provider.runs) == runs  # no container run
    assert {"h200.1x", "h200.2x"} <= set(w.env.catalogue)


# -- catalogue and capacity ---------------------------------------------------------------------
def test_types_named_after_the_gpus_only_where_there_are_gpus(tmp_path):
    cpu = world(tmp_path / "cpu")
    assert not [t for t in cpu.env.catalogue if t.startswith("h200")]
    w = gpu_world(tmp_path / "gpu", n=8, cpus=64, memory_mib=1024 * 1024)
    cat = w.env.catalogue
    assert [t for t in sorted(cat) if t.startswith("h200")] == ["h200.1x", "h200.2x", "h200.4x", "h200.8x"]
    t = cat["h200.2x"]
    assert (t.gpus, t.gpu_model, t.vcpus) == (2, "h200", 16)
    assert cat["gpu.1x"].gpu_model is None  # the shipped generic type stays


def test_each_gpu_backs_one_node_and_quarantined_gpus_none(tmp_path):
    w = gpu_world(tmp_path, n=2)
    cat = w.env.catalogue
    pool = capacity.host_pool(w.provider, w.env.store)
    assert pool.gpus == [h200_uuid(0), h200_uuid(1)] and pool.gpu_models[h200_uuid(1)] == "h200"
    used = capacity.usage([], cat)
    first = capacity.check(cat["h200.1x"], pool, used, {})
    used = used.plus(cat["h200.1x"], first)
    second = capacity.check(cat["h200.1x"], pool, used, {})
    assert first == [h200_uuid(0)] and second == [h200_uuid(1)]
    used = used.plus(cat["h200.1x"], second)
    with pytest.raises(Exception, match=r"needs 1 GPU\(s\) of model h200, 0 free \(of 2\)"):
        capacity.check(cat["h200.1x"], pool, used, {})
    capacity.quarantine(w.env.store, [h200_uuid(0)], "cpu-1: ecc")
    pool = capacity.host_pool(w.provider, w.env.store)
    assert pool.gpus == [h200_uuid(1)] and "quarantined" in pool.gpu_note
    assert capacity.ceiling(cat["h200.2x"], pool)[0] == 0
    assert capacity.release_gpus(w.env.store, None) == [h200_uuid(0)]
    assert capacity.ceiling(cat["h200.2x"], capacity.host_pool(w.provider, w.env.store))[0] == 1


def test_a_gpu_type_on_a_host_without_gpus_is_refused_before_anything_is_made(tmp_path):
    w = world(tmp_path)
    with pytest.raises(BadInput) as ei:
        make(w, [("gpu", "gpu.1x", 1)])
    msg = str(ei.value)
    assert ei.value.exit_code == 2 and "InsufficientCapacity" in msg and "0 GPU(s) on this host" in msg
    assert "no NVIDIA GPU device" in msg
    assert w.provider.containers("lab") == [] and w.env.store.cluster("lab") is None


def test_scaling_a_gpu_group_past_the_hosts_gpus_is_refused(tmp_path):
    w = gpu_world(tmp_path, n=2)
    make(w, [("gpu", "h200.1x", 1)])
    with pytest.raises(BadInput, match=r"InsufficientCapacity: 3 node\(s\) of h200.1x .* \(2 GPU\(s\) of model h200"):
        scale(w.env, "lab", "gpu", 3)


def test_a_bad_thresholds_file_is_refused_at_create(tmp_path, monkeypatch):
    bad = tmp_path / "th.yaml"
    bad.write_text("Models:\n  h900: {Measured: false, Bf16GemmTflops: 100}\n")
    monkeypatch.setenv("HP_GPU_THRESHOLDS", str(bad))
    w = gpu_world(tmp_path)
    with pytest.raises(BadInput, match="unknown GPU model 'h900'") as ei:
        make(w, [("gpu", "h200.1x", 1)])
    assert ei.value.exit_code == 2 and w.provider.containers("lab") == []


# -- wiring, Gres, gres.conf ---------------------------------------------------------------------
def timeline(w):
    """One list of what the fake engine and the fake Slurm did, in order."""
    events = []
    w.provider.on_start.append(lambda c: events.append(("start", c.spec.name)))
    orig = w.slurm.reconfigure

    def reconf():
        events.append(("reconfigure", ""))
        orig()

    w.slurm.reconfigure = reconf
    return events


def test_gpu_nodes_get_their_gpus_gres_and_gres_conf_before_they_start(tmp_path):
    w = gpu_world(tmp_path, n=2)
    events = timeline(w)
    make(w, [("gpu", "h200.1x", 2)])
    c1, c2 = w.provider.node("lab", "gpu-1"), w.provider.node("lab", "gpu-2")
    assert c1.spec.gpus.mode == "devices" and c1.spec.gpus.gpu_ids == (h200_uuid(0),)
    assert (
        "/dev/nvidia1:/dev/nvidia1:rwm" in c2.spec.gpus.devices
        and "/dev/nvidia0:/dev/nvidia0:rwm" not in c2.spec.gpus.devices
    )
    assert c1.spec.labels["io.hp.gpu-mode"] == "devices" and c1.spec.labels["io.hp.gpu-model"] == "h200"
    assert c2.spec.labels["io.hp.gpu-devices"] == "/dev/nvidia1" and c2.spec.labels["io.hp.gpus"] == h200_uuid(1)
    assert "Gres=gpu:h200:1" in c1.spec.environment["HP_SLURMD_CONF"]
    ctl = w.provider.node("lab", "controller-1")
    assert b"GresTypes=gpu" in ctl.files["/etc/slurm/slurm.conf"]
    gres = ctl.files["/etc/slurm/gres.conf"].decode()
    assert "NodeName=gpu-1 Name=gpu Type=h200 File=/dev/nvidia0" in gres
    assert "NodeName=gpu-2 Name=gpu Type=h200 File=/dev/nvidia1" in gres
    # slurmctld read gres.conf again before either GPU node's slurmd started
    assert events.index(("reconfigure", "")) < events.index(("start", "hp-lab-gpu-1"))
    assert events.count(("reconfigure", "")) == 1
    # the GPU check image was built with the cluster (its checks and monitors need it)
    assert any(t.startswith("hp-check-gpu:") for t in w.provider.images)


def test_scale_up_and_replace_reconfigure_only_when_the_lines_change(tmp_path, monkeypatch):
    from orchestrator.cluster.reconciler import GroupReconciler
    from orchestrator.core.launcher import Launcher

    monkeypatch.setattr(actions, "POLL_S", 0.001)
    w = gpu_world(tmp_path, n=2)
    make(w, [("gpu", "h200.1x", 1)])
    events = timeline(w)
    scale(w.env, "lab", "gpu", 2)
    c = Cluster(w.env, "lab")
    rec = GroupReconciler(c, "gpu", Launcher(c, w.env.images(DEFAULT).refs()), clock=lambda: 1e11)
    for _ in range(4):
        rec.step({n.name: n for n in w.slurm.nodes()})
    assert "NodeName=gpu-2 Name=gpu Type=h200 File=/dev/nvidia1" in current_gres_conf(c)
    assert events[:2] == [("reconfigure", ""), ("start", "hp-lab-gpu-2")]
    # replaced onto the same GPU: its lines are there already, no reconfigure
    events.clear()
    assert actions.replace(c, "gpu-2", "test", wait=1)
    assert events == [("start", "hp-lab-gpu-2")]


def test_a_gpu_node_does_not_start_when_slurmctld_cannot_be_reconfigured(tmp_path):
    from orchestrator.core.launcher import Launcher

    w = gpu_world(tmp_path, n=2)
    make(w, [("gpu", "h200.1x", 1)])
    c = Cluster(w.env, "lab")

    def fails():
        from orchestrator.errors import OperationFailed

        raise OperationFailed("scontrol reconfigure failed (1): slurm_reconfigure error")

    w.slurm.reconfigure = fails
    lau = Launcher(c, w.env.images(DEFAULT).refs())
    res = lau.create_many([(c.spec.group("gpu"), 2)])
    cid = res["gpu-2"]
    err = lau.start(cid)
    assert err is not None and err.code == "GresConfigFailed" and err.retryable
    assert w.provider._get(cid).state == "created"  # never started: its slurmd would miss its GPUs
    # the agent restarts (a new Launcher) and finds the container left created: the pending
    # reconfigure is in the store, so it is done before that start
    del w.slurm.reconfigure
    events = timeline(w)
    again = Launcher(c, w.env.images(DEFAULT).refs())
    assert again.gres_pending and again.start(cid) is None
    assert events == [("reconfigure", ""), ("start", "hp-lab-gpu-2")] and not again.gres_pending


def test_hp_gpus_stand_ins_are_capacity_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HP_GPUS", "g0,g1")
    w = world(tmp_path, memory_mib=65536)
    make(w, [("gpu", "gpu.1x", 2)])
    c = w.provider.node("lab", "gpu-2")
    assert c.spec.gpus is None and c.spec.labels["io.hp.gpu-mode"] == "none" and c.spec.labels["io.hp.gpus"] == "g1"
    assert "Gres=gpu:1" in c.spec.environment["HP_SLURMD_CONF"]
    assert "/etc/slurm/gres.conf" not in w.provider.node("lab", "controller-1").files


def test_capacity_show_reports_gpus(tmp_path):
    w = gpu_world(tmp_path)
    doc = capacity.report(w.provider, w.env.store, w.env.catalogue)
    assert doc["Pool"]["Gpus"] == [H200_UUID] and doc["Pool"]["GpuModels"] == {H200_UUID: "h200"}
    assert doc["Pool"]["GpuDiscovery"].startswith("1 x h200") and doc["Pool"]["GpuQuarantined"] == {}
    json.dumps(doc)


def test_wire_of_the_discovered_gpu_matches_the_pure_module(tmp_path):
    w = gpu_world(tmp_path)
    info = w.env.gpus()
    assert info.wiring([H200_UUID]) == wire("devices", list(info.gpus), driver=info.driver, host_devices=info.devices)


def test_without_an_engine_the_last_discovery_stands(tmp_path):
    """A stored GPU cluster's types stay known while the engine is briefly away."""
    w = gpu_world(tmp_path)
    first = w.env.gpus()
    w.provider.up = False
    assert discover(w.provider, w.env.store) == first
    cpu = world(tmp_path / "cpu")
    cpu.provider.up = False
    cpu.env.store.put("gpu.discovery:*last", None)
    with pytest.raises(EngineUnavailable):
        discover(cpu.provider, cpu.env.store)


def test_a_bad_thresholds_file_is_refused_at_health_check_start(tmp_path, monkeypatch):
    from orchestrator.health.requests import service

    w = gpu_world(tmp_path)
    make(w, [("gpu", "h200.1x", 1)])
    bad = tmp_path / "th.yaml"
    bad.write_text("TolerancePerNode: 2\nModels:\n  h200: {Measured: maybe}\n")
    monkeypatch.setenv("HP_GPU_THRESHOLDS", str(bad))
    with pytest.raises(BadInput, match="bad GPU thresholds: 2 problems") as ei:
        service.start(w.env, "lab", ["gpu"], [], ["InstanceStress"], {}, detach=False)
    assert "TolerancePerNode" in str(ei.value) and "Models.h200.Measured" in str(ei.value)


def test_release_gpu_cli(tmp_path):
    """`hp capacity release-gpu`: only quarantined GPUs, every problem is bad input."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from orchestrator.state.store import Store

    home = tmp_path / "home"
    capacity.quarantine(Store(home), ["GPU-a", "GPU-b"], "gpu-1: hp:gpu:replace:ecc-uncorrectable ...")
    root = Path(__file__).resolve().parents[2]

    def hp(*args):
        env = {**os.environ, "HP_HOME": str(home), "DOCKER_HOST": "tcp://127.0.0.1:9", "PYTHONPATH": str(root)}
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args], env=env, capture_output=True, text=True
        )

    r = hp("capacity", "release-gpu")
    assert r.returncode == 2 and "give GPU ids or --all" in r.stderr
    r = hp("capacity", "release-gpu", "GPU-x")
    assert r.returncode == 2 and "not quarantined: GPU-x (quarantined: GPU-a, GPU-b)" in r.stderr
    r = hp("capacity", "release-gpu", "GPU-a")
    assert r.returncode == 0 and "back in the pool: GPU-a" in r.stderr
    assert capacity.quarantined(Store(home)) == {"GPU-b": "gpu-1: hp:gpu:replace:ecc-uncorrectable ..."}


def test_hp_logs_keeps_the_controllers_gres_conf(tmp_path):
    from orchestrator.ci.logs import export_logs

    w = gpu_world(tmp_path)
    make(w, [("gpu", "h200.1x", 1)])
    doc = export_logs(w.env, "lab", tmp_path / "logs")
    assert "gres.conf" in doc["Files"]
    assert "File=/dev/nvidia0" in (tmp_path / "logs" / "gres.conf").read_text()
