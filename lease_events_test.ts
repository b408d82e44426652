// What a manager tells its listeners and its health probe (issue 20): the
// events of a holder change, a loss by a paused server, an overwrite, a
// deleted bucket and a clean release, each checked against what happened;
// health() turning bad while the server is paused or the connection down,
// and good again after.
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary.
import { after, describe } from "node:test";
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { before, test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  createLeaseManager,
  LeaseAcquiredEvent,
  type LeaseEventMap,
  LeaseLostEvent,
  type LeaseManager,
  LeaseReleasedEvent,
  LeaseRenewedEvent,
  type NotHolderError,
  RenewalFailedEvent,
} from "./mod.ts";
import {
  conn,
  eventually,
  guardUntil,
  sleep,
  uniq,
} from "./test_util/lease_helpers.ts";
import { NatsServer } from "./test_util/nats_server.ts";

/** Every event of `m`, in order, as `[type, event]`. */
function record(m: LeaseManager): Event[] {
  const seen: Event[] = [];
  for (
    const type of [
      "acquired",
      "lost",
      "released",
      "renewal-failed",
      "renewed",
      "defunct",
    ] as const
  ) {
    m.addEventListener(type, (e) => seen.push(e));
  }
  return seen;
}

/** The events of `type` among `seen`. */
function of<K extends keyof LeaseEventMap>(
  seen: Event[],
  type: K,
): LeaseEventMap[K][] {
  return seen.filter((e) => e.type === type) as LeaseEventMap[K][];
}

