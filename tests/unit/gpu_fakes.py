"""Test doubles for hp's GPU check and monitor programs, fed with REAL H200 data.

FakeNvml stands in for nvidia-ml-py (module ``pynvml``): every value it answers
comes from tests/fixtures/gpu-h200/nvml-snapshot.json (an NVML snapshot of the
lent H200 through nvidia-ml-py) and, for what the snapshot lacks (the minor
number), nvidia-smi-q.xml of the same machine. Calls the H200 answered
"NVMLError_NotSupported" raise NVMLError(NOT_SUPPORTED) here too. Tests mutate
copies of these values to make failures, and say so.

FakeBackend stands in for the CuPy compute backend: it returns the GEMM and
HBM figures measured on that H200 (torch-gemm-hbm.json: 659.79 TFLOP/s,
4282.48 GB/s), unless a test gives others.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator import resources

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gpu-h200"
IMAGE_DIR = resources.healthchecks() / "gpu"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def load_program(name: str) -> Any:
    """Import hp_gpu_check.py / hp_gpu_monitor.py from the GPU check's folder."""
    if str(IMAGE_DIR) not in sys.path:
        sys.path.insert(0, str(IMAGE_DIR))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, IMAGE_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


REAL_SNAPSHOT = json.loads(fixture("nvml-snapshot.json"))
REAL_GEMM = json.loads(fixture("torch-gemm-hbm.json"))
REAL_MINOR = 0  # <minor_number>0</minor_number> in nvidia-smi-q.xml


class NVMLError(Exception):
    NAMES = {
        3: "Not Supported",
        4: "Insufficient Permissions",
        10: "Timeout",
        12: "NVML Shared Library Not Found",
        15: "GPU is lost",
        9: "Driver Not Loaded",
        999: "Unknown Error",
    }

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self.NAMES.get(self.value, f"error {self.value}")


class Handle:
    def __init__(self, index: int):
        self.index = index


class _Obj:
    def __init__(self, **kw: Any):
        self.__dict__.update(kw)


def _code(v: Any) -> int | None:
    """A snapshot value {"error": "NVMLError_NotSupported: ..."} -> 3."""
    if isinstance(v, dict) and "error" in v:
        text = v["error"]
        for code, name in NVMLError.NAMES.items():
            if name.replace(" ", "") in text.replace(" ", "") or f"NVMLError_{name.replace(' ', '')}" in text:
                return code
        return 999
    return None


def h200_gpu(index: int = 0, **changes: Any) -> dict[str, Any]:
    """A copy of the real H200's NVML values; changes (and index > 0: another
    UUID, bus id and minor) are the test's mutations."""
    g = copy.deepcopy(REAL_SNAPSHOT["gpus"][0])
    g["minor"] = REAL_MINOR
    if index:
        g["index"] = index
        g["uuid"] = g["uuid"][:-2] + f"{index:02d}"
        g["pci"] = f"00000000:{index + 0x10:02x}:00.0"
        g["minor"] = index
    g.update(changes)
    return g


