"""CLI commands registered on the main app (see cli.py)."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
