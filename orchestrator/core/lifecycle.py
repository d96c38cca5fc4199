"""Lifecycle scripts on a node (LifeCycleConfig.OnCreate; docs/lifecycle.md).

Before a node's container first starts, the launcher copies into it (put_archive):
- the group's folder, under DIR/src (DIR = /opt/hp/oncreate);
- DIR/script (the script's path in the folder) and DIR/timeout (seconds): data the
  node's entry reads, never a command line (no user string reaches a shell);
- DIR/pending: the entry (images/node/hp-entry) runs the script once, at the
  container's first start, before slurmctld, slurmd or sackd: a reboot restarts the
  same container (pending is gone), a replace makes a new one (it runs again);
- the node's facts: /opt/ml/config/resource_config.json (HyperPod's shape: the
  cluster, every group with its nodes) and, for sh scripts, /etc/hp/node.env
  (HP_CLUSTER, HP_GROUP, HP_NODE, HP_NODE_TYPE, HP_CONTROLLER) and /etc/hp/nodes (one
  line per node: group, node type, node name).
The entry writes the script's output to the container's log, its exit code to DIR/rc
(one write, ending in a newline) and then a line that says so, with the script's run time
as the node measured it. The launcher waits for that line (wait_result), reads DIR/rc and
the log's last lines, and turns a failure into a LaunchError.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .. import waits
from ..docker.provider import Provider
from ..errors import TRANSIENT, EngineError, LaunchError
from ..naming import node_name
from ..spec.lifecycle import folder_files

if TYPE_CHECKING:
    from ..spec.model import ClusterSpec, InstanceGroup, LifeCycleSpec

DIR = "opt/hp/oncreate"  # relative to /, as put_archive's tar names are
RESULT = f"/{DIR}/rc"
CONFIG = "opt/ml/config/resource_config.json"
FileMap = dict[str, tuple[bytes, int, int]]
TAIL_LINES = 5  # of the script's output, in its event and in a failure's message
LOG_LINES = 200  # of the node's log read for them (the daemon may have begun to log after)
DONE = "hp-entry: lifecycle script "  # the entry's lines around it; the last: "... exited RC after S s"
TOOK = re.compile(r" exited -?\d+ after (\d+\.\d+) s$")
SLACK_S = 15.0  # beyond OnCreateTimeout: the entry's own kill (5 s) and the copy back
TIMED_OUT = (124, 137)  # timeout(1): the limit passed (137: killed after the grace)


def resource_config(spec: ClusterSpec) -> dict:
    """HyperPod's resource_config.json: the cluster and every group's nodes (the
    group's target count; no addresses: the nodes' names resolve on the network)."""
    return {
        "ClusterConfig": {"ClusterName": spec.ClusterName},
        "InstanceGroups": [
            {
                "Name": g.InstanceGroupName,
                "InstanceType": g.InstanceType,
                "NodeType": g.node_type,
                "Instances": [
                    {"InstanceName": node_name(g.InstanceGroupName, i), "Hostname": node_name(g.InstanceGroupName, i)}
                    for i in range(1, g.InstanceCount + 1)
                ],
            }
            for g in spec.InstanceGroups
        ],
    }


def node_env(spec: ClusterSpec, group: InstanceGroup, node: str, controller: str) -> str:
    """/etc/hp/node.env: the node's facts as shell assignments (quoted)."""
    facts = {
        "HP_CLUSTER": spec.ClusterName,
        "HP_GROUP": group.InstanceGroupName,
        "HP_NODE": node,
        "HP_NODE_TYPE": group.node_type,
        "HP_CONTROLLER": controller,
    }
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in facts.items())


def node_list(spec: ClusterSpec) -> str:
    """/etc/hp/nodes: `group node-type node` per line, every group's nodes."""
    return "".join(
        f"{g.InstanceGroupName} {g.node_type} {node_name(g.InstanceGroupName, i)}\n"
        for g in spec.InstanceGroups
        for i in range(1, g.InstanceCount + 1)
    )


def files(spec: ClusterSpec, group: InstanceGroup, index: int, controller: str) -> FileMap:
    """What goes into the node (tar names relative to /). Raises LaunchError when the
    group's folder cannot be read (it may have gone since the spec was checked)."""
    lc = group.LifeCycleConfig
    assert lc is not None
    folder = Path(lc.SourceS3Uri)
    out: FileMap = {}
    try:
        for rel, p in folder_files(folder):
            out[f"{DIR}/src/{rel}"] = (p.read_bytes(), p.stat().st_mode & 0o777, 0)
    except (OSError, ValueError) as e:
        raise LaunchError("LifecycleSourceUnreadable", f"{folder}: {e}", retryable=True) from None
    if f"{DIR}/src/{lc.OnCreate}" not in out:
        raise LaunchError("LifecycleSourceUnreadable", f"{lc.OnCreate} is no longer in {folder}", retryable=True)
    node = node_name(group.InstanceGroupName, index)
    out[f"{DIR}/script"] = (lc.OnCreate.encode() + b"\n", 0o600, 0)
    out[f"{DIR}/timeout"] = (f"{lc.timeout}\n".encode(), 0o600, 0)
    out[f"{DIR}/pending"] = (b"", 0o600, 0)
    out[CONFIG] = (json.dumps(resource_config(spec), indent=2).encode() + b"\n", 0o644, 0)
    out["etc/hp/node.env"] = (node_env(spec, group, node, controller).encode(), 0o644, 0)
    out["etc/hp/nodes"] = (node_list(spec).encode(), 0o644, 0)
    return out


