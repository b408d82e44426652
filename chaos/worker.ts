/**
 * A chaos worker: one lease manager with its own node id, contending for a
 * handful of keys and sending every guarded write to the fenced store. The
 * harness (`chaos.ts`) runs several, under Deno, Bun and Node 24:
 *
 *     deno run -A chaos/worker.ts | bun chaos/worker.ts | node chaos/worker.ts
 *
 * For each key it loops: `guard(key, write)`, a short pause, again. The
 * write opens a write at the store (`begin`, with the lease's epoch), holds
 * it for 10 to 40 ms, and commits it. It deliberately ignores
 * `lease.signal`, like an application that does not look: what the lease
 * cannot stop (a holder frozen past its TTL) the fence must.
 *
 * SIGTERM is a clean shutdown: the manager's signal aborts, `close()` lets
 * writes in progress finish and releases every lease, the process exits 0.
 * It also exits when its stdin closes (the harness is gone).
 *
 * Environment:
 * - `CHAOS_NATS`: comma-separated server URLs.
 * - `CHAOS_STORE`: base URL of the fenced store.
 * - `CHAOS_NODE`: this worker's lease node id (a replacement may reuse a
 *   dead worker's).
 * - `CHAOS_PROC`: this process's name in the history (default: the node id).
 * - `CHAOS_KEYS`: comma-separated keys.
 * - `CHAOS_BUCKET`, `CHAOS_TTL`: the lease bucket and its TTL in ms.
 * - `CHAOS_SEED`: seeds the write durations and pauses.
 * - `CHAOS_POLL`: ms between attempts while another node holds a key
 *   (default 30).
 * - `CHAOS_BROKEN`: **test-only** deliberately unsafe variants, to prove the
 *   checker can fail. `blind`: after each successful guard, keep writing
 *   the key for two TTLs without guarding, on the old epoch (a check of the
 *   lease once, then writes without it). `nograce`: when `guard()` refuses
 *   because the failover grace is running, write anyway with the epoch
 *   `holder()` reports (treating "you hold it, wait" as "go").
 *
 * Stdout carries one JSON line per event for the harness: `ready`,
 * `stats` (cumulative counters, every 250 ms and at exit), `stall` (the
 * event loop ran more than 20 ms late: `{from, to}`), `term` (SIGTERM seen),
 * `released` (`close()` resolved) and `closed`.
 *
 * @module
 */

import process from "node:process";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  createLeaseManager,
  type Lease,
  type LeaseManager,
  NotHolderError,
  UnavailableError,
} from "../mod.ts";
import { seeded } from "../test_util/prng.ts";

const env = process.env;
const required = (name: string): string => {
  const value = env[name];
  if (value === undefined || value === "") {
    throw new TypeError(
      `Cannot start chaos worker as ${name} is not set: run it from chaos/chaos.ts`,
    );
  }
  return value;
};

const servers = required("CHAOS_NATS").split(",");
const storeUrl = required("CHAOS_STORE");
const node = required("CHAOS_NODE");
const proc = env.CHAOS_PROC ?? node;
const keys = required("CHAOS_KEYS").split(",");
const bucket = required("CHAOS_BUCKET");
const ttl = Number(required("CHAOS_TTL"));
const poll = Number(env.CHAOS_POLL ?? 30);
const broken = env.CHAOS_BROKEN ?? "";
const random = seeded(`${env.CHAOS_SEED ?? ""}:${proc}`);

/** The store refused our write: our epoch is no longer the newest. */
class FencedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "FencedError";
  }
}

const stats = {
  attempted: 0,
  notHolder: 0,
  grace: 0,
  unavailable: 0,
  fenced: 0,
  other: 0,
  unguarded: 0,
};
const say = (ev: string, extra: Record<string, unknown> = {}): void => {
  process.stdout.write(JSON.stringify({ ev, t: Date.now(), ...extra }) + "\n");
};
const sleep = (ms: number): Promise<void> =>
  new Promise((r) => setTimeout(r, ms));

const controller = new AbortController();
const stopping = controller.signal;
process.on("SIGTERM", () => {
  say("term");
  controller.abort(new Error("SIGTERM"));
});
process.stdin.on("end", () => process.exit(3));
process.stdin.on("close", () => process.exit(3));
process.stdin.resume();
const statsTimer = setInterval(() => say("stats", stats), 250);
// Event-loop lag: time in which this process could not act (CPU starvation,
// SIGSTOP). The checker extends a liveness bound by it, since no lease can
// hand over faster than its processes are scheduled.
const TICK = 20;
let due = performance.now() + TICK;
const lagTimer = setInterval(() => {
  const now = performance.now();
  const late = now - due;
  due = now + TICK;
  if (late > 20) {
    const t = Date.now();
    say("stall", { from: Math.round(t - late), to: t });
  }
}, TICK);

