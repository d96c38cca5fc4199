"""`hp reboot` / `hp replace`: recovery by hand, of several nodes at once."""

from __future__ import annotations

import os
from typing import Any

from ..core.context import Env, parallel
from ..errors import BadInput, OperationFailed
from ..naming import node_id
from ..state.operations import OperationKind, OperationStatus
from . import actions


def run(env: Env, action: str, name: str, nodes: list[str], reason: str, timeout: float) -> list[dict[str, Any]]:
    """Check the whole request (BadInput, nothing done), then act on every node at once."""
    cluster = env.cluster(name)
    wanted = list(dict.fromkeys(nodes))
    if problems := actions.request_problems(cluster, action, wanted, timeout):
        raise BadInput(problems, f"cannot {action}")
    fn = actions.reboot if action == "reboot" else actions.replace
    kind = OperationKind.REBOOT if action == "reboot" else OperationKind.REPLACE
    before = cluster.node_containers()
    groups = {before[n].group for n in wanted if n in before}
    op = env.store.add_operation(name, groups.pop() if len(groups) == 1 else "", kind, nodes=wanted, pid=os.getpid())
    status, why = OperationStatus.FAILED, "interrupted"
    try:
        results = parallel(lambda n: fn(cluster, n, reason, timeout), wanted)
        failed = [n for n, ok in zip(wanted, results, strict=True) if not ok]
        status = OperationStatus.FAILED if failed else OperationStatus.DONE
        why = f"not back in service: {', '.join(failed)}" if failed else ""
    finally:
        env.store.end_operation(op, status, why)
    after = cluster.node_containers()
    return [
        {
            "SlurmNodeName": n,
            "Action": action,
            "Succeeded": ok,
            "NodeId": node_id(after[n].id) if n in after else None,
            "OperationId": op,
        }
        for n, ok in zip(wanted, results, strict=True)
    ]


def check_all_back(name: str, action: str, rows: list[dict[str, Any]]) -> None:
    failed = [r["SlurmNodeName"] for r in rows if not r["Succeeded"]]
    if failed:
        raise OperationFailed(
            f"{len(failed)} node(s) not back in service after {action}: {', '.join(failed)} "
            f"(see 'hp nodes {name}' and the cluster's events)"
        )
