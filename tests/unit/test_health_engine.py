"""The health engine's drain / check / resume / recover flow on the fakes, with the check
tools answering with real outputs (tests/fixtures), and the failure policy: a bug in a
parser is reported and leaves the node in service, never rebooted or replaced."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import spec_doc, world

from orchestrator.cluster.create import CreateOptions, create
from orchestrator.core.context import Cluster
from orchestrator.docker.views import ExecResult
from orchestrator.errors import BadInput, NotFound, OperationFailed
from orchestrator.health.requests import onstart, service
from orchestrator.health.requests import runner as engine_mod
from orchestrator.health.requests.runner import Options, run_and_record
from orchestrator.health.tools.stress import RC_MARK, YAML_MARK, StressOptions
from orchestrator.recovery import actions
from orchestrator.spec.model import validate
from orchestrator.state.health_requests import Records
from orchestrator.state.phases import Phase

FIX = Path(__file__).resolve().parent.parent / "fixtures"
STRESS_OK = (
    (FIX / "stress-ng-0.15.06-pass.log").read_text()
    + YAML_MARK
    + "\n"
    + (FIX / "stress-ng-0.15.06-pass.yaml").read_text()
    + f"{RC_MARK}0\n"
)
STRESS_VM_ZERO = (
    (FIX / "stress-ng-0.15.06-vm-ulimit-zero-ops.log").read_text()
    + YAML_MARK
    + "\n"
    + (FIX / "stress-ng-0.15.06-vm-ulimit-zero-ops.yaml").read_text()
    + f"{RC_MARK}0\n"
)
IPERF_OK = (FIX / "iperf3-pass.json").read_text()
# a real run on cgroup v1 whose container the kernel ran out of memory (tmpfs filled during
# it): stress-ng killed, exit 137, 8 OOM kills (tests/fixtures/README.md)
OOM_BEFORE = (FIX / "hp-stress-trixie-cgroup1-oom-137-before.txt").read_text()
OOM_137 = (FIX / "hp-stress-trixie-cgroup1-oom-137.txt").read_text()


class Tools:
    """What the check image's tools print, per node (a node in `sick` fails stress)."""

    def __init__(self) -> None:
        self.sick: set[str] = set()
        self.killed: set[str] = set()  # the kernel kills the stress run (OOM, 137)
        self.ran: list[tuple[str, str]] = []

    def __call__(self, c, argv: list[str]) -> ExecResult:
        node = c.spec.labels.get("io.hp.node", "")
        self.ran.append((node, argv[0]))
        if argv[0] == "/usr/local/bin/hp-stress" and argv[1:] == ["--memory"]:
            return ExecResult(0, OOM_BEFORE if node in self.killed else "")
        if argv[0] == "/usr/local/bin/hp-stress":
            if node in self.killed:
                return ExecResult(0, OOM_137)
            return ExecResult(0, STRESS_VM_ZERO if node in self.sick else STRESS_OK)
        if argv[0] == "ssh-keygen":
            key = argv[argv.index("-f") + 1]
            c.files[key], c.files[key + ".pub"] = b"PRIVATE", b"ssh-ed25519 PUB"
            return ExecResult(0, "")
        if argv[0] == "iperf3" and "-c" in argv:
            return ExecResult(0, IPERF_OK)
        if argv[0] == "mpirun":
            hosts = [h.split(":")[0] for h in argv[argv.index("--host") + 1].split(",")]
            n = len(hosts)
            return ExecResult(
                0,
                "".join(
                    f"HP-MPI rank={i} size={n} host={h} sum={n * (n + 1) // 2} expected={n * (n + 1) // 2} ok=1\n"
                    for i, h in enumerate(hosts)
                ),
            )
        return ExecResult(0, "")


@pytest.fixture
def w(tmp_path, monkeypatch):
    monkeypatch.setattr(actions, "POLL_S", 0.001)
    monkeypatch.setattr(engine_mod, "POLL_S", 0.001)
    w = world(tmp_path)
    create(
        w.env,
        validate(spec_doc("lab", [("cpu", "cpu.nano", 3)], login=False), w.env.catalogue),
        CreateOptions(timeout=5),
    )
    w.tools = Tools()
    w.provider.exec_handler = w.tools
    return w


def request(w, nodes, checks=("InstanceStress", "InstanceConnectivity"), **opts):
    rec = Records(w.env.store)
    rid = rec.new_request("lab", list(checks), ["cpu"], nodes, {})
    verdicts = run_and_record(Cluster(w.env, "lab"), rid, nodes, Options(checks=list(checks), recovery_wait=2, **opts))
    return rid, {n: str(v) for n, v in verdicts.items()}


