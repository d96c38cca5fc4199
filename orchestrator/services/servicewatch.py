"""The agent's watch over a cluster's services (a controller of orchestrator/runtime.py):

- a service container that stopped (killed, exited, removed) is brought back at once:
  slurmrestd's (made again when removed), and an older cluster's accounting container
  (then slurmctld may restart: recovery waits for this). Docker's restart policy already
  restarts a process that died inside its container; a container stopped through the
  engine is the watch's to start;
- accounting's health (Healthy, or Unhealthy with DaemonDown / DbUnreachable) is checked
  at each look (every POLL_S, and when an event wakes the watch); each change is an `hp events` entry; a slurmdbd or database that
  runs but does not answer for HUNG_AFTER_S is killed in the controller's container (its
  entry starts it again; an older cluster's accounting container is restarted).

Whatever NodeRecovery says: the services are the cluster's infrastructure, not nodes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from .. import waits
from ..core.context import Cluster, Env
from ..docker.views import Container, Event
from ..errors import OperationFailed
from ..naming import SERVICE_HOSTS
from ..runtime import Controller, Result
from ..state.transitions import ENDING
from .accounting import (
    DAEMON_DOWN,
    HOSTS,
    LEGACY_ACCOUNTING,
    LEGACY_DATABASE,
    Health,
    ensure_up,
    health,
    kill_hung,
    restart,
    roles,
    service_containers,
)

log = logging.getLogger("hp.services")

# the containers' states (one list call of every container of the cluster), and accounting's
# health (sacctmgr ping: one exec): a safety net, since a service host's die, destroy or
# pause wakes the watch at once (`watch`); every 2 s it was a third of an idle agent's
# listings at 60 nodes
POLL_S = 10.0
HUNG_AFTER_S = 30.0
SETTLE_S = 0.5  # after an event or a death, give the engine's state and Docker's restart policy a moment
BACKOFF_S = 30.0


class ServiceWatch(Controller):
    kind = "services"
    backoff = (2.0,)  # the engine or Slurm did not answer: soon again

    def __init__(self, env: Env, name: str):
        self.env = env
        self.name = name
        self.cluster = Cluster(env, name)
        self.last: Health | None = None
        self.unhealthy_since: float | None = None
        self.retry_at = 0.0

    def watch(self, event: Event) -> Iterable[str]:
        """A service container stopped (die, destroy, pause): look now."""
        return ("",) if event.role in SERVICE_HOSTS and event.action in ("die", "destroy", "pause") else ()

    def reconcile(self, key: str) -> Result:
        self.step()
        return Result(POLL_S)

    def _event(self, level: str, text: str) -> None:
        self.env.store.event(self.name, "Cluster", level, f"Cluster {self.name}: {text}")

    def step(self, now: float | None = None) -> None:
        row = self.env.store.cluster(self.name)
        if row is None or row.status in ENDING:
            return
        self.cluster.reload()
        spec = self.cluster.spec
        if not (spec.accounting or spec.rest):
            return
        cs = self.cluster.containers()  # one listing serves the roles, the states and health
        wanted = roles(self.cluster, cs)
        now = time.monotonic() if now is None else now
        down = self._down(wanted, cs)
        if down and now >= self.retry_at:
            waits.pause(SETTLE_S)
            cs = self.cluster.containers()
            down = self._down(wanted, cs)
        if down and now >= self.retry_at:
            names = ", ".join(f"{HOSTS[r]} ({why})" for r, why in down.items())
            self._event("Warn", f"{names} down: starting it again")
            t0 = time.monotonic()
            try:
                done = ensure_up(self.cluster)
            except OperationFailed as e:
                self.retry_at = now + BACKOFF_S
                self._event("Error", f"could not bring {names} back (tried again in {BACKOFF_S:g} s): {e}")
                return
            self._event("Info", f"{'; '.join(done) or 'services'}: back in {time.monotonic() - t0:.1f} s")
            cs = self.cluster.containers()  # as the repair left them
        if spec.accounting:
            self._health(now, cs)

    def _down(self, wanted: list[str], containers: list[Container]) -> dict[str, str]:
        svc = service_containers(self.cluster, containers)
        out = {}
        for r in wanted:
            c = svc.get(r)
            if c is None:
                out[r] = "no container"
            elif not c.running and c.state != "restarting":
                out[r] = f"container {c.state}" + (f", exit {c.exit_code}" if c.dead else "")
        return out

    def _health(self, now: float, containers: list[Container]) -> None:
        h = health(self.cluster, containers)
        prev, self.last = self.last, h
        if prev is None or (prev.status, prev.reason) != (h.status, h.reason):
            if h.healthy:
                if prev is not None:
                    self._event("Info", "slurmdbd is Healthy again")
            else:
                self._event("Warn", f"slurmdbd is Unhealthy ({h.reason}): {h.message}")
        if h.healthy:
            self.unhealthy_since = None
            return
        self.unhealthy_since = self.unhealthy_since if self.unhealthy_since is not None else now
        if now - self.unhealthy_since < HUNG_AFTER_S or now < self.retry_at:
            return
        svc = service_containers(self.cluster, containers)
        what = "slurmdbd" if h.reason == DAEMON_DOWN else "its database"
        try:
            if LEGACY_ACCOUNTING not in svc:  # in the controller's container: the process is killed
                self._event("Warn", f"{what} runs but does not answer: killing it (its entry starts it again)")
                self._event("Info", kill_hung(self.cluster, h.reason or DAEMON_DOWN))
            else:  # an older cluster's own container(s): restarted
                role = LEGACY_DATABASE if h.reason != DAEMON_DOWN and LEGACY_DATABASE in svc else LEGACY_ACCOUNTING
                self._event("Warn", f"{what} runs but does not answer: restarting {HOSTS[role]}'s container")
                self._event("Info", restart(self.cluster, role))
            self.unhealthy_since = None
        except OperationFailed as e:
            self.retry_at = now + BACKOFF_S
            self._event("Error", f"bringing {what} back failed: {e}")
