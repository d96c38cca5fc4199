"""orchestrator.gpu.judge judging the GPU check's JSON.

The passing document is what hp_gpu_check.py prints from the REAL H200's NVML values
(tests/fixtures/gpu-h200/nvml-snapshot.json, through FakeNvml) and its measured GEMM
and HBM figures (torch-gemm-hbm.json, through FakeBackend). Each failing case mutates a
copy of those values (or of the document), and its docstring says what it changed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from gpu_fakes import FakeBackend, FakeNvml, fixture, h200_gpu, load_program

from orchestrator.gpu.judge import (
    XID_TABLE,
    DcgmRun,
    Finding,
    judge_gpu_check,
    strongest,
    xid_policy,
)
from orchestrator.gpu.thresholds import load_thresholds
from orchestrator.verdict import Action, Verdict

chk = load_program("hp_gpu_check")
TABLE = load_thresholds(env={})
H200 = TABLE.for_model("h200")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def check_doc(gpus=None, backend_kw=None, argv=None, which=lambda b: None, runner=subprocess.run, **nv_kw) -> dict:
    nv = FakeNvml(gpus if gpus is not None else [h200_gpu()], **nv_kw)
    backend = FakeBackend([g["pci"] for g in nv.gpus], **(backend_kw or {}))
    return chk.run_check(
        argv if argv is not None else ["--expected-gpus", str(len(nv.gpus))],
        nvml_loader=lambda: nv,
        backend_loader=lambda: backend,
        which=which,
        run=runner,
    )


def judge(doc, expected=1, model="h200", th=H200, **kw):
    return judge_gpu_check(doc, expected_gpus=expected, model=model, thresholds=th, **kw)


def codes(v) -> set[str]:
    return {f.code for f in v.findings}


def only_failure(v, code, severity, action):
    fails = [f for f in v.findings if f.fails]
    assert [f.code for f in fails] == [code], [f.message for f in fails]
    assert (fails[0].severity, fails[0].action) == (severity, action)
    assert not v.passed and v.reasons == [fails[0].message] and v.action == action
    return fails[0]


def test_real_h200_passes():
    """No change: the H200's real NVML values and measured figures (660 TFLOP/s, 4282 GB/s)."""
    v = judge(check_doc())
    assert v.passed and v.reasons == [] and v.action == "none"
    assert codes(v) == {"dcgm-not-configured", "nccl-one-rank"}
    assert "DCGM not configured" in " ".join(v.notes)
    f = v.figures
    assert f["gpus_seen"] == f["gpus_expected"] == 1 and f["driver_major"] == 580
    assert f["gpu0.gemm"] == pytest.approx(659.79, abs=0.01) and f["gemm_min"] == 550
    assert f["gpu0.hbm"] == pytest.approx(4282.48, abs=0.01) and f["hbm_min"] == 3200
    assert f["gpu0.pcie_gen"] == f["gpu0.pcie_gen_max"] == 5 and f["gpu0.pcie_width"] == 16
    assert f["gpu0.ecc_uncorrected_volatile"] == 0 and f["xid_events"] == 0 and f["dcgm_configured"] == 0
    assert "seconds.total" in f and "gemm_threshold_measured" not in f
    assert isinstance(v.verdict(), Verdict) and v.verdict().passed
    # the same document as text, after a line of noise on stderr merged into the output
    assert judge("warning: something\n" + json.dumps(check_doc())).passed


def test_uncorrectable_ecc():
    """Changed: volatile uncorrectable ECC 0 -> 2."""
    v = judge(check_doc([h200_gpu(ecc_uncorrected_volatile=2)]))
    f = only_failure(v, "ecc-uncorrectable", "fatal", "replace")
    assert f.gpu == 0 and "2 uncorrectable ECC error(s)" in f.message and "during the check" not in f.message


