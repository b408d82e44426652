/**
 * Reproduction of a gap the chaos checker found in `lease.ts` (see
 * RESULTS.md): a process that finds the key held by *its own node id*
 * written by another instance takes the live entry over at once (no wait
 * for it to expire) and writes one grace (TTL) later. Another node id would
 * wait for the entry to expire first, then the grace.
 *
 *     deno run -A chaos/repro_same_node_restart.ts
 *     bun chaos/repro_same_node_restart.ts
 *     node chaos/repro_same_node_restart.ts
 *
 * 1. **Restart under a frozen holder's node id.** Holder `x` (a child
 *    process, `test_util/lease_child.ts`) starts a 300 ms write; it is
 *    frozen with SIGSTOP for 1.5 TTL, less than TTL + grace, then killed
 *    200 ms after it wakes. A new manager is started at once, as `x` and
 *    then, for comparison, as `y`. With `x`
 *    it writes about one TTL after the freeze, while the frozen write is
 *    still open: the two overlap although the holder was not paused past
 *    TTL plus grace (the fence still refuses the frozen write's epoch). With
 *    `y` it writes about two TTLs after, once the frozen write is over.
 * 2. **Two live instances with one node id** steal the lease from each other
 *    at every attempt, each restarting the other's grace: neither writes.
 *
 * Both were fixed in lease.ts a0740c2 (an entry with our node id written
 * by another process is left to expire like any holder's, unless
 * `restartGrace: false`): then 1. shows no overlap for `x` either, and in
 * 2. one twin writes and the other waits.
 *
 * @module
 */

import process from "node:process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import {
  createLeaseManager,
  NotHolderError,
  UnavailableError,
} from "../mod.ts";
import { signal, startChild } from "../test_util/child.ts";
import { NatsServer } from "../test_util/nats_server.ts";

const TTL = 1000;
const sleep = (ms: number): Promise<void> =>
  new Promise((r) => setTimeout(r, ms));
const CHILD = fileURLToPath(
  new URL("../test_util/lease_child.ts", import.meta.url),
);

await using ns = await NatsServer.start();
const nc = await connect({ servers: ns.url });

async function frozenHolder(successor: string): Promise<void> {
  const bucket = `repro_${successor}`;
  const { child, events } = startChild<
    { ev: string; t: number; epoch?: number }
  >(CHILD, {
    NATS_URL: ns.url,
    LEASE_BUCKET: bucket,
    LEASE_KEY: "k",
    LEASE_NODE: "x",
    LEASE_TTL: String(TTL),
    LEASE_WRITE_MS: "300",
    LEASE_MODE: "loop",
  }, { stderr: "inherit" });
  try {
    // Freeze the holder 20 ms into a write: 280 ms of it are left.
    while (events.filter((e) => e.ev === "start").length < 2) await sleep(2);
    while (events.at(-1)!.ev !== "start") await sleep(1);
    await sleep(20);
    process.kill(child.pid!, "SIGSTOP");
    const frozen = Date.now();
    // It wakes before TTL + grace; the orchestrator kills it soon after.
    setTimeout(() => signal(child.pid!, "SIGCONT"), 1.5 * TTL);
    setTimeout(() => signal(child.pid!, "SIGKILL"), 1.5 * TTL + 200);
    const m = await createLeaseManager({
      nc,
      node: successor,
      bucket,
      ttl: TTL,
    });
    let first: { t: number; epoch: number } | undefined;
    while (!first) {
      try {
        first = await m.guard("k", (l) => ({ t: Date.now(), epoch: l.epoch }));
      } catch (err) {
        if (
          !(err instanceof NotHolderError || err instanceof UnavailableError)
        ) throw err;
        await sleep(10);
      }
    }
    const end = events.find((e) => e.ev === "end" && e.t > frozen);
    if (!end) throw new Error("the frozen holder never finished its write");
    console.log(
      `successor '${successor}': frozen write of 'x' (epoch ${end.epoch}) ends at ${
        end.t - frozen
      } ms; successor writes at ${
        first.t - frozen
      } ms (epoch ${first.epoch}): ${
        first.t < end.t ? "OVERLAP" : "no overlap"
      }`,
    );
    await m.close();
  } finally {
    signal(child.pid!, "SIGCONT");
    signal(child.pid!, "SIGKILL");
  }
}

console.log(
  `1. holder 'x' frozen for ${1.5 * TTL} ms (TTL ${TTL} ms, grace ${TTL} ms)`,
);
await frozenHolder("x");
await frozenHolder("y");

console.log("2. two live managers with node id 'x' guard one key for 5 s");
const conns = await Promise.all([0, 1].map(() => connect({ servers: ns.url })));
const twins = await Promise.all(
  conns.map((c) =>
    createLeaseManager({ nc: c, node: "x", bucket: "twins", ttl: TTL })
  ),
);
const writes = [0, 0];
const stop = Date.now() + 5_000;
await Promise.all(twins.map(async (m, i) => {
  while (Date.now() < stop) {
    await m.guard("k", () => writes[i]!++).catch(() => {});
    await sleep(30);
  }
}));
console.log(`writes: ${writes.join(" and ")}`);
await Promise.all(twins.map((m) => m.close()));
await Promise.all([...conns, nc].map((c) => c.close()));
process.exit(0);
