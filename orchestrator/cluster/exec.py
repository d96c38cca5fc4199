"""`hp exec`: run a command on a cluster's node as the default user (or root). Which node
and as whom: target.py, whose rules the quick `hp exec` (cli/quick.py) follows too; this
is the whole way, taken for every case the quick one leaves (no agent running, a cluster
across hosts, the controller, a terminal, any error before the command starts)."""

from __future__ import annotations

from collections.abc import Callable

from ..core.context import Env
from ..errors import BadInput, OperationFailed
from ..naming import DEFAULT_USER, container_name
from .target import default_login, find_node, identity

Write = Callable[[bytes, bool], None]  # (data, is stderr)


def exec_target(env: Env, name: str, node: str | None) -> tuple[str, bool]:
    """Container to run a command in: the named node, else a login node, else the
    controller; and whether it is the controller's."""
    cluster = env.cluster(name)
    containers = cluster.node_containers()
    if node is not None:
        c = find_node(containers, node)
        if c is None and (lost := cluster.lost_nodes(containers).get(node)):
            raise OperationFailed(
                f"node {node} of cluster {name!r} is on host {lost[0]}, which is unreachable ({lost[1]})"
            )
        if c is None:
            raise BadInput(f"cluster {name!r} has no node {node!r} (nodes: {', '.join(sorted(containers))})")
        if not c.running:
            raise OperationFailed(
                f"node {node} of cluster {name!r} is not running (container {c.state}, "
                f"exit code {c.exit_code}); see 'hp nodes {name}'"
            )
        return c.name, c.role == "controller"
    login = default_login(containers.values())
    if login is not None:
        return login.name, False
    ctl = cluster.controller_of(containers)
    return ctl.name if ctl else container_name(name, cluster.controller_node), True


def run_exec(
    env: Env,
    container: str,
    cmd: list[str],
    root: bool,
    write: Write,
    interactive: bool = False,
    controller: bool = True,
) -> int:
    """Run cmd in the container as the default user (or root), stream its output, return its exit code.
    `controller`: the container is the cluster's controller, which has no shared /home (the
    default user's home is made there first; a login or compute node made it when it booted)."""
    user, workdir, environment = identity(root)
    p = env.provider
    if not root and controller:
        p.exec(container, ["install", "-d", "-o", DEFAULT_USER, "-g", DEFAULT_USER, workdir])
    if interactive:
        return p.exec_interactive(container, cmd, user=user, workdir=workdir, environment=environment)
    handle = p.exec_stream(container, cmd, user=user, workdir=workdir, environment=environment)
    for out, err in handle.chunks:
        if out:
            write(out, False)
        if err:
            write(err, True)
    return p.exec_exit_code(handle)
