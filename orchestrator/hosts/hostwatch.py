"""The host watcher: a controller of each multi-host cluster's agent (orchestrator/runtime.py).

Every POLL_S it pings every registered host (key "": MultiHostProvider.check; a unix socket
to a dead engine fails at once, a TCP one within HP_HOST_PING_TIMEOUT) and, every
SWARM_EVERY_S, reads the swarm's node states from a manager (key "swarm", on another of the
controller's workers: while the swarm elects a new leader a manager's answer waits seconds,
and the pings must go on meanwhile). A host that has not
answered for LOST_AFTER_S (or whose swarm node is Down: then it is fenced, so that no
node is placed there until it is Ready again) is lost:

- nodes placed there (the store's placement) get an event; with NodeRecovery Automatic
  each is replaced on another host under the same Slurm name (its key "node:<name>", all
  of them side by side on the controller's workers; recovery.actions.replace: Replacing,
  then Running; a replacement that finds no capacity is LaunchFailed and the
  reconciler retries it with backoff, forever in continuous mode); without, they are
  marked (their status message) and wait for the host;
- when the controller is there, the cluster is Degraded with a message saying so: one
  controller, as in HyperPod; nothing is replaced (no Slurm would take the nodes). It
  comes back with its state (the slurmctld volume is on that host) when the host does.

While a host is lost the watcher keeps a record of it in the registry (renewed every
RECORD_EVERY_S), so that hp's commands take it as unreachable without waiting on it.

A host that answers again is reconciled before anything starts: copies of nodes that
were replaced elsewhere are removed (they never run again: hp gives containers no
restart policy, so a returning engine starts nothing by itself), check containers left
there are removed, and the controller, the /home file server and the nodes still placed
there are started. The same sweep of stale copies runs every SWEEP_EVERY_S, so that no
Slurm node is ever doubled.

Bound (docs/multihost.md, measured by bench/multihost.py): a killed host's nodes are idle
on other hosts within LOST_AFTER_S + POLL_S + a replacement (create and start on another
host, slurmd registers: about 1-2 s).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ..core.across_hosts import controller_host_of, ensure_fileserver
from ..core.context import Cluster, Env
from ..errors import TRANSIENT, EngineError, EngineUnavailable
from ..naming import group_prefix, node_id
from ..recovery import actions
from ..runtime import Controller, Result, node_key, node_of
from ..state.phases import Phase, allowed
from ..state.store import Latest, iso
from ..state.transitions import NODES_HANDS_OFF, ClusterStatus
from .engines import record_lost
from .registry import _manager

log = logging.getLogger("hp.hosts")

POLL_S = 1.0
LOST_AFTER_S = float(os.environ.get("HP_HOST_LOST_AFTER", "3"))
SWARM_EVERY_S = 5.0
SWEEP_EVERY_S = 5.0
RECORD_EVERY_S = 2.0  # a lost host's record is renewed this often (engines.LOST_TRUST_S)
FRESH_S = 20.0  # a host that came back is swept every poll this long
REPLACE_WAIT_S = 60.0
WATCHED = frozenset(ClusterStatus).difference(NODES_HANDS_OFF)
CONTROLLER_LOST = "the controller's host"
SWARM = "swarm"  # the key that reads the swarm's node states

Replace = Callable[[Cluster, str, str, float], bool]


class HostWatch(Controller):
    kind = "hosts"
    keys = ("", SWARM)
    backoff = (POLL_S,)
    workers = 16  # the pings, the swarm's states, and a lost host's nodes replaced side by side

    def __init__(self, env: Env, name: str, replace: Replace | None = None, clock: Callable[[], float] = time.time):
        self.env = env
        self.name = name
        self.cluster = Cluster(env, name)
        self.clock = clock
        self._replace = replace or actions.replace
        self.down_since: dict[str, float] = {}
        self.acted: dict[str, str] = {}  # hosts whose loss was acted on (this outage) -> why they are lost
        self._last_sweep = 0.0
        self._swarm_down: dict[str, str] = {}
        self._first = True
        self._fresh: dict[str, float] = {}  # host back -> until when it is swept every poll
        self._recorded: dict[str, float] = {}  # host -> when its loss was last recorded

    # -- the controller ---------------------------------------------------------------
    def reconcile(self, key: str) -> Result:
        if (node := node_of(key)) is not None:
            return self.replace_lost(node)
        if key == SWARM:
            if self._watching():
                self._swarm_down = self._swarm_states()
            return Result(SWARM_EVERY_S)
        self.poll()
        return Result(POLL_S)

    def describe(self, key: str) -> str:
        node = node_of(key)
        return f"replacement of {node} after its host was lost" if node else super().describe(key)

    def _watching(self) -> bool:
        if not self.env.provider.places_nodes:
            return False
        row = self.env.store.cluster(self.name)
        return row is not None and row.status not in NODES_HANDS_OFF

    def poll(self) -> None:
        if not self._watching():
            return
        now = self.clock()
        mp: Any = self.env.provider
        down = dict(mp.check()) if hasattr(mp, "check") else dict(mp.unreachable(refresh=True))
        unanswered = set(down)  # its engine (a fenced host's may still answer)
        for h, why in self._swarm_down.items():
            down.setdefault(h, why)
        for h in self.env.provider.engines():
            if h in down:
                since = self.down_since.setdefault(h, now)
                due = now - self._recorded.get(h, 0.0) >= RECORD_EVERY_S
                if h in unanswered and now - since >= LOST_AFTER_S and due:
                    self._recorded[h] = now  # hp's commands take it as unreachable without waiting on it
                    record_lost(self.env.store, h, down[h], since, now)
                if h not in self.acted and now - since >= LOST_AFTER_S:
                    self.acted[h] = down[h]
                    self.host_lost(h, down[h], since)
            if h not in unanswered and self._recorded.pop(h, None) is not None:
                record_lost(self.env.store, h, None)
            if h not in down:
                self.down_since.pop(h, None)
                if h in self.acted:
                    del self.acted[h]
                    self._fresh[h] = now + FRESH_S
                    self.host_back(h)
                elif self._fresh.get(h, 0) > now:  # a returning engine may list its containers late
                    self.sweep(h, returned=True)
        if self._first or now - self._last_sweep >= SWEEP_EVERY_S:
            self._first = False
            self._last_sweep = now
            for h in self.env.provider.engines():
                if h not in down:
                    self.sweep(h, returned=False)
        self._controller_status(down)

    def _swarm_states(self) -> dict[str, str]:
        """Hosts whose swarm node a manager sees Down (their engine may still answer):
        fenced in the registry (no node is placed there) until Ready again."""
        store = self.env.store
        try:
            _, mgr, _ = _manager(store)
            nodes = {n["id"]: n for n in mgr.swarm_nodes()}
        except (*TRANSIENT, OSError) as e:  # no manager answers: the pings say the rest
            log.info("swarm node states unknown: %s", e)
            return {}
        out = {}
        for r in store.hosts():
            n = nodes.get(r.opt("swarm_node_id", ""))
            down = n is not None and n["state"] == "down"
            if down:
                out[r.name] = "its swarm node is Down"
            if down != bool(r.opt("fenced")):
                store.update_host(r.name, fenced=out.get(r.name))
        return out

    # -- a host is lost ------------------------------------------------------------------
    def host_lost(self, host: str, why: str, since: float) -> None:
        c = self.cluster
        store = self.env.store
        spec = c.reload()
        placed = store.node_hosts(self.name)
        latest = store.latest_phases(self.name)
        gone = (Phase.REMOVED, Phase.SHUTTING_DOWN)
        ours = sorted(n for n, h in placed.items() if h == host and latest.phase(n) not in gone)
        if not ours:
            return
        log.warning("host %s lost (%s): nodes %s", host, why, ", ".join(ours))
        at = iso(since)
        if c.controller_node in ours:
            msg = (
                f"{CONTROLLER_LOST} {host} does not answer ({why}) since {at}: Slurm is down until it returns; "
                "the cluster comes back with its state then (one controller per cluster, as in HyperPod)"
            )
            store.set_status(self.name, ClusterStatus.DEGRADED, msg, expect=WATCHED)
            for n in ours:
                self._mark(n, host, at, why, latest)
            return
        automatic = spec.NodeRecovery == "Automatic"
        for n in ours:
            replace = automatic and allowed(latest.phase(n), Phase.REPLACING)
            what = f"Instance {n} in cluster {self.name} is lost with its host {host}: {why}"
            what += "; replacing it on another host" if replace else ""
            store.event(self.name, "Instance", "Warn", what, _group_of(c, n) or None, node=n)
            if replace:
                self.offer(node_key(n))
            else:
                self._mark(n, host, at, why, latest)

    def _mark(self, n: str, host: str, at: str, why: str, latest: Latest) -> None:
        if latest.phase(n) is Phase.RUNNING:
            self.env.store.set_phase(self.name, n, Phase.RUNNING, f"its host {host} does not answer ({why}) since {at}")

    def replace_lost(self, n: str) -> Result:
        """A node's key: replaced on another host while the host it is placed on is lost
        (NodeRecovery Automatic); once, a replacement that failed is the reconciler's to retry
        (LaunchFailed; a bug: reported, the key parked)."""
        store = self.env.store
        host = store.node_hosts(self.name).get(n, "")
        why = self.acted.get(host)
        if why is None or self.cluster.reload().NodeRecovery != "Automatic":
            return Result()
        if not allowed(store.latest_phases(self.name).phase(n), Phase.REPLACING):
            return Result()
        try:
            self._replace(self.cluster, n, f"its host {host} does not answer ({why})", REPLACE_WAIT_S)
        except TRANSIENT as e:  # the reconciler retries a replacement left LaunchFailed
            log.warning("replacing %s: %s", n, e)
        return Result()

    # -- a host comes back ----------------------------------------------------------------
    def host_back(self, host: str) -> None:
        log.info("host %s answers again", host)
        store = self.env.store
        store.event(self.name, "Cluster", "Info", f"Cluster {self.name}: host {host} answers again")
        self.sweep(host, returned=True)
        mark = f"its host {host} does not answer"
        for n, rec in store.latest_phases(self.name).items():
            if rec.phase is Phase.RUNNING and rec.message.startswith(mark):
                store.set_phase(self.name, n, Phase.RUNNING, f"back with its host {host}")

    def sweep(self, host: str, returned: bool) -> list[str]:
        """Remove stale copies of nodes placed elsewhere on `host` (and, once it came
        back, check containers left there), then start what is still placed there and
        stopped (only when it came back). Returns what was removed."""
        c = self.cluster
        p = self.env.provider
        store = self.env.store
        try:
            containers = [x for x in p.containers(self.name) if x.host == host]
        except (EngineError, EngineUnavailable) as e:
            log.info("sweep of %s: %s", host, e)
            return []
        placed = store.node_hosts(self.name)
        latest = store.latest_phases(self.name)
        removed = []
        for x in containers:
            if x.role in ("check", "nettest") and returned and not x.running:
                p.remove_container(x.id)  # killed with the host: its request is over
                continue
            if not x.is_node or not x.node:
                continue
            where = placed.get(x.node)
            if where and where != host:
                p.remove_container(x.id)  # before anything may start it: never two of one Slurm node
                removed.append(x.node)
                what = f"its stale copy on host {host} was removed (the node runs on {where})"
                nid = node_id(x.id)
                what = f"Instance {nid} ({x.node}) in cluster {self.name}: {what}"
                store.event(self.name, "Instance", "Info", what, x.group, nid, x.node)
                continue
            if returned and not x.running:
                if x.role == "controller" or latest.phase(x.node) is Phase.RUNNING:
                    log.info("starting %s again on %s", x.node, host)
                    try:
                        p.start(x.id)
                    except EngineError as e:
                        log.warning("starting %s on %s: %s", x.node, host, e)
        if controller_host_of(c) == host:
            try:
                ensure_fileserver(c)
            except (EngineError, EngineUnavailable) as e:
                log.warning("file server of %s: %s", self.name, e)
        return removed

    def _controller_status(self, down: dict[str, str]) -> None:
        """A cluster Degraded by its controller's host is InService again once Slurm answers."""
        row = self.env.store.cluster(self.name)
        if row is None or row.status != ClusterStatus.DEGRADED or not row.message.startswith(CONTROLLER_LOST):
            return
        if controller_host_of(self.cluster) in down:
            return
        try:
            up = self.cluster.slurm.ping()
        except TRANSIENT:
            up = False
        if up:
            back = "its controller's host is back"
            self.env.store.set_status(self.name, ClusterStatus.IN_SERVICE, detail=back, expect=ClusterStatus.DEGRADED)


def _group_of(c: Cluster, node: str) -> str:
    prefix = group_prefix(node)
    return next((g.InstanceGroupName for g in c.spec.InstanceGroups if g.InstanceGroupName.lower() == prefix), "")
