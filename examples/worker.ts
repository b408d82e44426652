/**
 * Web Worker: the lease manager runs inside a worker thread, which proves it
 * needs nothing from the main thread (no `node:*` module, no runtime
 * namespace): only what a Web Worker has, WebSocket included.
 *
 *     NATS_WS_URL=ws://127.0.0.1:8080 deno run --allow-net --allow-env --allow-read examples/worker.ts
 *
 * The main thread starts the worker, sends it the server URL, and waits for
 * the result of one guarded write (worker_lease.ts does the NATS part).
 *
 * @module
 */

import process from "node:process";

/** What worker_lease.ts posts back. */
type Result =
  | { ok: true; node: string; key: string; epoch: number }
  | { ok: false; error: string };

const servers = process.env.NATS_WS_URL ?? "ws://127.0.0.1:8080";
const key = process.env.LEASE_KEY ?? "worker-job";

const worker = new Worker(new URL("./worker_lease.ts", import.meta.url), {
  type: "module",
});
try {
  const result = await new Promise<Result>((resolve, reject) => {
    worker.onmessage = (e: MessageEvent<Result>) => resolve(e.data);
    worker.onerror = (e: ErrorEvent) => {
      e.preventDefault();
      reject(new Error(`worker failed: ${e.message}`));
    };
    worker.postMessage({ servers, key });
  });
  if (!result.ok) throw new Error(`worker reported: ${result.error}`);
  console.log(
    `[main] the worker (${result.node}) wrote '${result.key}' at epoch ${result.epoch}, released the lease and closed its connection`,
  );
} finally {
  // The worker has closed its connection before posting; end the thread.
  worker.terminate();
}
