/**
 * What the epoch is for: a store that refuses writes from a holder that has
 * already been replaced.
 *
 *     NATS_URL=nats://127.0.0.1:4222 deno run --allow-net --allow-env examples/fenced_store.ts
 *     NATS_URL=nats://127.0.0.1:4222 bun examples/fenced_store.ts
 *     NATS_URL=nats://127.0.0.1:4222 node examples/fenced_store.ts
 *
 * A lease alone cannot stop a holder that froze (a long GC pause, a VM
 * migration) after it checked its lease and before its write reached the
 * store: by the time it wakes, its lease has expired and another node holds
 * it. Each guarded write carries an epoch, the KV revision at which the
 * holder's tenure began, and every later holder's epoch is higher. A store
 * that remembers the highest epoch it accepted can turn the late write away.
 * It also remembers which tenure wrote under that epoch: only a server that
 * lost writes it had acknowledged repeats an epoch, and then the tenure
 * tells the two holders apart.
 *
 * The story below runs two nodes in one process, each with its own
 * connection, so that one of them can be cut off:
 * 1. node-a holds the lease and writes "a1".
 * 2. node-a starts its next write, then freezes. We simulate the freeze by
 *    closing its connection, so it can no longer renew its lease.
 * 3. The lease expires; node-b takes it over, waits out the failover grace
 *    and writes "b1" with a higher epoch.
 * 4. node-a wakes up and sends "a2" with its old epoch: the store rejects it.
 *
 * @module
 */

import process from "node:process";
import { connect } from "@nats-io/transport-node";
import {
  createLeaseManager,
  type Lease,
  type LeaseManager,
  NotHolderError,
} from "../mod.ts";

/**
 * A record store that accepts a write only from the newest epoch it has
 * seen, and that epoch only from the tenure that first wrote under it: a
 * server that lost writes it had acknowledged can hand the same epoch to a
 * second holder (see `Lease.tenure`).
 */
class FencedStore {
  #newest = { epoch: 0, tenure: "" };
  readonly rows: { value: string; epoch: number }[] = [];

  write(value: string, { epoch, tenure }: Lease): void {
    if (epoch < this.#newest.epoch) {
      throw new Error(
        `stale epoch ${epoch}: the store already accepted epoch ${this.#newest.epoch}`,
      );
    }
    if (epoch === this.#newest.epoch && tenure !== this.#newest.tenure) {
      throw new Error(
        `epoch ${epoch} repeated by another tenure: the server lost writes it had acknowledged; take the lease anew`,
      );
    }
    this.#newest = { epoch, tenure };
    this.rows.push({ value, epoch });
    console.log(`store   accepted '${value}' at epoch ${epoch}`);
  }
}

const servers = (process.env.NATS_URL ?? "nats://127.0.0.1:4222").split(",");
const key = process.env.LEASE_KEY ?? "ledger";
// Each node gets its own bucket-sharing manager; a 1 s TTL keeps this short.
const options = { bucket: "fenced-example", ttl: 1_000 };
const store = new FencedStore();

// Reconnects forever: nats.js gives up after 10 tries by default, and a
// manager over a connection closed for good refuses every write.
const ncA = await connect({ servers, maxReconnectAttempts: -1 });
const ncB = await connect({ servers, maxReconnectAttempts: -1 });
const a = await createLeaseManager({ nc: ncA, node: "node-a", ...options });
const b = await createLeaseManager({ nc: ncB, node: "node-b", ...options });
try {
  // 1. node-a takes the lease and writes.
  await guardWithRetry(a, (lease) => store.write("a1", lease));

  // 2. node-a's next write passes the lease check, then node-a freezes.
  let wakeUp!: () => void;
  const frozen = new Promise<void>((resolve) => wakeUp = resolve);
  const late = a.guard(key, async (lease) => {
    console.log(`node-a  checked its lease (epoch ${lease.epoch}), then froze`);
    await ncA.close(); // no more renewals: the lease will expire on the server
    await frozen;
    console.log(
      `node-a  woke up; its lease signal says aborted=${lease.signal.aborted}, but it writes anyway`,
    );
    store.write("a2", lease);
  });

  // 3. node-b waits until the lease expires, then through the grace.
  await guardWithRetry(b, (lease) => store.write("b1", lease));

  // 4. node-a's write arrives late and is fenced off.
  wakeUp();
  await late.then(
    () => console.log("node-a  write accepted (this should not happen)"),
    (err: Error) =>
      console.log(`store   rejected node-a's 'a2': ${err.message}`),
  );
  console.log(
    `store   holds ${JSON.stringify(store.rows.map((r) => r.value))}`,
  );
} finally {
  await a.close(); // node-a's lease is gone already: nothing to release
  await b.close(); // node-b releases its lease
  await ncA.close();
  await ncB.close();
}

/** One guarded write on `key`, retrying through the grace and while another node holds it. */
async function guardWithRetry(
  leases: LeaseManager,
  write: (lease: Lease) => void,
): Promise<void> {
  let said = "";
  for (let attempt = 1;; attempt++) {
    try {
      return await leases.guard(key, (lease) => {
        console.log(`${leases.node}  holds '${key}' at epoch ${lease.epoch}`);
        write(lease);
      });
    } catch (err) {
      if (!(err instanceof NotHolderError) || attempt === 100) throw err;
      const why = err.retryAfter !== undefined
        ? "waits out the failover grace"
        : `waits: '${key}' is held by ${err.holder}`;
      if (why !== said) console.log(`${leases.node}  ${why}`);
      said = why;
      await new Promise((r) => setTimeout(r, err.retryAfter ?? 100));
    }
  }
}
