"""What Slurm's states and reasons mean, and the parsers of its `--json` output (Slurm 24.11,
data_parser v0.0.42). Pure: nothing here runs a command.

The one place that knows Slurm's vocabulary: node base states and flags, which reasons
are Slurm's own, which are hp's (health checks, on-start checks, removal), which an
admin's; which job states are final.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import OperationFailed

# -- reasons --------------------------------------------------------------------------
# Every reason hp sets on a node (drain, down) starts with REASON_PREFIX, so that
# `is_ours` tells hp's from an admin's (as Slinky's slurm-operator asks IsNodeReasonOurs).
REASON_PREFIX = "hp:"
HEALTH_PREFIX = f"{REASON_PREFIX}health:"  # deep health checks: hp:health:<request>:<check>[ failed: why]
ONSTART_REASON = f"{HEALTH_PREFIX}on-start:pending"  # new nodes of groups with on-start checks register drained so
# hp's passive GPU monitor drains with hp:gpu:<action>:<finding code> <message> (gpu/monitor.py)
GPU_MONITOR_PREFIX = f"{REASON_PREFIX}gpu:"
REMOVING_REASON = f"{REASON_PREFIX} removing node"  # scale-down / delete-nodes drain
# a worker rebooted or replaced while Slurm still had jobs on it: set DOWN so that Slurm
# ends them (their processes died with the container) instead of waiting for them forever
REBOOTING_REASON = f"{REASON_PREFIX} node rebooted, its jobs ended"
DELETING_REASON = f"{REASON_PREFIX} cluster being deleted"  # the whole cluster goes
# What the version before one prefix wrote (a cluster it created may still carry them):
# read as the reason each became, so that an upgrade does not turn hp's drains into an admin's.
PREVIOUS_REASONS = {"hp-health:": HEALTH_PREFIX, "hp-gpu:": GPU_MONITOR_PREFIX}
PREVIOUS_DELETING_REASON = "hp delete"
# `srun --auto-resume` (images/node/hp_auto_resume.c): hp notes on each job what it did
# to a node the job held (AdminComment "hp: <node> <what>"); the plugin grows a job that
# lost a node back with a job of this name, whose comment says what it retries.
JOB_NOTE_PREFIX = "hp: "
AUTO_RESUME_JOB = "hp-auto-resume"
AUTO_RESUME_COMMENT = "hp-auto-resume "
ACTION_REBOOT = "Action:Reboot"  # an admin's recovery requests (HyperPod's convention)
ACTION_REPLACE = "Action:Replace"
# Reasons Slurm itself sets on a node that stops answering or comes back unasked.
SLURM_OWN_REASONS = ("Not responding", "Node unexpectedly rebooted")
# Reasons hp may clear with `state=resume` once the node answers again: the admin's
# recovery requests and Slurm's own verdicts. Any other reason is someone's.
RESUMABLE_REASONS = (ACTION_REBOOT, ACTION_REPLACE, REBOOTING_REASON, *SLURM_OWN_REASONS)

# -- node states and job states ---------------------------------------------------------
IDLE = "IDLE"
DOWN = "DOWN"
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED"})
# an IDLE node with any of these takes no job (SlurmNode.usable; the bench floor's count)
NOT_USABLE_FLAGS = DRAIN_FLAGS | {"NOT_RESPONDING", "FAIL", "MAINTENANCE"}
COMPLETED = "COMPLETED"
JOB_ENDED = frozenset(
    {COMPLETED, "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
BUSY_STATES = ("ALLOCATED", "MIXED", "COMPLETING")


def current_reason(reason: str) -> str:
    """A reason as this version writes it: one written by the previous version (hp-health:,
    hp-gpu:, "hp delete") is read as the one it became; any other is as it is."""
    if reason == PREVIOUS_DELETING_REASON:
        return DELETING_REASON
    for old, new in PREVIOUS_REASONS.items():
        if reason.startswith(old):
            return new + reason[len(old) :]
    return reason


def is_ours(reason: str) -> bool:
    """The reason is hp's own (a drain or down hp set), not an admin's nor Slurm's."""
    return current_reason(reason).startswith(REASON_PREFIX)


def health_reason(request: str, check: str, why: str = "") -> str:
    """The drain reason of a deep health check: names the request and the check."""
    r = f"{HEALTH_PREFIX}{request}:{check}"
    return f"{r} failed: {why}"[:200] if why else r


