"""GPU nodes' health in the core, on the fakes: the deep check (hp_gpu_check.py's real
output, made by running the program with FakeNvml answering the REAL H200's NVML
values, mutated per case: each test says what it changed) in a check container given
the node's GPUs, its findings driving recovery; DCGM only when configured; and the
passive monitor (hp_gpu_monitor.py's real lines, the same way) followed by the agent."""

from __future__ import annotations

import json
import time

import pytest
from fakes import FIXTURES, gpu_host, h200_uuid, spec_doc, world
from gpu_fakes import FakeBackend, FakeNvml, h200_gpu, load_program
from test_health_engine import STRESS_OK

from orchestrator.agent.gpuwatch import GpuWatch
from orchestrator.cluster.create import CreateOptions, create
from orchestrator.core import capacity
from orchestrator.core.context import Cluster
from orchestrator.docker.images import GPU_IMAGES
from orchestrator.docker.views import ExecResult
from orchestrator.health.requests import runner as engine_mod
from orchestrator.health.requests.decisions import claim
from orchestrator.health.requests.gpu_check import CHECK_PROGRAM, condemned_gpus
from orchestrator.health.requests.runner import Options, run_and_record
from orchestrator.naming import L_WATCHES, monitor_name
from orchestrator.recovery import actions
from orchestrator.releases import DEFAULT
from orchestrator.runtime import Runtime
from orchestrator.slurm.model import SlurmNode
from orchestrator.spec.model import validate
from orchestrator.state.health_requests import Records
from orchestrator.verdict import Action

chk = load_program("hp_gpu_check")
mon = load_program("hp_gpu_monitor")


def check_json(uuid: str = h200_uuid(0), **nv_kw) -> str:
    """hp_gpu_check.py's stdout on one H200 (its real values; `nv_kw` the test's change)."""
    g = h200_gpu()
    g["uuid"] = uuid
    nv = FakeNvml([g], **{k: v for k, v in nv_kw.items() if k != "gpu"})
    if "gpu" in nv_kw:
        nv.gpus[0].update(nv_kw["gpu"])
    doc = chk.run_check(
        ["--expected-gpus", "1", "--gemm-seconds", "0.01"],
        nvml_loader=lambda: nv,
        backend_loader=lambda: FakeBackend([nv.gpus[0]["pci"]]),
        which=lambda b: None,
    )
    return json.dumps(doc) + "\n"


class GpuTools:
    """The check containers' tools: stress-ng passes; hp_gpu_check.py prints what
    `sick` says for the GPU the check container was given (by UUID), else the real H200."""

    def __init__(self):
        self.sick: dict[str, dict] = {}  # GPU UUID -> FakeNvml changes
        self.once: set[str] = set()  # sick only until the node is rebooted or replaced
        self.argv: list[list[str]] = []
        self.check_gpus: list[tuple[str, ...]] = []

    def __call__(self, c, argv):
        if argv[0] == "/usr/local/bin/hp-stress":
            return ExecResult(0, STRESS_OK)
        if argv[:2] == ["python3", CHECK_PROGRAM]:
            self.argv.append(argv)
            uuid = c.spec.gpus.gpu_ids[0]
            self.check_gpus.append(c.spec.gpus.gpu_ids)
            return ExecResult(0, check_json(uuid, **self.sick.get(uuid, {})))
        return ExecResult(0, "")


@pytest.fixture
def w(tmp_path, monkeypatch):
    monkeypatch.setattr(actions, "POLL_S", 0.001)
    monkeypatch.setattr(engine_mod, "POLL_S", 0.001)
    w = world(tmp_path, cpus=16, memory_mib=131072, build=False)
    gpu_host(w.provider, 2)
    w.env.images(DEFAULT).build(log=lambda s: None)
    spec = validate(spec_doc("lab", [("gpu", "h200.1x", 1)], login=False, NodeRecovery="Automatic"), w.env.catalogue)
    create(w.env, spec, CreateOptions(timeout=5))
    w.tools = GpuTools()
    w.provider.exec_handler = w.tools
    w.restarts = []
    w.provider.on_start.append(
        lambda c: w.restarts.append(c.spec.name) if c.spec.labels.get("io.hp.role") == "worker" else None
    )
    return w


