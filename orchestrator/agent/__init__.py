"""The per-cluster agent: the daemon loop (daemon.py, which runs the group reconcilers of
cluster/reconciler.py; its process control is core/agents.py); the on-start check queue
(onstart_queue.py); passive GPU monitoring (gpuwatch.py). The daemon also runs the
recovery watcher, the host watcher, the cluster services' watch and loopback endpoints
(metrics, the REST front)."""
