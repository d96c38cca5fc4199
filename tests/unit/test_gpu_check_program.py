"""hp_gpu_check.py (the program in hp's GPU check image), run here with nvidia-ml-py
replaced by FakeNvml answering the REAL H200's NVML values (tests/fixtures/gpu-h200/
nvml-snapshot.json) and CuPy by FakeBackend answering its measured GEMM / HBM figures.
What these tests cannot show: the CuPy backend itself (it needs a GPU)."""

from __future__ import annotations

import json
import subprocess

import pytest
from gpu_fakes import REAL_GEMM, FakeBackend, FakeNvml, Handle, fixture, h200_gpu, load_program

chk = load_program("hp_gpu_check")
BUS = "00000000:00:06.0"


def run(
    nv: FakeNvml | None = None,
    backend: FakeBackend | None = None,
    argv: list[str] | None = None,
    which=lambda b: None,
    runner=None,
) -> dict:
    nv = nv or FakeNvml()
    backend = backend or FakeBackend([g["pci"] for g in nv.gpus])
    return chk.run_check(
        argv if argv is not None else ["--expected-gpus", str(len(nv.gpus))],
        nvml_loader=lambda: nv,
        backend_loader=lambda: backend,
        which=which,
        run=runner or subprocess.run,
    )


def test_real_h200_values_through_the_program():
    """No change: the H200's NVML values and measured figures."""
    doc = run()
    assert doc["tool"] == "hp_gpu_check" and doc["format"] == 1
    sw = doc["software"]
    assert sw["status"] == "ok" and sw["driver_version"] == "580.159.04" and sw["cuda_driver_version"] == 13000
    assert sw["gpu_count"] == 1 and sw["expected_gpus"] == 1 and sw["inaccessible"] == []
    (g,) = sw["gpus"]
    assert g == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-3fadaaaa-e57c-b9f1-78a9-3213b39f962c",
        "pci_bus_id": BUS,
        "minor_number": 0,
        "memory_total_bytes": 150754820096,
        "persistence_mode": True,
        "compute_mode": "Default",
    }
    (c,) = doc["counters"]
    assert c["ecc_mode_current"] is True and c["ecc_uncorrected_volatile"] == 0
    assert c["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert c["retired_pages_pending"] == {"unsupported": "NVMLError: Not Supported"}
    assert c["clock_event_reasons"] == 1 and c["pcie"] == {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16}
    assert c["nvlink_active"] == 0 and c["power_w"] == 82.575 and c["power_limit_w"] == 700.0
    assert c["under_load"]["samples"] >= 2 and c["under_load"]["pcie_gen_best"] == 5
    assert c["under_load"]["sm_clock_max_mhz"] == 345 and c["under_load"]["power_max_w"] == 82.575
    assert doc["counters_start"][0]["ecc_uncorrected_volatile"] == 0
    (r,) = doc["compute"]["gpus"]
    assert r["cuda_device"] == 0 and r["gemm"]["tflops"] == REAL_GEMM["bf16_matmul_tflops"]
    assert r["hbm"]["gbps"] == REAL_GEMM["d2d_copy_GBps_read_plus_write"] and r["hbm"]["bytes"] == 4 << 30
    assert doc["nccl"]["status"] == "skipped" and "busbw is 0 by definition" in doc["nccl"]["why"]
    assert doc["xid"] == {"status": "ok", "why": None, "events": [], "unregistered": []}
    assert set(doc["timings_s"]) == {"software", "counters_start", "compute", "nccl", "counters", "total"}
    json.dumps(doc)  # one JSON document


def test_main_prints_one_json_line(monkeypatch, capsys):
    monkeypatch.setattr(chk, "load_nvml", lambda: FakeNvml())
    monkeypatch.setattr(chk, "run_check", lambda argv: {"tool": "hp_gpu_check", "argv": argv})
    assert chk.main(["--discover"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == {"tool": "hp_gpu_check", "argv": ["--discover"]}


def test_discover_prints_software_only():
    doc = run(argv=["--discover"])
    assert doc["software"]["gpu_count"] == 1 and "compute" not in doc and "xid" not in doc
    assert set(doc["timings_s"]) == {"software", "total"}


def test_arguments():
    a = chk.parse_args(["--hbm-bytes", "512M", "--nccl-min-bytes", "1k", "--nccl-max-bytes", "2GiB"])
    assert a.hbm_bytes == 512 << 20 and a.nccl_min_bytes == 1024 and a.nccl_max_bytes == 2 << 30
    assert chk.parse_args(["--hbm-bytes", "1000"]).hbm_bytes == 1000
    for bad in (
        ["--hbm-bytes", "lots"],
        ["--hbm-bytes", "0"],
        ["--gemm-seconds", "0"],
        ["--nccl-min-bytes", "2G", "--nccl-max-bytes", "1G"],
        ["--nccl", "mpi"],
    ):
        with pytest.raises(SystemExit) as e:
            chk.parse_args(bad)
        assert e.value.code == 2
    assert chk.nccl_sizes(16 << 20, 4 << 30) == [16 << 20, 64 << 20, 256 << 20, 1 << 30, 4 << 30]
    assert chk.norm_bus_id("00000000:00:06.0") == chk.norm_bus_id("0000:00:06.0") == "00:06.0"
    assert chk.norm_bus_id("weird") == "weird"


def test_nvml_does_not_initialise():
    """NVML init raises DriverNotLoaded (the driver is gone): every part says why, no crash."""
    doc = run(FakeNvml(init_error=9))
    assert doc["software"]["status"] == "error" and "Driver Not Loaded" in doc["software"]["why"]
    assert doc["compute"]["status"] == "skipped" and doc["nccl"]["status"] == "skipped"
    assert doc["xid"]["status"] == "skipped" and "counters" not in doc


def test_nvidia_ml_py_missing():
    def boom():
        raise ImportError("No module named 'pynvml'")

    doc = chk.run_check(["--expected-gpus", "1"], nvml_loader=boom, backend_loader=lambda: None)
    assert doc["software"]["why"] == "nvidia-ml-py cannot be imported: ImportError: No module named 'pynvml'"
    assert doc["compute"]["status"] == "skipped" and doc["xid"]["why"].startswith("nvidia-ml-py")
    doc = chk.run_check(["--discover"], nvml_loader=boom, backend_loader=lambda: None)
    assert doc["software"]["status"] == "error"


def test_cupy_missing():
    def boom():
        raise ImportError("libcublas.so.12: cannot open shared object file")

    nv = FakeNvml()
    doc = chk.run_check([], nvml_loader=lambda: nv, backend_loader=boom)
    assert doc["compute"] == {
        "status": "error",
        "why": "CuPy cannot be loaded: ImportError: libcublas.so.12: cannot open shared object file",
        "gpus": [],
    }


def test_count_fails_and_gpu_not_accessible():
    """Two copies of the H200: the second's handle answers NoPermission (a host GPU that is not this
    node's); then one whose handle answers GpuIsLost; then nvmlDeviceGetCount itself failing."""
    doc = run(FakeNvml([h200_gpu(0), h200_gpu(1)], handle_errors={1: 4}))
    assert doc["software"]["gpu_count"] == 1
    assert doc["software"]["inaccessible"] == [
        {"nvml_index": 1, "error": "NVMLError: Insufficient Permissions", "lost": False}
    ]
    doc = run(FakeNvml([h200_gpu(0), h200_gpu(1)], handle_errors={1: 15}))
    assert doc["software"]["inaccessible"][0]["lost"] is True

    class NoCount(FakeNvml):
        def nvmlDeviceGetCount(self):
            raise self.NVMLError(999)

    doc = run(NoCount())
    assert doc["software"]["status"] == "error" and "cannot count GPUs" in doc["software"]["why"]


def test_values_that_fail_or_are_missing():
    """Changed in the H200's values: PCI info, memory, persistence and compute mode answer Unknown Error;
    ECC mode and remapped rows NotSupported; NVLink link 0 Unknown Error; the clocks 'event' call missing
    (an older nvidia-ml-py that only has the 'throttle' name)."""
    g = h200_gpu(
        pci={"error": "Unknown Error"},
        memory_total={"error": "Unknown Error"},
        persistence={"error": "Unknown Error"},
        compute_mode={"error": "Unknown Error"},
        ecc_mode={"error": "NVMLError_NotSupported"},
        remapped_rows={"error": "NVMLError_NotSupported"},
        nvlink_state_0={"error": "Unknown Error"},
    )

    class OldNvml(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
            return 0x40

    nv = OldNvml([g])
    doc = run(nv, FakeBackend([]))
    s = doc["software"]["gpus"][0]
    assert s["pci_bus_id"] == {"error": "NVMLError: Unknown Error", "code": 999} and s["memory_total_bytes"]["error"]
    assert s["persistence_mode"]["error"] and s["compute_mode"]["error"]
    c = doc["counters"][0]
    assert "unsupported" in c["ecc_mode_current"] and "unsupported" in c["remapped_rows"]
    assert c["nvlink_active"] == {"error": "NVMLError: Unknown Error", "code": 999} and c["clock_event_reasons"] == 0x40
    assert doc["compute"]["gpus"][0]["error"].startswith("CUDA does not see the GPU at {'error'")
    assert doc["compute"]["status"] == "error"


def test_nvml_call_not_in_this_library():
    nvml = chk.Nvml(FakeNvml())
    assert nvml.call("nvmlDeviceGetNoSuchThing") == {"unsupported": "nvmlDeviceGetNoSuchThing not in this nvidia-ml-py"}
    assert "none of a, b" in nvml.first(("a", "b"))["unsupported"]


def test_nvlinks_counted():
    """Changed: links 0..3 of the H200 copy report active (1), link 4 inactive (0), the rest unsupported."""
    g = h200_gpu(**{f"nvlink_state_{i}": 1 for i in range(4)}, nvlink_state_4=0)
    assert run(FakeNvml([g]), argv=["--skip", "compute"])["counters"][0]["nvlink_active"] == 4
    every = h200_gpu(**{f"nvlink_state_{i}": 1 for i in range(18)})
    assert chk.nvlinks(chk.Nvml(FakeNvml([every])), Handle(0)) == 18


def test_xid_events_recorded():
    """XID 79 and 13 queued on the H200 copy's event set (as NVML would deliver them)."""
    doc = run(FakeNvml(xids=[(0, 79), (0, 13)]))
    assert [(e["index"], e["xid"]) for e in doc["xid"]["events"]] == [(0, 79), (0, 13)]
    assert doc["xid"]["status"] == "ok"


def test_xid_watch_degrades():
    """No event set (NotSupported), no GPU accepting registration, a wait that fails, --skip xid, and an
    event from a device whose UUID NVML cannot read."""
    doc = run(FakeNvml(event_error=3))
    assert doc["xid"]["status"] == "error" and doc["xid"]["why"].startswith("no NVML event set")
    doc = run(FakeNvml(register_error=4))
    assert doc["xid"]["why"] == "no GPU accepted XID event registration" and len(doc["xid"]["unregistered"]) == 1
    doc = run(FakeNvml(wait_error=999))
    assert doc["xid"]["status"] == "error" and "event wait failed" in doc["xid"]["why"]
    doc = run(argv=["--skip", "xid"])
    assert doc["xid"] == {"status": "skipped", "why": "--skip xid", "events": []}
    nv = FakeNvml(xids=[(0, 48)])
    watch = chk.XidWatch(chk.Nvml(nv), [(0, Handle(0))])
    nv.gpus[0]["uuid"] = {"error": "Unknown Error"}
    assert watch._index(Handle(0)) is None
    bad = chk.XidWatch(chk.Nvml(FakeNvml([h200_gpu(uuid={"error": "Unknown Error"})])), [(0, Handle(0))])
    assert bad._by_uuid == {}


def test_sampler_sees_load_reasons_and_best_link():
    """Changed: the clocks reasons answer HW slowdown (0x8) while loaded; idle gen 1 of 5 (the sampler
    keeps the best gen seen)."""
    nv = FakeNvml([h200_gpu(pcie_gen=1)])
    nv.load_mask = 0x8
    doc = run(nv)
    ul = doc["counters"][0]["under_load"]
    assert ul["clock_event_reasons_mask"] == 0x8 and ul["pcie_gen_best"] == 1


def test_compute_error_on_one_gpu():
    """Two H200 copies; CUDA raises on the second (an illegal address, as a sick GPU would)."""
    nv = FakeNvml([h200_gpu(0), h200_gpu(1)])
    backend = FakeBackend([g["pci"] for g in nv.gpus], errors={1: "CUDARuntimeError: cudaErrorIllegalAddress"})
    doc = run(nv, backend, argv=["--nccl", "off"])
    assert doc["compute"]["status"] == "ok"
    assert doc["compute"]["gpus"][1] == {
        "index": 1,
        "cuda_device": 1,
        "error": "RuntimeError: CUDARuntimeError: cudaErrorIllegalAddress",
    }
    assert doc["nccl"] == {"status": "skipped", "why": "not asked for", "ranks": 2}


def test_nccl_library_path():
    """Two H200 copies, no all_reduce_perf on PATH: CuPy's NCCL bindings (fake rows)."""
    nv = FakeNvml([h200_gpu(0), h200_gpu(1)])
    backend = FakeBackend([g["pci"] for g in reversed(nv.gpus)])  # CUDA order differs from NVML order
    doc = run(nv, backend)
    n = doc["nccl"]
    assert n["status"] == "ok" and n["method"] == "library" and n["library"] == "NCCL 2.28.9" and n["ranks"] == 2
    assert backend.all_reduce_devs == [1, 0] and n["rows"][-1]["size_bytes"] == 4 << 30
    assert [r["cuda_device"] for r in doc["compute"]["gpus"]] == [1, 0]


def test_nccl_library_unavailable_or_failing():
    nv = FakeNvml([h200_gpu(0), h200_gpu(1)])
    buses = [g["pci"] for g in nv.gpus]
    doc = run(nv, FakeBackend(buses, nccl_ok=(False, "CuPy was built without NCCL")), argv=["--skip", "compute"])
    assert doc["nccl"] == {"ranks": 2, "status": "error", "why": "CuPy was built without NCCL", "method": "library"}
    doc = run(
        nv, FakeBackend(buses, nccl_error="NcclError: NCCL_ERROR_UNHANDLED_CUDA_ERROR"), argv=["--skip", "compute"]
    )
    assert doc["nccl"]["why"].startswith("NCCL all_reduce through CuPy failed: RuntimeError: NcclError")
    assert doc["compute"] == {"status": "skipped", "why": "--skip compute", "gpus": []}
    assert "under_load" not in doc["counters"][0]


def test_nccl_tests_binary_path():
    """Two H200 copies with all_reduce_perf on PATH; its output is the REAL nccl-tests 2.19.6 text of the
    H200 (one rank), returned as the run's stdout."""
    nv = FakeNvml([h200_gpu(0), h200_gpu(1)])
    seen = {}

    def runner(cmd, **kw):
        seen["cmd"], seen["kw"] = cmd, kw
        return subprocess.CompletedProcess(cmd, 0, fixture("nccl-tests-2.19.6-all_reduce_perf-1xh200.txt"), "")

    doc = run(nv, argv=["--nccl", "tests", "--skip", "compute"], which=lambda b: "/usr/local/bin/" + b, runner=runner)
    n = doc["nccl"]
    assert n["status"] == "ok" and n["method"] == "nccl-tests" and n["exit_code"] == 0
    assert seen["cmd"] == [
        "/usr/local/bin/all_reduce_perf",
        "-b",
        str(16 << 20),
        "-e",
        str(4 << 30),
        "-f",
        "4",
        "-g",
        "2",
        "-c",
        "1",
    ]
    assert "# nccl-tests version 2.19.6" in n["output"]

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 3, "partial\n", "Test NCCL failure common.cu:1\n")

    n = run(nv, argv=["--skip", "compute"], which=lambda b: "/x/" + b, runner=failing)["nccl"]
    assert n["status"] == "error" and n["why"] == "all_reduce_perf exited 3" and "Test NCCL failure" in n["output"]

    def hanging(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"# nThread 1 nGpus 2\n")

    n = run(nv, argv=["--skip", "compute", "--nccl-timeout", "7"], which=lambda b: "/x/" + b, runner=hanging)["nccl"]
    assert n["why"] == "all_reduce_perf ran past 7 s" and n["output"].startswith("# nThread")

    def missing(cmd, **kw):
        raise FileNotFoundError(2, "No such file or directory")

    n = run(nv, argv=["--skip", "compute"], which=lambda b: "/x/" + b, runner=missing)["nccl"]
    assert n["why"].startswith("all_reduce_perf did not start: FileNotFoundError")
    n = run(nv, argv=["--nccl", "tests", "--skip", "compute"])["nccl"]
    assert n == {"ranks": 2, "status": "error", "why": "all_reduce_perf not found on PATH"}


def test_shutdown_error_ignored():
    nv = FakeNvml()
    nv.shutdown_error = True
    assert run(nv)["software"]["status"] == "ok"


def test_program_file_is_self_contained():
    """The image copies only the two programs: they import nothing from hp."""
    from gpu_fakes import IMAGE_DIR

    for name in ("hp_gpu_check.py", "hp_gpu_monitor.py"):
        text = (IMAGE_DIR / name).read_text()
        assert "orchestrator" not in text.split('"""', 2)[2], name


def test_xid_events_arriving_at_the_end_are_drained():
    """XIDs 94 and 95 queued after the watch thread's last wait: stop() still collects them."""
    nv = FakeNvml()
    watch = chk.XidWatch(chk.Nvml(nv), [(0, Handle(0))]).start()
    watch._stop.set()
    watch._thread.join()
    nv.xids = [(0, 94), (0, 95)]
    assert [e["xid"] for e in watch.stop()["events"]] == [94, 95]


def test_load_sampler_samples_while_running():
    import time as _time

    nv = FakeNvml()
    with chk.LoadSampler(chk.Nvml(nv), [(0, Handle(0))], interval=0.01) as s:
        _time.sleep(0.1)
    assert s.seen[0]["samples"] >= 4


def test_compute_without_sampler_and_real_loader(monkeypatch):
    nv = FakeNvml()
    args = chk.parse_args([])
    sw, _handles = chk.software(chk.Nvml(nv), 1)
    out = chk.compute(FakeBackend([nv.gpus[0]["pci"]]), sw["gpus"], args, None)
    assert out["status"] == "ok" and out["gpus"][0]["gemm"]["tflops"] > 600
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nv)
    assert chk.load_nvml() is nv
