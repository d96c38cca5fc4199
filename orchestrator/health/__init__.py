"""Deep health checks: one module per tool holding the command it runs and the parser
of its output (stress, iperf, mpi, nccl, dcgm), the request engine (engine.py), the
service the CLI and the agent call (service.py, onstart.py). Requests and results are
recorded in orchestrator/state/health_requests.py."""
