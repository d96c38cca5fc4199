"""Waiting for a cluster's groups to reach their targets (`hp scale --wait`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import waits
from ..core.context import Env
from ..errors import WaitTimeout
from .describe import describe

POLL_S = 0.5


def wait_groups(env: Env, name: str, groups: list[str], timeout: float, show: Callable[[str], None]) -> dict[str, Any]:
    """Show per-group progress (current/target, pending) until the groups reach their targets."""
    last: list[str | None] = [None]  # the line shown last

    def look() -> tuple[dict[str, Any], str]:  # the cluster's description and its progress line
        env.agents.ensure(name)  # the agent does the work: one gone meanwhile is started again
        doc = describe(env, name)
        gs = [g for g in doc["InstanceGroups"] if g["InstanceGroupName"] in groups]
        line = "  ".join(
            f"{g['InstanceGroupName']} {g['CurrentCount']}/{g['TargetCount']}"
            + (f" ({g['PendingCount']} pending)" if g["PendingCount"] else "")
            for g in gs
        )
        if line != last[0]:
            show(line)
            last[0] = line
        return doc, line

    def reached(seen: tuple[dict[str, Any], str]) -> bool:
        gs = [g for g in seen[0]["InstanceGroups"] if g["InstanceGroupName"] in groups]
        return all(
            g["CurrentCount"] == g["TargetCount"] and not g["PendingCount"] and not g["ActiveOperations"] for g in gs
        )

    return waits.until(
        look,
        reached,
        every=POLL_S,
        timeout=timeout,
        error=lambda seen: WaitTimeout(f"timed out after {timeout:g} s: {seen[1]}"),
    )[0]
