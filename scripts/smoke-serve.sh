#!/usr/bin/env bash
# Start `agenthost serve` from the given binary in a throw-away state and runtime directory, check that it
# answers on its admin socket, stop it with SIGTERM and require a clean exit (status 0, loop closed).
# Used by `make minimal` to show that a build with every plugin disabled still serves.
set -euo pipefail
bin=${1:?usage: smoke-serve.sh PATH-TO-agenthost}
dir=$(mktemp -d)
trap 'kill -KILL "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
"$bin" --state-dir "$dir/state" --runtime-dir "$dir/run" --plugin-dir "$dir/no-plugins" serve \
  2>"$dir/log" &
pid=$!
for _ in $(seq 1 100); do
  [ -S "$dir/run/admin.sock" ] && break
  sleep 0.05
done
"$bin" --state-dir "$dir/state" --runtime-dir "$dir/run" plugins list | tee "$dir/list"
grep -q '^core ' "$dir/list"
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
if [ "$status" -ne 0 ] || ! grep -q ' host: stopped$' "$dir/log"; then
  echo "smoke-serve: serve did not stop cleanly (status $status)" >&2
  cat "$dir/log" >&2
  exit 1
fi
echo "smoke-serve: serve ran with no plugins and stopped cleanly"
