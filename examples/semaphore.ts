/**
 * A semaphore: at most two report builders at once among five, each in a
 * slot that is a lease with its own key and fencing epoch.
 *
 *     NATS_URL=nats://127.0.0.1:4222 deno run --allow-net --allow-env examples/semaphore.ts
 *     NATS_URL=nats://127.0.0.1:4222 bun examples/semaphore.ts
 *     NATS_URL=nats://127.0.0.1:4222 node examples/semaphore.ts
 *
 * The five builders run in one process here, each with its own connection
 * and node id, as five processes would:
 * 1. All five ask for a slot at once, waiting in line (`wait: true`); each
 *    build takes 300 ms, and never more than two run at once.
 * 2. A builder configured with another limit is refused (it takes no slot).
 * 3. One builder holds a slot for longer work with `acquire()`, released
 *    by `await using` when its block ends.
 *
 * @module
 */

import process from "node:process";
import { connect } from "@nats-io/transport-node";
import { createLeaseManager, LimitMismatchError, semaphore } from "../mod.ts";

const servers = (process.env.NATS_URL ?? "nats://127.0.0.1:4222").split(",");
const name = process.env.SEM_NAME ?? "reports";
// A 2 s TTL keeps a crash short here; a clean release hands a slot on at once.
const options = { bucket: "semaphore-example", ttl: 2_000 };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const ncs = await Promise.all(
  // Reconnects forever: a builder waits through an outage of any length.
  [0, 1, 2, 3, 4].map(() => connect({ servers, maxReconnectAttempts: -1 })),
);
const builders = await Promise.all(
  ncs.map((nc, i) =>
    createLeaseManager({ nc, node: `builder-${i}`, ...options })
  ),
);
try {
  // 1. Five builders, two slots.
  let running = 0;
  let peak = 0;
  await Promise.all(builders.map(async (leases) => {
    const reports = semaphore(leases, name, { limit: 2 });
    await reports.guard(async (lease) => {
      peak = Math.max(peak, ++running);
      console.log(
        `${leases.node} builds in slot ${lease.slot} ('${lease.key}', epoch ${lease.epoch})`,
      );
      await sleep(300);
      lease.throwIfLost(); // right before the commit point
      running--;
    }, { wait: true });
  }));
  console.log(`at most ${peak} builds ran at once`);

  // 2. The same name with another limit, while a slot is held: refused.
  const held = await semaphore(builders[0]!, name, { limit: 2 }).acquire();
  try {
    await semaphore(builders[1]!, name, { limit: 3 }).guard(() => {
      console.log("should not happen: a build under another limit");
    });
  } catch (err) {
    if (!(err instanceof LimitMismatchError)) throw err;
    console.log(
      `builder-1 refused: asked ${err.asked}, the bucket records ${err.recorded}`,
    );
  }
  await held.release();

  // 3. A slot held for longer work, released when the block ends.
  {
    await using slot = await semaphore(builders[2]!, name, { limit: 2 })
      .acquire();
    console.log(`builder-2 holds slot ${slot.slot} for longer work`);
    await sleep(100);
  }
  const left = await semaphore(builders[3]!, name, { limit: 2 }).holders();
  console.log(`slots held after the block: ${left.size}`);
} finally {
  await Promise.all(builders.map((b) => b.close()));
  await Promise.all(ncs.map((nc) => nc.close()));
}
