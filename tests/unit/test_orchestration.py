"""Orchestration against the fakes (tests/fakes.py): create's stages and rollback, the
reconciler (scale up and down, which nodes go first, backoff, crash leftovers), the
agent's status sync and all-or-nothing rollback, scaling bounds, delete, queries.
Milliseconds each; the same behaviours run against real Docker and Slurm in tests/e2e."""

from __future__ import annotations

import ast
import re
import shutil
import time
from pathlib import Path

import pytest
from fakes import FakeAgents, FakeProvider, spec_doc, world

import orchestrator.cluster.create as create_mod
import orchestrator.cluster.reconciler as reconciler
from orchestrator.agent.daemon import CLUSTER, Agent, Provisioning, sync_status
from orchestrator.cluster import teardown
from orchestrator.cluster.create import CreateOptions, create
from orchestrator.cluster.delete import delete
from orchestrator.cluster.describe import describe
from orchestrator.cluster.query import list_clusters, nodes
from orchestrator.cluster.reconciler import BACKOFF, GroupReconciler
from orchestrator.cluster.scaling import delete_nodes, scale
from orchestrator.cluster.teardown import remove_network
from orchestrator.core import capacity
from orchestrator.core.context import Cluster, Env
from orchestrator.core.launcher import Launcher
from orchestrator.errors import BadInput, EngineError, NotFound, OperationFailed
from orchestrator.releases import DEFAULT
from orchestrator.spec.model import validate
from orchestrator.state.operations import OperationKind, OperationStatus
from orchestrator.state.store import Store


def make(w, name="lab", groups=None, wait=True, **top):
    spec = validate(spec_doc(name, groups, **top), w.env.catalogue)
    return create(w.env, spec, CreateOptions(wait=wait, timeout=5))


def phases(w, name):
    return {n: r.phase for n, r in w.env.store.latest_phases(name).items()}


def reconcile(w, name, group, passes=6, clock=None):
    c = Cluster(w.env, name)
    rec = GroupReconciler(c, group, Launcher(c, w.env.images(DEFAULT).refs()), clock=clock or (lambda: 1e11))
    for _ in range(passes):
        rec.step({n.name: n for n in w.slurm.nodes()})
    return rec


# -- create -----------------------------------------------------------------------------
def test_create_makes_every_node_in_order_and_records_phases(tmp_path):
    w = world(tmp_path)
    make(w)
    names = [n for op, n in w.provider.calls if op == "create"]
    # accounting (on by default) in the controller's container; the nodes once it
    # started (test_services.py: the order)
    assert sorted(names) == sorted(["hp-lab-controller-1", "hp-lab-cpu-1", "hp-lab-cpu-2", "hp-lab-login-1"])
    assert names[0] == "hp-lab-controller-1"
    assert set(phases(w, "lab").values()) == {"Running"}
    assert w.env.store.cluster("lab").status == "InService"
    assert w.agents.ensured == ["lab"]
    ctl = w.provider.node("lab", "controller-1")
    assert "/etc/slurm/slurm.conf" in ctl.files and "/etc/slurm/slurm.key" in ctl.files
    assert b"MaxNodeCount=128" in ctl.files["/etc/slurm/slurm.conf"]
    assert w.env.store.cluster("lab").spec["MaxNodeCount"] == 128  # fixed from now on
    doc = describe(w.env, "lab")
    assert [g["Status"] for g in doc["InstanceGroups"]] == ["InService"] * 3


def test_create_hands_on_slurms_nodes_from_the_look_that_saw_every_node_join(tmp_path):
    """What `hp create` prints after it needs no second Slurm query: create returns the
    nodes of its last look (every compute node joined in it), and describe shows them."""
    w = world(tmp_path)
    made = make(w)
    assert made.cluster.name == "lab" and sorted(made.slurm_nodes) == ["cpu-1", "cpu-2"]
    w.slurm.up = False  # a query now would fail: the view comes from create's look
    doc = describe(w.env, "lab", services=False, slurm_nodes=made.slurm_nodes)
    assert doc["ControllerReachable"] and [g["Status"] for g in doc["InstanceGroups"]] == ["InService"] * 3
    # without it describe asks Slurm, and says when it cannot
    assert not describe(w.env, "lab", services=False)["ControllerReachable"]
    # continuous mode: create waits for the login node only, so it hands on no look
    w.slurm.up = True
    assert make(w, "cont", NodeProvisioningMode="Continuous").slurm_nodes is None


