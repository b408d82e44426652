// Runs every example in examples/ as a child process, under the runtimes the
// examples are written for, against a real nats-server with a WebSocket
// listener, and checks what each one prints (not only its exit code).
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary (see test_util/nats_server.ts).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  createLeaseManager,
  type LeaseManager,
  type LeaseReleasedEvent,
} from "./mod.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";
import { guardUntil, sleep, versionOf } from "./test_util/lease_helpers.ts";
import { markersVersion } from "./lease/servers.ts";

type Runtime = "deno" | "bun" | "node";

const root = fileURLToPath(new URL(".", import.meta.url));
/** Hard limit for one example process; it is killed and the test fails after it. */
const EXAMPLE_TIMEOUT = 30_000;
/** Per test: bun's default of 5 s is too short for a handover. */
const TEST_TIMEOUT = 60_000;
const FENCED = markersVersion(versionOf(natsServerBinary()))
  ? false
  : "fenced buckets need nats-server 2.11.2 or later";
/** The TTL of examples/edge.ts (and of the bucket the examples share). */
const EDGE_TTL = 2_000;
/** How long to wait for one expected line. */
const LINE_TIMEOUT = 15_000;

/** The runtime running this file, told apart by feature, not by name. */
const self: Runtime = "Deno" in globalThis
  ? "deno"
  : "Bun" in globalThis
  ? "bun"
  : "node";

function binary(runtime: Runtime): string {
  const file = `${root}node_modules/.bin/${runtime}`;
  if (!fs.existsSync(file)) {
    throw new Error(
      `Cannot run examples under ${runtime}: ${file} is missing. Run 'bash scripts/setup.sh' (it installs the runtimes from npm).`,
    );
  }
  return file;
}

/** The permissions each example asks for in its header comment. */
const DENO_FLAGS: Record<string, string[]> = {
  "deno.ts": ["--allow-net", "--allow-env"],
  "edge.ts": ["--allow-net", "--allow-env"],
  "worker.ts": ["--allow-net", "--allow-env", "--allow-read"],
  "fenced_store.ts": ["--allow-net", "--allow-env"],
  // It starts copies of itself with the runtime running it.
  "fenced_bucket.ts": ["--allow-all"],
  "semaphore.ts": ["--allow-net", "--allow-env"],
  "shards.ts": ["--allow-net", "--allow-env"],
  "demo.ts": ["--allow-all"],
};

let seq = 0;
const unique = (prefix: string) =>
  `${prefix}-${Date.now().toString(36)}-${seq++}`;

/** One example process, with its output collected line by line. */
class Example {
  readonly label: string;
  readonly lines: { at: number; stream: "out" | "err"; text: string }[] = [];
  readonly exit: Promise<{ code: number | null; signal: string | null }>;
  readonly #child: ChildProcess;
  readonly #wake = new Set<() => void>();
  #exited = false;

