"""Health-check options: validation (pure; each returns the problems it finds, named by
the CLI flag) and the stress-ng command as an argv list.

No user-supplied string reaches a shell: InstanceStress runs stress-ng through the
check image's hp-stress wrapper with an argv list (`docker exec` with a list runs no
shell), and a size is handed over as plain digits (stress.stress_command).

Sizes are validated against what stress-ng takes (measured with stress-ng 0.18 in
hp-check-cpu: b/k/m/g/t suffixes in either case, decimals like 1.5G, 4096 bytes up to
2^48-1, or N% of the *host's* available memory) and against the node: a memory
stressor larger than the node's memory limit is OOM-killed over and over and
reports 0 bogo-ops (measured: 400M, 50% and 90% on a 256 MiB container all gave 0
ops, exit 0), so a healthy node would be failed, rebooted and replaced.
"""

from __future__ import annotations

import math
import re
from typing import Any

VM_BYTES_MIN = 4096  # stress-ng: "allowed: 4096 .. 281474976710655"
VM_BYTES_MAX = 2**48 - 1
VM_NODE_FRACTION = 0.75  # at most this share of the node's memory (200M of 256M worked)
STRESS_SECONDS = (1, 3600)  # the nodes stay drained while it runs
DCGM_LEVELS = (1, 2, 3, 4)  # dcgmi diag -r 1..4
WAIT_IDLE_MAX_S = 7 * 24 * 3600.0  # how long drained nodes may wait for running jobs
RECOVERY_WAIT_MAX_S = 3600.0
WAIT_TIMEOUT_MAX_S = 7 * 24 * 3600.0

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"(?P<num>[0-9]{1,15}(?:\.[0-9]{1,6})?)(?P<unit>[bBkKmMgGtT]?)")
_PERCENT = re.compile(r"(?P<pct>[0-9]{1,3})%")
SIZE_FORMS = "a size like 64M, 1G, 1.5G or 4096 (bytes; suffix b, k, m, g or t) or a percentage like 5%"


def parse_size(text: object) -> tuple[str, float] | None:
    """('bytes', n) or ('percent', p) for a well-formed size, else None."""
    if not isinstance(text, str):
        return None
    if m := _SIZE.fullmatch(text):
        return "bytes", math.floor(float(m["num"]) * _UNITS[m["unit"].lower()])
    if m := _PERCENT.fullmatch(text):
        return "percent", float(m["pct"])
    return None


def vm_bytes_problems(
    value: object, *, node_memory_mib: int | None = None, host_memory_mib: int | None = None, flag: str = "--vm-bytes"
) -> list[str]:
    """Problems of a memory-stressor size; with node_memory_mib (the smallest node
    under check), also whether it fits the node. A percentage is of the host's
    available memory (stress-ng does not read the container's limit), so it is
    checked against host_memory_mib when given, and refused when it cannot be."""
    size = parse_size(value)
    if size is None:
        return [f"{flag} must be {SIZE_FORMS}, got {_show(value)}"]
    kind, n = size
    if kind == "percent":
        if not 1 <= n <= 100:
            return [f"{flag} percentage must be 1% to 100%, got {_show(value)}"]
        if node_memory_mib is None:
            return []
        if host_memory_mib is None:
            return [
                f"{flag} {value}: a percentage is of the host's memory, not the node's; give a size "
                f"(at most {_mib(node_memory_mib * VM_NODE_FRACTION)})"
            ]
        n = n / 100 * host_memory_mib * 1024**2
    if kind == "bytes" and not VM_BYTES_MIN <= n <= VM_BYTES_MAX:
        return [f"{flag} must be between 4K and 256T (stress-ng's range), got {_show(value)}"]
    if node_memory_mib is not None and n > node_memory_mib * 1024**2 * VM_NODE_FRACTION:
        what = f"{value} ({_mib(n / 1024**2)} of the host's memory)" if kind == "percent" else str(value)
        return [
            f"{flag} {what} does not fit the nodes under check: at most {_mib(node_memory_mib * VM_NODE_FRACTION)} "
            f"({VM_NODE_FRACTION:.0%} of {node_memory_mib} MiB); a larger memory stressor is killed for memory "
            "and fails a healthy node"
        ]
    return []


def int_problems(flag: str, value: object, lo: int, hi: int) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        return [f"{flag} must be a whole number from {lo} to {hi}, got {_show(value)}"]
    return []


def seconds_problems(flag: str, value: object, *, hi: float, zero_ok: bool) -> list[str]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok) or value > hi:
        low = ">= 0" if zero_ok else "> 0"
        return [f"{flag} must be a number of seconds {low} and at most {hi:g}, got {_show(value)}"]
    return []


def problems(
    opts: dict[str, Any], *, node_memory_mib: int | None = None, host_memory_mib: int | None = None
) -> list[str]:
    """Every problem of a health-check request's options (CLI names, as recorded with
    the request); missing keys take their defaults."""
    out: list[str] = []
    out += seconds_problems("--wait-idle-timeout", opts.get("wait_idle_timeout", 600), hi=WAIT_IDLE_MAX_S, zero_ok=True)
    out += int_problems("--stress-seconds", opts.get("stress_seconds", 3), *STRESS_SECONDS)
    out += vm_bytes_problems(
        opts.get("vm_bytes", "64M"), node_memory_mib=node_memory_mib, host_memory_mib=host_memory_mib
    )
    if opts.get("dcgm_level", 2) not in DCGM_LEVELS or isinstance(opts.get("dcgm_level"), bool):
        out.append(
            f"--dcgm-level must be one of {', '.join(map(str, DCGM_LEVELS))}, got {_show(opts.get('dcgm_level'))}"
        )
    out += seconds_problems("--recovery-wait", opts.get("recovery_wait", 90), hi=RECOVERY_WAIT_MAX_S, zero_ok=False)
    if "timeout" in opts:
        out += seconds_problems("--timeout", opts["timeout"], hi=WAIT_TIMEOUT_MAX_S, zero_ok=False)
    return out


def _mib(mib: float) -> str:
    return f"{mib / 1024:.4g}G" if mib >= 1024 else f"{math.floor(mib)}M"


def _show(value: object) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."