def test_uncorrectable_ecc_rises_during_the_check():
    """Changed: the counter goes from 0 to 1 while the GEMM runs (the backend bumps it)."""
    nv = FakeNvml([h200_gpu()])

    class Bumping(FakeBackend):
        def gemm(self, dev, n, seconds):
            nv.gpus[0]["ecc_uncorrected_volatile"] = 1
            return super().gemm(dev, n, seconds)

    doc = chk.run_check(
        ["--expected-gpus", "1"], nvml_loader=lambda: nv, backend_loader=lambda: Bumping([nv.gpus[0]["pci"]])
    )
    f = only_failure(judge(doc), "ecc-uncorrectable", "fatal", "replace")
    assert f.message.endswith("1 of them during the check")


def test_pending_remap():
    """Changed: remapped rows (corr, unc, pending, failure) (0,0,0,0) -> (0,1,1,0)."""
    only_failure(judge(check_doc([h200_gpu(remapped_rows=[0, 1, 1, 0])])), "remap-pending", "error", "recover")


def test_remap_failure():
    """Changed: remapped rows -> (0,1,0,1): a remap failed."""
    only_failure(judge(check_doc([h200_gpu(remapped_rows=[0, 1, 0, 1])])), "remap-failure", "fatal", "replace")


def test_retired_pages_pending():
    """Changed: retired pages pending NotSupported -> 1 (as on a pre-A100 GPU with a page to retire)."""
    only_failure(judge(check_doc([h200_gpu(retired_pages_pending=1)])), "retired-pages-pending", "error", "recover")


def test_xid_79():
    """Changed: NVML delivers XID 79 on GPU 0 during the check."""
    f = only_failure(judge(check_doc(xids=[(0, 79)])), "xid-79", "fatal", "recover")
    assert "fallen off the bus" in f.message and f.gpu == 0


def test_xid_13_is_an_event_only():
    """Changed: NVML delivers XID 13 (twice: reported once) on GPU 0; the check passes, action monitor."""
    v = judge(check_doc(xids=[(0, 13), (0, 13)]))
    assert v.passed and v.action == "monitor" and v.figures["xid_events"] == 2
    (f,) = v.by_code("xid-13")
    assert (f.severity, f.action) == ("warning", "monitor") and "application" in f.message


def test_xid_table_and_unknown_xid():
    assert {x: (p.severity, p.action) for x, p in XID_TABLE.items() if x in (13, 31, 43, 48, 63, 64, 79, 94, 95)} == {
        13: ("warning", "monitor"),
        31: ("warning", "monitor"),
        43: ("warning", "monitor"),
        48: ("fatal", "replace"),
        63: ("error", "recover"),
        64: ("fatal", "replace"),
        79: ("fatal", "recover"),
        94: ("error", "recover"),
        95: ("fatal", "replace"),
    }
    assert xid_policy(999).action == "monitor"
    v = judge(check_doc(xids=[(0, 999)]))
    assert v.passed and "not in hp's XID table" in v.by_code("xid-999")[0].message


def test_pcie_x8():
    """Changed: current PCIe width 16 -> 8 (at rest and under load)."""
    f = only_failure(judge(check_doc([h200_gpu(pcie_width=8)])), "pcie-width", "error", "replace")
    assert "x8" in f.message and "x16" in f.message


def test_pcie_gen_lower_under_load():
    """Changed: current PCIe gen 5 -> 4, at rest and under load."""
    f = only_failure(judge(check_doc([h200_gpu(pcie_gen=4)])), "pcie-gen", "error", "recover")
    assert "gen 4 under load" in f.message


def test_pcie_gen_lower_at_rest_only_is_not_a_failure():
    """Changed: PCIe gen 5 -> 1 and compute skipped (no reading under load): idle GPUs lower the gen."""
    v = judge(check_doc([h200_gpu(pcie_gen=1)], argv=["--expected-gpus", "1", "--skip", "compute"]))
    assert v.passed and "pcie-gen-idle" in codes(v) and "compute-skipped" in codes(v)


