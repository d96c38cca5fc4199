"""Capacity: instance types consume a finite pool shared by every cluster on the host.

With registered hosts there is one pool per host (`pools`): a node fits on one host,
and the pool of a type is the sum over the hosts (`ceiling` per host, summed by
cluster/create.py); placement (core/placement.py) picks the host.

By default the pool is the Docker host's real CPUs (x4, see below), memory and GPUs (each GPU backs
one node at a time; found by orchestrator/gpu/inventory.py, or HP_GPUS for tests); an admin can cap how many nodes of a type may run
(`hp capacity set TYPE N`). Usage is counted from the containers that exist (Docker
labels are the truth), under a host-wide lock so two launchers can't both take the
last slot.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..docker.provider import Provider
from ..docker.views import LOCAL_ENGINE, Container
from ..errors import TRANSIENT, BadInput, InsufficientCapacity
from ..gpu import inventory
from ..spec.catalogue import InstanceType
from ..state.store import Store

LIMITS_KEY = "capacity.limits"
QUARANTINE_KEY = "capacity.gpu-quarantine"  # GPU id -> why: GPUs a replace-class finding condemned


@dataclass(frozen=True)
class Pool:
    cpus: float
    memory_mib: int
    gpus: list[str]  # GPU ids (UUIDs)
    gpu_models: dict[str, str] = field(default_factory=dict)  # id -> model (h200...)
    gpu_note: str = ""  # what discovery said (why there are none)

    def gpus_of(self, model: str | None) -> list[str]:
        """The pool's GPUs of a model (every GPU when None)."""
        return [g for g in self.gpus if model is None or self.gpu_models.get(g) == model]

    def most_of_one_model(self, model: str | None) -> int:
        """The most GPUs one node may get: of `model`, or of any single model."""
        if model is not None:
            return len(self.gpus_of(model))
        counts: dict[str, int] = {}
        for g in self.gpus:
            counts[self.gpu_models.get(g, "")] = counts.get(self.gpu_models.get(g, ""), 0) + 1
        return max(counts.values(), default=0)


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


def host_pool(provider: Provider, store: Store | None, gpus_too: bool = True) -> Pool:
    """The host's pool; its GPUs only with `gpus_too` (discovery may run a probe
    container: nodes of CPU types never need it). Without a store (a dry run, which
    writes no state) GPUs are discovered uncached."""
    info = provider.info()
    factor = float(os.environ.get("HP_CPU_OVERCOMMIT", DEFAULT_CPU_OVERCOMMIT))
    if not gpus_too:
        return Pool(cpus=float(info.cpus) * factor, memory_mib=info.memory_mib, gpus=[], gpu_models={}, gpu_note="")

    try:
        g = inventory.discover(provider, store)
        gpus, models, note = g.ids, g.model_of(), g.why or g.summary()
    except TRANSIENT as e:  # no cached result and the engine failed: no GPU for now
        gpus, models, note = [], {}, f"GPU discovery failed: {str(e)[:200]}"
    bad = [x for x in gpus if store is not None and x in quarantined(store)]
    if bad:
        gpus = [x for x in gpus if x not in bad]
        note += f"; {len(bad)} GPU(s) quarantined after a replace-class finding ('hp capacity show')"
    return Pool(cpus=float(info.cpus) * factor, memory_mib=info.memory_mib, gpus=gpus, gpu_models=models, gpu_note=note)


def _gpu_words(itype: InstanceType) -> str:
    return f"{itype.gpus} GPU(s)" + (f" of model {itype.gpu_model}" if itype.gpu_model else "")


