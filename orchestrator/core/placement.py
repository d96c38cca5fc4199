"""Placement: which host a new node goes to (pure; the Launcher applies it).

A node fits on one host (its own pool: capacity.fit). A group may name its hosts and a
strategy (`Placement: {Hosts: [...], Strategy: spread|pack}`):

- spread: the host with the fewest nodes of the group, then of the cluster, then the
  first in the hosts' order: a group's nodes (and the cluster's) are spread evenly;
- pack: the first host (in the group's order, else the hosts' order) where it fits.

Defaults: the controller and login groups pack (the controller on the first host, the
login node with it: users and the /home file server are there), compute groups spread
over every host. With one engine there is one host, LOCAL_ENGINE, and placement only checks
capacity, with the messages of one host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..docker.views import LOCAL_ENGINE, Container
from ..errors import InsufficientCapacity
from ..naming import L_CLUSTER
from ..spec.catalogue import InstanceType
from .capacity import Pool, Usage, fit, usage

if TYPE_CHECKING:
    from ..spec.model import InstanceGroup


@dataclass
class HostLoad:
    """One host as placement sees it: its pool, what runs there, the cluster's nodes there."""

    pool: Pool
    used: Usage
    group_nodes: dict[str, int] = field(default_factory=dict)  # the cluster's group -> nodes on this host
    cluster_nodes: int = 0

    def plus(self, itype: InstanceType, gpus: list[str], group: str) -> HostLoad:
        g = dict(self.group_nodes)
        g[group] = g.get(group, 0) + 1
        return HostLoad(self.pool, self.used.plus(itype, gpus), g, self.cluster_nodes + 1)


def loads(
    pools: dict[str, Pool], containers: list[Container], catalogue: Mapping[str, InstanceType], cluster: str
) -> dict[str, HostLoad]:
    """Host -> its load, from every container hp runs (all clusters share the pools)."""
    out = {}
    for h, pool in pools.items():
        mine = [c for c in containers if c.host == h]
        ours = [c for c in mine if c.is_node and not c.dead and c.labels.get(L_CLUSTER) == cluster]
        groups: dict[str, int] = {}
        for c in ours:
            groups[c.group] = groups.get(c.group, 0) + 1
        out[h] = HostLoad(pool, usage(mine, catalogue), groups, len(ours))
    return out


def strategy_of(group: InstanceGroup) -> str:
    if group.Placement is not None and group.Placement.Strategy:
        return group.Placement.Strategy
    return "spread" if group.node_type == "Compute" else "pack"


def hosts_of(group: InstanceGroup, registered: list[str]) -> list[str]:
    """The hosts a group may use, in order: its Placement.Hosts, else every host."""
    if group.Placement is not None and group.Placement.Hosts:
        return list(group.Placement.Hosts)
    return list(registered)


def place(
    itype: InstanceType,
    group: InstanceGroup,
    registered: list[str],
    load: dict[str, HostLoad],
    unavailable: dict[str, str],
) -> tuple[str, list[str] | None]:
    """(host, GPU ids) for one node of `group`; InsufficientCapacity saying, per host,
    what is missing (one engine: as before, with no host named)."""
    allowed = hosts_of(group, registered)
    fits: dict[str, list[str] | None] = {}
    why: dict[str, str] = {}
    for h in allowed:
        if h not in load:
            why[h] = unavailable.get(h) or ("not a registered host" if h not in registered else "unavailable")
            continue
        gpus, short = fit(itype, load[h].pool, load[h].used)
        if short:
            why[h] = "; ".join(short)
        else:
            fits[h] = gpus
    if not fits:
        if allowed == [LOCAL_ENGINE]:
            raise InsufficientCapacity(f"no capacity for instance type {itype.name}: {why['']}")
        raise InsufficientCapacity(
            f"no capacity for instance type {itype.name} on any host: " + " | ".join(f"{h}: {why[h]}" for h in allowed)
        )
    order = {h: i for i, h in enumerate(allowed)}
    gname = group.InstanceGroupName
    if strategy_of(group) == "pack":
        host = min(fits, key=lambda h: order[h])
    else:
        host = min(fits, key=lambda h: (load[h].group_nodes.get(gname, 0), load[h].cluster_nodes, order[h]))
    return host, fits[host]
