#!/usr/bin/env bash
# Runs the demo: three nodes contend for one lease on a local nats-server
# (started by the demo itself unless NATS_URL is set), with a crash and a
# clean handover. Installs what is missing first, so it works as the first
# command in a fresh clone: only what the demo runs with (scripts/setup.sh's
# demo profile: Deno, nats.js and one nats-server), not the tests' 600 MB.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -f scripts/setup.sh ]]; then
  bash scripts/setup.sh demo
fi

exec node_modules/.bin/deno run --allow-all examples/demo.ts "$@"
