"""Spec fuzzing (issue 9): generated specs, valid and broken, are
(a) judged the same by hp's validator (orchestrator.spec.validate) and the JSON Schema
    schemas/cluster-spec.schema.json, except where the schema cannot speak (the gaps
    listed in orchestrator/spec/schema.py: catalogue lookups, uniqueness, MinCount vs
    InstanceCount, name lengths relative to the cluster name): the schema never refuses
    what hp accepts, and every spec hp refuses that the schema accepts is explained by
    a gap;
(b) never crash `hp create -f FILE` (run in-process through cli.main, Docker
    unreachable): exit 0 (--dry-run of a valid spec, whose JSON output the schema
    accepts) or 2 (refused, with an "error:" line and no traceback), and a refused spec
    creates nothing (not even hp's state directory);
(c) random bytes and text as a spec file: exit 2, no traceback.

The schema is checked with integers as hp sees them (2.0 is not an integer; JSON
Schema's own "integer" takes it: a documented gap). Budget: HP_FUZZ_EXAMPLES (default
600: 25-65 s on the 2-core CI VM) specs, a fifth of that for raw files; the counts and times are
printed at the end. Each documented gap is also run as an explicit example.
A longer run by hand: HP_FUZZ_EXAMPLES=5000 pytest tests/unit/test_spec_fuzz.py
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestrator.errors import BadInput
from orchestrator.spec import names as specnames
from orchestrator.spec.catalogue import load_catalogue
from orchestrator.spec.loader import load_spec_file
from orchestrator.spec.model import name_problem, validate
from orchestrator.spec.schema import PATH as SCHEMA_PATH
from orchestrator.spec.schema import cluster_spec_schema

CAT = load_catalogue()
TYPES = sorted(CAT)
EXAMPLES = int(os.environ.get("HP_FUZZ_EXAMPLES", "600"))
SCHEMA = json.loads(SCHEMA_PATH.read_text())
_strict_int = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool)
)
Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_strict_int)
SCHEMA_V = Validator(SCHEMA)
STATS: Counter[str] = Counter()
TIMES: Counter[str] = Counter()

# -- strategies --------------------------------------------------------------------------
good_name = st.from_regex(r"[a-zA-Z0-9](-{0,2}[a-zA-Z0-9]){0,10}", fullmatch=True)
edge_name = st.one_of(
    st.integers(30, 70).map(lambda n: "g" * n),
    st.sampled_from(
        [
            "",
            "-a",
            "a-",
            "a_b",
            "lab\n",
            " lab",
            "a.b",
            "ä",
            "dev",
            "default",
            "DEFAULT",
            "ALL",
            "123",
            "x" * 40,
            "x" * 41,
            "x" * 52,
            "x" * 53,
            "x" * 63,
            "x" * 64,
        ]
    ),
    st.text(max_size=8),
    st.integers(-2, 2),
    st.none(),
    st.booleans(),
)
name = st.one_of(good_name, good_name, good_name, edge_name)
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_value = st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8
)
count = st.one_of(
    st.integers(0, 4), st.integers(0, 4), st.integers(-3, 10**6), st.sampled_from([True, 1.0, 2.5, "2", None])
)


def _group(draw: Any, ntype: str) -> dict[str, Any]:
    """A valid group (names may collide: a documented gap); mutations break it."""
    sc: dict[str, Any] = {"NodeType": ntype}
    if ntype == "Compute":
        sc["PartitionNames"] = [draw(good_name)]
    g = {
        "InstanceGroupName": draw(good_name),
        "InstanceType": draw(st.sampled_from(TYPES)),
        "InstanceCount": 1 if ntype != "Compute" else draw(st.integers(0, 4)),
        "SlurmConfig": sc,
    }
    if ntype == "Compute" and draw(st.integers(0, 4)) == 0:
        g["MinCount"] = draw(st.integers(0, 4))
    if draw(st.integers(0, 5)) == 0:
        g["OnStartDeepHealthChecks"] = draw(
            st.lists(st.sampled_from(["InstanceStress", "InstanceConnectivity"]), max_size=2)
        )
    return g


def _groups(doc: dict[str, Any]) -> list[Any]:
    gs = doc.get("InstanceGroups")
    return gs if isinstance(gs, list) else []


def _pick_group(draw: Any, doc: dict[str, Any]) -> dict[str, Any] | None:
    gs = [g for g in _groups(doc) if isinstance(g, dict)]
    return draw(st.sampled_from(gs)) if gs else None


def m_drop_key(draw, doc):
    g = _pick_group(draw, doc)
    target = draw(st.sampled_from([doc] + ([g, g.get("SlurmConfig")] if g else [])))
    if isinstance(target, dict) and target:
        target.pop(draw(st.sampled_from(sorted(target))), None)


def m_extra_key(draw, doc):
    g = _pick_group(draw, doc)
    target = draw(st.sampled_from([doc] + ([g, g.get("SlurmConfig")] if g else [])))
    if isinstance(target, dict):
        target[
            draw(
                st.sampled_from(
                    [
                        "Foo",
                        "clustername",
                        "Tags",
                        "VpcConfig",
                        "ThreadsPerCore",
                        "Image",
                        "PartitionNames",
                        "LifeCycleConfig",
                    ]
                )
            )
        ] = draw(json_value)


def m_wrong_type(draw, doc):
    g = _pick_group(draw, doc)
    choices = [(doc, k) for k in ("ClusterName", "InstanceGroups", "NodeRecovery", "NodeProvisioningMode", "Tags")]
    if g:
        choices += [
            (g, k)
            for k in (
                "InstanceGroupName",
                "InstanceType",
                "InstanceCount",
                "MinCount",
                "SlurmConfig",
                "OnStartDeepHealthChecks",
                "ThreadsPerCore",
            )
        ]
        if isinstance(g.get("SlurmConfig"), dict):
            choices += [(g["SlurmConfig"], "NodeType"), (g["SlurmConfig"], "PartitionNames")]
    target, key = draw(st.sampled_from(choices))
    target[key] = draw(json_value)


def m_bad_name(draw, doc):
    g = _pick_group(draw, doc)
    which = draw(st.sampled_from(["cluster", "group", "partition"]))
    if which == "cluster" or g is None:
        doc["ClusterName"] = draw(edge_name)
    elif which == "group":
        g["InstanceGroupName"] = draw(edge_name)
    elif isinstance(g.get("SlurmConfig"), dict):
        g["SlurmConfig"]["PartitionNames"] = [draw(edge_name)]


def m_count(draw, doc):
    g = _pick_group(draw, doc)
    if g:
        g[draw(st.sampled_from(["InstanceCount", "MinCount"]))] = draw(count)


def m_duplicate_group(draw, doc):
    g = _pick_group(draw, doc)
    if g:
        doc["InstanceGroups"].append(copy.deepcopy(g))


def m_extra_role(draw, doc):
    if isinstance(doc.get("InstanceGroups"), list):
        doc["InstanceGroups"].append(_group(draw, draw(st.sampled_from(["Controller", "Login"]))))


def m_drop_group(draw, doc):
    gs = _groups(doc)
    if gs:
        gs.pop(draw(st.integers(0, len(gs) - 1)))


def m_partitions(draw, doc):
    g = _pick_group(draw, doc)
    if g and isinstance(g.get("SlurmConfig"), dict):
        g["SlurmConfig"]["PartitionNames"] = draw(st.lists(name, max_size=2))


def m_type(draw, doc):
    g = _pick_group(draw, doc)
    if g:
        g["InstanceType"] = draw(st.sampled_from(["x.huge", "CPU.SMALL", "", "cpu.small "]))


def m_not_a_mapping(draw, doc):
    return draw(st.one_of(json_leaf, st.lists(json_leaf, max_size=2)))


MUTATIONS = [
    m_drop_key,
    m_extra_key,
    m_wrong_type,
    m_bad_name,
    m_count,
    m_duplicate_group,
    m_extra_role,
    m_drop_group,
    m_partitions,
    m_type,
    m_not_a_mapping,
]


@st.composite
def specs(draw: Any) -> Any:
    groups = [_group(draw, "Controller")]
    if draw(st.booleans()):
        groups.append(_group(draw, "Login"))
    groups += [_group(draw, "Compute") for _ in range(draw(st.integers(0, 3)))]
    doc: Any = {"ClusterName": draw(good_name), "InstanceGroups": draw(st.permutations(groups))}
    if draw(st.booleans()):
        doc["NodeRecovery"] = draw(st.sampled_from(["Automatic", "None", "none", None]))
    if draw(st.booleans()):
        doc["NodeProvisioningMode"] = draw(st.sampled_from(["Continuous", "AllOrNothing", None, "continuous"]))
    if draw(st.integers(0, 3)) == 0:
        doc["Tags"] = draw(st.lists(json_value, max_size=3))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 1, 2, 3]))):  # about 3 in 8 unbroken
        new = draw(st.sampled_from(MUTATIONS))(draw, doc)
        if new is not None:
            return new
    return doc


# -- judgements --------------------------------------------------------------------------
def hp_judges(doc: Any) -> list[str]:
    """hp's problems ([] = valid); anything but BadInput is a crash."""
    try:
        validate(copy.deepcopy(doc), CAT)
    except BadInput as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems)
        assert e.exit_code == 2
        return e.problems
    return []


