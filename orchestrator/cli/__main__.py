"""python -m orchestrator.cli ...: the `hp` command."""

from . import main

main()
