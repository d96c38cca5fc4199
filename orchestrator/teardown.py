"""Removing what exists of a cluster: found by its labels, and nothing else."""
from __future__ import annotations

from .cluster import parallel
from .provider import DockerProvider


def remove_resources(p: DockerProvider, name: str) -> dict[str, int]:
    """Remove every container, then network and volume labelled for cluster `name`."""
    containers = p.containers(name)
    parallel(lambda c: p.remove_container(c.id), containers)
    nets = p.networks(name)
    for n in nets:
        p.remove_network(n["Id"])
    vols = p.volumes(name)
    for v in vols:
        p.remove_volume(v["Name"])
    return {"containers": len(containers), "networks": len(nets), "volumes": len(vols)}
