/**
 * The three systems of the peer comparison (`bench/peers.ts`) behind one
 * shape, shared by the bench and its holder child (`bench/_peers_child.ts`):
 * this library on NATS JetStream KV, etcd with the `etcd3` client's `Lock`
 * and `Election`, and Redis with `redlock` over `ioredis`.
 *
 * A guarded write puts a value under `data.<key>` in the system itself:
 *
 * - ours: `guard(key, write)` (a CAS on the lease key, or none with
 *   `check: "lease"`), then `kv.put` into a data bucket: the epoch is the
 *   token, for a store that checks it;
 * - ours on a fenced bucket (`fenced: true`, issue 33): `guard(key, write)`
 *   (with `check: "cas"` a read of the key's tenure entry, or none with
 *   `"lease"`), then `lease.put("data.<key>")` into the same bucket: a
 *   publish that the server stores only while the key's tenure entry is
 *   still at the epoch, the coordinator's own commit-point check as etcd's
 *   transaction is;
 * - etcd: one transaction that compares the lock key's create revision and
 *   puts the value, etcd's own commit-point check: the revision is the token;
 * - Redis: `lock.extend()`, the only confirmation Redlock offers before a
 *   write, then `SET`: there is no token.
 *
 * Beside each, `openFloor` gives the least its server must be asked to take
 * a free key and give it up (row 3b), through the system's plain client
 * with no lock library: two requests, each awaited, that create a key only
 * if it is absent and then delete it.
 *
 * @module
 */

import { connect } from "@nats-io/transport-node";
import { headers, type NatsConnection } from "@nats-io/nats-core";
import { jetstream } from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";
import { Etcd3 } from "etcd3";
import type { Campaign, Election, Lock as EtcdLock } from "etcd3";
import { Redis } from "ioredis";
import Redlock from "redlock";
import type { Lock as RedlockLock } from "redlock";
import {
  createLeaseManager,
  type GuardCheck,
  type LeaseManager,
} from "../mod.ts";

/** Where each system listens. */
export interface Endpoints {
  nats: string;
  etcd: string;
  redis: string;
}

/** Which system, and for ours which server. */
export type SystemName =
  | "nats"
  | "nats-always"
  | "nats-fenced"
  | "nats-fenced-always"
  | "etcd"
  | "redis"
  | "redis-always";

/** A held lock: its token, the guarded write, the release. */
export interface Held {
  /** The fencing token, or `undefined` where the system has none. */
  readonly token: number | undefined;
  /**
   * Checks the lock as the system allows, calls `between` (where a pause
   * hits "mid-write"), then writes `value` under `data.<key>`.
   *
   * @returns Whether the write landed.
   */
  write(value: string, between?: () => Promise<void>): Promise<boolean>;
  /**
   * Fenced buckets only: sends the message a fenced put of `value` sends
   * (the data subject, the fence's two headers at this tenure's epoch) by a
   * bare `js.publish`, without the lease's own check before sending, as a
   * put that left just before a pause would reach the server. Resolves
   * with whether the server stored it and, if not, its answer.
   */
  sendFenced?(value: string): Promise<{ stored: boolean; answer: string }>;
  /** Gives the lock up. */
  release(): Promise<void>;
}

/** One system's client. */
export interface Peer {
  /** Takes a free key; throws when it is held. */
  acquire(key: string, ttl: number): Promise<Held>;
  /**
   * Waits until the key is ours, then writes `value` once; resolves with the
   * time of that write (`performance.now()`) and the token.
   */
  waitAndWrite(
    key: string,
    ttl: number,
    value: string,
  ): Promise<{ at: number; token: number | undefined }>;
  /** How a waiting successor learns that the key is free. */
  readonly learns: string;
  /**
   * Fenced buckets only: the value of the data key the writes of `key` go
   * to, as the server has it now (`undefined` when there is none).
   */
  stored?(key: string, ttl: number): Promise<string | undefined>;
  close(): Promise<void>;
}

/** Opens a client of `system` with guard check `check` (ours only). */
export async function openPeer(
  system: SystemName,
  ep: Endpoints,
  node: string,
  check: GuardCheck = "cas",
): Promise<Peer> {
  if (system === "etcd") return openEtcd(ep.etcd);
  if (system === "redis" || system === "redis-always") {
    return openRedis(ep.redis);
  }
  if (system === "nats-fenced" || system === "nats-fenced-always") {
    return await openFenced(ep.nats, node, check);
  }
  return await openOurs(ep.nats, node, check);
}

/** The bucket ours keeps its lease keys in on `system`, for a TTL. */
export function bucketOf(system: SystemName, ttl: number): string {
  return system === "nats-fenced" || system === "nats-fenced-always"
    ? `peers_fenced_${ttl}`
    : `peers_${ttl}`;
}

