"""Orchestration against the fakes (tests/fakes.py): create's stages and rollback, the
reconciler (scale up and down, which nodes go first, backoff, crash leftovers), the
agent's status sync and all-or-nothing rollback, scaling bounds, delete, queries.
Milliseconds each; the same behaviours run against real Docker and Slurm in tests/e2e."""

from __future__ import annotations

import time

import pytest
from fakes import FakeProvider, spec_doc, world

from orchestrator.agent.daemon import Agent
from orchestrator.cluster import capacity
from orchestrator.cluster.context import Cluster
from orchestrator.cluster.create import CreateOptions, create
from orchestrator.cluster.delete import delete, remove_network
from orchestrator.cluster.launcher import Launcher
from orchestrator.cluster.query import describe, list_clusters, nodes
from orchestrator.cluster.reconciler import BACKOFF, GroupReconciler
from orchestrator.cluster.scaling import delete_nodes, scale
from orchestrator.errors import BadInput, EngineError, NotFound, OperationFailed
from orchestrator.spec.model import validate


def make(w, name="lab", groups=None, wait=True, **top):
    spec = validate(spec_doc(name, groups, **top), w.env.catalogue)
    return create(w.env, spec, CreateOptions(wait=wait, timeout=5, register_timeout=2))


def phases(w, name):
    return {n: p for n, (p, _, _) in w.env.store.latest_phases(name).items()}


def reconcile(w, name, group, passes=6, clock=None):
    c = Cluster(w.env, name)
    rec = GroupReconciler(c, group, Launcher(c, w.env.images.refs()), clock=clock or (lambda: 1e11))
    for _ in range(passes):
        rec.step({n.name: n for n in w.slurm.nodes()})
    return rec


# -- create -----------------------------------------------------------------------------
def test_create_makes_every_node_in_order_and_records_phases(tmp_path):
    w = world(tmp_path)
    make(w)
    names = [n for op, n in w.provider.calls if op == "create"]
    # accounting (on by default): the database and slurmdbd first, then the controller
    assert names[:3] == ["hp-lab-mariadb", "hp-lab-slurmdbd", "hp-lab-controller-1"]
    assert sorted(names[3:]) == ["hp-lab-cpu-1", "hp-lab-cpu-2", "hp-lab-login-1"]
    assert set(phases(w, "lab").values()) == {"Running"}
    assert w.env.store.cluster("lab").status == "InService"
    assert w.agents.ensured == ["lab"]
    ctl = w.provider.node("lab", "controller-1")
    assert "/etc/slurm/slurm.conf" in ctl.files and "/etc/slurm/slurm.key" in ctl.files
    assert b"MaxNodeCount=128" in ctl.files["/etc/slurm/slurm.conf"]
    assert w.env.store.cluster("lab").spec["MaxNodeCount"] == 128  # fixed from now on
    doc = describe(w.env, "lab")
    assert [g["Status"] for g in doc["InstanceGroups"]] == ["InService"] * 3


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
    agent = Agent(w.env, "lab")
    c = Cluster(w.env, "lab")
    for g in ("login", "cpu"):
        reconcile(w, "lab", g, passes=2)
    agent._sync_status(c)
    assert w.env.store.cluster("lab").status == "InService"


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
    rec = GroupReconciler(c, "cpu", Launcher(c, w.env.images.refs()))
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
    launcher = Launcher(c, w.env.images.refs())
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
    rec = GroupReconciler(c, "cpu", Launcher(c, w.env.images.refs()))
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
    Agent(w.env, "lab")._sync_status(c)
    assert w.env.store.cluster("lab").spec["InstanceGroups"][2]["InstanceCount"] == 1
    op = w.env.store.operations("lab", active_only=False)[-1]
    assert op["status"] == "Failed" and "rolling back to 1" in op["message"]
    reconcile(w, "lab", "cpu", passes=4)
    assert sorted(c.node for c in w.provider.containers("lab") if c.group == "cpu") == ["cpu-1"]


def test_agent_bug_in_a_group_is_reported_once_and_that_group_left_alone(tmp_path, monkeypatch):
    w = world(tmp_path)
    make(w)
    agent = Agent(w.env, "lab")
    c = Cluster(w.env, "lab")
    rec = GroupReconciler(c, "cpu", Launcher(c, w.env.images.refs()))
    monkeypatch.setattr(rec, "step", lambda snodes: 1 / 0)
    agent._step(rec, {})
    agent._step(rec, {})
    bugs = [e.description for e in w.env.store.events("lab") if "internal error" in e.description]
    assert len(bugs) == 1 and "ZeroDivisionError" in bugs[0] and "provisioning of group cpu" in bugs[0]
    assert "cpu" in agent._bugs
    monkeypatch.setattr(rec, "step", lambda snodes: (_ for _ in ()).throw(OperationFailed("engine hiccup")))
    assert agent._step(rec, {}) == 2.0  # the outside world: tried again soon


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
    assert removed == {"containers": 6, "networks": 1, "volumes": 3}  # with accounting's two and its volume
    assert w.env.store.cluster("lab") is None and w.agents.stopped == ["lab"]
    assert ("drain", ("cpu-1", "cpu-2")) in w.slurm.calls or ("drain", ("cpu-2", "cpu-1")) in w.slurm.calls
    with pytest.raises(NotFound):
        delete(w.env, "lab")
    assert any("deleted" in e.description for e in w.env.store.events("lab"))


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
