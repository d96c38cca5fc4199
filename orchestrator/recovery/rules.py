"""Recovery decisions, as data: what to do for which observed fact (`RULES`), and when
not to act on an observation (`guard`). Pure; the watcher observes and acts."""

from __future__ import annotations

from dataclasses import dataclass

from ..slurm.model import SlurmNode
from ..state.phases import Owner, owner

NONE = "none"
REBOOT = "reboot"
REPLACE = "replace"
RECOVER = "recover"  # reboot, then replace if it does not come back

ANY = "*"
LOST_AFTER_S = 15.0  # a running worker unknown to Slurm this long is lost (registration takes ~0.5 s)
BACKOFF_S = (30.0, 60.0, 120.0, 300.0)  # after a failed recovery, before trying that node again

# -- observed facts ------------------------------------------------------------------
# Container: running | died (exited/dead) | paused (frozen) | starting (created/restarting/removing) | missing
# Slurm:     ok | absent (no record) | lost (no record for LOST_AFTER_S) | action_reboot | action_replace
#            | admin_hold | not_responding   (SlurmNode.condition gives all but absent/lost)

# (role, container, slurm) -> (action, only when NodeRecovery is Automatic). First match wins.
RULES: tuple[tuple[tuple[str, str, str], tuple[str, bool]], ...] = (
    # An admin asked through Slurm (state=fail reason=Action:...): an explicit request,
    # honoured whatever NodeRecovery says.
    ((ANY, ANY, "action_replace"), (REPLACE, False)),
    ((ANY, ANY, "action_reboot"), (REBOOT, False)),
    # Drained/down/failed by someone for a reason of their own: theirs to handle.
    ((ANY, ANY, "admin_hold"), (NONE, False)),
    # No container: removed on purpose (scale-down, delete) or by someone; not a fault
    # hp observed. Provisioning restores counts, not recovery.
    ((ANY, "missing", ANY), (NONE, False)),
    # Being created or restarted right now: wait for the outcome.
    ((ANY, "starting", ANY), (NONE, False)),
    # The controller's state is on a named volume: restart it, never replace it.
    (("controller", "died", ANY), (REBOOT, True)),
    (("controller", "paused", ANY), (REBOOT, True)),
    # A frozen node (docker pause, a stuck cgroup freezer) answers nothing: reboot, then replace.
    ((ANY, "paused", ANY), (RECOVER, True)),
    # A worker or login container died (killed, OOM, slurmd/sackd exited): reboot, then replace.
    ((ANY, "died", ANY), (RECOVER, True)),
    # The container runs but Slurm says slurmd stopped answering (DOWN / NOT_RESPONDING).
    (("worker", "running", "not_responding"), (RECOVER, True)),
    # The container runs but Slurm has had no record of it for LOST_AFTER_S: a controller
    # restart forgot it (state not saved), and slurmd only registers when it starts.
    (("worker", "running", "lost"), (RECOVER, True)),
    # Everything else is healthy, or not hp's to judge.
    ((ANY, ANY, ANY), (NONE, False)),
)


def decide(role: str, container: str, slurm: str, automatic: bool) -> str:
    """The action for a node's observed facts (see RULES)."""
    for (r, c, s), (action, needs_auto) in RULES:
        if r in (ANY, role) and c in (ANY, container) and s in (ANY, slurm):
            return NONE if needs_auto and not automatic else action
    return NONE  # pragma: no cover - the last rule matches everything


def container_condition(state: str | None) -> str:
    """Docker's container state, as the table reads it."""
    if state is None:
        return "missing"
    if state == "running":
        return "running"
    if state in ("exited", "dead"):
        return "died"
    if state == "paused":
        return "paused"
    return "starting"


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


def guard(
    seen: Seen, recorded: tuple[str, str, float] | None, busy: bool, last_done: float, retry_at: float, now: float
) -> str | None:
    """Why not to act on an observation (None: go ahead). Pure."""
    if busy:
        return "an action on it is in progress here"
    if seen.at < last_done:
        return "observed before the last action on it ended"
    if now < retry_at:
        return "backing off after a failed recovery"
    if recorded is not None:
        phase, _, t = recorded
        if t > seen.at:
            return "its status changed after the observation"
        o = owner(phase, t, now)
        if o is Owner.RECOVERY and t <= last_done:
            pass  # written by this watcher's own action, which has ended (failed): not an owner any more
        elif o is not Owner.NONE:
            return f"it is {phase} (owned by {o.value})"
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