def took(log: str) -> float | None:
    """The script's run time from the entry's last closing line in `log` ("... exited RC
    after S s"; None when there is none, or the entry said no time)."""
    said = [m for ln in log.splitlines() if ln.startswith(DONE) and (m := TOOK.search(ln))]
    return float(said[-1].group(1)) if said else None


class Outcome(NamedTuple):
    rc: int  # the script's exit code (-1: none was read)
    tail: list[str]  # the last lines of its output
    error: LaunchError | None  # when it failed
    seconds: float | None = None  # its run time as the node's entry measured it (None: unknown)


def outcome(lc: LifeCycleSpec, rc_text: bytes, log_tail: str) -> Outcome:
    """The script's outcome from DIR/rc and the end of the node's log."""
    try:
        rc = int(rc_text.strip() or b"-1")
    except ValueError:
        rc = -1
    lines = log_tail.splitlines()
    ends = [i for i, ln in enumerate(lines) if ln.startswith(DONE) and " exited " in ln]
    seconds = took(lines[ends[-1]]) if ends else None
    lines = lines[: ends[-1]] if ends else lines  # the script's output, not the daemon's after it
    starts = [i for i, ln in enumerate(lines) if ln.startswith(DONE)]
    lines = lines[starts[-1] + 1 :] if starts else lines
    tail = [ln for ln in lines if ln.strip()][-TAIL_LINES:]
    if rc == 0:
        return Outcome(rc, tail, None, seconds)
    last = tail[-1][:200] if tail else "(no output)"
    how = f"timed out after {lc.timeout} s" if rc in TIMED_OUT else f"exit {rc}"
    err = LaunchError("LifecycleScriptFailed", f"{how}: {last} (script {lc.OnCreate})", retryable=True)
    return Outcome(rc, tail, err, seconds)


PAUSE_S = 0.2  # between two looks when the node's log cannot be followed


def wait_result(
    p: Provider, cid: str, lc: LifeCycleSpec, clock: waits.Clock = time.monotonic, sleep: waits.Sleep | None = None
) -> Outcome:
    """Wait for the node's entry to finish the script (bounded by OnCreateTimeout plus
    SLACK_S): its outcome. Woken by the entry's line in the node's log (no polling);
    the result itself is read from the node. A node that stops without a result failed."""
    deadline = clock() + lc.timeout + SLACK_S

    def look() -> Outcome | None:
        if (found := read()) is not None:
            return found
        if _wait_line(p, cid, deadline - clock()):  # the entry wrote the result before this line
            return read()
        return None  # a line that only looked like the entry's (the script's own output), or no stream

    def read() -> Outcome | None:
        try:
            rc = p.get_dir(cid, RESULT).get("rc", b"")
            if rc.endswith(b"\n"):  # written whole
                return outcome(lc, rc, p.logs(cid, tail=LOG_LINES))
            running = p.inspect(cid).state.running
        except EngineError as e:
            return Outcome(
                -1, [], LaunchError("LifecycleScriptFailed", f"its result cannot be read: {e}", retryable=True)
            )
        if not running:  # the entry died before writing a result (e.g. the container was killed)
            tail = p.logs(cid, tail=TAIL_LINES).strip().splitlines()
            last = tail[-1][:200] if tail else "(no output)"
            err = f"the node stopped before its script {lc.OnCreate} finished: {last}"
            return Outcome(-1, tail, LaunchError("LifecycleScriptFailed", err, retryable=True))
        if clock() > deadline:
            err = f"no result within {lc.timeout + SLACK_S:g} s (script {lc.OnCreate})"
            return Outcome(-1, [], LaunchError("LifecycleScriptFailed", err, retryable=True))
        return None

    result = waits.until(look, lambda r: r is not None, every=PAUSE_S, clock=clock, sleep=sleep)
    assert result is not None
    return result


def _wait_line(p: Provider, cid: str, seconds: float) -> bool:
    """Follow the node's log until the entry says the script exited (True), or the
    stream ends, breaks (the engine's read timeout on a quiet log) or `seconds` pass."""
    try:
        stream = p.follow_logs(cid)
    except EngineError:
        return False
    timer = threading.Timer(max(seconds, 0.0), stream.close)
    timer.daemon = True
    timer.start()
    try:
        return any(line.startswith(DONE) and " exited " in line for line in stream)
    except TRANSIENT:
        return False
    finally:
        timer.cancel()
        stream.close()
