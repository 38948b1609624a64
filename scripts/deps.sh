#!/usr/bin/env bash
# Install the Debian 12 (bookworm) packages agenthost needs to build and test.
#
#   all present            -> prints nothing, exits 0
#   missing, running as root -> apt-get update (once) + apt-get install of the missing ones
#   missing, not root      -> prints the sudo command to run, exits 1
#
# Then the npm packages of the integration tests (tests/integration/package-lock.json, pinned) are
# installed with the machine's Node.js (>= 20; Debian's own nodejs is older and is not installed) into
# tests/integration/node_modules, which git ignores; a stamp of the lock file's hash skips it when current.
#
# Never reads stdin (CI runs with none). AH_SKIP_DEPS=1 skips the check entirely (for machines that
# provide the libraries some other way; meson then reports anything still missing).
set -euo pipefail

# The one list. Keep one package per line, with what needs it.
PACKAGES=(
  build-essential        # gcc, make, libc headers
  pkg-config             # meson finds every library below through it
  meson                  # build system (meson.build needs >= 1.0; bookworm has 1.0.1)
  ninja-build            # meson's backend
  git                    # `make format` / `make format-check` list files with git ls-files
  python3                # scripts/test-summary.py; meson itself
  libuv1-dev             # the event loop the host and every plugin run on
  libjansson-dev         # JSON values across the plugin API and JSON-RPC
  libffi-dev             # remote gateway: calling registered descriptors
  libsqlite3-dev         # durable store (WAL)
  libinih-dev            # INI config file parsing
  libcriterion-dev       # Criterion tests (tests/unit, tests/system)
  clang-format           # `make format` / `make format-check`
  clang                  # make fuzz: the libFuzzer harnesses (tests/fuzz) are built with clang
  libclang-rt-14-dev     # ... and link its libFuzzer and sanitizer runtimes
  libwebsockets-dev      # browser plugin: HTTP + WebSocket carrier
  libwebsockets-evlib-uv # libwebsockets' libuv event-loop backend (loaded by lws at run time)
  libjs-marked           # the web UI renders the assistant's Markdown with marked
  node-dompurify         # ... sanitized by DOMPurify (both served by the browser plugin at /vendor/)
  libjs-chart.js         # ... and draws the usage panel's chart with Chart.js (/vendor/chart.min.js)
  libcurl4-openssl-dev   # the core's HTTP client service (model providers, MCP over HTTP)
  libpq-dev              # the store's PostgreSQL backend (several hosts on one store)
  postgresql-15          # tests: a PostgreSQL cluster of their own (tests/support/with_pg.sh)
  uthash-dev             # the core's and the ACP plugin's tables by id (live sessions, requests)
  ca-certificates        # the system CA store libcurl verifies TLS against
  openssl                # tests: a CA and a server certificate made at test time
  wrk                    # make bench: HTTP load on the browser surface
  chromium               # browser end-to-end tests (playwright-core drives it)
  debhelper              # make deb: the Debian packages (debian/, dh with meson) ...
  dh-python              # ... python3-agenthost's dependencies (dh-sequence-python3)
  dpkg-dev               # ... dpkg-buildpackage
  fakeroot               # ... the packages' files owned by root without being root
  lintian                # ... checked; the packaging test (tests/packaging) installs them
  man-db                 # tests: man -l renders agenthost(1)
  systemd                # tests: systemd-analyze verify checks the user unit
  curl                   # tests: the installed browser plugin's pages fetched
)

if [[ "${AH_SKIP_DEPS:-0}" == 1 ]]; then
  exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "deps.sh: dpkg-query not found (not a Debian system?); not checking packages." >&2
  echo "deps.sh: agenthost needs the equivalents of: ${PACKAGES[*]}" >&2
  exit 0
fi

installed() {
  # Multi-arch packages may print one status per architecture; any "install ok installed" will do.
  local status
  status="$(dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null || true)"
  [[ "$status" == *"install ok installed"* ]]
}

missing_packages() {
  local pkg
  for pkg in "${PACKAGES[@]}"; do
    installed "$pkg" || printf '%s\n' "$pkg"
  done
}

node_packages() {
  local dir lock stamp major want
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/integration"
  lock="$dir/package-lock.json"
  stamp="$dir/node_modules/.ah-lock-sha256"
  [[ -f "$lock" ]] || return 0
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "deps.sh: Node.js >= 20 with npm is needed for tests/integration (not found in PATH)" >&2
    return 1
  fi
  major="$(node -p 'process.versions.node.split(".")[0]')"
  if ((major < 20)); then
    echo "deps.sh: Node.js >= 20 is needed for tests/integration (found $(node --version))" >&2
    return 1
  fi
  want="$(sha256sum "$lock" | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  echo "deps.sh: installing the pinned npm packages of tests/integration" >&2
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error </dev/null)
  printf '%s\n' "$want" >"$stamp"
}

mapfile -t missing < <(missing_packages)
if ((${#missing[@]} == 0)); then
  node_packages
  exit 0
fi

if [[ "$(id -u)" != 0 ]]; then
  echo "deps.sh: missing Debian packages: ${missing[*]}" >&2
  echo "Install them with:" >&2
  echo "  sudo apt-get install -y ${missing[*]}"
  exit 1
fi

echo "deps.sh: installing missing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get -q update </dev/null
apt-get -q install -y --no-install-recommends "${missing[@]}" </dev/null

mapfile -t still_missing < <(missing_packages)
if ((${#still_missing[@]} != 0)); then
  echo "deps.sh: still missing after apt-get install: ${still_missing[*]}" >&2
  exit 1
fi
node_packages