// ---------------------------------------------------------------------------
// Ours.

async function openOurs(
  url: string,
  node: string,
  check: GuardCheck,
): Promise<Peer> {
  const nc: NatsConnection = await connect({ servers: url });
  const data: KV = await new Kvm(nc).create("peers_data");
  // One manager per TTL: the TTL is the manager's.
  const byTtl = new Map<number, LeaseManager>();
  const manager = async (ttl: number): Promise<LeaseManager> => {
    let m = byTtl.get(ttl);
    if (m === undefined) {
      m = await createLeaseManager({
        nc,
        node,
        bucket: bucketOf("nats", ttl),
        ttl,
        check,
        restartGrace: false,
      });
      byTtl.set(ttl, m);
    }
    return m;
  };
  const held = (m: LeaseManager, key: string, token: number): Held => ({
    token,
    async write(value, between) {
      await m.guard(key, async (lease) => {
        await between?.();
        await data.put(`data.${key}`, `${lease.epoch} ${value}`);
      });
      return true;
    },
    release: () => m.release(key),
  });
  return {
    learns: "watch on the lease key (wait: true), then the failover grace",
    async acquire(key, ttl) {
      const m = await manager(ttl);
      const epoch = await m.guard(key, (lease) => lease.epoch);
      return held(m, key, epoch);
    },
    async waitAndWrite(key, ttl, value) {
      const m = await manager(ttl);
      return await m.guard(key, async (lease) => {
        await data.put(`data.${key}`, `${lease.epoch} ${value}`);
        return { at: performance.now(), token: lease.epoch };
      }, { wait: true, signal: AbortSignal.timeout(10 * ttl) });
    },
    async close() {
      for (const m of byTtl.values()) await m.close();
      await nc.close();
    },
  };
}

// ---------------------------------------------------------------------------
// Ours on a fenced bucket: the data key is written by the lease's fenced put.

async function openFenced(
  url: string,
  node: string,
  check: GuardCheck,
): Promise<Peer> {
  const nc: NatsConnection = await connect({ servers: url });
  const js = jetstream(nc);
  const byTtl = new Map<number, LeaseManager>();
  const manager = async (ttl: number): Promise<LeaseManager> => {
    let m = byTtl.get(ttl);
    if (m === undefined) {
      m = await createLeaseManager({
        nc,
        node,
        bucket: bucketOf("nats-fenced", ttl),
        ttl,
        check,
        fenced: true,
      });
      byTtl.set(ttl, m);
    }
    return m;
  };
  const held = (
    m: LeaseManager,
    ttl: number,
    key: string,
    token: number,
  ): Held => ({
    token,
    async write(value, between) {
      await m.guard(key, async (lease) => {
        await between?.();
        await lease.put(`data.${key}`, `${lease.epoch} ${value}`);
      });
      return true;
    },
    async sendFenced(value) {
      const bucket = bucketOf("nats-fenced", ttl);
      const h = headers();
      h.set("Nats-Expected-Last-Subject-Sequence", String(token));
      h.set(
        "Nats-Expected-Last-Subject-Sequence-Subject",
        `$KV.${bucket}._lease.k.${key}`,
      );
      try {
        const ack = await js.publish(
          `$KV.${bucket}.data.${key}`,
          `${token} ${value}`,
          { headers: h },
        );
        return { stored: true, answer: `stored at ${ack.seq}` };
      } catch (err) {
        return { stored: false, answer: String(err).split("\n")[0]! };
      }
    },
    release: () => m.release(key),
  });
  return {
    learns:
      "watch on the key's tenure entry and on the holder's session entry (its expiry or delete), and a probe of the holder's session subject every 25 ms (no responders: its connection is gone); no grace",
    async acquire(key, ttl) {
      const m = await manager(ttl);
      const epoch = await m.guard(key, (lease) => lease.epoch);
      return held(m, ttl, key, epoch);
    },
    async waitAndWrite(key, ttl, value) {
      const m = await manager(ttl);
      return await m.guard(key, async (lease) => {
        await lease.put(`data.${key}`, `${lease.epoch} ${value}`);
        return { at: performance.now(), token: lease.epoch };
      }, { wait: true, signal: AbortSignal.timeout(10 * ttl) });
    },
    async stored(key, ttl) {
      await manager(ttl);
      const kv = await new Kvm(nc).open(bucketOf("nats-fenced", ttl));
      return (await kv.get(`data.${key}`))?.string();
    },
    async close() {
      for (const m of byTtl.values()) await m.close();
      await nc.close();
    },
  };
}

// ---------------------------------------------------------------------------
// etcd: Lock for a free key, Election for a waiting successor.

