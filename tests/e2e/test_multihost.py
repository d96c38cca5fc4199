"""A cluster across three Docker hosts, for real: each host is a Docker-in-Docker
container running its own dockerd (tests/hosts/dind.py), registered with `hp hosts add`,
joined in a swarm by hp. One cluster (1 controller + 1 login + 3 compute) goes through,
in order: spread and a job across hosts, /home shared across hosts, InstanceConnectivity
across hosts and with one host's overlay traffic cut, `docker kill` of a host (its nodes
come back on the others with no command), the host started again (stale copies removed,
no Slurm node doubled), an encrypted overlay (proven, or refused with the reason), and
`hp delete` (nothing left on any host). Bad input (an unreachable host, an unknown host in
a spec, removing the controller's host) is refused with nothing recorded.

Skipped, with the reason, where this machine's engine cannot run Docker-in-Docker hosts.
Resources: names start with HP_DIND_PREFIX (default hpdind-); all removed at the end.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import Hp, slurm_release, write_spec

from orchestrator.docker.multihost import PING_TIMEOUT_S
from orchestrator.releases import SlurmRelease

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hosts.dind import Harness, Host, Unsupported  # noqa: E402

# its tests share one module-scoped cluster: one xdist worker runs them, in order
pytestmark = pytest.mark.xdist_group("multihost")

NAME = "mhlab"
CPUS, MEMORY_MIB = 2, 4096  # each host's capacity override (every DinD engine reports the whole machine)
COMPUTE = 3  # the module cluster's compute nodes: one a host (spread), the fewest that show it


@dataclass
class Lab:
    hp: Hp
    harness: Harness
    hosts: list[Host]
    home: Path
    made: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def host(self, i: int) -> Host:
        return self.hosts[i - 1]

    def nodes(self, name: str = NAME) -> dict[str, dict[str, Any]]:
        return {n["SlurmNodeName"]: n for n in self.hp.json("nodes", name)["ClusterNodeSummaries"]}

    def on_host(self, h: str, name: str = NAME) -> list[str]:
        return sorted(n for n, v in self.nodes(name).items() if v["Host"] == h and n.startswith("cpu"))

    def labelled(self, i: int, name: str) -> dict[str, list[str]]:
        """What host i holds with the cluster's label: containers, networks, volumes."""
        c = self.harness.client(self.host(i).name)
        try:
            f = {"label": f"io.hp.cluster={name}"}
            return {
                "containers": [x.name for x in c.containers.list(all=True, ignore_removed=True, filters=f)],
                "networks": [x.name for x in c.networks.list(filters=f)],
                "volumes": [x.name for x in c.volumes.list(filters=f)],
            }
        finally:
            c.close()


