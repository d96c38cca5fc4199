"""Where a cluster's agent serves its loopback endpoints (metrics, the REST front): the
ports recorded in the store, their URLs, and a wait for the agent to listen. Read by
`hp describe`, `hp metrics`, `hp api` and `hp delete`, which load none of the servers
(endpoints.py)."""

from __future__ import annotations

import socket

from .. import waits
from ..errors import OperationFailed
from ..state.store import Store

KINDS = ("metrics", "rest")


def key(kind: str, name: str) -> str:
    return f"endpoint.{kind}:{name}"


def url(store: Store, name: str, kind: str) -> str | None:
    """The endpoint's URL as last recorded (None: never served)."""
    port = store.get(key(kind, name))
    if not port:
        return None
    return f"http://127.0.0.1:{port}" + ("/metrics" if kind == "metrics" else "")


def forget(store: Store, name: str) -> None:
    for kind in KINDS:
        store.put(key(kind, name), None)


def listening(store: Store, name: str, kind: str) -> bool:
    port = store.get(key(kind, name))
    if not port:
        return False
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=0.5).close()
        return True
    except OSError:
        return False


def wait_url(store: Store, name: str, kind: str, timeout: float = 15.0) -> str:
    """The URL once the agent listens on it (it may have just been started)."""
    waits.until(
        lambda: listening(store, name, kind),
        every=0.1,
        timeout=timeout,
        error=lambda _: OperationFailed(
            f"the agent of cluster {name!r} does not serve its {kind} endpoint (see its log: "
            f"{store.home / 'clusters' / name / 'agent.log'})"
        ),
    )
    u = url(store, name, kind)
    assert u is not None
    return u