function openEtcd(url: string): Peer {
  const client = new Etcd3({ hosts: url });
  const seconds = (ttl: number): number => Math.max(1, Math.round(ttl / 1000));
  // The write and the check in one transaction: the put happens only while
  // the lock key still has the create revision it had when we took it.
  const txnWrite = async (
    lockKey: string,
    rev: string,
    key: string,
    value: string,
  ): Promise<boolean> => {
    const res = await client.if(lockKey, "Create", "==", rev)
      .then(client.put(`data.${key}`).value(`${rev} ${value}`))
      .commit();
    return res.succeeded;
  };
  const createRevision = async (lockKey: string): Promise<string> => {
    const res = await client.get(lockKey).exec();
    const kv = res.kvs[0];
    if (kv === undefined) throw new Error(`etcd lost '${lockKey}' at once`);
    return kv.create_revision;
  };
  const elections = new Map<string, Election>();
  const campaigns: Campaign[] = [];
  const heldCampaign = async (c: Campaign, key: string): Promise<Held> => {
    const lockKey = await c.getCampaignKey();
    const rev = String((c as unknown as { keyRevision: string }).keyRevision);
    return {
      token: Number(rev),
      async write(value, between) {
        await between?.();
        return await txnWrite(lockKey, rev, key, value);
      },
      release: () => c.resign(),
    };
  };
  const campaign = async (key: string, ttl: number): Promise<Campaign> => {
    let e = elections.get(`${key}/${ttl}`);
    if (e === undefined) {
      e = client.election(`el.${key}`, seconds(ttl));
      elections.set(`${key}/${ttl}`, e);
    }
    const c = e.campaign("x");
    campaigns.push(c);
    await c.wait();
    return c;
  };
  return {
    learns:
      "Election: watch on the preceding campaign key (deleted when its lease expires)",
    async acquire(key, ttl) {
      if (key.startsWith("el.")) {
        return await heldCampaign(await campaign(key, ttl), key);
      }
      const lock: EtcdLock = client.lock(`lock.${key}`).ttl(seconds(ttl));
      await lock.acquire();
      const rev = await createRevision(`lock.${key}`);
      return {
        token: Number(rev),
        async write(value, between) {
          await between?.();
          return await txnWrite(`lock.${key}`, rev, key, value);
        },
        release: () => lock.release(),
      };
    },
    async waitAndWrite(key, ttl, value) {
      const held = await heldCampaign(await campaign(key, ttl), key);
      if (!(await held.write(value))) {
        throw new Error(`etcd refused the elected successor's write`);
      }
      return { at: performance.now(), token: held.token };
    },
    async close() {
      for (const c of campaigns) await c.resign().catch(() => {});
      client.close();
    },
  };
}

// ---------------------------------------------------------------------------
// Redis: Redlock on one instance.

function openRedis(url: string): Peer {
  const redis = new Redis(url, { lazyConnect: false });
  // Redlock's defaults: 10 retries, 200 ms apart, ±100 ms jitter. A waiting
  // successor retries without end: Redlock has no way to wait for a release.
  const redlock = new Redlock([redis]);
  const waiter = new Redlock([redis], { retryCount: -1 });
  const held = (first: RedlockLock, key: string, ttl: number): Held => {
    let lock = first;
    // A running holder extends its lock every TTL/3, as etcd's client
    // keeps its lease alive and our manager renews.
    const timer = setInterval(() => {
      lock.extend(ttl).then((l) => (lock = l), () => {});
    }, ttl / 3);
    return {
      token: undefined,
      async write(value, between) {
        // extend() is the only check Redlock offers; it says nothing about
        // the write that follows.
        try {
          lock = await lock.extend(ttl);
        } catch {
          return false;
        }
        await between?.();
        await redis.set(`data.${key}`, value);
        return true;
      },
      async release() {
        clearInterval(timer);
        await lock.release();
      },
    };
  };
  return {
    learns: "poll: acquire retried every 200 ms ± 100 ms (Redlock's defaults)",
    async acquire(key, ttl) {
      return held(
        await redlock.acquire([`lock.${key}`], ttl, { retryCount: 0 }),
        key,
        ttl,
      );
    },
    async waitAndWrite(key, ttl, value) {
      const lock = await waiter.acquire([`lock.${key}`], ttl);
      await redis.set(`data.${key}`, value);
      const at = performance.now();
      await lock.release().catch(() => {});
      return { at, token: undefined };
    },
    async close() {
      await redis.quit();
    },
  };
}

// ---------------------------------------------------------------------------
// Row 3b: the server's floor.

/**
 * The least a system's server is asked to take a free key and give it up,
 * through its plain client, no lock library: two requests, each awaited.
 */