def pick_gpus(itype: InstanceType, pool: Pool, used: Usage) -> tuple[list[str] | None, str]:
    """GPUs for one node of `itype` (all of one model), or None and what is missing."""
    free = [g for g in pool.gpus_of(itype.gpu_model) if g not in used.gpus]
    by_model: dict[str, list[str]] = {}
    for g in free:
        by_model.setdefault(pool.gpu_models.get(g, ""), []).append(g)
    for _model, ids in sorted(by_model.items()):
        if len(ids) >= itype.gpus:
            return ids[: itype.gpus], ""
    if not pool.gpus_of(itype.gpu_model):
        note = f": {pool.gpu_note}" if pool.gpu_note else ""
        return None, f"needs {_gpu_words(itype)}, this host has none{note}"
    most = max((len(v) for v in by_model.values()), default=0)
    return None, f"needs {_gpu_words(itype)}, {most} free (of {len(pool.gpus_of(itype.gpu_model))})"


def usage(containers: list[Container], catalogue: Mapping[str, InstanceType]) -> Usage:
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
    missing = limit_problems(itype, used.per_type, limits)
    chosen, short = fit(itype, pool, used)
    missing += short
    if missing:
        raise InsufficientCapacity(f"no capacity for instance type {itype.name}: " + "; ".join(missing))
    return chosen


def limit_problems(itype: InstanceType, per_type: dict[str, int], limits: dict[str, int]) -> list[str]:
    """The admin's per-type limit (`hp capacity set`), over every host."""
    lim = limits.get(itype.name)
    if lim is not None and per_type.get(itype.name, 0) + 1 > lim:
        return [f"the limit for {itype.name} is {lim} node(s) and {per_type.get(itype.name, 0)} run"]
    return []


def fit(itype: InstanceType, pool: Pool, used: Usage) -> tuple[list[str] | None, list[str]]:
    """(GPU ids to give a node of `itype`, what is missing) on one host's pool."""
    missing = []
    if used.cpus + itype.cpu_limit > pool.cpus + 1e-9:
        missing.append(f"needs {itype.cpu_limit:g} CPU, {max(pool.cpus - used.cpus, 0):g} of {pool.cpus:g} free")
    if used.memory_mib + itype.memory_mib > pool.memory_mib:
        missing.append(f"needs {itype.memory_mib} MiB memory, {max(pool.memory_mib - used.memory_mib, 0)} MiB free")
    chosen: list[str] | None = None
    if itype.gpus:
        chosen, why = pick_gpus(itype, pool, used)
        if chosen is None:
            missing.append(why)
    return chosen, missing


def wants_gpus(catalogue: Mapping, types: Iterable[str]) -> bool:
    """Whether any of these instance types has GPUs (a type not in the catalogue has none)."""
    return any(catalogue[t].gpus for t in types if t in catalogue)


def pools(provider: Provider, store: Store, gpus: bool = True) -> tuple[dict[str, Pool], dict[str, str]]:
    """Host -> its pool, for the hosts nodes may be placed on now; and host -> why not, for
    the others (unreachable, or draining for `hp hosts remove --drain`). One engine: {LOCAL_ENGINE: pool}.
    Without `gpus`, the pools' GPUs are left out (for nodes of CPU types)."""
    engines = provider.engines()
    if LOCAL_ENGINE in engines:
        return {LOCAL_ENGINE: host_pool(provider, store, gpus)}, {}
    out: dict[str, Pool] = {}
    why = {h: f"unreachable ({w})" for h, w in provider.unreachable().items()}
    for r in store.hosts():
        if r.opt("draining"):
            why[r.name] = "draining (hp hosts remove --drain)"
        elif r.opt("fenced"):
            why[r.name] = f"fenced: {r.opt('fenced')}"
    for h, e in engines.items():
        if h in why:
            continue
        try:
            out[h] = host_pool(e, store, gpus)
        except TRANSIENT as ex:
            why[h] = f"unreachable ({str(ex).splitlines()[0][:120]})"
    return out, why


def quarantined(store: Store) -> dict[str, str]:
    """GPUs kept out of the pool (id -> why): a replace-class finding (uncorrectable ECC,
    a row-remap failure...) condemned them, so that a replacement node gets other GPUs.
    `hp capacity release-gpu` puts them back (after the card was fixed or swapped)."""
    return {str(k): str(v) for k, v in json.loads(store.get(QUARANTINE_KEY) or "{}").items()}


