#!/usr/bin/env bash
# Installs what one use of the clone needs, idempotently, printing one line
# per step. Usage: bash scripts/setup.sh [demo|quickstart|all]
#
#   demo        what scripts/demo.sh runs with: Deno and nats.js (package.json's
#               "dependencies") and nats-server $NATS_SERVER_VERSION, built with
#               Go into .tools/bin. No apt, nothing else from npm.
#   quickstart  the demo's, and what scripts/pack.sh builds the package with:
#               Node 24, TypeScript and @opentelemetry/api (package.json's
#               "peerDependencies").
#   all         (the default) everything the tests need: the above, the rest of
#               the npm packages ("devDependencies": Bun, miniflare,
#               playwright-core, the etcd and Redis clients ...), and
#     - nats-server $NATS_ROLLBACK_VERSION (the last release before subject
#       delete markers), built into .tools/bin/nats-server-$NATS_ROLLBACK_VERSION
#       for the tests that roll a running server back to it;
#     - nats-server $NATS_FENCE_MIN_VERSION and $NATS_ATOMIC_MIN_VERSION, the
#       oldest releases with fenced buckets and with atomic batches, built
#       the same way, for scripts/test.sh's servers fence-min and atomic-min;
#     - Debian's nats-server package (/usr/sbin/nats-server, 2.9.10 on bookworm),
#       the oldest server the tests run against;
#     - Debian's etcd-server and redis-server, for bench/peers.ts only;
#     - Debian's chromium (/usr/bin/chromium), which browser_test.ts drives
#       with playwright-core (nothing downloads a browser build of its own).
#
# A smaller profile never removes what a larger one installed, and a larger
# one installs what a smaller one left out: node_modules is "up to date" only
# when it holds every package the profile needs at package.json's version.
# Subcommand output goes to a log that is shown only when a step fails.
set -euo pipefail

NATS_SERVER_VERSION=2.15.2
NATS_ROLLBACK_VERSION=2.10.22
NATS_FENCE_MIN_VERSION=2.11.2
NATS_ATOMIC_MIN_VERSION=2.12.0

profile="${1:-all}"
case "$profile" in
demo | quickstart | all) ;;
-h | --help) sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' && exit 0 ;;
*)
  echo "setup: the profile must be demo, quickstart or all: received '$profile'" >&2
  exit 2
  ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

log="$(mktemp "${TMPDIR:-/tmp}/lease-setup.XXXXXX")"
trap 'rm -f "$log"' EXIT

# Runs a command with its output sent to the log; on failure shows the log
# and stops.
quietly() {
  if ! "$@" >"$log" 2>&1; then
    echo "setup: FAILED: $*" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

as_root() {
  if [[ "$(id -u)" == 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo -n "$@"
  else
    echo "setup: FAILED: '$*' needs root and sudo is missing" >&2
    exit 1
  fi
}

# 1. npm packages, in three tiers of package.json. For each tier, prints
# "complete" (every package in node_modules at its pinned version), "partial"
# or "absent". npm's own record (node_modules/.package-lock.json) cannot say
# this: after a light install it is as new as after a full one.
tiers() {
  node -e '
    const fs = require("fs");
    const pkg = JSON.parse(fs.readFileSync("package.json", "utf8"));
    const state = (deps) => {
      const pins = Object.entries(deps ?? {});
      const have = pins.filter(([name, version]) => {
        try {
          const p = `node_modules/${name}/package.json`;
          // redlock 5.0.0-beta.2 calls itself "v5.0.0-beta.2".
          const got = JSON.parse(fs.readFileSync(p, "utf8")).version;
          return got.replace(/^v/, "") === version;
        } catch {
          return false;
        }
      }).length;
      return have === pins.length ? "complete" : have > 0 ? "partial" : "absent";
    };
    console.log(["dependencies", "peerDependencies", "devDependencies"]
      .map((k) => state(pkg[k])).join(" "));
  '
}
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup: FAILED: npm is needed to install Deno and nats.js (try 'apt-get install -y npm')" >&2
  exit 1
fi
read -r deps peers devs < <(tiers)
# What is there already stays: a demo run in a clone set up for the tests
# must not prune its Bun.
want="$profile"
[[ "$want" == demo && "$peers" != absent ]] && want=quickstart
[[ "$want" != all && "$devs" != absent ]] && want=all
case "$want" in
demo) omit=(--omit=dev --omit=peer) ;;
quickstart) omit=(--omit=dev) ;;
all) omit=() ;;
esac
# The states of the tiers $want needs.
needed() {
  case "$want" in
  demo) echo "$deps" ;;
  quickstart) echo "$deps $peers" ;;
  all) echo "$deps $peers $devs" ;;
  esac
}
# A lockfile newer than npm's record means a change since the last install.
if [[ ! -f node_modules/.package-lock.json ||
  package.json -nt node_modules/.package-lock.json ||
  (-f package-lock.json && package-lock.json -nt node_modules/.package-lock.json) ||
  "$(needed)" =~ absent|partial ]]; then
  quietly npm install --no-audit --no-fund "${omit[@]}"
  read -r deps peers devs < <(tiers)
  if [[ "$(needed)" =~ absent|partial ]]; then
    # e.g. legacy-peer-deps=true in an .npmrc skips the "peerDependencies".
    echo "setup: FAILED: npm install ${omit[*]} left packages of the '$want' profile out (dependencies $deps, peerDependencies $peers, devDependencies $devs)" >&2
    exit 1
  fi
  versions="$(node_modules/.bin/deno --version | head -n 1)"
  [[ "$want" == demo ]] || versions+=", node $(node_modules/.bin/node --version)"
  [[ "$want" != all ]] || versions+=", bun $(node_modules/.bin/bun --version)"
  echo "setup: npm install for '$want' done ($versions)"