def request(w, nodes=("gpu-1",)):
    rec = Records(w.env.store)
    rid = rec.new_request("lab", ["InstanceStress"], ["gpu"], list(nodes), {})
    v = run_and_record(Cluster(w.env, "lab"), rid, list(nodes), Options(checks=["InstanceStress"], recovery_wait=2))
    return rid, {n: str(x) for n, x in v.items()}, Records(w.env.store).results(rid)


def events(w):
    return [e.description for e in w.env.store.events("lab")]


def test_a_healthy_h200_node_passes_and_the_result_says_dcgm_is_not_configured(w):
    """No change: the real H200's values."""
    rid, verdicts, results = request(w)
    assert verdicts == {"gpu-1": "Passed"}
    assert w.tools.argv == [["python3", CHECK_PROGRAM, "--expected-gpus", "1", "--gemm-seconds", "5"]]
    assert w.tools.check_gpus == [(h200_uuid(0),)]  # the check container got the node's own GPU
    (r,) = results
    assert r.state == "Passed" and any("DCGM not configured" in x for x in r.reasons)
    assert r.figures["gpu.gpu0.gemm"] > 550 and r.figures["gpu.dcgm_configured"] == 0
    assert "DCGM not configured" in open(r.output).read()
    assert not [c for c in w.provider.containers("lab") if c.role == "check"]


def test_uncorrectable_ecc_replaces_at_once_onto_another_gpu(w):
    """Changed: volatile uncorrectable ECC 0 -> 2 on the node's GPU. A replace-class
    finding: no reboot first; the GPU is quarantined, the new node gets the other one."""
    w.tools.sick[h200_uuid(0)] = {"gpu": {"ecc_uncorrected_volatile": 2}}
    rid, verdicts, results = request(w)
    assert verdicts == {"gpu-1": "Passed after replace"}
    assert w.restarts == ["hp-lab-gpu-1"]  # started once: the replacement (no reboot)
    assert list(capacity.quarantined(w.env.store)) == [h200_uuid(0)]
    assert w.provider.node("lab", "gpu-1").spec.labels["io.hp.gpus"] == h200_uuid(1)
    assert [r.state for r in results] == ["Failed", "Passed"]
    assert "uncorrectable ECC" in results[0].reasons[0]


def test_xid_79_reboots_then_checks_again(w):
    """Changed: NVML delivers XID 79 on GPU 0 during the first check only (the reboot cures it)."""
    w.tools.sick[h200_uuid(0)] = {"xids": [(0, 79)]}
    w.provider.on_start.append(lambda c: w.tools.sick.clear() if c.spec.labels.get("io.hp.role") == "worker" else None)
    rid, verdicts, results = request(w)
    assert verdicts == {"gpu-1": "Passed after reboot"}
    assert ("restart", "hp-lab-gpu-1") in w.provider.calls and capacity.quarantined(w.env.store) == {}
    assert "XID 79" in results[0].reasons[0]


def test_an_application_xid_is_an_event_only(w):
    """Changed: XID 13 on GPU 0 during the check: passes, the finding is an event."""
    w.tools.sick[h200_uuid(0)] = {"xids": [(0, 13)]}
    rid, verdicts, _ = request(w)
    assert verdicts == {"gpu-1": "Passed"} and not w.restarts
    assert any("xid-13 (monitored, no action)" in e for e in events(w))


