"""What a CI pipeline relies on (orchestrator/ci/), against the fakes: `hp submit`'s exit
code is the job's, `hp logs` writes one folder per node that exists or recently existed
and never the auth key, `hp images save/load` round-trips and refuses a damaged file,
`hp version` works with and without an engine. JSON documents are checked against
schemas/."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fakes import FakeContainer, World, spec_doc, world

import orchestrator
from orchestrator.ci import images_io, logs, submit
from orchestrator.ci.image_versions import image_versions
from orchestrator.ci.images_io import images_key, load_images, read_manifest, save_images
from orchestrator.ci.logs import LogWriter, export_logs, nodes_to_collect
from orchestrator.ci.submit import FOLLOW_SH
from orchestrator.ci.version import versions
from orchestrator.cluster.create import CreateOptions, create
from orchestrator.cluster.describe import package_version
from orchestrator.docker.images import parse_dpkg_version
from orchestrator.docker.views import ExecResult
from orchestrator.errors import BadInput, EngineError, NotFound, OperationFailed, WaitTimeout
from orchestrator.releases import DEFAULT, RELEASES
from orchestrator.slurm.model import JobInfo
from orchestrator.spec.model import validate
from orchestrator.state.health_requests import Records
from orchestrator.state.phases import NodePhase, Phase, Phases

ROOT = Path(__file__).resolve().parents[2]
SLURM_TEXT = json.loads((ROOT / "tests" / "fixtures" / "slurm-24.11-cli-text.json").read_text())


def check_schema(command: str, doc: Any) -> None:
    schema = json.loads((ROOT / "schemas" / f"{command}.schema.json").read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(doc)


def make(w: World, name: str = "lab", groups: list | None = None, **kw: Any) -> None:
    spec = validate(spec_doc(name, groups, **kw), w.env.catalogue)
    create(w.env, spec, CreateOptions(timeout=5))


# -- submit ----------------------------------------------------------------------------
JOB_OUTPUT = b"hello from the job\nline 2\n"


@pytest.fixture
def ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    """A cluster whose login node answers as a real one: `install -d` works, the output
    follower prints the job's output; sbatch calls are kept in w.sbatch."""
    monkeypatch.setattr(submit, "POLL", 0.001)
    w = world(tmp_path)
    make(w)

    def handler(c: FakeContainer, cmd: list[str]) -> ExecResult:
        if cmd[:2] == ["sh", "-c"] and cmd[2] == FOLLOW_SH:
            return ExecResult(0, JOB_OUTPUT.decode())
        return ExecResult(0, "")

    w.provider.exec_handler = handler
    w.sbatch = []  # type: ignore[attr-defined]
    real = w.slurm.submit

    def sbatch(container: str, script: str, output: str, args: list[str], user: str, workdir: str, env: dict) -> Any:
        w.sbatch.append(
            {
                "container": container,
                "script": script,
                "output": output,
                "args": args,
                "user": user,
                "workdir": workdir,
                "env": env,
            }
        )  # type: ignore[attr-defined]
        return real(container, script, output, args, user, workdir, env)

    w.slurm.submit = sbatch  # type: ignore[method-assign]
    return w


def script(tmp_path: Path, name: str = "job.sh") -> Path:
    p = tmp_path / name
    p.write_text("#!/bin/sh\necho hello from the job\n")
    return p


def test_submit_runs_the_script_on_the_login_node_and_returns_the_jobs_exit_code(ci: World, tmp_path: Path) -> None:
    shown: list[bytes] = []
    res = submit.submit(ci.env, "lab", script(tmp_path), "cpu", 2, ["--time=5"], 30, shown.append)
    assert (res.job_id, res.exit_code, res.output) == (1, 0, JOB_OUTPUT.decode())
    assert b"".join(shown) == JOB_OUTPUT  # streamed as it came
    [sb] = ci.sbatch  # type: ignore[attr-defined]
    assert sb["container"] == "hp-lab-login-1" and sb["user"] == "hpuser" and sb["workdir"] == "/home/hpuser"
    assert sb["args"] == ["--partition", "cpu", "--nodes", "2", "--time=5"]
    assert sb["env"] == {"HOME": "/home/hpuser", "USER": "hpuser"}
    assert sb["script"] == res.script and sb["output"] == res.output_file == res.script + ".out"
    assert res.script.startswith("/home/hpuser/hp-submit/") and res.script.endswith("-job.sh")
    login = ci.provider.node("lab", "login-1")
    assert login.files[res.script] == script(tmp_path).read_bytes()
    assert res.script + ".done" in login.files  # the follower was told to stop
    doc = res.as_dict()
    check_schema("submit", doc)
    assert doc["JobId"] == 1 and doc["ExitCode"] == 0


