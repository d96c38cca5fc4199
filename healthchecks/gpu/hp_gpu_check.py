#!/usr/bin/env python3
"""hp's GPU check: runs in hp's GPU check image on a node's GPUs and prints ONE JSON
document on stdout (judged by orchestrator/gpu/judge.py, never here).

Parts, each {"status": "ok" | "error" | "skipped", "why": ...} plus its data, so a
part that cannot run says why and the others still run:

  software   NVML answers; GPU count (accessible ones) vs --expected-gpus; driver and
             CUDA driver versions; per GPU name, UUID, PCI bus id, minor number,
             memory, persistence mode, compute mode.
  counters   per GPU, read at the start (counters_start) and at the end (counters):
             ECC mode, volatile uncorrected/corrected and aggregate uncorrected ECC,
             remapped rows (correctable, uncorrectable, pending, failure), retired
             pages pending, clock event reasons, PCIe gen/width current and max,
             active NVLinks, temperature, power; "under_load": what was seen while
             the GEMM ran (clock event reasons OR-ed, best PCIe gen/width, peak
             temperature, power and SM clock).
  xid        XID events seen during the run (NVML event set, critical XIDs).
  compute    per GPU: bf16 GEMM TFLOP/s (cuBLAS through CuPy) for --gemm-seconds,
             with a spot check of the result; HBM device-to-device copy GB/s
             (bytes read + written). All GPUs at once, one thread each.
  nccl       with >= 2 GPUs: intra-node all_reduce, by nccl-tests' all_reduce_perf
             when it is on PATH (its text output kept for hp's parser), else CuPy's
             NCCL bindings (rows of size, time, algbw, busbw, wrong results).
  timings_s  seconds per part and in total.

Exit status: 0 when the JSON was printed (whatever it says), 2 for bad arguments.
--discover prints the software part only (GPU inventory for hp's discovery).
Arguments by argv only; nothing is read from the environment except what CUDA and
NVML read themselves (CUDA_DEVICE_ORDER is set to PCI_BUS_ID when unset, so CUDA's
device numbers follow the PCI order NVML uses).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

FORMAT = 1
XID_POLL_MS = 500
SAMPLE_S = 0.5
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
NVLINK_MAX_LINKS = 18


def _size(text: str) -> int:
    """'16M' -> 16 MiB, '4G' -> 4 GiB, '512' -> 512 bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "KMG" else t
    try:
        value = int(float(num) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 16M, 4G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0: {text!r}")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hp_gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--expected-gpus", type=int, default=None, help="GPUs the node's type promises")
    p.add_argument("--discover", action="store_true", help="print the software part only")
    p.add_argument("--gemm-seconds", type=float, default=5.0)
    p.add_argument("--gemm-size", type=int, default=8192, help="M = N = K of the bf16 GEMM")
    p.add_argument("--hbm-bytes", type=_size, default=_size("4G"), help="bytes per copy (capped at 40%% of free)")
    p.add_argument("--hbm-iters", type=int, default=20)
    p.add_argument(
        "--nccl",
        choices=("auto", "tests", "library", "off"),
        default="auto",
        help="auto: all_reduce_perf if on PATH, else CuPy's NCCL bindings",
    )
    p.add_argument("--nccl-tests-bin", default="all_reduce_perf")
    p.add_argument("--nccl-min-bytes", type=_size, default=_size("16M"))
    p.add_argument("--nccl-max-bytes", type=_size, default=_size("4G"))
    p.add_argument("--nccl-timeout", type=float, default=300.0)
    p.add_argument("--skip", action="append", default=[], choices=("compute", "nccl", "xid"))
    a = p.parse_args(argv)
    if a.gemm_seconds <= 0 or a.gemm_size < 256 or a.hbm_iters < 1:
        p.error("--gemm-seconds > 0, --gemm-size >= 256 and --hbm-iters >= 1 are required")
    if a.nccl_min_bytes > a.nccl_max_bytes:
        p.error("--nccl-min-bytes is larger than --nccl-max-bytes")
    return a


