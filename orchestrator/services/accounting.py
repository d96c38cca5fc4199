"""The cluster services: Accounting (slurmdbd with its MariaDB, in the controller's
container: images/node/hp-entry runs them beside slurmctld) and slurmrestd (`rest`, a
container made from hp's images like the nodes, but not a Slurm node).

Order (measured: docs/accounting.md). In the controller's container each daemon starts
the moment the one it needs accepts connections (images/node/hp-entry: slurmdbd for
MariaDB's port, slurmctld for slurmdbd's, a connect every 0.01 s): no round trip through
hp between them. So slurmctld registers the cluster at its first start (no `sacctmgr add
cluster`, no CLUSTER ID MISMATCH), and create checks that slurmdbd said "slurmdbd
version ... started". (Started at once without those waits, slurmdbd retries the
database every 5 s and slurmctld blocks on slurmdbd: 7 s instead of 1.5 s.) One
container fewer than accounting's own: ~0.1 s off a create on this 2-core host.

When MariaDB or slurmdbd dies, the controller's entry starts it again (slurmctld goes
on); a hung one (running, not answering) is killed by the agent's watch, and so started
again. The database's data is on a named volume, so records of jobs that ended before a
fault are still there after it, also after the controller's reboot.

Clusters made before slurmdbd moved into the controller's container keep their
accounting container (role `accounting`, hp-<c>-slurmdbd; older still, their database in
one of its own: role `database`): it is kept running (started again before slurmctld,
which must never start while slurmdbd is unreachable: it dies with "You are running with
a database but for some reason we have no TRES from it") and asked in health checks,
never made anew.
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
from ..naming import L_CLUSTER, L_ROLE, SERVICE_HOSTS, labels, network_name, service_container
from ..slurm.conf import render, slurmdbd_conf, template
from ..state.home import cluster_folder

log = logging.getLogger("hp")

# slurmrestd's port in its container, on the cluster's network only: never published on a
# host (the front, services/front.py, is the one door; issue 24)
REST_PORT = 6820
RESTART_POLICY = "unless-stopped"
# (cores, MiB) of slurmrestd's container. Not counted in the host's capacity (a quota is
# a ceiling; it idles after create). Accounting's daemons add theirs to the controller's
# (core/launcher.py ACCOUNTING_QUOTA).
LIMITS = {"rest": (0.25, 256)}
DATABASE_READY = re.compile(r"ready for connections")  # MariaDB's line, in the log of the container it runs in
# Older clusters' accounting containers (the module's docstring): slurmdbd and MariaDB
# (role "accounting", hp-<c>-slurmdbd), or the database alone (role "database", hp-<c>-mariadb).
LEGACY_ACCOUNTING = "accounting"
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
    """What the controller needs in /etc/slurm beside slurm.conf and the auth key: the JWT
    key (REST); with Accounting, slurmdbd.conf and the SQL of its database user."""
    spec, out = cluster.spec, {}
    if spec.rest:
        out["jwt.key"] = (jwt_key(cluster), 0o600, SLURM_UID)
    if spec.accounting:
        password = db_password(cluster)
        out["slurmdbd.conf"] = (slurmdbd_conf(spec, password).encode(), 0o600, SLURM_UID)
        out["hp-init.sql"] = (init_sql(password, cluster.name), 0o600, 0)
    return out


def roles(cluster: Cluster, containers: list[Container] | None = None) -> list[str]:
    """The roles of the service containers the cluster keeps running, in start order:
    an older cluster's accounting containers (the database's first), then slurmrestd's."""
    spec = cluster.spec
    svc = service_containers(cluster, containers)
    legacy = [r for r in (LEGACY_DATABASE, LEGACY_ACCOUNTING) if spec.accounting and r in svc]
    return legacy + (["rest"] if spec.rest else [])


def dbd_container(cluster: Cluster, containers: list[Container]) -> Container | None:
    """The container slurmdbd runs in: the controller's (an older cluster's: its own)."""
    svc = service_containers(cluster, containers)
    if LEGACY_ACCOUNTING in svc:
        return svc[LEGACY_ACCOUNTING]
    return next((c for c in containers if c.role == "controller" and c.labels.get(L_CLUSTER) == cluster.name), None)


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
    cluster.p.place(spec, cluster.name, role, controller_host_of(cluster))  # across hosts: the controller's
    return spec


Files = dict[str, tuple[bytes, int, int]]  # name -> (content, mode, owner uid)


def files(cluster: Cluster, role: str, slurm_conf: bytes | None) -> dict[str, Files]:
    """directory -> files, copied into a service's container before it starts (slurmrestd:
    the controller's slurm.conf and nothing secret; tokens come with each request)."""
    return {"/etc/slurm": {"slurm.conf": (slurm_conf or b"", 0o644, 0)}}


