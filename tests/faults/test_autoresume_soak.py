"""A soak of `srun --auto-resume` under real faults (`make faults`, HP_FAULTS_LONG=1): a
cluster of four cpu.small workers with NodeRecovery Automatic runs batch jobs of two nodes,
two in flight, whose step (`srun --auto-resume=3 -N2`) does 20 one-second steps with a
checkpoint on the shared /home after each; every KILL_EVERY_S seconds a random worker is
`docker kill`ed, batch hosts among them. Every job must end COMPLETED with its counter at
20: a lost node is retried in the job (the step's other node) or the job is requeued and
resumes from its checkpoint (its batch host). The figures are printed (docs/auto-resume.md).

HP_SOAK_S sets the length (default 480 s), HP_SOAK_SEED the victims' order.
"""

from __future__ import annotations

import os
import random
import re
import sys
import time

import docker
import pytest
from conftest import put_file, small_spec, wait_until, write_spec

pytestmark = pytest.mark.skipif(not os.environ.get("HP_FAULTS_LONG"), reason="the long fault campaign: make faults")

SOAK_S = float(os.environ.get("HP_SOAK_S", "480"))
KILL_EVERY_S = 30.0
STEPS = 20
IN_FLIGHT = 2
WORKERS = 4
TRAIN = f"""#!/bin/bash
# rank 0: {STEPS} one-second steps, a checkpoint after each; rank 1 waits for the end
ck=$HOME/ck-$SLURM_JOB_ID
if [ "$SLURM_PROCID" = 0 ]; then
  i=$(cat "$ck" 2>/dev/null || echo 0)
  echo "start attempt=${{HP_AUTO_RESUME_ATTEMPT:-none}} restart=${{SLURM_RESTART_COUNT:-0}} from=$i"
  while [ "$i" -lt {STEPS} ]; do
    sleep 1; i=$((i+1)); echo "$i" > "$ck.tmp" && mv "$ck.tmp" "$ck"
  done
  touch "$ck.done"
else
  while [ ! -e "$ck.done" ]; do sleep 0.5; done
fi
"""
JOB = "#!/bin/bash\n#SBATCH -N2 -o /home/hpuser/soak-%j.out --open-mode=append\nsrun --auto-resume=3 -N2 bash /home/hpuser/train.sh\n"


def test_auto_resume_soak_with_a_worker_killed_every_30_s(hp, tmp_path):
    name = hp.name("soak")
    spec = small_spec(name, [("cpu", "cpu.small", WORKERS)], login=True, NodeRecovery="Automatic")
    hp("create", "-f", str(write_spec(tmp_path / "s.json", spec)), "--timeout", "180", check=True)
    client = docker.from_env()
    login = client.containers.get(f"hp-{name}-login-1")

    def sh(*cmd: str) -> str:
        r = login.exec_run(list(cmd), user="hpuser", environment={"HOME": "/home/hpuser"})
        return r.output.decode(errors="replace")

    for path, text in (("/home/hpuser/train.sh", TRAIN), ("/home/hpuser/job.sh", JOB)):
        put_file(login, path, text)
    seed = int(os.environ.get("HP_SOAK_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    jobs: list[int] = []

    def in_flight() -> list[int]:
        return [int(j) for j in sh("squeue", "-h", "-u", "hpuser", "-n", "job.sh", "-o", "%i").split() if j.isdigit()]

    def submit() -> None:
        out = sh("sbatch", "--parsable", "/home/hpuser/job.sh").strip()
        jid = out.splitlines()[-1].split(";")[0] if out else ""
        assert jid.isdigit(), out
        jobs.append(int(jid))

    kills: list[str] = []
    t0 = time.monotonic()
    next_kill = t0 + KILL_EVERY_S
    while time.monotonic() - t0 < SOAK_S:
        while len(in_flight()) < IN_FLIGHT:
            submit()
        if time.monotonic() >= next_kill:
            victim = f"cpu-{rng.randint(1, WORKERS)}"
            running = sh("squeue", "-h", "-t", "R", "-o", "%i %B %N").strip()
            try:
                client.containers.get(f"hp-{name}-{victim}").kill()
                kills.append(f"{time.monotonic() - t0:.0f}s {victim} [{running.replace(chr(10), '; ')}]")
            except docker.errors.APIError as e:  # already dead (its reboot under way)
                kills.append(f"{time.monotonic() - t0:.0f}s {victim}: {e.explanation}")
            next_kill += KILL_EVERY_S
        time.sleep(1.0)

    def all_ended() -> bool:
        return not in_flight()

    wait_until(all_ended, 300, "every soak job to end", poll=2.0)
    rows = sh("sacct", "-n", "-X", "-P", "-j", ",".join(map(str, jobs)), "-o", "JobID,State,ExitCode,Restarts")
    final: dict[int, tuple[str, str]] = {}
    for line in rows.splitlines():
        f = line.split("|")
        if len(f) >= 3 and f[0].isdigit():
            final[int(f[0])] = (f[1].split()[0], f[2])  # the last record of a job is its end
    report, bad = [], []
    retries = requeues = 0
    for j in jobs:
        out = sh("cat", f"/home/hpuser/soak-{j}.out")
        ck = sh("cat", f"/home/hpuser/ck-{j}").strip()
        r = len(re.findall(r"^hp: retrying step", out, re.M))
        q = len(set(re.findall(r"restart=(\d+)", out))) - 1
        retries += r
        requeues += max(q, 0)
        state = final.get(j, ("?", "?"))
        report.append(f"job {j}: {state[0]} {state[1]} counter={ck} step retries={r} requeues={max(q, 0)}")
        if state != ("COMPLETED", "0:0") or ck != str(STEPS):
            bad.append(f"job {j}: {state} counter={ck!r}\n{out[-1500:]}")
    print(
        f"\nauto-resume soak (seed {seed}, {SOAK_S:g} s, a kill every {KILL_EVERY_S:g} s): {len(kills)} kills, "
        f"{len(jobs)} jobs, {len(jobs) - len(bad)} COMPLETED with counter {STEPS}, "
        f"{retries} step retries, {requeues} requeues\n" + "\n".join(kills) + "\n" + "\n".join(report),
        file=sys.stderr,
    )
    assert not bad, "\n".join(bad)
