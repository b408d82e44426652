// Tests of shard ownership (shards.ts): assignShards() as a pure function,
// shards()'s input checks, and, against a real nats-server, members that
// join, leave cleanly, break, abort and are killed (SIGKILL, in a child
// process), with every write to a shard going through a fenced store that
// records its shard, node and epoch.
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary. Each test prints the figures it measured.
import { after, describe } from "node:test";
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { before, test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  assignShards,
  createLeaseManager,
  type Lease,
  type LeaseManager,
  memberKey,
  type ShardAssignment,
  shardKey,
  shards,
} from "./mod.ts";
import { conn, eventually, sleep, uniq } from "./test_util/lease_helpers.ts";
import { NatsServer } from "./test_util/nats_server.ts";

const TTL = 1000;
const COUNT = 16;

/** Prints measured figures: numbers are milliseconds, strings counts. */
function report(what: string, figures: Record<string, number | string>) {
  const text = Object.entries(figures).map(([k, v]) =>
    typeof v === "number" ? `${k}=${Math.round(v)} ms` : `${k}=${v}`
  ).join(", ");
  console.log(`  [figures] ${what}: ${text}`);
}

// ---------------------------------------------------------------------------
// assignShards: no server.

/** shard -> member, from assignShards' member -> shards. */
function owners(count: number, members: string[]): Map<number, string> {
  const out = new Map<number, string>();
  for (const [m, ss] of assignShards(count, members)) {
    for (const s of ss) out.set(s, m);
  }
  return out;
}

describe("assignShards", () => {
  test("assignShards() gives every shard to one member, floor or ceil each", () => {
    for (const count of [1, 7, 16, 256]) {
      for (let n = 1; n <= 9; n++) {
        const members = Array.from({ length: n }, (_, i) => `node-${i}`);
        const a = assignShards(count, members);
        assert.deepEqual([...a.keys()], [...members].sort());
        const all = [...a.values()].flat().sort((x, y) => x - y);
        assert.deepEqual(all, Array.from({ length: count }, (_, i) => i));
        for (const ss of a.values()) {
          assert.ok(
            ss.length === Math.floor(count / n) ||
              ss.length === Math.ceil(count / n),
            `count ${count}, ${n} members: ${ss.length}`,
          );
        }
      }
    }
  });

  test("assignShards() depends on the member set only, not its order or repeats", () => {
    const a = assignShards(64, ["b", "a", "c"]);
    assert.deepEqual(assignShards(64, ["c", "a", "b", "a"]), a);
  });

  test("assignShards() moves about count/members shards on a join or leave", () => {
    const names = Array.from({ length: 6 }, (_, i) => `worker-${i}`);
    for (let n = 1; n < names.length; n++) {
      const before = owners(256, names.slice(0, n));
      const after = owners(256, names.slice(0, n + 1));
      const moved = [...after].filter(([s, m]) => before.get(s) !== m).length;
      const least = Math.floor(256 / (n + 1));
      // The joiner gains its share; the balancing pass may move a few
      // more among the others.
      assert.ok(
        [...after].filter(([, m]) => m === names[n]).length >= least,
      );
      assert.ok(moved <= 1.35 * least + 2, `${n}->${n + 1}: ${moved}`);
      const back = owners(256, names.slice(0, n));
      assert.deepEqual(back, before);
    }
  });

  test("assignShards() rejects a bad count or member list", () => {
    assert.throws(() => assignShards(0, ["a"]), RangeError);
    assert.throws(() => assignShards(1.5, ["a"]), RangeError);
    assert.throws(() => assignShards(5000, ["a"]), RangeError);
    assert.throws(
      () => assignShards("4" as unknown as number, ["a"]),
      TypeError,
    );
    assert.throws(() => assignShards(4, [""]), TypeError);
    assert.throws(
      () => assignShards(4, "a" as unknown as string[]),
      TypeError,
    );
    assert.deepEqual(assignShards(4, []), new Map());
    assert.throws(
      () => assignShards(4096, Array.from({ length: 257 }, (_, i) => `n${i}`)),
      RangeError,
    );
  });

  test("shards() rejects bad input before it sends anything", () => {
    // A manager whose every method fails the test: nothing may be called.
    const touched: string[] = [];
    const fake = new Proxy({}, {
      get: (_t, p) => {
        if (typeof p === "string") touched.push(p);
        return () => {
          throw new Error(`called ${String(p)}`);
        };
      },
    }) as LeaseManager;
    assert.throws(() => shards(fake, "bad key", { count: 4 }), TypeError);
    assert.throws(() => shards(fake, "g", { count: 0 }), RangeError);
    assert.throws(() => shards(fake, "g", { count: 2.5 }), RangeError);
    assert.throws(
      () => shards(fake, "g", { count: "4" as unknown as number }),
      TypeError,
    );
    assert.throws(
      () => shards(fake, "g", { count: 4, maxMembers: 0 }),
      RangeError,
    );
    assert.throws(
      () => shards(fake, "g", { count: 4, signal: {} as AbortSignal }),
      TypeError,
    );
    assert.throws(
      () => shards(fake, "g", undefined as unknown as { count: number }),
      TypeError,
    );
    assert.throws(
      () => shards(null as unknown as LeaseManager, "g", { count: 4 }),
      TypeError,
    );
    // Only the method checks read properties; nothing was called.
    shards(fake, "g", { count: 4 }); // valid: returns without calling
    assert.ok(
      touched.every((p) => ["guard", "watch", "held", "release"].includes(p)),
    );
  });
});

