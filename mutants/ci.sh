#!/usr/bin/env bash
# CI entry point of the mutant table (mutants/table.ts): every mutant put
# into a copy of the tree, its test run under Node 24 against nats-server
# 2.15.2. Prints "mutants ci: score: PASS (K of N killed)" or "... FAILED",
# which .ci/run counts as one test, and exits non-zero below the minimum.
#
# Environment:
#   MUTANTS_MIN   the lowest score that passes, in percent (default 90)
#   MUTANTS_PART  run only slice K/N of the table (default: all of it)
#   MUTANTS_SET   which mutants: table (default, mutants/table.ts),
#                 independent, independent2, independent3, independent4 (the
#                 sets made without sight of the table, mutants/independent*.ts)
#                 or all
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
export NO_COLOR=1

node=node_modules/.bin/node
if [[ ! -x "$node" || ! -x .tools/bin/nats-server ]]; then
  echo "mutants ci: score: FAILED (no node_modules/.bin/node or .tools/bin/nats-server; run scripts/setup.sh)"
  exit 1
fi
args=(--min "${MUTANTS_MIN:-90}")
[[ -n "${MUTANTS_PART:-}" ]] && args+=(--part "$MUTANTS_PART")
[[ -n "${MUTANTS_SET:-}" ]] && args+=(--set "$MUTANTS_SET")
log="$(mktemp "${TMPDIR:-/tmp}/lease-mutants.XXXXXX")"
trap 'rm -f "$log"' EXIT
start=$SECONDS
"$node" mutants/run.ts "${args[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
score="$(grep '^mutants: ' "$log" | tail -n 1)"
if ((rc == 0)) && [[ -n "$score" ]]; then
  echo "mutants ci: score: PASS (${score#mutants: }, $((SECONDS - start)) s)"
else
  echo "mutants ci: score: FAILED (${score:-no score printed}, $((SECONDS - start)) s)"
  exit 1
fi