@pytest.mark.parametrize(
    "mask, code, severity, action, passed",
    [
        (0x8, "clocks-hw-slowdown", "error", "replace", False),
        (0x40, "clocks-hw-thermal-slowdown", "error", "replace", False),
        (0x80, "clocks-hw-power-brake-slowdown", "error", "replace", False),
        (0x20, "clocks-sw-thermal-slowdown", "warning", "monitor", True),
        (0x4, None, None, None, True),  # SW power cap: normal at full load
    ],
)
def test_clock_event_reasons_under_load(mask, code, severity, action, passed):
    """Changed: the clocks event reasons answer `mask` while the GEMM runs."""
    nv = FakeNvml([h200_gpu()])
    nv.load_mask = mask
    doc = chk.run_check(
        ["--expected-gpus", "1"], nvml_loader=lambda: nv, backend_loader=lambda: FakeBackend([nv.gpus[0]["pci"]])
    )
    v = judge(doc)
    assert v.passed is passed and v.figures["gpu0.clock_event_reasons"] == mask
    if code:
        (f,) = v.by_code(code)
        assert (f.severity, f.action) == (severity, action) and "while loaded" in f.message


def test_clock_reasons_at_rest_when_no_load():
    """Changed: HW slowdown reported at rest, compute skipped: judged on the at-rest reading."""
    v = judge(check_doc([h200_gpu(throttle_reasons=0x8)], argv=["--expected-gpus", "1", "--skip", "compute"]))
    assert "at rest" in v.by_code("clocks-hw-slowdown")[0].message and not v.passed


def test_gemm_at_half_speed():
    """Changed: GEMM 659.8 -> 330 TFLOP/s (half)."""
    f = only_failure(judge(check_doc(backend_kw={"gemm": {0: 330.0}})), "gemm-slow", "error", "recover")
    assert "330 TFLOP/s is below the h200 threshold 550" in f.message


def test_hbm_low():
    """Changed: HBM copy 4282 -> 2000 GB/s."""
    f = only_failure(judge(check_doc(backend_kw={"hbm": {0: 2000.0}})), "hbm-slow", "error", "recover")
    assert "2000 GB/s" in f.message


def test_one_gpu_slower_than_the_best_of_its_node():
    """Two copies of the H200: GEMM 762 (its warm figure) and 650 TFLOP/s: both above the 550 threshold,
    but 650 is 15% below the node's best (tolerance 10%)."""
    doc = check_doc(
        [h200_gpu(0), h200_gpu(1)],
        backend_kw={"gemm": {0: 762.0, 1: 650.0}},
        argv=["--expected-gpus", "2", "--nccl", "off"],
    )
    f = only_failure(judge(doc, expected=2), "gemm-slow-vs-node", "error", "recover")
    assert f.gpu == 1 and "15% below the best GPU of the node (762" in f.message
    v = judge(doc, expected=2, tolerance=0.2)
    assert v.passed


def test_gpu_missing_vs_the_type():
    """No change to the GPU; the node's type promises 2 GPUs and it has 1."""
    f = only_failure(judge(check_doc(), expected=2), "gpu-missing", "fatal", "replace")
    assert "sees 1 of 2" in f.message


def test_gpu_lost_means_reboot():
    """Two H200 copies, the second's handle answers GpuIsLost (fallen off the bus); the type has 2."""
    doc = check_doc([h200_gpu(0), h200_gpu(1)], handle_errors={1: 15}, argv=["--expected-gpus", "2", "--nccl", "off"])
    v = judge(doc, expected=2)
    assert {f.code for f in v.findings if f.fails} == {"gpu-lost", "gpu-missing"}
    assert all(f.action == "recover" for f in v.findings if f.fails) and v.action == "recover"
    assert v.by_code("gpu-lost")[0].gpu == 1


def test_missing_gpu_after_xid_79_means_reboot():
    """The type has 2 GPUs, the node sees 1, and XID 79 was seen: reboot first."""
    v = judge(check_doc(xids=[(0, 79)]), expected=2)
    assert v.by_code("gpu-missing")[0].action == "recover"


def test_host_gpus_not_given_are_not_judged():
    """Two H200 copies, the second answers NoPermission (another node's GPU on the same host)."""
    v = judge(check_doc([h200_gpu(0), h200_gpu(1)], handle_errors={1: 4}))
    assert v.passed and "gpus-not-given" in codes(v)


