"""Passive GPU monitoring (HyperPod's health-monitoring agent): a controller of the
cluster's agent (orchestrator/runtime.py).

Every running GPU node gets a monitor container (`hp-<cluster>-<node>-gpumon`: hp's
GPU check image running hp_gpu_monitor.py, given the node's own GPUs, no network, a
small CPU and memory ceiling). It sleeps in NVML's event wait and prints one JSON line
per XID event and per counter snapshot (every HP_GPU_MONITOR_INTERVAL seconds, 30 by
default). The agent follows each monitor's output through the Provider (one blocked
log stream per node: no polling) and feeds it to gpu/monitor.py's MonitorState,
which reports only what is new. Then (gpu/monitor.py, decide):

- a failing finding drains the node with a reason naming it (`hp:gpu:<action>:<code>
  <message>`, slurm/model.py), and records an event;
- with `NodeRecovery: Automatic` the one escalation policy (recovery/rules.py) acts: a
  REPLACE-class finding replaces the node at once (its GPUs are quarantined first:
  capacity.quarantine, so the new node gets others), a RECOVER-class one reboots it once
  its jobs have ended; the same finding again after that reboot (the re-check) replaces
  it (a container restart does not reset a GPU);
- a monitor-class finding (application XIDs, correctable ECC rising) is an event only.

Nothing of this is kept in memory: what waits for an action is read from Slurm (a node
drained with a monitor's reason, which names the action and the finding) and whether it
was rebooted for that finding from its recorded phases (the reboot's reason names it),
so an agent killed between a reboot and its re-check replaces the node when it comes
back, never reboots it twice. A monitor's output is read from the node's last reboot on:
what came before is what that reboot was for.

Monitors go with their node: one whose node is gone, or was replaced (a new container:
`io.hp.watches` names the container watched), is removed; cluster delete removes them
with every container labelled for the cluster.

On the runtime: key "" looks (every STEP_S) and offers each running GPU node's key
"monitor:<node>" (its monitor made, made again RETRY_S after it exited or could not be
made, and followed) and each node due an action its key "node:<node>" (the action; a
failed one is backed off by the runtime), on the controller's workers.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from ..core import capacity
from ..core.context import Cluster, Env
from ..docker.images import GPU_IMAGES
from ..docker.views import Container, ContainerSpec, LineStream
from ..errors import TRANSIENT, guarded
from ..gpu.judge import FAILING, Finding
from ..gpu.monitor import MonitorDecision, MonitorState, decide, reason_fault
from ..gpu.wiring import GpuWiringError
from ..health.requests.gpu_check import condemned_gpus, node_wiring
from ..naming import L_GPU_MODE, L_ROLE, L_WATCHES, labels, monitor_name
from ..recovery import actions
from ..recovery.rules import escalation, rebooted_for
from ..runtime import Controller, Result, node_key, node_of
from ..slurm.model import SlurmNode
from ..state.phases import Owner, Phase, owner_of
from ..state.store import Latest
from ..verdict import Action

log = logging.getLogger("hp.gpuwatch")

MONITOR_PROGRAM = "/opt/hp-gpu/bin/hp_gpu_monitor.py"
ROLE = "gpu-monitor"
WIRED_MODES = ("runtime", "cdi", "devices")
MONITOR_CPUS = 0.2  # a ceiling; it uses far less (bench/health.py measures it)
MONITOR_MEMORY = 256 << 20
STEP_S = 5.0
RETRY_S = 30.0  # a monitor that exited or could not be made is made again after this
MONITOR = "monitor:"  # a node's monitor key: "monitor:<node>"

Act = Callable[[Cluster, Action, str, str], bool]  # (cluster, step, node, reason) -> back?


def interval() -> float:
    try:
        return float(os.environ.get("HP_GPU_MONITOR_INTERVAL", "30"))
    except ValueError:
        return 30.0


class GpuWatch(Controller):
    kind = "gpu-monitors"
    workers = 4  # the look, and monitors made and nodes acted on side by side

    def __init__(self, env: Env, name: str, act: Act | None = None, step_s: float = STEP_S):
        self.env = env
        self.name = name
        self.cluster = Cluster(env, name)
        self.step_s = step_s
        self.backoff = (step_s,)
        self._act = act or actions.step
        self.lock = threading.RLock()
        self.states: dict[str, MonitorState] = {}  # node -> what its monitor said so far
        self.followers: dict[str, tuple[str, LineStream]] = {}  # node -> (monitor id, its open log stream)
        self._said: set[str] = set()  # one-off events already recorded

    # -- the controller ---------------------------------------------------------------
    def reconcile(self, key: str) -> Result:
        if self.env.store.cluster(self.name) is None:
            return Result()
        if (node := node_of(key)) is not None:
            return self.act(node)
        if key.startswith(MONITOR):
            return self.monitor(key[len(MONITOR) :])
        self.step()  # monitors follow their nodes; due actions are taken, each on its key
        return Result(self.step_s)

    def close(self) -> None:
        with self.lock:
            streams = list(self.followers.values())
            self.followers.clear()
        for _, s in streams:
            s.close()

    def step(self) -> None:
        nodes, monitors = self._nodes_and_monitors()
        for n, m in monitors.items():  # a monitor whose node is gone
            if n not in nodes:
                self._forget(n)
                self.cluster.p.remove_container(m.id)
        for n, node in nodes.items():
            if node.running:
                self.offer(MONITOR + n)
        self.act_due()

    # -- monitors -----------------------------------------------------------------------
    def _nodes_and_monitors(self) -> tuple[dict[str, Container], dict[str, Container]]:
        nodes, monitors = {}, {}
        for c in self.cluster.containers():
            if c.role == ROLE and c.node:
                monitors[c.node] = c
            elif c.is_node and c.role == "worker" and c.node and c.gpus and c.labels.get(L_GPU_MODE) in WIRED_MODES:
                nodes[c.node] = c
        return nodes, monitors

    def monitor(self, n: str) -> Result:
        """A node's monitor key: one whose node was replaced is removed; one that exited is
        removed and made again after RETRY_S; the node's monitor made and followed."""
        p = self.cluster.p
        nodes, monitors = self._nodes_and_monitors()
        node, m = nodes.get(n), monitors.get(n)
        if m is not None and (node is None or m.labels.get(L_WATCHES) != node.id):  # its node is gone or was replaced
            self._forget(n)
            p.remove_container(m.id)
            m = None
        if m is not None and m.dead:
            tail = p.logs(m.id, tail=3).strip().replace("\n", " | ")[-300:]
            group = node.group if node else None
            self._event("Warning", f"GPU monitor of {n} exited ({m.exit_code}): {tail}; made again", n, group)
            self._forget(n)
            p.remove_container(m.id)
            return Result(RETRY_S)
        if node is None or not node.running:
            return Result()
        if m is None:
            m = self._start_monitor(node)
            if m is None:
                return Result(RETRY_S)
        if m.running:
            self._follow(n, m.id, node)
        return Result()

    def _start_monitor(self, node: Container) -> Container | None:
        c, p = self.cluster, self.cluster.p
        n = node.node or ""
        image = c.images.refs(GPU_IMAGES)["check-gpu"]
        if not c.images.exists(image):
            self._event_once(
                f"image:{image}",
                "Warning",
                f"GPU monitors cannot run: the GPU check image {image} is not built ('hp images build --gpu')",
            )
            return None
        try:
            wiring = node_wiring(c, node)
        except GpuWiringError as e:
            self._event_once(f"wiring:{n}", "Warning", f"GPU monitor of {n}: its GPUs cannot be given to it: {e}", n)
            return None
        spec = ContainerSpec(
            name=monitor_name(c.name, n),
            image=image,
            labels=labels(c.name, ROLE, node.group, n) | {L_WATCHES: node.id},
            network="none",
            command=["python3", MONITOR_PROGRAM, "--interval", f"{interval():g}"],
            cpu_limit=MONITOR_CPUS,
            memory_bytes=MONITOR_MEMORY,
            gpus=wiring,
        )
        try:
            cid = p.create_container(spec)
            p.start(cid)
        except TRANSIENT as e:
            log.warning("GPU monitor of %s: %s", n, e)
            p.remove_container(spec.name)
            return None
        with self.lock:
            self.states[n] = MonitorState(expected_gpus=len(node.gpus))
        log.info("GPU monitor of %s started", n)
        return next((x for x in p.containers(c.name, {L_ROLE: ROLE}) if x.id == cid), None)

    def _follow(self, node: str, cid: str, ncont: Container) -> None:
        with self.lock:
            cur = self.followers.get(node)
            if cur is not None and cur[0] == cid:
                return
            self.states.setdefault(node, MonitorState(expected_gpus=len(ncont.gpus)))
        stream = self.cluster.p.follow_logs(cid, since=self._rebooted_at(node))
        with self.lock:
            self.followers[node] = (cid, stream)
        # a thread: it blocks on the monitor's log stream (Docker's, no poll) as long as it runs
        threading.Thread(target=self._read, args=(node, cid, stream), daemon=True, name=f"gpumon-{node}").start()

    def _read(self, node: str, cid: str, stream: LineStream) -> None:
        def lines() -> None:
            try:
                for line in stream:
                    self.on_line(node, line)
            except TRANSIENT as e:  # the stream broke: the next step follows again
                log.info("GPU monitor of %s: %s", node, e)

        # a bug is reported; the node's monitor is followed again at the next step
        guarded(self.env.store, self.name, f"the GPU monitor of {node}", log, lines, node=node)
        with self.lock:
            if self.followers.get(node, ("",))[0] == cid:
                del self.followers[node]

    def _forget(self, node: str) -> None:
        with self.lock:
            f = self.followers.pop(node, None)
            self.states.pop(node, None)
        if f is not None:
            f[1].close()

    # -- findings -----------------------------------------------------------------------
    def on_line(self, node: str, line: str) -> MonitorDecision | None:
        with self.lock:
            state = self.states.setdefault(node, MonitorState())
            findings = state.feed_line(line)
        if not findings:
            return None
        return self.on_findings(node, findings)

    def on_findings(self, node: str, findings: list[Finding]) -> MonitorDecision:
        c = self.cluster
        cont = c.node_containers().get(node)
        group = cont.group if cont else None
        for f in findings:
            level = "Error" if f.severity in FAILING else ("Warning" if f.severity == "warning" else "Info")
            self._event(
                level, f"GPU monitor on {node}: {f.code} ({f.severity}, action {f.action}): {f.message}", node, group
            )
        d = decide(findings)
        if not d.drain:
            return d
        action = self._step(node, d.action, d.reason)
        try:
            c.slurm.drain([node], d.reason)
        except TRANSIENT as e:
            log.warning("drain %s for %s: %s", node, d.reason, e)
        automatic = c.reload().NodeRecovery == "Automatic"
        drained = f"{node} drained for a GPU finding ({d.reason})"
        if action is Action.NONE or not automatic:
            why = "NodeRecovery is not Automatic" if action is not Action.NONE else f"action {d.action}"
            self._event("Warning", f"{drained}; kept drained: {why}", node, group)
            return d
        if action is Action.REPLACE and cont is not None:
            capacity.quarantine(c.store, self._bad_gpus(node, cont, findings), f"{node}: {d.reason}")
        then = "replaced now" if action is Action.REPLACE else "rebooted when its jobs have ended"
        self._event("Warning", f"{drained}: it will be {then}", node, group)
        return MonitorDecision(d.drain, action, action is Action.REPLACE, d.reason)

    def _step(self, node: str, action: Action, reason: str) -> Action:
        """The escalation's step now for `node`, drained with `reason` (a finding's): a
        reboot if it was not rebooted for that finding yet, else a replace (from its
        recorded history: an agent restart changes nothing)."""
        got = reason_fault(reason)
        mark = got[1] if got else reason
        return escalation(action, rebooted_for(self.env.store.node_history(self.name, node), mark))

    def _rebooted_at(self, node: str) -> float | None:
        """When the node was last rebooted (None: never): its monitor's lines from then on
        are news, those before were what that reboot was for."""
        times = [r.time for r in self.env.store.node_history(self.name, node) if r.phase is Phase.REBOOTING]
        return times[-1] if times else None

    def _bad_gpus(self, node: str, cont: Container, findings: list[Finding]) -> list[str]:
        """The node's GPUs a replace-class finding names (NVML index -> UUID through the
        monitor's last snapshot); all of the node's when it names none."""
        with self.lock:
            st = self.states.get(node)
            by_index = {
                g.index: uuid for uuid, g in (st.last.gpus.items() if st and st.last else ()) if g.index is not None
            }
        return condemned_gpus(findings, by_index, cont.gpus)

    def act_due(self) -> None:
        """Offer the key of each node drained for a GPU finding (Slurm says which, and for
        what) that is due its escalation's step."""
        c = self.cluster
        try:
            drained = [n for n in c.slurm.nodes() if n.gpu_finding]
        except TRANSIENT:
            return
        if not drained or c.reload().NodeRecovery != "Automatic":
            return
        latest = c.store.latest_phases(c.name)
        for sn in drained:
            if self._todo(sn, latest) is not Action.NONE:
                self.offer(node_key(sn.name))

    def _todo(self, sn: SlurmNode, latest: Latest) -> Action:
        """The step due now for a node drained for a GPU finding: the escalation's step from
        its history, once no one else owns it and, for a reboot, its jobs have ended."""
        got = reason_fault(sn.reason)
        todo = self._step(sn.name, got[0], sn.reason) if got else Action.NONE
        if owner_of(latest.get(sn.name), time.time()) not in (Owner.NONE, Owner.RECONCILER):
            return Action.NONE  # a health check or a recovery owns it now
        if todo is not Action.REPLACE and sn.busy:
            return Action.NONE  # jobs still running: never killed for a reboot
        return todo

    def act(self, node: str) -> Result:
        """A node's key: the step due for it now (read again from Slurm and its history); one
        that did not bring it back is backed off by the runtime."""
        c = self.cluster
        sn = next((n for n in c.slurm.nodes() if n.name == node and n.gpu_finding), None)
        if sn is None or c.reload().NodeRecovery != "Automatic":
            return Result()
        todo = self._todo(sn, c.store.latest_phases(c.name))
        if todo is Action.NONE:
            return Result()
        try:
            ok = self._act(self.cluster, todo, node, f"GPU finding: {sn.reason}")
        except TRANSIENT as e:
            log.warning("%s of %s failed: %s", todo, node, e)
            ok = False
        if todo is Action.REBOOT:
            with self.lock:
                st = self.states.get(node)
                if st is not None:
                    st.active.clear()  # a condition still there after the reboot is reported again
        if not ok:
            self._event("Error", f"{todo} of {node} for a GPU finding did not bring it back", node)
            return Result.backoff()
        return Result()

    # -- events -------------------------------------------------------------------------
    def _event(self, level: str, text: str, node: str | None = None, group: str | None = None) -> None:
        self.env.store.event(self.name, "Instance" if node else "Cluster", level, text, group, node=node)

    def _event_once(self, key: str, level: str, text: str, node: str | None = None) -> None:
        if key not in self._said:
            self._said.add(key)
            self._event(level, text, node)
