"""The one wait primitive (orchestrator/waits.py), on a fake clock."""

from __future__ import annotations

import itertools

import pytest
from tenacity import wait_exponential, wait_fixed

from orchestrator import waits
from orchestrator.errors import EngineError, OperationFailed, WaitTimeout


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_until_returns_the_first_done_value_looking_every_interval():
    c, seen = Clock(), iter([1, 2, 3, 4])
    assert waits.until(lambda: next(seen), lambda v: v >= 3, every=0.5, timeout=10, clock=c, sleep=c.sleep) == 3
    assert c.slept == [0.5, 0.5]


def test_paced_looks_start_every_interval_and_a_slow_one_is_followed_at_once():
    c, took = Clock(), iter([0.03, 0.15, 0.1, 0.02])

    def look() -> float:  # a look that takes its time (an exec into a container)
        t = next(took)
        c.now += t
        return t

    assert waits.until(look, lambda t: t == 0.02, every=0.1, timeout=10, clock=c, sleep=c.sleep, paced=True) == 0.02
    assert [round(s, 6) for s in c.slept] == [0.07, 0.0, 0.0]  # unpaced: the first test's pause after each look


def test_a_timeout_carries_the_last_value_seen():
    c, n = Clock(), itertools.count()
    with pytest.raises(waits.TimedOut) as e:
        waits.until(
            lambda: f"line {next(n)}", lambda _: False, every=1, timeout=3, what="the log", clock=c, sleep=c.sleep
        )
    assert isinstance(e.value, WaitTimeout) and e.value.exit_code == 3 and e.value.last == "line 3"
    assert str(e.value) == "the log: not within 3 s; last seen: line 3"
    # a deadline (an instant of the clock) instead of a timeout; the caller's own error
    with pytest.raises(OperationFailed, match="still 7"):
        waits.until(
            lambda: 7,
            lambda _: False,
            every=1,
            deadline=5,
            clock=c,
            sleep=c.sleep,
            error=lambda v: OperationFailed(f"still {v}"),
        )


def test_poll_gives_the_last_value_back_and_attempts_bound_the_looks():
    c, n = Clock(), itertools.count(1)
    assert waits.poll(lambda: next(n), lambda v: v > 10, every=1, attempts=4, clock=c, sleep=c.sleep) == 4
    assert c.slept == [1, 1, 1]
    assert waits.poll(lambda: False, every=2, timeout=4, clock=c, sleep=c.sleep) is False


def test_exceptions_of_retry_on_count_as_not_yet_others_end_the_wait():
    c, answers = Clock(), [EngineError("busy"), EngineError("busy"), "removed"]

    def attempt() -> str:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert waits.until(attempt, every=0.3, timeout=5, retry_on=EngineError, clock=c, sleep=c.sleep) == "removed"

    def busy() -> str:
        raise EngineError("still busy")

    with pytest.raises(EngineError, match="still busy"):  # the last look's error, at the deadline
        waits.until(busy, every=1, timeout=2, retry_on=EngineError, clock=c, sleep=c.sleep)
    calls = []

    def bug() -> None:
        calls.append(1)
        raise KeyError("x")

    with pytest.raises(KeyError):
        waits.until(bug, every=1, timeout=60, retry_on=EngineError, clock=c, sleep=c.sleep)
    assert calls == [1]


def test_pause_sleeps_and_slept_after_reads_tenacitys_strategy(monkeypatch):
    slept = []
    monkeypatch.setattr(waits.time, "sleep", slept.append)
    waits.pause(0.25)
    assert slept == [0.25]
    exp = wait_exponential(multiplier=1, min=1, max=10)
    assert [waits.slept_after(exp, a) for a in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert waits.slept_after(wait_fixed(3), 0) == 3