def test_healthy_nodes_are_drained_checked_and_resumed(w):
    rid, verdicts = request(w, ["cpu-1", "cpu-2", "cpu-3"])
    assert verdicts == {"cpu-1": "Passed", "cpu-2": "Passed", "cpu-3": "Passed"}
    assert ("drain", ("cpu-1", "cpu-2", "cpu-3")) in w.slurm.calls
    assert all(not n.drained for n in w.slurm.nodes())
    assert {r.phase for r in w.env.store.latest_phases("lab").values()} == {Phase.RUNNING}
    assert not [c for c in w.provider.containers("lab") if c.role == "check"]  # check containers removed
    res = Records(w.env.store).results(rid)
    assert {(r.node, r.check, r.state) for r in res} >= {
        ("cpu-1", "InstanceStress", "Passed"),
        ("cpu-2", "InstanceConnectivity", "Passed"),
    }
    st = service.status(w.env, "lab", rid)
    assert service.all_passed(st) and st["Request"]["Results"] == {f"cpu-{i}": "Passed" for i in (1, 2, 3)}


def test_a_failing_node_is_rebooted_rechecked_and_passes(w):
    w.tools.sick.add("cpu-2")
    restarted = []

    def rebooted(c):  # the reboot cures it (the node's container, not its check container)
        if c.spec.labels.get("io.hp.role") == "worker":
            restarted.append(c.spec.name)
            w.tools.sick.discard("cpu-2")

    w.provider.on_start.append(rebooted)
    _, verdicts = request(w, ["cpu-1", "cpu-2"], checks=("InstanceStress",))
    assert verdicts == {"cpu-1": "Passed", "cpu-2": "Passed after reboot"}
    assert restarted == ["hp-lab-cpu-2"] and not w.slurm.nodes_["cpu-2"].drained


def test_a_node_that_keeps_failing_is_kept_drained_with_the_reason(w):
    w.tools.sick.add("cpu-3")
    spec = w.env.store.cluster("lab").spec
    w.env.store.update_spec("lab", lambda s: {**s, "NodeRecovery": "None"})
    rid, verdicts = request(w, ["cpu-3"], checks=("InstanceStress",))
    assert verdicts["cpu-3"].startswith("Failed: InstanceStress: ")
    sn = w.slurm.nodes_["cpu-3"]
    assert sn.drained and sn.reason.startswith(f"hp:health:{rid}:InstanceStress failed:")
    assert not any(op == "restart" for op, _ in w.provider.calls)
    assert spec  # (unchanged otherwise)


def test_a_bug_in_a_parser_is_no_verdict_and_never_reboots(w, monkeypatch):
    def buggy(*a, **k):
        raise TypeError("unsupported operand type(s)")

    monkeypatch.setattr(engine_mod, "judge", buggy)
    rid, verdicts = request(w, ["cpu-1"], checks=("InstanceStress",))
    assert verdicts["cpu-1"].startswith("Error: internal error in health check InstanceStress on cpu-1: TypeError")
    assert not w.slurm.nodes_["cpu-1"].drained  # back in service
    assert not any(op in ("restart", "remove") for op, n in w.provider.calls if n == "hp-lab-cpu-1")
    assert any("internal error" in e.description and "TypeError" in e.description for e in w.env.store.events("lab"))
    assert [r.state for r in Records(w.env.store).results(rid)] == ["Error"]
    assert not service.all_passed(service.status(w.env, "lab", rid))


def test_a_stress_run_the_kernel_killed_is_no_verdict_and_never_reboots(w):
    """Issue 24: a healthy node's check killed by the OOM killer (stress-ng exited 137) was
    a failed node, rebooted and replaced. Now: the check could not run, with the reason;
    the node goes back into service untouched."""
    w.tools.killed.add("cpu-2")
    rid, verdicts = request(w, ["cpu-1", "cpu-2"], checks=("InstanceStress",))
    assert verdicts["cpu-1"] == "Passed"
    v = verdicts["cpu-2"]
    assert v.startswith("Error: the check could not run: stress-ng exited 137: terminated by signal 9"), v
    assert "the OOM killer killed 8 process(es) in the check container" in v and "memory limit 128 MiB" in v
    assert not w.slurm.nodes_["cpu-2"].drained  # back in service
    assert not any(op in ("restart", "remove") for op, n in w.provider.calls if n == "hp-lab-cpu-2")
    res = {r.node: r for r in Records(w.env.store).results(rid)}
    assert res["cpu-2"].state == "Error" and "the node was not judged" in res["cpu-2"].reasons[0]
    assert not any("internal error" in e.description for e in w.env.store.events("lab"))


def test_busy_and_foreign_drained_nodes_are_skipped(w):
    w.slurm.set("cpu-1", "IDLE", "DRAIN", reason="admin work")
    w.slurm.set("cpu-2", "ALLOCATED")
    _, verdicts = request(w, ["cpu-1", "cpu-2"], checks=("InstanceStress",), wait_idle_timeout=0.01)
    assert verdicts["cpu-1"].startswith("Skipped: already drained by someone else")
    assert verdicts["cpu-2"].startswith("Skipped: still running jobs")
    assert w.slurm.nodes_["cpu-1"].reason == "admin work"


