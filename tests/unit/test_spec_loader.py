"""Hostile spec files (issue 9, item 2): each is refused with a clear message, exit 2,
nothing created, in bounded time and memory. The documents are the real attacks."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from pathlib import Path

import pytest

from orchestrator.errors import BadInput
from orchestrator.spec import loader as specload
from orchestrator.spec.catalogue import load_catalogue
from orchestrator.spec.loader import load_spec_file
from orchestrator.spec.model import validate

CAT = load_catalogue()
TIME_S = 1.0
PEAK_BYTES = 8 * 1024 * 1024  # Python allocations while reading (libyaml's own C buffers are not traced)

VALID_YAML = """\
ClusterName: lab
InstanceGroups:
  - InstanceGroupName: controller
    InstanceType: cpu.small
    InstanceCount: 1
    SlurmConfig: {NodeType: Controller}
  - InstanceGroupName: cpu
    InstanceType: cpu.small
    InstanceCount: 2
    SlurmConfig: {NodeType: Compute, PartitionNames: [cpu]}
"""

LAUGHS = """\
  - &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
  - &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  - &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  - &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  - &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  - &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  - &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
  - &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
  - &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""  # 9^9 = 387,420,489 "lol"s from 9 lines


def refused(path: Path) -> tuple[str, float, int]:
    """(message, seconds, peak traced bytes) of reading a file that must be refused.

    Timed and traced in two reads: tracemalloc slows every allocation several times (a
    1 MiB file took 0.17 s untraced, 0.74 s traced, more under coverage), so a time taken
    while tracing measures the tracer, not the loader."""
    t0 = time.perf_counter()
    with pytest.raises(BadInput) as e:
        load_spec_file(path)
    dt = time.perf_counter() - t0
    tracemalloc.start()
    try:
        with pytest.raises(BadInput) as traced:
            load_spec_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.exit_code == 2 and str(traced.value) == str(e.value)
    return str(e.value), dt, peak


def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def test_valid_yaml_and_json_read_as_before(tmp_path):
    doc = load_spec_file(write(tmp_path, "ok.yaml", VALID_YAML))
    assert validate(doc, CAT).ClusterName == "lab"
    again = load_spec_file(write(tmp_path, "ok.json", json.dumps(doc, indent=2)))
    assert again == doc


def test_alias_bomb_under_tags(tmp_path):
    p = write(tmp_path, "bomb.yaml", VALID_YAML + "Tags:\n" + LAUGHS)
    msg, dt, peak = refused(p)
    # line 16 (&e): its second *d brings the count past 10,000 (each *d is 7,381 values)
    assert msg.startswith(f"invalid cluster spec: {p}: line 16: the document holds more than 10000 values")
    assert "more than 10000 values once its aliases are expanded" in msg and "billion laughs" in msg
    assert dt < TIME_S and peak < PEAK_BYTES, (dt, peak)


def test_alias_bomb_used_as_a_count(tmp_path):
    doc = VALID_YAML.replace("InstanceCount: 2", "InstanceCount: *i")
    p = write(tmp_path, "count.yaml", "Tags:\n" + LAUGHS + doc)
    msg, dt, peak = refused(p)
    assert "more than 10000 values once its aliases are expanded" in msg
    assert dt < TIME_S and peak < PEAK_BYTES, (dt, peak)


def test_a_small_alias_is_fine_and_counts_its_expansion(tmp_path):
    doc = VALID_YAML.replace(
        "    InstanceType: cpu.small\n    InstanceCount: 2\n", "    <<: *small\n    InstanceCount: 2\n"
    ).replace(
        "    InstanceType: cpu.small\n    InstanceCount: 1\n",
        "    <<: &small {InstanceType: cpu.small}\n    InstanceCount: 1\n",
    )
    got = load_spec_file(write(tmp_path, "merge.yaml", doc))
    assert [g["InstanceType"] for g in got["InstanceGroups"]] == ["cpu.small", "cpu.small"]
    assert validate(got, CAT).compute[0].InstanceCount == 2