def test_more_gpus_than_the_type():
    """Two H200 copies on a node whose type has 1: the wiring leaked another node's GPU."""
    doc = check_doc([h200_gpu(0), h200_gpu(1)], argv=["--expected-gpus", "1", "--nccl", "off"])
    only_failure(judge(doc, expected=1), "gpu-count-high", "error", "none")


def test_software_findings():
    """Changed: persistence 1 -> 0 (warning), compute mode 0 -> 3 Exclusive_Process (warning), ECC mode
    off (warning), aggregate uncorrectable 0 -> 4 (history, info)."""
    v = judge(check_doc([h200_gpu(persistence=0, compute_mode=3, ecc_mode=[0, 0], ecc_uncorrected_aggregate=4)]))
    assert v.passed and {"persistence-off", "compute-exclusive", "ecc-off", "ecc-history"} <= codes(v)
    v = judge(check_doc([h200_gpu(compute_mode=2)]))
    only_failure(v, "compute-prohibited", "error", "recover")


def test_wrong_model():
    """No change to the GPU (an H200); the node's type expects h100."""
    f = only_failure(judge(check_doc(), model="h100", th=TABLE.for_model("h100")), "gpu-model", "error", "none")
    assert "NVIDIA H200 (h200)" in f.message


def test_driver_not_answering():
    """Changed: NVML init answers DriverNotLoaded."""
    f = only_failure(judge(check_doc(init_error=9)), "driver-not-answering", "fatal", "recover")
    assert "Driver Not Loaded" in f.message
    assert judge(check_doc(init_error=9)).figures["gpus_seen"] == 0


def test_nvml_library_missing_is_a_setup_problem():
    """Changed: NVML init answers LibraryNotFound (libnvidia-ml not mounted)."""
    doc = check_doc(init_error=12)
    doc["software"]["why"] = "NVML did not initialise: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    only_failure(judge(doc), "nvml-missing", "error", "none")
    no_expect = judge(doc, expected=None)
    assert "gpus_expected" not in no_expect.figures


def test_compute_failures():
    """Changed: CUDA raises on GPU 0 (compute-error); the GEMM's spot check wrong (gemm-wrong); CuPy not
    loadable (compute-unavailable)."""
    only_failure(
        judge(check_doc(backend_kw={"errors": {0: "cudaErrorIllegalAddress"}})), "compute-error", "error", "recover"
    )
    only_failure(judge(check_doc(backend_kw={"wrong": {0}})), "gemm-wrong", "fatal", "replace")
    nv = FakeNvml()

    def boom():
        raise ImportError("no cupy")

    doc = chk.run_check(["--expected-gpus", "1"], nvml_loader=lambda: nv, backend_loader=boom)
    only_failure(judge(doc), "compute-unavailable", "error", "none")


def test_model_without_compute_thresholds():
    """The H200 judged with the gb10 row (no GEMM threshold) and with no row at all."""
    v = judge(check_doc(), th=TABLE.for_model("gb10"), model=None)
    assert v.passed and "gemm-no-threshold" in codes(v) and v.figures["gemm_threshold_measured"] == 0
    v = judge(check_doc(), th=None, model=None)
    assert v.passed and "gemm_min" not in v.figures and "gemm-no-threshold" not in codes(v)


# ---------------------------------------------------------------- all_reduce


def test_one_rank_busbw_zero_is_not_a_bad_link():
    """The REAL one-rank nccl-tests 2.19.6 output (busbw 0.00 at every size) given as the all_reduce of a
    node: once as a one-rank run, once claimed as two ranks (the parser sees one rank)."""
    text = fixture("nccl-tests-2.19.6-all_reduce_perf-1xh200.txt")
    doc = check_doc()
    doc["nccl"] = {"status": "ok", "ranks": 1, "method": "nccl-tests", "output": text, "exit_code": 0}
    v = judge(doc)
    assert v.passed and v.by_code("nccl-one-rank")
    doc["nccl"]["ranks"] = 2
    v = judge(doc)
    assert v.passed and "one rank" in v.by_code("nccl-one-rank")[0].message


