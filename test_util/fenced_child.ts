/**
 * A holder on a fenced bucket in a process of its own (issue 33), so that
 * `lease_fenced_test.ts` can SIGKILL and SIGSTOP it: connects to NATS_URL,
 * opens a fenced manager for LEASE_NODE on LEASE_BUCKET (stream
 * `KV_<bucket>`, made by the test) with LEASE_TTL, takes LEASE_KEY and,
 * inside that one guarded write, puts `<node>-<n>` to the data key
 * DATA_KEY every 50 ms until a put is refused. Prints `{"ev":"holding",
 * "epoch":..}` after the first put, `{"ev":"refused","n":..,"error":..}`
 * when the server refused one, and exits.
 *
 * @module
 */

import { connect } from "@nats-io/transport-node";
import { env, say, sleep } from "./child_preamble.ts";
import { fencedManager } from "./port.ts";

const bucket = env.LEASE_BUCKET!;
const node = env.LEASE_NODE!;
const ttl = Number(env.LEASE_TTL);
const nc = await connect({ servers: env.NATS_URL!.split(",") });
const leases = await fencedManager(nc, bucket, node, ttl);
await leases.guard(env.LEASE_KEY!, async (lease) => {
  const fenced = lease;
  for (let n = 1;; n++) {
    try {
      await fenced.put(env.DATA_KEY!, `${node}-${n}`);
    } catch (err) {
      say("refused", { n, error: String(err), name: (err as Error).name });
      return;
    }
    if (n === 1) say("holding", { epoch: lease.epoch });
    await sleep(50);
  }
}, { wait: true });
await leases.close();
await nc.close();