def test_recursive_alias(tmp_path):
    msg, dt, _ = refused(write(tmp_path, "rec.yaml", "ClusterName: lab\nTags: &t [1, *t]\n"))
    assert "line 2: alias *t refers to a value that contains it (a recursive alias)" in msg
    assert dt < TIME_S


def test_too_many_aliases(tmp_path):
    doc = "Tags:\n  - &x 1\n" + "".join("  - *x\n" for _ in range(specload.MAX_ALIASES + 1))
    msg, _, _ = refused(write(tmp_path, "many.yaml", doc))
    assert f"more than {specload.MAX_ALIASES} YAML aliases (*x)" in msg


def test_duplicate_cluster_name_yaml(tmp_path):
    p = write(tmp_path, "dup.yaml", VALID_YAML + "ClusterName: other\n")
    msg, dt, _ = refused(p)
    assert msg == f"invalid cluster spec: {p}: line 11: duplicate key 'ClusterName' (first at line 1)"
    assert dt < TIME_S


def test_duplicate_cluster_name_json(tmp_path):
    text = '{\n  "ClusterName": "lab",\n  "InstanceGroups": [],\n  "ClusterName": "other"\n}\n'
    p = write(tmp_path, "dup.json", text)
    msg, dt, _ = refused(p)
    assert msg == f"invalid cluster spec: {p}: line 4: duplicate key 'ClusterName' (first at line 2)"
    assert dt < TIME_S


def test_duplicate_nested_key_yaml_and_json(tmp_path):
    y = VALID_YAML.replace(
        "SlurmConfig: {NodeType: Controller}", "SlurmConfig: {NodeType: Controller, NodeType: Login}"
    )
    assert "line 6: duplicate key 'NodeType' (first at line 6)" in refused(write(tmp_path, "n.yaml", y))[0]
    j = json.dumps(load_spec_file(write(tmp_path, "ok.yaml", VALID_YAML)), indent=1)
    j = j.replace('"NodeType": "Controller"', '"NodeType": "Controller", "NodeType": "Login"')
    assert "duplicate key 'NodeType'" in refused(write(tmp_path, "n.json", j))[0]


def test_json_content_in_a_yaml_file_also_refuses_duplicates(tmp_path):
    p = write(tmp_path, "dup.yml", '{"ClusterName": "a",\n "ClusterName": "b"}')
    assert "line 2: duplicate key 'ClusterName' (first at line 1)" in refused(p)[0]


def test_latin1_file(tmp_path):
    text = VALID_YAML + "Tags: [{Key: owner, Value: José}]\n"
    data = text.encode("latin-1")
    p = write(tmp_path, "latin1.yaml", data)
    msg, dt, _ = refused(p)
    off = data.index(b"\xe9")
    assert msg == (
        f"invalid cluster spec: {p} is not UTF-8: byte 0xe9 at offset {off} (line 11, column 31) is not "
        "valid UTF-8 (Latin-1 or another legacy encoding?); save the file as UTF-8"
    )
    assert dt < TIME_S


def test_utf16_file(tmp_path):
    p = write(tmp_path, "u16.yaml", VALID_YAML.encode("utf-16"))
    assert "is not UTF-8: byte 0xff at offset 0 (line 1, column 1) is not valid UTF-8 (UTF-16?)" in refused(p)[0]


def test_utf8_bom_and_non_ascii_are_fine(tmp_path):
    text = VALID_YAML + "Tags: [{Key: owner, Value: José 🚀}]\n"
    doc = load_spec_file(write(tmp_path, "bom.yaml", b"\xef\xbb\xbf" + text.encode()))
    assert doc["Tags"][0]["Value"] == "José 🚀"


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_deep_nesting(tmp_path, suffix):
    depth = 100_000
    text = '{"ClusterName": "lab", "Tags": ' + "[" * depth + "]" * depth + "}"
    msg, dt, peak = refused(write(tmp_path, "deep" + suffix, text))
    # libyaml's scanner reads ahead and has its own bound (1,000 flow levels); either refuses
    assert (
        f"line 1: values are nested deeper than {specload.MAX_DEPTH} levels" in msg
        or "not valid YAML: while increasing flow level exceeded maximum nesting depth" in msg
    ), msg
    assert dt < TIME_S and peak < PEAK_BYTES, (dt, peak)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_nesting_just_past_the_bound(tmp_path, suffix):
    depth = specload.MAX_DEPTH + 1
    text = '{"ClusterName": "lab", "Tags":\n ' + "[" * depth + "]" * depth + "}"
    msg, _, _ = refused(write(tmp_path, "deep" + suffix, text))
    assert f"line 2: values are nested deeper than {specload.MAX_DEPTH} levels" in msg, msg
    ok = '{"ClusterName": "lab", "Tags": ' + "[" * (depth - 2) + "]" * (depth - 2) + "}"
    assert load_spec_file(write(tmp_path, "ok" + suffix, ok))["ClusterName"] == "lab"


