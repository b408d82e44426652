// Safety regressions of the lease manager against real nats-server
// processes: what a successor, a displaced holder and a closing manager may
// and may not do when an operator deletes an entry, a holder is frozen, a
// reply is lost, a replica lags, or the bucket disappears. Runs under
// `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN picks the
// server binary.
import { after, describe } from "node:test";
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { before, test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import {
  JetStreamApiError,
  type JetStreamManager,
  jetstreamManager,
} from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/nats-core";
import { type KV, Kvm } from "@nats-io/kv";
import {
  createLeaseManager,
  type Lease,
  type LeaseManager,
  type LeaseManagerOptions,
  NotHolderError,
  UnavailableError,
} from "./mod.ts";
import {
  createBucket,
  guardUntil,
  sleep,
  uniq,
} from "./test_util/lease_helpers.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";
import { signal, startChild } from "./test_util/child.ts";
import { NatsProxy } from "./test_util/proxy.ts";
import { ProxiedCluster } from "./test_util/proxied_cluster.ts";

const TTL = 1000;

const versionText = /v?(\d+)\.(\d+)\.(\d+)/.exec(
  execFileSync(natsServerBinary(), ["--version"], { encoding: "utf8" }),
)!;
const [maj, min] = [Number(versionText[1]), Number(versionText[2])];
/** Route compression can be turned off (the proxies read route frames), and replicated CAS is safe. */
const proxiedClusterOk = maj > 2 || (maj === 2 && min >= 10);

async function conn(url: string): Promise<NatsConnection> {
  return await connect({
    servers: url,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
    // Through a proxy, stay behind it: never dial a server it gossips.
    ignoreClusterUpdates: true,
  });
}

async function rawKv(nc: NatsConnection, bucket: string): Promise<KV> {
  return await new Kvm(nc).open(bucket);
}

/** Whether the bucket's stream exists. */
async function bucketExists(
  jsm: JetStreamManager,
  bucket: string,
): Promise<boolean> {
  try {
    await jsm.streams.info(`KV_${bucket}`);
    return true;
  } catch (err) {
    if (err instanceof JetStreamApiError && err.code === 10059) return false;
    throw err;
  }
}

/**
 * The plain puts (a holder's acquisitions and renewals) on the stream after
 * revision `from`; delete markers and server-written markers do not count.
 */
async function putsAfter(
  jsm: JetStreamManager,
  bucket: string,
  from: number,
): Promise<string[]> {
  const last = (await jsm.streams.info(`KV_${bucket}`)).state.last_seq;
  const puts: string[] = [];
  for (let seq = from + 1; seq <= last; seq++) {
    const sm = await jsm.streams.getMessage(`KV_${bucket}`, { seq })
      .catch(() => null);
    if (!sm) continue;
    const op = sm.header?.get("KV-Operation") ?? "";
    const marker = sm.header?.get("Nats-Marker-Reason") ?? "";
    if (op === "" && marker === "") puts.push(`${sm.subject}@${seq}`);
  }
  return puts;
}

/** Guards `key` until a write runs; returns when it started and its epoch. */
function contend(
  m: LeaseManager,
  key: string,
  limit: number,
): Promise<{ t: number; epoch: number }> {
  return guardUntil(
    m,
    key,
    (l) => ({ t: performance.now(), epoch: l.epoch }),
    limit,
  );
}

// ---------------------------------------------------------------------------
// A holder in a child process, to freeze for real.

const CHILD = fileURLToPath(
  new URL("./test_util/lease_safety_child.ts", import.meta.url),
);

interface ChildEvent {
  ev: string;
  t: number;
  epoch?: number;
  aborted?: boolean;
  deadline?: number | null;
  pastDeadline?: boolean;
  threw?: string;
  error?: string;
}

// ---------------------------------------------------------------------------

describe("lease safety on one server", () => {
  let ns: NatsServer;
  let op: NatsConnection; // the operator's connection
  let jsm: JetStreamManager;
  const conns: NatsConnection[] = [];
  const managers: LeaseManager[] = [];

  async function manager(
    opts: Partial<LeaseManagerOptions> & { node: string; bucket: string },
  ): Promise<LeaseManager> {
    const c = await conn(ns.url);
    conns.push(c);
    const m = await createLeaseManager({ ttl: TTL, ...opts, nc: c });
    managers.push(m);
    return m;
  }

  /**
   * A manager (node "a", TTL, 200 ms timeout unless `opts` says otherwise)
   * on its own connection through a proxy to the server. Disposing it lets
   * held frames through, then closes the manager, the connection and the
   * proxy.
   */
  async function proxiedManager(
    bucket: string,
    opts: Partial<LeaseManagerOptions> = {},
  ): Promise<
    { proxy: NatsProxy; nc: NatsConnection; m: LeaseManager } & AsyncDisposable
  > {
    const proxy = await NatsProxy.start(ns.port);
    const nc = await conn(proxy.url);
    const m = await createLeaseManager({
      node: "a",
      ttl: TTL,
      timeout: 200,
      ...opts,
      bucket,
      nc,
    });
    return {
      proxy,
      nc,
      m,
      async [Symbol.asyncDispose]() {
        proxy.release("both");
        await m.close();
        await nc.close();
        await proxy.close();
      },
    };
  }

  before(async () => {
    ns = await NatsServer.start();
    op = await conn(ns.url);
    jsm = await jetstreamManager(op);
  });

  after(async () => {
    await Promise.allSettled(managers.map((m) => m.close()));
    await Promise.allSettled(conns.map((c) => c.close()));
    await op.close();
    await ns[Symbol.asyncDispose]();
  });

  test("guard() after an operator's kv.delete() of a held key first writes once the displaced holder's write has ended and its lease signal has aborted", async () => {
    const bucket = uniq("op");
    const a = await manager({ node: "a", bucket, restartGrace: false });
    const b = await manager({ node: "b", bucket });
    const kv = await rawKv(op, bucket);
    await a.guard("k", () => {});
    let abortedAt = Infinity;
    let aEnd = 0;
    // A's write lasts a TTL; the operator deletes A's entry during it.
    const aWrite = a.guard("k", async ({ signal }) => {
      signal.addEventListener("abort", () => abortedAt = performance.now(), {
        once: true,
      });
      await sleep(TTL);
      aEnd = performance.now();
    });
    // B contends from before the delete, so it has seen A hold the key.
    const bFirst = contend(b, "k", 8 * TTL);
    await sleep(150);
    const removedAt = performance.now();
    await kv.delete("k");
    await aWrite;
    const first = await bFirst;
    const ms = (t: number) => `${(t - removedAt).toFixed(0)} ms`;
    assert.ok(
      first.t >= aEnd,
      `B wrote ${ms(first.t)} after the delete, while A's write ran until ${
        ms(aEnd)
      }`,
    );
    // A's next renewal (due TTL/3 after its last compare-and-set, sent
    // 150 ms before the delete) found the key gone; its deadline, the only
    // other thing that would end the tenure, is about 850 ms after the
    // delete. 250 ms of slack on top of a whole TTL/3 are for a loaded
    // machine.
    assert.ok(
      abortedAt <= removedAt + TTL / 3 + 250,
      `A's lease signal aborted ${ms(abortedAt)} after the delete`,
    );
    assert.ok(first.t >= abortedAt, "B wrote before A's signal aborted");
  });

  for (const how of ["delete", "purge"] as const) {
    test(`guard() after an operator's kv.${how}() of a held key waits out a holder cut off from the server that passes throwIfLost() just before its deadline and then writes for almost a TTL`, async () => {
      const bucket = uniq("cut");
      const proxy = await NatsProxy.start(ns.port);
      const ncA = await conn(proxy.url);
      const a = await createLeaseManager({
        nc: ncA,
        node: "a",
        bucket,
        ttl: TTL,
        timeout: 200,
        restartGrace: false,
      });
      try {
        const b = await manager({ node: "b", bucket });
        const kv = await rawKv(op, bucket);
        await a.guard("k", () => {});
        // B contends from before the removal, so it has seen A hold the key.
        const bFirst = contend(b, "k", 8 * TTL);
        await sleep(50);
        let removedAt = 0;
        let committedAt = 0;
        let aEnd = 0;
        await a.guard("k", async (lease) => {
          proxy.hold("both"); // A is cut off from here on
          removedAt = performance.now();
          if (how === "delete") await kv.delete("k");
          else await kv.purge("k");
          await sleep(lease.deadline - 100 - performance.now());
          lease.throwIfLost(); // A cannot know yet: its commit check passes
          committedAt = performance.now();
          await sleep(TTL - 250); // the commit, within the grace
          aEnd = performance.now();
        });
        const first = await bFirst;
        const ms = (t: number) => `${(t - removedAt).toFixed(0)} ms`;
        assert.ok(
          first.t >= aEnd,
          `B wrote ${
            ms(first.t)
          } after the ${how}, while A (cut off) passed its commit check at ${
            ms(committedAt)
          } and wrote until ${ms(aEnd)}`,
        );
      } finally {
        proxy.release("both");
        await a.close();
        await ncA.close();
        await proxy.close();
      }
    });
  }

  test("close() of a manager still inside its failover grace does not let the next holder skip that grace (the previous holder may still be writing)", async () => {
    const bucket = uniq("grace");
    const frozen = startChild<ChildEvent>(CHILD, {
      NATS_URL: ns.url,
      LEASE_BUCKET: bucket,
      LEASE_KEY: "k",
      LEASE_NODE: "frozen",
      LEASE_TTL: String(TTL),
      LEASE_WRITE_MS: "60000",
    }, { untilMs: 15_000 });
    try {
      await frozen.until((e) => e.ev === "start");
      signal(frozen.pid, "SIGSTOP"); // mid-write, for the rest of the test
      const b = await manager({ node: "b", bucket });
      // B guards until it holds the key and is told to wait out the grace.
      let graceEnd: number | undefined;
      const end = performance.now() + 8 * TTL;
      while (graceEnd === undefined) {
        const t = performance.now();
        const err = await b.guard("k", () => "wrote").catch((e) => e);
        assert.notEqual(err, "wrote", "B wrote without a grace");
        if (err instanceof NotHolderError && err.retryAfter !== undefined) {
          // The grace ends no earlier than this.
          graceEnd = t + err.retryAfter - 1;
        } else {
          assert.ok(
            err instanceof NotHolderError || err instanceof UnavailableError,
            String(err),
          );
          assert.ok(performance.now() < end, "B never acquired");
          await sleep(10);
        }
      }
      await b.close();
      const c = await manager({ node: "c", bucket });
      const first = await contend(c, "k", 8 * TTL);
      assert.ok(
        first.t >= graceEnd,
        `C wrote ${
          (graceEnd - first.t).toFixed(0)
        } ms before B's grace would have ended`,
      );
    } finally {
      await frozen.stop();
    }
  });

  test("Lease.throwIfLost() in a write resumed after a pause of 3×TTL throws, and performance.now() is past lease.deadline, while the new holder writes", async () => {
    const bucket = uniq("pause");
    const paused = startChild<ChildEvent>(CHILD, {
      NATS_URL: ns.url,
      LEASE_BUCKET: bucket,
      LEASE_KEY: "k",
      LEASE_NODE: "paused",
      LEASE_TTL: String(TTL),
      LEASE_WRITE_MS: "300",
      LEASE_WRITES: "1",
    }, { untilMs: 15_000 });
    try {
      await paused.until((e) => e.ev === "start");
      await sleep(20);
      signal(paused.pid, "SIGSTOP");
      const stoppedAt = performance.now();
      const b = await manager({ node: "b", bucket });
      // B's write resumes the paused holder and waits for its report.
      const report = await guardUntil(b, "k", async () => {
        await sleep(stoppedAt + 3 * TTL - performance.now());
        signal(paused.pid, "SIGCONT");
        return await paused.until((e) => e.ev === "end", 5_000);
      }, 10 * TTL);
      assert.ok(
        report.threw === "UnavailableError" ||
          report.threw === "NotHolderError",
        `throwIfLost() ${
          report.threw === "none" ? "returned" : report.threw
        } in the resumed write (signal.aborted: ${report.aborted})`,
      );
      assert.equal(
        report.pastDeadline,
        true,
        `performance.now() not past lease.deadline ${report.deadline}`,
      );
    } finally {
      await paused.stop();
    }
  });

  test("guard() whose acquiring compare-and-set lost its reply recognises its own entry: it never names itself as the holder and writes after one TTL, not two", async () => {
    const bucket = uniq("lost");
    await using p = await proxiedManager(bucket);
    const { proxy, m } = p;
    // The reply to the first compare-and-set on the key comes too late.
    let armed = true;
    proxy.onFrame = (f, dir) => {
      if (armed && dir === "up" && f.subject === `$KV.${bucket}.k`) {
        armed = false;
        proxy.holdFor("down", 300);
      }
    };
    const t0 = performance.now();
    const errors: Error[] = [];
    let first: { t: number; epoch: number } | undefined;
    while (!first) {
      try {
        first = await m.guard("k", (l) => ({
          t: performance.now(),
          epoch: l.epoch,
        }));
      } catch (err) {
        assert.ok(
          err instanceof NotHolderError || err instanceof UnavailableError,
          String(err),
        );
        errors.push(err);
        assert.ok(performance.now() - t0 < 5 * TTL, "never wrote");
        await sleep(5);
      }
    }
    assert.equal(armed, false, "no compare-and-set went through the proxy");
    assert.ok(
      errors[0] instanceof UnavailableError,
      `the first guard did not lose its reply: ${errors[0]}`,
    );
    const self = errors.filter((e) =>
      e instanceof NotHolderError && e.holder === "a"
    );
    assert.equal(
      self.length,
      0,
      `NotHolderError naming this node ${self.length}×: ${self[0]?.message}`,
    );
    assert.ok(
      first.t - t0 <= 1.75 * TTL, // expiry, then a fresh grace: two TTLs and more
      `first write ${(first.t - t0).toFixed(0)} ms after the first guard`,
    );
    // The tenure began at the lost-reply write: the bucket's first revision.
    assert.equal(first.epoch, 1);
  });

  test("close() keeps renewing while a 3 s write settles (TTL 1.5 s), then releases the key so a successor writes at once, without waiting for the expiry or a grace", async () => {
    const bucket = uniq("settle");
    const ttl = 1500;
    const m = await manager({
      node: "a",
      bucket,
      ttl,
      restartGrace: false,
      settleTimeout: 4000,
    });
    const s = await manager({ node: "s", bucket, ttl });
    const kv = await rawKv(op, bucket);
    await m.guard("k", () => {});
    const successor = contend(s, "k", 10 * ttl);
    const problems: string[] = [];
    let closing: ReturnType<LeaseManager["close"]> | undefined;
    let writeEnd = 0;
    await m.guard("k", async ({ signal }) => {
      const t = performance.now();
      closing = m.close();
      const other = await m.guard("k2", () => "ran").catch((e) => e);
      assert.ok(other instanceof Error, "a guard during close() ran");
      while (performance.now() - t < 3000) {
        await sleep(100);
        const at = `${(performance.now() - t).toFixed(0)} ms`;
        const e = await kv.get("k");
        if (e?.operation !== "PUT" || e.string() !== "a") {
          problems.push(
            `${at}: entry ${e ? `${e.operation} '${e.string()}'` : "gone"}`,
          );
        }
        if (signal.aborted) problems.push(`${at}: signal aborted`);
      }
      writeEnd = performance.now();
    });
    const result = await closing;
    const closed = performance.now();
    const first = await successor;
    assert.deepEqual(
      problems.slice(0, 3),
      [],
      `the lease lapsed mid-write: ${problems.slice(0, 3).join("; ")}`,
    );
    assert.deepEqual(result, { released: ["k"], unreleased: [] });
    assert.ok(first.t >= writeEnd, "the successor wrote during the write");
    console.log(
      `  [figures] successor wrote ${
        (first.t - closed).toFixed(0)
      } ms after close() resolved`,
    );
    // Released cleanly: the successor waited for neither a's expiry (at
    // least 2/3 TTL after close(), as a renewed every TTL/3 until then) nor
    // a grace (a TTL or two), so anything below TTL/2 proves it. How fast a
    // handover is, is measured in bench/ (row 5).
    assert.ok(
      first.t - closed < ttl / 2,
      `successor wrote ${(first.t - closed).toFixed(0)} ms after close()`,
    );
  });

  test("close() with the server down resolves within settleTimeout + timeout and lists the key in unreleased", async () => {
    await using ns2 = await NatsServer.start();
    const nc = await conn(ns2.url);
    try {
      const m = await createLeaseManager({
        nc,
        node: "a",
        bucket: uniq("down"),
        ttl: TTL,
        timeout: 250,
        settleTimeout: TTL,
        restartGrace: false,
      });
      await m.guard("k", () => {});
      const write = m.guard("k", () => sleep(3000));
      await sleep(20);
      await ns2.kill();
      const t = performance.now();
      const result = await m.close();
      const took = performance.now() - t;
      await write;
      // Liveness: settleTimeout (TTL), then the release's request timeout
      // (250 ms); 400 ms on top are for a loaded machine. A close() that
      // waited for the 3 s write, or for the server, would take longer.
      assert.ok(
        took <= TTL + 250 + 400,
        `close() took ${took.toFixed(0)} ms`,
      );
      assert.deepEqual(result, { released: [], unreleased: ["k"] });
    } finally {
      await nc.close();
    }
  });

  test("release() of 200 held keys stops their renewals and a later guard re-acquires at once", async () => {
    const bucket = uniq("rel");
    const m = await manager({ node: "a", bucket, restartGrace: false });
    const keys = Array.from({ length: 200 }, (_, i) => `k${i}`);
    const epochs = await Promise.all(
      keys.map((k) => m.guard(k, (l) => l.epoch)),
    );
    await Promise.all(keys.map((k) => m.release(k)));
    const released = (await jsm.streams.info(`KV_${bucket}`)).state.last_seq;
    await sleep(2 * TTL);
    const puts = await putsAfter(jsm, bucket, released);
    assert.deepEqual(
      puts.slice(0, 5),
      [],
      `${puts.length} writes after release()`,
    );
    const kv = await rawKv(op, bucket);
    for (const k of keys.slice(0, 10)) {
      assert.notEqual((await kv.get(k))?.operation ?? "gone", "PUT", k);
    }
    const again = await m.guard("k0", (l) => l.epoch);
    assert.ok(again > epochs[0]!, `epoch ${again} after ${epochs[0]}`);
  });

  test("idleRelease releases a key not guarded for that long and keeps renewing a key in use", async () => {
    const bucket = uniq("idle");
    const m = await manager({
      node: "a",
      bucket,
      restartGrace: false,
      idleRelease: TTL,
    });
    await m.guard("idle", () => {});
    const until = performance.now() + 2.5 * TTL;
    while (performance.now() < until) {
      await m.guard("busy", () => {});
      await sleep(200);
    }
    const kv = await rawKv(op, bucket);
    const idle = await kv.get("idle");
    assert.notEqual(
      idle?.operation ?? "gone",
      "PUT",
      "the idle key is still held",
    );
    const busy = await kv.get("busy");
    assert.equal(busy?.operation, "PUT");
    assert.equal(busy?.string(), "a");
    // Released cleanly: guarding it again needs no grace.
    assert.equal(await m.guard("idle", () => "again"), "again");
  });

  test("createLeaseManager() without ttl rejects a timeout above the TTL it adopts from an existing bucket, and changes nothing", async () => {
    const bucket = uniq("adopt");
    await new Kvm(op).create(bucket, { ttl: 1000, history: 1 });
    const before = await jsm.streams.info(`KV_${bucket}`);
    const r = await createLeaseManager({
      nc: op,
      node: "a",
      bucket,
      timeout: 10_000,
    }).catch((e) => e);
    if (!(r instanceof Error)) await r.close();
    assert.ok(
      r instanceof RangeError && /timeout/.test(r.message),
      `expected a RangeError about 'timeout', got ${
        r instanceof Error ? r : "a manager"
      }`,
    );
    const after = await jsm.streams.info(`KV_${bucket}`);
    assert.equal(after.state.last_seq, 0, "something was written");
    assert.equal(after.config.max_age, before.config.max_age);
  });

  test("createLeaseManager({ createBucket: false }) rejects when the bucket does not exist and creates nothing", async () => {
    const bucket = uniq("absent");
    const r = await createLeaseManager({
      nc: op,
      node: "a",
      bucket,
      ttl: TTL,
      createBucket: false,
    }).catch((e) => e);
    if (!(r instanceof Error)) await r.close();
    assert.ok(r instanceof Error, "resolved with a manager");
    assert.ok(r.message.includes(bucket), `names no bucket: ${r.message}`);
    assert.equal(
      await bucketExists(jsm, bucket),
      false,
      "the bucket was created",
    );
  });

  test("a manager whose bucket is deleted stops vouching within the TTL: the lease signal aborts, guards reject with UnavailableError, and the bucket is not re-created", async () => {
    const bucket = uniq("gone");
    const m = await manager({ node: "a", bucket, restartGrace: false });
    await m.guard("k", () => {});
    let abortedAt = Infinity;
    const write = m.guard("k", ({ signal }) =>
      new Promise<void>((resolve) => {
        signal.addEventListener("abort", () => {
          abortedAt = performance.now();
          resolve();
        }, { once: true });
        setTimeout(resolve, 3 * TTL);
      }));
    await sleep(50);
    const deletedAt = performance.now();
    await jsm.streams.delete(`KV_${bucket}`);
    await write;
    assert.ok(
      abortedAt - deletedAt <= TTL + 150,
      `the lease signal aborted ${
        (abortedAt - deletedAt).toFixed(0)
      } ms after the delete`,
    );
    let ran = 0;
    while (performance.now() - deletedAt < 2 * TTL) {
      for (const key of ["k", "other"]) {
        const err = await m.guard(key, () => ran++).catch((e) => e);
        assert.ok(err instanceof UnavailableError, `guard('${key}'): ${err}`);
      }
      await sleep(100);
    }
    assert.equal(ran, 0);
    assert.equal(
      await bucketExists(jsm, bucket),
      false,
      "the bucket was re-created",
    );
  });

  test('with check: "lease", a manager whose bucket is deleted writes on only until its next renewal finds the stream gone, and never past the lease\'s deadline (what the README says)', async () => {
    const bucket = uniq("gonel");
    const m = await manager({
      node: "a",
      bucket,
      restartGrace: false,
      check: "lease",
    });
    let held: Lease | undefined;
    await m.guard("k", (l) => {
      held = l;
    });
    const writes: number[] = [];
    let stop = false;
    let last: unknown;
    const loop = (async () => {
      while (!stop) {
        try {
          await m.guard("k", () => writes.push(performance.now()));
        } catch (err) {
          last = err;
        }
        await sleep(5);
      }
    })();
    await sleep(20);
    const deletedAt = performance.now();
    await jsm.streams.delete(`KV_${bucket}`);
    await sleep(2 * TTL);
    stop = true;
    await loop;
    const after = writes.filter((t) => t > deletedAt);
    const lastWrite = after.at(-1) ?? deletedAt;
    console.log(
      `  [figures] lease-checked writes after the bucket delete: ${after.length}, the last ${
        (lastWrite - deletedAt).toFixed(0)
      } ms after it (TTL ${TTL}, renewals every ${TTL / 3})`,
    );
    // The statement: they stop once a renewal finds the stream gone; the
    // safety bound: never past the deadline the last renewal gave, however
    // late that renewal runs on a loaded machine.
    assert.ok(held!.signal.aborted, "the lease signal aborted");
    // Every renewal before the delete was sent before it, so no deadline
    // reaches past deletedAt + TTL.
    assert.ok(
      lastWrite - deletedAt < TTL,
      `a write ${(lastWrite - deletedAt).toFixed(0)} ms after the delete`,
    );
    assert.ok(last instanceof UnavailableError, String(last));
    const n = writes.length;
    await sleep(TTL / 2);
    assert.equal(writes.length, n, "no write after the manager stopped");
  });

  test("a manager whose bucket was deleted and re-created by another manager never writes again under an epoch at or below its old one", async () => {
    const bucket = uniq("again");
    const m = await manager({ node: "a", bucket, restartGrace: false });
    // Old epochs well above what the re-created bucket starts from.
    for (let i = 0; i < 20; i++) await m.guard("pad", () => {});
    const old = {
      k: await m.guard("k", (l) => l.epoch),
      j: await m.guard("j", (l) => l.epoch),
    };
    await jsm.streams.delete(`KV_${bucket}`);
    const n = await manager({ node: "n", bucket, restartGrace: false });
    const nEpoch = await n.guard("k", (l) => l.epoch);
    assert.ok(nEpoch < old.k);
    const bad: string[] = [];
    const end = performance.now() + 3 * TTL;
    while (performance.now() < end) {
      for (const key of ["k", "j"] as const) {
        await m.guard(key, (l) => {
          if (l.epoch <= old[key]) {
            bad.push(`'${key}' at epoch ${l.epoch} (old ${old[key]})`);
          }
        }).catch(() => {});
      }
      await sleep(50);
    }
    assert.deepEqual(
      bad.slice(0, 3),
      [],
      `${bad.length} writes, e.g. ${bad[0]}`,
    );
  });

  // A paused process sends nothing and times nothing out. If the bucket is
  // deleted and re-created meanwhile and the new stream passes its revision,
  // its renewal fails as if another node had taken over, and its next
  // acquire would succeed in the new bucket, under a restarted epoch. The
  // simulator found this (seed 229806); an answer after a silence longer
  // than the TTL now makes the manager check the stream first.
  test("a holder paused past its TTL while the bucket was deleted and re-created (the new one passing its revision) never writes again", async () => {
    const bucket = uniq("silent");
    const paused = startChild<ChildEvent>(CHILD, {
      NATS_URL: ns.url,
      LEASE_BUCKET: bucket,
      LEASE_KEY: "k",
      LEASE_NODE: "p",
      LEASE_TTL: String(TTL),
      LEASE_WRITE_MS: "20",
    }, { untilMs: 15_000 });
    try {
      await paused.until((e) => e.ev === "end");
      signal(paused.pid, "SIGSTOP");
      const stoppedAt = performance.now();
      const rev = (await (await new Kvm(op).open(bucket)).get("k"))!.revision;
      await jsm.streams.delete(`KV_${bucket}`);
      const n = await manager({ node: "n", bucket, restartGrace: false });
      const kv = await new Kvm(op).open(bucket);
      for (;;) {
        await n.guard("k", () => {});
        if ((await kv.get("k"))!.revision > rev + 1) break;
      }
      await n.release("k");
      await sleep(stoppedAt + 1.5 * TTL - performance.now());
      const resumedAt = Date.now();
      signal(paused.pid, "SIGCONT");
      await sleep(5 * TTL);
      const since = paused.events.filter((e) => e.t >= resumedAt);
      assert.deepEqual(
        since.filter((e) => e.ev === "start"),
        [],
        "the paused holder wrote in the re-created bucket",
      );
      assert.ok(
        since.some((e) => e.ev === "refused" && e.error === "UnavailableError"),
        JSON.stringify(since),
      );
    } finally {
      await paused.stop();
    }
  });

  test("release() while renewals go unanswered sends nothing on the key after it resolves (simulator seed 200184)", async () => {
    const bucket = uniq("relq");
    // A timeout longer than the retry interval (TTL/10) while the lease can
    // still be saved: a renewal planned then is queued behind one in flight.
    await using p = await proxiedManager(bucket, {
      ttl: 3000,
      timeout: 1000,
      restartGrace: false,
    });
    const { proxy, nc, m } = p;
    await m.guard("k", () => {});
    proxy.hold("both");
    // g1 sends a renewal nobody answers (at 0 ms) and g2 queues the next
    // one behind it. release() at 800 ms waits up to a timeout for them.
    // g1's renewal times out at 1000 ms and g2's goes out, and the retry
    // it plans (at 1300 ms, TTL/10 later) is queued behind that one.
    const g1 = m.guard("k", () => {}).catch((e) => e);
    await sleep(10);
    const g2 = m.guard("k", () => {}).catch((e) => e);
    await sleep(790);
    await m.release("k");
    const out = nc.stats().outMsgs;
    // release() gave up waiting at 1800 ms; g2's renewal times out at
    // 2000 ms. Before, the queued retry then ran as an acquire of the
    // released key (a read, then a compare-and-set).
    await sleep(1000);
    assert.equal(nc.stats().outMsgs - out, 0, "messages after release()");
    assert.ok((await g1) instanceof UnavailableError, String(await g1));
    assert.ok((await g2) instanceof UnavailableError, String(await g2));
  });

  test("guard() rejects with an UnavailableError that speaks of guarding the write when the server does not answer", async () => {
    const bucket = uniq("msg");
    await using p = await proxiedManager(bucket, { restartGrace: false });
    const { proxy, m } = p;
    await m.guard("k", () => {});
    proxy.hold("both");
    const err = await m.guard("k", () => {}).catch((e) => e);
    assert.ok(err instanceof UnavailableError, String(err));
    // It may say why (a renewal timed out), but it is about the guard.
    assert.match(err.message, /^Cannot guard a write on 'k': /);
  });

  test("guard() after renewals failed past the lease's deadline starts a new tenure (greater epoch, after a grace) even when the old entry is still the key's last", async () => {
    const bucket = uniq("lapse");
    await using p = await proxiedManager(bucket, { restartGrace: false });
    const { proxy, m } = p;
    const epoch = await m.guard("k", (l) => l.epoch);
    // The server keeps the entry (a replica late to expire, or a
    // re-created bucket that reached the same revision): nothing on the
    // server shows that the lease lapsed.
    const si = await jsm.streams.info(`KV_${bucket}`);
    await jsm.streams.update(`KV_${bucket}`, {
      ...si.config,
      max_age: 3_600_000_000_000,
    });
    let signal: AbortSignal | undefined;
    await m.guard("k", (l) => {
      signal = l.signal;
    });
    proxy.hold("both");
    await sleep(TTL * 1.5);
    assert.equal(signal!.aborted, true, "the lease lapsed at its deadline");
    proxy.release("both");
    const t = performance.now();
    const first = await m.guard("k", () => {}).catch((e) => e);
    assert.ok(
      first instanceof NotHolderError && first.retryAfter !== undefined,
      `the first guard after the lapse waits a grace: ${first}`,
    );
    const next = await guardUntil(m, "k", (l) => l.epoch, 4 * TTL);
    const took = performance.now() - t;
    assert.ok(next > epoch, `epoch ${next} after ${epoch}`);
    assert.ok(took >= 2 * TTL * 0.95, `wrote after ${took.toFixed(0)} ms`);
  });
});

// ---------------------------------------------------------------------------

const clusterTitle =
  "on a 3-node cluster, a holder whose renewal replies are lost while one replica lags keeps its epoch, is never reported lost, and never writes inside its grace";

describe("lease safety on a 3-node cluster", () => {
  if (!proxiedClusterOk) {
    test(
      `${clusterTitle} (skipped: nats-server ${
        versionText[0]
      } cannot run a replicated bucket safely or turn route compression off; needs 2.10 or later)`,
      { skip: `needs nats-server 2.10 or later, this is ${versionText[0]}` },
      () => {},
    );
    return;
  }

  let cluster: ProxiedCluster;
  before(async () => {
    cluster = await ProxiedCluster.start(3);
  });
  after(async () => {
    await cluster.close();
  });

  test(clusterTitle, async () => {
    const ttl = 2000;
    const bucket = uniq("r3");
    const op = await conn(cluster.urls[0]!);
    let nc: NatsConnection | undefined;
    let m: LeaseManager | undefined;
    let p: NatsProxy | undefined;
    try {
      await createBucket(op, bucket, { ttl, history: 1, replicas: 3 });
      const info = await (await jetstreamManager(op)).streams.info(
        `KV_${bucket}`,
      );
      const leader = info.cluster!.leader!;
      const lagging = info.cluster!.replicas!.find((r) => r.name !== leader)!
        .name;
      // The holder talks to the replica that will lag, through a proxy that
      // can hold the replies to its writes.
      p = await NatsProxy.start(
        cluster.servers[Number(lagging.slice(1))]!.port,
      );
      const proxy = p;
      nc = await conn(proxy.url);
      m = await createLeaseManager({ nc, node: "m", bucket, timeout: 300 });
      assert.equal(m.ttl, ttl);
      let armed = false;
      let lost = 0;
      proxy.onFrame = (f, dir) => {
        if (armed && dir === "up" && f.subject?.startsWith(`$KV.${bucket}.`)) {
          armed = false;
          lost++;
          proxy.holdFor("down", 450);
        }
      };
      /** Arms a lost reply for the next write and waits until it is resolved. */
      const loseOneReply = async () => {
        armed = true;
        const end = performance.now() + ttl;
        while (armed && performance.now() < end) await sleep(10);
        assert.equal(armed, false, "no renewal was sent within the TTL");
        // Held for 450 ms, timed out at 300, retried TTL/10 later, resolved.
        await sleep(900);
      };
      const keys = ["g0", "g1", "g2", "g3", "g4", "g5"];
      const notHeld: string[] = [];
      const manager = m;

      // 1. In the grace: six fresh keys are acquired while one replica
      // lags, and their first renewals lose their replies.
      cluster.cut(leader, lagging);
      await sleep(1200); // the lagging replica starts answering reads
      const graceEnd = new Map<string, number>();
      await Promise.all(keys.map(async (k) => {
        for (;;) {
          const t = performance.now();
          const err = await manager.guard(k, () => "wrote").catch((e) => e);
          assert.notEqual(err, "wrote", `${k} written without a grace`);
          if (err instanceof NotHolderError && err.retryAfter !== undefined) {
            graceEnd.set(k, t + err.retryAfter - 1);
            return;
          }
          assert.ok(err instanceof UnavailableError, `${k}: ${err}`);
          await sleep(20);
        }
      }));
      const writers = keys.map(async (k) => {
        const end = performance.now() + 5 * ttl;
        for (;;) {
          assert.ok(performance.now() < end, `${k} never written`);
          try {
            return await manager.guard(k, (l) => ({
              t: performance.now(),
              epoch: l.epoch,
            }));
          } catch (err) {
            if (err instanceof NotHolderError && err.retryAfter === undefined) {
              notHeld.push(`${k}: ${err.message}`);
            } else if (!(err instanceof NotHolderError)) {
              assert.ok(err instanceof UnavailableError, `${k}: ${err}`);
            }
            await sleep(10);
          }
        }
      });
      await loseOneReply();
      cluster.healAll();
      const first = await Promise.all(writers);
      keys.forEach((k, i) => {
        const early = graceEnd.get(k)! - first[i]!.t;
        assert.ok(
          early <= 0,
          `${k} wrote ${early.toFixed(0)} ms inside its grace`,
        );
      });
      assert.deepEqual(notHeld, [], "reported not holding a key it held");

      // 2. Held, mid-write: the same fault must not end the tenure.
      let go!: () => void;
      const done = new Promise<void>((r) => go = r);
      const long = keys.map((k) =>
        manager.guard(k, async ({ signal, epoch }) => {
          await done;
          return { aborted: signal.aborted, reason: signal.reason, epoch };
        })
      );
      await sleep(50);
      cluster.cut(leader, lagging);
      await sleep(1200);
      await loseOneReply();
      cluster.healAll();
      go();
      const results = await Promise.all(long);
      keys.forEach((k, i) => {
        assert.equal(
          results[i]!.aborted,
          false,
          `${k}: lease signal aborted: ${results[i]!.reason}`,
        );
        assert.equal(results[i]!.epoch, first[i]!.epoch, `${k}: epoch changed`);
      });
      for (const [i, k] of keys.entries()) {
        assert.equal(await manager.guard(k, (l) => l.epoch), first[i]!.epoch);
      }
      assert.deepEqual(notHeld, [], "reported not holding a key it held");
      assert.equal(lost, 2);
    } finally {
      cluster.healAll();
      await m?.close();
      await nc?.close();
      await p?.close();
      await op.close();
    }
  });
});
