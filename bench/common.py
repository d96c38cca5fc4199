"""Shared pieces of the benchmarks: the plain-docker floor, and running hp."""

from __future__ import annotations

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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.cluster.delete import remove_network  # noqa: E402
from orchestrator.docker.engine import DockerEngine as DockerProvider
from orchestrator.docker.images import Images  # noqa: E402
from orchestrator.docker.views import ContainerSpec  # noqa: E402
from orchestrator.slurm.client import SlurmCli as Slurm  # noqa: E402
from orchestrator.slurm.conf import render, slurmd_conf  # noqa: E402
from orchestrator.spec.catalogue import load_catalogue  # noqa: E402
from orchestrator.spec.model import validate  # noqa: E402

BENCH_TYPES = "bench.tiny: {VCpus: 1, CpuLimit: 0.02, MemoryMiB: 128}\n"


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
    """Seconds from nothing to n idle Slurm nodes, with plain docker-py calls: the same
    images and slurm.conf, no orchestration (no state, no capacity, no labels logic). The
    fastest order found: every container created at once on threads, the controller
    started first and each worker as soon as it is made (the image's entry starts slurmd
    once slurmctld listens, a connect every 0.05 s), Slurm polled every 0.05 s. (Workers
    started only after `scontrol ping` answered: 10-20% slower at N = 4 here.)"""
    os.environ.setdefault("HP_INSTANCE_TYPES", "")
    p = DockerProvider()
    with tempfile.TemporaryDirectory() as tmp:
        tf = Path(tmp) / "types.yaml"
        tf.write_text(BENCH_TYPES)
        cat = load_catalogue(tf)
        name = f"floor{secrets.token_hex(3)}"
        spec = validate(spec_doc(name, n, itype), cat)
        imgs = Images(p).refs()
        conf = render(spec, cat).encode()
        key = secrets.token_bytes(64)
        t = cat[itype]
        net = f"floor-{name}"
        lab = {"io.hp.bench": net}
        t0 = time.monotonic()
        with bench_network(p, net) as ids:

            def controller() -> str:
                cid = p.create_container(
                    ContainerSpec(
                        name=f"{net}-ctl", image=imgs["controller"], hostname="controller-1", labels=lab, network=net
                    )
                )
                ids.append(cid)
                p.put_files(cid, "/etc/slurm", {"slurm.conf": (conf, 0o644, 0), "slurm.key": (key, 0o600, 64030)})
                p.start(cid)
                return cid

            def worker(i: int) -> str:
                cid = p.create_container(
                    ContainerSpec(
                        name=f"{net}-w{i}",
                        image=imgs["worker"],
                        hostname=f"w-{i}",
                        labels=lab,
                        network=net,
                        environment={"HP_CONTROLLER": "controller-1", "HP_SLURMD_CONF": slurmd_conf(t, "w")},
                        cpu_limit=t.cpu_limit,
                        memory_bytes=t.memory_mib * 2**20,
                    )
                )
                ids.append(cid)
                p.put_files(cid, "/etc/slurm", {"slurm.key": (key, 0o600, 0)})
                p.start(cid)
                return cid

            with ThreadPoolExecutor(32) as ex:
                ctl = ex.submit(controller)
                list(ex.map(worker, range(1, n + 1)))
                slurm = Slurm(p, ctl.result())
            while sum(1 for x in slurm.nodes() if x.usable) < n:
                time.sleep(0.05)
            return time.monotonic() - t0


def start_floor(n: int) -> float:
    """Seconds to create and start n containers of hp's worker image on one new bridge
    network, all at once on threads, each only sleeping: Docker's own cost of the
    containers a create starts (with no daemon booting in them, and no waits)."""
    p = DockerProvider()
    image = Images(p).refs()["worker"]
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
            ids.append(p.create_container(spec))
            p.start(ids[-1])

        with ThreadPoolExecutor(32) as ex:
            list(ex.map(one, range(n)))
        return time.monotonic() - t0


@contextmanager
def bench_network(p: DockerProvider, net: str) -> Iterator[list[str]]:
    """A bridge network of the bench's own (made on entry), and the list of the containers
    made on it: all removed on the way out."""
    ids: list[str] = []
    try:
        p.api.create_network(net, driver="bridge", labels={"io.hp.bench": net})
        yield ids
    finally:
        with ThreadPoolExecutor(32) as ex:
            list(ex.map(p.remove_container, ids))
        remove_network(p, net)  # as hp's delete: Docker may count the endpoints a moment longer


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
