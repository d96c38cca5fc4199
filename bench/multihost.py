"""A cluster over three Docker hosts vs the same cluster on one of them, and losing a host.

    .venv/bin/python bench/multihost.py [--compute 12] [--runs 2] [--json FILE] [--write-docs]

Hosts are Docker-in-Docker containers (tests/hosts/dind.py; names start with
HP_DIND_PREFIX, default hpdind-), removed at the end, also on failure.

1. Images: the node images streamed from the local engine to the three hosts (one save,
   fanned out; timed once, then present: the creates below start with them in place).
2. Create of 1 controller + 1 login + N compute (cpu.nano): over the three hosts (hosts
   registered: swarm overlay, GlusterFS /home, placement) against the same spec on host 1
   alone (no host registered, DOCKER_HOST=host 1: hp as on one engine), alternately,
   `--runs` times each; the medians and their ratio (target <= 1.3), with hp's per-stage
   split (images check, network, controller, nodes, wait) of each.
   And Docker's own floor for the same: N+1 containers (the worker image, `sleep`)
   created and started on an attachable overlay over the three hosts vs a bridge on
   host 1 (docker-py straight, no hp).
3. `docker kill` of host 3 with the three-host cluster up: seconds until every node that
   was there is idle in Slurm on hosts 1 and 2 (target <= 15 s), split into detection
   (kill -> the host watcher declares the host lost), replacement (-> the new containers
   made and started) and registration (-> idle in Slurm), read on the controller; and
   beside it the user's view: `hp nodes --json` in a loop (the slowest call: target
   <= 3 s) until those nodes are idle on hosts 1 and 2, then `hp exec -- srun -N<N>`
   (seconds from the kill: target <= 20 s).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import benchdocs
from hosts.dind import Harness  # noqa: E402

from orchestrator.slurm.model import parse_nodes  # noqa: E402
from orchestrator.state.store import Store  # noqa: E402

CPUS, MEMORY_MIB = 4, 8192
STAGE = re.compile(r"^\[\s*([\d.]+)s\] (\w[\w-]*):")


def hp(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if r.returncode != 0:
        raise SystemExit(f"hp {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def spec(name: str, compute: int) -> dict[str, Any]:
    def g(n: str, t: str, c: int, nt: str) -> dict[str, Any]:
        d = {"InstanceGroupName": n, "InstanceType": t, "InstanceCount": c, "SlurmConfig": {"NodeType": nt}}
        if nt == "Compute":
            d["SlurmConfig"]["PartitionNames"] = [n]
        return d

    return {
        "ClusterName": name,
        "NodeRecovery": "Automatic",
        "InstanceGroups": [
            g("controller", "cpu.small", 1, "Controller"),
            g("login", "cpu.nano", 1, "Login"),
            g("cpu", "cpu.nano", compute, "Compute"),
        ],
    }


def stages(stderr: str, total: float) -> dict[str, float]:
    """hp create's progress lines -> seconds spent in each stage (in order)."""
    marks: list[tuple[str, float]] = []
    for line in stderr.splitlines():
        m = STAGE.match(line)
        if m and (not marks or marks[-1][0] != m.group(2)):
            marks.append((m.group(2), float(m.group(1))))
    out: dict[str, float] = {}
    for (name, t), nxt in zip(marks, [*marks[1:], ("end", total)], strict=True):
        out[name] = round(out.get(name, 0.0) + nxt[1] - t, 2)
    return out


def create(env: dict[str, str], name: str, compute: int, tmp: Path) -> tuple[float, dict[str, float]]:
    f = tmp / f"{name}.json"
    f.write_text(json.dumps(spec(name, compute)))
    t0 = time.monotonic()
    r = hp(env, "create", "-f", str(f), "--timeout", "300")
    took = time.monotonic() - t0
    return took, stages(r.stderr, took)


