"""`hp create`, `list`, `describe`, `nodes`, `exec`, `delete`, `version`."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import typer

from ..errors import BadInput
from .common import CliProgress, JsonOpt, SlurmOpt, env
from .output import Out


def create(
    spec_file: Optional[Path] = typer.Option(
        None, "-f", "--file", help="Cluster spec (YAML or JSON, CreateCluster shape). Default: the built-in cluster."
    ),
    name: Optional[str] = typer.Option(None, "--name", help="Cluster name (overrides ClusterName)."),
    mode: Optional[str] = typer.Option(
        None, "--mode", help="continuous or all-or-nothing (overrides NodeProvisioningMode)."
    ),
    wait: bool = typer.Option(
        True, "--wait/--no-wait", help="Wait until every node is idle in Slurm (continuous: until InService)."
    ),
    timeout: float = typer.Option(300, "--timeout", help="Seconds to wait."),
    retain: bool = typer.Option(False, "--retain", help="Keep a failed cluster's containers for debugging."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the spec (and the host's capacity) only."),
    encrypt_network: bool = typer.Option(
        False,
        "--encrypt-network",
        help="Registered hosts only: an IPsec-encrypted overlay network, proven to carry traffic between the hosts.",
    ),
    accounting: Optional[bool] = typer.Option(
        None, "--accounting/--no-accounting", help="Slurm accounting: slurmdbd and MariaDB (overrides Accounting)."
    ),
    rest: Optional[bool] = typer.Option(None, "--rest/--no-rest", help="slurmrestd with JWT (overrides Rest)."),
    mount: list[str] = typer.Option(
        [],
        "--mount",
        help="SRC[:TARGET]: bind-mount the host folder SRC (absolute) into every login and compute node at TARGET "
        "(default: the same path); repeatable, added to the spec's Mounts.",
    ),
    slurm: Optional[str] = SlurmOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Create a cluster: controller first, then login and compute groups in parallel."""
    from ..cluster.create import CreateOptions
    from ..cluster.create import create as do_create
    from ..cluster.describe import describe
    from ..spec.catalogue import load_catalogue
    from ..spec.loader import load_spec_file
    from ..spec.model import DEFAULT_SPEC, uses_only, with_overrides

    out = Out(json_out)
    raw = load_spec_file(spec_file) if spec_file else dict(DEFAULT_SPEC)
    problems = [f"--timeout must be positive, got {timeout:g}"] if timeout <= 0 else []
    # a spec of the shipped (or the user's) types is judged before anything else is made:
    # no state, no engine; GPU types named after the host's GPUs need discovery
    static = load_catalogue()
    e = None if uses_only(raw, static, gpu_names=True) else env()
    catalogue = static if e is None else e.catalogue
    base = spec_file.resolve().parent if spec_file else None  # a LifeCycleConfig's folder is relative to the file
    spec = with_overrides(
        raw,
        catalogue,
        name=name,
        mode=mode,
        problems=problems,
        accounting=accounting,
        rest=rest,
        mounts=mount,
        slurm=slurm,
        base=base,
    )
    if dry_run:  # what hp would create; no state is made, and no engine is needed
        dry_run_check(e, spec, catalogue)
        out.json(spec.model_dump(exclude_none=True)) if json_out else out.info(
            f"spec of cluster {spec.ClusterName} is valid; nothing was created"
        )
        return
    e = e or env()
    progress = CliProgress(out)
    opts = CreateOptions(wait=wait, timeout=timeout, retain=retain, encrypt_network=encrypt_network)
    made = do_create(e, spec, opts, progress)
    doc = describe(e, spec.ClusterName, services=json_out, slurm_nodes=made.slurm_nodes)
    if json_out:
        out.json(doc)
    else:
        out.info(f"{progress.elapsed()} cluster {spec.ClusterName} is {doc['ClusterStatus']}")
        print_groups(out, doc)