def test_a_setup_problem_keeps_the_node_drained_and_touches_nothing(w):
    """Changed: the GPU check image is gone (action none: nothing to reboot for)."""
    ref = w.env.images(DEFAULT).refs(GPU_IMAGES)["check-gpu"]
    del w.provider.images[ref]
    rid, verdicts, results = request(w)
    assert verdicts["gpu-1"].startswith("Failed: InstanceStress: the GPU check image")
    assert not w.restarts and ("restart", "hp-lab-gpu-1") not in w.provider.calls
    sn = w.slurm.nodes_["gpu-1"]
    assert sn.drained and "hp images build --gpu" in sn.reason


def test_a_configured_dcgm_image_that_is_missing_says_so(w, monkeypatch):
    """Changed: HP_DCGM_IMAGE names an image the engine does not have."""
    monkeypatch.setenv("HP_DCGM_IMAGE", "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04")
    rid, verdicts, results = request(w)
    (r,) = results
    assert r.state == "Failed" and "is not on the Docker engine" in " ".join(r.reasons)
    assert not w.restarts  # a setup problem: kept drained, not recovered


def test_a_configured_dcgm_image_runs_dcgmi_with_the_nodes_gpus(w, monkeypatch):
    image = "dcgm:test"
    monkeypatch.setenv("HP_DCGM_IMAGE", image)
    w.provider.images[image] = "sha256:dcgm"
    fail = (FIXTURES / "dcgm-4.2.3-diag-r1-fail.json").read_text()
    inner = w.tools

    def tools(c, argv):
        if argv[0] == "dcgmi":
            assert c.spec.image == image and c.spec.gpus.gpu_ids == (h200_uuid(0),)
            return ExecResult(226, fail)
        return inner(c, argv)

    w.provider.exec_handler = tools
    rid, verdicts, results = request(w)
    assert results[0].state == "Failed" and any("DCGM" in x for x in results[0].reasons)


def test_condemned_gpus_by_index_else_all_of_the_nodes():
    from orchestrator.gpu.judge import Finding

    ecc = Finding("ecc-uncorrectable", "fatal", Action.REPLACE, "GPU 1: ...", 1)
    missing = Finding("gpu-missing", "fatal", Action.REPLACE, "1 GPU missing")
    reboot = Finding("xid-79", "fatal", Action.RECOVER, "XID 79", 0)
    assert condemned_gpus([ecc, reboot], {0: "A", 1: "B"}, ["A", "B"]) == ["B"]
    assert condemned_gpus([ecc, missing], {0: "A", 1: "B"}, ["A", "B"]) == ["A", "B"]
    assert condemned_gpus([ecc], {0: "A"}, ["A", "B"]) == ["A", "B"]  # index unknown: all of them
    assert condemned_gpus([reboot], {0: "A"}, ["A"]) == []


# -- passive monitoring -----------------------------------------------------------------------
def monitor_lines(nv: FakeNvml, hook=None) -> list[str]:
    out = []

    class W:
        def write(self, s):
            out.append(s)
            if hook and s.endswith("\n"):
                hook(len(out), json.loads(s))

        def flush(self):
            pass

    mon.signal.signal = lambda sig, fn: None  # never in the test process
    mon.main(["--interval", "0.01", "--count", "2", "--max-wait-ms", "5"], nvml_loader=lambda: nv, out=W())
    return "".join(out).splitlines()


class Acts:
    """The agent's steps, recorded, then taken for real on the fakes (their phases are
    the history the next decision reads)."""

    def __init__(self):
        self.done: list[tuple[str, str]] = []

    def __call__(self, cluster, action, node, reason):
        self.done.append((action, node))
        return actions.step(cluster, action, node, reason, wait=5)


RUNTIMES: list[Runtime] = []


@pytest.fixture(autouse=True)
def _runtimes():
    yield
    while RUNTIMES:
        RUNTIMES.pop().shutdown()


def watch(w):
    """A GPU watch on a runtime of its own: its monitor and node keys run on the runtime's
    workers, its look (key "") is the test's (`step`)."""
    acts = Acts()
    gw = GpuWatch(w.env, "lab", act=acts)
    gw.acts = acts
    gw.keys = ()
    rt = Runtime(w.env.store, "lab")
    rt.add(gw)
    RUNTIMES.append(rt.start())
    return gw