def floor(harness: Harness, hosts: list[Any], n: int, runs: int) -> dict[str, Any]:
    """Create+start of n containers: overlay over the hosts vs bridge on host 1 (Docker alone)."""
    from concurrent.futures import ThreadPoolExecutor

    import docker

    from orchestrator.docker.engine import DockerEngine
    from orchestrator.docker.images import Images
    from orchestrator.releases import DEFAULT

    image = Images(DockerEngine(), DEFAULT).refs()["worker"]  # what the clusters above ran (on every host now)
    apis = [docker.APIClient(base_url=h.url, version="auto") for h in hosts]

    def run(a: Any, name: str, net: str) -> tuple[Any, str]:
        hc = a.create_host_config(network_mode=net, init=True, nano_cpus=50_000_000, mem_limit=256 << 20)
        nc = a.create_networking_config({net: a.create_endpoint_config(aliases=[name])})
        cid = a.create_container(
            image, ["sleep", "600"], name=name, hostname=name, host_config=hc, networking_config=nc
        )
        a.start(cid["Id"])
        return a, cid["Id"]

    out: dict[str, list[float]] = {"overlay_3_hosts_s": [], "bridge_host_1_s": []}
    for r in range(runs):
        for key, net, spread in (
            ("bridge_host_1_s", f"{harness.prefix}fb{r}", False),
            ("overlay_3_hosts_s", f"{harness.prefix}fo{r}", True),
        ):
            if spread:
                apis[0].create_network(net, driver="overlay", attachable=True)
            else:
                apis[0].create_network(net, driver="bridge")
            t0 = time.monotonic()
            targets = [(apis[i % 3] if spread else apis[0], f"{net}-{i}", net) for i in range(n)]
            with ThreadPoolExecutor(16) as ex:
                made = list(ex.map(lambda t: run(*t), targets))
            out[key].append(round(time.monotonic() - t0, 2))
            for a, cid in made:
                a.remove_container(cid, force=True)
            for _ in range(60):
                try:
                    apis[0].remove_network(net)
                    break
                except docker.errors.APIError:
                    time.sleep(0.5)
    o, b = statistics.median(out["overlay_3_hosts_s"]), statistics.median(out["bridge_host_1_s"])
    return {**out, "ratio": round(o / b, 3)}


def users_view(env: dict[str, str], name: str, lost: list[str], compute: int, t0: float, out: dict[str, Any]) -> None:
    """As a user would: `hp nodes --json` in a loop (each call timed) until the lost nodes
    are idle on hosts 1 and 2, then `hp exec -- srun -N<compute> hostname`; seconds from
    the kill (t0, time.time())."""
    calls: list[float] = []
    try:
        while time.time() - t0 < 90:
            t = time.monotonic()
            r = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "nodes", name, "--json"],
                env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            calls.append(time.monotonic() - t)
            if r.returncode == 0:
                n = {x["SlurmNodeName"]: x for x in json.loads(r.stdout)["ClusterNodeSummaries"]}
                if all(n.get(x, {}).get("Host") in ("h1", "h2") and n[x]["SlurmState"] == "idle" for x in lost):
                    break
            time.sleep(0.2)
        out["hp_nodes_idle_s"] = round(time.time() - t0, 2)
        hp(env, "exec", name, "--", "srun", f"-N{compute}", "hostname", timeout=120)
        out["srun_all_s"] = round(time.time() - t0, 2)
    finally:
        out["hp_nodes_calls"] = len(calls)
        out["hp_nodes_slowest_s"] = round(max(calls, default=0.0), 2)


def kill_host(harness: Harness, env: dict[str, str], home: Path, name: str, compute: int) -> dict[str, Any]:
    store = Store(home)
    user: dict[str, Any] = {}
    try:
        placed = store.node_hosts(name)
        lost = sorted(n for n, h in placed.items() if h == "h3" and n.startswith("cpu"))
        host1 = harness.host_name(1)
        ctl = f"hp-{name}-controller-1"
        t0 = time.time()
        harness.kill(harness.host_name(3))
        watcher = threading.Thread(target=users_view, args=(env, name, lost, compute, t0, user), daemon=True)
        watcher.start()
        moved_at = None
        while time.time() - t0 < 90:
            placed = store.node_hosts(name)
            if all(placed.get(n) in ("h1", "h2") for n in lost):
                moved_at = moved_at or time.time()
                c = harness.client(host1)
                try:
                    res = c.containers.get(ctl).exec_run(["scontrol", "show", "nodes", "--json"])
                finally:
                    c.close()
                idle = {n.name for n in parse_nodes(res.output.decode()) if n.usable} if res.exit_code == 0 else set()
                if set(lost) <= idle:
                    break
            time.sleep(0.1)
        else:
            raise SystemExit(f"nodes {lost} not idle on hosts 1 and 2 within 90 s")
        total = time.time() - t0
        events = store.events(name, limit=1000)
        lost_at = min((e.time for e in events if "is lost with its host h3" in (e.description or "")), default=None)
        replaced_at = max((e.time for e in events if "was replaced by" in (e.description or "")), default=None)
        watcher.join(150)
    finally:
        store.close()
    split = {}
    if lost_at:
        split["detect_s"] = round(lost_at - t0, 2)
    if lost_at and moved_at:
        split["place_and_create_s"] = round(moved_at - lost_at, 2)
    if replaced_at:
        split["replaced_event_s"] = round(replaced_at - t0, 2)
    return {"nodes": lost, "kill_to_idle_s": round(total, 2), "split": split, "user": user}