def test_service_validates_before_touching_anything_and_cancels(w):
    with pytest.raises(BadInput) as e:
        service.start(w.env, "lab", ["nope"], ["cpu-9"], ["Bogus"], {"vm_bytes": "1M; id", "dcgm_level": 9})
    assert len(e.value.problems) == 2  # options first: size and dcgm level
    with pytest.raises(BadInput) as e:
        service.start(w.env, "lab", ["nope"], ["cpu-9"], ["Bogus"], {})
    assert len(e.value.problems) == 3
    with pytest.raises(NotFound):
        service.start(w.env, "nope", [], [], [], {})
    rid = service.start(w.env, "lab", ["cpu"], [], ["InstanceStress"], {}, detach=False)
    w.slurm.drain(["cpu-1"], f"hp:health:{rid}:InstanceStress")
    w.slurm.up = False  # the controller does not answer: said, and the request stays to be cancelled again
    with pytest.raises(OperationFailed):
        service.cancel(w.env, "lab")
    assert service.status(w.env, "lab")["Request"]["State"] == "Pending" and w.slurm.nodes_["cpu-1"].drained
    w.slurm.up = True
    assert service.cancel(w.env, "lab") == rid
    assert not w.slurm.nodes_["cpu-1"].drained
    with pytest.raises(NotFound):
        service.cancel(w.env, "lab")
    assert service.status(w.env, "lab")["Request"]["State"] == "Cancelled"


def test_a_request_whose_worker_died_is_failed_and_hands_its_nodes_back(w):
    rec = Records(w.env.store)
    rid = rec.new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-1"], {})
    rec.set_pid(rid, 2**22 + 12345)  # no such process
    w.slurm.drain(["cpu-1"], f"hp:health:{rid}:InstanceStress")
    w.env.store.set_phase("lab", "cpu-1", "DeepHealthCheckInProgress", rid)
    doc = service.status(w.env, "lab", rid)
    assert doc["Request"]["State"] == "Failed" and "died" in doc["Request"]["Message"]
    assert not w.slurm.nodes_["cpu-1"].drained and w.env.store.latest_phases("lab").phase("cpu-1") is Phase.RUNNING


def test_on_start_checks_of_new_nodes(w):
    w.slurm.drain(["cpu-1", "cpu-2"], "hp:health:on-start:pending")
    w.env.store.update_spec(
        "lab",
        lambda s: {
            **s,
            "InstanceGroups": [
                {**g, "OnStartDeepHealthChecks": ["InstanceStress"]} if g["InstanceGroupName"] == "cpu" else g
                for g in s["InstanceGroups"]
            ],
        },
    )
    verdicts = onstart.check_new_nodes(Cluster(w.env, "lab"), ["cpu-1", "cpu-2"])
    assert {n: str(v) for n, v in verdicts.items()} == {"cpu-1": "Passed", "cpu-2": "Passed"}
    assert not w.slurm.nodes_["cpu-1"].drained
    rec = Records(w.env.store)
    assert rec.requests("lab")[-1].options["on_start"] is True
    # another request active: the on-start check waits (ClusterBusy), nothing is touched
    rec.new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-3"], {})
    with pytest.raises(onstart.ClusterBusy):
        onstart.check_new_nodes(Cluster(w.env, "lab"), ["cpu-3"])


def test_worker_options_come_from_the_recorded_request():
    from orchestrator.health.requests.worker import options

    o = options({"stress_seconds": 7, "vm_bytes": "1G", "dcgm_level": 3, "recovery_wait": 5})
    assert o.stress == StressOptions(7, "1G") and o.dcgm_level == 3 and o.recovery_wait == 5.0


def test_a_node_whose_cgroup_is_short_fails_even_when_its_check_cannot_run(w):
    """A node `docker update`d to 40 MiB (cpu.nano promises 256): no room for a memory
    stressor, but the short grant is the node's own fault: Failed, with both reasons."""
    node = w.provider.node("lab", "cpu-3")
    node.spec.memory_bytes = 40 * 2**20
    w.env.store.update_spec("lab", lambda s: {**s, "NodeRecovery": "None"})
    tight = (FIX / "hp-stress-trixie-cgroup1-oom-137-before.txt").read_text().replace("134217728", str(40 * 2**20))
    real, ran = w.tools, []

    def tools(c, argv):
        ran.append((c.spec.labels.get("io.hp.node"), argv[:2]))
        if argv[1:] == ["--memory"] and c.spec.labels.get("io.hp.node") == "cpu-3":
            return ExecResult(0, tight)
        return real(c, argv)

    w.provider.exec_handler = tools
    rid, verdicts = request(w, ["cpu-3"], checks=("InstanceStress",))
    assert verdicts["cpu-3"].startswith("Failed: InstanceStress: memory limit is 40 MiB"), verdicts
    (res,) = Records(w.env.store).results(rid)
    assert res.state == "Failed" and any("no room for a memory stressor" in r for r in res.reasons), res.reasons
    assert ("cpu-3", ["/usr/local/bin/hp-stress", "--memory"]) in ran  # the cgroup was read...
    assert ("cpu-3", ["/usr/local/bin/hp-stress", "--cpu"]) not in ran  # ...and stress-ng never ran
