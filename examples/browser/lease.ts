/**
 * The lease module as a browser page or Web Worker loads it: this file is
 * the entry point of an esbuild bundle (`platform: "browser"`, ES module),
 * built to `dist/lease.js`. It re-exports the module and `wsconnect`, the
 * WebSocket transport of `@nats-io/nats-core`, since a page has no TCP
 * sockets. Nothing in the bundle needs a Node or Deno shim.
 *
 *     node_modules/.bin/esbuild examples/browser/lease.ts --bundle \
 *       --format=esm --platform=browser --outdir=examples/browser/dist
 *
 * `browser_test.ts` builds it the same way, with esbuild's JS API.
 *
 * @module
 */

export * from "../../mod.ts";
export { wsconnect } from "@nats-io/nats-core";
