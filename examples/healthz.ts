/**
 * A `/healthz` endpoint for a process that holds a lease: 200 with the
 * manager's {@linkcode LeaseManager.health} as JSON while it can vouch for
 * what it holds, 503 with the same JSON when it cannot (the server
 * unreachable or slow, a renewal overdue, a key near its deadline). One file
 * for Deno (`Deno.serve`), Bun (`Bun.serve`) and Node (`node:http`), picked
 * by what the runtime has.
 *
 * ```sh
 * deno run --allow-net --allow-env --allow-sys examples/healthz.ts
 * bun examples/healthz.ts
 * node examples/healthz.ts   # Node 24
 * ```
 *
 * Environment: `NATS_URL` (default 127.0.0.1:4222), `PORT` (default 0: any
 * free port; the one taken is printed), `LEASE_KEY` (default `healthz`),
 * `LEASE_BUCKET` (default `healthz`), `LEASE_TTL` in ms (default 15000).
 * Prints `listening on http://127.0.0.1:PORT/healthz`, then a line per
 * tenure won; stops on SIGINT or SIGTERM.
 *
 * @module
 */

import process from "node:process";
import { createServer } from "node:http";
import { connect } from "@nats-io/transport-node";
import { createLeaseManager, type LeaseManager } from "../mod.ts";

const env = process.env;
const nc = await connect({
  servers: (env.NATS_URL || "127.0.0.1:4222").split(","),
  maxReconnectAttempts: -1,
  reconnectTimeWait: 250,
});
const leases: LeaseManager = await createLeaseManager({
  nc,
  node: `healthz-${process.pid}`,
  bucket: env.LEASE_BUCKET || "healthz",
  ttl: Number(env.LEASE_TTL || 15_000),
});
const key = env.LEASE_KEY || "healthz";
const stop = new AbortController();

/** The answer to `GET /healthz`: 200 when the manager vouches, else 503. */
function healthz(url: string): Response {
  if (new URL(url, "http://localhost").pathname !== "/healthz") {
    return new Response("not found\n", { status: 404 });
  }
  const h = leases.health();
  return new Response(JSON.stringify(h) + "\n", {
    status: h.ok ? 200 : 503,
    headers: { "content-type": "application/json" },
  });
}

/** Serves `healthz` on `port` with what this runtime has; resolves with the port and a stop function. */
async function serve(
  port: number,
): Promise<{ port: number; close: () => Promise<void> }> {
  const g = globalThis as {
    Deno?: {
      serve(
        o: {
          port: number;
          hostname: string;
          onListen?: (a: { port: number }) => void;
        },
        h: (r: Request) => Response,
      ): { addr: { port: number }; shutdown(): Promise<void> };
    };
    Bun?: {
      serve(o: {
        port: number;
        hostname: string;
        fetch: (r: Request) => Response;
      }): { port: number; stop(force?: boolean): void };
    };
  };
  if (typeof g.Deno?.serve === "function") {
    const s = g.Deno.serve(
      { port, hostname: "127.0.0.1", onListen: () => {} },
      (r) => healthz(r.url),
    );
    return { port: s.addr.port, close: () => s.shutdown() };
  }
  if (typeof g.Bun?.serve === "function") {
    const s = g.Bun.serve({
      port,
      hostname: "127.0.0.1",
      fetch: (r) => healthz(r.url),
    });
    return {
      port: s.port,
      close: () => Promise.resolve(s.stop(true)),
    };
  }
  const s = createServer((req, res) => {
    const r = healthz(req.url ?? "/");
    res.writeHead(r.status, Object.fromEntries(r.headers));
    void r.text().then((body) => res.end(body));
  });
  await new Promise<void>((resolve) => s.listen(port, "127.0.0.1", resolve));
  const addr = s.address();
  return {
    port: typeof addr === "object" && addr !== null ? addr.port : port,
    close: () =>
      new Promise<void>((resolve) => {
        s.closeAllConnections();
        s.close(() => resolve());
      }),
  };
}

const server = await serve(Number(env.PORT || 0));
console.log(`listening on http://127.0.0.1:${server.port}/healthz`);

// Hold the key: a campaign wins it again after a loss (an outage past the
// TTL); while lost, health reports nothing held.
const held = (async () => {
  for await (const lease of leases.campaign(key, { signal: stop.signal })) {
    console.log(`holding '${key}' (epoch ${lease.epoch})`);
    await new Promise((r) =>
      lease.signal.addEventListener("abort", r, { once: true })
    );
  }
})();

const quit = () => stop.abort();
process.on("SIGINT", quit);
process.on("SIGTERM", quit);
await new Promise((r) =>
  stop.signal.addEventListener("abort", r, { once: true })
);
await server.close();
await leases.close();
await held.catch(() => {});
await nc.close();
