// Tests of the testing kit (testing.ts): real lease managers on the
// in-memory server in virtual time. Each failover runs in milliseconds of
// real time (printed); each check of the kit is shown catching a real
// violation, a write that escapes its lease as the simulator's "escape"
// writes do (returned at once, committed later without a check). Runs
// under `node --test`, `deno test -A` and `bun test`; starts no server.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  createTestLeases,
  type Lease,
  LeaseOverlapError,
  type TestLeases,
} from "./testing.ts";
import {
  type LeaseAcquiredEvent,
  type LeaseLostEvent,
  NotHolderError,
} from "./mod.ts";

const TTL = 15_000;

/** The manager's next event of `type`, with the clock when it came. */
function next<E extends Event>(
  t: TestLeases,
  target: EventTarget,
  type: string,
): Promise<{ e: E; at: number }> {
  return new Promise((resolve) =>
    target.addEventListener(
      type,
      (e) => resolve({ e: e as E, at: t.clock.now() }),
      { once: true },
    )
  );
}

/** Runs `fn` and reports its real duration. */
async function timed<T>(what: string, fn: () => Promise<T>): Promise<T> {
  const t0 = performance.now();
  const out = await fn();
  console.log(`${what}: ${(performance.now() - t0).toFixed(1)} ms real`);
  return out;
}

