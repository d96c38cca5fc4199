"""The agent's loopback endpoints of a cluster: metrics (always) and the REST front
(with Rest). Each listens on 127.0.0.1 on a port recorded in the store (ports.py), so
that the URLs `hp metrics` and `hp api` print stay the same when the agent restarts (a
port taken meanwhile by another program is replaced by a free one, and recorded)."""

from __future__ import annotations

import logging
from typing import Any

from ..core.context import Cluster, Env
from ..errors import EngineError
from ..naming import network_name, service_container
from .accounting import REST_PORT, jwt_key
from .front import UPSTREAM_TIMEOUT, Front
from .metrics import HealthResults, registry
from .ports import KINDS, key, url

log = logging.getLogger("hp.agent")

# In slurmrestd's container: the request from stdin to slurmrestd, then its answer (the
# request says Connection: close) to stdout; bounded by the front's own upstream timeout.
REST_RELAY = [
    "bash",
    "-c",
    f"exec 3<>/dev/tcp/127.0.0.1/{REST_PORT} && cat >&3 && exec timeout {UPSTREAM_TIMEOUT:g} cat <&3",
]


class Endpoints:
    """Started by the agent: the servers, on daemon threads."""

    def __init__(self, env: Env, name: str, health_results: HealthResults):
        self.env = env
        self.name = name
        self.health_results = health_results
        self.cluster = Cluster(env, name)
        self.servers: list[Any] = []
        self._upstream: tuple[str, int] | None = None

    def _bind(self, kind: str, make: Any) -> Any:
        store = self.env.store
        want = int(store.get(key(kind, self.name)) or 0)
        try:
            srv = make(want)
        except OSError as e:  # the recorded port is taken: another one, recorded
            log.warning("%s endpoint: port %d: %s; taking a free port", kind, want, e)
            srv = make(0)
        store.put(key(kind, self.name), str(srv.server_address[1]))
        self.servers.append(srv)
        return srv

    def start(self) -> None:
        from prometheus_client import start_http_server

        reg = registry(self.cluster, self.health_results)
        self._bind("metrics", lambda port: start_http_server(port, addr="127.0.0.1", registry=reg)[0])
        if self.cluster.spec.rest:
            tunnel = None if self.env.provider.reaches_addresses else self.tunnel
            front = self._bind("rest", lambda port: Front(port, lambda: jwt_key(self.cluster), self.upstream, tunnel))
            front.serve_in_thread()
        log.info("endpoints: %s", ", ".join(f"{k} {url(self.env.store, self.name, k)}" for k in KINDS))

    def tunnel(self, request: bytes) -> bytes:
        """With registered hosts: the swarm overlay's addresses are not routed to this host,
        so one HTTP exchange goes through an exec in slurmrestd's container (on whichever
        host it runs), relayed there to slurmrestd on loopback. Its port stays published
        nowhere."""
        try:
            res = self.env.provider.exec(service_container(self.name, "rest"), REST_RELAY, stdin=request)
        except EngineError as e:
            raise ConnectionError(f"slurmrestd's container: {e}") from None
        if res.exit_code != 0 and not res.output:
            raise ConnectionError(f"slurmrestd does not answer in its container (exit {res.exit_code})")
        return res.output.encode()  # slurmrestd answers UTF-8 JSON

    def upstream(self, again: bool) -> tuple[str, int]:
        """slurmrestd's address on the cluster's network (looked up in Docker, then kept):
        its port is published nowhere, so the front is the only way in from the host."""
        if self._upstream is None or again:
            try:
                d = self.env.provider.inspect(service_container(self.name, "rest"))
            except EngineError as e:
                raise ConnectionError(f"slurmrestd's container: {e}") from None
            ip = d.addresses.get(network_name(self.name))
            if not ip:
                raise ConnectionError(
                    f"slurmrestd's container has no address on network {network_name(self.name)} (is it running?)"
                )
            self._upstream = (ip, REST_PORT)
        return self._upstream

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()
