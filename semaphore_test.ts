// Tests of semaphore() (semaphore.ts) against a real nats-server: at most
// `limit` writes at once under contention, a full semaphore's refusal, limit
// agreement and a deliberate change, abort and close while waiting (no
// consumer left), release and `await using`, a SIGKILLed holder's slot taken
// after the TTL and the grace, a turnstile holder paused (SIGSTOP) between
// its census and its slot's compare-and-set, first-come-first-served
// waiting, a manager and instrument() of it as one manager, and slots and
// the turnstile held past a manager's idleRelease.
// Runs under `deno test -A`, `bun test` and `node --test`.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  createLeaseManager,
  type LeaseManager,
  type LeaseManagerOptions,
  LimitMismatchError,
  MAX_SEMAPHORE_LIMIT,
  NotHolderError,
  semaphore,
  SemaphoreFullError,
  type SlotLease,
  UnavailableError,
} from "./mod.ts";
import { instrument } from "./otel.ts";
import {
  conn,
  eventually,
  sleep,
  strayErrors,
  uniq,
} from "./test_util/lease_helpers.ts";
import { startChild } from "./test_util/child.ts";
import { NatsServer } from "./test_util/nats_server.ts";

const TTL = 1000;
/** Server expiry is 80-250 ms late; waiters' fallback reads allow 600 more. */
const FAILOVER_BOUND = 850;
/**
 * A handover by release: the holder deletes its entry, the waiter's watch
 * hears it and takes the slot, a few round trips. Anything that waits for an
 * entry to expire instead takes at least the TTL.
 */
const HANDOVER_BOUND = TTL / 2;
/** An idleRelease far below the TTL: it acts at the next renewal, TTL/3 on. */
const IDLE = 300;

/** Prints measured figures: numbers are milliseconds, strings counts. */
function report(what: string, figures: Record<string, number | string>) {
  const text = Object.entries(figures).map(([k, v]) =>
    typeof v === "number" ? `${k}=${Math.round(v)} ms` : `${k}=${v}`
  ).join(", ");
  console.log(`  [figures] ${what}: ${text}`);
}

async function consumers(jsm: JetStreamManager, bucket: string) {
  return (await jsm.consumers.list(`KV_${bucket}`).next()).length;
}

/**
 * The consumers a slot held by acquire() keeps: its pin against
 * `idleRelease` is a campaign, which watches its key.
 */
const PINNED_SLOT_CONSUMERS = 1;

