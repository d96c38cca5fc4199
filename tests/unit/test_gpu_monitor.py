"""Passive GPU monitoring: the monitor program (hp_gpu_monitor.py, run here with FakeNvml
answering the REAL H200's NVML values) and the pure decisions of
orchestrator.gpu.monitor. Each case says what it changed."""

from __future__ import annotations

import copy
import io
import json
import threading

import pytest
from gpu_fakes import FakeNvml, h200_gpu, load_program

from orchestrator.gpu.judge import Finding
from orchestrator.gpu.monitor import (
    REASON_MAX,
    MonitorState,
    Snapshot,
    XidEvent,
    decide,
    drain_reason,
    parse_line,
)
from orchestrator.verdict import Action

mon = load_program("hp_gpu_monitor")


@pytest.fixture(autouse=True)
def _no_real_signal_handlers(monkeypatch):
    """main() installs SIGTERM/SIGINT handlers; never in the test process."""
    monkeypatch.setattr(mon.signal, "signal", lambda sig, fn: None)


class Hooked(io.StringIO):
    """Captures the lines; calls hook(n, obj) after the n-th line is written."""

    def __init__(self, hook=None):
        super().__init__()
        self.hook, self.n = hook, 0

    def write(self, s):
        r = super().write(s)
        if s.endswith("\n"):
            self.n += 1
            if self.hook:
                self.hook(self.n, json.loads(s))
        return r


def run_monitor(nv, argv=None, hook=None):
    out = Hooked(hook)
    rc = mon.main(argv or ["--interval", "0.01", "--count", "3", "--max-wait-ms", "5"], nvml_loader=lambda: nv, out=out)
    return rc, [json.loads(x) for x in out.getvalue().splitlines()]


def test_real_h200_idle_gives_no_finding():
    """No change: three snapshots of the H200's real counters."""
    rc, lines = run_monitor(FakeNvml())
    assert rc == 0 and [x["type"] for x in lines] == ["start", "snapshot", "snapshot", "snapshot"]
    start, snap = lines[0], lines[1]
    assert start["xid"] == {"status": "ok", "why": None} and start["gpus"] == [
        {"index": 0, "uuid": "GPU-3fadaaaa-e57c-b9f1-78a9-3213b39f962c"}
    ]
    g = snap["gpus"][0]
    assert g["ecc_uncorrected_volatile"] == 0 and g["remapped_rows"]["pending"] is False
    assert "unsupported" in g["retired_pages_pending"] and snap["nvml_error"] is None
    state = MonitorState(expected_gpus=1)
    assert state.feed_lines(json.dumps(x) for x in lines) == []


def test_xid_79_drains_and_reboots_after_jobs():
    """Changed: NVML delivers XID 79 while the monitor waits."""
    rc, lines = run_monitor(FakeNvml(xids=[(0, 79)]))
    xid = [x for x in lines if x["type"] == "xid"]
    assert xid == [
        {"type": "xid", "t": xid[0]["t"], "index": 0, "uuid": "GPU-3fadaaaa-e57c-b9f1-78a9-3213b39f962c", "xid": 79}
    ]
    findings = MonitorState().feed_lines(json.dumps(x) for x in lines)
    assert [(f.code, f.severity, f.action) for f in findings] == [("xid-79", "fatal", "recover")]
    d = decide(findings)
    assert d.drain and d.action == "recover" and not d.at_once
    assert d.reason.startswith("hp:gpu:recover:xid-79 XID 79 on GPU 0 (passive monitoring): GPU has fallen off the bus")


def test_xid_13_is_recorded_not_drained():
    """Changed: NVML delivers XID 13."""
    _, lines = run_monitor(FakeNvml(xids=[(0, 13)]))
    findings = MonitorState().feed_lines(json.dumps(x) for x in lines)
    d = decide(findings)
    assert [f.code for f in findings] == ["xid-13"] and not d.drain and d.action == "monitor" and d.reason == ""


def test_counter_rise_between_snapshots_replaces_at_once():
    """Changed: after the first snapshot, uncorrectable ECC 0 -> 1 and correctable 0 -> 5."""
    nv = FakeNvml()

    def hook(n, obj):
        if obj["type"] == "snapshot" and n == 2:
            nv.gpus[0]["ecc_uncorrected_volatile"] = 1
            nv.gpus[0]["ecc_corrected_volatile"] = 5

    _, lines = run_monitor(nv, hook=hook)
    findings = MonitorState().feed_lines(json.dumps(x) for x in lines)
    assert [(f.code, f.severity, f.action) for f in findings] == [
        ("ecc-uncorrectable", "fatal", "replace"),
        ("ecc-correctable", "info", "monitor"),
    ]
    assert findings[0].message == "GPU 0: uncorrectable ECC errors rose from 0 to 1"
    d = decide(findings)
    assert d.drain and d.at_once and d.action == "replace" and d.reason.startswith("hp:gpu:replace:ecc-uncorrectable")


