/**
 * Node.js 24: append to the store key "orders" under a lease, so that only
 * one process at a time writes it. Node 24 runs this TypeScript file as is
 * (type stripping): no build step.
 *
 *     NATS_URL=nats://127.0.0.1:4222 node examples/node.ts
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
import { setTimeout as sleep } from "node:timers/promises";
import { connect } from "@nats-io/transport-node";
// Node resolves relative imports literally: keep the `.ts` extension.
import {
  createLeaseManager,
  NotHolderError,
  UnavailableError,
} from "../mod.ts";

// One URL, or several separated by commas for a cluster.
const servers = (process.env.NATS_URL ?? "nats://127.0.0.1:4222").split(",");
const node = process.env.NODE_ID ?? `node-${process.pid}`;
const key = process.env.LEASE_KEY ?? "orders";
const runFor = Number(process.env.RUN_FOR_MS ?? 30_000);
const log = (msg: string) => console.log(`[${node}] ${msg}`);

// Ctrl-C, or the end of the run, aborts this signal; both the loop and the
// lease manager listen to it.
const stop = new AbortController();
const onSigint = () => stop.abort("SIGINT");
process.once("SIGINT", onSigint);
const signal = AbortSignal.any([stop.signal, AbortSignal.timeout(runFor)]);

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
    signal,
  });

  // What we last reported, so a state is reported once, not on every retry.
  let state = "";
  while (!signal.aborted) {
    try {
      // The write runs only once a compare-and-set on the lease entry proved
      // that this node holds it. `epoch` grows with every change of holder.
      await leases.guard(key, ({ epoch }) => {
        written++;
        log(`wrote order #${written} at epoch ${epoch}`);
      }, { signal });
      state = "writing";
      await sleep(500, undefined, { signal });
    } catch (err) {
      if (signal.aborted) break;
      if (err instanceof NotHolderError && err.retryAfter !== undefined) {
        // We just took the lease; a previous holder may still be finishing a
        // write, so the first write waits one TTL (the failover grace).
        if (state !== "grace") {
          log(
            `acquired '${key}', waiting out the grace: ${
              Math.ceil(err.retryAfter)
            } ms`,
          );
        }
        state = "grace";
        await sleep(err.retryAfter, undefined, { signal }).catch(() => {});
      } else if (err instanceof NotHolderError) {
        if (state !== `held by ${err.holder}`) {
          log(`waiting: '${key}' is held by ${err.holder}`);
        }
        state = `held by ${err.holder}`;
        await sleep(100, undefined, { signal }).catch(() => {});
      } else if (err instanceof UnavailableError) {
        log(`NATS unavailable, write refused: ${err.message}`);
        await sleep(500, undefined, { signal }).catch(() => {});
      } else {
        throw err;
      }
    }
  }
  log(`stopping (${signal.reason === "SIGINT" ? "SIGINT" : "time is up"})`);
}
process.off("SIGINT", onSigint);
log(`released '${key}' and closed the connection after ${written} writes`);
