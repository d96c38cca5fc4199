"""Issue 21: the user's work runs on the nodes: a usable base (Python with venv and pip,
git, curl), host folders mounted on every node, node images of one's own (NodePackages,
an image FROM hp's), and outside Slurm clients (submitit, dask-jobqueue) run from the
login node."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from orchestrator.docker.engine import DockerEngine
from orchestrator.docker.images import Images
from tests.conftest import ROOT, slurm_release, small_spec, write_spec

CLIENTS_IMAGE = Path(__file__).resolve().parent.parent / "fixtures" / "clients-image"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")

# what a job script expects on a node: a venv with pip, and the small tools
USABLE = (
    "set -e; python3 -m venv /tmp/hp-venv; /tmp/hp-venv/bin/python -c 'import sys; print(\"venv\", sys.prefix)'; "
    "/tmp/hp-venv/bin/pip --version; git --version; curl --version | head -1; ps -p $$ -o comm=; "
    'echo "host $(hostname)"'
)


def test_python_venv_on_login_and_compute_nodes(hp, tmp_path):
    name = hp.name("py")
    # the default cluster's type: ensurepip's install into the venv takes ~60 s of a cpu.nano's 0.05 cores
    spec = write_spec(tmp_path / "s.json", small_spec(name, [("cpu", "cpu.small", 1)], itype="cpu.small"))
    hp("create", "-f", str(spec), "--no-accounting", check=True)
    login = hp("exec", name, "--", "bash", "-c", USABLE, check=True).stdout
    assert "venv /tmp/hp-venv" in login and "pip " in login and "git version" in login and "curl " in login
    assert "host login-1" in login, login
    compute = hp("exec", name, "--", "srun", "-N1", "-p", "cpu", "bash", "-c", USABLE, check=True).stdout
    assert "venv /tmp/hp-venv" in compute and "pip " in compute and "git version" in compute
    assert "host cpu-1" in compute, compute


@pytest.mark.releases
def test_mounted_folder_is_shared_by_host_login_and_compute_nodes(hp, tmp_path):
    name = hp.name("mnt")
    shared = tmp_path / "checkout"
    shared.mkdir()
    shared.chmod(0o777)  # hp runs as root here: hpuser keeps the image's uid 1000 (test below: a user's)
    (shared / "from-host.txt").write_text("host was here\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    spec = write_spec(tmp_path / "s.json", small_spec(name, [("cpu", "cpu.nano", 1)]))
    hp(
        "create", "-f", str(spec), "--no-accounting", "--mount", str(shared), "--mount", f"{ro}:/data", check=True
    )  # fmt: skip
    assert hp("exec", name, "--", "cat", f"{shared}/from-host.txt", check=True).stdout == "host was here\n"
    job = f'echo "written by $(hostname)" > {shared}/from-job.txt'
    hp("exec", name, "--", "srun", "-N1", "-p", "cpu", "bash", "-c", job, check=True)
    assert (shared / "from-job.txt").read_text() == "written by cpu-1\n"
    # Target other than the Source's path; the controller does not get the mounts
    assert hp("exec", name, "--", "srun", "-N1", "-p", "cpu", "ls", "-d", "/data", check=True).stdout == "/data\n"
    assert hp("exec", name, "--node", "controller-1", "--", "test", "-e", str(shared)).returncode == 1


def test_a_users_hp_create_gives_the_jobs_files_in_a_mount_to_that_user(hp, tmp_path):
    """Issue 46 item 2: a CI runner's user (not root, uid 1001 on GitHub's runners, with
    Docker access) runs `hp create --mount "$PWD"` on its checkout, a folder of its own
    (0755, no chmod): jobs write there, and what they write belongs to that user, who can
    remove it. Run here as a user made for the test, in the socket's group."""
    if os.geteuid() != 0:
        pytest.skip("adding a user needs root")
    sock = Path(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://"))
    if not sock.exists() or sock.stat().st_gid == 0:
        pytest.skip("no local Docker socket with a group of its own")
    uid = next(i for i in range(1001, 1100) if not _taken(pwd.getpwuid, i) and not _taken(grp.getgrgid, i))
    user = f"hpci{uid}"
    name = hp.name("own")
    base = Path(tempfile.mkdtemp(prefix="hp-user-", dir="/tmp"))  # pytest's tmp_path is root's alone
    subprocess.run(["groupadd", "-g", str(uid), user], check=True)
    try:
        group = grp.getgrgid(sock.stat().st_gid).gr_name
        subprocess.run(["useradd", "-M", "-u", str(uid), "-g", str(uid), "-G", group, user], check=True)
        checkout, home = base / "checkout", base / "hp-home"
        for d in (base, checkout, home):
            d.mkdir(exist_ok=True)
            os.chown(d, uid, uid)
            d.chmod(0o755)
        spec = write_spec(base / "s.json", small_spec(name, [("cpu", "cpu.nano", 1)]))
        python, more = _python_for(user)
        env = {**hp.env, "HP_HOME": str(home), "HOME": str(base), **more}

        def as_user(*args: str) -> subprocess.CompletedProcess[str]:
            argv = ["runuser", "-u", user, "--", *python, "-m", "orchestrator.cli", *args]
            return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)

        try:
            r = as_user("create", "-f", str(spec), "--no-accounting", "--mount", str(checkout))
            assert r.returncode == 0, r.stderr
            job = f"mkdir {checkout}/cache && echo from-job > {checkout}/cache/result && id -u && id -g"
            r = as_user("exec", name, "--", "srun", "-N1", "-p", "cpu", "bash", "-c", job)
            assert (r.returncode, r.stdout.split()) == (0, [str(uid), str(uid)]), r.stderr
            script = base / "job.sh"
            script.write_text(f"#!/bin/bash\necho submitted > {checkout}/submitted\nls -n {checkout}/submitted\n")
            r = as_user("submit", name, str(script), "--partition", "cpu")
            assert r.returncode == 0 and f" {uid} {uid} " in r.stdout, (r.stdout, r.stderr)
            for f in (checkout / "cache", checkout / "cache" / "result", checkout / "submitted"):
                st = f.stat()
                assert (st.st_uid, st.st_gid) == (uid, uid), f
            assert (checkout / "cache" / "result").read_text() == "from-job\n"
            # hpuser's home on the shared /home is that user's too
            r = as_user("exec", name, "--", "stat", "-c", "%u:%g", "/home/hpuser")
            assert r.stdout.strip() == f"{uid}:{uid}", r.stderr
            r = subprocess.run(["runuser", "-u", user, "--", "rm", "-r", str(checkout / "cache")], capture_output=True)
            assert r.returncode == 0 and not (checkout / "cache").exists(), r.stderr
        finally:
            as_user("delete", name)
    finally:
        subprocess.run(["userdel", user], capture_output=True)
        subprocess.run(["groupdel", user], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _python_for(user: str) -> tuple[list[str], dict[str, str]]:
    """The interpreter the user runs hp with, and its environment: this one where the user
    may run it (a venv of the system's Python, as `make venv` makes on a fresh machine); else
    the system's python3 of the same version on this venv's packages (a Python kept in
    root's home, as on the development machine)."""
    if subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", ""], capture_output=True).returncode == 0:
        return [sys.executable], {}
    system = "/usr/bin/python3"
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    r = subprocess.run(
        [system, "-c", "import sys; print(*sys.version_info[:2], sep='.')"], capture_output=True, text=True
    )
    if r.stdout.strip() != want:
        pytest.skip(f"the user can run neither {sys.executable} nor a system Python {want}")
    return [system], {"PYTHONPATH": f"{ROOT}:{sysconfig.get_paths()['purelib']}"}


def _taken(lookup, i: int) -> bool:
    try:
        lookup(i)
        return True
    except KeyError:
        return False


def test_bad_mounts_and_packages_create_nothing(hp, tmp_path):
    name = hp.name("bad")
    doc = small_spec(
        name,
        Mounts=[{"Source": "rel"}, {"Source": str(tmp_path / "missing")}, {"Source": str(tmp_path), "Target": "/etc"}],
        NodePackages=["jq; touch /tmp/pwned", "$(id)"],
    )
    r = hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)), "--mount", f"{tmp_path}:/proc/x")
    assert r.returncode == 2, r.stderr
    for want in (
        "Mounts[0].Source: 'rel' must be an absolute path",
        f"Mounts[1].Source: '{tmp_path / 'missing'}' does not exist",
        "Mounts[2].Target: '/etc' is inside /etc",
        "Mounts[3].Target: '/proc/x' is inside /proc",
        "NodePackages[0]: 'jq; touch /tmp/pwned' is not a Debian package name",
        "NodePackages[1]: '$(id)' is not a Debian package name",
    ):
        assert want in r.stderr, r.stderr
    assert hp.json("list")["ClusterSummaries"] == []


