"""`hp`: HyperPod-style Slurm clusters on Docker. A thin CLI over the library.

Exit codes: 0 success, 1 operation failed, 2 bad input, 3 timeout waiting.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from .errors import BadInput, HpError
from .output import Out

EXIT_CODES = "Exit codes: 0 success, 1 operation failed, 2 bad input, 3 timeout waiting."

app = typer.Typer(
    name="hp",
    help="HyperPod-style Slurm clusters on Docker: continuous provisioning, deep health checks, "
         f"node recovery.\n\n{EXIT_CODES}",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
images_app = typer.Typer(help=f"Build, list, save and load hp's images. {EXIT_CODES}", no_args_is_help=True)
app.add_typer(images_app, name="images")

JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")


def _env() -> Any:
    from .cluster import Env

    return Env()


class CliProgress:
    """Stage lines (and per-group counts) on stderr; a live line on a TTY."""

    def __init__(self, out: Out):
        self.out = out
        self.t0 = time.monotonic()
        self.last: tuple[str, str] | None = None
        self.last_groups: dict[str, tuple[int, int, int]] = {}

    def stage(self, name: str, detail: str = "") -> None:
        if (name, detail) != self.last:
            self.last = (name, detail)
            self.out.info(f"[{time.monotonic() - self.t0:5.1f}s] {name}: {detail}")

    def groups(self, counts: dict[str, tuple[int, int, int]]) -> None:
        if counts != self.last_groups:
            self.last_groups = counts
            txt = "  ".join(f"{g} {c}/{t}" + (f" ({f} failed)" if f else "") for g, (c, t, f) in counts.items())
            self.out.info(f"[{time.monotonic() - self.t0:5.1f}s] nodes: {txt}")


@app.command()
def create(
    spec_file: Optional[Path] = typer.Option(None, "-f", "--file", help="Cluster spec (YAML or JSON, CreateCluster shape). Default: the built-in cluster."),
    name: Optional[str] = typer.Option(None, "--name", help="Cluster name (overrides ClusterName)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="continuous or all-or-nothing (overrides NodeProvisioningMode)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until every node is idle in Slurm (continuous: until InService)."),
    timeout: float = typer.Option(300, "--timeout", help="Seconds to wait."),
    retain: bool = typer.Option(False, "--retain", help="Keep a failed cluster's containers for debugging."),
    json_out: bool = JsonOpt,
) -> None:
    """Create a cluster: controller first, then login and compute groups in parallel."""
    from .create import CreateOptions, create as do_create
    from .ops import describe
    from .spec import DEFAULT_SPEC, load_spec_file, validate

    out = Out(json_out)
    env = _env()
    raw = load_spec_file(spec_file) if spec_file else dict(DEFAULT_SPEC)
    problems = []
    if mode is not None:
        modes = {"continuous": "Continuous", "all-or-nothing": None}
        if mode not in modes:
            problems.append(f"--mode must be continuous or all-or-nothing, got {mode!r}")
        elif isinstance(raw, dict):
            raw = {**raw, "NodeProvisioningMode": modes[mode]}
            if raw["NodeProvisioningMode"] is None:
                del raw["NodeProvisioningMode"]
    if timeout <= 0:
        problems.append(f"--timeout must be positive, got {timeout:g}")
    try:
        spec = validate(raw, env.catalogue, name=name)
    except BadInput as e:
        problems += e.problems
    if problems:
        raise BadInput(problems, "invalid cluster spec")
    progress = CliProgress(out)
    do_create(env, spec, CreateOptions(wait=wait, timeout=timeout, retain=retain), progress)
    doc = describe(env, spec.ClusterName)
    if json_out:
        out.json(doc)
    else:
        out.info(f"[{time.monotonic() - progress.t0:5.1f}s] cluster {spec.ClusterName} is {doc['ClusterStatus']}")
        _print_groups(out, doc)


def _print_groups(out: Out, doc: dict[str, Any]) -> None:
    out.table(f"{doc['ClusterName']}: {doc['ClusterStatus']}" + (f" ({doc['FailureMessage']})" if doc.get("FailureMessage") else ""),
              ["GROUP", "TYPE", "NODE TYPE", "CURRENT/TARGET", "STATUS", "PARTITIONS"],
              [[g["InstanceGroupName"], g["InstanceType"], g["NodeType"], f"{g['CurrentCount']}/{g['TargetCount']}",
                g["Status"], ",".join(g["PartitionNames"])] for g in doc["InstanceGroups"]])


@app.command("list")
def list_(json_out: bool = JsonOpt) -> None:
    """List clusters."""
    from .agent import ensure_agent
    from .ops import list_clusters

    env = _env()
    doc = list_clusters(env)
    for c in doc["ClusterSummaries"]:
        ensure_agent(env, c["ClusterName"])
    out = Out(json_out)
    if json_out:
        out.json(doc)
    else:
        out.table(None, ["NAME", "STATUS", "CREATED"],
                  [[c["ClusterName"], c["ClusterStatus"], c["CreationTime"]] for c in doc["ClusterSummaries"]])


@app.command()
def describe(name: str, json_out: bool = JsonOpt) -> None:
    """Describe a cluster (DescribeCluster shape)."""
    from .agent import ensure_agent
    from .ops import describe as do_describe

    env = _env()
    agent = ensure_agent(env, name) if env.store.cluster(name) else None
    doc = do_describe(env, name)
    doc["Agent"] = agent
    out = Out(json_out)
    if json_out:
        out.json(doc)
    else:
        _print_groups(out, doc)
        if agent:
            print(f"agent: {'restarted' if agent['Restarted'] else 'alive'} (pid {agent['Pid']})")


@app.command()
def nodes(name: str, group: Optional[str] = typer.Option(None, "--group", "-g", help="Only this instance group."),
          json_out: bool = JsonOpt) -> None:
    """List a cluster's nodes (ListClusterNodes shape) with their Slurm state."""
    from .agent import ensure_agent
    from .ops import nodes as do_nodes

    env = _env()
    if env.store.cluster(name):
        ensure_agent(env, name)
    doc = do_nodes(env, name, group)
    out = Out(json_out)
    if json_out:
        out.json(doc)
        return
    out.table(None, ["NODE", "GROUP", "TYPE", "STATUS", "SLURM", "NODE ID", "MESSAGE"],
              [[n["SlurmNodeName"], n["InstanceGroupName"], n["InstanceType"], n["InstanceStatus"]["Status"],
                n["SlurmState"] or "", n["NodeId"] or "", n["InstanceStatus"]["Message"] or n.get("SlurmReason") or ""]
               for n in doc["ClusterNodeSummaries"]])