def gaps(doc: Any) -> set[str]:
    """Why hp may refuse what the schema accepts (specschema.GAPS)."""
    out: set[str] = set()
    if not isinstance(doc, dict):
        return out
    cluster = doc.get("ClusterName")
    seen: set[str] = set()
    parts: set[str] = set()
    counts = [
        g.get("InstanceCount")
        for g in _groups(doc)
        if isinstance(g, dict)
        and isinstance(g.get("SlurmConfig"), dict)
        and g["SlurmConfig"].get("NodeType") == "Compute"
    ]
    limit = doc.get("MaxNodeCount") if isinstance(doc.get("MaxNodeCount"), int) else 65536
    if sum(c for c in counts if isinstance(c, int) and not isinstance(c, bool)) > limit:
        out.add("compute nodes over MaxNodeCount")
    for g in _groups(doc):
        if not isinstance(g, dict):
            continue
        if isinstance(g.get("InstanceType"), str) and g["InstanceType"] not in CAT:
            out.add("catalogue")
        n = g.get("InstanceGroupName")
        if isinstance(n, str) and not name_problem("g", n):
            if n.lower() in seen:
                out.add("unique group names")
            seen.add(n.lower())
            if isinstance(cluster, str) and specnames.group_name_problems(cluster, n):
                out.add("name lengths")
        mc, c = g.get("MinCount"), g.get("InstanceCount")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in (mc, c)) and mc > c:
            out.add("MinCount > InstanceCount")
        sc = g.get("SlurmConfig")
        pn = sc.get("PartitionNames") if isinstance(sc, dict) else None
        if isinstance(pn, list) and len(pn) == 1 and isinstance(pn[0], str):
            if pn[0] in parts:
                out.add("unique partitions")
            parts.add(pn[0])
    return out