async function post(
  path: string,
  body: unknown,
): Promise<{ ok: boolean; id?: number; reason?: string }> {
  const res = await fetch(storeUrl + path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return await res.json();
}

/** The guarded write: open at the store, hold 10 to 40 ms, commit. */
async function write(lease: Lease, called: number): Promise<void> {
  const start = Date.now();
  const begun = await post("/begin", {
    key: lease.key,
    node,
    proc,
    epoch: lease.epoch,
    called,
    start,
  });
  if (!begun.ok) throw new FencedError(begun.reason ?? "refused");
  await sleep(random.between(10, 40));
  const done = await post("/commit", { id: begun.id, end: Date.now() });
  if (!done.ok) throw new FencedError(done.reason ?? "refused");
}

async function contend(leases: LeaseManager, key: string): Promise<void> {
  while (!stopping.aborted) {
    const called = Date.now();
    stats.attempted++;
    try {
      let held: Lease | undefined;
      await leases.guard(key, (lease) => {
        held = lease;
        return write(lease, called);
      });
      if (broken === "blind" && held) await blind(held);
      await sleep(random.between(20, 60));
    } catch (err) {
      if (stopping.aborted) break;
      if (err instanceof NotHolderError) {
        if (err.retryAfter !== undefined) {
          stats.grace++;
          if (broken === "nograce") await skipGrace(leases, key, called);
          else await sleep(err.retryAfter + 1);
        } else {
          stats.notHolder++;
          await sleep(random.between(poll / 2, poll * 1.5));
        }
      } else if (err instanceof UnavailableError) {
        stats.unavailable++;
        await sleep(random.between(poll / 2, poll * 1.5));
      } else if (err instanceof FencedError) {
        stats.fenced++;
        await sleep(random.between(poll / 2, poll * 1.5));
      } else {
        stats.other++;
        console.error(`${node}: ${key}: ${(err as Error)?.stack ?? err}`);
        await sleep(poll);
      }
    }
  }
}

/** BROKEN (test-only): writes on a stale lease for two TTLs without guarding. */
async function blind(lease: Lease): Promise<void> {
  const until = Date.now() + 2 * ttl;
  while (Date.now() < until && !stopping.aborted) {
    await sleep(random.between(20, 60));
    const now = Date.now();
    stats.attempted++;
    stats.unguarded++;
    try {
      await write(lease, now);
    } catch (err) {
      if (err instanceof FencedError) stats.fenced++;
      else stats.other++;
    }
  }
}

/** BROKEN (test-only): writes during the failover grace, unguarded. */
async function skipGrace(
  leases: LeaseManager,
  key: string,
  called: number,
): Promise<void> {
  try {
    const h = await leases.holder(key);
    if (h?.node !== node) return;
    stats.unguarded++;
    // A stand-in lease that vouches for nothing: this variant writes blind.
    const blind = () =>
      Promise.reject(new TypeError("a stand-in lease writes no fenced data"));
    const lease: Lease = {
      key,
      node,
      epoch: h.epoch,
      tenure: `blind:${h.epoch}`,
      signal: stopping,
      deadline: Infinity,
      throwIfLost: () => {},
      put: blind,
      delete: blind,
      commit: blind,
      publish: blind,
    };
    await write(lease, called);
    await sleep(random.between(20, 60));
  } catch (err) {
    if (err instanceof FencedError) stats.fenced++;
  }
}

let nc: NatsConnection | undefined;
let leases: LeaseManager | undefined;
while (!leases && !stopping.aborted) {
  try {
    nc ??= await connect({
      servers,
      name: node,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 100,
      waitOnFirstConnect: true,
    });
    leases = await createLeaseManager({
      nc,
      node,
      bucket,
      ttl,
      signal: stopping,
    });
  } catch (err) {
    // The server may be down or without a stream leader right now.
    if (stopping.aborted) break;
    console.error(`${node}: starting: ${(err as Error)?.message ?? err}`);
    await sleep(200);
  }
}
if (leases) {
  const manager = leases;
  // The first request of a runtime's fetch is slow (Node loads undici): pay
  // it now, not in the first write after a takeover.
  await post("/hello", {}).catch(() => {});
  say("ready");
  await Promise.all(keys.map((key) => contend(manager, key)));
  await manager.close();
  say("released");
}
await nc?.close();
clearInterval(statsTimer);
clearInterval(lagTimer);
say("stats", stats);
process.stdout.write(
  JSON.stringify({ ev: "closed", t: Date.now() }) + "\n",
  () => process.exit(0),
);
