#!/usr/bin/env bash
# Remote over the browser carrier (issue 7): wrk on POST /api/remote.invoke (types.echo_int through the
# remote plugin and libffi) against POST /api/ok.add (a plain method of the `ok` fixture), same daemon, same
# token, keep-alive, alternating runs; prints each run, the medians and the ratio (target: the libffi path at
# most 10 % slower).
#
# usage: bench/remote_http.sh AGENTHOST FIXTURE_DIR [SECONDS] [RUNS]
# Needs wrk and curl; exits 77 (skipped) without them.
set -euo pipefail

bin="$1"
fixtures="$2"
secs="${3:-3}"
runs="${4:-7}"
for tool in wrk curl; do
  command -v "$tool" >/dev/null || { echo "remote http bench: $tool not found; skipped" >&2; exit 77; }
done

tmp="$(mktemp -d)"
pid=""
cleanup() {
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
mkdir -p "$tmp/state" "$tmp/run"
"$bin" --state-dir "$tmp/state" --runtime-dir "$tmp/run" --listen "127.0.0.1:$port" --log-level warn serve \
  >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 100); do
  grep -q '#k=' "$tmp/out" 2>/dev/null && break
  sleep 0.1
done
token="$(sed -n 's/.*#k=//p' "$tmp/out")"
[[ -n "$token" ]] || { echo "remote http bench: the daemon printed no launch URL" >&2; cat "$tmp/err" >&2; exit 1; }
for f in ok remote-types; do
  "$bin" --state-dir "$tmp/state" --runtime-dir "$tmp/run" plugins load "$fixtures/$f.so" >/dev/null
done

write_lua() { # NAME METHOD PAYLOAD
  cat >"$tmp/$1.lua" <<EOF
wrk.method = "POST"
wrk.body = '{"kind":"client-request","rpcId":"1","method":"$2","payload":$3}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $token"
EOF
}
write_lua plain ok.add '{"a":3,"b":4}'
write_lua remote remote.invoke '{"namespace":"types","method":"echo_int","args":{"i":7}}'

check() { # METHOD PAYLOAD WANT
  local got
  got="$(curl -s -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $token" \
    --data "{\"kind\":\"client-request\",\"rpcId\":\"1\",\"method\":\"$1\",\"payload\":$2}" \
    "http://127.0.0.1:$port/api/$1")"
  [[ "$got" == *"$3"* ]] || { echo "remote http bench: $1 answered $got" >&2; exit 1; }
}
check ok.add '{"a":3,"b":4}' '"value":{"sum":7}'
check remote.invoke '{"namespace":"types","method":"echo_int","args":{"i":7}}' '"value":7'

run() { # NAME METHOD → "req/s non2xx"
  local out
  out="$(wrk -t2 -c32 -d"${secs}s" -s "$tmp/$1.lua" "http://127.0.0.1:$port/api/$2" 2>&1)"
  echo "$(awk '/Requests\/sec/ {print $2}' <<<"$out") $(awk '/Non-2xx/ {print $NF}' <<<"$out")"
}
plain=()
remote=()
bad=0
echo "remote over the browser carrier: wrk -t2 -c32, ${runs} alternating runs of ${secs} s"
for i in $(seq "$runs"); do
  read -r p pbad <<<"$(run plain ok.add)"
  read -r r rbad <<<"$(run remote remote.invoke)"
  plain+=("$p")
  remote+=("$r")
  bad=$((bad + ${pbad:-0} + ${rbad:-0}))
  printf '  run %d: plain ok.add %8.0f req/s   remote.invoke %8.0f req/s\n' "$i" "$p" "$r"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
pm="$(median "${plain[@]}")"
rm_="$(median "${remote[@]}")"
awk -v p="$pm" -v r="$rm_" -v bad="$bad" 'BEGIN {
  printf "  median: plain %.0f req/s, remote.invoke %.0f req/s\n", p, r;
  printf "  remote / plain: %.3f (libffi path %.1f %% slower; target <= 10 %%); non-2xx %d\n", r / p, (1 - r / p) * 100, bad }'
