"""Unit tests for the health-check tool parsers (orchestrator.health.{dcgm,nccl,stress,iperf,mpi}), on real tool outputs (see
tests/fixtures/README.md for where each fixture comes from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.gpu.dcgm import dcgmi_exit_reason, judge_dcgm, parse_dcgm
from orchestrator.gpu.nccl import judge_nccl, parse_nccl_tests
from orchestrator.health.tools.iperf import (
    better,
    judge_iperf3,
    name_not_resolved,
    only_too_slow,
    parse_iperf3,
    run_verdict,
)
from orchestrator.health.tools.mpi import judge_mpi_allreduce, mpirun, parse_mpi_allreduce, subnet_of
from orchestrator.health.tools.stress import explain_cpu_time, judge_stress, parse_stress_ng, stress_ng_exit_reason
from orchestrator.verdict import ParseError

FIXTURES = Path(__file__).parent.parent / "fixtures"
GiB = 1 << 30


def fx(name: str) -> str:
    return (FIXTURES / name).read_text()


def stress(base: str):
    return parse_stress_ng(fx(f"{base}.yaml"), fx(f"{base}.log"))


# ---------------------------------------------------------------- DCGM


def test_dcgm_4x_real_failure():
    r = parse_dcgm(fx("dcgm-4.2.3-diag-r1-fail.json"))
    assert r.layout == "4.x"
    assert r.version == "4.2.3"
    assert r.driver_version == "580.82.09"
    assert not r.passed
    assert r.failed_tests == ["software"]
    entity = [x for x in r.results if not x.summary]
    assert len(entity) == 1 and entity[0].gpu_ids == (0,) and entity[0].status == "Fail"
    summary = [x for x in r.results if x.summary]
    assert summary[0].status == "Fail" and "SRAM Threshold" in summary[0].info[0]
    # one message, naming test, GPU and DCGM's own words (summary not repeated)
    assert len(r.failures) == 1
    msg = r.failures[0]
    assert "'software'" in msg and "GPU 0" in msg and "Persistence mode for GPU 0 is disabled" in msg

    v = judge_dcgm(r, 226)
    assert not v.passed
    assert any("226" in x and "NVVS error" in x for x in v.reasons)
    assert v.figures["exit_code"] == 226


def test_dcgm_text_before_json_is_ignored():
    text = "Successfully ran diagnostic for group.\nWARNING: falling back to defaults\n"
    r = parse_dcgm(text + fx("dcgm-4.2.3-diag-r1-fail.json") + "\ntrailing text\n")
    assert r.layout == "4.x" and r.failed_tests == ["software"]


def _dcgm_4x_all(status: str) -> str:
    doc = json.loads(fx("dcgm-4.2.3-diag-r1-fail.json"))
    test = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]
    test["results"][0]["status"] = status
    test["results"][0].pop("warnings")
    test["test_summary"]["status"] = status
    return json.dumps(doc)


def test_dcgm_4x_pass_derived_from_sample():
    r = parse_dcgm(_dcgm_4x_all("Pass"))
    assert r.passed and r.failures == []
    assert judge_dcgm(r, 0).passed
    # same document, but dcgmi said it failed: the exit code alone fails it
    v = judge_dcgm(r, 205)
    assert not v.passed and "isolate" in v.reasons[0]


def test_dcgm_everything_skipped_is_not_a_pass():
    r = parse_dcgm(_dcgm_4x_all("Skip"))
    assert r.passed  # nothing failed...
    v = judge_dcgm(r, 0)
    assert not v.passed  # ...but nothing was checked either
    assert "skipped every test" in v.reasons[0] and "SRAM" in v.reasons[0]


def test_dcgm_3x_failure():
    r = parse_dcgm(fx("dcgm-3.x-diag-r2-fail-HANDWRITTEN.json"))
    assert r.layout == "3.x"
    assert r.version == "3.3.5"
    assert r.driver_version == "535.154.05"
    assert not r.passed
    assert r.failed_tests == ["PCIe"]
    assert r.failures == [
        "DCGM test 'PCIe' failed on GPU 1: Detected 112 pcie_replay_counter errors for GPU 1 "
        "which is above the threshold 8 Check DCGM and system logs for errors. Reset GPU. "
        "Restart DCGM. Rerun diagnostics."
    ]
    pcie0 = next(x for x in r.results if x.test == "PCIe" and x.gpu_ids == (0,))
    assert pcie0.status == "Pass" and pcie0.info[0].startswith("GPU to Host bandwidth")
    assert {x.category for x in r.results} == {"Deployment", "Integration", "Hardware"}
    assert not judge_dcgm(r, 226).passed


def test_dcgm_3x_pass_with_preamble():
    r = parse_dcgm("dcgmi: connecting to hostengine\n" + fx("dcgm-3.x-diag-r2-pass-HANDWRITTEN.json"))
    assert r.layout == "3.x" and r.passed
    assert len(r.results) == 22 and all(x.status == "Pass" for x in r.results)
    v = judge_dcgm(r, 0)
    assert v.passed and v.reasons == []


def test_dcgm_3x_variants_nulls_csv_ids_warn_uppercase():
    doc = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Deployment",
                    "tests": [
                        {
                            "name": "Denylist",
                            "results": [{"gpu_ids": "0,1,2", "status": "PASS"}],
                        },
                        None,
                        {
                            "name": "Inforom",
                            "results": [
                                {
                                    "gpu_ids": 2,
                                    "status": "WARN",
                                    "warnings": ["inforom corrupted"],
                                }
                            ],
                        },
                    ],
                }
            ],
            "version": "3.1.0",
        }
    }
    r = parse_dcgm(json.dumps(doc))
    assert r.results[0].gpu_ids == (0, 1, 2) and r.results[0].status == "Pass"
    assert r.results[1].status == "Fail"  # a WARN is a failure, as dcgmi writes it
    assert r.failures == ["DCGM test 'Inforom' failed on GPU 2: inforom corrupted"]


def test_dcgm_runtime_error_and_empty():
    r = parse_dcgm('{"DCGM Diagnostic": {}, "runtime_error": "Unable to run diagnostic on unsupported GPU 0."}')
    assert not r.passed and "unsupported GPU 0" in r.failures[0]
    r = parse_dcgm('{"DCGM Diagnostic": {"test_categories": []}}')
    assert not r.passed and r.failures == ["DCGM reported no test results"]


def test_dcgm_not_dcgm_output():
    with pytest.raises(ParseError):
        parse_dcgm("Error: unable to connect to host engine\n")
    with pytest.raises(ParseError):
        parse_dcgm('{"something": "else"}')
    with pytest.raises(ParseError):
        parse_dcgm('{"DCGM Diagnostic": {"test_categories": [')  # truncated


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (0, "passed"),
        (226, "-30"),
        (205, "-51"),
        (242, "no data"),
        (255, "-1"),
        (3, "unexpected"),
    ],
)
def test_dcgmi_exit_reason(code, words):
    assert words in dcgmi_exit_reason(code)


# ---------------------------------------------------------------- nccl-tests


def test_nccl_parse_real_sample():
    r = parse_nccl_tests(fx("nccl-tests-all_reduce_perf-2x8-h100.txt"))
    assert len(r.rows) == 31
    assert r.rows[0].size_bytes == 8 and r.rows[-1].size_bytes == 8 * GiB
    last = r.rows[-1]
    assert (last.oop_busbw, last.ip_busbw, last.oop_wrong, last.ip_wrong) == (
        338.82,
        337.35,
        0,
        0,
    )
    assert r.hosts == ["ztan-mig-235z", "ztan-mig-gq73"] and r.n_ranks == 16
    assert r.out_of_bounds == 0 and r.avg_busbw == 70.742 and r.avg_busbw_status is None
    assert r.params["maxBytes"] == 8 * GiB and r.params["iters"] == 20
    assert r.version is None and r.collective is None and not r.concluded
    # our mean over all rows, both columns, matches nccl-tests' own figure
    mean = sum(x.oop_busbw + x.ip_busbw for x in r.rows) / (2 * len(r.rows))
    assert mean == pytest.approx(r.avg_busbw, abs=0.005)


def test_nccl_judge_threshold_over_fixed_range():
    r = parse_nccl_tests(fx("nccl-tests-all_reduce_perf-2x8-h100.txt"))
    ok = judge_nccl(r, min_busbw_gbps=300, min_bytes=1 * GiB, max_bytes=8 * GiB)
    assert ok.passed, ok.reasons
    assert ok.figures["rows_in_range"] == 4
    busbw_1g_to_8g = [297.86, 298.82, 318.40, 318.52, 330.58, 330.51, 338.82, 337.35]
    assert ok.figures["avg_busbw_gbps"] == pytest.approx(sum(busbw_1g_to_8g) / 8)
    assert ok.figures["min_busbw_gbps"] == 300

    low = judge_nccl(r, min_busbw_gbps=350, min_bytes=1 * GiB, max_bytes=8 * GiB)
    assert not low.passed
    assert len(low.reasons) == 1
    assert "321.36 GB/s" in low.reasons[0] and "350 GB/s" in low.reasons[0] and "4 sizes" in low.reasons[0]

    # the tool's own average (70.7) includes tiny sizes: a full-range threshold fails
    assert not judge_nccl(r, 100, 8, 8 * GiB).passed
    # no rows in the range is a failure, not a pass
    none = judge_nccl(r, 1, 16 * GiB, 32 * GiB)
    assert not none.passed and "no result rows" in none.reasons[0]


def test_nccl_newer_header_wrong_and_out_of_bounds():
    r = parse_nccl_tests(fx("nccl-tests-2.17.6-all_reduce_perf-wrong-HANDEDITED.txt"))
    assert r.version == "2.17.6" and r.collective == "all_reduce_perf" and r.concluded
    assert r.params["unalign"] == 0 and r.params["validation"] == 1
    assert len(r.rows) == 31 and r.out_of_bounds == 1
    v = judge_nccl(r, 300, 1 * GiB, 8 * GiB)
    assert not v.passed
    assert any("37 at 1048576 B out-of-place" in x for x in v.reasons)
    assert any("1 out-of-bounds" in x for x in v.reasons)
    assert v.figures["wrong_total"] == 37


def test_nccl_wrong_in_place_and_na_and_tool_failed():
    header = (
        "# nccl-tests version 2.17.6 nccl-headers=22603 nccl-library=22603\n"
        "# Collective test starting: all_reduce_perf\n"
    )
    rows = (
        " 1073741824 268435456 float sum -1 6759.0 158.86 297.86 N/A 6737.4 159.37 298.82 N/A\n"
        " 2147483648 536870912 float sum -1 12646 169.81 318.40 0 12641 169.88 318.52 5\n"
    )
    footer = (
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 308.4 FAILED\n"
        "#\n# Collective test concluded: all_reduce_perf\n"
    )
    r = parse_nccl_tests(header + rows + footer)
    assert r.rows[0].oop_wrong is None and r.rows[0].ip_wrong is None
    assert r.avg_busbw_status == "FAILED"
    v = judge_nccl(r, 300, 1 * GiB, 2 * GiB)
    assert any("5 at 2147483648 B in-place" in x for x in v.reasons)
    assert any("FAILED" in x for x in v.reasons)
    # with N/A only (validation off) and no FAILED, it passes
    first_row = rows.splitlines()[0]
    clean = parse_nccl_tests(header + first_row + "\n# Out of bounds values : 0 OK\n# Avg bus bandwidth : 298.3\n")
    assert judge_nccl(clean, 290, 1 * GiB, 1 * GiB).passed
    assert not judge_nccl(clean, 290, 1 * GiB, 1 * GiB, exit_code=1).passed


def test_nccl_truncated_run_and_errors():
    text = fx("nccl-tests-all_reduce_perf-2x8-h100.txt").splitlines()
    cut = "\n".join(text[:30]) + (
        "\nztan-mig-gq73: Test NCCL failure common.cu:1005 'remote process exited or there was a network error'\n"
    )
    r = parse_nccl_tests(cut)
    assert r.out_of_bounds is None and r.errors
    v = judge_nccl(r, 1, 8, 1024)
    assert not v.passed
    assert any("did not finish" in x for x in v.reasons)
    assert any("Test NCCL failure" in x for x in v.reasons)


def test_nccl_not_nccl_output():
    with pytest.raises(ParseError):
        parse_nccl_tests("bash: all_reduce_perf: command not found\n")
    # a header but no rows (crashed before the first size) parses, and fails
    r = parse_nccl_tests("# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor)\n")
    assert r.rows == [] and not judge_nccl(r, 1, 8, 128).passed


# ---------------------------------------------------------------- stress-ng


def test_stress_sample_0_19_invalid_yaml_still_parsed():
    yaml = pytest.importorskip("yaml")
    with pytest.raises(yaml.YAMLError):  # stress-ng 0.19.02 writes invalid YAML
        yaml.safe_load(fx("stress-ng-pass.yaml"))
    r = stress("stress-ng-pass")
    assert r.version == "0.19.02"
    assert list(r.metrics) == ["cpu", "vm"]
    cpu = r.metrics["cpu"]
    assert cpu.bogo_ops == 4135 and cpu.wall_s == pytest.approx(5.002873)
    assert cpu.usr_s == pytest.approx(4.924610) and cpu.sys_s == pytest.approx(0.003983)
    assert cpu.per_wall_s == pytest.approx(826.525009, rel=1e-6)
    assert cpu.per_cpu_s == pytest.approx(838.981835, rel=1e-6)
    assert cpu.cpus_used == pytest.approx(0.985, abs=0.001)
    assert cpu.cpu_usage_pct_per_instance == pytest.approx(98.515245)
    assert r.instances == {"cpu": 1, "vm": 1} and cpu.instances == 1
    assert r.passed == ["cpu", "vm"] and r.failed == [] and r.completed is True
    assert r.fail_lines == []
    v = judge_stress(r, 0, {"cpu": 500, "vm": 50000})
    assert v.passed, v.reasons
    assert v.figures["cpu.bogo_ops_per_s_wall"] == pytest.approx(826.525, rel=1e-5)
    assert v.figures["cpu.min_bogo_ops_per_s_wall"] == 500


def test_stress_exit_zero_but_low_throughput_fails():
    r = stress("stress-ng-pass")
    v = judge_stress(r, 0, {"cpu": 1000, "vm": 50000})
    assert not v.passed
    assert any("stressor cpu: 826.53 bogo-ops/s (wall) is below 1000" in x for x in v.reasons)
    assert not any("stressor vm" in x for x in v.reasons)


def test_stress_0_15_pass():
    r = stress("stress-ng-0.15.06-pass")
    assert r.version == "0.15.06" and r.passed == [] and r.completed is True
    assert judge_stress(r, 0, {"cpu": 1000, "vm": 20000}).passed


def test_stress_zero_ops_with_exit_zero():
    r = stress("stress-ng-0.15.06-vm-ulimit-zero-ops")
    assert r.metrics["vm"].bogo_ops == 0
    v = judge_stress(r, 0, {})  # no threshold at all: doing nothing still fails
    assert not v.passed and v.reasons == ["stressor vm did no work (0 bogo-ops)"]


def test_stress_fail_line_with_exit_zero():
    r = stress("stress-ng-0.15.06-hdd-ulimit-f-fail")
    assert r.fail_lines == ["hdd: write failed, errno=27 (File too large), filesystem type: ext2"]
    v = judge_stress(r, 0, {})
    assert not v.passed and "File too large" in v.reasons[0]


def test_stress_killed_child_exit_2():
    r = stress("stress-ng-0.15.06-child-sigkill")
    assert r.completed is False
    v = judge_stress(r, 2, {"cpu": 100})
    assert not v.passed
    assert v.reasons[0] == "stress-ng exited 2: one or more stressors failed"
    assert any("corrupted bogo-ops counter" in x for x in v.reasons)
    assert any("no run time" in x for x in v.reasons)
    assert not any("CPU time:" in x for x in v.reasons)  # no bogus CPU-time diagnosis on lost figures


def test_stress_bad_option_log_only():
    r = parse_stress_ng(None, fx("stress-ng-0.15.06-bad-option.log"))
    assert r.metrics == {}
    v = judge_stress(r, 1, {"cpu": 100})
    assert not v.passed
    assert v.reasons[0].startswith("stress-ng exited 1: bad options or usage error (cpu-method must be one of")
    assert "stress-ng produced no metrics" in v.reasons
    assert "no metrics for stressor cpu" in v.reasons


def test_stress_metrics_from_log_when_yaml_missing():
    r = parse_stress_ng("", fx("stress-ng-pass.log"))
    assert r.metrics["cpu"].bogo_ops == 4135 and r.metrics["cpu"].wall_s == 5.00
    assert r.metrics["vm"].per_cpu_s == pytest.approx(576246 / (3.46 + 1.52))
    assert r.metrics["vm"].instances == 1
    assert judge_stress(r, 0, {"cpu": 800}).passed


def test_stress_per_cpu_second_tells_waiting_from_quota():
    contended = stress("stress-ng-0.15.06-cpu-contended")
    m = contended.metrics["cpu"]
    assert m.cpus_used == pytest.approx(0.5, abs=0.01)
    assert m.per_cpu_s == pytest.approx(2 * m.per_wall_s, rel=0.01)
    # by wall second it is slow; the reason says it waited for CPU
    v = judge_stress(contended, 0, {"cpu": 1000}, granted_cpus=1)
    assert not v.passed
    assert "waited for CPUs held by other processes or sibling containers" in v.reasons[-1]
    # by CPU second the CPU itself is fine
    assert judge_stress(contended, 0, {"cpu": 1000}, per="cpu").passed

    quota = stress("stress-ng-0.15.06-cpu2-on-1cpu")
    q = quota.metrics["cpu"]
    assert q.instances == 2 and q.cpus_used == pytest.approx(1.0, abs=0.01)
    assert q.cpu_usage_pct_per_instance == pytest.approx(50.0, abs=0.1)
    v = judge_stress(quota, 0, {"cpu": 2000}, granted_cpus=1)  # 2 instances x ~1100
    assert not v.passed
    assert "limited by the node's own CPU quota" in v.reasons[-1]
    assert judge_stress(quota, 0, {"cpu": 1000}, per="cpu").passed

    # a slow CPU: got all it asked for, still below the bar
    healthy = stress("stress-ng-0.15.06-pass")
    assert "the CPU itself was slow" in explain_cpu_time(healthy, granted_cpus=2)


def test_stress_instances_derived_from_yaml_alone():
    r = parse_stress_ng(fx("stress-ng-0.15.06-cpu2-on-1cpu.yaml"))
    assert r.metrics["cpu"].instances == 2


def test_stress_empty_and_exit_codes():
    with pytest.raises(ParseError):
        parse_stress_ng("", "")
    for code, words in [
        (1, "bad options"),
        (2, "stressor"),
        (3, "resources"),
        (5, "signal"),
        (6, "no bogo-op metrics"),
        (7, "untrustworthy"),
        (137, "signal 9"),
    ]:
        assert words in stress_ng_exit_reason(code)
    r = stress("stress-ng-0.15.06-pass")
    for code in (3, 5, 6, 7):
        v = judge_stress(r, code, {})
        assert not v.passed and v.reasons[0].startswith(f"stress-ng exited {code}: ")


def test_stress_summary_lines_failed_and_untrustworthy():
    log = (
        "stress-ng: info:  [8] dispatching hogs: 2 cpu, 1 vm\n"
        "stress-ng: fail:  [11] vm: detected 3 bit errors while stressing memory\n"
        "stress-ng: info:  [8] skipped: 0\n"
        "stress-ng: info:  [8] passed: 1: cpu (2)\n"
        "stress-ng: info:  [8] failed: 1: vm (1)\n"
        "stress-ng: info:  [8] metrics untrustworthy: 1: vm (1)\n"
        "stress-ng: info:  [8] unsuccessful run completed in 5.04 secs\n"
    )
    r = parse_stress_ng(fx("stress-ng-pass.yaml"), log)
    assert r.instances == {"cpu": 2, "vm": 1}
    assert r.passed == ["cpu"] and r.failed == ["vm"] and r.untrustworthy == ["vm"]
    assert r.completed is False
    v = judge_stress(r, 2, {})
    assert "stressors failed: vm" in v.reasons
    assert "stressor metrics untrustworthy: vm" in v.reasons
    assert any("bit errors" in x for x in v.reasons)


# ---------------------------------------------------------------- iperf3


def test_iperf3_pass_3_18_and_3_12():
    r = parse_iperf3(fx("iperf3-pass.json"))
    assert r.version == "iperf 3.18" and r.error is None
    assert r.received_bps == pytest.approx(12603498762.3175)
    assert r.sent_bps == pytest.approx(12604581822.21505)
    assert r.retransmits == 788 and r.seconds == pytest.approx(2.001725)
    v = judge_iperf3(r, 0, 10)
    assert v.passed and v.figures["received_gbps"] == pytest.approx(12.6035, rel=1e-4)
    assert v.figures["min_gbps"] == 10
    low = judge_iperf3(r, 0, 20)
    assert not low.passed and low.reasons == ["received 12.603 Gbit/s is below 20 Gbit/s"]

    r12 = parse_iperf3(fx("iperf3-3.12-loopback-pass.json"))
    assert r12.version == "iperf 3.12" and judge_iperf3(r12, 0, 5).passed


def test_iperf3_rate_limited_run_fails_threshold():
    r = parse_iperf3(fx("iperf3-3.12-loopback-200M.json"))
    assert r.received_gbps == pytest.approx(0.2, rel=0.01)
    assert not judge_iperf3(r, 0, 1).passed


def test_iperf3_error_json_with_exit_zero():
    r = parse_iperf3(fx("iperf3-3.12-refused.json"))
    assert r.error == "unable to connect to server: Connection refused"
    assert r.received_bps is None
    v = judge_iperf3(r, 0, 1)
    assert not v.passed and v.reasons == ["iperf3 error: unable to connect to server: Connection refused"]

    killed = parse_iperf3(fx("iperf3-3.12-server-killed.json"))
    assert "Connection reset by peer" in killed.error
    assert not judge_iperf3(killed, 0, 1).passed

    # iperf 3.18 exits 1 on the same failure
    v = judge_iperf3(r, 1, 1)
    assert "iperf3 exited 1" in v.reasons


def test_only_a_run_that_worked_but_was_slow_is_measured_again():
    slow = judge_iperf3(parse_iperf3(fx("iperf3-3.12-loopback-200M.json")), 0, 1)
    fast = judge_iperf3(parse_iperf3(fx("iperf3-3.12-loopback-pass.json")), 0, 1)
    refused = judge_iperf3(parse_iperf3(fx("iperf3-3.12-refused.json")), 0, 1)
    assert only_too_slow(slow) and not only_too_slow(fast)
    assert not only_too_slow(refused)  # no connection: no second chance
    assert not only_too_slow(judge_iperf3(parse_iperf3(fx("iperf3-3.12-loopback-200M.json")), 1, 1))  # exit 1
    assert not only_too_slow(run_verdict("iperf3: error - unable to connect\n", 1, 1))  # no JSON at all
    assert better(slow, fast) is fast and better(fast, slow) is fast
    slower = judge_iperf3(parse_iperf3(fx("iperf3-3.12-loopback-200M.json")), 0, 5)
    assert better(slower, slow).figures["received_gbps"] == slow.figures["received_gbps"]
    assert better(refused, slow) is slow  # both failed: the one that measured more


def test_a_server_name_that_does_not_resolve_is_tried_again_and_nothing_else_is():
    unresolved = (
        '{"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server - server may have '
        'stopped running or use a different port, firewall issue, etc.: Name or service not known"}'
    )
    v = run_verdict(unresolved, 1, 1)
    assert not v.passed and name_not_resolved(v)
    refused = judge_iperf3(parse_iperf3(fx("iperf3-3.12-refused.json")), 0, 1)
    assert not name_not_resolved(refused)
    assert not name_not_resolved(judge_iperf3(parse_iperf3(fx("iperf3-3.12-loopback-pass.json")), 0, 1))


def test_iperf3_not_iperf_output():
    with pytest.raises(ParseError):
        parse_iperf3("iperf3: error - unable to connect to server\n")
    with pytest.raises(ParseError):
        parse_iperf3('{"foo": 1}')


# ---------------------------------------------------------------- MPI allreduce


def test_mpi_real_pass():
    r = parse_mpi_allreduce(fx("mpi_allreduce-openmpi-4.1.4-np4.txt"))
    assert sorted(x.rank for x in r.lines) == [0, 1, 2, 3]
    assert all(x.sum == 10 and x.expected == 10 and x.ok and x.size == 4 for x in r.lines)
    v = judge_mpi_allreduce(r, expected_size=4, expected_hosts=["vm"], exit_code=0)
    assert v.passed, v.reasons
    assert judge_mpi_allreduce(r).passed  # size taken from the lines


def test_mpi_missing_rank_and_host():
    text = fx("mpi_allreduce-openmpi-4.1.4-np4.txt")
    lines = [ln for ln in text.splitlines() if "rank=2 " not in ln]
    r = parse_mpi_allreduce("\n".join(lines))
    v = judge_mpi_allreduce(r, expected_size=4, expected_hosts=["vm", "node-b"])
    assert not v.passed
    assert any("1 of 4 ranks printed nothing: 2" in x and "hosts that did report: vm" in x for x in v.reasons)
    assert "no HP-MPI line from host(s): node-b" in v.reasons
    assert v.figures["ranks_missing"] == 1


def test_mpi_wrong_sum_names_host():
    text = (
        "0: HP-MPI rank=0 size=3 host=node-a sum=6 expected=6 ok=1\n"
        "1: HP-MPI rank=1 size=3 host=node-b sum=5 expected=6 ok=0\n"
        "2: HP-MPI rank=2 size=3 host=node-c sum=7 expected=7 ok=1\n"  # lies about expected
        "some unrelated line\n"
    )
    r = parse_mpi_allreduce(text)
    assert len(r.lines) == 3
    v = judge_mpi_allreduce(r, expected_size=3)
    assert not v.passed
    assert "wrong allreduce sum on node-b (rank 1): got 5, expected 6" in v.reasons
    assert any("node-c (rank 2)" in x for x in v.reasons)
    assert not any("node-a" in x for x in v.reasons)


def test_mpi_singletons_and_abort():
    r = parse_mpi_allreduce(fx("mpi_allreduce-2-singletons.txt"))
    v = judge_mpi_allreduce(r, expected_size=2)
    assert not v.passed and "separate size-1 MPI job" in v.reasons[0]
    v = judge_mpi_allreduce(r)  # even without an expected size
    assert not v.passed

    r = parse_mpi_allreduce(fx("mpi_allreduce-openmpi-4.1.4-np2-abort.txt"))
    assert r.lines == []
    v = judge_mpi_allreduce(r, expected_size=2, exit_code=2)
    assert not v.passed
    assert v.reasons == [
        "MPI job exited 2",
        "no HP-MPI lines: no rank completed MPI_Allreduce",
    ]
    assert v.figures["ranks_missing"] == 2


def test_mpi_duplicate_rank_and_size_mismatch():
    text = "HP-MPI rank=0 size=2 host=a sum=3 expected=3 ok=1\nHP-MPI rank=0 size=2 host=b sum=3 expected=3 ok=1\n"
    v = judge_mpi_allreduce(parse_mpi_allreduce(text), expected_size=2)
    assert "rank 0 reported 2 times (hosts a, b)" in v.reasons
    assert any("ranks printed nothing: 1" in x for x in v.reasons)
    v = judge_mpi_allreduce(parse_mpi_allreduce(text), expected_size=4)
    assert any("size 2 differs from the expected 4" in x for x in v.reasons)


# -- the check container's memory (issue 24): sizing and a run the kernel killed ---------------

CGROUP_V2_HANDWRITTEN = """@@HP-STRESS-MEMORY@@
== memory.max
268435456
== memory.current
241172480
== memory.events
low 0
high 0
max 12
oom 1
oom_kill 1
== memory.stat
anon 4194304
file 234881024
kernel 2097152
shmem 0
file_dirty 1048576
== meminfo
MemTotal:       24683568 kB
MemAvailable:   20938100 kB
@@HP-STRESS-MEMORY-END@@
"""


def test_cgroup_memory_of_both_versions():
    from orchestrator.health.tools.stress import parse_cgroup_memory

    v1 = parse_cgroup_memory(fx("hp-stress-trixie-cgroup1-page-cache-220M.txt"))
    assert v1 is not None and v1.limit == 256 * 2**20 and v1.oom_kills == 0
    assert v1.file > 200 * 2**20 and v1.dirty == 0  # hp-stress --memory syncs first
    assert v1.held < 16 * 2**20  # the page cache can be reclaimed: it is not held
    assert v1.host_available is not None and v1.host_available > 2**30  # /proc/meminfo's kB, as bytes
    v2 = parse_cgroup_memory(CGROUP_V2_HANDWRITTEN)
    assert v2 is not None and (v2.limit, v2.usage, v2.file, v2.oom_kills) == (256 * 2**20, 241172480, 234881024, 1)
    assert v2.held == 241172480 - 234881024
    unlimited = parse_cgroup_memory(CGROUP_V2_HANDWRITTEN.replace("268435456", "max"))
    assert unlimited is not None and unlimited.limit is None
    assert parse_cgroup_memory("stress-ng: no marker") is None
    oom = parse_cgroup_memory(fx("hp-stress-trixie-cgroup1-oom-137.txt"))  # after the run: the kills
    assert oom is not None and oom.oom_kills == 8 and oom.shmem > 90 * 2**20 and oom.held > 90 * 2**20


def test_memory_stressor_is_sized_from_what_the_container_has():
    from orchestrator.health.tools.stress import StressOptions, parse_cgroup_memory, vm_bytes_for

    cached = parse_cgroup_memory(fx("hp-stress-trixie-cgroup1-page-cache-220M.txt"))
    # 220 MiB of page cache in a 256 MiB cgroup: reclaimable, so 64M still fits untouched
    assert vm_bytes_for(StressOptions(vm_bytes="64M"), cached, 1) == (64 * 2**20, "")
    # the largest size the CLI takes on a 256 MiB node (75%) is cut to half of what is left
    size, note = vm_bytes_for(StressOptions(vm_bytes="192M"), cached, 1)
    assert size is not None and 100 * 2**20 < size < 110 * 2**20 and "cut to" in note and "page cache" in note
    # a percentage is of the host's available memory (as stress-ng takes it), then cut
    size, note = vm_bytes_for(StressOptions(vm_bytes="5%"), cached, 1)
    assert size is not None and size < 110 * 2**20 and "asked 5%" in note
    # without a reading (an older check image): the size as asked
    assert vm_bytes_for(StressOptions(vm_bytes="5%"), None, 1) == ("5%", "")
    # tmpfs holding almost everything: no room, so the check cannot run (and says why)
    full = parse_cgroup_memory(fx("hp-stress-trixie-cgroup1-oom-137.txt"))
    size, why = vm_bytes_for(StressOptions(vm_bytes="32M"), full, 1)
    assert size is None and "no room for a memory stressor" in why and "tmpfs 99 MiB" in why
    with pytest.raises(ValueError):
        vm_bytes_for(StressOptions(vm_bytes="16M; echo x"), cached, 1)


def test_the_page_cache_is_reclaimed_before_the_timed_run_not_during_it():
    """The real run (cpu.nano, 0.05 CPU, 200 MiB of clean page cache in 256 MiB, host
    under load): the memory stressor's first pass reclaimed in the kernel for 8.2 s of a
    2 s run and did 0 bogo-ops, so the healthy node failed. hp now takes the room first."""
    from orchestrator.health.tools.stress import (
        HEADROOM_PER_CPU_BYTES,
        CgroupMemory,
        judge,
        parse_cgroup_memory,
        room_command,
    )
    from orchestrator.spec.catalogue import InstanceType

    nano = InstanceType("cpu.nano", 1, 0.05, 256)
    out = fx("hp-stress-trixie-cgroup1-vm-reclaim-0-ops.txt")
    v = judge(nano, out, 0.05, [], parse_cgroup_memory(out), 0)
    assert not v.passed and v.reasons == ["stressor vm did no work (0 bogo-ops)"] and not v.not_run
    cached = parse_cgroup_memory(fx("hp-stress-trixie-cgroup1-page-cache-220M.txt"))
    cmd = room_command(64 * 2**20, cached, 1)
    assert cmd is not None and cmd[0] == "stress-ng" and "--vm-populate" in cmd
    assert cmd[cmd.index("--vm-bytes") + 1] == str(64 * 2**20 + HEADROOM_PER_CPU_BYTES)  # digits, no shell
    free = CgroupMemory(limit=256 * 2**20, usage=20 * 2**20, file=10 * 2**20)
    assert room_command(64 * 2**20, free, 1) is None  # the room is free already: nothing to do
    assert room_command(210 * 2**20, free, 1) is not None
    assert room_command("5%", cached, 1) is None and room_command(64 * 2**20, None, 1) is None
    assert room_command(64 * 2**20, CgroupMemory(limit=None, usage=2**30), 1) is None


def test_a_stress_run_the_kernel_killed_is_no_verdict():
    """The real run (cgroup v1, trixie's stress-ng): the cgroup ran out of memory while
    stress-ng ran, the OOM killer killed 8 processes and stress-ng itself (exit 137)."""
    from orchestrator.health.tools.stress import judge, parse_cgroup_memory
    from orchestrator.spec.catalogue import InstanceType

    nano = InstanceType("cpu.nano", 1, 0.05, 256)
    before = parse_cgroup_memory(fx("hp-stress-trixie-cgroup1-oom-137-before.txt"))
    v = judge(nano, fx("hp-stress-trixie-cgroup1-oom-137.txt"), 0.25, [], before, 0)
    assert not v.passed and v.not_run == v.reasons[0]
    assert v.not_run.startswith("the check could not run: stress-ng exited 137: terminated by signal 9")
    assert "OOM killer killed 8 process(es)" in v.not_run and "memory limit 128 MiB" in v.not_run
    # without a reading before (an older image) a 137 is still the kernel's doing
    assert judge(nano, fx("hp-stress-trixie-cgroup1-oom-137.txt"), 0.25, []).not_run
    # the wrapper itself killed (no exit status printed)
    assert "wrapper was killed (exit 137)" in judge(nano, "Killed\n", 0.25, [], None, 137).not_run
    # stress-ng exited 0 but a stressor was OOM-killed (and restarted) during the run
    ok = fx("stress-ng-0.15.06-pass.log") + "@@HP-STRESS-YAML@@\n" + fx("stress-ng-0.15.06-pass.yaml")
    after = CGROUP_V2_HANDWRITTEN.replace("oom_kill 1", "oom_kill 3")
    v = judge(nano, ok + after + "@@HP-STRESS-RC=0\n", 1.0, [], parse_cgroup_memory(CGROUP_V2_HANDWRITTEN), 0)
    assert v.not_run.startswith("the check could not run: stress-ng exited 0; the OOM killer killed 2 process(es)")
    # no kill: judged as before (a real failure stays a failure, a pass a pass)
    v = judge(
        nano, ok + CGROUP_V2_HANDWRITTEN + "@@HP-STRESS-RC=0\n", 1.0, [], parse_cgroup_memory(CGROUP_V2_HANDWRITTEN)
    )
    assert not v.not_run
    bad = fx("stress-ng-0.15.06-child-sigkill.log") + "@@HP-STRESS-YAML@@\n@@HP-STRESS-RC=2\n"
    v = judge(nano, bad, 1.0, [])
    assert not v.passed and not v.not_run


# what `ip -o -4 addr show dev eth0` printed in a check container on this machine (its
# interface index 33753: past int16, where PRRTE's include list by name matched nothing)
IP_ADDR_ETH0 = (
    "33753: eth0    inet 192.168.80.7/20 brd 192.168.95.255 scope global eth0\\"
    "       valid_lft forever preferred_lft forever\n"
)


def test_mpi_uses_the_clusters_subnet_for_its_transport_and_names_no_interface() -> None:
    assert subnet_of(IP_ADDR_ETH0) == "192.168.80.0/20"
    assert subnet_of("") is None and subnet_of('Device "eth0" does not exist.') is None
    argv = mpirun(["a", "b"], "ssh", ["prog"], subnet_of(IP_ADDR_ETH0))
    assert argv[argv.index("btl_tcp_if_include") + 1] == "192.168.80.0/20"
    assert "eth0" not in argv and not any("oob_tcp_if" in a for a in argv)  # PRRTE's own: its default
    plain = mpirun(["a", "b"], "ssh", ["prog"])
    assert plain[-1] == "prog" and not any("if_include" in a for a in plain)
