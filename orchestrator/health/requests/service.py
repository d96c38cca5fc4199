"""Start, follow and cancel health-check requests (what the CLI and on-start call)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

from ... import waits
from ...core.context import Cluster, Env
from ...core.procs import alive
from ...errors import BadInput, NotFound, OperationFailed, WaitTimeout
from ...gpu.thresholds import thresholds_checked
from ...state.health_requests import Records, Request, output_dir
from ...state.statuses import CheckState
from ...state.store import iso
from ...state.transitions import ACTIVE, RequestState
from ..tools import options as option_rules
from .decisions import CHECKS, validate_checks
from .runner import hand_back


def option_problems(opts: dict[str, Any]) -> list[str]:
    """Every problem with a request's options (validated before anything is touched)."""
    return option_rules.problems(opts)


def plan(cluster: Cluster, groups: list[str], nodes: list[str], checks: list[str]) -> tuple[list[str], list[str]]:
    """(nodes to check, their groups) from --group/--node; every problem at once."""
    problems = validate_checks(checks)
    spec = cluster.spec
    compute = {g.InstanceGroupName for g in spec.InstanceGroups if g.node_type == "Compute"}
    problems += [
        f"{g!r} is not a compute instance group of {cluster.name} (groups: {', '.join(sorted(compute))})"
        for g in groups
        if g not in compute
    ]
    workers = {n: c for n, c in cluster.node_containers().items() if c.role == "worker"}
    problems += [
        f"{n!r} is not a worker node of {cluster.name} (nodes: {', '.join(sorted(workers))})"
        for n in nodes
        if n not in workers
    ]
    if problems:
        raise BadInput(problems, "invalid health-check request")
    chosen = (
        list(dict.fromkeys(nodes))
        if nodes
        else sorted(n for n, c in workers.items() if not groups or c.group in groups)
    )
    if not chosen:
        raise BadInput("no worker node to check", "invalid health-check request")
    if "InstanceConnectivity" in checks and len(chosen) < 2:
        raise BadInput(
            f"InstanceConnectivity needs at least 2 nodes, {len(chosen)} chosen", "invalid health-check request"
        )
    return chosen, sorted({workers[n].group for n in chosen})


def start(
    env: Env,
    name: str,
    groups: list[str],
    nodes: list[str],
    checks: list[str],
    options: dict[str, Any],
    detach: bool = True,
) -> str:
    if problems := option_problems(options):
        raise BadInput(problems, "invalid health-check request")
    cluster = env.cluster(name)
    checks = list(dict.fromkeys(checks or CHECKS))
    chosen, gs = plan(cluster, groups, nodes, checks)
    if "InstanceStress" in checks:  # the memory stressor must fit the smallest node checked
        mem = min(env.catalogue[cluster.group_of(g).InstanceType].memory_mib for g in gs)
        host = env.provider.info().memory_mib
        if problems := option_rules.problems(options, node_memory_mib=mem, host_memory_mib=host):
            raise BadInput(problems, "invalid health-check request")
    if "InstanceStress" in checks and any(env.catalogue[g.InstanceType].gpus for g in map(cluster.group_of, gs)):
        thresholds_checked()  # GPU nodes are judged against it: a bad file is bad input, now
    rec = Records(env.store)
    if (act := rec.active(name)) is not None:
        reap_dead(env, rec, act)  # its worker died: it no longer blocks this one
    rid = rec.new_request(name, checks, gs, chosen, options)
    if rid is None:
        act = rec.active(name)
        raise OperationFailed(
            f"cluster {name!r} already has an active health check {act.id if act else ''} "
            f"({act.state if act else ''}); wait for it or 'hp health-check cancel {name}'"
        )
    if detach:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.health.requests.worker", name, rid],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=open(output_dir(env.store, name, rid) / "worker.log", "ab"),
            stderr=subprocess.STDOUT,
        )
        rec.set_pid(rid, proc.pid)
    return rid


