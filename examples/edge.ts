/**
 * Edge / worker style: only Web-standard APIs (WebSocket, AbortSignal,
 * timers, `crypto`), no `node:*` module and no runtime namespace in the code
 * path. The connection goes over WebSocket with `wsconnect`, which is what a
 * browser, a service worker or an edge function can open.
 *
 *     NATS_WS_URL=ws://127.0.0.1:8080 deno run --allow-net --allow-env examples/edge.ts
 *     NATS_WS_URL=ws://127.0.0.1:8080 bun examples/edge.ts
 *
 * The server needs a WebSocket listener; for a local test without TLS:
 * `websocket { host: "127.0.0.1", port: 8080, no_tls: true }`. Give the URL
 * with its scheme and port: a bare host name means `wss://` on port 443.
 *
 * One process should use one transport: do not mix `wsconnect` with
 * `connect` from `@nats-io/transport-node` in the same process.
 *
 * @module
 */

import { wsconnect } from "@nats-io/nats-core";
import {
  createLeaseManager,
  type Lease,
  type LeaseManager,
  NotHolderError,
} from "../mod.ts";

// One URL, or several separated by commas for a cluster.
const servers = (env("NATS_WS_URL") ?? "ws://127.0.0.1:8080").split(",");
const key = env("LEASE_KEY") ?? "edge-counter";
// An edge instance has no stable name of its own: make one up.
const node = env("NODE_ID") ?? `edge-${crypto.randomUUID().slice(0, 8)}`;

{
  // `await using` cleans up in reverse order when the block ends, also on an
  // error: the lease manager releases the lease, then the connection drains.
  // Reconnects forever: the default gives up after 10 tries (about 20 s).
  await using nc = await wsconnect({ servers, maxReconnectAttempts: -1 });
  console.log(`[${node}] connected over WebSocket to ${servers.join(",")}`);
  await using leases = await createLeaseManager({
    nc,
    node,
    bucket: "examples",
    ttl: 2_000, // short, so the example moves quickly; the default is 15 s
  });
  const epoch = await guardWithRetry(leases, key, ({ epoch }) => {
    // The real write goes here, to a store that checks `epoch` (see
    // fenced_store.ts). Under the lease, this node is the only writer.
    console.log(`[${node}] wrote '${key}' at epoch ${epoch}`);
    return epoch;
  });
  console.log(`[${node}] one guarded write done at epoch ${epoch}`);
}
console.log(`[${node}] released '${key}' and closed the connection`);

/** Runs one guarded write, retrying while the grace runs or another node holds the key. */
async function guardWithRetry<T>(
  leases: LeaseManager,
  key: string,
  write: (lease: Lease) => T,
): Promise<T> {
  for (let attempt = 1;; attempt++) {
    try {
      return await leases.guard(key, write);
    } catch (err) {
      if (!(err instanceof NotHolderError) || attempt === 50) throw err;
      // `retryAfter` is set while the failover grace runs: a previous holder
      // may still be finishing a write, so the first write waits one TTL.
      console.log(`[${node}] ${err.message}`);
      await new Promise((resolve) =>
        setTimeout(resolve, err.retryAfter ?? 200)
      );
    }
  }
}

/**
 * Reads a setting. Edge platforms pass settings to the handler; a script has
 * only the process environment, which each runtime exposes its own way.
 */
function env(name: string): string | undefined {
  const g = globalThis as {
    Deno?: { env: { get(name: string): string | undefined } };
    process?: { env: Record<string, string | undefined> };
  };
  return g.Deno?.env.get(name) ?? g.process?.env[name];
}