def as_yaml(doc: Any) -> str | None:
    """YAML text that PyYAML itself reads back as doc (its emitter writes U+0085 raw,
    which reads back as a line break; YAML has no surrogate-pair escapes), or None."""
    for text in (
        lambda: yaml.safe_dump(doc, allow_unicode=True),
        lambda: yaml.safe_dump(doc, allow_unicode=False),
        lambda: json.dumps(doc, ensure_ascii=False),
    ):
        t = text()
        try:
            if yaml.safe_load(t) == doc:
                return t
        except yaml.YAMLError:
            continue
    return None


def run_hp(*args: str) -> tuple[int, str, str]:
    """`hp ARGS` in this process (cli.main), Docker unreachable: (exit code, stdout, stderr)."""
    from orchestrator.cli import main as cli

    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["hp", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest):
    yield
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    line = (
        f"spec fuzz: {STATS['specs']} generated specs in {TIMES['specs']:.1f} s "
        f"(hp accepted {STATS['accepted']}, refused {STATS['refused']}: {STATS['both refuse']} by both, "
        f"{STATS['gap']} by hp alone through a documented gap); "
        f"{STATS['raw']} raw files in {TIMES['raw']:.1f} s"
    )
    gapinfo = ", ".join(f"{k[4:]} {v}" for k, v in sorted(STATS.items()) if k.startswith("gap:"))
    msg = line + (f"; gaps: {gapinfo}" if gapinfo else "")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        if tr is not None:
            tr.write_line("")
            tr.write_line(msg)
        else:  # pragma: no cover
            print(msg)


