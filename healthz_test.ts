// test.sh: first server only: the endpoint reads local state; a frozen
// server is frozen alike on every version.
// examples/healthz.ts as a child process of this test's runtime against a
// real nats-server: /healthz answers 200, then 503 while the server is
// frozen (SIGSTOP), then 200 again once it is thawed.
// Runs under `deno test -A`, `bun test` and `node --test`.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { NatsServer } from "./test_util/nats_server.ts";
import { sleep, uniq } from "./test_util/lease_helpers.ts";

const EXAMPLE = fileURLToPath(
  new URL("./examples/healthz.ts", import.meta.url),
);
const TTL = 1_000;

describe("examples/healthz.ts", () => {
  let ns: NatsServer;
  let child: ChildProcess | undefined;

  before(async () => {
    ns = await NatsServer.start();
  });
  after(async () => {
    child?.kill("SIGKILL");
    if (ns?.paused) await ns.resume();
    await ns?.[Symbol.asyncDispose]();
  });

  test("/healthz answers 200 while the lease is held, 503 within a TTL of the server freezing, and 200 again once it is back", async () => {
    const [cmd, pre] = "Deno" in globalThis
      ? [process.execPath, ["run", "-A", EXAMPLE]]
      : [process.execPath, [EXAMPLE]];
    const env: Record<string, string | undefined> = {
      ...process.env,
      NATS_URL: ns.url,
      PORT: "0",
      LEASE_TTL: String(TTL),
      LEASE_BUCKET: uniq("healthz"),
    };
    delete env.NODE_TEST_CONTEXT;
    child = spawn(cmd, [...pre], { env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout!.setEncoding("utf8").on("data", (d: string) => out += d);
    child.stderr!.setEncoding("utf8").on("data", (d: string) => out += d);
    const exited = new Promise<number>((r) =>
      child!.on("exit", (code) => r(code ?? -1))
    );

    const poll = async (want: number, within: number, what: string) => {
      const t0 = performance.now();
      for (;;) {
        const port = /127\.0\.0\.1:(\d+)\/healthz/.exec(out)?.[1];
        let status = 0;
        let body = "";
        if (port !== undefined) {
          try {
            const r = await fetch(`http://127.0.0.1:${port}/healthz`, {
              signal: AbortSignal.timeout(500),
            });
            status = r.status;
            body = await r.text();
          } catch {
            // Not listening yet.
          }
        }
        if (status === want) return { ms: performance.now() - t0, body };
        assert.ok(
          performance.now() - t0 < within,
          `no ${want} ${what} within ${within} ms (last ${status} ${body}); the example said:\n${out}`,
        );
        await sleep(50);
      }
    };

    await poll(200, 10_000, "at start");
    // On a server without markers a fresh key owes a grace of one TTL.
    for (const t0 = performance.now(); !out.includes("holding '");) {
      assert.ok(performance.now() - t0 < 5 * TTL, `never held:\n${out}`);
      await sleep(20);
    }
    const h = JSON.parse((await poll(200, 1_000, "held")).body);
    assert.equal(h.held, 1, JSON.stringify(h));
    assert.equal(h.ok, true);

    await ns.pause();
    const down = await poll(503, 2 * TTL, "after the freeze");
    const sick = JSON.parse(down.body);
    assert.equal(sick.ok, false);
    await ns.resume();
    const back = await poll(200, 5 * TTL, "after the thaw");
    assert.equal(JSON.parse(back.body).ok, true);
    console.log(
      `[figures] healthz: 503 ${
        Math.round(down.ms)
      } ms after SIGSTOP (TTL ${TTL} ms), 200 ${
        Math.round(back.ms)
      } ms after SIGCONT`,
    );

    process.kill(child.pid!, "SIGTERM");
    assert.equal(await exited, 0, out);
  });
});