def _two_gpu_doc(nvlink: bool = True, **kw):
    links = {f"nvlink_state_{i}": 1 for i in range(4)} if nvlink else {}
    return check_doc([h200_gpu(0, **links), h200_gpu(1, **links)], argv=["--expected-gpus", "2"], **kw)


def test_nccl_library_rows():
    """Two NVLinked H200 copies; the all_reduce rows (fake) at 240 GB/s busbw: below the 2-GPU NVLink
    threshold (250); then 300 GB/s (passes); then wrong results; then no NVLink (PCIe threshold 15)."""
    v = judge(_two_gpu_doc(), expected=2)
    f = only_failure(v, "nccl-slow", "error", "recover")
    assert "240.0 GB/s across 2 GPUs is below 250" in f.message and v.figures["nccl_min_busbw_gbps"] == 250
    rows = [{"size_bytes": s, "busbw_gbps": 300.0, "wrong": 0} for s in (1 << 30, 4 << 30)]
    assert judge(_two_gpu_doc(backend_kw={"nccl_rows": rows}), expected=2).passed
    rows[0]["wrong"] = 3
    only_failure(judge(_two_gpu_doc(backend_kw={"nccl_rows": rows}), expected=2), "nccl-wrong", "fatal", "replace")
    v = judge(_two_gpu_doc(nvlink=False), expected=2)
    assert v.passed and v.figures["nccl_min_busbw_gbps"] == 15


def test_nccl_library_edge_cases():
    """Two H200 copies: rows only below 1 GiB (not judged), no rows, no threshold for the model, NCCL
    missing from CuPy (setup), NCCL failing (reboot)."""
    small = [{"size_bytes": 16 << 20, "busbw_gbps": 1.0, "wrong": 0}]
    v = judge(_two_gpu_doc(backend_kw={"nccl_rows": small}), expected=2)
    assert v.passed and "nccl-no-large-sizes" in codes(v)
    only_failure(judge(_two_gpu_doc(backend_kw={"nccl_rows": []}), expected=2), "nccl-failed", "error", "recover")
    v = judge(_two_gpu_doc(), expected=2, th=TABLE.for_model("gb10"), model=None)
    assert v.passed and "nccl-no-threshold" in codes(v)
    doc = _two_gpu_doc(backend_kw={"nccl_ok": (False, "CuPy was built without NCCL")})
    only_failure(judge(doc, expected=2), "nccl-failed", "error", "none")
    doc = _two_gpu_doc(backend_kw={"nccl_error": "NCCL_ERROR_SYSTEM_ERROR"})
    only_failure(judge(doc, expected=2), "nccl-failed", "error", "recover")


def test_nccl_tests_outputs():
    """Two NVLinked H200 copies with all_reduce_perf 'on PATH' answering: the REAL 2x8 H100 run (16 ranks,
    busbw 298-339 GB/s at >= 1 GiB): judged against the h100 NVLink threshold for 8+ GPUs (400) it is
    slow; the HAND-EDITED 2.17.6 run with #wrong; a run that failed with an NCCL error; one that exited 1
    without error lines; text that is not nccl-tests at all."""

    def with_output(text, code=0):
        def runner(cmd, **kw):
            return subprocess.CompletedProcess(cmd, code, text, "")

        return _two_gpu_doc(which=lambda b: "/usr/bin/" + b, runner=runner)

    h100 = TABLE.for_model("h100")
    v = judge(
        with_output((FIXTURES / "nccl-tests-all_reduce_perf-2x8-h100.txt").read_text()), expected=2, model=None, th=h100
    )
    f = only_failure(v, "nccl-slow", "error", "recover")
    assert "across 16 GPUs is below 400 GB/s" in f.message and v.figures["nccl_ranks"] == 16
    assert v.figures["nccl_busbw_gbps"] == pytest.approx(
        (297.86 + 298.82 + 318.40 + 318.52 + 330.58 + 330.51 + 338.82 + 337.35) / 8, abs=0.01
    )
    wrong = (FIXTURES / "nccl-tests-2.17.6-all_reduce_perf-wrong-HANDEDITED.txt").read_text()
    v = judge(with_output(wrong, code=1), expected=2, model=None, th=h100)
    assert "nccl-wrong" in codes(v) and v.action == "replace"
    failed = "# nThread 1 nGpus 2 minBytes 8 maxBytes 128\nTest NCCL failure common.cu:1 'unhandled cuda error'\n"
    v = judge(with_output(failed, code=3), expected=2)
    assert any("unhandled cuda error" in r for r in v.reasons) and v.action == "recover"
    v = judge(with_output("# nThread 1 nGpus 2 minBytes 8 maxBytes 128\n", code=1), expected=2)
    assert "all_reduce_perf exited 1" in v.reasons
    v = judge(with_output("segmentation fault\n", code=139), expected=2)
    assert v.by_code("nccl-failed")[0].message.startswith("all_reduce_perf printed no result")


