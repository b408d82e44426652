/**
 * One node of the demo (demo.ts starts three of these as child processes).
 *
 * It campaigns for one store key, writes to it while it leads, and reports
 * each step as one JSON line on stdout, which demo.ts turns into the
 * timeline. SIGINT shuts it
 * down cleanly: the lease manager releases the lease on the way out. SIGKILL
 * is the crash: nothing is released, and the lease has to expire.
 *
 * @module
 */

import process from "node:process";
import { connect } from "@nats-io/transport-node";
import {
  createLeaseManager,
  NotHolderError,
  UnavailableError,
} from "../mod.ts";

const node = process.env.NODE_ID ?? `node-${process.pid}`;
const servers = (process.env.NATS_URL ?? "nats://127.0.0.1:4222").split(",");
const bucket = process.env.DEMO_BUCKET ?? "demo";
const key = process.env.DEMO_KEY ?? "orders";

/** One timeline event, as a JSON line for demo.ts. */
function emit(event: string, data: Record<string, unknown> = {}): void {
  process.stdout.write(JSON.stringify({ node, event, ...data }) + "\n");
}

const stop = new AbortController();
process.once("SIGINT", () => stop.abort("SIGINT"));

const nc = await connect({ servers, maxReconnectAttempts: -1 });
const leases = await createLeaseManager({
  nc,
  node,
  bucket,
  ttl: 1_000,
  signal: stop.signal, // aborting releases our lease for the next node
});
emit("ready");

// Who holds the key, as this node's watch sees it (a hint, never a licence
// to write): reported whenever another node takes it.
const watching = (async () => {
  let last = "";
  for await (const h of leases.watch(key, { signal: stop.signal })) {
    if (h !== null && h.node !== node && h.node !== last) {
      emit("waiting", { holder: h.node });
    }
    last = h?.node ?? "";
  }
})();

let writes = 0;
// Leader election: campaign() yields a lease each time this node becomes the
// holder (after any grace), and campaigns again when that tenure ends. The
// writes still go through guard(), which checks the lease at the commit point.
for await (const lease of leases.campaign(key, { signal: stop.signal })) {
  emit("leader", { epoch: lease.epoch });
  while (!lease.signal.aborted && !stop.signal.aborted) {
    try {
      await leases.guard(key, ({ epoch }) => {
        writes++;
        emit("write", { n: writes, epoch });
      }, { signal: stop.signal });
    } catch (err) {
      if (stop.signal.aborted) break;
      if (err instanceof UnavailableError) {
        emit("unavailable", { message: err.message });
      } else if (!(err instanceof NotHolderError)) throw err;
      // NotHolderError: the tenure ended; the campaign goes on.
    }
    await sleep(300);
  }
}
await watching;
await leases.close(); // resolves once our lease, if any, is released
emit("stopped");
await nc.close();

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(id);
      stop.signal.removeEventListener("abort", done);
      resolve();
    };
    const id = setTimeout(done, ms);
    stop.signal.addEventListener("abort", done, { once: true });
  });
}