def test_the_login_nodes_join_is_looked_at_in_the_pass_in_which_the_last_worker_joined(tmp_path):
    """The workers show up in Slurm at create's second look; the login node answers from
    then on. Its join is seen in that same pass (not one pass, NODES_POLL_S, later), and
    that look is handed on."""
    w = world(tmp_path)
    w.slurm.auto_register = False
    looks = [0]
    real_nodes, real_ping_from = w.slurm.nodes, w.slurm.ping_from

    def nodes():
        looks[0] += 1
        if looks[0] == 2:  # slurmd registers
            for c in w.provider.containers_.values():
                if c.spec.labels.get("io.hp.role") == "worker" and c.state == "running":
                    w.slurm.set(c.spec.hostname, "IDLE")
        return real_nodes()

    w.slurm.nodes = nodes
    w.slurm.ping_from = lambda container: looks[0] >= 2 and real_ping_from(container)
    passes = []

    class Passes(create_mod.NoProgress):
        def groups(self, counts):
            passes.append(counts)

    spec = validate(spec_doc("lab", None), w.env.catalogue)
    made = create(w.env, spec, CreateOptions(timeout=5), Passes())
    assert w.env.store.cluster("lab").status == "InService"
    assert len(passes) == 2 and looks[0] == 2, (passes, looks)
    assert sorted(made.slurm_nodes) == ["cpu-1", "cpu-2"]


def test_all_or_nothing_create_that_cannot_be_provisioned_rolls_back(tmp_path):
    w = world(tmp_path)
    capacity.set_limit(w.env.store, "cpu.nano", 2)  # login + 1 worker fit, not 2
    with pytest.raises(OperationFailed, match="all-or-nothing provisioning failed"):
        make(w)
    assert w.provider.containers("lab") == [] and w.provider.networks("lab") == [] and w.provider.volumes("lab") == []
    row = w.env.store.cluster("lab")
    assert row.status == "Failed" and "InsufficientCapacity" in row.message
    assert not (w.home / "clusters" / "lab" / "slurm.key").exists()
    # its name is free again
    capacity.set_limit(w.env.store, "cpu.nano", None)
    make(w)


def test_continuous_create_is_in_service_with_what_is_up_and_records_the_rest(tmp_path):
    w = world(tmp_path)
    capacity.set_limit(w.env.store, "cpu.nano", 2)
    make(w, NodeProvisioningMode="Continuous")
    assert w.env.store.cluster("lab").status == "InService"
    ph = phases(w, "lab")
    assert ph["login-1"] == "Running" and sorted([ph["cpu-1"], ph["cpu-2"]]) == ["LaunchFailed", "Launching"]


def test_controller_that_cannot_start_is_fatal_and_rolled_back(tmp_path):
    w = world(tmp_path)
    w.provider.fail_start = lambda c: EngineError("port conflict", 500) if "controller" in c.spec.name else None
    with pytest.raises(OperationFailed, match="controller controller-1 could not be started"):
        make(w, NodeProvisioningMode="Continuous")
    assert w.provider.containers("lab") == []


def test_retain_keeps_a_failed_cluster(tmp_path):
    w = world(tmp_path)
    capacity.set_limit(w.env.store, "cpu.nano", 0)
    spec = validate(spec_doc("lab"), w.env.catalogue)
    with pytest.raises(OperationFailed):
        create(w.env, spec, CreateOptions(timeout=5, retain=True))
    assert w.provider.containers("lab") and w.env.store.cluster("lab").status == "Failed"


def test_a_name_in_use_and_too_big_a_spec_are_refused_before_anything_is_made(tmp_path):
    w = world(tmp_path)
    make(w)
    with pytest.raises(BadInput, match="already exists"):
        make(w)
    n = len(w.provider.containers_)
    with pytest.raises(BadInput, match="more than this host can ever run"):
        make(w, name="big", groups=[("cpu", "cpu.large", 40)])  # 40 x 1 CPU on 8 x 4 CPUs of pool
    assert len(w.provider.containers_) == n and w.env.store.cluster("big") is None


