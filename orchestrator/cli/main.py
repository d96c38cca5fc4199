"""The `hp` command line as a typer app: parsing, output and exit codes only, over the
library. Every command module lists its commands (COMMANDS) and command groups
(GROUPS); they are registered in one place, below. The process's entry is `run` in
__init__.py, which tries the quick `hp exec` (quick.py) before it loads this module.

Exit codes: 0 success, 1 operation failed, 2 bad input, 3 timeout waiting.
"""

from __future__ import annotations

import atexit
import copy
import functools
import gc
import sys
from collections.abc import Callable
from typing import Any

import typer

from ..errors import HpError
from . import ci, cluster, health, hosts, images, recovery, scale, services, software
from .common import EXIT_CODES
from .output import Out

app = typer.Typer(
    name="hp",
    help="HyperPod-style Slurm clusters on Docker: continuous provisioning, deep health checks, "
    f"node recovery.\n\n{EXIT_CODES}",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _register() -> None:
    for m in (cluster, scale, health, recovery, ci, images, hosts, services, software):
        for name, fn, *rest in getattr(m, "COMMANDS", ()):
            settings = rest[0] if rest else None
            help_text = rest[1] if len(rest) > 1 else None
            app.command(name, context_settings=settings, help=help_text)(fn)
        for name, group in getattr(m, "GROUPS", ()):
            app.add_typer(group, name=name)


_register()


@functools.cache
def command(name: str | None = None) -> Callable[..., Any]:
    """The click command tree of `app`, built once per process (typer builds it anew at
    every `app()` call: half the time of an in-process `hp` call in the tests). With
    `name`, one of `app`'s commands or groups: the same tree with that one alone, under
    the same `hp` group (typer reads every command's signature to build one: the whole
    tree is ~25 ms of CPU of each `hp` call, one command ~1 ms). A command line that names
    none (`hp`, `hp --help`, a mistyped command) gets the whole tree."""
    if name is None:
        return typer.main.get_command(app)
    one = copy.copy(app)  # the same settings (help, context, no completion)
    one.registered_commands = [c for c in app.registered_commands if c.name == name]
    one.registered_groups = [g for g in app.registered_groups if g.name == name]
    return typer.main.get_group(one)


def names() -> frozenset[str]:
    """The names of `app`'s commands and groups."""
    return frozenset(c.name for c in app.registered_commands) | frozenset(g.name for g in app.registered_groups)


# click's usage errors (typer vendors click as typer._click, so they are told apart by name)
USAGE_ERRORS = (
    "UsageError",
    "BadParameter",
    "NoSuchOption",
    "MissingParameter",
    "BadOptionUsage",
    "BadArgumentUsage",
    "NoArgsIsHelpError",  # `hp`, `hp images`...: the help, exit 2
)


def run() -> None:
    """The `hp` process (its console script, `python -m orchestrator.cli`): `main`, and at
    its exit no collection of cyclic garbage (gc.freeze before the interpreter's own
    collections): the process ends anyway, and those collections over the modules it
    loaded (docker-py, pydantic...) took 0.05-0.1 s of every hp command's time. Callers of
    `main` in a long-lived process (the tests) keep their collector."""
    atexit.register(gc.freeze)
    main()


def main() -> None:
    out = Out()
    try:
        first = sys.argv[1] if len(sys.argv) > 1 else None
        rc = command(first if first in names() else None)(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except HpError as e:
        out.error(str(e))
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        out.error("interrupted")
        sys.exit(130)
    except Exception as e:  # the command-line parser's own errors; anything else is a bug: traceback
        kind = type(e).__name__
        if kind in USAGE_ERRORS and hasattr(e, "show"):
            e.show()
            sys.exit(2)
        if kind == "Abort":
            sys.exit(130)
        raise
