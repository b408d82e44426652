/**
 * A fenced bucket (nats-server 2.11.2 or later): the server itself refuses
 * a replaced holder's write, so no store of yours has to check the epoch,
 * and a crashed holder's key is taken in milliseconds.
 *
 *     NATS_URL=nats://127.0.0.1:4222 deno run -A examples/fenced_bucket.ts
 *     NATS_URL=nats://127.0.0.1:4222 bun examples/fenced_bucket.ts
 *     NATS_URL=nats://127.0.0.1:4222 node examples/fenced_bucket.ts
 *
 * The data lives in the lease bucket itself, as plain KV keys written with
 * `lease.put` inside `guard`; readers read them with `@nats-io/kv`. This
 * process is node-b; it starts two holders, each a copy of this file in a
 * process of its own:
 * 1. node-a takes `ledger` and stores `balance`. Its next write passes
 *    every check, then the process freezes for 3 s (as in a long GC pause)
 *    before the write leaves it.
 * 2. node-b takes the key once node-a's session expired (one TTL, 1 s
 *    here, with no grace) and stores its own balance.
 * 3. node-a wakes, its write reaches the server, and the server refuses it:
 *    `balance` keeps node-b's value.
 * 4. node-c takes the key after node-b releases it, and is killed with
 *    SIGKILL. node-b takes the key as soon as the server says node-c's
 *    connection is gone: milliseconds, not a TTL.
 *
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import process from "node:process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import {
  createLeaseManager,
  type LeaseAcquiredEvent,
  NotHolderError,
} from "../mod.ts";

const servers = (process.env.NATS_URL ?? "nats://127.0.0.1:4222").split(",");
const key = process.env.LEASE_KEY ?? "ledger";
const options = { bucket: "fenced-bucket-example", ttl: 1_000, fenced: true };
const role = process.argv[2];

if (role === "holder") await holder(process.argv[3]!);
else await main();

/** A holder in a process of its own: node-a freezes, node-c waits to be killed. */
async function holder(node: string): Promise<void> {
  const nc = await connect({ servers });
  const leases = await createLeaseManager({ nc, node, ...options });
  try {
    await leases.guard(key, async (lease) => {
      await lease.put(`${key}.balance`, `100 (${node})`);
      console.log(`${node}  took '${key}' at epoch ${lease.epoch}`);
    }, { wait: true });
    if (node === "node-c") {
      console.log("node-c  holds it; kill me");
      await new Promise(() => {});
    }
    await leases.guard(key, (lease) => {
      // Checked, and queued to the server: the bytes leave this process
      // only when it runs again.
      const late = lease.put(`${key}.balance`, `90 (${node})`);
      console.log(`${node}  checked its lease, then froze for 3 s`);
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 3_000);
      return late;
    });
    console.log(`${node}  its late write was stored (this should not happen)`);
  } catch (err) {
    if (!(err instanceof NotHolderError)) throw err;
    console.log(`${node}  woke; ${err.message}`);
  } finally {
    await leases.close();
    await nc.close();
  }
}

/** node-b: starts the holders and takes the key from each. */
async function main(): Promise<void> {
  const nc = await connect({ servers });
  const leases = await createLeaseManager({ nc, node: "node-b", ...options });
  const kv = await new Kvm(nc).open(options.bucket);
  const balance = async () => (await kv.get(`${key}.balance`))?.string();
  let found = "";
  leases.addEventListener("acquired", (e) => {
    found = (e as LeaseAcquiredEvent).found;
  });
  try {
    // 1 and 2: node-a freezes; node-b takes the key when its session ends.
    const a = start("node-a");
    await a.said(/checked its lease, then froze/);
    const frozen = performance.now();
    await leases.guard(key, async (lease) => {
      const after = performance.now() - frozen;
      await lease.put(`${key}.balance`, "50 (node-b)");
      console.log(
        `node-b  took '${key}' at epoch ${lease.epoch}, ${
          (after / 1000).toFixed(1)
        } s after node-a froze (${found}), and stored 50`,
      );
    }, { wait: true });
    // 3. node-a's write arrives late.
    await a.said(/woke/);
    await a.exited;
    console.log(`node-b  balance is ${await balance()}`);
    await leases.release(key);

    // 4. node-c takes the key and is killed.
    const c = start("node-c");
    await c.said(/kill me/);
    const killed = performance.now();
    c.child.kill("SIGKILL");
    await leases.guard(key, async (lease) => {
      const after = performance.now() - killed;
      await lease.put(`${key}.balance`, "40 (node-b)");
      console.log(
        `node-b  took '${key}' ${
          after.toFixed(0)
        } ms after node-c was killed (${found}), and stored 40`,
      );
    }, { wait: true });
    await c.exited;
    console.log(`node-b  balance is ${await balance()}`);
  } finally {
    await leases.close();
    await nc.close();
  }
}

/** A copy of this file as holder `node`, its lines echoed as they come. */
function start(node: string) {
  const file = fileURLToPath(import.meta.url);
  const args = "Deno" in globalThis
    ? ["run", "-A", file, "holder", node]
    : [file, "holder", node];
  const child: ChildProcess = spawn(process.execPath, args, {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines: string[] = [];
  const waiting = new Set<() => void>();
  createInterface({ input: child.stdout! }).on("line", (line) => {
    console.log(line);
    lines.push(line);
    for (const wake of waiting) wake();
  });
  const exited = new Promise<void>((resolve) =>
    child.on("exit", () => resolve())
  );
  const said = (re: RegExp) =>
    new Promise<void>((resolve, reject) => {
      const check = () => {
        if (lines.some((l) => re.test(l))) {
          waiting.delete(check);
          resolve();
        }
      };
      waiting.add(check);
      exited.then(() => {
        check();
        reject(new Error(`${node} exited before saying ${re}`));
      });
      check();
    });
  return { child, said, exited };
}
