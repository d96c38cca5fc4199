"""The detached process that runs one health-check request:
python -m orchestrator.health.worker CLUSTER REQUEST_ID"""
from __future__ import annotations

import json
import sys
import traceback

from ..cluster import Cluster, Env
from .engine import Options, run_request
from .records import Records
from .stress import StressOptions


def main(name: str, rid: str) -> int:
    env = Env()
    rec = Records(env.store)
    req = rec.request(rid)
    if req is None:
        print(f"no health check {rid}", file=sys.stderr)
        return 2
    rec.set_state(rid, "Running")
    o = req.options
    opts = Options(checks=req.checks, wait_idle_timeout=float(o.get("wait_idle_timeout", 600)),
                   stress=StressOptions(seconds=int(o.get("stress_seconds", 3)), vm_bytes=o.get("vm_bytes", "64M"),
                                        dcgm_level=int(o.get("dcgm_level", 2))),
                   recovery_wait=float(o.get("recovery_wait", 90)))
    cluster = Cluster(env, name)
    try:
        verdicts = run_request(cluster, rid, req.nodes, opts)
    except BaseException as e:  # noqa: BLE001 - record why, then let the process end
        rec.set_state(rid, "Failed", f"{type(e).__name__}: {e}", ended=True)
        traceback.print_exc()
        from . import sidecar

        sidecar.remove_all(cluster, rid)
        return 1
    env.store.execute("UPDATE health_requests SET options=? WHERE id=?",
                      (json.dumps({**o, "verdicts": verdicts}), rid))
    bad = {n: v for n, v in verdicts.items() if not v.startswith("Passed")}
    rec.set_state(rid, "Completed", f"{len(verdicts) - len(bad)} of {len(verdicts)} node(s) passed", ended=True)
    env.store.event(name, "Cluster", "Info" if not bad else "Warning",
                    f"Deep health check {rid} completed: {len(verdicts) - len(bad)} of {len(verdicts)} node(s) passed"
                    + (": " + "; ".join(f"{n} {v}" for n, v in bad.items())[:400] if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