@app.command()
def exec(
    name: str,
    cmd: list[str] = typer.Argument(..., help="Command to run (after --)."),
    node: Optional[str] = typer.Option(None, "--node", "-n", help="Node (Slurm name); default: the login node, else the controller."),
    root: bool = typer.Option(False, "--root", help="Run as root instead of the default user (hpuser)."),
) -> None:
    """Run a command on a node (default: the login node) as the default user; exit with its code.

    Example: hp exec lab -- srun -N4 hostname
    """
    from .ops import exec_target, run_exec

    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise BadInput("no command given: hp exec NAME -- CMD...")
    from .agent import ensure_agent

    env = _env()
    target = exec_target(env, name, node)
    ensure_agent(env, name)

    def write(data: bytes, err: bool) -> None:
        s = sys.stderr.buffer if err else sys.stdout.buffer
        s.write(data)
        s.flush()

    interactive = sys.stdin.isatty() and sys.stdout.isatty()  # a terminal: attach one (hp exec lab -- bash)
    raise typer.Exit(run_exec(env, target, cmd, root, write, interactive))


@app.command()
def delete(name: str, json_out: bool = JsonOpt) -> None:
    """Drain and remove every node, container, network and volume of a cluster."""
    from .ops import delete as do_delete

    removed = do_delete(_env(), name)
    out = Out(json_out)
    if json_out:
        out.json({"ClusterName": name, "Removed": removed})
    else:
        out.info(f"deleted cluster {name}: {removed['containers']} containers, {removed['networks']} networks, "
                 f"{removed['volumes']} volumes")


@images_app.command("build")
def images_build(json_out: bool = JsonOpt) -> None:
    """Build the node and check images (nothing is rebuilt when nothing changed)."""
    env = _env()
    env.provider.ping()
    out = Out(json_out)
    refs = env.images.build(log=out.info)
    if json_out:
        out.json({"Images": refs})
    else:
        out.table(None, ["IMAGE", "REFERENCE"], sorted(refs.items()))


@images_app.command("list")
def images_list(json_out: bool = JsonOpt) -> None:
    """Show hp's images, the tag their inputs hash to now, and whether it is built."""
    env = _env()
    env.provider.ping()
    rows = env.images.status()
    out = Out(json_out)
    if json_out:
        out.json({"Images": rows})
    else:
        out.table(None, ["IMAGE", "TAG", "PRESENT"], [[r["Image"], r["Tag"], r["Present"]] for r in rows])


@app.command()
def version(json_out: bool = JsonOpt) -> None:
    """Print hp's, Slurm's and the images' versions."""
    from importlib.metadata import version as pkg_version

    from .images import NODE_IMAGES

    doc: dict[str, Any] = {"hp": pkg_version("hp"), "python": sys.version.split()[0]}
    try:
        env = _env()
        env.provider.ping()
        refs = env.images.refs(NODE_IMAGES)
        doc["images"] = refs
        w = refs["worker"]
        from .ci import slurm_version

        doc["slurm"] = slurm_version(env, w)  # from the worker image's dpkg database; None if not built
    except HpError as e:
        doc["images"] = None
        doc["note"] = str(e).splitlines()[0]
    out = Out(json_out)
    if json_out:
        out.json(doc)
    else:
        for k, v in doc.items():
            print(f"{k}: {v}")


def main() -> None:
    out = Out()
    try:
        rc = app(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except HpError as e:
        out.error(str(e))
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        out.error("interrupted")
        sys.exit(130)
    except Exception as e:  # usage errors of the command-line parser (click, vendored by typer)
        kind = type(e).__name__
        if type(e).__module__.startswith(("docker.", "requests.", "urllib3.")):  # the engine refused: say so
            out.error(f"Docker: {str(e).splitlines()[0][:500] if str(e) else kind}")
            sys.exit(1)
        if hasattr(e, "show") and hasattr(e, "exit_code"):
            e.show()
            sys.exit(2 if kind in ("UsageError", "BadParameter", "NoSuchOption", "MissingParameter",
                                   "BadOptionUsage", "BadArgumentUsage") else int(e.exit_code or 1))
        if kind == "Abort":
            sys.exit(130)
        raise


def _register() -> None:
    from . import cli_ci, cli_health, cli_recovery, cli_scale

    for m in (cli_scale, cli_ci, cli_health, cli_recovery):
        m.register(app)


_register()


if __name__ == "__main__":
    main()
