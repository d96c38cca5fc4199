"""`hp api`, `hp token`, `hp metrics`: the cluster services' endpoints (docs/accounting.md)."""

from __future__ import annotations

import typer

from ..errors import BadInput
from .common import JsonOpt, env
from .output import Out


def _rest_cluster(name: str):  # -> Cluster
    e = env()
    cluster = e.cluster(name)
    if not cluster.spec.rest:
        raise BadInput(
            f"cluster {name!r} has no REST API (its spec has Rest.Enabled false); create a cluster with "
            "'Rest: {Enabled: true}' in its spec, or 'hp create --rest'",
            "no REST API",
        )
    return e, cluster


def api(name: str, json_out: bool = JsonOpt) -> None:
    """Print the URL of the cluster's REST API (slurmrestd behind hp's token check, on 127.0.0.1).

    Requests carry X-SLURM-USER-NAME and X-SLURM-USER-TOKEN (from 'hp token NAME').
    Example: curl -H "X-SLURM-USER-TOKEN: $(hp token lab)" "$(hp api lab)/slurm/v0.0.42/ping"
    (--json: ApiVersion, the newest version the cluster's Slurm release serves).
    """
    from ..releases import RELEASES
    from ..services.ports import wait_url

    e, cluster = _rest_cluster(name)
    e.agents.ensure(name)  # the agent serves the front
    url = wait_url(e.store, name, "rest")
    out = Out(json_out)
    if json_out:
        out.json({"ClusterName": name, "Url": url, "ApiVersion": RELEASES[cluster.spec.release].rest_api})
    else:
        print(url)


def token(
    name: str,
    lifespan: int = typer.Option(1800, "--lifespan", help="Seconds the token is valid (default 1800)."),
    json_out: bool = JsonOpt,
) -> None:
    """Print a JWT for the default user (hpuser) for the cluster's REST API (scontrol token)."""
    from ..naming import DEFAULT_USER

    if lifespan <= 0:
        raise BadInput(f"--lifespan must be a positive number of seconds, got {lifespan}")
    _, cluster = _rest_cluster(name)
    tok = cluster.slurm.token(DEFAULT_USER, lifespan)
    out = Out(json_out)
    if json_out:
        out.json({"ClusterName": name, "User": DEFAULT_USER, "Lifespan": lifespan, "Token": tok})
    else:
        print(tok)


def metrics(name: str, json_out: bool = JsonOpt) -> None:
    """Print the URL of the cluster's Prometheus metrics (served by its agent on 127.0.0.1)."""
    from ..services.ports import wait_url

    e = env()
    e.cluster(name)
    e.agents.ensure(name)
    url = wait_url(e.store, name, "metrics")
    out = Out(json_out)
    if json_out:
        out.json({"ClusterName": name, "Url": url})
    else:
        print(url)


COMMANDS = (("api", api), ("token", token), ("metrics", metrics))
