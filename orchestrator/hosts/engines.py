"""The provider hp uses, given the registered hosts (registry.py): the local engine when
none is registered, else a MultiHostProvider over their engines; and the host watcher's
records of the hosts it found lost, which every process's provider trusts for a while.

Apart from registry.py, which holds what adding and removing a host needs (the swarm, the
probes, a drain): every command makes a provider, and this is all it loads for it.
"""

from __future__ import annotations

import os
import time

from ..docker import engine as engine_mod
from ..docker.engine import DockerEngine
from ..docker.multihost import PING_TIMEOUT_S, MultiHostProvider
from ..docker.provider import Provider
from ..state.store import HostRow, Store, iso

LOST_KEY = "lost"  # in a host's doc: {"why", "since", "seen"}, kept by the host watcher
LOST_TRUST_S = 10.0


def engine_for(row: HostRow, timeout: float | None = None, answer_timeout: float = PING_TIMEOUT_S) -> DockerEngine:
    """A registered host's engine: one that does not answer costs a call `answer_timeout`
    (its first answer), not docker-py's 60 s."""
    return engine_mod.DockerEngine(
        row.url,
        name=row.name,
        timeout=timeout,
        answer_timeout=answer_timeout,
        cpus=row.opt("cpus"),
        memory_mib=row.opt("memory_mib"),
        tls_dir=row.opt("tls_dir"),
    )


def overlay_mtu(rows: list[HostRow]) -> int | None:
    """The overlay's MTU: HP_OVERLAY_MTU, else 50 below the smallest NIC MTU given with
    --mtu (VXLAN's overhead) when one is below 1500; else Docker's default (1450)."""
    if raw := os.environ.get("HP_OVERLAY_MTU"):
        return int(raw)
    nics = [int(r.opt("mtu")) for r in rows if r.opt("mtu")]
    if nics and min(nics) < 1500:
        return min(nics) - 50
    return None


def provider_for(store: Store) -> Provider:
    """The local engine when no host is registered; else the hosts' engines together
    (those a host watcher found lost moments ago taken as unreachable, not even pinged)."""
    rows = store.hosts()
    if not rows:
        return engine_mod.DockerEngine()  # looked up now (tests replace it)
    return MultiHostProvider(
        {r.name: engine_for(r) for r in rows}, engine_mod.DockerEngine(), mtu=overlay_mtu(rows), lost=lost_hosts(rows)
    )


def lost_hosts(rows: list[HostRow], now: float | None = None) -> dict[str, str]:
    """Host -> why, for the hosts a host watcher recorded as lost within LOST_TRUST_S
    (it records them every poll while they are; an older record is not trusted: the
    watcher may have stopped)."""
    now = time.time() if now is None else now
    out = {}
    for r in rows:
        u = r.opt(LOST_KEY)
        if isinstance(u, dict) and now - float(u.get("seen", 0)) < LOST_TRUST_S:
            out[r.name] = f"{u.get('why', 'does not answer')} (lost since {iso(float(u.get('since', now)))})"
    return out


def record_lost(store: Store, host: str, why: str | None, since: float = 0.0, now: float = 0.0) -> None:
    """The host watcher's record of a lost host (why None: it answers again)."""
    try:
        store.update_host(host, **{LOST_KEY: {"why": why, "since": since, "seen": now} if why else None})
    except KeyError:  # removed meanwhile
        pass
