"""Capacity: instance types consume a finite pool shared by every cluster on the host.

By default the pool is the Docker host's real CPUs (x4, see below), memory and GPUs (each GPU backs
one node at a time); an admin can cap how many nodes of a type may run
(`hp capacity set TYPE N`). Usage is counted from the containers that exist (Docker
labels are the truth), under a host-wide lock so two launchers can't both take the
last slot.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..docker.provider import Provider
from ..docker.views import Container
from ..errors import InsufficientCapacity
from ..spec.catalogue import InstanceType
from ..state.store import Store

LIMITS_KEY = "capacity.limits"


@dataclass(frozen=True)
class Pool:
    cpus: float
    memory_mib: int
    gpus: list[str]


@dataclass(frozen=True)
class Usage:
    cpus: float
    memory_mib: int
    gpus: set[str]
    per_type: dict[str, int]

    def plus(self, itype: InstanceType, gpus: list[str]) -> Usage:
        """What is used once one more node of `itype` (with these GPUs) runs."""
        return Usage(
            self.cpus + itype.cpu_limit,
            self.memory_mib + itype.memory_mib,
            self.gpus | set(gpus),
            {**self.per_type, itype.name: self.per_type.get(itype.name, 0) + 1},
        )


# CPU limits are ceilings (cgroup quotas), not reservations, and idle Slurm nodes use
# almost none: by default the pool holds 4x the host's cores. HP_CPU_OVERCOMMIT=1 makes
# it strict. Memory is never overcommitted.
DEFAULT_CPU_OVERCOMMIT = 4.0


def host_pool(provider: Provider) -> Pool:
    info = provider.info()
    gpus = [g.strip() for g in os.environ.get("HP_GPUS", "").split(",") if g.strip()]
    factor = float(os.environ.get("HP_CPU_OVERCOMMIT", DEFAULT_CPU_OVERCOMMIT))
    return Pool(cpus=float(info.cpus) * factor, memory_mib=info.memory_mib, gpus=gpus)


def usage(containers: list[Container], catalogue: dict[str, InstanceType]) -> Usage:
    """What the live node containers hold (exited ones hold nothing)."""
    cpus, mem, per = 0.0, 0, {}
    gpus: set[str] = set()
    for c in containers:
        if not c.is_node:
            continue
        # an exited node's GPUs stay its own: recovery restarts it in place
        gpus |= set(c.gpus)
        if c.dead:
            continue
        t = catalogue.get(c.itype)
        if t is None:
            continue
        cpus += t.cpu_limit
        mem += t.memory_mib
        per[t.name] = per.get(t.name, 0) + 1
    return Usage(cpus, mem, gpus, per)


def check(itype: InstanceType, pool: Pool, used: Usage, limits: dict[str, int]) -> list[str] | None:
    """GPU ids to give a node of `itype`, or raise InsufficientCapacity naming what is missing."""
    missing = []
    lim = limits.get(itype.name)
    if lim is not None and used.per_type.get(itype.name, 0) + 1 > lim:
        missing.append(f"the limit for {itype.name} is {lim} node(s) and {used.per_type.get(itype.name, 0)} run")
    if used.cpus + itype.cpu_limit > pool.cpus + 1e-9:
        missing.append(f"needs {itype.cpu_limit:g} CPU, {max(pool.cpus - used.cpus, 0):g} of {pool.cpus:g} free")
    if used.memory_mib + itype.memory_mib > pool.memory_mib:
        missing.append(f"needs {itype.memory_mib} MiB memory, {max(pool.memory_mib - used.memory_mib, 0)} MiB free")
    free_gpus = [g for g in pool.gpus if g not in used.gpus]
    if itype.gpus and len(free_gpus) < itype.gpus:
        missing.append(f"needs {itype.gpus} GPU(s), {len(free_gpus)} free")
    if missing:
        raise InsufficientCapacity(f"no capacity for instance type {itype.name}: " + "; ".join(missing))
    return free_gpus[: itype.gpus] if itype.gpus else None


def limits(store: Store) -> dict[str, int]:
    return {k: int(v) for k, v in json.loads(store.get(LIMITS_KEY) or "{}").items()}


def set_limit(store: Store, itype: str, n: int | None) -> None:
    cur = limits(store)
    if n is None:
        cur.pop(itype, None)
    else:
        cur[itype] = n
    store.put(LIMITS_KEY, json.dumps(cur))


@contextmanager
def host_lock(home: Path) -> Iterator[None]:
    """Serialise capacity decisions across every hp process on this host."""
    with open(home / "capacity.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ceiling(itype: InstanceType, pool: Pool) -> tuple[int, str]:
    """The most nodes of `itype` the host could ever run at once (every other node
    gone), and what sets that bound. Admin limits (`hp capacity set`) are not bounds:
    they change, and nodes wait for them in continuous mode."""
    bounds = []
    if itype.cpu_limit > 0:
        bounds.append((int(pool.cpus // itype.cpu_limit + 1e-9), f"{pool.cpus:g} CPU in the pool"))
    if itype.memory_mib > 0:
        bounds.append((pool.memory_mib // itype.memory_mib, f"{pool.memory_mib} MiB of memory"))
    if itype.gpus:
        bounds.append((len(pool.gpus) // itype.gpus, f"{len(pool.gpus)} GPU(s)"))
    if not bounds:
        return 1 << 30, "no bound"
    n, why = min(bounds, key=lambda b: b[0])
    return n, why


def report(provider: Provider, store: Store, catalogue: dict[str, InstanceType]) -> dict:
    """The host's pool, what hp's nodes use of it, and per-type limits (`hp capacity show`)."""
    provider.ping()
    pool = host_pool(provider)
    used = usage(provider.containers(), catalogue)
    lim = limits(store)
    return {
        "Pool": {"Cpus": pool.cpus, "MemoryMiB": pool.memory_mib, "Gpus": pool.gpus},
        "Used": {"Cpus": round(used.cpus, 3), "MemoryMiB": used.memory_mib, "Gpus": sorted(used.gpus)},
        "Types": [
            {"InstanceType": t, "Running": used.per_type.get(t, 0), "Limit": lim.get(t)} for t in sorted(catalogue)
        ],
    }


def set_limit_checked(
    store: Store, catalogue: dict[str, InstanceType], itype: str, count: int | None, clear: bool
) -> None:
    """`hp capacity set`: every problem at once (BadInput), else the new limit."""
    from ..errors import BadInput

    problems = []
    if itype not in catalogue:
        problems.append(f"unknown instance type {itype!r} (known: {', '.join(sorted(catalogue))})")
    if clear == (count is not None):
        problems.append("give either a COUNT or --clear")
    if count is not None and count < 0:
        problems.append(f"COUNT must be >= 0, got {count}")
    if problems:
        raise BadInput(problems, "cannot set capacity")
    set_limit(store, itype, None if clear else count)
