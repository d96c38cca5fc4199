"""Health-check options (issue 9, item 4): a malformed option is a usage error (exit 2)
that touches no node, and no option value reaches a shell."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.health.tools import options as O
from orchestrator.health.tools.stress import StressOptions, vm_bytes_for
from orchestrator.health.tools.stress import stress_command as _stress_command

INJECTION = "16M; echo INJECTED $(id -u) #"


def stress_command(opts, cpus):
    """The command as the engine makes it without a reading of the cgroup."""
    return _stress_command(opts, cpus, vm_bytes_for(opts, None, 1)[0])


@pytest.mark.parametrize(
    "value,bytes_",
    [
        ("64M", 64 << 20),
        ("64m", 64 << 20),
        ("1G", 1 << 30),
        ("1.5G", 3 << 29),
        ("4096", 4096),
        ("4k", 4096),
        ("4K", 4096),
        ("1t", 1 << 40),
        ("512b", None),
    ],
)
def test_sizes_stress_ng_takes(value, bytes_):
    kind, n = O.parse_size(value)
    assert kind == "bytes"
    if bytes_ is not None:
        assert n == bytes_
        assert O.vm_bytes_problems(value) == []


@pytest.mark.parametrize(
    "value",
    [
        INJECTION,
        "",
        " 64M",
        "64M ",
        "64M\n",
        "64MB",
        "0x10",
        "-1M",
        "1e3",
        "$(id)",
        "`id`",
        "64M;id",
        "64M|id",
        "1" * 16 + "M",
        "1..5G",
        "1.",
        ".5G",
        "1.1234567G",
        "64 M",
        "６４M",
        "64Mi",
        None,
        64,
        ["64M"],
    ],
)
def test_malformed_sizes(value):
    p = O.vm_bytes_problems(value)
    assert p and p[0].startswith("--vm-bytes must be a size like 64M, 1G, 1.5G or 4096"), p


@pytest.mark.parametrize(
    "value,why",
    [
        ("0", "between 4K and 256T"),
        ("3k", "between 4K and 256T"),
        ("512b", "between 4K and 256T"),
        ("300T", "between 4K and 256T"),
        ("0%", "1% to 100%"),
        ("101%", "1% to 100%"),
        ("999%", "1% to 100%"),
    ],
)
def test_sizes_out_of_range(value, why):
    p = O.vm_bytes_problems(value)
    assert len(p) == 1 and why in p[0], p


def test_size_must_fit_the_node():
    """Measured: 400M, 50% and 90% on a 256 MiB container: 0 bogo-ops, a healthy node failed."""
    assert O.vm_bytes_problems("192M", node_memory_mib=256) == []
    p = O.vm_bytes_problems("200M", node_memory_mib=256)
    assert p == [
        "--vm-bytes 200M does not fit the nodes under check: at most 192M (75% of 256 MiB); a larger "
        "memory stressor is killed for memory and fails a healthy node"
    ]
    assert O.vm_bytes_problems("64M", node_memory_mib=256) == []  # the default fits the smallest type


def test_percent_is_of_the_host():
    assert O.vm_bytes_problems("5%") == []  # well formed
    p = O.vm_bytes_problems("5%", node_memory_mib=256, host_memory_mib=24 * 1024)
    assert p and p[0].startswith("--vm-bytes 5% (1.2G of the host's memory) does not fit"), p
    assert O.vm_bytes_problems("1%", node_memory_mib=4096, host_memory_mib=24 * 1024) == []
    p = O.vm_bytes_problems("1%", node_memory_mib=4096)
    assert p == ["--vm-bytes 1%: a percentage is of the host's memory, not the node's; give a size (at most 3G)"]


@pytest.mark.parametrize(
    "opts,flag",
    [
        ({"stress_seconds": 0}, "--stress-seconds must be a whole number from 1 to 3600, got 0"),
        ({"stress_seconds": 3601}, "--stress-seconds"),
        ({"stress_seconds": True}, "--stress-seconds"),
        ({"stress_seconds": "3"}, "--stress-seconds"),
        ({"dcgm_level": 5}, "--dcgm-level must be one of 1, 2, 3, 4, got 5"),
        ({"dcgm_level": True}, "--dcgm-level"),
        ({"wait_idle_timeout": -1}, "--wait-idle-timeout must be a number of seconds >= 0"),
        ({"wait_idle_timeout": math.nan}, "--wait-idle-timeout"),
        ({"wait_idle_timeout": math.inf}, "--wait-idle-timeout"),
        ({"recovery_wait": 0}, "--recovery-wait must be a number of seconds > 0"),
        ({"recovery_wait": 1e9}, "--recovery-wait"),
        ({"timeout": -5}, "--timeout"),
        ({"timeout": math.nan}, "--timeout"),
        ({"vm_bytes": INJECTION}, "--vm-bytes"),
    ],
)
def test_every_option_is_validated(opts, flag):
    p = O.problems(opts)
    assert len(p) == 1 and p[0].startswith(flag), p


def test_defaults_are_valid():
    assert O.problems({}) == []
    assert (
        O.problems(
            {
                "wait_idle_timeout": 0,
                "stress_seconds": 1,
                "vm_bytes": "64M",
                "dcgm_level": 4,
                "recovery_wait": 90,
                "timeout": 1800,
            }
        )
        == []
    )


def test_stress_command_is_an_argv_list_without_a_shell():
    argv = stress_command(StressOptions(seconds=3, vm_bytes="1.5G"), 2.5)
    assert argv == [
        "/usr/local/bin/hp-stress",
        "--cpu",
        "3",
        "--vm",
        "1",
        "--vm-bytes",
        str(3 << 29),
        "--verify",
        "--metrics-brief",
        "--cache-size",  # not the last-level cache's size: 300 MiB on a 2026 Xeon
        "64K",
        "--timeout",
        "3s",
    ]
    assert stress_command(StressOptions(vm_bytes="5%"), None)[6] == "5%"
    with pytest.raises(ValueError, match="--vm-bytes must be"):
        stress_command(StressOptions(vm_bytes=INJECTION), 1)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_text_is_refused_or_becomes_a_plain_number(text):
    """Whatever the user types, stress-ng gets digits (and maybe a %), or nothing runs."""
    if O.vm_bytes_problems(text):
        with pytest.raises(ValueError):
            stress_command(StressOptions(vm_bytes=text), 1)
        return
    argv = stress_command(StressOptions(vm_bytes=text), 1)
    assert re.fullmatch(r"[0-9]+%?", argv[argv.index("--vm-bytes") + 1])
    assert "sh" not in argv


def test_cli_injection_is_exit_2_and_touches_nothing(tmp_path, monkeypatch, capsys):
    """The fault campaign's command: exit 2, before the store or Docker is touched."""
    from orchestrator.cli import main as cli

    monkeypatch.setenv("HP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setattr(
        "sys.argv",
        ["hp", "health-check", "start", "lab", "--node", "cpu-1", "--check", "InstanceStress", "--vm-bytes", INJECTION],
    )
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: invalid health-check request: --vm-bytes must be a size like 64M")
        and "Traceback" not in err
    )
    assert not (tmp_path / "home").exists()  # not even the store was opened


def test_a_recorded_request_with_bad_options_touches_no_node(tmp_path, monkeypatch):
    """A request recorded before validation existed: the worker refuses it (exit 2)
    before it reads the cluster or Docker."""
    from orchestrator.health.requests import worker
    from orchestrator.state.health_requests import Records
    from orchestrator.state.store import Store

    monkeypatch.setenv("HP_HOME", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    rid = Records(Store(tmp_path)).new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-1"], {"vm_bytes": INJECTION})
    assert rid
    assert worker.main("lab", rid) == 2
