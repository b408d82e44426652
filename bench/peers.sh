#!/usr/bin/env bash
# The comparison with etcd and Redis (issue 18) from a fresh clone: installs
# what it needs (scripts/setup.sh: npm dev dependencies, nats-server, Debian's
# etcd-server and redis-server), then runs bench/peers.ts under Node 24 and,
# for this library's columns as well as the peers', under Deno.
#   bash bench/peers.sh [--smoke] [--runs N]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ "${LEASE_SKIP_SETUP:-}" != 1 ]]; then bash scripts/setup.sh; fi
node_modules/.bin/node bench/peers.ts "$@"
node_modules/.bin/deno run --allow-all bench/peers.ts "$@"
