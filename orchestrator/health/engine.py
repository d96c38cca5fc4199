"""Run one health-check request: isolate the nodes (drain, wait for idle), check them
in check containers, then resume, recover or keep them drained, recording every step."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .. import recovery
from ..catalogue import InstanceType
from ..cluster import Cluster, parallel
from ..errors import OperationFailed
from ..images import CHECK_IMAGES
from ..naming import L_GROUP, L_ITYPE
from ..slurm import SlurmNode
from . import sidecar
from .connectivity import run_connectivity
from .logic import CpuBudget, claim, idle_drained, is_ours, reason
from .records import Records, Result, output_dir
from .stress import StressOptions, run_stress

POLL_S = 0.5
SETTLE_S = 20.0  # how long a resumed node may take to answer Slurm's ping before hp hands it back anyway


@dataclass
class Options:
    checks: list[str]
    wait_idle_timeout: float = 600.0
    stress: StressOptions = field(default_factory=StressOptions)
    iperf_seconds: int = 1
    recovery_wait: float = 90.0
    on_start: bool = False  # the agent's check of new nodes (may take nodes drained with ONSTART_REASON)


@dataclass
class NodeRun:
    node: str
    group: str
    itype: InstanceType
    failed: dict[str, str] = field(default_factory=dict)  # check -> short why


class Engine:
    def __init__(self, cluster: Cluster, rid: str, opts: Options, attempt: str = "initial"):
        self.c = cluster
        self.rid = rid
        self.opts = opts
        self.rec = Records(cluster.store)
        self.attempt = attempt
        self.image = cluster.env.images.refs(CHECK_IMAGES)["check-cpu"]
        self.outdir = output_dir(cluster.store, cluster.name, rid)
        self.budget = CpuBudget(float(cluster.p.api.info().get("NCPU", 1)))

    # -- Slurm --------------------------------------------------------------------------
    def snodes(self) -> dict[str, SlurmNode]:
        return {n.name: n for n in self.c.slurm.nodes()}

    def label(self) -> str:
        return reason(self.rid, "+".join(self.opts.checks))

    def isolate(self, nodes: list[str]) -> tuple[list[str], dict[str, str]]:
        """Drain the nodes hp may take (never one drained for a foreign reason) and
        wait until each runs nothing. Returns (ready nodes, skipped node -> why)."""
        sn = self.snodes()
        skipped: dict[str, str] = {}
        take = []
        for n in nodes:
            cl = claim(sn.get(n), self.opts.on_start)
            if cl.drain:
                take.append(n)
            else:
                skipped[n] = cl.skip_reason
        self.c.slurm.update(take, "drain", self.label())
        for n in take:
            self.c.store.node_status(self.c.name, n, "DeepHealthCheckInProgress",
                                     f"{self.rid}: {', '.join(self.opts.checks)}")
        deadline = time.monotonic() + self.opts.wait_idle_timeout
        waiting = set(take)
        while waiting and time.monotonic() < deadline:
            sn = self.snodes()
            waiting = {n for n in waiting if not idle_drained(sn.get(n))}
            if waiting:
                time.sleep(POLL_S)
        for n in sorted(waiting):
            skipped[n] = (f"still running jobs after {self.opts.wait_idle_timeout:g} s "
                          f"(Slurm state {sn[n].display if n in sn else 'unknown'}): not checked")
        self.release(sorted(waiting))
        return [n for n in take if n not in waiting], skipped

    def release(self, nodes: list[str]) -> None:
        """Resume the nodes hp drained (only those still drained for this request) and
        say they run, once Slurm sees them answering: right after a resume Slurm may
        flag a node not responding until its next ping, and the recovery watcher would
        reboot a Running node it sees so. Until then the node stays ours."""
        sn = self.snodes()
        mine = [n for n in nodes if n in sn and sn[n].drained and is_ours(sn[n].reason, self.rid)]
        self.c.slurm.update(mine, "resume")
        deadline = time.monotonic() + SETTLE_S
        while mine and time.monotonic() < deadline:
            sn = self.snodes()
            if not any(sn[n].not_responding for n in mine if n in sn):
                break
            time.sleep(POLL_S)
        for n in nodes:
            self.c.store.node_status(self.c.name, n, "Running", "")

    def keep_drained(self, node: str, why: str) -> None:
        self.c.slurm.update([node], "drain", why)
        self.c.store.node_status(self.c.name, node, "Running", why)

    # -- checks -------------------------------------------------------------------------
    def _row(self, run: NodeRun, check: str) -> tuple[int, Result]:
        r = Result(run.node, run.group, check, self.attempt, "Running", started=time.time())
        return self.rec.result(self.rid, self.c.name, r), r

    def _finish(self, row: int, r: Result, passed: bool, reasons: list[str], figures: dict, text: str) -> None:
        path = self.outdir / f"{r.node}-{r.check}{'' if self.attempt == 'initial' else '-' + self.attempt}.txt"
        path.write_text(text)
        r.state, r.ended, r.reasons, r.figures, r.output = ("Passed" if passed else "Failed"), time.time(), \
            reasons, figures, str(path)
        self.rec.update(row, r)
        level = "Info" if passed else "Error"
        self.c.store.event(self.c.name, "Instance", level, f"Deep health check {r.check} ({self.rid}, {self.attempt}) "
                           f"on {r.node}: {'passed' if passed else 'failed: ' + '; '.join(reasons)[:300]}",
                           r.group, node=r.node)

    def stress_one(self, run: NodeRun, sc: sidecar.Sidecar) -> None:
        row, r = self._row(run, "InstanceStress")
        cpus = sc.limits.granted_cpus or 1.0
        self.budget.acquire(cpus)
        try:
            v, out = run_stress(self.c, sc, run.itype, self.opts.stress)
        except Exception as e:  # noqa: BLE001 - the check could not run: that is a failed check
            v, out = None, f"check did not run: {e}"
        finally:
            self.budget.release(cpus)
        if v is None:
            self._finish(row, r, False, [out], {}, out)
            run.failed["InstanceStress"] = out[:150]
            return
        self._finish(row, r, v.passed, v.reasons, v.figures, out)
        if not v.passed:
            run.failed["InstanceStress"] = v.reasons[0][:150]

    def check(self, runs: list[NodeRun], peers: list[NodeRun] = ()) -> None:
        """Run the requested checks on `runs` (peers join the connectivity check only)."""
        cont = self.c.node_containers()
        everyone = list(runs) + [p for p in peers if p.node not in {r.node for r in runs}]
        cars = {}
        try:
            for x, sc in zip(everyone, parallel(lambda x: sidecar.start(self.c, cont[x.node], self.image, self.rid),
                                                everyone)):
                cars[x.node] = sc
            if "InstanceStress" in self.opts.checks:
                parallel(lambda x: self.stress_one(x, cars[x.node]), runs)
            if "InstanceConnectivity" in self.opts.checks:
                self.connectivity(runs, everyone, cars)
        finally:
            parallel(lambda sc: sidecar.stop(self.c, sc), list(cars.values()))

    def connectivity(self, runs: list[NodeRun], everyone: list[NodeRun], cars: dict) -> None:
        rows = {x.node: self._row(x, "InstanceConnectivity") for x in runs}
        if len(everyone) < 2:
            for x in runs:
                self._finish(*rows[x.node], False, ["InstanceConnectivity needs at least 2 nodes under check"], {}, "")
                x.failed["InstanceConnectivity"] = "needs at least 2 nodes"
            return
        try:
            res = run_connectivity(self.c, [cars[x.node] for x in everyone], {x.node: x.itype for x in everyone},
                                   self.opts.iperf_seconds)
        except Exception as e:  # noqa: BLE001
            for x in runs:
                self._finish(*rows[x.node], False, [f"check did not run: {e}"], {}, str(e))
                x.failed["InstanceConnectivity"] = str(e)[:150]
            return
        for x in runs:
            why = res.reasons.get(x.node, [])
            self._finish(*rows[x.node], not why, why, res.figures.get(x.node, {}), res.output)
            if why:
                x.failed["InstanceConnectivity"] = why[0][:150]


def run_request(cluster: Cluster, rid: str, nodes: list[str], opts: Options,
                peers: list[str] = ()) -> dict[str, str]:
    """Check `nodes`; returns node -> final verdict (Passed, Failed, Skipped: why).
    `peers` (not drained, not judged) only join the connectivity check: a lone new
    node needs someone to talk to."""
    eng = Engine(cluster, rid, opts)
    cont = cluster.node_containers()
    cat = cluster.env.catalogue
    verdicts: dict[str, str] = {}
    ready, skipped = eng.isolate(nodes)
    for n, why in skipped.items():
        g = cont[n].labels.get(L_GROUP, "") if n in cont else ""
        eng.rec.result(rid, cluster.name, Result(n, g, "+".join(opts.checks), "initial", "Skipped",
                                                 time.time(), time.time(), [why]))
        cluster.store.event(cluster.name, "Instance", "Warning", f"Deep health check {rid} skipped {n}: {why}", g, node=n)
        verdicts[n] = f"Skipped: {why}"
    runs = [NodeRun(n, cont[n].labels.get(L_GROUP, ""), cat[cont[n].labels[L_ITYPE]]) for n in ready]
    if runs:
        eng.check(runs, [NodeRun(n, cont[n].labels.get(L_GROUP, ""), cat[cont[n].labels[L_ITYPE]])
                         for n in peers if n in cont and n not in ready])
    failed = [r for r in runs if r.failed]
    passed = [r for r in runs if not r.failed]
    anchor = passed[:1] if failed and "InstanceConnectivity" in opts.checks else []
    done = [r for r in passed if r not in anchor]
    eng.release([r.node for r in done])
    verdicts.update({r.node: "Passed" for r in done})
    if failed and cluster.spec.NodeRecovery == "Automatic":
        failed = recover(eng, failed, anchor, verdicts)
    for r in failed:
        verdicts[r.node] = _keep(eng, r)
    eng.release([r.node for r in anchor])
    verdicts.update({r.node: "Passed" for r in anchor})
    return verdicts


def run_and_record(cluster: Cluster, rid: str, nodes: list[str], opts: Options,
                   peers: list[str] = ()) -> dict[str, str]:
    """Run a recorded request to its end and record the outcome (Completed with the
    verdicts, or Failed with why; its check containers are removed either way). The
    detached worker and the agent's on-start checks both end here."""
    rec = Records(cluster.store)
    rec.set_state(rid, "Running")
    try:
        verdicts = run_request(cluster, rid, nodes, opts, peers)
    except BaseException as e:  # record why, clean up, hand the nodes back, and let the caller see it
        rec.set_state(rid, "Failed", f"{type(e).__name__}: {e}", ended=True)
        sidecar.remove_all(cluster, rid)
        hand_back(cluster, rid, nodes, opts.on_start)
        raise
    rec.set_verdicts(rid, verdicts)
    bad = {n: v for n, v in verdicts.items() if not v.startswith("Passed")}
    summary = f"{len(verdicts) - len(bad)} of {len(verdicts)} node(s) passed"
    rec.set_state(rid, "Completed", summary, ended=True)
    cluster.store.event(cluster.name, "Cluster", "Info" if not bad else "Warning",
                        f"Deep health check {rid} completed: {summary}"
                        + (": " + "; ".join(f"{n} {v}" for n, v in bad.items())[:400] if bad else ""))
    return verdicts


