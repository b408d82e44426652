#!/usr/bin/env bash
# CI entry point of the chaos checker: a ~60 s run on one nats-server, then
# a ~60 s run on a 3-node cluster with an R3 bucket, one seed for both.
# Exits non-zero if either run reports a violation or an error (or cannot
# run, e.g. cluster mode on a server older than 2.9.21).
#
# Environment:
#   CHAOS_SECONDS   seconds of fault injection per mode (default 60)
#   CHAOS_SEED      the seed (default: the clock; printed, so a failure can
#                   be replayed with chaos/run.sh --seed)
#   CHAOS_OUT       directory for the JSON reports (default: a temp dir)
#   NATS_SERVER_BIN the server (default .tools/bin/nats-server)
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
export NO_COLOR=1

seconds="${CHAOS_SECONDS:-60}"
seed="${CHAOS_SEED:-$(date +%s)}"
out="${CHAOS_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/chaos-ci.XXXXXX")}"
mkdir -p "$out"
echo "chaos ci: seed $seed, $seconds s per mode, reports in $out"

failed=0
for mode in single cluster; do
  echo "+ chaos/run.sh --mode $mode --seconds $seconds --seed $seed"
  # Faults start only before the deadline, but each one is followed by a
  # wait for recovery; the timeout catches a hung run.
  rc=0
  timeout -k 10 $((seconds * 2 + 180)) bash chaos/run.sh --mode "$mode" \
    --seconds "$seconds" --seed "$seed" --json "$out/$mode.json" </dev/null || rc=$?
  if ((rc == 0)); then
    echo "chaos ci: $mode: PASS"
  else
    echo "chaos ci: $mode: FAILED (exit $rc; 1 = violations, 2 = errors, 3 = mode not supported by the server, 124 = timed out)"
    failed=$((failed + 1))
  fi
done
((failed == 0))