@pytest.fixture(scope="module")
def lab(docker_ok: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    harness = Harness()
    try:
        hosts = harness.start(3)
    except Unsupported as e:
        pytest.skip(f"this engine cannot run Docker-in-Docker hosts: {e}")
    home = tmp_path_factory.mktemp("hphome-mh")
    hp = Hp(home)
    lab = Lab(hp, harness, hosts, home)
    try:
        for i, h in enumerate(hosts, 1):
            hp(
                "hosts",
                "add",
                f"h{i}",
                "--docker-host",
                h.url,
                "--cpus",
                str(CPUS),
                "--memory-mib",
                str(MEMORY_MIB),
                "--advertise-addr",
                h.ip,
                check=True,
            )
        yield lab
    finally:
        for log in home.glob("clusters/*/agent.log"):
            sys.stderr.write(f"--- {log}\n{log.read_text()[-4000:]}")
        for n in lab.made:
            hp("delete", n, timeout=120)
        harness.stop_all()
        shutil.rmtree(home, ignore_errors=True)


def spec(name: str, compute: int = COMPUTE, **top: Any) -> dict[str, Any]:
    return {
        "ClusterName": name,
        "NodeRecovery": "Automatic",
        "InstanceGroups": [
            {
                "InstanceGroupName": "controller",
                "InstanceType": "cpu.small",
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Controller"},
            },
            {
                "InstanceGroupName": "login",
                "InstanceType": "cpu.nano",
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Login"},
            },
            {
                "InstanceGroupName": "cpu",
                "InstanceType": "cpu.nano",
                "InstanceCount": compute,
                "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["cpu"]},
            },
        ],
        **top,
    }


def wait_for(what: str, fn: Any, timeout: float, every: float = 0.25) -> Any:
    t0 = time.monotonic()
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(every)


# -- hosts ------------------------------------------------------------------------------
def test_hosts_are_registered_in_one_swarm_and_bad_hosts_are_refused(lab: Lab) -> None:
    doc = lab.hp.json("hosts", "list")
    assert doc["Swarm"]["Mode"] == "created"
    rows = doc["Hosts"]
    assert [h["Name"] for h in rows] == ["h1", "h2", "h3"]
    assert all(h["Reachable"] and h["Cpus"] == CPUS and h["MemoryMiB"] == MEMORY_MIB for h in rows)
    assert [h["SwarmRole"] for h in rows] == ["manager"] * 3 and {h["SwarmState"] for h in rows} == {"ready"}
    r = lab.hp("hosts", "add", "h4", "--docker-host", f"unix://{lab.home}/nothing.sock")
    assert r.returncode == 1 and "cannot reach the Docker engine of host h4" in r.stderr
    r = lab.hp("hosts", "add", "h1", "--docker-host", "tcp://10.0.0.1:2376")
    assert r.returncode == 2 and "already registered" in r.stderr
    r = lab.hp("hosts", "remove", "h9")
    assert r.returncode == 2
    assert [h["Name"] for h in lab.hp.json("hosts", "list")["Hosts"]] == ["h1", "h2", "h3"]


def test_a_host_whose_engine_cannot_hand_nodes_dev_fuse_is_refused_until_it_can(lab: Lab, tmp_path: Path) -> None:
    harness = lab.harness
    h4 = harness.start(1, first=4, fuse=False)[0]  # a Docker-in-Docker host without --device /dev/fuse
    add = ("hosts", "add", "h4", "--docker-host", h4.url, "--cpus", str(CPUS), "--memory-mib", str(MEMORY_MIB),
           "--advertise-addr", h4.ip)  # fmt: skip
    try:
        t0 = time.monotonic()
        r = lab.hp(*add)
        took = time.monotonic() - t0
        print(f"\nhp hosts add of a host without /dev/fuse: exit {r.returncode} in {took:.1f} s: {r.stderr.strip()}")
        assert r.returncode == 2, r.stderr
        assert "host h4 cannot run hp's nodes" in r.stderr and "/dev/fuse" in r.stderr
        assert "--device /dev/fuse" in r.stderr and "modprobe fuse" in r.stderr  # the fix
        doc = lab.hp.json("hosts", "list")
        assert [h["Name"] for h in doc["Hosts"]] == ["h1", "h2", "h3"]  # nothing recorded
        c = harness.client(h4.name)
        try:
            assert c.info()["Swarm"]["LocalNodeState"] == "inactive"  # nor joined to the swarm
        finally:
            c.close()
        h4 = harness.recreate(4)  # the same host, given the device
        t0 = time.monotonic()
        lab.hp(*add, check=True)
        print(f"the same host given /dev/fuse: accepted in {time.monotonic() - t0:.1f} s")
        assert [h["Name"] for h in lab.hp.json("hosts", "list")["Hosts"]] == ["h1", "h2", "h3", "h4"]
        # the host loses the device later (restarted without it, its images and swarm state kept):
        # create's preflight refuses before anything is streamed or made
        h4 = harness.recreate(4, fuse=False, fresh=False)

        def rejoined() -> bool:  # a host that is up again, as the user's would be: back in the swarm
            c = harness.client(h4.name)
            try:
                return c.info()["Swarm"]["LocalNodeState"] == "active"
            finally:
                c.close()

        wait_for("h4 back in the swarm", rejoined, 120, 0.5)
        t0 = time.monotonic()
        r = lab.hp("create", "-f", str(write_spec(tmp_path / "f.json", spec("mhfuse", compute=1))))
        took = time.monotonic() - t0
        print(f"hp create with h4 without /dev/fuse: exit {r.returncode} in {took:.1f} s: {r.stderr.strip()}")
        assert r.returncode == 2, r.stderr
        assert "host h4 cannot run hp's nodes now" in r.stderr and "/dev/fuse" in r.stderr, r.stderr
        assert "streaming" not in r.stderr  # no node image went to any host
        assert "mhfuse" not in lab.hp("list").stdout
        for i in (1, 2, 3):
            assert lab.labelled(i, "mhfuse") == {"containers": [], "networks": [], "volumes": []}
        assert took < 30, r.stderr
        lab.hp("hosts", "remove", "h4", check=True)
    finally:
        harness.docker.api.remove_container(h4.name, force=True, v=True)
    assert [h["Name"] for h in lab.hp.json("hosts", "list")["Hosts"]] == ["h1", "h2", "h3"]


# -- a cluster across the hosts ----------------------------------------------------------------
def test_a_cluster_spreads_over_three_hosts_and_shares_home(lab: Lab, tmp_path: Path) -> None:
    hp = lab.hp
    bad = spec(NAME)
    bad["InstanceGroups"][2]["Placement"] = {"Hosts": ["h1", "h7"]}
    r = hp("create", "-f", str(write_spec(tmp_path / "bad.json", bad)))
    assert r.returncode == 2 and "unknown host(s) h7" in r.stderr
    lab.made.append(NAME)
    t0 = time.monotonic()
    hp("create", "-f", str(write_spec(tmp_path / "s.json", spec(NAME))), "--timeout", "300", check=True)
    lab.notes["create_s"] = time.monotonic() - t0
    nodes = lab.nodes()
    assert nodes["controller-1"]["Host"] == nodes["login-1"]["Host"] == "h1"
    per_host = {h: lab.on_host(h) for h in ("h1", "h2", "h3")}
    assert [len(v) for v in per_host.values()] == [COMPUTE // 3] * 3, per_host
    r = hp("exec", NAME, "--", "srun", f"-N{COMPUTE}", "hostname", check=True)
    assert sorted(r.stdout.split()) == sorted(n for n in nodes if n.startswith("cpu"))
    # a job on a compute node of host 2 writes; the login node on host 1 reads it
    on2 = per_host["h2"][0]
    out = "/home/hpuser/from-h2.txt"
    hp("exec", NAME, "--", "sbatch", "--wait", "-w", on2, "-o", out, "--wrap", "hostname; id -un", check=True)
    r = hp("exec", NAME, "--", "cat", out, check=True)
    assert r.stdout.split() == [on2, "hpuser"]
    r = hp("exec", NAME, "--", "stat", "-c", "%U", out, check=True)
    assert r.stdout.strip() == "hpuser"  # real ownership across hosts (GlusterFS)
    # the controller's host cannot go while the controller lives there
    r = hp("hosts", "remove", "h1")
    assert r.returncode == 2 and "holds the controller of cluster" in r.stderr
    print(
        f"\ncreate of 1+1+{COMPUTE} over 3 hosts (images streamed to each host included): {lab.notes['create_s']:.1f} s"
    )


def phases(lab: Lab) -> dict[str, tuple[str, str]]:
    from orchestrator.state.store import Store

    st = Store(lab.home)
    try:
        return {n: (r.phase.value, r.message[:80]) for n, r in st.latest_phases(NAME).items()}
    finally:
        st.close()


def health_doc(lab: Lab) -> dict[str, Any]:
    return lab.hp.json("health-check", "status", NAME)["Request"]


def initial_results(req: dict[str, Any]) -> dict[str, str]:
    out = {}
    for g in req.get("InstanceGroups") or []:
        for n in g["Nodes"]:
            first = next(
                (x for x in n["Checks"] if x["Attempt"] == "initial" and x["State"] in ("Passed", "Failed")), None
            )
            if first:
                out[n["Node"]] = first["State"]
    return out


def test_instance_connectivity_across_hosts_and_a_host_whose_overlay_is_cut(lab: Lab) -> None:
    hp = lab.hp
    args = ("health-check", "start", NAME, "--group", "cpu", "--check", "InstanceConnectivity")
    r = hp(*args, "--wait", "--timeout", "300")
    assert r.returncode == 0, r.stdout + r.stderr
    on3 = lab.on_host("h3")
    h3 = lab.host(3).name
    lab.harness.cut_overlay(h3)
    try:
        rid = hp(*args, check=True).stdout.strip()
        req = wait_for(
            "the initial verdicts",
            lambda: (d := health_doc(lab)) and len(initial_results(d)) == COMPUTE and d,
            240,
            1.0,
        )
    finally:
        lab.harness.cut_overlay(h3, cut=False)
    got = initial_results(req)
    assert sorted(n for n, v in got.items() if v == "Failed") == on3, got
    # with traffic back, NodeRecovery Automatic reboots and checks them again: they pass
    done = wait_for(
        "the request's end", lambda: (d := health_doc(lab)) and d["State"] in ("Completed", "Failed") and d, 300, 1.0
    )
    assert done["Id"] == rid and done["State"] == "Completed", json.dumps(done)[:4000]
    assert set(done["Results"].values()) == {"Passed"}, done["Results"]


USER_BOUND_S = 3.0  # each hp command while a host is down (issue 24)
SRUN_BOUND_S = 20.0  # kill -> srun over every compute node works, as the user sees it


def test_docker_kill_of_host_3_brings_its_nodes_back_on_the_others(lab: Lab) -> None:
    """What the user sees: every hp command answers within USER_BOUND_S while host 3 is
    down (naming it unreachable), and srun over every compute node works within
    SRUN_BOUND_S of the kill."""
    hp = lab.hp
    on3 = lab.on_host("h3")
    assert on3
    took: dict[str, list[float]] = {"nodes": [], "describe": [], "exec": []}
    named = []

    def timed(kind: str, *args: str) -> Any:
        t = time.monotonic()
        r = hp(*args, timeout=60)
        took[kind].append(time.monotonic() - t)
        assert r.returncode == 0, r.stderr
        named.append("host h3 is unreachable" in r.stderr)
        return r

    # the same commands with every host up, three times each: this machine's floor for them
    # (with the suite's other workers beside it, one `hp nodes` took 0.99 to 3.34 s here)
    for _ in range(3):
        timed("nodes", "nodes", NAME, "--json")
        timed("describe", "describe", NAME, "--json")
        timed("exec", "exec", NAME, "--", "hostname")
    floors = {k: sorted(v) for k, v in took.items()}
    floor = {k: v[1] for k, v in floors.items()}  # the median of three
    for v in took.values():
        v.clear()
    named.clear()
    t0 = time.monotonic()
    lab.harness.kill(lab.host(3).name)
    seen: list[str] = []

    def back() -> bool:
        n = {
            x["SlurmNodeName"]: x
            for x in json.loads(timed("nodes", "nodes", NAME, "--json").stdout)["ClusterNodeSummaries"]
        }
        missing = [x for x in on3 if x not in n]
        if missing:  # every node is listed all along (lost, then pending, then running)
            seen.append(f"{time.monotonic() - t0:.1f}s: {missing} not listed: {phases(lab)}")
        return all(x in n and n[x]["Host"] in ("h1", "h2") and n[x]["SlurmState"] == "idle" for x in on3)

    wait_for("the nodes of host 3 idle on hosts 1 and 2", back, 60, 0.2)
    idle = time.monotonic() - t0
    r = hp("exec", NAME, "--", "srun", f"-N{COMPUTE}", "hostname", timeout=60, check=True)
    srun = time.monotonic() - t0
    assert len(set(r.stdout.split())) == COMPUTE
    # host 3 is still down (the host watcher has marked it lost by now)
    assert "h3" in json.loads(timed("describe", "describe", NAME, "--json").stdout)["UnreachableHosts"]
    timed("exec", "exec", NAME, "--", "hostname")
    lab.notes["kill_to_idle_s"] = idle
    slowest = {k: max(v) for k, v in took.items()}
    print(
        f"\ndocker kill of host 3 -> as the user sees it: hp nodes (x{len(took['nodes'])}) at most "
        f"{slowest['nodes']:.2f} s (median {sorted(took['nodes'])[len(took['nodes']) // 2]:.2f} s), hp describe {slowest['describe']:.2f} s, hp exec {slowest['exec']:.2f} s "
        f"(bound {USER_BOUND_S:g} s; with every host up, medians of 3: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in floor.items())
        + f"); {', '.join(on3)} idle on hosts 1 and 2 in hp nodes at {idle:.1f} s; "
        f"srun -N{COMPUTE} done at {srun:.1f} s (bound {SRUN_BOUND_S:g} s)"
    )
    assert not seen, seen
    assert named[0], "the first hp nodes after the kill names host h3 as unreachable"
    # no command waits more than HP_HOST_PING_TIMEOUT on the dead host: each kind's median
    # within USER_BOUND_S, or, on a machine busy enough (the suite's other workers) that the
    # command alone takes longer than USER_BOUND_S - that, within its slowest all-up run plus
    # that timeout (the load that slowed one all-up run slows the runs after the kill as much:
    # one CI run saw all-up nodes 1.08/1.44/3.58 s, then 1.15/3.77/3.72 s with h3 dead);
    # and none of them near a stall (docker-py's 60 s): within the slowest floor + both bounds
    median = {k: sorted(v)[len(v) // 2] for k, v in took.items()}
    over = {k: v for k, v in median.items() if v >= max(USER_BOUND_S, floors[k][-1] + PING_TIMEOUT_S)}
    stalled = {k: v for k, v in slowest.items() if v >= floors[k][-1] + PING_TIMEOUT_S + USER_BOUND_S}
    assert not over and not stalled, (over, stalled, floors, took)
    assert srun < SRUN_BOUND_S


def test_host_3_back_has_its_stale_copies_removed_and_no_node_doubled(lab: Lab) -> None:
    hp = lab.hp
    h3 = lab.host(3).name
    up = lab.harness.restart(h3)

    def clean() -> bool:
        return not [c for c in lab.labelled(3, NAME)["containers"] if "-cpu-" in c]

    wait_for("host 3 without stale copies", clean, 60, 0.5)
    print(f"\nhost 3 answered {up:.1f} s after it was started again; its stale copies are gone")
    r = hp("exec", NAME, "--", "scontrol", "show", "nodes", "--oneliner", check=True)
    names = [w.split("=", 1)[1] for line in r.stdout.splitlines() for w in line.split() if w.startswith("NodeName=")]
    assert sorted(names) == sorted(set(names)) and len([n for n in names if n.startswith("cpu")]) == COMPUTE
    running = []
    for i in (1, 2, 3):
        running += [c for c in lab.labelled(i, NAME)["containers"] if "-cpu-" in c]
    assert len(running) == len(set(running)) == COMPUTE, running  # one container per node, over all hosts
    assert json.loads(hp("hosts", "list", "--json", check=True).stdout)["Hosts"][2]["Reachable"]


def test_an_encrypted_overlay_is_proven_or_refused_with_the_reason(lab: Lab, tmp_path: Path) -> None:
    name = "mhenc"
    lab.made.append(name)
    s = spec(name, compute=1)
    r = lab.hp("create", "-f", str(write_spec(tmp_path / "e.json", s)), "--encrypt-network", "--timeout", "120")
    if r.returncode == 0:  # a kernel with IPsec: traffic was proven
        assert "traffic passes from" in r.stderr
        lab.hp("delete", name, check=True)
    else:  # this sandbox's kernel has no ESP: refused, with why, and nothing left
        assert r.returncode == 1 and "carries no traffic" in r.stderr and "IPsec" in r.stderr, r.stderr
        for i in (1, 2, 3):
            assert lab.labelled(i, name) == {"containers": [], "networks": [], "volumes": []}


def test_rest_across_hosts_answers_through_the_front_only(lab: Lab, tmp_path: Path) -> None:
    """With registered hosts slurmrestd runs on the controller's host, on the overlay this
    host cannot reach: the front relays each request through an exec in its container;
    no container publishes a port."""
    name = "mhrest"
    lab.made.append(name)
    s = spec(name, compute=1, Rest={"Enabled": True})
    lab.hp("create", "-f", str(write_spec(tmp_path / "r.json", s)), "--timeout", "240", check=True)
    url = lab.hp("api", name, check=True).stdout.strip()
    tok = lab.hp("token", name, "--lifespan", "300", check=True).stdout.strip()
    t0 = time.monotonic()
    status, doc = http(f"{url}/slurm/v0.0.42/ping", token=tok)
    took = time.monotonic() - t0
    assert status == 200 and doc["pings"][0]["pinged"] == "UP", doc
    status, doc = http(f"{url}/slurm/v0.0.42/nodes", token=tok)
    assert status == 200 and {n["name"] for n in doc["nodes"]} == {"cpu-1"}, doc
    status, doc = http(f"{url}/slurm/v0.0.42/ping")
    assert status == 401 and doc["errors"][0]["error"] == "missing X-SLURM-USER-TOKEN", doc
    print(f"\nREST across hosts: ping through the front in {took:.2f} s")
    for i in (1, 2, 3):
        c = lab.harness.client(lab.host(i).name)
        try:
            f = {"label": f"io.hp.cluster={name}"}
            published = {x.name: x.ports for x in c.containers.list(filters=f) if any(x.ports.values())}
        finally:
            c.close()
        assert published == {}, published
    lab.hp("delete", name, check=True)
    lab.made.remove(name)


def http(url: str, method: str = "GET", token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method)
    req.add_header("X-SLURM-USER-NAME", "hpuser")
    if token is not None:
        req.add_header("X-SLURM-USER-TOKEN", token)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_delete_leaves_nothing_on_any_host(lab: Lab) -> None:
    lab.hp("delete", NAME, check=True)
    for i in (1, 2, 3):
        assert lab.labelled(i, NAME) == {"containers": [], "networks": [], "volumes": []}, i
    lab.made.remove(NAME)


def test_the_other_slurm_release_runs_across_the_hosts(lab: Lab, tmp_path: Path) -> None:
    """Several hosts on the release the rest of the module does not run (issue 48: every
    feature on both releases); its images streamed to each host as the default's were. Then,
    from the older release, `hp upgrade` of that cluster across the hosts."""
    other = next(r for r in SlurmRelease if r is not slurm_release()).value
    hp, name = lab.hp, "mhother"
    lab.made.append(name)
    t0 = time.monotonic()
    hp(
        "create",
        "-f",
        str(write_spec(tmp_path / "o.json", spec(name, 3))),
        "--slurm",
        other,
        "--timeout",
        "300",
        check=True,
    )
    took = time.monotonic() - t0
    hosts = {v["Host"] for n, v in lab.nodes(name).items() if n.startswith("cpu")}
    assert len(hosts) >= 2, hosts
    r = hp("exec", name, "--", "srun", "-N3", "hostname", check=True)
    assert len(set(r.stdout.split())) == 3, r.stdout
    versions = hp("exec", name, "--", "scontrol", "show", "nodes", check=True).stdout
    found = re.findall(r"Version=(\d+\.\d+)", versions)
    assert found and set(found) == {other}, found
    assert hp.json("describe", name)["SlurmVersion"] == other
    # hp upgrade across the hosts, where the other release is the older one (24.11 -> 26.05)
    newer = max((r.value for r in SlurmRelease), key=lambda r: tuple(map(int, r.split("."))))
    if other != newer:
        t1 = time.monotonic()
        hp("upgrade", name, "--slurm", newer, "--batch-size", "3", "--wait", timeout=600, check=True)
        up = time.monotonic() - t1
        found = re.findall(r"Version=(\d+\.\d+)", hp("exec", name, "--", "scontrol", "show", "nodes").stdout)
        assert found and set(found) == {newer}, found
        r = hp("exec", name, "--", "srun", "-N3", "hostname", check=True)
        assert len(set(r.stdout.split())) == 3, r.stdout
        assert {v["Host"] for n, v in lab.nodes(name).items() if n.startswith("cpu")} == hosts  # stayed placed
        print(f"\nhp upgrade {other} -> {newer} over {len(hosts)} hosts: {up:.1f} s")
    hp("delete", name, check=True)
    for i in (1, 2, 3):
        assert lab.labelled(i, name) == {"containers": [], "networks": [], "volumes": []}, i
    lab.made.remove(name)
    print(f"\nSlurm {other} over {len(hosts)} hosts: create of 1+1+3 (its images streamed) {took:.1f} s")
