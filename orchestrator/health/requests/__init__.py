"""Health-check requests: started, followed and cancelled (service.py, onstart.py), run
by a detached worker (worker.py, runner.py) in check containers (sidecar.py), stage by
stage (connectivity.py, gpu_check.py), decided by pure rules (decisions.py), recorded
in state/health_requests.py."""
