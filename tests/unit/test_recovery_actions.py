"""Recovery on the fakes: reboot, replace, recover, what a request by hand refuses, and the
watcher's observations (a dead container, a node Slurm forgot, an admin's Action:*)."""

from __future__ import annotations

import time

import pytest
from fakes import force_status, spec_doc, world

from orchestrator.cluster.create import CreateOptions, create
from orchestrator.core.context import Cluster
from orchestrator.docker.views import Event
from orchestrator.errors import BadInput, EngineError, EngineUnavailable, OperationFailed
from orchestrator.recovery import actions, by_hand
from orchestrator.recovery.watcher import RecoveryWatcher
from orchestrator.runtime import Runtime
from orchestrator.spec.model import validate
from orchestrator.state.phases import Phase
from orchestrator.verdict import Action


@pytest.fixture
def w(tmp_path, monkeypatch):
    monkeypatch.setattr(actions, "POLL_S", 0.001)
    w = world(tmp_path)
    create(w.env, validate(spec_doc("lab"), w.env.catalogue), CreateOptions(timeout=5))
    w.runtimes = []
    yield w
    for rt in w.runtimes:
        rt.shutdown()


def phase(w, node):
    return w.env.store.latest_phases("lab")[node].phase


def test_reboot_restarts_the_container_and_waits_for_slurm(w):
    c = Cluster(w.env, "lab")
    cid = w.provider.node("lab", "cpu-1").id
    w.provider.die("lab", "cpu-1")
    assert actions.reboot(c, "cpu-1", "container died", wait=2)
    assert w.provider.node("lab", "cpu-1").id == cid and phase(w, "cpu-1") == "Running"
    assert ("delete", ("cpu-1",)) in w.slurm.calls  # forgotten first: it registers afresh
    assert any("was rebooted: container died" in e.description for e in w.env.store.events("lab"))


@pytest.mark.parametrize("state", [("ALLOCATED",), ("IDLE", "COMPLETING")])
def test_a_worker_that_died_with_jobs_is_set_down_so_slurm_ends_them(w, state):
    """Slurm keeps a dead node's jobs RUNNING (or COMPLETING) for good and refuses to
    delete it: hp sets it DOWN (Slurm ends the jobs, NODE_FAIL), then deletes it."""
    from dataclasses import replace

    c = Cluster(w.env, "lab")
    w.slurm.nodes_["cpu-1"] = replace(w.slurm.nodes_["cpu-1"], state=state)
    w.provider.die("lab", "cpu-1")
    assert actions.reboot(c, "cpu-1", "container died", wait=2)
    calls = [k for k in w.slurm.calls if k[1] == ("cpu-1",)]
    assert calls[:3] == [("delete", ("cpu-1",)), ("down", ("cpu-1",)), ("delete", ("cpu-1",))]
    assert phase(w, "cpu-1") == "Running" and w.slurm.nodes_["cpu-1"].usable


def test_the_jobs_of_a_node_hp_takes_get_hps_note_first(w):
    """An srun --auto-resume step that runs again says why its node went: hp writes what
    it did on each job the node held (found before Slurm is told the node is down)."""
    from dataclasses import replace

    c = Cluster(w.env, "lab")
    w.slurm.nodes_["cpu-1"] = replace(w.slurm.nodes_["cpu-1"], state=("ALLOCATED",))
    w.slurm.jobs[7] = w.slurm.jobs[8] = None
    w.slurm.job_nodes = {7: ("cpu-1", "cpu-2"), 8: ("cpu-2",)}
    w.provider.die("lab", "cpu-1")
    assert actions.reboot(c, "cpu-1", "container died (exit 137)", wait=2)
    assert w.slurm.notes == {7: "hp: cpu-1 rebooted: container died (exit 137)"}
    names = [k[0] for k in w.slurm.calls]
    assert names.index("down") < names.index("note_jobs")  # the node out of its jobs first
    # Slurm refusing the note is no reason not to recover the node
    w.slurm.nodes_["cpu-1"] = replace(w.slurm.nodes_["cpu-1"], state=("ALLOCATED",))
    w.slurm.note_jobs = lambda jobs, note: (_ for _ in ()).throw(OperationFailed("refused"))  # type: ignore[method-assign]
    w.provider.die("lab", "cpu-1")
    assert actions.replace(c, "cpu-1", "requested through Slurm (Action:Replace)", wait=2)