class FakeNvml:
    """The subset of pynvml the programs call, answering from `gpus` (h200_gpu dicts)."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_FEATURE_ENABLED = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    nvmlEventTypeXidCriticalError = 8

    def __init__(
        self,
        gpus: list[dict[str, Any]] | None = None,
        *,
        driver: str = REAL_SNAPSHOT["driver"],
        cuda: int = REAL_SNAPSHOT["cuda"],
        init_error: int | None = None,
        handle_errors: dict[int, int] | None = None,
        xids: list[tuple[int, int]] | None = None,
        event_error: int | None = None,
        register_error: int | None = None,
        wait_error: int | None = None,
    ):
        self.gpus = gpus if gpus is not None else [h200_gpu()]
        self.driver, self.cuda = driver, cuda
        self.init_error, self.handle_errors = init_error, handle_errors or {}
        self.xids = list(xids or [])
        self.event_error, self.register_error, self.wait_error = event_error, register_error, wait_error
        self.calls: list[str] = []
        self.load_mask: int | None = None  # clock event reasons while "loaded" (LoadSampler)
        self.shutdown_error = False

    # -- helpers --------------------------------------------------------------------
    def _g(self, h: Handle) -> dict[str, Any]:
        return self.gpus[h.index]

    def _val(self, h: Handle, key: str) -> Any:
        v = self._g(h).get(key)
        code = _code(v)
        if code is not None:
            raise NVMLError(code)
        if v is None:
            raise NVMLError(3)
        return v

    # -- system ---------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        if self.shutdown_error:
            raise NVMLError(999)

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return self.driver.encode()

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13." + self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        if i in self.handle_errors:
            raise NVMLError(self.handle_errors[i])
        return Handle(i)

    # -- device ---------------------------------------------------------------------
    def nvmlDeviceGetName(self, h: Handle) -> str:
        return self._val(h, "name")

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        return self._val(h, "uuid")

    def nvmlDeviceGetPciInfo(self, h: Handle) -> _Obj:
        return _Obj(busId=self._val(h, "pci").encode())

    def nvmlDeviceGetMinorNumber(self, h: Handle) -> int:
        return self._val(h, "minor")

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> _Obj:
        return _Obj(total=self._val(h, "memory_total"))

    def nvmlDeviceGetPersistenceMode(self, h: Handle) -> int:
        return self._val(h, "persistence")

    def nvmlDeviceGetComputeMode(self, h: Handle) -> int:
        return self._val(h, "compute_mode")

    def nvmlDeviceGetEccMode(self, h: Handle) -> list[int]:
        return self._val(h, "ecc_mode")

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, kind: int, counter: int) -> int:
        key = {
            (1, 0): "ecc_uncorrected_volatile",
            (0, 0): "ecc_corrected_volatile",
            (1, 1): "ecc_uncorrected_aggregate",
        }[(kind, counter)]
        return self._val(h, key)

    def nvmlDeviceGetRemappedRows(self, h: Handle) -> list[int]:
        return self._val(h, "remapped_rows")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Handle) -> int:
        return self._val(h, "retired_pages_pending")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Handle) -> int:
        if self.load_mask is not None:
            return self.load_mask
        return self._val(h, "throttle_reasons")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Handle) -> int:
        return self._val(h, "pcie_gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Handle) -> int:
        return self._val(h, "pcie_gen_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Handle) -> int:
        return self._val(h, "pcie_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Handle) -> int:
        return self._val(h, "pcie_width_max")

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        return self._val(h, f"nvlink_state_{link}")

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        return self._val(h, "temperature")

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return self._val(h, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Handle) -> int:
        return self._val(h, "power_limit_mw")

    def nvmlDeviceGetClockInfo(self, h: Handle, clock: int) -> int:
        return self._val(h, "sm_clock")

    # -- events ---------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> str:
        if self.event_error is not None:
            raise NVMLError(self.event_error)
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: Handle, kinds: int, es: str) -> None:
        if self.register_error is not None:
            raise NVMLError(self.register_error)

    def nvmlEventSetWait_v2(self, es: str, ms: int) -> _Obj:
        if self.xids:
            index, xid = self.xids.pop(0)
            return _Obj(device=Handle(index), eventType=8, eventData=xid)
        if self.wait_error is not None:
            raise NVMLError(self.wait_error)
        time.sleep(min(ms, 5) / 1000)
        raise NVMLError(10)

    def nvmlEventSetFree(self, es: str) -> None:
        raise NVMLError(999)  # freeing may fail at exit; the programs ignore it


class FakeBackend:
    """Compute backend answering the H200's measured figures, per PCI bus id."""

    library = "fake backend (figures measured on the H200: torch-gemm-hbm.json)"

    def __init__(
        self,
        bus_ids: list[str],
        gemm: dict[int, float] | None = None,
        hbm: dict[int, float] | None = None,
        errors: dict[int, str] | None = None,
        wrong: set[int] | None = None,
        nccl_rows: list[dict[str, Any]] | None = None,
        nccl_ok: tuple[bool, str] = (True, "NCCL 2.28.9"),
        nccl_error: str | None = None,
    ):
        self.bus_ids = bus_ids
        self.gemm_by_dev = gemm or {}
        self.hbm_by_dev = hbm or {}
        self.errors = errors or {}
        self.wrong = wrong or set()
        self.nccl_rows, self.nccl_ok, self.nccl_error = nccl_rows, nccl_ok, nccl_error
        self.all_reduce_devs: list[int] | None = None

    def device_count(self) -> int:
        return len(self.bus_ids)

    def pci_bus_id(self, dev: int) -> str:
        # CUDA's form: 4-digit domain, upper case hex
        return "0000:" + ":".join(self.bus_ids[dev].split(":")[-2:]).upper()

    def gemm(self, dev: int, n: int, seconds: float) -> dict[str, Any]:
        if dev in self.errors:
            raise RuntimeError(self.errors[dev])
        wrong = dev in self.wrong
        return {
            "tflops": self.gemm_by_dev.get(dev, REAL_GEMM["bf16_matmul_tflops"]),
            "seconds": seconds,
            "calls": 100,
            "size": n,
            "max_rel_error": 0.5 if wrong else 0.002,
            "result_ok": not wrong,
        }

    def hbm(self, dev: int, nbytes: int, iters: int) -> dict[str, Any]:
        return {
            "gbps": self.hbm_by_dev.get(dev, REAL_GEMM["d2d_copy_GBps_read_plus_write"]),
            "bytes": nbytes,
            "iters": iters,
            "seconds": 0.1,
        }

    def nccl_available(self) -> tuple[bool, str]:
        return self.nccl_ok

    def all_reduce(self, devs: list[int], sizes: list[int]) -> list[dict[str, Any]]:
        self.all_reduce_devs = devs
        if self.nccl_error:
            raise RuntimeError(self.nccl_error)
        if self.nccl_rows is not None:
            return self.nccl_rows
        n = len(devs)
        return [
            {"size_bytes": s, "time_us": 100.0, "algbw_gbps": 240.0, "busbw_gbps": 240.0 * 2 * (n - 1) / n, "wrong": 0}
            for s in sizes
        ]