@pytest.mark.releases
def test_node_packages_are_built_once_and_reused(hp, tmp_path):
    # jq is not in hp's images; the derived image is keyed by hp's image and the list
    names = [hp.name("pkg"), hp.name("pkg")]
    specs = [
        write_spec(tmp_path / f"{n}.json", small_spec(n, [("cpu", "cpu.nano", 1)], NodePackages=["jq"])) for n in names
    ]
    first = hp("create", "-f", str(specs[0]), "--no-accounting", check=True)
    assert "hp-worker-pkgs:" in first.stderr + first.stdout
    again = hp("create", "-f", str(specs[1]), "--no-accounting", check=True)
    out = again.stderr + again.stdout
    assert "building hp-" not in out and "hp-worker-pkgs:" in out and "up to date" in out, out
    for n in names:
        assert hp("exec", n, "--", "jq", "-n", "1+1", check=True).stdout == "2\n"
        assert hp("exec", n, "--", "srun", "-N1", "-p", "cpu", "jq", "-n", "2+2", check=True).stdout == "4\n"
    # the controller runs hp's own image
    assert hp("exec", names[0], "--node", "controller-1", "--", "sh", "-c", "command -v jq").returncode != 0
    # the cache key follows the list
    key = hp("images", "key", "-f", str(specs[0]), check=True).stdout.strip()
    assert key != hp("images", "key", check=True).stdout.strip()