@pytest.mark.parametrize("requeueable", [True, False])
def test_a_job_whose_batch_host_hp_takes_runs_again_or_ends_with_hps_reason(w, requeueable):
    """A --no-kill job (srun --auto-resume) keeps running when its batch host goes DOWN,
    with nothing in it: hp requeues it (it runs again from its script) or, when Slurm
    refuses (--no-requeue), cancels it; its note and a Job event say why."""
    from dataclasses import replace

    c = Cluster(w.env, "lab")
    w.slurm.nodes_["cpu-1"] = replace(w.slurm.nodes_["cpu-1"], state=("ALLOCATED",))
    w.slurm.jobs[7] = w.slurm.jobs[8] = None
    w.slurm.job_nodes = {7: ("cpu-1", "cpu-2"), 8: ("cpu-1", "cpu-2")}
    w.slurm.batch_hosts = {7: "cpu-1", 8: "cpu-2"}  # job 8 only lost a node: its step is retried in it
    if not requeueable:
        w.slurm.no_requeue.add(7)
    w.provider.die("lab", "cpu-1")
    assert actions.reboot(c, "cpu-1", "container died (exit 137)", wait=2)
    names = [k for k in w.slurm.calls if k[0] in ("down", "requeue", "kill_job", "delete")]
    if requeueable:
        assert w.slurm.requeued == [7] and ("kill_job", ("7",)) not in w.slurm.calls
        assert w.slurm.notes[7] == (
            "hp: cpu-1 rebooted: container died (exit 137); it was the job's batch host: "
            "the job was requeued and runs again from the top of its script"
        )
    else:
        assert ("kill_job", ("7",)) in w.slurm.calls
        assert "cannot be requeued (--no-requeue): it was cancelled" in w.slurm.notes[7]
    assert names[1:] == [("down", ("cpu-1",)), ("requeue", ("7",)), *names[3:]]  # refused delete, DOWN, requeue
    assert names[-1] == ("delete", ("cpu-1",))
    assert 8 not in w.slurm.requeued and w.slurm.notes[8] == "hp: cpu-1 rebooted: container died (exit 137)"
    jobs = [e for e in w.env.store.events("lab") if e.resource_type == "Job"]
    assert [e.description.split(":")[0] for e in jobs] == ["job 7"]
    assert jobs[0].level == ("Warning" if requeueable else "Error")


def test_the_watcher_reruns_a_job_whose_batch_host_slurm_set_down_by_itself(w):
    """NodeRecovery None: hp takes no node, Slurm sets a silent one DOWN (SlurmdTimeout) and
    keeps its --no-kill job running without it; the watcher's look requeues the job."""
    from dataclasses import replace

    w.slurm.nodes_["cpu-2"] = replace(w.slurm.nodes_["cpu-2"], state=("DOWN",), reason="Not responding")
    w.slurm.jobs[9] = None
    w.slurm.job_nodes = {9: ("cpu-1",)}
    w.slurm.batch_hosts = {9: "cpu-2"}
    calls: list = []
    wt = watcher(w, calls)
    assert wt.poll()
    assert w.slurm.requeued == [9]
    assert w.slurm.notes[9].startswith("hp: cpu-2 is down in Slurm (Not responding); it was the job's batch host")
    assert wt.poll() and w.slurm.requeued == [9]  # once: a requeued job is no orphan


def test_a_job_requeued_meanwhile_is_left_alone_never_cancelled(w):
    """Two looks of hp's (the reboot's and the watcher's) may find the same orphan; the
    second requeue is refused because the first one took: the job must not be cancelled."""
    from dataclasses import replace

    w.slurm.nodes_["cpu-2"] = replace(w.slurm.nodes_["cpu-2"], state=("DOWN",), reason="Not responding")
    w.slurm.batch_hosts = {9: "cpu-2"}
    w.slurm.requeue = lambda job_id: False  # type: ignore[method-assign]  # as slurmctld: "Job is pending execution"
    assert actions.rerun_orphans(Cluster(w.env, "lab"), {"cpu-2": "rebooted"}) == []
    assert ("kill_job", ("9",)) not in w.slurm.calls and 9 not in w.slurm.notes


