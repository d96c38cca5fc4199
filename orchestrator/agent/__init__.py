"""The per-cluster agent: process control (process.py) apart from the daemon loop
(daemon.py, which runs the group reconcilers of cluster/reconciler.py); the on-start check
queue (onstart.py).
The daemon also runs the cluster services' watch and loopback endpoints (metrics, the
REST front), from orchestrator/services."""
