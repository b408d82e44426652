/**
 * A holder on a fenced bucket in a process of its own (issue 33), so that
 * `lease_fenced_test.ts` and `lease_stream_test.ts` can SIGKILL and SIGSTOP it: connects to NATS_URL,
 * opens a fenced manager for LEASE_NODE on LEASE_BUCKET (created by
 * whichever of it and the test opens it first) with LEASE_TTL, takes LEASE_KEY and,
 * inside that one guarded write, puts `<node>-<n>` to the data key
 * DATA_KEY every 50 ms until a put is refused. Prints `{"ev":"holding",
 * "epoch":..}` after the first put, `{"ev":"renewed","at":..}` when a put
 * sees a later session renewal (its send time, wall clock), `{"ev":"refused","n":..,"error":..}`
 * when the server refused one, and exits.
 *
 * @module
 */

import { connect } from "@nats-io/transport-node";
import { env, say, sleep } from "./child_preamble.ts";
import { CLOCK_RATE_BOUND, createLeaseManager } from "../mod.ts";

const bucket = env.LEASE_BUCKET!;
const node = env.LEASE_NODE!;
const ttl = Number(env.LEASE_TTL);
const nc = await connect({ servers: env.NATS_URL!.split(",") });
// LEASE_STREAM and LEASE_SUBJECTS: the leases live in that stream, and
// each write is an append to DATA_KEY (a subject of it).
const stream = env.LEASE_STREAM;
const leases = await createLeaseManager(
  stream === undefined
    ? { nc, node, bucket, ttl, fenced: true }
    : { nc, node, ttl, stream, leaseSubjects: env.LEASE_SUBJECTS! },
);
let deadline = 0;
await leases.guard(env.LEASE_KEY!, async (lease) => {
  for (let n = 1;; n++) {
    try {
      if (stream === undefined) await lease.put(env.DATA_KEY!, `${node}-${n}`);
      else await lease.publish(env.DATA_KEY!, `${node}-${n}`);
    } catch (err) {
      say("refused", { n, error: String(err), name: (err as Error).name });
      return;
    }
    // The session's last confirmed renewal, on the wall clock (the parent
    // measures a takeover from it): the deadline is its send time plus
    // the TTL less the clock-rate margin.
    if (lease.deadline !== deadline) {
      deadline = lease.deadline;
      say("renewed", {
        at: performance.timeOrigin + deadline -
          ttl * (1 - 2 * CLOCK_RATE_BOUND),
      });
    }
    if (n === 1) say("holding", { epoch: lease.epoch });
    await sleep(50);
  }
}, { wait: true });
await leases.close();
await nc.close();