// ---------------------------------------------------------------------------
// Against a real server.

/**
 * A store that refuses a write older than the newest epoch it accepted for
 * the shard, and records a violation when two nodes write one shard at once
 * or a write is refused (neither may happen under the leases).
 */
class FencedStore {
  readonly newest = new Map<number, number>();
  readonly active = new Map<number, string>();
  readonly last = new Map<
    number,
    { node: string; epoch: number; at: number }
  >();
  readonly violations: string[] = [];
  writes = 0;

  async write(shard: number, node: string, epoch: number): Promise<void> {
    const newest = this.newest.get(shard) ?? 0;
    if (epoch < newest) {
      this.violations.push(
        `shard ${shard}: ${node} wrote epoch ${epoch} < ${newest}`,
      );
      return;
    }
    const other = this.active.get(shard);
    if (other !== undefined && other !== node) {
      this.violations.push(`shard ${shard}: ${node} and ${other} at once`);
    }
    this.newest.set(shard, epoch);
    this.active.set(shard, node);
    this.writes++;
    await sleep(1);
    if (this.active.get(shard) === node) this.active.delete(shard);
    this.last.set(shard, { node, epoch, at: performance.now() });
  }
}

/** One member in this process: its own connection and manager. */
interface Member {
  readonly node: string;
  readonly leases: LeaseManager;
  readonly nc: NatsConnection;
  /** Every assignment it saw, in order. */
  readonly seen: ShardAssignment[];
  latest(): ShardAssignment | undefined;
  /** Resolves when its loop ended (and, with it, its writers). */
  readonly done: Promise<void>;
  readonly stop: AbortController;
}

