#!/usr/bin/env bash
# Browser surface benchmark (issue 6). Prints:
#  1. wrk on POST /api/host.describe with the token, keep-alive, against `agenthost serve`, beside a bare
#     libwebsockets responder on a libuv loop (bench/browser_bare.c) sending the same bytes: requests/s of
#     each, the ratio (target >= 70 %) and the non-2xx count of each (target 0);
#  2. the daemon's RSS before and after the wrk load;
#  3. bench/browser_fanout.c (built as bench/bench_browser_fanout, also `meson test --benchmark
#     browser-fanout`): 100 WebSocket clients on the mux of one session streaming at fixed rates from the
#     bench-stream fixture provider, p50/p99/max emit→frame latency, a slow client closed 1013 with the
#     others unaffected, and the RSS of its own daemon before, at the peak and after the run.
#
# usage: bench/browser.sh [AGENTHOST] [SECONDS] [BARE]
#   AGENTHOST  the built binary (default: build/host/agenthost); the fan-out client, the bench-stream
#              fixture and the browser module are taken from the same build directory
#   SECONDS    wrk duration per server (default 10)
#   BARE       a built bench/browser_bare (default: compiled here with cc and pkg-config)
# env: AH_BENCH_FANOUT_ARGS extra options for the fan-out client (e.g. "--rates 1000,10000 --seconds 5").
# Needs wrk, curl and Node.js (a free port) (and, without BARE, a C compiler and pkg-config with
# libwebsockets and libuv). Exits 77 (skipped) when a tool is missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${1:-$here/../build/host/agenthost}"
secs="${2:-10}"
bare="${3:-}"
threads="${AH_BENCH_WRK_THREADS:-2}"
conns="${AH_BENCH_WRK_CONNS:-32}"

tools=(wrk node curl)
[[ -n "$bare" ]] || tools+=(cc pkg-config)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "browser bench: $tool not found; skipped" >&2; exit 77; }
done
[[ -x "$bin" ]] || { echo "browser bench: $bin is not an executable (build first)" >&2; exit 1; }

tmp="$(mktemp -d)"
host_pid=""
bare_pid=""
cleanup() {
  [[ -n "$host_pid" ]] && kill "$host_pid" 2>/dev/null && wait "$host_pid" 2>/dev/null || true
  [[ -n "$bare_pid" ]] && kill "$bare_pid" 2>/dev/null && wait "$bare_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

if [[ -z "$bare" ]]; then
  bare="$tmp/browser_bare"
  # shellcheck disable=SC2046
  cc -O2 -o "$bare" "$here/browser_bare.c" $(pkg-config --cflags --libs libwebsockets libuv)
fi

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

# ---- the daemon
mkdir -p "$tmp/state" "$tmp/run"
port="$(free_port)"
"$bin" --state-dir "$tmp/state" --runtime-dir "$tmp/run" --listen "127.0.0.1:$port" --log-level warn serve \
  >"$tmp/host.out" 2>"$tmp/host.err" &
host_pid=$!
for _ in $(seq 100); do
  grep -q '#k=' "$tmp/host.out" 2>/dev/null && break
  sleep 0.1
done
url="$(grep -o 'http://[^ ]*#k=[A-Za-z0-9_-]*' "$tmp/host.out" | head -1)"
[[ -n "$url" ]] || { echo "browser bench: agenthost serve printed no launch URL" >&2; cat "$tmp/host.err" >&2; exit 1; }
token="${url##*#k=}"
envelope='{"kind":"client-request","rpcId":"bench","method":"host.describe","payload":{}}'

curl -s -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $token" -d "$envelope" \
  "http://127.0.0.1:$port/api/host.describe" >"$tmp/describe.json"
grep -q '"server-response"' "$tmp/describe.json" || { echo "browser bench: host.describe failed" >&2; exit 1; }

cat >"$tmp/post.lua" <<EOF
wrk.method = "POST"
wrk.body = '$envelope'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $token"
EOF

rss_start="$(rss_kb "$host_pid")"

# ---- the bare responder, same bytes
bare_port="$(free_port)"
"$bare" "$bare_port" "$tmp/describe.json" 2>"$tmp/bare.err" &
bare_pid=$!
sleep 0.3

run_wrk() { # URL → "RPS NON2XX"
  local out
  out="$(wrk -t"$threads" -c"$conns" -d"${secs}s" -s "$tmp/post.lua" "$1")"
  echo "$out" >>"$tmp/wrk.log"
  local rps non
  rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
  non="$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")"
  echo "${rps:-0} ${non:-0}"
}

echo "browser bench: wrk -t$threads -c$conns -d${secs}s, POST host.describe ($(wc -c <"$tmp/describe.json") bytes answered)"
read -r bare_rps bare_non < <(run_wrk "http://127.0.0.1:$bare_port/api/host.describe")
read -r host_rps host_non < <(run_wrk "http://127.0.0.1:$port/api/host.describe")
ratio="$(awk -v a="$host_rps" -v b="$bare_rps" 'BEGIN { printf "%.1f", (b > 0 ? 100 * a / b : 0) }')"
printf '  bare libwebsockets responder  %10.0f req/s  non-2xx %s\n' "$bare_rps" "$bare_non"
printf '  agenthost (fence+token+call)  %10.0f req/s  non-2xx %s\n' "$host_rps" "$host_non"
printf '  ratio %s %% (target >= 70 %%)\n' "$ratio"
# The same pipeline with a cheap handler separates the carrier's cost from host.describe's own work.
sed -e 's/host\.describe/request.list/' "$tmp/post.lua" >"$tmp/post-list.lua"
list_out="$(wrk -t"$threads" -c"$conns" -d"${secs}s" -s "$tmp/post-list.lua" "http://127.0.0.1:$port/api/request.list")"
list_rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$list_out")"
list_non="$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$list_out")"
printf '  agenthost POST request.list   %10.0f req/s  non-2xx %s  (%s %% of the bare responder)\n' "$list_rps" "${list_non:-0}" \
  "$(awk -v a="$list_rps" -v b="$bare_rps" 'BEGIN { printf "%.1f", (b > 0 ? 100 * a / b : 0) }')"
kill "$bare_pid" 2>/dev/null && wait "$bare_pid" 2>/dev/null || true
bare_pid=""
rss_http="$(rss_kb "$host_pid")"

sleep "${AH_BENCH_SETTLE:-3}"
rss_end="$(rss_kb "$host_pid")"
echo "browser bench: daemon RSS start ${rss_start} KiB, after wrk ${rss_http} KiB, settled ${rss_end} KiB ($((rss_end - rss_start)) KiB over the start)"
kill "$host_pid" 2>/dev/null && wait "$host_pid" 2>/dev/null || true
host_pid=""

# ---- WebSocket fan-out on one session (the C client starts its own daemon with the bench-stream provider)
build="$(cd "$(dirname "$bin")/.." && pwd)"
fanout="$build/bench/bench_browser_fanout"
if [[ -x "$fanout" && -f "$build/tests/plugins/bench-stream.so" && -f "$build/plugins/browser/browser.so" ]]; then
  # shellcheck disable=SC2086
  "$fanout" "$bin" "$build/tests/plugins/bench-stream.so" "$build/plugins/browser/browser.so" \
    ${AH_BENCH_FANOUT_ARGS:-} || echo "browser bench: the WebSocket fan-out part failed" >&2
else
  echo "browser bench: WebSocket fan-out skipped: $fanout, the bench-stream fixture or the browser module is not built" >&2
fi
