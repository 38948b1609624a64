#!/usr/bin/env bash
# The Debian packages as a user gets them (debian/, make deb): built in a clean copy, installed one at a
# time with apt from the .deb files, used, removed. Needs root (apt installs into the system); as anyone
# else it is skipped (status 77), and so it is when one of these packages is already installed (the
# machine's own). Every package it installed is purged again when it ends, whatever happened.
#
#   test_deb.sh SOURCE_ROOT WORK_DIR
#
# Prints one line per check and closes with "N passed, N failed".
set -uo pipefail
root=${1:?usage: test_deb.sh SOURCE_ROOT WORK_DIR}
work=${2:?usage: test_deb.sh SOURCE_ROOT WORK_DIR}

if [ "$(id -u)" != 0 ]; then
  echo "test_deb: needs root (apt installs the packages into the system): skipped"
  exit 77
fi

export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8
deb="$work/deb"
tmp="$work/tmp"
passed=0
failed=0
log=$(mktemp)

# Every package debian/control builds, binary and arch-independent.
mapfile -t packages < <(sed -n 's/^Package: *//p' "$root/debian/control")

ours_installed() {
  dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null |
    awk '$NF == "installed" || $NF == "half-installed" || $NF == "unpacked" {print $1}'
}
purge_ours() {
  local installed
  mapfile -t installed < <(ours_installed)
  if [ "${#installed[@]}" -gt 0 ]; then
    apt-get purge -y -q "${installed[@]}" >/dev/null 2>&1 || dpkg --purge "${installed[@]}" >/dev/null 2>&1
  fi
}
# The daemon a failed check left running is killed before the next one starts, and at the end.
daemon_pid=
serve_kill() {
  if [ -n "$daemon_pid" ]; then
    kill -KILL "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
    daemon_pid=
  fi
}
cleanup() {
  serve_kill
  purge_ours
  rm -f "$log"
}
trap cleanup EXIT

# check NAME COMMAND...: one check; its output is shown when it fails.
check() {
  local name=$1
  shift
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    echo "ok - $name"
  else
    failed=$((failed + 1))
    echo "FAIL - $name"
    sed 's/^/    /' "$log" | tail -40
  fi
}
finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}
the_deb() { ls "$deb/$1"_*.deb; }
apt_install() {
  local files=() p
  for p in "$@"; do files+=("$(the_deb "$p")"); done
  apt-get install -y -q --no-install-recommends "${files[@]}"
}

# A daemon of the installed binary in a throw-away home: its own state and runtime directories, the
# installed default plugin directory and configuration (none). The browser listens on an ephemeral port
# (a daemon of the machine's own may hold 7878).
home="$tmp/home"
serve_start() {
  serve_kill
  rm -rf "$home"
  mkdir -p "$home"
  HOME="$home" XDG_RUNTIME_DIR= XDG_STATE_HOME= XDG_CONFIG_HOME= /usr/bin/agenthost --listen 127.0.0.1:0 serve \
    >"$tmp/serve.out" 2>"$tmp/serve.log" &
  daemon_pid=$!
  for _ in $(seq 1 200); do
    [ -S "$home/.local/state/agenthost/run/admin.sock" ] && return 0
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "serve did not open its admin socket"
  cat "$tmp/serve.log"
  return 1
}
at_home() { HOME="$home" XDG_RUNTIME_DIR= XDG_STATE_HOME= XDG_CONFIG_HOME= "$@"; }
serve_stop() {
  local status=0
  kill -TERM "$daemon_pid"
  wait "$daemon_pid" || status=$?
  daemon_pid=
  if [ "$status" -ne 0 ] || ! grep -q ' host: stopped$' "$tmp/serve.log"; then
    echo "serve did not stop cleanly (status $status)"
    cat "$tmp/serve.log"
    return 1
  fi
}
plugin_names() { at_home agenthost plugins list | awk '{print $1}' | sort | tr '\n' ' '; }

# Packages of ours installed before the test are the machine owner's: never replaced or purged here.
preinstalled=$(ours_installed | tr '\n' ' ')
if [ -n "$preinstalled" ]; then
  trap - EXIT
  rm -f "$log"
  echo "test_deb: already installed here: ${preinstalled}(remove them to run this test): skipped"
  exit 77
fi
rm -rf "$work"
mkdir -p "$tmp"

# ---- build ------------------------------------------------------------------------------------------
check "make deb: the packages build in a clean copy and lintian reports no error or warning" \
  bash "$root/scripts/deb.sh" "$deb"
