"""`hp scale`, `add-nodes`, `delete-nodes`, `events`, `operations`, `capacity set|show`."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import typer

from ..errors import BadInput
from .common import JsonOpt, env, sub_app
from .output import Out

# `hp scale lab cpu -5`: a negative count is a count (refused by the rules), not an option
NUMBERS_OK = {"ignore_unknown_options": True}


def _scale(name: str, group: str, count: int, add: bool, wait: bool, timeout: float, json_out: bool) -> None:
    from ..cluster.scaling import scale as do_scale
    from ..cluster.waiting import wait_groups

    if wait and timeout <= 0:
        raise BadInput(f"--timeout must be positive, got {timeout:g}")
    e = env()
    out = Out(json_out)
    doc = do_scale(e, name, group, count, add=add)
    if wait:
        wait_groups(e, name, [group], timeout, out.info)
    if json_out:
        out.json(doc)
    else:
        out.info(f"{name}/{group}: target {doc['PreviousCount']} -> {doc['TargetCount']}")


def scale(
    name: str,
    group: str,
    count: int = typer.Argument(..., help="New target count."),
    wait: bool = typer.Option(False, "--wait/--no-wait", help="Wait until the group reaches its target."),
    timeout: float = typer.Option(600, "--timeout"),
    json_out: bool = JsonOpt,
) -> None:
    """Set an instance group's target count. Returns at once; the cluster's agent does the work."""
    _scale(name, group, count, False, wait, timeout, json_out)


def add_nodes(
    name: str,
    group: str,
    count: int = typer.Argument(..., help="Nodes to add."),
    wait: bool = typer.Option(False, "--wait/--no-wait", help="Wait until the group reaches its target."),
    timeout: float = typer.Option(600, "--timeout"),
    json_out: bool = JsonOpt,
) -> None:
    """Add nodes to an instance group. Returns at once."""
    _scale(name, group, count, True, wait, timeout, json_out)


def delete_nodes(
    name: str, nodes: list[str] = typer.Argument(..., help="Slurm node names or node ids."), json_out: bool = JsonOpt
) -> None:
    """Remove chosen nodes (drained first; running jobs end first). Returns at once."""
    from ..cluster.scaling import delete_nodes as do_delete

    doc = do_delete(env(), name, nodes)
    out = Out(json_out)
    if json_out:
        out.json(doc)
    else:
        out.info(f"removing {', '.join(doc['NodesToDelete'])}")


def events(
    name: str,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events."),
    limit: int = typer.Option(1000, "--limit", "-n", help="How many of the newest events (at most 10000)."),
    json_out: bool = JsonOpt,
) -> None:
    """The cluster's newest events (HyperPod shape), oldest first; --follow for new ones."""
    from ..errors import NotFound
    from ..state.store import PAGE_MAX

    e = env()
    out = Out(json_out)
    if not 1 <= limit <= PAGE_MAX:
        raise BadInput(f"--limit must be between 1 and {PAGE_MAX}, got {limit}")
    if e.store.cluster(name) is None and not e.store.has_events(name):
        raise NotFound(f"cluster {name!r} does not exist (see 'hp list')")
    evs = e.store.events(name, limit=limit)
    if follow:
        if e.store.cluster(name) is not None:
            e.agents.ensure(name)
        last = evs[-1].id if evs else 0
        for ev in [*evs, *e.store.follow_events(name, after_id=last, poll=0.5)]:
            line = json.dumps(ev.as_dict()) if json_out else event_line(ev.as_dict())
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        return
    docs = [ev.as_dict() for ev in evs]
    if json_out:
        out.json({"ClusterName": name, "Events": docs})
    else:
        for d in docs:
            print(event_line(d))


def event_line(e: dict[str, Any]) -> str:
    where = e["InstanceGroupName"] or ""
    if e.get("SlurmNodeName"):
        where += f"/{e['SlurmNodeName']}"
    op = f"op {e['OperationId']}" if e.get("OperationId") is not None else ""
    return f"{e['EventTime']}  {e['EventLevel']:<5} {e['ResourceType']:<13} {where:<20} {op:<7} {e['Description']}"


