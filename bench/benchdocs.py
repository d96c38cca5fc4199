"""The benchmarks write their own figures into docs/benchmarks.md (`--write-docs`).

Each benchmark owns sections between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`
lines: a run replaces only its own sections, with what it printed on stdout, headed by
the date (UTC), the commit (`-dirty` when tracked files differ from it) and the machine
(cores, memory, OS, Docker's version; never a host name). A section not yet in the file
is appended under a heading of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def begin(name: str) -> str:
    return f"<!-- bench:{name} -->"


def end(name: str) -> str:
    return f"<!-- /bench:{name} -->"


@dataclass(frozen=True)
class Machine:
    cores: int
    memory_gib: float
    os: str
    kernel: str
    docker: str

    def __str__(self) -> str:
        return (
            f"{self.cores} cores, {self.memory_gib:.1f} GiB memory, {self.os} (Linux {self.kernel}), "
            f"Docker {self.docker}"
        )


def _docker_version() -> str:
    try:
        r = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, timeout=15
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"


def machine(
    meminfo: Path = Path("/proc/meminfo"),
    os_release: Path = Path("/etc/os-release"),
    docker_version: Callable[[], str] = _docker_version,
) -> Machine:
    """The facts of this machine a figure depends on (no host name)."""
    kib = next((int(line.split()[1]) for line in meminfo.read_text().splitlines() if line.startswith("MemTotal:")), 0)
    pretty = next(
        (
            line.split("=", 1)[1].strip().strip('"')
            for line in (os_release.read_text().splitlines() if os_release.exists() else [])
            if line.startswith("PRETTY_NAME=")
        ),
        platform.system(),
    )
    return Machine(os.cpu_count() or 1, kib / 2**20, pretty, platform.release(), docker_version())


def commit(root: Path = ROOT) -> str:
    """`git rev-parse --short HEAD`, with `-dirty` when a tracked file differs from it
    (docs/benchmarks.md itself left out: an earlier bench's section does not make the
    next one dirty)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/benchmarks.md")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed else "")


def header(when: datetime.datetime, rev: str, host: Machine, command: str) -> str:
    return f"Measured {when:%Y-%m-%d %H:%M} UTC at commit `{rev}` on {host}, with `{command}`:"


def render(head: str, output: str) -> str:
    """A section's body: the header line, then what the benchmark printed, verbatim."""
    return f"{head}\n\n```text\n{output.rstrip() or '(no output)'}\n```"


def _span(text: str, name: str) -> tuple[int, int] | None:
    """Where section `name` (its marker lines included) is in `text`; None when absent."""
    starts = [m.start() for m in re.finditer(rf"^{re.escape(begin(name))}$", text, re.M)]
    ends = [m.end() for m in re.finditer(rf"^{re.escape(end(name))}$", text, re.M)]
    if not starts and not ends:
        return None
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(f"section {name!r}: {len(starts)} opening and {len(ends)} closing markers, or out of order")
    return starts[0], ends[0]


def replace_section(text: str, name: str, body: str, title: str | None = None) -> str:
    """`text` with section `name` holding `body` and nothing else changed; a section not in
    `text` is appended under `## title` (default: the name)."""
    if not NAME.fullmatch(name):
        raise ValueError(f"section name {name!r} must match {NAME.pattern}")
    block = f"{begin(name)}\n{body.strip()}\n{end(name)}"
    span = _span(text, name)
    if span is None:
        return f"{text.rstrip()}\n\n## {title or name}\n\n{block}\n".lstrip()
    return text[: span[0]] + block + text[span[1] :]


def section_body(text: str, name: str) -> str | None:
    """What section `name` holds (None when absent)."""
    span = _span(text, name)
    if span is None:
        return None
    return text[span[0] + len(begin(name)) : span[1] - len(end(name))].strip()


def write(name: str, body: str, doc: Path = DOC, title: str | None = None) -> None:
    old = doc.read_text() if doc.exists() else ""
    doc.write_text(replace_section(old, name, body, title))


def add_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--write-docs",
        action="store_true",
        help="also write what this run prints into its own section(s) of docs/benchmarks.md",
    )


def command_line(argv: list[str]) -> str:
    """The command as run from the repository's root, without --write-docs."""
    return shlex.join([f"bench/{Path(argv[0]).name}", *(a for a in argv[1:] if a != "--write-docs")])


class _Tee(io.TextIOBase):
    def __init__(self, out: TextIO) -> None:
        self.out, self.seen = out, io.StringIO()

    def write(self, s: str) -> int:
        self.seen.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()


class Recording:
    """What a `section` block yields: `discard()` keeps the block's figures out of the file
    (a run that measured nothing, such as a GPU part on a host without GPUs)."""

    def __init__(self) -> None:
        self.kept = True

    def discard(self) -> None:
        self.kept = False


@contextlib.contextmanager
def section(
    name: str,
    enabled: bool,
    title: str | None = None,
    doc: Path = DOC,
    facts: Callable[[], Machine] = machine,
) -> Iterator[Recording]:
    """Run the block printing as usual; with `enabled`, what it printed on stdout becomes
    section `name` of `doc` once the block ends without an exception (a failed run
    leaves the figures there as they were)."""
    rec = Recording()
    if not enabled:
        yield rec
        return
    head = header(datetime.datetime.now(datetime.UTC), commit(), facts(), command_line(sys.argv))
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        yield rec
    finally:
        sys.stdout = tee.out
    if rec.kept:
        write(name, render(head, tee.seen.getvalue()), doc, title)
        print(f"(written to {doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc}: section {name})")
