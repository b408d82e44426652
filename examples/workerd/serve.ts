/**
 * Runs `worker.ts` in workerd through miniflare, with no wrangler.toml:
 * esbuild bundles it into one ES module, miniflare starts workerd with a
 * Durable Object namespace for `LeaseHolder`, and the worker listens on
 * 127.0.0.1:8787.
 *
 *     NATS_WS_URL=ws://127.0.0.1:8080 node_modules/.bin/node examples/workerd/serve.ts
 *     curl -X POST http://127.0.0.1:8787/write/counter
 *     curl http://127.0.0.1:8787/holder/a/start?key=leader
 *     curl http://127.0.0.1:8787/holder/a/status
 *     curl -X POST 'http://127.0.0.1:8787/fenced/orders?data=orders.total'
 *
 * (Node 24, which runs TypeScript as is; `workerd_test.ts` uses
 * {@linkcode startWorker} the same way.)
 *
 * @module
 */

import * as esbuild from "esbuild";
import { Miniflare } from "miniflare";
import process from "node:process";

/**
 * The compatibility date the worker runs with: that of the workerd the
 * tests ran (1.20260730.x, `workerd --version` says 2026-07-30). No
 * compatibility flag is needed: `new WebSocket(url)` (which `wsconnect`
 * opens), `AbortSignal.timeout`, `crypto.randomUUID` and the timers are
 * there without `nodejs_compat`.
 */
export const COMPATIBILITY_DATE = "2026-07-30";

/** Bundles `entry` (`worker.ts`) and what it imports into one ES module. */
export async function bundleWorker(
  entry: URL = new URL("./worker.ts", import.meta.url),
): Promise<string> {
  const result = await esbuild.build({
    entryPoints: [decodeURIComponent(entry.pathname)],
    bundle: true,
    format: "esm",
    // "browser" honours tweetnacl's `"browser": { "crypto": false }`;
    // otherwise its optional `require("crypto")` fails the build.
    platform: "browser",
    target: "es2022",
    write: false,
    logLevel: "silent",
  });
  return result.outputFiles[0]!.text;
}

/** Options of {@linkcode startWorker}. */
export interface WorkerOptions {
  /** The server's WebSocket URL, e.g. `ws://127.0.0.1:8080`. */
  natsWsUrl: string;
  /** The lease bucket. @default {"leases"} */
  bucket?: string;
  /** The lease TTL in ms. @default {the bucket's, or 15000} */
  ttl?: number;
  /** The fenced bucket of `POST /fenced/KEY`. @default {"fenced-leases"} */
  fencedBucket?: string;
  /** Serve HTTP on this port (0: none, use `dispatchFetch`). @default {0} */
  port?: number;
  /** The worker's module. @default {worker.ts beside this file} */
  entry?: URL;
  /**
   * Durable Object namespaces: binding name to exported class.
   * @default {{ HOLDER: "LeaseHolder" }}
   */
  durableObjects?: Record<string, string>;
}

/** Starts the worker in workerd; dispose of the result to stop it. */
export async function startWorker(options: WorkerOptions): Promise<Miniflare> {
  const bindings: Record<string, string> = { NATS_WS_URL: options.natsWsUrl };
  if (options.bucket) bindings.LEASE_BUCKET = options.bucket;
  if (options.ttl) bindings.LEASE_TTL = String(options.ttl);
  if (options.fencedBucket) {
    bindings.LEASE_FENCED_BUCKET = options.fencedBucket;
  }
  const mf = new Miniflare({
    modules: true,
    script: await bundleWorker(options.entry),
    compatibilityDate: COMPATIBILITY_DATE,
    bindings,
    durableObjects: options.durableObjects ?? { HOLDER: "LeaseHolder" },
    ...(options.port ? { host: "127.0.0.1", port: options.port } : {}),
  });
  await mf.ready;
  return mf;
}

if (import.meta.main) {
  const mf = await startWorker({
    natsWsUrl: process.env.NATS_WS_URL ?? "ws://127.0.0.1:8080",
    port: Number(process.env.PORT ?? 8787),
  });
  console.log(`worker listening on ${await mf.ready}`);
  process.once("SIGINT", () => void mf.dispose());
}