def test_the_watcher_records_each_auto_resume_retry_once_after_it_acted_on_a_worker(w):
    from orchestrator.slurm.model import AutoResumeRetry

    calls: list = []
    wt = watcher(w, calls)
    w.slurm.retries = [AutoResumeRetry(12, "job=11 step=0 lost=cpu-1 attempt=1 of 1: rebooted: container died")]
    assert wt.poll()  # nothing acted on yet: Slurm is not asked
    assert not [e for e in w.env.store.events("lab") if e.resource_type == "Job"]
    w.provider.die("lab", "cpu-1")
    assert wt.poll() and wt.poll()
    join(wt)
    assert wt.poll()
    jobs = [e.description for e in w.env.store.events("lab") if e.resource_type == "Job"]
    assert jobs == [
        "srun --auto-resume: job=11 step=0 lost=cpu-1 attempt=1 of 1: rebooted: container died (job 12 grew it back)"
    ]
    w.slurm.up = False  # Slurm not answering: no event, no error
    assert wt.poll()


def test_reboot_keeping_the_node_drained_for_a_health_check(w):
    c = Cluster(w.env, "lab")
    assert actions.reboot(c, "cpu-2", "check failed", wait=2, keep_drained="hp:health:hc-1:InstanceStress")
    sn = w.slurm.nodes_["cpu-2"]
    assert sn.drained and sn.reason == "hp:health:hc-1:InstanceStress"


def test_replace_makes_a_new_container_under_the_same_name(w):
    c = Cluster(w.env, "lab")
    old = w.provider.node("lab", "cpu-1").id
    assert actions.replace(c, "cpu-1", "bad node", wait=2)
    new = w.provider.node("lab", "cpu-1")
    assert new.id != old and new.state == "running" and phase(w, "cpu-1") == "Running"
    assert any(f"was replaced by i-{new.id[:17]}" in e.description for e in w.env.store.events("lab"))
    with pytest.raises(BadInput, match="can be rebooted"):
        actions.replace(c, "controller-1", "no", wait=1)


def test_recover_replaces_when_the_reboot_does_not_bring_the_node_back(w):
    c = Cluster(w.env, "lab")
    w.slurm.auto_register = False
    registered = []

    def only_new(cont):  # the old container never registers again; a fresh one does
        if cont.id != old:
            w.slurm.auto_register = True
            w.slurm.register(cont)
            registered.append(cont.id)

    old = w.provider.node("lab", "cpu-1").id
    w.provider.on_start.append(only_new)
    assert actions.recover(c, "cpu-1", "slurmd down", wait=0.3)
    assert registered and phase(w, "cpu-1") == "Running"
    hist = [r.phase for r in w.env.store.node_history("lab", "cpu-1")]
    assert hist[-3:] == ["Rebooting", "Replacing", "Running"]


def test_a_replacement_that_cannot_launch_goes_back_to_the_reconciler(w):
    c = Cluster(w.env, "lab")
    w.provider.fail_create = lambda spec: EngineError("disk full", 500)
    assert not actions.replace(c, "cpu-2", "bad", wait=1)
    assert phase(w, "cpu-2") == "LaunchFailed"


def test_a_replacement_cut_short_by_the_engine_going_away_goes_back_to_the_reconciler(w):
    c = Cluster(w.env, "lab")

    def gone(cid):  # the engine stops: the old container cannot even be removed
        raise EngineUnavailable("cannot reach a Docker engine (stopped)")

    w.provider.remove_container = gone
    assert not actions.replace(c, "cpu-2", "died", wait=1)
    assert phase(w, "cpu-2") == "LaunchFailed"


def test_controller_reboot_re_registers_workers_it_forgot(w):
    c = Cluster(w.env, "lab")
    w.slurm.nodes_.pop("cpu-2")  # slurmctld killed before saving state forgets a dynamic node
    assert actions.reboot(c, "controller-1", "container died", wait=2)
    assert "cpu-2" in w.slurm.nodes_ and phase(w, "cpu-2") == "Running"


