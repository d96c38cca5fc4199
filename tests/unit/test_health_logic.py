"""Pure logic of the deep health checks."""

from __future__ import annotations

import threading

import pytest

from orchestrator.docker.views import Limits as NodeLimits
from orchestrator.gpu.judge import Finding
from orchestrator.gpu.monitor import drain_reason
from orchestrator.health.requests.decisions import claim, implicated, ring_pairs, validate_checks
from orchestrator.health.tools.limits import CpuBudget, grant_problems, thresholds
from orchestrator.health.tools.stress import StressOptions, judge, split_output, vm_bytes_for
from orchestrator.health.tools.stress import stress_command as _stress_command
from orchestrator.slurm.model import (
    DELETING_REASON,
    ONSTART_REASON,
    REASON_PREFIX,
    REBOOTING_REASON,
    REMOVING_REASON,
    SlurmNode,
    is_gpu_monitor_reason,
)
from orchestrator.slurm.model import health_reason as reason
from orchestrator.slurm.model import is_health_reason as is_ours
from orchestrator.slurm.model import is_ours as is_hp_reason
from orchestrator.spec.catalogue import InstanceType
from orchestrator.verdict import Action

NANO = InstanceType("cpu.nano", 1, 0.05, 256, health={"IperfGbps": 0.2})


def stress_command(opts, cpus):
    """The command as the engine makes it without a reading of the cgroup."""
    return _stress_command(opts, cpus, vm_bytes_for(opts, None, 1)[0])


def test_limits_granted():
    assert NodeLimits(nano_cpus=50_000_000, memory_bytes=256 * 2**20).granted_cpus == 0.05
    lim = NodeLimits(cpu_quota=1000, cpu_period=100000, memory_bytes=40 * 2**20)
    assert lim.granted_cpus == 0.01 and lim.memory_mib == 40
    assert NodeLimits().granted_cpus is None and NodeLimits().memory_mib is None


def test_grant_problems_name_the_own_quota_and_memory():
    assert grant_problems(NANO, NodeLimits(nano_cpus=50_000_000, memory_bytes=256 * 2**20), 0.03) == []
    p = grant_problems(NANO, NodeLimits(nano_cpus=10_000_000, memory_bytes=40 * 2**20), 0.01)
    assert "throttled by the node's own cgroup quota" in p[0] and "memory limit is 40 MiB" in p[1]


def test_thresholds_overlay_defaults():
    th = thresholds(NANO)
    assert th["IperfGbps"] == 0.2 and th["StressCpuBogoOpsPerCpuSecond"] > 0


def test_cpu_budget_bounds_concurrency_by_host_cores():
    b = CpuBudget(2.0)
    b.acquire(1.5)
    assert not b.fits(1.0) and b.fits(0.5)
    got = threading.Event()
    t = threading.Thread(target=lambda: (b.acquire(1.0), got.set()))
    t.start()
    assert not got.wait(0.2)
    b.release(1.5)
    assert got.wait(2)
    t.join()
    big = CpuBudget(1.0)
    big.acquire(8.0)  # bigger than the host: admitted alone
    assert big.running == 1


def test_ring_pairs_and_blame():
    assert ring_pairs(["a"]) == [] and ring_pairs(["a", "b"]) == [("a", "b")]
    pairs = ring_pairs(["a", "b", "c"])
    assert pairs == [("a", "b"), ("b", "c"), ("c", "a")]
    ok = {("a", "b"): False, ("b", "c"): False, ("c", "a"): True}
    assert implicated(["a", "b", "c"], ok) == {"b"}
    assert implicated(["a", "b"], {("a", "b"): False}) == {"a", "b"}
    assert implicated(["a", "b", "c"], {p: False for p in pairs}) == {"a", "b", "c"}


def node(state, reason=""):
    return SlurmNode("cpu-1", tuple(state), reason)


def test_claim_never_takes_a_foreign_drain():
    assert claim(node(["IDLE"])).drain
    assert claim(node(["MIXED"])).drain  # drained now, checked once idle
    c = claim(node(["IDLE", "DRAIN"], "admin work"))
    assert not c.drain and "admin work" in c.skip_reason
    assert not claim(node(["IDLE", "DRAIN"], "admin work"), on_start=True).drain
    assert claim(node(["IDLE", "DRAIN"], "hp:health:r0:InstanceStress failed: x")).drain
    assert not claim(None).drain


def test_on_start_nodes_are_left_to_the_on_start_check():
    pending = node(["IDLE", "DRAIN"], ONSTART_REASON)
    c = claim(pending)
    assert not c.drain and "on-start" in c.skip_reason
    assert claim(pending, on_start=True).drain
    # a node an earlier on-start check failed is hp's to check again, by either kind
    assert claim(node(["IDLE", "DRAIN"], "hp:health:hc-1:InstanceStress failed: x"), on_start=True).drain


