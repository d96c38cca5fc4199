"""The program's assembly, in one place: the parts hp runs with, put together into an Env
once per process.

- the container provider: the local Docker engine, or with registered hosts (`hp hosts
  add`) a MultiHostProvider over their engines (hosts/engines.provider_for);
- the Slurm client: SlurmCli, Slurm's commands run in the controller's container;
- the store: hp's SQLite state under HP_HOME (state/store.py);
- the agents: one background process per cluster (core/agents.py).

Every process's entry uses it: the CLI (cli/common.py), the agent (agent/daemon.py) and
the health worker (health/requests/worker.py). Unit tests build their Env from fakes.
"""

from __future__ import annotations

from .core.agents import AgentProcesses
from .core.context import Env
from .hosts.engines import provider_for
from .slurm.client import SlurmCli
from .state.store import Store


def env(store: Store | None = None) -> Env:
    """hp's Env on `store` (default: the one under HP_HOME)."""
    store = Store() if store is None else store
    return Env(provider=provider_for(store), store=store, slurm_factory=SlurmCli, agents=AgentProcesses(store))
