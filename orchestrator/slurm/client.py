"""Talk to Slurm: its commands (with `--json` where they have it), run inside the
cluster's containers through the provider.

The only module that runs Slurm commands, so that pyslurm can replace it once a
distribution ships the Slurm it compiles against. `Slurm` is the interface (a
Protocol: the orchestration is unit-tested against an in-memory fake, tests/fakes.py),
`SlurmCli` its implementation.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .. import waits
from ..docker.provider import Provider
from ..docker.views import LOCAL_ENGINE
from ..errors import EngineError, OperationFailed
from ..naming import L_SLURM_RELEASE
from ..releases import RELEASES, SlurmRelease
from .model import (
    AUTO_RESUME_JOB,
    AccountingPing,
    AcctJob,
    AutoResumeRetry,
    JobInfo,
    OrphanJob,
    SlurmNode,
    parse_accounting_ping,
    parse_auto_resume,
    parse_held_requeued,
    parse_job_ids,
    parse_job_states,
    parse_jobs,
    parse_nodes,
    parse_orphans,
    parse_sacct,
    parse_token,
    requeued_by_hp,
)


@runtime_checkable
class Slurm(Protocol):
    def ping(self) -> bool:
        """Does slurmctld answer? (False, never an error, when it or its container is down.)"""

    def ping_from(self, container: str) -> bool:
        """Does slurmctld answer from this node (a login node's sackd configuration)?"""

    def nodes(self) -> list[SlurmNode]:
        """Every node slurmctld knows. OperationFailed when it does not answer."""

    def node_digest(self) -> str:
        """A cheap look at every node's name, full state and reason: when two are equal, so
        are those of `nodes` (partitions, features and addresses aside)."""

    def job(self, job_id: int) -> JobInfo | None:
        """One job, also one that ended in the last MinJobAge seconds; None if unknown."""

    def drain(self, nodes: list[str], reason: str) -> None: ...

    def resume(self, nodes: list[str]) -> None: ...

    def down(self, nodes: list[str], reason: str) -> None:
        """Set nodes DOWN: Slurm ends (or requeues) the jobs it has on them."""

    def delete(self, nodes: list[str]) -> None:
        """Remove dynamic nodes' records (Slurm refuses while they hold jobs)."""

    def jobs_on(self, node: str) -> list[int]:
        """The jobs a node holds."""

    def note_jobs(self, jobs: list[int], note: str) -> None:
        """Write hp's `note` (model.job_note) on the jobs (their AdminComment)."""

    def orphan_jobs(self) -> list[OrphanJob]:
        """The running batch jobs whose batch host is no longer one of their nodes (a
        --no-kill job keeps running when Slurm takes a node out of it, its batch host too)."""

    def requeue(self, job_id: int) -> bool:
        """End a running job and queue it again; it starts again from the top of its
        script as soon as nodes are free. False when Slurm refuses."""

    def requeueable(self, job_id: int) -> bool:
        """Does Slurm requeue the job when asked (not --no-requeue)? True for a job it no
        longer knows (nothing to cancel)."""

    def kill_job(self, job_id: int) -> None:
        """Cancel a job as the administrator."""

    def release_requeued(self, resumed: set[int]) -> list[int]:
        """Start now the requeued jobs that Slurm holds until a begin time (cred_expire +
        1 s, 121 s by default, set once the requeue ended): those hp requeued, and those
        `resumed` (an `srun --auto-resume` of theirs grew them back: one whose step could
        not start then requeues itself). Their ids."""

    def auto_resume_retries(self) -> list[AutoResumeRetry]:
        """The retries of `srun --auto-resume` steps slurmctld still knows (MinJobAge)."""

    def shutdown_controller(self) -> None:
        """`scontrol shutdown slurmctld`: slurmctld saves its state and exits (the nodes'
        slurmd go on)."""

    def reconfigure(self) -> None:
        """`scontrol reconfigure`: slurmctld reads its files again (gres.conf, which
        configless ships to slurmds) and answers again before this returns."""

    def submit(
        self, container: str, script: str, output: str, args: list[str], user: str, workdir: str, env: dict[str, str]
    ) -> tuple[int | None, str]:
        """sbatch a script on a node as `user`: (job id or None, sbatch's output)."""

    def cancel(self, container: str, job_id: int, user: str) -> None: ...

    def show_node(self, node: str) -> str:
        """`scontrol show node` text, for logs."""

    def overview(self) -> dict[str, str]:
        """`sinfo -N -l` and `squeue -a -l` texts, for logs."""

    def job_states(self) -> dict[tuple[str, str], int]:
        """Jobs slurmctld knows (also those that ended in the last MinJobAge seconds), by
        (state, partition). OperationFailed when it does not answer."""

    def accounting_ping(self) -> AccountingPing:
        """Does slurmdbd answer the controller (within 2 s), and is its database reachable?"""

    def sacct(self, job_ids: list[int], container: str | None = None) -> list[AcctJob]:
        """Jobs' records in accounting (state, exit code), from the controller or `container`."""

    def clusters(self) -> list[str]:
        """The clusters registered in accounting (as Slurm names them: lower case)."""

    def token(self, user: str, lifespan: int) -> str:
        """A JWT for `user`, valid `lifespan` seconds (needs AuthAltTypes=auth/jwt)."""


# Every Slurm command runs under coreutils' timeout: a slurmctld that hangs (stuck at
# start, a frozen container) makes a command fail, never block hp (its agent) forever.
COMMAND_TIMEOUT_S = 30
PING_TIMEOUT_S = 10
TIMED_OUT = 124  # timeout(1)'s exit status when the command ran out of time
# slurmctld 25.11+ answers HTTP on its RPC port: GET /readyz is 204 (200 with a body) once
# it services RPCs, 500 before (src/slurmctld/http.c). hp's slurm.conf keeps the default port.
SLURMCTLD_PORT = 6817
READYZ_TIMEOUT_S = 2.0
REQUEUE_START_S = 1  # a job hp requeued starts again this many seconds on (release_requeued)  # timeout(1)'s exit status when the command ran out of time


def bounded(cmd: list[str], seconds: int = COMMAND_TIMEOUT_S) -> list[str]:
    """`cmd` under timeout(1): TERM after `seconds`, KILL 2 s later."""
    return ["timeout", "-k", "2", str(seconds), *cmd]


class SlurmCli:
    """Slurm operations, run in the controller container (or the node given)."""

    def __init__(self, provider: Provider, controller: str):
        self.p = provider
        self.controller = controller
        self._readyz: tuple[str, int] | None = None  # slurmctld's address, once looked up
        self._readyz_off = False  # it does not answer there from this process: exec only
        self._unreached = False  # the last GET timed out or had no route (not refused: slurmctld starting)

    def _run(self, *args: str) -> str:
        try:
            res = self.p.exec(self.controller, bounded(list(args)))
        except EngineError as e:  # e.g. the controller's container is not running
            raise OperationFailed(f"{args[0]}: {e}") from None
        if res.exit_code == TIMED_OUT:
            raise OperationFailed(f"{' '.join(args)} did not answer within {COMMAND_TIMEOUT_S} s")
        if res.exit_code != 0:
            raise OperationFailed(f"{' '.join(args)} failed ({res.exit_code}): {res.output.strip()[:500]}")
        return res.output

    def ping(self) -> bool:
        """GET /readyz on slurmctld's address where its release serves it and this process
        reaches the container (one local engine): 2 ms and ~5 ms of CPU against the exec's
        90 ms and ~69 ms (docs/slurm-releases.md). Otherwise, or when it does not answer,
        `scontrol ping` by exec decides; when the exec finds slurmctld up, the address does
        not reach it from here (a remote engine) and this client execs from then on."""
        if self._ready_over_http():
            return True
        up = self.ping_from(self.controller)
        if up and self._unreached:
            self._readyz_off = True
        self._readyz, self._unreached = None, False  # looked up again: a replaced container has another address
        return up

    def _ready_over_http(self) -> bool:
        if self._readyz_off:
            return False
        if self._readyz is None:
            try:
                d = self.p.inspect(self.controller)
            except EngineError:
                return False
            label = d.labels.get(L_SLURM_RELEASE, "")
            remote = d.host != LOCAL_ENGINE  # a registered host: the overlay's addresses are not routed here
            if remote:
                self._readyz_off = True
            if remote or label not in set(SlurmRelease) or not RELEASES[SlurmRelease(label)].readyz or not d.addresses:
                return False  # the release is read again at the next ping: an upgrade replaces the controller
            self._readyz = (next(iter(d.addresses.values())), SLURMCTLD_PORT)
        import http.client  # here: it loads ssl and email, ~15 ms of each command with a Slurm client

        conn = http.client.HTTPConnection(*self._readyz, timeout=READYZ_TIMEOUT_S)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status in (200, 204)
        except (ConnectionError, http.client.HTTPException):  # refused or reset: not (yet) listening
            return False
        except OSError:  # timed out, no route: perhaps not reachable from here
            self._unreached = True
            return False
        finally:
            conn.close()

    def ping_from(self, container: str) -> bool:
        try:
            return self.p.exec(container, bounded(["scontrol", "ping"], PING_TIMEOUT_S)).exit_code == 0
        except EngineError:  # the container is not running
            return False

    def nodes(self) -> list[SlurmNode]:
        return parse_nodes(self._run("scontrol", "show", "nodes", "--json"))

    def node_digest(self) -> str:
        # sinfo's line a node and partition, every field whole (width 0): 10 KB at 160 nodes
        # where `nodes`' JSON is 416 KB, whose parse was half of an idle agent's CPU there
        return self._run("sinfo", "-h", "-N", "-O", "NodeList:0|,StateComplete:0|,Reason:0|")

    def job(self, job_id: int) -> JobInfo | None:
        try:
            res = self.p.exec(self.controller, bounded(["scontrol", "show", "job", "--json", str(int(job_id))]))
        except EngineError as e:
            raise OperationFailed(f"scontrol show job: {e}") from None
        return next(iter(parse_jobs(res.output)), None) if res.exit_code == 0 else None

    def _update(self, nodes: list[str], state: str, reason: str | None = None) -> None:
        if not nodes:
            return
        args = ["scontrol", "update", f"nodename={','.join(nodes)}", f"state={state}"]
        if reason is not None:
            args.append(f"reason={reason}")
        self._run(*args)

    def drain(self, nodes: list[str], reason: str) -> None:
        self._update(nodes, "drain", reason)

    def resume(self, nodes: list[str]) -> None:
        self._update(nodes, "resume")

    def down(self, nodes: list[str], reason: str) -> None:
        self._update(nodes, "down", reason)

    def delete(self, nodes: list[str]) -> None:
        if nodes:
            self._run("scontrol", "delete", f"nodename={','.join(nodes)}")

    def jobs_on(self, node: str) -> list[int]:
        return parse_job_ids(self._run("squeue", "-h", "-w", node, "-o", "%A"))

    def note_jobs(self, jobs: list[int], note: str) -> None:
        for j in jobs:
            self._run("scontrol", "update", f"jobid={int(j)}", f"AdminComment={note}")

    def orphan_jobs(self) -> list[OrphanJob]:
        return parse_orphans(self._run("squeue", "-h", "-t", "R,S", "-o", "%A|%B|%N"))

    def requeue(self, job_id: int) -> bool:
        try:
            self._run("scontrol", "requeue", str(int(job_id)))
        except OperationFailed:
            return False
        return True

    def requeueable(self, job_id: int) -> bool:
        try:
            res = self.p.exec(self.controller, bounded(["scontrol", "show", "job", "-o", str(int(job_id))]))
        except EngineError as e:
            raise OperationFailed(f"scontrol show job: {e}") from None
        return res.exit_code != 0 or " Requeue=0 " not in res.output  # unknown: ended, nothing to cancel

    def release_requeued(self, resumed: set[int]) -> list[int]:
        held = parse_held_requeued(self._run("squeue", "-h", "-t", "PD", "-o", "%i|%r"))
        released = []
        for j in held:
            try:
                if j in resumed or requeued_by_hp(self._run("scontrol", "show", "job", "-o", str(j))):
                    # the old run's credentials were revoked by time: a start a second on is safe
                    self._run("scontrol", "update", f"jobid={j}", f"StartTime=now+{REQUEUE_START_S}")
                    released.append(j)
            except OperationFailed:  # it started or ended meanwhile, or its nodes are not back yet: next look
                continue
        return released

    def kill_job(self, job_id: int) -> None:
        self._run("scancel", str(int(job_id)))

    def auto_resume_retries(self) -> list[AutoResumeRetry]:
        return parse_auto_resume(self._run("squeue", "-h", "-t", "all", "-n", AUTO_RESUME_JOB, "-o", "%i|%k"))

    def shutdown_controller(self) -> None:
        self._run("scontrol", "shutdown", "slurmctld")

    def reconfigure(self, timeout: float = 30.0) -> None:
        self._run("scontrol", "reconfigure")
        waits.until(  # 24.11 re-executes slurmctld on reconfigure
            self.ping,
            every=0.2,
            timeout=timeout,
            error=lambda _: OperationFailed(f"slurmctld did not answer within {timeout:g} s of 'scontrol reconfigure'"),
        )

    def submit(
        self, container: str, script: str, output: str, args: list[str], user: str, workdir: str, env: dict[str, str]
    ) -> tuple[int | None, str]:
        try:
            res = self.p.exec(
                container,
                bounded(["sbatch", "--parsable", "-o", output, "-e", output, *args, script]),
                user=user,
                workdir=workdir,
                environment=env,
            )
        except EngineError as e:
            raise OperationFailed(f"sbatch: {e}") from None
        first = res.output.strip().splitlines()[-1].split(";")[0] if res.output.strip() else ""
        if res.exit_code != 0 or not first.isdigit():
            return None, res.output
        return int(first), res.output

    def cancel(self, container: str, job_id: int, user: str) -> None:
        try:
            self.p.exec(container, bounded(["scancel", str(int(job_id))]), user=user)
        except EngineError as e:
            raise OperationFailed(f"scancel: {e}") from None

    def show_node(self, node: str) -> str:
        try:
            return self.p.exec(self.controller, bounded(["scontrol", "show", "node", node])).output
        except EngineError as e:
            return f"scontrol show node {node}: {e}\n"

    def job_states(self) -> dict[tuple[str, str], int]:
        return parse_job_states(self._run("squeue", "-h", "-a", "-t", "all", "-o", "%T|%P"))

    def accounting_ping(self) -> AccountingPing:
        try:
            res = self.p.exec(self.controller, bounded(["sacctmgr", "ping"], 2))
        except EngineError as e:  # the controller's container is not running
            raise OperationFailed(f"sacctmgr ping: {e}") from None
        return parse_accounting_ping(res.exit_code, res.output)

    def sacct(self, job_ids: list[int], container: str | None = None) -> list[AcctJob]:
        ids = ",".join(str(int(j)) for j in job_ids)
        cmd = ["sacct", "-n", "-X", "-P", "-o", "JobID,State,ExitCode", "-j", ids]
        try:
            res = self.p.exec(container or self.controller, bounded(cmd))
        except EngineError as e:
            raise OperationFailed(f"sacct: {e}") from None
        if res.exit_code != 0:
            raise OperationFailed(f"sacct failed ({res.exit_code}): {res.output.strip()[:300]}")
        return parse_sacct(res.output)

    def clusters(self) -> list[str]:
        out = self._run("sacctmgr", "-n", "-P", "show", "cluster", "format=cluster")
        return [line.strip() for line in out.splitlines() if line.strip()]

    def token(self, user: str, lifespan: int) -> str:
        return parse_token(self._run("scontrol", "token", f"username={user}", f"lifespan={int(lifespan)}"))

    def overview(self) -> dict[str, str]:
        out = {}
        for name, cmd in (("sinfo.txt", ["sinfo", "-N", "-l"]), ("squeue.txt", ["squeue", "-a", "-l"])):
            try:
                out[name] = self.p.exec(self.controller, bounded(cmd)).output
            except EngineError as e:
                out[name] = f"{' '.join(cmd)}: {e}\n"
        return out