def test_a_package_apt_does_not_know_fails_with_apts_words(hp, tmp_path):
    name = hp.name("nopkg")
    spec = write_spec(tmp_path / "s.json", small_spec(name, [("cpu", "cpu.nano", 1)], NodePackages=["hp-no-such-pkg"]))
    r = hp("create", "-f", str(spec), "--no-accounting")
    assert r.returncode == 1, r.stderr
    assert "Unable to locate package hp-no-such-pkg" in r.stderr, r.stderr
    assert hp.json("list")["ClusterSummaries"] == []
    assert DockerEngine().containers(name) == []


def clients_image(tmp_path: Path) -> str:
    """A user's image FROM hp's worker image with submitit and dask-jobqueue from PyPI
    (tests/fixtures/clients-image), tagged by hp's image and the Dockerfile: built once."""
    p = DockerEngine()
    worker = Images(p, slurm_release()).refs()["worker"]
    recipe = (CLIENTS_IMAGE / "Dockerfile").read_bytes()
    tag = "hp-test-clients:" + hashlib.sha256(worker.encode() + b"\0" + recipe).hexdigest()[:12]
    if p.image_id(tag) is None:
        ctx = tmp_path / "clients-image"
        shutil.copytree(CLIENTS_IMAGE, ctx)
        shutil.copy(HOST_CA, ctx / "host-ca.crt")  # PyPI over HTTPS from inside the build
        p.build_image(ctx, tag, None, {"PARENT": worker}, lambda line: None)
    return tag


SUBMITIT = r"""
import socket, submitit

def square(x):
    return x * x

def where():
    env = submitit.JobEnvironment()
    return env.global_rank, socket.gethostname()

def boom():
    raise ValueError("boom from the job")

ex = submitit.AutoExecutor(folder="submitit/%j")
assert ex.cluster == "slurm", ex.cluster
ex.update_parameters(slurm_partition="cpu", timeout_min=5, nodes=1, tasks_per_node=1, cpus_per_task=1, slurm_mem="100M")
jobs = ex.map_array(square, [1, 2, 3, 4])
print("array", [j.result() for j in jobs], len({j.job_id.split("_")[0] for j in jobs}))
ex.update_parameters(nodes=2)
print("two-node", sorted(ex.submit(where).results()))
ex.update_parameters(nodes=1)
try:
    ex.submit(boom).result()
    print("no exception")
except Exception as e:
    print("raised", type(e).__name__, "ValueError: boom from the job" in str(e))
"""

DASK = r"""
import socket
from dask.distributed import Client
from dask_jobqueue import SLURMCluster

cluster = SLURMCluster(queue="cpu", cores=1, processes=1, memory="300MB", walltime="00:10:00", log_directory="dask-logs")
cluster.scale(jobs=3)
client = Client(cluster)
client.wait_for_workers(3, timeout=240)
workers = sorted(client.scheduler_info()["workers"])
hosts = client.run(socket.gethostname)
parts = [client.submit(lambda i: (i * i, socket.gethostname()), i, workers=[w], pure=False) for i, w in enumerate(workers)]
total = client.submit(lambda xs: sum(x for x, _ in xs), parts).result()
print("workers", len(workers), "hosts", sorted(set(hosts.values())), "ran on", len({h for _, h in client.gather(parts)}))
print("total", total)
client.close()
cluster.close()
"""


def test_submitit_and_dask_jobqueue_run_from_the_login_node(hp, tmp_path):
    image = clients_image(tmp_path)
    name = hp.name("cli")
    doc = small_spec(name, [("cpu", "cpu.medium", 2)], itype="cpu.medium")
    for g in doc["InstanceGroups"][1:]:  # login and compute run the user's image; the controller hp's
        g["Image"] = image
    hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)), check=True)  # submitit polls sacct
    r = hp("exec", name, "--", "python3", "-c", SUBMITIT, timeout=400, check=True)
    lines = r.stdout.splitlines()
    assert "array [1, 4, 9, 16] 1" in lines, r.stdout  # one array job of 4 tasks
    assert "two-node [(0, 'cpu-1'), (1, 'cpu-2')]" in lines or "two-node [(0, 'cpu-2'), (1, 'cpu-1')]" in lines, (
        r.stdout
    )
    assert "raised FailedJobError True" in lines, r.stdout
    r = hp("exec", name, "--", "python3", "-c", DASK, timeout=400, check=True)
    assert "workers 3 hosts ['cpu-1', 'cpu-2'] ran on 2" in r.stdout, r.stdout + r.stderr
    assert "total 5" in r.stdout, r.stdout  # 0 + 1 + 4, one part on each worker
