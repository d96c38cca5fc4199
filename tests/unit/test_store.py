"""The store: the one gate for node phases, spec changes with phases in one transaction,
events per incarnation of a cluster name, paging from the newest, retention."""

from __future__ import annotations

import sqlite3

import pytest

from orchestrator.errors import InvalidTransition
from orchestrator.state import store as store_mod
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
    assert [p for p, _, _ in st.node_history("lab", "cpu-1")] == ["Queued", "Launching"]


def test_update_spec_and_phases_are_one_transaction(st):
    st.set_phase("lab", "cpu-1", Phase.QUEUED)

    def change(spec):
        spec["X"] = 1
        return spec

    with pytest.raises(InvalidTransition):  # a refused edge rolls the spec change back too
        st.update_spec("lab", change, [("cpu-1", Phase.REMOVED, "x"), ("cpu-1", Phase.RUNNING, "y")])
    assert "X" not in st.cluster("lab").spec
    st.update_spec("lab", change, [("cpu-1", Phase.SHUTTING_DOWN, "delete-nodes")])
    assert st.cluster("lab").spec["X"] == 1 and st.latest_phases("lab")["cpu-1"][0] == "ShuttingDown"
    with pytest.raises(KeyError):
        st.update_spec("nope", change)
    row, latest = st.snapshot("lab")
    assert row.name == "lab" and latest["cpu-1"][1] == "delete-nodes"


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
    )
    db.commit()
    db.close()
    st = Store(home)
    assert st.cluster("old").incarnation == ""
    st.event("old", "Cluster", "Info", "after the upgrade")
    assert [e.description for e in st.events("old")] == ["after the upgrade"]
    fresh = Store(tmp_path / "new")
    assert oct(fresh.path.stat().st_mode & 0o777) == "0o600"
    assert st.add_cluster("old", {}, ClusterStatus.CREATING) is False
    assert st.cluster("old").status is ClusterStatus.IN_SERVICE  # a status written by an older hp reads as one


def test_operations_and_kv(st):
    op = st.add_operation("lab", "cpu", "Scale", 3, 1)
    assert st.operations("lab")[0]["id"] == op
    st.end_operation(op, "Succeeded")
    assert st.operations("lab") == [] and st.operations("lab", active_only=False)[0]["status"] == "Succeeded"
    st.put("k", "v")
    assert st.get("k") == "v"
    st.put("k", None)
    assert st.get("k", "d") == "d"