def test_missing_images_are_built_and_no_wait_leaves_the_rest_to_the_agent(tmp_path):
    w = world(tmp_path, build=False)
    w.slurm.auto_register = False
    make(w, wait=False)
    assert w.env.store.cluster("lab").status == "Creating"
    assert phases(w, "lab")["cpu-1"] == "Launching"
    # the agent's passes: workers register, the cluster becomes InService
    w.slurm.auto_register = True
    for n in ("cpu-1", "cpu-2"):
        w.slurm.register(w.provider.node("lab", n))
    c = Cluster(w.env, "lab")
    for g in ("login", "cpu"):
        reconcile(w, "lab", g, passes=2)
    sync_status(c)
    assert w.env.store.cluster("lab").status == "InService"


def history(w, name, node):
    return [(r.phase, r.message) for r in w.env.store.node_history(name, node)]


def test_create_launches_and_waits_through_the_agents_reconciler(tmp_path, monkeypatch):
    """create launches its nodes with the reconciler's code (one batch over every group:
    one capacity decision) and waits with the groups' passive sync, as the agent does:
    the records are the reconciler's; create launches nothing of its own."""
    batches, synced, stepped = [], [], []
    real_create, real_sync = reconciler.Launch.create, reconciler.GroupReconciler.sync

    def spy_create(self, files=None):
        batches.append(sorted(self.rec_of))
        return real_create(self, files)

    def spy_sync(self, snodes):
        synced.append(self.group)
        return real_sync(self, snodes)

    monkeypatch.setattr(reconciler.Launch, "create", spy_create)
    monkeypatch.setattr(reconciler.GroupReconciler, "sync", spy_sync)
    monkeypatch.setattr(reconciler.GroupReconciler, "step", lambda self, snodes: stepped.append(self.group))
    w = world(tmp_path)
    make(w)
    assert batches == [["cpu-1", "cpu-2", "login-1"]]
    assert set(synced) == {"cpu", "login"} and stepped == []
    assert history(w, "lab", "cpu-1") == [
        ("Queued", "waiting for capacity"),
        ("Launching", "container started"),
        ("Running", ""),
    ]
    # create's own nodes get no per-node event (as before the one launch path: a node's
    # events tell of what happened to it later); the agent's launches do
    assert not [e for e in w.env.store.events("lab") if "is running and joined Slurm" in e.description]
    # the controller is one of create's actions: its records through the same Recorder
    assert history(w, "lab", "controller-1")[-1] == ("Running", "")
    assert any(e.description == "Controller controller-1 is up" for e in w.env.store.events("lab"))


def test_a_launch_failure_is_written_in_one_place_at_create_and_by_the_agent(tmp_path, monkeypatch):
    written = []
    real = reconciler.GroupReconciler.failed

    def spy(self, n, err, cid=None):
        written.append((self.group, n, err.code))
        return real(self, n, err, cid)

    monkeypatch.setattr(reconciler.GroupReconciler, "failed", spy)
    w = world(tmp_path)
    capacity.set_limit(w.env.store, "cpu.nano", 2)  # login + 1 worker fit, not 2
    with pytest.raises(OperationFailed) as e:
        make(w)
    # the text users and tests see: the LaunchError itself, per group
    assert str(e.value).startswith(
        "all-or-nothing provisioning failed: group cpu could not be fully provisioned (1 node(s)): cpu-"
    )
    assert written == [("cpu", "cpu-2", "InsufficientCapacity")]
    ph, msg = history(w, "lab", "cpu-2")[-1]
    assert ph == "LaunchFailed" and msg.startswith("InsufficientCapacity: ") and msg.endswith("(retry 1, next in 1 s)")
    ev = [x for x in w.env.store.events("lab") if x.node == "cpu-2" and x.level == "Warn"]
    assert [x.description.split(": ", 1)[0] for x in ev] == [
        "Instance creation in cluster lab and instance group cpu failed"
    ]
    # the agent's launch of the same node writes through the same place
    capacity.set_limit(w.env.store, "cpu.nano", None)
    make(w, NodeProvisioningMode="Continuous", groups=[("cpu", "cpu.nano", 1)])
    capacity.set_limit(w.env.store, "cpu.nano", 2)
    scale(w.env, "lab", "cpu", 2)
    reconcile(w, "lab", "cpu", passes=1)
    assert written[-1] == ("cpu", "cpu-2", "InsufficientCapacity")


