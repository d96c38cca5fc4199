"""The cluster services' containers: slurmdbd with its MariaDB (role `accounting`: one
container, images/node/hp-entry runs both) and slurmrestd (`rest`), made from hp's images
like the nodes, but not Slurm nodes.

Order (measured: docs/accounting.md). Accounting's container and the controller's are
started at once, first of a new cluster's containers, and each daemon waits in its entry
for the one it needs to accept connections (images/node/hp-entry: slurmdbd for MariaDB's
port, slurmctld for slurmdbd's, a connect every 0.01 s): no round trip through hp
between them. So
slurmctld registers the cluster at its first start (no `sacctmgr add cluster`, no
CLUSTER ID MISMATCH), and create checks that slurmdbd said "slurmdbd version ...
started". (Started at once without those waits, slurmdbd retries the database every 5 s
and slurmctld blocks on slurmdbd: 7 s instead of 1.5 s.)

Hazard: slurmctld must never be (re)started while slurmdbd is unreachable (it dies with
"You are running with a database but for some reason we have no TRES from it" after
~20 s of retries). `ensure_up` brings accounting back first; the controller's reboot
calls it (recovery/actions.py).

Accounting's container runs with Docker's restart policy unless-stopped: when MariaDB or
slurmdbd dies, its entry stops the other and exits, and Docker starts both again; a
container killed through the engine is not restarted by Docker: the agent's watch starts
it again. The database's data is on a named volume, so records of jobs that ended before
a fault are still there after it.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from string import Template

from .. import waits
from ..core.across_hosts import controller_host_of
from ..core.context import SLURM_UID, Cluster
from ..docker.images import SERVICE_IMAGES
from ..docker.views import Container, ContainerSpec
from ..errors import EngineError, OperationFailed
from ..naming import L_CLUSTER, L_HOST, SERVICE_HOSTS, database_volume, labels, network_name, service_container
from ..slurm.conf import render, slurmdbd_conf, template
from ..state.home import cluster_folder

log = logging.getLogger("hp")

# slurmrestd's port in its container, on the cluster's network only: never published on a
# host (the front, services/front.py, is the one door; issue 24)
REST_PORT = 6820
RESTART_POLICY = "unless-stopped"
# (cores, MiB): MariaDB needs at least one core's quota to boot in ~1 s (0.5: +0.7 s);
# accounting's container has the quotas its two daemons had in containers of their own
# (1.0 + 0.5: first srun medians 3.04 vs 3.17 s with 1.0, 6 alternated pairs). Not
# counted in the host's capacity (quotas are ceilings; they idle after create).
LIMITS = {"accounting": (1.5, 512), "rest": (0.25, 256)}
DATABASE_READY = re.compile(r"ready for connections")  # MariaDB's line, in accounting's log
# Clusters made before accounting was one container have their database in a container
# of its own (role "database", hp-<c>-mariadb): it is kept running (started again before
# slurmdbd, which needs it) and asked in health checks, never made anew.
LEGACY_DATABASE = "database"
HOSTS = {**SERVICE_HOSTS, LEGACY_DATABASE: "mariadb"}  # role -> its container's hostname
READY = {"accounting": re.compile(r"slurmdbd version \S+ started"), LEGACY_DATABASE: DATABASE_READY}
READY_TIMEOUT = 60.0
POLL_S = 0.05
_BRINGING_BACK: dict[str, threading.Lock] = {}  # per cluster: the watch and a controller's reboot, one at a time


# -- secrets: 0600 files in the cluster's folder of hp's state, as the auth key -------------
def _secret(cluster: Cluster, fname: str, make: Callable[[], bytes]) -> bytes:
    path = cluster.dir / fname
    if not path.exists():
        tmp = path.with_name(f".{fname}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(make())
        try:  # the first one made wins (another thread or process may be making it too)
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_bytes()


def jwt_key(cluster: Cluster) -> bytes:
    """The key that signs and checks the cluster's JWTs: whoever has it can make a token
    for any user (never printed, logged or put in JSON)."""
    return _secret(cluster, "jwt.key", lambda: secrets.token_bytes(32))


def db_password(cluster: Cluster) -> str:
    """slurmdbd's database password (in slurmdbd.conf and the init SQL, both 0600)."""
    return _secret(cluster, "db.password", lambda: secrets.token_hex(16).encode()).decode()


