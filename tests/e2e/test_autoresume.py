"""`srun --auto-resume=N` (images/node/hp_auto_resume.c, a SPANK plugin) with real faults:
a batch job's two-node step that writes a checkpoint every second loses its second node
to `docker kill`, `docker pause` or Slurm's own `Action:Replace` request mid-step; hp
brings the node back under its name, the job grows back to two nodes and the step runs
again in the same job, continuing from its checkpoint on the shared /home. A step that
fails by itself is not retried; one whose retries are used up fails with hp's reason; a
job without --auto-resume ends as it always did.

One cluster (controller, login, three cpu.nano workers) for the module, its tests in order
on one xdist worker.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import docker
import pytest
from conftest import Hp, put_file, small_spec, wait_until, write_spec

pytestmark = pytest.mark.xdist_group("autoresume")

AFTER = 5  # steps a retried run does before it ends (the first run counts until its node is lost)
TRAIN = f"""#!/bin/bash
# rank 0 counts, one checkpoint a second on the shared /home, until its node is lost; a
# retried run goes on from the checkpoint for {AFTER} more steps. Rank 1 waits for the end.
ck=$HOME/ck-$SLURM_JOB_ID
if [ "$SLURM_PROCID" = 0 ]; then
  i=$(cat "$ck" 2>/dev/null || echo 0); from=$i
  echo "start attempt=${{HP_AUTO_RESUME_ATTEMPT:-none}} restart=${{SLURM_RESTART_COUNT:-0}} from=$i at=$(date +%s.%N) nodes=$SLURM_JOB_NODELIST"
  while [ "$i" -lt 600 ]; do
    i=$((i+1)); echo "$i" > "$ck.tmp" && mv "$ck.tmp" "$ck"; echo "step $i"
    again=$(( ${{HP_AUTO_RESUME_ATTEMPT:-0}} + ${{SLURM_RESTART_COUNT:-0}} ))  # a retried step, or a requeued job
    if [ "$again" -ge 1 ] && [ "$i" -ge $((from+{AFTER})) ]; then break; fi
    sleep 1
  done
  touch "$ck.done"
else
  while [ ! -e "$ck.done" ]; do sleep 0.5; done