def test_launch_failure_reasons_and_event_are_made_in_one_function_each():
    """LaunchError("ContainerExited" / "RegistrationTimeout") are made only by
    reconciler.not_joined, and the failed-launch event only by GroupReconciler.failed."""
    root = Path(create_mod.__file__).resolve().parents[1]
    sites: dict[str, set[str]] = {"ContainerExited": set(), "RegistrationTimeout": set(), "Instance creation": set()}
    for p in root.rglob("*.py"):
        text = p.read_text()
        if "data" in p.relative_to(root).parts or not any(key in text for key in sites):
            continue
        tree = ast.parse(text)
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for key in sites:
                        if node.value == key or node.value.startswith(f"{key} in cluster"):
                            sites[key].add(f"{p.relative_to(root)}:{fn.name}")
    assert sites == {
        "ContainerExited": {"cluster/reconciler.py:not_joined"},
        "RegistrationTimeout": {"cluster/reconciler.py:not_joined"},
        "Instance creation": {"cluster/reconciler.py:failed"},
    }


def test_a_node_that_exits_or_never_registers_fails_an_all_or_nothing_create(tmp_path, monkeypatch):
    w = world(tmp_path)

    def exits(c):
        if c.spec.hostname == "cpu-2":
            c.state, c.exit_code, c.logs = "exited", 3, "slurmd cannot start\n"

    w.provider.on_start.append(exits)
    with pytest.raises(
        OperationFailed, match="cpu-2: ContainerExited: container exited with code 3 at start: slurmd cannot start"
    ):
        make(w)
    assert w.provider.containers("lab") == [] and w.env.store.cluster("lab").status == "Failed"
    # a node whose container is gone while create waits for it
    w.provider.on_start[-1] = lambda c: c.spec.hostname == "cpu-1" and w.provider.remove_container(c.id)
    with pytest.raises(OperationFailed, match="cpu-1: ContainerExited: its container is gone before it joined"):
        make(w)
    # one that does not register within the one register timeout (HP_REGISTER_TIMEOUT)
    w = world(tmp_path / "again")  # a Slurm that knows no node
    w.slurm.auto_register = False
    monkeypatch.setattr(reconciler, "REGISTER_TIMEOUT", 0.3)
    with pytest.raises(
        OperationFailed, match=r"cpu-\d: RegistrationTimeout: slurmd on cpu-\d did not register within 0.3 s"
    ):
        make(w)
    assert w.provider.containers("lab") == []


def test_continuous_create_waits_for_login_nodes_and_leaves_retries_to_the_agent(tmp_path):
    w = world(tmp_path)
    now = [time.time()]
    w.env.store.clock = lambda: now[0]
    w.provider.fail_start = lambda c: EngineError("device busy", 500) if c.spec.hostname == "cpu-2" else None
    answers = iter([False, False, False])

    def ping_from(container):  # the login node answers late: long after cpu-2's retry was due
        now[0] += 2 * BACKOFF.delay(1)
        return next(answers, True)

    w.slurm.ping_from = ping_from
    make(w, NodeProvisioningMode="Continuous")
    assert w.env.store.cluster("lab").status == "InService"
    assert phases(w, "lab")["login-1"] == "Running" and phases(w, "lab")["cpu-1"] == "Launching"
    assert [p for p, _ in history(w, "lab", "cpu-2")] == ["Queued", "LaunchFailed"]  # tried once: the agent retries
    assert "ContainerStartFailed: device busy (retry 1" in history(w, "lab", "cpu-2")[-1][1]
    # the agent's retry says which try it is, not that the node waits for capacity
    reconcile(w, "lab", "cpu", passes=1, clock=lambda: now[0] + 60)
    assert history(w, "lab", "cpu-2")[-2:] == [
        ("Queued", "being launched again (try 2) after ContainerStartFailed: device busy"),
        ("LaunchFailed", "ContainerStartFailed: device busy (retry 2, next in 2 s)"),
    ]


def test_a_controller_that_exits_at_start_is_made_again_in_continuous_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(create_mod, "POLL_S", 0.001)
    w = world(tmp_path)
    starts = []

    def first_exits(c):
        if c.spec.hostname == "controller-1":
            starts.append(c.id)
            w.slurm.up = len(starts) > 1
            if len(starts) == 1:
                c.state, c.exit_code, c.logs = "exited", 1, "fatal: bad config\n"

    w.provider.on_start.append(first_exits)
    make(w, NodeProvisioningMode="Continuous", Accounting={"Enabled": False})
    assert len(starts) == 2 and w.env.store.cluster("lab").status == "InService"
    assert [p for p, _ in history(w, "lab", "controller-1")] == [
        "Queued",
        "Launching",
        "LaunchFailed",
        "Queued",
        "Launching",
        "Running",
    ]
    ev = [e.description for e in w.env.store.events("lab") if e.node == "controller-1"]
    assert ev[0].startswith("Controller controller-1 failed, retrying: ContainerExited: container exited with code 1")
    assert "fatal: bad config" in ev[0] and ev[-1] == "Controller controller-1 is up"
    # all-or-nothing: the controller's failure is the create's
    w.provider.on_start[-1] = lambda c: c.spec.hostname == "controller-1" and setattr(w.slurm, "up", False)
    monkeypatch.setattr(reconciler, "REGISTER_TIMEOUT", 0.05)
    with pytest.raises(OperationFailed, match="controller controller-1: RegistrationTimeout: slurmctld did not answer"):
        make(w, name="lab2", Accounting={"Enabled": False})
    assert w.provider.containers("lab2") == []