def test_submit_names_unsafe_script_names_safely(ci: World, tmp_path: Path) -> None:
    res = submit.submit(ci.env, "lab", script(tmp_path, "my job;rm -rf $HOME.sh"), None, None, [], 30, lambda b: None)
    assert res.script.endswith("-my_job_rm_-rf__HOME.sh")
    assert ci.sbatch[0]["args"] == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "state, code, ci_code",
    [("FAILED", 3, 3), ("CANCELLED", 0, 1), ("NODE_FAIL", None, 1), ("TIMEOUT", 0, 1), ("COMPLETED", None, 0)],
)
def test_a_job_that_did_not_succeed_fails_the_step(
    ci: World, tmp_path: Path, state: str, code: int | None, ci_code: int
) -> None:
    def sbatch(*a: Any) -> tuple[int, str]:
        ci.slurm.jobs[7] = JobInfo(7, state, "cpu-1", code)
        return 7, "7\n"

    ci.slurm.submit = sbatch  # type: ignore[method-assign]
    shown: list[bytes] = []
    res = submit.submit(ci.env, "lab", script(tmp_path), None, None, [], 30, shown.append)
    assert (res.job_id, res.exit_code) == (7, ci_code)
    said = f"hp: job 7 ended {state}\n".encode()
    assert (said in b"".join(shown)) == (state != "COMPLETED")


def test_a_job_sbatch_refuses_is_exit_1_with_sbatchs_words(ci: World, tmp_path: Path) -> None:
    refused = SLURM_TEXT["sbatch --parsable --partition nope ok.sh"]["output"]
    ci.slurm.submit = lambda *a: (None, refused)  # type: ignore[method-assign]
    shown: list[bytes] = []
    res = submit.submit(ci.env, "lab", script(tmp_path), "nope", None, [], 30, shown.append)
    assert (res.job_id, res.exit_code, res.output) == (None, 1, refused)
    assert b"".join(shown) == refused.encode()
    check_schema("submit", res.as_dict())


def test_a_job_that_outlives_the_timeout_is_cancelled_and_exit_3(ci: World, tmp_path: Path) -> None:
    def sbatch(*a: Any) -> tuple[int, str]:
        ci.slurm.jobs[9] = JobInfo(9, "RUNNING", "cpu-1", 0)
        return 9, "9\n"

    ci.slurm.submit = sbatch  # type: ignore[method-assign]
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as ei:
        submit.submit(ci.env, "lab", script(tmp_path), None, None, [], 0.05, lambda b: None)
    assert time.monotonic() - t0 < 1
    assert ei.value.exit_code == 3
    assert "job 9 did not finish within 0.05 s (cancelled); output in /home/hpuser/hp-submit/" in str(ei.value)
    assert ("cancel", ("9",)) in ci.slurm.calls
    assert any(k.endswith(".done") for k in ci.provider.node("lab", "login-1").files)


def test_submit_needs_a_running_login_node(tmp_path: Path) -> None:
    w = world(tmp_path)
    make(w, login=False)
    with pytest.raises(BadInput, match="cluster 'lab' has no running login node: hp submit runs jobs from one") as ei:
        submit.submit(w.env, "lab", script(tmp_path), None, None, [], 30, lambda b: None)
    assert ei.value.exit_code == 2
    assert not [c for c in w.provider.calls if c[0] == "exec"]  # nothing was run
    make(w, "lab2")
    w.provider.die("lab2", "login-1")  # its login node is down: the controller is no stand-in
    with pytest.raises(BadInput, match="no running login node"):
        submit.submit(w.env, "lab2", script(tmp_path), None, None, [], 30, lambda b: None)