def create(cluster: Cluster, role: str, image: str, slurm_conf: bytes | None = None) -> str:
    """Create (not start) a service's container with its files; its id."""
    cid = cluster.p.create_container(container_spec(cluster, role, image))
    # one copy into the container: each is a mount of its file system by the engine
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
    d = cluster.p.inspect(cid)
    if d.state.running or d.state.status == "restarting":
        return None
    # its own container (an older cluster's, slurmrestd's) or the controller's (slurmdbd's now)
    who = HOSTS[role] if d.labels.get(L_ROLE) == role else d.name.lstrip("/")
    what = "it" if who == HOSTS[role] else HOSTS[role]
    return OperationFailed(
        f"{who} exited ({d.state.exit_code}) before {what} was ready; last log:\n" + cluster.p.logs(cid, tail=15)
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
    """The services of a cluster being created: `begin` (slurmrestd's container made on a
    thread while the controller's is), `accounting_ready` (slurmdbd, in the controller's
    container, started), `start_rest` (once slurmctld answers)."""

    def __init__(self, cluster: Cluster, images: dict[str, str]):
        self.c = cluster
        self.images = images
        self.ids: dict[str, str] = {}
        self._making: Future[None] | None = None

    def begin(self, slurm_conf: bytes) -> None:
        if not self.c.spec.rest:
            return
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hp-services")
        self._making = pool.submit(self._make, "rest", slurm_conf)
        pool.shutdown(wait=False)

    def _make(self, role: str, slurm_conf: bytes) -> None:
        self.ids[role] = create(self.c, role, self.images[role], slurm_conf)

    def _made(self) -> None:
        if self._making is not None:
            self._making.result()  # its error, if any, is the create's

    def settle(self) -> None:
        """Wait for the container being made on the thread (its error is not this one's)."""
        if self._making is not None:
            wait([self._making])

    def accounting_ready(self, controller: str, deadline: float) -> None:
        """With Accounting: slurmdbd, in the `controller` container, said it started (fails
        fast with the last lines of the container's log when it stopped)."""
        if not self.c.spec.accounting:
            return
        deadline = min(deadline, time.monotonic() + READY_TIMEOUT)
        wait_ready(self.c, controller, "accounting", 0, deadline)

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
    """Accounting's health: the state of slurmdbd's container (the controller's) first (no
    exec), then `sacctmgr ping` from the controller (2 s at most), then the database
    itself (a client in the same container) when slurmdbd does not answer: DbUnreachable
    if it does not either, else DaemonDown."""
    cs = containers if containers is not None else cluster.containers()
    svc = service_containers(cluster, cs)
    dbd = dbd_container(cluster, cs)
    if why := _down(dbd, "slurmdbd" if LEGACY_ACCOUNTING in svc else "the controller"):
        return Health(UNHEALTHY, DAEMON_DOWN, why)
    assert dbd is not None
    db = svc.get(LEGACY_DATABASE) or dbd
    if why := _down(db, "the database"):  # an older cluster's database container
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
    return cluster.images.refs(tuple(d for d in _service_defs() if d.name == role))[role]


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
    """Bring the cluster's service containers back, in order (an older cluster's
    accounting, slurmrestd): a stopped, exited or frozen container is started, a missing
    slurmrestd made again. Returns what was done; OperationFailed if one does not come
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


HUNG = {DAEMON_DOWN: "slurmdbd", DB_UNREACHABLE: "mariadbd"}  # the process a health reason names


def kill_hung(cluster: Cluster, reason: str, timeout: float | None = None) -> str:
    """In the controller's container: kill a running but hung slurmdbd (DaemonDown) or
    MariaDB (DbUnreachable); its entry starts it again (MariaDB: slurmdbd with it). Waits
    until slurmdbd said it started once more."""
    ctl = dbd_container(cluster, cluster.containers())
    if ctl is None or not ctl.running:
        raise OperationFailed("the controller's container is not running")
    proc = HUNG[reason]
    before = ready_marks(cluster, ctl.id, "accounting")
    res = cluster.p.exec(ctl.id, ["pkill", "-KILL", "-x", proc])
    if res.exit_code not in (0, 1):  # 1: it had exited meanwhile (and is being started again)
        raise OperationFailed(f"pkill {proc} in the controller exited {res.exit_code}: {res.output[-200:]}")
    wait_ready(cluster, ctl.id, "accounting", before, time.monotonic() + (timeout or READY_TIMEOUT))
    return f"{proc} killed and started again (it did not answer)"


def before_controller_start(cluster: Cluster, timeout: float = READY_TIMEOUT) -> list[str]:
    """Never (re)start slurmctld while slurmdbd is unreachable: an older cluster's
    accounting container is brought back first (OperationFailed when it does not come
    back). In the controller's container, its entry starts slurmdbd first."""
    if not cluster.spec.accounting:
        return []
    return ensure_up(cluster, timeout, only=(LEGACY_DATABASE, LEGACY_ACCOUNTING))