def secret_files(home: Path, name: str) -> list[bytes]:
    """The cluster's secrets other than the auth key, as they are (for redaction)."""
    d = cluster_folder(home, name)
    return [p.read_bytes() for p in (d / "jwt.key", d / "db.password") if p.is_file()]


def forget_secrets(cluster: Cluster) -> None:
    for fname in ("jwt.key", "db.password"):
        (cluster.dir / fname).unlink(missing_ok=True)


def init_sql(password: str, cluster: str) -> bytes:
    """The SQL MariaDB runs at every start of the cluster's database: slurmdbd's database
    and user (the cluster's password); at the first, the seed cluster's tables made at the
    image's build (images/node/hp-dbschema) renamed to the cluster's, as Slurm names them
    (the name in lower case; spec/names.py keeps it to letters, digits and dashes)."""
    return Template(template("hp-init.sql.tmpl")).substitute(db_password=password, cluster=cluster.lower()).encode()


def controller_files(cluster: Cluster) -> dict[str, tuple[bytes, int, int]]:
    """What the controller needs beside slurm.conf and the auth key: the JWT key (REST)."""
    return {"jwt.key": (jwt_key(cluster), 0o600, SLURM_UID)} if cluster.spec.rest else {}


def roles(cluster: Cluster, containers: list[Container] | None = None) -> list[str]:
    """The service roles the cluster's spec asks for, in start order (with a legacy
    database container, that first)."""
    spec = cluster.spec
    legacy = spec.accounting and LEGACY_DATABASE in service_containers(cluster, containers)
    return (
        ([LEGACY_DATABASE] if legacy else [])
        + (["accounting"] if spec.accounting else [])
        + (["rest"] if spec.rest else [])
    )


def service_containers(cluster: Cluster, containers: list[Container] | None = None) -> dict[str, Container]:
    """role -> its container, for the services that exist."""
    cs = containers if containers is not None else cluster.containers()
    return {c.role: c for c in cs if c.role in HOSTS and c.labels.get(L_CLUSTER) == cluster.name}


# -- containers -------------------------------------------------------------------------
def container_spec(cluster: Cluster, role: str, image: str) -> ContainerSpec:
    cpus, mib = LIMITS[role]
    spec = ContainerSpec(
        name=service_container(cluster.name, role),
        image=image,
        hostname=SERVICE_HOSTS[role],
        labels=labels(cluster.name, role),
        network=network_name(cluster.name),
        environment={"HP_CLUSTER": cluster.name, "HP_CONTROLLER": cluster.controller_node},
        cpu_limit=cpus,
        memory_bytes=mib * 2**20,
        restart_policy=RESTART_POLICY,
    )
    if role == "accounting":
        spec.volumes = {database_volume(cluster.name): "/var/lib/mysql"}
    if cluster.multihost:  # registered hosts: on the controller's host
        spec.host = controller_host_of(cluster)
        spec.labels[L_HOST] = spec.host
        if role == "accounting":
            spec.volume_labels = {database_volume(cluster.name): labels(cluster.name, "database")}
    return spec


Files = dict[str, tuple[bytes, int, int]]  # name -> (content, mode, owner uid)


