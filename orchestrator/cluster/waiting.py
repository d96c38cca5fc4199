"""Waiting for a cluster's groups to reach their targets (`hp scale --wait`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.context import Env
from ..errors import WaitTimeout
from .query import describe

POLL_S = 0.5


def wait_groups(env: Env, name: str, groups: list[str], timeout: float, show: Callable[[str], None]) -> dict[str, Any]:
    """Show per-group progress (current/target, pending) until the groups reach their targets."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        doc = describe(env, name)
        gs = [g for g in doc["InstanceGroups"] if g["InstanceGroupName"] in groups]
        line = "  ".join(
            f"{g['InstanceGroupName']} {g['CurrentCount']}/{g['TargetCount']}"
            + (f" ({g['PendingCount']} pending)" if g["PendingCount"] else "")
            for g in gs
        )
        if line != last:
            show(line)
            last = line
        if all(
            g["CurrentCount"] == g["TargetCount"] and not g["PendingCount"] and not g["ActiveOperations"] for g in gs
        ):
            return doc
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s: {line}")
        time.sleep(POLL_S)
