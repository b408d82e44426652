// Shard ownership on a real 3-node cluster (an R3 bucket), 256 shards, the
// workers child processes (test_util/shards_child.ts) of this runtime, each
// connected to one of the servers, each writing every shard it owns every
// 100 ms through a guard (check: "lease") and reporting each write's shard,
// epoch and start and end times (a wall clock shared by the processes):
//   1. 4 workers join one by one: the time from a worker's start (its
//      "ready") until the group is balanced, and the shards moved, against
//      the minimum (the joiner's share);
//   2. one worker is SIGKILLed: the time until its shards are owned again
//      (bound: TTL + grace + a small δ);
//   3. one worker leaves cleanly (SIGTERM: the signal aborts, it releases):
//      the time until its shards are owned again (bound: well under 100 ms);
//   4. through all of it, from the writes: no shard written by two owners at
//      once, and no write under an older epoch than one before it (what a
//      fenced store would refuse);
//   5. the largest gap between two writes of a shard that did not move in a
//      step, per step.
//
// Usage: node bench/shards.ts [--count N] [--ttl MS] [--nodes 3|1] [--json FILE]
//        (deno run -A bench/shards.ts, bun bench/shards.ts)
// --nodes 1 runs one server and an R1 bucket: the way to run it on a server
// older than 2.9.21 (NATS_SERVER_BIN=/usr/sbin/nats-server for Debian's
// 2.9.10), where a replicated bucket is refused (nats-server#4320).
import process from "node:process";
import * as fs from "node:fs";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import { createLeaseManager } from "../mod.ts";
import { readJsonLines } from "../test_util/child.ts";
import { NatsCluster, NatsServer } from "../test_util/nats_server.ts";

const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1]! : dflt;
};
const COUNT = Number(arg("--count", "256"));
const TTL = Number(arg("--ttl", "2000"));
const WRITE_MS = 100;
const JSON_OUT = arg("--json", "");
const NODES = Number(arg("--nodes", "3"));
if (NODES !== 1 && NODES !== 3) throw new RangeError("--nodes must be 1 or 3");
const runtime = "Deno" in globalThis
  ? "deno"
  : "Bun" in globalThis
  ? "bun"
  : "node";
const version = "Deno" in globalThis
  ? (globalThis as unknown as { Deno: { version: { deno: string } } }).Deno
    .version.deno
  : "Bun" in globalThis
  ? (globalThis as unknown as { Bun: { version: string } }).Bun.version
  : process.versions.node;
const now = () => performance.timeOrigin + performance.now();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const CHILD = fileURLToPath(
  new URL("../test_util/shards_child.ts", import.meta.url),
);

interface Ev {
  ev: string;
  t: number;
  owned?: Record<string, number>;
  members?: string[];
  w?: [number, number, number, number][];
  key?: string;
  found?: string;
  grace?: number;
  clean?: boolean;
}

interface Worker {
  name: string;
  events: Ev[];
  kill(sig: "SIGKILL" | "SIGTERM"): void;
  exited: Promise<unknown>;
  /** The latest assignment's shard -> epoch. */
  owned(): Map<number, number>;
  alive: boolean;
}

/** Every write: [shard, epoch, start, end, node]. */
const writes: [number, number, number, number, string][] = [];

function start(name: string, url: string, bucket: string): Worker {
  const args = runtime === "deno" ? ["run", "-A", CHILD] : [CHILD];
  const env: Record<string, string | undefined> = {
    ...process.env,
    NATS_URL: url,
    LEASE_BUCKET: bucket,
    LEASE_TTL: String(TTL),
    LEASE_NODE: name,
    SHARDS_GROUP: "bench",
    SHARDS_COUNT: String(COUNT),
    SHARDS_WRITE_MS: String(WRITE_MS),
  };
  delete env.NODE_TEST_CONTEXT;
  const child = spawn(process.execPath, args, {
    env,
    stdio: ["ignore", "pipe", "inherit"],
  });
  const events: Ev[] = [];
  readJsonLines(child.stdout!, (ev) => {
    const e = ev as Ev;
    if (e.ev === "w") {
      for (const x of e.w!) writes.push([x[0], x[1], x[2], x[3], name]);
    } else events.push(e);
  }, (line) => process.stderr.write(`${name}: ${line}\n`));
  const w: Worker = {
    name,
    events,
    alive: true,
    kill: (sig) => child.kill(sig),
    exited: new Promise((r) => child.on("exit", r)),
    owned: () => {
      const a = events.filter((e) => e.ev === "assign").at(-1);
      return new Map(
        Object.entries(a?.owned ?? {}).map(([s, e]) => [Number(s), e]),
      );
    },
  };
  void w.exited.then(() => w.alive = false);
  return w;
}

