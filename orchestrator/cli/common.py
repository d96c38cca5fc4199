"""What every command module of the CLI shares: the environment, options, progress."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import typer

from ..releases import DEFAULT, names
from .output import Out

if TYPE_CHECKING:
    from ..core.context import Env

EXIT_CODES = "Exit codes: 0 success, 1 operation failed, 2 bad input, 3 timeout waiting."
JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")
# The Slurm release (orchestrator/releases.py), checked by hp (releases.problem), not typer: a
# bad one is named with the command's other problems
SlurmOpt = typer.Option(None, "--slurm", metavar="RELEASE", help=f"Slurm release: {names()} (default {DEFAULT}).")


def env() -> Env:
    """The program's environment (orchestrator/assembly.py), imported when a command runs: the
    CLI itself starts with typer alone, and each command loads only what it uses (docker-py,
    pydantic... ~0.4 s)."""
    from .. import assembly

    return assembly.env()


def sub_app(help_text: str) -> typer.Typer:
    """A command group (hp images, hp capacity, hp health-check...)."""
    return typer.Typer(help=f"{help_text} {EXIT_CODES}", no_args_is_help=True)


class CliProgress:
    """Stage lines (and per-group counts) on stderr."""

    def __init__(self, out: Out):
        self.out = out
        self.t0 = time.monotonic()
        self.last: tuple[str, str] | None = None
        self.last_groups: dict[str, tuple[int, int, int]] = {}

    def elapsed(self) -> str:
        return f"[{time.monotonic() - self.t0:5.1f}s]"

    def stage(self, name: str, detail: str = "") -> None:
        if (name, detail) != self.last:
            self.last = (name, detail)
            self.out.info(f"{self.elapsed()} {name}: {detail}")

    def groups(self, counts: dict[str, tuple[int, int, int]]) -> None:
        if counts != self.last_groups:
            self.last_groups = counts
            txt = "  ".join(f"{g} {c}/{t}" + (f" ({f} failed)" if f else "") for g, (c, t, f) in counts.items())
            self.out.info(f"{self.elapsed()} nodes: {txt}")
