#!/usr/bin/env bash
# Runs the lease benchmark under Deno, Bun and Node 24, one runtime at a
# time (each on a nats-server of its own), then prints rows 1 to 3 of all
# three side by side (both guard checks for rows 1 and 3).
#
# Usage: bash bench/run.sh [--smoke] [--all]
#
#   --smoke  a few seconds per runtime: checks that the benchmark runs
#   --all    every row under every runtime (default: every row under Deno,
#            rows 1 to 3 under Bun and Node)
#
# Reports go to bench-results/<runtime>.json; NATS_SERVER_BIN picks the
# server (default: .tools/bin/nats-server, see test_util/nats_server.ts).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

mode=()
all=0
for arg in "$@"; do
  case "$arg" in
  --smoke) mode=(--smoke) ;;
  --all) all=1 ;;
  -h | --help) sed -n '6,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' && exit 0 ;;
  *) echo "run.sh: unknown argument '$arg'" >&2 && exit 2 ;;
  esac
done

bin=node_modules/.bin
for tool in deno bun node; do
  [[ -x "$bin/$tool" ]] || {
    echo "run.sh: $bin/$tool is missing: run 'npm ci' (or bash scripts/setup.sh) first" >&2
    exit 1
  }
done

out=bench-results
mkdir -p "$out"
rows123=(--rows 1,2,3)
((all)) && rows123=()

echo "machine: $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)"
echo "runtimes: deno $("$bin/deno" --version | head -n 1 | cut -d' ' -f2), bun $("$bin/bun" --version), node $("$bin/node" --version)"
echo

"$bin/deno" run -A bench/bench.ts "${mode[@]}" --out "$out/deno.json"
echo
"$bin/bun" bench/bench.ts "${mode[@]}" "${rows123[@]}" --out "$out/bun.json"
echo
"$bin/node" bench/bench.ts "${mode[@]}" "${rows123[@]}" --out "$out/node.json"
echo
"$bin/deno" run -A bench/bench.ts --combine "$out/deno.json" "$out/bun.json" "$out/node.json"