def is_health_reason(reason: str, request: str | None = None) -> bool:
    """hp's own health-check drain (of `request`, or of any request and the on-start one)."""
    return current_reason(reason).startswith(f"{HEALTH_PREFIX}{request}:" if request else HEALTH_PREFIX)


def is_gpu_monitor_reason(reason: str) -> bool:
    """A drain of hp's passive GPU monitor (a GPU finding on the node)."""
    return current_reason(reason).startswith(GPU_MONITOR_PREFIX)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: tuple[str, ...]  # e.g. ("IDLE", "DYNAMIC_NORM"), ("IDLE", "DRAIN")
    reason: str = ""
    features: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    address: str = ""

    @property
    def base(self) -> str:
        """The base state: IDLE, ALLOCATED, MIXED, DOWN, FUTURE, UNKNOWN..."""
        return self.state[0] if self.state else "UNKNOWN"

    @property
    def idle(self) -> bool:
        """Running no job (drained or not)."""
        return self.base == IDLE

    @property
    def flags(self) -> set[str]:
        return set(self.state[1:])

    @property
    def drained(self) -> bool:
        return bool(DRAIN_FLAGS & self.flags)

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.flags or self.base == DOWN

    @property
    def usable(self) -> bool:
        """Idle and able to take jobs."""
        return self.idle and not (NOT_USABLE_FLAGS & self.flags)

    @property
    def busy(self) -> bool:
        """Running (or finishing) jobs."""
        return self.base in BUSY_STATES

    @property
    def emptied(self) -> bool:
        """Running nothing and finishing nothing (no COMPLETING flag either)."""
        return self.idle and "COMPLETING" not in self.flags

    @property
    def idle_drained(self) -> bool:
        """Drained and running nothing (IDLE+DRAIN, not MIXED/ALLOCATED+DRAIN)."""
        return self.idle and self.drained

    @property
    def held(self) -> bool:
        """Kept out of service: down, failed or drained."""
        return self.base == DOWN or bool({"FAIL", "DRAIN"} & self.flags)

    @property
    def awaiting_onstart(self) -> bool:
        """Registered drained, waiting for its on-start deep health checks."""
        return self.drained_for(ONSTART_REASON)

    @property
    def failed_health_check(self) -> bool:
        """Kept drained by hp after failing a deep health check."""
        return self.drained and is_health_reason(self.reason) and " failed" in self.reason

    @property
    def gpu_finding(self) -> bool:
        """Drained by hp's passive GPU monitor; the monitor acts on it (reboot or
        replace when its jobs end), recovery's table does not."""
        return self.drained and is_gpu_monitor_reason(self.reason)

    @property
    def admin_hold(self) -> bool:
        """Drained/down/failed by someone for a reason of their own (not Slurm's, not hp's)."""
        return (
            self.held
            and bool(self.reason)
            and not self.reason.startswith(SLURM_OWN_REASONS)
            and not is_ours(self.reason)
        )

    def drained_for(self, *reasons: str) -> bool:
        """Drained with one of hp's `reasons` (exactly)."""
        return self.drained and current_reason(self.reason) in reasons

    @property
    def needs_resume(self) -> bool:
        """Answers, but Slurm keeps it out of service for a reason hp may clear."""
        return self.held and "NOT_RESPONDING" not in self.flags and self.reason.startswith(RESUMABLE_REASONS)

    def condition(self) -> str:
        """Slurm's view of the node, in the words of the recovery rules:
        action_replace | action_reboot | admin_hold | not_responding | unanswered | ok.

        not_responding is Slurm's verdict: DOWN, once slurmd missed its pings for
        SlurmdTimeout. The NOT_RESPONDING flag alone (`unanswered`) is one missed ping, and
        every node carries it for a while after slurmctld restarts (hp upgrade, a reboot of
        the controller): a node still running its jobs."""
        # Slurm keeps the reason after a resume: only a node still held is asking for action.
        if self.held and self.reason.startswith(ACTION_REPLACE):
            return "action_replace"
        if self.held and self.reason.startswith(ACTION_REBOOT):
            return "action_reboot"
        if self.admin_hold:
            return "admin_hold"
        if self.base == DOWN:
            return "not_responding"
        if "NOT_RESPONDING" in self.flags:
            return "unanswered"
        return "ok"

    @property
    def display(self) -> str:
        """sinfo-like compact state, e.g. idle, alloc, drain, idle+drain."""
        s = self.base.lower()
        extra = [f.lower() for f in self.state[1:] if f not in ("DYNAMIC_NORM",)]
        return "+".join([s, *extra])


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    state: str
    nodes: str
    exit_code: int | None = None

    @property
    def ended(self) -> bool:
        return self.state in JOB_ENDED

    @property
    def completed(self) -> bool:
        """Ended by itself (whatever its exit code), not cancelled, failed by Slurm..."""
        return self.state == COMPLETED

    def ci_exit_code(self) -> int:
        """The exit code a CI step gets: the script's own; 1 when Slurm ended the job
        another way (cancelled, node failure, time limit...) and left a 0 behind."""
        if self.completed:
            return self.exit_code or 0
        return self.exit_code or 1