fi
"""


@dataclass
class Lab:
    hp: Hp
    name: str
    client: Any

    def sh(self, *cmd: str, check: bool = True) -> str:
        r = self.hp("exec", self.name, "--", *cmd, timeout=120)
        if check:
            assert r.returncode == 0, f"{' '.join(cmd)}: {r.stdout}{r.stderr}"
        return r.stdout + r.stderr

    def put(self, path: str, text: str) -> None:
        """A file of hpuser's on the shared /home, through the login node's container."""
        put_file(self.container("login-1"), path, text)

    def submit(self, name: str, srun: str) -> int:
        """A two-node batch job whose one step is `srun`; its output in ~/NAME.out (a
        requeued job's runs one after the other)."""
        self.put(
            f"/home/hpuser/{name}.sh",
            f"#!/bin/bash\n#SBATCH -N2 -o /home/hpuser/{name}.out --open-mode=append\n{srun}\n",
        )
        out = self.sh("sbatch", "--parsable", f"/home/hpuser/{name}.sh")
        return int(out.strip().splitlines()[-1].split(";")[0])

    def output(self, name: str) -> str:
        return self.sh("cat", f"/home/hpuser/{name}.out", check=False)

    def checkpoint(self, job: int) -> int:
        out = self.sh("cat", f"/home/hpuser/ck-{job}", check=False).strip()
        return int(out) if out.isdigit() else 0

    def batch_host(self, job: int) -> str:
        return self.sh("squeue", "-h", "-j", str(job), "-o", "%B").strip()

    def other_node(self, job: int) -> str:
        """The job's node that is not its batch host (where srun --auto-resume watches)."""
        nodes, batch = self.sh("squeue", "-h", "-j", str(job), "-o", "%N %B").split()
        hosts = self.sh("scontrol", "show", "hostnames", nodes).split()
        return next(h for h in hosts if h != batch)

    def final(self, job: int, timeout: float = 180) -> tuple[str, str]:
        """The job's last accounting record once it ended: (state, exit code)."""

        def ended() -> tuple[str, str] | None:
            now = self.sh("squeue", "-h", "-t", "all", "-j", str(job), "-o", "%T", check=False).split()
            if not now or now[0] not in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"):
                return None  # still queued, running or being requeued (a requeued job's first record ended it)
            rows = self.sh("sacct", "-n", "-X", "-P", "-j", str(job), "-o", "State,ExitCode", check=False).split()
            last = rows[-1].split("|") if rows else None
            return (last[0].split()[0], last[1]) if last and last[0] not in ("RUNNING", "RESIZING", "PENDING") else None

        return wait_until(ended, timeout, f"job {job} to end")

    def running(self, job: int) -> None:
        """Until the job's step runs on its nodes."""
        wait_until(
            lambda: f"{job}.0" in self.sh("squeue", "-h", "-s", "-j", str(job), "-o", "%i", check=False).split(),
            60,
            f"job {job}'s step 0 to run",
        )

    def container(self, node: str) -> Any:
        return self.client.containers.get(f"hp-{self.name}-{node}")


@pytest.fixture(scope="module")
def lab(docker_ok: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    home = tmp_path_factory.mktemp("hphome-ar")
    hp = Hp(home)
    name = hp.name("ar")
    # three workers: a job of two that loses one could grow back by the idle third (see
    # test_a_retry_that_cannot_start_on_the_job_grown_back_requeues_it)
    spec = write_spec(home / "s.json", small_spec(name, [("cpu", "cpu.nano", 3)], login=True, NodeRecovery="Automatic"))
    try:
        hp("create", "-f", str(spec), "--timeout", "120", check=True)
        lab = Lab(hp, name, docker.from_env())
        lab.put("/home/hpuser/train.sh", TRAIN)
        yield lab
    finally:
        for log in home.glob("clusters/*/agent.log"):
            sys.stderr.write(f"--- {log}\n{log.read_text()[-3000:]}")
        hp.cleanup()


def _fault_mid_step(lab: Lab, fault: str, tag: str) -> None:
    job = lab.submit(tag, "srun --auto-resume=1 -N2 bash /home/hpuser/train.sh")
    wait_until(lambda: lab.checkpoint(job) >= 3, 60, f"job {job}'s checkpoint to reach 3")
    node = lab.other_node(job)
    before = lab.checkpoint(job)  # the step goes on until its node is lost: at least this far
    t_fault = time.time()
    _inject(lab, fault, node)
    state, code = lab.final(job)
    out = lab.output(tag)
    starts = re.findall(r"start attempt=(\S+) restart=\d+ from=(\d+) at=([\d.]+)", out)
    retry_lines = [ln for ln in out.splitlines() if ln.startswith("hp: retrying step")]
    print(f"\n{fault}: {node} after checkpoint {before}; {retry_lines}; starts {starts}; job {state} {code}")
    assert state == "COMPLETED" and code == "0:0", out
    assert len(retry_lines) == 1, out
    assert re.fullmatch(
        rf"hp: retrying step 0 of job {job} after {node} failed \(.+\), attempt 1 of 1", retry_lines[0]
    ), retry_lines
    assert [a for a, _, _ in starts] == ["0", "1"], out
    resumed = int(starts[1][1])
    assert resumed >= before >= 3, out  # continued from its checkpoint, not from 0
    assert f"step {resumed + AFTER}" in out and lab.checkpoint(job) == resumed + AFTER
    print(f"{fault} -> retried step's first line: {float(starts[1][2]) - t_fault:.1f} s")
    events = lab.hp("events", lab.name, check=True).stdout
    assert f"job={job} step=0 lost={node} attempt=1 of 1" in events, events
    # the job that grew it back was submitted once the node was idle again, so Slurm gave
    # it its node at submission, not in a later scheduling pass (NodeList=(null) there)
    grew = re.search(rf"job={job} step=0 lost={node} attempt=1 of 1: .*\(job (\d+) grew it back\)", events)
    assert grew, events
    log = lab.container("controller-1").exec_run(["cat", "/var/log/slurm/slurmctld.log"]).output.decode()
    allocs = re.findall(rf"_slurm_rpc_allocate_resources JobId={grew[1]} NodeList=(\S+)", log)
    assert allocs == [node], allocs


@pytest.mark.releases
def test_a_killed_node_mid_step_is_retried_in_the_same_job_from_its_checkpoint(lab: Lab) -> None:
    _fault_mid_step(lab, "kill", "kill")


def test_a_paused_node_mid_step_is_retried(lab: Lab) -> None:
    _fault_mid_step(lab, "pause", "pause")


def test_an_action_replace_request_mid_step_is_retried(lab: Lab) -> None:
    _fault_mid_step(lab, "replace", "replace")


def _fault_on_batch_host(lab: Lab, fault: str, tag: str) -> None:
    """The batch host runs the script and the supervising srun: with it, the job lost
    more than a step. hp requeues it; it runs again from the top of its script, its step
    from the checkpoint, and ends COMPLETED: never a job holding nodes with nothing in it."""
    job = lab.submit(tag, "srun --auto-resume=1 -N2 bash /home/hpuser/train.sh")
    wait_until(lambda: lab.checkpoint(job) >= 3, 60, f"job {job}'s checkpoint to reach 3")
    node = lab.batch_host(job)
    before = lab.checkpoint(job)
    t_fault = time.time()
    _inject(lab, fault, node)
    state, code = lab.final(job)
    out = lab.output(tag)
    starts = re.findall(r"start attempt=(\S+) restart=(\d+) from=(\d+) at=([\d.]+)", out)
    print(f"\n{fault} of batch host {node} after checkpoint {before}: starts {starts}; job {state} {code}")
    assert state == "COMPLETED" and code == "0:0", out
    assert [(a, r) for a, r, _, _ in starts] == [("0", "0"), ("0", "1")], out  # the same job, run again
    resumed = int(starts[1][2])
    assert resumed >= before >= 3 and lab.checkpoint(job) == resumed + AFTER, out
    print(f"{fault} of the batch host -> the job's second run's first line: {float(starts[1][3]) - t_fault:.1f} s")
    restarts = lab.sh("sacct", "-n", "-X", "-P", "-j", str(job), "-o", "Restarts").split()
    assert restarts[-1] == "1", restarts
    events = lab.hp("events", lab.name, check=True).stdout
    assert re.search(rf"job {job}: {node} .*it was the job's batch host: the job was requeued", events), events


def _inject(lab: Lab, fault: str, node: str) -> None:
    if fault == "kill":
        lab.container(node).kill()
    elif fault == "pause":
        for attempt in range(3):  # the freezer can time out on a loaded host ("unable to freeze"): again
            try:
                lab.container(node).pause()
                break
            except docker.errors.APIError:
                if attempt == 2:
                    raise
                time.sleep(1.0)
    else:
        r = lab.container("controller-1").exec_run(  # as the admin (root), as HyperPod's users do
            ["scontrol", "update", f"nodename={node}", "state=fail", "reason=Action:Replace"]
        )
        assert r.exit_code == 0, r.output


@pytest.mark.parametrize("fault", [pytest.param("kill", marks=pytest.mark.releases), "pause", "replace"])
def test_a_lost_batch_host_requeues_the_job_which_resumes_from_its_checkpoint(lab: Lab, fault: str) -> None:
    _fault_on_batch_host(lab, fault, f"batch-{fault}")


def test_a_retry_that_cannot_start_on_the_job_grown_back_requeues_it(lab: Lab) -> None:
    """The lost node does not come back (an admin set it DOWN for a reason of their own,
    which hp leaves alone): the job grows back by the idle third node. Slurm 24.11 keeps
    an expanded job's old node addresses, so the retried step's launch on that node goes
    to the lost one's slurmd and fails ("Invalid node name specified"); the supervisor
    sees the launch fail and requeues the job, which runs again on healthy nodes from its
    checkpoint and ends COMPLETED (issue 46: a soak's job ended FAILED 98:0 there)."""
    job = lab.submit("regrow", "srun --auto-resume=1 --auto-resume-timeout=10 -N2 bash /home/hpuser/train.sh")
    wait_until(lambda: lab.checkpoint(job) >= 3, 60, f"job {job}'s checkpoint to reach 3")
    node = lab.other_node(job)
    before = lab.checkpoint(job)
    ctl = lab.container("controller-1")
    r = ctl.exec_run(["scontrol", "update", f"nodename={node}", "state=down", "reason=maintenance by the admin"])
    assert r.exit_code == 0, r.output
    try:
        state, code = lab.final(job)
    finally:
        ctl.exec_run(["scontrol", "update", f"nodename={node}", "state=resume"])
    out = lab.output("regrow")
    starts = re.findall(r"start attempt=(\S+) restart=(\d+) from=(\d+)", out)
    print(f"\n{node} down by the admin after checkpoint {before}: starts {starts}; job {state} {code}")
    assert state == "COMPLETED" and code == "0:0", out
    assert re.search(rf"hp: retrying step 0 of job {job} after {node} failed", out), out
    if "could not start on the job grown back" in out:  # Slurm 24.11 (see above)
        assert starts[-1][1] == "1" and int(starts[-1][2]) >= before, out  # the requeued run, from the checkpoint
    assert int(starts[-1][2]) >= before >= 3, out
    wait_until(lambda: "idle" in lab.sh("sinfo", "-h", "-o", "%t", "-n", node), 90, f"{node} idle again")


def test_a_step_that_fails_by_itself_is_not_retried(lab: Lab) -> None:
    job = lab.submit("exit3", "srun --auto-resume=1 -N2 bash -c 'echo ran; exit 3'")
    assert lab.final(job) == ("FAILED", "3:0")
    out = lab.output("exit3")
    assert "ran" in out and "hp: " not in out, out


def test_used_up_retries_fail_with_hps_reason_and_no_option_ends_as_before(lab: Lab) -> None:
    # steps that run until their node is lost: the kill always lands mid-step, however busy the machine
    job = lab.submit("none-left", "srun --auto-resume=0 -N2 sleep 300")
    lab.running(job)
    node = lab.other_node(job)
    lab.container(node).kill()
    state, _ = lab.final(job)
    out = lab.output("none-left")
    assert state == "FAILED", out
    assert re.search(rf"hp: step 0 of job {job} lost {node} \(.+\): not retried, 0 of 0 retries used", out), out
    assert "hp: retrying" not in out
    # without --auto-resume: Slurm's own handling of a lost node, untouched by hp
    wait_until(lambda: "idle" in lab.sh("sinfo", "-h", "-o", "%t", "-n", node), 90, f"{node} idle again")
    job = lab.submit("plain", "srun -N2 sleep 300")
    lab.running(job)
    node = lab.other_node(job)
    lab.container(node).kill()

    def first_run() -> list[str] | None:
        rows = lab.sh("sacct", "-n", "-X", "-P", "-D", "-j", str(job), "-o", "State", check=False).split()
        return rows if rows and rows[0] not in ("RUNNING", "PENDING") else None

    first = wait_until(first_run, 120, f"job {job}'s first run to end")
    print(f"\nwithout --auto-resume, job {job} after losing {node}: {first}")
    assert first[0] == "NODE_FAIL", first  # as it always did (then Slurm's own requeue, JobRequeue=1)
    assert "hp: " not in lab.output("plain")
    lab.sh("scancel", str(job))


@pytest.mark.releases
def test_bad_values_are_refused_by_srun_with_the_plugins_message(lab: Lab) -> None:
    for bad in ("-1", "x", "1.5", "101"):
        r = lab.hp("exec", lab.name, "--", "srun", f"--auto-resume={bad}", "true", timeout=60)
        assert r.returncode != 0, bad
        assert f"hp: --auto-resume={bad}: give the number of times" in r.stderr, r.stderr
    r = lab.hp("exec", lab.name, "--", "srun", "--auto-resume-timeout=0", "true", timeout=60)
    assert r.returncode != 0 and "hp: --auto-resume-timeout=0" in r.stderr, r.stderr
    r = lab.hp("exec", lab.name, "--", "srun", "--auto-resume=1", "true", timeout=60)  # no allocation
    assert r.returncode != 0 and "use it in a job allocation" in r.stderr, r.stderr
