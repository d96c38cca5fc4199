#!/usr/bin/env bash
# Make sure a Docker engine answers, installing and starting one if needed
# (Debian/Ubuntu, as root). Also installs debootstrap, which hp uses to make its
# base image when no registry can be reached.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! have debootstrap && have apt-get; then
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq debootstrap >/dev/null
fi

if docker info >/dev/null 2>&1 || python3 -c 'import docker,sys; docker.from_env().ping()' >/dev/null 2>&1; then
  exit 0
fi
if ! have dockerd; then
  have apt-get || { echo "no Docker engine and no apt-get: install Docker and start it" >&2; exit 1; }
  echo "installing docker.io ..." >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq docker.io >/dev/null
fi
if have systemctl && systemctl is-system-running >/dev/null 2>&1; then
  $SUDO systemctl start docker || true
fi
if ! [ -S /var/run/docker.sock ] || ! curl -s --unix-socket /var/run/docker.sock http://localhost/_ping >/dev/null 2>&1; then
  echo "starting dockerd (log: /tmp/dockerd.log) ..." >&2
  $SUDO setsid dockerd >>/tmp/dockerd.log 2>&1 < /dev/null &
fi
for _ in $(seq 60); do
  if curl -s --unix-socket /var/run/docker.sock http://localhost/_ping 2>/dev/null | grep -q OK; then
    exit 0
  fi
  sleep 0.5
done
echo "dockerd did not come up; last log lines:" >&2
tail -20 /tmp/dockerd.log >&2 || true
exit 1