def step(gw):
    """One look, and what it offered done."""
    gw.step()
    assert gw.runtime.idle(gw.kind, 10)


def wait_for(cond, timeout=2.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.01)


def test_each_gpu_node_gets_a_monitor_with_its_gpus(w):
    gw = watch(w)
    step(gw)
    m = w.provider._get(monitor_name("lab", "gpu-1"))
    node = w.provider.node("lab", "gpu-1")
    assert m.state == "running" and m.spec.gpus.gpu_ids == (h200_uuid(0),) and m.spec.network == "none"
    assert m.spec.command[:2] == ["python3", "/opt/hp-gpu/bin/hp_gpu_monitor.py"]
    assert m.spec.labels[L_WATCHES] == node.id and m.spec.labels["io.hp.role"] == "gpu-monitor"
    assert m.spec.cpu_limit <= 0.2
    assert "gpu-1" in gw.followers
    step(gw)  # idempotent: one monitor, one follower
    assert len([c for c in w.provider.containers("lab") if c.role == "gpu-monitor"]) == 1
    # the node is replaced: its monitor goes, the new container gets one
    assert actions.replace(Cluster(w.env, "lab"), "gpu-1", "test", wait=1)
    step(gw)
    m2 = w.provider._get(monitor_name("lab", "gpu-1"))
    assert m2.spec.labels[L_WATCHES] == w.provider.node("lab", "gpu-1").id != node.id
    gw.runtime.shutdown()


def test_monitor_lines_are_followed_xid_79_drains_and_reboots_when_jobs_end(w):
    """Changed: NVML delivers XID 79 on GPU 0 while the monitor runs."""
    gw = watch(w)
    step(gw)
    lines = monitor_lines(FakeNvml([h200_gpu()], xids=[(0, 79)]))
    assert any('"type": "xid"' in x for x in lines)
    w.slurm.set("gpu-1", "ALLOCATED")  # a job runs on it
    for line in lines:
        w.provider.push_log(monitor_name("lab", "gpu-1"), line)
    wait_for(lambda: w.slurm.nodes_["gpu-1"].gpu_finding)
    sn = w.slurm.nodes_["gpu-1"]
    assert sn.drained and sn.reason.startswith("hp:gpu:recover:xid-79") and sn.gpu_finding
    step(gw)
    assert gw.acts.done == []  # its job still runs: a reboot waits
    w.slurm.nodes_["gpu-1"] = SlurmNode("gpu-1", ("IDLE", "DRAIN"), sn.reason)
    step(gw)
    wait_for(lambda: gw.acts.done == [("reboot", "gpu-1")])
    assert any("xid-79" in e and "rebooted when its jobs have ended" in e for e in events(w))
    gw.runtime.shutdown()


def test_uncorrectable_ecc_replaces_at_once_and_quarantines_the_gpu(w):
    """Changed: the GPU's volatile uncorrectable ECC is 1 in the monitor's snapshots."""
    gw = watch(w)
    w.slurm.set("gpu-1", "ALLOCATED")
    for line in monitor_lines(FakeNvml([h200_gpu(uuid=h200_uuid(0), ecc_uncorrected_volatile=1)])):
        gw.on_line("gpu-1", line)
    assert list(capacity.quarantined(w.env.store)) == [h200_uuid(0)]
    step(gw)
    wait_for(lambda: gw.acts.done == [("replace", "gpu-1")])  # at once, its job or not