describe("events and health()", () => {
  let ns: NatsServer;
  const conns: NatsConnection[] = [];
  const managers: LeaseManager[] = [];

  before(async () => {
    ns = await NatsServer.start();
  });

  after(async () => {
    await Promise.allSettled(managers.map((m) => m.close()));
    await Promise.allSettled(conns.map((c) => c.close()));
    await ns?.[Symbol.asyncDispose]();
  });

  async function manager(node: string, bucket: string, ttl = 1500) {
    const nc = await conn(ns.url);
    conns.push(nc);
    const m = await createLeaseManager({ nc, node, bucket, ttl });
    managers.push(m);
    return m;
  }

  test("a holder change: acquired (fresh), released (clean), acquired (released, no grace); steady guards dispatch nothing", async () => {
    const bucket = uniq("ev");
    const a = await manager("a", bucket);
    const b = await manager("b", bucket);
    const seenA = record(a);
    const seenB = record(b);
    const epochA = await guardUntil(a, "k", (l) => l.epoch, 5000);
    await sleep(10); // events are dispatched in a microtask after the change
    const [acquired] = of(seenA, "acquired");
    assert.ok(acquired instanceof LeaseAcquiredEvent);
    assert.equal(acquired.key, "k");
    assert.equal(acquired.epoch, epochA);
    assert.ok(["fresh", "expired"].includes(acquired.found), acquired.found);
    const before = seenA.length;
    for (let i = 0; i < 50; i++) await a.guard("k", () => {});
    for (let i = 0; i < 50; i++) {
      await a.guard("k", () => {}, { check: "lease" });
    }
    assert.equal(seenA.length, before, "steady-state guards dispatched events");
    const waiting = b.guard("k", (l) => l.epoch, {
      wait: true,
      signal: AbortSignal.timeout(10_000),
    });
    await a.release("k");
    const epochB = await waiting;
    await sleep(10);
    const [released] = of(seenA, "released");
    assert.ok(released instanceof LeaseReleasedEvent);
    assert.deepEqual(
      [released.key, released.epoch, released.clean],
      ["k", epochA, true],
    );
    assert.deepEqual(of(seenA, "lost"), [], "a release is not a loss");
    const [took] = of(seenB, "acquired");
    assert.deepEqual(
      [took?.key, took?.epoch, took?.found, took?.grace],
      ["k", epochB, "released", 0],
    );
    assert.ok(a.health().ok);
    assert.equal(b.health().held, 1);
  });

  test("renewed: each renewal of the timer with its epoch and time; a key its CAS guards keep renewed gets none", async () => {
    const bucket = uniq("ev");
    const ttl = 1500;
    const a = await manager("a", bucket, ttl);
    const seen = record(a);
    const epoch = await guardUntil(a, "k", (l) => l.epoch, 5000);
    // The timer renews every TTL/3 (500 ms): two within 2 TTL.
    await eventually(
      () => of(seen, "renewed").length >= 2,
      2 * ttl,
      "two renewals",
    );
    for (const e of of(seen, "renewed")) {
      assert.ok(e instanceof LeaseRenewedEvent);
      assert.deepEqual([e.key, e.epoch], ["k", epoch]);
      // A round trip to the server, on a clock of microseconds: more than
      // nothing, and confirmed within the deadline.
      assert.ok(e.duration > 0 && e.duration < ttl, `${e.duration} ms`);
    }
    // A CAS guard every 50 ms renews the key itself: for one TTL the timer
    // never comes due, so nothing is dispatched.
    await a.guard("k", () => {});
    await sleep(10);
    const before = of(seen, "renewed").length;
    const until = performance.now() + ttl;
    while (performance.now() < until) {
      await a.guard("k", () => {});
      await sleep(50);
    }
    assert.equal(of(seen, "renewed").length, before, "renewed during guards");
    assert.deepEqual(of(seen, "renewal-failed"), []);
  });

  test("another node's write over the key: lost (overwritten, naming it)", async () => {
    const bucket = uniq("ev");
    const a = await manager("a", bucket);
    const seen = record(a);
    const epoch = await guardUntil(a, "k", (l) => l.epoch, 5000);
    const kv = await new Kvm(conns.at(-1)!).open(bucket);
    await kv.put("k", "intruder");
    await eventually(
      () => of(seen, "lost").length > 0,
      3000,
      "the loss to be reported",
    );
    const [lost] = of(seen, "lost");
    assert.ok(lost instanceof LeaseLostEvent);
    assert.deepEqual(
      [lost.key, lost.epoch, lost.reason, lost.holder],
      ["k", epoch, "overwritten", "intruder"],
    );
    assert.equal(a.health().held, 0);
  });

  test("a key deleted behind its holder: lost (deleted); the next takes it found removed, owing 2 TTL of grace; released inside that grace: released (not clean), its entry left to expire", async () => {
    const bucket = uniq("ev");
    const ttl = 1500;
    const a = await manager("a", bucket, ttl);
    const b = await manager("b", bucket, ttl);
    const seenA = record(a);
    const seenB = record(b);
    const epochA = await guardUntil(a, "k", (l) => l.epoch, 5000);
    const kv = await new Kvm(conns.at(-1)!).open(bucket);
    // Someone else's delete (untagged): a's next renewal (TTL/3) finds it.
    await kv.delete("k");
    await eventually(
      () => of(seenA, "lost").length > 0,
      ttl,
      "a's loss to be reported",
    );
    const [lost] = of(seenA, "lost");
    assert.deepEqual(
      [lost?.key, lost?.epoch, lost?.reason, lost?.holder],
      ["k", epochA, "deleted", undefined],
    );
    // b takes the key, but a deleted entry's holder may still be inside
    // its deadline (one TTL), and then owed the grace (one TTL): b may not
    // write for 2 TTL.
    await assert.rejects(b.guard("k", () => {}), (err: NotHolderError) => {
      assert.equal(err.name, "NotHolderError");
      assert.ok(
        err.retryAfter !== undefined && err.retryAfter > ttl,
        `retryAfter ${err.retryAfter}`,
      );
      return true;
    });
    await sleep(10);
    const [took] = of(seenB, "acquired");
    assert.ok(took instanceof LeaseAcquiredEvent);
    assert.deepEqual(
      [took.key, took.found, took.grace],
      ["k", "removed", 2 * ttl],
    );
    assert.ok(took.epoch > epochA, `${took.epoch} after ${epochA}`);
    // Released inside its grace: a write of the holder before a may still
    // land, so b deletes nothing and says so.
    await b.release("k");
    await sleep(10);
    const [released] = of(seenB, "released");
    assert.ok(released instanceof LeaseReleasedEvent);
    assert.deepEqual(
      [released.key, released.epoch, released.tenure, released.clean],
      ["k", took.epoch, took.tenure, false],
    );
    const entry = await kv.get("k");
    assert.deepEqual(
      [entry?.operation, entry?.string()],
      ["PUT", "b"],
      "an unclean release must leave its entry to expire",
    );
    assert.deepEqual(of(seenB, "lost"), [], "a release is not a loss");
  });

  test("a paused server: renewal-failed with the time left, lost (expired), health() bad while paused and good after", async () => {
    const bucket = uniq("ev");
    const ttl = 1500;
    const a = await manager("a", bucket, ttl);
    const seen = record(a);
    const epoch = await guardUntil(a, "k", (l) => l.epoch, 5000);
    assert.deepEqual(a.health(), {
      ok: true,
      closed: false,
      defunct: undefined,
      connected: true,
      held: 1,
      overdue: [],
      expiring: [],
    });
    await ns.pause();
    let bad;
    try {
      await eventually(() => !a.health().ok, 2 * ttl, "health() to turn bad");
      bad = a.health();
      await eventually(
        () => of(seen, "lost").length > 0,
        3 * ttl,
        "the loss to be reported",
      );
    } finally {
      await ns.resume();
    }
    assert.equal(bad.connected, true, "a paused server keeps the connection");
    assert.ok(
      bad.overdue.includes("k") || bad.expiring.includes("k"),
      JSON.stringify(bad),
    );
    const failed = of(seen, "renewal-failed");
    assert.ok(failed.length > 0, "no renewal-failed event");
    assert.ok(failed[0] instanceof RenewalFailedEvent);
    assert.equal(failed[0].epoch, epoch);
    assert.ok(failed[0].remaining > 0, `remaining ${failed[0].remaining}`);
    const [lost] = of(seen, "lost");
    assert.deepEqual([lost?.key, lost?.reason], ["k", "expired"]);
    await eventually(() => a.health().ok, 3 * ttl, "health() to turn good");
    await guardUntil(a, "k", () => {}, 5 * ttl);
    assert.ok(a.health().ok, JSON.stringify(a.health()));
  });

  test("health() while the connection is down: not connected, its lease expiring (not vouched for), not ok; connected and ok again once the server is back", async () => {
    // A server of its own: this one is stopped and restarted.
    await using own = await NatsServer.start();
    const nc = await conn(own.url);
    const ttl = 3000;
    const a = await createLeaseManager({
      nc,
      node: "a",
      bucket: uniq("ev"),
      ttl,
    });
    try {
      await guardUntil(a, "k", () => {}, 5000);
      assert.ok(a.health().ok, JSON.stringify(a.health()));
      await own.stop();
      await eventually(
        () => !a.health().connected,
        ttl / 3,
        "health() to see the connection down",
      );
      // Well inside the deadline (2/3 TTL at least after the last renewal,
      // more than the margin of TTL/3): expiring because it is suspended.
      const down = a.health();
      assert.deepEqual(
        [down.ok, down.connected, down.held, down.expiring],
        [false, false, 1, ["k"]],
        JSON.stringify(down),
      );
      await own.restart();
      await eventually(() => a.health().ok, 3 * ttl, "health() to turn good");
      assert.equal(a.health().connected, true);
    } finally {
      await a.close();
      await nc.close();
    }
  });

  test("a deleted bucket: lost (defunct) for each held key, then defunct once; health() says why", async () => {
    const bucket = uniq("ev");
    const a = await manager("a", bucket);
    const seen = record(a);
    await guardUntil(a, "k1", () => {}, 5000);
    await guardUntil(a, "k2", () => {}, 5000);
    const jsm = await jetstreamManager(conns.at(-1)!);
    await jsm.streams.delete(`KV_${bucket}`);
    await eventually(
      () => of(seen, "defunct").length > 0,
      5000,
      "defunct to be reported",
    );
    await sleep(10);
    const lost = of(seen, "lost");
    assert.deepEqual(
      lost.map((e) => [e.key, e.reason]).sort(),
      [["k1", "defunct"], ["k2", "defunct"]],
    );
    assert.equal(of(seen, "defunct").length, 1);
    assert.match(of(seen, "defunct")[0]!.reason, /gone/);
    const h = a.health();
    assert.equal(h.ok, false);
    assert.match(h.defunct ?? "", /gone/);
  });

  test("a deleted bucket, seen by a manager that holds nothing: its watch throws, its waiting guard rejects, it goes defunct", async () => {
    const bucket = uniq("ev");
    // A TTL long enough that nothing but the watch can tell in time, even
    // by its fallback (two missed idle heartbeats, about 10 s).
    const w = await manager("w", bucket, 30_000);
    const seen = record(w);
    // Another node's entry, written as the Go reference writes one: w waits.
    const kv = await new Kvm(conns.at(-1)!).open(bucket);
    await kv.put("k", "h");
    const holders: (string | null)[] = [];
    const watching = (async () => {
      for await (const x of w.watch("k")) holders.push(x?.node ?? null);
    })();
    const waiting = w.guard("k", () => {}, { wait: true });
    // Both reject when the bucket goes, in either order, and each is
    // awaited below: handled from now on, so that the one that rejects
    // while the other is awaited is not an unhandled rejection (Bun fails
    // the running test for one and runs the rest of its body beside the
    // next tests: run 24 of this stop).
    watching.catch(() => {});
    waiting.catch(() => {});
    await eventually(() => holders.length > 0, 5000, "the watch's first news");
    assert.deepEqual(holders, ["h"]);
    const t0 = performance.now();
    await jetstreamManager(conns.at(-1)!).then((jsm) =>
      jsm.streams.delete(`KV_${bucket}`)
    );
    await assert.rejects(watching, (err: Error) => {
      assert.equal(err.name, "UnavailableError");
      assert.match(err.message, /gone/);
      return true;
    });
    const ms = Math.round(performance.now() - t0);
    await assert.rejects(waiting, { name: "UnavailableError" });
    await sleep(10);
    assert.equal(of(seen, "defunct").length, 1);
    assert.match(w.health().defunct ?? "", /gone/);
    // Well within the TTL (30 s): the watch told, not a read one TTL after
    // the holder's entry was seen (the only way before it told). Mostly in
    // milliseconds; 20 s leaves room for the heartbeat fallback under load.
    assert.ok(ms < 20_000, `${ms} ms`);
    console.log(`[figures] watch ended ${ms} ms after the bucket's deletion`);
    // A watch begun on the defunct manager ends the same way.
    await assert.rejects(
      (async () => {
        for await (const _ of w.watch("k2")) { /* nothing comes */ }
      })(),
      { name: "UnavailableError" },
    );
  });

  test("a listener that throws breaks neither the manager nor the other listeners; removeEventListener and close()", async () => {
    const bucket = uniq("ev");
    const a = await manager("a", bucket);
    const errors: unknown[][] = [];
    const consoleError = console.error;
    console.error = (...args: unknown[]) => void errors.push(args);
    try {
      const bad = () => {
        throw new Error("listener bug");
      };
      a.addEventListener("acquired", bad);
      const seen = record(a);
      await guardUntil(a, "k", () => {}, 5000);
      await eventually(
        () => of(seen, "acquired").length === 1,
        1000,
        "the other listener",
      );
      assert.equal(errors.length, 1);
      assert.match(String(errors[0]![1]), /listener bug/);
      a.removeEventListener("acquired", bad);
      await a.release("k");
      await guardUntil(a, "k", () => {}, 5000);
      await eventually(
        () => of(seen, "acquired").length === 2,
        1000,
        "the second acquisition",
      );
      assert.equal(errors.length, 1, "a removed listener was called");
      const closing = a.close();
      // Closed from the call on, not only once the keys have settled: a
      // probe asked meanwhile must not say ok.
      const during = a.health();
      assert.deepEqual([during.ok, during.closed], [false, true]);
      const { released } = await closing;
      assert.deepEqual(released, ["k"]);
      await sleep(10);
      assert.equal(of(seen, "released").at(-1)?.clean, true);
      const h = a.health();
      assert.deepEqual([h.ok, h.closed, h.held], [false, true, 0]);
      assert.throws(() => a.health({ margin: -1 }), RangeError);
      // NaN would compare false with every time left: nothing expiring.
      assert.throws(() => a.health({ margin: NaN }), RangeError);
    } finally {
      console.error = consoleError;
    }
  });
});