def test_submit_lists_every_bad_argument_at_once_and_does_nothing(ci: World, tmp_path: Path) -> None:
    before = list(ci.provider.calls)
    with pytest.raises(BadInput) as ei:
        submit.submit(ci.env, "lab", tmp_path / "missing.sh", None, 0, [], 0, lambda b: None)
    assert ei.value.problems == [
        f"script {tmp_path / 'missing.sh'} does not exist or is not a file",
        "--nodes must be at least 1, got 0",
        "--timeout must be positive, got 0",
    ]
    assert str(ei.value).startswith("cannot submit: 3 problems")
    assert ci.provider.calls == before and ci.sbatch == []  # type: ignore[attr-defined]
    with pytest.raises(NotFound, match="cluster 'nope' does not exist"):
        submit.submit(ci.env, "nope", script(tmp_path), None, None, [], 30, lambda b: None)


def test_submit_when_the_login_node_cannot_take_the_script(ci: World, tmp_path: Path) -> None:
    ci.provider.exec_handler = lambda c, cmd: ExecResult(1, "install: cannot create directory: Read-only file system\n")
    with pytest.raises(OperationFailed, match="cannot make /home/hpuser/hp-submit on hp-lab-login-1: install: cannot"):
        submit.submit(ci.env, "lab", script(tmp_path), None, None, [], 30, lambda b: None)
    ci.provider.exec_handler = lambda c, cmd: ExecResult(0, "")

    def refuse(*a: Any) -> None:
        raise EngineError("copy files into hp-lab-login-1:/home/hpuser/hp-submit: no space left on device", 500)

    ci.provider.put_files = refuse  # type: ignore[method-assign]
    with pytest.raises(OperationFailed, match="cannot copy the script to hp-lab-login-1: .*no space left"):
        submit.submit(ci.env, "lab", script(tmp_path), None, None, [], 30, lambda b: None)
    assert ci.sbatch == []  # type: ignore[attr-defined]


# -- logs ------------------------------------------------------------------------------
def all_files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def test_logs_write_every_nodes_evidence_and_never_the_auth_key(tmp_path: Path) -> None:
    w = world(tmp_path)
    make(w)
    key = (w.home / "clusters" / "lab" / "slurm.key").read_bytes()
    ctl = w.provider.node("lab", "controller-1")
    assert ctl.files["/etc/slurm/slurm.key"] == key  # it is on the node...
    cpu1 = w.provider.node("lab", "cpu-1")
    cpu1.files["/var/log/slurm/slurmd.log"] = b"[2026] debug: key " + key + b" loaded\n"
    cpu1.files["/var/log/slurm/slurmd.pid"] = b"17\n"  # not a log
    ctl.files["/etc/slurm/gres.conf"] = b"NodeName=gpu-1 Name=gpu File=/dev/nvidia0\n"
    out = tmp_path / "logs"
    said: list[str] = []
    doc = export_logs(w.env, "lab", out, log=said.append)
    check_schema("logs", doc)
    files = all_files(out)
    assert not [f for f, data in files.items() if key in data]  # ...and in no file written
    assert b"<hp: auth key removed>" in files["cpu-1/slurmd.log"] and "cpu-1/slurmd.pid" not in files
    assert doc["Nodes"] == ["controller-1", "cpu-1", "cpu-2", "login-1"]
    assert sorted(doc["Files"]) == sorted(files) and doc["Directory"] == str(out)
    # accounting (on by default) runs in the controller's container: slurmdbd's and
    # MariaDB's lines are in its log; no service container of its own (services/<host>/)
    assert said == [f"collecting {n}" for n in doc["Nodes"]]
    assert doc["Services"] == [] and b"slurmdbd version" in files["controller-1/container.log"]
    for n in doc["Nodes"]:
        st = json.loads(files[f"{n}/status.json"])
        assert st["Container"] == f"hp-lab-{n}" and st["State"]["Status"] == "running"
        assert st["RecordedStatus"] == "Running" and st["Labels"]["io.hp.node"] == n
    assert {"cpu-1/scontrol-show-node.txt", "cpu-2/scontrol-show-node.txt"} <= set(files)
    assert "controller-1/scontrol-show-node.txt" not in files  # workers only
    assert files["slurm.conf"] == ctl.files["/etc/slurm/slurm.conf"]
    assert files["gres.conf"] == ctl.files["/etc/slurm/gres.conf"]
    assert files["sinfo.txt"] == b"sinfo\n" and files["squeue.txt"] == b"squeue\n"
    cluster = json.loads(files["cluster.json"])
    assert cluster["ClusterStatus"] == "InService" and cluster["Spec"]["ClusterName"] == "lab"
    assert any("creation started" in e["Description"] for e in json.loads(files["events.json"]))
    assert "health-checks.json" not in files