def test_by_hand_checks_the_whole_request_first(w):
    with pytest.raises(BadInput) as e:
        by_hand.run(w.env, "replace", "lab", ["controller-1", "cpu-9", "cpu-1"], "x", 0)
    assert len(e.value.problems) == 3  # the timeout, the controller, the unknown node
    w.env.store.set_phase("lab", "cpu-1", Phase.CHECKING, "hc-1")
    w.env.store.set_phase("lab", "cpu-1", Phase.RUNNING, "")
    w.env.store.set_phase("lab", "cpu-1", Phase.SHUTTING_DOWN, "scale-down")
    with pytest.raises(BadInput, match="ShuttingDown"):
        by_hand.run(w.env, "reboot", "lab", ["cpu-1"], "x", 5)
    rows = by_hand.run(w.env, "reboot", "lab", ["cpu-2", "cpu-2"], "x", 2)
    assert rows == [
        {
            "SlurmNodeName": "cpu-2",
            "Action": "reboot",
            "Succeeded": True,
            "NodeId": "i-" + w.provider.node("lab", "cpu-2").id[:17],
            "OperationId": rows[0]["OperationId"],
        }
    ]
    # the request is one operation (none for those refused), ended with how it went
    [op] = w.env.store.operations("lab", active_only=False)
    assert (op.id, op.kind, op.status, op.group, op.nodes) == (
        rows[0]["OperationId"],
        "Reboot",
        "Done",
        "cpu",
        ("cpu-2",),
    )
    with pytest.raises(OperationFailed, match="not back in service after reboot: cpu-2"):
        by_hand.check_all_back("lab", "reboot", [{**rows[0], "Succeeded": False}])


def test_targets_without_a_container(w):
    c = Cluster(w.env, "lab")
    w.provider.remove_container("hp-lab-cpu-2")
    t = actions.target(c, "cpu-2")
    assert t.container is None and t.role == "worker" and t.label() == "Instance (none) (cpu-2)"
    assert not actions.reboot(c, "cpu-2", "x", wait=1)
    with pytest.raises(BadInput):
        actions.target(c, "gpu-1")


# -- the watcher ------------------------------------------------------------------------
def watcher(w, calls=None, act=None):
    """A watcher on a runtime of its own: its node keys run on the runtime's workers, its
    poll is the test's."""

    def record(cluster, action, node, why, wait):
        calls.append((action, node, why))
        return True

    wt = RecoveryWatcher(w.env, "lab", act=act or record)
    wt.keys = ()
    rt = Runtime(w.env.store, "lab")
    rt.add(wt)
    w.runtimes.append(rt.start())
    return wt


def join(wt):
    assert wt.runtime.idle(wt.kind, 5)


def test_watcher_recovers_a_dead_worker_and_reboots_a_dead_controller(w):
    calls: list = []
    wt = watcher(w, calls)
    w.provider.die("lab", "cpu-1")
    w.provider.die("lab", "controller-1")
    w.slurm.up = False
    assert wt.poll()
    join(wt)
    assert sorted(a[:2] for a in calls) == [(Action.REBOOT, "controller-1"), (Action.RECOVER, "cpu-1")]


def test_watcher_honours_an_admins_action_and_leaves_a_hold_alone(w):
    calls: list = []
    wt = watcher(w, calls)
    w.slurm.set("cpu-1", "IDLE", "FAIL", reason="Action:Replace")
    w.slurm.set("cpu-2", "IDLE", "DRAIN", reason="bad DIMM")
    wt.poll()
    join(wt)
    assert [c[:2] for c in calls] == [(Action.REPLACE, "cpu-1")] and "requested through Slurm" in calls[0][2]


def test_watcher_keeps_its_hands_off_nodes_others_own_and_clusters_being_made(w):
    calls: list = []
    wt = watcher(w, calls)
    w.env.store.set_phase("lab", "cpu-1", Phase.CHECKING, "hc-1")
    w.provider.die("lab", "cpu-1")
    wt.poll()
    join(wt)
    assert calls == []
    force_status(w.env.store, "lab", "Creating")
    w.provider.die("lab", "cpu-2")
    assert wt.poll() and calls == []
    w.env.store.remove_cluster("lab")
    assert wt.poll() is False  # gone: the watch ends