def test_gpu_lost_mid_run():
    """Changed: after the first snapshot, every counter read answers GpuIsLost."""
    nv = FakeNvml()

    def hook(n, obj):
        if n == 2:
            for k in ("ecc_uncorrected_volatile", "ecc_corrected_volatile", "remapped_rows"):
                nv.gpus[0][k] = {"error": "GPU is lost"}

    _, lines = run_monitor(nv, hook=hook)
    assert lines[2]["nvml_error"] == "NVMLError: GPU is lost"
    findings = MonitorState().feed_lines(json.dumps(x) for x in lines)
    assert [(f.code, f.action) for f in findings] == [("driver-not-answering", "recover")]


def test_nvml_not_ready_at_start_then_ready():
    """Changed: the first nvmlInit answers DriverNotLoaded, the second works."""

    class Late(FakeNvml):
        tries = 0

        def nvmlInit(self):
            Late.tries += 1
            if Late.tries == 1:
                raise self.NVMLError(9)

    _, lines = run_monitor(Late())
    assert lines[0]["type"] == "error" and "Driver Not Loaded" in lines[0]["why"]
    assert [x["type"] for x in lines[1:]] == ["start", "snapshot", "snapshot", "snapshot"]
    assert [f.code for f in MonitorState().feed_lines(json.dumps(x) for x in lines)] == ["monitor-error"]


def test_events_unavailable_and_wait_failing():
    """No event set (NotSupported); no GPU accepting registration; the event wait failing later; a GPU
    whose handle cannot be had (another node's); an XID from a device whose UUID cannot be read."""
    _, lines = run_monitor(FakeNvml(event_error=3))
    assert lines[0]["xid"]["status"] == "error"
    assert [f.code for f in MonitorState().feed(parse_line(lines[0]))] == ["xid-unwatched"]
    _, lines = run_monitor(FakeNvml(register_error=3))
    assert lines[0]["xid"]["why"] == "no GPU accepted XID event registration"
    _, lines = run_monitor(FakeNvml(wait_error=999))
    assert any(x["type"] == "error" and "XIDs no longer watched" in x["why"] for x in lines)
    _, lines = run_monitor(FakeNvml([h200_gpu(0), h200_gpu(1)], handle_errors={1: 4}))
    assert len(lines[0]["gpus"]) == 1
    nv = FakeNvml(xids=[(0, 31)])
    m = mon.Monitor(mon.parse_args(["--count", "1"]), nv, io.StringIO())
    m.setup()
    nv.gpus[0]["uuid"] = {"error": "Unknown Error"}
    assert m._index(__import__("gpu_fakes").Handle(0)) == (None, "")


def test_monitor_arguments_and_import_failure():
    for bad in (["--interval", "0"], ["--count", "-1"], ["--max-wait-ms", "0"]):
        with pytest.raises(SystemExit):
            mon.parse_args(bad)

    def boom():
        raise ImportError("No module named 'pynvml'")

    out = io.StringIO()
    assert mon.main(["--count", "1"], nvml_loader=boom, out=out) == 1
    assert json.loads(out.getvalue())["why"].startswith("nvidia-ml-py cannot be imported")


def test_sigterm_like_stop_and_shutdown_error():
    """The stop event (what SIGTERM sets) ends an endless monitor; nvmlShutdown failing is ignored."""
    nv = FakeNvml()
    nv.shutdown_error = True
    m = mon.Monitor(mon.parse_args(["--interval", "0.01", "--max-wait-ms", "5"]), nv, io.StringIO())
    t = threading.Timer(0.1, m.stop.set)
    t.start()
    assert m.run() == 0 and m.snapshots >= 1
    m2 = mon.Monitor(mon.parse_args(["--interval", "0.01"]), FakeNvml(event_error=3), io.StringIO())
    m2.setup()
    threading.Timer(0.05, m2.stop.set).start()
    m2.wait(5)  # sleeps in the stop event when no event set: returns at stop


def test_main_installs_signal_handlers(monkeypatch):
    seen = {}
    monkeypatch.setattr(mon.signal, "signal", lambda sig, fn: seen.setdefault(sig, fn))
    out = io.StringIO()
    assert mon.main(["--interval", "0.01", "--count", "1"], nvml_loader=lambda: FakeNvml(), out=out) == 0
    assert set(seen) == {mon.signal.SIGTERM, mon.signal.SIGINT}
    seen[mon.signal.SIGTERM]()  # the handler only sets the stop event


# ---------------------------------------------------------------- pure state machine

SNAP = {
    "type": "snapshot",
    "t": 30.0,
    "nvml_error": None,
    "gpus": [
        {
            "index": 0,
            "uuid": "GPU-a",
            "ecc_uncorrected_volatile": 0,
            "ecc_corrected_volatile": 0,
            "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
            "retired_pages_pending": {"unsupported": "NVMLError_NotSupported: Not Supported"},
        }
    ],
}


def snap(**gpu_changes):
    s = copy.deepcopy(SNAP)
    s["gpus"][0].update(gpu_changes)
    return s