def test_a_key_printed_in_a_container_log_is_removed(tmp_path: Path) -> None:
    w = world(tmp_path)
    make(w)
    key_path = w.home / "clusters" / "lab" / "slurm.key"
    key_path.write_bytes(b"an-ascii-only-key-0123456789")  # text survives the log's decoding intact
    w.provider.node("lab", "cpu-1").logs = "slurmd: key an-ascii-only-key-0123456789 read\n"
    export_logs(w.env, "lab", tmp_path / "a")
    assert (tmp_path / "a" / "cpu-1" / "container.log").read_text() == "slurmd: key <hp: auth key removed> read\n"


def test_a_binary_key_printed_in_a_container_log_is_removed(tmp_path: Path) -> None:
    w = world(tmp_path)
    make(w)
    key = (w.home / "clusters" / "lab" / "slurm.key").read_bytes()
    shown = key.decode(errors="replace")  # what DockerEngine.logs returns for those bytes
    w.provider.node("lab", "cpu-1").logs = f"key={shown}\n"
    export_logs(w.env, "lab", tmp_path / "a")
    assert shown.encode() not in (tmp_path / "a" / "cpu-1" / "container.log").read_bytes()


def test_logs_cover_nodes_that_recently_existed_or_wait_to_but_not_long_gone_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world(tmp_path)
    make(w, groups=[("cpu", "cpu.nano", 3)])
    st = w.env.store
    for n in ("cpu-2", "cpu-3"):  # removed on purpose (scale-down): their containers are gone
        st.set_phase("lab", n, Phase.SHUTTING_DOWN, "scaled down")
        st.set_phase("lab", n, Phase.REMOVED, "scaled down")
        w.provider.remove_container(f"hp-lab-{n}")
    st.set_phase("lab", "cpu-4", Phase.QUEUED, "InsufficientCapacity: no cpu.nano left")  # waits to exist
    doc = export_logs(w.env, "lab", tmp_path / "a")
    assert doc["Nodes"] == ["controller-1", "cpu-1", "cpu-2", "cpu-3", "cpu-4", "login-1"]
    gone = json.loads((tmp_path / "a" / "cpu-2" / "status.json").read_text())
    assert gone == {"Node": "cpu-2", "Container": None, "RecordedStatus": "Removed", "Message": "scaled down"}
    queued = json.loads((tmp_path / "a" / "cpu-4" / "status.json").read_text())
    assert queued["RecordedStatus"] == "Queued" and "InsufficientCapacity" in queued["Message"]
    # two hours later the removed ones are history; the one still waiting is not
    later = time.time() + 2 * 3600
    monkeypatch.setattr(logs, "time", type("T", (), {"time": staticmethod(lambda: later)}))
    doc = export_logs(w.env, "lab", tmp_path / "b")
    assert doc["Nodes"] == ["controller-1", "cpu-1", "cpu-4", "login-1"]
    assert not (tmp_path / "b" / "cpu-2").exists()


def test_nodes_to_collect() -> None:
    now = 10_000.0
    recorded = Phases(
        a=NodePhase(Phase.REMOVED, "", now - 3599),  # removed within the hour
        b=NodePhase(Phase.REMOVED, "", now - 3601),  # long gone
        c=NodePhase(Phase.LAUNCH_FAILED, "", now - 86400),  # failing for a day: still wanted
        d=NodePhase(Phase.RUNNING, "", now - 86400),
    )
    assert nodes_to_collect({"x": None, "b": None}, recorded, now) == ["a", "b", "c", "d", "x"]  # type: ignore[dict-item]
    assert nodes_to_collect({}, Phases(), now) == []


