"""The agent's reconcile runtime (orchestrator/runtime.py): requeues, wake-ups by Docker
events, the per-key backoff table, and the failure policy (a bug reported once and its key
parked until reset; an error of the outside world backed off)."""

from __future__ import annotations

import threading
import time

from orchestrator.errors import EngineUnavailable, OperationFailed
from orchestrator.runtime import Controller, Result, Runtime


class Log:
    def __init__(self):
        self.events: list[str] = []

    def event(self, cluster, kind, level, text, *where, **named):
        self.events.append(text)


class Counter(Controller):
    kind = "count"
    keys = ("a", "b")
    backoff = (0.01, 0.02, 5.0)

    def __init__(self, outcomes=None):
        self.runs: list[str] = []
        self.outcomes = outcomes or {}

    def reconcile(self, key):
        self.runs.append(key)
        out = self.outcomes.get(key)
        if isinstance(out, BaseException):
            raise out
        return out or Result(requeue_after=0.01)

    def watch(self, event):
        return ("b",) if event == "poke-b" else ()


def until(cond, timeout=3.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition not met in time"
        time.sleep(0.005)


def test_keys_run_at_start_and_again_when_they_ask():
    c = Counter()
    rt = Runtime(Log(), "lab")
    rt.add(c)
    rt.start()
    until(lambda: c.runs.count("a") >= 3 and c.runs.count("b") >= 3)
    rt.shutdown()
    n = len(c.runs)
    time.sleep(0.05)
    assert len(c.runs) == n  # stopped: nothing runs


def test_a_key_that_asks_nothing_runs_only_when_woken_by_an_event_or_enqueue():
    c = Counter({"a": Result(), "b": Result()})
    events = threading.Event()

    def stream():
        events.wait(2)
        yield "unrelated"
        yield "poke-b"
        while True:
            time.sleep(0.05)
            yield "unrelated"

    rt = Runtime(Log(), "lab", stream)
    rt.add(c)
    rt.start()
    until(lambda: sorted(c.runs) == ["a", "b"])
    events.set()
    until(lambda: c.runs.count("b") == 2)
    rt.enqueue("count", "a")
    until(lambda: c.runs.count("a") == 2)
    time.sleep(0.1)
    assert c.runs.count("a") == 2 and c.runs.count("b") == 2
    rt.shutdown()


def test_the_backoff_table_grows_per_key_and_a_success_forgets_it():
    c = Counter({"a": OperationFailed("engine hiccup"), "b": Result.backoff()})
    c.keys = ()
    rt = Runtime(Log(), "lab")
    rt.add(c)

    def run(key):  # as the runtime's thread does: the key taken, then run
        rt._due.pop(("count", key), None)
        r = rt.run_once(c, key)
        return r, rt._due[("count", key)] - time.monotonic()

    assert run("a")[0].failed and rt.failures("count", "a") == 1
    r, after = run("a")
    assert r.failed and rt.failures("count", "a") == 2 and 0.01 < after <= 0.02  # the table's second step
    assert run("b")[0].failed and rt.failures("count", "b") == 1  # a key of its own
    assert run("a")[1] > 4.0  # its third: 5 s
    c.outcomes["a"] = Result(1.0)
    run("a")
    assert rt.failures("count", "a") == 0


def test_a_bug_is_reported_once_and_its_key_parked_until_reset():
    log = Log()
    c = Counter({"a": ZeroDivisionError("x")})
    rt = Runtime(log, "lab")
    rt.add(c)
    assert rt.run_once(c, "a") is None
    assert rt.run_once(c, "a") is None
    assert len([e for e in log.events if "internal error in count of a" in e]) == 1
    assert rt.parked("count") == {"a"}
    rt.start()
    until(lambda: c.runs.count("b") >= 3)
    assert c.runs.count("a") == 2  # parked: never retried in a loop
    c.outcomes["a"] = Result(60.0)
    rt.reset("count")
    until(lambda: c.runs.count("a") == 3)
    assert rt.parked("count") == set()
    rt.shutdown()


def test_an_event_that_a_controller_fails_on_leaves_the_stream_to_the_others():
    log = Log()

    class Fussy(Controller):
        kind = "fussy"
        keys = ()

        def reconcile(self, key):
            return Result()

        def watch(self, event):
            if event == "bad":
                raise KeyError(event)
            if event == "away":
                raise EngineUnavailable("engine away")
            return ()

    c = Counter({"a": Result(), "b": Result()})

    def stream():
        yield from ("bad", "away", "poke-b")
        while True:
            time.sleep(0.05)
            yield "x"

    rt = Runtime(log, "lab", stream)
    rt.add(Fussy())
    rt.add(c)
    rt.start()
    until(lambda: c.runs.count("b") == 2)
    rt.shutdown()
    assert len([e for e in log.events if "fussy, on a Docker event" in e]) == 1
