"""What every health-check tool module returns: a Verdict (passed, reasons, figures),
and the parsing helpers they share. Each tool module (health/tools: stress, iperf, mpi;
gpu/: nccl, dcgm, judge) holds both the command it runs and the parser/judge of that
tool's output; parsers
raise ParseError when a text is not that tool's output at all, judges never raise. Also
the words of what is done to a node for what a check (or anyone) found: `Action`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Action(StrEnum):
    """What is done to a node for a fault, weakest first. The one escalation policy
    (recovery/rules.py, `escalation`) turns one into the step to take now."""

    NONE = "none"  # nothing: healthy, not hp's to judge, or a setup problem (the node is kept as it is)
    MONITOR = "monitor"  # an event only (an application's XID)
    REBOOT = "reboot"  # restart the container, and only that (the controller; an admin's Action:reboot)
    RECOVER = "recover"  # reboot, re-check, and replace if it still fails
    REPLACE = "replace"  # a new container at once


ACTIONS = tuple(Action)  # weakest first


def strongest(actions: Iterable[Action]) -> Action:
    """The strongest of `actions` (NONE for none)."""
    return max(actions, key=ACTIONS.index, default=Action.NONE)


class ParseError(ValueError):
    """The text is not (a complete enough piece of) the expected tool output."""


@dataclass
class Verdict:
    """Outcome of one check, as shown to the user.

    passed: True when nothing was wrong.
    reasons: one human-readable sentence per problem found; empty when passed.
    figures: measured values and the thresholds they were compared to, keyed
        by short names (e.g. ``avg_busbw_gbps`` and ``min_busbw_gbps``).
    """

    passed: bool
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    # why the check could not run (the kernel killed it, it had no room): no verdict on
    # the node at all, which goes back into service untouched
    not_run: str = ""


def verdict(reasons: list[str], figures: dict[str, float]) -> Verdict:
    return Verdict(passed=not reasons, reasons=reasons, figures=figures)


def json_object(text: str, tool: str) -> dict[str, Any]:
    """The first JSON object in text; anything before the first '{' or after
    the object (dcgmi and srun may print lines around it) is ignored."""
    start = text.find("{")
    if start < 0:
        raise ParseError(f"{tool}: no JSON object in output")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{tool}: invalid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ParseError(f"{tool}: JSON is not an object")
    return obj


def obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def num(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