def files(cluster: Cluster, role: str, slurm_conf: bytes | None) -> dict[str, Files]:
    """directory -> files, copied into a service's container before it starts."""
    if role == "accounting":
        out = {
            "slurm.key": (cluster.key(), 0o600, SLURM_UID),
            "slurmdbd.conf": (slurmdbd_conf(cluster.spec, db_password(cluster)).encode(), 0o600, SLURM_UID),
        }
        if cluster.spec.rest:
            out["jwt.key"] = (jwt_key(cluster), 0o600, SLURM_UID)
        return {
            "/etc/slurm": out,
            "/etc/mysql": {"hp-init.sql": (init_sql(db_password(cluster), cluster.name), 0o600, 0)},
        }
    # rest: the controller's slurm.conf and nothing secret (tokens come with each request)
    return {"/etc/slurm": {"slurm.conf": (slurm_conf or b"", 0o644, 0)}}


def create(cluster: Cluster, role: str, image: str, slurm_conf: bytes | None = None) -> str:
    """Create (not start) a service's container with its files; its id."""
    cid = cluster.p.create_container(container_spec(cluster, role, image))
    # one copy into the container: each is a mount of its file system by the engine (on
    # accounting's chain, which slurmctld waits for: 2 copies 75 ms, one 36-44 ms)
    put = {f"{d.strip('/')}/{name}": f for d, fs in files(cluster, role, slurm_conf).items() for name, f in fs.items()}
    try:
        cluster.p.put_files(cid, "/", put)
    except EngineError:
        cluster.p.remove_container(cid)
        raise
    return cid


def ready_marks(cluster: Cluster, cid: str, role: str) -> int:
    """How many times the service's log says it is ready (a restart adds one)."""
    pattern = READY.get(role)
    return len(pattern.findall(cluster.p.logs(cid))) if pattern else 0


def _stopped(cluster: Cluster, cid: str, role: str) -> OperationFailed | None:
    st = cluster.p.inspect(cid).state
    if st.running or st.status == "restarting":
        return None
    return OperationFailed(
        f"{HOSTS[role]} exited ({st.exit_code}) before it was ready; last log:\n" + cluster.p.logs(cid, tail=15)
    )


def wait_ready(cluster: Cluster, cid: str, role: str, marks_before: int, deadline: float) -> None:
    """Until the service's log says ready once more than `marks_before`; OperationFailed
    (with its last lines) when its container stops, or at the deadline."""
    looks = itertools.count(1)
    t0 = time.monotonic()

    def ready() -> bool:
        if ready_marks(cluster, cid, role) > marks_before:
            return True
        if next(looks) % 10 == 0 and (err := _stopped(cluster, cid, role)):
            raise err
        return False

    def late(_: object) -> OperationFailed:
        logs = cluster.p.logs(cid)
        # slurmdbd waits for its database: when that never said ready, it is the one named
        who = HOSTS[role]
        if role == "accounting" and not DATABASE_READY.search(logs):
            who = "the database (slurmdbd waits for it)"
        last = "\n".join(logs.splitlines()[-15:])
        return OperationFailed(f"{who} was not ready within {max(deadline - t0, 0):.1f} s; last log:\n{last}")

    waits.until(ready, every=POLL_S, deadline=deadline, error=late)


