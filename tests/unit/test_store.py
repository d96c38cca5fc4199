"""The store: the one gate for node phases, spec changes with phases in one transaction,
events per incarnation of a cluster name, paging from the newest, retention."""

from __future__ import annotations

import sqlite3

import pytest

from orchestrator.errors import InvalidTransition
from orchestrator.state import store as store_mod
from orchestrator.state.operations import OperationKind, OperationStatus
from orchestrator.state.phases import Phase
from orchestrator.state.store import Store
from orchestrator.state.transitions import ClusterStatus

STARTED = "Cluster lab creation started (a test)"  # the event of the fixture's first status


@pytest.fixture
def st(tmp_path):
    s = Store(tmp_path / "home")
    s.add_cluster("lab", {"ClusterName": "lab", "InstanceGroups": []}, ClusterStatus.CREATING, "a test")
    return s


def test_every_phase_write_goes_through_the_gate(st):
    assert st.set_phase("lab", "cpu-1", Phase.QUEUED, "waiting")
    assert not st.set_phase("lab", "cpu-1", "Queued", "waiting")  # nothing changed: nothing written
    assert st.set_phase("lab", "cpu-1", Phase.LAUNCHING)
    with pytest.raises(InvalidTransition, match="Launching -> Removed"):
        st.set_phase("lab", "cpu-1", Phase.REMOVED)
    with pytest.raises(InvalidTransition, match="unknown node phase"):
        st.set_phase("lab", "cpu-1", "Pending")
    with pytest.raises(InvalidTransition, match=r"\(no history\) -> Running"):
        st.set_phase("lab", "cpu-9", Phase.RUNNING)
    assert [r.phase for r in st.node_history("lab", "cpu-1")] == [Phase.QUEUED, Phase.LAUNCHING]


def test_update_spec_and_phases_are_one_transaction(st):
    st.set_phase("lab", "cpu-1", Phase.QUEUED)

    def change(spec):
        spec["X"] = 1
        return spec

    with pytest.raises(InvalidTransition):  # a refused edge rolls the spec change back too
        st.update_spec("lab", change, [("cpu-1", Phase.REMOVED, "x"), ("cpu-1", Phase.RUNNING, "y")])
    assert "X" not in st.cluster("lab").spec
    st.update_spec("lab", change, [("cpu-1", Phase.SHUTTING_DOWN, "delete-nodes")])
    assert st.cluster("lab").spec["X"] == 1 and st.latest_phases("lab").phase("cpu-1") is Phase.SHUTTING_DOWN
    with pytest.raises(KeyError):
        st.update_spec("nope", change)
    row, latest = st.snapshot("lab")
    assert row.name == "lab" and latest["cpu-1"].message == "delete-nodes"


def test_events_belong_to_one_incarnation_of_a_name(st):
    st.event("lab", "Cluster", "Info", "first life")
    st.event("lab", "Cluster", "Info", "deleted")
    st.remove_cluster("lab")
    assert [e.description for e in st.events("lab")] == [STARTED, "first life", "deleted"]  # readable after delete
    assert st.has_events("lab")
    st.add_cluster("lab", {"ClusterName": "lab", "InstanceGroups": []}, ClusterStatus.CREATING, "a test")
    st.event("lab", "Cluster", "Info", "second life")
    assert [e.description for e in st.events("lab")] == [STARTED, "second life"]
    assert not st.has_events("never") and st.events("never") == []


def test_events_page_from_the_newest(st):
    for i in range(50):
        st.event("lab", "Cluster", "Info", f"e{i}")
    page = st.events("lab", limit=10)
    assert [e.description for e in page] == [f"e{i}" for i in range(40, 50)]  # newest, oldest first
    after = st.events("lab", after_id=page[-3].id, limit=100)
    assert [e.description for e in after] == ["e48", "e49"]
    assert len(st.events("lab", limit=10**9)) == 51  # clamped to PAGE_MAX, no error (and the fixture's)
    follow = st.follow_events("lab", after_id=page[-1].id, poll=0.01, until=lambda: True)
    assert list(follow) == []


