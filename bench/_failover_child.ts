/**
 * The lease holder of the failover benchmark, run as a child process so the
 * benchmark can SIGKILL it. It acquires one key, prints `held`, and on the
 * line `close` on stdin shuts its manager down cleanly, prints `closed` and
 * exits.
 *
 * Usage: `<runtime> bench/_failover_child.ts <url> <bucket> <key> <ttl>`
 *
 * @module
 */

import process from "node:process";
import { createInterface } from "node:readline";
import { connect } from "@nats-io/transport-node";
import { createLeaseManager } from "../mod.ts";

const [url, bucket, key, ttl] = process.argv.slice(2);
if (!url || !bucket || !key || !ttl) {
  throw new TypeError(
    `Cannot start the failover holder as it needs <url> <bucket> <key> <ttl>: received ${
      JSON.stringify(process.argv.slice(2))
    }`,
  );
}

const nc = await connect({ servers: url });
const leases = await createLeaseManager({
  nc,
  node: "holder",
  bucket,
  ttl: Number(ttl),
  restartGrace: false,
});
const deadline = performance.now() + 10 * Number(ttl);
while (!(await leases.held(key))) {
  if (performance.now() > deadline) {
    throw new Error(`Cannot acquire '${key}' for the failover benchmark`);
  }
  await new Promise((r) => setTimeout(r, 5));
}
process.stdout.write("held\n");

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (line.trim() === "close") break;
}
// Also reached when the parent closes our stdin: release and go.
await leases.close();
process.stdout.write("closed\n");
lines.close();
await nc.close();
process.exit(0);
