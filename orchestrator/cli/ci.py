"""`hp submit`, `hp logs`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from .common import JsonOpt, env
from .output import Out


def submit(
    name: str,
    script: Path = typer.Argument(..., help="Batch script to run (copied to the login node)."),
    sbatch_args: Optional[list[str]] = typer.Argument(None, help="More sbatch arguments, after --."),
    partition: Optional[str] = typer.Option(None, "--partition", "-p", help="Partition (default: dev)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="Number of nodes."),
    timeout: float = typer.Option(
        3600, "--timeout", help="Seconds to wait for the job; then it is cancelled (exit 3)."
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Run a batch job as the default user, stream its output, exit with its exit code.

    Exit 1 when Slurm ended the job another way (cancelled, node failure), 3 on --timeout.
    Example: hp submit ci job.sh --nodes 2 -- --time=5
    """
    from ..ci.submit import submit as do_submit

    args = list(sbatch_args or [])
    if args and args[0] == "--":
        args = args[1:]

    def write(data: bytes) -> None:
        if not json_out:  # with --json, stdout is the document only; the output is in it
            sys.stdout.buffer.write(data)
            sys.stdout.flush()

    res = do_submit(env(), name, script, partition, nodes, args, timeout, write)
    out = Out(json_out)
    if json_out:
        out.json(res.as_dict())
    else:
        out.info(f"job {res.job_id} on {name} exited with code {res.exit_code} (output: {res.output_file})")
    raise typer.Exit(res.exit_code)


def logs(
    name: str,
    directory: Path = typer.Option(..., "--dir", "-d", help="Folder to write the logs into."),
    json_out: bool = JsonOpt,
) -> None:
    """Export a cluster's logs (also of a failed or half-made one); never the auth key.

    One folder per node that exists or recently existed (container log, Slurm logs and
    state), plus the cluster's events and slurm.conf."""
    from ..ci.logs import export_logs

    out = Out(json_out)
    doc = export_logs(env(), name, directory, log=out.info)
    if json_out:
        out.json(doc)
    else:
        out.info(f"wrote {len(doc['Files'])} files for {len(doc['Nodes'])} nodes to {directory}")


COMMANDS = (("submit", submit, None), ("logs", logs, None))
