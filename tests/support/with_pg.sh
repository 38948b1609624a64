#!/usr/bin/env bash
# Run a command beside a PostgreSQL 15 cluster of its own, then stop the cluster.
#
#   tests/support/with_pg.sh COMMAND [ARGS...]
#
# The cluster is made with initdb in a new temporary directory, owned by an unprivileged user (initdb and
# postgres refuse to run as root: as root the cluster runs as the `postgres` user that Debian's package
# creates), listens on 127.0.0.1 on a free port (and on a socket in its own directory), and requires a
# password (scram-sha-256) for its superuser `agenthost`. The command sees:
#   AH_TEST_PG           a libpq connection string without the database and without the password
#   AH_TEST_PG_URL       the same with an empty database of its own, "agenthost"
#   AH_TEST_PG_PASSWORD  the password (a fresh random one)
#   AH_TEST_PG_BIN       the directory of the server's programs (pg_ctl, psql)
#   AH_TEST_PG_DATA      the cluster's directory
# Without PostgreSQL 15's server programs it says so and fails (exit 1): a suite that needs them is never
# skipped silently. The cluster is stopped and removed however the command ends; the command's exit status
# is this script's.
set -euo pipefail

bin=""
for d in /usr/lib/postgresql/15/bin "$(command -v pg_config >/dev/null 2>&1 && pg_config --bindir || true)"; do
  if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
    bin=$d
    break
  fi
done
if [[ -z "$bin" ]]; then
  echo "with_pg.sh: PostgreSQL 15's server programs (initdb, pg_ctl) are not installed: install postgresql-15 (scripts/deps.sh does)" >&2
  exit 1
fi

run_as=()
if [[ $(id -u) == 0 ]]; then
  if ! id postgres >/dev/null 2>&1; then
    echo "with_pg.sh: running as root, and there is no 'postgres' user to run the cluster as" >&2
    exit 1
  fi
  run_as=(runuser -u postgres --)
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/ah-pg.XXXXXX")
chmod 755 "$dir"
data="$dir/data"
pwfile="$dir/pw"
password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
printf '%s\n' "$password" >"$pwfile"
if [[ ${#run_as[@]} -gt 0 ]]; then chown -R postgres "$dir"; fi
chmod 600 "$pwfile"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')

cleanup() {
  "${run_as[@]}" "$bin/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

"${run_as[@]}" "$bin/initdb" -D "$data" -U agenthost --pwfile="$pwfile" --auth=scram-sha-256 \
  -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
rm -f "$pwfile"
cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 200
fsync = on
log_min_messages = warning
CONF
"${run_as[@]}" "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 60 start >/dev/null || {
  cat "$dir/server.log" >&2
  exit 1
}

"${run_as[@]}" env PGPASSWORD="$password" "$bin/psql" -q -h 127.0.0.1 -p "$port" -U agenthost -d postgres \
  -c "CREATE DATABASE agenthost" >/dev/null

export AH_TEST_PG="host=127.0.0.1 port=$port user=agenthost"
export AH_TEST_PG_URL="$AH_TEST_PG dbname=agenthost"
export AH_TEST_PG_PASSWORD="$password"
export AH_TEST_PG_BIN="$bin"
export AH_TEST_PG_DATA="$data"
set +e
"$@"
status=$?
set -e
exit $status
