"""Read and remove: list, describe, nodes, delete, exec."""
from __future__ import annotations

from typing import Any, Callable

from .cluster import DEFAULT_USER, Cluster, Env
from .errors import BadInput, NotFound, OperationFailed
from .naming import L_ROLE, container_name
from .slurm import SlurmNode
from .state import iso
from .status import NodeView, group_views, node_views
from . import teardown


def list_clusters(env: Env) -> dict[str, Any]:
    rows = env.store.clusters()
    return {"ClusterSummaries": [{"ClusterName": r.name, "ClusterStatus": r.status,
                                  "CreationTime": iso(r.created)} for r in rows]}


def _observe(cluster: Cluster) -> tuple[list[NodeView], bool]:
    containers = cluster.node_containers()
    ctl = containers.get(cluster.controller_host)
    snodes: dict[str, SlurmNode] = {}
    up = False
    if ctl is not None and ctl.state == "running":
        try:
            snodes = {n.name: n for n in cluster.slurm.nodes()}
            up = True
        except OperationFailed:
            up = False
    recorded = cluster.store.latest_node_status(cluster.name)
    return node_views(cluster.spec, containers, snodes, recorded, up), up


def describe(env: Env, name: str, active_ops: Callable[[Cluster], dict[str, list[str]]] | None = None,
             extra: Callable[[Cluster], dict[str, Any]] | None = None) -> dict[str, Any]:
    row = env.store.cluster(name)
    if row is None:
        raise NotFound(f"cluster {name!r} does not exist")
    cluster = Cluster(env, name)
    nodes, up = _observe(cluster)
    spec = cluster.spec
    out = {
        "ClusterName": name,
        "ClusterStatus": row.status,
        "FailureMessage": row.message or None,
        "CreationTime": iso(row.created),
        "NodeRecovery": spec.NodeRecovery,
        "NodeProvisioningMode": spec.NodeProvisioningMode or "AllOrNothing",
        "ControllerReachable": up,
        "SlurmControllerHost": cluster.controller_host,
        "InstanceGroups": group_views(spec, nodes, active_ops(cluster) if active_ops else _active_ops(env, name)),
    }
    if extra:
        out.update(extra(cluster))
    return out


def _active_ops(env: Env, name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for op in env.store.operations(name):
        what = f"{op['kind']}" + (f" to {op['target']}" if op["target"] is not None else f" {op['nodes']}")
        out.setdefault(op["group"], []).append(what)
    return out


def nodes(env: Env, name: str, group: str | None = None) -> dict[str, Any]:
    if env.store.cluster(name) is None:
        raise NotFound(f"cluster {name!r} does not exist")
    cluster = Cluster(env, name)
    if group is not None:
        cluster.group_of(group)
    views, _ = _observe(cluster)
    return {"ClusterName": name, "ClusterNodeSummaries": [v.as_dict() for v in views
                                                          if group is None or v.group == group]}


def delete(env: Env, name: str) -> dict[str, int]:
    row = env.store.cluster(name)
    p = env.provider
    p.ping()
    existing = p.containers(name)
    if row is None and not existing and not p.networks(name) and not p.volumes(name):
        raise NotFound(f"cluster {name!r} does not exist")
    if row is not None:
        from .agent import stop_agent

        env.store.set_status(name, "Deleting")
        env.store.event(name, "Cluster", "Info", f"Cluster {name} deletion started")
        stop_agent(env, name)  # nothing may launch a node while the cluster goes
        _stop_health_check(env, name)
        cluster = Cluster(env, name)
        ctl = next((c for c in existing if c.labels.get(L_ROLE) == "controller" and c.state == "running"), None)
        workers = [c.labels.get("io.hp.node", "") for c in existing if c.labels.get(L_ROLE) == "worker"]
        if ctl and workers:
            try:  # drain first so that Slurm schedules nothing more on them
                cluster.slurm.update(workers, "drain", "hp delete")
            except OperationFailed:
                pass
    removed = teardown.remove_resources(p, name)
    if row is not None:
        env.store.remove_cluster(name)
        import shutil

        shutil.rmtree(env.store.home / "clusters" / name, ignore_errors=True)
        env.store.event(name, "Cluster", "Info", f"Cluster {name} deleted")
    return removed


def _stop_health_check(env: Env, name: str) -> None:
    """A deep health check's worker could recover (re-create) nodes during teardown:
    stop it first. Its check containers go with the cluster's containers."""
    import os
    import signal

    from .health.records import Records

    rec = Records(env.store)
    act = rec.active(name)
    if act is not None and act.pid and not act.options.get("on_start"):
        try:
            os.killpg(act.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    rec.forget(name)


def exec_target(env: Env, name: str, node: str | None) -> str:
    """Container to run a command in: the named node, else a login node, else the controller."""
    if env.store.cluster(name) is None:
        raise NotFound(f"cluster {name!r} does not exist")
    cluster = Cluster(env, name)
    containers = cluster.node_containers()
    if node is not None:
        c = containers.get(node) or next((c for c in containers.values() if c.name == node or c.id.startswith(node)), None)
        if c is None:
            raise BadInput(f"cluster {name!r} has no node {node!r} (nodes: {', '.join(sorted(containers))})")
        if c.state != "running":
            raise OperationFailed(f"node {node} of cluster {name!r} is not running (container {c.state}, "
                                  f"exit code {c.exit_code}); see 'hp nodes {name}'")
        return c.name
    login = sorted((c for c in containers.values() if c.labels.get(L_ROLE) == "login" and c.state == "running"),
                   key=lambda c: c.name)
    if login:
        return login[0].name
    return container_name(name, cluster.controller_host)


def run_exec(env: Env, container: str, cmd: list[str], root: bool, write: Callable[[bytes, bool], None],
             interactive: bool = False) -> int:
    """Run cmd in the container as the default user (or root), stream its output, return its exit code."""
    user = "root" if root else DEFAULT_USER
    workdir = "/root" if root else f"/home/{DEFAULT_USER}"
    environment = None if root else {"HOME": workdir, "USER": DEFAULT_USER}
    p = env.provider
    if not root:  # the shared home is created by the first node that boots; be sure it is there
        p.exec(container, ["sh", "-c", f"[ -d {workdir} ] || install -d -o 1000 -g 1000 {workdir}"])
    if interactive:
        return p.exec_interactive(container, cmd, user=user, workdir=workdir, environment=environment)
    stream, exec_id = p.exec_stream(container, cmd, user=user, workdir=workdir, environment=environment)
    for out, err in stream:
        if out:
            write(out, False)
        if err:
            write(err, True)
    return p.exec_exit_code(exec_id)
