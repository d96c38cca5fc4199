"""The cluster status and health-check request state machines (state/transitions.py):
every edge their tables list is accepted by its one writer (Store.set_status,
Records.set_state) and writes its event once; every other edge, and a name that is not a
member, is refused with nothing written."""

from __future__ import annotations

import itertools

import pytest
from fakes import force_status, spec_doc, world

from orchestrator.cluster.create import CreateOptions, NoProgress, create, rollback
from orchestrator.core.context import Cluster
from orchestrator.errors import InvalidTransition
from orchestrator.spec.model import validate
from orchestrator.state import transitions
from orchestrator.state.health_requests import Records
from orchestrator.state.store import Store
from orchestrator.state.transitions import ACTIVE, CLUSTER, REQUEST, ClusterStatus, RequestState

S, R = ClusterStatus, RequestState


def texts(st: Store, name: str = "lab") -> list[str]:
    return [e.description for e in st.events(name)]


def cluster_in(st: Store, status: ClusterStatus | None) -> None:
    """A cluster recorded in `status` (set past the gate: what is tested is the next edge)."""
    if status is None:
        return
    assert st.add_cluster("lab", {"ClusterName": "lab", "InstanceGroups": []}, S.CREATING, "a test")
    force_status(st, "lab", status.value, "before")


@pytest.mark.parametrize(("frm", "to"), list(CLUSTER), ids=lambda s: str(s))
def test_every_listed_cluster_edge_is_written_with_its_event_once(tmp_path, frm, to):
    st = Store(tmp_path)
    cluster_in(st, frm)
    before = texts(st)
    if frm is None:
        assert st.add_cluster("lab", {"ClusterName": "lab"}, to, "a test")
    else:
        assert st.set_status("lab", to, "why", detail="a detail")
    row = st.cluster("lab")
    assert row.status is to and row.message == ("" if frm is None else "why")
    new = texts(st)[len(before) :]
    edge = CLUSTER[(frm, to)]
    assert new == [edge.event("lab", row.message, "a test" if frm is None else "a detail")]
    assert [e.level for e in st.events("lab")][-1] == edge.level and "{" not in new[0]


UNLISTED_CLUSTER = [(f, t) for f, t in itertools.product([None, *S], S) if (f, t) not in CLUSTER]


@pytest.mark.parametrize(("frm", "to"), UNLISTED_CLUSTER, ids=lambda s: str(s))
def test_every_other_cluster_edge_is_refused_and_nothing_written(tmp_path, frm, to):
    st = Store(tmp_path)
    cluster_in(st, frm)
    before, row = texts(st), st.cluster("lab")
    with pytest.raises(InvalidTransition, match="not an allowed ClusterStatus change"):
        if frm is None:
            st.add_cluster("lab", {"ClusterName": "lab"}, to)
        else:
            st.set_status("lab", to, "why")
    assert texts(st) == before and st.cluster("lab") == row


def test_cluster_status_writer_refuses_unknown_names_and_yields_to_a_change_it_did_not_see(tmp_path):
    st = Store(tmp_path)
    with pytest.raises(InvalidTransition, match="unknown ClusterStatus"):
        st.add_cluster("lab", {}, "Updating")
    assert st.cluster("lab") is None and not st.has_events("lab")
    assert st.set_status("lab", S.DELETING) is False  # not recorded: nothing to change
    st.add_cluster("lab", {}, S.CREATING, "a test")
    with pytest.raises(InvalidTransition, match="unknown ClusterStatus"):
        st.set_status("lab", "Up")
    st.set_status("lab", S.DELETING)
    n = len(texts(st))
    # read as Creating, changed by someone else since: the expecting writer writes nothing
    assert st.set_status("lab", S.IN_SERVICE, expect=frozenset({S.CREATING})) is False
    assert st.cluster("lab").status is S.DELETING and len(texts(st)) == n
    assert st.set_status("lab", S.DELETING) and texts(st)[-1] == "Cluster lab deletion started"  # again: said again


def test_a_created_cluster_says_so_once_even_with_its_agent_at_it(tmp_path):
    w = world(tmp_path)
    create(w.env, validate(spec_doc("lab"), w.env.catalogue), CreateOptions(timeout=5))
    ev = texts(w.env.store)
    assert ev[0] == "Cluster lab creation started (all-or-nothing provisioning)"
    assert ev.count("Cluster lab is InService") == 1 and w.env.store.cluster("lab").status is S.IN_SERVICE


