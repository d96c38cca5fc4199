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
