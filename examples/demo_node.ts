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
process.once("SIGTERM", () => stop.abort("SIGTERM"));

const nc = await connect({ servers, maxReconnectAttempts: -1 });
const leases = await createLeaseManager({
  nc,
  node,
  bucket,
  ttl: 1_000,
  signal: stop.signal, // aborting releases our lease for the next node
});
emit("ready");

// The tenure this node last reported taking, and the report (see took()).
let taken: { epoch: number; reported: Promise<void> } | undefined;

/**
 * Reports that this node took the key at `epoch`, once per tenure, with how
 * much of the failover grace is left: campaign() yields only after the
 * grace, so without this line the node would look idle while it holds the
 * key. A guard with `check: "lease"` asks without a round trip: in the
 * grace it is refused with NotHolderError.retryAfter; past it (or with no
 * grace owed) it runs the empty write at once on the last renewal. (Should
 * the watch report the entry before the manager has read the reply to its
 * acquire, the guard takes the compare-and-set path: one more renewal.)
 */
function took(epoch: number): Promise<void> {
  if (taken?.epoch !== epoch) {
    taken = { epoch, reported: report(epoch) };
  }
  return taken.reported;
}

async function report(epoch: number): Promise<void> {
  let grace = 0;
  try {
    await leases.guard(key, () => {}, { check: "lease", signal: stop.signal });
  } catch (err) {
    if (err instanceof NotHolderError && err.retryAfter !== undefined) {
      grace = err.retryAfter;
    } else if (
      err instanceof NotHolderError || err instanceof UnavailableError ||
      stop.signal.aborted
    ) {
      return; // the tenure already ended, or this node is stopping
    } else throw err;
  }
  emit("took", { epoch, grace });
}

// Who holds the key, as this node's watch sees it (a hint, never a licence
// to write): reported whenever another node takes it, and when this node
// does (its own entry, at a new epoch).
const watching = (async () => {
  let last = "";
  for await (const h of leases.watch(key, { signal: stop.signal })) {
    if (h !== null && h.node !== node && h.node !== last) {
      emit("waiting", { holder: h.node });
    }
    if (h !== null && h.node === node) void took(h.epoch);
    last = h?.node ?? "";
  }
})();

let writes = 0;
// Leader election: campaign() yields a lease each time this node becomes the
// holder (after any grace), and campaigns again when that tenure ends. The
// writes still go through guard(), which checks the lease at the commit point.
for await (const lease of leases.campaign(key, { signal: stop.signal })) {
  // Usually reported already, when the watch saw this node's entry; after a
  // clean release the campaign can win before the watch reports it.
  await took(lease.epoch);
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