def test_logs_of_a_cluster_whose_controller_is_down_or_gone(tmp_path: Path) -> None:
    w = world(tmp_path)
    make(w)
    w.provider.die("lab", "controller-1")
    doc = export_logs(w.env, "lab", tmp_path / "a")
    files = all_files(tmp_path / "a")
    assert "sinfo.txt" not in files and "cpu-1/scontrol-show-node.txt" not in files  # Slurm can't answer
    ctl_status = json.loads(files["controller-1/status.json"])
    assert ctl_status["State"]["Status"] == "exited" and ctl_status["State"]["ExitCode"] == 137
    assert files["slurm.conf"] == w.provider.node("lab", "controller-1").files["/etc/slurm/slurm.conf"]
    w.provider.remove_container("hp-lab-controller-1")
    doc = export_logs(w.env, "lab", tmp_path / "b")
    conf = (tmp_path / "b" / "slurm.conf").read_text()
    assert "ClusterName=lab" in conf and "SlurmctldHost=controller-1" in conf  # rendered from the spec
    assert "controller-1" in doc["Nodes"]  # recorded Running, no container: said so
    assert json.loads((tmp_path / "b" / "controller-1" / "status.json").read_text())["Container"] is None


def test_logs_of_a_half_made_cluster_with_no_record_and_its_controller_down(tmp_path: Path) -> None:
    w = world(tmp_path)
    make(w)
    w.provider.die("lab", "controller-1")
    w.env.store.remove_cluster("lab")  # left over from an earlier run (another HP_HOME, a lost store)
    doc = export_logs(w.env, "lab", tmp_path / "a")
    files = all_files(tmp_path / "a")
    assert doc["Nodes"] == ["controller-1", "cpu-1", "cpu-2", "login-1"]
    assert "cluster.json" not in files and "events.json" not in files and "slurm.conf" not in files
    assert json.loads(files["cpu-1/status.json"])["RecordedStatus"] is None


def test_logs_of_a_half_made_cluster_with_no_record_and_its_controller_up(tmp_path: Path) -> None:
    w = world(tmp_path)
    make(w)
    w.env.store.remove_cluster("lab")
    doc = export_logs(w.env, "lab", tmp_path / "a")
    assert doc["Nodes"] == ["controller-1", "cpu-1", "cpu-2", "login-1"]


def test_logs_of_an_unknown_cluster_or_without_an_engine(tmp_path: Path) -> None:
    w = world(tmp_path)
    with pytest.raises(NotFound, match="cluster 'nope' does not exist"):
        export_logs(w.env, "nope", tmp_path / "a")
    assert not (tmp_path / "a").exists()
    w.provider.up = False
    with pytest.raises(Exception, match="cannot reach a Docker engine"):
        export_logs(w.env, "nope", tmp_path / "a")


def test_logs_include_the_recorded_health_checks(tmp_path: Path) -> None:
    w = world(tmp_path)
    make(w)
    rid = Records(w.env.store).new_request("lab", ["InstanceStress"], ["cpu"], ["cpu-1"], {})
    export_logs(w.env, "lab", tmp_path / "a")
    [hc] = json.loads((tmp_path / "a" / "health-checks.json").read_text())
    assert hc["RequestId"] == rid and hc["Checks"] == ["InstanceStress"] and hc["Nodes"] == ["cpu-1"]
    assert hc["State"] == "Pending" and hc["Results"] == []


def test_log_writer_redacts_the_key_in_text_and_bytes(tmp_path: Path) -> None:
    w = LogWriter(tmp_path, b"SECRET")
    w.write("a/b.txt", "x SECRET y SECRET")
    w.json("c.json", {"k": "SECRET"})
    assert (tmp_path / "a" / "b.txt").read_text() == "x <hp: auth key removed> y <hp: auth key removed>"
    assert b"SECRET" not in (tmp_path / "c.json").read_bytes() and w.files == ["a/b.txt", "c.json"]
    w2 = LogWriter(tmp_path, b"")  # no key (a failed create removed it): nothing to redact
    w2.write("d.txt", b"plain")
    assert (tmp_path / "d.txt").read_bytes() == b"plain"


# -- images as files -------------------------------------------------------------------
def real_ids(w: World) -> None:
    """The fake engine's image ids, in the engine's shape (sha256 of 64 hex digits)."""
    for ref, iid in list(w.provider.images.items()):
        w.provider.images[ref] = "sha256:" + hashlib.sha256(iid.encode()).hexdigest()