/** shard -> {node, epoch} from each live worker's latest assignment. */
function ownership(ws: Worker[]): Map<number, { node: string; epoch: number }> {
  const out = new Map<number, { node: string; epoch: number }>();
  for (const w of ws) {
    for (const [s, e] of w.owned()) out.set(s, { node: w.name, epoch: e });
  }
  return out;
}

function balanced(ws: Worker[]): boolean {
  const lo = Math.floor(COUNT / ws.length), hi = Math.ceil(COUNT / ws.length);
  const sizes = ws.map((w) => w.owned().size);
  const all = ws.flatMap((w) => [...w.owned().keys()]);
  return all.length === COUNT && new Set(all).size === COUNT &&
    sizes.every((n) => n >= lo && n <= hi);
}

/** The time of the latest assign event of any worker. */
function lastAssign(ws: Worker[]): number {
  return Math.max(
    ...ws.map((w) => w.events.filter((e) => e.ev === "assign").at(-1)?.t ?? 0),
  );
}

/** When each of `theirs` was first owned by one of `rest` after `t0`, ms after it. */
function ownedAgainAt(theirs: number[], rest: Worker[], t0: number) {
  const at = theirs.map((s) =>
    Math.min(
      ...rest.flatMap((w) =>
        w.events.filter((e) =>
          e.ev === "assign" && e.t >= t0 && e.owned?.[s] !== undefined
        ).map((e) => e.t)
      ),
    ) - t0
  ).sort((x, y) => x - y);
  return {
    first: at[0],
    median: at[Math.floor(at.length / 2)],
    last: at.at(-1),
  };
}

/**
 * How each of `theirs` was taken over by one of `rest` after `t0`, from the
 * survivors' "acquired" events: per `found` (lease.ts's AcquiredFrom), the
 * number of shards, the range of times after `t0` and of graces owed.
 */
function takeovers(theirs: number[], rest: Worker[], t0: number) {
  const by: Record<string, { n: number; at: number[]; grace: number[] }> = {};
  for (const s of theirs) {
    const key = `bench.shards.${s}`;
    const e = rest.flatMap((w) =>
      w.events.filter((x) =>
        x.ev === "acq" && x.key === key && x.t >= t0
      )
    ).sort((a, b) => a.t - b.t)[0];
    const f = e?.found ?? "none";
    const b = by[f] ??= { n: 0, at: [], grace: [] };
    b.n++;
    if (e) {
      b.at.push(Math.round(e.t - t0));
      b.grace.push(e.grace!);
    }
  }
  return Object.fromEntries(
    Object.entries(by).map(([f, b]) => [f, {
      shards: b.n,
      at: b.at.length ? [Math.min(...b.at), Math.max(...b.at)] : null,
      grace: b.grace.length
        ? [Math.min(...b.grace), Math.max(...b.grace)]
        : null,
    }]),
  );
}

async function until(pred: () => boolean, ms: number, what: string) {
  const end = performance.now() + ms;
  while (!pred()) {
    if (performance.now() > end) throw new Error(`timed out: ${what}`);
    await sleep(5);
  }
}

/** The largest write gap of each shard in [from, to] that stayed with `own`. */
function gaps(
  from: number,
  to: number,
  before: Map<number, { node: string; epoch: number }>,
  after: Map<number, { node: string; epoch: number }>,
): { max: number; p99: number; shards: number } {
  const per = new Map<number, number[]>();
  for (const [s, e, a, _b, node] of writes) {
    const o = before.get(s);
    const n = after.get(s);
    if (!o || !n || o.node !== n.node || o.epoch !== n.epoch) continue;
    if (node !== o.node || e !== o.epoch || a < from || a > to) continue;
    (per.get(s) ?? per.set(s, []).get(s)!).push(a);
  }
  const worst: number[] = [];
  for (const ts of per.values()) {
    ts.sort((x, y) => x - y);
    let m = 0;
    for (let i = 1; i < ts.length; i++) m = Math.max(m, ts[i]! - ts[i - 1]!);
    worst.push(m);
  }
  worst.sort((x, y) => x - y);
  return {
    max: worst.at(-1) ?? 0,
    p99: worst[Math.floor(worst.length * 0.99)] ?? 0,
    shards: worst.length,
  };
}

