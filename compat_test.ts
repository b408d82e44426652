// Cross-language test: our lease manager and the Go reference design
// (../shared/reference/lease.go, run by compat/go/main.go) share one bucket
// on a real nats-server and must exclude each other. Both sides use the
// default bucket "leases", the store key as the KV key, the node id as the
// raw value and the bucket TTL as the lease TTL.
//
// The Go program is built at test time: lease.go is copied from the shared
// reference (never into this repo) into a temp dir beside compat/go's files,
// and the binary is cached under .tools/compat-go/<hash of the inputs>/. The
// tests skip, saying why, only when lease.go or the Go toolchain is missing.
//
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary (see test_util/nats_server.ts).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { type KV, Kvm } from "@nats-io/kv";
import {
  createLeaseManager,
  type Lease,
  type LeaseManager,
  NotHolderError,
  UnavailableError,
} from "./mod.ts";
import { NatsServer } from "./test_util/nats_server.ts";

/** Lease TTL on both sides; lease.go renews every TTL/3. */
const TTL = 1000;
/** How long one guarded write lasts, on either side. */
const HOLD = 20;
/** Pause between two guards of one contending loop, on either side. */
const PAUSE = 10;
/** How long to wait for one expected event. */
const EVENT_TIMEOUT = 10_000;
const TEST_TIMEOUT = 30_000;

const root = fileURLToPath(new URL(".", import.meta.url));
const reference = path.resolve(root, "../shared/reference/lease.go");
const goSources = path.join(root, "compat/go");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------
// Building the Go node.

