// Small helpers shared by the lease test files.
import { execFileSync } from "node:child_process";
import process from "node:process";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstream, JetStreamApiError } from "@nats-io/jetstream";
import { type KV, Kvm, type KvOptions } from "@nats-io/kv";
import {
  type Lease,
  type LeaseManager,
  NotHolderError,
  UnavailableError,
} from "../mod.ts";

/** Resolves after `ms` milliseconds. */
export const sleep = (ms: number): Promise<void> =>
  new Promise((r) => setTimeout(r, ms));

/** Polls `pred` every `pause` ms until it holds; fails after `ms`. */
export async function eventually(
  pred: () => boolean | Promise<boolean>,
  ms: number,
  what: string,
  pause = 10,
): Promise<void> {
  const end = performance.now() + ms;
  while (!(await pred())) {
    if (performance.now() >= end) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await sleep(pause);
  }
}

let seq = 0;
/** A name no other test in this process uses, for buckets. */
export const uniq = (prefix: string): string =>
  `${prefix}${Date.now() % 1e6}x${seq++}`;

/**
 * Guards until the write runs, retrying on NotHolderError (a holder, or the
 * grace) and UnavailableError (an election, a restart), for at most `limit`
 * ms; then rethrows the last error.
 */
export async function guardUntil<T>(
  m: LeaseManager,
  key: string,
  write: (l: Lease) => T | Promise<T>,
  limit: number,
  pause = 5,
): Promise<T> {
  const end = performance.now() + limit;
  for (;;) {
    try {
      return await m.guard(key, write);
    } catch (err) {
      if (
        !(err instanceof NotHolderError || err instanceof UnavailableError) ||
        performance.now() > end
      ) throw err;
      await sleep(pause);
    }
  }
}

/**
 * Creates (or opens) a KV bucket for a test's set-up, asking again while a
 * cluster that has just started cannot yet: one electing its meta leader
 * drops the API requests it gets meanwhile, or says it has none (10008); one
 * whose meta leader has not heard from every peer yet may find no room for
 * the replicas (10005 "no suitable peers for placement", 10023
 * "insufficient resources": a run with two clusters starting at once failed
 * on an API error here, its code not kept); and a replicated stream is
 * answered for once its raft group has a leader, which a failed first vote
 * delays by 4-9 s. A repeat is safe: `Kvm.create` reads the stream first,
 * and an add with the same config succeeds. Each attempt waits 10 s; it
 * gives up after `budget` ms. Each repeat is logged, with its cause.
 */
export async function createBucket(
  nc: NatsConnection,
  bucket: string,
  opts: Partial<KvOptions>,
  budget = 60_000,
): Promise<KV> {
  const end = performance.now() + budget;
  for (;;) {
    try {
      return await new Kvm(jetstream(nc, { timeout: 10_000 })).create(
        bucket,
        opts,
      );
    } catch (err) {
      const again = (err instanceof Error && err.name === "TimeoutError") ||
        (err instanceof JetStreamApiError &&
          [10005, 10008, 10023].includes(err.code));
      if (!again || performance.now() > end) throw err;
      console.error(
        `createBucket ${bucket}: ${(err as Error).message}; asking again`,
      );
      await sleep(250);
    }
  }
}

/**
 * A connection that reconnects for ever, quickly, and never dials a server
 * it hears of from the one it reached (through a proxy, it stays behind it).
 */
export async function conn(url: string): Promise<NatsConnection> {
  return await connect({
    servers: url,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
    ignoreClusterUpdates: true,
  });
}

/**
 * A connection to every server of a cluster, preferring server `first`, that
 * fails over to the others and reconnects for ever, quickly.
 */
export async function clusterConn(
  cluster: { readonly urls: readonly string[] },
  first: number,
): Promise<NatsConnection> {
  const urls = cluster.urls;
  return await connect({
    servers: [...urls.slice(first), ...urls.slice(0, first)],
    noRandomize: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
  });
}

/** The `x.y.z` version a nats-server binary reports. */
export function versionOf(binary: string): string {
  return /v?(\d+\.\d+\.\d+)/.exec(
    execFileSync(binary, ["--version"], { encoding: "utf8" }),
  )?.[1] ?? "unknown";
}

/** Subject delete markers on expiry work from 2.11.2 (nats-server#6741). */
export function markersSupported(version: string): boolean {
  const [a = 0, b = 0, c = 0] = version.split(".").map(Number);
  return a > 2 || (a === 2 && (b > 11 || (b === 11 && c >= 2)));
}

/**
 * Records every unhandled rejection and uncaught exception from now until
 * `stop()`, which returns them: what a closed connection does to a manager
 * must reach the caller's await, never a process-wide handler (a Node
 * process dies of it, with a stack trace).
 */
export function strayErrors(): { stop(): Promise<unknown[]> } {
  const seen: unknown[] = [];
  const rejection = (reason: unknown) => void seen.push(reason);
  const uncaught = (err: unknown) => void seen.push(err);
  process.on("unhandledRejection", rejection);
  process.on("uncaughtException", uncaught);
  return {
    async stop() {
      // A rejection is reported unhandled a turn or so after it settles.
      await sleep(100);
      process.off("unhandledRejection", rejection);
      process.off("uncaughtException", uncaught);
      return seen;
    },
  };
}
