"""Run one health-check request: isolate the nodes (drain, wait for idle), check them
in check containers, then resume, recover or keep them drained, recording every step.

Failure policy: a check that runs and finds a problem, or that cannot run because the
engine or a tool failed (TRANSIENT), fails the node. A bug in hp (anything else, e.g. a
parser raising TypeError) is never a verdict on the node: it is reported (log and
`hp events`), the result says "internal error", and the node goes back into service
untouched (never rebooted or replaced). So does a stress run the kernel killed (SIGKILL,
OOM kills in the check container) or one with no room for its memory stressor
(Verdict.not_run): the result is Error with the reason, the node is not judged.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ... import waits
from ...core import capacity
from ...core.context import Cluster, parallel
from ...docker.images import CHECK_IMAGES
from ...errors import TRANSIENT, OperationFailed, report_bug
from ...gpu.judge import FAILING
from ...recovery import actions as recovery
from ...recovery.rules import escalation, rebooted_for
from ...slurm.model import ONSTART_REASON, SlurmNode, health_reason, is_health_reason
from ...spec.catalogue import InstanceType
from ...state.health_requests import Records, Result, output_dir
from ...state.phases import Phase
from ...state.statuses import Attempt, CheckState
from ...state.transitions import RequestState
from ...verdict import Action, Verdict, strongest
from ..tools.limits import CpuBudget, grant_problems
from ..tools.stress import (
    MEMORY_COMMAND,
    StressOptions,
    cpu_instances,
    judge,
    parse_cgroup_memory,
    room_command,
    stress_command,
    vm_bytes_for,
)
from . import sidecar
from .connectivity import run_connectivity
from .decisions import Outcome, claim
from .gpu_check import GpuCheckOptions, run_gpu_check

log = logging.getLogger("hp.health")

POLL_S = 0.5
SETTLE_S = 20.0  # how long a resumed node may take to answer Slurm's ping before hp hands it back anyway


@dataclass
class Options:
    checks: list[str]
    wait_idle_timeout: float = 600.0
    stress: StressOptions = field(default_factory=StressOptions)
    dcgm_level: int = 2
    iperf_seconds: int = 1
    recovery_wait: float = 90.0
    on_start: bool = False  # the agent's check of new nodes (may take nodes drained with ONSTART_REASON)


@dataclass
class NodeRun:
    node: str
    group: str
    itype: InstanceType
    failed: dict[str, Outcome] = field(default_factory=dict)  # check -> short why
    error: str = ""  # an internal error (a bug in hp): the node is not judged
    # what recovery does when it failed (rules.escalation): RECOVER (CPU checks; a GPU
    # finding's too: reboot, re-check, replace), REPLACE (at once), NONE (kept drained)
    action: Action = Action.RECOVER
    condemned: list[str] = field(default_factory=list)  # GPUs a replace-class finding names: quarantined


class Engine:
    def __init__(self, cluster: Cluster, rid: str, opts: Options, attempt: Attempt = Attempt.INITIAL):
        self.c = cluster
        self.rid = rid
        self.opts = opts
        self.rec = Records(cluster.store)
        self.attempt = attempt
        self.image = cluster.images.refs(CHECK_IMAGES)["check-cpu"]
        self.outdir = output_dir(cluster.store, cluster.name, rid)
        self.budget = CpuBudget(float(cluster.p.info().cpus))

    # -- Slurm --------------------------------------------------------------------------
    def snodes(self) -> dict[str, SlurmNode]:
        return {n.name: n for n in self.c.slurm.nodes()}

    def label(self) -> str:
        return health_reason(self.rid, "+".join(self.opts.checks))

    @property
    def fault(self) -> str:
        """The words that begin the reason of each reboot or replace this request makes: its
        history says whether it rebooted a node already (rules.rebooted_for)."""
        return f"deep health check {self.rid} "

    def isolate(self, nodes: list[str]) -> tuple[list[str], dict[str, Outcome]]:
        """Drain the nodes hp may take (never one drained for a foreign reason) and
        wait until each runs nothing. Returns (ready nodes, skipped node -> why)."""
        sn = self.snodes()
        skipped: dict[str, Outcome] = {}
        take = []
        for n in nodes:
            cl = claim(sn.get(n), self.opts.on_start)
            if cl.drain:
                take.append(n)
            else:
                skipped[n] = cl.skip_reason
        # drained in Slurm first, recorded after: what `hp nodes` shows is never ahead of Slurm
        self.c.slurm.drain(take, self.label())
        for n in take:
            self.c.store.set_phase(self.c.name, n, Phase.CHECKING, f"{self.rid}: {', '.join(self.opts.checks)}")
        waiting = set(take)

        def look() -> dict[str, SlurmNode]:  # Slurm's view; the nodes idle in it are no longer waited for
            now = self.snodes()
            waiting.difference_update({n for n in waiting if n in now and now[n].idle_drained})
            return now

        if waiting:
            sn = waits.poll(look, lambda _: not waiting, every=POLL_S, timeout=self.opts.wait_idle_timeout)
        for n in sorted(waiting):
            skipped[n] = (
                f"still running jobs after {self.opts.wait_idle_timeout:g} s "
                f"(Slurm state {sn[n].display if n in sn else 'unknown'}): not checked"
            )
        self.release(sorted(waiting))
        return [n for n in take if n not in waiting], skipped

    def release(self, nodes: list[str]) -> None:
        """Resume the nodes hp drained (only those still drained for this request) and
        say they run, once Slurm sees them answering: right after a resume Slurm may
        flag a node not responding until its next ping, and the recovery watcher would
        reboot a Running node it sees so. Until then the node stays ours."""
        sn = self.snodes()
        mine = [n for n in nodes if n in sn and sn[n].drained and is_health_reason(sn[n].reason, self.rid)]
        self.c.slurm.resume(mine)
        if mine:
            waits.poll(
                lambda: not any(s.not_responding for n, s in self.snodes().items() if n in mine),
                every=POLL_S,
                timeout=SETTLE_S,
            )
        for n in nodes:
            self.c.store.set_phase(self.c.name, n, Phase.RUNNING, "")

    def keep_drained(self, node: str, why: str) -> None:
        """Leave a node that failed drained with the reason. One whose replacement did not
        come up is the reconciler's again (LaunchFailed): only its Slurm record, if any, is
        drained."""
        try:
            self.c.slurm.drain([node], why)
        except OperationFailed as e:
            log.info("%s: not drained (%s)", node, e)
        if self.c.store.latest_phases(self.c.name).phase(node) in (Phase.CHECKING, Phase.RUNNING):
            self.c.store.set_phase(self.c.name, node, Phase.RUNNING, why)

    # -- checks -------------------------------------------------------------------------
    def _row(self, run: NodeRun, check: str) -> tuple[int, Result]:
        r = Result(run.node, run.group, check, self.attempt, CheckState.RUNNING, started=time.time())
        return self.rec.result(self.rid, self.c.name, r), r

    def _finish(self, row: int, r: Result, state: CheckState, reasons: list[str], figures: dict, text: str) -> None:
        path = self.outdir / f"{r.node}-{r.check}{'' if self.attempt is Attempt.INITIAL else '-' + self.attempt}.txt"
        path.write_text(text)
        r.state, r.ended, r.reasons, r.figures, r.output = state, time.time(), reasons, figures, str(path)
        self.rec.update(row, r)
        level = {CheckState.PASSED: "Info", CheckState.FAILED: "Error"}.get(state, "Warning")
        said = "; ".join(reasons)[:300]
        what = {CheckState.PASSED: "passed", CheckState.FAILED: f"failed: {said}"}.get(state, said)
        self.event(
            level, f"Deep health check {r.check} ({self.rid}, {self.attempt}) on {r.node}: {what}", r.node, r.group
        )

    def _internal_error(self, run: NodeRun, check: str, row: int, r: Result, e: BaseException) -> None:
        desc = report_bug(self.c.store, self.c.name, f"health check {check} on {run.node}", e, log, node=run.node)
        run.error = desc
        self._finish(row, r, CheckState.ERROR, [f"{desc}; the node was not judged"], {}, desc)

    def stress_one(self, run: NodeRun, sc: sidecar.Sidecar) -> None:
        row, r = self._row(run, "InstanceStress")
        cpus = sc.limits.granted_cpus or 1.0
        self.budget.acquire(cpus)
        notes: list[str] = []
        try:
            v, out, run.action, notes, run.condemned = self.run_stress(run.itype, sc)
        except TRANSIENT as e:  # the check could not run (engine, tool): a failed check
            v, out = Verdict(False, [f"check did not run: {e}"]), f"check did not run: {e}"
        except Exception as e:  # noqa: BLE001 - a bug: not a verdict on the node
            self._internal_error(run, "InstanceStress", row, r, e)
            return
        finally:
            self.budget.release(cpus)
        if v.not_run:  # the kernel killed the check, or it had no room: the node is not judged
            run.error = v.not_run
            self._finish(row, r, CheckState.ERROR, [f"{v.not_run}; the node was not judged"], v.figures, out)
            return
        self._finish(row, r, CheckState.PASSED if v.passed else CheckState.FAILED, v.reasons + notes, v.figures, out)
        if not v.passed:
            run.failed["InstanceStress"] = v.reasons[0][:150]

    def run_stress(self, itype: InstanceType, sc: sidecar.Sidecar) -> tuple[Verdict, str, Action, list[str], list[str]]:
        """The stress run (and on GPU nodes the GPU check) in the node's check
        container(s): (verdict, output, recovery action, notes, condemned GPUs). The
        action is the GPU findings' when the GPU check failed (RECOVER otherwise: reboot,
        re-check, replace)."""
        before = parse_cgroup_memory(sidecar.run(self.c, sc, MEMORY_COMMAND).output)
        cpus = cpu_instances(sc.limits.granted_cpus)
        vm_bytes, sizing = vm_bytes_for(self.opts.stress, before, cpus)
        room = ""
        if vm_bytes is None:
            v, out = Verdict(False, [sizing], not_run=sizing), sizing
        else:
            if before is not None and (make_room := room_command(vm_bytes, before, cpus)):
                t0 = time.monotonic()
                rc = sidecar.run(self.c, sc, make_room).exit_code
                room = f"page cache reclaimed before the run, not during it ({time.monotonic() - t0:.1f} s{f', exit {rc}' if rc else ''}): {before.describe()}"
                before = parse_cgroup_memory(sidecar.run(self.c, sc, MEMORY_COMMAND).output)  # what the run starts from
            res = sidecar.run(self.c, sc, stress_command(self.opts.stress, sc.limits.granted_cpus, vm_bytes))
            out = res.output
            v = judge(itype, out, sc.limits.granted_cpus, [], before, res.exit_code)
        if v.not_run:  # no room, or killed by the kernel: no verdict from the run (nor a GPU check)...
            if short := grant_problems(itype, sc.limits, None):  # ...but the node's own cgroup is short
                return Verdict(False, short + v.reasons), out, Action.RECOVER, [], []
            return v, out, Action.RECOVER, [], []
        v.reasons += grant_problems(itype, sc.limits, v.figures.get("cpus_used_total"))
        action, notes, condemned = Action.RECOVER, [f"note: {n}" for n in (sizing, room) if n], []
        if itype.gpus:
            node = self.c.node_containers().get(sc.node)
            if node is None:
                raise OperationFailed(f"{sc.node} has no container any more")
            g = run_gpu_check(self.c, node, itype, self.rid, GpuCheckOptions(dcgm_level=self.opts.dcgm_level))
            gv, gout, condemned = g.verdict, g.output, g.condemned
            for f in gv.findings:  # ones to monitor (application XIDs, correctable ECC): an event each
                if f.action is Action.MONITOR:
                    what = f"GPU finding {f.code} (monitored, no action): {f.message}"
                    self.event("Warning", f"Deep health check {self.rid} on {sc.node}: {what}", sc.node, node.group)
            if not gv.passed:
                action = strongest(f.action for f in gv.findings if f.severity in FAILING)
                if v.reasons:  # the CPU part failed too: the usual reboot-then-replace at least
                    action = strongest((action, Action.RECOVER))
            v.reasons += gv.reasons
            notes += [f"note: {n}" for n in gv.notes]
            v.figures.update({f"gpu.{k}": x for k, x in gv.figures.items()})
            out += "\n\n==== GPU ====\n" + gout
        v.passed = not v.reasons
        return v, out, action, notes, condemned

    def event(self, level: str, text: str, node: str, group: str) -> None:
        self.c.store.event(self.c.name, "Instance", level, text, group, node=node)

    def check(self, runs: list[NodeRun], peers: list[NodeRun] = ()) -> None:
        """Run the requested checks on `runs` (peers join the connectivity check only)."""
        cont = self.c.node_containers()
        everyone = list(runs) + [p for p in peers if p.node not in {r.node for r in runs}]
        cars: dict[str, sidecar.Sidecar] = {}
        try:
            # registered hosts: the check image goes to every host at once (one stream, fanned out)
            self.c.p.prepare_images([self.image], lambda s: log.info("%s: %s", self.rid, s))
            started = parallel(lambda x: sidecar.start(self.c, cont[x.node], self.image, self.rid), everyone)
            for x, sc in zip(everyone, started, strict=True):
                cars[x.node] = sc
            if "InstanceStress" in self.opts.checks:
                parallel(lambda x: self.stress_one(x, cars[x.node]), runs)
            if "InstanceConnectivity" in self.opts.checks:
                self.connectivity(runs, everyone, cars)
        finally:
            sidecar.remove_all(self.c, self.rid)

    def connectivity(self, runs: list[NodeRun], everyone: list[NodeRun], cars: dict[str, sidecar.Sidecar]) -> None:
        check = "InstanceConnectivity"
        rows = {x.node: self._row(x, check) for x in runs}

        def finish(x: NodeRun, why: list[str], figures: dict, out: str, short: str = "") -> None:
            self._finish(*rows[x.node], CheckState.FAILED if why else CheckState.PASSED, why, figures, out)
            if why:  # the drain reason's words
                x.failed[check] = (short or why[0])[:150]

        if len(everyone) < 2:
            for x in runs:
                finish(x, [f"{check} needs at least 2 nodes under check"], {}, "", "needs at least 2 nodes")
            return
        try:
            itypes = {x.node: x.itype for x in everyone}
            res = run_connectivity(self.c, [cars[x.node] for x in everyone], itypes, self.opts.iperf_seconds)
        except TRANSIENT as e:  # could not run: a failed check
            for x in runs:
                finish(x, [f"check did not run: {e}"], {}, str(e), str(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug: not a verdict on the nodes
            for x in runs:
                self._internal_error(x, check, *rows[x.node], e)
            return
        for x in runs:
            finish(x, res.reasons.get(x.node, []), res.figures.get(x.node, {}), res.output)


def run_request(
    cluster: Cluster, rid: str, nodes: list[str], opts: Options, peers: list[str] = ()
) -> dict[str, Outcome]:
    """Check `nodes`; returns node -> final verdict (Passed, Failed, Skipped: why, Error:
    why). `peers` (not drained, not judged) only join the connectivity check: a lone new
    node needs someone to talk to."""
    eng = Engine(cluster, rid, opts)
    cont = cluster.node_containers()
    verdicts: dict[str, Outcome] = {}
    ready, skipped = eng.isolate(nodes)
    for n, why in skipped.items():
        g, now = cont[n].group if n in cont else "", time.time()
        r = Result(n, g, "+".join(opts.checks), Attempt.INITIAL, CheckState.SKIPPED, now, now, [why])
        eng.rec.result(rid, cluster.name, r)
        eng.event("Warning", f"Deep health check {rid} skipped {n}: {why}", n, g)
        verdicts[n] = Outcome(CheckState.SKIPPED, why)

    def run(n: str) -> NodeRun:
        return NodeRun(n, cont[n].group, cluster.env.catalogue[cont[n].itype])

    runs = [run(n) for n in ready]
    if runs:
        eng.check(runs, [run(n) for n in peers if n in cont and n not in ready])
    errored = [r for r in runs if r.error]
    failed = [r for r in runs if r.failed and not r.error]
    passed = [r for r in runs if not r.failed and not r.error]
    anchor = passed[:1] if failed and "InstanceConnectivity" in opts.checks else []
    done = [r for r in passed if r not in anchor]
    eng.release([r.node for r in done + errored])  # an internal error is no verdict: back into service
    verdicts.update({r.node: Outcome(CheckState.PASSED) for r in done})
    verdicts.update({r.node: Outcome(CheckState.ERROR, r.error) for r in errored})
    if failed and cluster.spec.NodeRecovery == "Automatic":
        failed = recover(eng, failed, anchor, verdicts)
    for r in failed:
        verdicts[r.node] = _keep(eng, r)
    eng.release([r.node for r in anchor])
    verdicts.update({r.node: Outcome(CheckState.PASSED) for r in anchor})
    return verdicts


def run_and_record(
    cluster: Cluster, rid: str, nodes: list[str], opts: Options, peers: list[str] = ()
) -> dict[str, Outcome]:
    """Run a recorded request to its end and record the outcome (Completed with the
    verdicts, or Failed with why; its check containers are removed either way). The
    detached worker and the agent's on-start checks both end here."""
    rec = Records(cluster.store)
    rec.set_state(rid, RequestState.RUNNING)
    try:
        verdicts = run_request(cluster, rid, nodes, opts, peers)
    except BaseException as e:  # noqa: BLE001 - record why, clean up, hand the nodes back, and let the caller see it
        rec.set_state(rid, RequestState.FAILED, f"{type(e).__name__}: {e}")
        hand_back(cluster, rid, nodes, opts.on_start)
        raise
    rec.set_verdicts(rid, {n: str(v) for n, v in verdicts.items()}, {n: v.result for n, v in verdicts.items()})
    bad = {n: v for n, v in verdicts.items() if not v.passed}
    summary = f"{len(verdicts) - len(bad)} of {len(verdicts)} node(s) passed"
    detail = ": " + "; ".join(f"{n} {v}" for n, v in bad.items())[:400] if bad else ""
    rec.set_state(rid, RequestState.COMPLETED, summary, detail=detail, level="Warning" if bad else None)
    return verdicts