def dry_run_check(e: Any, spec: Any, catalogue: Mapping) -> None:
    """With an engine that answers, the host's capacity too (CPU types: no state is read,
    unless hosts are registered: then their capacity and the spec's Placement)."""
    from ..cluster.create import capacity_problems, has_gpus
    from ..core import capacity
    from ..core.across_hosts import placement_problems
    from ..docker.engine import DockerEngine
    from ..errors import EngineUnavailable
    from ..state.home import hosts_registered

    gpu = has_gpus(spec, catalogue)
    if e is None and hosts_registered():
        e = env()  # the registered hosts' capacity
    if e is not None and e.provider.places_nodes:
        try:
            problems = placement_problems(e, spec) or capacity_problems(e, spec, None, catalogue)
        except EngineUnavailable:
            Out().info("note: no registered host answers: their capacity was not checked")
            problems = placement_problems(e, spec)
        if problems:
            raise BadInput(problems, "cannot create")
        return
    provider = e.provider if e is not None else DockerEngine()
    try:  # GPU types: the host's GPUs discovered (uncached without a store: a dry run writes no state)
        pool = capacity.host_pool(provider, e.store if e is not None else None, gpus_too=gpu)
    except EngineUnavailable:
        Out().info("note: no Docker engine answers: the host's capacity was not checked")
        return
    if problems := placement_problems(e, spec) or capacity_problems(e, spec, pool, catalogue):
        raise BadInput(problems, "cannot create")


def print_groups(out: Out, doc: dict[str, Any]) -> None:
    fail = f" ({doc['FailureMessage']})" if doc.get("FailureMessage") else ""
    out.table(
        f"{doc['ClusterName']}: {doc['ClusterStatus']}{fail}",
        ["GROUP", "TYPE", "NODE TYPE", "CURRENT/TARGET", "STATUS", "PARTITIONS"],
        [
            [
                g["InstanceGroupName"],
                g["InstanceType"],
                g["NodeType"],
                f"{g['CurrentCount']}/{g['TargetCount']}",
                g["Status"],
                ",".join(g["PartitionNames"]),
            ]
            for g in doc["InstanceGroups"]
        ],
    )


def list_(json_out: bool = JsonOpt) -> None:
    """List clusters."""
    from ..cluster.query import list_clusters

    e = env()
    doc = list_clusters(e)
    if doc["EngineReachable"]:
        for c in doc["ClusterSummaries"]:
            e.agents.ensure(c["ClusterName"])
    out = Out(json_out)
    if json_out:
        out.json(doc)
        return
    if not doc["EngineReachable"]:
        out.info("warning: the Docker engine does not answer: statuses are the last recorded ones")
    out.table(
        None,
        ["NAME", "STATUS", "CREATED"],
        [[c["ClusterName"], c["ClusterStatus"], c["CreationTime"]] for c in doc["ClusterSummaries"]],
    )


def describe(name: str, json_out: bool = JsonOpt) -> None:
    """Describe a cluster (DescribeCluster shape)."""
    from ..cluster.describe import describe as do_describe

    e = env()
    e.cluster(name)
    agent = e.agents.ensure(name)
    doc = do_describe(e, name)
    doc["Agent"] = agent
    out = Out(json_out)
    warn_unreachable(out, doc)
    if json_out:
        out.json(doc)
        return
    print_groups(out, doc)
    print(f"slurm: {doc['SlurmVersion']} ({doc.get('SlurmPackageVersion') or 'package version unknown'})")
    print_services(doc)
    print(f"agent: {'restarted' if agent['Restarted'] else 'alive'} (pid {agent['Pid']})")


def warn_unreachable(out: Out, doc: dict[str, Any]) -> None:
    """On stderr (also with --json): the registered hosts that do not answer."""
    for h, why in (doc.get("UnreachableHosts") or {}).items():
        out.info(f"warning: host {h} is unreachable ({why}): what it holds is shown as last recorded")


def print_services(doc: dict[str, Any]) -> None:
    """Accounting's health and the services' endpoints (docs/accounting.md)."""
    for h in doc.get("SlurmHealth") or []:
        why = f" ({h['Reason']})" if h.get("Reason") else ""
        print(f"slurmdbd: {h['Status']}{why}: {h['Message']}")
    if not doc.get("Accounting", {}).get("Enabled"):
        print("accounting: off")
    ends = doc.get("Endpoints") or {}
    if doc.get("Rest", {}).get("Enabled"):
        print(f"rest: {ends.get('Rest') or 'not served yet'} (hp api, hp token)")
    if ends.get("Metrics"):
        print(f"metrics: {ends['Metrics']}")


