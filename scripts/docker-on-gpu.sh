#!/usr/bin/env bash
# Try the docker backend on a GPU host that has no Docker and no registry: unpack Debian's
# docker binaries (carried in .dock/docker.tar.xz), start a private dockerd, make a base
# image from the host's own python3 and C library, then run part of the reference matrix
# in containers with the GPU's device nodes and driver libraries passed in.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
D=/tmp/cumatrix-docker; mkdir -p "$D"
tar xJf .dock/docker.tar.xz -C "$D" || exit 1
ln -sf tini-static "$D/usr/bin/docker-init"
export PATH=$D/usr/bin:$D/usr/sbin:$PATH DOCKER_HOST=unix:///tmp/cumatrix-docker.sock
# Libraries dockerd links that the GPU host may lack (Debian's libdevmapper), carried beside it.
dlib=$PWD/.dock/lib
(LD_LIBRARY_PATH=$dlib setsid dockerd --iptables=false --bridge=none --data-root /tmp/cumatrix-docker-data -H "$DOCKER_HOST" \
   --pidfile /tmp/cumatrix-dockerd.pid >"$OUT/dockerd.log" 2>&1 &)
for _ in $(seq 1 40); do docker info >/dev/null 2>&1 && break; sleep 1; done
docker info >"$OUT/docker-info.txt" 2>&1 || { echo "dockerd did not start"; tail -30 "$OUT/dockerd.log"; exit 1; }
echo "dockerd $(docker version --format '{{.Server.Version}}') is up"
time (tar -C / -cf - --exclude='usr/lib/x86_64-linux-gnu/libcuda*' --exclude='usr/lib/x86_64-linux-gnu/libnvidia*' \
   etc usr/bin usr/sbin usr/lib/python3.12 usr/lib/x86_64-linux-gnu usr/lib64 bin sbin lib lib64 2>/dev/null \
   | timeout 180 docker import - cumatrix-hostroot:1 >/dev/null) || exit 1
docker run --rm --init --network none cumatrix-hostroot:1 python3 -c "print('python3 runs in a container')"
devs=$(for d in /dev/nvidia*; do [ -c "$d" ] && printf -- '--device %s ' "$d"; done)
echo "device nodes: $devs"
docker run --rm --init --network none $devs cumatrix-hostroot:1 sh -c 'ls /dev | grep nvidia'
python3 -m cumatrix doctor
python3 -m cumatrix run examples/h200-reference.yaml --backend docker --base-image cumatrix-hostroot:1 \
  --wheel-dir .wheels --out "$OUT/gpu-h200-docker" -q -k "(cu12.9 or cu13.0 or none) and (probe or d2h)"