/** Writes of one shard by two owners at once, or under an older epoch. */
function fenceCheck(): { writes: number; overlaps: number; stale: number } {
  const per = new Map<number, typeof writes>();
  for (const w of writes) {
    (per.get(w[0]) ?? per.set(w[0], []).get(w[0])!).push(w);
  }
  let overlaps = 0, stale = 0;
  for (const ws of per.values()) {
    ws.sort((x, y) => x[2] - y[2]);
    let newest = 0;
    let lastEnd = new Map<string, number>();
    for (const [, e, a, b, node] of ws) {
      if (e < newest) stale++;
      newest = Math.max(newest, e);
      for (const [other, end] of lastEnd) {
        if (other !== node && end > a) overlaps++;
      }
      lastEnd = new Map(lastEnd);
      lastEnd.set(node, Math.max(lastEnd.get(node) ?? 0, b));
    }
  }
  return { writes: writes.length, overlaps, stale };
}

const cluster: {
  urls: string[];
  version: string;
  [Symbol.asyncDispose](): Promise<void>;
} = NODES === 3
  ? await (async () => {
    const c = await NatsCluster.start(3);
    return {
      urls: c.urls,
      version: c.servers[0]!.version,
      [Symbol.asyncDispose]: () => c[Symbol.asyncDispose](),
    };
  })()
  : await (async () => {
    const s = await NatsServer.start();
    return {
      urls: [s.url],
      version: s.version,
      [Symbol.asyncDispose]: () => s[Symbol.asyncDispose](),
    };
  })();