def hand_back(cluster: Cluster, rid: str, nodes: list[str], on_start: bool) -> None:
    """After a request failed (not its checks: the request itself), give back the nodes
    it still holds: on-demand ones are resumed; on-start ones are drained again with
    the on-start reason, still unchecked, so that they take no job."""
    from ..cluster import ONSTART_REASON

    try:
        held = [n.name for n in cluster.slurm.nodes() if n.name in nodes and n.drained and is_ours(n.reason, rid)]
        if on_start:
            cluster.slurm.update(held, "drain", ONSTART_REASON)
        else:
            cluster.slurm.update(held, "resume")
    except Exception:  # noqa: BLE001 - controller down: the nodes stay drained, which is safe
        held = []
    for n in nodes:
        cluster.store.node_status(cluster.name, n, "Running", "" if n in held and not on_start else
                                  "on-start health check did not run" if on_start else "")


def _keep(eng: Engine, r: NodeRun) -> str:
    check, why = next(iter(r.failed.items()))
    eng.keep_drained(r.node, reason(eng.rid, check, why))
    return f"Failed: {check}: {why}"


def recover(eng: Engine, failed: list[NodeRun], anchor: list[NodeRun], verdicts: dict[str, str]) -> list[NodeRun]:
    """Reboot the failed nodes and check them again (together, so that a connectivity
    check has its peers); replace those that still fail and check again. Returns the
    nodes that failed every time."""
    c = eng.c
    for action, fn in (("reboot", recovery.reboot), ("replace", recovery.replace)):
        if not failed:
            break

        def act(r: NodeRun) -> bool:
            check, why = next(iter(r.failed.items()))
            try:
                # the node comes back drained with the check's reason: it takes no job
                # before it has passed the check again
                ok = fn(c, r.node, f"deep health check {eng.rid} {check} failed: {why}", eng.opts.recovery_wait,
                        keep_drained=eng.label())
            except (NotImplementedError, OperationFailed) as e:
                r.failed = {check: f"{why}; {action} unavailable: {str(e)[:100]}"}
                ok = False
            return ok

        back = [r for r, ok in zip(failed, parallel(act, failed)) if ok]
        if not back:
            continue
        for r in back:
            c.store.node_status(c.name, r.node, "DeepHealthCheckInProgress", f"{eng.rid}: re-check after {action}")
        again = Engine(c, eng.rid, eng.opts, attempt=f"after-{action}")
        fresh = [NodeRun(r.node, r.group, r.itype) for r in back]
        again.check(fresh, anchor)
        for r, f in zip(back, fresh):
            if f.failed:
                r.failed = f.failed
            else:
                verdicts[r.node] = f"Passed after {action}"
        eng.release([r.node for r in back if not any(f.node == r.node and f.failed for f in fresh)])
        failed = [r for r in failed if r.node not in verdicts]
    return failed