def quarantine(store: Store, gpus: list[str], why: str) -> None:
    cur = quarantined(store)
    cur.update({g: why[:300] for g in gpus})
    store.put(QUARANTINE_KEY, json.dumps(cur))


def release_gpus(store: Store, gpus: list[str] | None) -> list[str]:
    """Put quarantined GPUs back into the pool (all when None); the ids released."""
    cur = quarantined(store)
    gone = list(cur) if gpus is None else [g for g in gpus if g in cur]
    for g in gone:
        cur.pop(g, None)
    store.put(QUARANTINE_KEY, json.dumps(cur))
    return gone


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
    if itype.gpus:  # first: when GPUs bound as tightly as memory, they are what the user must hear about
        have = pool.gpus_of(itype.gpu_model)
        of = f" of model {itype.gpu_model}" if itype.gpu_model else ""
        note = f": {pool.gpu_note}" if not have and pool.gpu_note else ""
        bounds.append(
            (pool.most_of_one_model(itype.gpu_model) // itype.gpus, f"{len(have)} GPU(s){of} on this host{note}")
        )
    if itype.cpu_limit > 0:
        bounds.append((int(pool.cpus // itype.cpu_limit + 1e-9), f"{pool.cpus:g} CPU in the pool"))
    if itype.memory_mib > 0:
        bounds.append((pool.memory_mib // itype.memory_mib, f"{pool.memory_mib} MiB of memory"))
    if not bounds:
        return 1 << 30, "no bound"
    n, why = min(bounds, key=lambda b: b[0])
    return n, why


def report(provider: Provider, store: Store, catalogue: Mapping[str, InstanceType]) -> dict:
    """The pool, what hp's nodes use of it, and per-type limits (`hp capacity show`); with
    registered hosts the pool is the sum over the hosts nodes may go to, and `Hosts`
    gives each host's share."""
    provider.ping()
    per_host, why = pools(provider, store)
    containers = provider.containers()
    used = usage(containers, catalogue)
    lim = limits(store)
    gpus = [g for p in per_host.values() for g in p.gpus]
    models = {k: v for p in per_host.values() for k, v in p.gpu_models.items()}
    doc = {
        "Pool": {
            "Cpus": sum(p.cpus for p in per_host.values()),
            "MemoryMiB": sum(p.memory_mib for p in per_host.values()),
            "Gpus": gpus,
            "GpuModels": models,
            "GpuDiscovery": "; ".join(f"{h}: {p.gpu_note}" if h else p.gpu_note for h, p in per_host.items()),
            "GpuQuarantined": quarantined(store),
        },
        "Used": {"Cpus": round(used.cpus, 3), "MemoryMiB": used.memory_mib, "Gpus": sorted(used.gpus)},
        "Types": [
            {"InstanceType": t, "Running": used.per_type.get(t, 0), "Limit": lim.get(t)} for t in sorted(catalogue)
        ],
    }
    if LOCAL_ENGINE not in per_host:
        hosts = []
        for h in provider.engines():
            u = usage([c for c in containers if c.host == h], catalogue)
            p = per_host.get(h)
            hosts.append(
                {
                    "Host": h,
                    "Available": p is not None,
                    "Why": why.get(h),
                    "Cpus": p.cpus if p else None,
                    "MemoryMiB": p.memory_mib if p else None,
                    "Gpus": len(p.gpus) if p else None,
                    "UsedCpus": round(u.cpus, 3),
                    "UsedMemoryMiB": u.memory_mib,
                }
            )
        doc["Hosts"] = hosts
    return doc


def set_limit_checked(
    store: Store, catalogue: Mapping[str, InstanceType], itype: str, count: int | None, clear: bool
) -> None:
    """`hp capacity set`: every problem at once (BadInput), else the new limit."""
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