def operations(
    args: list[str] = typer.Argument(..., metavar="NAME | describe NAME ID", show_default=False),
    json_out: bool = JsonOpt,
) -> None:
    """The cluster's operations (HyperPod's ListClusterOperations): each scale, add or delete
    of nodes, health check, reboot or replace by hand and software upgrade, with its status
    (InProgress, Superseded, Done, Failed). `hp operations describe NAME ID`: one of them
    (DescribeClusterOperation), with its groups' counts and its events."""
    from ..cluster.operation_views import describe_operation, list_operations

    describe = args[0] == "describe" and len(args) > 1
    problems = []
    if describe and len(args) != 3:
        problems.append(f"'hp operations describe' takes NAME and ID, got {len(args) - 1} argument(s)")
    if not describe and len(args) != 1:
        problems.append(f"'hp operations' takes NAME (or: describe NAME ID), got {' '.join(args)!r}")
    if describe and len(args) == 3 and not (args[2].isdigit() and int(args[2]) > 0):
        problems.append(f"ID must be an operation's number (see 'hp operations {args[1]}'), got {args[2]!r}")
    if problems:
        raise BadInput(problems, "cannot show operations")
    e, out = env(), Out(json_out)
    if describe:
        doc = describe_operation(e, args[1], int(args[2]))
        if json_out:
            return out.json({"ClusterName": args[1], "Operation": doc})
        print(op_line(doc) + (f"  nodes: {', '.join(doc['Nodes'])}" if doc["Nodes"] else ""))
        out.table(
            None,
            ["GROUP", "CURRENT", "MIN", "TARGET", "PREVIOUS"],
            [
                [g["InstanceGroupName"], *(str(g[k]) if g[k] is not None else "-" for k in COUNT_KEYS)]
                for g in doc["InstanceGroups"]
            ],
        )
        for ev in doc["Events"]:
            print(event_line(ev))
        return None
    doc = list_operations(e, args[0])
    if json_out:
        return out.json(doc)
    for op in doc["Operations"]:
        print(op_line(op))
    return None


COUNT_KEYS = ("CurrentCount", "MinCount", "TargetCount", "PreviousCount")


def op_line(o: dict[str, Any]) -> str:
    end = o["EndTime"] or "-"
    what = f"{o['OperationType']} {o['InstanceGroupName'] or ''}".strip()
    tail = f"  {o['Message']}" if o["Message"] else ""
    return f"{o['OperationId']:>4}  {o['Status']:<10} {what:<24} {o['StartTime']}  {end}{tail}"


capacity_app = sub_app("Show and limit the capacity instance types draw from.")


@capacity_app.command("set")
def capacity_set(
    instance_type: str,
    count: Optional[int] = typer.Argument(None, help="Max nodes of this type on the host; omit with --clear."),
    clear: bool = typer.Option(False, "--clear", help="Remove the limit."),
) -> None:
    """Limit how many nodes of an instance type may run on this host (all clusters)."""
    from ..core import capacity

    e = env()
    capacity.set_limit_checked(e.store, e.catalogue, instance_type, count, clear)
    for row in e.store.clusters():  # waiting clusters retry now
        e.agents.ensure(row.name)
        e.agents.poke(row.name)
    Out().info(f"{instance_type}: " + ("no limit" if clear else f"at most {count} node(s)"))


@capacity_app.command("release-gpu")
def capacity_release_gpu(
    gpus: Optional[list[str]] = typer.Argument(None, help="GPU ids (UUIDs) to put back into the pool."),
    all_: bool = typer.Option(False, "--all", help="Every quarantined GPU."),
) -> None:
    """Put GPUs that a replace-class finding quarantined back into the pool."""
    from ..core import capacity
    from ..errors import BadInput

    e = env()
    if bool(gpus) == all_:
        raise BadInput("give GPU ids or --all", "cannot release GPUs")
    bad = capacity.quarantined(e.store)
    if gpus and (unknown := [g for g in gpus if g not in bad]):
        raise BadInput(
            f"not quarantined: {', '.join(unknown)} (quarantined: {', '.join(bad) or 'none'})", "cannot release GPUs"
        )
    done = capacity.release_gpus(e.store, None if all_ else gpus)
    Out().info(f"back in the pool: {', '.join(done) or 'none'}")


@capacity_app.command("show")
def capacity_show(json_out: bool = JsonOpt) -> None:
    """The host's pool, what hp's nodes use of it, and per-type limits."""
    from ..core import capacity

    e = env()
    doc = capacity.report(e.provider, e.store, e.catalogue)
    out = Out(json_out)
    if json_out:
        out.json(doc)
        return
    pool, used = doc["Pool"], doc["Used"]
    gpus = ", ".join(f"{g} ({pool['GpuModels'].get(g, '?')})" for g in pool["Gpus"]) or "none"
    print(
        f"pool: {pool['Cpus']:g} CPU, {pool['MemoryMiB']} MiB, GPUs {gpus}; "
        f"used: {used['Cpus']:g} CPU, {used['MemoryMiB']} MiB, GPUs {', '.join(used['Gpus']) or 'none'}"
    )
    print(f"GPU discovery: {pool['GpuDiscovery']}")
    for g, why in pool["GpuQuarantined"].items():
        print(f"quarantined GPU {g}: {why} ('hp capacity release-gpu {g}' puts it back)")
    out.table(
        None,
        ["TYPE", "RUNNING", "LIMIT"],
        [[t["InstanceType"], t["Running"], t["Limit"] if t["Limit"] is not None else "-"] for t in doc["Types"]],
    )


COMMANDS = (
    ("scale", scale, NUMBERS_OK),
    ("add-nodes", add_nodes, NUMBERS_OK),
    ("delete-nodes", delete_nodes, None),
    ("events", events, None),
    ("operations", operations, None),
)
GROUPS = (("capacity", capacity_app),)
