"""CLI commands registered on the main app (see cli.py): `hp health-check`."""
from __future__ import annotations

from typing import Any, List, Optional

import typer

from .output import Out


def register(app: typer.Typer) -> None:
    hc = typer.Typer(help="Deep health checks (InstanceStress, InstanceConnectivity) on a cluster's nodes. "
                          "Exit codes: 0 success, 1 operation failed, 2 bad input, 3 timeout waiting.",
                     no_args_is_help=True)
    app.add_typer(hc, name="health-check")

    @hc.command("start")
    def start(
        name: str,
        group: List[str] = typer.Option([], "--group", "-g", help="Check every node of this group (repeatable)."),
        node: List[str] = typer.Option([], "--node", "-n", help="Check this node (repeatable)."),
        check: List[str] = typer.Option([], "--check", help="InstanceStress or InstanceConnectivity (default both)."),
        wait_idle_timeout: float = typer.Option(600, "--wait-idle-timeout", help="Seconds to wait for running jobs to end."),
        stress_seconds: int = typer.Option(3, "--stress-seconds", help="stress-ng run time per node."),
        vm_bytes: str = typer.Option("64M", "--vm-bytes", help="stress-ng memory stressor size."),
        dcgm_level: int = typer.Option(2, "--dcgm-level", help="dcgmi diag -r LEVEL on GPU nodes."),
        recovery_wait: float = typer.Option(90, "--recovery-wait",
                                            help="NodeRecovery Automatic: seconds a rebooted/replaced node has to come back."),
        wait: bool = typer.Option(False, "--wait", help="Block until the check is done."),
        timeout: float = typer.Option(1800, "--timeout", help="Seconds to wait with --wait."),
        json_out: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout."),
    ) -> None:
        """Start a deep health check; returns at once with the request id (work runs detached)."""
        from .cluster import Env
        from .errors import BadInput
        from .health import service

        problems = []
        if wait_idle_timeout < 0:
            problems.append(f"--wait-idle-timeout must be >= 0, got {wait_idle_timeout:g}")
        if stress_seconds < 1:
            problems.append(f"--stress-seconds must be >= 1, got {stress_seconds}")
        if dcgm_level not in (1, 2, 3, 4):
            problems.append(f"--dcgm-level must be 1-4, got {dcgm_level}")
        if recovery_wait <= 0:
            problems.append(f"--recovery-wait must be > 0, got {recovery_wait:g}")
        if problems:
            raise BadInput(problems, "invalid health-check request")
        env = Env()
        out = Out(json_out)
        rid = service.start(env, name, group, node, check, {
            "wait_idle_timeout": wait_idle_timeout, "stress_seconds": stress_seconds, "vm_bytes": vm_bytes,
            "dcgm_level": dcgm_level, "recovery_wait": recovery_wait})
        if not wait:
            if json_out:
                out.json({"ClusterName": name, "RequestId": rid})
            else:
                print(rid)
            return
        doc = service.wait(env, name, rid, timeout)
        _show(out, doc, json_out)
        bad = [v for v in (doc["Request"] or {}).get("Verdicts", {}).values() if not v.startswith("Passed")]
        if doc["Request"]["State"] != "Completed" or bad:
            raise typer.Exit(1)

    @hc.command("status")
    def status(name: str, request: Optional[str] = typer.Option(None, "--request", help="A request id (default: latest)."),
               json_out: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")) -> None:
        """Progress and results of the latest (or given) health check, per group and node."""
        from .cluster import Env
        from .health import service

        _show(Out(json_out), service.status(Env(), name, request), json_out)

    @hc.command("cancel")
    def cancel(name: str) -> None:
        """Stop the active health check and resume the nodes it drained."""
        from .cluster import Env
        from .health import service

        print(f"cancelled {service.cancel(Env(), name)}")


def _show(out: Out, doc: dict[str, Any], json_out: bool) -> None:
    if json_out:
        out.json(doc)
        return
    r = doc["Request"]
    if r is None:
        print(f"{doc['ClusterName']}: no health check yet")
        return
    print(f"{r['Id']}: {r['State']}  checks {', '.join(r['Checks'])}  started {r['CreationTime']}"
          + (f"  ended {r['EndTime']}" if r["EndTime"] else "") + (f"  ({r['Message']})" if r["Message"] else ""))
    rows = []
    for g in r["InstanceGroups"]:
        for n in g["Nodes"]:
            for c in n["Checks"]:
                figs = ", ".join(f"{k}={v:.4g}" for k, v in list(c["Figures"].items())[:8])
                rows.append([g["InstanceGroupName"], n["Node"], c["Check"], c["Attempt"], c["State"],
                             (c["StartTime"] or "")[11:19], (c["EndTime"] or "")[11:19],
                             "; ".join(c["Reasons"])[:160] or figs, c["Output"] or ""])
    out.table(None, ["GROUP", "NODE", "CHECK", "ATTEMPT", "STATE", "START", "END", "WHY / FIGURES", "OUTPUT"], rows)
    for n, v in r.get("Verdicts", {}).items():
        print(f"{n}: {v}")
