"""hp's own state, and the only code that touches SQLite: the store (store.py), where the
state lives and the two facts the quick `hp exec` reads of it (home.py), the node
state machine and its gate (phases.py), the cluster status and health-check request
state machines (transitions.py; their statuses' names: statuses.py), the health checks' requests and results
(health_requests.py), and status derived from Docker, Slurm and the history (status.py)."""
