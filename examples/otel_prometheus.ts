/**
 * Lease metrics for Prometheus: two nodes share a key, and `/metrics` shows
 * the holder change in OpenTelemetry's instruments (`instrument()` of
 * `otel.ts`, exported by `@opentelemetry/exporter-prometheus`).
 *
 *     NATS_URL=nats://127.0.0.1:4222 deno run --allow-net --allow-env examples/otel_prometheus.ts
 *     NATS_URL=nats://127.0.0.1:4222 bun examples/otel_prometheus.ts
 *     NATS_URL=nats://127.0.0.1:4222 node examples/otel_prometheus.ts
 *
 * then `curl http://127.0.0.1:$PORT/metrics` with the port it prints
 * (`METRICS_PORT`, default 0: a free one). node-a writes the key, node-b is
 * refused, node-a releases it and node-b takes it over; node-b then holds
 * it for `HOLD_MS` (default 30 s) while the metrics are served, and both
 * close. `TTL_MS` sets the lease TTL (default 2 s), `LEASE_KEY` the key.
 *
 * @module
 */

import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import process from "node:process";
import { connect } from "@nats-io/transport-node";
import { MeterProvider } from "@opentelemetry/sdk-metrics";
import { PrometheusExporter } from "@opentelemetry/exporter-prometheus";
import { createLeaseManager, NotHolderError } from "../mod.ts";
import { instrument } from "../otel.ts";

const servers = (process.env.NATS_URL ?? "nats://127.0.0.1:4222").split(",");
const key = process.env.LEASE_KEY ?? "report";
const holdMs = Number(process.env.HOLD_MS ?? 30_000);
const options = {
  bucket: "otel-example",
  ttl: Number(process.env.TTL_MS ?? 2_000),
};

// The exporter is the provider's reader; it serves through our own HTTP
// server, which can listen on port 0 (the exporter's own treats 0 as 9464).
const exporter = new PrometheusExporter({ preventServerStart: true });
const provider = new MeterProvider({ readers: [exporter] });
const http = createServer((req, res) => {
  if (req.url === "/metrics") {
    return exporter.getMetricsRequestHandler(req, res);
  }
  res.statusCode = 404;
  res.end();
});
await new Promise<void>((resolve) =>
  http.listen(Number(process.env.METRICS_PORT ?? 0), "127.0.0.1", resolve)
);
const { port } = http.address() as AddressInfo;
console.log(`metrics: http://127.0.0.1:${port}/metrics`);

const [ncA, ncB] = await Promise.all([
  connect({ servers, maxReconnectAttempts: -1 }),
  connect({ servers, maxReconnectAttempts: -1 }),
]);
// One meter per node: Prometheus tells them apart by `otel_scope_name`.
const a = instrument(
  await createLeaseManager({ nc: ncA, node: "node-a", ...options }),
  { meter: provider.getMeter("node-a") },
);
const b = instrument(
  await createLeaseManager({ nc: ncB, node: "node-b", ...options }),
  { meter: provider.getMeter("node-b") },
);
try {
  for (let i = 0; i < 3; i++) {
    await a.guard(key, (lease) => {
      console.log(`node-a writes ${key} at epoch ${lease.epoch}`);
    }, { wait: true });
  }
  try {
    await b.guard(key, () => {});
  } catch (err) {
    if (!(err instanceof NotHolderError)) throw err;
    console.log(`node-b refused: ${err.message}`);
  }
  await a.release(key);
  await b.guard(key, (lease) => {
    console.log(`node-b holds ${key} at epoch ${lease.epoch}`);
  }, { wait: true });
  await new Promise((resolve) => setTimeout(resolve, holdMs));
} finally {
  // `await using` would do the same: close each manager, then stop its
  // metrics.
  await b[Symbol.asyncDispose]();
  await a[Symbol.asyncDispose]();
  await Promise.all([ncA.close(), ncB.close()]);
  await provider.shutdown();
  http.close();
  console.log("closed");
}
