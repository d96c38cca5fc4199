"""Slurm's configuration for a cluster (pure): slurm.conf from the template shipped in
the package, and the `slurmd -Z --conf` string a dynamic node registers with."""

from __future__ import annotations

from pathlib import Path
from string import Template

from ..naming import node_name
from ..spec.catalogue import InstanceType
from ..spec.model import ClusterSpec

TEMPLATE = Path(__file__).resolve().parent.parent / "data" / "slurm.conf.tmpl"
SLURMD_TIMEOUT = 30  # hp watches Docker events itself; Slurm's own detection is a backstop


def controller_host(spec: ClusterSpec) -> str:
    return node_name(spec.controller.InstanceGroupName, 1)


def slurmd_conf(itype: InstanceType, feature: str, drain_reason: str | None = None, gres: str | None = None) -> str:
    """The `slurmd -Z --conf` string that makes a dynamic node advertise its type (and,
    with `drain_reason`, register drained: it takes no job until hp resumes it).
    `gres`: the node's `Gres=gpu:<type>:N` word (gpu/gres.slurmd_conf_gres) when its
    GPUs are known; else a GPU type advertises an untyped `Gres=gpu:N`."""
    conf = f"CPUs={itype.vcpus} RealMemory={itype.memory_mib} Features={feature}"
    if gres:
        conf += f" {gres}"
    elif itype.gpus:
        conf += f" Gres=gpu:{itype.gpus}"
    if drain_reason:
        conf += f" State=DRAIN Reason={drain_reason}"
    return conf


def render(spec: ClusterSpec, catalogue: dict[str, InstanceType]) -> str:
    tmpl = Template(TEMPLATE.read_text())
    nodesets, partitions = [], []
    for g in spec.compute:
        ns = f"ns_{g.InstanceGroupName.lower()}"
        nodesets.append(f"Nodeset={ns} Feature={g.InstanceGroupName.lower()}")
        partitions.append(f"PartitionName={g.partition} Nodes={ns} MaxTime=INFINITE State=UP OverSubscribe=NO")
    gpu = any(catalogue[g.InstanceType].gpus for g in spec.compute if g.InstanceType in catalogue)
    return tmpl.substitute(
        cluster=spec.ClusterName,
        controller=controller_host(spec),
        max_nodes=spec.max_nodes,
        slurmd_timeout=SLURMD_TIMEOUT,
        gres_types="GresTypes=gpu" if gpu else "",
        nodesets="\n".join(nodesets),
        partitions="\n".join(partitions),
    )
