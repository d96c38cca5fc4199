"""hp's own state: the SQLite store (store.py), the node state machine and its gate
(phases.py), and status derived from Docker, Slurm and the history (status.py)."""