def hand_back(cluster: Cluster, rid: str, nodes: list[str], on_start: bool, strict: bool = False) -> None:
    """After a request failed (not its checks: the request itself; also its worker killed,
    service.reap_dead) or was cancelled, remove its check containers and give back the nodes
    it still holds: on-demand ones are resumed; on-start ones are drained again with the
    on-start reason, still unchecked, so that they take no job. `strict`: Slurm's silence is
    raised (the nodes stay drained either way)."""
    sidecar.remove_all(cluster, rid)
    try:
        held = [n.name for n in cluster.slurm.nodes() if n.drained and is_health_reason(n.reason, rid)]
        if on_start:
            cluster.slurm.drain(held, ONSTART_REASON)
        else:
            cluster.slurm.resume(held)
    except OperationFailed:  # controller down: the nodes stay drained, which is safe
        if strict:  # `hp health-check cancel`: said, the request stays active (cancelled again later)
            raise
        held = []
    latest = cluster.store.latest_phases(cluster.name)
    for n in nodes:
        if latest.phase(n) is Phase.CHECKING:
            msg = "on-start health check did not run" if on_start else ("" if n in held else "health check ended")
            cluster.store.set_phase(cluster.name, n, Phase.RUNNING, msg)


def _keep(eng: Engine, r: NodeRun) -> Outcome:
    check, why = next(iter(r.failed.items()))
    eng.keep_drained(r.node, health_reason(eng.rid, check, why))
    return Outcome(CheckState.FAILED, f"{check}: {why}")


