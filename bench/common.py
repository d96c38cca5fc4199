"""Shared pieces of the benchmarks: the plain-docker floor, and running hp."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.cluster.teardown import remove_network  # noqa: E402
from orchestrator.core.context import SLURM_UID  # noqa: E402
from orchestrator.core.launcher import ACCOUNTING_QUOTA  # noqa: E402
from orchestrator.docker import images as image_sets  # noqa: E402
from orchestrator.docker.engine import DockerEngine as DockerProvider  # noqa: E402
from orchestrator.docker.engine import tar_of  # noqa: E402
from orchestrator.docker.images import Images  # noqa: E402
from orchestrator.docker.provider import FileMap  # noqa: E402
from orchestrator.docker.views import ContainerSpec  # noqa: E402
from orchestrator.errors import EngineError  # noqa: E402
from orchestrator.naming import node_name  # noqa: E402
from orchestrator.releases import DEFAULT  # noqa: E402
from orchestrator.services.accounting import init_sql  # noqa: E402
from orchestrator.slurm.client import SlurmCli as Slurm  # noqa: E402
from orchestrator.slurm.conf import controller_node, render, slurmd_conf, slurmdbd_conf  # noqa: E402
from orchestrator.slurm.model import IDLE, NOT_USABLE_FLAGS  # noqa: E402
from orchestrator.spec.catalogue import load_catalogue  # noqa: E402
from orchestrator.spec.model import DEFAULT_SPEC, validate  # noqa: E402

BENCH_TYPES = "bench.tiny: {VCpus: 1, CpuLimit: 0.02, MemoryMiB: 128}\n"


def timestamp(iso: str) -> float:
    """An RFC 3339 timestamp (Docker's, with nanoseconds; hp's) as seconds since the epoch."""
    day, _, frac = iso.rstrip("Z").partition(".")
    frac, plus, zone = frac.partition("+")
    if plus:
        raise ValueError(f"not a UTC timestamp: {iso}")
    return datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp() + float(f"0.{frac or 0}")


def bench_env(home: str) -> dict[str, str]:
    types = Path(home) / "types.yaml"
    types.write_text(BENCH_TYPES)
    return {**os.environ, "HP_HOME": home, "HP_INSTANCE_TYPES": str(types), "NO_COLOR": "1"}


def spec_doc(name: str, n: int, itype: str = "bench.tiny", login: bool = False, accounting: bool = False) -> dict:
    """A bench cluster: controller, optional login, n workers. Accounting off unless asked
    (the floor is bare Slurm; create.py measures what accounting adds on its own)."""
    groups = [
        {
            "InstanceGroupName": "controller",
            "InstanceType": "cpu.small",
            "InstanceCount": 1,
            "SlurmConfig": {"NodeType": "Controller"},
        }
    ]
    if login:
        groups.append(
            {
                "InstanceGroupName": "login",
                "InstanceType": itype,
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Login"},
            }
        )
    groups.append(
        {
            "InstanceGroupName": "w",
            "InstanceType": itype,
            "InstanceCount": n,
            "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["w"]},
        }
    )
    return {"ClusterName": name, "InstanceGroups": groups, "Accounting": {"Enabled": accounting}}


def floor(n: int, itype: str = "bench.tiny") -> float:
    """Seconds from nothing to n idle Slurm nodes with plain docker-py, timed as `hp create
    --wait` is: from its process's spawn to its exit (bench/floorrun.py: docker-py and the
    standard library, no import of hp's). The same images, slurm.conf, files and container
    settings as hp's (DockerEngine.create_args), prepared here before the clock starts; no
    orchestration (no state, capacity, labels logic or checks). The fastest order found:
    every container created at once on threads, the controller first and each started as
    soon as it is made (the image's entry starts slurmd once slurmctld listens, a connect
    every 0.05 s), Slurm polled every 0.05 s. (Workers started only after `scontrol ping`
    answered: 10-20% slower at N = 4 here.) The floor's own figure from its first Docker
    call is kept in FLOOR_DOCKER_S (what a floor inside an already-running Python gives)."""
    os.environ.setdefault("HP_INSTANCE_TYPES", "")
    p = DockerProvider()
    with tempfile.TemporaryDirectory() as tmp:
        tf = Path(tmp) / "types.yaml"
        tf.write_text(BENCH_TYPES)
        cat = load_catalogue(tf)
        name = f"floor{secrets.token_hex(3)}"
        spec = validate(spec_doc(name, n, itype), cat)
        imgs = Images(p, DEFAULT).refs()
        conf = render(spec, cat).encode()
        key = secrets.token_bytes(64)
        t = cat[itype]
        net = f"floor-{name}"
        lab = {"io.hp.bench": net}

        def container(cs: ContainerSpec, files: FileMap) -> dict:
            return {"image": cs.image, "args": p.create_args(cs), "tar": base64.b64encode(tar_of(files)).decode()}

        ctl = ContainerSpec(
            name=f"{net}-ctl", image=imgs["controller"], hostname="controller-1", labels=lab, network=net
        )
        job = {
            "base_url": os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"),
            "api_version": p.api.api_version,
            "network": net,
            "network_labels": lab,
            "want": n,
            "idle": IDLE,
            "not_usable": sorted(NOT_USABLE_FLAGS),
            "containers": [
                container(
                    ctl, {"etc/slurm/slurm.conf": (conf, 0o644, 0), "etc/slurm/slurm.key": (key, 0o600, SLURM_UID)}
                )
            ]
            + [
                container(
                    ContainerSpec(
                        name=f"{net}-w{i}",
                        image=imgs["worker"],
                        hostname=f"w-{i}",
                        labels=lab,
                        network=net,
                        environment={"HP_CONTROLLER": "controller-1", "HP_SLURMD_CONF": slurmd_conf(t, "w")},
                        cpu_limit=t.cpu_limit,
                        memory_bytes=t.memory_mib * 2**20,
                    ),
                    {"etc/slurm/slurm.key": (key, 0o600, 0)},
                )
                for i in range(1, n + 1)
            ],
        }
        jf = Path(tmp) / "job.json"
        jf.write_text(json.dumps(job))
        clean_left_networks(p)
        t0 = time.monotonic()
        try:
            r = subprocess.run(
                [sys.executable, str(ROOT / "bench" / "floorrun.py"), str(jf)], capture_output=True, text=True
            )
            dt = time.monotonic() - t0
        finally:
            ids = [c["Id"] for c in p.api.containers(all=True, filters={"label": f"io.hp.bench={net}"})]
            with ThreadPoolExecutor(32) as ex:
                list(ex.map(p.remove_container, ids))
            if p.api.networks(names=[net]) and not remove_network(p, net):
                print(
                    f"warning: the bench's network {net} is left (Docker still counts endpoints on it)", file=sys.stderr
                )
        if r.returncode != 0:
            raise SystemExit(f"the floor's process failed ({r.returncode}):\n{r.stderr[-3000:]}")
        FLOOR_DOCKER_S.append(json.loads(r.stdout.splitlines()[-1])["docker_s"])
        return dt


# each floor's seconds from its first Docker call (floorrun.py's own figure), in run order
FLOOR_DOCKER_S: list[float] = []


def first_job_floor(release: str = DEFAULT.value) -> float:
    """Seconds from nothing to the first successful `srun -N4` on the default cluster
    (accounting on, hp's DEFAULT_SPEC and catalogue) of Slurm `release` (hp's default unless
    told) with plain docker-py: the same images,
    slurm.conf, slurmdbd.conf, database SQL, limits and volumes (the database's and
    slurmctld's state; /home shared by the nodes) as hp's, no orchestration. The fastest
    order found (3 runs each, first srun, when the database and slurmdbd had a container
    each): the services and the controller created and started at once on threads, and
    the nodes as soon as the database's start returned, each started as it is made
    (2.3-3.1 s; every container at once: 3.4-3.8 s; the nodes after the controller's
    start: 2.6-3.2 s; after all three: 2.9 s). Now MariaDB and slurmdbd run in the
    controller's container (its quota grown by theirs, core/launcher.py ACCOUNTING_QUOTA),
    made and started on a thread with every node's (6 alternated pairs, 2026-12-06: 0.16 s
    sooner than the nodes once its start returned). Its entry starts each daemon once the
    one it needs answers (slurmdbd for MariaDB, slurmctld for slurmdbd), the nodes' wait
    for slurmctld. `scontrol ping` every 0.05 s until slurmctld answers (a `show nodes`
    sent before it listens retries only after 1 s), then Slurm polled every 0.05 s until 4
    nodes are idle, then `srun -N4 hostname` as hpuser on the login node through docker exec (again at
    once should it fail). The same work as hp's default create and first job, minus hp
    itself (Python, imports, checks, state, events, the agent)."""
    os.environ.setdefault("HP_INSTANCE_TYPES", "")
    p = DockerProvider()
    cat = load_catalogue()
    name = f"floorjob{secrets.token_hex(3)}"
    spec = validate({**DEFAULT_SPEC, "ClusterName": name, "SlurmVersion": release}, cat)
    assert spec.accounting, "the default cluster has accounting on"
    imgs = Images(p, spec.release).refs(image_sets.NODE_IMAGES)
    conf = render(spec, cat).encode()
    key, password = secrets.token_bytes(64), secrets.token_hex(16)
    net = f"floor-{name}"
    lab = {"io.hp.bench": net}
    ctl = controller_node(spec)
    vols = {v: f"{net}-{v}" for v in ("db", "state", "home")}
    t0 = time.monotonic()
    try:
        with bench_network(p, net) as ids:

            def make(host: str, image: str, files: dict[str, dict], **kw: object) -> str:
                spec = ContainerSpec(name=f"{net}-{host}", image=image, hostname=host, labels=lab, network=net, **kw)
                return started(p, ids, spec, files)

            def controller() -> str:
                t = cat[spec.controller.InstanceType]
                files = {
                    "/etc/slurm": {
                        "slurm.conf": (conf, 0o644, 0),
                        "slurm.key": (key, 0o600, SLURM_UID),
                        "slurmdbd.conf": (slurmdbd_conf(spec, password).encode(), 0o600, SLURM_UID),
                        "hp-init.sql": (init_sql(password, name), 0o600, 0),
                    }
                }
                return make(
                    ctl,
                    imgs["controller"],
                    files,
                    cpu_limit=t.cpu_limit + ACCOUNTING_QUOTA[0],
                    memory_bytes=(t.memory_mib + ACCOUNTING_QUOTA[1]) * 2**20,
                    volumes={vols["state"]: "/var/spool/slurmctld", vols["db"]: "/var/lib/mysql"},
                )

            def node(g: object, i: int) -> str:
                t = cat[g.InstanceType]  # type: ignore[attr-defined]
                group, login = g.InstanceGroupName, g.node_type == "Login"  # type: ignore[attr-defined]
                env = {"HP_CONTROLLER": ctl}
                if not login:
                    env["HP_SLURMD_CONF"] = slurmd_conf(t, group)
                return make(
                    node_name(group, i),
                    imgs["login" if login else "worker"],
                    {"/etc/slurm": {"slurm.key": (key, 0o600, 0)}},
                    environment=env,
                    cpu_limit=t.cpu_limit,
                    memory_bytes=t.memory_mib * 2**20,
                    volumes={vols["home"]: "/home"},
                )

            nodes = [
                (g, i)
                for g in spec.InstanceGroups
                if g.node_type != "Controller"
                for i in range(1, g.InstanceCount + 1)
            ]
            with ThreadPoolExecutor(32) as ex:
                made_controller = ex.submit(controller)  # and every node at once
                made = [ex.submit(node, g, i) for g, i in nodes]
                c = made_controller.result()
                login = next(f.result() for (g, _), f in zip(nodes, made, strict=True) if g.node_type == "Login")
                slurm = Slurm(p, c)
                [f.result() for f in made]
            want = sum(g.InstanceCount for g in spec.compute)
            while not slurm.ping():  # `scontrol show nodes` before slurmctld listens retries after 1 s
                time.sleep(0.05)
            while sum(1 for x in slurm.nodes() if x.usable) < want:
                time.sleep(0.05)
            while p.exec(login, ["srun", "-N4", "hostname"], user="hpuser", workdir="/tmp").exit_code != 0:
                pass
            return time.monotonic() - t0
    finally:
        for v in vols.values():
            p.remove_volume(v)


def start_floor(n: int) -> float:
    """Seconds to create and start n containers of hp's worker image on one new bridge
    network, all at once on threads, each only sleeping: Docker's own cost of the
    containers a create starts (with no daemon booting in them, and no waits)."""
    p = DockerProvider()
    image = Images(p, DEFAULT).refs()["worker"]
    net = f"floor-start{secrets.token_hex(3)}"
    t0 = time.monotonic()
    with bench_network(p, net) as ids:

        def one(i: int) -> None:
            spec = ContainerSpec(
                name=f"{net}-{i}",
                image=image,
                hostname=f"c-{i}",
                labels={"io.hp.bench": net},
                network=net,
                command=["sleep", "1d"],
            )
            started(p, ids, spec)

        with ThreadPoolExecutor(32) as ex:
            list(ex.map(one, range(n)))
        return time.monotonic() - t0


def started(p: DockerProvider, ids: list[str], spec: ContainerSpec, files: dict[str, dict] | None = None) -> str:
    """A floor's container: created (noted in `ids`, for bench_network to remove), its
    files put (directory -> files, in one copy), started."""
    cid = p.create_container(spec)
    ids.append(cid)
    if files:  # one copy (each is a mount of the container's file system by the engine)
        p.put_files(cid, "/", {f"{at.strip('/')}/{name}": f for at, fs in files.items() for name, f in fs.items()})
    p.start(cid)
    return cid


# networks of earlier runs that Docker would not remove (Docker 20.10 can keep counting
# the endpoints of a network's removed containers until dockerd restarts): tried once
_LEFT: set[str] = set()


def clean_left_networks(p: DockerProvider) -> None:
    """Earlier runs' networks, once Docker let go of them: one try each (not
    remove_network's wait: in some floors this runs inside the timing)."""
    for left in p.api.networks(filters={"label": "io.hp.bench"}):
        if left["Id"] not in _LEFT and not p.api.inspect_network(left["Id"]).get("Containers"):
            try:
                p.remove_network(left["Id"])
            except EngineError as e:
                _LEFT.add(left["Id"])
                print(f"warning: an earlier bench's network is still left: {e}", file=sys.stderr)


@contextmanager
def bench_network(p: DockerProvider, net: str) -> Iterator[list[str]]:
    """A bridge network of the bench's own (made on entry), and the list of the containers
    made on it: all removed on the way out (the network left, with a warning, when Docker
    still counts endpoints on it after NETWORK_BUSY_S; a later run tries it again once)."""
    ids: list[str] = []
    clean_left_networks(p)
    try:
        p.api.create_network(net, driver="bridge", labels={"io.hp.bench": net})
        yield ids
    finally:
        with ThreadPoolExecutor(32) as ex:
            list(ex.map(p.remove_container, ids))
        # as hp's delete: Docker may count the endpoints a moment longer, or keep counting them
        if not remove_network(p, net):  # the figure is taken: say what is left, and go on
            print(f"warning: the bench's network {net} is left (Docker still counts endpoints on it)", file=sys.stderr)


def hp(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True
    )
    if check and r.returncode != 0:
        raise SystemExit(f"hp {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def write_json(path: Path, doc: dict) -> str:
    path.write_text(json.dumps(doc))
    return str(path)