const rows: Record<string, unknown>[] = [];
const workers: Worker[] = [];
try {
  const bucket = `shards${Date.now() % 1e6}`;
  {
    const nc = await connect({ servers: cluster.urls });
    // A cluster that just elected its meta leader can take longer than a
    // request's timeout to create an R3 stream (seen once under Deno): the
    // creation is idempotent, so ask again, for up to a minute.
    const end = performance.now() + 60_000;
    for (;;) {
      try {
        const m = await createLeaseManager({
          nc,
          node: "bench-setup",
          bucket,
          ttl: TTL,
          replicas: NODES,
        });
        await m.close();
        break;
      } catch (err) {
        if (performance.now() > end) throw err;
        console.error(`# bucket creation: ${err}; asking again`);
        await sleep(1000);
      }
    }
    await nc.close();
  }
  console.log(
    `# shards bench: ${runtime} ${version}, nats-server ${cluster.version} ×${NODES}, R${NODES} bucket, ${COUNT} shards, TTL ${TTL} ms, writes every ${WRITE_MS} ms per shard`,
  );

  // 1. Joins.
  for (let k = 1; k <= 4; k++) {
    const before = ownership(workers);
    const w = start(`w${k}`, cluster.urls[(k - 1) % NODES]!, bucket);
    workers.push(w);
    await until(() => w.events.some((e) => e.ev === "ready"), 30_000, "ready");
    const ready = w.events.find((e) => e.ev === "ready")!.t;
    await until(() => balanced(workers), 60_000, `balance with ${k}`);
    const settled = lastAssign(workers);
    const after = ownership(workers);
    const moved = [...after].filter(([s, o]) => {
      const b = before.get(s);
      return b !== undefined && (b.node !== o.node || b.epoch !== o.epoch);
    }).length;
    const sizes = workers.map((x) => x.owned().size).join("/");
    // Writes go on for a while, for the gaps of the unmoved shards.
    await sleep(1500);
    const g = k > 1
      ? gaps(ready, now(), before, ownership(workers))
      : undefined;
    rows.push({
      step: `join ${k}`,
      ms: settled - ready,
      moved,
      minimum: k === 1 ? 0 : Math.floor(COUNT / k),
      sizes,
      gap: g,
    });
    console.log(JSON.stringify(rows.at(-1)));
  }

  // 2. SIGKILL w2.
  {
    const victim = workers[1]!;
    const theirs = [...victim.owned().keys()];
    const rest = workers.filter((w) => w !== victim);
    const before = ownership(workers);
    await sleep(500);
    const t0 = now();
    victim.kill("SIGKILL");
    await victim.exited;
    await until(
      () => theirs.every((s) => rest.some((w) => w.owned().has(s))),
      10 * TTL,
      "the killed worker's shards owned again",
    );
    const owned = lastAssign(rest);
    const fromKill = ownedAgainAt(theirs, rest, t0);
    // Per survivor: when it saw the killed worker leave the members, and
    // when it owned the last of its share of the killed worker's shards.
    const bySurvivor = Object.fromEntries(rest.map((w) => {
      const assigns = w.events.filter((e) => e.ev === "assign" && e.t >= t0);
      const left = assigns.find((e) => !e.members?.includes(victim.name));
      const mine = theirs.filter((s) => w.owned().has(s));
      const got = mine.map((s) =>
        assigns.find((e) => e.owned?.[s] !== undefined)?.t ?? NaN
      );
      return [w.name, {
        sawLeave: left ? left.t - t0 : null,
        shards: mine.length,
        last: Math.max(...got) - t0,
      }];
    }));
    await until(() => balanced(rest), 10 * TTL, "balance after the kill");
    await sleep(1500);
    const g = gaps(t0, now(), before, ownership(rest));
    rows.push({
      step: "SIGKILL w2",
      ms: owned - t0,
      bound: 2 * TTL,
      fromKill,
      bySurvivor,
      takeovers: takeovers(theirs, rest, t0),
      shards: theirs.length,
      sizes: rest.map((x) => x.owned().size).join("/"),
      gap: g,
    });
    console.log(JSON.stringify(rows.at(-1)));
    workers.splice(1, 1);
  }

  // 3. SIGTERM w3: a clean leave.
  {
    const leaver = workers.find((w) => w.name === "w3")!;
    const theirs = [...leaver.owned().keys()];
    const rest = workers.filter((w) => w !== leaver);
    const before = ownership(workers);
    await sleep(500);
    const t0 = now();
    leaver.kill("SIGTERM");
    await until(
      () => theirs.every((s) => rest.some((w) => w.owned().has(s))),
      10 * TTL,
      "the leaver's shards owned again",
    );
    const owned = lastAssign(rest);
    const leaving = leaver.events.find((e) => e.ev === "leaving")!.t;
    const fromLeaving = ownedAgainAt(theirs, rest, leaving);
    // The leaver's side, from its "released" events: its last shard
    // released, and its slot released (after its shards, by design).
    const rel = leaver.events.filter((e) => e.ev === "rel" && e.t >= leaving);
    const relShards = rel.filter((e) => e.key!.startsWith("bench.shards."));
    const relSlot = rel.find((e) => e.key!.startsWith("bench.members."));
    const released = {
      lastShard: relShards.length
        ? Math.max(...relShards.map((e) => e.t)) - leaving
        : null,
      unclean: relShards.filter((e) => !e.clean).length,
      slot: relSlot ? relSlot.t - leaving : null,
    };
    await leaver.exited;
    await until(() => balanced(rest), 10 * TTL, "balance after the leave");
    await sleep(1500);
    const g = gaps(t0, now(), before, ownership(rest));
    rows.push({
      step: "SIGTERM w3 (clean leave)",
      ms: owned - t0,
      fromLeaving,
      released,
      takeovers: takeovers(theirs, rest, leaving),
      shards: theirs.length,
      sizes: rest.map((x) => x.owned().size).join("/"),
      gap: g,
    });
    console.log(JSON.stringify(rows.at(-1)));
    workers.splice(workers.indexOf(leaver), 1);
  }
} finally {
  for (const w of workers) w.kill("SIGTERM");
  await Promise.race([
    Promise.all(workers.map((w) => w.exited)),
    sleep(10_000),
  ]);
  for (const w of workers) if (w.alive) w.kill("SIGKILL");
  await cluster[Symbol.asyncDispose]();
}
const fence = fenceCheck();
console.log(JSON.stringify({ fence }));
if (JSON_OUT) {
  fs.writeFileSync(
    JSON_OUT,
    JSON.stringify(
      {
        runtime,
        version,
        server: cluster.version,
        nodes: NODES,
        ttl: TTL,
        count: COUNT,
        rows,
        fence,
      },
      null,
      2,
    ),
  );
}
