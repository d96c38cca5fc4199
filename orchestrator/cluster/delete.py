"""Removing a cluster: what exists is found by its labels, and nothing else."""

from __future__ import annotations

import shutil

from ..docker.provider import Provider
from ..errors import NotFound, OperationFailed
from ..slurm.model import DELETING_REASON
from .context import Cluster, Env, parallel


def remove_resources(p: Provider, name: str) -> dict[str, int]:
    """Remove every container, then network and volume labelled for cluster `name`."""
    containers = p.containers(name)
    parallel(lambda c: p.remove_container(c.id), containers)
    nets = p.networks(name)
    for n in nets:
        p.remove_network(n.id)
    vols = p.volumes(name)
    for v in vols:
        p.remove_volume(v.name)
    return {"containers": len(containers), "networks": len(nets), "volumes": len(vols)}


def delete(env: Env, name: str) -> dict[str, int]:
    """Stop the cluster's agent and health checks, drain its workers, remove everything
    labelled for it, and forget it (its events stay a while: `hp events NAME`)."""
    row = env.store.cluster(name)
    p = env.provider
    p.ping()
    existing = p.containers(name)
    if row is None and not existing and not p.networks(name) and not p.volumes(name):
        raise NotFound(f"cluster {name!r} does not exist (see 'hp list')")
    if row is not None:
        env.store.set_status(name, "Deleting")
        env.store.event(name, "Cluster", "Info", f"Cluster {name} deletion started")
        env.agents.stop(name)  # nothing may launch a node while the cluster goes
        from ..health.service import stop_for_delete

        stop_for_delete(env, name)
        cluster = Cluster(env, name)
        ctl = next((c for c in existing if c.role == "controller" and c.running), None)
        workers = [c.node for c in existing if c.role == "worker" and c.node]
        if ctl and workers:
            try:  # drain first so that Slurm schedules nothing more on them
                cluster.slurm.drain(workers, DELETING_REASON)
            except OperationFailed:
                pass  # the controller is not answering: nothing will be scheduled anyway
    removed = remove_resources(p, name)
    if row is not None:
        env.store.event(name, "Cluster", "Info", f"Cluster {name} deleted")
        env.store.remove_cluster(name)
        from ..services.endpoints import forget

        forget(env.store, name)  # the agent's loopback ports
        shutil.rmtree(env.store.home / "clusters" / name, ignore_errors=True)
        env.store.prune()
    return removed