[ "$failed" -eq 0 ] || finish

every_package_built() {
  local p
  for p in "${packages[@]}"; do the_deb "$p" || return 1; done
}
check "a .deb for each package of debian/control (${#packages[@]})" every_package_built

abi_relation() {
  local minor provides depends p
  minor=$(sed -n 's/^#define AH_ABI_MINOR \([0-9]*\).*/\1/p' "$root/plugin-api/agenthost/plugin.h")
  provides=$(dpkg-deb -f "$(the_deb agenthost)" Provides)
  echo "agenthost Provides: $provides (ABI minor $minor)"
  [ "$provides" = "agenthost-abi-1 (= $minor)" ] || return 1
  for p in browser remote sdk acp openai mcp; do
    depends=$(dpkg-deb -f "$(the_deb agenthost-plugin-$p)" Depends)
    echo "agenthost-plugin-$p Depends: $depends"
    [[ ", $depends," == *", agenthost-abi-1 (>= $minor),"* ]] || return 1
  done
}
check "the core provides its plugin ABI and every plugin depends on it (>= its minor)" abi_relation

# ---- the core alone ---------------------------------------------------------------------------------
core_alone() {
  apt_install agenthost || return 1
  local now
  now=$(ours_installed | tr '\n' ' ')
  echo "installed: $now"
  [ "$now" = "agenthost " ]
}
check "apt installs agenthost alone from its .deb" core_alone

serve_without_plugins() {
  serve_start || return 1
  local names
  names=$(plugin_names)
  echo "plugins: $names"
  [ "$names" = "core " ] || return 1
  grep -q "plugin browser is enabled but not installed" "$tmp/serve.log" || return 1
  serve_stop
}
check "agenthost serve starts with no plugin installed and stops cleanly" serve_without_plugins

unit_verifies() {
  grep -qx 'ExecStart=/usr/bin/agenthost serve' /usr/share/systemd/user/agenthost.service &&
    SYSTEMD_LOG_LEVEL=notice systemd-analyze verify /usr/share/systemd/user/agenthost.service
}
check "systemd-analyze verify accepts the installed user unit" unit_verifies

man_renders() {
  local text
  text=$(MANWIDTH=100 man -l /usr/share/man/man1/agenthost.1.gz 2>&1) || return 1
  echo "$text" | head -20
  grep -q '^NAME' <<<"$text" && grep -q 'agenthost - ' <<<"$text" &&
    grep -Eq '^ +serve( |$)' <<<"$text" && grep -Eq '^ +sessions list' <<<"$text"
}
check "man -l renders the installed agenthost(1)" man_renders

completion_works() {
  bash -c 'source /usr/share/bash-completion/completions/agenthost &&
    COMP_WORDS=(agenthost plugins "") COMP_CWORD=2 && _agenthost && echo "${COMPREPLY[*]}" &&
    test "${COMPREPLY[*]}" = "list load reload unload"'
}
check "the installed bash completion completes agenthost's commands" completion_works

