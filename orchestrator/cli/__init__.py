"""`hp`: HyperPod-style Slurm clusters on Docker; the process's entry (its console script,
`python -m orchestrator.cli`). `hp exec` of a running cluster goes the quick way
(quick.py: no parser, no docker-py, within 1.5x of a `docker exec`); every other command,
and every case the quick way leaves, goes through the typer app (main.py), loaded then.
"""

from __future__ import annotations

import sys

from . import quick


def run() -> None:
    rc = quick.run(sys.argv[1:])
    if rc is not None:
        sys.exit(rc)
    from .main import run as run_app  # typer and the commands: loaded for the full way only

    run_app()