def recover(eng: Engine, failed: list[NodeRun], anchor: list[NodeRun], verdicts: dict[str, Outcome]) -> list[NodeRun]:
    """The escalation policy (rules.escalation) on the failed nodes, reboots first: each
    node's step is read from its action and its history (RECOVER reboots, and replaces once
    this request's reboot did not help; REPLACE replaces at once; NONE, a setup problem,
    touches nothing); the nodes a step brought back are checked again together (a
    connectivity check has its peers). Returns the nodes that failed every time."""
    c = eng.c

    def step_of(r: NodeRun) -> Action:
        return escalation(r.action, rebooted_for(c.store.node_history(c.name, r.node), eng.fault))

    for kind in (Action.REBOOT, Action.REPLACE):
        todo = [r for r in failed if step_of(r) is kind]
        if not todo:
            continue

        def act(r: NodeRun, kind: Action = kind) -> bool:
            check, why = next(iter(r.failed.items()))
            # the node comes back drained with the check's reason: it takes no job
            # before it has passed the check again
            why_now = f"{eng.fault}{check} failed: {why}"
            if kind is Action.REPLACE and r.condemned:  # the replacement must get other GPUs
                capacity.quarantine(c.store, r.condemned, f"{r.node}: {why_now}")
            try:
                return recovery.step(c, kind, r.node, why_now, eng.opts.recovery_wait, eng.label())
            except OperationFailed as e:
                r.failed = {check: f"{why}; {kind} unavailable: {str(e)[:100]}"}
                return False

        back = [r for r, ok in zip(todo, parallel(act, todo), strict=True) if ok]
        if not back:
            continue
        for r in back:
            c.store.set_phase(c.name, r.node, Phase.CHECKING, f"{eng.rid}: re-check after {kind}")
        again = Engine(c, eng.rid, eng.opts, attempt=Attempt.after(kind))
        fresh = [NodeRun(r.node, r.group, r.itype) for r in back]
        again.check(fresh, anchor)
        for r, f in zip(back, fresh, strict=True):
            if f.error:
                verdicts[r.node] = Outcome(CheckState.ERROR, f.error)
            elif f.failed:
                r.failed, r.action, r.condemned = f.failed, f.action, f.condemned
            else:
                verdicts[r.node] = Outcome(CheckState.PASSED, f"after {kind}")
        eng.release([f.node for f in fresh if f.error or not f.failed])
        failed = [r for r in failed if r.node not in verdicts]
    return failed
