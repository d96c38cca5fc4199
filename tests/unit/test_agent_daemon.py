"""The agent's loop on the fakes: it scales a group up, marks a cluster InService, stops
when its cluster is deleted or its state folder removed, and its on-start queue checks joined nodes."""

from __future__ import annotations

import shutil
import threading
import time
from types import SimpleNamespace

from fakes import spec_doc, world

from orchestrator.agent import onstart_queue as onstart_mod
from orchestrator.agent.daemon import Agent, slurm_nodes
from orchestrator.agent.onstart_queue import OnStartQueue
from orchestrator.cluster.create import CreateOptions, create
from orchestrator.cluster.scaling import scale
from orchestrator.core.context import Cluster
from orchestrator.errors import EngineUnavailable, OperationFailed
from orchestrator.releases import DEFAULT
from orchestrator.spec.model import validate
from orchestrator.state.transitions import ClusterStatus


def until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_agent_scales_up_and_exits_when_the_cluster_goes(tmp_path):
    w = world(tmp_path)
    create(w.env, validate(spec_doc("lab"), w.env.catalogue), CreateOptions(timeout=5))
    agent = Agent(w.env, "lab")
    t = threading.Thread(target=agent.run, daemon=True)
    t.start()
    scale(w.env, "lab", "cpu", 4)
    agent.kick()
    until(lambda: sum(1 for c in w.provider.containers("lab") if c.group == "cpu" and c.running) == 4)
    until(lambda: not w.env.store.operations("lab"))  # the scale operation closed
    w.env.store.set_status("lab", ClusterStatus.DELETING)
    agent.kick()
    t.join(5)
    assert not t.is_alive()
    agent.stop.set()


def test_agent_for_an_unknown_cluster_says_so_and_exits_2(tmp_path, caplog):
    """`python -m orchestrator.agent NAME` for a cluster hp does not know: one line, exit 2
    (it ended with a NotFound traceback); nothing is started for it."""
    w = world(tmp_path)
    with caplog.at_level("ERROR"):
        assert Agent(w.env, "nosuch").run() == 2
    assert "cluster 'nosuch' does not exist" in caplog.text
    assert not w.provider.containers("nosuch")


def test_agent_started_while_the_engine_restarts_waits_for_it(tmp_path):
    """hp starts the agent as a create ends: an engine that restarts just then (no
    answer to the images' lookup) is waited for; the agent was lost before."""
    w = world(tmp_path)
    create(w.env, validate(spec_doc("lab"), w.env.catalogue), CreateOptions(timeout=5))
    real, looks = w.env.images(DEFAULT).refs, [0]

    def refs(defs):  # the agent's first reads of its node images' tags, while the engine is away
        looks[0] += 1
        if looks[0] <= 2:
            raise EngineUnavailable("cannot reach a Docker engine (fake: restarting)")
        return real(defs)

    w.env.images(DEFAULT).refs = refs
    agent = Agent(w.env, "lab")
    t = threading.Thread(target=agent.run, daemon=True)
    t.start()
    scale(w.env, "lab", "cpu", 3)
    agent.kick()
    until(lambda: sum(1 for c in w.provider.containers("lab") if c.group == "cpu" and c.running) == 3)
    assert looks[0] >= 3 and t.is_alive()
    agent.stop.set()
    agent.kick()
    t.join(5)


def test_agent_exits_when_its_state_folder_is_removed(tmp_path):
    """A state folder removed under a running agent (a CI job's temporary HP_HOME):
    SQLite goes on with the unlinked file, so the agent ran on forever before; it exits
    now, and leaves the cluster's containers as they are."""
    w = world(tmp_path)
    create(w.env, validate(spec_doc("lab"), w.env.catalogue), CreateOptions(timeout=5))
    agent = Agent(w.env, "lab")
    t = threading.Thread(target=agent.run, daemon=True)
    t.start()
    until(lambda: t.is_alive())
    assert not w.env.store.gone()
    running = sorted(c.name for c in w.provider.containers("lab") if c.running)
    shutil.rmtree(w.home)
    assert w.env.store.gone()
    agent.kick()
    t.join(5)
    assert not t.is_alive()
    assert sorted(c.name for c in w.provider.containers("lab") if c.running) == running


def test_agent_waits_while_the_controller_does_not_answer(tmp_path):
    w = world(tmp_path)
    create(w.env, validate(spec_doc("lab"), w.env.catalogue), CreateOptions(timeout=5))
    w.slurm.up = False
    assert slurm_nodes(Cluster(w.env, "lab")) is None  # unknown for now, never "no nodes"


def test_onstart_queue_batches_retries_when_busy_and_reports_failures(monkeypatch):
    class Busy(Exception):
        pass

    seen, errors = [], []
    answers = [Busy(), None, OperationFailed("controller down")]

    def check(nodes):
        seen.append(list(nodes))
        a = answers.pop(0)
        if a is not None:
            raise a

    woken = []
    q = OnStartQueue(check, Busy, lambda batch, e: errors.append((batch, str(e))))
    q.runtime = SimpleNamespace(enqueue=lambda *a: woken.append(a))
    q.add("cpu-1")
    q.add("cpu-2")
    q.add("cpu-1")  # never twice
    assert woken == [("on-start", "batch", onstart_mod.GATHER_S)] * 2  # nodes that joined together: one batch
    assert q.reconcile().requeue_after == onstart_mod.RETRY_BUSY_S  # busy: the batch goes back
    q.reconcile()  # checked
    assert seen == [["cpu-1", "cpu-2"], ["cpu-1", "cpu-2"]]
    q.add("cpu-3")
    q.reconcile()
    assert errors == [(["cpu-3"], "controller down")]
    assert q.reconcile().requeue_after is None  # nothing queued: nothing done
    assert len(seen) == 3
