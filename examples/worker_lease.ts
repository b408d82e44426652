/**
 * The worker half of worker.ts: receives the server URL, connects over
 * WebSocket, does one guarded write, posts the epoch back and ends.
 *
 * @module
 */

/// <reference no-default-lib="true" />
/// <reference lib="deno.worker" />

import { wsconnect } from "@nats-io/nats-core";
import { createLeaseManager, NotHolderError } from "../mod.ts";

self.onmessage = async (e: MessageEvent<{ servers: string; key: string }>) => {
  const { servers, key } = e.data;
  const node = `worker-${crypto.randomUUID().slice(0, 8)}`;
  try {
    let epoch = 0;
    {
      // Released and closed, in that order, when this block ends.
      await using nc = await wsconnect({
        servers: servers.split(","),
        maxReconnectAttempts: -1,
      });
      await using leases = await createLeaseManager({
        nc,
        node,
        bucket: "examples",
        ttl: 2_000,
      });
      for (let attempt = 1; epoch === 0; attempt++) {
        try {
          epoch = await leases.guard(key, (lease) => lease.epoch);
        } catch (err) {
          // During the failover grace `retryAfter` says how long to wait.
          if (!(err instanceof NotHolderError) || attempt === 50) throw err;
          await new Promise((r) => setTimeout(r, err.retryAfter ?? 200));
        }
      }
    }
    self.postMessage({ ok: true, node, key, epoch });
  } catch (err) {
    self.postMessage({ ok: false, error: String(err) });
  }
  self.close();
};
