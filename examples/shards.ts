/**
 * Shard ownership: 12 shards split among the workers that are alive, each
 * shard a lease with its own fencing epoch.
 *
 *     NATS_URL=nats://127.0.0.1:4222 deno run --allow-net --allow-env examples/shards.ts
 *     NATS_URL=nats://127.0.0.1:4222 bun examples/shards.ts
 *     NATS_URL=nats://127.0.0.1:4222 node examples/shards.ts
 *
 * Three workers run in this process, each with its own connection and lease
 * manager, as three processes would:
 * 1. worker-1 joins the group and owns every shard;
 * 2. worker-2 and worker-3 join one by one: each takes its share, and only
 *    the shards that move change hands (the others keep their lease);
 * 3. worker-2 leaves cleanly: it releases its shards, and the others own
 *    them again within milliseconds.
 * Every worker writes each shard it owns every 50 ms through a guard, into
 * a store that refuses an epoch older than the newest it accepted.
 *
 * @module
 */

import process from "node:process";
import { connect } from "@nats-io/transport-node";
import {
  createLeaseManager,
  type Lease,
  type ShardAssignment,
  shards,
} from "../mod.ts";

const servers = (process.env.NATS_URL ?? "nats://127.0.0.1:4222").split(",");
const group = process.env.SHARDS_GROUP ?? "orders";
const COUNT = 12;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A store that refuses a write older than the newest epoch of its shard. */
class FencedStore {
  readonly #newest = new Map<number, number>();
  writes = 0;
  refused = 0;

  write(shard: number, epoch: number): void {
    if (epoch < (this.#newest.get(shard) ?? 0)) {
      this.refused++;
      throw new Error(`stale epoch ${epoch} on shard ${shard}`);
    }
    this.#newest.set(shard, epoch);
    this.writes++;
  }
}
const store = new FencedStore();

/** One worker: a member of the group that writes the shards it owns. */
async function worker(name: string) {
  // Reconnects forever: a worker keeps its shards, or waits, through an outage.
  const nc = await connect({ servers, maxReconnectAttempts: -1 });
  const leases = await createLeaseManager({
    nc,
    node: name,
    bucket: "shards-example",
    ttl: 2_000,
  });
  const stop = new AbortController();
  let latest: ShardAssignment | undefined;
  const writers: Promise<void>[] = [];

  async function write(shard: number, lease: Lease): Promise<void> {
    while (!lease.signal.aborted) {
      // The guard refuses (instead of taking the key again) once the shard
      // moved away: its signal is the shard's lease signal.
      await leases.guard(lease.key, (l) => store.write(shard, l.epoch), {
        signal: lease.signal,
      }).catch(() => {});
      await sleep(50);
    }
  }

  const loop = (async () => {
    for await (
      const a of shards(leases, group, { count: COUNT, signal: stop.signal })
    ) {
      latest = a;
      for (const s of a.added) writers.push(write(s, a.owned.get(s)!));
    }
    await Promise.all(writers);
    await leases.close();
    await nc.close();
  })();
  return {
    name,
    owned: () => [...(latest?.owned.keys() ?? [])],
    epochs: () =>
      new Map([...(latest?.owned ?? [])].map(([s, l]) => [s, l.epoch])),
    members: () => latest?.members ?? [],
    /** Leaves the group: its shards are released at once. */
    async leave() {
      stop.abort();
      await loop;
    },
  };
}
type Worker = Awaited<ReturnType<typeof worker>>;

/** Waits until every shard is owned once and the workers are balanced. */
async function settled(ws: Worker[]): Promise<void> {
  for (let i = 0; i < 400; i++) {
    const all = ws.flatMap((w) => w.owned());
    const sizes = ws.map((w) => w.owned().length);
    if (
      all.length === COUNT && new Set(all).size === COUNT &&
      Math.max(...sizes) - Math.min(...sizes) <= 1 &&
      ws.every((w) => w.members().length === ws.length)
    ) return;
    await sleep(25);
  }
  throw new Error("the workers did not settle within 10 s");
}

const show = (ws: Worker[]) =>
  ws.map((w) => `${w.name} [${w.owned().sort((a, b) => a - b).join(" ")}]`)
    .join(", ");

const workers: Worker[] = [];
let joined2 = 0;
for (const name of ["worker-1", "worker-2", "worker-3"]) {
  const before = new Map(
    workers.flatMap((w) =>
      [...w.epochs()].map(([s, e]) => [s, { w: w.name, e }])
    ),
  );
  workers.push(await worker(name));
  await settled(workers);
  // Its member slot was taken before the group settled with it.
  if (name === "worker-2") joined2 = performance.now();
  let moved = 0, kept = 0;
  for (const w of workers) {
    for (const [s, e] of w.epochs()) {
      const b = before.get(s);
      if (b === undefined) continue;
      if (b.w === w.name && b.e === e) kept++;
      else moved++;
    }
  }
  console.log(`${name} joined: ${show(workers)}`);
  if (workers.length > 1) {
    console.log(`  ${moved} shards moved, ${kept} kept their lease and epoch`);
  }
}

// A member's slot taken fresh on a server without expiry markers (before
// 2.11.2) owes a failover grace of one TTL, and a release inside it is not
// clean: the others would learn of the leave only when the slot expired. So
// worker-2 leaves once it has been a member that long.
await sleep(Math.max(0, joined2 + 2_100 - performance.now()));
const leaving = workers[1]!;
const theirs = leaving.owned().length;
const t0 = performance.now();
await leaving.leave();
const rest = workers.filter((w) => w !== leaving);
await settled(rest);
console.log(
  `worker-2 left: its ${theirs} shards were owned again after ${
    Math.round(performance.now() - t0)
  } ms: ${show(rest)}`,
);

await sleep(200);
for (const w of rest) await w.leave();
console.log(
  `store: ${store.writes} writes, ${store.refused} refused (a stale epoch)`,
);
