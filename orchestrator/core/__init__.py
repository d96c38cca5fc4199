"""The cluster core: what every operation on a cluster stands on.

- context.py: `Env` (the process-wide handles: provider, store, Slurm client factory,
  agents; put together by orchestrator/assembly.py) and `Cluster` (one cluster's
  context), and `parallel`;
- launcher.py: a node's container made, started and registered (its GPUs, its gres.conf
  lines, its lifecycle scripts);
- capacity.py and placement.py: the hosts' pools and which host a new node goes to;
- lifecycle.py: LifeCycleConfig's scripts copied onto a node before it first starts;
- across_hosts.py: what a cluster across registered hosts has (overlay, /home file
  server, placement and host preflight); hostprobe.py: can a Docker host run hp's nodes;
- agents.py: the per-cluster agent processes (start, poke, stop, the creation lock);
  agentlock.py: their lock file, the sign that one is alive.
"""