class CreateServices:
    """The services of a cluster being created: `begin` (on threads: accounting's
    container made and started, slurmrestd's made, while the controller's is),
    `accounting_started`, `accounting_ready` (slurmdbd started), `start_rest` (once
    slurmctld answers)."""

    def __init__(self, cluster: Cluster, images: dict[str, str]):
        self.c = cluster
        self.images = images
        self.ids: dict[str, str] = {}
        self._accounting: Future[None] | None = None
        self._making: Future[None] | None = None

    @property
    def accounting(self) -> bool:
        return self.c.spec.accounting

    def begin(self, slurm_conf: bytes) -> None:
        if self.accounting:
            db_password(self.c)
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hp-services")
        if self.accounting:
            self._accounting = pool.submit(self._make, "accounting", slurm_conf)
        if self.c.spec.rest:
            self._making = pool.submit(self._make, "rest", slurm_conf)
        pool.shutdown(wait=False)

    def _make(self, role: str, slurm_conf: bytes) -> None:
        """On a thread: accounting's container made and started (MariaDB, then slurmdbd
        once it answers), or slurmrestd's made."""
        self.ids[role] = create(self.c, role, self.images[role], slurm_conf if role == "rest" else None)
        if role == "accounting":
            try:
                self.c.p.start(self.ids[role])
            except EngineError as e:
                raise OperationFailed(f"{SERVICE_HOSTS[role]}'s container could not be started: {e}") from None

    def accounting_started(self) -> None:
        """Accounting's container started (with Accounting; its error is the create's)."""
        if self._accounting is not None:
            self._accounting.result()

    def _made(self) -> None:
        self.accounting_started()
        if self._making is not None:
            self._making.result()  # its error, if any, is the create's

    def settle(self) -> None:
        """Wait for the containers being made on the threads (their error is not this one's)."""
        wait([f for f in (self._accounting, self._making) if f is not None])

    def accounting_ready(self, deadline: float) -> None:
        """slurmdbd said it started (fails fast with the last lines of its container's log
        when the container stopped)."""
        if not self.accounting:
            return
        self._made()
        deadline = min(deadline, time.monotonic() + READY_TIMEOUT)
        wait_ready(self.c, self.ids["accounting"], "accounting", 0, deadline)

    def start_rest(self) -> None:
        self._made()
        if "rest" in self.ids:
            self.c.p.start(self.ids["rest"])


# -- health: HyperPod's SlurmHealthMetadata -----------------------------------------------
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
DAEMON_DOWN, DB_UNREACHABLE = "DaemonDown", "DbUnreachable"


@dataclass(frozen=True)
class Health:
    status: str  # Healthy | Unhealthy
    reason: str | None  # DaemonDown | DbUnreachable (None when healthy)
    message: str

    @property
    def healthy(self) -> bool:
        return self.status == HEALTHY

    def as_dict(self) -> dict[str, str]:
        """SlurmHealthMetadata (Reason omitted when healthy), with hp's Message."""
        d = {"Component": "Slurmdbd", "Status": self.status}
        if self.reason:
            d["Reason"] = self.reason
        d["Message"] = self.message
        return d


def _down(c: Container | None, what: str) -> str | None:
    if c is None:
        return f"{what}'s container does not exist"
    if not c.running:
        code = f" (exit {c.exit_code})" if c.dead else ""
        return f"{what}'s container is {c.state}{code}"
    return None


def database_answers(cluster: Cluster, db: Container) -> bool:
    try:
        # --skip-ssl: the server runs without TLS (images/node/hp-my.cnf), and MariaDB
        # 11.8's client otherwise refuses it ("SSL is required, but the server does not
        # support it"), which read as a database that does not answer
        res = cluster.p.exec(db.id, ["timeout", "2", "mariadb", "--skip-ssl", "-N", "-e", "select 1"])
    except EngineError:
        return False
    return res.exit_code == 0


def health(cluster: Cluster, containers: list[Container] | None = None) -> Health:
    """Accounting's health: its container's state first (no exec), then `sacctmgr ping`
    from the controller (2 s at most), then the database itself (a client in the same
    container) when slurmdbd does not answer: DbUnreachable if it does not either, else
    DaemonDown."""
    cs = containers if containers is not None else cluster.containers()
    svc = service_containers(cluster, cs)
    if why := _down(svc.get("accounting"), "slurmdbd"):
        return Health(UNHEALTHY, DAEMON_DOWN, why)
    db = svc.get(LEGACY_DATABASE) or svc["accounting"]
    if why := _down(db, "the database"):  # a legacy database container
        return Health(UNHEALTHY, DB_UNREACHABLE, why)
    ctl = next((c for c in cs if c.role == "controller" and c.running), None)
    ping = None
    if ctl is not None:
        try:
            ping = cluster.slurm.accounting_ping()
        except OperationFailed as e:  # the controller stopped meanwhile
            log.info("accounting ping: %s", e)
    if ping is not None and ping.up:
        return Health(HEALTHY, None, "slurmdbd answers and reaches its database")
    if ping is not None and ping.db_unreachable:
        return Health(UNHEALTHY, DB_UNREACHABLE, f"slurmdbd cannot reach its database: {ping.message}")
    if not database_answers(cluster, db):
        return Health(UNHEALTHY, DB_UNREACHABLE, "the database does not answer")
    if ping is None:
        return Health(HEALTHY, None, "container running and the database answers (slurmdbd not pinged: no controller)")
    why = "no answer within 2 s" if ping.timed_out else ping.message
    return Health(UNHEALTHY, DAEMON_DOWN, f"slurmdbd does not answer: {why}")