describe("shards on a real server", () => {
  let ns: NatsServer;
  let jsm: JetStreamManager;
  let admin: NatsConnection;
  const conns: NatsConnection[] = [];
  const managers: LeaseManager[] = [];

  before(async () => {
    ns = await NatsServer.start();
    admin = await conn(ns.url);
    jsm = await jetstreamManager(admin);
  });

  after(async () => {
    await Promise.all(managers.map((m) => m.close().catch(() => {})));
    await Promise.all(conns.map((c) => c.close().catch(() => {})));
    await admin?.close();
    await ns?.[Symbol.asyncDispose]();
  });

  async function manager(node: string, bucket: string): Promise<LeaseManager> {
    const nc = await conn(ns.url);
    conns.push(nc);
    const m = await createLeaseManager({ nc, node, bucket, ttl: TTL });
    managers.push(m);
    return m;
  }

  /**
   * Starts a member of `group` that writes each owned shard every
   * `writeMs` ms (check: "lease") through `store`, until the shard's lease
   * signal aborts. `how` says how it leaves: `break` out of the loop when
   * `stop` aborts, or pass `stop.signal` to shards().
   */
  async function member(
    node: string,
    bucket: string,
    group: string,
    store: FencedStore | undefined,
    how: "break" | "signal" = "signal",
    writeMs = 20,
  ): Promise<Member> {
    const leases = await manager(node, bucket);
    const nc = conns.at(-1)!;
    const stop = new AbortController();
    const seen: ShardAssignment[] = [];
    const writers: Promise<void>[] = [];
    const write = async (s: number, lease: Lease) => {
      while (!lease.signal.aborted && store) {
        try {
          await leases.guard(
            lease.key,
            (l) => store.write(s, node, l.epoch),
            { signal: lease.signal, check: "lease" },
          );
        } catch {
          // refused: moved away, or the signal aborted
        }
        await sleep(writeMs);
      }
    };
    const done = (async () => {
      const it = shards(leases, group, {
        count: COUNT,
        ...(how === "signal" ? { signal: stop.signal } : {}),
      });
      for await (const a of it) {
        seen.push(a);
        for (const s of a.added) writers.push(write(s, a.owned.get(s)!));
        // With "break", the body holds on to a balanced assignment of two
        // members until `stop` aborts, then breaks out of the loop.
        if (
          how === "break" && a.members.length === 2 &&
          a.owned.size === COUNT / 2
        ) {
          await new Promise((r) =>
            stop.signal.aborted
              ? r(null)
              : stop.signal.addEventListener("abort", r, { once: true })
          );
          break;
        }
      }
      await Promise.all(writers);
    })();
    return { node, leases, nc, seen, latest: () => seen.at(-1), done, stop };
  }

  /** Owned shards by node, from each member's latest assignment. */
  function ownership(ms: Member[]): Map<string, number[]> {
    return new Map(
      ms.map((m) => [m.node, [...(m.latest()?.owned.keys() ?? [])]]),
    );
  }

  function balanced(ms: Member[]): boolean {
    const own = ownership(ms);
    const all = [...own.values()].flat();
    if (all.length !== COUNT || new Set(all).size !== COUNT) return false;
    const lo = Math.floor(COUNT / ms.length), hi = Math.ceil(COUNT / ms.length);
    return [...own.values()].every((s) => s.length >= lo && s.length <= hi) &&
      ms.every((m) => m.latest()?.members.length === ms.length);
  }

  async function consumers(bucket: string): Promise<number> {
    return (await jsm.consumers.list(`KV_${bucket}`).next()).length;
  }

  test("shards() balances 16 shards over members joining one by one, keeping the unmoved ones' leases", async () => {
    const bucket = uniq("shj");
    const store = new FencedStore();
    const ms: Member[] = [];
    const figures: Record<string, number | string> = {};
    try {
      for (let i = 0; i < 3; i++) {
        const before = new Map(
          ms.flatMap((m) => [...(m.latest()?.owned ?? [])]),
        );
        const t0 = performance.now();
        ms.push(await member(`n${i}`, bucket, "jobs", store));
        await eventually(() => balanced(ms), 10 * TTL, `balance at ${i + 1}`);
        figures[`balanced${i + 1}`] = performance.now() - t0;
        // A shard that stayed with its owner kept its lease: same object,
        // same epoch, signal not aborted.
        let kept = 0, moved = 0;
        for (const m of ms) {
          for (const [s, l] of m.latest()!.owned) {
            const old = before.get(s);
            if (old === undefined) continue;
            if (old.node === m.node) {
              assert.equal(old, l, `shard ${s} kept by ${m.node}`);
              assert.equal(old.signal.aborted, false);
              kept++;
            } else {
              assert.equal(old.signal.aborted, true);
              assert.ok(l.epoch > old.epoch);
              moved++;
            }
          }
        }
        figures[`moved${i + 1}`] = String(moved);
        figures[`kept${i + 1}`] = String(kept);
        if (i > 0) {
          // Only the joiner gains shards, about its share.
          const least = Math.floor(COUNT / (i + 1));
          assert.ok(moved >= least && moved <= 2 * least, `moved ${moved}`);
        }
      }
      await sleep(300); // writes go on
      assert.deepEqual(store.violations, []);
      assert.ok(store.writes > 0);
      // The member set, as each member sees it.
      for (const m of ms) {
        assert.deepEqual(m.latest()!.members, ["n0", "n1", "n2"]);
      }
      figures.writes = String(store.writes);
      report("joins", figures);
    } finally {
      for (const m of ms) m.stop.abort();
      await Promise.all(ms.map((m) => m.done));
    }
    assert.deepEqual(store.violations, []);
  });

  test("shards() hands a member's shards on at once when it leaves by break, with no watch left", async () => {
    const bucket = uniq("shb");
    const store = new FencedStore();
    const a = await member("a", bucket, "jobs", store);
    const b = await member("b", bucket, "jobs", store, "break");
    try {
      await eventually(() => balanced([a, b]), 10 * TTL, "balance");
      // Past the grace of every shard, so that a release is clean.
      await sleep(TTL + 100);
      const bShards = [...b.latest()!.owned.keys()];
      const bLeases = [...b.latest()!.owned.values()];
      const t0 = performance.now();
      b.stop.abort();
      await b.done;
      const left = performance.now() - t0;
      for (const l of bLeases) assert.equal(l.signal.aborted, true);
      await eventually(
        () => a.latest()!.owned.size === COUNT,
        5 * TTL,
        "a owns every shard",
      );
      const moved = performance.now() - t0;
      // Taken on a clean release, not after an expiry: within a TTL.
      assert.ok(moved < TTL, `${moved} ms`);
      assert.deepEqual(a.latest()!.members, ["a"]);
      // b's loop left nothing: its manager holds no key and has no watch.
      const closed = await b.leases.close();
      assert.deepEqual(closed, { released: [], unreleased: [] });
      await sleep(200);
      assert.deepEqual(store.violations, []);
      report("clean leave (break)", {
        shards: String(bShards.length),
        leave: left,
        ownedAgain: moved,
      });
    } finally {
      a.stop.abort();
      b.stop.abort();
      await Promise.all([a.done, b.done]);
    }
    // a left by its signal: no consumer remains on the stream.
    await eventually(
      async () => (await consumers(bucket)) === 0,
      5 * TTL,
      "no consumers",
    );
    assert.deepEqual(await a.leases.close(), { released: [], unreleased: [] });
  });

  test("shards() takes a shard back under a new lease after its key was deleted behind its back, reporting it removed and added, the other shards untouched", async () => {
    const bucket = uniq("shl");
    const store = new FencedStore();
    const a = await member("a", bucket, "jobs", store);
    try {
      await eventually(
        () => a.latest()?.owned.size === COUNT,
        10 * TTL,
        "a owns every shard",
      );
      const before = a.latest()!;
      const lost = before.owned.get(3)!;
      const others = [...before.owned].filter(([s]) => s !== 3);
      const seenBefore = a.seen.length;
      // An operator's delete of one shard's key: the owner's next renewal
      // finds the entry gone, so that tenure ends.
      const kv = await new Kvm(admin).open(bucket);
      const t0 = performance.now();
      await kv.delete(shardKey("jobs", 3));
      await eventually(() => lost.signal.aborted, 3 * TTL, "the lost signal");
      const lostAfter = performance.now() - t0;
      // Still its target, a takes it again: after the grace, since the
      // delete is not its own clean release.
      await eventually(
        () => {
          const l = a.latest()!.owned.get(3);
          return l !== undefined && l !== lost;
        },
        10 * TTL,
        "shard 3 taken again",
      );
      const takenAfter = performance.now() - t0;
      const again = a.latest()!.owned.get(3)!;
      assert.ok(again.epoch > lost.epoch, `${again.epoch} > ${lost.epoch}`);
      assert.notEqual(again.tenure, lost.tenure);
      assert.equal(again.signal.aborted, false);
      const since = a.seen.slice(seenBefore);
      assert.ok(since.some((x) => x.removed.includes(3)), "3 removed");
      assert.ok(since.some((x) => x.added.includes(3)), "3 added");
      // No other shard moved: same lease objects, none aborted.
      for (const [s, l] of others) {
        assert.equal(a.latest()!.owned.get(s), l, `shard ${s} kept`);
        assert.equal(l.signal.aborted, false, `shard ${s} not lost`);
        assert.ok(!since.some((x) => x.removed.includes(s)), `${s} removed`);
      }
      await sleep(100);
      assert.deepEqual(store.violations, []);
      report("a shard's key deleted", {
        lost: lostAfter,
        takenAgain: takenAfter,
      });
    } finally {
      a.stop.abort();
      await a.done;
    }
  });

  test("shards() ends when the manager closes, and an aborted signal ends it at once", async () => {
    const bucket = uniq("shc");
    const leases = await manager("c", bucket);
    const seen: ShardAssignment[] = [];
    const loop = (async () => {
      for await (const a of shards(leases, "jobs", { count: 4 })) seen.push(a);
    })();
    await eventually(() => seen.at(-1)?.owned.size === 4, 10 * TTL, "owns all");
    const owned = [...seen.at(-1)!.owned.values()];
    const r = await leases.close();
    await loop;
    for (const l of owned) assert.equal(l.signal.aborted, true);
    assert.equal(r.released.length + r.unreleased.length, 5); // 4 shards, 1 slot
    assert.equal(await consumers(bucket), 0);

    const other = await manager("d", bucket);
    let n = 0;
    for await (
      const _ of shards(other, "jobs", {
        count: 4,
        signal: AbortSignal.abort(),
      })
    ) n++;
    assert.equal(n, 0);
    // One iteration per group per manager at a time.
    const stop = new AbortController();
    const first = shards(other, "jobs", { count: 4, signal: stop.signal })
      [Symbol.asyncIterator]();
    await first.next();
    await assert.rejects(
      shards(other, "jobs", { count: 4 })[Symbol.asyncIterator]().next(),
      TypeError,
    );
    stop.abort();
    assert.equal((await first.next()).done, true);
    await eventually(
      async () => (await consumers(bucket)) === 0,
      5 * TTL,
      "no consumers",
    );
  });

  test("shards() moves a SIGKILLed member's shards after its TTL and the grace", async () => {
    const bucket = uniq("shk");
    const store = new FencedStore();
    const a = await member("a", bucket, "jobs", store);
    await eventually(
      () => a.latest()?.owned.size === COUNT,
      10 * TTL,
      "a owns all",
    );
    const child = startChild(ns.url, bucket, "k");
    try {
      await eventually(
        () => {
          const o = child.assign();
          return o !== undefined &&
            Object.keys(o.owned ?? {}).length === COUNT / 2 &&
            a.latest()!.owned.size === COUNT / 2;
        },
        15 * TTL,
        "split with the child",
      );
      const kEpochs = child.assign()!.owned!;
      const kOwned = Object.keys(kEpochs).map(Number);
      await sleep(300);
      const killedAt = performance.now();
      child.child.kill("SIGKILL");
      await child.exited;
      await eventually(
        () => a.latest()!.owned.size === COUNT,
        10 * TTL,
        "a owns all again",
      );
      const back = performance.now() - killedAt;
      // Not before the dead member's entries could expire.
      assert.ok(back >= TTL, `${back} ms`);
      for (const s of kOwned) {
        assert.ok(a.latest()!.owned.get(s)!.epoch > kEpochs[s]!);
      }
      assert.deepEqual(a.latest()!.members, ["a"]);
      await sleep(200);
      assert.deepEqual(store.violations, []);
      report("SIGKILLed member", {
        shards: String(kOwned.length),
        ownedAgain: back,
      });
    } finally {
      child.child.kill("SIGKILL");
      await child.exited;
      a.stop.abort();
      await a.done;
    }
  });

  test("shards() in a child process: SIGTERM leaves, closes, and the process exits by itself", async () => {
    const bucket = uniq("sht");
    const a = await member("a", bucket, "jobs", undefined);
    const child = startChild(ns.url, bucket, "t");
    try {
      await eventually(
        () =>
          Object.keys(child.assign()?.owned ?? {}).length === COUNT / 2 &&
          a.latest()?.owned.size === COUNT / 2,
        15 * TTL,
        "split with the child",
      );
      await sleep(TTL + 100); // past the grace
      const t0 = performance.now();
      child.child.kill("SIGTERM");
      const code = await Promise.race([
        child.exited,
        sleep(5000).then(() => "hung"),
      ]);
      // Deno's child_process reports a child sent SIGTERM as ended by it,
      // even when it handled the signal and exited with status 0.
      assert.ok(
        code === 0 || ("Deno" in globalThis && code === "SIGTERM"),
        `child exit: ${code}; ${child.stderr()}; ${
          JSON.stringify(child.events.at(-1))
        }`,
      );
      const closed = child.events.find((e) => e.ev === "closed")!;
      assert.deepEqual(closed.released, []);
      await eventually(
        () => a.latest()!.owned.size === COUNT,
        5 * TTL,
        "a owns all",
      );
      report("clean leave (child SIGTERM)", {
        ownedAgain: performance.now() - t0,
      });
    } finally {
      child.child.kill("SIGKILL");
      await child.exited;
      a.stop.abort();
      await a.done;
    }
    await eventually(
      async () => (await consumers(bucket)) === 0,
      5 * TTL,
      "no consumers",
    );
  });

  test("shards() leaves a member with every slot taken waiting as a standby", async () => {
    const bucket = uniq("shs");
    const one = await manager("one", bucket);
    const two = await manager("two", bucket);
    const stop = new AbortController();
    const seenOne: ShardAssignment[] = [], seenTwo: ShardAssignment[] = [];
    const l1 = (async () => {
      for await (
        const a of shards(one, "jobs", {
          count: 4,
          maxMembers: 1,
          signal: stop.signal,
        })
      ) seenOne.push(a);
    })();
    await eventually(
      () => seenOne.at(-1)?.owned.size === 4,
      10 * TTL,
      "one owns all",
    );
    const stopOne = new AbortController();
    const l2 = (async () => {
      for await (
        const a of shards(two, "jobs", {
          count: 4,
          maxMembers: 1,
          signal: AbortSignal.any([stop.signal, stopOne.signal]),
        })
      ) seenTwo.push(a);
    })();
    await eventually(
      () => seenTwo.length > 0,
      5 * TTL,
      "two's first assignment",
    );
    assert.equal(seenTwo.at(-1)!.owned.size, 0);
    assert.deepEqual(seenTwo.at(-1)!.members, ["one"]);
    // one leaves: two takes the slot and the shards.
    await one.close();
    await l1;
    await eventually(
      () => seenTwo.at(-1)?.owned.size === 4,
      5 * TTL,
      "two owns all",
    );
    assert.deepEqual(seenTwo.at(-1)!.members, ["two"]);
    stop.abort();
    await l2;
    assert.equal(await two.holder(memberKey("jobs", 0)), null);
    assert.equal(await two.holder(shardKey("jobs", 0)), null);
  });

  test("lease shards GROUP --count N prints the members and each shard's owner, as text and --json; bad input exits 64 before connecting", async () => {
    const bucket = uniq("shl");
    const a = await member("a", bucket, "jobs", undefined);
    const b = await member("b", bucket, "jobs", undefined);
    try {
      await eventually(() => balanced([a, b]), 10 * TTL, "balance");
      const text = await cli([
        "shards",
        "jobs",
        "--count",
        String(COUNT),
        "--bucket",
        bucket,
      ]);
      assert.equal(text.code, 0, text.err);
      const lines = text.out.trim().split("\n");
      assert.equal(lines[0], "members (2): a b");
      assert.equal(lines.length, 1 + COUNT);
      for (let i = 0; i < COUNT; i++) {
        const owner = a.latest()!.owned.has(i) ? a : b;
        const l = owner.latest()!.owned.get(i)!;
        assert.equal(
          lines[1 + i],
          `shard ${i}: ${owner.node} epoch ${l.epoch}`,
        );
      }
      const json = await cli([
        "shards",
        "jobs",
        "--count=4",
        "--bucket",
        bucket,
        "--json",
      ]);
      assert.equal(json.code, 0, json.err);
      const v = JSON.parse(json.out);
      assert.deepEqual(v.members, ["a", "b"]);
      assert.equal(v.shards.length, 4);
      assert.deepEqual(Object.keys(v.shards[0]), ["shard", "holder", "target"]);
      for (
        const bad of [["shards", "jobs"], ["shards", "jobs", "--count", "0"], [
          "shards",
          "bad group",
          "--count",
          "4",
        ], ["shards", "jobs", "--count", "x"]]
      ) {
        const r = await cli([...bad, "--servers", "127.0.0.1:1"]);
        assert.ok(
          r.code === 64 || r.code === 65,
          `${bad.join(" ")}: ${r.code} ${r.err}`,
        );
      }
    } finally {
      a.stop.abort();
      b.stop.abort();
      await Promise.all([a.done, b.done]);
    }
  });

  /** Runs `lease ARGS` (cli.ts) under this test's runtime, to its end. */
  function cli(
    args: string[],
  ): Promise<{ code: number | null; out: string; err: string }> {
    const cliPath = fileURLToPath(new URL("./cli.ts", import.meta.url));
    const pre = "Deno" in globalThis ? ["run", "-A", cliPath] : [cliPath];
    const env: Record<string, string | undefined> = {
      ...process.env,
      NATS_URL: ns.url,
    };
    delete env.NODE_TEST_CONTEXT;
    const child = spawn(process.execPath, [...pre, ...args], {
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "", err = "";
    child.stdout!.setEncoding("utf8").on("data", (d: string) => out += d);
    child.stderr!.setEncoding("utf8").on("data", (d: string) => err += d);
    return new Promise((r) =>
      child.on("exit", (code) => r({ code, out, err }))
    );
  }
});

// ---------------------------------------------------------------------------
// A member in a child process (test_util/shards_child.ts).

const CHILD = fileURLToPath(
  new URL("./test_util/shards_child.ts", import.meta.url),
);

interface ChildEvent {
  ev: string;
  t: number;
  owned?: Record<string, number>;
  released?: string[];
  [k: string]: unknown;
}

function startChild(url: string, bucket: string, node: string) {
  const args = "Deno" in globalThis ? ["run", "-A", CHILD] : [CHILD];
  const child = spawn(process.execPath, args, {
    env: {
      ...process.env,
      NATS_URL: url,
      LEASE_BUCKET: bucket,
      LEASE_TTL: String(TTL),
      LEASE_NODE: node,
      SHARDS_GROUP: "jobs",
      SHARDS_COUNT: String(COUNT),
      SHARDS_WRITE_MS: "0",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const events: ChildEvent[] = [];
  let buf = "", err = "";
  child.stdout!.setEncoding("utf8");
  child.stdout!.on("data", (d: string) => {
    buf += d;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      try {
        events.push(JSON.parse(line));
      } catch {
        err += line + "\n";
      }
    }
  });
  child.stderr!.setEncoding("utf8");
  child.stderr!.on("data", (d: string) => err += d);
  const exited = new Promise<number | string | null>((r) =>
    child.on("exit", (code, signal) => r(code ?? signal))
  );
  return {
    child,
    events,
    exited,
    stderr: () => err,
    assign: () => events.filter((e) => e.ev === "assign").at(-1),
  };
}
