"""Pure decisions of the deep health checks: limits, thresholds, who may run when,
whom a failed pair implicates, what a Slurm node's state means for a check."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..catalogue import InstanceType
from ..cluster import ONSTART_REASON
from ..slurm import SlurmNode

CHECKS = ("InstanceStress", "InstanceConnectivity")
REASON_PREFIX = "hp-health:"

# Used when a type has no HealthThresholds (see orchestrator/data/instance-types.yaml
# for how the shipped figures were measured).
DEFAULT_THRESHOLDS = {
    "StressCpuBogoOpsPerCpuSecond": 300.0,
    "StressVmBogoOpsPerCpuSecond": 600.0,
    "IperfGbps": 0.05,
    "NcclBusBwGbps": 1.0,
}
# A node whose cgroup grants less than this share of its type's CPUs or memory has
# been cut (docker update, a bad cgroup): it can't deliver what its type promises.
MIN_GRANT_SHARE = 0.9


@dataclass(frozen=True)
class NodeLimits:
    """A node container's cgroup limits as Docker reports them now."""

    nano_cpus: int = 0
    cpu_quota: int = 0
    cpu_period: int = 0
    memory_bytes: int = 0

    @property
    def granted_cpus(self) -> float | None:
        if self.nano_cpus:
            return self.nano_cpus / 1e9
        if self.cpu_quota > 0:
            return self.cpu_quota / (self.cpu_period or 100000)
        return None

    @property
    def memory_mib(self) -> float | None:
        return self.memory_bytes / 2**20 if self.memory_bytes else None


def node_limits(inspect_doc: dict[str, Any]) -> NodeLimits:
    hc = inspect_doc.get("HostConfig") or {}
    return NodeLimits(nano_cpus=int(hc.get("NanoCpus") or 0), cpu_quota=int(hc.get("CpuQuota") or 0),
                      cpu_period=int(hc.get("CpuPeriod") or 0), memory_bytes=int(hc.get("Memory") or 0))


def thresholds(itype: InstanceType) -> dict[str, float]:
    return {**DEFAULT_THRESHOLDS, **itype.health}


def grant_problems(itype: InstanceType, lim: NodeLimits, cpus_used: float | None) -> list[str]:
    """What the node's current cgroup withholds from what its type promises. The CPU
    time the stressors actually used is quoted, so the message says the node was
    throttled by its OWN quota (not merely waiting for busy siblings)."""
    out = []
    g = lim.granted_cpus
    if g is not None and g < MIN_GRANT_SHARE * itype.cpu_limit:
        used = f"; the stressors used {cpus_used:.3f} CPUs, all of it" if cpus_used is not None else ""
        out.append(f"CPU quota is {g:.3g} CPUs, below the {itype.cpu_limit:g} of {itype.name}{used}: "
                   "throttled by the node's own cgroup quota")
    m = lim.memory_mib
    if m is not None and m < MIN_GRANT_SHARE * itype.memory_mib:
        out.append(f"memory limit is {m:.0f} MiB, below the {itype.memory_mib} MiB of {itype.name}")
    return out


class CpuBudget:
    """Admit stress checks while the CPUs they are granted fit in the host's cores,
    so that concurrent checks don't steal each other's CPU time. One check is always
    admitted (a node bigger than the host still gets checked, alone)."""

    def __init__(self, host_cpus: float):
        self.total = host_cpus
        self.used = 0.0
        self.running = 0
        self._cv = threading.Condition()

    def fits(self, cpus: float) -> bool:
        return self.running == 0 or self.used + cpus <= self.total + 1e-9

    def acquire(self, cpus: float) -> None:
        with self._cv:
            self._cv.wait_for(lambda: self.fits(cpus))
            self.used += cpus
            self.running += 1

    def release(self, cpus: float) -> None:
        with self._cv:
            self.used -= cpus
            self.running -= 1
            self._cv.notify_all()


def ring_pairs(nodes: list[str]) -> list[tuple[str, str]]:
    """Client -> server pairs: each node sends to the next, the last to the first, so
    each node is in two pairs (one with two nodes: a single pair)."""
    if len(nodes) < 2:
        return []
    if len(nodes) == 2:
        return [(nodes[0], nodes[1])]
    return [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]


def implicated(nodes: list[str], pair_ok: dict[tuple[str, str], bool]) -> set[str]:
    """Nodes to blame for failed pair tests: a node all of whose pairs failed. When
    every pair failed nothing tells the nodes apart, and all are implicated; with
    two nodes both are."""
    bad = set()
    for n in nodes:
        mine = [ok for (a, b), ok in pair_ok.items() if n in (a, b)]
        if mine and not any(mine):
            bad.add(n)
    if pair_ok and not any(pair_ok.values()):
        return set(nodes)
    if not bad:  # some pair failed but every node also passed one: blame both ends of the failed pairs
        bad = {x for (a, b), ok in pair_ok.items() if not ok for x in (a, b)}
    return bad


@dataclass(frozen=True)
class Claim:
    """What to do with a node when a request starts: drain it, or skip it and why."""

    drain: bool
    skip_reason: str = ""


def claim(snode: SlurmNode | None, on_start: bool = False) -> Claim:
    """Whether a request may take the node. A node drained by hp (a check, or the
    on-start drain it registers with) is hp's to check again; any other drain is
    someone's. A node waiting for its on-start checks is left to them by on-demand
    requests, so that it is not resumed after checks other than its group's."""
    if snode is None:
        return Claim(False, "not registered in Slurm")
    if snode.drained and snode.reason == ONSTART_REASON and not on_start:
        return Claim(False, "waiting for its on-start deep health checks (drained until they pass)")
    if snode.drained:
        if snode.reason.startswith(REASON_PREFIX):  # hp's own check (this or an earlier one): check again
            return Claim(True)
        return Claim(False, f"already drained by someone else (reason: {snode.reason or 'none'}); "
                            "hp leaves it as it is")
    if snode.not_responding:
        return Claim(False, f"Slurm reports it {snode.display}")
    return Claim(True)


def idle_drained(snode: SlurmNode | None) -> bool:
    """Drained and running nothing (IDLE+DRAIN, not MIXED/ALLOCATED+DRAIN)."""
    return snode is not None and snode.base == "IDLE" and snode.drained


def reason(req: str, check: str, why: str = "") -> str:
    """The Slurm drain reason hp writes: names the request and the check."""
    r = f"{REASON_PREFIX}{req}:{check}"
    return f"{r} failed: {why}"[:200] if why else r


def is_ours(slurm_reason: str, req: str) -> bool:
    return slurm_reason.startswith(f"{REASON_PREFIX}{req}:")


def validate_checks(checks: list[str]) -> list[str]:
    return [f"unknown check {c!r} (checks: {', '.join(CHECKS)})" for c in checks if c not in CHECKS]
