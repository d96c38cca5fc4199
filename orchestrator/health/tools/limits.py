"""What a node's type promises and its cgroup grants: thresholds, grant checks, and the
host CPU budget that keeps concurrent stress checks from stealing each other's time."""

from __future__ import annotations

import threading

from ...docker.views import Limits
from ...spec.catalogue import InstanceType

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


def thresholds(itype: InstanceType) -> dict[str, float]:
    return {**DEFAULT_THRESHOLDS, **itype.health}


def grant_problems(itype: InstanceType, lim: Limits, cpus_used: float | None) -> list[str]:
    """What the node's current cgroup withholds from what its type promises. The CPU
    time the stressors actually used is quoted, so the message says the node was
    throttled by its OWN quota (not merely waiting for busy siblings)."""
    out = []
    g = lim.granted_cpus
    if g is not None and g < MIN_GRANT_SHARE * itype.cpu_limit:
        used = f"; the stressors used {cpus_used:.3f} CPUs, all of it" if cpus_used is not None else ""
        out.append(
            f"CPU quota is {g:.3g} CPUs, below the {itype.cpu_limit:g} of {itype.name}{used}: "
            "throttled by the node's own cgroup quota"
        )
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
