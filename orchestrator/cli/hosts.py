"""`hp hosts add|list|remove`: the Docker hosts a cluster may span (docs/multihost.md)."""

from __future__ import annotations

from typing import Optional

import typer

from .common import JsonOpt, env, sub_app
from .output import Out

hosts_app = sub_app(
    "Register the Docker hosts clusters spread over (a Docker swarm joins them). With none, hp uses the local engine."
)


@hosts_app.command("add")
def add(
    name: str = typer.Argument(..., help="A name for the host (used in placement and 'hp nodes')."),
    docker_host: str = typer.Option(
        ..., "--docker-host", help="Its engine: unix:///path, tcp://HOST:2376 (TLS with --tls-dir) or ssh://user@host."
    ),
    cpus: Optional[int] = typer.Option(
        None, "--cpus", help="Capacity override: CPUs hp may use there (default: what the engine reports)."
    ),
    memory_mib: Optional[int] = typer.Option(
        None, "--memory-mib", help="Capacity override: memory (MiB) hp may use there (default: the engine's)."
    ),
    tls_dir: Optional[str] = typer.Option(
        None, "--tls-dir", help="Folder with ca.pem, cert.pem and key.pem for a tcp:// engine with TLS."
    ),
    advertise_addr: Optional[str] = typer.Option(
        None, "--advertise-addr", help="Its address for the swarm (default: the URL's host; else the engine picks)."
    ),
    mtu: Optional[int] = typer.Option(
        None, "--mtu", help="The MTU of its network interface when below 1500 (the overlay's is set 50 below)."
    ),
) -> None:
    """Register a Docker host: reach it, check it, put it in the hosts' swarm."""
    from ..hosts.registry import add as do_add

    out = Out()
    e = env()
    doc = do_add(
        e.store,
        name,
        docker_host,
        cpus=cpus,
        memory_mib=memory_mib,
        tls_dir=tls_dir,
        advertise_addr=advertise_addr,
        mtu=mtu,
        log=out.info,
    )
    out.info(f"host {doc['Name']} added ({doc['Architecture']}, swarm node {doc['SwarmNodeId'][:12]})")


@hosts_app.command("list")
def list_(json_out: bool = JsonOpt) -> None:
    """Registered hosts: engine, size, GPUs, swarm role and state, reachable or not, nodes placed there."""
    from ..hosts.registry import listing

    doc = listing(env().store)
    out = Out(json_out)
    if json_out:
        out.json(doc)
        return
    if not doc["Hosts"]:
        out.info("no host registered: hp uses the local Docker engine (hp hosts add NAME --docker-host URL)")
        return
    out.table(
        f"swarm: {doc['Swarm']['Mode']}",
        ["NAME", "DOCKER HOST", "REACHABLE", "ENGINE", "ARCH", "CPUS", "MEMORY MIB", "GPUS", "SWARM", "NODES"],
        [
            [
                h["Name"],
                h["DockerHost"],
                "yes" if h["Reachable"] else f"no: {h['Error']}",
                h["EngineVersion"] or "",
                h["Architecture"] or "",
                h["Cpus"] if h["Cpus"] is not None else "",
                h["MemoryMiB"] if h["MemoryMiB"] is not None else "",
                h["Gpus"] if h["Gpus"] is not None else "",
                f"{h['SwarmRole'] or '?'}/{h['SwarmState'] or '?'}" + (" draining" if h["Draining"] else ""),
                len(h["Nodes"]),
            ]
            for h in doc["Hosts"]
        ],
    )


@hosts_app.command("remove")
def remove(
    name: str = typer.Argument(...),
    drain: bool = typer.Option(
        False, "--drain", help="Move the nodes it holds to other hosts first (replaced under the same Slurm names)."
    ),
) -> None:
    """Unregister a host (refused while nodes live there, unless --drain; never with a controller there)."""
    from ..hosts.registry import remove as do_remove

    out = Out()
    doc = do_remove(env(), name, drain=drain, log=out.info)
    moved = f", {len(doc['Moved'])} node(s) moved" if doc["Moved"] else ""
    out.info(f"host {name} removed{moved}")


GROUPS = (("hosts", hosts_app),)