def test_prune_keeps_the_database_bounded(st, monkeypatch):
    monkeypatch.setattr(store_mod, "EVENTS_PER_CLUSTER", 5)
    monkeypatch.setattr(store_mod, "PHASES_PER_NODE", 4)
    for i in range(12):
        st.event("lab", "Cluster", "Info", f"e{i}")
    st.set_phase("lab", "cpu-1", Phase.QUEUED)
    for _ in range(5):
        st.set_phase("lab", "cpu-1", Phase.LAUNCH_FAILED, "a")
        st.set_phase("lab", "cpu-1", Phase.LAUNCH_FAILED, "b")
    removed = st.prune()
    assert removed["events"] == 8 and [e.description for e in st.events("lab")][0] == "e7"
    assert len(st.node_history("lab", "cpu-1")) == 4 and removed["node_status"] == 7
    # a deleted cluster's events go once they are older than the retention
    st.remove_cluster("lab")
    st.clock = lambda: 10**12
    st.prune()
    assert st.events("lab") == []


def test_store_migrates_an_old_database_and_is_private(tmp_path):
    home = tmp_path / "old"
    home.mkdir()
    db = sqlite3.connect(home / "hp.db")
    db.executescript(
        "CREATE TABLE clusters (name TEXT PRIMARY KEY, spec TEXT NOT NULL, status TEXT NOT NULL, message TEXT NOT NULL "
        "DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);"
        "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, cluster TEXT NOT NULL, time REAL NOT NULL, "
        "resource_type TEXT NOT NULL, level TEXT NOT NULL, group_name TEXT, node_id TEXT, node TEXT, description TEXT NOT NULL);"
        "INSERT INTO clusters VALUES ('old', '{}', 'InService', '', 1, 1);"
        "CREATE TABLE operations (id INTEGER PRIMARY KEY AUTOINCREMENT, cluster TEXT NOT NULL, group_name TEXT NOT "
        "NULL, kind TEXT NOT NULL, target INTEGER, previous INTEGER, nodes TEXT NOT NULL DEFAULT '', status TEXT NOT "
        "NULL, message TEXT NOT NULL DEFAULT '', started REAL NOT NULL, ended REAL);"
        "INSERT INTO operations VALUES (1, 'old', 'cpu', 'Scale', 2, 1, '', 'Succeeded', '', 1, 2);"
        "INSERT INTO operations VALUES (2, 'old', 'cpu', 'DeleteNodes', NULL, NULL, 'cpu-1,cpu-2', 'InProgress', '', 3, NULL);"
    )
    db.commit()
    db.close()
    st = Store(home)
    assert st.cluster("old").incarnation == ""
    st.event("old", "Cluster", "Info", "after the upgrade", "cpu", node="cpu-2")
    assert [(e.description, e.operation) for e in st.events("old")] == [("after the upgrade", 2)]
    done, deleting = st.operations("old", active_only=False)
    assert (done.kind, done.status, done.request) == (OperationKind.SCALE, OperationStatus.DONE, "")
    assert deleting.nodes == ("cpu-1", "cpu-2") and deleting.active and deleting.target is None
    fresh = Store(tmp_path / "new")
    assert oct(fresh.path.stat().st_mode & 0o777) == "0o600"
    assert st.add_cluster("old", {}, ClusterStatus.CREATING) is False
    assert st.cluster("old").status is ClusterStatus.IN_SERVICE  # a status written by an older hp reads as one


def test_operations_are_typed_and_end_once_and_kv(st):
    op = st.add_operation("lab", "cpu", OperationKind.SCALE, 3, 1)
    (rec,) = st.operations("lab")
    assert (rec.id, rec.kind, rec.status, rec.target, rec.previous) == (op, "Scale", OperationStatus.IN_PROGRESS, 3, 1)
    assert st.end_operation(op, OperationStatus.DONE)
    assert not st.end_operation(op, OperationStatus.FAILED, "too late")  # ended once
    assert st.operations("lab") == [] and st.operation("lab", op).status is OperationStatus.DONE
    with pytest.raises(ValueError, match="Done or Failed"):
        st.end_operation(st.add_operation("lab", "cpu", OperationKind.SCALE, 2, 3), OperationStatus.SUPERSEDED)
    # a caller written before the enum: its words still work, and read back as the enum's
    legacy = st.add_operation("lab", "", "Upgrade", 1, None)
    assert st.end_operation(legacy, "Succeeded") and st.operation("lab", legacy).status is OperationStatus.DONE
    st.put("k", "v")
    assert st.get("k") == "v"
    st.put("k", None)
    assert st.get("k", "d") == "d"


