// A semaphore slot holder run as a child process by semaphore_test.ts, so a
// test can SIGKILL a real holder. Acquires one slot of LEASE_KEY (limit
// LEASE_LIMIT), prints {"ev":"held","key","slot","epoch","t"} and waits to be
// killed.
//
// Environment: NATS_URL, LEASE_BUCKET, LEASE_KEY, LEASE_NODE, LEASE_TTL,
// LEASE_LIMIT.
import process from "node:process";
import { connect } from "@nats-io/transport-node";
import { createLeaseManager, semaphore } from "../mod.ts";

const env = process.env;
const nc = await connect({
  servers: env.NATS_URL!,
  maxReconnectAttempts: -1,
  reconnectTimeWait: 100,
});
const leases = await createLeaseManager({
  nc,
  node: env.LEASE_NODE!,
  bucket: env.LEASE_BUCKET!,
  ttl: Number(env.LEASE_TTL),
  restartGrace: false,
});
const sem = semaphore(leases, env.LEASE_KEY!, {
  limit: Number(env.LEASE_LIMIT),
});
const slot = await sem.acquire();
console.log(JSON.stringify({
  ev: "held",
  key: slot.key,
  slot: slot.slot,
  epoch: slot.epoch,
  t: Date.now(),
}));
setInterval(() => {}, 60_000); // held until killed