def nodes(
    name: str,
    group: Optional[str] = typer.Option(None, "--group", "-g", help="Only this instance group."),
    json_out: bool = JsonOpt,
) -> None:
    """List a cluster's nodes (ListClusterNodes shape) with their Slurm state."""
    from ..cluster.query import nodes as do_nodes

    e = env()
    e.cluster(name)
    e.agents.ensure(name)
    doc = do_nodes(e, name, group)
    out = Out(json_out)
    warn_unreachable(out, doc)
    if json_out:
        out.json(doc)
        return
    hosts = e.provider.places_nodes  # with registered hosts, the host each node runs on
    out.table(
        None,
        ["NODE", "GROUP", "TYPE", "STATUS", "SLURM", *(["HOST"] if hosts else []), "NODE ID", "MESSAGE"],
        [
            [
                n["SlurmNodeName"],
                n["InstanceGroupName"],
                n["InstanceType"],
                n["InstanceStatus"]["Status"],
                n["SlurmState"] or "",
                *([n.get("Host") or ""] if hosts else []),
                n["NodeId"] or "",
                n["InstanceStatus"]["Message"] or n.get("SlurmReason") or "",
            ]
            for n in doc["ClusterNodeSummaries"]
        ],
    )


def exec_(
    name: str,
    cmd: list[str] = typer.Argument(..., help="Command to run (after --)."),
    node: Optional[str] = typer.Option(
        None, "--node", "-n", help="Node (Slurm name); default: the login node, else the controller."
    ),
    root: bool = typer.Option(False, "--root", help="Run as root instead of the default user (hpuser)."),
) -> None:
    """Run a command on a node (default: the login node) as the default user; exit with its code.

    Example: hp exec lab -- srun -N4 hostname
    """
    from ..cluster.exec import exec_target, run_exec

    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise BadInput("no command given: hp exec NAME -- CMD...")
    e = env()
    target, on_controller = exec_target(e, name, node)
    e.agents.ensure(name)

    def write(data: bytes, err: bool) -> None:
        s = sys.stderr.buffer if err else sys.stdout.buffer
        s.write(data)
        s.flush()

    interactive = sys.stdin.isatty() and sys.stdout.isatty()  # a terminal: attach one (hp exec lab -- bash)
    raise typer.Exit(run_exec(e, target, cmd, root, write, interactive, on_controller))


def delete(
    name: str,
    missing_ok: bool = typer.Option(
        False, "--missing-ok", help="A cluster that does not exist is no error: nothing to delete, exit 0."
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Drain and remove every node, container, network and volume of a cluster."""
    from ..cluster.delete import delete as do_delete

    removed = do_delete(env(), name, missing_ok)
    out = Out(json_out)
    if removed is None:  # --missing-ok, and nothing of it exists
        if json_out:
            out.json({"ClusterName": name, "Removed": {"containers": 0, "networks": 0, "volumes": 0}})
        else:
            out.info(f"no cluster {name}: nothing to delete")
        return
    if json_out:
        out.json({"ClusterName": name, "Removed": removed})
    else:
        out.info(
            f"deleted cluster {name}: {removed['containers']} containers, {removed['networks']} networks, "
            f"{removed['volumes']} volumes"
        )
        if removed.get("unreachable_hosts"):
            out.info(
                f"warning: {removed['unreachable_hosts']} host(s) do not answer: what they hold of {name} is left "
                f"there; run 'hp delete {name}' again once they are back (hp hosts list)"
            )
        if removed.get("warning"):
            out.info(f"warning: {removed['warning']}")


def version(
    images: bool = typer.Option(
        False, "--images", help="Also the node images' tags and the Slurm version they hold (asks the Docker engine)."
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Print hp's and Python's versions (with --images, Slurm's and the images' too)."""
    from ..ci.version import versions

    doc: dict[str, Any] = versions()
    if images:
        from ..ci.image_versions import image_versions

        doc |= image_versions(env())
    out = Out(json_out)
    if json_out:
        out.json(doc)
        return
    print(f"hp {doc['hp']} (Python {doc['python']})")
    if not images:
        return
    from ..releases import DEFAULT

    for release, one in doc["releases"].items():
        default = " (the default)" if release == DEFAULT else ""
        print(f"Slurm {release}{default}: {one['slurm'] or 'unknown (images not built)'}")
        for k, v in (one.get("images") or {}).items():
            print(f"  image {k}: {v}")
        if one.get("note"):
            print(f"  note: {one['note']}")


COMMANDS = (
    ("create", create),
    ("list", list_),
    ("describe", describe),
    ("nodes", nodes),
    ("exec", exec_),
    ("delete", delete),
    ("version", version),
)
