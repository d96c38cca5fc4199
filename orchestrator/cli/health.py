"""`hp health-check start|status|cancel`."""

from __future__ import annotations

from typing import Any, Optional

import typer

from .common import JsonOpt, env, sub_app
from .output import Out

health_app = sub_app("Deep health checks (InstanceStress, InstanceConnectivity) on a cluster's nodes.")


@health_app.command("start")
def start(
    name: str,
    group: list[str] = typer.Option([], "--group", "-g", help="Check every node of this group (repeatable)."),
    node: list[str] = typer.Option([], "--node", "-n", help="Check this node (repeatable)."),
    check: list[str] = typer.Option([], "--check", help="InstanceStress or InstanceConnectivity (default both)."),
    wait_idle_timeout: float = typer.Option(
        600, "--wait-idle-timeout", help="Seconds to wait for running jobs to end."
    ),
    stress_seconds: int = typer.Option(3, "--stress-seconds", help="stress-ng run time per node."),
    vm_bytes: str = typer.Option("64M", "--vm-bytes", help="stress-ng memory stressor size (e.g. 64M, 1G, 50%)."),
    dcgm_level: int = typer.Option(2, "--dcgm-level", help="dcgmi diag -r LEVEL on GPU nodes (1-4)."),
    recovery_wait: float = typer.Option(
        90, "--recovery-wait", help="NodeRecovery Automatic: seconds a rebooted/replaced node has to come back."
    ),
    wait: bool = typer.Option(False, "--wait", help="Block until the check is done."),
    timeout: float = typer.Option(1800, "--timeout", help="Seconds to wait with --wait."),
    json_out: bool = JsonOpt,
) -> None:
    """Start a deep health check; returns at once with the request id (work runs detached)."""
    from ..errors import BadInput
    from ..health.requests import service

    out = Out(json_out)
    options = {
        "wait_idle_timeout": wait_idle_timeout,
        "stress_seconds": stress_seconds,
        "vm_bytes": vm_bytes,
        "dcgm_level": dcgm_level,
        "recovery_wait": recovery_wait,
    }
    if problems := service.option_problems({**options, **({"timeout": timeout} if wait else {})}):
        raise BadInput(problems, "invalid health-check request")  # before the store or Docker is touched
    e = env()
    rid = service.start(e, name, group, node, check, options)
    if not wait:
        out.json({"ClusterName": name, "RequestId": rid}) if json_out else print(rid)
        return
    doc = service.wait(e, name, rid, timeout)
    show(out, doc, json_out)
    if not service.all_passed(doc):
        raise typer.Exit(1)


@health_app.command("status")
def status(
    name: str,
    request: Optional[str] = typer.Option(None, "--request", help="A request id (default: latest)."),
    json_out: bool = JsonOpt,
) -> None:
    """Progress and results of the latest (or given) health check, per group and node."""
    from ..health.requests import service

    show(Out(json_out), service.status(env(), name, request), json_out)


@health_app.command("cancel")
def cancel(name: str) -> None:
    """Stop the active health check and resume the nodes it drained."""
    from ..health.requests import service

    print(f"cancelled {service.cancel(env(), name)}")


def show(out: Out, doc: dict[str, Any], json_out: bool) -> None:
    if json_out:
        out.json(doc)
        return
    r = doc["Request"]
    if r is None:
        print(f"{doc['ClusterName']}: no health check yet")
        return
    print(
        f"{r['Id']}: {r['State']}  checks {', '.join(r['Checks'])}  started {r['CreationTime']}"
        + (f"  ended {r['EndTime']}" if r["EndTime"] else "")
        + (f"  ({r['Message']})" if r["Message"] else "")
    )
    rows = []
    for g in r["InstanceGroups"]:
        for n in g["Nodes"]:
            for c in n["Checks"]:
                figs = ", ".join(f"{k}={v:.4g}" for k, v in list(c["Figures"].items())[:8])
                rows.append(
                    [
                        g["InstanceGroupName"],
                        n["Node"],
                        c["Check"],
                        c["Attempt"],
                        c["State"],
                        (c["StartTime"] or "")[11:19],
                        (c["EndTime"] or "")[11:19],
                        "; ".join(c["Reasons"])[:160] or figs,
                        c["Output"] or "",
                    ]
                )
    out.table(None, ["GROUP", "NODE", "CHECK", "ATTEMPT", "STATE", "START", "END", "WHY / FIGURES", "OUTPUT"], rows)
    for n, v in r.get("Verdicts", {}).items():
        print(f"{n}: {v}")


GROUPS = (("health-check", health_app),)
