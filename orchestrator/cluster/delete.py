"""Removing a cluster: what exists is found by its labels, and nothing else (on every
registered host: a host that does not answer keeps what it holds, said so; `hp delete`
again once it is back removes the rest)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from .. import waits
from ..core.context import Cluster, Env, parallel
from ..docker.provider import Provider
from ..docker.views import Network
from ..errors import BadInput, EngineError, NotFound, OperationFailed
from ..health.requests.service import stop_for_delete
from ..naming import L_HOME
from ..services.endpoints import forget
from ..slurm.model import DELETING_REASON
from ..state.store import cluster_folder
from ..state.transitions import ClusterStatus

NETWORK_BUSY_S = 15.0  # an overlay's endpoints on other hosts go a moment after their containers


def remove_network(p: Provider, net: str) -> bool:
    """Remove a network whose containers were just removed. Docker 20.10 may still count
    their endpoints for a moment ("has active endpoints"; an overlay's, on other hosts,
    a while longer): tried again for up to NETWORK_BUSY_S. False when it is left because
    a container on a host that does not answer still uses it."""

    def attempt() -> bool:
        try:
            p.remove_network(net)
            return True
        except EngineError as e:
            if e.missing:
                return True
            if p.unreachable():  # in use by a container on a host that is away: left there
                return False
            raise

    return waits.until(attempt, lambda _: True, every=0.3, timeout=NETWORK_BUSY_S, retry_on=EngineError)


def remove_resources(p: Provider, name: str) -> dict[str, int]:
    """Remove every container, then network and volume labelled for cluster `name` (on
    every reachable host; a network still in use by a container on a host that does not
    answer is left, and counted in "left")."""
    containers = p.containers(name)
    parallel(lambda c: p.remove_container(c.id), containers)
    nets = p.networks(name)
    left = sum(not remove_network(p, n.id) for n in nets)
    if nets and not left and not p.unreachable() and "" not in p.engines():
        # a swarm overlay leaves every host's list a moment after the manager removed it
        waits.poll(lambda: not p.networks(name), every=0.2, timeout=NETWORK_BUSY_S)
    vols = p.volumes(name)
    for v in sorted({v.name for v in vols}):  # one name may be on several hosts
        p.remove_volume(v)
    out = {"containers": len(containers), "networks": len(nets) - left, "volumes": len(vols)}
    if left:
        out["left"] = left
    return out


def other_home(env: Env, name: str, nets: list[Network]) -> str | None:
    """The hp state folder (HP_HOME) that made cluster `name`, from its network's label,
    when that is not this one and still holds the cluster's folder; None otherwise (a
    cluster that no state folder holds any more is anyone's to remove: labels are the
    truth of what exists)."""
    for n in nets:
        home = n.labels.get(L_HOME)
        if home and Path(home).resolve() != env.store.home.resolve() and cluster_folder(Path(home), name).is_dir():
            return home
    return None


def delete(env: Env, name: str) -> dict[str, int]:
    """Stop the cluster's agent and health checks, drain its workers, remove everything
    labelled for it, and forget it (its events stay a while: `hp events NAME`)."""
    row = env.store.cluster(name)
    p = env.provider
    p.ping()
    existing = p.containers(name)
    nets = p.networks(name) if row is None else []  # (remove_resources lists them itself)
    if row is None and not existing and not nets and not p.volumes(name):
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
    if row is not None:
        env.store.event(name, "Cluster", "Info", f"Cluster {name} deleted")
        env.store.remove_cluster(name)

        forget(env.store, name)  # the agent's loopback ports
        shutil.rmtree(cluster_folder(env.store.home, name), ignore_errors=True)
        env.store.prune()
    return removed