@pytest.fixture(autouse=True)
def _no_docker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/hp-fuzz.sock")
    monkeypatch.setenv("HP_HOME", str(tmp_path / "hp-home"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("HP_INSTANCE_TYPES", raising=False)


def test_schema_file_is_generated_from_the_model():
    assert SCHEMA == cluster_spec_schema(), "run: python -m orchestrator.spec.schema --write"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def _spec(cluster: str = "lab", **group: Any) -> dict[str, Any]:
    ctl = {
        "InstanceGroupName": "controller",
        "InstanceType": "cpu.small",
        "InstanceCount": 1,
        "SlurmConfig": {"NodeType": "Controller"},
    }
    cpu = {
        "InstanceGroupName": "cpu",
        "InstanceType": "cpu.small",
        "InstanceCount": 2,
        "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["cpu"]},
        **group,
    }
    return {"ClusterName": cluster, "InstanceGroups": [ctl, cpu]}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(doc=specs(), as_json=st.booleans())
@example(doc=_spec(), as_json=False)
@example(doc=_spec(InstanceType="x.huge"), as_json=True)  # gap: catalogue
@example(doc=_spec(InstanceGroupName="Controller"), as_json=False)  # gap: unique names (case aside)
@example(doc=_spec(MinCount=3), as_json=True)  # gap: MinCount > InstanceCount
@example(doc=_spec(cluster="c" * 30, InstanceGroupName="g" * 30), as_json=False)  # gap: name lengths
@example(doc=_spec(InstanceCount=2.0), as_json=True)  # 2.0: refused by both here
@example(doc=_spec(cluster="lab\n"), as_json=False)  # found: "$" before a final newline
@example(doc=_spec(SlurmConfig={"NodeType": []}), as_json=True)  # found: a crash (unhashable)
def test_generated_specs(doc: Any, as_json: bool) -> None:
    t0 = time.perf_counter()
    home = Path(os.environ["HP_HOME"])
    problems = hp_judges(doc)
    schema_ok = SCHEMA_V.is_valid(doc)
    STATS["specs"] += 1
    if not problems:
        STATS["accepted"] += 1
        assert schema_ok, f"the schema refuses a spec hp accepts: {[e.message for e in SCHEMA_V.iter_errors(doc)][:3]}"
    else:
        STATS["refused"] += 1
        if schema_ok:
            why = gaps(doc)
            assert why, f"hp refuses, the schema accepts, no documented gap explains it: {problems}"
            STATS["gap"] += 1
            for k in why:
                STATS["gap:" + k] += 1
        else:
            STATS["both refuse"] += 1
    # (b) through the CLI, from a file
    with tempfile.TemporaryDirectory(prefix="in-fuzz-") as d:
        text = None if as_json else as_yaml(doc)
        path = Path(d) / ("spec.json" if text is None else "spec.yaml")
        path.write_text(json.dumps(doc) if text is None else text)
        assert load_spec_file(path) == doc  # what hp reads is what was written
        code, out, err = run_hp("create", "-f", str(path), "--dry-run", "--json")
        assert "Traceback" not in err + out
        if problems:
            assert code == 2 and err.startswith("error: invalid cluster spec"), (code, err)
            code2, _, err2 = run_hp("create", "-f", str(path))  # for real: refused before anything is made
            assert code2 == 2 and "Traceback" not in err2
            assert not home.exists(), "a refused spec created hp's state"
        else:
            assert code == 0, (code, err)
            assert SCHEMA_V.is_valid(json.loads(out))  # what hp would create is a valid spec too
            assert not home.exists()
    TIMES["specs"] += time.perf_counter() - t0


@settings(
    max_examples=max(EXAMPLES // 5, 20),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200).map(str.encode),
        st.lists(
            st.sampled_from(
                [
                    "ClusterName: a\n",
                    "InstanceGroups:\n",
                    "- ",
                    "  ",
                    "&a ",
                    "*a ",
                    "[",
                    "]",
                    "{",
                    "}",
                    ": ",
                    '"',
                    "'",
                    "\t",
                    "\n",
                    "!!binary ",
                    "<<: ",
                    "---\n",
                    "#",
                    "\xe9",
                    "1e999",
                    "9" * 50,
                ]
            ),
            max_size=30,
        ).map(lambda xs: "".join(xs).encode("utf-8", "surrogatepass")),
    ),
    suffix=st.sampled_from([".yaml", ".json", ".yml", ""]),
)
def test_raw_files_never_crash(data: bytes, suffix: str) -> None:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="in-fuzz-") as d:
        path = Path(d) / f"spec{suffix}"
        path.write_bytes(data)
        code, out, err = run_hp("create", "-f", str(path), "--dry-run")
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err + out
    if code == 2:
        assert err.startswith("error: ")
    STATS["raw"] += 1
    TIMES["raw"] += time.perf_counter() - t0


def test_integral_float_counts_are_the_one_type_gap():
    """The published schema, read by a standard validator, takes InstanceCount 2.0
    (JSON Schema's integer); hp refuses it. Documented in the schema's $comment."""
    doc = _spec(InstanceCount=2.0)
    assert jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)
    assert not SCHEMA_V.is_valid(doc) and hp_judges(doc)
    assert "integral float" in SCHEMA["$comment"]
