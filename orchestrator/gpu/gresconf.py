"""GPU nodes in the core: the controller's gres.conf (gpu/gres.py says why it is done
this way) kept in step with the cluster's GPU nodes.

A GPU node container carries its GPUs in labels (io.hp.gpus: ids, io.hp.gpu-model,
io.hp.gpu-devices: its /dev/nvidiaN in order). The controller's gres.conf holds
explicit `NodeName=<node> Name=gpu Type=<model> File=/dev/nvidiaN` lines for every
GPU node; configless ships it to every slurmd. slurmctld reads it only when it starts
or on `scontrol reconfigure`, so a node whose lines are new or changed needs the file
written AND a reconfigure BEFORE its slurmd starts (the Launcher does both between
creating and starting the container). Lines of nodes that are gone are harmless and
are dropped at the next rewrite.
"""

from __future__ import annotations

import logging
from typing import Protocol

from ..docker.provider import Provider
from ..docker.views import Container
from ..errors import ObjectMissing
from ..naming import L_GPU_DEVICES, L_GPU_MODEL
from .gres import GresError, GresNode, gres_conf, lines_changed

log = logging.getLogger("hp")


class Cluster(Protocol):
    """What gres.conf needs of a cluster (core/context.py's Cluster): its name, its
    containers, its controller's container and the Provider to reach it."""

    name: str

    @property
    def p(self) -> Provider: ...

    @property
    def controller_container(self) -> str: ...

    def containers(self) -> list[Container]: ...


GRES_DIR = "/etc/slurm"
GRES_FILE = "gres.conf"


def gres_node(c: Container) -> GresNode | None:
    """A worker container's gres.conf view; None for a node without wired GPUs."""
    devices = tuple(d for d in c.labels.get(L_GPU_DEVICES, "").split(",") if d)
    model = c.labels.get(L_GPU_MODEL, "")
    if c.role != "worker" or not c.node or not devices or not model:
        return None
    try:
        return GresNode(c.node, model, devices)
    except GresError as e:  # labels hp did not write: leave the node out, say so
        log.warning("%s: not in gres.conf: %s", c.node, e)
        return None


def desired_gres_conf(cluster: Cluster, containers: list[Container] | None = None) -> str | None:
    """The gres.conf the cluster's GPU nodes need now; None when it has none."""
    nodes = {}
    for c in containers if containers is not None else cluster.containers():
        g = gres_node(c)
        if g is not None:
            nodes[g.name] = g
    if not nodes:
        return None
    return gres_conf(list(nodes.values()), None, cluster.name)


def current_gres_conf(cluster: Cluster) -> str | None:
    try:
        return cluster.p.get_file(cluster.controller_container, f"{GRES_DIR}/{GRES_FILE}").decode()
    except ObjectMissing:
        return None


def write_gres_conf(cluster: Cluster, new_nodes: list[str]) -> bool:
    """Write the controller's gres.conf when the lines of one of `new_nodes` (about
    to start) are not in it as they must be. True when it was written: slurmctld must
    then be reconfigured before those nodes start."""
    want = desired_gres_conf(cluster)
    if want is None:
        return False
    old = current_gres_conf(cluster)
    if old is not None and not any(lines_changed(old, want, n) for n in new_nodes):
        return False
    cluster.p.put_files(cluster.controller_container, GRES_DIR, {GRES_FILE: (want.encode(), 0o644, 0)})
    return True