def test_idle_drained_and_reasons():
    assert node(["IDLE", "DRAIN"]).idle_drained
    assert not node(["MIXED", "DRAIN"]).idle_drained and not node(["IDLE"]).idle_drained
    r = reason("hc-1", "InstanceStress", "slow")
    assert r == "hp:health:hc-1:InstanceStress failed: slow" and is_ours(r, "hc-1") and not is_ours(r, "hc-2")


def test_one_prefix_tells_hps_reasons_from_an_admins_also_those_of_the_previous_version():
    ours = [reason("hc-1", "InstanceStress"), ONSTART_REASON, REMOVING_REASON, REBOOTING_REASON, DELETING_REASON]
    ours.append(drain_reason([Finding("xid-79", "fatal", Action.RECOVER, "XID 79")]))
    assert all(r.startswith(REASON_PREFIX) and is_hp_reason(r) for r in ours), ours
    assert not any(is_hp_reason(r) for r in ("admin work", "Not responding", "Action:Reboot", "hpc upgrade"))
    # a cluster created before one prefix: its drains stay hp's, read as what they became
    old = [
        "hp-health:hc-1:InstanceStress failed: x",
        "hp-health:on-start:pending",
        "hp-gpu:reboot:xid-79 X",
        "hp delete",
    ]
    assert all(is_hp_reason(r) for r in old)
    assert is_ours(old[0], "hc-1") and not is_ours(old[0], "hc-2") and is_gpu_monitor_reason(old[2])
    assert node(["IDLE", "DRAIN"], old[1]).awaiting_onstart and node(["IDLE", "DRAIN"], old[0]).failed_health_check
    assert node(["IDLE", "DRAIN"], old[2]).gpu_finding and not node(["IDLE", "DRAIN"], old[3]).admin_hold
    assert claim(node(["IDLE", "DRAIN"], old[0])).drain
    assert node(["IDLE", "DRAIN"], "admin work").admin_hold and node(["DOWN"], "hp-x").admin_hold
    assert validate_checks(["InstanceStress", "Nope"]) == [
        "unknown check 'Nope' (checks: InstanceStress, InstanceConnectivity)"
    ]


YAML = """metrics:
    - stressor: cpu
      bogo-ops: 139
      bogo-ops-per-second-usr-sys-time: 1488.7
      bogo-ops-per-second-real-time: 46.3
      wall-clock-time: 3.0
      user-time: 0.09
      system-time: 0.003
    - stressor: vm
      bogo-ops: {vm}
      bogo-ops-per-second-usr-sys-time: 3411.0
      bogo-ops-per-second-real-time: 84.4
      wall-clock-time: 3.6
      user-time: 0.006
      system-time: 0.083
"""


def out(vm: int, rc: int = 0) -> str:
    return f"stress-ng: info:  [8] dispatching hogs: 1 cpu, 1 vm\n@@HP-STRESS-YAML@@\n{YAML.format(vm=vm)}@@HP-STRESS-RC={rc}\n"


def test_stress_output_split_and_judged_per_cpu_second():
    log, yml, rc = split_output(out(304))
    assert rc == 0 and "dispatching" in log and "stressor: vm" in yml
    assert split_output("killed")[2] == -1
    v = judge(NANO, out(304), 0.05, [])
    assert v.passed, v.reasons
    bad = judge(NANO, out(0), 0.05, [])  # exit 0, but the memory stressor did nothing
    assert not bad.passed and any("vm did no work" in r for r in bad.reasons)
    argv = stress_command(StressOptions(), 0.05)
    assert "--verify" in argv and argv[argv.index("--cpu") + 1] == "1" and argv[0] == "/usr/local/bin/hp-stress"


def test_stress_options_are_validated_and_never_reach_a_shell():
    """The fault campaign's injection: a --vm-bytes that is a shell command is refused."""
    bad = StressOptions(vm_bytes="16M; echo INJECTED $(id -u) #")
    assert bad.problems() and "--vm-bytes must be a size" in bad.problems()[0]
    assert StressOptions(vm_bytes="64M").problems() == [] and StressOptions(vm_bytes="50%").problems() == []
    assert StressOptions(vm_bytes="1g").problems() == [] and StressOptions(vm_bytes="0M").problems()
    assert StressOptions(seconds=0).problems() and StressOptions(seconds=10**6).problems()
    # a value that slipped past the CLI (a recorded request) never runs
    with pytest.raises(ValueError):
        stress_command(StressOptions(vm_bytes="16M; echo x"), 1)


def test_concurrent_results_get_their_own_rows(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.state.health_requests import Records, Result
    from orchestrator.state.store import Store

    rec = Records(Store(tmp_path))
    rows = list(
        ThreadPoolExecutor(8).map(
            lambda i: rec.result("hc-1", "c", Result(f"cpu-{i}", "cpu", "InstanceStress", "initial", "Running")),
            range(16),
        )
    )
    assert len(set(rows)) == 16
    for i, row in enumerate(rows):
        rec.update(row, Result(f"cpu-{i}", "cpu", "InstanceStress", "initial", "Passed"))
    assert {r.state for r in rec.results("hc-1")} == {"Passed"}