else
  echo "setup: node_modules up to date for '$want'"
fi

# 2. nats-server $NATS_SERVER_VERSION in .tools/bin.
bin=".tools/bin/nats-server"
if [[ -x "$bin" && "$("$bin" --version 2>/dev/null)" == "nats-server: v$NATS_SERVER_VERSION" ]]; then
  echo "setup: $bin v$NATS_SERVER_VERSION present"
else
  if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
    PATH="/usr/local/go/bin:$PATH"
  fi
  if ! command -v go >/dev/null; then
    echo "setup: FAILED: Go is needed to build nats-server v$NATS_SERVER_VERSION (try 'apt-get install -y golang-go')" >&2
    exit 1
  fi
  mkdir -p .tools/bin
  quietly env GOBIN="$root/.tools/bin" \
    go install "github.com/nats-io/nats-server/v2@v$NATS_SERVER_VERSION"
  echo "setup: built $bin ($("$bin" --version))"
fi

if [[ "$profile" != all ]]; then
  # The demo and the quick start run on the one server built above.
  exit 0
fi

# 2b. Older releases, each as .tools/bin/nats-server-<version> (go install
# names every build nats-server: built in a directory of its own, then
# moved): $NATS_ROLLBACK_VERSION, and the first releases with fenced writes
# ($NATS_FENCE_MIN_VERSION) and atomic batches ($NATS_ATOMIC_MIN_VERSION).
build_release() {
  local version="$1" out=".tools/bin/nats-server-$1" build
  if [[ -x "$out" && "$("$out" --version 2>/dev/null)" == "nats-server: v$version" ]]; then
    echo "setup: $out v$version present"
    return
  fi
  if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
    PATH="/usr/local/go/bin:$PATH"
  fi
  if ! command -v go >/dev/null; then
    echo "setup: FAILED: Go is needed to build nats-server v$version (try 'apt-get install -y golang-go')" >&2
    exit 1
  fi
  build="$(mktemp -d "${TMPDIR:-/tmp}/lease-setup-bin.XXXXXX")"
  quietly env GOBIN="$build" \
    go install "github.com/nats-io/nats-server/v2@v$version"
  mkdir -p .tools/bin
  mv "$build/nats-server" "$out"
  rmdir "$build"
  echo "setup: built $out ($("$out" --version))"
}
build_release "$NATS_ROLLBACK_VERSION"
build_release "$NATS_FENCE_MIN_VERSION"
build_release "$NATS_ATOMIC_MIN_VERSION"

# 3. Debian's nats-server: the oldest version the tests cover.
if [[ -x /usr/sbin/nats-server ]]; then
  echo "setup: /usr/sbin/nats-server present ($(/usr/sbin/nats-server --version))"
else
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be missing in a fresh container; refresh them only
  # when the package cannot be found without.
  if ! as_root apt-get install -y nats-server >"$log" 2>&1; then
    quietly as_root apt-get update
    quietly as_root apt-get install -y nats-server
  fi
  echo "setup: installed /usr/sbin/nats-server ($(/usr/sbin/nats-server --version))"
fi

# 4. Debian's etcd-server and redis-server, for the comparison in
# bench/peers.ts only. The bench starts its own processes on free ports with
# temp data dirs, so the packages' services are never used. Where apt starts
# them on install (systemd, or an init script that invoke-rc.d allows), they
# are stopped again here; a service that ran before this step is left alone.
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
command -v redis-server >/dev/null || missing+=(redis-server)
if [[ ${#missing[@]} == 0 ]]; then
  echo "setup: etcd and redis-server present ($(etcd --version | head -n 1), $(redis-server --version | cut -d ' ' -f 3))"
else
  export DEBIAN_FRONTEND=noninteractive
  if ! as_root apt-get install -y --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    quietly as_root apt-get update
    quietly as_root apt-get install -y --no-install-recommends "${missing[@]}"
  fi
  for unit in "${missing[@]}"; do
    service="${unit/etcd-server/etcd}"
    if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
      as_root systemctl disable --now "$service" >/dev/null 2>&1 || true
    elif [[ -x "/etc/init.d/$service" ]]; then
      as_root "/etc/init.d/$service" stop >/dev/null 2>&1 || true
    fi
  done
  echo "setup: installed ${missing[*]} ($(etcd --version | head -n 1), $(redis-server --version | cut -d ' ' -f 3))"
fi

# 5. Debian's chromium, for browser_test.ts: playwright-core launches
# /usr/bin/chromium itself. (The launcher script prints a harmless shell
# warning on stderr with --version, hence the 2>/dev/null.)
if [[ -x /usr/bin/chromium ]]; then
  echo "setup: /usr/bin/chromium present ($(/usr/bin/chromium --version 2>/dev/null | cut -d ' ' -f 1-2))"
else
  export DEBIAN_FRONTEND=noninteractive
  if ! as_root apt-get install -y chromium >"$log" 2>&1; then
    quietly as_root apt-get update
    quietly as_root apt-get install -y chromium
  fi
  echo "setup: installed /usr/bin/chromium ($(/usr/bin/chromium --version 2>/dev/null | cut -d ' ' -f 1-2))"
fi