export interface Floor {
  /** What the two requests are. */
  readonly what: string;
  /**
   * Creates `key` (refused if it has an entry), then deletes it; resolves
   * with the milliseconds of each request.
   */
  createDelete(key: string): Promise<[number, number]>;
  /**
   * NATS only: the same two messages with their acks on one shared reply
   * subscription, matched by a counter, as the lease's port sends its
   * writes (without `js.publish`'s per-request `Error`s, timer and parsed
   * ack); resolves with the milliseconds of both.
   */
  createDeleteLean?(key: string): Promise<number>;
  /** What `ping` is. */
  readonly pingWhat: string;
  /** One round trip to the server that stores nothing. */
  ping(): Promise<void>;
  close(): Promise<void>;
}

const timed = async (f: () => Promise<unknown>): Promise<number> => {
  const t = performance.now();
  await f();
  return performance.now() - t;
};

/**
 * Opens `system`'s floor. On NATS it writes to fresh subjects of the stream
 * of the bucket ours uses for `ttl` (`bucketOf`), which must exist.
 */
export async function openFloor(
  system: SystemName,
  ep: Endpoints,
  ttl: number,
): Promise<Floor> {
  if (system === "etcd") {
    const client = new Etcd3({ hosts: ep.etcd });
    return {
      what: "etcd3 put, then delete",
      async createDelete(key) {
        return [
          await timed(() => client.put(`floor.${key}`).value("x").exec()),
          await timed(() => client.delete().key(`floor.${key}`).exec()),
        ];
      },
      // A member-local read of a key that is never written: no consensus,
      // no disk.
      pingWhat: "etcd3 serializable get of an absent key",
      ping: () =>
        client.get("floor.none").serializable(true).exec().then(() => {}),
      close: () => Promise.resolve(client.close()),
    };
  }
  if (system === "redis" || system === "redis-always") {
    const redis = new Redis(ep.redis);
    return {
      what: "ioredis SET key val NX PX 5000, then DEL key",
      async createDelete(key) {
        let set: unknown;
        const t1 = await timed(async () =>
          set = await redis.set(`floor.${key}`, "x", "PX", 5000, "NX")
        );
        if (set !== "OK") throw new Error(`SET NX of floor.${key}: ${set}`);
        return [t1, await timed(() => redis.del(`floor.${key}`))];
      },
      pingWhat: "ioredis PING",
      ping: () => redis.ping().then(() => {}),
      async close() {
        await redis.quit();
      },
    };
  }
  const nc: NatsConnection = await connect({ servers: ep.nats });
  const js = jetstream(nc);
  const prefix = `$KV.${bucketOf(system, ttl)}.floor.`;
  const del = headers();
  del.set("KV-Operation", "DEL");
  const empty = new Uint8Array();
  const body = new TextEncoder().encode("x");
  // Acks on one wildcard subscription, matched by a counter.
  const inbox = `_INBOX.${crypto.randomUUID().replaceAll("-", "")}.`;
  const pending = new Map<string, (data: Uint8Array) => void>();
  const dec = new TextDecoder();
  const sub = nc.subscribe(`${inbox}*`, {
    callback: (err, msg) => {
      if (err !== null) return;
      const k = msg.subject.slice(inbox.length);
      const done = pending.get(k);
      pending.delete(k);
      done?.(msg.data);
    },
  });
  let n = 0;
  const leanPublish = (
    subject: string,
    data: Uint8Array,
    h: ReturnType<typeof headers>,
  ): Promise<void> =>
    new Promise((resolve, reject) => {
      const k = (++n).toString(36);
      pending.set(k, (ack) => {
        const text = dec.decode(ack);
        if (ack.length === 0 || text.includes('"error"')) {
          reject(new Error(`publish to ${subject}: ${text}`));
        } else resolve();
      });
      nc.publish(subject, data, { reply: inbox + k, headers: h });
    });
  const create = headers();
  create.set("Nats-Expected-Last-Subject-Sequence", "0");
  return {
    what:
      "js.publish expecting last subject sequence 0, then js.publish with KV-Operation: DEL",
    async createDelete(key) {
      return [
        await timed(() =>
          js.publish(prefix + key, body, {
            expect: { lastSubjectSequence: 0 },
          })
        ),
        await timed(() => js.publish(prefix + key, empty, { headers: del })),
      ];
    },
    createDeleteLean: (key) =>
      timed(async () => {
        await leanPublish(`${prefix}lean.${key}`, body, create);
        await leanPublish(`${prefix}lean.${key}`, empty, del);
      }),
    pingWhat: "nc.flush() (PING, PONG)",
    ping: () => nc.flush(),
    async close() {
      sub.unsubscribe();
      await nc.close();
    },
  };
}
