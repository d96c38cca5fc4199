"""`hp upgrade NAME --slurm RELEASE`: a running cluster onto a newer Slurm release
(orchestrator/cluster/upgrade.py; the cluster's agent does the work)."""

from __future__ import annotations

import typer

from .common import JsonOpt, env
from .output import Out

WAIT_POLL_S = 1.0


def upgrade(
    name: str,
    slurm: str = typer.Option(..., "--slurm", metavar="RELEASE", help="The Slurm release to move the cluster onto."),
    batch_size: int = typer.Option(1, "--batch-size", help="Compute nodes drained and replaced at a time."),
    wait: bool = typer.Option(False, "--wait/--no-wait", help="Show per-group progress until the upgrade ends."),
    timeout: float = typer.Option(1800, "--timeout", help="With --wait: seconds before giving up waiting (exit 3)."),
    json_out: bool = JsonOpt,
) -> None:
    """Upgrade a running cluster's Slurm (HyperPod's UpdateClusterSoftware): slurmdbd and its
    database and slurmctld first, then login nodes, then compute nodes --batch-size at a
    time, each drained and replaced once its jobs ended. Returns at once (--wait to follow)."""
    from .. import waits
    from ..cluster.upgrade import progress, start
    from ..errors import BadInput, OperationFailed, WaitTimeout

    if wait and timeout <= 0:
        raise BadInput(f"--timeout must be positive, got {timeout:g}")
    e = env()
    out = Out(json_out)
    doc = start(e, name, slurm, batch_size)
    if not json_out:
        out.info(f"{name}: upgrading Slurm {doc['From']} -> {doc['To']} (operation {doc['OperationId']})")
    if wait:
        shown = [""]

        def look() -> dict:
            now = progress(e, name)
            line = ", ".join(f"{g} {v['Upgraded']}/{v['Nodes']}" for g, v in sorted(now["Groups"].items()))
            if line != shown[0] and not json_out:
                out.info(f"{name}: on Slurm {doc['To']}: {line}")
                shown[0] = line
            return now

        doc = waits.poll(look, lambda d: d["Status"] != "InProgress", every=WAIT_POLL_S, timeout=timeout)
        if doc["Status"] == "InProgress":
            raise WaitTimeout(f"the upgrade of {name} did not end within {timeout:g} s (it goes on)")
        if doc["Status"] != "Done":
            raise OperationFailed(doc.get("Message") or f"the upgrade of {name} {doc['Status']}")
        if not json_out:
            out.info(doc.get("Message", ""))
    if json_out:
        out.json(progress(e, name))


COMMANDS = (("upgrade", upgrade),)
