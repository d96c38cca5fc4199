"""Errors, classified by what the caller should do with them (exit code, retry), and hp's
failure policy.

Exit codes (documented in `hp --help` and the README):
  0 success, 1 operation failed, 2 bad input, 3 timeout waiting.

Failure policy. `TRANSIENT` names the errors that come from the outside world: the
container engine answering with an error or not at all, a node that could not be
launched, a command (Slurm, a check tool) that failed. Those are retried (with backoff)
or reported as the outcome of what was tried. Anything else that reaches a loop of hp's
is a bug in hp: it is logged with its traceback and recorded as an `hp events` entry
(`report_bug`), and it never becomes a verdict (a failed health check, a dead
controller) nor is it retried forever.
"""

from __future__ import annotations

import hashlib
import logging
import traceback
from collections.abc import Callable
from typing import Any, Protocol


class EventLog(Protocol):
    """Where a bug is recorded as an `hp events` entry: hp's store (state/store.py)."""

    def event(self, cluster: str, kind: str, level: str, text: str, *where: Any, **named: Any) -> None: ...


class HpError(Exception):
    """Base of every error hp reports to a user (no traceback)."""

    exit_code = 1


class BadInput(HpError):
    """Specs, names, counts or flags that can't be used. Nothing was changed."""

    exit_code = 2

    def __init__(self, problems: list[str] | str, what: str = "invalid input"):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.what = what
        super().__init__(self.render())

    def render(self) -> str:
        if len(self.problems) == 1:
            return f"{self.what}: {self.problems[0]}"
        lines = [f"{self.what}: {len(self.problems)} problems"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class NotFound(BadInput):
    """A cluster, group or node the user named does not exist (bad input: exit 2)."""

    def __init__(self, message: str):
        super().__init__(message, "not found")

    def render(self) -> str:
        return self.problems[0]


class OperationFailed(HpError):
    """Something hp tried did not work (a command failed, a node did not come back)."""

    exit_code = 1


class WaitTimeout(HpError):
    exit_code = 3


class EngineUnavailable(HpError):
    """No container engine answers (not started, unreachable, refused the connection)."""

    exit_code = 1


class EngineError(OperationFailed):
    """The container engine answered with an error. `status` is its HTTP status (404
    missing, 409 conflict, 500 engine fault...), 0 when unknown."""

    def __init__(self, message: str, status: int = 0):
        self.status = status
        super().__init__(message)

    @property
    def missing(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class ObjectMissing(EngineError):
    """The engine has no such container, image, network or volume."""

    def __init__(self, message: str):
        super().__init__(message, 404)


class LaunchError(HpError):
    """A node could not be launched. `retryable` says whether trying again can help
    (capacity comes back, a transient fault) or not (the image is missing). The
    classification is made where the failure is observed, never by matching text."""

    def __init__(self, code: str, message: str, *, retryable: bool):
        self.code = code
        self.retryable = retryable
        super().__init__(f"{code}: {message}")


class InsufficientCapacity(LaunchError):
    def __init__(self, message: str):
        super().__init__("InsufficientCapacity", message, retryable=True)


class InvalidTransition(Exception):
    """A node phase, cluster status or health-check request state change its transition
    table does not allow: a bug in hp, never a user error (not an HpError, so it is never
    shown as an operation's outcome)."""


# The outside world's errors: retried or reported as an outcome. Anything else is a bug.
TRANSIENT: tuple[type[BaseException], ...] = (EngineUnavailable, EngineError, LaunchError, OperationFailed)


def bug_signature(e: BaseException) -> str:
    """A short stable id of a bug (type and where it was raised), to report it once."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    return hashlib.sha1(f"{type(e).__name__}@{where}".encode()).hexdigest()[:10]


def report_bug(
    store: EventLog | None,
    cluster: str | None,
    where: str,
    e: BaseException,
    log: logging.Logger,
    *,
    group: str | None = None,
    node: str | None = None,
) -> str:
    """Log a bug with its traceback and record it as an event of the cluster; returns
    the one-line description. Never raises (the caller is already handling a failure)."""
    desc = f"internal error in {where}: {type(e).__name__}: {str(e)[:300]} (a bug in hp, id {bug_signature(e)}; traceback in the log)"
    log.error("%s", desc, exc_info=e)
    if store is not None and cluster is not None:
        try:
            store.event(cluster, "Cluster" if node is None else "Instance", "Error", desc, group, node=node)
        except store.Error:  # pragma: no cover - the store itself failing: the log has it
            log.exception("could not record the internal error")
    return desc


def guarded(
    store: EventLog | None,
    cluster: str | None,
    where: str,
    log: logging.Logger,
    fn: Callable[..., Any],
    *args: Any,
    node: str | None = None,
) -> Any:
    """Run `fn` (a thread's body, a background loop) so that a bug in it is reported
    (report_bug) and ends it, never the process; returns fn's result, None after a bug."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - a bug: reported, and the caller goes on without this part
        report_bug(store, cluster, where, e, log, node=node)
        return None