def _err(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def norm_bus_id(bus: str) -> str:
    """'00000000:00:06.0' and '0000:00:06.0' -> '00:06.0' (bus:device.function)."""
    parts = bus.strip().lower().split(":")
    return ":".join(parts[-2:]) if len(parts) >= 2 else bus.strip().lower()


# --------------------------------------------------------------------------
# NVML
# --------------------------------------------------------------------------


class Nvml:
    """The NVML calls the check makes, through nvidia-ml-py (module `nv`); every
    value is the result, {"unsupported": why} or {"error": why}."""

    def __init__(self, nv: Any):
        self.nv = nv

    def _code(self, e: BaseException) -> int | None:
        return getattr(e, "value", None)

    def call(self, name: str, *args: Any) -> Any:
        fn = getattr(self.nv, name, None)
        if fn is None:
            return {"unsupported": f"{name} not in this nvidia-ml-py"}
        try:
            return _s(fn(*args))
        except self.nv.NVMLError as e:
            if self._code(e) == self.nv.NVML_ERROR_NOT_SUPPORTED:
                return {"unsupported": _err(e)}
            return {"error": _err(e), "code": self._code(e)}

    def first(self, names: tuple[str, ...], *args: Any) -> Any:
        """The first of several equivalent calls this nvidia-ml-py has (the
        clocks "event" names replaced "throttle" in 12.535)."""
        for name in names:
            if callable(getattr(self.nv, name, None)):
                return self.call(name, *args)
        return {"unsupported": f"none of {', '.join(names)} in this nvidia-ml-py"}


def _ok(v: Any) -> bool:
    return not isinstance(v, dict)


def software(nvml: Nvml, expected: int | None) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
    """The software part and the (index, handle) of every accessible GPU."""
    nv = nvml.nv
    out: dict[str, Any] = {"status": "ok", "why": None, "expected_gpus": expected}
    try:
        nv.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, LibRmVersionMismatch...
        out.update(status="error", why=f"NVML did not initialise: {_err(e)}", gpu_count=0, gpus=[])
        return out, []
    out["driver_version"] = nvml.call("nvmlSystemGetDriverVersion")
    out["nvml_version"] = nvml.call("nvmlSystemGetNVMLVersion")
    out["cuda_driver_version"] = nvml.call("nvmlSystemGetCudaDriverVersion")
    count = nvml.call("nvmlDeviceGetCount")
    if not _ok(count):
        out.update(status="error", why=f"NVML cannot count GPUs: {count}", gpu_count=0, gpus=[])
        return out, []
    gpus, handles, inaccessible = [], [], []
    for i in range(count):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as e:
            # NO_PERMISSION: a host GPU whose device node this container lacks;
            # GPU_IS_LOST: fallen off the bus. Both are reported, neither counted.
            inaccessible.append({"nvml_index": i, "error": _err(e), "lost": nvml._code(e) == nv.NVML_ERROR_GPU_IS_LOST})
            continue
        mem = nvml.call("nvmlDeviceGetMemoryInfo", h)
        pci = nvml.call("nvmlDeviceGetPciInfo", h)
        pers = nvml.call("nvmlDeviceGetPersistenceMode", h)
        mode = nvml.call("nvmlDeviceGetComputeMode", h)
        gpus.append(
            {
                "index": i,
                "name": nvml.call("nvmlDeviceGetName", h),
                "uuid": nvml.call("nvmlDeviceGetUUID", h),
                "pci_bus_id": _s(pci.busId) if _ok(pci) else pci,
                "minor_number": nvml.call("nvmlDeviceGetMinorNumber", h),
                "memory_total_bytes": mem.total if _ok(mem) else mem,
                "persistence_mode": (pers == nv.NVML_FEATURE_ENABLED) if _ok(pers) else pers,
                "compute_mode": COMPUTE_MODES.get(mode, f"mode {mode}") if _ok(mode) else mode,
            }
        )
        handles.append((i, h))
    out.update(gpu_count=len(gpus), gpus=gpus, inaccessible=inaccessible)
    return out, handles


def counters(nvml: Nvml, handles: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    nv = nvml.nv
    rows = []
    for i, h in handles:
        ecc = nvml.call("nvmlDeviceGetEccMode", h)
        remap = nvml.call("nvmlDeviceGetRemappedRows", h)
        retired = nvml.call("nvmlDeviceGetRetiredPagesPendingStatus", h)
        reasons = nvml.first(("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), h)
        power = nvml.call("nvmlDeviceGetPowerUsage", h)
        limit = nvml.call("nvmlDeviceGetEnforcedPowerLimit", h)
        rows.append(
            {
                "index": i,
                "ecc_mode_current": bool(ecc[0]) if _ok(ecc) else ecc,
                "ecc_mode_pending": bool(ecc[1]) if _ok(ecc) else ecc,
                "ecc_uncorrected_volatile": nvml.call(
                    "nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                ),
                "ecc_corrected_volatile": nvml.call(
                    "nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC
                ),
                "ecc_uncorrected_aggregate": nvml.call(
                    "nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC
                ),
                "remapped_rows": (
                    {
                        "correctable": int(remap[0]),
                        "uncorrectable": int(remap[1]),
                        "pending": bool(remap[2]),
                        "failure": bool(remap[3]),
                    }
                    if _ok(remap)
                    else remap
                ),
                "retired_pages_pending": (retired == nv.NVML_FEATURE_ENABLED) if _ok(retired) else retired,
                "clock_event_reasons": reasons,
                "pcie": {
                    "gen": nvml.call("nvmlDeviceGetCurrPcieLinkGeneration", h),
                    "gen_max": nvml.call("nvmlDeviceGetMaxPcieLinkGeneration", h),
                    "width": nvml.call("nvmlDeviceGetCurrPcieLinkWidth", h),
                    "width_max": nvml.call("nvmlDeviceGetMaxPcieLinkWidth", h),
                },
                "nvlink_active": nvlinks(nvml, h),
                "temperature_c": nvml.call("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
                "power_w": power / 1000 if _ok(power) else power,
                "power_limit_w": limit / 1000 if _ok(limit) else limit,
            }
        )
    return rows


def nvlinks(nvml: Nvml, h: Any) -> Any:
    """Active NVLinks of a GPU: 0 on a PCIe-only GPU (NVML answers NotSupported
    for link 0), or {"error": ...}."""
    active = 0
    for link in range(NVLINK_MAX_LINKS):
        state = nvml.call("nvmlDeviceGetNvLinkState", h, link)
        if not _ok(state):
            if "unsupported" in state or link > 0:
                return active  # past the last link, or no NVLink at all
            return state
        active += 1 if state == nvml.nv.NVML_FEATURE_ENABLED else 0
    return active


class XidWatch:
    """Collects critical XID events of the given GPUs from an NVML event set,
    in a thread, until stop(); waits in NVML (XID_POLL_MS), never spins."""

    def __init__(self, nvml: Nvml, handles: list[tuple[int, Any]], clock: Callable[[], float] = time.monotonic):
        self.nvml, self.nv, self.handles, self.clock = nvml, nvml.nv, handles, clock
        self.events: list[dict[str, Any]] = []
        self.unregistered: list[dict[str, Any]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        self.t0 = clock()
        self._by_uuid: dict[str, int] = {}
        for i, h in handles:
            uuid = nvml.call("nvmlDeviceGetUUID", h)
            if isinstance(uuid, str):
                self._by_uuid[uuid] = i

    def start(self) -> XidWatch:
        nv = self.nv
        try:
            self._set = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            self.error = f"no NVML event set: {_err(e)}"
            return self
        for i, h in self.handles:
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._set)
            except nv.NVMLError as e:
                self.unregistered.append({"index": i, "error": _err(e)})
        if len(self.unregistered) == len(self.handles):
            self.error = "no GPU accepted XID event registration"
            return self
        self._thread = threading.Thread(target=self._run, name="xid-watch", daemon=True)
        self._thread.start()
        return self

    def _index(self, device: Any) -> int | None:
        """NVML index of an event's device (handles are ctypes pointers: compare UUIDs)."""
        uuid = self.nvml.call("nvmlDeviceGetUUID", device)
        return self._by_uuid.get(uuid) if isinstance(uuid, str) else None

    def _wait(self, ms: int) -> bool:
        """One wait; False when the watch must end (an NVML error)."""
        nv = self.nv
        try:
            data = nv.nvmlEventSetWait_v2(self._set, ms)
        except nv.NVMLError as e:
            if getattr(e, "value", None) == nv.NVML_ERROR_TIMEOUT:
                return True
            self.error = f"NVML event wait failed: {_err(e)}"
            return False
        self.events.append(
            {
                "index": self._index(data.device),
                "xid": int(data.eventData),
                "event_type": int(data.eventType),
                "t_s": round(self.clock() - self.t0, 3),
            }
        )
        return True

    def _run(self) -> None:
        while not self._stop.is_set() and self._wait(XID_POLL_MS):
            pass

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            # events that arrived since the thread's last wait
            n = len(self.events)
            while self.error is None and self._wait(0) and len(self.events) > n:
                n = len(self.events)
        if self._set is not None:
            try:
                self.nv.nvmlEventSetFree(self._set)
            except self.nv.NVMLError:
                pass
        status = "error" if self.error else "ok"
        return {"status": status, "why": self.error, "events": self.events, "unregistered": self.unregistered}


class LoadSampler:
    """While the GEMM runs: clock event reasons (OR-ed), the best PCIe link,
    peak temperature, power and SM clock, every SAMPLE_S seconds."""

    def __init__(self, nvml: Nvml, handles: list[tuple[int, Any]], interval: float = SAMPLE_S):
        self.nvml, self.handles, self.interval = nvml, handles, interval
        self.seen: dict[int, dict[str, Any]] = {i: {"samples": 0} for i, _ in handles}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def sample(self) -> None:
        nv = self.nvml
        for i, h in self.handles:
            s = self.seen[i]
            s["samples"] += 1
            r = nv.first(("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), h)
            if _ok(r):
                s["clock_event_reasons_mask"] = s.get("clock_event_reasons_mask", 0) | int(r)
            for key, call, args, scale in (
                ("pcie_gen_best", "nvmlDeviceGetCurrPcieLinkGeneration", (), 1),
                ("pcie_width_best", "nvmlDeviceGetCurrPcieLinkWidth", (), 1),
                ("temperature_max_c", "nvmlDeviceGetTemperature", (nv.nv.NVML_TEMPERATURE_GPU,), 1),
                ("power_max_w", "nvmlDeviceGetPowerUsage", (), 1000),
                ("sm_clock_max_mhz", "nvmlDeviceGetClockInfo", (nv.nv.NVML_CLOCK_SM,), 1),
            ):
                v = nv.call(call, h, *args)
                if _ok(v):
                    v = v / scale if scale != 1 else v
                    s[key] = max(s.get(key, v), v)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> LoadSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()


# --------------------------------------------------------------------------
# Compute (CuPy): the only part that needs a GPU to run
# --------------------------------------------------------------------------


class CupyBackend:  # pragma: no cover - needs a GPU; exercised on the lent H200 by the device script
    """bf16 GEMM through cuBLAS (cublasGemmEx), D2D copies and NCCL through CuPy."""

    def __init__(self) -> None:
        import cupy
        import numpy
        from cupy.cuda import runtime
        from cupy_backends.cuda.libs import cublas

        self.cp, self.np, self.rt, self.cublas = cupy, numpy, runtime, cublas
        self.library = f"cupy {cupy.__version__}"

    def device_count(self) -> int:
        return int(self.rt.getDeviceCount())

    def pci_bus_id(self, dev: int) -> str:
        return str(self.rt.deviceGetPCIBusId(dev))

    def _bf16(self, n: int, salt: int) -> Any:
        # bf16 bit patterns of values in [1, 2): 0x3F80 | 7 mantissa bits
        cp = self.cp
        k = (cp.arange(n * n, dtype=cp.uint32) * 2654435761 + salt) >> 25
        return (cp.uint16(0x3F80) | k.astype(cp.uint16)).reshape(n, n)

    @staticmethod
    def _bf16_to_f32(np: Any, bits: Any) -> Any:
        return (bits.astype(np.uint32) << 16).view(np.float32)

    def _gemm_call(self, handle: int, n: int, a: Any, b: Any, c: Any, alpha: Any, beta: Any) -> None:
        """C = A B, column-major, bf16 in and out, FP32 accumulate (cublasGemmEx)."""
        bf16 = self.rt.CUDA_R_16BF
        self.cublas.gemmEx(
            handle,
            0,
            0,
            n,
            n,
            n,
            alpha.ctypes.data,
            a.data.ptr,
            bf16,
            n,
            b.data.ptr,
            bf16,
            n,
            beta.ctypes.data,
            c.data.ptr,
            bf16,
            n,
            self.cublas.CUBLAS_COMPUTE_32F,
            self.cublas.CUBLAS_GEMM_DEFAULT,
        )

    def gemm(self, dev: int, n: int, seconds: float) -> dict[str, Any]:
        cp, np = self.cp, self.np
        device = cp.cuda.Device(dev)
        with device:
            a, b = self._bf16(n, 1), self._bf16(n, 2)
            c = cp.empty((n, n), dtype=cp.uint16)
            handle = cp.cuda.device.get_cublas_handle()
            alpha = np.array(1.0, dtype=np.float32)
            beta = np.array(0.0, dtype=np.float32)
            for _ in range(3):
                self._gemm_call(handle, n, a, b, c, alpha, beta)
            device.synchronize()
            calls, t0 = 0, time.perf_counter()
            while True:
                for _ in range(10):
                    self._gemm_call(handle, n, a, b, c, alpha, beta)
                calls += 10
                device.synchronize()
                elapsed = time.perf_counter() - t0
                if elapsed >= seconds:
                    break
            # Spot check. Row-major a[r, q] read column-major with ld n is A(q, r), so
            # C(i, j) = sum_k A(i, k) B(k, j) = sum_k a[k, i] b[j, k], stored at c[j, i].
            worst = 0.0
            for i, j in ((0, 0), (n // 2, n // 3), (n - 1, n - 1)):
                col = self._bf16_to_f32(np, cp.asnumpy(a[:, i])).astype(np.float64)
                row = self._bf16_to_f32(np, cp.asnumpy(b[j, :])).astype(np.float64)
                want = float(np.dot(col, row))
                got = float(self._bf16_to_f32(np, cp.asnumpy(c[j, i : i + 1]))[0])
                worst = max(worst, abs(got - want) / abs(want))
            a = b = c = None
            cp.get_default_memory_pool().free_all_blocks()
        return {
            "tflops": 2 * n**3 * calls / elapsed / 1e12,
            "seconds": elapsed,
            "calls": calls,
            "size": n,
            "max_rel_error": worst,
            "result_ok": worst < 0.02,
        }

    def hbm(self, dev: int, nbytes: int, iters: int) -> dict[str, Any]:
        cp = self.cp
        with cp.cuda.Device(dev):
            free, _total = self.rt.memGetInfo()
            nbytes = min(nbytes, int(free * 0.4) // 2 // 2**20 * 2**20)
            src = cp.empty(nbytes, dtype=cp.uint8)
            dst = cp.empty(nbytes, dtype=cp.uint8)
            dst.data.copy_from_device(src.data, nbytes)
            cp.cuda.Device(dev).synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                dst.data.copy_from_device_async(src.data, nbytes)
            cp.cuda.Device(dev).synchronize()
            elapsed = time.perf_counter() - t0
            del src, dst
            cp.get_default_memory_pool().free_all_blocks()
        return {"gbps": 2 * nbytes * iters / elapsed / 1e9, "bytes": nbytes, "iters": iters, "seconds": elapsed}

    def nccl_available(self) -> tuple[bool, str]:
        try:
            from cupy.cuda import nccl
        except Exception as e:  # noqa: BLE001
            return False, f"cupy.cuda.nccl cannot be imported: {_err(e)}"
        if not nccl.available:
            return False, "CuPy was built without NCCL"
        v = int(nccl.get_version())  # 23203 -> 2.32.3
        return True, f"NCCL {v // 10000}.{v // 100 % 100}.{v % 100}"

    def _all_reduce_once(self, nccl: Any, comms: list[Any], bufs: list[tuple[Any, Any, Any]], count: int) -> None:
        nccl.groupStart()
        for comm, (send, recv, stream) in zip(comms, bufs, strict=True):
            comm.allReduce(send.data.ptr, recv.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        nccl.groupEnd()

    def all_reduce(self, devs: list[int], sizes: list[int], iters: int = 20) -> list[dict[str, Any]]:
        """nccl-tests' all_reduce measure, one process, one communicator per GPU:
        algbw = bytes / time, busbw = algbw * 2(n-1)/n; rank r sends r+1
        everywhere, so every element must come back n(n+1)/2."""
        cp = self.cp
        from cupy.cuda import nccl

        comms = nccl.NcclCommunicator.initAll(devs)
        n = len(devs)
        want = n * (n + 1) / 2
        rows = []
        try:
            for size in sizes:
                count = size // 4
                bufs: list[tuple[Any, Any, Any]] = []
                for rank, d in enumerate(devs):
                    with cp.cuda.Device(d):
                        bufs.append(
                            (
                                cp.full(count, rank + 1, dtype=cp.float32),
                                cp.empty(count, dtype=cp.float32),
                                cp.cuda.Stream(non_blocking=True),
                            )
                        )
                self._all_reduce_once(nccl, comms, bufs, count)
                for _send, _recv, stream in bufs:
                    stream.synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    self._all_reduce_once(nccl, comms, bufs, count)
                for _send, _recv, stream in bufs:
                    stream.synchronize()
                t = (time.perf_counter() - t0) / iters
                wrong = 0
                for d, (_send, recv, _stream) in zip(devs, bufs, strict=True):
                    with cp.cuda.Device(d):
                        ends = cp.asnumpy(recv[cp.asarray([0, count // 2, count - 1])])
                    wrong += int(sum(1 for x in ends if x != want))
                algbw = size / t / 1e9
                rows.append(
                    {
                        "size_bytes": size,
                        "time_us": t * 1e6,
                        "algbw_gbps": algbw,
                        "busbw_gbps": algbw * 2 * (n - 1) / n,
                        "wrong": wrong,
                    }
                )
                bufs.clear()
                for d in devs:
                    with cp.cuda.Device(d):
                        cp.get_default_memory_pool().free_all_blocks()
        finally:
            for comm in comms:
                comm.destroy()
        return rows


def load_backend() -> Any:  # pragma: no cover - imports CuPy
    return CupyBackend()


def compute(
    backend: Any, gpus: list[dict[str, Any]], args: argparse.Namespace, sampler: LoadSampler | None
) -> dict[str, Any]:
    """GEMM then HBM copy on every GPU at once (a thread per GPU)."""
    ndev = backend.device_count()
    by_bus = {norm_bus_id(backend.pci_bus_id(d)): d for d in range(ndev)}
    results: dict[int, dict[str, Any]] = {}
    plan = []
    for g in gpus:
        bus = g.get("pci_bus_id")
        dev = by_bus.get(norm_bus_id(bus)) if isinstance(bus, str) else None
        if dev is None:
            results[g["index"]] = {
                "index": g["index"],
                "error": f"CUDA does not see the GPU at {bus} (CUDA sees {ndev} device(s))",
            }
        else:
            plan.append((g["index"], dev))

    def one(index: int, dev: int) -> None:
        row: dict[str, Any] = {"index": index, "cuda_device": dev}
        try:
            row["gemm"] = backend.gemm(dev, args.gemm_size, args.gemm_seconds)
            row["hbm"] = backend.hbm(dev, args.hbm_bytes, args.hbm_iters)
        except Exception as e:  # noqa: BLE001 - a CUDA error on one GPU is that GPU's result
            row["error"] = _err(e)
        results[index] = row

    threads = [threading.Thread(target=one, args=p, name=f"gpu{p[0]}") for p in plan]
    ctx = sampler if sampler is not None else _Null()
    with ctx:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    rows = [results[i] for i in sorted(results)]
    failed = [r for r in rows if "error" in r]
    status = "error" if rows and len(failed) == len(rows) else "ok"
    return {
        "status": status,
        "why": failed[0]["error"] if status == "error" else None,
        "library": getattr(backend, "library", "?"),
        "gpus": rows,
    }


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def nccl_sizes(lo: int, hi: int) -> list[int]:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= 4
    return sizes


def nccl(
    backend_loader: Callable[[], Any],
    gpus: list[dict[str, Any]],
    args: argparse.Namespace,
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., Any] = subprocess.run,
) -> dict[str, Any]:
    n = len(gpus)
    base: dict[str, Any] = {"ranks": n}
    if n < 2:
        return {
            **base,
            "status": "skipped",
            "why": f"{n} GPU: an all_reduce needs 2 ranks (with one, busbw is 0 by definition)",
        }
    binary = which(args.nccl_tests_bin) if args.nccl in ("auto", "tests") else None
    if args.nccl == "tests" and binary is None:
        return {**base, "status": "error", "why": f"{args.nccl_tests_bin} not found on PATH"}
    if binary:
        cmd = [
            binary,
            "-b",
            str(args.nccl_min_bytes),
            "-e",
            str(args.nccl_max_bytes),
            "-f",
            "4",
            "-g",
            str(n),
            "-c",
            "1",
        ]
        try:
            p = run(cmd, capture_output=True, text=True, timeout=args.nccl_timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            return {
                **base,
                "status": "error",
                "why": f"all_reduce_perf ran past {args.nccl_timeout:g} s",
                "method": "nccl-tests",
                "argv": cmd,
                "output": out[-20000:],
            }
        except OSError as e:
            return {
                **base,
                "status": "error",
                "why": f"all_reduce_perf did not start: {_err(e)}",
                "method": "nccl-tests",
                "argv": cmd,
            }
        status = "ok" if p.returncode == 0 else "error"
        return {
            **base,
            "status": status,
            "why": None if status == "ok" else f"all_reduce_perf exited {p.returncode}",
            "method": "nccl-tests",
            "argv": cmd,
            "exit_code": p.returncode,
            "output": (p.stdout + ("\n" + p.stderr if p.stderr else ""))[-20000:],
        }
    try:
        backend = backend_loader()
        ok, what = backend.nccl_available()
        if not ok:
            return {**base, "status": "error", "why": what, "method": "library"}
        by_bus = {norm_bus_id(backend.pci_bus_id(d)): d for d in range(backend.device_count())}
        devs = [by_bus[norm_bus_id(g["pci_bus_id"])] for g in gpus]
        rows = backend.all_reduce(devs, nccl_sizes(args.nccl_min_bytes, args.nccl_max_bytes))
    except Exception as e:  # noqa: BLE001 - NCCL or CUDA failure: the result says so
        return {
            **base,
            "status": "error",
            "why": f"NCCL all_reduce through CuPy failed: {_err(e)}",
            "method": "library",
        }
    return {**base, "status": "ok", "why": None, "method": "library", "library": what, "rows": rows}


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def load_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def run_check(
    argv: list[str],
    *,
    nvml_loader: Callable[[], Any] = load_nvml,
    backend_loader: Callable[[], Any] = load_backend,
    which: Callable[[str], str | None] = shutil.which,
    run: Callable[..., Any] = subprocess.run,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    args = parse_args(argv)
    t_start = clock()
    timings: dict[str, float] = {}
    doc: dict[str, Any] = {
        "tool": "hp_gpu_check",
        "format": FORMAT,
        "argv": argv,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "timings_s": timings,
    }

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t0 = clock()
        try:
            return fn()
        finally:
            timings[name] = round(clock() - t0, 3)

    try:
        nv = nvml_loader()
    except Exception as e:  # noqa: BLE001 - nvidia-ml-py missing from the image
        doc["software"] = {
            "status": "error",
            "why": f"nvidia-ml-py cannot be imported: {_err(e)}",
            "expected_gpus": args.expected_gpus,
            "gpu_count": 0,
            "gpus": [],
        }
        nv = None
    handles: list[tuple[int, Any]] = []
    nvml = Nvml(nv) if nv is not None else None
    if nvml is not None:
        doc["software"], handles = timed("software", lambda: software(nvml, args.expected_gpus))
    if args.discover:
        timings["total"] = round(clock() - t_start, 3)
        return doc
    sw_ok = nvml is not None and doc["software"]["status"] == "ok"
    gpus = doc["software"].get("gpus", []) if sw_ok else []
    why_no_gpu = doc["software"]["why"] if not sw_ok else "no accessible GPU"

    watch = XidWatch(nvml, handles, clock).start() if sw_ok and handles and "xid" not in args.skip else None
    sampler = LoadSampler(nvml, handles) if sw_ok else None
    if sw_ok:
        doc["counters_start"] = timed("counters_start", lambda: counters(nvml, handles))
    if "compute" in args.skip:
        doc["compute"] = {"status": "skipped", "why": "--skip compute", "gpus": []}
    elif not gpus:
        doc["compute"] = {"status": "skipped", "why": why_no_gpu, "gpus": []}
    else:

        def do_compute() -> dict[str, Any]:
            try:
                backend = backend_loader()
            except Exception as e:  # noqa: BLE001 - CuPy or the CUDA libraries missing / broken
                return {"status": "error", "why": f"CuPy cannot be loaded: {_err(e)}", "gpus": []}
            return compute(backend, gpus, args, sampler)

        doc["compute"] = timed("compute", do_compute)
    if "nccl" in args.skip or args.nccl == "off":
        doc["nccl"] = {"status": "skipped", "why": "not asked for", "ranks": len(gpus)}
    elif not gpus:
        doc["nccl"] = {"status": "skipped", "why": why_no_gpu, "ranks": 0}
    else:
        doc["nccl"] = timed("nccl", lambda: nccl(backend_loader, gpus, args, which, run))
    if sw_ok:
        doc["counters"] = timed("counters", lambda: counters(nvml, handles))
    if watch is not None:
        doc["xid"] = watch.stop()
    elif "xid" in args.skip:
        doc["xid"] = {"status": "skipped", "why": "--skip xid", "events": []}
    else:
        doc["xid"] = {"status": "skipped", "why": why_no_gpu, "events": []}
    if sampler is not None and doc["compute"]["status"] != "skipped":
        for row in doc["counters"]:
            row["under_load"] = sampler.seen.get(row["index"])
    if nvml is not None and sw_ok:
        try:
            nvml.nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    timings["total"] = round(clock() - t_start, 3)
    return doc


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    doc = run_check(sys.argv[1:] if argv is None else argv)
    json.dump(doc, sys.stdout, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
