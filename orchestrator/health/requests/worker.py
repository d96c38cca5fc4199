"""The detached process that runs one health-check request:
python -m orchestrator.health.requests.worker CLUSTER REQUEST_ID"""

from __future__ import annotations

import sys
import traceback

from ... import assembly
from ...core.context import Cluster
from ...state.health_requests import Records
from ...state.transitions import RequestState
from ..tools import options as option_rules
from ..tools.stress import StressOptions
from .runner import Options, run_and_record


def options(o: dict) -> Options:
    """The engine's options from a request's recorded options (CLI names)."""
    return Options(
        checks=[],
        wait_idle_timeout=float(o.get("wait_idle_timeout", 600)),
        stress=StressOptions(seconds=int(o.get("stress_seconds", 3)), vm_bytes=str(o.get("vm_bytes", "64M"))),
        dcgm_level=int(o.get("dcgm_level", 2)),
        recovery_wait=float(o.get("recovery_wait", 90)),
    )


def main(name: str, rid: str) -> int:
    env = assembly.env()
    req = Records(env.store).request(rid)
    if req is None:
        print(f"no health check {rid}", file=sys.stderr)
        return 2
    if bad := option_rules.problems(req.options):  # recorded before validation existed: touch nothing
        Records(env.store).set_state(rid, RequestState.FAILED, "invalid options: " + "; ".join(bad))
        print("invalid health-check request: " + "; ".join(bad), file=sys.stderr)
        return 2
    opts = options(req.options)
    opts.checks = req.checks
    try:
        run_and_record(Cluster(env, name), rid, req.nodes, opts)
    except BaseException:  # noqa: BLE001 - run_and_record recorded why; log it and end
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
