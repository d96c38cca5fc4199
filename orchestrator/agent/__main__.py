"""python -m orchestrator.agent NAME: the cluster's agent (see daemon.py). It takes the
cluster's lock first, before it loads the agent's modules (0.3-0.5 s): from then on it
is alive for everyone who looks (core/agentlock.py), so an `hp exec` just after `hp
create` finds it and goes the quick way, and no second agent is started meanwhile."""

import signal
import sys

from ..core.agentlock import take
from ..state.home import home_dir


def run() -> int:
    # A poke (SIGUSR1, after a spec change) may come as soon as the pid file is written,
    # before daemon.main sets its handler: SIGUSR1's default would end the agent (CI: `hp
    # scale` just after `hp create`, no agent, no scale-up). Ignored until then: the
    # agent's first pass reads the store after, so the change is not missed.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    held = take(home_dir(), sys.argv[1])
    if held is None:
        return 0  # another agent holds this cluster
    from .daemon import main  # the agent itself, once the lock is held

    return main()


sys.exit(run())