# -- accounting and tokens -------------------------------------------------------------
DB_UNREACHABLE = "Unable to connect to database"  # slurmdbd answers, its database does not


@dataclass(frozen=True)
class AccountingPing:
    """`sacctmgr ping` from the controller: slurmdbd answered UP; or not, and whether it
    said its database is unreachable, or did not answer at all (timed out)."""

    up: bool
    db_unreachable: bool
    timed_out: bool
    message: str


def parse_accounting_ping(exit_code: int, output: str) -> AccountingPing:
    text = output.strip()
    up = exit_code == 0 and " is UP" in text
    last = text.splitlines()[-1] if text else ""
    msg = "slurmdbd answers" if up else (last or f"no answer (exit {exit_code})")
    return AccountingPing(up, not up and DB_UNREACHABLE in text, exit_code == 124, msg[:300])


@dataclass(frozen=True)
class AcctJob:
    """A job's record in accounting (sacct): its final state and exit code (code:signal)."""

    job_id: str
    state: str
    exit_code: str


def parse_sacct(text: str) -> list[AcctJob]:
    """`sacct -n -X -P -o JobID,State,ExitCode` lines."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0]:
            out.append(AcctJob(parts[0], parts[1].split(" ")[0], parts[2]))
    return out


REQUEUED_NOTE = "the job was requeued and runs again from the top of its script"  # hp's note (rerun_orphans)


def job_note(node: str, what: str) -> str:
    """hp's note on a job that held `node` when hp took it (`what`: "rebooted: <why>")."""
    return f"{JOB_NOTE_PREFIX}{node} {what}"[:1000]


def parse_job_ids(text: str) -> list[int]:
    """`squeue -h -o %A` lines."""
    return [int(x) for x in text.split() if x.isdigit()]


@dataclass(frozen=True)
class OrphanJob:
    """A running batch job whose batch host is no longer one of its nodes: its script
    died with that node, and Slurm keeps a --no-kill job running on the others."""

    job_id: int
    batch_host: str


def expand_hostlist(text: str) -> list[str]:
    """A Slurm hostlist (`cpu-[1,3-4],login-1`) as names, in order; zero padding kept."""
    names: list[str] = []
    depth, start = 0, 0
    parts = []
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in (p.strip() for p in parts):
        head, sep, rest = part.partition("[")
        if not sep:
            if part and part != "(null)":
                names.append(part)
            continue
        ranges, _, tail = rest.partition("]")
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                continue
            for n in range(int(lo), int(hi or lo) + 1):
                names.extend(f"{head}{str(n).zfill(len(lo))}{suffix}" for suffix in expand_hostlist(tail) or [""])
    return names


def parse_held_requeued(pending: str) -> list[int]:
    """`squeue -h -t PD -o %i|%r` lines: the jobs Slurm holds until a begin time (the
    hold it gives a requeued job: cred_expire + 1 s)."""
    return [
        int(i)
        for i, _, r in (ln.strip().partition("|") for ln in pending.splitlines())
        if i.isdigit() and r == "BeginTime"
    ]


def requeued_by_hp(show_job: str) -> bool:
    """`scontrol show job -o` text: a job that ran before and was requeued after hp took
    one of its nodes (hp's note on it: hp requeued it when its batch host was lost)."""
    return show_job.partition(" AdminComment=")[2].startswith(JOB_NOTE_PREFIX) and " Restarts=0 " not in show_job


def parse_orphans(text: str) -> list[OrphanJob]:
    """`squeue -h -o %A|%B|%N` lines: the jobs whose batch host is not among their nodes."""
    out = []
    for line in text.splitlines():
        f = line.strip().split("|")
        if len(f) == 3 and f[0].isdigit() and f[1] and f[1] != "(null)" and f[1] not in expand_hostlist(f[2]):
            out.append(OrphanJob(int(f[0]), f[1]))
    return out