describe("createTestLeases()", () => {
  test("guard() runs the write once a compare-and-set on the in-memory server confirmed the lease", async () => {
    await using t = createTestLeases({ ttl: TTL });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    const seen = await a.guard("report", (lease) => ({
      epoch: lease.epoch,
      node: lease.node,
      deadline: lease.deadline,
      at: t.clock.now(),
    }));
    // One round trip of 2 x 0.5 ms; the deadline is a TTL after the send.
    assert.deepEqual(seen, { epoch: 1, node: "a", deadline: TTL, at: 1 });
    await assert.rejects(
      b.guard("report", () => {}),
      (err: unknown) => err instanceof NotHolderError && err.holder === "a",
    );
    // The second guard renews by compare-and-set: same epoch.
    assert.equal(await a.guard("report", (lease) => lease.epoch), 1);
    assert.equal(a.ttl, TTL);
    assert.equal(a.bucket, "leases");
  });

  test("a crashed holder's key is taken after its TTL and the grace, with wait: true, in well under a second", async () => {
    await using t = createTestLeases({ ttl: TTL });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    await a.guard("report", (lease) => t.recordWrite(lease));
    t.crash("a");
    const crashed = t.clock.now();
    const acquired = next<LeaseAcquiredEvent>(t, b, "acquired");
    const epoch = await timed(
      "crash, TTL 15 s, then the grace, with wait: true",
      () =>
        b.guard("report", (lease) => {
          t.recordWrite(lease);
          return lease.epoch;
        }, { wait: true }),
    );
    const { e, at } = await acquired;
    // The entry expires a TTL after a's last renewal into a marker, which
    // b takes (found "expired") owing one more TTL of grace.
    assert.equal(e.found, "expired");
    assert.equal(e.grace, TTL);
    assert.ok(at >= crashed + TTL && at < crashed + TTL + 10, `${at}`);
    const wrote = t.history().writes.at(-1)!.at;
    assert.ok(wrote >= at + TTL && wrote < at + TTL + 10, `${wrote}`);
    assert.ok(epoch > 1);
    t.assertNoOverlap();
    assert.deepEqual(
      t.history().tenures.map((x) => [x.node, x.ended]),
      [["a", "crashed"], ["b", undefined]],
    );
  });

  test("release() hands the key over at once", async () => {
    await using t = createTestLeases({ ttl: TTL });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    await a.guard("report", (lease) => t.recordWrite(lease));
    const t0 = t.clock.now();
    await a.release("report");
    const acquired = next<LeaseAcquiredEvent>(t, b, "acquired");
    await b.guard("report", (lease) => t.recordWrite(lease));
    const { e } = await acquired;
    assert.equal(e.found, "released");
    assert.equal(e.grace, 0);
    assert.ok(t.clock.now() - t0 < 10, `${t.clock.now() - t0} ms`);
    t.assertNoOverlap();
    assert.deepEqual(
      t.history().tenures.map((x) => [x.node, x.ended]),
      [["a", "released"], ["b", undefined]],
    );
  });

  test("pause() stalls a holder past its TTL: wait: true takes over after the grace, a careful write refuses, an escaping one is caught", async () => {
    await using t = createTestLeases({ ttl: TTL });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    let careful: Lease | undefined;
    let escaping: Lease | undefined;
    // Two writes under a's lease that commit after a stall: one checks its
    // lease at the commit point, the other (returned at once) does not.
    await a.guard("report", (lease) => {
      careful = lease;
      escaping = lease;
    });
    const paused = t.clock.now();
    t.pause("a", 40_000);
    const lost = next<LeaseLostEvent>(t, a, "lost");
    await timed(
      "pause 40 s, TTL 15 s, then the grace, with wait: true",
      () =>
        b.guard("report", (lease) => t.recordWrite(lease), {
          wait: true,
        }),
    );
    const handover = t.clock.now();
    assert.ok(handover >= paused + 2 * TTL, `${handover}`);
    assert.ok(handover < paused + 40_000, "before a resumes");
    // a resumes at 40 s and learns its lease is over.
    const { e, at } = await lost;
    assert.ok(at >= paused + 40_000, `${at}`);
    assert.ok(careful!.signal.aborted);
    assert.throws(() => careful!.throwIfLost());
    t.assertNoOverlap();
    // The escaping write lands now, unchecked: the check catches it.
    t.recordWrite(escaping!);
    assert.throws(() => t.assertNoOverlap(), (err: unknown) => {
      assert.ok(err instanceof LeaseOverlapError);
      assert.equal(err.write.node, "a");
      assert.equal(err.later.node, "b");
      assert.ok(err.later.epoch > err.tenure.epoch);
      assert.match(
        err.message,
        /node 'a' wrote under epoch 1 .* after node 'b' could write under epoch \d+/,
      );
      return true;
    });
    assert.ok(["expired", "overwritten"].includes(e.reason), e.reason);
    await assert.rejects(a.guard("report", () => {}), NotHolderError);
  });

  test("expire() ends a holder's tenure at its next renewal; a write that escapes it is caught", async () => {
    await using t = createTestLeases({ ttl: TTL });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    let escaping: Lease | undefined;
    await a.guard("report", (lease) => {
      escaping = lease;
    });
    const lost = next<LeaseLostEvent>(t, a, "lost");
    assert.equal(t.expire("report"), true);
    const expired = t.clock.now();
    const { e, at } = await lost;
    // Found at the next renewal (every TTL/3), as a deleted entry.
    assert.equal(e.reason, "deleted");
    assert.ok(at - expired <= TTL / 3 + 10, `${at - expired}`);
    assert.throws(() => escaping!.throwIfLost());
    await b.guard("report", (lease) => t.recordWrite(lease), { wait: true });
    t.assertNoOverlap();
    t.recordWrite(escaping!);
    assert.throws(() => t.assertNoOverlap(), LeaseOverlapError);
    assert.equal(t.expire("nothing-here"), false);
  });

  test("history() lists every tenure with how it ended, and every recorded write", async () => {
    await using t = createTestLeases({ ttl: TTL });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    await a.guard("k1", (lease) => t.recordWrite(lease));
    await a.guard("k2", (lease) => t.recordWrite(lease));
    await a.release("k1");
    await b.guard("k1", (lease) => t.recordWrite(lease));
    t.crash("a");
    const h = t.history();
    assert.deepEqual(
      h.tenures.map((x) => [x.key, x.node, x.epoch, x.ended]),
      [
        ["k1", "a", 1, "released"],
        ["k2", "a", 2, "crashed"],
        ["k1", "b", 4, undefined],
      ],
    );
    assert.deepEqual(
      h.writes.map((w) => [w.key, w.node, w.epoch]),
      [["k1", "a", 1], ["k2", "a", 2], ["k1", "b", 4]],
    );
    for (const x of h.tenures) assert.ok(x.from <= x.writable);
    // A copy: changing it changes nothing in the kit.
    (h.writes as unknown[]).length = 0;
    assert.equal(t.history().writes.length, 3);
    assert.throws(
      () => t.recordWrite({ tenure: "elsewhere" } as Lease),
      TypeError,
    );
  });

  test("assertNoOverlap() names both tenures, their epochs and the times", async () => {
    await using t = createTestLeases({ ttl: TTL });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    let late: Lease | undefined;
    await a.guard("report", (lease) => {
      late = lease;
    });
    await a.release("report");
    await b.guard("report", (lease) => t.recordWrite(lease));
    await t.clock.advance(100);
    t.recordWrite(late!); // a write after the release: it escaped
    assert.throws(
      () => t.assertNoOverlap(),
      new RegExp(
        String
          .raw`Lease overlap on 'report' \(bucket 'leases'\): node 'a' wrote under epoch 1 \(tenure from 1 ms\) at \d+(\.\d+)? ms, after node 'b' could write under epoch \d+ \(tenure from \d+(\.\d+)? ms, writable from \d+(\.\d+)? ms\)$`,
      ),
    );
  });

  test("the same test gives the same history, to the microsecond", async () => {
    const run = async () => {
      await using t = createTestLeases({ ttl: TTL });
      const a = t.manager({ node: "a" });
      const b = t.manager({ node: "b" });
      await a.guard("report", (lease) => t.recordWrite(lease));
      t.pause("a", 20_000);
      await b.guard("report", (lease) => t.recordWrite(lease), { wait: true });
      await t.clock.advance(10_000);
      return t.history();
    };
    assert.deepEqual(await run(), await run());
  });

  test("advance() moves the clock exactly, and the driver moves it only while the test waits", async () => {
    await using t = createTestLeases({ ttl: TTL });
    assert.equal(t.clock.now(), 0);
    await t.clock.advance(1234.5);
    assert.equal(t.clock.now(), 1234.5);
    const a = t.manager({ node: "a" });
    await a.guard("report", () => {});
    assert.equal(t.clock.now(), 1235.5);
    // Renewals every TTL/3 run inside an advance.
    let renewed = 0;
    a.addEventListener("renewed", () => renewed++);
    await t.clock.advance(3 * TTL);
    assert.equal(t.clock.now(), 1235.5 + 3 * TTL);
    assert.ok(renewed >= 8, `${renewed}`);
    await assert.rejects(t.clock.advance(-1), RangeError);
  });

  test('clock: "manual" moves only on advance() and runUntilIdle()', async () => {
    await using t = createTestLeases({ ttl: TTL, clock: "manual" });
    const a = t.manager({ node: "a" });
    let done = false;
    const written = a.guard("report", (lease) => lease.epoch).finally(() => {
      done = true;
    });
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(done, false);
    assert.equal(t.clock.now(), 0);
    await t.clock.runUntilIdle();
    assert.equal(await written, 1);
    assert.equal(t.clock.now(), 1);
    // Only the renewal timer is left: the clock stays.
    await t.clock.runUntilIdle();
    assert.equal(t.clock.now(), 1);
    await t.clock.advance(TTL);
    assert.equal(t.clock.now(), 1 + TTL);
  });

  test('clock: "real" runs the same world in real time, and refuses advance()', async () => {
    await using t = createTestLeases({ ttl: 1_000, clock: "real" });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    const t0 = performance.now();
    await a.guard("report", (lease) => t.recordWrite(lease));
    await a.release("report");
    await b.guard("report", (lease) => t.recordWrite(lease));
    const took = performance.now() - t0;
    assert.ok(took < 500, `${took} ms`);
    assert.ok(t.clock.now() > 0);
    await assert.rejects(t.clock.advance(10), TypeError);
    t.assertNoOverlap();
  });

  test("close() closes the live managers, releasing their keys, and stops the clock", async () => {
    const t = createTestLeases({ ttl: TTL });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    await a.guard("report", () => {});
    await b.guard("other", () => {});
    t.crash("b");
    await t.close();
    await t.close(); // safe twice
    assert.deepEqual(
      t.history().tenures.map((x) => [x.key, x.ended]),
      [["report", "released"], ["other", "crashed"]],
    );
    const now = t.clock.now();
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(t.clock.now(), now);
    await assert.rejects(t.clock.advance(1), TypeError);
    assert.throws(() => t.manager({ node: "c" }), TypeError);
    await assert.rejects(a.guard("report", () => {}), TypeError);
  });

  test('close() leaves no real timer of the kit armed, with keys held on clock: "real"', async () => {
    const live = new Set<unknown>();
    const { setTimeout: set, clearTimeout: clear } = globalThis;
    globalThis.setTimeout = ((fn: () => void, ms?: number) => {
      const h = set(() => {
        live.delete(h);
        fn();
      }, ms);
      live.add(h);
      return h;
    }) as typeof setTimeout;
    globalThis.clearTimeout = ((h: ReturnType<typeof setTimeout>) => {
      live.delete(h);
      clear(h);
    }) as typeof clearTimeout;
    try {
      const t = createTestLeases({ ttl: 1_000, clock: "real" });
      try {
        await t.manager({ node: "a" }).guard("report", () => {});
        await t.manager({ node: "b" }).guard("other", () => {});
        // The driver sleeps until the next renewal, on a real timer.
        await new Promise((resolve) => set(resolve, 10));
        assert.ok(live.size > 0);
      } finally {
        await t.close();
      }
      assert.equal(live.size, 0);
    } finally {
      globalThis.setTimeout = set;
      globalThis.clearTimeout = clear;
    }
  });

  test("manager() checks its options as createLeaseManager does", async () => {
    await using t = createTestLeases({ ttl: TTL });
    assert.throws(() => t.manager({ node: " " }), TypeError);
    assert.throws(
      () => t.manager({ node: "a", fenced: true }),
      /does not offer fenced buckets/,
    );
    assert.throws(() => t.manager({ node: "a", timeout: 0 }), RangeError);
    assert.throws(
      () => t.manager({ node: "a", check: "never" as "cas" }),
      TypeError,
    );
    t.manager({ node: "a" });
    assert.throws(
      () => t.manager({ node: "b", ttl: 5_000 }),
      /bucket 'leases' has a TTL of 15000 ms but 'ttl' is 5000 ms/,
    );
    assert.throws(
      () => t.manager({ node: "b", bucket: "other", createBucket: false }),
      /does not exist and 'createBucket' is false/,
    );
    const other = t.manager({ node: "b", bucket: "other", ttl: 5_000 });
    assert.equal(other.ttl, 5_000);
    const aborted = AbortSignal.abort(new Error("stop"));
    assert.throws(() => t.manager({ node: "c", signal: aborted }), /stop/);
    assert.throws(() => createTestLeases({ ttl: 10 }), RangeError);
    assert.throws(
      () => createTestLeases({ clock: "fake" as "real" }),
      TypeError,
    );
    assert.throws(() => t.pause("nobody", 1), TypeError);
  });

  test("on a server without markers even a never-used key owes the grace", async () => {
    await using t = createTestLeases({ ttl: TTL, version: "2.10.22" });
    const a = t.manager({ node: "a" });
    const b = t.manager({ node: "b" });
    const first = next<LeaseAcquiredEvent>(t, a, "acquired");
    await assert.rejects(a.guard("report", () => {}), NotHolderError);
    assert.equal((await first).e.found, "fresh");
    await a.guard("report", () => {}, { wait: true });
    assert.ok(t.clock.now() >= TTL);
    t.crash("a");
    const acquired = next<LeaseAcquiredEvent>(t, b, "acquired");
    await b.guard("report", () => {}, { wait: true });
    const { e } = await acquired;
    // No marker: the expired entry just went.
    assert.equal(e.found, "fresh");
    assert.equal(e.grace, TTL);
  });
});
