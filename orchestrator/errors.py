"""Errors, classified by what the caller should do with them (exit code, retry).

Exit codes (documented in `hp --help` and the README):
  0 success, 1 operation failed, 2 bad input, 3 timeout waiting.
"""
from __future__ import annotations


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


class NotFound(HpError):
    exit_code = 1


class OperationFailed(HpError):
    exit_code = 1


class WaitTimeout(HpError):
    exit_code = 3


class DockerUnavailable(HpError):
    exit_code = 1


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
