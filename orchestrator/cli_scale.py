"""CLI: scaling, events and capacity (continuous provisioning)."""
from __future__ import annotations

import time
from typing import Any, List, Optional

import typer

from .errors import BadInput, WaitTimeout
from .output import Out

JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")


def _env() -> Any:
    from .cluster import Env

    return Env()


def wait_groups(env: Any, name: str, groups: list[str], timeout: float, out: Out) -> dict[str, Any]:
    """Show per-group progress (current/target, pending, retries) until the groups reach their targets."""
    from .ops import describe

    deadline = time.monotonic() + timeout
    last = None
    while True:
        doc = describe(env, name)
        gs = [g for g in doc["InstanceGroups"] if g["InstanceGroupName"] in groups]
        line = "  ".join(f"{g['InstanceGroupName']} {g['CurrentCount']}/{g['TargetCount']}"
                         + (f" ({g['PendingCount']} pending)" if g["PendingCount"] else "") for g in gs)
        if line != last:
            out.info(line)
            last = line
        if all(g["CurrentCount"] == g["TargetCount"] and not g["PendingCount"] and not g["ActiveOperations"] for g in gs):
            return doc
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s: {line}")
        time.sleep(0.5)


def register(app: typer.Typer) -> None:
    capacity_app = typer.Typer(help="Show and limit the capacity instance types draw from.", no_args_is_help=True)
    app.add_typer(capacity_app, name="capacity")

    def _scale(name: str, group: str, count: int, add: bool, wait: bool, timeout: float, json_out: bool) -> None:
        from .scaling import scale as do_scale

        if wait and timeout <= 0:
            raise BadInput(f"--timeout must be positive, got {timeout:g}")
        env = _env()
        out = Out(json_out)
        doc = do_scale(env, name, group, count, add=add)
        if wait:
            wait_groups(env, name, [group], timeout, out)
        if json_out:
            out.json(doc)
        else:
            out.info(f"{name}/{group}: target {doc['PreviousCount']} -> {doc['TargetCount']}")

    @app.command()
    def scale(name: str, group: str, count: int = typer.Argument(..., help="New target count."),
              wait: bool = typer.Option(False, "--wait/--no-wait", help="Wait until the group reaches its target."),
              timeout: float = typer.Option(600, "--timeout"), json_out: bool = JsonOpt) -> None:
        """Set an instance group's target count. Returns at once; the cluster's agent does the work."""
        _scale(name, group, count, False, wait, timeout, json_out)

    @app.command("add-nodes")
    def add_nodes(name: str, group: str, count: int = typer.Argument(..., help="Nodes to add."),
                  wait: bool = typer.Option(False, "--wait/--no-wait", help="Wait until the group reaches its target."),
                  timeout: float = typer.Option(600, "--timeout"), json_out: bool = JsonOpt) -> None:
        """Add nodes to an instance group. Returns at once."""
        _scale(name, group, count, True, wait, timeout, json_out)

    @app.command("delete-nodes")
    def delete_nodes(name: str, nodes: List[str] = typer.Argument(..., help="Slurm node names or node ids."),
                     json_out: bool = JsonOpt) -> None:
        """Remove chosen nodes (drained first; running jobs end first). Returns at once."""
        from .scaling import delete_nodes as do_delete

        doc = do_delete(_env(), name, nodes)
        out = Out(json_out)
        if json_out:
            out.json(doc)
        else:
            out.info(f"removing {', '.join(doc['NodesToDelete'])}")

    @app.command()
    def events(name: str, follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events."),
               json_out: bool = JsonOpt) -> None:
        """The cluster's events (HyperPod shape), oldest first."""
        from .errors import NotFound

        env = _env()
        out = Out(json_out)
        if env.store.cluster(name) is None and not env.store.events(name, limit=1):
            raise NotFound(f"cluster {name!r} does not exist")
        if follow:
            from .agent import ensure_agent

            ensure_agent(env, name)
            for e in env.store.follow_events(name, poll=0.5):
                if json_out:
                    import json
                    import sys

                    sys.stdout.write(json.dumps(e.as_dict()) + "\n")
                    sys.stdout.flush()
                else:
                    print(_event_line(e.as_dict()), flush=True)
            return
        evs = [e.as_dict() for e in env.store.events(name)]
        if json_out:
            out.json({"ClusterName": name, "Events": evs})
        else:
            for e in evs:
                print(_event_line(e))

    @capacity_app.command("set")
    def capacity_set(instance_type: str, count: Optional[int] = typer.Argument(None, help="Max nodes of this type on the host; omit with --clear."),
                     clear: bool = typer.Option(False, "--clear", help="Remove the limit.")) -> None:
        """Limit how many nodes of an instance type may run on this host (all clusters)."""
        from . import capacity
        from .agent import ensure_agent, poke

        env = _env()
        problems = []
        if instance_type not in env.catalogue:
            problems.append(f"unknown instance type {instance_type!r} (known: {', '.join(sorted(env.catalogue))})")
        if clear == (count is not None):
            problems.append("give either a COUNT or --clear")
        if count is not None and count < 0:
            problems.append(f"COUNT must be >= 0, got {count}")
        if problems:
            raise BadInput(problems, "cannot set capacity")
        capacity.set_limit(env.store, instance_type, None if clear else count)
        for row in env.store.clusters():  # waiting clusters retry now
            ensure_agent(env, row.name)
            poke(env, row.name)
        Out().info(f"{instance_type}: " + ("no limit" if clear else f"at most {count} node(s)"))

    @capacity_app.command("show")
    def capacity_show(json_out: bool = JsonOpt) -> None:
        """The host's pool, what hp's nodes use of it, and per-type limits."""
        from . import capacity

        env = _env()
        env.provider.ping()
        pool = capacity.host_pool(env.provider)
        used = capacity.usage(env.provider.containers(), env.catalogue)
        lim = capacity.limits(env.store)
        doc = {"Pool": {"Cpus": pool.cpus, "MemoryMiB": pool.memory_mib, "Gpus": pool.gpus},
               "Used": {"Cpus": round(used.cpus, 3), "MemoryMiB": used.memory_mib, "Gpus": sorted(used.gpus)},
               "Types": [{"InstanceType": t, "Running": used.per_type.get(t, 0), "Limit": lim.get(t)}
                         for t in sorted(env.catalogue)]}
        out = Out(json_out)
        if json_out:
            out.json(doc)
        else:
            print(f"pool: {pool.cpus:g} CPU, {pool.memory_mib} MiB, GPUs {pool.gpus or 'none'}; "
                  f"used: {used.cpus:g} CPU, {used.memory_mib} MiB")
            out.table(None, ["TYPE", "RUNNING", "LIMIT"], [[t["InstanceType"], t["Running"], t["Limit"] if t["Limit"] is not None else "-"]
                                                           for t in doc["Types"]])


def _event_line(e: dict[str, Any]) -> str:
    where = e["InstanceGroupName"] or ""
    if e.get("SlurmNodeName"):
        where += f"/{e['SlurmNodeName']}"
    return f"{e['EventTime']}  {e['EventLevel']:<5} {e['ResourceType']:<13} {where:<20} {e['Description']}"
