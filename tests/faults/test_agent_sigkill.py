"""SIGKILL of the cluster's agent at random moments of create, scale-up, scale-down,
delete-nodes and the on-start health checks (the agent runs those), and of an on-demand
health check's worker. Seeded and printed, so a failure can be replayed:

    HP_FAULT_SEED=1234 make faults          # replay
    HP_FAULT_POINTS=200 make faults         # the long campaign
    HP_FAULT_CLUSTERS=1 make faults         # one cluster at a time (default: 3 side by side)

After every point the cluster must converge: no duplicate, no leak, Slurm matching
Docker, every node Running (tests/faults/invariants.py). Convergence times are printed.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

from conftest import small_spec, write_spec
from invariants import converge, kill_agent, summary

POINTS = int(os.environ.get("HP_FAULT_POINTS", "20"))
SEED = int(os.environ.get("HP_FAULT_SEED", str(int(time.time()) % 100000)))
# The points are shared out over this many clusters, run side by side: a point mostly
# waits (the machine's load stays under one core), so side-by-side campaigns take little more
# than one. Each cluster's sequence of operations and kill delays is seeded. Measured once on
# the 2-core VM with seed 54763 (the points share out differently): 376 s over two clusters,
# 220 s over three, with no slower convergence per point (median 30.2 s and 18.8 s).
CLUSTERS = int(os.environ.get("HP_FAULT_CLUSTERS", "3"))
# After its create, each cluster's points take their kinds from this cycle, in a seeded
# order: every kind in every campaign, and no seed that is minutes slower than another (a
# free draw gave 2 to 7 on-start points of about 58 s each: the campaign took 256 s with
# seed 48194 and 376 s with seed 54763 over two clusters).
KINDS = ("scale-up", "scale-down", "delete-nodes", "on-start", "scale-up", "scale-down")


def campaign(hp, tmp_path, k: int, points: int, out: list[str], times: dict[str, list[float]]) -> None:
    rnd = random.Random(SEED * 100 + k)
    name = hp.name(f"fk{k}")
    doc = small_spec(
        name, [("cpu", "cpu.nano", 2), ("chk", "cpu.nano", 0)], login=False, NodeProvisioningMode="Continuous"
    )
    doc["InstanceGroups"][0]["InstanceType"] = "cpu.nano"
    doc["InstanceGroups"][2]["OnStartDeepHealthChecks"] = ["InstanceStress"]
    spec = write_spec(tmp_path / f"s{k}.json", doc)

    def point(i: int, what: str, act) -> None:
        delay = rnd.uniform(0.0, 2.5)
        t0 = time.monotonic()
        act()
        time.sleep(delay)
        killed = kill_agent(hp, name)
        took = converge(hp, name, timeout=150)
        times.setdefault(what, []).append(took)
        line = (
            f"cluster {k} point {i:3d} {what:<14} kill after {delay:4.2f} s (agent pid {killed}): "
            f"converged in {took:5.1f} s ({time.monotonic() - t0:5.1f} s in all)"
        )
        out.append(line)
        print(line, file=sys.stderr)

    point(0, "create", lambda: hp("create", "-f", str(spec), "--no-wait", "--timeout", "120", check=True))
    counts = {"cpu": 2, "chk": 0}
    kinds = [KINDS[j % len(KINDS)] for j in range(points - 1)]
    rnd.shuffle(kinds)
    for i, kind in enumerate(kinds, start=1):
        if kind == "scale-up" or (kind in ("scale-down", "delete-nodes") and counts["cpu"] <= 1):
            counts["cpu"] = min(counts["cpu"] + rnd.randint(1, 3), 6)
            point(i, "scale-up", lambda: hp("scale", name, "cpu", str(counts["cpu"]), check=True))
        elif kind == "scale-down":
            counts["cpu"] = max(counts["cpu"] - rnd.randint(1, 2), 1)
            point(i, "scale-down", lambda: hp("scale", name, "cpu", str(counts["cpu"]), check=True))
        elif kind == "delete-nodes":
            nodes = sorted(n["SlurmNodeName"] for n in hp.json("nodes", name, "--group", "cpu")["ClusterNodeSummaries"])
            victim = rnd.choice(nodes)
            counts["cpu"] -= 1
            point(i, "delete-nodes", lambda victim=victim: hp("delete-nodes", name, victim, check=True))
        else:
            counts["chk"] = 1 if counts["chk"] == 0 else 0
            point(i, "on-start", lambda: hp("scale", name, "chk", str(counts["chk"]), check=True))


def test_agent_sigkill_at_random_moments(hp, tmp_path):
    n = max(1, min(CLUSTERS, POINTS))
    print(
        f"\nfault campaign: seed {SEED}, {POINTS} points over {n} clusters (replay: HP_FAULT_SEED={SEED})",
        file=sys.stderr,
    )
    lines: list[str] = []
    times: dict[str, list[float]] = {}
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            campaign(hp, tmp_path, k, POINTS // n + (1 if k < POINTS % n else 0), lines, times)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,), name=f"campaign-{k}") for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    every = [t for v in times.values() for t in v]
    out = [summary("all", every)] + [summary(k, v) for k, v in sorted(times.items())]
    print("\n".join(out), file=sys.stderr)
    (tmp_path.parent / f"faults-sigkill-{SEED}.txt").write_text("\n".join(lines + out) + "\n")
    assert len(every) == POINTS


def test_health_check_worker_sigkill_hands_nodes_back(hp, tmp_path):
    """An on-demand check's worker killed mid-check: the request is Failed and its nodes
    are back in service (no node stays drained by a dead request)."""
    import signal

    name = hp.name("fh")
    doc = small_spec(name, [("cpu", "cpu.nano", 2)], login=False)
    doc["InstanceGroups"][0]["InstanceType"] = "cpu.nano"
    hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)), "--timeout", "120", check=True)
    rid = hp("health-check", "start", name, "--group", "cpu", "--stress-seconds", "5", check=True).stdout.strip()
    from orchestrator.health.requests.records import Records
    from orchestrator.state.store import Store

    deadline = time.monotonic() + 30
    while True:
        req = Records(Store(hp.home)).request(rid)
        if req.pid and req.state == "Running":
            break
        assert time.monotonic() < deadline, "the check never started"
        time.sleep(0.1)
    time.sleep(1.5)
    os.killpg(req.pid, signal.SIGKILL)
    st = hp.json("health-check", "status", name)["Request"]
    assert st["State"] == "Failed" and "died" in st["Message"], st
    took = converge(hp, name, timeout=60)
    print(f"\nhealth-check worker SIGKILL: converged in {took:.1f} s", file=sys.stderr)
