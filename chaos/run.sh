#!/usr/bin/env bash
# Runs the chaos checker (chaos/chaos.ts) for a long run: lease-manager
# workers under Deno, Bun and Node 24 against a real nats-server or a 3-node
# cluster, with faults chosen from the seed. Prints a table, writes a JSON
# report, exits non-zero on any violation.
#
# Usage: bash chaos/run.sh [--seconds N] [--mode single|cluster] [--seed S]
#                          [--runtime deno|bun|node] [chaos.ts options...]
#
#   --seconds N   how long to inject faults (default 600)
#   --mode M      single (one server) or cluster (3 nodes, R3 bucket);
#                 default single
#   --seed S      seed of the plan (default: derived from the clock, printed)
#   --runtime R   runtime of the harness itself (default deno); the workers
#                 always mix all three
#   other options go to chaos.ts: --workers N, --keys N, --ttl MS,
#   --slack MS, --handover MS, --faults kind,..., --holder-pause MIN,MAX,
#   --json FILE, --history FILE
#
# The server is $NATS_SERVER_BIN, else .tools/bin/nats-server (see
# scripts/setup.sh). Also available as `deno task chaos`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

runtime=deno
args=(--seconds 600)
while (($# > 0)); do
  case "$1" in
  --runtime)
    (($# >= 2)) || { echo "run.sh: --runtime needs a value" >&2 && exit 2; }
    runtime="$2"
    shift 2
    ;;
  --runtime=*) runtime="${1#*=}" && shift ;;
  -h | --help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' && exit 0 ;;
  *) args+=("$1") && shift ;;
  esac
done

case "$runtime" in
deno) cmd=(node_modules/.bin/deno run -A chaos/chaos.ts) ;;
bun) cmd=(node_modules/.bin/bun chaos/chaos.ts) ;;
node) cmd=(node_modules/.bin/node chaos/chaos.ts) ;;
*) echo "run.sh: --runtime must be deno, bun or node: received '$runtime'" >&2 && exit 2 ;;
esac
if [[ ! -x "${cmd[0]}" ]]; then
  echo "run.sh: ${cmd[0]} is missing: run 'bash scripts/setup.sh' first" >&2
  exit 2
fi
# chaos.ts takes the last value of a repeated option, so ours are defaults.
exec "${cmd[@]}" "${args[@]}"