def test_deep_nesting_through_an_alias(tmp_path):
    nest = "[" * 20 + "1" + "]" * 20
    doc = f"a: &a {nest}\nb: {'[' * 20}*a{']' * 20}\n"
    assert "nested deeper than 32 levels (through *a)" in refused(write(tmp_path, "d.yaml", doc))[0]


def test_huge_file(tmp_path):
    p = tmp_path / "huge.yaml"
    with open(p, "wb") as f:
        f.write(VALID_YAML.encode() + b"Tags:\n")
        line = b"  - " + b"x" * 100 + b"\n"
        f.write(line * (50 * 1024 * 1024 // len(line)))  # 50 MiB
    msg, dt, peak = refused(p)
    size = p.stat().st_size
    assert msg == f"invalid cluster spec: {p} is {size} bytes; a spec file may be at most 1048576 bytes (1 MiB)"
    assert dt < TIME_S and peak < 2 * specload.MAX_BYTES + PEAK_BYTES, (dt, peak)


def test_many_values_just_under_the_size_limit(tmp_path):
    line = b"  - 1\n"
    data = VALID_YAML.encode() + b"Tags:\n" + line * ((specload.MAX_BYTES - 300) // len(line))
    p = write(tmp_path, "many.yaml", data)
    msg, dt, peak = refused(p)
    assert "more than 10000 values" in msg
    assert dt < TIME_S and peak < PEAK_BYTES, (dt, peak)


def test_pipes_devices_and_missing_files(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")  # no writer: read as empty, the open does not block
    msg, dt, _ = refused(tmp_path / "fifo.yaml")
    assert msg.endswith("fifo.yaml is empty") and dt < TIME_S
    msg, dt, _ = refused(Path("/dev/zero"))  # endless: read up to the bound only
    assert (
        msg
        == (
            "invalid cluster spec: /dev/zero is more than 1048576 bytes; a spec file may be at most "
            "1048576 bytes (1 MiB)"
        )
        and dt < TIME_S
    )
    assert "cannot read spec file" in refused(tmp_path / "missing.yaml")[0]
    assert refused(tmp_path)[0].endswith("Is a directory")


def test_a_pipe_is_read(tmp_path):
    """hp create -f /dev/stdin < spec.yaml (or cat spec | hp create -f /dev/stdin)."""
    r, w = os.pipe()
    os.write(w, VALID_YAML.encode())
    os.close(w)
    try:
        assert load_spec_file(f"/dev/fd/{r}")["ClusterName"] == "lab"
    finally:
        os.close(r)


@pytest.mark.parametrize(
    "doc,suffix,expect",
    [
        ("", ".yaml", "is empty"),
        ("--- 1\n--- 2\n", ".yaml", "line 2 column 1: not valid YAML: expected a single document"),
        ("ClusterName: [\n", ".yaml", "not valid YAML"),
        ('{"ClusterName": "lab",}', ".json", "line 1 column 23: not valid JSON: Expecting property name"),
        ("ClusterName: lab\nInstanceCount: " + "9" * 5000 + "\n", ".yaml", "Exceeds the limit (4300 digits)"),
        ('{"InstanceCount": ' + "9" * 5000 + "}", ".json", "Exceeds the limit (4300 digits)"),
        ('{"InstanceCount": NaN}', ".json", "NaN is not a JSON number"),
        ('{"InstanceCount": 1e400}', ".json", "1e400 is not a finite number"),
        ("InstanceCount: .inf\n", ".yaml", "line 1: '.inf' is not a finite number"),
        ("Tags: !!binary aGVsbG8=\n", ".yaml", "the YAML tag tag:yaml.org,2002:binary is not allowed"),
        (
            "Tags: !!python/object:os.system {}\n",
            ".yaml",
            "the YAML tag tag:yaml.org,2002:python/object:os.system is not allowed",
        ),
        ("Tags: !!set {a, b}\n", ".yaml", "the YAML tag tag:yaml.org,2002:set is not allowed"),
        ("1: x\n", ".yaml", "line 1: mapping keys must be strings, found '1'"),
        ("? [a]\n: x\n", ".yaml", "mapping keys must be strings, found a list"),
        ("a: \x07\n", ".yaml", "not valid YAML"),
    ],
)
def test_other_bad_documents(tmp_path, doc, suffix, expect):
    msg, dt, _ = refused(write(tmp_path, "bad" + suffix, doc))
    assert expect in msg, msg
    assert dt < TIME_S


def test_plain_data_only(tmp_path):
    doc = load_spec_file(write(tmp_path, "t.yaml", "a: 2024-01-01\nb: 1.5\nc: null\nd: yes\ne: '1'\n"))
    assert doc == {"a": "2024-01-01", "b": 1.5, "c": None, "d": True, "e": "1"}


def test_cli_refuses_a_bomb_with_exit_2_and_creates_nothing(tmp_path, monkeypatch, capsys):
    """Through `hp create -f`: exit 2, the message on stderr, no traceback, no cluster in
    the store, and Docker never asked (an unreachable DOCKER_HOST)."""
    from orchestrator.cli import main as cli
    from orchestrator.state.store import Store

    monkeypatch.setenv("HP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    cases = {
        "bomb.yaml": VALID_YAML + "Tags:\n" + LAUGHS,
        "dup.json": '{"ClusterName": "a", "ClusterName": "b", "InstanceGroups": []}',
        "latin1.yaml": (VALID_YAML + "Tags: [{Key: k, Value: café}]\n").encode("latin-1"),
    }
    for name, data in cases.items():
        p = write(tmp_path, name, data)
        monkeypatch.setattr("sys.argv", ["hp", "create", "-f", str(p)])
        t0 = time.perf_counter()
        with pytest.raises(SystemExit) as e:
            cli.main()
        assert e.value.code == 2, name
        assert time.perf_counter() - t0 < TIME_S
        err = capsys.readouterr().err
        assert err.startswith(f"error: invalid cluster spec: {p}"), err
        assert "Traceback" not in err
    assert Store(tmp_path / "home").clusters() == []


def test_without_libyaml_the_same_rules_hold(tmp_path):
    """PyYAML without its C parser (yaml._yaml): the pure-Python parser, same budgets."""
    import subprocess
    import sys

    bomb = write(tmp_path, "bomb.yaml", VALID_YAML + "Tags:\n" + LAUGHS)
    dup = write(tmp_path, "dup.yaml", VALID_YAML + "ClusterName: other\n")
    ok = write(tmp_path, "ok.yaml", VALID_YAML)
    code = (
        "import sys, time; sys.modules['yaml._yaml'] = None\n"
        "from orchestrator.spec import loader as L\n"
        "from orchestrator.errors import BadInput\n"
        "assert L._Parser.__name__ == '_PyParser'\n"
        "assert L.load_spec_file(sys.argv[3])['ClusterName'] == 'lab'\n"
        "for p in sys.argv[1:3]:\n"
        "    t = time.perf_counter()\n"
        "    try:\n"
        "        L.load_spec_file(p)\n"
        "    except BadInput as e:\n"
        "        print(f'{time.perf_counter() - t:.3f}', e)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(bomb), str(dup), str(ok)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "line 16: the document holds more than 10000 values once its aliases are expanded" in lines[0]
    assert "line 11: duplicate key 'ClusterName' (first at line 1)" in lines[1]
    assert all(float(x.split()[0]) < TIME_S for x in lines)
