#!/usr/bin/env bash
# Builds the package as JSR's npm layer would serve it (ESM JavaScript and
# .d.ts files, @nats-io/* left as bare imports) into an npm tarball, for
# using the library from this clone before it is on JSR: the main entry,
# ./otel, whose @opentelemetry/api is an optional peer dependency, ./cli,
# ./testing (the in-memory server with a virtual clock, for users' tests),
# and the `lease` command as the package's bin, so that
# `npm install -g ./dist/nats-lease-lease-*.tgz` (or `bun add -g`) puts `lease`
# on PATH with nothing but Node 20 or later (docs/cli.md). It is also the
# file `npm publish` takes once the package goes to npm.
#
# Usage: bash scripts/pack.sh [--install DIR]
#
#   (no option)    write dist/nats-lease-lease-<version>.tgz and print its path
#   --install DIR  also make DIR a project that uses it: create DIR if
#                  missing, give it a package.json with "type": "module"
#                  (unless it has one), and npm install the tarball and
#                  @nats-io/transport-node there. The package's @nats-io
#                  dependencies use the same version ranges as
#                  transport-node's, so npm installs one copy of
#                  @nats-io/nats-core, not two.
#
# Needs what `scripts/setup.sh quickstart` installs (it is run first,
# idempotently).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
install_dir=""
while (($# > 0)); do
  case "$1" in
  --install)
    if (($# < 2)); then
      echo "pack.sh: --install needs a directory" >&2
      exit 2
    fi
    install_dir="$2"
    shift 2
    ;;
  -h | --help) sed -n '11,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' && exit 0 ;;
  *) echo "pack.sh: unknown argument '$1'" >&2 && exit 2 ;;
  esac
done

if [[ "${LEASE_SKIP_SETUP:-}" != 1 ]]; then
  bash "$root/scripts/setup.sh" quickstart >&2
fi
node="$root/node_modules/.bin/node"
npm_cli="$(readlink -f "$(command -v npm)")"
npm() {
  # The machine's npm, run by Node 24 (what the package asks for).
  "$node" "$npm_cli" "$@"
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pkg="$work/package"
mkdir -p "$pkg" "$root/dist"

# package.json: name and version from deno.json; dependencies are the
# @nats-io packages lease.ts, lease/, the testing kit (testing.ts,
# testing/: none of its own) and the command (cli.ts, cli/) import,
# with deno.json's ranges: transport-node only for the command, which dials
# the server itself.
"$node" --input-type=module - "$root" "$pkg" <<'EOF'
import * as fs from "node:fs";
import * as path from "node:path";
const [root, pkg] = process.argv.slice(2);
const deno = JSON.parse(fs.readFileSync(path.join(root, "deno.json"), "utf8"));
const inDir = (dir) =>
  fs.readdirSync(path.join(root, dir))
    .filter((f) => f.endsWith(".ts") && !f.endsWith("_test.ts"))
    .map((f) => `${dir}/${f}`);
const source = [
  "lease.ts",
  ...inDir("lease"),
  "testing.ts",
  ...inDir("testing"),
  "cli.ts",
  ...inDir("cli"),
]
  .map((f) => fs.readFileSync(path.join(root, f), "utf8")).join("\n");
const used = new Set(
  [...source.matchAll(/from "(@nats-io\/[^"]+)"/g)].map((m) => m[1]),
);
const dependencies = {};
for (const [name, target] of Object.entries(deno.imports)) {
  const m = /^npm:(@?[^@]+)@(.+)$/.exec(target);
  if (m && m[1] === name && used.has(name)) dependencies[name] = m[2];
}
const otelRange = /^npm:@opentelemetry\/api@(.+)$/.exec(
  deno.imports["@opentelemetry/api"],
)[1];
fs.writeFileSync(
  path.join(pkg, "package.json"),
  JSON.stringify(
    {
      name: deno.name,
      version: deno.version,
      description: "Single-writer leases with fencing epochs over NATS JetStream KV",
      license: deno.license,
      type: "module",
      exports: {
        ".": { types: "./mod.d.ts", default: "./mod.js" },
        "./otel": { types: "./otel.d.ts", default: "./otel.js" },
        "./cli": { types: "./cli.d.ts", default: "./cli.js" },
        "./testing": { types: "./testing.d.ts", default: "./testing.js" },
      },
      bin: { lease: "bin/lease.js" },
      files: [
        "*.js",
        "*.d.ts",
        "lease/*.js",
        "lease/*.d.ts",
        "testing/*.js",
        "testing/*.d.ts",
        "cli/*.js",
        "cli/*.d.ts",
        "bin/lease.js",
        "README.md",
        "LICENSE",
      ],
      engines: { node: ">=20" },
      // A scoped package is private unless said otherwise: without this the
      // first `npm publish` of the tarball is refused.
      publishConfig: { access: "public" },
      dependencies,
      // Only ./otel imports it, and an application that measures has its
      // own copy: the one its SDK registers the meter provider with.
      peerDependencies: { "@opentelemetry/api": otelRange },
      peerDependenciesMeta: { "@opentelemetry/api": { optional: true } },
    },
    null,
    2,
  ) + "\n",
);
fs.writeFileSync(
  path.join(pkg, "..", "tsconfig.json"),
  JSON.stringify({
    compilerOptions: {
      target: "ES2022",
      module: "NodeNext",
      moduleResolution: "NodeNext",
      declaration: true,
      isolatedDeclarations: true,
      rewriteRelativeImportExtensions: true,
      strict: true,
      exactOptionalPropertyTypes: true,
      noUncheckedIndexedAccess: true,
      lib: ["ES2023", "ESNext.Disposable", "DOM"],
      // Node's typings for the command's node:* imports (the library itself
      // needs none: npm_compat_test.ts builds it with `types: []`).
      types: ["node"],
      typeRoots: [path.join(root, "node_modules", "@types")],
      skipLibCheck: true,
      rootDir: root,
      outDir: pkg,
    },
    // cli/watchdog.ts is no import of cli.ts: `lease run` starts it as a
    // process of its own, from the file beside cli/run.js.
    files: ["mod.ts", "otel.ts", "cli.ts", "cli/watchdog.ts", "testing.ts"]
      .map((f) => path.join(root, f)),
  }),
);
// The bin npm links onto PATH. Not cli.js itself: cli.ts runs main() only
// when it is the program, which it tells by comparing argv[1] with its own
// path, and npm's link puts another path (.../bin/lease) there.
fs.mkdirSync(path.join(pkg, "bin"));
fs.writeFileSync(
  path.join(pkg, "bin", "lease.js"),
  `#!/usr/bin/env node
// The \`lease\` command (cli.ts in the source; see docs/cli.md).
import process from "node:process";
import { main } from "../cli/main.js";

process.exit(await main(process.argv.slice(2)));
`,
  { mode: 0o755 },
);
EOF
(cd "$root" && "$node" node_modules/typescript/lib/tsc.js -p "$work/tsconfig.json")
cp "$root/README.md" "$root/LICENSE" "$pkg/"
tarball="$(cd "$root/dist" && npm pack --silent "$pkg" | tail -n 1)"
tarball="$root/dist/$tarball"
echo "$tarball"

if [[ -n "$install_dir" ]]; then
  mkdir -p "$install_dir"
  cd "$install_dir"
  if [[ ! -f package.json ]]; then
    npm init -y >/dev/null
    npm pkg set type=module
  fi
  npm install --no-audit --no-fund "$tarball" \
    "@nats-io/transport-node@$(
      "$node" -e 'const d=require(process.argv[1]);console.log(d.imports["@nats-io/transport-node"].replace(/^npm:@nats-io\/transport-node@/,""))' \
        "$root/deno.json"
    )" >&2
  cores="$(find node_modules -path '*/@nats-io/nats-core/package.json' | wc -l)"
  echo "pack.sh: installed in $(pwd): @nats-lease/lease and @nats-io/transport-node ($cores copy of @nats-io/nats-core)" >&2
fi
