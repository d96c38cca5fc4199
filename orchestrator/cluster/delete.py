"""Removing a cluster: what exists is found by its labels, and nothing else (on every
registered host: a host that does not answer keeps what it holds, said so; `hp delete`
again once it is back removes the rest)."""

from __future__ import annotations

import shlex
import shutil
from typing import Any

from ..core.context import Cluster, Env
from ..errors import BadInput, NotFound, OperationFailed
from ..health.requests.service import stop_for_delete
from ..services.ports import forget
from ..slurm.model import DELETING_REASON
from ..state.home import cluster_folder
from ..state.transitions import ClusterStatus
from .teardown import KEPT_BY_DOCKER, other_home, remove_resources


def delete(env: Env, name: str, missing_ok: bool = False) -> dict[str, Any] | None:
    """Stop the cluster's agent and health checks, drain its workers, remove everything
    labelled for it, and forget it (its events stay a while: `hp events NAME`). A cluster
    of which nothing exists is NotFound, or None with `missing_ok`."""
    row = env.store.cluster(name)
    p = env.provider
    p.ping()
    existing = p.containers(name)
    nets = p.networks(name) if row is None else []  # (remove_resources lists them itself)
    if row is None and not existing and not nets and not p.volumes(name):
        if missing_ok:
            return None
        raise NotFound(f"cluster {name!r} does not exist (see 'hp list')")
    if row is None and (owner := other_home(env, name, nets)):
        raise BadInput(
            f"cluster {name!r} was made from another hp state folder, {owner}, and is still there (its agent "
            f"would bring back what this removes): delete it from there: HP_HOME={shlex.quote(owner)} hp delete {name}",
            "not this state folder's cluster",
        )
    if row is not None:
        env.store.set_status(name, ClusterStatus.DELETING)
        env.agents.stop(name)  # nothing may launch a node while the cluster goes

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
    if down := p.unreachable():
        removed["unreachable_hosts"] = len(down)
        env.store.event(
            name,
            "Cluster",
            "Warn",
            f"Cluster {name}: host(s) {', '.join(sorted(down))} do not answer: what they hold of the cluster is "
            f"left there; run 'hp delete {name}' again once they are back",
        )
    elif kept := removed.get("left_networks"):
        removed["warning"] = f"network(s) {', '.join(kept)} left: {KEPT_BY_DOCKER}"
        env.store.event(name, "Cluster", "Warn", f"Cluster {name}: {removed['warning']}")
    if row is not None:
        env.store.event(name, "Cluster", "Info", f"Cluster {name} deleted")
        env.store.remove_cluster(name)

        forget(env.store, name)  # the agent's loopback ports
        shutil.rmtree(cluster_folder(env.store.home, name), ignore_errors=True)
        env.store.prune()
    return removed
