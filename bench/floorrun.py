"""The plain-docker floor's own process (bench/common.py `floor` starts it): docker-py and
the standard library only, no import of hp's. It reads the job that `floor` prepared (its
network, each container's docker-py create keywords and files, the workers to wait for)
from the JSON file named on its command line, then does what hp create does in the
fastest order found: the network; every container created on a thread, the controller
first, each started as soon as its files are in (the image's entry starts slurmd once
slurmctld listens); `scontrol show nodes --json` in the controller every 0.05 s until
that many nodes are idle. It prints one JSON line: the seconds from its first Docker call
to that state (what a floor inside an already-running Python measures) and the ids made.

Timed by `floor` from its spawn to its exit, as `hp create --wait` is: each pays Python's
start and docker-py's import (about 0.1 s of CPU here), which any program using
plain docker-py pays.
"""

import base64
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import docker


def main() -> None:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    api = docker.APIClient(base_url=job["base_url"], version=job["api_version"])
    t0 = time.monotonic()
    api.create_network(job["network"], driver="bridge", labels=job["network_labels"])
    ids: list[str] = []
    not_usable = set(job["not_usable"])  # hp's rule (SlurmNode.usable), handed over as data

    def started(c: dict) -> str:
        cid = api.create_container(c["image"], **c["args"])["Id"]
        ids.append(cid)
        api.put_archive(cid, "/", base64.b64decode(c["tar"]))
        api.start(cid)
        return cid

    with ThreadPoolExecutor(32) as ex:
        ctl = ex.submit(started, job["containers"][0])
        list(ex.map(started, job["containers"][1:]))
        ctl_id = ctl.result()
    while True:
        ex_id = api.exec_create(ctl_id, ["scontrol", "show", "nodes", "--json"])["Id"]
        out = api.exec_start(ex_id)
        if api.exec_inspect(ex_id)["ExitCode"] == 0:
            states = [n.get("state") or ["UNKNOWN"] for n in json.loads(out).get("nodes", [])]
            usable = sum(1 for s in states if s[0] == job["idle"] and not not_usable & set(s[1:]))
            if usable >= job["want"]:
                break
        time.sleep(0.05)
    print(json.dumps({"docker_s": time.monotonic() - t0, "ids": ids}), flush=True)


if __name__ == "__main__":
    main()
