"""Pure logic: Slurm JSON parsers (real 24.11 output), honest status, the node state machine."""

from pathlib import Path

import pytest

from orchestrator.docker.views import Container
from orchestrator.errors import InvalidTransition, OperationFailed
from orchestrator.slurm.model import SlurmNode, parse_jobs, parse_nodes
from orchestrator.spec.catalogue import load_catalogue
from orchestrator.spec.model import DEFAULT_SPEC, validate
from orchestrator.state.phases import TRANSITIONS, Backoff, History, NodePhase, Phase, Phases, allowed, check, visible
from orchestrator.state.status import group_views, instance_status, node_views

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def rec(phase: str, message: str, time: float) -> NodePhase:
    return NodePhase(Phase(phase), message, time)


def test_parse_real_scontrol_nodes():
    nodes = {n.name: n for n in parse_nodes((FIX / "scontrol-24.11-show-nodes.json").read_text())}
    a2, a3 = nodes["a-2"], nodes["a-3"]
    assert a2.drained and a2.reason == "maintenance by admin" and not a2.usable and a2.display == "idle+drain"
    assert a3.base == "ALLOCATED" and not a3.usable and a3.display == "allocated"
    assert "a" in a3.features and "a" in a3.partitions and "dev" in a3.partitions


def test_parse_real_squeue():
    jobs = parse_jobs((FIX / "squeue-24.11.json").read_text())
    assert [(j.job_id, j.state, j.nodes) for j in jobs] == [(2, "RUNNING", "a-3")]


def test_parse_errors():
    with pytest.raises(OperationFailed):
        parse_nodes("slurm_load_node error: Unable to contact slurm controller")
    with pytest.raises(OperationFailed):
        parse_nodes('{"nodes": [], "errors": [{"description": "boom"}]}')


def ci(state="running", code=0, role="worker", node="cpu-a-1", group="cpu-a"):
    return Container(
        id="abcdef0123456789abcdef",
        name=f"hp-x-{node}",
        state=state,
        exit_code=code,
        created="2026-01-01T00:00:00Z",
        image="img",
        ip="10.0.0.2",
        labels={"io.hp.role": role, "io.hp.node": node, "io.hp.group": group, "io.hp.instance-type": "cpu.small"},
    )


IDLE = SlurmNode("cpu-a-1", ("IDLE", "DYNAMIC_NORM"))
DOWN = SlurmNode("cpu-a-1", ("DOWN", "NOT_RESPONDING"), reason="Not responding")
DRAINED = SlurmNode("cpu-a-1", ("IDLE", "DRAIN"), reason="hp:health:hc-1:InstanceStress")


@pytest.mark.parametrize(
    "role,container,snode,recorded,up,expect",
    [
        ("worker", ci(), IDLE, None, True, "Running"),
        ("worker", ci(), None, None, True, "Pending"),  # slurmd not registered yet
        ("worker", ci(state="exited", code=137), None, None, True, "Failure"),
        ("worker", ci(), DOWN, None, True, "Failure"),  # Slurm says so
        ("worker", None, None, rec("LaunchFailed", "InsufficientCapacity: ...", 0.0), True, "Pending"),
        ("worker", None, None, None, True, "NotFound"),
        ("worker", ci(), DRAINED, rec("DeepHealthCheckInProgress", "req", 0.0), True, "DeepHealthCheckInProgress"),
        # recorded as checked, but Slurm (read after the record) shows it in service: it is not isolated
        ("worker", ci(), IDLE, rec("DeepHealthCheckInProgress", "req", 0.0), True, "Running"),
        ("worker", ci(), IDLE, rec("ShuttingDown", "scale-down", 0.0), True, "ShuttingDown"),
        ("worker", ci(state="created"), None, None, True, "Pending"),
        ("login", ci(role="login"), None, None, True, "Running"),
    ],
)
def test_instance_status(role, container, snode, recorded, up, expect):
    assert instance_status(role, container, snode, recorded, up)[0] == expect


def test_status_messages_are_honest():
    st, msg = instance_status("worker", ci(state="exited", code=137), None, None, True)
    assert "exited with code 137" in msg
    st, msg = instance_status("worker", ci(), None, None, False)
    assert st == "Running" and "controller unreachable" in msg