  constructor(runtime: Runtime, script: string, env: Record<string, string>) {
    this.label = `${script} under ${runtime}`;
    const file = `${root}examples/${script}`;
    const args = runtime === "deno"
      ? ["run", ...(DENO_FLAGS[script] ?? ["--allow-all"]), file]
      : [file];
    const childEnv: Record<string, string | undefined> = {
      ...process.env,
      NO_COLOR: "1",
      ...env,
    };
    // Set by `node --test`; a child node process that sees it reports as a
    // test file instead of running the example.
    delete childEnv.NODE_TEST_CONTEXT;
    this.#child = spawn(binary(runtime), args, {
      cwd: root,
      env: childEnv,
      stdio: ["ignore", "pipe", "pipe"],
    });
    for (const stream of ["out", "err"] as const) {
      let partial = "";
      const source = stream === "out"
        ? this.#child.stdout!
        : this.#child.stderr!;
      source.setEncoding("utf8");
      source.on("data", (chunk: string) => {
        const parts = (partial + chunk).split("\n");
        partial = parts.pop()!;
        for (const text of parts) this.#add(stream, text);
      });
      source.on("end", () => {
        if (partial !== "") this.#add(stream, partial);
        partial = "";
      });
    }
    const killer = setTimeout(() => {
      this.lines.push({
        at: performance.now(),
        stream: "err",
        text: `(killed by the test after ${EXAMPLE_TIMEOUT} ms)`,
      });
      this.#child.kill("SIGKILL");
    }, EXAMPLE_TIMEOUT);
    this.exit = new Promise((resolve) => {
      this.#child.once("close", (code, signal) => {
        clearTimeout(killer);
        this.#exited = true;
        for (const wake of this.#wake) wake();
        resolve({ code, signal });
      });
    });
  }

  #add(stream: "out" | "err", text: string): void {
    this.lines.push({ at: performance.now(), stream, text });
    for (const wake of this.#wake) wake();
  }

  /** Everything the process printed so far, for failure messages. */
  transcript(): string {
    const out = this.lines.map((l) =>
      `${l.stream === "err" ? "!" : " "} ${l.text}`
    );
    return `--- ${this.label} ---\n${out.join("\n")}\n---`;
  }

  get stdout(): string {
    return this.lines.filter((l) => l.stream === "out").map((l) => l.text)
      .join("\n");
  }

  /** Waits for a stdout line matching `re` (searching from line `from`). */
  waitFor(
    re: RegExp,
    from = 0,
  ): Promise<{ match: RegExpMatchArray; at: number; index: number }> {
    return new Promise((resolve, reject) => {
      const check = () => {
        for (let i = from; i < this.lines.length; i++) {
          const line = this.lines[i]!;
          const match = line.stream === "out" ? re.exec(line.text) : null;
          if (match) {
            return done(() => resolve({ match, at: line.at, index: i }));
          }
        }
        if (this.#exited) {
          done(() =>
            reject(
              new Error(
                `${this.label} exited without printing ${re}\n${this.transcript()}`,
              ),
            )
          );
        }
      };
      const timer = setTimeout(() =>
        done(() =>
          reject(
            new Error(
              `${this.label} printed no line matching ${re} within ${LINE_TIMEOUT} ms\n${this.transcript()}`,
            ),
          )
        ), LINE_TIMEOUT);
      const done = (settle: () => void) => {
        clearTimeout(timer);
        this.#wake.delete(check);
        settle();
      };
      this.#wake.add(check);
      check();
    });
  }

  /** Waits for the exit and asserts it was a clean one (code 0, nothing on stderr that looks like an error). */
  async succeeded(): Promise<void> {
    const { code, signal } = await this.exit;
    assert.equal(
      code,
      0,
      `${this.label} exited with code ${code} signal ${signal}\n${this.transcript()}`,
    );
    const errors = this.lines.filter((l) =>
      l.stream === "err" && /error|uncaught|warning/i.test(l.text)
    );
    assert.deepEqual(
      errors,
      [],
      `${this.label} wrote to stderr\n${this.transcript()}`,
    );
  }

  kill(signal: "SIGINT" | "SIGTERM" | "SIGKILL"): void {
    if (this.#exited || this.#child.pid === undefined) return;
    // Not `child.kill()`: under Deno 2.9 a child signalled that way is
    // reported as killed by the signal even when it caught it and exited 0.
    try {
      process.kill(this.#child.pid, signal);
    } catch {
      // Already gone.
    }
  }
}

describe("examples against a real nats-server", () => {
  let ns: NatsServer;
  let env: Record<string, string>;
  let nc: NatsConnection;
  let holder: LeaseManager;
  const events: LeaseReleasedEvent[] = [];
  const running: Example[] = [];

  function start(
    runtime: Runtime,
    script: string,
    extra: Record<string, string> = {},
  ): Example {
    const example = new Example(runtime, script, { ...env, ...extra });
    running.push(example);
    return example;
  }

  before(async () => {
    ns = await NatsServer.start({ websocket: true });
    env = { NATS_URL: ns.url, NATS_WS_URL: ns.wsUrl! };
    nc = await connect({ servers: ns.url });
    // The examples' bucket and TTL, so that the examples share it.
    holder = await createLeaseManager({
      nc,
      node: "edge-holder",
      bucket: "examples",
      ttl: EDGE_TTL,
    });
    holder.addEventListener("released", (e) => events.push(e));
  });

  after(async () => {
    for (const example of running) example.kill("SIGKILL");
    await Promise.all(running.map((example) => example.exit));
    await holder?.close();
    await nc?.close();
    await ns?.[Symbol.asyncDispose]();
  });

  // Each runtime's own example runs when this file runs under that runtime:
  // the whole suite (scripts/test.sh) runs each once per server, instead of
  // three times.
  for (const runtime of [self]) {
    test(
      `examples/${runtime}.ts under ${runtime}: one copy writes, a second waits, SIGINT hands over at once, the second stops on its own, and a third stops cleanly on SIGTERM`,
      { timeout: TEST_TIMEOUT },
      async () => {
        const key = unique(runtime);
        const a = start(runtime, `${runtime}.ts`, {
          NODE_ID: `${runtime}-A`,
          LEASE_KEY: key,
          RUN_FOR_MS: "20000",
        });
        await a.waitFor(/^\[\S+-A\] connected to nats:\/\/127\.0\.0\.1:\d+$/);
        // A fresh key: written at once where the server keeps expiry
        // markers (2.11.2 and later), after the grace where it cannot tell
        // a never-used key from an expired one.
        const first = await a.waitFor(
          /^\[\S+-A\] wrote order #1 at epoch (\d+)$/,
        );
        // The second copy starts while the first holds the key, says so,
        // and waits.
        const b = start(runtime, `${runtime}.ts`, {
          NODE_ID: `${runtime}-B`,
          LEASE_KEY: key,
          RUN_FOR_MS: "4500",
        });
        await b.waitFor(
          new RegExp(
            `^\\[${runtime}-B\\] waiting: '${key}' is held by ${runtime}-A$`,
          ),
        );
        a.kill("SIGINT");
        await a.waitFor(/^\[\S+-A\] stopping \(SIGINT\)$/);
        const released = await a.waitFor(
          new RegExp(
            `^\\[${runtime}-A\\] released '${key}' and closed the connection after \\d+ writes$`,
          ),
        );
        await a.succeeded();

        const taken = await b.waitFor(
          /^\[\S+-B\] wrote order #1 at epoch (\d+)$/,
        );
        assert.ok(
          Number(taken.match[1]) > Number(first.match[1]),
          `the successor's epoch ${taken.match[1]} must exceed ${
            first.match[1]
          }\n${b.transcript()}`,
        );
        // A released lease needs no grace: the waiting guard writes at
        // once. Waiting for A's entry to expire would take at least 2/3 of
        // the examples' 2 s TTL (A renewed every TTL/3), a grace a TTL more,
        // so below half the TTL proves neither happened; the rest is for a
        // loaded machine, not a speed target (bench/ measures that).
        const gap = taken.at - released.at;
        assert.ok(
          gap < 1_000,
          `handover took ${Math.round(gap)} ms\n${b.transcript()}`,
        );
        assert.doesNotMatch(b.stdout, /grace/, b.transcript());
        await b.waitFor(/^\[\S+-B\] stopping \(time is up\)$/);
        await b.waitFor(
          new RegExp(
            `^\\[${runtime}-B\\] released '${key}' and closed the connection after [1-9]\\d* writes$`,
          ),
        );
        await b.succeeded();

        // A service manager stops it with SIGTERM: a clean leave too, where
        // the default action would kill it and cost a successor TTL + grace.
        const c = start(runtime, `${runtime}.ts`, {
          NODE_ID: `${runtime}-C`,
          LEASE_KEY: key,
          RUN_FOR_MS: "20000",
        });
        await c.waitFor(/^\[\S+-C\] wrote order #1 at epoch (\d+)$/);
        c.kill("SIGTERM");
        await c.waitFor(/^\[\S+-C\] stopping \(SIGTERM\)$/);
        await c.waitFor(
          new RegExp(
            `^\\[${runtime}-C\\] released '${key}' and closed the connection after [1-9]\\d* writes$`,
          ),
        );
        await c.succeeded();
      },
    );
  }

  // The edge example runs under each runtime on one key, held by this
  // test's own manager when it starts: it is refused ("held by"), retries
  // every 200 ms, and once the holder releases it finds the key released
  // and writes at once, with a higher epoch, waiting no grace.
  const edgeKey = unique("edge");
  let edgeEpoch = 0;
  for (const runtime of ["deno", "bun", "node"] as const) {
    const why = runtime === "node"
      ? " (beyond the issue: Node 24 has a global WebSocket too)"
      : "";
    test(
      `examples/edge.ts under ${runtime}: connects over WebSocket, one guarded write with its epoch, exits cleanly${why}`,
      { timeout: TEST_TIMEOUT },
      async () => {
        // The holder takes the key (after the grace where the key is new
        // on a server without markers, or the last run's tombstone is
        // gone), so that the example starts against a held key, whatever
        // its start-up costs.
        const held = await guardUntil(holder, edgeKey, (l) => l.epoch, 10_000);
        assert.ok(
          held > edgeEpoch,
          `holder's epoch ${held} after ${edgeEpoch}`,
        );
        const edge = start(runtime, "edge.ts", {
          LEASE_KEY: edgeKey,
          NODE_ID: `edge-${runtime}`,
        });
        await edge.waitFor(
          new RegExp(
            `^\\[edge-${runtime}\\] connected over WebSocket to ${ns.wsUrl}$`,
          ),
        );
        await edge.waitFor(
          new RegExp(
            `^\\[edge-${runtime}\\] Lease on '${edgeKey}' is held by node 'edge-holder'$`,
          ),
        );
        const seen = events.length;
        await holder.release(edgeKey);
        const releasedAt = performance.now();
        await sleep(10); // events are dispatched in a microtask
        const [released] = events.slice(seen);
        assert.deepEqual(
          [released?.key, released?.epoch, released?.clean],
          [edgeKey, held, true],
          "the holder's release must be clean for the next to skip the grace",
        );
        const wrote = await edge.waitFor(
          new RegExp(
            `^\\[edge-${runtime}\\] wrote '${edgeKey}' at epoch (\\d+)$`,
          ),
        );
        const epoch = Number(wrote.match[1]);
        await edge.waitFor(
          new RegExp(
            `^\\[edge-${runtime}\\] one guarded write done at epoch ${epoch}$`,
          ),
        );
        await edge.waitFor(
          new RegExp(
            `^\\[edge-${runtime}\\] released '${edgeKey}' and closed the connection$`,
          ),
        );
        await edge.succeeded();
        assert.ok(epoch > held, `epoch ${epoch} after the holder's ${held}`);
        // A clean release lets the waiter write at once, while its
        // tombstone lives (the bucket's max age, the example's 2 s TTL); the
        // example retries every 200 ms, so its next try comes well inside
        // that. A grace waited would print "writes wait out the failover
        // grace" (the NotHolderError the example prints), and hold its write
        // back a TTL (2 s) past the release.
        assert.doesNotMatch(edge.stdout, /grace/, edge.transcript());
        const gap = wrote.at - releasedAt;
        console.log(
          `  [figures] edge.ts under ${runtime}: wrote ${
            gap.toFixed(0)
          } ms after the holder's release`,
        );
        assert.ok(
          gap < EDGE_TTL,
          `wrote ${
            Math.round(gap)
          } ms after the release: a grace (one TTL, ${EDGE_TTL} ms) was waited\n${edge.transcript()}`,
        );
        edgeEpoch = epoch;
      },
    );
  }

  // The worker continues the WebSocket chain on the same key.
  const workerKey = edgeKey;
  for (const runtime of ["deno", "bun", "node"] as const) {
    const skip = runtime === "node"
      ? "Node has no Web Worker global (worker_threads is another API); the issue asks for a Deno Web Worker"
      : undefined;
    const why = runtime === "bun"
      ? " (beyond the issue: Bun has Web Workers too)"
      : skip
      ? ` (skipped: ${skip})`
      : "";
    test(
      `examples/worker.ts under ${runtime}: the lease manager runs in a Web Worker and posts its epoch back${why}`,
      { skip },
      async () => {
        const worker = start(runtime, "worker.ts", { LEASE_KEY: workerKey });
        await worker.waitFor(
          new RegExp(
            `^\\[main\\] the worker \\(worker-[0-9a-f]{8}\\) wrote '${workerKey}' at epoch \\d+, released the lease and closed its connection$`,
          ),
        );
        await worker.succeeded();
      },
    );
  }

  test(
    `examples/fenced_store.ts under ${self} (the runtime running this file): the store rejects the late write of a replaced holder`,
    { timeout: TEST_TIMEOUT },
    async () => {
      const key = unique("ledger");
      const fenced = start(self, "fenced_store.ts", { LEASE_KEY: key });
      const a1 = await fenced.waitFor(
        /^store {3}accepted 'a1' at epoch (\d+)$/,
      );
      await fenced.waitFor(
        /^node-a {2}checked its lease \(epoch \d+\), then froze$/,
      );
      await fenced.waitFor(/^node-b {2}waits: '\S+' is held by node-a$/);
      await fenced.waitFor(/^node-b {2}waits out the failover grace$/);
      const b1 = await fenced.waitFor(
        /^store {3}accepted 'b1' at epoch (\d+)$/,
      );
      assert.ok(Number(b1.match[1]) > Number(a1.match[1]));
      await fenced.waitFor(
        new RegExp(
          `^store {3}rejected node-a's 'a2': stale epoch ${
            a1.match[1]
          }: the store already accepted epoch ${b1.match[1]}$`,
        ),
      );
      await fenced.waitFor(/^store {3}holds \["a1","b1"\]$/);
      assert.doesNotMatch(fenced.stdout, /should not happen/);
      await fenced.succeeded();
    },
  );

  test(
    `examples/fenced_bucket.ts under ${self} (the runtime running this file): the server refuses a frozen holder's late write, and a killed holder's key is taken in milliseconds`,
    { timeout: TEST_TIMEOUT, skip: FENCED },
    async () => {
      const ex = start(self, "fenced_bucket.ts", {
        LEASE_KEY: unique("ledger"),
      });
      const a = await ex.waitFor(/^node-a {2}took '\S+' at epoch (\d+)$/);
      await ex.waitFor(/^node-a {2}checked its lease, then froze for 3 s$/);
      const b = await ex.waitFor(
        /^node-b {2}took '\S+' at epoch (\d+), ([\d.]+) s after node-a froze \(session-ended\), and stored 50$/,
      );
      assert.ok(Number(b.match[1]) > Number(a.match[1]));
      // One TTL (1 s) after node-a's last renewal, with no grace.
      assert.ok(Number(b.match[2]) <= 2.5, b.match[0]);
      await ex.waitFor(
        new RegExp(
          `^node-a {2}woke; .*the server refused a write of the tenure at epoch ${
            a.match[1]
          }, as the key's tenure entry is now at revision ${b.match[1]}$`,
        ),
      );
      await ex.waitFor(/^node-b {2}balance is 50 \(node-b\)$/);
      const c = await ex.waitFor(
        /^node-b {2}took '\S+' (\d+) ms after node-c was killed \(crashed\), and stored 40$/,
      );
      // Far inside the 1 s TTL: the server said node-c's connection is gone.
      assert.ok(Number(c.match[1]) < 500, c.match[0]);
      await ex.waitFor(/^node-b {2}balance is 40 \(node-b\)$/);
      assert.doesNotMatch(ex.stdout, /should not happen/);
      await ex.succeeded();
    },
  );

  test(
    `examples/semaphore.ts under ${self} (the runtime running this file): five builders, two slots, never more than two at once; another limit is refused; await using releases a slot`,
    { timeout: TEST_TIMEOUT },
    async () => {
      const sem = start(self, "semaphore.ts", { SEM_NAME: unique("reports") });
      const builds = [];
      let from = 0;
      for (let i = 0; i < 5; i++) {
        const b = await sem.waitFor(
          /^builder-(\d) builds in slot ([01]) \('(\S+)', epoch (\d+)\)$/,
          from,
        );
        builds.push(b);
        from = b.index + 1;
      }
      assert.equal(new Set(builds.map((b) => b.match[1])).size, 5);
      for (const b of builds) {
        assert.ok(b.match[3]!.endsWith(`.n2.${b.match[2]}`), b.match[0]);
      }
      await sem.waitFor(/^at most 2 builds ran at once$/);
      await sem.waitFor(/^builder-1 refused: asked 3, the bucket records 2$/);
      await sem.waitFor(/^builder-2 holds slot [01] for longer work$/);
      await sem.waitFor(/^slots held after the block: 0$/);
      assert.doesNotMatch(sem.stdout, /should not happen/);
      await sem.succeeded();
    },
  );

  test(
    `examples/shards.ts under ${self} (the runtime running this file): workers join and balance, unmoved shards keep their epoch, a leaver's shards are owned again at once, the fenced store refuses nothing`,
    { timeout: TEST_TIMEOUT },
    async () => {
      const ex = start(self, "shards.ts", { SHARDS_GROUP: unique("orders") });
      const list = (name: string) => `${name} \\[(\\d+(?: \\d+)*)\\]`;
      const sizes = (m: RegExpMatchArray) =>
        m.slice(1).map((l) => l.split(" ").length);
      const one = await ex.waitFor(
        new RegExp(`^worker-1 joined: ${list("worker-1")}$`),
      );
      assert.deepEqual(sizes(one.match), [12]);
      const two = await ex.waitFor(
        new RegExp(
          `^worker-2 joined: ${list("worker-1")}, ${list("worker-2")}$`,
        ),
      );
      assert.deepEqual(sizes(two.match), [6, 6]);
      await ex.waitFor(/^ {2}6 shards moved, 6 kept their lease and epoch$/);
      const three = await ex.waitFor(
        new RegExp(
          `^worker-3 joined: ${list("worker-1")}, ${list("worker-2")}, ${
            list("worker-3")
          }$`,
        ),
      );
      assert.deepEqual(sizes(three.match), [4, 4, 4]);
      // The minimum: worker-3's 4 shards, the other 8 kept.
      await ex.waitFor(/^ {2}4 shards moved, 8 kept their lease and epoch$/);
      const left = await ex.waitFor(
        new RegExp(
          `^worker-2 left: its 4 shards were owned again after (\\d+) ms: ${
            list("worker-1")
          }, ${list("worker-3")}$`,
        ),
      );
      assert.deepEqual(sizes(left.match).slice(1), [6, 6]);
      // Released, not expired: far below the 2 s TTL and its grace (not a
      // speed target: bench/shards.ts measures that).
      assert.ok(Number(left.match[1]) < 1_000, ex.transcript());
      const done = await ex.waitFor(
        /^store: (\d+) writes, 0 refused \(a stale epoch\)$/,
      );
      assert.ok(Number(done.match[1]) > 0);
      await ex.succeeded();
    },
  );

  /**
   * The revisions a demo "why A → B" line accounts for ("2–4 were ...",
   * "12 was ..."), each one, in order.
   */
  const skipped = (line: string): number[] =>
    [...line.matchAll(/(\d+)(?:–(\d+))? (?:was|were) /g)].flatMap((m) => {
      const first = Number(m[1]);
      const last = Number(m[2] ?? m[1]);
      return Array.from({ length: last - first + 1 }, (_, i) => first + i);
    });
  /** The revisions strictly between two epochs. */
  const revisionsBetween = (from: string, to: string): number[] =>
    Array.from(
      { length: Number(to) - Number(from) - 1 },
      (_, i) => Number(from) + 1 + i,
    );

  test(
    `examples/demo.ts under ${self} (the runtime running this file): the timeline shows contention, a crash with failover after TTL + grace, and a clean handover`,
    { timeout: TEST_TIMEOUT },
    async () => {
      // Without NATS_URL the demo starts its own server, as `scripts/demo.sh`
      // does for a new user.
      const demo = start(self, "demo.ts", { NATS_URL: "" });
      await demo.waitFor(
        /^Started nats-server \S+ on nats:\/\/127\.0\.0\.1:\d+/,
      );
      await demo.waitFor(
        /demo +fresh key: node-\w wrote \d+ ms after it was ready/,
      );
      await demo.waitFor(/ node-\w +waiting: 'orders' is held by node-\w$/);
      const crash = await demo.waitFor(/^── node-\w crashes \(SIGKILL\)/);
      // The successor says it took the key, and how much grace is left,
      // before the grace ends and it writes at that epoch.
      const took = await demo.waitFor(
        /(node-\w) +took 'orders' \(epoch (\d+)\), waiting out the failover grace \((\d+) ms left\) before its first write$/,
        crash.index,
      );
      const [, successor, epoch, left] = took.match;
      assert.ok(
        Number(left) > 0 && Number(left) <= 1_000,
        `grace left ${left} ms\n${demo.transcript()}`,
      );
      const firstWrite = await demo.waitFor(
        new RegExp(`${successor} +write #1 under the lease, epoch ${epoch}$`),
        crash.index,
      );
      assert.ok(firstWrite.index > took.index, demo.transcript());
      const failover = await demo.waitFor(
        /demo +failover: node-\w wrote (\d+) ms after the crash, epoch (\d+) → (\d+)$/,
      );
      assert.ok(Number(failover.match[1]) >= 1_000, demo.transcript());
      assert.ok(Number(failover.match[3]) > Number(failover.match[2]));
      assert.equal(failover.match[3], epoch, demo.transcript());
      // Each jump of epochs is explained as it is shown; the first also
      // says why epochs jump at all.
      const why = await demo.waitFor(
        /demo +why (\d+) → (\d+): an epoch is the KV revision its tenure began at, and every write to the bucket takes the next revision: \d+(–\d+)? (was|were) .+, so (node-\w)'s take got (\d+)$/,
        failover.index,
      );
      const clean = await demo.waitFor(/^── node-\w shuts down cleanly/);
      assert.ok(why.index < clean.index, demo.transcript());
      assert.deepEqual(
        [why.match[1], why.match[2], why.match[5], why.match[6]],
        [failover.match[2], epoch, successor, epoch],
      );
      assert.deepEqual(
        skipped(why.match.input!),
        revisionsBetween(failover.match[2]!, epoch!),
        demo.transcript(),
      );
      const handover = await demo.waitFor(
        /demo +handover: node-\w wrote (\d+) ms after it was told to stop, with no grace, epoch (\d+) → (\d+)$/,
      );
      // Timed from the SIGINT, so it includes the old holder's close():
      // the demo's 1 s TTL allows for that on a loaded machine and stays
      // far below the expiry and the grace (at least 5/3 TTL) a handover
      // without a clean release would wait. Not a speed target.
      assert.ok(Number(handover.match[1]) < 1_000, demo.transcript());
      assert.ok(Number(handover.match[3]) > Number(handover.match[2]));
      // The second jump: the old holder's renewals (of its grace too), then
      // its release, a delete that takes a revision of its own.
      const why2 = await demo.waitFor(
        /demo +why (\d+) → (\d+): (?!an epoch)\d+(–\d+)? (was|were) .+, (\d+) was (node-\w)'s release \(the delete its close\(\) wrote, tagged so that the next holder owes no grace\), so node-\w's take got (\d+)$/,
        handover.index,
      );
      assert.deepEqual(
        [why2.match[1], why2.match[2], why2.match[6], why2.match[7]],
        [
          handover.match[2],
          handover.match[3],
          successor,
          handover.match[3],
        ],
        demo.transcript(),
      );
      assert.equal(
        Number(why2.match[5]),
        Number(handover.match[3]) - 1,
        demo.transcript(),
      );
      assert.match(
        why2.match.input!,
        new RegExp(
          `^.*${successor}'s renewals \\(every 333 ms while it waited out the grace, then`,
        ),
        demo.transcript(),
      );
      assert.deepEqual(
        skipped(why2.match.input!),
        revisionsBetween(handover.match[2]!, handover.match[3]!),
        demo.transcript(),
      );
      await demo.waitFor(/^ {2}✓ one writer at a time, 3 tenures/);
      assert.equal(
        demo.stdout.match(/ demo +why /g)?.length,
        2,
        demo.transcript(),
      );
      await demo.succeeded();
    },
  );
});
