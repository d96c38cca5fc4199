"""Slurm's configuration for a cluster (pure): slurm.conf from the templates in slurm-conf/
(resources.py), and the `slurmd -Z --conf` string a dynamic node registers with."""

from __future__ import annotations

from collections.abc import Mapping
from string import Template
from typing import TYPE_CHECKING

from .. import resources
from ..naming import node_name
from ..spec.catalogue import InstanceType

if TYPE_CHECKING:
    from ..spec.model import ClusterSpec

SLURMD_TIMEOUT = 30  # hp watches Docker events itself; Slurm's own detection is a backstop


def template(name: str) -> str:
    """The text of the template NAME in slurm-conf/ (resources.slurm_conf)."""
    return (resources.slurm_conf() / name).read_text()


def controller_node(spec: ClusterSpec) -> str:
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


def render(spec: ClusterSpec, catalogue: Mapping[str, InstanceType]) -> str:
    tmpl = Template(template("slurm.conf.tmpl"))
    nodesets, partitions = [], []
    for g in spec.compute:
        ns = f"ns_{g.InstanceGroupName.lower()}"
        nodesets.append(f"Nodeset={ns} Feature={g.InstanceGroupName.lower()}")
        partitions.append(f"PartitionName={g.partition} Nodes={ns} MaxTime=INFINITE State=UP OverSubscribe=NO")
    gpu = any(catalogue[g.InstanceType].gpus for g in spec.compute if g.InstanceType in catalogue)
    return tmpl.substitute(
        cluster=spec.ClusterName,
        controller=controller_node(spec),
        max_nodes=spec.max_nodes,
        slurmd_timeout=SLURMD_TIMEOUT,
        gres_types="GresTypes=gpu" if gpu else "",
        nodesets="\n".join(nodesets),
        partitions="\n".join(partitions),
        accounting=accounting_lines(spec),
        rest=rest_lines(spec.rest),
    )


def _part(name: str, **values: str) -> str:
    return Template(template(name)).substitute(**values).strip()


def accounting_lines(spec: ClusterSpec) -> str:
    """slurm.conf's accounting lines: slurmdbd storage (in the controller's container) and
    a gather plugin that works in containers; without accounting, no gathering."""
    if not spec.accounting:
        return _part("slurm.conf.noaccounting")
    return _part("slurm.conf.accounting", dbd_host=controller_node(spec))


def rest_lines(enabled: bool) -> str:
    """slurm.conf's (and slurmdbd.conf's) JWT lines: the key that checks REST tokens."""
    return _part("slurm.conf.rest") if enabled else ""


def slurmdbd_conf(spec: ClusterSpec, db_password: str) -> str:
    """slurmdbd.conf (mode 0600: it holds the database password)."""
    return (
        _part(
            "slurmdbd.conf.tmpl",
            cluster=spec.ClusterName,
            auth_alt=rest_lines(spec.rest),
            dbd_host=controller_node(spec),
            db_password=db_password,
        )
        + "\n"
    )
