"""Everything hp knows about GPUs that needs no cluster: found, given to nodes, counted
by Slurm, checked and watched.

- discovery: what GPUs a Docker host has (nvidia-smi XML / -L, or hp's check
  program inventory), instance types named after them, and the driver files to
  mount when the host has no NVIDIA container toolkit;
- inventory: discovery on a Docker host (two short containers, through the Provider
  only), cached per engine in hp's store;
- wiring: how a node container gets its GPUs (NVIDIA runtime, CDI, or plain
  device nodes plus read-only driver binds), as plain data for the Docker layer;
- gres: Slurm GRES for a dynamic GPU node (``Gres=`` for ``slurmd -Z --conf``,
  gres.conf lines, ``GresTypes``); gresconf: the controller's gres.conf kept in step
  with the cluster's GPU nodes;
- thresholds: per-model GPU thresholds shipped as data
  (orchestrator/data/gpu-thresholds.yaml);
- judge: the verdict on hp's GPU check's JSON (findings, the XID table), with the GPU
  tools it runs: dcgm (`dcgmi diag`) and nccl (nccl-tests' all_reduce_perf);
- monitor: the passive monitor's output turned into new findings and a decision.

Running them on a cluster is done above: the GPU stage of a health check
(health/requests/gpu_check.py) and the agent's monitor thread (agent/gpuwatch.py).
Nothing here talks to Docker, runs a process or reads a file it was not given,
except thresholds.load_thresholds, which reads the shipped YAML (and an overlay),
inventory.py, which runs its probe containers through the Provider, and gresconf.py,
which reads and writes the controller's gres.conf through it.
"""
