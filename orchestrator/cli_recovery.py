"""`hp reboot` and `hp replace`: node recovery by hand (registered on the main app, see cli.py)."""
from __future__ import annotations

from typing import Any, Callable

import typer

from .errors import BadInput, NotFound, OperationFailed
from .output import Out

EXIT_CODES = "Exit codes: 0 success, 1 operation failed, 2 bad input, 3 timeout waiting."


def register(app: typer.Typer) -> None:
    app.command("reboot", help="Reboot nodes (restart their containers) and wait until they are usable in "
                               f"Slurm again. The controller can be rebooted. {EXIT_CODES}")(reboot)
    app.command("replace", help="Replace nodes: remove their containers and launch new ones with the same Slurm "
                                f"names (new NodeIds). The controller cannot be replaced. {EXIT_CODES}")(replace)


ReasonOpt = typer.Option("requested by hand", "--reason", help="Why: recorded in the node's status and events.")
TimeoutOpt = typer.Option(60.0, "--timeout", help="Seconds to wait for each node to be usable again.")
JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")


def reboot(name: str, nodes: list[str] = typer.Argument(..., help="Slurm node names, e.g. cpu-1 controller-1."),
           reason: str = ReasonOpt, timeout: float = TimeoutOpt, json_out: bool = JsonOpt) -> None:
    from . import recovery

    _run("reboot", recovery.reboot, name, nodes, reason, timeout, json_out)


def replace(name: str, nodes: list[str] = typer.Argument(..., help="Slurm node names, e.g. cpu-1."),
            reason: str = ReasonOpt, timeout: float = TimeoutOpt, json_out: bool = JsonOpt) -> None:
    from . import recovery

    _run("replace", recovery.replace, name, nodes, reason, timeout, json_out)


def _run(action: str, fn: Callable[..., bool], name: str, nodes: list[str], reason: str, timeout: float,
         json_out: bool) -> None:
    from .cluster import Cluster, Env, parallel

    env = Env()
    if env.store.cluster(name) is None:
        raise NotFound(f"cluster {name!r} does not exist")
    cluster = Cluster(env, name)
    wanted = list(dict.fromkeys(nodes))
    _check(action, cluster, wanted, timeout)
    results = parallel(lambda n: fn(cluster, n, reason, timeout), wanted)
    after = cluster.node_containers()
    rows: list[dict[str, Any]] = [
        {"SlurmNodeName": n, "Action": action, "Succeeded": ok,
         "NodeId": _node_id(after[n].id) if n in after else None}
        for n, ok in zip(wanted, results)]
    out = Out(json_out)
    if json_out:
        out.json({"ClusterName": name, "Nodes": rows})
    else:
        out.table(None, ["NODE", "ACTION", "RESULT", "NODE ID"],
                  [[r["SlurmNodeName"], action, "back in service" if r["Succeeded"] else "FAILED", r["NodeId"] or ""]
                   for r in rows])
    failed = [r["SlurmNodeName"] for r in rows if not r["Succeeded"]]
    if failed:
        raise OperationFailed(f"{len(failed)} node(s) not back in service after {action}: {', '.join(failed)} "
                              f"(see 'hp nodes {name}' and the cluster's events)")


def _check(action: str, cluster: Any, nodes: list[str], timeout: float) -> None:
    """Every problem with the request at once (BadInput, nothing done)."""
    from . import recovery

    problems = []
    if timeout <= 0:
        problems.append(f"--timeout must be positive, got {timeout:g}")
    for n in nodes:
        try:
            t = recovery.target(cluster, n)
        except BadInput as e:
            problems += e.problems
            continue
        if action == "replace" and t.role == "controller":
            problems.append(f"{n} is the controller: it can be rebooted ('hp reboot {cluster.name} {n}'), "
                            "not replaced (its state lives on its volume)")
        if action == "reboot" and t.container is None:
            problems.append(f"{n} has no container to reboot; replace it with 'hp replace {cluster.name} {n}'")
    if problems:
        raise BadInput(problems, f"cannot {action}")


def _node_id(cid: str) -> str:
    from .naming import node_id

    return node_id(cid)