def test_an_operation_whose_process_died_is_ended_failed_once_with_an_event(st):
    """hp reboot / replace do their operation in their own process: killed mid-way (a
    real process, SIGKILLed), the operation is not left InProgress for good."""
    import signal
    import subprocess
    import sys

    from orchestrator.core.procs import alive

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    mine = st.add_operation("lab", "cpu", OperationKind.REBOOT, nodes=["cpu-1"], pid=p.pid)
    agents = st.add_operation("lab", "cpu", OperationKind.SCALE, 3, 1)  # no pid: the agent's, untouched
    assert st.end_orphaned_operations("lab", alive) == [] and st.operation("lab", mine).pid == p.pid
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert st.end_orphaned_operations("lab", alive) == [mine]
    op = st.operation("lab", mine)
    assert op.status is OperationStatus.FAILED and f"pid {p.pid}" in op.message
    assert [e.description for e in st.operation_events("lab", mine)] == [
        f"Operation {mine} (Reboot) failed: {op.message}"
    ]
    assert st.end_orphaned_operations("lab", alive) == [] and st.operation("lab", agents).active


def test_a_newer_count_request_of_a_group_supersedes_the_older_and_events_go_to_their_operation(st):
    scale = st.add_operation("lab", "cpu", OperationKind.SCALE, 4, 2)
    other = st.add_operation("lab", "gpu", OperationKind.SCALE, 1, 0)
    check = st.add_operation("lab", "cpu", OperationKind.HEALTH_CHECK, nodes=["cpu-1"], request="hc-1")
    st.event("lab", "Instance", "Info", "cpu-3 launching", "cpu", node="cpu-3")
    st.event("lab", "Instance", "Info", "cpu-1 checked", "cpu", node="cpu-1")
    st.event("lab", "Cluster", "Info", "nothing under way")
    add = st.add_operation("lab", "cpu", OperationKind.ADD_NODES, 6, 4)
    ops = {o.id: o for o in st.operations("lab", active_only=False)}
    assert ops[scale].status is OperationStatus.SUPERSEDED and ops[scale].message == f"superseded by operation {add}"
    assert ops[scale].ended is not None
    # another group's, and a health check of the same group, are not count requests of it
    assert ops[other].active and ops[check].active and ops[add].active
    assert st.request_operation("hc-1") == check
    by_text = {e.description: e.operation for e in st.events("lab")}
    assert by_text["cpu-3 launching"] == scale and by_text["cpu-1 checked"] == check
    assert by_text["nothing under way"] is None
    assert by_text[f"Operation {scale} (Scale of instance group cpu) superseded by operation {add}"] == scale
    assert [e.description for e in st.operation_events("lab", scale)][0] == "cpu-3 launching"
    # the superseded one is not ended again by the code that would have ended it
    assert not st.end_operation(scale, OperationStatus.DONE)
    st.event("lab", "Instance", "Info", "cpu-5 launching", "cpu", node="cpu-5")
    assert st.events("lab")[-1].operation == add
    # an upgrade (the cluster's own) takes what nothing else claims
    up = st.add_operation("lab", "", OperationKind.UPGRADE, 1)
    st.event("lab", "Cluster", "Info", "controller upgraded")
    st.event("lab", "Instance", "Info", "gpu-1 launching", "gpu", node="gpu-1")
    assert [e.operation for e in st.events("lab")[-2:]] == [up, other]
    assert st.add_operation("lab", "", OperationKind.UPGRADE, 1) and st.operation("lab", up).active


def _journal_mode_refused(monkeypatch, error: str, times: int) -> list[str]:
    """Store's connections answer `PRAGMA journal_mode...` with `error` the first `times` times
    (a real SQLite connection otherwise); returns the statements refused."""
    real, refused = sqlite3.connect, []

    class Refusing:
        def __init__(self, db):
            self.db = db

        def execute(self, sql, *a):
            if sql.startswith("PRAGMA journal_mode") and len(refused) < times:
                refused.append(sql)
                raise sqlite3.OperationalError(error)
            return self.db.execute(sql, *a)

        def __getattr__(self, name):
            return getattr(self.db, name)

    monkeypatch.setattr(store_mod.sqlite3, "connect", lambda *a, **k: Refusing(real(*a, **k)))
    return refused


def test_opening_waits_out_a_lock_sqlite_reports_at_once(tmp_path, monkeypatch):
    """`PRAGMA journal_mode=WAL` can answer "database is locked" without the busy handler
    (a CLI call beside a busy agent, seen in the fault suite): the open tries again."""
    Store(tmp_path).close()
    refused = _journal_mode_refused(monkeypatch, "database is locked", 3)
    st = Store(tmp_path)
    assert len(refused) == 3 and st.clusters() == []
    st.close()


def test_opening_raises_other_database_errors_at_once(tmp_path, monkeypatch):
    refused = _journal_mode_refused(monkeypatch, "disk I/O error", 10)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        Store(tmp_path)
    assert len(refused) == 1  # not tried again