@dataclass(frozen=True)
class AutoResumeRetry:
    """One retry of an `srun --auto-resume` step: the job that grew its job back (its id)
    and what the plugin wrote in its comment (job, step, lost nodes, attempt, why)."""

    job_id: int
    what: str

    def describe(self) -> str:
        return f"srun --auto-resume: {self.what} (job {self.job_id} grew it back)"

    @property
    def resumed_job(self) -> int | None:
        """The job whose step was retried (the plugin's `job=N`)."""
        head = self.what.partition(" ")[0]
        return int(head[4:]) if head.startswith("job=") and head[4:].isdigit() else None


def parse_auto_resume(text: str) -> list[AutoResumeRetry]:
    """`squeue -h -t all -n hp-auto-resume -o %i|%k` lines; comments not the plugin's are skipped."""
    out = []
    for line in text.splitlines():
        jid, _, comment = line.strip().partition("|")
        if jid.isdigit() and comment.startswith(AUTO_RESUME_COMMENT):
            out.append(AutoResumeRetry(int(jid), comment[len(AUTO_RESUME_COMMENT) :].strip()))
    return out


def parse_token(text: str) -> str:
    """`scontrol token` prints SLURM_JWT=<token>."""
    for line in text.splitlines():
        if line.startswith("SLURM_JWT="):
            return line.split("=", 1)[1].strip()
    raise OperationFailed(f"no token in Slurm's answer: {text.strip()[:200]!r}")


def parse_job_states(text: str) -> dict[tuple[str, str], int]:
    """`squeue -h -o %T|%P` lines -> (state, partition) -> number of jobs."""
    out: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        state, _, part = line.strip().partition("|")
        if state:
            out[(state, part)] = out.get((state, part), 0) + 1
    return out


def parse_nodes(text: str) -> list[SlurmNode]:
    """Parse `scontrol show nodes --json`."""
    doc = _load(text)
    out = []
    for n in _list(doc, "nodes"):
        feats = n.get("features") or []
        if isinstance(feats, str):
            feats = [f for f in feats.split(",") if f]
        name = n.get("name")
        if not isinstance(name, str):
            raise OperationFailed(f"unexpected node record from Slurm: {str(n)[:200]}")
        out.append(
            SlurmNode(
                name=name,
                state=tuple(str(s) for s in (n.get("state") or ())),
                reason=str(n.get("reason") or ""),
                features=tuple(str(f) for f in feats),
                partitions=tuple(str(p) for p in (n.get("partitions") or ())),
                address=str(n.get("address") or ""),
            )
        )
    return out


def parse_jobs(text: str) -> list[JobInfo]:
    """Parse `scontrol show job --json` / `squeue --json`."""
    doc = _load(text)
    out = []
    for j in _list(doc, "jobs"):
        st = j.get("job_state") or ["UNKNOWN"]
        ec = j.get("exit_code") or {}
        rc = ec.get("return_code", {}) if isinstance(ec, dict) else {}
        code = rc.get("number") if isinstance(rc, dict) and rc.get("set") else None
        try:
            job_id = int(j["job_id"])
        except (KeyError, TypeError, ValueError):
            raise OperationFailed(f"unexpected job record from Slurm: {str(j)[:200]}") from None
        out.append(
            JobInfo(
                job_id=job_id,
                state=str(st[0] if isinstance(st, list) and st else st),
                nodes=str(j.get("nodes") or ""),
                exit_code=int(code) if isinstance(code, int) else None,
            )
        )
    return out


def _list(doc: dict, key: str) -> list[dict]:
    items = doc.get(key) or []
    if not isinstance(items, list):
        raise OperationFailed(f"unexpected output from Slurm: {key} is not a list")
    return [i for i in items if isinstance(i, dict)]


def _load(text: str) -> dict:
    """The JSON document of a Slurm command (anything before its first '{' is skipped);
    Slurm's own errors as OperationFailed."""
    try:
        doc = json.loads(text[text.index("{") :])
    except ValueError:
        raise OperationFailed(f"unexpected output from Slurm: {text[:300]!r}") from None
    if not isinstance(doc, dict):
        raise OperationFailed(f"unexpected output from Slurm: {text[:300]!r}")
    errs = [e.get("description") or e.get("error") for e in doc.get("errors") or [] if isinstance(e, dict)]
    if errs and not doc.get("nodes") and not doc.get("jobs"):
        raise OperationFailed("Slurm: " + "; ".join(str(e) for e in errs))
    return doc