def test_conditions_reported_when_they_appear_and_again_after_clearing():
    """Pending remap appears (reported), stays (not again), clears, appears again (reported again)."""
    st = MonitorState()
    pending = {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}
    assert st.feed(parse_line(snap())) == []
    assert [f.code for f in st.feed(parse_line(snap(remapped_rows=pending)))] == ["remap-pending"]
    assert st.feed(parse_line(snap(remapped_rows=pending))) == []
    assert st.feed(parse_line(snap())) == []
    assert [f.code for f in st.feed(parse_line(snap(remapped_rows=pending)))] == ["remap-pending"]


def test_state_machine_cases():
    st = MonitorState(expected_gpus=1)
    # already failing at the first snapshot: reported once
    out = st.feed(
        parse_line(
            snap(
                ecc_uncorrected_volatile=3,
                retired_pages_pending=True,
                remapped_rows={"pending": False, "failure": True},
            )
        )
    )
    assert [(f.code, f.action) for f in out] == [
        ("ecc-uncorrectable", "replace"),
        ("remap-failure", "replace"),
        ("retired-pages-pending", "recover"),
    ]
    assert out[0].message == "GPU 0: uncorrectable ECC errors 3 since the driver loaded"
    # the GPU disappears: lost (and missing vs the type), once; it comes back: cleared
    gone = copy.deepcopy(SNAP)
    gone["gpus"] = []
    assert [f.code for f in st.feed(parse_line(gone))] == ["gpu-lost", "gpu-missing"]
    assert st.feed(parse_line(gone)) == []
    st.feed(parse_line(snap(ecc_uncorrected_volatile=3)))
    assert st.gone == {} and "count" not in st.active
    # NVML stops answering: reported once, counters kept
    bad = dict(copy.deepcopy(SNAP), nvml_error="NVMLError_GpuIsLost: GPU is lost")
    assert [f.code for f in st.feed(parse_line(bad))] == ["driver-not-answering"]
    assert st.feed(parse_line(bad)) == [] and st.last.gpus["GPU-a"].ecc_uncorrected_volatile == 3
    # one GPU unreadable
    assert [f.code for f in st.feed(parse_line(snap(error="NVMLError_Unknown")))] == ["gpu-unreadable"]
    # a counter going down (driver reloaded) is not a finding
    assert st.feed(parse_line(snap(ecc_uncorrected_volatile=0))) == []


def test_parse_line_variants():
    assert parse_line("not json") is None and parse_line("[1]") is None and parse_line('{"type": "other"}') is None
    assert parse_line('{"type": "xid", "xid": "x"}') is None
    x = parse_line('{"type": "xid", "t": 3, "index": 0, "uuid": "GPU-a", "xid": 48}')
    assert x == XidEvent(3.0, 48, 0, "GPU-a")
    s = parse_line({"type": "snapshot", "gpus": [{"index": 1}, "junk"], "nvml_error": None})
    assert isinstance(s, Snapshot) and list(s.gpus) == ["index-1"]
    assert parse_line({"type": "start"}) == {"type": "start"}
    st = MonitorState()
    assert st.feed(None) == [] and st.feed(parse_line({"type": "start", "xid": {"status": "ok"}})) == []
    assert [f.code for f in st.feed(x)] == ["xid-48"]


def test_drain_reason_and_decide():
    fs = [
        Finding("xid-13", "warning", Action.MONITOR, "XID 13"),
        Finding("remap-pending", "error", Action.RECOVER, "pending"),
        Finding("ecc-uncorrectable", "fatal", Action.REPLACE, "ECC " + "x" * 300),
    ]
    r = drain_reason(fs)
    assert r.startswith("hp:gpu:replace:ecc-uncorrectable ECC xxx") and len(r) == REASON_MAX and r.endswith("...")
    assert drain_reason(fs[:2]) == "hp:gpu:recover:remap-pending pending"
    assert drain_reason(fs[:1]) == ""
    assert "(+1 more)" in drain_reason(fs[1:2] + [Finding("xid-74", "error", Action.RECOVER, "NVLink")])
    d = decide([])
    assert (d.drain, d.action, d.at_once, d.reason) == (False, "none", False, "")


def test_unreadable_gpu_is_not_nvml_gone():
    """Changed: the remapped-rows read answers Unknown Error (code 999): the GPU is unreadable, NVML is not gone."""
    _, lines = run_monitor(FakeNvml([h200_gpu(remapped_rows={"error": "Unknown Error"})]))
    assert lines[1]["nvml_error"] is None and lines[1]["gpus"][0]["error"] == "NVMLError: Unknown Error"
    assert [f.code for f in MonitorState().feed_lines(json.dumps(x) for x in lines)] == ["gpu-unreadable"]


def test_main_outside_the_main_thread_installs_no_handler():
    out, rc = io.StringIO(), []
    t = threading.Thread(
        target=lambda: rc.append(
            mon.main(["--interval", "0.01", "--count", "1"], nvml_loader=lambda: FakeNvml(), out=out)
        )
    )
    t.start()
    t.join()
    assert rc == [0] and out.getvalue().count("\n") == 2