# ---------------------------------------------------------------- DCGM


def test_dcgm_not_configured_is_neither_pass_nor_fail():
    v = judge(check_doc(), dcgm=None)
    (f,) = v.by_code("dcgm-not-configured")
    assert f.severity == "info" and f.action == "none" and f.message.startswith("DCGM not configured")
    assert v.passed and v.figures["dcgm_configured"] == 0


def test_dcgm_real_failure():
    """The REAL dcgmi diag -r 1 -j of a GB10 failing its software test (persistence mode), exit 226."""
    run = DcgmRun("nvcr.io/nvidia/cloud-native/dcgm:4.2.3", fixture("../dcgm-4.2.3-diag-r1-fail.json"), 226)
    v = judge(check_doc(), dcgm=run)
    fails = [f for f in v.findings if f.fails]
    assert {f.code for f in fails} == {"dcgm"} and all(f.action == "recover" for f in fails)
    assert any("Persistence mode for GPU 0 is disabled" in r for r in v.reasons)
    assert any("dcgmi exited 226" in r for r in v.reasons) and v.figures["dcgm_configured"] == 1


def test_dcgm_hardware_failure_means_replace():
    """The REAL DCGM 4.2.3 document with its test's category changed Deployment -> Hardware and name
    software -> memory."""
    text = (
        fixture("../dcgm-4.2.3-diag-r1-fail.json")
        .replace('"Deployment"', '"Hardware"')
        .replace('"software"', '"memory"')
    )
    v = judge(check_doc(), dcgm=DcgmRun("dcgm:4", text, 226))
    assert v.action == "replace" and not v.passed


def test_dcgm_image_missing_or_unreadable():
    v = judge(check_doc(), dcgm=DcgmRun("nvcr.io/nvidia/cloud-native/dcgm:latest", error="No such image"))
    f = only_failure(v, "dcgm-unavailable", "error", "none")
    assert "nvcr.io/nvidia/cloud-native/dcgm:latest could not run: No such image" in f.message
    v = judge(check_doc(), dcgm=DcgmRun("dcgm:4", "dcgmi: command not found", 127))
    only_failure(v, "dcgm-unreadable", "error", "none")
    ok = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Deployment",
                    "tests": [
                        {"name": "software", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}]}
                    ],
                }
            ]
        }
    }
    assert judge(check_doc(), dcgm=DcgmRun("dcgm:4", json.dumps(ok))).passed


# ---------------------------------------------------------------- unreadable documents, odd parts


def test_unreadable_output():
    v = judge("Traceback (most recent call last):\n  ...\nMemoryError\n")
    only_failure(v, "unreadable", "error", "none")
    assert "MemoryError" in v.reasons[0]
    only_failure(judge(""), "unreadable", "error", "none")
    only_failure(judge('{"tool": "other"}'), "unreadable", "error", "none")
    assert judge(json.dumps(check_doc(), indent=1)).passed  # a pretty-printed document


