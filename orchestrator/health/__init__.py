"""Deep health checks, in two rooms:

- tools/: the CPU and network tools, each module holding the command it runs and the
  parser and verdict of its output (stress.py: stress-ng; iperf.py: iperf3; mpi.py: hp's
  MPI allreduce), what a node's type promises (limits.py) and the options' rules
  (options.py). The GPU tools (hp's GPU check, DCGM, nccl-tests) and their verdicts are
  in orchestrator/gpu/; the Verdict they all return is orchestrator/verdict.py;
- requests/: the request machinery: the service the CLI and on-start call (service.py,
  onstart.py), the detached worker process (worker.py), the run of one request
  (runner.py: isolate, check, then resume, recover or keep drained), its stages
  (connectivity.py, gpu_check.py) in check containers (sidecar.py), the pure decisions
  (decisions.py). Requests and results are recorded in orchestrator/state/health_requests.py.
"""
