"""Issue 21: the user's work runs on the nodes: a usable base (Python with venv and pip,
git, curl), host folders mounted on every node, node images of one's own (NodePackages,
an image FROM hp's), and outside Slurm clients (submitit, dask-jobqueue) run from the
login node."""

from __future__ import annotations

from tests.conftest import small_spec, write_spec

# what a job script expects on a node: a venv with pip, and the small tools
USABLE = (
    "set -e; python3 -m venv /tmp/hp-venv; /tmp/hp-venv/bin/python -c 'import sys; print(\"venv\", sys.prefix)'; "
    "/tmp/hp-venv/bin/pip --version; git --version; curl --version | head -1; ps -p $$ -o comm=; "
    'echo "host $(hostname)"'
)


def test_python_venv_on_login_and_compute_nodes(hp, tmp_path):
    name = hp.name("py")
    spec = write_spec(tmp_path / "s.json", small_spec(name, [("cpu", "cpu.nano", 1)]))
    hp("create", "-f", str(spec), "--no-accounting", check=True)
    login = hp("exec", name, "--", "bash", "-c", USABLE, check=True).stdout
    assert "venv /tmp/hp-venv" in login and "pip " in login and "git version" in login and "curl " in login
    assert "host login-1" in login, login
    compute = hp("exec", name, "--", "srun", "-N1", "-p", "cpu", "bash", "-c", USABLE, check=True).stdout
    assert "venv /tmp/hp-venv" in compute and "pip " in compute and "git version" in compute
    assert "host cpu-1" in compute, compute


def test_mounted_folder_is_shared_by_host_login_and_compute_nodes(hp, tmp_path):
    name = hp.name("mnt")
    shared = tmp_path / "checkout"
    shared.mkdir()
    shared.chmod(0o777)  # the job runs as hpuser (uid 1000)
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
    from orchestrator.docker.engine import DockerEngine

    assert DockerEngine().containers(name) == []