# -- the reconciler ---------------------------------------------------------------------
def test_scale_up_and_down_removes_idle_and_broken_nodes_first(tmp_path):
    w = world(tmp_path)
    make(w)
    scale(w.env, "lab", "cpu", 4)
    assert w.agents.poked == ["lab"]
    reconcile(w, "lab", "cpu")
    assert {n: p for n, p in phases(w, "lab").items() if n.startswith("cpu")} == {
        f"cpu-{i}": "Running" for i in range(1, 5)
    }
    w.slurm.set("cpu-1", "ALLOCATED")  # busy: last to go
    w.provider.die("lab", "cpu-4")  # broken: first
    scale(w.env, "lab", "cpu", 2)
    reconcile(w, "lab", "cpu", passes=8)
    left = sorted(c.node for c in w.provider.containers("lab") if c.group == "cpu")
    assert left == ["cpu-1", "cpu-2"], left
    assert ("drain", ("cpu-3",)) in w.slurm.calls and ("delete", ("cpu-3",)) in w.slurm.calls
    assert phases(w, "lab")["cpu-4"] == "Removed" and phases(w, "lab")["cpu-3"] == "Removed"


def test_scale_down_waits_for_running_jobs(tmp_path):
    w = world(tmp_path)
    make(w, groups=[("cpu", "cpu.nano", 1)])
    w.slurm.set("cpu-1", "ALLOCATED")
    scale(w.env, "lab", "cpu", 0)
    reconcile(w, "lab", "cpu", passes=4)
    assert w.slurm.nodes_["cpu-1"].drained and w.provider.node("lab", "cpu-1")  # drained, still there
    w.slurm.set("cpu-1", "IDLE", "DRAIN")
    reconcile(w, "lab", "cpu", passes=2)
    assert phases(w, "lab")["cpu-1"] == "Removed"


def test_failed_launches_back_off_from_the_history(tmp_path):
    w = world(tmp_path)
    make(w, NodeProvisioningMode="Continuous", groups=[("cpu", "cpu.nano", 1)])
    capacity.set_limit(w.env.store, "cpu.nano", 2)  # login + cpu-1
    scale(w.env, "lab", "cpu", 2)
    now = [time.time()]
    w.env.store.clock = lambda: now[0]
    c = Cluster(w.env, "lab")
    rec = GroupReconciler(c, "cpu", Launcher(c, w.env.images(DEFAULT).refs()))
    rec.step({n.name: n for n in w.slurm.nodes()})
    h = rec.rec.history("cpu-2")
    assert h.phase.value == "LaunchFailed" and "InsufficientCapacity" in h.message
    nxt = rec.step({n.name: n for n in w.slurm.nodes()})
    assert rec.rec.history("cpu-2").failures_since_running() == 1 and 0 < nxt <= BACKOFF.delay(1)
    capacity.set_limit(w.env.store, "cpu.nano", None)
    now[0] += 0.5  # not yet due
    rec.step({n.name: n for n in w.slurm.nodes()})
    assert rec.rec.history("cpu-2").phase.value == "LaunchFailed"
    now[0] += 5
    rec.step({n.name: n for n in w.slurm.nodes()})
    rec.step({n.name: n for n in w.slurm.nodes()})
    assert rec.rec.history("cpu-2").phase.value == "Running"
    # one event per change: the same reason failing again added none
    assert sum("failed: InsufficientCapacity" in e.description for e in w.env.store.events("lab")) == 1


