#!/usr/bin/env python3
"""hp's passive GPU monitor: runs long-lived in hp's GPU check image with a node's
GPUs and prints one JSON line per snapshot or event on stdout (judged by
orchestrator/gpu/monitor.py):

  {"type": "start", ...}     once: the GPUs watched, whether XID events can be watched
  {"type": "xid", ...}       at once, for every critical XID (NVML event set)
  {"type": "snapshot", ...}  every --interval seconds: volatile ECC counters, remapped
                             rows, retired pages pending; "nvml_error" when NVML fails
  {"type": "error", ...}     NVML could not start (retried every --interval)

Cheap on CPU: it sleeps inside NVML's event wait (at most --max-wait-ms at a time, so
that SIGTERM ends it within that) and reads a handful of counters per interval.
Arguments by argv only. SIGTERM / SIGINT: exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hp_gpu_check import Nvml, _err, _ok, load_nvml  # noqa: E402  (same folder in the image)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hp_gpu_monitor.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--interval", type=float, default=30.0, help="seconds between counter snapshots")
    p.add_argument("--max-wait-ms", type=int, default=2000, help="longest single wait inside NVML")
    p.add_argument("--count", type=int, default=0, help="stop after this many snapshots (0: never; tests)")
    a = p.parse_args(argv)
    if a.interval <= 0 or a.max_wait_ms <= 0 or a.count < 0:
        p.error("--interval and --max-wait-ms must be > 0, --count >= 0")
    return a


def snapshot_gpus(nvml: Nvml, handles: list[tuple[int, Any]], uuids: dict[int, str]) -> tuple[list[dict], str | None]:
    """Counters of every GPU; nvml_error when NVML itself stops answering (a
    GPU lost, the driver gone)."""
    nv = nvml.nv
    # NVML itself gone: a GPU lost (fallen off the bus), NVML uninitialised, the driver unloaded
    fatal_codes = {
        getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15),
        getattr(nv, "NVML_ERROR_UNINITIALIZED", 1),
        getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9),
    }
    rows, fatal = [], None
    for i, h in handles:
        row: dict[str, Any] = {"index": i, "uuid": uuids.get(i, "")}
        unc = nvml.call("nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        cor = nvml.call("nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        remap = nvml.call("nvmlDeviceGetRemappedRows", h)
        retired = nvml.call("nvmlDeviceGetRetiredPagesPendingStatus", h)
        row["ecc_uncorrected_volatile"] = unc
        row["ecc_corrected_volatile"] = cor
        row["remapped_rows"] = (
            {
                "correctable": int(remap[0]),
                "uncorrectable": int(remap[1]),
                "pending": bool(remap[2]),
                "failure": bool(remap[3]),
            }
            if _ok(remap)
            else remap
        )
        row["retired_pages_pending"] = (retired == nv.NVML_FEATURE_ENABLED) if _ok(retired) else retired
        errors = [v for v in (unc, cor, remap, retired) if isinstance(v, dict) and "error" in v]
        if errors:
            row["error"] = errors[0]["error"]
            if any(e.get("code") in fatal_codes for e in errors):
                fatal = errors[0]["error"]
        rows.append(row)
    return rows, fatal


class Monitor:
    def __init__(
        self, args: argparse.Namespace, nv: Any, out: TextIO = sys.stdout, clock: Callable[[], float] = time.monotonic
    ):
        self.args, self.nvml, self.nv, self.out, self.clock = args, Nvml(nv), nv, out, clock
        self.stop = threading.Event()
        self.t0 = clock()
        self.handles: list[tuple[int, Any]] = []
        self.uuids: dict[int, str] = {}
        self.events: Any = None
        self.snapshots = 0

    def emit(self, kind: str, **fields: Any) -> None:
        self.out.write(json.dumps({"type": kind, "t": round(self.clock() - self.t0, 3), **fields}, default=str) + "\n")
        self.out.flush()

    def setup(self) -> bool:
        nv = self.nv
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except Exception as e:  # noqa: BLE001 - the driver is not there (yet)
            self.emit("error", why=f"NVML did not initialise: {_err(e)}")
            return False
        self.handles = []
        for i in range(count):
            try:
                self.handles.append((i, nv.nvmlDeviceGetHandleByIndex(i)))
            except nv.NVMLError:
                continue  # a host GPU that is not this node's (or lost: the snapshots will tell)
        self.uuids = {i: self.nvml.call("nvmlDeviceGetUUID", h) for i, h in self.handles}
        xid = {"status": "ok", "why": None}
        try:
            self.events = nv.nvmlEventSetCreate()
            registered = 0
            for _i, h in self.handles:
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self.events)
                    registered += 1
                except nv.NVMLError:
                    pass
            if not registered:
                xid = {"status": "error", "why": "no GPU accepted XID event registration"}
                self.events = None
        except nv.NVMLError as e:
            xid = {"status": "error", "why": f"no NVML event set: {_err(e)}"}
            self.events = None
        self.emit(
            "start",
            interval_s=self.args.interval,
            xid=xid,
            gpus=[{"index": i, "uuid": self.uuids.get(i)} for i, _ in self.handles],
        )
        return True

    def _index(self, device: Any) -> tuple[int | None, str]:
        uuid = self.nvml.call("nvmlDeviceGetUUID", device)
        for i, u in self.uuids.items():
            if u == uuid:
                return i, u
        return None, uuid if isinstance(uuid, str) else ""

    def wait(self, seconds: float) -> None:
        """Wait up to `seconds`, inside NVML's event wait when events are
        watched (printing any XID at once), in slices of --max-wait-ms."""
        nv = self.nv
        end = self.clock() + seconds
        while not self.stop.is_set():
            left = end - self.clock()
            if left <= 0:
                return
            ms = max(1, min(int(left * 1000), self.args.max_wait_ms))
            if self.events is None:
                self.stop.wait(ms / 1000)
                continue
            try:
                data = nv.nvmlEventSetWait_v2(self.events, ms)
            except nv.NVMLError as e:
                if getattr(e, "value", None) != nv.NVML_ERROR_TIMEOUT:
                    self.emit("error", why=f"NVML event wait failed, XIDs no longer watched: {_err(e)}")
                    self.events = None
                continue
            index, uuid = self._index(data.device)
            self.emit("xid", index=index, uuid=uuid, xid=int(data.eventData))

    def run(self) -> int:
        while not self.stop.is_set() and not self.setup():
            self.wait(self.args.interval)
        while not self.stop.is_set():
            rows, fatal = snapshot_gpus(self.nvml, self.handles, self.uuids)
            self.emit("snapshot", gpus=rows, nvml_error=fatal)
            self.snapshots += 1
            if self.args.count and self.snapshots >= self.args.count:
                break
            self.wait(self.args.interval)
        try:
            self.nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
        return 0


def main(argv: list[str] | None = None, nvml_loader: Callable[[], Any] = load_nvml, out: TextIO = sys.stdout) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        nv = nvml_loader()
    except Exception as e:  # noqa: BLE001
        out.write(json.dumps({"type": "error", "t": 0.0, "why": f"nvidia-ml-py cannot be imported: {_err(e)}"}) + "\n")
        return 1
    mon = Monitor(args, nv, out)

    def stop(*_: Any) -> None:
        mon.stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    return mon.run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
