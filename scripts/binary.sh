#!/usr/bin/env bash
# Builds the `lease` command as one self-contained executable, dist/lease,
# with `bun build --compile`: Bun's runtime plus the command's code (cli.ts,
# cli/, the library and the @nats-io packages), to copy onto a machine that
# has neither Node nor this clone (docs/cli.md). The runtime is the one in
# the bun npm package that scripts/setup.sh installs: for this machine's
# target nothing is downloaded. The entry is scripts/lease_binary.ts, which
# also lets the binary be its own watchdog for `lease run`.
#
# Usage: bash scripts/binary.sh [--target TARGET] [--out FILE]
#
#   --target TARGET  bun's compile target (default bun-linux-x64, the only
#                    one the tests run). For other machines:
#                    bun-linux-arm64, bun-linux-x64-musl (Alpine),
#                    bun-darwin-arm64, bun-darwin-x64 (no --contain there:
#                    it needs Linux cgroups). bun fetches that target's
#                    runtime once from the npm registry into its cache.
#                    Not Windows: `lease run` stops a command by its
#                    process group, which Windows does not have.
#   --out FILE       where to write it (default dist/lease)
#
# Prints the file's path. Needs what scripts/setup.sh installs (it is run
# first, idempotently, unless LEASE_SKIP_SETUP=1).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="bun-linux-x64"
out="$root/dist/lease"
while (($# > 0)); do
  case "$1" in
  --target | --out)
    if (($# < 2)); then
      echo "binary.sh: $1 needs a value" >&2
      exit 2
    fi
    if [[ "$1" == --target ]]; then target="$2"; else out="$2"; fi
    shift 2
    ;;
  -h | --help) sed -n '10,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' && exit 0 ;;
  *) echo "binary.sh: unknown argument '$1'" >&2 && exit 2 ;;
  esac
done
if [[ "$target" == bun-windows* ]]; then
  echo "binary.sh: no Windows build: lease run needs process groups" >&2
  exit 2
fi

if [[ "${LEASE_SKIP_SETUP:-}" != 1 ]]; then
  bash "$root/scripts/setup.sh" >&2
fi
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
(cd "$root" && node_modules/.bin/bun build --compile --target="$target" \
  scripts/lease_binary.ts --outfile "$out" >&2)
echo "$out"
