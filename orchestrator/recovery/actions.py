"""Node recovery: reboot (restart the container) and replace (new container, same Slurm
node name, new NodeId). Called by the recovery watcher, the deep health checks and
`hp reboot` / `hp replace`.

Each action records phases through the store's gate (Rebooting, Replacing, then
Running; LaunchFailed hands a replacement that did not come up to the agent's
reconciler, which retries it), so that other hp processes leave the node alone, and
events, and waits until the node is usable again: a worker idle in Slurm, a login node
reaching slurmctld, the controller answering.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .. import waits
from ..core.context import Cluster, parallel
from ..core.launcher import Launcher
from ..docker.views import Container
from ..errors import TRANSIENT, BadInput, LaunchError, OperationFailed
from ..naming import ROLE_BY_NODE_TYPE, node_id, split_node
from ..services.accounting import before_controller_start
from ..slurm.model import ONSTART_REASON, REBOOTING_REASON, REQUEUED_NOTE, job_note
from ..state.phases import Phase, allowed, owner_of
from ..verdict import Action
from .rules import escalation

POLL_S = 0.2
RESUME_EVERY_S = 2.0


@dataclass(frozen=True)
class Target:
    """The node acted on: its Slurm name, role, group and index, and its container if any."""

    node: str
    role: str
    group: str
    index: int
    container: Container | None

    @property
    def node_id(self) -> str | None:
        return node_id(self.container.id) if self.container else None

    def label(self) -> str:
        return f"Instance {self.node_id or '(none)'} ({self.node})"


def target(cluster: Cluster, node: str) -> Target:
    """Resolve a Slurm node name to what recovery needs; BadInput if the cluster has no such node."""
    c = cluster.node_containers().get(node)
    if c is not None:
        return Target(node, c.role, c.group, c.index, c)
    # No container (removed by someone): the name still says group and index.
    base, idx = split_node(node)
    groups = {g.InstanceGroupName.lower(): g for g in cluster.spec.InstanceGroups}
    g = groups.get(base)
    if g is None or not 1 <= idx <= max(g.InstanceCount, 1):
        raise BadInput(f"cluster {cluster.name!r} has no node {node!r}")
    return Target(node, ROLE_BY_NODE_TYPE[g.node_type], g.InstanceGroupName, idx, None)


def request_problems(cluster: Cluster, action: str, nodes: list[str], timeout: float) -> list[str]:
    """Every problem with a reboot/replace request by hand (nothing is done when any)."""
    problems = []
    if timeout <= 0:
        problems.append(f"--timeout must be positive, got {timeout:g}")
    latest = cluster.store.latest_phases(cluster.name)
    now = time.time()
    for n in nodes:
        try:
            t = target(cluster, n)
        except BadInput as e:
            problems += e.problems
            continue
        if action == "replace" and t.role == "controller":
            problems.append(
                f"{n} is the controller: it can be rebooted ('hp reboot {cluster.name} {n}'), "
                "not replaced (its state lives on its volume)"
            )
        if action == "reboot" and t.container is None:
            problems.append(f"{n} has no container to reboot; replace it with 'hp replace {cluster.name} {n}'")
        phase = latest.phase(n)
        o = owner_of(latest.get(n), now)
        to, done = (Phase.REBOOTING, "rebooted") if action == "reboot" else (Phase.REPLACING, "replaced")
        if not allowed(phase, to):
            problems.append(
                f"{n} is {phase} (owned by {o.value}): it cannot be {done} now; try again when it is Running"
            )
    return problems


def reboot(cluster: Cluster, node: str, reason: str, wait: float = 60.0, keep_drained: str | None = None) -> bool:
    """Restart the node's container; True when it is back idle (or usable) in Slurm.
    With `keep_drained` (a drain reason), the node comes back drained with it: it takes
    no job until whoever asked (a health check) resumes it."""
    t = target(cluster, node)
    store, name = cluster.store, cluster.name
    if t.container is None:
        _event(cluster, t, "Error", f"could not be rebooted ({reason}): it has no container")
        return False
    store.set_phase(name, node, Phase.REBOOTING, f"rebooting: {reason}")
    _event(cluster, t, "Info", f"is being rebooted: {reason}")
    t0 = time.monotonic()
    try:
        if keep_drained and t.role == "worker":
            # keep the node's record, drained: a dynamic node's DRAIN survives a slurmd restart
            try:
                cluster.slurm.drain([node], keep_drained)
            except OperationFailed:
                pass  # the controller does not answer: the node registers anew
        else:
            _forget(cluster, t, f"rebooted: {reason}")
        if t.role == "controller":  # never (re)start slurmctld while slurmdbd is unreachable
            if done := before_controller_start(cluster, wait):
                _event(cluster, t, "Info", f"waits for accounting first: {'; '.join(done)}")
        if t.container.state in ("running", "paused"):  # a restart also thaws a frozen one
            cluster.p.restart(t.container.id, timeout=2)
        else:
            cluster.p.start(t.container.id)
        ok = wait_usable(cluster, t, t.container.id, t0 + wait, keep_drained)
    except TRANSIENT as e:  # the engine or Slurm refused: the reboot failed, replace may help
        ok, reason = False, f"{reason}; {str(e)[:200]}"
    if ok:
        store.set_phase(name, node, Phase.RUNNING)
        _event(cluster, t, "Info", f"was rebooted: {reason} (back in {time.monotonic() - t0:.1f} s)")
        if t.role == "controller":
            reregister_lost(cluster, wait)
    else:  # left Rebooting: recover() replaces it; a stale one is taken back later
        _event(cluster, t, "Error", f"did not come back within {wait:g} s of a reboot: {reason}")
    return ok


def replacing(reason: str) -> str:
    """The status message of a node `replace` is replacing for `reason`."""
    return f"replacing: {reason}"


def replace(
    cluster: Cluster,
    node: str,
    reason: str,
    wait: float = 60.0,
    keep_drained: str | None = None,
    images: dict[str, str] | None = None,
) -> bool:
    """Remove the node's container and launch a new one with the same Slurm name.
    With `keep_drained`, the new node registers drained with that reason; with `images`,
    on those (hp upgrade: another Slurm release's), else on hp's current ones."""
    t = target(cluster, node)
    if t.role == "controller":
        raise BadInput(
            f"{node} is the controller of cluster {cluster.name!r}: it can be rebooted "
            f"('hp reboot {cluster.name} {node}'), not replaced (its state lives on its volume)"
        )
    store, name = cluster.store, cluster.name
    group = cluster.group_of(t.group)
    store.set_phase(name, node, Phase.REPLACING, replacing(reason))
    _event(cluster, t, "Info", f"is being replaced: {reason}")
    t0 = time.monotonic()
    try:
        if t.container is not None:
            cluster.p.remove_container(t.container.id)
        _forget(cluster, t, f"replaced: {reason}")
        launcher = Launcher(cluster, images or _images(cluster, t))
        res = launcher.create_many([(group, t.index)], drain_reason=keep_drained)[node]
        err = res if isinstance(res, LaunchError) else launcher.start(res)
    except TRANSIENT as e:  # the engine went away part-way: the reconciler launches it when it is back
        res, err = "", str(e)[:300]
    if err is not None:
        store.set_phase(name, node, Phase.LAUNCH_FAILED, f"replacement could not be launched: {err}")
        _event(cluster, t, "Error", f"could not be replaced ({reason}): {err}")
        return False
    assert isinstance(res, str)
    new = Target(t.node, t.role, t.group, t.index, cluster.node_containers().get(node))
    try:
        ok = wait_usable(cluster, new, res, t0 + wait, keep_drained)
    except TRANSIENT:  # e.g. the new container was removed meanwhile
        ok = False
    if ok:
        store.set_phase(name, node, Phase.RUNNING)
        took = f"{time.monotonic() - t0:.1f} s"
        _event(cluster, t, "Info", f"was replaced by {new.node_id}: {reason} (up in {took})", new.node_id)
    else:
        try:  # one that exited says so, not a timeout it never reached
            st = cluster.p.inspect(res).state
            gone = f"exited (code {st.exit_code}) before it came up" if st.status in ("exited", "dead") else None
        except TRANSIENT:
            gone = "was removed before it came up"
        why = f"replacement {gone or f'did not register within {wait:g} s'}: {reason}"
        store.set_phase(name, node, Phase.LAUNCH_FAILED, why)
        _event(cluster, new, "Error", f"(replacement) {gone or f'did not come up within {wait:g} s'}: {reason}")
    return ok


def step(
    cluster: Cluster, action: Action, node: str, reason: str, wait: float = 60.0, keep_drained: str | None = None
) -> bool:
    """One step the escalation policy chose (rules.escalation): REBOOT or REPLACE; True when
    the node is back. RECOVER runs the whole escalation (`recover`)."""
    if action is Action.RECOVER:
        return recover(cluster, node, reason, wait, keep_drained)
    if action not in (Action.REBOOT, Action.REPLACE):
        raise ValueError(f"{action!r} is not a step taken on a node")
    fn = reboot if action is Action.REBOOT else replace
    return fn(cluster, node, reason, wait, keep_drained=keep_drained)


def recover(cluster: Cluster, node: str, reason: str, wait: float = 60.0, keep_drained: str | None = None) -> bool:
    """RECOVER, by the escalation policy (rules.escalation): reboot; its re-check is the node
    back in service (reboot's wait); replace if it is not (the controller is only rebooted).
    Whether it was rebooted is read from the history: a node left Rebooting (a reboot that
    did not bring it back, here or in an agent that died meanwhile) is replaced."""
    replaceable = target(cluster, node).role != "controller"
    for _ in range(2):
        history = cluster.store.node_history(cluster.name, node)
        rebooted = bool(history) and history[-1].phase is Phase.REBOOTING
        todo = escalation(Action.RECOVER, rebooted, replaceable)
        if todo is Action.NONE:
            return False
        why = f"{reason}; reboot did not bring it back" if rebooted else reason
        if step(cluster, todo, node, why, wait, keep_drained):
            return True
        if todo is Action.REPLACE:
            return False
    return False


def reregister_lost(cluster: Cluster, wait: float = 60.0) -> list[str]:
    """A controller killed before it saved its state forgets the dynamic nodes that
    registered since; their slurmd never registers again by itself. Reboot them."""
    try:
        known = {n.name for n in cluster.slurm.nodes()}
    except OperationFailed:
        return []
    lost = sorted(
        n for n, c in cluster.node_containers().items() if c.role == "worker" and c.running and n not in known
    )
    parallel(lambda n: reboot(cluster, n, "Slurm forgot it when the controller restarted", wait), lost)
    return lost


def wait_usable(cluster: Cluster, t: Target, cid: str, deadline: float, keep_drained: str | None = None) -> bool:
    """Wait until the node can be used: worker idle in Slurm (or registered drained with
    hp's own reason: `keep_drained`, or a group's on-start check), login/controller
    answering. False at the deadline or as soon as its container exits."""
    ours = {r for r in (keep_drained, ONSTART_REASON) if r}
    checks = 0
    resumed_at = 0.0

    def look() -> bool | None:  # True: usable, False: its container exited, None: not yet
        nonlocal checks, resumed_at
        if t.role == "controller" and cluster.slurm.ping():
            return True
        if t.role == "login" and cluster.slurm.ping_from(cid):
            return True
        if t.role == "worker":
            try:
                snode = next((n for n in cluster.slurm.nodes() if n.name == t.node), None)
            except OperationFailed:  # the controller may be restarting: unknown for now
                snode = None
            if snode is not None and snode.usable:
                return True
            if snode is not None and snode.drained_for(*ours) and not snode.not_responding:
                return True
            # Slurm keeps a FAIL (admin's Action:*) or DOWN node so until told: resume it
            # once slurmd answers again (no NOT_RESPONDING), at most every 2 s.
            if snode is not None and snode.needs_resume and time.monotonic() - resumed_at > RESUME_EVERY_S:
                resumed_at = time.monotonic()
                try:
                    cluster.slurm.resume([t.node])
                except OperationFailed:
                    pass  # the controller may be restarting: next round
        checks += 1
        if checks % 10 == 0 and not cluster.p.inspect(cid).state.running:
            return False
        return None

    return waits.poll(look, lambda r: r is not None, every=POLL_S, deadline=deadline) is True


def _forget(cluster: Cluster, t: Target, what: str) -> None:
    """Delete a worker's Slurm record before it comes back, so that it registers afresh
    (idle, no stale Action:* reason). Slurm refuses while the node holds jobs: their
    processes died with the container, but Slurm would wait for them for good (a job
    RUNNING past its end, or one COMPLETING on a node killed mid-completion). So the node
    is set DOWN first, which makes Slurm end or requeue them (NODE_FAIL), then deleted;
    if Slurm still refuses, the old record revives on registration (ReturnToService=2)
    and is resumed (wait_usable: REBOOTING_REASON is hp's). Each of those jobs gets hp's
    note of `what` it did to the node and why (job_note): an `srun --auto-resume` step
    that runs again says why its node was lost. A job whose batch host this was runs
    again (rerun_orphans)."""
    if t.role != "worker":
        return
    try:
        cluster.slurm.delete([t.node])
        rerun_orphans(cluster, {t.node: what})
        return
    except OperationFailed:
        pass
    try:
        jobs = cluster.slurm.jobs_on(t.node)  # before DOWN takes the node out of them
    except OperationFailed:
        jobs = []
    try:
        cluster.slurm.down([t.node], REBOOTING_REASON)
        if jobs:  # after DOWN, so that the steps on it end first; read once their srun ended
            try:
                cluster.slurm.note_jobs(jobs, job_note(t.node, what))
            except OperationFailed:
                pass  # a job without hp's note: its retry says the node was lost
        rerun_orphans(cluster, {t.node: what})
        cluster.slurm.delete([t.node])
    except OperationFailed:
        pass


def rerun_orphans(cluster: Cluster, why: dict[str, str]) -> list[int]:
    """The running jobs whose batch host is no longer one of their nodes (one hp takes,
    or one Slurm took by itself; `why`: what happened to which node): their script died with it, and a
    --no-kill job (what an `srun --auto-resume` script gets) would otherwise hold its
    other nodes for good with nothing running. Each is requeued (it runs again from the
    top of its script, its --auto-resume steps from their checkpoints) or, when Slurm
    refuses (--no-requeue), cancelled; hp's note on it and a Job event say which and why.
    Returns the jobs handled."""
    try:
        orphans = cluster.slurm.orphan_jobs()
    except OperationFailed:
        return []
    handled = []
    for o in orphans:
        lost = f"{why.get(o.batch_host, 'left the job')}; it was the job's batch host"
        try:
            if cluster.slurm.requeue(o.job_id):
                done, level = f"{lost}: {REQUEUED_NOTE}", "Warning"
            elif not cluster.slurm.requeueable(o.job_id):
                cluster.slurm.kill_job(o.job_id)
                done, level = f"{lost} and the job cannot be requeued (--no-requeue): it was cancelled", "Error"
            else:  # requeued meanwhile (another look of hp's, or Slurm): nothing more to do
                continue
            cluster.slurm.note_jobs([o.job_id], job_note(o.batch_host, done))
        except OperationFailed as e:  # the controller stopped answering: the next look finds it again
            done, level = f"{lost}: Slurm took neither hp's requeue nor its cancel ({str(e)[:200]})", "Error"
        handled.append(o.job_id)
        cluster.store.event(cluster.name, "Job", level, f"job {o.job_id}: {o.batch_host} {done}", node=o.batch_host)
    return handled


def _images(cluster: Cluster, t: Target) -> dict[str, str]:
    """hp's current node images; the old container's image where the current one is not built."""
    refs = cluster.images.refs(cluster.env.node_image_defs())
    key = cluster.p.node_image(t.role)
    if t.container is not None and not cluster.images.exists(refs.get(key, "")):
        refs[key] = t.container.image
    return refs


def _event(cluster: Cluster, t: Target, level: str, what: str, nid: str | None = None) -> None:
    """An Instance event; `nid` is the NodeId it is filed under (a replacement's new one)."""
    text = f"{t.label()} in cluster {cluster.name} {what}"
    cluster.store.event(cluster.name, "Instance", level, text, t.group, nid or t.node_id, t.node)