# -- bringing the services back -------------------------------------------------------------
def _image(cluster: Cluster, role: str) -> str:
    return cluster.env.images.refs(tuple(d for d in _service_defs() if d.name == role))[role]


def _service_defs() -> tuple:
    return SERVICE_IMAGES


def _bring_back(cluster: Cluster, role: str, c: Container | None, deadline: float) -> str | None:
    """Start (or re-create, on its volume) one service's container and wait until it is
    ready; a description of what was done, None when it was running."""
    p = cluster.p
    if c is not None and c.running:
        return None
    if c is None:
        conf = None
        if role == "rest":
            ctl = cluster.node_containers().get(cluster.controller_node)
            got = p.get_dir(ctl.id, "/etc/slurm/slurm.conf") if ctl else {}
            conf = next(iter(got.values()), None)
            if conf is None:
                conf = render(cluster.spec, cluster.env.catalogue).encode()
        cid, what = create(cluster, role, _image(cluster, role), conf), "re-created"
        before = 0
    else:
        cid, what = c.id, "restarted"
        before = ready_marks(cluster, cid, role)
    if c is not None and c.state == "paused":
        p.restart(cid, timeout=2)  # a restart also thaws a frozen one
    else:
        p.start(cid)
    if role in READY:
        wait_ready(cluster, cid, role, before, deadline)
    return f"{HOSTS[role]} {what}"


def ensure_up(cluster: Cluster, timeout: float = READY_TIMEOUT, only: tuple[str, ...] | None = None) -> list[str]:
    """Bring the cluster's services back, in order (accounting, slurmrestd): a stopped,
    exited or frozen container is started, a missing one made again (the database on its
    volume). Returns what was done; OperationFailed if one does not come
    back in `timeout` s."""
    deadline = time.monotonic() + timeout
    with _BRINGING_BACK.setdefault(cluster.name, threading.Lock()):
        cs = cluster.containers()
        svc = service_containers(cluster, cs)
        done = []
        for role in roles(cluster, cs):
            if only is not None and role not in only:
                continue
            if what := _bring_back(cluster, role, svc.get(role), deadline):
                done.append(what)
        return done


def restart(cluster: Cluster, role: str, timeout: float = READY_TIMEOUT) -> str:
    """Restart a running but hung service (it does not answer) and wait until it is ready."""
    c = service_containers(cluster).get(role)
    if c is None or not c.running:
        return ", ".join(ensure_up(cluster, timeout, only=(role,)))
    before = ready_marks(cluster, c.id, role)
    cluster.p.restart(c.id, timeout=2)
    if role in READY:
        wait_ready(cluster, c.id, role, before, time.monotonic() + timeout)
    return f"{HOSTS[role]} restarted (it did not answer)"


def before_controller_start(cluster: Cluster, timeout: float = READY_TIMEOUT) -> list[str]:
    """Never (re)start slurmctld while slurmdbd is unreachable: bring accounting back
    first (OperationFailed when it does not come back)."""
    if not cluster.spec.accounting:
        return []
    return ensure_up(cluster, timeout, only=(LEGACY_DATABASE, "accounting"))