def test_a_container_that_exits_at_start_is_retried_and_one_left_created_is_started(tmp_path):
    w = world(tmp_path)
    make(w, groups=[("cpu", "cpu.nano", 1)])
    w.provider.die("lab", "cpu-1", 1)
    c = Cluster(w.env, "lab")
    # the node was Running: its death is recovery's business, not the reconciler's
    reconcile(w, "lab", "cpu", passes=1)
    assert phases(w, "lab")["cpu-1"] == "Running"
    # a crash between create and start leaves a created container (maybe without its key):
    # the reconciler removes it and launches the node afresh
    scale(w.env, "lab", "cpu", 2)
    launcher = Launcher(c, w.env.images(DEFAULT).refs())
    w.env.store.set_phase("lab", "cpu-2", "Queued", "")
    launcher.create_many([(c.spec.group("cpu"), 2)])
    half = w.provider.node("lab", "cpu-2").id
    assert w.provider.node("lab", "cpu-2").state == "created"
    reconcile(w, "lab", "cpu", passes=3)
    fresh = w.provider.node("lab", "cpu-2")
    assert fresh.id != half and fresh.state == "running" and phases(w, "lab")["cpu-2"] == "Running"


def test_registration_timeout_fails_the_launch(tmp_path, monkeypatch):
    import orchestrator.cluster.reconciler as r

    w = world(tmp_path)
    make(w, NodeProvisioningMode="Continuous", groups=[("cpu", "cpu.nano", 1)])
    w.slurm.auto_register = False
    scale(w.env, "lab", "cpu", 2)
    now = [time.time()]
    w.env.store.clock = lambda: now[0]
    c = Cluster(w.env, "lab")
    rec = GroupReconciler(c, "cpu", Launcher(c, w.env.images(DEFAULT).refs()))
    monkeypatch.setattr(r, "REGISTER_TIMEOUT", 5.0)
    rec.step({n.name: n for n in w.slurm.nodes()})
    now[0] += 10
    rec.step({n.name: n for n in w.slurm.nodes()})
    assert "RegistrationTimeout" in rec.rec.history("cpu-2").message


def test_stale_recovery_is_taken_back_and_recovering_nodes_are_not_missing(tmp_path):
    w = world(tmp_path)
    make(w, groups=[("cpu", "cpu.nano", 2)])
    w.env.store.set_phase("lab", "cpu-2", "Rebooting", "rebooting: x")
    w.provider.remove_container("hp-lab-cpu-2")
    reconcile(w, "lab", "cpu", passes=2, clock=w.env.store.clock)  # recovery owns it: no new cpu-3
    assert not any(c.node == "cpu-3" for c in w.provider.containers("lab"))
    w.env.store.set_phase("lab", "cpu-1", "Rebooting", "rebooting: y")
    reconcile(w, "lab", "cpu", passes=2)  # long after: the recovery process died
    assert phases(w, "lab")["cpu-1"] == "Running"


def test_delete_nodes_removes_exactly_those_nodes(tmp_path):
    w = world(tmp_path)
    make(w, groups=[("cpu", "cpu.nano", 3)])
    cid = w.provider.node("lab", "cpu-3").id
    doc = delete_nodes(w.env, "lab", ["cpu-1", "i-" + cid[:17]])
    assert doc["NodesToDelete"] == ["cpu-1", "cpu-3"]
    assert w.env.store.cluster("lab").spec["InstanceGroups"][2]["InstanceCount"] == 1
    reconcile(w, "lab", "cpu", passes=4)
    assert sorted(c.node for c in w.provider.containers("lab") if c.group == "cpu") == ["cpu-2"]
    with pytest.raises(BadInput) as e:
        delete_nodes(w.env, "lab", ["cpu-9", "controller-1", "cpu-1"])
    assert len(e.value.problems) == 3


def test_scale_rules_and_bounds_name_every_problem(tmp_path):
    w = world(tmp_path)
    make(w)
    for args, msg in [
        (("nope", 3), "has no instance group 'nope'"),
        (("controller", 2), "Controller group"),
        (("cpu", -5), "must be >= 0"),
        (("cpu", 100000), "MaxNodeCount 128"),
        (("cpu", 120), "more than the host can ever run"),
    ]:
        with pytest.raises(BadInput, match=msg):
            scale(w.env, "lab", *args)
    with pytest.raises(BadInput, match="must be positive"):
        scale(w.env, "lab", "cpu", 0, add=True)
    with pytest.raises(NotFound):
        scale(w.env, "nope", "cpu", 1)
    assert scale(w.env, "lab", "cpu", 2, add=True)["TargetCount"] == 4


