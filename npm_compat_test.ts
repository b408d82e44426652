// Proves the package works the way Node and Bun users get it from JSR's npm
// compatibility layer (`npx jsr add`, `bunx jsr add`): plain ESM JavaScript
// plus `.d.ts` files, with `@nats-io/*` left as bare imports that resolve
// from node_modules. We build that shape with the TypeScript compiler into a
// temp `node_modules/@nats-lease/lease`, type-check a consumer against the
// `.d.ts`, and run a guarded write from a plain `.mjs` file under Node 24 and
// Bun against a real nats-server, and a failover on the testing kit
// (`./testing`, no server) likewise.
// Runs under `deno test -A`, `bun test` and `node --test`.
// test.sh: first server only: the package's npm shape; what differs between
// servers is covered by the lease tests.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { NatsServer } from "./test_util/nats_server.ts";
import { type Done, runToEnd, show } from "./test_util/run_to_end.ts";

const root = fileURLToPath(new URL(".", import.meta.url));
const bin = (name: string) => path.join(root, "node_modules", ".bin", name);
const TEST_TIMEOUT = 120_000;

/** Runs a command to completion (killed after `timeout` ms); never rejects. */
function run(
  file: string,
  args: string[],
  options: { cwd: string; env?: Record<string, string>; timeout?: number },
): Promise<Done> {
  const env: Record<string, string | undefined> = {
    ...process.env,
    NO_COLOR: "1",
    ...options.env,
  };
  // Set by `node --test`; a child node process that sees it reports as a
  // test file.
  delete env.NODE_TEST_CONTEXT;
  return runToEnd(file, args, {
    cwd: options.cwd,
    env,
    timeout: options.timeout ?? 30_000,
  });
}

/** The npm dependencies deno.json maps (`npm:@nats-io/kv@^3.4.0` → `^3.4.0`). */
function npmDependencies(
  imports: Record<string, string>,
): Record<string, string> {
  const deps: Record<string, string> = {};
  for (const [name, target] of Object.entries(imports)) {
    const m = /^npm:(@?[^@]+)@(.+)$/.exec(target);
    if (m && m[1] === name) deps[name] = m[2]!;
  }
  return deps;
}

// The consumer a Node or Bun user writes after `npx jsr add @nats-lease/lease`:
// plain JavaScript, the package imported by its name.
const CONSUMER = `import process from "node:process";
import { connect } from "@nats-io/transport-node";
import {
  createLeaseManager,
  NotHolderError,
  UnavailableError,
} from "@nats-lease/lease";

const nc = await connect({ servers: process.env.NATS_URL });
const leases = await createLeaseManager({
  nc,
  node: process.env.NODE_ID,
  bucket: "npm-compat",
  ttl: 1000,
});
let epoch;
for (let attempt = 0; epoch === undefined; attempt++) {
  try {
    epoch = await leases.guard(process.env.LEASE_KEY, (lease) => lease.epoch);
  } catch (err) {
    if (!(err instanceof NotHolderError) || attempt === 50) throw err;
    await new Promise((r) => setTimeout(r, err.retryAfter ?? 100));
  }
}
await leases.close();
await nc.close();
console.log(JSON.stringify({
  node: process.env.NODE_ID,
  epoch,
  errors: [NotHolderError.name, UnavailableError.name],
  ttl: leases.ttl,
}));
`;

// A user's test of a failover on the testing kit, by its export's name: a
// crashed holder's key taken after the TTL and the grace, in virtual time.
const KIT_CONSUMER =
  `import { createTestLeases } from "@nats-lease/lease/testing";

const t = createTestLeases({ ttl: 15_000 });
const a = t.manager({ node: "a" });
const b = t.manager({ node: "b" });
await a.guard("report", (lease) => t.recordWrite(lease));
t.crash("a");
const epoch = await b.guard("report", (lease) => {
  t.recordWrite(lease);
  return lease.epoch;
}, { wait: true });
t.assertNoOverlap();
const virtual = t.clock.now();
await t.close();
console.log(JSON.stringify({ epoch, virtual }));
`;

