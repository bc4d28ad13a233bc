#!/bin/sh
# Creates the Redis Cluster of deploy/compose.yaml from its six nodes (3 masters, one
# replica each), once: when the cluster is already formed it only checks it and exits 0.
# Usage: cluster-init.sh host:port ... (six nodes). redis-cli >= 7.0.5 resolves names.
set -eu
[ "$#" -eq 6 ] || { echo "cluster-init: expected 6 nodes, got $#" >&2; exit 2; }
first=$1
host=${first%:*}
port=${first#*:}

state() { redis-cli -h "$host" -p "$port" cluster info | tr -d '\r' | sed -n 's/^cluster_state://p'; }
known() { redis-cli -h "$host" -p "$port" cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p'; }

if [ "$(known)" = "6" ] && [ "$(state)" = "ok" ]; then
  echo "cluster-init: the cluster is already formed"
else
  echo "cluster-init: creating the cluster from $*"
  redis-cli --cluster create "$@" --cluster-replicas 1 --cluster-yes
fi
i=0
until [ "$(state)" = "ok" ]; do
  i=$((i + 1))
  [ "$i" -le 60 ] || { echo "cluster-init: the cluster did not become ok" >&2; exit 1; }
  sleep 1
done
redis-cli --cluster check "$first"
echo "cluster-init: cluster ok"
