"""Unit tests for the recovery decision table and guards (orchestrator.recovery), pure logic."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator.recovery.rules import (
    RULES,
    Seen,
    container_condition,
    decide,
    guard,
    slurm_condition,
)
from orchestrator.recovery.watcher import RecoveryWatcher
from orchestrator.runtime import Runtime
from orchestrator.slurm.model import SlurmNode
from orchestrator.state.phases import NodePhase, Phase
from orchestrator.verdict import Action


def rec(phase: str, message: str, time: float) -> NodePhase:
    return NodePhase(Phase(phase), message, time)


def sn(*state: str, reason: str = "") -> SlurmNode:
    return SlurmNode(name="cpu-1", state=tuple(state), reason=reason)


@pytest.mark.parametrize(
    "state,expected",
    [
        ("running", "running"),
        ("exited", "died"),
        ("dead", "died"),
        ("created", "starting"),
        ("restarting", "starting"),
        ("paused", "paused"),
        ("removing", "starting"),
        (None, "missing"),
    ],
)
def test_container_condition(state, expected):
    assert container_condition(state) == expected


@pytest.mark.parametrize(
    "node,expected",
    [
        (None, "absent"),
        (sn("IDLE", "DYNAMIC_NORM"), "ok"),
        (sn("ALLOCATED", "DYNAMIC_NORM"), "ok"),
        (sn("IDLE", "FAIL", "DYNAMIC_NORM", reason="Action:Reboot"), "action_reboot"),
        (sn("IDLE", "FAIL", "DYNAMIC_NORM", reason="Action:Replace"), "action_replace"),
        (sn("DOWN", "DYNAMIC_NORM", reason="Action:Replace"), "action_replace"),
        (sn("IDLE", "DRAIN", reason="Action:Reboot please"), "action_reboot"),
        # Slurm keeps the reason after a resume: an idle node is not asking for anything.
        (sn("IDLE", "DYNAMIC_NORM", reason="Action:Replace"), "ok"),
        (sn("IDLE", "DRAIN", reason="maintenance"), "admin_hold"),
        (sn("DOWN", "NOT_RESPONDING", reason="disk swap"), "admin_hold"),
        (sn("IDLE", "FAIL", reason="bad DIMM"), "admin_hold"),
        (sn("DOWN", "NOT_RESPONDING", "DYNAMIC_NORM", reason="Not responding"), "not_responding"),
        (sn("IDLE", "NOT_RESPONDING", "DYNAMIC_NORM"), "unanswered"),  # one missed ping
        (sn("ALLOCATED", "NOT_RESPONDING", "DYNAMIC_NORM"), "unanswered"),  # after slurmctld restarts
        (sn("DOWN", "DYNAMIC_NORM"), "not_responding"),
    ],
)
def test_slurm_condition(node, expected):
    assert slurm_condition(node) == expected


@pytest.mark.parametrize(
    "role,container,slurm,automatic,expected",
    [
        ("worker", "died", "ok", True, Action.RECOVER),
        ("worker", "died", "ok", False, Action.NONE),  # NodeRecovery None: a dead node stays dead
        ("login", "died", "absent", True, Action.RECOVER),
        ("controller", "died", "absent", True, Action.REBOOT),  # never replaced
        ("controller", "died", "absent", False, Action.NONE),
        ("controller", "paused", "ok", True, Action.REBOOT),
        ("worker", "paused", "not_responding", True, Action.RECOVER),
        ("worker", "paused", "ok", False, Action.NONE),
        ("worker", "running", "not_responding", True, Action.RECOVER),
        ("worker", "running", "not_responding", False, Action.NONE),
        ("worker", "running", "unanswered", True, Action.NONE),  # one missed ping: Slurm decides
        ("worker", "paused", "unanswered", True, Action.RECOVER),  # the container's fact first
        ("worker", "running", "action_reboot", False, Action.REBOOT),  # explicit requests, whatever NodeRecovery
        ("worker", "running", "action_replace", False, Action.REPLACE),
        ("worker", "died", "action_replace", True, Action.REPLACE),
        ("worker", "died", "admin_hold", True, Action.NONE),  # drained by someone else
        ("worker", "running", "admin_hold", True, Action.NONE),
        ("worker", "missing", "not_responding", True, Action.NONE),  # removed on purpose (scale-down)
        ("worker", "starting", "not_responding", True, Action.NONE),
        ("worker", "running", "ok", True, Action.NONE),
        ("worker", "running", "absent", True, Action.NONE),  # not registered yet
        ("worker", "running", "lost", True, Action.RECOVER),  # forgotten by a controller restart
        ("worker", "running", "lost", False, Action.NONE),
        ("login", "running", "lost", True, Action.NONE),
    ],
)
def test_decide(role, container, slurm, automatic, expected):
    assert decide(role, container, slurm, automatic) == expected


def test_table_ends_with_a_catch_all():
    assert RULES[-1] == (("*", "*", "*"), (Action.NONE, False))


def seen(at: float = 100.0) -> Seen:
    return Seen("cpu-1", "worker", "died", "ok", at, "container died (exit 137)")


@pytest.mark.parametrize(
    "recorded,last_done,now,blocked",
    [  # never twice at once, and backing off: the runtime's (the node's key; test_runtime.py)
        (None, 0.0, 101.0, False),
        (None, 100.5, 101.0, True),  # stale: taken before the last action ended
        (rec("DeepHealthCheckInProgress", "", 50.0), 0.0, 101.0, True),
        (rec("ShuttingDown", "", 50.0), 0.0, 101.0, True),
        (rec("Rebooting", "rebooting: x", 90.0), 0.0, 101.0, True),  # another process acts
        (rec("Replacing", "replacing: x", 90.0), 0.0, 101.0, True),
        (rec("Rebooting", "rebooting: x", 90.0), 0.0, 1000.0, False),  # a leftover
        (rec("Launching", "", 50.0), 0.0, 101.0, True),  # the reconciler's
        (rec("LaunchFailed", "", 50.0), 0.0, 101.0, True),
        (rec("Running", "", 100.5), 0.0, 101.0, True),  # status changed after the observation
        (rec("Running", "", 50.0), 0.0, 101.0, False),
        (rec("Rebooting", "reboot did not bring it back", 50.0), 0.0, 1000.0, False),
        # this watcher's own reboot failed (left Rebooting at 90, ended at 95): not an owner any more
        (rec("Rebooting", "rebooting: x", 90.0), 95.0, 101.0, False),
        (rec("Replacing", "replacing: x", 90.0), 95.0, 101.0, False),
        (rec("Rebooting", "rebooting: x", 96.0), 95.0, 101.0, True),  # a newer one: someone else's
    ],
)
def test_guard(recorded, last_done, now, blocked):
    assert (guard(seen(), recorded, last_done, now) is not None) == blocked


@pytest.mark.parametrize(
    "node,expected",
    [
        (sn("IDLE", "FAIL", "DYNAMIC_NORM", reason="Action:Reboot"), True),
        (sn("DOWN", "DYNAMIC_NORM", reason="Not responding"), True),
        (sn("DOWN", "NOT_RESPONDING", reason="Not responding"), False),  # slurmd not back yet
        (sn("IDLE", "DRAIN", reason="maintenance"), False),  # someone else's
        (sn("IDLE", "DYNAMIC_NORM"), False),
    ],
)
def test_needs_resume(node, expected):
    assert node.needs_resume == expected


class _Env:
    """Just enough of Env for RecoveryWatcher.consider (no Docker, no Slurm)."""

    provider = store = None
    catalogue = {}


def test_watcher_never_acts_twice_on_a_node_at_once():
    gate, calls = threading.Event(), []

    def act(cluster, action, node, why, wait):
        calls.append((action, node))
        gate.wait(5)
        return True

    w = RecoveryWatcher(_Env(), "x", act=act)
    w.keys = ()  # the poll is the test's
    rt = Runtime(None, "x")
    rt.add(w)
    rt.start()
    for _ in range(3):
        w.consider(seen(), True, None)
    w.consider(Seen("cpu-2", "worker", "died", "ok", 100.0, "died"), True, None)  # another node: concurrently
    t0 = time.monotonic()
    while len(calls) < 2 and time.monotonic() - t0 < 3:
        time.sleep(0.01)
    time.sleep(0.2)  # both still blocked on the gate: they have started, and only once each
    assert sorted(calls) == [(Action.RECOVER, "cpu-1"), (Action.RECOVER, "cpu-2")]
    gate.set()
    assert rt.idle("recovery", 5)
    w.consider(seen(at=50.0), True, None)  # observed before the action ended: stale
    assert rt.idle("recovery", 5)
    assert len(calls) == 2
    rt.shutdown()


def test_absent_becomes_lost_only_after_a_while():
    w = RecoveryWatcher(_Env(), "x")
    assert w._lost("cpu-1", "absent", 100.0, True) == "absent"
    assert w._lost("cpu-1", "absent", 110.0, True) == "absent"
    assert w._lost("cpu-1", "absent", 116.0, True) == "lost"
    assert w._lost("cpu-1", "ok", 117.0, True) == "ok"  # registered: the clock restarts
    assert w._lost("cpu-1", "absent", 118.0, True) == "absent"
    assert w._lost("cpu-1", "absent", 200.0, False) == "absent"  # Slurm did not answer: no verdict


def test_the_one_escalation_policy():
    """RECOVER reboots, then replaces once a reboot did not help; the controller is kept."""
    from orchestrator.recovery.rules import escalation

    assert escalation(Action.RECOVER, rebooted=False) is Action.REBOOT
    assert escalation(Action.RECOVER, rebooted=True) is Action.REPLACE
    assert escalation(Action.RECOVER, rebooted=True, replaceable=False) is Action.NONE
    assert escalation(Action.REPLACE, rebooted=False) is Action.REPLACE
    assert escalation(Action.REBOOT, rebooted=True) is Action.REBOOT  # an explicit reboot is only that
    assert escalation(Action.MONITOR, rebooted=False) is escalation(Action.NONE, rebooted=True) is Action.NONE


def test_rebooted_for_reads_the_history_since_the_container_was_made():
    from orchestrator.recovery.rules import rebooted_for

    mark = "hp:gpu:recover:xid-79"
    rebooted = [rec("Queued", "", 1.0), rec("Launching", "", 2.0), rec("Running", "", 3.0)]
    rebooted += [rec("Rebooting", f"rebooting: GPU finding: {mark} XID 79", 4.0), rec("Running", "", 5.0)]
    assert rebooted_for(rebooted, mark)
    assert not rebooted_for(rebooted, "hp:gpu:recover:remap-pending")  # rebooted for another finding
    replaced = rebooted + [rec("Replacing", f"replacing: GPU finding: {mark}", 6.0), rec("Running", "", 7.0)]
    assert not rebooted_for(replaced, mark)  # a new container: its reboots are to come
    assert not rebooted_for([], mark)


def test_the_poll_reads_slurms_full_records_only_when_the_digest_changed_or_they_are_old(monkeypatch):
    from types import SimpleNamespace

    from fakes import FakeSlurm

    from orchestrator.recovery import watcher as watcher_mod

    slurm = FakeSlurm()
    slurm.nodes_["cpu-1"] = sn("IDLE", "DYNAMIC_NORM")
    full = []
    real = slurm.nodes
    monkeypatch.setattr(slurm, "nodes", lambda: full.append(1) or real())
    w = RecoveryWatcher(_Env(), "x")
    w.cluster = SimpleNamespace(slurm=slurm)
    for _ in range(3):
        assert w._slurm_nodes()["cpu-1"].base == "IDLE"
    assert len(full) == 1  # nothing changed: one full read
    slurm.nodes_["cpu-1"] = sn("IDLE", "DRAIN", reason="Action:Reboot")
    assert w._slurm_nodes()["cpu-1"].reason == "Action:Reboot" and len(full) == 2
    monkeypatch.setattr(watcher_mod, "FULL_EVERY_S", 0.0)  # old: read again, digest or not
    w._slurm_nodes()
    assert len(full) == 3
