#!/bin/sh
# Entrypoint of the gateway image: `gateway serve` with the listen address and the
# number of worker processes from the environment. exec, so that the gateway is PID 1
# and gets SIGTERM (drain) directly. Extra arguments go to `gateway serve`.
set -eu
exec gateway serve \
  --config "${GATEWAY_CONFIG:-/etc/gateway/config.toml}" \
  --host "${GATEWAY_HOST:-0.0.0.0}" \
  --port "${GATEWAY_PORT:-8080}" \
  --workers "${GATEWAY_WORKERS:-1}" \
  "$@"
