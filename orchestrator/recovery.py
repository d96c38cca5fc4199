"""Node recovery: reboot (restart the container) and replace (new container, same
Slurm node name). To be implemented; API fixed so that the health checks and the
agent can call it."""
from __future__ import annotations

from .cluster import Cluster


def reboot(cluster: Cluster, node: str, reason: str, wait: float = 60.0) -> bool:
    """Restart the node's container; True when it is back idle (or usable) in Slurm."""
    raise NotImplementedError


def replace(cluster: Cluster, node: str, reason: str, wait: float = 60.0) -> bool:
    """Remove the node's container and launch a new one with the same Slurm name."""
    raise NotImplementedError
