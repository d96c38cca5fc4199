"""Waiting: the one primitive behind hp's polling loops, built on tenacity.

`until(probe, done, ...)` looks (calls `probe`) every `every` seconds until `done(value)`
holds and returns that value. It gives up at a deadline (`timeout` seconds from now, or
`deadline`, a time.monotonic() instant) or after `attempts` looks, and then raises
`error(last)`, by default `TimedOut`, which carries the last value it looked at (the way
testcontainers' waits report the last output they saw). `poll` is the same wait, but
gives back the last value instead of raising: for loops that say themselves what a
deadline means. An exception of `retry_on` raised by a look counts as "not yet"; when
the last look raised one, that exception is raised. Any other exception ends the wait.

`paced=True`: `every` is the period from one look's start to the next's, not the pause
after each (a look slower than `every` is followed by the next at once): for a wait whose
look is itself slow (an exec into a container) and whose latency is what matters.

`pause(seconds)` is a deliberate pause (letting events settle), the one plain sleep.
`slept_after(wait, attempt)` is the pause a tenacity wait strategy makes after failed
try `attempt` (backoffs computed from a recorded retry count).

Imports nothing of hp's but errors (the lowest floor); tenacity when a wait runs (a
command that waits for nothing, `hp nodes`, loads none of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import WaitTimeout

if TYPE_CHECKING:
    from tenacity import RetryCallState
    from tenacity.wait import wait_base

T = TypeVar("T")
Clock = Callable[[], float]
Sleep = Callable[[float], None]
LAST_MAX = 500  # characters of the last value a TimedOut shows


class TimedOut(WaitTimeout):
    """A wait that ran out of time; `last` is the last value looked at."""

    def __init__(self, what: str, seconds: float | None, last: Any):
        self.what = what
        self.seconds = seconds
        self.last = last
        seen = last if isinstance(last, str) else repr(last)
        within = f"not within {seconds:g} s" if seconds is not None else "gave up"
        super().__init__(f"{what}: {within}; last seen: {seen[-LAST_MAX:]}")


class _GaveUp:
    def __init__(self, last: Any):
        self.last = last


def _looks(
    probe: Callable[[], T],
    done: Callable[[T], bool],
    every: float,
    end: float | None,
    attempts: int | None,
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    clock: Clock,
    sleep: Sleep | None,
    paced: bool = False,
) -> tuple[bool, T]:
    """(done, the last value looked at); `end`: the clock's time to give up at."""
    from tenacity import Retrying, retry_if_exception_type, retry_if_result

    began = [clock()]  # the latest look's start (paced)

    def look() -> T:
        began[0] = clock()
        return probe()

    def pace(rs: RetryCallState) -> float:
        return max(every - (clock() - began[0]), 0.0) if paced else every

    def stop(rs: RetryCallState) -> bool:
        return (end is not None and clock() >= end) or (attempts is not None and rs.attempt_number >= attempts)

    def give_up(rs: RetryCallState) -> _GaveUp:
        assert rs.outcome is not None
        return _GaveUp(rs.outcome.result())  # raises the last look's exception, if it raised one

    out = Retrying(
        stop=stop,
        wait=pace,
        sleep=sleep or time.sleep,
        retry=retry_if_exception_type(retry_on) | retry_if_result(lambda v: not done(v)),
        retry_error_callback=give_up,
    )(look)
    if isinstance(out, _GaveUp):
        return False, out.last
    return True, out


def until(
    probe: Callable[[], T],
    done: Callable[[T], bool] = bool,
    *,
    what: str = "waiting",
    error: Callable[[T], BaseException] | None = None,
    **look: Any,
) -> T:
    """The first value of `probe` that is `done`; at the deadline raises `error(last)`
    (TimedOut naming `what` when no `error` is given). `look`: poll's keywords."""
    start = (look.get("clock") or time.monotonic)()
    last = poll(probe, done, **look)
    if done(last):
        return last
    if error is not None:
        raise error(last)
    end = _end(start, look.get("timeout"), look.get("deadline"))
    raise TimedOut(what, None if end is None else end - start, last)


def poll(
    probe: Callable[[], T],
    done: Callable[[T], bool] = bool,
    *,
    every: float,
    timeout: float | None = None,
    deadline: float | None = None,
    attempts: int | None = None,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    clock: Clock | None = None,
    sleep: Sleep | None = None,
    paced: bool = False,
) -> T:
    """Like `until`, but the last value is returned at the deadline too (the caller
    tells a done one by `done`)."""
    clock = clock or time.monotonic
    return _looks(probe, done, every, _end(clock(), timeout, deadline), attempts, retry_on, clock, sleep, paced)[1]


def _end(now: float, timeout: float | None, deadline: float | None) -> float | None:
    return deadline if deadline is not None else (now + timeout if timeout is not None else None)


def pause(seconds: float) -> None:
    """A deliberate pause: let what was just done settle before looking again."""
    time.sleep(seconds)


def slept_after(wait: wait_base, attempt: int) -> float:
    """The pause tenacity's `wait` makes after failed try number `attempt` (>= 1): found by
    letting a Retrying fail that many tries with a sleep that records instead of sleeping."""
    from tenacity import Retrying, retry_if_result, stop_after_attempt

    slept: list[float] = []
    Retrying(
        wait=wait,
        stop=stop_after_attempt(max(attempt, 1) + 1),
        retry=retry_if_result(lambda _: True),
        sleep=slept.append,
        retry_error_callback=lambda _: None,
    )(lambda: None)
    return slept[-1]