def reap_dead(env: Env, rec: Records, r: Request) -> Request:
    """A request whose worker died without finishing is Failed (said so, once), and the
    nodes it held are handed back (as run_and_record would have)."""
    if r.state in ACTIVE and r.pid and not alive(r.pid):
        # expect: another process may have reaped it meanwhile (said once)
        rec.set_state(r.id, RequestState.FAILED, "the health-check worker process died", expect=ACTIVE)

        try:
            hand_back(Cluster(env, r.cluster), r.id, r.nodes, bool(r.options.get("on_start")))
        except NotFound:
            pass  # the cluster is gone
        return rec.request(r.id) or r
    return r


def status(env: Env, name: str, rid: str | None = None) -> dict[str, Any]:
    env.cluster(name)
    rec = Records(env.store)
    reqs = rec.requests(name)
    if rid:
        reqs = [r for r in reqs if r.id == rid]
        if not reqs:
            raise NotFound(f"cluster {name!r} has no health check {rid!r}")
    if not reqs:
        return {"ClusterName": name, "Request": None}
    r = reap_dead(env, rec, reqs[-1])
    results = rec.results(r.id)
    groups: dict[str, Any] = {}
    for x in results:
        g = groups.setdefault(x.group, {"InstanceGroupName": x.group, "Nodes": {}})
        g["Nodes"].setdefault(x.node, []).append(x.as_dict())
    return {
        "ClusterName": name,
        "Request": {
            "Id": r.id,
            "State": r.state,
            "Checks": r.checks,
            "Groups": r.groups,
            "Nodes": r.nodes,
            "CreationTime": iso(r.created),
            "EndTime": iso(r.ended) if r.ended else None,
            "Message": r.message,
            "Verdicts": r.options.get("verdicts", {}),
            "Results": r.options.get("results", {}),
            "OnStart": bool(r.options.get("on_start")),
            "InstanceGroups": [
                {
                    "InstanceGroupName": g["InstanceGroupName"],
                    "Nodes": [{"Node": n, "Checks": v} for n, v in sorted(g["Nodes"].items())],
                }
                for g in groups.values()
            ],
        },
    }


def wait(env: Env, name: str, rid: str, timeout: float) -> dict[str, Any]:
    rec = Records(env.store)
    waits.until(
        lambda: reap_dead(env, rec, rec.request(rid)),
        lambda r: r.state not in ACTIVE,
        every=0.5,
        timeout=timeout,
        error=lambda r: WaitTimeout(f"health check {rid} still {r.state} after {timeout:g} s"),
    )
    return status(env, name, rid)


def cancel(env: Env, name: str) -> str:
    """Stop the active request's worker, remove its check containers and resume the
    nodes it drained (only those still drained for it)."""
    rec = Records(env.store)
    r = rec.active(name)
    if r is None:
        raise NotFound(f"cluster {name!r} has no active health check")
    if r.options.get("on_start"):
        raise BadInput(
            f"{r.id} checks new nodes of cluster {name!r} before they take jobs (on-start checks, run by "
            "the cluster's agent): it cannot be cancelled; it ends by itself",
            "cannot cancel",
        )
    _stop(r)
    hand_back(Cluster(env, name), r.id, r.nodes, on_start=False, strict=True)
    rec.set_state(r.id, RequestState.CANCELLED, "cancelled by the user", expect=ACTIVE)  # unless it ended meanwhile
    return r.id


def stop_for_delete(env: Env, name: str) -> None:
    """A deep health check's worker could recover (re-create) nodes during teardown:
    stop it first. Its check containers go with the cluster's containers."""
    rec = Records(env.store)
    act = rec.active(name)
    if act is not None and not act.options.get("on_start"):
        _stop(act)
    rec.forget(name)


def _stop(r: Request) -> None:
    """End a request's detached worker (its process group)."""
    if r.pid and alive(r.pid):
        try:
            os.killpg(r.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass


def all_passed(doc: dict[str, Any]) -> bool:
    """Did a finished request (status() document) pass on every node?"""
    r = doc.get("Request")
    return (
        r is not None
        and r["State"] == RequestState.COMPLETED
        and all(v == CheckState.PASSED for v in r.get("Results", {}).values())
    )
