"""The GPU half of hp, as pure modules the core plugs in.

- discovery: what GPUs a Docker host has (nvidia-smi XML / -L, or hp's check
  program inventory), instance types named after them, and the driver files to
  mount when the host has no NVIDIA container toolkit;
- wiring: how a node container gets its GPUs (NVIDIA runtime, CDI, or plain
  device nodes plus read-only driver binds), as plain data for the Docker layer;
- gres: Slurm GRES for a dynamic GPU node (``Gres=`` for ``slurmd -Z --conf``,
  gres.conf lines, ``GresTypes``);
- thresholds: per-model GPU thresholds shipped as data
  (orchestrator/data/gpu-thresholds.yaml);
- host: discovery on a Docker host (two short containers, through the Provider
  only), cached per engine in hp's store.

Nothing here talks to Docker, runs a process or reads a file it was not given,
except thresholds.load_thresholds, which reads the shipped YAML (and an overlay),
and host.py, which runs its probe containers through the Provider.
"""
