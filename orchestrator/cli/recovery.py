"""`hp reboot` and `hp replace`: node recovery by hand."""

from __future__ import annotations

import typer

from .common import EXIT_CODES, JsonOpt, env
from .output import Out

ReasonOpt = typer.Option("requested by hand", "--reason", help="Why: recorded in the node's status and events.")
TimeoutOpt = typer.Option(60.0, "--timeout", help="Seconds to wait for each node to be usable again.")


def reboot(
    name: str,
    nodes: list[str] = typer.Argument(..., help="Slurm node names, e.g. cpu-1 controller-1."),
    reason: str = ReasonOpt,
    timeout: float = TimeoutOpt,
    json_out: bool = JsonOpt,
) -> None:
    _run("reboot", name, nodes, reason, timeout, json_out)


def replace(
    name: str,
    nodes: list[str] = typer.Argument(..., help="Slurm node names, e.g. cpu-1."),
    reason: str = ReasonOpt,
    timeout: float = TimeoutOpt,
    json_out: bool = JsonOpt,
) -> None:
    _run("replace", name, nodes, reason, timeout, json_out)


def _run(action: str, name: str, nodes: list[str], reason: str, timeout: float, json_out: bool) -> None:
    from ..recovery.by_hand import run

    rows = run(env(), action, name, nodes, reason, timeout)
    out = Out(json_out)
    if json_out:
        out.json({"ClusterName": name, "Nodes": rows})
    else:
        out.table(
            None,
            ["NODE", "ACTION", "RESULT", "NODE ID"],
            [
                [r["SlurmNodeName"], action, "back in service" if r["Succeeded"] else "FAILED", r["NodeId"] or ""]
                for r in rows
            ],
        )
    from ..recovery.by_hand import check_all_back

    check_all_back(name, action, rows)


COMMANDS = (
    (
        "reboot",
        reboot,
        None,
        "Reboot nodes (restart their containers) and wait until they are usable in Slurm again. "
        f"The controller can be rebooted. {EXIT_CODES}",
    ),
    (
        "replace",
        replace,
        None,
        "Replace nodes: remove their containers and launch new ones with the same Slurm names (new NodeIds). "
        f"The controller cannot be replaced. {EXIT_CODES}",
    ),
)
