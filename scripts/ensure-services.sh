#!/usr/bin/env bash
# Make sure the Redis and MariaDB *binaries* that the test harness (tests/services.py) needs
# are installed. The harness runs its own throw-away servers on ephemeral loopback ports, so
# this script never starts, stops or reconfigures the machine's system services: a system
# Redis on 6379 or MariaDB on 3306 may be running and is left alone. Quick and idempotent
# when everything is present; installs with apt-get only when run as root.
set -euo pipefail

PACKAGES=(redis-server mariadb-server)
# Each entry: alternative names of one required binary (the first found wins).
REQUIRED=("redis-server" "redis-cli" "mariadbd mysqld" "mariadb-install-db mysql_install_db"
          "mariadb mysql")
# mariadbd lives in /usr/sbin, which non-root PATHs often lack; tests/services.py looks
# there too. ENSURE_SERVICES_PATH / _POLICY override the search path and the policy-rc.d
# location; they exist to test this script without touching the machine.
SEARCH_PATH="${ENSURE_SERVICES_PATH:-$PATH:/usr/sbin:/usr/local/sbin:/sbin}"
POLICY="${ENSURE_SERVICES_POLICY:-/usr/sbin/policy-rc.d}"
POLICY_BACKUP=""

# find_any NAME... : print the path of the first NAME found on SEARCH_PATH.
find_any() {
  local name dir
  local IFS=:
  for name in "$@"; do
    for dir in $SEARCH_PATH; do
      if [[ -n $dir && -f $dir/$name && -x $dir/$name ]]; then
        echo "$dir/$name"
        return 0
      fi
    done
  done
  return 1
}

# missing_binaries : print one line per required binary that is not found.
missing_binaries() {
  local names
  for names in "${REQUIRED[@]}"; do
    # shellcheck disable=SC2086  # split the alternatives on purpose
    find_any $names >/dev/null || echo "${names// / or }"
  done
}

# While apt-get runs, a policy-rc.d answering 101 ("action forbidden") keeps the packages'
# maintainer scripts from starting the system redis-server / mariadb services (invoke-rc.d
# and deb-systemd-invoke honour it). Any existing policy file is restored afterwards.
forbid_service_starts() {
  if [[ -e $POLICY ]]; then
    POLICY_BACKUP=$(mktemp "$POLICY.ensure-services.XXXXXX")
    cp -p "$POLICY" "$POLICY_BACKUP"
  fi
  trap restore_policy EXIT
  printf '#!/bin/sh\n# written by ensure-services.sh while installing packages\nexit 101\n' \
    >"$POLICY"
  chmod 755 "$POLICY"
}

restore_policy() {
  if [[ -n $POLICY_BACKUP ]]; then
    mv -f "$POLICY_BACKUP" "$POLICY"
  else
    rm -f "$POLICY"
  fi
}

install_packages() {
  forbid_service_starts
  export DEBIAN_FRONTEND=noninteractive
  # Try the cached package lists first: an update is slow and often unnecessary.
  if ! apt-get install -y "${PACKAGES[@]}"; then
    echo "ensure-services: install failed; running apt-get update and retrying" >&2
    apt-get update
    apt-get install -y "${PACKAGES[@]}"
  fi
}

# report WHAT : print WHAT and the missing binaries (from $missing) as a comma-separated list.
report() {
  local joined
  joined=$(printf '%s, ' "${missing[@]}")
  echo "ensure-services: $1: ${joined%, }" >&2
}

mapfile -t missing < <(missing_binaries)
if ((${#missing[@]} == 0)); then
  echo "ensure-services: redis-server, redis-cli, mariadbd, mariadb-install-db, mariadb present"
  exit 0
fi

report missing
if [[ $(id -u) -ne 0 ]]; then
  echo "ensure-services: not root; please install: sudo apt-get install -y ${PACKAGES[*]}" >&2
  echo "  (only the binaries are used; the system services need not run)" >&2
  exit 1
fi

install_packages
mapfile -t missing < <(missing_binaries)
if ((${#missing[@]} != 0)); then
  report "still missing after install"
  exit 1
fi
echo "ensure-services: installed ${PACKAGES[*]}"
