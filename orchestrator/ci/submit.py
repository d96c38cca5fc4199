"""`hp submit`: a batch job whose exit code is the CI step's.

Not `sbatch --wait`: it polls the job after 2, 8, then 32 s, so a 3 s job would hold the
CI step for 10 s. hp submits, follows the output file on the login node (the shared
/home) and asks slurmctld for the job's state every POLL seconds instead.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import waits
from ..cluster.exec import exec_target
from ..core.context import Cluster, Env
from ..docker.provider import Provider
from ..errors import BadInput, EngineError, OperationFailed, WaitTimeout
from ..naming import DEFAULT_USER
from ..slurm.model import JobInfo

POLL = 0.25
# Follow the output until the `done` file appears (tail --pid: one last read, then exit).
# A fixed script: the two paths are its arguments ($1, $2), never spliced into it.
FOLLOW_SH = r"""
out="$1"; done="$2"
( while [ ! -e "$done" ]; do sleep 0.1; done ) & w=$!
tail -n +1 -s 0.1 -F --pid="$w" "$out" 2>/dev/null
rm -f "$done"
"""


@dataclass
class SubmitResult:
    cluster: str
    job_id: int | None
    exit_code: int
    script: str
    output_file: str
    output: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "ClusterName": self.cluster,
            "JobId": self.job_id,
            "ExitCode": self.exit_code,
            "Script": self.script,
            "OutputFile": self.output_file,
            "Output": self.output,
        }


def submit(
    env: Env,
    name: str,
    script: Path,
    partition: str | None,
    nodes: int | None,
    sbatch_args: list[str],
    timeout: float,
    write: Callable[[bytes], None],
) -> SubmitResult:
    problems = []
    if not script.is_file():
        problems.append(f"script {script} does not exist or is not a file")
    if nodes is not None and nodes < 1:
        problems.append(f"--nodes must be at least 1, got {nodes}")
    if timeout <= 0:
        problems.append(f"--timeout must be positive, got {timeout:g}")
    if problems:
        raise BadInput(problems, "cannot submit")
    cluster = env.cluster(name)
    p = env.provider
    target, on_controller = exec_target(env, name, None)
    if on_controller:  # only login and compute nodes share /home
        raise BadInput(f"cluster {name!r} has no running login node: hp submit runs jobs from one", "cannot submit")
    home = f"/home/{DEFAULT_USER}"
    jobdir = f"{home}/hp-submit"
    stem = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-" + re.sub(r"[^A-Za-z0-9._-]", "_", script.name)
    remote, out_file, done_file = f"{jobdir}/{stem}", f"{jobdir}/{stem}.out", f"{jobdir}/{stem}.done"
    user_env = {"HOME": home, "USER": DEFAULT_USER}
    uid, _ = env.store.user_ids(name)  # hpuser's in this cluster
    try:
        mk = p.exec(target, ["install", "-d", "-o", DEFAULT_USER, "-g", DEFAULT_USER, home, jobdir])
        if mk.exit_code != 0:
            raise OperationFailed(f"cannot make {jobdir} on {target}: {mk.output.strip()}")
        files = {stem: (script.read_bytes(), 0o755, uid), f"{stem}.out": (b"", 0o644, uid)}
        p.put_files(target, jobdir, files)
    except EngineError as e:
        raise OperationFailed(f"cannot copy the script to {target}: {e}") from None
    args = (["--partition", partition] if partition else []) + (["--nodes", str(nodes)] if nodes else [])
    job_id, sb_out = cluster.slurm.submit(target, remote, out_file, [*args, *sbatch_args], DEFAULT_USER, home, user_env)
    if job_id is None:
        write(sb_out.encode())
        return SubmitResult(name, None, 1, remote, out_file, sb_out)
    shown: list[bytes] = []
    follower = threading.Thread(target=_follow, args=(p, target, out_file, done_file, write, shown), daemon=True)
    follower.start()
    try:
        job = _wait_job(cluster, job_id, time.monotonic() + timeout)
    finally:  # stop the follower (it reads the file once more), also on timeout or ^C
        p.put_files(target, jobdir, {f"{stem}.done": (b"", 0o644, uid)})
        follower.join(10)
    if job is None:
        cluster.slurm.cancel(target, job_id, DEFAULT_USER)
        raise WaitTimeout(f"job {job_id} did not finish within {timeout:g} s (cancelled); output in {out_file}")
    if not job.completed:
        write(f"hp: job {job_id} ended {job.state}\n".encode())
    return SubmitResult(name, job_id, job.ci_exit_code(), remote, out_file, b"".join(shown).decode(errors="replace"))


def _follow(
    p: Provider, target: str, out_file: str, done_file: str, write: Callable[[bytes], None], shown: list[bytes]
) -> None:
    handle = p.exec_stream(target, ["sh", "-c", FOLLOW_SH, "hp-follow", out_file, done_file], user=DEFAULT_USER)
    for out, err in handle.chunks:
        for chunk in (out, err):
            if chunk:
                shown.append(chunk)
                write(chunk)


def _wait_job(cluster: Cluster, job_id: int, deadline: float) -> JobInfo | None:
    """The job once it has ended; None at the deadline."""

    def ended(job: JobInfo | None) -> bool:
        return job is not None and job.ended

    job = waits.poll(lambda: cluster.slurm.job(job_id), ended, every=POLL, deadline=deadline)
    return job if ended(job) else None
