/**
 * One node of the demo (demo.ts starts three of these as child processes).
 *
 * It tries to write to one store key in a loop and reports each step as one
 * JSON line on stdout, which demo.ts turns into the timeline. SIGINT shuts it
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

let writes = 0;
// What we last reported, so a state is reported once, not on every retry.
let state = "";
while (!stop.signal.aborted) {
  try {
    await leases.guard(key, ({ epoch }) => {
      writes++;
      emit("write", { n: writes, epoch });
    }, { signal: stop.signal });
    state = "writing";
    await sleep(300);
  } catch (err) {
    if (stop.signal.aborted) break;
    if (err instanceof NotHolderError && err.retryAfter !== undefined) {
      if (state !== "grace") emit("grace", { ms: Math.ceil(err.retryAfter) });
      state = "grace";
      await sleep(err.retryAfter);
    } else if (err instanceof NotHolderError) {
      if (state !== `held by ${err.holder}`) {
        emit("waiting", { holder: err.holder });
      }
      state = `held by ${err.holder}`;
      // Poll often, so a released lease is taken over within tens of ms.
      await sleep(25);
    } else if (err instanceof UnavailableError) {
      emit("unavailable", { message: err.message });
      await sleep(100);
    } else {
      throw err;
    }
  }
}
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
