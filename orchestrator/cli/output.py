"""Output for people (rich tables, progress on a TTY) and for machines (--json, plain)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any


def is_tty() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class Out:
    def __init__(self, json_mode: bool = False):
        self.json_mode = json_mode
        self.tty = is_tty()
        self._console: Any = None
        self._err: Any = None

    @property
    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(no_color=not self.tty, highlight=False, soft_wrap=not self.tty)
        return self._console

    @property
    def err_console(self) -> Any:
        if self._err is None:
            from rich.console import Console

            self._err = Console(
                stderr=True,
                no_color=not sys.stderr.isatty() or bool(os.environ.get("NO_COLOR")),
                highlight=False,
                soft_wrap=True,
            )
        return self._err

    def json(self, doc: Any) -> None:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        sys.stdout.flush()

    def info(self, msg: str) -> None:
        """Progress and notes go to stderr so stdout stays parseable."""
        if self.tty and sys.stderr.isatty():
            self.err_console.print(msg)
        else:
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()

    def error(self, msg: str) -> None:
        if sys.stderr.isatty() and not os.environ.get("NO_COLOR"):
            self.err_console.print(f"[bold red]error:[/] {msg}", markup=True)
        else:
            sys.stderr.write(f"error: {msg}\n")

    def table(self, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if not self.tty:  # plain, aligned text: greppable, no box characters
            cells = [list(map(str, columns))] + [["" if v is None else str(v) for v in r] for r in rows]
            widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
            if title:
                print(title)
            for r in cells:
                print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
            return
        from rich.table import Table

        t = Table(title=title, title_justify="left")
        for c in columns:
            t.add_column(c)
        for r in rows:
            t.add_row(*("" if v is None else str(v) for v in r))
        self.console.print(t)
