"""InstanceStress: stress-ng CPU and memory with verification, run in a node's check
container: its command (an argv list: user options never reach a shell), the parser of
its output and the verdict. Judged on bogo-ops per CPU-second (so a node that merely
waited for busy siblings is not blamed) and on what the node's own cgroup grants
against what its type promises."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from ...spec.catalogue import InstanceType
from ...verdict import ParseError, Verdict, num, verdict
from . import options
from .limits import thresholds

YAML_MARK = "@@HP-STRESS-YAML@@"
RC_MARK = "@@HP-STRESS-RC="
MEMORY_MARK, MEMORY_END = "@@HP-STRESS-MEMORY@@", "@@HP-STRESS-MEMORY-END@@"
WRAPPER = "/usr/local/bin/hp-stress"  # in the check image: stress-ng "$@", then its YAML, memory and exit status
MEMORY_COMMAND = [WRAPPER, "--memory"]  # the check container's cgroup memory (after a sync)
SIGKILL_EXIT = 128 + 9  # a shell's status of a process killed by SIGKILL (the OOM killer's signal)
# Room the memory stressor must leave in the check container's cgroup: stress-ng's parent
# and each stressor instance hold a few MiB each (measured RSS with stress-ng 0.18: parent
# 4 MiB, cpu instance 3 MiB, vm instance 3 MiB besides its --vm-bytes), and the kernel's
# own charges (page tables, slab) grow with the run.
HEADROOM_BYTES = 32 * 2**20
HEADROOM_PER_CPU_BYTES = 4 * 2**20
VM_MIN_BYTES = 4 * 2**20  # a smaller memory stressor proves nothing: the check cannot run
ROOM_TIMEOUT_S = 60  # room_command: what the kernel may take to reclaim before the run
# stress-ng maps a shared buffer the size of the last-level cache at start-up, whatever
# the stressors (for its cache stressor, not run here): on a host whose CPU reports a
# 300 MiB L3 (Xeon, 2026-12) that alone OOM-killed every check in a 256 MiB container.
# Both runs name a small one, so what a check charges is its stressors.
CACHE_SIZE = "64K"


@dataclass(frozen=True)
class CgroupMemory:
    """The check container's memory as its cgroup (v2 or v1) says, in bytes.

    limit: memory.max / memory.limit_in_bytes (None: no limit).
    usage: memory.current / memory.usage_in_bytes: everything charged, page cache too.
    file: page cache (v2 `file`, v1 `total_cache`); shmem (tmpfs, /dev/shm) is part of
        it and cannot be reclaimed without swap, page cache otherwise can.
    oom_kills: processes the OOM killer killed in the cgroup so far (v2
        memory.events oom_kill, v1 memory.oom_control oom_kill; None: not reported).
    host_available: /proc/meminfo MemAvailable (stress-ng's base for a percentage).
    """

    limit: int | None
    usage: int
    anon: int = 0
    file: int = 0
    shmem: int = 0
    dirty: int = 0
    oom_kills: int | None = None
    host_available: int | None = None

    @property
    def held(self) -> int:
        """What the cgroup holds that reclaim cannot free: usage less clean page cache."""
        return max(0, self.usage - max(0, self.file - self.shmem))

    def describe(self) -> str:
        lim = f"{self.limit / 2**20:.0f} MiB" if self.limit is not None else "none"
        return (
            f"memory limit {lim}, charged {self.usage / 2**20:.0f} MiB (page cache {self.file / 2**20:.0f} MiB, "
            f"anonymous {self.anon / 2**20:.0f} MiB, tmpfs {self.shmem / 2**20:.0f} MiB), "
            f"not reclaimable {self.held / 2**20:.0f} MiB"
        )


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip().split()[0])
    except (ValueError, IndexError):
        return None


def parse_cgroup_memory(out: str) -> CgroupMemory | None:
    """The section hp-stress prints between MEMORY_MARK and MEMORY_END (cgroup v2 or
    v1 files under "== name" headers), or None when there is none."""
    _, mark, rest = out.partition(MEMORY_MARK)
    if not mark:
        return None
    text = rest.partition(MEMORY_END)[0]
    files: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("== "):
            current = files.setdefault(line[3:].strip(), [])
        elif line.strip():
            current.append(line.strip())

    def kv(name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in files.get(name, []):
            k, _, v = line.partition(" ")
            if (n := _int(v)) is not None:
                out[k.rstrip(":")] = n
        return out

    meminfo = kv("meminfo")
    avail = meminfo.get("MemAvailable")
    host_available = avail * 1024 if avail is not None else None  # /proc/meminfo counts kB
    if "memory.current" in files:  # v2
        raw = (files.get("memory.max") or [""])[0]
        usage = _int((files["memory.current"] or [""])[0])
        stat = kv("memory.stat")
        return CgroupMemory(
            limit=None if raw == "max" else _int(raw),
            usage=usage or 0,
            anon=stat.get("anon", 0),
            file=stat.get("file", 0),
            shmem=stat.get("shmem", 0),
            dirty=stat.get("file_dirty", 0),
            oom_kills=kv("memory.events").get("oom_kill"),
            host_available=host_available,
        )
    if "memory.usage_in_bytes" in files:  # v1: an unlimited cgroup reports a huge limit
        limit = _int((files.get("memory.limit_in_bytes") or [""])[0])
        stat = kv("memory.stat")
        return CgroupMemory(
            limit=limit if limit is not None and limit < 2**62 else None,
            usage=_int((files["memory.usage_in_bytes"] or [""])[0]) or 0,
            anon=stat.get("total_rss", stat.get("rss", 0)),
            file=stat.get("total_cache", stat.get("cache", 0)),
            shmem=stat.get("total_shmem", stat.get("shmem", 0)),
            dirty=stat.get("total_dirty", stat.get("dirty", 0)),
            oom_kills=kv("memory.oom_control").get("oom_kill"),
            host_available=host_available,
        )
    return None


def vm_bytes_for(opts: StressOptions, mem: CgroupMemory | None, cpus: int) -> tuple[int | str | None, str]:
    """The memory stressor's bytes from what the check container really has: the asked
    size (a percentage is of the host's available memory, as stress-ng takes it), at most
    half of what the cgroup can still give (its limit less what it holds that cannot be
    reclaimed, less room for stress-ng's own processes). (None, why) when that is too
    little for a memory stressor to prove anything: the check cannot run. Without a
    reading of the cgroup (an older check image) the asked size as stress-ng takes it.
    ValueError on options that are not valid (a recorded request is checked where it runs)."""
    if bad := opts.problems():
        raise ValueError("; ".join(bad))
    kind, n = options.parse_size(opts.vm_bytes)  # type: ignore[misc]
    if kind == "percent":
        base = mem.host_available if mem is not None and mem.host_available else None
        want = int(n / 100 * base) if base else None
    else:
        want = int(n)
    if mem is None or mem.limit is None:
        return (want if want is not None else opts.vm_bytes), ""
    room = mem.limit - mem.held - HEADROOM_BYTES - HEADROOM_PER_CPU_BYTES * cpus
    fit = room // 2
    if fit < VM_MIN_BYTES:
        return None, (
            f"the check container has no room for a memory stressor: {mem.describe()}; "
            f"{max(0, room) / 2**20:.0f} MiB left after stress-ng's own {(HEADROOM_BYTES + HEADROOM_PER_CPU_BYTES * cpus) / 2**20:.0f} MiB"
        )
    if want is None or want > fit:
        return fit, f"memory stressor cut to {fit / 2**20:.0f} MiB (asked {opts.vm_bytes}): {mem.describe()}"
    return want, ""


def room_command(vm_bytes: int | str | None, mem: CgroupMemory | None, cpus: int) -> list[str] | None:
    """A stress-ng run, outside the timed one, that takes at once what the timed run will
    charge (the memory stressor and a stressor instance's room per CPU), so that the
    kernel reclaims the cgroup's page cache before the check starts its clock; None when
    the cgroup has that room free already (or no limit, no reading, a percentage).

    Measured on this 2-core host (cgroup v1, kernel 6.18, cpu.nano: 0.05 CPU, 256 MiB
    holding 200 MiB of clean page cache): in about 1 run in 20 under load the memory
    stressor's first pass reclaimed in the kernel for the whole run (vm: 0 bogo-ops, 0.36 s
    of sys time, 8.2 s for a 2 s run), so a healthy node failed InstanceStress. Taking the
    room first costs about 2 s at 0.05 CPU, only where the cache must be reclaimed."""
    if mem is None or mem.limit is None or not isinstance(vm_bytes, int):
        return None
    size = vm_bytes + HEADROOM_PER_CPU_BYTES * cpus
    if mem.limit - mem.usage >= size + HEADROOM_BYTES:
        return None
    return [
        "stress-ng",
        "--vm",
        "1",
        "--vm-bytes",
        str(size),
        "--vm-populate",
        "--vm-ops",
        "1",
        "--cache-size",
        CACHE_SIZE,
        "--timeout",
        f"{ROOM_TIMEOUT_S}s",
        "--quiet",
    ]


@dataclass(frozen=True)
class StressOptions:
    seconds: int = 3
    vm_bytes: str = "64M"

    def problems(self) -> list[str]:
        """Every problem with the options (a size must be a size: 64M, 1.5G, 5%)."""
        return options.int_problems(
            "--stress-seconds", self.seconds, *options.STRESS_SECONDS
        ) + options.vm_bytes_problems(self.vm_bytes)


def cpu_instances(cpus: float | None) -> int:
    """One CPU stressor per granted CPU, at least one."""
    return max(1, math.ceil(cpus or 1))


def stress_command(opts: StressOptions, cpus: float | None, vm_bytes: int | str) -> list[str]:
    """stress-ng with one CPU stressor per granted CPU (at least one) and one memory
    stressor of `vm_bytes` (vm_bytes_for: sized from the check container's memory),
    verifying results; the wrapper prints its log, then its YAML metrics, the cgroup's
    memory and exit status. An argv list, the size as plain digits; ValueError on a
    value that is not valid (a recorded request is checked again where it runs)."""
    if bad := opts.problems():
        raise ValueError("; ".join(bad))
    if isinstance(vm_bytes, str):  # a percentage, as asked (checked by opts.problems)
        kind, n = options.parse_size(vm_bytes)  # type: ignore[misc]
        size = f"{int(n)}%" if kind == "percent" else str(int(n))
    elif options.VM_BYTES_MIN <= vm_bytes <= options.VM_BYTES_MAX:
        size = str(int(vm_bytes))
    else:
        raise ValueError(f"a memory stressor of {vm_bytes} bytes is out of stress-ng's range")
    cpu = cpu_instances(cpus)
    return [
        WRAPPER,
        "--cpu",
        str(cpu),
        "--vm",
        "1",
        "--vm-bytes",
        size,
        "--verify",
        "--metrics-brief",
        "--cache-size",
        CACHE_SIZE,
        "--timeout",
        f"{int(opts.seconds)}s",
    ]


def split_output(out: str) -> tuple[str, str, int]:
    """(log, yaml, stress-ng exit status) from the output of stress_command."""
    log, _, rest = out.partition(YAML_MARK)
    yml, _, rc = rest.rpartition(RC_MARK)
    yml = yml.partition(MEMORY_MARK)[0]
    try:
        code = int(rc.strip().split()[0])
    except (ValueError, IndexError):
        code = -1  # the wrapper itself was killed (e.g. out of memory)
    return log, yml, code


def killed_by_kernel(code: int, wrapper_exit: int, before: CgroupMemory | None, after: CgroupMemory | None) -> str:
    """Why a stress run says nothing about the node, or "": stress-ng (or the wrapper)
    was killed by SIGKILL, or the OOM killer killed a process of the check container
    while it ran (stress-ng restarts a killed stressor and may still exit 0). The
    kernel does that when the cgroup runs out of memory: the check's own sizing, not
    the node's health."""
    kills = (
        after.oom_kills - before.oom_kills
        if before is not None and after is not None and before.oom_kills is not None and after.oom_kills is not None
        else None
    )
    if code == SIGKILL_EXIT:
        what = f"stress-ng exited {code}: {stress_ng_exit_reason(code)}"
    elif code == -1 and wrapper_exit != 0:
        what = f"the check's wrapper was killed (exit {wrapper_exit})"
    elif kills:
        what = f"stress-ng exited {code}"
    else:
        return ""
    oom = f"; the OOM killer killed {kills} process(es) in the check container" if kills else ""
    mem = f"; before the run: {before.describe()}" if before is not None else ""
    return f"the check could not run: {what}{oom}{mem}"


def judge(
    itype: InstanceType,
    out: str,
    granted_cpus: float | None,
    limits_problems: list[str],
    before: CgroupMemory | None = None,
    wrapper_exit: int = 0,
) -> Verdict:
    """The verdict on a stress run's output (a ParseError of unreadable output is a
    failed check: the tool ran and produced garbage). A run the kernel killed is no
    verdict (Verdict.not_run): `before` is the cgroup's memory before it."""
    log, yml, code = split_output(out)
    if why := killed_by_kernel(code, wrapper_exit, before, parse_cgroup_memory(out)):
        return Verdict(False, [why], {"exit_code": float(code)}, not_run=why)
    th = thresholds(itype)
    try:
        res = parse_stress_ng(yml, log)
    except ParseError as e:
        return Verdict(False, [f"stress-ng output unreadable: {e}"], {"exit_code": float(code)})
    v = judge_stress(
        res,
        code,
        {"cpu": th["StressCpuBogoOpsPerCpuSecond"], "vm": th["StressVmBogoOpsPerCpuSecond"]},
        per="cpu",
        granted_cpus=granted_cpus,
    )
    v.reasons += limits_problems
    v.passed = not v.reasons
    return v


# --------------------------------------------------------------------------
# stress-ng
# --------------------------------------------------------------------------

STRESS_NG_EXIT_CODES: Mapping[int, str] = {
    0: "success",
    1: "bad options or usage error",
    2: "one or more stressors failed",
    3: "a stressor could not initialise its resources (e.g. out of memory)",
    4: "a stressor is not implemented on this system",
    5: "killed by a signal",
    6: "no bogo-op metrics were produced",
    7: "metrics untrustworthy (bogo-op counters corrupted)",
}


def stress_ng_exit_reason(exit_code: int) -> str:
    if exit_code in STRESS_NG_EXIT_CODES:
        return STRESS_NG_EXIT_CODES[exit_code]
    if exit_code > 128:
        return f"terminated by signal {exit_code - 128}"
    return f"unexpected exit status {exit_code}"


@dataclass(frozen=True)
class StressMetric:
    """One stressor's metrics as stress-ng reports them, all instances together.

    bogo_ops: bogo operations done by all instances.
    wall_s: wall-clock run time ("real time"; the instances' mean).
    usr_s, sys_s: user and system CPU time, summed over instances.
    reported_per_s_real: stress-ng's "bogo ops/s (real time)" = bogo_ops / wall_s.
    reported_per_s_cpu: stress-ng's "bogo ops/s (usr+sys time)"; None if absent.
    cpu_usage_pct_per_instance: CPU use of one instance in % of one CPU; None
        when only the log was available.
    instances: instance count from the log ("dispatching hogs: 2 cpu") or
        derived from cpu-usage-per-instance; None when unknown.

    Derived:
    cpu_s: usr_s + sys_s, the CPU time the stressor actually got.
    per_wall_s: bogo-ops per wall second: what the node delivered.
    per_cpu_s: bogo-ops per CPU second: how fast the CPU was while it ran.
    cpus_used: cpu_s / wall_s, CPUs the stressor occupied on average.

    A stressor that got less CPU than it asked for (a cgroup quota below its
    instance count, or CPUs shared with sibling containers) has a low
    per_wall_s but a normal per_cpu_s; a slow or sick CPU has both low.
    """

    stressor: str
    bogo_ops: float
    wall_s: float
    usr_s: float
    sys_s: float
    reported_per_s_real: float
    reported_per_s_cpu: float | None = None
    cpu_usage_pct_per_instance: float | None = None
    instances: int | None = None

    @property
    def cpu_s(self) -> float:
        return self.usr_s + self.sys_s

    @property
    def per_wall_s(self) -> float:
        return self.bogo_ops / self.wall_s if self.wall_s > 0 else self.reported_per_s_real

    @property
    def per_cpu_s(self) -> float:
        if self.cpu_s > 0:
            return self.bogo_ops / self.cpu_s
        return self.reported_per_s_cpu or 0.0

    @property
    def cpus_used(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class StressResult:
    """Parsed stress-ng run.

    metrics: per stressor, in output order (from the YAML; from the log's
        "metrc:" lines when the YAML has none).
    version: stress-ng version from the YAML system-info, else None.
    instances: per stressor, from the log's "dispatching hogs:" line.
    passed, failed, skipped, untrustworthy: stressor names from the log's
        summary lines (stress-ng >= 0.16 prints them; older ones do not).
    fail_lines: log lines at level "fail" or "error" (verification failures,
        corrupted counters, ...), without the "stress-ng: fail: [pid]" prefix.
    completed: True for "successful run completed", False for
        "unsuccessful run completed", None when neither line is present.
    other_lines: log lines without the "stress-ng: level: [pid]" prefix, such
        as option errors ("cpu-method must be one of: ...").
    """

    metrics: dict[str, StressMetric] = field(default_factory=dict)
    version: str | None = None
    instances: dict[str, int] = field(default_factory=dict)
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    untrustworthy: list[str] = field(default_factory=list)
    fail_lines: list[str] = field(default_factory=list)
    completed: bool | None = None
    other_lines: list[str] = field(default_factory=list)


_SNG_LOG = re.compile(r"^stress-ng:\s*([\w-]+):\s*\[\d+\]\s?(.*)$")
_SNG_SUMMARY = re.compile(r"^(passed|failed|skipped|metrics untrustworthy):\s*(\d+)(?::\s*(.*))?$")
_SNG_NAMES = re.compile(r"([\w-]+) \(\d+\)")
_SNG_SECTION = re.compile(r"^([A-Za-z][\w-]*):\s*$")
_SNG_KV = re.compile(r"^\s*(?:-\s+)?([\w-]+):\s*(.*?)\s*$")


def _yaml_metric_items(yaml_text: str) -> tuple[list[dict[str, str]], str | None]:
    """The ``metrics:`` list and stress-ng-version of a stress-ng YAML file.

    Read line by line rather than with a YAML library: stress-ng 0.19.02
    writes ``source-date-epoch:`` unindented inside build-info, which makes
    the file invalid YAML (see tests/fixtures/stress-ng-pass.yaml).
    """
    items: list[dict[str, str]] = []
    version = None
    section = ""
    for line in yaml_text.splitlines():
        if line.strip() in ("---", "..."):
            section = ""
            continue
        if m := _SNG_SECTION.match(line):
            section = m.group(1)
            continue
        m = _SNG_KV.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2).strip("'\"")
        if section == "system-info" and key == "stress-ng-version":
            version = value
        elif section == "metrics":
            if key == "stressor" and line.lstrip().startswith("-"):
                items.append({})
            if items:
                items[-1][key] = value
    return items, version


def _metric_from_yaml(item: dict[str, str], instances: int | None) -> StressMetric | None:
    name = item.get("stressor")
    ops = num(item.get("bogo-ops"))
    if not name or ops is None:
        return None
    wall = num(item.get("wall-clock-time")) or 0.0
    usr = num(item.get("user-time")) or 0.0
    sys_ = num(item.get("system-time")) or 0.0
    pct = num(item.get("cpu-usage-per-instance"))
    if instances is None and pct and wall > 0:
        instances = max(1, round((usr + sys_) / wall * 100.0 / pct))
    return StressMetric(
        stressor=name,
        bogo_ops=ops,
        wall_s=wall,
        usr_s=usr,
        sys_s=sys_,
        reported_per_s_real=num(item.get("bogo-ops-per-second-real-time")) or 0.0,
        reported_per_s_cpu=num(item.get("bogo-ops-per-second-usr-sys-time")),
        cpu_usage_pct_per_instance=pct,
        instances=instances,
    )


def parse_stress_ng(yaml_text: str | None, log_text: str | None = None) -> StressResult:
    """Parse stress-ng's ``--yaml`` file and (optionally) its stderr log.

    Metrics come from the YAML; when it has none (missing, or stress-ng died
    before writing it) they come from the log's "metrc:" table, which has the
    same figures rounded to 2 decimals. Raises ParseError only when both
    texts are empty.
    """
    if not (yaml_text or "").strip() and not (log_text or "").strip():
        raise ParseError("stress-ng: no YAML and no log")
    res = StressResult()
    log_metrics: list[StressMetric] = []
    for line in (log_text or "").splitlines():
        m = _SNG_LOG.match(line.strip())
        if not m:
            if line.strip():
                res.other_lines.append(line.strip())
            continue
        level, msg = m.group(1), m.group(2).strip()
        if level in ("fail", "error"):
            res.fail_lines.append(msg)
        elif level == "metrc":
            tok = msg.split()
            if len(tok) == 7 and all(num(t) is not None for t in tok[1:]):
                ops, real, usr, sys_, per_real, per_cpu = (float(t) for t in tok[1:])
                log_metrics.append(StressMetric(tok[0], ops, real, usr, sys_, per_real, per_cpu))
        elif msg.startswith("dispatching hogs:"):
            for part in msg.split(":", 1)[1].split(","):
                bits = part.split()
                if len(bits) == 2 and bits[0].isdigit():
                    res.instances[bits[1]] = int(bits[0])
        elif s := _SNG_SUMMARY.match(msg):
            names = _SNG_NAMES.findall(s.group(3) or "")
            target = {
                "passed": res.passed,
                "failed": res.failed,
                "skipped": res.skipped,
            }.get(s.group(1), res.untrustworthy)
            target.extend(names)
        elif "successful run completed" in msg:
            res.completed = not msg.startswith("unsuccessful")

    items, res.version = _yaml_metric_items(yaml_text or "")
    for item in items:
        parsed = _metric_from_yaml(item, res.instances.get(item.get("stressor", "")))
        if parsed:
            res.metrics[parsed.stressor] = parsed
    if not res.metrics:
        for metric in log_metrics:
            res.metrics[metric.stressor] = replace(metric, instances=res.instances.get(metric.stressor))
    return res


def explain_cpu_time(result: StressResult, granted_cpus: float | None = None) -> str:
    """Say where a low bogo-ops/s (wall) comes from, using the CPU time the
    stressors actually got (usr+sys) against what they asked for (one CPU per
    instance) and, when known, the CPUs the node is granted (its cgroup quota
    or cpuset size).

    - got (almost) every CPU-second asked for: the CPU itself was slow;
    - used up the node's grant: limited by the node's own CPU quota;
    - got less than the grant: waited for CPUs held by other processes or
      sibling containers on the same host.
    """
    used = sum(m.cpus_used for m in result.metrics.values())
    demand_known = all(m.instances for m in result.metrics.values())
    demand = float(sum(m.instances or 0 for m in result.metrics.values())) if demand_known else None
    if demand and used >= 0.9 * demand:
        return f"it got the CPU time it asked for ({used:.2f} of {demand:g} CPUs): the CPU itself was slow"
    if granted_cpus is not None and used >= 0.9 * min(granted_cpus, demand or granted_cpus):
        return f"it used its whole CPU grant ({used:.2f} of {granted_cpus:g} CPUs): limited by the node's own CPU quota"
    if granted_cpus is not None:
        return (
            f"it got only {used:.2f} of the {granted_cpus:g} CPUs granted to the node: "
            "it waited for CPUs held by other processes or sibling containers"
        )
    asked = f" of the {demand:g} CPUs it asked for" if demand else " CPUs"
    return (
        f"it got only {used:.2f}{asked}: the node's CPU quota is smaller, "
        "or it waited for CPUs held by other processes or sibling containers"
    )


def judge_stress(
    result: StressResult,
    exit_code: int,
    min_bogo_ops_per_s: Mapping[str, float],
    *,
    per: Literal["wall", "cpu"] = "wall",
    granted_cpus: float | None = None,
) -> Verdict:
    """Judge a stress-ng run.

    Fails on a non-zero exit status, "fail"/"error" log lines, stressors the
    log lists as failed or untrustworthy, missing metrics, a stressor with
    zero bogo-ops, or a stressor below its threshold in min_bogo_ops_per_s.

    per="wall" compares bogo-ops per wall second (what the node delivered);
    per="cpu" compares bogo-ops per CPU second (usr+sys), so a node that
    merely waited for CPU (quota, sibling containers) is not blamed for it;
    thresholds must then be per CPU second. Either way both rates, the CPUs
    used and (when a rate is low) the explanation of explain_cpu_time go into
    the verdict; granted_cpus sharpens that explanation.
    """
    reasons: list[str] = []
    figures: dict[str, float] = {"exit_code": float(exit_code)}
    if exit_code != 0:
        detail = f" ({result.other_lines[0][:200]})" if exit_code == 1 and result.other_lines else ""
        reasons.append(f"stress-ng exited {exit_code}: {stress_ng_exit_reason(exit_code)}{detail}")
    for line in result.fail_lines[:5]:
        reasons.append(f"stress-ng reported: {line}")
    if len(result.fail_lines) > 5:
        reasons.append(f"... and {len(result.fail_lines) - 5} more failure lines")
    if result.failed:
        reasons.append(f"stressors failed: {', '.join(result.failed)}")
    if result.untrustworthy:
        reasons.append(f"stressor metrics untrustworthy: {', '.join(result.untrustworthy)}")
    if not result.metrics:
        reasons.append("stress-ng produced no metrics")
    if granted_cpus is not None:
        figures["granted_cpus"] = float(granted_cpus)

    slow = False
    for name, m in result.metrics.items():
        figures[f"{name}.bogo_ops"] = m.bogo_ops
        figures[f"{name}.bogo_ops_per_s_wall"] = m.per_wall_s
        figures[f"{name}.bogo_ops_per_s_cpu"] = m.per_cpu_s
        figures[f"{name}.cpus_used"] = m.cpus_used
        if m.bogo_ops <= 0:
            reasons.append(f"stressor {name} did no work (0 bogo-ops)")
        elif m.wall_s <= 0:
            reasons.append(f"stressor {name} has no run time in its metrics: the figures are lost")
    for name, threshold in min_bogo_ops_per_s.items():
        figures[f"{name}.min_bogo_ops_per_s_{per}"] = float(threshold)
        got = result.metrics.get(name)
        if got is None:
            reasons.append(f"no metrics for stressor {name}")
            continue
        rate = got.per_cpu_s if per == "cpu" else got.per_wall_s
        if rate < threshold and got.bogo_ops > 0 and got.wall_s > 0:
            slow = True
            reasons.append(
                f"stressor {name}: {rate:.2f} bogo-ops/s ({per}) is below {threshold:g} "
                f"[{got.per_wall_s:.2f}/s wall, {got.per_cpu_s:.2f}/s per CPU-second, "
                f"{got.cpus_used:.2f} CPUs used]"
            )
    if result.metrics:
        figures["cpus_used_total"] = sum(m.cpus_used for m in result.metrics.values())
    if slow:
        reasons.append("CPU time: " + explain_cpu_time(result, granted_cpus))
    return verdict(reasons, figures)