def test_images_save_then_load_round_trip(tmp_path: Path) -> None:
    w = world(tmp_path)
    real_ids(w)
    d = tmp_path / "cache"
    d.mkdir()
    (d / "hp-images-0123456789abcdef01234567.tar").write_bytes(b"an older save")
    said: list[str] = []
    saved = save_images(w.env, DEFAULT, d, log=said.append)
    check_schema("images-save", saved)
    assert [i["Name"] for i in saved["Images"]] == ["base", "controller", "login", "worker", "check-cpu"]
    assert saved["Images"][0]["Ref"] == RELEASES[DEFAULT].pulled_base
    tar = d / saved["File"]
    assert sorted(p.name for p in d.iterdir()) == sorted([saved["File"], "manifest.json"])  # the old one went
    assert saved["Size"] == tar.stat().st_size and saved["Sha256"] == hashlib.sha256(tar.read_bytes()).hexdigest()
    assert saved["Key"] == images_key(w.env, DEFAULT) and saved["File"] == f"hp-images-{saved['Key']}.tar"
    assert said == [f"saving 5 images to {tar}"]
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest == {k: v for k, v in saved.items() if k != "Directory"}
    # a fresh runner: no images; load puts back every one with the id it was saved with
    fresh = world(tmp_path / "runner", build=False)
    fresh.provider.images.clear()
    said.clear()
    loaded = load_images(fresh.env, d, log=said.append)
    check_schema("images-load", loaded)
    assert loaded["Loaded"] and loaded["KeyMatches"] and loaded["Key"] == saved["Key"]
    for i in saved["Images"]:
        assert fresh.provider.image_id(i["Ref"]) == i["Id"]
    assert said == [f"loading 5 image(s) from {tar}"]
    # everything there already: nothing to load, unless forced
    said.clear()
    again = load_images(fresh.env, d, log=said.append)
    assert not again["Loaded"] and said == ["every image is already present with the saved id: nothing to load"]
    assert load_images(fresh.env, d, force=True)["Loaded"]


def test_load_refuses_a_damaged_or_truncated_file(tmp_path: Path) -> None:
    w = world(tmp_path)
    d = tmp_path / "cache"
    saved = save_images(w.env, DEFAULT, d)
    tar = d / saved["File"]
    data = tar.read_bytes()
    tar.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size, one bit flipped
    with pytest.raises(OperationFailed, match=rf"{tar} is corrupt: sha256 [0-9a-f]{{16}}\.\.\., the manifest says"):
        load_images(w.env, d)
    tar.write_bytes(data[:-10])
    with pytest.raises(
        OperationFailed, match=rf"{tar} is corrupt: {len(data) - 10} bytes, the manifest says {len(data)}"
    ):
        load_images(w.env, d)


