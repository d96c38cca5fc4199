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


# -- a controller's workers (controller-runtime's MaxConcurrentReconciles) ------------------
class Gated(Controller):
    """Each reconcile waits for its key's gate; records who ran when, and the most keys and
    the most runs of one key at once."""

    kind = "gated"
    keys = ()
    workers = 2

    def __init__(self, outcomes=None):
        self.lock = threading.Lock()
        self.gates: dict[str, threading.Event] = {}
        self.now: dict[str, int] = {}
        self.most_keys = self.most_of_one = 0
        self.runs: list[str] = []
        self.outcomes = outcomes or {}

    def gate(self, key):
        with self.lock:
            return self.gates.setdefault(key, threading.Event())

    def reconcile(self, key):
        with self.lock:
            self.runs.append(key)
            self.now[key] = self.now.get(key, 0) + 1
            self.most_keys = max(self.most_keys, sum(1 for v in self.now.values() if v))
            self.most_of_one = max(self.most_of_one, self.now[key])
        try:
            self.gate(key).wait(3)
            out = self.outcomes.get(key)
            if isinstance(out, BaseException):
                raise out
            return out or Result()
        finally:
            with self.lock:
                self.now[key] -= 1


def test_two_keys_of_one_controller_run_at_once_with_two_workers():
    c = Gated()
    rt = Runtime(Log(), "lab")
    rt.add(c)
    rt.start()
    rt.enqueue("gated", "node:a")
    rt.enqueue("gated", "node:b")
    until(lambda: c.most_keys == 2)  # both inside reconcile, neither gate open
    c.gate("node:a").set()
    c.gate("node:b").set()
    assert rt.idle("gated", 3)
    rt.shutdown()
    assert sorted(c.runs) == ["node:a", "node:b"]


def test_one_worker_runs_one_key_at_a_time():
    c = Gated()
    c.workers = 1
    rt = Runtime(Log(), "lab")
    rt.add(c)
    rt.start()
    rt.enqueue("gated", "node:a")
    rt.enqueue("gated", "node:b")
    until(lambda: len(c.runs) == 1)
    time.sleep(0.1)
    assert len(c.runs) == 1  # the other waits for the one thread
    c.gate("node:a").set()
    c.gate("node:b").set()
    assert rt.idle("gated", 3) and c.most_keys == 1
    rt.shutdown()


def test_a_key_never_runs_on_two_threads_and_one_enqueued_while_it_runs_runs_again_after():
    c = Gated()
    c.workers = 4
    rt = Runtime(Log(), "lab")
    rt.add(c)
    rt.start()
    rt.enqueue("gated", "node:a")
    until(lambda: c.runs == ["node:a"])
    for _ in range(5):  # while it runs: once more after it, never beside it
        rt.enqueue("gated", "node:a")
        rt.wake("gated")
    assert not rt.offer("gated", "node:a")  # an observer's offer: it runs (or waits) already
    time.sleep(0.1)
    assert c.runs == ["node:a"] and c.most_of_one == 1
    c.gate("node:a").set()
    until(lambda: c.runs == ["node:a", "node:a"])
    assert rt.idle("gated", 3)
    time.sleep(0.05)
    assert c.runs == ["node:a", "node:a"] and c.most_of_one == 1
    assert rt.offer("gated", "node:a")  # idle: an offer runs it
    until(lambda: len(c.runs) == 3)
    rt.shutdown()


def test_with_workers_a_bug_parks_only_its_key_and_a_failure_backs_off_only_its_key():
    log = Log()
    c = Gated({"node:bad": ZeroDivisionError("x"), "node:flaky": Result.backoff()})
    c.backoff = (30.0,)
    for k in ("node:bad", "node:flaky", "node:good"):
        c.gate(k).set()
    rt = Runtime(log, "lab")
    rt.add(c)
    rt.start()
    for k in ("node:bad", "node:flaky", "node:good"):
        rt.enqueue("gated", k)
    assert rt.idle("gated", 3)
    assert rt.parked("gated") == {"node:bad"}
    assert 25.0 < rt.due_in("gated", "node:flaky") <= 30.0 and rt.failures("gated", "node:flaky") == 1
    assert rt.due_in("gated", "node:good") is None and rt.failures("gated", "node:good") == 0
    bug = [e for e in log.events if "internal error in gated of node:bad" in e]
    assert len(bug) == 1
    rt.enqueue("gated", "node:good")
    assert rt.idle("gated", 3)
    assert c.runs.count("node:good") == 2 and c.runs.count("node:bad") == 1
    rt.shutdown()