def test_parts_missing_or_odd():
    """Changed in the document: software part removed; compute part removed; xid part marked error;
    counters at the end removed (judged on counters_start); a non-mapping row ignored; compute skipped
    by hand."""
    doc = check_doc()
    del doc["software"]
    assert "no-software-part" in codes(judge(doc))
    doc = check_doc()
    del doc["compute"]
    assert "no-compute-part" in codes(judge(doc))
    doc = check_doc()
    doc["xid"] = {"status": "error", "why": "no NVML event set: Not Supported", "events": [{"xid": "x"}]}
    v = judge(doc)
    assert v.passed and v.by_code("xid-unwatched")[0].severity == "warning"
    doc = check_doc([h200_gpu(remapped_rows=[0, 0, 1, 0])])
    del doc["counters"]
    doc["counters_start"].append("junk")
    assert "remap-pending" in codes(judge(doc))
    doc = check_doc()
    del doc["counters"], doc["counters_start"], doc["xid"], doc["nccl"]
    doc["compute"] = {"status": "skipped", "why": "by hand", "gpus": []}
    assert judge(doc).passed
    doc = check_doc(init_error=9)
    doc["compute"] = {"status": "skipped", "why": "x"}
    assert "compute-skipped" not in codes(judge(doc))


def test_findings_and_actions():
    assert strongest([]) == "none" and strongest(["monitor", "replace", "recover"]) == "replace"
    with pytest.raises(ValueError, match="bad finding x"):
        Finding("x", "catastrophic", Action.NONE, "m")
    assert Finding("x", "fatal", Action.REPLACE, "m").fails and not Finding("x", "warning", Action.MONITOR, "m").fails


def test_values_not_supported_are_not_judged():
    """Changed: volatile ECC, remapped rows, clocks event reasons and every PCIe value answer NotSupported
    (as on a GPU or vGPU without them); the compute row lacks its GEMM and HBM figures; the driver version
    is not a number; a timing is not a number; the type's GPU count is unknown."""
    ns = {"error": "NVMLError_NotSupported: Not Supported"}
    doc = check_doc(
        [
            h200_gpu(
                ecc_uncorrected_volatile=ns,
                remapped_rows=ns,
                throttle_reasons=ns,
                pcie_gen=ns,
                pcie_gen_max=ns,
                pcie_width=ns,
                pcie_width_max=ns,
            )
        ]
    )
    doc["compute"]["gpus"][0] = {"index": 0, "cuda_device": 0}
    doc["software"]["driver_version"] = "unknown"
    doc["timings_s"]["odd"] = "n/a"
    v = judge(doc, expected=None)
    assert v.passed and not any(k.startswith("gpu0.") for k in v.figures), v.figures
    assert "driver_major" not in v.figures and "seconds.odd" not in v.figures and "gpus_expected" not in v.figures


def test_nccl_tests_more_ranks_without_threshold():
    """Two H200 copies, all_reduce_perf answering the REAL 2x8 H100 text, judged without a threshold row."""

    def runner(cmd, **kw):
        text = (FIXTURES / "nccl-tests-all_reduce_perf-2x8-h100.txt").read_text()
        return subprocess.CompletedProcess(cmd, 0, text, "")

    doc = _two_gpu_doc(which=lambda b: "/usr/bin/" + b, runner=runner)
    v = judge(doc, expected=2, model=None, th=None)
    assert v.passed and v.figures["nccl_ranks"] == 16 and "nccl_min_busbw_gbps" not in v.figures


def test_real_output_of_the_image_without_a_driver():
    """The REAL output of hp_gpu_check.py in the built check image on a machine without GPU or driver
    (tests/fixtures/gpu-check-image/): a setup problem, nothing to reboot or replace."""
    text = (FIXTURES / "gpu-check-image" / "hp_gpu_check-no-driver.json").read_text()
    v = judge(text)
    f = only_failure(v, "nvml-missing", "error", "none")
    assert "NVMLError_LibraryNotFound" in f.message and v.figures["gpus_seen"] == 0