def test_a_rollback_writes_nothing_over_a_delete_that_began_meanwhile(tmp_path):
    w = world(tmp_path)
    create(w.env, validate(spec_doc("lab"), w.env.catalogue), CreateOptions(timeout=5))
    force_status(w.env.store, "lab", "Creating")
    w.env.store.set_status("lab", S.DELETING)  # `hp delete` while `hp create` still runs
    n = len(texts(w.env.store))
    rollback(Cluster(w.env, "lab"), "interrupted", False, NoProgress())
    assert w.env.store.cluster("lab").status is S.DELETING and len(texts(w.env.store)) == n
    assert w.provider.containers("lab") == []  # what was made is removed all the same


# -- health-check requests -------------------------------------------------------------
def request_in(rec: Records, state: RequestState | None) -> str | None:
    if state is None:
        return None
    rid = rec.new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-1", "cpu-2"], {})
    rec.s.execute("UPDATE health_requests SET state=? WHERE id=?", (state.value, rid))  # past the gate
    return rid


@pytest.fixture
def rec(tmp_path) -> Records:
    st = Store(tmp_path)
    st.add_cluster("lab", {}, S.CREATING, "a test")
    return Records(st)


@pytest.mark.parametrize(("frm", "to"), list(REQUEST), ids=lambda s: str(s))
def test_every_listed_request_edge_is_written_with_its_event_once(rec, frm, to):
    rid = request_in(rec, frm)
    before = texts(rec.s)
    if frm is None:
        rid = rec.new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-1", "cpu-2"], {})
        assert rid is not None
        want = [f"Deep health check {rid} requested: InstanceStress on 2 node(s) of cpu"]
    else:
        assert rec.set_state(rid, to, "why", detail=" (detail)")
        edge = REQUEST[(frm, to)]
        want = [edge.event(rid, "why", " (detail)")] if edge.level else []
    r = rec.request(rid)
    assert r.state is to and (r.ended is None) == (to in ACTIVE)
    assert texts(rec.s)[len(before) :] == want


UNLISTED_REQUEST = [(f, t) for f, t in itertools.product([None, *R], R) if (f, t) not in REQUEST]


@pytest.mark.parametrize(("frm", "to"), [e for e in UNLISTED_REQUEST if e[0] is not None], ids=lambda s: str(s))
def test_every_other_request_edge_is_refused_and_nothing_written(rec, frm, to):
    rid = request_in(rec, frm)
    before, r = texts(rec.s), rec.request(rid)
    with pytest.raises(InvalidTransition, match="not an allowed RequestState change"):
        rec.set_state(rid, to, "why")
    assert texts(rec.s) == before and rec.request(rid) == r


def test_a_request_is_born_pending_only_and_one_is_active_at_a_time(rec):
    assert all(to is R.PENDING for f, to in REQUEST if f is None)
    with pytest.raises(InvalidTransition):
        transitions.request_edge("hc-x", None, R.RUNNING)
    rid = rec.new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-3"], {"on_start": True})
    assert texts(rec.s)[-1] == f"Deep health check {rid} (on start) of cpu-3 in group cpu: InstanceStress"
    assert rec.s.events("lab")[-1].group == "cpu"
    n = len(texts(rec.s))
    assert rec.new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-1"], {}) is None  # one active: nothing written
    assert len(texts(rec.s)) == n and len(rec.requests("lab")) == 1
    assert rec.set_state("hc-none", R.RUNNING) is False
    with pytest.raises(InvalidTransition, match="unknown RequestState"):
        rec.set_state(rid, "Done")
    # reaped by two processes, or cancelled as it ended: the second writer writes nothing
    assert rec.set_state(rid, R.FAILED, "the worker died", expect=ACTIVE)
    assert rec.set_state(rid, R.FAILED, "the worker died", expect=ACTIVE) is False
    assert rec.set_state(rid, R.CANCELLED, "cancelled by the user", expect=ACTIVE) is False
    assert texts(rec.s)[n:] == [f"Deep health check {rid} failed: the worker died"]
    assert rec.new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-1"], {}) is not None  # none active now


def test_completed_with_failed_nodes_warns(rec):
    rid = rec.new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-1"], {})
    rec.set_state(rid, R.RUNNING)
    rec.set_state(rid, R.COMPLETED, "0 of 1 node(s) passed", detail=": cpu-1 Failed: x", level="Warning")
    e = rec.s.events("lab")[-1]
    assert (e.level, e.description) == (
        "Warning",
        f"Deep health check {rid} completed: 0 of 1 node(s) passed: cpu-1 Failed: x",
    )