def test_an_application_xid_is_an_event_and_a_manual_cluster_is_only_drained(w):
    """Changed: XID 13 (monitor-class), then XID 79 with NodeRecovery None."""
    gw = watch(w)
    for line in monitor_lines(FakeNvml([h200_gpu()], xids=[(0, 13)])):
        gw.on_line("gpu-1", line)
    step(gw)
    assert not w.slurm.nodes_["gpu-1"].drained and gw.acts.done == []
    assert any("xid-13" in e for e in events(w))
    w.env.store.update_spec("lab", lambda s: {**s, "NodeRecovery": "None"})
    gw2 = watch(w)
    for line in monitor_lines(FakeNvml([h200_gpu()], xids=[(0, 79)])):
        gw2.on_line("gpu-1", line)
    step(gw2)
    assert w.slurm.nodes_["gpu-1"].gpu_finding and gw2.acts.done == []
    assert any("kept drained: NodeRecovery is not Automatic" in e for e in events(w))


def test_a_finding_back_after_a_reboot_escalates_to_replace(w):
    """Changed: a row remap stays pending after the reboot (a container restart does not reset a GPU)."""
    gw = watch(w)
    pending = monitor_lines(FakeNvml([h200_gpu(remapped_rows=[0, 1, 1, 0])]))
    for line in pending:
        gw.on_line("gpu-1", line)
    assert w.slurm.nodes_["gpu-1"].reason.startswith("hp:gpu:recover:remap-pending")
    step(gw)
    wait_for(lambda: gw.acts.done == [("reboot", "gpu-1")], timeout=10)
    assert gw.runtime.idle(gw.kind, 10)
    assert not w.slurm.nodes_["gpu-1"].drained  # back in service after the reboot
    for line in pending[1:]:  # the next snapshots still show it: the re-check
        gw.on_line("gpu-1", line)
    step(gw)
    wait_for(lambda: gw.acts.done == [("reboot", "gpu-1"), ("replace", "gpu-1")], timeout=10)
    gw.runtime.shutdown()


def test_an_agent_restarted_between_the_reboot_and_the_re_check_replaces(w):
    """Changed: a row remap stays pending after the reboot, and the agent that rebooted the
    node is gone before the re-check (a new GpuWatch: nothing of the old one's memory)."""
    first = watch(w)
    pending = monitor_lines(FakeNvml([h200_gpu(remapped_rows=[0, 1, 1, 0])]))
    for line in pending:
        first.on_line("gpu-1", line)
    step(first)
    wait_for(lambda: first.acts.done == [("reboot", "gpu-1")], timeout=10)
    assert first.runtime.idle(first.kind, 10)
    first.runtime.shutdown()
    again = watch(w)
    d = None
    for line in pending:  # the re-check: the new agent's first look at the monitor
        d = again.on_line("gpu-1", line) or d
    assert d is not None and d.action == "replace" and d.at_once
    assert any("it will be replaced now" in e for e in events(w))
    step(again)
    wait_for(lambda: again.acts.done == [("replace", "gpu-1")], timeout=10)
    assert again.runtime.idle(again.kind, 10)
    history = [r.phase for r in w.env.store.node_history("lab", "gpu-1")]
    assert history.count("Rebooting") == 1 and history[-2:] == ["Replacing", "Running"]
    again.runtime.shutdown()


def test_a_node_drained_before_an_agent_restart_is_acted_on_by_the_next(w):
    """Changed: the agent that drained the node for XID 79 is gone before it acted: the next
    one reads what to do from Slurm's drain reason alone."""
    first = watch(w)
    for line in monitor_lines(FakeNvml([h200_gpu()], xids=[(0, 79)])):
        first.on_line("gpu-1", line)
    first.runtime.shutdown()
    again = watch(w)
    step(again)
    wait_for(lambda: again.acts.done == [("reboot", "gpu-1")], timeout=10)
    again.runtime.shutdown()


def test_a_health_check_may_take_a_node_the_monitor_drained():
    sn = SlurmNode("gpu-1", ("IDLE", "DRAIN"), "hp:gpu:recover:xid-79 XID 79 on GPU 0")
    assert claim(sn).drain and not sn.admin_hold and sn.condition() == "ok"
    assert not claim(sn, on_start=True).drain
