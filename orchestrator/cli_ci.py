"""CI commands: `hp submit`, `hp logs`, `hp images save/load/key` (logic in ci.py)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from .output import Out

JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")


def _env():  # noqa: ANN202
    from .cluster import Env

    return Env()


def submit(
    name: str,
    script: Path = typer.Argument(..., help="Batch script to run (copied to the login node)."),
    sbatch_args: Optional[list[str]] = typer.Argument(None, help="More sbatch arguments, after --."),
    partition: Optional[str] = typer.Option(None, "--partition", "-p", help="Partition (default: dev)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="Number of nodes."),
    timeout: float = typer.Option(3600, "--timeout", help="Seconds to wait for the job; then it is cancelled (exit 3)."),
    json_out: bool = JsonOpt,
) -> None:
    """Run a batch job (sbatch --wait) as the default user, show its output, exit with its exit code.

    Example: hp submit ci job.sh --nodes 2 -- --time=5
    """
    from .ci import submit as do_submit

    args = list(sbatch_args or [])
    if args and args[0] == "--":
        args = args[1:]

    def write(data: bytes) -> None:
        if not json_out:  # with --json, stdout is the document only; the output is in it
            sys.stdout.buffer.write(data)
            sys.stdout.flush()

    res = do_submit(_env(), name, script, partition, nodes, args, timeout, write)
    out = Out(json_out)
    if json_out:
        out.json(res.as_dict())
    else:
        out.info(f"job {res.job_id} on {name} exited with code {res.exit_code} (output: {res.output_file})")
    raise typer.Exit(res.exit_code)


def logs(name: str, directory: Path = typer.Option(..., "--dir", "-d", help="Folder to write the logs into."),
         json_out: bool = JsonOpt) -> None:
    """Export a cluster's logs (also a failed or half-made one): one folder per node with its
    container log, Slurm logs and state, plus the cluster's events and slurm.conf (never the key)."""
    from .ci import export_logs

    out = Out(json_out)
    doc = export_logs(_env(), name, directory, log=out.info)
    if json_out:
        out.json(doc)
    else:
        out.info(f"wrote {len(doc['Files'])} files for {len(doc['Nodes'])} nodes to {directory}")


def images_save(directory: Path = typer.Argument(..., help="Folder to write the images and manifest into."),
                json_out: bool = JsonOpt) -> None:
    """Save hp's images (base, node, check) as one tar plus a manifest, e.g. for a CI cache."""
    from .ci import save_images

    out = Out(json_out)
    doc = save_images(_env(), directory, log=out.info)
    if json_out:
        out.json(doc)
    else:
        out.info(f"saved {len(doc['Images'])} images ({doc['Size'] / 1e6:.0f} MB), key {doc['Key']}, to {directory}")


def images_load(directory: Path = typer.Argument(..., help="Folder written by 'hp images save'."),
                force: bool = typer.Option(False, "--force", help="Load even when every image is already present."),
                json_out: bool = JsonOpt) -> None:
    """Load images saved by 'hp images save', after checking the file against its manifest."""
    from .ci import load_images

    out = Out(json_out)
    doc = load_images(_env(), directory, log=out.info, force=force)
    if json_out:
        out.json(doc)
    else:
        out.info(f"{'loaded' if doc['Loaded'] else 'already present'}: "
                 + ", ".join(i["Ref"] for i in doc["Images"]))


def images_key(json_out: bool = JsonOpt) -> None:
    """Print the hash of every image's inputs (a cache key; needs no Docker)."""
    from .ci import images_key as key

    k = key(_env())
    if json_out:
        Out(True).json({"Key": k})
    else:
        print(k)


def register(app: typer.Typer) -> None:
    app.command()(submit)
    app.command()(logs)
    # The `images` group of the app we are given (not `from .cli import images_app`: under
    # `python -m orchestrator.cli` that would be a second copy of the module).
    images_app = next(g.typer_instance for g in app.registered_groups if g.name == "images")
    images_app.command("save")(images_save)
    images_app.command("load")(images_load)
    images_app.command("key")(images_key)
