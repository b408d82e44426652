/**
 * Bun: append to the store key "orders" under a lease, so that only one
 * process at a time writes it.
 *
 *     NATS_URL=nats://127.0.0.1:4222 bun examples/bun.ts
 *
 * Start a second copy in another terminal: it waits, because the lease names
 * the first. Press Ctrl-C in the first: it hands the lease back on its way
 * out, and the second copy starts writing at once, with a higher epoch.
 *
 * NATS basics used here: a NATS server with JetStream keeps a key-value
 * bucket (here "examples"); the lease for "orders" is one entry in it, whose
 * value is the holder's node id and which expires unless renewed (the TTL).
 *
 * @module
 */

import process from "node:process";
import { connect } from "@nats-io/transport-node";
import { createLeaseManager } from "../mod.ts";

// One URL, or several separated by commas for a cluster.
const servers = (Bun.env.NATS_URL ?? "nats://127.0.0.1:4222").split(",");
const node = Bun.env.NODE_ID ?? `bun-${process.pid}`;
const key = Bun.env.LEASE_KEY ?? "orders";
const runFor = Number(Bun.env.RUN_FOR_MS ?? 30_000);
const log = (msg: string) => console.log(`[${node}] ${msg}`);

// Ctrl-C, SIGTERM or the end of the run aborts this controller; both the loop and
// the lease manager listen to its signal.
const stop = new AbortController();
const onSigint = () => stop.abort("SIGINT");
const onSigterm = () => stop.abort("SIGTERM");
process.once("SIGINT", onSigint);
process.once("SIGTERM", onSigterm);
const timer = setTimeout(() => stop.abort("time is up"), runFor);

let written = 0;
{
  // `await using` disposes in reverse order when the block ends: first the
  // lease manager (releasing the lease for the next node), then the
  // connection (drained).
  await using nc = await connect({
    servers,
    maxReconnectAttempts: -1, // a long-running writer rides out server restarts
  });
  log(`connected to ${servers.join(",")}`);
  await using leases = await createLeaseManager({
    nc,
    node,
    bucket: "examples",
    ttl: 2_000, // short, so the example moves quickly; the default is 15 s
    signal: stop.signal,
  });

  // Say once who holds the key, if another node does: the guard below
  // then waits quietly for its turn.
  const holder = await leases.holder(key);
  if (holder !== null && holder.node !== node) {
    log(`waiting: '${key}' is held by ${holder.node}`);
  }
  while (!stop.signal.aborted) {
    try {
      // With wait: true the guard waits until this node holds the lease
      // (at once after a clean release; after a crash, once the entry has
      // expired and the failover grace has passed) and rides out outages.
      // The write runs only once a compare-and-set on the lease entry proved
      // that this node holds it; `epoch` grows with every change of holder.
      await leases.guard(key, ({ epoch }) => {
        written++;
        log(`wrote order #${written} at epoch ${epoch}`);
      }, { signal: stop.signal, wait: true });
      await sleep(500, stop.signal);
    } catch (err) {
      // Aborted: Ctrl-C or the end of the run. Anything else is a bug.
      if (stop.signal.aborted) break;
      throw err;
    }
  }
  log(`stopping (${stop.signal.reason})`);
}
clearTimeout(timer);
process.off("SIGINT", onSigint);
process.off("SIGTERM", onSigterm);
log(`released '${key}' and closed the connection after ${written} writes`);

/**
 * Waits `ms` milliseconds, or less if `signal` aborts first. (`Bun.sleep`
 * cannot be cancelled, so a plain timer it is.)
 */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(id);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const id = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

// Bun's global, declared for type checkers that do not load `@types/bun`.
declare const Bun: { env: Record<string, string | undefined> };
