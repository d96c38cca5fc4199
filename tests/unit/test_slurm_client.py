"""SlurmCli (orchestrator/slurm/client.py) over the fake provider: the argv it runs in which
container and as whom, and how it reads Slurm 24.11's real answers (tests/fixtures:
scontrol-24.11-show-nodes.json, squeue-24.11.json, scontrol-24.11-show-job-*.json and
slurm-24.11-cli-text.json, recorded from a real hp cluster, see README-slurm.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeContainer, FakeProvider

from orchestrator.docker.views import ContainerSpec, ExecResult
from orchestrator.errors import OperationFailed
from orchestrator.naming import L_SLURM_RELEASE
from orchestrator.slurm.client import Slurm, SlurmCli
from orchestrator.slurm.model import JobInfo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CTL, LOGIN = "hp-lab-controller-1", "hp-lab-login-1"
TEXT = json.loads((FIXTURES / "slurm-24.11-cli-text.json").read_text())


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


class Provider(FakeProvider):
    """The fake provider, also keeping who ran what where (user, workdir, environment)."""

    def __init__(self) -> None:
        super().__init__()
        self.execs: list[tuple[str, list[str], dict[str, Any]]] = []
        self.bounds: list[int] = []

    def exec(self, container: str, cmd: list[str], **kw: Any) -> ExecResult:  # type: ignore[override]
        # every Slurm command runs under timeout(1): recorded and answered without it
        assert cmd[:3] == ["timeout", "-k", "2"] and cmd[3].isdigit(), f"unbounded Slurm command: {cmd}"
        self.bounds.append(int(cmd[3]))
        cmd = cmd[4:]
        self.execs.append((container, list(cmd), kw))
        return super().exec(container, cmd, **kw)


Handler = Callable[[FakeContainer, list[str]], ExecResult]


def slurm(handler: Handler | None = None, running: tuple[str, ...] = (CTL, LOGIN)) -> tuple[SlurmCli, Provider]:
    p = Provider()
    p.images["hp-controller:1"] = "sha256:1"
    for name in (CTL, LOGIN):
        cid = p.create_container(ContainerSpec(name=name, image="hp-controller:1", labels={}))
        if name in running:
            p.start(cid)
    p.exec_handler = handler
    return SlurmCli(p, CTL), p


def answers(table: dict[str, tuple[int, str]]) -> Handler:
    """Answer by the command line (argv joined by spaces); anything else fails the test."""

    def h(c: FakeContainer, cmd: list[str]) -> ExecResult:
        key = " ".join(cmd)
        if key not in table:
            raise AssertionError(f"unexpected command in {c.spec.name}: {cmd}")
        rc, out = table[key]
        return ExecResult(rc, out)

    return h


def test_slurm_cli_is_the_slurm_interface() -> None:
    assert isinstance(slurm()[0], Slurm)


# -- nodes and jobs --------------------------------------------------------------------
def test_nodes_parses_scontrol_show_nodes_json_run_in_the_controller() -> None:
    s, p = slurm(answers({"scontrol show nodes --json": (0, fixture("scontrol-24.11-show-nodes.json"))}))
    nodes = {n.name: n for n in s.nodes()}
    assert set(nodes) == {"a-2", "a-3"}
    a2 = nodes["a-2"]
    assert a2.idle_drained and a2.reason == "maintenance by admin" and a2.admin_hold
    assert a2.partitions == ("dev", "a") and a2.features == ("a",) and a2.address == "192.168.176.3"
    assert nodes["a-3"].busy and nodes["a-3"].display == "allocated"
    assert p.execs == [(CTL, ["scontrol", "show", "nodes", "--json"], {})]


def test_nodes_when_slurmctld_or_its_container_is_down_is_operation_failed() -> None:
    down = "slurm_load_node error: Unable to contact slurm controller (connect failure)\n"
    s, _ = slurm(answers({"scontrol show nodes --json": (1, down)}))
    with pytest.raises(OperationFailed) as ei:
        s.nodes()
    assert str(ei.value) == f"scontrol show nodes --json failed (1): {down.strip()}"
    s, _ = slurm(running=(LOGIN,))
    with pytest.raises(OperationFailed, match=f"scontrol: run scontrol in {CTL}: container is not running"):
        s.nodes()
    s, _ = slurm(answers({"scontrol show nodes --json": (0, "slurm_load_node: garbage")}))
    with pytest.raises(OperationFailed, match="unexpected output from Slurm"):
        s.nodes()


@pytest.mark.parametrize(
    "fixture_name, job_id, state, exit_code, ci_code",
    [
        ("completed", 1, "COMPLETED", 0, 0),
        ("failed-exit3", 2, "FAILED", 3, 3),
        ("cancelled", 4, "CANCELLED", 0, 1),  # ended by Slurm with a 0 left behind: a failed step
    ],
)
def test_job_reads_a_finished_jobs_state_and_exit_code(
    fixture_name: str, job_id: int, state: str, exit_code: int, ci_code: int
) -> None:
    text = fixture(f"scontrol-24.11-show-job-{fixture_name}.json")
    s, p = slurm(answers({f"scontrol show job --json {job_id}": (0, text)}))
    job = s.job(job_id)
    assert job is not None and (job.job_id, job.state, job.exit_code) == (job_id, state, exit_code)
    assert job.ended and job.ci_exit_code() == ci_code
    assert p.execs[0][0] == CTL


def test_job_running_unknown_and_refused() -> None:
    s, _ = slurm(
        answers(
            {
                "scontrol show job --json 3": (0, fixture("scontrol-24.11-show-job-running.json")),
                "scontrol show job --json 999": (0, fixture("scontrol-24.11-show-job-unknown.json")),
                "scontrol show job --json 7": (1, "slurm_load_jobs error: Invalid job id specified\n"),
            }
        )
    )
    running = s.job(3)
    assert running == JobInfo(3, "RUNNING", "cpu-1", 0) and not running.ended
    assert s.job(999) is None  # 24.11 answers an unknown id with exit 0 and no jobs
    assert s.job(7) is None
    assert s.job("3") == running  # type: ignore[arg-type]  # ids are coerced to int: no argv injection


def test_job_with_the_controller_stopped_is_operation_failed() -> None:
    s, _ = slurm(running=(LOGIN,))
    with pytest.raises(OperationFailed, match="scontrol show job: run scontrol in"):
        s.job(1)
    with pytest.raises(ValueError):
        s.job("1; reboot")  # type: ignore[arg-type]


# -- node state changes ----------------------------------------------------------------
def test_drain_resume_delete_argv_one_argument_each_no_shell() -> None:
    s, p = slurm(lambda c, cmd: ExecResult(0, ""))
    s.drain(["cpu-1", "cpu-2"], "hp:health:r1:InstanceStress failed: too slow; rm -rf /")
    s.resume(["cpu-1"])
    s.delete(["cpu-1", "cpu-2"])
    assert [(c, cmd) for c, cmd, _ in p.execs] == [
        (
            CTL,
            [
                "scontrol",
                "update",
                "nodename=cpu-1,cpu-2",
                "state=drain",
                "reason=hp:health:r1:InstanceStress failed: too slow; rm -rf /",
            ],
        ),
        (CTL, ["scontrol", "update", "nodename=cpu-1", "state=resume"]),
        (CTL, ["scontrol", "delete", "nodename=cpu-1,cpu-2"]),
    ]
    s.drain([], "x")
    s.resume([])
    s.delete([])
    assert len(p.execs) == 3  # nothing to change: nothing run


def test_node_changes_slurm_refuses_are_operation_failed_with_slurms_words() -> None:
    upd = TEXT["scontrol update nodename=nope state=drain reason=ut"]
    dele = TEXT["scontrol delete nodename=nope"]
    s, _ = slurm(
        answers(
            {
                "scontrol update nodename=nope state=drain reason=ut": (upd["rc"], upd["output"]),
                "scontrol update nodename=nope state=resume": (upd["rc"], upd["output"]),
                "scontrol delete nodename=nope": (dele["rc"], dele["output"]),
            }
        )
    )
    with pytest.raises(OperationFailed) as ei:
        s.drain(["nope"], "ut")
    assert "nodename=nope" in str(ei.value) and "Invalid node name specified" in str(ei.value)
    with pytest.raises(OperationFailed, match="Invalid node name specified"):
        s.resume(["nope"])
    with pytest.raises(OperationFailed, match=r"scontrol delete nodename=nope failed \(1\): scontrol: error: failed"):
        s.delete(["nope"])


def test_reconfigure_waits_until_slurmctld_answers_again(monkeypatch: pytest.MonkeyPatch) -> None:
    pings = iter([1, 1, 0])
    ping_ok = TEXT["scontrol ping"]

    def h(c: FakeContainer, cmd: list[str]) -> ExecResult:
        if cmd == ["scontrol", "reconfigure"]:
            return ExecResult(0, "")
        assert cmd == ["scontrol", "ping"]
        rc = next(pings)
        return ExecResult(rc, ping_ok["output"] if rc == 0 else "Slurmctld(primary) at controller-1 is DOWN\n")

    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    s, p = slurm(h)
    s.reconfigure(timeout=30)
    assert [cmd for _, cmd, _ in p.execs] == [["scontrol", "reconfigure"]] + [["scontrol", "ping"]] * 3
    assert slept == [0.2, 0.2]


def test_reconfigure_refused_or_never_answering_is_operation_failed() -> None:
    s, _ = slurm(
        answers({"scontrol reconfigure": (1, "slurm_reconfigure error: Unable to contact slurm controller\n")})
    )
    with pytest.raises(OperationFailed, match="scontrol reconfigure failed"):
        s.reconfigure()
    s, _ = slurm(answers({"scontrol reconfigure": (0, ""), "scontrol ping": (1, "DOWN\n")}))
    with pytest.raises(OperationFailed, match="slurmctld did not answer within 0 s of 'scontrol reconfigure'"):
        s.reconfigure(timeout=0)


# -- jobs from a login node --------------------------------------------------------------
def test_submit_runs_sbatch_parsable_as_the_user_and_reads_the_job_id() -> None:
    ok = TEXT["sbatch --parsable -o ok2.out ok.sh"]
    s, p = slurm(lambda c, cmd: ExecResult(ok["rc"], ok["output"]))
    env = {"HOME": "/home/hpuser", "USER": "hpuser"}
    jid, out = s.submit(
        LOGIN, "/home/hpuser/j.sh", "/home/hpuser/j.out", ["--nodes", "2"], "hpuser", "/home/hpuser", env
    )
    assert (jid, out) == (5, "5\n")
    [(container, cmd, kw)] = p.execs
    assert container == LOGIN
    assert cmd == [
        "sbatch",
        "--parsable",
        "-o",
        "/home/hpuser/j.out",
        "-e",
        "/home/hpuser/j.out",
        "--nodes",
        "2",
        "/home/hpuser/j.sh",
    ]
    assert kw == {"user": "hpuser", "workdir": "/home/hpuser", "environment": env}


@pytest.mark.parametrize(
    "rc, output, job_id",
    [
        (0, "17;ut1\n", 17),  # --parsable with a cluster name
        (0, "sbatch: warning: can't honor --ntasks-per-node set to 1\n18\n", 18),  # warnings first
        (0, "", None),
        (0, "Submitted batch job 19\n", None),  # not --parsable output: not trusted
        (
            TEXT["sbatch --parsable --partition nope ok.sh"]["rc"],
            TEXT["sbatch --parsable --partition nope ok.sh"]["output"],
            None,
        ),
        (1, "20\n", None),  # a failed sbatch is a failure whatever it printed
    ],
)
def test_submit_output_parsing(rc: int, output: str, job_id: int | None) -> None:
    s, _ = slurm(lambda c, cmd: ExecResult(rc, output))
    assert s.submit(LOGIN, "j.sh", "j.out", [], "hpuser", "/home/hpuser", {}) == (job_id, output)


def test_submit_and_cancel_on_a_stopped_node_are_operation_failed() -> None:
    s, _ = slurm(running=(CTL,))
    with pytest.raises(OperationFailed, match=f"sbatch: run sbatch in {LOGIN}: container is not running"):
        s.submit(LOGIN, "j.sh", "j.out", [], "hpuser", "/home/hpuser", {})
    with pytest.raises(OperationFailed, match="scancel: run scancel in"):
        s.cancel(LOGIN, 5, "hpuser")


def test_cancel_runs_scancel_as_the_user() -> None:
    s, p = slurm(lambda c, cmd: ExecResult(0, ""))
    s.cancel(LOGIN, 5, "hpuser")
    assert p.execs == [(LOGIN, ["scancel", "5"], {"user": "hpuser"})]


# -- ping, and texts for logs ------------------------------------------------------------
def test_ping_and_ping_from_never_raise() -> None:
    up = TEXT["scontrol ping"]
    s, p = slurm(lambda c, cmd: ExecResult(up["rc"], up["output"]))
    assert s.ping() and s.ping_from(LOGIN)
    assert [(c, cmd) for c, cmd, _ in p.execs] == [(CTL, ["scontrol", "ping"]), (LOGIN, ["scontrol", "ping"])]
    s, _ = slurm(lambda c, cmd: ExecResult(1, "Slurmctld(primary) at controller-1 is DOWN\n"))
    assert not s.ping()
    s, _ = slurm(running=())  # neither container runs: False, not an error
    assert not s.ping() and not s.ping_from(LOGIN)
    s, _ = slurm(running=(CTL,))
    assert s.ping() is True and s.ping_from(LOGIN) is False
    s.p.containers_.clear()  # type: ignore[attr-defined]  # gone altogether (ObjectMissing is an EngineError)
    assert s.ping() is False


def test_show_node_and_overview_are_texts_even_when_slurm_cannot_answer() -> None:
    def h(c: FakeContainer, cmd: list[str]) -> ExecResult:
        return ExecResult(0, f"{' '.join(cmd)} output\n")

    s, p = slurm(h)
    assert s.show_node("cpu-1") == "scontrol show node cpu-1 output\n"
    assert s.overview() == {"sinfo.txt": "sinfo -N -l output\n", "squeue.txt": "squeue -a -l output\n"}
    assert {c for c, _, _ in p.execs} == {CTL}
    s, _ = slurm(running=(LOGIN,))
    assert s.show_node("cpu-1").startswith("scontrol show node cpu-1: run scontrol in")
    ov = s.overview()
    assert ov["sinfo.txt"].startswith("sinfo -N -l: run sinfo in") and "not running" in ov["squeue.txt"]


def test_accounting_and_token_commands_and_their_answers() -> None:
    """Answers as Slurm 24.11 gives them on an hp cluster with accounting and REST."""
    s, p = slurm(
        answers(
            {
                "sacctmgr ping": (0, "slurmdbd(primary) at slurmdbd is UP\n"),
                "sacct -n -X -P -o JobID,State,ExitCode -j 1,2": (0, "1|COMPLETED|0:0\n2|FAILED|3:0\n"),
                "sacctmgr -n -P show cluster format=cluster": (0, "lab\n"),
                "scontrol token username=hpuser lifespan=60": (0, "SLURM_JWT=eyJh.eyJl.c2ln\n"),
                "squeue -h -a -t all -o %T|%P": (0, "RUNNING|cpu\nCOMPLETED|dev\nRUNNING|cpu\n"),
            }
        )
    )
    assert s.accounting_ping().up
    assert [(j.job_id, j.state, j.exit_code) for j in s.sacct([1, 2])] == [
        ("1", "COMPLETED", "0:0"),
        ("2", "FAILED", "3:0"),
    ]
    assert s.clusters() == ["lab"] and s.token("hpuser", 60) == "eyJh.eyJl.c2ln"
    assert s.job_states() == {("RUNNING", "cpu"): 2, ("COMPLETED", "dev"): 1}
    assert {c for c, _, _ in p.execs} == {CTL}
    s, _ = slurm(
        answers(
            {
                "sacctmgr ping": (
                    1,
                    "sacctmgr: error: Sending PersistInit msg: Unable to connect to database\n"
                    "slurmdbd(primary) at slurmdbd is DOWN\n",
                ),
                "sacct -n -X -P -o JobID,State,ExitCode -j 1": (
                    1,
                    "sacct: error: Problem talking to the database: Unable to connect to database\n",
                ),
            }
        )
    )
    ping = s.accounting_ping()
    assert not ping.up and ping.db_unreachable
    with pytest.raises(OperationFailed, match="Unable to connect to database"):
        s.sacct([1])
    s, _ = slurm(running=())  # the controller's container is not running
    with pytest.raises(OperationFailed):
        s.accounting_ping()


def test_a_slurm_command_that_hangs_is_cut_off_and_fails() -> None:
    s, p = slurm(lambda c, cmd: ExecResult(124, ""))  # timeout(1) ended it
    with pytest.raises(OperationFailed, match="did not answer within 30 s"):
        s.nodes()
    assert s.ping() is False
    assert p.bounds == [30, 10]


def test_note_jobs_and_auto_resume_retries_one_argument_each() -> None:
    from orchestrator.slurm.model import AutoResumeRetry, job_note

    def answer(c: str, cmd: list[str]) -> ExecResult:
        if cmd[0] == "squeue" and "-w" in cmd:
            return ExecResult(0, "7\n9\n")
        if cmd[0] == "squeue":
            return ExecResult(0, "12|hp-auto-resume job=7 step=0 lost=cpu-2 attempt=1 of 1: why\n13|someone's\n")
        return ExecResult(0, "")

    s, p = slurm(answer)
    note = job_note("cpu-2", "rebooted: container died; rm -rf /")
    assert s.jobs_on("cpu-2") == [7, 9]
    s.note_jobs([7, 9], note)
    assert [cmd for _, cmd, _ in p.execs][:3] == [
        ["squeue", "-h", "-w", "cpu-2", "-o", "%A"],
        ["scontrol", "update", "jobid=7", "AdminComment=hp: cpu-2 rebooted: container died; rm -rf /"],
        ["scontrol", "update", "jobid=9", "AdminComment=hp: cpu-2 rebooted: container died; rm -rf /"],
    ]
    assert s.auto_resume_retries() == [AutoResumeRetry(12, "job=7 step=0 lost=cpu-2 attempt=1 of 1: why")]
    assert p.execs[-1][1] == ["squeue", "-h", "-t", "all", "-n", "hp-auto-resume", "-o", "%i|%k"]


def test_orphan_jobs_are_running_jobs_without_their_batch_host() -> None:
    from orchestrator.slurm.model import OrphanJob, expand_hostlist

    assert expand_hostlist("cpu-[1,3-4],login-1") == ["cpu-1", "cpu-3", "cpu-4", "login-1"]
    assert expand_hostlist("gpu-a-[08-10]") == ["gpu-a-08", "gpu-a-09", "gpu-a-10"]
    assert expand_hostlist("(null)") == [] and expand_hostlist("cpu-2") == ["cpu-2"]

    hp_note = "hp: cpu-2 rebooted: x; it was the job's batch host: the job was requeued and runs again from the top of its script"

    def answer(c: str, cmd: list[str]) -> ExecResult:
        if cmd[:3] == ["squeue", "-h", "-t"] and cmd[3] == "PD":
            return ExecResult(0, "13|BeginTime\n17|BeginTime\n18|Resources\n")
        if cmd[0] == "squeue":
            return ExecResult(0, "12|cpu-1|cpu-[1-2]\n13|cpu-2|cpu-[1,3]\n14|(null)|\n15|cpu-4|cpu-4\n")
        if cmd[:3] == ["scontrol", "show", "job"]:  # 17: a user's own --begin job
            note = hp_note if cmd[-1] == "13" else ""
            return ExecResult(0, f"JobId={cmd[-1]} JobName=j Restarts=1 BatchFlag=1 AdminComment={note} Comment=x\n")
        if cmd[:2] == ["scontrol", "requeue"] and cmd[2] == "16":
            return ExecResult(1, "scontrol: error: Requested operation is presently disabled for job 16")
        return ExecResult(0, "")

    s, p = slurm(answer)
    assert s.orphan_jobs() == [OrphanJob(13, "cpu-2")]
    assert p.execs[-1][1] == ["squeue", "-h", "-t", "R,S", "-o", "%A|%B|%N"]
    assert s.requeue(13) is True and p.execs[-1][1] == ["scontrol", "requeue", "13"]
    assert s.requeue(16) is False
    assert s.requeueable(13) is True
    assert s.release_requeued(set()) == [13]
    assert ["scontrol", "update", "jobid=13", "StartTime=now+1"] in [cmd for _, cmd, _ in p.execs]
    assert not [cmd for _, cmd, _ in p.execs if cmd[:2] == ["scontrol", "update"] and cmd[2] != "jobid=13"]
    assert s.release_requeued({17}) == [13, 17]  # 17: its srun --auto-resume grew it back, then requeued it


# -- the controller's ping over slurmctld's HTTP /readyz (Slurm 25.11+) -------------------
class Readyz:
    """A local HTTP server standing in for slurmctld's port: answers GET /readyz with
    `status` (0: accepts the connection and never answers)."""

    def __init__(self, status: int):
        import http.server
        import threading

        paths: list[str] = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                paths.append(self.path)
                if status == 0:
                    time.sleep(1)
                    return
                self.send_response(status)
                self.send_header("Connection", "close")
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.paths = paths
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def controller(release: str, handler: Handler, host: str = "") -> tuple[SlurmCli, Provider]:
    p = Provider()
    p.name = host
    p.images["hp-controller:1"] = "sha256:1"
    cid = p.create_container(
        ContainerSpec(name=CTL, image="hp-controller:1", labels={L_SLURM_RELEASE: release}, network="hp-lab")
    )
    p.start(cid)
    p.containers_[cid].address = "127.0.0.1"  # type: ignore[attr-defined]
    p.exec_handler = handler
    return SlurmCli(p, CTL), p


PING_UP = answers({"scontrol ping": (0, "Slurmctld(primary) at controller-1 is UP\n")})
PING_DOWN = answers({"scontrol ping": (1, "Slurmctld(primary) at controller-1 is DOWN\n")})


@pytest.fixture
def readyz(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Readyz]:
    import orchestrator.slurm.client as client

    servers: list[Readyz] = []

    def make(status: int) -> Readyz:
        r = Readyz(status)
        monkeypatch.setattr(client, "SLURMCTLD_PORT", r.port)
        monkeypatch.setattr(client, "READYZ_TIMEOUT_S", 0.3)
        servers.append(r)
        return r

    yield make  # type: ignore[misc]
    for r in servers:
        r.close()


def test_ping_of_a_26_05_controller_is_get_readyz_with_no_exec(readyz: Callable[[int], Readyz]) -> None:
    r = readyz(204)
    s, p = controller("26.05", PING_DOWN)  # the exec would say down: not asked
    assert s.ping() and s.ping()
    assert r.paths == ["/readyz", "/readyz"] and p.execs == []


def test_a_readyz_that_is_not_ready_or_not_listening_lets_scontrol_ping_decide(
    readyz: Callable[[int], Readyz],
) -> None:
    r = readyz(500)  # slurmctld listening, not yet servicing RPCs
    s, p = controller("26.05", PING_DOWN)
    assert s.ping() is False
    assert r.paths == ["/readyz"] and [cmd for _, cmd, _ in p.execs] == [["scontrol", "ping"]]
    r.close()  # nothing listens: refused, as while slurmctld starts
    p.exec_handler = PING_UP
    assert s.ping() is True  # the exec says up: trusted
    r2 = readyz(204)
    assert s.ping() is True and r2.paths == ["/readyz"]  # a refused GET did not turn HTTP off
    assert len(p.execs) == 2


def test_an_address_that_does_not_answer_from_here_turns_http_off_once_the_exec_finds_slurmctld_up(
    readyz: Callable[[int], Readyz],
) -> None:
    r = readyz(0)  # accepts, never answers (an engine whose addresses are not routed here)
    s, p = controller("26.05", PING_UP)
    assert s.ping() is True and len(r.paths) == 1
    assert s.ping() is True and len(r.paths) == 1  # exec only from then on
    assert len(p.execs) == 2


@pytest.mark.parametrize("release, host", [("24.11", ""), ("26.05", "h1")])
def test_ping_execs_for_24_11_and_on_registered_hosts(readyz: Callable[[int], Readyz], release: str, host: str) -> None:
    r = readyz(204)
    s, p = controller(release, PING_UP, host=host)
    assert s.ping() is True
    assert r.paths == [] and [cmd for _, cmd, _ in p.execs] == [["scontrol", "ping"]]