def test_all_or_nothing_scale_up_that_fails_is_rolled_back_by_the_agent(tmp_path):
    w = world(tmp_path)
    make(w, groups=[("cpu", "cpu.nano", 1)])
    capacity.set_limit(w.env.store, "cpu.nano", 2)
    scale(w.env, "lab", "cpu", 3)
    c = Cluster(w.env, "lab")
    reconcile(w, "lab", "cpu", passes=1)
    sync_status(c)
    assert w.env.store.cluster("lab").spec["InstanceGroups"][2]["InstanceCount"] == 1
    op = w.env.store.operations("lab", active_only=False)[-1]
    assert op.status is OperationStatus.FAILED and "rolling back to 1" in op.message
    reconcile(w, "lab", "cpu", passes=4)
    assert sorted(c.node for c in w.provider.containers("lab") if c.group == "cpu") == ["cpu-1"]


def test_the_agent_ends_a_scale_done_once_converged_and_leaves_other_operations_to_their_code(tmp_path):
    w = world(tmp_path)
    make(w, groups=[("cpu", "cpu.nano", 1)])
    op = scale(w.env, "lab", "cpu", 2)["OperationId"]
    check = w.env.store.add_operation("lab", "cpu", OperationKind.HEALTH_CHECK, nodes=["cpu-1"], request="hc-x")
    c = Cluster(w.env, "lab")
    sync_status(c)
    assert w.env.store.operation("lab", op).active  # cpu-2 not there yet
    reconcile(w, "lab", "cpu", passes=3)
    sync_status(c)
    done = w.env.store.operation("lab", op)
    assert done.status is OperationStatus.DONE and done.ended is not None
    assert w.env.store.operation("lab", check).active
    texts = [e.description for e in w.env.store.operation_events("lab", op)]
    assert texts[0] == "Scaling instance group cpu in cluster lab from 1 to 2"
    assert texts[-1] == "Scale of instance group cpu in cluster lab completed: 2 node(s)"
    assert any("cpu-2" in t for t in texts[1:-1])  # the launch's own events, written under it


def test_agent_bug_in_a_group_is_reported_once_and_that_group_left_alone(tmp_path, monkeypatch):
    w = world(tmp_path)
    make(w)
    agent = Agent(w.env, "lab")
    c = Cluster(w.env, "lab")
    prov = Provisioning(c, lambda node: None, agent.stop)
    rt = agent.runtime
    rt.add(prov)
    rt.run_once(prov, CLUSTER)  # the spec read: every group's key queued
    rec = prov.recs.setdefault("cpu", GroupReconciler(c, "cpu", Launcher(c, w.env.images(DEFAULT).refs())))
    monkeypatch.setattr(rec, "step", lambda snodes: 1 / 0)
    rt.run_once(prov, "cpu")
    rt.run_once(prov, "cpu")
    bugs = [e.description for e in w.env.store.events("lab") if "internal error" in e.description]
    assert len(bugs) == 1 and "ZeroDivisionError" in bugs[0] and "provisioning of group cpu" in bugs[0]
    assert rt.parked("provisioning") == {"cpu"}
    monkeypatch.setattr(rec, "step", lambda snodes: (_ for _ in ()).throw(OperationFailed("engine hiccup")))
    rt.reset("provisioning")  # a spec change: the group is tried again
    assert rt.parked("provisioning") == set()
    assert rt.run_once(prov, "cpu").failed and rt.failures("provisioning", "cpu") == 1  # the outside world: backed off


# -- queries, delete --------------------------------------------------------------------
def test_nodes_list_and_delete(tmp_path):
    w = world(tmp_path)
    make(w)
    assert [n["SlurmNodeName"] for n in nodes(w.env, "lab", "cpu")["ClusterNodeSummaries"]] == ["cpu-1", "cpu-2"]
    with pytest.raises(BadInput, match="no instance group"):
        nodes(w.env, "lab", "gpu")
    assert list_clusters(w.env)["ClusterSummaries"][0]["ClusterStatus"] == "InService"
    w.provider.up = False
    doc = list_clusters(w.env)
    assert doc["EngineReachable"] is False and "last recorded" in doc["ClusterSummaries"][0]["StatusNote"]
    w.provider.up = True
    removed = delete(w.env, "lab")
    assert removed == {"containers": 4, "networks": 1, "volumes": 3}  # with the database's volume
    assert w.env.store.cluster("lab") is None and w.agents.stopped == ["lab"]
    assert ("drain", ("cpu-1", "cpu-2")) in w.slurm.calls or ("drain", ("cpu-2", "cpu-1")) in w.slurm.calls
    with pytest.raises(NotFound):
        delete(w.env, "lab")
    assert any("deleted" in e.description for e in w.env.store.events("lab"))