# ---- the browser plugin, added and removed ----------------------------------------------------------
browser_mounted() {
  # libwebsockets' libuv loop (loaded by lws at run time, so no shlibs dependency finds it) and the UI's
  # JavaScript libraries, from their Debian packages.
  local depends need
  depends=$(dpkg-deb -f "$(the_deb agenthost-plugin-browser)" Depends)
  echo "Depends: $depends"
  for need in libwebsockets-evlib-uv libjs-marked node-dompurify libjs-chart.js; do
    [[ ", $depends," == *", $need,"* ]] || { echo "no dependency on $need"; return 1; }
  done
  apt_install agenthost-plugin-browser || return 1
  serve_start || return 1
  local url names
  names=$(plugin_names)
  echo "plugins: $names"
  url=$(grep -Eo '^http://127\.0\.0\.1:[0-9]+/#k=[A-Za-z0-9_-]+$' "$tmp/serve.out")
  echo "launch URL: ${url:-(none on stdout)}"
  [ -n "$url" ] || { cat "$tmp/serve.out" "$tmp/serve.log"; return 1; }
  ! grep -qF "${url#*#k=}" "$tmp/serve.log" || { echo "the token is in the log"; return 1; }
  [ "$(at_home agenthost url)" = "$url" ] || return 1
  [[ " $names" == *" browser "* ]] || return 1
  local base=${url%%#*}
  # The page and the JavaScript libraries the UI takes from their Debian packages.
  curl -fsS -o "$tmp/index.html" "$base" && grep -qi '<html' "$tmp/index.html" || return 1
  curl -fsS -o "$tmp/marked.js" "${base}vendor/marked.min.js" || return 1
  cmp "$tmp/marked.js" /usr/share/javascript/marked/marked.min.js || return 1
  curl -fsS -o "$tmp/purify.js" "${base}vendor/purify.min.js" || return 1
  cmp "$tmp/purify.js" /usr/share/nodejs/dompurify/dist/purify.min.js || return 1
  serve_stop
}
check "with agenthost-plugin-browser installed serve mounts it and prints the launch URL" browser_mounted

browser_removed() {
  apt-get remove -y -q agenthost-plugin-browser || return 1
  [ ! -e "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/agenthost/plugins/browser.so" ] || return 1
  [ ! -e /usr/share/agenthost/ui ] || return 1
  serve_start || return 1
  local names
  names=$(plugin_names)
  echo "plugins: $names"
  [ "$names" = "core " ] || return 1
  at_home agenthost status || return 1
  serve_stop
}
check "with the browser plugin removed the core keeps working" browser_removed

# ---- the Python client ------------------------------------------------------------------------------
python_session() {
  apt_install python3-agenthost agenthost-plugin-sdk || return 1
  dpkg -L python3-agenthost | grep -qx '/usr/lib/python3/dist-packages/agenthost/client.py' || return 1
  rm -rf "$home" && mkdir -p "$home/project"
  (cd / && at_home env -u PYTHONPATH /usr/bin/python3 - "$home/project" <<'PY'
import sys
import agenthost
from agenthost import Client

print("module:", agenthost.__file__)
assert agenthost.__file__.startswith("/usr/lib/python3/dist-packages/"), agenthost.__file__
with Client() as client:                      # agenthost on PATH: /usr/bin/agenthost
    info = client.initialize(cwd=sys.argv[1])
    print("server:", info.server_name, info.server_version)
    result = client.session().run("hello from the package")
    print("reply:", result.final_response, "/", result.finish_reason)
    assert result.final_response == "echo: hello from the package", result.final_response
    assert result.finish_reason == "end", result.finish_reason
PY
  )
}
check "the installed Python client runs a session against the installed binary" python_session

# ---- building against the installed headers ---------------------------------------------------------
outoftree_plugin() {
  apt_install agenthost-plugin-dev || return 1
  local cflags
  cflags=$(pkg-config --cflags agenthost-plugin) || return 1
  echo "cflags: $cflags"
  [[ "$cflags" != *"$root"* ]] || return 1
  cc -shared -fPIC $cflags -o "$tmp/hello.so" "$root/tests/outoftree/hello.c" || return 1
  [ "$(pkg-config --variable=plugindir agenthost-plugin)" = "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/agenthost/plugins" ] || return 1
  serve_start || return 1
  at_home agenthost plugins load "$tmp/hello.so" || return 1
  at_home agenthost call hello.greet | tee "$tmp/greet"
  grep -q '"greeting": *"hello"' "$tmp/greet" || return 1
  serve_stop
}
check "pkg-config --cflags agenthost-plugin builds the out-of-tree example, which the installed host loads" \
  outoftree_plugin

client_library() {
  apt_install libagenthost-client0 libagenthost-client-dev || return 1
  cat >"$tmp/client-check.c" <<'C'
#include <agenthost/client.h>
#include <stdio.h>
int main(void) {
  ah_client_opts opts = {.struct_size = sizeof opts};
  ah_client *c = NULL;
  if (ah_client_new(&opts, &c) != 0)
    return 1;
  ah_client_free(c);
  puts("linked");
  return 0;
}
C
  cc -o "$tmp/client-check" "$tmp/client-check.c" $(pkg-config --cflags --libs agenthost-client) || return 1
  ldd "$tmp/client-check" | tee "$tmp/ldd"
  grep -Eq 'libagenthost-client\.so\.0 => (/usr)?/lib/' "$tmp/ldd" || return 1
  [ "$("$tmp/client-check")" = linked ]
}
check "a program builds against libagenthost-client-dev and runs on libagenthost-client0" client_library

# ---- gone again -------------------------------------------------------------------------------------
purged_clean() {
  purge_ours
  local left
  left=$(ours_installed)
  [ -z "$left" ] || { echo "still installed: $left"; return 1; }
  [ ! -e /usr/bin/agenthost ] && [ ! -e "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/agenthost" ] &&
    [ ! -e /usr/include/agenthost ] && [ ! -e /usr/lib/python3/dist-packages/agenthost ]
}
check "purging the packages leaves nothing of them behind" purged_clean

finish
