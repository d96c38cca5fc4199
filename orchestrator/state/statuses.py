"""The names of a cluster's, an instance group's and a health-check request's statuses
(their transition tables, in transitions.py, are what may change them). Apart, and light
(enum only), so that the quick `hp exec` (cli/quick.py) reads a cluster's status without
loading the tables."""

from __future__ import annotations

from enum import StrEnum


class ClusterStatus(StrEnum):
    """A cluster's recorded status (HyperPod's ClusterStatus, plus Degraded)."""

    CREATING = "Creating"
    IN_SERVICE = "InService"
    FAILED = "Failed"
    ROLLING_BACK = "RollingBack"
    DELETING = "Deleting"
    DEGRADED = "Degraded"  # its controller's host does not answer: Slurm is down until it returns


class GroupStatus(StrEnum):
    """An instance group's status, derived from its nodes each time (state/status.py):
    never recorded, so it has no transition table."""

    CREATING = "Creating"
    IN_SERVICE = "InService"
    UPDATING = "Updating"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class RequestState(StrEnum):
    """A deep health-check request's state (`hp health-check status`)."""

    PENDING = "Pending"  # recorded; its worker (or the agent, on start) is about to run it
    RUNNING = "Running"
    COMPLETED = "Completed"  # ran to its end: the verdicts are recorded (passed or not)
    FAILED = "Failed"  # the request itself failed (not its checks): its worker died, bad options, an error
    CANCELLED = "Cancelled"


class CheckState(StrEnum):
    """One check's result on one node in a request (and a node's final outcome in it)."""

    WAITING = "Waiting"
    RUNNING = "Running"
    PASSED = "Passed"
    FAILED = "Failed"
    SKIPPED = "Skipped"  # not checked: busy, drained by someone else, or gone
    ERROR = "Error"  # an internal error, or a check the kernel killed: not judged


class Attempt(StrEnum):
    """Which run of a check a result is: the request's first, or after a reboot or a
    replacement of the node."""

    INITIAL = "initial"
    AFTER_REBOOT = "after-reboot"
    AFTER_REPLACE = "after-replace"

    @classmethod
    def after(cls, action: str) -> Attempt:
        """The re-check after recovery `action` (reboot or replace)."""
        return cls(f"after-{action}")