function findGo(): string | undefined {
  for (const dir of (process.env.PATH ?? "").split(path.delimiter)) {
    if (dir !== "" && isExecutable(path.join(dir, "go"))) {
      return path.join(dir, "go");
    }
  }
  return isExecutable("/usr/local/go/bin/go")
    ? "/usr/local/go/bin/go"
    : undefined;
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

const go = findGo();
const skip = !fs.existsSync(reference)
  ? `the Go reference ${reference} is missing (CI keeps a read-only copy of shared/ beside the clone)`
  : go === undefined
  ? "no Go toolchain: 'go' is neither on PATH nor at /usr/local/go/bin/go"
  : undefined;

/** The build's inputs, as [path in the build dir, source file]. */
const inputs: [string, string][] = [
  ["go.mod", path.join(goSources, "go.mod")],
  ["go.sum", path.join(goSources, "go.sum")],
  ["main.go", path.join(goSources, "main.go")],
  ["lease/lease.go", reference],
];

/**
 * Builds the Go node, or returns the binary cached for the same inputs and
 * toolchain. Runs once, at load time, so that no runtime's hook or test
 * timeout cuts a first build (with module downloads) short.
 */
function buildGoNode(goBin: string): string {
  const hash = createHash("sha256");
  hash.update(
    execFileSync(goBin, ["env", "GOVERSION", "GOOS", "GOARCH"], {
      encoding: "utf8",
    }),
  );
  for (const [name, file] of inputs) {
    hash.update(`\0${name}\0`).update(fs.readFileSync(file));
  }
  const cache = path.join(root, ".tools/compat-go");
  const dir = path.join(cache, hash.digest("hex").slice(0, 16));
  const binary = path.join(dir, "lease-compat");
  if (isExecutable(binary)) return binary;

  const work = fs.mkdtempSync(path.join(os.tmpdir(), "lease-compat-"));
  try {
    for (const [name, file] of inputs) {
      fs.mkdirSync(path.dirname(path.join(work, name)), { recursive: true });
      fs.copyFileSync(file, path.join(work, name));
    }
    fs.mkdirSync(dir, { recursive: true });
    // Built beside its final name and renamed, so a concurrent run never
    // sees half a binary.
    const partial = `${binary}.${process.pid}.tmp`;
    try {
      execFileSync(goBin, ["build", "-o", partial, "."], {
        cwd: work,
        env: { ...process.env, GOWORK: "off" },
        stdio: ["ignore", "pipe", "pipe"],
        timeout: 600_000,
      });
    } catch (error) {
      const out = error as { stdout?: Buffer; stderr?: Buffer };
      throw new Error(
        `Cannot build the Go node (compat/go with ${reference}) using ${goBin}:\n${
          out.stderr?.toString() ?? ""
        }${out.stdout?.toString() ?? ""}`,
        { cause: error },
      );
    }
    fs.renameSync(partial, binary);
    // Binaries of older inputs are never used again.
    for (const old of fs.readdirSync(cache)) {
      if (old !== path.basename(dir)) {
        fs.rmSync(path.join(cache, old), { recursive: true, force: true });
      }
    }
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
  return binary;
}

let goNode: string | undefined;
let buildError: unknown;
if (skip !== undefined) {
  // Bun and Deno do not print a skip reason.
  console.warn(`compat_test.ts: skipping the Go compatibility tests: ${skip}`);
} else {
  try {
    goNode = buildGoNode(go!);
  } catch (error) {
    buildError = error;
  }
}

// ---------------------------------------------------------------------------
// Nodes and their writes.

/** One guarded write, in Unix milliseconds (both sides use the wall clock). */
interface Write {
  node: string;
  start: number;
  end: number;
  /** Our epoch, or the revision a Go write saw its own entry at. */
  epoch: number;
}

/** A line the Go node prints (compat/go/main.go documents them). */
interface GoEvent {
  ev: "ready" | "start" | "end" | "refused" | "exit";
  t: number;
  node: string;
  pid?: number;
  rev?: number;
  kind?: "not_holder" | "unavailable" | "other";
  err?: string;
  writes?: number;
}

/** A process running the Go reference manager in a Guard loop on one key. */
class GoNode {
  readonly node: string;
  readonly events: GoEvent[] = [];
  readonly exited: Promise<number | null>;
  readonly #child: ChildProcess;
  readonly #wake = new Set<() => void>();
  #stderr = "";
  #done = false;

  constructor(url: string, node: string, key: string, duration: number) {
    this.node = node;
    this.#child = spawn(goNode!, [
      "-server",
      url,
      "-node",
      node,
      "-key",
      key,
      "-ttl",
      `${TTL}ms`,
      "-duration",
      `${duration}ms`,
      "-hold",
      `${HOLD}ms`,
      "-pause",
      `${PAUSE}ms`,
    ], { stdio: ["ignore", "pipe", "pipe"] });
    let partial = "";
    this.#child.stdout!.setEncoding("utf8");
    this.#child.stdout!.on("data", (chunk: string) => {
      const lines = (partial + chunk).split("\n");
      partial = lines.pop()!;
      for (const line of lines) {
        try {
          this.events.push(JSON.parse(line) as GoEvent);
        } catch {
          this.#stderr += `(stdout) ${line}\n`;
        }
      }
      this.#notify();
    });
    this.#child.stderr!.setEncoding("utf8");
    this.#child.stderr!.on("data", (chunk: string) => this.#stderr += chunk);
    this.#child.on("error", (error) => this.#stderr += `(spawn) ${error}\n`);
    this.exited = new Promise((resolve) => {
      this.#child.once("close", (code) => {
        this.#done = true;
        this.#notify();
        resolve(code);
      });
    });
  }

  #notify(): void {
    for (const wake of this.#wake) wake();
  }

  /** Waits for an event matching `pred`, `what` naming it in the error. */
  waitFor(what: string, pred: (e: GoEvent) => boolean): Promise<GoEvent> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () =>
          finish(
            new Error(
              `${this.node}: no ${what} within ${EVENT_TIMEOUT} ms\n${this.transcript()}`,
            ),
          ),
        EVENT_TIMEOUT,
      );
      const finish = (result: GoEvent | Error) => {
        clearTimeout(timer);
        this.#wake.delete(check);
        if (result instanceof Error) reject(result);
        else resolve(result);
      };
      const check = () => {
        const hit = this.events.find(pred);
        if (hit) finish(hit);
        else if (this.#done) {
          finish(
            new Error(
              `${this.node} exited without ${what}\n${this.transcript()}`,
            ),
          );
        }
      };
      this.#wake.add(check);
      check();
    });
  }

  /** Waits for a clean exit (code 0, "exit" event printed). */
  async finished(): Promise<GoEvent> {
    const code = await this.exited;
    assert.equal(
      code,
      0,
      `${this.node} exited with ${code}\n${this.transcript()}`,
    );
    return await this.waitFor("exit event", (e) => e.ev === "exit");
  }

  signal(signal: "SIGTERM" | "SIGKILL"): void {
    if (this.#done || this.#child.pid === undefined) return;
    try {
      process.kill(this.#child.pid, signal);
    } catch {
      // Already gone.
    }
  }

  /** The writes it printed, paired start to end. */
  writes(): Write[] {
    const out: Write[] = [];
    let open: GoEvent | undefined;
    for (const e of this.events) {
      if (e.ev === "start") open = e;
      if (e.ev === "end" && open) {
        out.push({
          node: this.node,
          start: open.t,
          end: e.t,
          epoch: open.rev ?? 0,
        });
        open = undefined;
      }
    }
    return out;
  }

  refusals(): GoEvent[] {
    return this.events.filter((e) => e.ev === "refused");
  }

  transcript(): string {
    const lines = this.events.map((e) => JSON.stringify(e));
    return `--- ${this.node} ---\n${lines.join("\n")}\n${this.#stderr}---`;
  }
}

/** Our manager guarding writes in a loop on one key, as the Go node does. */
class TsLoop {
  readonly m: LeaseManager;
  readonly key: string;
  readonly writes: Write[] = [];
  readonly refusals: { t: number; error: NotHolderError | UnavailableError }[] =
    [];
  /** Writes whose lease signal aborted before they ended (must stay 0). */
  aborted = 0;
  #stopped = false;
  #failed: { error: unknown } | undefined;
  readonly #done: Promise<void>;
  readonly #wake = new Set<() => void>();

  constructor(m: LeaseManager, key: string) {
    this.m = m;
    this.key = key;
    // Anything but a refusal ends the loop; wrote() and stop() rethrow it.
    this.#done = this.#run().catch((error) => {
      this.#failed = { error };
      for (const wake of this.#wake) wake();
    });
  }

  async #run(): Promise<void> {
    while (!this.#stopped) {
      try {
        await this.m.guard(this.key, async (lease: Lease) => {
          const start = Date.now();
          await sleep(HOLD);
          if (lease.signal.aborted) this.aborted++;
          this.writes.push({
            node: lease.node,
            start,
            end: Date.now(),
            epoch: lease.epoch,
          });
        });
      } catch (error) {
        if (
          !(error instanceof NotHolderError ||
            error instanceof UnavailableError)
        ) {
          throw error;
        }
        this.refusals.push({ t: Date.now(), error });
      }
      for (const wake of this.#wake) wake();
      await sleep(PAUSE);
    }
  }

  /** Waits until this loop has written `n` times. */
  async wrote(n: number, limit = EVENT_TIMEOUT): Promise<Write> {
    const end = performance.now() + limit;
    while (this.writes.length < n) {
      if (this.#failed) throw this.#failed.error;
      if (performance.now() > end) {
        throw new Error(
          `${this.m.node}: ${this.writes.length} of ${n} writes within ${limit} ms; refusals: ${
            this.refusals.slice(-5).map((r) => r.error.message).join(" | ")
          }`,
        );
      }
      await new Promise<void>((r) => {
        const wake = () => {
          this.#wake.delete(wake);
          r();
        };
        this.#wake.add(wake);
      });
    }
    return this.writes[n - 1]!;
  }

  /** Stops after the guard in progress; rethrows what the loop threw. */
  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#done;
    if (this.#failed) throw this.#failed.error;
  }
}

/** Asserts that no two writes of different nodes overlap in time. */
function assertNoOverlap(writes: Write[]): void {
  const sorted = [...writes].sort((a, b) => a.start - b.start);
  for (let i = 0; i < sorted.length; i++) {
    for (
      let j = i + 1;
      j < sorted.length && sorted[j]!.start < sorted[i]!.end;
      j++
    ) {
      const [a, b] = [sorted[i]!, sorted[j]!];
      assert.ok(
        a.node === b.node,
        `writes overlap: ${a.node} [${a.start}, ${a.end}] and ${b.node} [${b.start}, ${b.end}]`,
      );
    }
  }
}

function span(writes: Write[]): { first: number; last: number } {
  return {
    first: Math.min(...writes.map((w) => w.start)),
    last: Math.max(...writes.map((w) => w.end)),
  };
}

// ---------------------------------------------------------------------------

describe("wire compatibility with the Go reference (lease.go) on one bucket", () => {
  let ns: NatsServer;
  let raw: KV | undefined;
  const servers: NatsServer[] = [];
  const conns: NatsConnection[] = [];
  const managers: LeaseManager[] = [];
  const goNodes: GoNode[] = [];

  async function conn(url: string): Promise<NatsConnection> {
    const nc = await connect({
      servers: url,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 100,
    });
    conns.push(nc);
    return nc;
  }

  /** A manager on its own connection, on the default bucket "leases". */
  async function manager(
    node: string,
    url = ns.url,
  ): Promise<LeaseManager> {
    const m = await createLeaseManager({
      nc: await conn(url),
      node,
      ttl: TTL,
    });
    managers.push(m);
    return m;
  }

  function goNodeOn(
    url: string,
    node: string,
    key: string,
    duration: number,
  ): GoNode {
    const g = new GoNode(url, node, key, duration);
    goNodes.push(g);
    return g;
  }

  /** Guards until the write runs (through the grace), returning its epoch. */
  async function guardUntil(m: LeaseManager, key: string): Promise<number> {
    const end = performance.now() + EVENT_TIMEOUT;
    for (;;) {
      try {
        return await m.guard(key, (l) => l.epoch);
      } catch (error) {
        const retry = error instanceof NotHolderError ||
          error instanceof UnavailableError;
        if (!retry || performance.now() > end) throw error;
        await sleep(PAUSE);
      }
    }
  }

  before(async () => {
    if (skip !== undefined) return;
    if (buildError !== undefined) throw buildError;
    ns = await NatsServer.start();
    servers.push(ns);
  });

  after(async () => {
    for (const g of goNodes) g.signal("SIGKILL");
    await Promise.all(goNodes.map((g) => g.exited));
    await Promise.allSettled(managers.map((m) => m.close()));
    await Promise.allSettled(conns.map((nc) => nc.close()));
    await Promise.allSettled(servers.map((s) => s[Symbol.asyncDispose]()));
  });

  /** A plain KV handle on the shared bucket, opened once it exists. */
  async function rawKv(): Promise<KV> {
    raw ??= await new Kvm(await conn(ns.url)).open("leases");
    return raw;
  }

  test(
    "guard() rejects with NotHolderError naming the Go node while it holds, and writes never overlap across handovers both ways",
    { skip, timeout: TEST_TIMEOUT },
    async () => {
      // The Go node goes first, so lease.New creates the bucket and our
      // manager adopts it.
      const a = goNodeOn(ns.url, "go-a", "k", 2000);
      await a.waitFor("first write", (e) => e.ev === "start");
      const m = await manager("ts-1");
      assert.equal(m.bucket, "leases");
      assert.equal(m.ttl, TTL);

      const refused = await m.guard("k", () => "wrote").catch((e) => e);
      assert.ok(refused instanceof NotHolderError, String(refused));
      assert.equal(refused.key, "k");
      assert.equal(refused.holder, "go-a");
      assert.equal(refused.retryAfter, undefined);
      assert.match(refused.message, /held by node 'go-a'/);

      // Both contend: the Go node runs out and its lease expires, ours takes
      // over; then a second Go node contends until we close.
      const ours = new TsLoop(m, "k");
      await a.finished();
      await ours.wrote(1);
      const b = goNodeOn(ns.url, "go-b", "k", 10_000);
      await b.waitFor("refusal", (e) => e.ev === "refused");
      await ours.wrote(ours.writes.length + 10);
      await ours.stop();
      await m.close();
      await b.waitFor("first write", (e) => e.ev === "start");
      await b.waitFor(
        "third write",
        (e) => e.ev === "end" && b.writes().length >= 3,
      );
      b.signal("SIGTERM");
      await b.finished();

      const [wa, wo, wb] = [a.writes(), ours.writes, b.writes()];
      const context = `\n${a.transcript()}\n${b.transcript()}\nours: ${
        JSON.stringify(wo)
      }`;
      assert.ok(wa.length > 0 && wo.length > 0 && wb.length > 0, context);
      assertNoOverlap([...wa, ...wo, ...wb]);
      assert.ok(
        ours.refusals.some((r) => r.t < span(wa).last),
        `we contended while go-a wrote${context}`,
      );
      assert.ok(
        span(wa).last <= span(wo).first,
        `go-a wrote after us${context}`,
      );
      assert.ok(
        span(wo).last <= span(wb).first,
        `go-b wrote before we closed${context}`,
      );
      assert.equal(
        ours.aborted,
        0,
        "no lease signal aborted during our writes",
      );
      // Every refusal before our takeover names the Go node.
      for (const r of ours.refusals.filter((r) => r.t < span(wo).first)) {
        assert.ok(r.error instanceof NotHolderError, r.error.message);
        assert.ok(
          r.error.holder === "go-a" || r.error.retryAfter !== undefined,
          r.error.message,
        );
      }
      // One tenure, fenced above every revision the Go node wrote at.
      const epochs = new Set(wo.map((w) => w.epoch));
      assert.equal(epochs.size, 1, `epochs ${[...epochs]}`);
      const maxA = Math.max(...wa.map((w) => w.epoch));
      assert.ok(
        wo[0]!.epoch > maxA,
        `epoch ${wo[0]!.epoch} after go-a's ${maxA}`,
      );
      assert.ok(
        Math.min(...wb.map((w) => w.epoch)) > wo[0]!.epoch,
        `go-b's revisions after our epoch${context}`,
      );
      // go-b's refusals while we held were plain ErrNotHolder.
      const whileOurs = b.refusals().filter((e) => e.t < span(wo).last);
      assert.ok(whileOurs.length > 0, context);
      for (const e of whileOurs) {
        assert.deepEqual([e.kind, e.err], [
          "not_holder",
          "store lease held by another node",
        ]);
      }
    },
  );

  test(
    "the Go node's Guard refuses with ErrNotHolder while our node holds, on a bucket our manager created",
    { skip, timeout: TEST_TIMEOUT },
    async () => {
      // A server of its own, so that our manager creates the bucket (with
      // expiry markers, on 2.11.2 and later) and lease.New finds it: its
      // CreateKeyValue fails on the different configuration, and it binds
      // the bucket as it is.
      const ns2 = await NatsServer.start();
      servers.push(ns2);
      const m = await manager("ts-2", ns2.url);
      const epoch = await guardUntil(m, "k");
      const ours = new TsLoop(m, "k");
      const c = goNodeOn(ns2.url, "go-c", "k", 1200);
      await c.finished();
      await ours.wrote(ours.writes.length + 3);
      await ours.stop();

      assert.deepEqual(c.writes(), [], c.transcript());
      const refusals = c.refusals();
      assert.ok(refusals.length >= 10, c.transcript());
      for (const e of refusals) {
        assert.deepEqual([e.kind, e.err], [
          "not_holder",
          "store lease held by another node",
        ]);
      }
      // Our tenure went on undisturbed while the Go node tried.
      assert.deepEqual(ours.refusals, []);
      assert.ok(ours.writes.every((w) => w.epoch === epoch));
      assert.deepEqual(await m.holder("k"), { node: "ts-2", epoch });
      await m.close();
    },
  );

  test(
    "close() deletes our entry by compare-and-delete and the Go node's Create takes the key at once",
    { skip, timeout: TEST_TIMEOUT },
    async () => {
      const m = await manager("ts-3");
      const epoch = await guardUntil(m, "k3");
      const d = goNodeOn(ns.url, "go-d", "k3", 10_000);
      await d.waitFor("refusal", (e) => e.ev === "refused");
      const closing = Date.now();
      await m.close();
      const closed = Date.now();

      // lease.go waits its own grace after a takeover from a foreign holder,
      // and says so: that refusal marks its acquisition.
      const took = await d.waitFor(
        "acquisition",
        (e) => e.ev === "refused" && /acquisition grace/.test(e.err ?? ""),
      );
      const entry = await (await rawKv()).get("k3");
      assert.equal(entry?.string(), "go-d");
      assert.ok(entry!.revision > epoch);
      // An expiry would take at least 2/3 TTL after our last renewal.
      assert.ok(
        took.t - closed < TTL / 2,
        `go-d acquired ${took.t - closed} ms after close() (which took ${
          closed - closing
        } ms)`,
      );
      const first = await d.waitFor("first write", (e) => e.ev === "start");
      console.log(
        `  [figures] Go node after our close(): acquired after ${
          took.t - closed
        } ms, first write ${
          first.t - took.t
        } ms after that (its grace ${TTL} ms)`,
      );
      // lease.go writes once its own grace (one TTL from its Create) is
      // over, retrying every PAUSE ms: it kept the key it took. Losing it
      // and taking it again would cost a second grace, so the bound is two
      // TTLs; how soon after its grace it writes is lease.go's affair, not a
      // speed this test holds it to.
      assert.ok(first.t - took.t < 2 * TTL, d.transcript());
      d.signal("SIGTERM");
      await d.finished();
    },
  );

  test(
    "guard() takes over after the Go node stops and its lease expires, waits the grace, and writes at a greater epoch",
    { skip, timeout: TEST_TIMEOUT },
    async () => {
      const e = goNodeOn(ns.url, "go-e", "k4", 20_000);
      // Ten writes take longer than one renewal period.
      await e.waitFor("tenth write", () => e.writes().length >= 10);
      const m = await manager("ts-4");
      const ours = new TsLoop(m, "k4");
      while (ours.refusals.length < 3) await sleep(PAUSE);
      e.signal("SIGTERM");
      const exit = await e.finished();
      // The Go node's last renewal is still in the bucket, unexpired.
      const last = await (await rawKv()).get("k4");
      const lastRev = last?.string() === "go-e"
        ? last.revision
        : Math.max(...e.writes().map((w) => w.epoch));

      const first = await ours.wrote(1);
      await ours.stop();
      const waited = first.start - exit.t;
      // lease.go renewed at most TTL/3 before Close, so its entry lived at
      // least 2/3 TTL past the exit; our grace adds a TTL.
      assert.ok(
        waited >= 1.5 * TTL,
        `wrote ${waited} ms after the Go node exited`,
      );
      // Liveness: the expiry (at most a TTL after the exit, the server up to
      // ~250 ms late) and our grace; the rest is for a loaded machine.
      assert.ok(
        waited < 2 * TTL + 1000,
        `wrote ${waited} ms after the Go node exited`,
      );
      assert.ok(
        first.epoch > lastRev,
        `epoch ${first.epoch} after go-e's revision ${lastRev}`,
      );
      assertNoOverlap([...e.writes(), ...ours.writes]);

      // Refused while the Go node held, then during our grace.
      const holding = ours.refusals.filter((r) =>
        r.error instanceof NotHolderError && r.error.holder === "go-e"
      );
      const grace = ours.refusals.filter((r) =>
        r.error instanceof NotHolderError && r.error.retryAfter !== undefined
      );
      assert.ok(
        holding.length >= 3,
        ours.refusals.map((r) => r.error.message).join("\n"),
      );
      assert.ok(
        grace.length > 0,
        ours.refusals.map((r) => r.error.message).join("\n"),
      );
      const graceStart = grace[0]!;
      assert.ok(
        first.start - graceStart.t >=
          (graceStart.error as NotHolderError).retryAfter! - 50,
        `wrote ${first.start - graceStart.t} ms after the grace started`,
      );
      assert.deepEqual(await m.holder("k4"), {
        node: "ts-4",
        epoch: first.epoch,
      });
      await m.close();
    },
  );

  test(
    "holder() reports the Go node with the entry's revision as its epoch",
    { skip, timeout: TEST_TIMEOUT },
    async () => {
      // Non-ASCII, as the value is the node id's raw UTF-8 on both sides.
      const f = goNodeOn(ns.url, "go-f-ü", "k5", 20_000);
      await f.waitFor("first write", (e) => e.ev === "start");
      const m = await manager("ts-5");
      const kv = await rawKv();
      // lease.go renews every TTL/3; read again when a renewal lands
      // between the reads.
      for (let i = 0;; i++) {
        const entry = await kv.get("k5");
        const holder = await m.holder("k5");
        const again = await kv.get("k5");
        assert.equal(entry?.string(), "go-f-ü");
        if (entry.revision === again?.revision) {
          assert.deepEqual(holder, { node: "go-f-ü", epoch: entry.revision });
          break;
        }
        assert.ok(i < 20, "the entry kept changing");
      }
      f.signal("SIGTERM");
      await f.finished();
      await m.close();
    },
  );
});