def test_watcher_acts_on_docker_die_events(w):
    calls: list = []
    wt = watcher(w, calls)
    c = w.provider.die("lab", "cpu-2")
    wt.watch(Event("oom", c.id, dict(c.spec.labels), time.time()))
    wt.watch(Event("die", c.id, dict(c.spec.labels), time.time(), 137))
    join(wt)
    assert calls and calls[0][:2] == (Action.RECOVER, "cpu-2") and "out of memory" in calls[0][2]
    wt.watch(Event("start", c.id, dict(c.spec.labels), time.time()))  # not a fault
    wt.watch(Event("die", c.id, {"io.hp.role": "check"}, time.time()))  # not a node
    join(wt)
    assert len(calls) == 1


def test_watcher_acts_on_a_pause_event_without_waiting_for_its_poll(w):
    """A frozen controller is rebooted from its 'pause' event: the poll may be stuck in an
    exec that froze with it (Docker 20.10), and only the reboot's thaw frees it."""
    calls: list = []
    wt = watcher(w, calls)
    ctl = w.provider.node("lab", "controller-1")
    wt.watch(Event("pause", ctl.id, dict(ctl.spec.labels), time.time()))
    join(wt)
    assert calls and calls[0][:2] == (Action.REBOOT, "controller-1")


def test_watcher_runs_until_stopped_and_reports_a_bug_in_an_action(w):
    def buggy(cluster, action, node, why, wait):
        raise TypeError("a bug")

    wt = RecoveryWatcher(w.env, "lab", act=buggy)
    w.provider.die("lab", "cpu-1")
    rt = Runtime(w.env.store, "lab")
    rt.add(wt)
    rt.start()
    deadline = time.monotonic() + 5
    while not any("internal error" in e.description for e in w.env.store.events("lab")) and time.monotonic() < deadline:
        time.sleep(0.02)
    rt.shutdown()
    assert not any(t.is_alive() for t in rt._threads)
    bug = next(e.description for e in w.env.store.events("lab") if "internal error" in e.description)
    assert "reboot of cpu-1" in bug or "recover of cpu-1" in bug
    assert rt.parked("recovery") == {"node:cpu-1"}  # its key parked: not retried in a loop, the poll goes on
    assert len([e for e in w.env.store.events("lab") if "internal error" in e.description]) == 1


def test_a_recovery_that_failed_because_the_engine_was_down_is_tried_again_soon(w):
    """An engine restart: the action fails at once (nothing reached a node). The node it
    left Rebooting is not 'owned' by that ended action, and no 30 s backoff applies."""
    calls: list = []

    def act(cluster, action, node, why, wait):
        calls.append((action, node))
        if len(calls) == 1:  # the engine stops while the first action runs
            w.provider.up = False
            cluster.store.set_phase("lab", node, Phase.REBOOTING, f"rebooting: {why}")
            return False
        cluster.store.set_phase("lab", node, Phase.RUNNING)
        return True

    wt = watcher(w, act=act)
    w.provider.die("lab", "controller-1")
    wt.poll()
    join(wt)
    w.provider.up = True
    assert calls == [(Action.REBOOT, "controller-1")]
    assert wt.runtime.due_in("recovery", "node:controller-1") <= 2.0
    assert wt.runtime.failures("recovery", "node:controller-1") == 0
    time.sleep(2.05)
    wt.poll()
    join(wt)
    assert calls == [(Action.REBOOT, "controller-1")] * 2  # acted again on the node its failed action left Rebooting


def test_a_recovery_that_failed_with_the_engine_up_backs_off(w):
    def act(cluster, action, node, why, wait):
        return False

    wt = watcher(w, act=act)
    w.provider.die("lab", "cpu-1")
    wt.poll()
    join(wt)
    assert wt.runtime.due_in("recovery", "node:cpu-1") > 25 and wt.runtime.failures("recovery", "node:cpu-1") == 1
    wt.poll()  # still dead: the poll leaves it to its backoff
    join(wt)
    assert wt.runtime.due_in("recovery", "node:cpu-1") > 25
