"""Recovery decisions, as data: what to do for which observed fact (`RULES`), when not to
act on an observation (`guard`), and the one escalation policy (`escalation`: reboot,
re-check, replace) that recovery, the deep health checks and the GPU watch all follow,
decided from the node's recorded history (`rebooted_for`). Pure; the callers observe and act."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..slurm.model import SlurmNode
from ..state.phases import NodePhase, Owner, Phase, owner_of
from ..verdict import Action

ANY = "*"
LOST_AFTER_S = 15.0  # a running worker unknown to Slurm this long is lost (registration takes ~0.5 s)
BACKOFF_S = (30.0, 60.0, 120.0, 300.0)  # after a failed recovery, before trying that node again

# -- observed facts ------------------------------------------------------------------
# Container: running | died (exited/dead) | paused (frozen) | starting (created/restarting/removing) | missing
# Slurm:     ok | absent (no record) | lost (no record for LOST_AFTER_S) | action_reboot | action_replace
#            | admin_hold | not_responding (DOWN) | unanswered (the flag alone)
#            (SlurmNode.condition gives all but absent/lost)

# (role, container, slurm) -> (action, only when NodeRecovery is Automatic). First match wins.
RULES: tuple[tuple[tuple[str, str, str], tuple[Action, bool]], ...] = (
    # An admin asked through Slurm (state=fail reason=Action:...): an explicit request,
    # honoured whatever NodeRecovery says.
    ((ANY, ANY, "action_replace"), (Action.REPLACE, False)),
    ((ANY, ANY, "action_reboot"), (Action.REBOOT, False)),
    # Drained/down/failed by someone for a reason of their own: theirs to handle.
    ((ANY, ANY, "admin_hold"), (Action.NONE, False)),
    # No container: removed on purpose (scale-down, delete) or by someone; not a fault
    # hp observed. Provisioning restores counts, not recovery.
    ((ANY, "missing", ANY), (Action.NONE, False)),
    # Being created or restarted right now: wait for the outcome.
    ((ANY, "starting", ANY), (Action.NONE, False)),
    # The controller's state is on a named volume: restart it, never replace it.
    (("controller", "died", ANY), (Action.REBOOT, True)),
    (("controller", "paused", ANY), (Action.REBOOT, True)),
    # A frozen node (docker pause, a stuck cgroup freezer) answers nothing: reboot, then replace.
    ((ANY, "paused", ANY), (Action.RECOVER, True)),
    # A worker or login container died (killed, OOM, slurmd/sackd exited): reboot, then replace.
    ((ANY, "died", ANY), (Action.RECOVER, True)),
    # The container runs but Slurm says slurmd stopped answering: DOWN after SlurmdTimeout.
    (("worker", "running", "not_responding"), (Action.RECOVER, True)),
    # A missed ping (NOT_RESPONDING without DOWN; every node's state for a while after
    # slurmctld restarts): not a fault yet, Slurm decides within SlurmdTimeout.
    ((ANY, ANY, "unanswered"), (Action.NONE, False)),
    # The container runs but Slurm has had no record of it for LOST_AFTER_S: a controller
    # restart forgot it (state not saved), and slurmd only registers when it starts.
    (("worker", "running", "lost"), (Action.RECOVER, True)),
    # Everything else is healthy, or not hp's to judge.
    ((ANY, ANY, ANY), (Action.NONE, False)),
)


def decide(role: str, container: str, slurm: str, automatic: bool) -> Action:
    """The action for a node's observed facts (see RULES)."""
    for (r, c, s), (action, needs_auto) in RULES:
        if r in (ANY, role) and c in (ANY, container) and s in (ANY, slurm):
            return Action.NONE if needs_auto and not automatic else action
    return Action.NONE  # pragma: no cover - the last rule matches everything


def escalation(action: Action, rebooted: bool, replaceable: bool = True) -> Action:
    """The one escalation policy: the step to take now (REBOOT, REPLACE or NONE) for a node
    whose fault calls for `action`, given whether it was already rebooted for that fault
    (`rebooted`: its re-check still found it; read from the history, `rebooted_for`).
    RECOVER reboots first and replaces once a reboot did not help; a node that cannot be
    replaced (the controller: its state lives on its volume) is then kept as it is. REBOOT
    and REPLACE are that step; NONE and MONITOR touch nothing."""
    if action is Action.RECOVER:
        return Action.REBOOT if not rebooted else (Action.REPLACE if replaceable else Action.NONE)
    return action if action in (Action.REBOOT, Action.REPLACE) else Action.NONE


# A new container for the node: what a reboot before it was for is history of another one.
NEW_CONTAINER = frozenset({Phase.QUEUED, Phase.LAUNCHING, Phase.REPLACING})


def rebooted_for(history: Sequence[NodePhase], fault: str) -> bool:
    """Whether the node was rebooted for `fault` (words its reboot's reason holds) since its
    container was made, from its recorded phases, oldest first (Store.node_history): the
    escalation survives an agent restart."""
    for rec in reversed(history):
        if rec.phase is Phase.REBOOTING and fault in rec.message:
            return True
        if rec.phase in NEW_CONTAINER:
            return False
    return False


def container_condition(state: str | None) -> str:
    """Docker's container state, as the table reads it."""
    if state is None:
        return "missing"
    return {"running": "running", "exited": "died", "dead": "died", "paused": "paused"}.get(state, "starting")


def slurm_condition(n: SlurmNode | None) -> str:
    """Slurm's view of a node, as the table reads it (absent: no record)."""
    return "absent" if n is None else n.condition()


@dataclass(frozen=True)
class Seen:
    """One node as observed at `at` (wall clock), with the reason words for events."""

    node: str
    role: str
    container: str
    slurm: str
    at: float
    why: str


def guard(seen: Seen, recorded: NodePhase | None, last_done: float, now: float) -> str | None:
    """Why not to act on an observation (None: go ahead; that no action on it runs and that a
    failed one backs off, the runtime sees to: the node's key). Pure."""
    if seen.at < last_done:
        return "observed before the last action on it ended"
    if recorded is not None:
        if recorded.time > seen.at:
            return "its status changed after the observation"
        o = owner_of(recorded, now)
        if o is Owner.RECOVERY and recorded.time <= last_done:
            pass  # written by this watcher's own action, which has ended (failed): not an owner any more
        elif o is not Owner.NONE:
            return f"it is {recorded.phase} (owned by {o.value})"
    return None


def describe_fact(seen_container: str, snode: SlurmNode | None, exit_code: int | None, oom: bool) -> str:
    """Words for the event: why hp acts."""
    if snode is not None and snode.condition() in ("action_reboot", "action_replace"):
        return f"requested through Slurm ({snode.reason})"
    if seen_container == "died":
        extra = " (out of memory)" if oom else ""
        return f"container died (exit {exit_code if exit_code is not None else '?'}){extra}"
    if seen_container == "paused":
        return "container frozen (paused)"
    if snode is not None:
        return f"Slurm reports {snode.display}" + (f": {snode.reason}" if snode.reason else "")
    return "node failed"