// A TypeScript consumer, only type-checked: the `.d.ts` must carry the API.
const TYPED_CONSUMER = `import { connect } from "@nats-io/transport-node";
import {
  createLeaseManager,
  type Lease,
  type LeaseManager,
  NotHolderError,
} from "@nats-lease/lease";

const nc = await connect({ servers: "nats://127.0.0.1:4222" });
const leases: LeaseManager = await createLeaseManager({ nc, node: "n", ttl: 1_000 });
const epoch: number = await leases.guard("k", (lease: Lease) => lease.epoch);
const holder: { node: string; epoch: number } | null = await leases.holder("k");
const wait: number | undefined = new NotHolderError("k").retryAfter;
// @ts-expect-error: guard() needs a write function
await leases.guard("k");
console.log(epoch, holder, wait);
await leases.close();
`;

describe("the package as JSR's npm layer ships it (ESM JavaScript + .d.ts)", () => {
  let tmp: string;
  let pkg: string;
  let build: Done | undefined;
  let ns: NatsServer;
  const key = `npm-${Date.now().toString(36)}`;
  let lastEpoch = 0;

  before(async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), "lease-npm-"));
    pkg = path.join(tmp, "node_modules", "@nats-lease", "lease");
    fs.mkdirSync(pkg, { recursive: true });
    // The nats.js packages come from the repo's node_modules, as npm would
    // install them next to the package.
    fs.symlinkSync(
      path.join(root, "node_modules", "@nats-io"),
      path.join(tmp, "node_modules", "@nats-io"),
      "dir",
    );
    const denoJson = JSON.parse(
      fs.readFileSync(path.join(root, "deno.json"), "utf8"),
    );
    fs.writeFileSync(
      path.join(pkg, "package.json"),
      JSON.stringify(
        {
          name: denoJson.name,
          version: denoJson.version,
          type: "module",
          exports: {
            ".": { types: "./mod.d.ts", default: "./mod.js" },
            "./testing": { types: "./testing.d.ts", default: "./testing.js" },
          },
          dependencies: npmDependencies(denoJson.imports),
        },
        null,
        2,
      ),
    );
    // One JavaScript module and one declaration file per source module.
    // `isolatedDeclarations` makes tsc refuse what JSR calls slow types;
    // `types: []` with the DOM lib proves lease.ts needs no Node typings.
    fs.writeFileSync(
      path.join(tmp, "tsconfig.build.json"),
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
          types: [],
          skipLibCheck: true,
          rootDir: root,
          outDir: pkg,
        },
        files: [path.join(root, "mod.ts"), path.join(root, "testing.ts")],
      }),
    );
    build = await run(
      bin("node"),
      [
        path.join(root, "node_modules", "typescript", "lib", "tsc.js"),
        "-p",
        path.join(tmp, "tsconfig.build.json"),
      ],
      { cwd: tmp, timeout: 90_000 },
    );
    ns = await NatsServer.start();
  });

  after(async () => {
    await ns?.[Symbol.asyncDispose]();
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  test(
    "tsc emits one ESM .js and one .d.ts per module, importing ./lease.js, ./lease/*.js and bare @nats-io/* specifiers",
    {
      timeout: TEST_TIMEOUT,
    },
    () => {
      assert.ok(build, "the build did not run");
      assert.equal(build.code, 0, show("tsc", build));
      const modules = [
        "lease.js",
        ...fs.readdirSync(path.join(pkg, "lease"))
          .filter((f) => f.endsWith(".js")).map((f) => `lease/${f}`),
      ];
      assert.ok(modules.includes("lease/manager.js"), modules.join(", "));
      for (const js of ["mod.js", ...modules]) {
        const dts = js.replace(/\.js$/, ".d.ts");
        for (const file of [js, dts]) {
          assert.ok(fs.existsSync(path.join(pkg, file)), `${file} is missing`);
        }
      }
      const mod = fs.readFileSync(path.join(pkg, "mod.js"), "utf8");
      assert.match(mod, /from "\.\/lease\.js";/);
      const bare = new Set<string>();
      for (const file of modules) {
        const text = fs.readFileSync(path.join(pkg, file), "utf8");
        for (
          const m of text.matchAll(/^(?:import|export) .* from "([^"]+)";$/gm)
        ) {
          const spec = m[1]!;
          if (spec.startsWith(".")) {
            // Relative imports were rewritten to the emitted files.
            assert.match(spec, /\.js$/, `${file} imports ${spec}`);
            const target = path.join(path.dirname(path.join(pkg, file)), spec);
            assert.ok(fs.existsSync(target), `${file} imports ${spec}`);
          } else bare.add(spec);
        }
      }
      // nats-core only for `headers()` (a tagged KV delete needs a header
      // object that only it builds); kv and jetstream import the same copy.
      assert.deepEqual([...bare].sort(), [
        "@nats-io/jetstream",
        "@nats-io/kv",
        "@nats-io/nats-core",
      ]);
    },
  );

  test("the .d.ts files type-check a TypeScript consumer", {
    timeout: TEST_TIMEOUT,
  }, async () => {
    assert.equal(build?.code, 0, "the build failed (see the first test)");
    fs.writeFileSync(path.join(tmp, "consumer_check.ts"), TYPED_CONSUMER);
    fs.writeFileSync(
      path.join(tmp, "tsconfig.check.json"),
      JSON.stringify({
        compilerOptions: {
          target: "ES2022",
          module: "NodeNext",
          moduleResolution: "NodeNext",
          strict: true,
          noEmit: true,
          lib: ["ES2023", "ESNext.Disposable", "DOM"],
          types: [],
          skipLibCheck: true,
        },
        files: ["consumer_check.ts"],
      }),
    );
    // `"type": "module"` makes the consumer ESM, so top-level await is allowed.
    fs.writeFileSync(
      path.join(tmp, "package.json"),
      JSON.stringify({ private: true, type: "module" }),
    );
    const check = await run(
      bin("node"),
      [
        path.join(root, "node_modules", "typescript", "lib", "tsc.js"),
        "-p",
        "tsconfig.check.json",
      ],
      { cwd: tmp, timeout: 90_000 },
    );
    assert.equal(check.code, 0, show("tsc (consumer)", check));
  });

  for (const runtime of ["node", "bun"] as const) {
    test(
      `a plain .mjs file under ${runtime} imports the package by name and runs a guarded write`,
      {
        timeout: TEST_TIMEOUT,
      },
      async () => {
        assert.equal(build?.code, 0, "the build failed (see the first test)");
        fs.writeFileSync(path.join(tmp, "consumer.mjs"), CONSUMER);
        fs.writeFileSync(
          path.join(tmp, "package.json"),
          JSON.stringify({ private: true, type: "module" }),
        );
        const done = await run(bin(runtime), ["consumer.mjs"], {
          cwd: tmp,
          env: {
            NATS_URL: ns.url,
            NODE_ID: `npm-${runtime}`,
            LEASE_KEY: key,
          },
        });
        assert.equal(done.code, 0, show(`${runtime} consumer.mjs`, done));
        const lines = done.stdout.trim().split("\n");
        const result = JSON.parse(lines.at(-1)!);
        assert.equal(result.node, `npm-${runtime}`);
        assert.ok(
          Number.isInteger(result.epoch) && result.epoch > lastEpoch,
          show(`${runtime} consumer.mjs`, done),
        );
        assert.deepEqual(result.errors, ["NotHolderError", "UnavailableError"]);
        assert.equal(result.ttl, 1000);
        assert.doesNotMatch(done.stderr, /error|warning/i, done.stderr);
        lastEpoch = result.epoch;
      },
    );
  }

  for (const runtime of ["node", "bun"] as const) {
    test(
      `a plain .mjs file under ${runtime} imports ./testing by name and runs a failover in virtual time`,
      {
        timeout: TEST_TIMEOUT,
      },
      async () => {
        assert.equal(build?.code, 0, "the build failed (see the first test)");
        fs.writeFileSync(path.join(tmp, "kit_consumer.mjs"), KIT_CONSUMER);
        fs.writeFileSync(
          path.join(tmp, "package.json"),
          JSON.stringify({ private: true, type: "module" }),
        );
        const done = await run(bin(runtime), ["kit_consumer.mjs"], {
          cwd: tmp,
        });
        assert.equal(done.code, 0, show(`${runtime} kit_consumer.mjs`, done));
        const result = JSON.parse(done.stdout.trim().split("\n").at(-1)!);
        // The marker of the expiry took a revision: the successor's is 3.
        assert.deepEqual(result, { epoch: 3, virtual: 30_004 });
        assert.doesNotMatch(done.stderr, /error|warning/i, done.stderr);
      },
    );
  }
});
