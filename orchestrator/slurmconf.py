"""Render slurm.conf for a cluster spec (pure)."""
from __future__ import annotations

from pathlib import Path
from string import Template

from .naming import node_name
from .spec import ClusterSpec
from .catalogue import InstanceType

SLURMD_TIMEOUT = 30  # hp watches Docker events itself; Slurm's own detection is a backstop


def project_dir() -> Path:
    """The project's root (images/, slurm-conf/, healthchecks/ live there)."""
    return Path(__file__).resolve().parent.parent


def controller_host(spec: ClusterSpec) -> str:
    return node_name(spec.controller.InstanceGroupName, 1)


def max_node_count(spec: ClusterSpec) -> int:
    """Room for the spec's compute nodes plus headroom to scale and replace."""
    n = sum(g.InstanceCount for g in spec.compute)
    return max(128, 4 * n)


def render(spec: ClusterSpec, catalogue: dict[str, InstanceType]) -> str:
    tmpl = Template((project_dir() / "slurm-conf" / "slurm.conf.tmpl").read_text())
    nodesets, partitions = [], []
    for g in spec.compute:
        ns = f"ns_{g.InstanceGroupName.lower()}"
        nodesets.append(f"Nodeset={ns} Feature={g.InstanceGroupName.lower()}")
        partitions.append(f"PartitionName={g.partition} Nodes={ns} MaxTime=INFINITE State=UP OverSubscribe=NO")
    gpu = any(catalogue[g.InstanceType].gpus for g in spec.compute if g.InstanceType in catalogue)
    return tmpl.substitute(
        cluster=spec.ClusterName,
        controller=controller_host(spec),
        max_nodes=max_node_count(spec),
        slurmd_timeout=SLURMD_TIMEOUT,
        gres_types="GresTypes=gpu" if gpu else "",
        nodesets="\n".join(nodesets),
        partitions="\n".join(partitions),
    )