def test_delete_from_another_state_folder_is_refused_while_the_maker_holds_the_cluster(tmp_path):
    # two HP_HOMEs on one engine: the one that did not make the cluster must not remove
    # it from under its maker (whose agent would bring nodes back); an orphan it may
    w = world(tmp_path)
    make(w)
    other = Env(
        provider=w.provider, store=Store(tmp_path / "other"), slurm_factory=w.env.slurm_factory, agents=FakeAgents()
    )
    before = len(w.provider.containers("lab"))
    home = re.escape(str(w.home.resolve()))
    with pytest.raises(BadInput, match=rf"made from another hp state folder, {home}.*HP_HOME={home} hp delete lab"):
        delete(other, "lab")
    assert len(w.provider.containers("lab")) == before and w.env.store.cluster("lab") is not None
    spec = validate(spec_doc("lab"), other.catalogue)
    with pytest.raises(
        BadInput, match=rf"name in use: cluster 'lab' exists: it was made from another hp state folder, {home}$"
    ):
        create(other, spec, CreateOptions(timeout=5))
    shutil.rmtree(w.home / "clusters" / "lab")  # the maker's state lost: what is left is anyone's to remove
    assert delete(other, "lab")["containers"] == before


def test_controller_down_is_shown_honestly(tmp_path):
    w = world(tmp_path)
    make(w)
    w.slurm.up = False
    doc = describe(w.env, "lab")
    assert doc["ControllerReachable"] is False
    ns = {n["SlurmNodeName"]: n for n in nodes(w.env, "lab")["ClusterNodeSummaries"]}
    assert "controller unreachable" in ns["cpu-1"]["InstanceStatus"]["Message"]


class _BusyNetworks(FakeProvider):
    """Docker 20.10 right after a network's containers were removed: "has active
    endpoints" a few times more (the bench floor's race at N = 64)."""

    def __init__(self, busy: int, away: bool = False):
        super().__init__()
        self.busy, self.away, self.tries = busy, away, 0

    def remove_network(self, name_or_id: str) -> None:
        self.tries += 1
        if self.tries <= self.busy:
            raise EngineError(f"error while removing network: network {name_or_id} has active endpoints", 403)
        super().remove_network(name_or_id)

    def unreachable(self, refresh: bool = False) -> dict[str, str]:
        return {"host3": "does not answer"} if self.away else {}


def test_a_network_that_still_counts_endpoints_is_removed_once_docker_lets_go() -> None:
    p = _BusyNetworks(busy=3)
    net = p.create_network("n1", {"io.hp.cluster": "c"})
    assert remove_network(p, net) is True and p.tries == 4 and not p.networks("c")


def test_a_network_in_use_on_a_host_that_is_away_is_left() -> None:
    p = _BusyNetworks(busy=99, away=True)
    net = p.create_network("n1", {"io.hp.cluster": "c"})
    assert remove_network(p, net) is False and p.tries == 1 and p.networks("c")


def test_a_network_docker_keeps_counting_endpoints_on_is_left_and_the_delete_goes_on(tmp_path, monkeypatch) -> None:
    """Docker 20.10 can keep counting a network's endpoints after its containers went
    (moby/moby#42119; seen here after 64 workers were removed at once), until dockerd
    restarts: delete removes the rest (volumes, state) and says what is left and why."""
    w = world(tmp_path)
    make(w, "lab")

    def kept(name_or_id: str) -> None:
        raise EngineError(f"error while removing network: network {name_or_id} has active endpoints", 403)

    monkeypatch.setattr(w.provider, "remove_network", kept)
    monkeypatch.setattr(teardown, "NETWORK_BUSY_S", 0.2)
    removed = delete(w.env, "lab")
    assert removed["left"] == 1 and removed["left_networks"] == ["hp-lab"], removed
    assert "moby/moby#42119" in removed["warning"] and "hp-lab" in removed["warning"]
    assert not w.provider.containers("lab") and not w.provider.volumes("lab") and w.env.store.cluster("lab") is None
    with pytest.raises(BadInput, match="already holds resources labelled for cluster 'lab'"):
        make(w, "lab")
