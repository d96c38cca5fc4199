"""`hp exec NAME [--node NODE] [--root] -- CMD...` the quick way: without the command-line
parser (typer), docker-py or the program's assembly, whose imports alone take longer than
a whole `docker exec` (issue 23: hp exec within 1.5x of one). It runs the command exactly
as the full way would (cluster/exec.py), over the same rules (cluster/target.py) and the
same Engine API client (docker/wire.py), and only where it is sure to: a cluster on this
engine alone (no registered hosts), InService, its agent running, a login or compute node
that runs, no terminal. Any other case (and any argument it does not know, `--help`, an
engine that does not answer, a refusal before the command starts) returns None and
`hp` takes the full way, which says what is wrong. Once the command started, nothing is
run twice: a broken stream is an error (exit 1)."""

from __future__ import annotations

import sys

from ..cluster.target import default_login, find_node, identity
from ..core.agentlock import holder
from ..docker import wire
from ..naming import L_CLUSTER, L_NODE, L_ROLE, NODE_ROLES
from ..state.home import home_dir, peek
from ..state.statuses import ClusterStatus


class Seen:
    """What one entry of the engine's container listing says of a node (the fields
    target.py reads; the full way reads the same from views.Container)."""

    __slots__ = ("id", "name", "node", "role", "running")

    def __init__(self, raw: dict):
        labels = raw.get("Labels") or {}
        self.id = str(raw.get("Id") or "")
        self.name = str((raw.get("Names") or ["/"])[0]).lstrip("/")
        self.node = labels.get(L_NODE)
        self.role = labels.get(L_ROLE, "")
        self.running = raw.get("State") == "running"


def parse(argv: list[str]) -> tuple[str, str | None, bool, list[str]] | None:
    """(name, node, root, command) of `exec NAME [--node NODE | -n NODE | --node=NODE]
    [--root] -- CMD...` with options before or after NAME, as typer reads it; None for
    any other command line (typer's own parse then runs, with its help and errors)."""
    if len(argv) < 4 or argv[0] != "exec":
        return None
    name: str | None = None
    node: str | None = None
    root = False
    i = 1
    while i < len(argv):
        t = argv[i]
        if t == "--":
            cmd = argv[i + 1 :]
            if name is None or not cmd or cmd[0] == "--":
                return None
            return name, node, root, cmd
        if t == "--root":
            root = True
        elif t in ("--node", "-n") or t.startswith("--node="):
            if node is not None:
                return None
            if t.startswith("--node="):
                node = t[len("--node=") :]
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                i += 1
                node = argv[i]
            else:
                return None
        elif t.startswith("-") or name is not None:
            return None
        else:
            name = t
        i += 1
    return None


def run(argv: list[str]) -> int | None:
    """The command's exit code, or None where the full way is to run it."""
    parsed = parse(argv)
    if parsed is None or (sys.stdin.isatty() and sys.stdout.isatty()):
        return None
    name, node, root, cmd = parsed
    home = home_dir()
    hosts, status = peek(home, name)
    if hosts or status != ClusterStatus.IN_SERVICE or holder(home, name) is None:
        return None
    try:
        engine = wire.Endpoint.from_env()
        listing = engine.containers({"label": [f"{L_CLUSTER}={name}"]})
    except (ValueError, wire.Unreachable, wire.Broken, wire.ApiError):
        return None
    nodes = {s.node: s for s in map(Seen, listing) if s.node and s.role in NODE_ROLES}
    target = find_node(nodes, node) if node is not None else default_login(nodes.values())
    if target is None or not target.running or target.role == "controller":
        return None
    user, workdir, environment = identity(root)
    try:
        exec_id = engine.exec_create(target.name, cmd, user, workdir, environment)
    except (wire.Unreachable, wire.Broken, wire.ApiError):
        return None  # nothing ran
    try:
        conn = engine.exec_start(exec_id)
        out, err = sys.stdout.buffer, sys.stderr.buffer
        for o, e in conn.frames():
            if o:
                out.write(o)
                out.flush()
            if e:
                err.write(e)
                err.flush()
        return engine.exec_exit_code(exec_id)
    except (wire.Unreachable, wire.Broken, wire.ApiError) as e:
        sys.stderr.write(f"error: run {cmd[0]} in {target.name}: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