def test_load_when_the_engine_refuses_the_tar_or_gives_other_ids(tmp_path: Path) -> None:
    w = world(tmp_path)
    d = tmp_path / "cache"
    save_images(w.env, DEFAULT, d)
    fresh = world(tmp_path / "runner", build=False)
    fresh.provider.images.clear()

    def refuse(data: Any) -> list[str]:
        raise EngineError("loading images failed: Error processing tar file(exit status 1): unexpected EOF")

    fresh.provider.load_images = refuse  # type: ignore[method-assign]
    with pytest.raises(
        OperationFailed, match="loading .*hp-images-.*tar failed: loading images failed: Error processing"
    ):
        load_images(fresh.env, d)
    doc = json.loads((d / "manifest.json").read_text())
    doc["Images"][2]["Id"] = "sha256:other"
    (d / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(OperationFailed, match=f"these images are missing or differ: {doc['Images'][2]['Ref']}$"):
        load_images(w.env, d)


def test_load_of_images_saved_for_other_inputs_says_so(tmp_path: Path) -> None:
    w = world(tmp_path)
    real_ids(w)
    d = tmp_path / "cache"
    save_images(w.env, DEFAULT, d)
    doc = json.loads((d / "manifest.json").read_text())
    doc["Key"] = "000000000000000000000000"
    (d / "manifest.json").write_text(json.dumps(doc))
    said: list[str] = []
    res = load_images(w.env, d, log=said.append)
    assert res["KeyMatches"] is False and res["Key"] == "000000000000000000000000"
    assert any(s.startswith("note: these images were saved for inputs 000000000000000000000000") for s in said)
    check_schema("images-load", res)


def test_save_refuses_without_built_images_and_without_an_engine(tmp_path: Path) -> None:
    w = world(tmp_path, build=False)
    with pytest.raises(
        OperationFailed,
        match=rf"^image hp-controller:{re.escape(DEFAULT)}-[0-9a-f]{{12}} is not built: "
        rf"run 'hp images build --slurm {re.escape(DEFAULT)}' first$",
    ):
        save_images(w.env, DEFAULT, tmp_path / "a")
    w = world(tmp_path / "bare", build=False)
    w.provider.images.clear()
    with pytest.raises(OperationFailed, match="no base image: run 'hp images build'"):
        save_images(w.env, DEFAULT, tmp_path / "a")
    w.provider.up = False
    with pytest.raises(Exception, match="cannot reach a Docker engine"):
        save_images(w.env, DEFAULT, tmp_path / "a")


def test_save_without_check_images_saves_the_node_images(tmp_path: Path) -> None:
    w = world(tmp_path)
    check = next(r for r in w.provider.images if r.startswith("hp-check-cpu:") and not r.endswith(":latest"))
    del w.provider.images[check]
    names = [i["Name"] for i in save_images(w.env, DEFAULT, tmp_path / "a")["Images"]]
    assert names == ["base", "controller", "login", "worker"]


def test_images_key_follows_the_build_inputs_only(tmp_path: Path) -> None:
    w = world(tmp_path)
    k = images_key(w.env, DEFAULT)
    assert k.startswith(f"{DEFAULT}-") and len(k) == 30 and int(k[6:], 16) >= 0 and images_key(w.env, DEFAULT) == k
    root = tmp_path / "resources"
    for folder in ("images", "healthchecks"):  # the folders the images' contexts are in
        shutil.copytree(w.env.images(DEFAULT).root / folder, root / folder)
    w.env.images(DEFAULT).root = root
    assert images_key(w.env, DEFAULT) == k  # a copy builds the same images
    f = next(p for p in sorted((root / "images" / "node").rglob("*")) if p.is_file())
    f.chmod(f.stat().st_mode ^ 0o040)  # a permission bit that is not "executable": same key
    assert images_key(w.env, DEFAULT) == k
    f.chmod(f.stat().st_mode ^ 0o111)
    k2 = images_key(w.env, DEFAULT)
    assert k2 != k
    f.write_bytes(f.read_bytes() + b"\n")
    assert images_key(w.env, DEFAULT) not in (k, k2)


def test_read_manifest_reports_every_problem(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="is not a directory"):
        read_manifest(tmp_path / "nope")
    with pytest.raises(BadInput, match="manifest.json is missing"):
        read_manifest(tmp_path)
    m = tmp_path / "manifest.json"
    m.write_text("{not json")
    with pytest.raises(BadInput, match="is corrupt"):
        read_manifest(tmp_path)
    m.write_text("[]")
    with pytest.raises(BadInput, match="not a JSON object"):
        read_manifest(tmp_path)
    m.write_text(json.dumps({"Format": 2, "File": "../x.tar", "Size": "1"}))
    with pytest.raises(BadInput) as ei:
        read_manifest(tmp_path)
    assert ei.value.exit_code == 2 and ei.value.what == "cannot load images"
    assert len(ei.value.problems) == 6
    assert any("format 2 is not 1" in p for p in ei.value.problems)
    assert any("Sha256 is missing or not a str" in p for p in ei.value.problems)
    assert any("image file" in p and "x.tar is missing" in p for p in ei.value.problems)
    # a manifest that names a file outside the folder is refused even when that file exists
    (tmp_path.parent / "x.tar").write_bytes(b"")
    good = {"Format": 1, "File": "../x.tar", "Size": 0, "Sha256": "", "Images": [], "Key": ""}
    m.write_text(json.dumps(good))
    with pytest.raises(BadInput, match="x.tar is missing"):
        read_manifest(tmp_path)
    assert images_io.MANIFEST == "manifest.json"


# -- version ---------------------------------------------------------------------------
def test_version_names_slurm_from_the_worker_images_dpkg_database_once(tmp_path: Path) -> None:
    w = world(tmp_path)
    reads: list[tuple[str, str]] = []
    real = w.provider.read_image_file

    def read(ref: str, path: str) -> bytes:
        reads.append((ref, path))
        return real(ref, path)

    w.provider.read_image_file = read  # type: ignore[method-assign]
    doc = versions() | image_versions(w.env)
    check_schema("version", doc)
    assert doc["slurm"] == "24.11.5-4" and set(doc["images"]) == {"controller", "login", "worker"}
    assert doc["python"].count(".") == 2 and doc["hp"] and "note" not in doc
    assert reads == [(doc["images"]["worker"], "/var/lib/dpkg/status")]
    assert image_versions(w.env)["slurm"] == "24.11.5-4" and len(reads) == 1  # images are immutable: remembered
    iid = w.provider.image_id(doc["images"]["worker"])
    assert w.env.store.get(f"slurm-version:{iid}") == "24.11.5-4"


def test_version_without_an_engine_or_images(tmp_path: Path) -> None:
    w = world(tmp_path, build=False)
    doc = image_versions(w.env)
    assert doc["images"] is not None and doc["slurm"] is None  # base there, worker not built
    w = world(tmp_path / "bare", build=False)
    w.provider.images.clear()
    doc = versions() | image_versions(w.env)
    assert (doc["images"], doc["slurm"], doc["note"]) == (None, None, "no base image: run 'hp images build'")
    check_schema("version", doc)
    w.provider.up = False
    doc = versions() | image_versions(w.env)
    assert doc["images"] is None and doc["note"].startswith("cannot reach a Docker engine")
    check_schema("version", doc)
    doc = versions()  # plain `hp version`: no engine, no state
    assert doc["hp"] == orchestrator.__version__ and set(doc) == {"hp", "python"}
    check_schema("version", doc)


def test_slurm_version_of_an_image_without_slurmd_is_not_remembered(tmp_path: Path) -> None:
    w = world(tmp_path)
    ref = w.env.images(DEFAULT).refs()["worker"]
    w.provider.read_image_file = lambda r, p: b"Package: bash\nStatus: install ok installed\nVersion: 5.2\n"  # type: ignore[method-assign]
    assert w.env.slurm_version(ref) is None
    assert w.env.store.get(f"slurm-version:{w.provider.image_id(ref)}") is None
    assert w.env.slurm_version("hp-worker:not-built") is None


def test_describe_reads_the_controllers_slurm_version_by_its_listed_image_id(tmp_path: Path) -> None:
    """The controller's image id comes with the container listing: once the version of that
    id is remembered, `hp describe` inspects no image (docker-py's import, ~0.1 s a call)."""
    w = world(tmp_path)
    create(w.env, validate(spec_doc("lab"), w.env.catalogue), CreateOptions(timeout=5))
    c = w.env.cluster("lab")
    ctl = c.controller_of(c.node_containers())
    assert ctl is not None and ctl.image_id == w.provider.image_id(ctl.image)
    first = package_version(c)
    assert first is not None  # the fake images say 24.11.5-4

    def no_inspect(ref: str) -> None:
        raise AssertionError(f"inspected {ref}")

    w.provider.image_id = no_inspect  # type: ignore[method-assign]
    assert package_version(c) == first


def test_parse_dpkg_version() -> None:
    status = (
        "Package: slurmd\nStatus: deinstall ok config-files\nVersion: 23.02.1-1\n\n"
        "Package: slurm-client\nStatus: install ok installed\nVersion: 24.11.5-4\n"
        "Description: SLURM client side commands\n a continuation line: with a colon\n\n"
        "Package: slurmd\nStatus: install ok installed\nPriority: optional\nVersion: 24.11.5-4\n"
    )
    assert parse_dpkg_version(status, "slurmd") == "24.11.5-4"  # the installed one, not the removed one
    assert parse_dpkg_version(status, "slurm-client") == "24.11.5-4"
    assert parse_dpkg_version(status, "munge") is None
    assert parse_dpkg_version("", "slurmd") is None
