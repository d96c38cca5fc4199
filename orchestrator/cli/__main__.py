"""python -m orchestrator.cli ...: the `hp` command."""

from . import run

run()
