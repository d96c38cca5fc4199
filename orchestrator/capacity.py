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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .catalogue import InstanceType
from .errors import InsufficientCapacity
from .naming import L_ITYPE, L_ROLE
from .provider import ContainerInfo, DockerProvider
from .state import Store

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


# CPU limits are ceilings (cgroup quotas), not reservations, and idle Slurm nodes use
# almost none: by default the pool holds 4x the host's cores. HP_CPU_OVERCOMMIT=1 makes
# it strict. Memory is never overcommitted.
DEFAULT_CPU_OVERCOMMIT = 4.0


def host_pool(provider: DockerProvider) -> Pool:
    info = provider.info()
    gpus = [g.strip() for g in os.environ.get("HP_GPUS", "").split(",") if g.strip()]
    factor = float(os.environ.get("HP_CPU_OVERCOMMIT", DEFAULT_CPU_OVERCOMMIT))
    return Pool(cpus=float(info.get("NCPU", os.cpu_count() or 1)) * factor,
                memory_mib=int(info.get("MemTotal", 0)) // (1024 * 1024), gpus=gpus)


def usage(containers: list[ContainerInfo], catalogue: dict[str, InstanceType]) -> Usage:
    """What the live node containers hold (exited ones hold nothing)."""
    cpus, mem, per = 0.0, 0, {}
    gpus: set[str] = set()
    for c in containers:
        if c.labels.get(L_ROLE) not in ("controller", "login", "worker"):
            continue
        # an exited node's GPUs stay its own: recovery restarts it in place
        gpus |= {g for g in c.labels.get("io.hp.gpus", "").split(",") if g}
        if c.state in ("exited", "dead"):
            continue
        t = catalogue.get(c.labels.get(L_ITYPE, ""))
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