def stop_agents(env: dict[str, str] | None, home: Path) -> None:
    """Delete what is left of the bench's clusters (their agents stop with them)."""
    if env is None or not (home / "hp.db").exists():
        return
    store = Store(home)
    try:
        names = [c.name for c in store.clusters()]
    finally:
        store.close()
    for n in names:
        subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "delete", n], env=env, cwd=ROOT, capture_output=True, timeout=120
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compute", type=int, default=12)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--json", type=Path)
    benchdocs.add_option(ap)
    args = ap.parse_args()
    with benchdocs.section("multihost", args.write_docs):
        measure(args)
    return 0


def measure(args: argparse.Namespace) -> None:
    harness = Harness()
    tmp = Path(tempfile.mkdtemp(prefix="hp-bench-mh-"))
    multi_home, one_home = tmp / "multi", tmp / "one"
    base = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    multi_env = {**base, "HP_HOME": str(multi_home)}
    out: dict[str, Any] = {"compute": args.compute, "runs": args.runs}
    try:
        t0 = time.monotonic()
        hosts = harness.start(3)
        out["hosts_start_s"] = round(time.monotonic() - t0, 2)
        one_env = {**base, "HP_HOME": str(one_home), "DOCKER_HOST": hosts[0].url}
        for i, h in enumerate(hosts, 1):
            hp(multi_env, "hosts", "add", f"h{i}", "--docker-host", h.url, "--cpus", str(CPUS), "--memory-mib",
               str(MEMORY_MIB), "--advertise-addr", h.ip)  # fmt: skip
        # 1. images on every host (what the first create on new hosts pays once)
        t0 = time.monotonic()
        took, st = create(multi_env, "mhwarm", 1, tmp)
        out["first_create_with_images_s"] = round(took, 2)
        out["images_to_3_hosts_s"] = st.get("images")
        hp(multi_env, "delete", "mhwarm")
        # 2. the same cluster over three hosts and on host 1 alone, alternately
        multi, one = [], []
        for run in range(args.runs):
            for label, env, acc in (("one", one_env, one), ("multi", multi_env, multi)):
                name = f"mhb{label}{run}"
                took, st = create(env, name, args.compute, tmp)
                acc.append((took, st))
                print(f"create {label} run {run + 1}: {took:.2f} s {st}", file=sys.stderr)
                if not (label == "multi" and run == args.runs - 1):
                    hp(env, "delete", name)
        m_med = statistics.median(t for t, _ in multi)
        o_med = statistics.median(t for t, _ in one)
        out["create"] = {
            "multi_s": [round(t, 2) for t, _ in multi],
            "one_host_s": [round(t, 2) for t, _ in one],
            "multi_median_s": round(m_med, 2),
            "one_host_median_s": round(o_med, 2),
            "ratio": round(m_med / o_med, 3),
            "multi_stages": multi[-1][1],
            "one_host_stages": one[-1][1],
        }
        out["docker_floor"] = floor(harness, hosts, args.compute + 1, args.runs)
        # 3. docker kill of host 3 with the three-host cluster up
        name = f"mhbmulti{args.runs - 1}"
        out["kill"] = kill_host(harness, multi_env, multi_home, name, args.compute)
        out["host3_back_s"] = round(harness.restart(harness.host_name(3)), 2)
        time.sleep(3)
        hp(multi_env, "delete", name)
    finally:
        for env, home in ((multi_env, multi_home), (one_env if "one_env" in locals() else None, one_home)):
            stop_agents(env, home)
        harness.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    c = out.get("create", {})
    k = out.get("kill", {})
    print(json.dumps(out, indent=2))
    print(
        f"create 1+1+{args.compute}: 3 hosts {c.get('multi_median_s')} s vs host 1 alone {c.get('one_host_median_s')} s "
        f"-> ratio {c.get('ratio')} (target <= 1.3; Docker alone, {args.compute + 1} containers on an overlay over 3 "
        f"hosts vs a bridge on 1: {out.get('docker_floor', {}).get('ratio')}); docker kill of host 3 -> its nodes idle elsewhere "
        f"{k.get('kill_to_idle_s')} s in Slurm on the controller (target <= 15 s) {k.get('split')}; as the user "
        f"sees it: idle in hp nodes at {k.get('user', {}).get('hp_nodes_idle_s')} s (slowest of "
        f"{k.get('user', {}).get('hp_nodes_calls')} calls {k.get('user', {}).get('hp_nodes_slowest_s')} s, target "
        f"<= 3 s), srun -N{args.compute} done at {k.get('user', {}).get('srun_all_s')} s (target <= 20 s)"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
