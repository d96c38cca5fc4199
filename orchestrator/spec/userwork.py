"""The rules of what a spec brings for the user's work: host folders mounted on the login
and compute nodes (`Mounts`, `hp create --mount`) and Debian packages added to their
images (`NodePackages`). Checked on the raw document, so every problem is reported with
the spec's others."""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

from ..errors import BadInput

# Where a mount would hide or replace what the node runs on: the system, Slurm's state,
# spool and sockets, and hp's /home (the cluster's shared volume; a folder inside it may
# be mounted: a CI checkout under /home/runner is).
RESERVED = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib64",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var/lib",
    "/var/log/slurm",
    "/var/spool/slurmctld",
    "/var/spool/slurmd",
)
HOME = "/home"
# Debian policy: lower case letters, digits, + - . ; at least two characters, starting alphanumeric
PACKAGE_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
PACKAGES_MAX = 200
MOUNTS_MAX = 32
# characters a bind mount's source or target cannot hold (Docker's "SRC:DST:MODE" syntax)
# or that no path needs: control characters
_BAD_PATH = re.compile(r"[:,\x00-\x1f\x7f]")


def _path_problems(where: str, path: object) -> list[str]:
    if not isinstance(path, str):
        return []  # the type error is pydantic's to report
    shown = repr(path if len(path) <= 200 else path[:197] + "...")
    if not path.startswith("/"):
        return [f"{where}: {shown} must be an absolute path"]
    if _BAD_PATH.search(path):
        return [f"{where}: {shown} holds ':', ',' or a control character"]
    if posixpath.normpath(path) != path.rstrip("/") and path != "/":
        return [f"{where}: {shown} is not a normal path (write {posixpath.normpath(path)!r})"]
    return []


def _reserved(target: str) -> str | None:
    t = posixpath.normpath(target)
    for r in RESERVED:
        if t == r or t.startswith(r + "/"):
            return f"is inside {r}, which the node's system or Slurm uses"
        if r.startswith(t.rstrip("/") + "/"):
            return f"would hide {r}, which the node's system or Slurm uses"
    if t == HOME:
        return "is hp's /home (the cluster's shared volume; a folder inside it may be mounted)"
    return None


def mount_problems(raw: dict[str, Any], on_host: bool = True) -> list[str]:
    """Problems of the spec's Mounts. `on_host`: also that each Source is a folder here
    (not for the stored spec of a cluster that exists: it must stay readable)."""
    mounts = raw.get("Mounts")
    if not isinstance(mounts, list):
        return []
    problems = []
    if len(mounts) > MOUNTS_MAX:
        problems.append(f"Mounts: at most {MOUNTS_MAX} mounts, got {len(mounts)}")
    targets: dict[str, int] = {}
    for i, m in enumerate(mounts[:MOUNTS_MAX]):
        if not isinstance(m, dict):
            continue
        where = f"Mounts[{i}]"
        src = m.get("Source")
        tgt = m["Target"] if m.get("Target") is not None else src
        src_bad = _path_problems(f"{where}.Source", src)
        problems += src_bad
        if isinstance(src, str) and not src_bad and on_host and not os.path.isdir(src):
            problems.append(
                f"{where}.Source: {src!r} " + ("is not a folder" if os.path.exists(src) else "does not exist")
            )
        tgt_where = f"{where}.Target" if m.get("Target") is not None else f"{where} (Target: its Source)"
        # an implicit Target is its Source: a Source's problems are not named twice
        tgt_bad = _path_problems(tgt_where, tgt) if m.get("Target") is not None else src_bad
        problems += tgt_bad if m.get("Target") is not None else []
        if isinstance(tgt, str) and not tgt_bad:
            if why := _reserved(tgt):
                problems.append(f"{tgt_where}: {tgt!r} {why}")
            t = posixpath.normpath(tgt)
            if t in targets:
                problems.append(f"{tgt_where}: {tgt!r} is already the Target of Mounts[{targets[t]}]")
            targets.setdefault(t, i)
    return problems


def package_problems(raw: dict[str, Any]) -> list[str]:
    """Problems of the spec's NodePackages: Debian package names only (no versions, no
    options, nothing a shell would read)."""
    pkgs = raw.get("NodePackages")
    if not isinstance(pkgs, list):
        return []
    problems = []
    if len(pkgs) > PACKAGES_MAX:
        problems.append(f"NodePackages: at most {PACKAGES_MAX} packages, got {len(pkgs)}")
    for i, p in enumerate(pkgs[:PACKAGES_MAX]):
        if isinstance(p, str) and not PACKAGE_RE.fullmatch(p):
            shown = p if len(p) <= 60 else p[:57] + "..."
            problems.append(
                f"NodePackages[{i}]: {shown!r} is not a Debian package name "
                "(lower case letters, digits, '+', '-', '.'; at least 2 characters, starting with a letter or digit)"
            )
    return problems


def package_key(packages: list[str] | None) -> tuple[str, ...]:
    """NodePackages as the derived image is keyed by: sorted, each once."""
    return tuple(sorted(set(packages or ())))


def packages_of(raw: object) -> tuple[str, ...]:
    """A spec document's NodePackages, checked (BadInput naming every problem), for what
    needs only them (`hp images key|build|save -f SPEC`)."""
    pkgs = raw.get("NodePackages") if isinstance(raw, dict) else None
    if pkgs is None:
        return ()
    if not isinstance(pkgs, list) or not all(isinstance(p, str) for p in pkgs):
        raise BadInput("NodePackages: must be a list of Debian package names (strings)", "invalid cluster spec")
    if problems := package_problems(raw):  # type: ignore[arg-type]
        raise BadInput(problems, "invalid cluster spec")
    return package_key(pkgs)


def mount_arg(arg: str) -> dict[str, Any]:
    """`hp create --mount SRC[:TARGET]` as a Mounts entry (TARGET: SRC's own path). The
    first ':' separates them (a path holding ':' is refused by mount_problems anyway).
    SRC is judged as a spec's Source is: a relative one is refused (write "$PWD")."""
    src, sep, tgt = arg.partition(":")
    return {"Source": src, "Target": tgt} if sep else {"Source": src}
