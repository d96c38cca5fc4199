"""What is labelled for a cluster, removed (its containers, networks and volumes, on every
reachable host), and which hp state folder made it: shared by `hp delete` (delete.py) and
create's rollback, which loads none of delete's health-check and endpoint wiring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import waits
from ..core.context import Env, parallel
from ..docker.provider import Provider
from ..docker.views import LOCAL_ENGINE, Network
from ..errors import EngineError
from ..naming import L_HOME
from ..state.home import cluster_folder

NETWORK_BUSY_S = 15.0  # an overlay's endpoints on other hosts go a moment after their containers
BUSY = "has active endpoints"  # Docker's answer to removing a network it counts endpoints on
# why a network is left when hosts answer and the cluster's containers are gone (delete.py)
KEPT_BY_DOCKER = (
    "Docker still counts endpoints on it though none of the cluster's containers is left: a container "
    "that is not hp's is attached to it, or Docker kept the count of removed ones (Docker 20.10 does, "
    "after many containers leave at once: moby/moby#42119; it keeps no endpoint then, so "
    "`docker network disconnect -f` finds none to free: only a restart of dockerd, which recounts, "
    "frees it). Until it is gone a new cluster of this name cannot be made"
)
# Not force-disconnected: on the networks Docker 20.10 kept (issue 46 item 4: 2 of 7 floors of 64
# Slurm workers), `network inspect` lists no endpoint and a forced disconnect of each removed
# container's name answers "endpoint ... not found"; libnetwork kept only its endpoint count,
# which it corrects only when dockerd starts (cleanupLocalEndpoints). Nothing through the API frees it.


def remove_network(p: Provider, net: str) -> bool:
    """Remove a network whose containers were just removed. Docker 20.10 may still count
    their endpoints for a moment ("has active endpoints"; an overlay's, on other hosts,
    a while longer): tried again for up to NETWORK_BUSY_S. False when it is left: a
    container on a host that does not answer still uses it, or Docker still counts
    endpoints on it after that time (KEPT_BY_DOCKER); any other error is raised."""

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

    try:
        return waits.until(attempt, lambda _: True, every=0.3, timeout=NETWORK_BUSY_S, retry_on=EngineError)
    except EngineError as e:
        if BUSY in str(e):
            return False
        raise


def remove_resources(p: Provider, name: str) -> dict[str, Any]:
    """Remove every container, then network and volume labelled for cluster `name` (on
    every reachable host). A network left (remove_network) is counted in "left", its name
    in "left_networks"; the volumes are removed all the same."""
    containers = p.containers(name)
    parallel(lambda c: p.remove_container(c.id), containers)
    nets = p.networks(name)
    kept = [n.name for n in nets if not remove_network(p, n.id)]
    left = len(kept)
    if nets and not left and not p.unreachable() and LOCAL_ENGINE not in p.engines():
        # a swarm overlay leaves every host's list a moment after the manager removed it
        waits.poll(lambda: not p.networks(name), every=0.2, timeout=NETWORK_BUSY_S)
    vols = p.volumes(name)
    for v in sorted({v.name for v in vols}):  # one name may be on several hosts
        p.remove_volume(v)
    out: dict[str, Any] = {"containers": len(containers), "networks": len(nets) - left, "volumes": len(vols)}
    if left:
        out["left"] = left
        out["left_networks"] = kept
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