def test_group_views_counts_and_status():
    spec = validate(DEFAULT_SPEC, load_catalogue())
    containers = {"cpu-a-1": ci(), "controller-1": ci(role="controller", node="controller-1", group="controller")}
    recorded = Phases({"cpu-a-2": rec("LaunchFailed", "InsufficientCapacity: no", 0.0)})
    views = node_views(lambda: spec, containers, {"cpu-a-1": IDLE}, recorded, True)
    assert [(v.node, v.status) for v in views] == [
        ("controller-1", "Running"),
        ("cpu-a-1", "Running"),
        ("cpu-a-2", "Pending"),
    ]
    g = {x["InstanceGroupName"]: x for x in group_views(spec, views, {"cpu-a": ["Scale to 2"]})}
    assert g["cpu-a"]["CurrentCount"] == 1 and g["cpu-a"]["PendingCount"] == 1 and g["cpu-a"]["TargetCount"] == 2
    assert g["cpu-a"]["ActiveOperations"] == ["Scale to 2"] and g["cpu-a"]["Status"] == "Creating"
    assert g["controller"]["Status"] == "InService"


def test_node_views_read_the_spec_only_for_a_node_without_a_container():
    spec = validate(DEFAULT_SPEC, load_catalogue())

    def unread():
        raise AssertionError("every node has a container: its labels name its group, role and type")

    containers = {"cpu-a-1": ci(), "controller-1": ci(role="controller", node="controller-1", group="controller")}
    views = node_views(unread, containers, {"cpu-a-1": IDLE}, {}, True)
    assert [(v.node, v.group, v.role, v.status) for v in views] == [
        ("controller-1", "controller", "controller", "Running"),
        ("cpu-a-1", "cpu-a", "worker", "Running"),
    ]
    asked = []
    views = node_views(lambda: asked.append(1) or spec, {}, {}, Phases({"cpu-b-2": rec("LaunchFailed", "", 0.0)}), True)
    assert [(v.node, v.group, v.itype, v.status) for v in views] == [("cpu-b-2", "cpu-b", "cpu.small", "Pending")]
    assert asked == [1]


def test_transition_table():
    assert allowed(None, "Queued") and not allowed(None, "Launching")
    assert not allowed(None, "Running")  # a node runs only after it was launched
    assert allowed("Launching", "Running") and allowed("LaunchFailed", "Queued")
    assert not allowed("Removed", "Running") and not allowed("ShuttingDown", "Running")
    assert all(isinstance(why, str) and why for why in TRANSITIONS.values())
    assert visible("LaunchFailed") == "Pending" and visible("Removed") == "NotFound"
    assert all(isinstance(a, Phase) and isinstance(b, Phase) for a, b in TRANSITIONS)


def test_the_gate_refuses_an_unknown_phase_and_an_edge_not_in_the_table():
    assert check("n", "Launching", "Running") is Phase.RUNNING
    with pytest.raises(InvalidTransition, match="unknown node phase 'Pending'"):
        check("n", "Running", "Pending")
    with pytest.raises(InvalidTransition, match="Removed -> Running"):
        check("n", "Removed", "Running")
    with pytest.raises(InvalidTransition):
        check("n", "Bogus", "Running")


def test_history_derives_retries_and_backoff():
    b = Backoff(initial=1, maximum=10)
    assert [b.delay(i) for i in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    h = History(
        [
            rec("Queued", "", 0.0),
            rec("LaunchFailed", "x", 10.0),
            rec("Queued", "", 11.0),
            rec("LaunchFailed", "y", 12.0),
        ]
    )
    assert h.failures_since_running() == 2 and h.try_number() == 3
    assert not h.retry_due(13.9, b) and h.retry_due(14.0, b) and h.next_retry(b) == 14.0
    h2 = History(h.rows + [rec("Launching", "", 15.0), rec("Running", "", 16.0), rec("Rebooting", "", 20.0)])
    assert h2.failures_since_running() == 0 and h2.try_number() == 1 and h2.retry_due(0, b)
