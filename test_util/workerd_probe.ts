/**
 * A worker for `workerd_test.ts` that probes what workerd does to a
 * stateless request's timers and connection after the request has
 * answered. Not an example: it does on purpose what a worker must not.
 *
 * - `/tick` starts a 50 ms interval and answers at once; `/ticks` reads
 *   how often it fired. `/tick-ws` does the same with a bare WebSocket to
 *   the server left open.
 * - `/open` connects, takes the lease of `KEY` and answers, leaving the
 *   connection and the manager open (module state); `/reuse` then tries
 *   to use them from another request and reports each error.
 *
 * @module
 */

import { type NatsConnection, wsconnect } from "@nats-io/nats-core";
import { createLeaseManager, type LeaseManager } from "../mod.ts";

interface Env {
  NATS_WS_URL: string;
  LEASE_BUCKET: string;
  LEASE_TTL: string;
}

let ticks = 0;
let nc: NatsConnection | undefined;
let leases: LeaseManager | undefined;
let renewals = 0;

/** What `fn` returns or throws, within `ms` ("pending" if neither). */
async function outcome(fn: () => unknown, ms = 1000): Promise<string> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const value = await Promise.race([
      Promise.resolve().then(fn),
      new Promise((resolve) => {
        timer = setTimeout(() => resolve("pending"), ms);
      }),
    ]);
    return value === "pending" ? "pending" : "ok";
  } catch (err) {
    return `${(err as Error).name}: ${(err as Error).message}`;
  } finally {
    clearTimeout(timer);
  }
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    switch (new URL(request.url).pathname) {
      case "/tick":
        setInterval(() => ticks++, 50);
        return Response.json({ ticks });
      case "/tick-ws": {
        // The same interval, with a bare WebSocket left open beside it.
        const ws = new WebSocket(env.NATS_WS_URL);
        await new Promise((resolve, reject) => {
          ws.addEventListener("open", resolve);
          ws.addEventListener("error", reject);
        });
        setInterval(() => ticks++, 50);
        return Response.json({ ticks });
      }
      case "/ticks":
        return Response.json({ ticks });
      case "/open": {
        nc = await wsconnect({ servers: env.NATS_WS_URL });
        leases = await createLeaseManager({
          nc,
          node: "leaked",
          bucket: env.LEASE_BUCKET,
          ttl: Number(env.LEASE_TTL),
        });
        leases.addEventListener("renewed", () => renewals++);
        const epoch = await leases.guard("leaked", (lease) => lease.epoch);
        return Response.json({ epoch });
      }
      case "/reuse":
        return Response.json({
          renewals,
          closed: nc!.isClosed(),
          health: await outcome(() => leases!.health()),
          guard: await outcome(() => leases!.guard("leaked", () => {})),
          flush: await outcome(() => nc!.flush()),
        });
      default:
        return new Response("not found\n", { status: 404 });
    }
  },
};
