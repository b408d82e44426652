// The README's quick start, run the way a newcomer runs it: the tarball is
// built and installed into an empty folder by the README's own command
// (`bash scripts/pack.sh --install DIR`), the README's `app.ts` block is
// written there, and two copies run at once under this test's runtime
// against a real nats-server. The only change to the block is the server
// address (the test server listens on a random port, not 4222).
// Runs under `deno test -A`, `bun test` and `node --test`.
// test.sh: first server only: the README's quick start and the pack script;
// what differs between servers is covered by the lease tests.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { NatsServer } from "./test_util/nats_server.ts";

const root = fileURLToPath(new URL(".", import.meta.url));
const README = fs.readFileSync(path.join(root, "README.md"), "utf8");

/** The README's fenced code blocks, in order. */
function blocks(lang: string): string[] {
  return [...README.matchAll(/```(\w+)\n([\s\S]*?)```/g)]
    .filter((m) => m[1] === lang)
    .map((m) => m[2]!);
}

interface Done {
  code: number;
  stdout: string;
  stderr: string;
  ms: number;
}

function run(
  file: string,
  args: string[],
  cwd: string,
  env: Record<string, string> = {},
  timeout = 60_000,
): Promise<Done> {
  const all: Record<string, string | undefined> = {
    ...process.env,
    NO_COLOR: "1",
    ...env,
  };
  // Set by `node --test`; a child node process that sees it reports as a
  // test file.
  delete all.NODE_TEST_CONTEXT;
  const t0 = performance.now();
  return new Promise((resolve) => {
    execFile(file, args, {
      cwd,
      env: all,
      timeout,
      killSignal: "SIGKILL",
      encoding: "utf8",
    }, (error, stdout, stderr) => {
      resolve({
        code: error === null
          ? 0
          : typeof error.code === "number"
          ? error.code
          : -1,
        stdout,
        stderr,
        ms: performance.now() - t0,
      });
    });
  });
}

/** How this runtime runs a TypeScript file, as the README says. */
function runApp(file: string): [string, string[]] {
  if ("Deno" in globalThis) return [process.execPath, ["run", "-A", file]];
  return [process.execPath, [file]];
}

describe("the README's quick start, pasted into an empty folder", () => {
  let tmp: string;
  let ns: NatsServer;
  let installed: Done;

  before(async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), "lease-readme-"));
    ns = await NatsServer.start();
    // The README's step 2, as written but for the folder.
    const step = blocks("sh").find((b) => b.includes("scripts/pack.sh"));
    assert.ok(step, "the README has no pack.sh step");
    assert.match(step, /^bash scripts\/pack\.sh --install \S+\n$/);
    installed = await run(
      "bash",
      [
        "scripts/pack.sh",
        "--install",
        path.join(tmp, "lease-quickstart"),
      ],
      root,
      { LEASE_SKIP_SETUP: "1" },
      180_000,
    );
  });

  after(async () => {
    await ns?.[Symbol.asyncDispose]();
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  test("scripts/pack.sh --install makes a module project with the package and one copy of @nats-io/nats-core", () => {
    assert.equal(installed.code, 0, installed.stderr);
    const dir = path.join(tmp, "lease-quickstart");
    const pkg = JSON.parse(
      fs.readFileSync(path.join(dir, "package.json"), "utf8"),
    );
    assert.equal(pkg.type, "module");
    assert.ok(pkg.dependencies["@nats-lease/lease"]);
    assert.ok(pkg.dependencies["@nats-io/transport-node"]);
    assert.match(installed.stderr, /\(1 copy of @nats-io\/nats-core\)/);
  });

  test(
    "two copies of the quick start's app.ts: one writes at once, the other waits and writes after it closes, at a higher epoch",
    {
      timeout: 90_000,
    },
    async () => {
      assert.equal(installed.code, 0, installed.stderr);
      const dir = path.join(tmp, "lease-quickstart");
      const app = blocks("ts").find((b) =>
        b.includes('leases.guard("orders"') && b.includes("wait: true")
      );
      assert.ok(app, "the README has no quick start app.ts");
      assert.ok(app.includes('"127.0.0.1:4222"'));
      fs.writeFileSync(
        path.join(dir, "app.ts"),
        app.replace('"127.0.0.1:4222"', JSON.stringify(ns.url)),
      );
      const [cmd, args] = runApp("app.ts");
      const [a, b] = await Promise.all([
        run(cmd, args, dir),
        run(cmd, args, dir),
      ]);
      for (const r of [a, b]) {
        assert.equal(r.code, 0, `exit ${r.code}\n${r.stdout}\n${r.stderr}`);
      }
      const out = `${a.stdout}${b.stdout}`;
      const commits = [
        ...out.matchAll(/commits to "orders" under epoch (\d+)/g),
      ]
        .map((m) => Number(m[1]));
      const done = [...out.matchAll(/done, epoch (\d+)/g)];
      assert.equal(commits.length, 2, out);
      assert.equal(done.length, 2, out);
      // The one that waited took over after the other's 2 s write and close().
      const [first, second] = [a, b].sort((x, y) => x.ms - y.ms);
      console.log(
        `  [figures] quick start: first exits after ${
          Math.round(first!.ms)
        } ms, second after ${Math.round(second!.ms)} ms`,
      );
      assert.ok(second!.ms - first!.ms > 1_500, `${first!.ms} / ${second!.ms}`);
      assert.notEqual(commits[0], commits[1]);
    },
  );
});
