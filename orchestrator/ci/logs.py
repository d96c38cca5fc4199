"""`hp logs`: the evidence after a failure, one folder per node. Covers the nodes that
exist, and those that recently existed or are waiting to (not every name ever
recorded). The cluster's secrets (auth key, JWT key, database password) never reach a
file."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.context import Cluster, Env
from ..docker.views import Container
from ..errors import NotFound
from ..naming import SERVICE_HOSTS
from ..services.accounting import secret_files
from ..slurm.conf import render
from ..state.health_requests import Records
from ..state.home import cluster_folder
from ..state.phases import NodePhase, Phase, Phases
from ..state.store import Latest

Log = Callable[[str], None]
RECENT_S = 3600.0  # a node removed (on purpose) within the last hour still gets a folder


class LogWriter:
    """Writes the files of a logs folder; the cluster's auth key (and `others`: the JWT
    key, the database password) never reach a file."""

    def __init__(self, root: Path, secret: bytes | None, others: list[bytes] | None = None):
        self.root = root
        self.secret = secret or None
        self.others = [s for s in others or [] if len(s) >= 8]
        self.files: list[str] = []

    def write(self, rel: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        if self.secret:  # as bytes, and as a log shows binary bytes once decoded (U+FFFD for each bad byte)
            for form in {self.secret, self.secret.decode(errors="replace").encode()}:
                raw = raw.replace(form, b"<hp: auth key removed>")
        for other in self.others:
            for form in {other, other.decode(errors="replace").encode()}:
                raw = raw.replace(form, b"<hp: secret removed>")
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        self.files.append(rel)

    def json(self, rel: str, doc: Any) -> None:
        self.write(rel, json.dumps(doc, indent=2, default=str) + "\n")


def nodes_to_collect(containers: dict[str, Container], recorded: Latest, now: float) -> list[str]:
    """Nodes with a container, and recorded ones that are not long gone."""
    keep = set(containers)
    for n, rec in recorded.items():
        if rec.phase is not Phase.REMOVED or now - rec.time < RECENT_S:
            keep.add(n)
    return sorted(keep)


def export_logs(env: Env, name: str, directory: Path, log: Log = lambda s: None) -> dict[str, Any]:
    """Everything worth reading after a failure, one folder per node. Works on half-made
    and failed clusters: stopped containers are read with get_archive, not exec."""
    p = env.provider
    p.ping()
    row = env.store.cluster(name)
    containers = p.containers(name)
    if row is None and not containers:
        raise NotFound(f"cluster {name!r} does not exist (see 'hp list')")
    cluster = Cluster(env, name)
    key_path = cluster_folder(env.store.home, name) / "slurm.key"
    secret = key_path.read_bytes() if key_path.is_file() else None

    w = LogWriter(directory, secret, secret_files(env.store.home, name))
    directory.mkdir(parents=True, exist_ok=True)
    # from every host; a stale copy of a node (left on a host that came back) is not the node
    current = cluster.current(containers)
    by_node = {c.node or c.name: c for c in current if c.role != "check" and c.role not in SERVICE_HOSTS}
    services = {SERVICE_HOSTS[c.role]: c for c in current if c.role in SERVICE_HOSTS}
    ctl = next((c for c in containers if c.role == "controller"), None)
    ctl_up = ctl is not None and ctl.running
    # Slurm through the controller found by its labels: also for leftovers with no record
    slurm = env.slurm_factory(p, ctl.id) if ctl is not None and ctl_up else None
    recorded = env.store.latest_phases(name) if row else Phases()
    nodes = nodes_to_collect(by_node, recorded, time.time())
    for node in nodes:
        log(f"collecting {node}")
        _node_logs(cluster, w, node, by_node.get(node), recorded.get(node), slurm)
    for host, c in sorted(services.items()):  # accounting and REST: services/<host>/
        log(f"collecting {host}")
        _node_logs(cluster, w, f"services/{host}", c, None, None)
    if row is not None:
        w.json(
            "cluster.json",
            {"ClusterName": name, "ClusterStatus": row.status, "FailureMessage": row.message or None, "Spec": row.spec},
        )
        w.json("events.json", [e.as_dict() for e in env.store.events(name, limit=10_000)])
        w.write("slurm.conf", _slurm_conf(cluster, ctl))
        if ctl is not None and (gres := cluster.p.get_dir(ctl.id, "/etc/slurm/gres.conf")):
            w.write("gres.conf", next(iter(gres.values())))  # GPU nodes' GRES (gpu/gresconf.py)
        health = _health_results(env, name)
        if health:
            w.json("health-checks.json", health)
        if p.places_nodes:  # where each node was placed, and which hosts answered
            w.json(
                "hosts.json",
                {"Placements": env.store.node_hosts(name), "Unreachable": p.unreachable(), "Hosts": list(p.engines())},
            )
    if slurm is not None:
        for fname, text in slurm.overview().items():
            w.write(fname, text)
    return {
        "ClusterName": name,
        "Directory": str(directory),
        "Nodes": nodes,
        "Services": sorted(services),
        "Files": sorted(w.files),
    }


def _node_logs(
    cluster: Cluster,
    w: LogWriter,
    node: str,
    c: Container | None,
    recorded: NodePhase | None,
    slurm: Any,
) -> None:
    p = cluster.p
    phase = {
        "RecordedStatus": recorded.phase.value if recorded else None,
        "Message": recorded.message if recorded else None,
    }
    if c is None:  # recorded by hp but has no container (e.g. launch failed, or removed)
        w.json(f"{node}/status.json", {"Node": node, "Container": None, **phase})
        return
    d = p.inspect(c.id)
    w.json(
        f"{node}/status.json",
        {
            "Node": node,
            "Container": c.name,
            "Image": d.image,
            "Labels": c.labels,
            "State": d.state.as_dict(),
            **({"Host": c.host} if c.host else {}),
            **phase,
        },
    )
    w.write(f"{node}/container.log", p.logs(c.id))
    for fname, data in p.get_dir(c.id, "/var/log/slurm").items():
        if fname.endswith(".log"):
            w.write(f"{node}/{fname}", data)
    if slurm is not None and c.role == "worker":
        w.write(f"{node}/scontrol-show-node.txt", slurm.show_node(node))


def _slurm_conf(cluster: Cluster, ctl: Container | None) -> bytes:
    """The controller's slurm.conf as it was given to slurmctld; rendered from the spec
    when there is no controller container. The key lives in its own file (slurm.key)."""
    if ctl is not None:
        data = cluster.p.get_dir(ctl.id, "/etc/slurm/slurm.conf")
        if data:
            return next(iter(data.values()))
    return render(cluster.spec, cluster.env.catalogue).encode()


def _health_results(env: Env, name: str) -> list[dict[str, Any]]:
    """The deep health checks hp recorded for the cluster: requests and per-node results."""
    rec = Records(env.store)
    return [
        {
            "RequestId": r.id,
            "State": r.state,
            "Checks": r.checks,
            "Nodes": r.nodes,
            "Message": r.message,
            "Results": [x.as_dict() for x in rec.results(r.id)],
        }
        for r in rec.requests(name)
    ]
