"""python -m orchestrator.agent NAME: the cluster's agent (see daemon.py). It takes the
cluster's lock first, before it loads the agent's modules (0.3-0.5 s): from then on it
is alive for everyone who looks (core/agentlock.py), so an `hp exec` just after `hp
create` finds it and goes the quick way, and no second agent is started meanwhile."""

import sys

from ..core.agentlock import take
from ..state.home import home_dir


def run() -> int:
    held = take(home_dir(), sys.argv[1])
    if held is None:
        return 0  # another agent holds this cluster
    from .daemon import main  # the agent itself, once the lock is held

    return main()


sys.exit(run())
