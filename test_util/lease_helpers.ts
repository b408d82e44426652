// Small helpers shared by the lease test files.
import { execFileSync } from "node:child_process";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
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