describe("semaphore", () => {
  let ns: NatsServer;
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  const conns: NatsConnection[] = [];
  const managers: LeaseManager[] = [];

  async function manager(
    node: string,
    bucket: string,
    extra: Partial<LeaseManagerOptions> = {},
  ): Promise<LeaseManager> {
    const c = await conn(ns.url);
    conns.push(c);
    const m = await createLeaseManager({
      nc: c,
      node,
      bucket,
      ttl: TTL,
      restartGrace: false,
      ...extra,
    });
    managers.push(m);
    return m;
  }

  /** A line of test_util/semaphore_child.ts. */
  interface SlotEvent {
    ev: string;
    key?: string;
    slot?: number;
    epoch?: number;
    name?: string;
    message?: string;
    keys?: string[];
  }

  /**
   * Runs test_util/semaphore_child.ts (node "child") on `bucket` with
   * `env`; its stderr goes to this process's.
   */
  function startHolder(bucket: string, env: Record<string, string>) {
    return startChild<SlotEvent>(
      fileURLToPath(new URL("./test_util/semaphore_child.ts", import.meta.url)),
      {
        NATS_URL: ns.url,
        LEASE_BUCKET: bucket,
        LEASE_NODE: "child",
        LEASE_TTL: String(TTL),
        ...env,
      },
      { stderr: "inherit" },
    );
  }

  before(async () => {
    ns = await NatsServer.start();
    nc = await conn(ns.url);
    jsm = await jetstreamManager(nc);
  });

  after(async () => {
    await Promise.allSettled(managers.map((m) => m.close()));
    await Promise.allSettled(conns.map((c) => c.close()));
    await nc.close();
    await ns[Symbol.asyncDispose]();
  });

  test("LeaseManager.holders(prefix) lists the held keys below the prefix with their holders, not released ones, and checks its input", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket);
    assert.deepEqual([...(await a.holders("fam"))], []);
    await a.guard("fam.x", () => {});
    await b.guard("fam.y.z", () => {});
    await b.guard("fam.gone", () => {});
    await b.release("fam.gone");
    await a.guard("family", () => {}); // not below "fam."
    const h = await a.holders("fam");
    assert.deepEqual([...h.keys()], ["fam.x", "fam.y.z"]);
    assert.equal(h.get("fam.x")?.node, "a");
    assert.equal(h.get("fam.y.z")?.node, "b");
    assert.equal(h.get("fam.x")?.epoch, (await a.holder("fam.x"))?.epoch);
    await assert.rejects(a.holders("fam.>"), TypeError);
    await assert.rejects(a.holders(""), TypeError);
    await b.close();
    await assert.rejects(b.holders("fam"), TypeError);
  });

  test("semaphore() throws TypeError or RangeError on bad input, before anything is sent", async () => {
    const m = await manager("a", uniq("s"));
    assert.throws(
      () => semaphore({} as LeaseManager, "s", { limit: 1 }),
      TypeError,
    );
    assert.throws(() => semaphore(m, "a..b", { limit: 1 }), TypeError);
    assert.throws(() => semaphore(m, "a.>", { limit: 1 }), TypeError);
    for (const limit of [0, -1, 1.5, NaN, MAX_SEMAPHORE_LIMIT + 1]) {
      assert.throws(
        () => semaphore(m, "s", { limit }),
        (e) => e instanceof RangeError && e.message.includes("'limit'"),
      );
    }
    // The bound's accepted side: the largest limit, as `lease run -n` takes.
    semaphore(m, "max", { limit: MAX_SEMAPHORE_LIMIT });
    semaphore(m, "one", { limit: 1 });
    assert.throws(
      () => semaphore(m, "s", { limit: "3" as unknown as number }),
      RangeError,
    );
    assert.throws(
      () => semaphore(m, "s", { limit: 2, resize: 1 as unknown as boolean }),
      TypeError,
    );
    const sem = semaphore(m, "s", { limit: 2 });
    const c = conns.at(-1)!; // m's connection
    const out = c.stats().outMsgs;
    await assert.rejects(sem.guard(42 as unknown as () => void), TypeError);
    await assert.rejects(
      sem.guard(() => {}, { wait: "yes" as unknown as boolean }),
      TypeError,
    );
    await assert.rejects(
      sem.guard(() => {}, { check: "x" as "cas" }),
      TypeError,
    );
    const reason = new Error("already");
    await assert.rejects(
      sem.acquire({ signal: AbortSignal.abort(reason) }),
      (e) => e === reason,
    );
    // Refused before the turnstile or a census was asked for.
    assert.equal(c.stats().outMsgs, out);
    assert.equal((await sem.holders()).size, 0);
  });

  test("guard() never runs more than `limit` writes at once under contention, each in its own slot with its own epoch", async () => {
    const bucket = uniq("s");
    const ms = await Promise.all(
      Array.from({ length: 6 }, (_, i) => manager(`n${i}`, bucket)),
    );
    let now = 0;
    let peak = 0;
    const slots = new Map<number, Set<number>>();
    const inUse = new Set<number>();
    const write = async (l: SlotLease) => {
      assert.equal(inUse.has(l.slot), false, `slot ${l.slot} twice at once`);
      inUse.add(l.slot);
      peak = Math.max(peak, ++now);
      assert.equal(l.key, `jobs.n3.${l.slot}`);
      if (!slots.has(l.slot)) slots.set(l.slot, new Set());
      slots.get(l.slot)!.add(l.epoch);
      await sleep(40);
      l.throwIfLost();
      now--;
      inUse.delete(l.slot);
    };
    // Two guards per manager at once: local contenders are counted too.
    const t0 = performance.now();
    await Promise.all(ms.flatMap((m) => {
      const sem = semaphore(m, "jobs", { limit: 3 });
      return [0, 1, 2].map(() => sem.guard(write, { wait: true }));
    }));
    report("18 writes of 40 ms, limit 3", {
      peak: String(peak),
      total: performance.now() - t0,
    });
    assert.equal(peak, 3);
    assert.equal(now, 0);
    assert.deepEqual([...slots.keys()].sort(), [0, 1, 2]);
    assert.equal(
      await semaphore(ms[0]!, "jobs", { limit: 3 }).holders().then((h) =>
        h.size
      ),
      0,
    );
  });

  test("guard() without wait rejects with SemaphoreFullError, a NotHolderError listing the holders, when all slots are held", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket);
    const c = await manager("c", bucket);
    const s1 = await semaphore(a, "api", { limit: 2 }).acquire();
    const s2 = await semaphore(b, "api", { limit: 2 }).acquire();
    assert.deepEqual([s1.slot, s2.slot].sort(), [0, 1]);
    let wrote = false;
    const err = await semaphore(c, "api", { limit: 2 }).guard(() => {
      wrote = true;
    }).then(() => undefined, (e) => e);
    assert.ok(err instanceof SemaphoreFullError, String(err));
    assert.ok(err instanceof NotHolderError);
    assert.deepEqual(
      [...err.holders].map(([k, h]) => [k, h.node]).sort(),
      [[s1.key, "a"], [s2.key, "b"]].sort(),
    );
    assert.match(err.message, /'a'/);
    assert.match(err.message, /'b'/);
    assert.equal(wrote, false);
    await s1.release();
    // A free slot: the same call now writes, in the slot s1 left.
    const slot = await semaphore(c, "api", { limit: 2 }).guard((l) => l.slot);
    assert.equal(slot, s1.slot);
    await s2.release();
  });

  test("a contender asking another limit gets LimitMismatchError naming both values, and takes no slot", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket);
    const held = await semaphore(a, "pool", { limit: 3 }).acquire();
    const other = semaphore(b, "pool", { limit: 5 });
    for (
      const attempt of [
        () => other.guard(() => assert.fail("wrote")),
        () => other.guard(() => assert.fail("wrote"), { wait: true }),
        () => other.acquire(),
      ]
    ) {
      const err = await attempt().then(() => undefined, (e) => e);
      assert.ok(err instanceof LimitMismatchError, String(err));
      assert.ok(err instanceof RangeError);
      assert.equal(err.asked, 5);
      assert.equal(err.recorded, 3);
      assert.equal(err.holder, "a");
      assert.match(err.message, /limit 5/);
      assert.match(err.message, /limit 3/);
    }
    const holders = await other.holders();
    assert.deepEqual([...holders.keys()], [held.key]);
    await held.release();
    // Nothing held, nothing recorded: the first taker's limit holds.
    await other.guard((l) => assert.equal(l.key, "pool.n5.0"));
  });

  test("resize: true changes the limit while holders of the old limit keep working", async () => {
    const bucket = uniq("s");
    const old = await Promise.all(
      [0, 1].map((i) => manager(`old${i}`, bucket)),
    );
    const fresh = await Promise.all(
      [0, 1, 2, 3].map((i) => manager(`new${i}`, bucket)),
    );
    const oldSlots = await Promise.all(
      old.map((m) => semaphore(m, "w", { limit: 2 }).acquire()),
    );
    // 2 -> 4: the resizing contenders count the old slots against 4.
    const newSem = fresh.map((m) =>
      semaphore(m, "w", { limit: 4, resize: true })
    );
    const got = [await newSem[0]!.acquire(), await newSem[1]!.acquire()];
    assert.deepEqual(got.map((s) => s.key).sort(), ["w.r4.0", "w.r4.1"]);
    await assert.rejects(newSem[2]!.guard(() => {}), SemaphoreFullError);
    // An old contender is not refused for the other limit: it counts the
    // r4 slots against its own limit of 2, so the semaphore is full to it.
    const oldSem = semaphore(old[0]!, "w", { limit: 2 });
    await assert.rejects(oldSem.guard(() => {}), SemaphoreFullError);
    await oldSlots[0]!.release();
    // 3 held: room under 4, none under 2.
    await assert.rejects(oldSem.guard(() => {}), SemaphoreFullError);
    const third = await newSem[2]!.acquire();
    assert.equal(third.key, "w.r4.2");
    await oldSlots[1]!.release();
    for (const s of [...got, third]) await s.release();
    assert.equal(await oldSem.guard((l) => l.key), "w.n2.0");
    // Once no old slot is left, strict contenders of the new limit agree.
    const strict = semaphore(fresh[3]!, "w", { limit: 4 });
    const held = await newSem[0]!.acquire();
    await strict.guard((l) => assert.equal(l.key, "w.n4.0"));
    await held.release();
  });

  test("acquire() holds a slot until release() or `await using` ends it, and the next waiter takes it at once", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket);
    const semA = semaphore(a, "one", { limit: 1 });
    const semB = semaphore(b, "one", { limit: 1 });
    let taken = 0;
    {
      await using slot = await semA.acquire();
      assert.equal(slot.slot, 0);
      assert.equal(slot.key, "one.n1.0");
      assert.equal(await a.holder(slot.key).then((h) => h?.node), "a");
      const waiting = semB.guard(() => taken = performance.now(), {
        wait: true,
      });
      await sleep(200);
      assert.equal(taken, 0);
      // leaving the block releases it
      void waiting;
    }
    const released = performance.now();
    await eventually(() => taken > 0, 2000, "the waiter to write");
    // The wait's signal does not end a slot once handed out.
    const ac = new AbortController();
    const slot = await semA.acquire({ signal: ac.signal });
    ac.abort();
    assert.equal(slot.signal.aborted, false);
    slot.throwIfLost();
    const epoch = slot.epoch;
    await slot.release();
    await slot.release(); // twice is fine
    assert.equal(slot.signal.aborted, true);
    assert.equal(await a.holder(slot.key), null);
    report("handover from `await using` to a waiter", {
      handover: taken - released,
      epoch: String(epoch),
    });
  });

  test("aborting a waiting guard rejects with the reason, takes nothing, and leaves no ticket or consumer", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket);
    const c = await manager("c", bucket);
    const held = await semaphore(a, "x", { limit: 1 }).acquire();
    const ac1 = new AbortController();
    const ac2 = new AbortController();
    // b waits at the turnstile, c in line with a ticket.
    const head = semaphore(b, "x", { limit: 1 }).guard(() => {
      assert.fail("b wrote");
    }, { wait: true, signal: ac1.signal });
    await sleep(150);
    const queued = semaphore(c, "x", { limit: 1 }).guard(() => {
      assert.fail("c wrote");
    }, { wait: true, signal: ac2.signal });
    await eventually(
      async () =>
        [...(await a.holders("x")).keys()].some((k) => k.startsWith("x.q.")),
      2000,
      "c's ticket",
    );
    assert.ok(await consumers(jsm, bucket) >= PINNED_SLOT_CONSUMERS + 1);
    const r1 = new Error("stop b");
    const r2 = new Error("stop c");
    const rejected = Promise.all([
      assert.rejects(head, (e) => e === r1),
      assert.rejects(queued, (e) => e === r2),
    ]);
    ac2.abort(r2);
    ac1.abort(r1);
    await rejected;
    await eventually(
      async () => [...(await a.holders("x")).keys()].join() === held.key,
      2000,
      "only the held slot to be left",
    );
    await eventually(
      async () => await consumers(jsm, bucket) === PINNED_SLOT_CONSUMERS,
      2000,
      "the waiters' watches to stop",
    );
    await held.release();
  });

  test("close() while a guard waits rejects it with TypeError and leaves no consumer", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket);
    const c = await manager("c", bucket);
    const held = await semaphore(a, "y", { limit: 1 }).acquire();
    const head = semaphore(b, "y", { limit: 1 }).guard(() => {}, {
      wait: true,
    });
    await sleep(150);
    const queued = semaphore(c, "y", { limit: 1 }).acquire();
    await sleep(150);
    const r1 = assert.rejects(head, TypeError);
    const r2 = assert.rejects(queued, TypeError);
    await Promise.all([b.close(), c.close()]);
    await r1;
    await r2;
    await eventually(
      async () => await consumers(jsm, bucket) === PINNED_SLOT_CONSUMERS,
      2000,
      "no consumer but the held slot's",
    );
    assert.deepEqual([...(await a.holders("y")).keys()], [held.key]);
    await held.release();
    await eventually(
      async () => await consumers(jsm, bucket) === 0,
      2000,
      "no consumer once the slot is released",
    );
  });

  test("over a connection closed for good, waiting guard() and acquire() reject with UnavailableError, a held slot's signal aborts, and nothing goes unhandled", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket);
    const nc = conns.at(-1)!;
    const stray = strayErrors();
    const held = await semaphore(a, "z", { limit: 1 }).acquire();
    const mine = await semaphore(b, "z2", { limit: 1 }).acquire();
    // Each handled from the start: one that rejected while another was
    // awaited would be reported unhandled.
    const ends = [
      semaphore(b, "z", { limit: 1 }).guard(() => {}, { wait: true }),
      semaphore(b, "z", { limit: 1 }).acquire(),
    ].map((p) => p.then(() => "ended quietly", (e: unknown) => e));
    await sleep(150);
    await nc.close();
    for (const e of await Promise.all(ends)) {
      assert.ok(
        e instanceof UnavailableError && /connection is closed/.test(e.message),
        String(e),
      );
    }
    assert.equal(mine.signal.aborted, true);
    await mine.release().catch(() => {});
    await held.release();
    assert.deepEqual(await stray.stop(), []);
  });

  test("a SIGKILLed holder's slot is taken by a waiter after the TTL and the grace, not before", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const { child, events, exited } = startHolder(bucket, {
      LEASE_KEY: "crash",
      LEASE_LIMIT: "1",
    });
    try {
      await eventually(
        () => events.some((e) => e.ev === "held"),
        15_000,
        "the child's slot",
      );
      const held = events[0]!;
      let wroteAt = 0;
      let epoch = 0;
      const waiting = semaphore(a, "crash", { limit: 1 }).guard((l) => {
        wroteAt = performance.now();
        epoch = l.epoch;
      }, { wait: true });
      await sleep(300);
      assert.equal(wroteAt, 0);
      const killedAt = performance.now();
      child.kill("SIGKILL");
      await waiting;
      const took = wroteAt - killedAt;
      report("SIGKILLed holder's slot to a waiter", { took });
      assert.ok(epoch > held.epoch!);
      // Not before the entry expired: a TTL after the last renewal, which
      // came at most TTL/3 before the kill (the grace after it may be cut by
      // expiry markers, nats-server 2.11.2+). Not much after the grace.
      assert.ok(took >= (2 * TTL) / 3, `${took} ms`);
      assert.ok(took <= 2 * TTL + FAILOVER_BOUND, `${took} ms`);
    } finally {
      child.kill("SIGKILL");
      await exited;
    }
  });

  test("a turnstile holder paused between its census and its slot's compare-and-set takes no slot when it wakes: its turnstile lapsed, and another contender counted and filled the only slot", async () => {
    const bucket = uniq("s");
    const b = await manager("b", bucket);
    // The child asks limit 1 with `resize: true`, so its slot key
    // (pause.r1.0) is not b's (pause.n1.0): only the turnstile keeps them
    // from holding a slot each. It stops after reading an empty census.
    const { child, events, exited } = startHolder(bucket, {
      LEASE_KEY: "pause",
      LEASE_LIMIT: "1",
      LEASE_RESIZE: "1",
      LEASE_PAUSE: "census",
    });
    try {
      await eventually(
        () => events.length > 0,
        15_000,
        "the child's census",
      );
      // No slot held: only its own turnstile.
      assert.deepEqual(events[0], { ev: "census", keys: ["pause.next"] });
      // The child holds the turnstile, unrenewed: b takes it once it
      // expired (and the grace), counts no slot held, and takes one.
      const t0 = performance.now();
      const slot = await semaphore(b, "pause", { limit: 1 }).acquire({
        signal: AbortSignal.timeout(10_000),
      });
      const took = performance.now() - t0;
      assert.equal(slot.key, "pause.n1.0");
      // Not child.kill(): Deno's ChildProcess sends one signal only, and
      // the SIGKILL of the cleanup must still reach it.
      process.kill(child.pid!, "SIGCONT");
      await eventually(
        () => events.length > 1,
        10_000,
        "the child's outcome",
      );
      const outcome = events[1]!;
      report("a contender paused after its census, then continued", {
        bTookTheSlot: took,
        child: outcome.ev,
      });
      // Its census is stale; its lapsed turnstile, checked once the slot's
      // compare-and-set succeeded, refuses the slot.
      assert.deepEqual(
        [outcome.ev, outcome.name],
        ["refused", "UnavailableError"],
        JSON.stringify(outcome),
      );
      assert.match(outcome.message!, /pause\.next/);
      assert.deepEqual(
        [...(await b.holders("pause")).keys()].filter((k) =>
          k !== "pause.next"
        ),
        ["pause.n1.0"],
      );
      await slot.release();
    } finally {
      child.kill("SIGKILL");
      await exited;
    }
  });

  test("waiters are served first come, first served, also while others keep taking freed slots", async () => {
    const bucket = uniq("s");
    const ms = await Promise.all(
      Array.from({ length: 7 }, (_, i) => manager(`f${i}`, bucket)),
    );
    const log: string[] = [];
    // Two greedy contenders take the one slot again and again.
    const stop = new AbortController();
    const greedy = [0, 1].map(async (g) => {
      const sem = semaphore(ms[g]!, "fair", { limit: 1 });
      while (!stop.signal.aborted) {
        await sem.guard(async () => {
          log.push(`g${g}`);
          await sleep(20);
        }, { wait: true, signal: stop.signal }).catch(() => {});
      }
    });
    await sleep(300);
    // Five waiters arrive one by one.
    const arrived: number[] = [];
    const waiters = [2, 3, 4, 5, 6].map(async (i, n) => {
      await sleep(n * 60);
      arrived.push(log.length);
      await semaphore(ms[i]!, "fair", { limit: 1 }).guard(async () => {
        log.push(`w${n}`);
        await sleep(20);
      }, { wait: true });
    });
    await Promise.all(waiters);
    stop.abort();
    await Promise.all(greedy);
    const order = log.filter((e) => e.startsWith("w"));
    // Writes by others between a waiter's arrival and its own write.
    const passed = [0, 1, 2, 3, 4].map((n) =>
      log.indexOf(`w${n}`) - arrived[n]!
    );
    report("first come, first served, limit 1", {
      order: order.join(" "),
      passedBy: passed.join(" "),
    });
    assert.deepEqual(order, ["w0", "w1", "w2", "w3", "w4"]);
    // Each waiter is passed by at most the writer, the turnstile's holder
    // and the waiters ahead of it.
    passed.forEach((p, n) => assert.ok(p <= n + 3, `w${n}: ${p}`));
  });

  test("a manager and instrument() of it count as one manager: their contenders mixed never exceed the limit and never deadlock", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket);
    const measured = instrument(a);
    let now = 0;
    let peak = 0;
    let writes = 0;
    let lastEnd = 0;
    let gap = 0;
    const start = async (l: SlotLease) => {
      peak = Math.max(peak, ++now);
      writes++;
      if (lastEnd > 0) gap = Math.max(gap, performance.now() - lastEnd);
      await sleep(20);
      l.throwIfLost();
      now--;
      lastEnd = performance.now();
    };
    // A stalled semaphore holds its slot for good: fail on that, not on the
    // test runner's timeout.
    const stalled = AbortSignal.timeout(15_000);
    const t0 = performance.now();
    // Through a, through instrument(a), and from another process (b), by
    // guard and by acquire, three rounds each.
    await Promise.all([a, measured, b, measured, a].map(async (m, i) => {
      const sem = semaphore(m, "mix", { limit: 1 });
      for (let round = 0; round < 3; round++) {
        if (i % 2 === 0) {
          await sem.guard(start, { wait: true, signal: stalled });
        } else {
          const slot = await sem.acquire({ signal: stalled });
          await start(slot);
          await slot.release();
        }
      }
    }));
    report("15 writes of 20 ms via a, instrument(a) and b, limit 1", {
      writes: String(writes),
      peak: String(peak),
      longestHandover: gap,
      total: performance.now() - t0,
    });
    assert.equal(writes, 15);
    assert.equal(peak, 1);
    // Every handover was a release, heard at once: no slot or turnstile
    // was left to expire by a contender that lost track of it.
    assert.ok(gap < HANDOVER_BOUND, `${gap} ms`);
    assert.equal((await a.holders("mix")).size, 0);
  });

  test("acquire() keeps its slot held past the manager's idleRelease, renewed, and no other node takes it until release()", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket, { idleRelease: IDLE });
    const b = await manager("b", bucket);
    const slot = await semaphore(a, "idle", { limit: 1 }).acquire();
    let taken = 0;
    const waiting = semaphore(b, "idle", { limit: 1 }).guard(() => {
      taken = performance.now();
    }, { wait: true });
    // Unused for IDLE, the key would be released at the next renewal (by
    // IDLE + TTL/3); two TTLs also outlast an entry nobody renews.
    await sleep(2 * TTL);
    assert.equal(taken, 0, "b took the slot while a held it");
    assert.equal(slot.signal.aborted, false);
    slot.throwIfLost();
    assert.deepEqual(await b.holder(slot.key), {
      node: "a",
      epoch: slot.epoch,
    });
    assert.ok(slot.deadline > performance.now(), "renewed");
    const released = performance.now();
    await slot.release();
    await waiting;
    report("acquire() held past idleRelease, then handed over", {
      handover: taken - released,
    });
    assert.ok(taken - released < HANDOVER_BOUND, `${taken - released} ms`);
  });

  test("a guard waiting at the turnstile on a manager with idleRelease keeps its place past idleRelease and writes when the slot is freed", async () => {
    const bucket = uniq("s");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket, { idleRelease: IDLE });
    const held = await semaphore(a, "wait", { limit: 1 }).acquire();
    let taken = 0;
    const waiting = semaphore(b, "wait", { limit: 1 }).guard(() => {
      taken = performance.now();
    }, { wait: true });
    await eventually(
      async () => (await a.holder("wait.next"))?.node === "b",
      2000,
      "b at the turnstile",
    );
    // Waiting for a slot is no use of the turnstile's key: unpinned, it
    // is released by IDLE + TTL/3, and b's wait fails when the slot frees.
    await sleep(2 * TTL);
    assert.equal((await a.holder("wait.next"))?.node, "b");
    const released = performance.now();
    await held.release();
    await waiting;
    assert.ok(taken - released < HANDOVER_BOUND, `${taken - released} ms`);
  });

  test("waiters are served first come, first served, also by a newcomer that arrives while the turnstile is free between two holders: it queues behind the waiter in line", async () => {
    const bucket = uniq("s");
    const { NatsProxy } = await import("./test_util/proxy.ts");
    await using proxy = await NatsProxy.start(ns.port);
    const h = await manager("h", bucket);
    const a = await manager("a", bucket);
    const c = await manager("c", bucket);
    // b's frames to the server can be held: its compare-and-set on the
    // turnstile then waits in the proxy, which keeps the turnstile free
    // while b is in line. Its requests may wait a TTL, so a held one is
    // not taken for unanswered.
    const bc = await conn(proxy.url);
    const b = await createLeaseManager({
      nc: bc,
      node: "b",
      bucket,
      ttl: TTL,
      timeout: TTL,
      restartGrace: false,
    });
    const log: string[] = [];
    const sem = (m: LeaseManager) => semaphore(m, "line", { limit: 1 });
    const turnstile = async () => (await h.holder("line.next"))?.node;
    const ticketOf = async (node: string) =>
      [...await h.holders("line.q")].some(([, x]) => x.node === node);
    try {
      const held = await sem(h).acquire();
      let endA!: () => void;
      const aGate = new Promise<void>((r) => endA = r);
      const aDone = sem(a).guard(async () => {
        log.push("a");
        await aGate;
      }, { wait: true });
      await eventually(
        async () => await turnstile() === "a",
        2000,
        "a at the turnstile",
      );
      const bDone = sem(b).guard(() => log.push("b"), { wait: true });
      await eventually(() => ticketOf("b"), 2000, "b in line");
      proxy.hold("up");
      await held.release();
      // a takes the slot and leaves the turnstile; b's claim on it is held.
      await eventually(
        async () => log.includes("a") && await turnstile() === undefined,
        2000,
        "a in its slot, the turnstile free",
      );
      const cDone = sem(c).guard(() => log.push("c"), { wait: true });
      // c decides: a ticket behind b's, or (wrongly) the free turnstile.
      await eventually(
        async () => await ticketOf("c") || await turnstile() === "c",
        2000,
        "c in line or at the turnstile",
      );
      proxy.release("up");
      await eventually(
        async () => await turnstile() !== undefined,
        2000,
        "the turnstile taken again",
      );
      endA();
      await Promise.all([aDone, bDone, cDone]);
      assert.deepEqual(log, ["a", "b", "c"]);
    } finally {
      proxy.release("up");
      await b.close();
      await bc.close();
    }
  });
});
