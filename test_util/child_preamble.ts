/**
 * What the scripts that tests run as child processes (`lease_child.ts`,
 * `lease_safety_child.ts`, `semaphore_child.ts`, `shards_child.ts`) share:
 * their environment, their reports as JSON lines on stdout, and a
 * connection with a lease manager on it. The parent reads the reports with
 * `startChild()` of `child.ts`.
 *
 * Environment: NATS_URL (comma-separated), LEASE_BUCKET, LEASE_NODE,
 * LEASE_TTL; each script names the rest at its head.
 *
 * @module
 */

import process from "node:process";
import { connect, type NodeConnectionOptions } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  createLeaseManager,
  type LeaseManager,
  type LeaseManagerOptions,
} from "../mod.ts";

/** The environment the parent gave this process. */
export const env: Record<string, string | undefined> = process.env;

/** Prints one event as a JSON line: `{"ev":..,"t":..,...extra}`. */
export type Say = (ev: string, extra?: Record<string, unknown>) => void;

/**
 * A {@linkcode Say} that stamps each line with `now()`. Lines go out
 * through console.log, as they always did: a script that stops itself
 * (semaphore_child.ts) counts on its last line being written first.
 *
 * @param now The clock of `t`; wall-clock milliseconds, which the processes
 * of one machine share.
 * @returns The printer.
 */
export function reporter(now: () => number = Date.now): Say {
  return (ev, extra = {}) =>
    console.log(JSON.stringify({ ev, t: now(), ...extra }));
}

/** Prints one event as a JSON line, `t` from `Date.now()`. */
export const say: Say = reporter();

/**
 * Resolves after `ms` milliseconds.
 *
 * @param ms How long.
 * @returns When it passed.
 */
export const sleep = (ms: number): Promise<void> =>
  new Promise((r) => setTimeout(r, ms));

/** Options of {@linkcode openLeases}, over what the environment says. */
export interface OpenLeasesOptions {
  /** Connection options beyond the servers and the endless reconnects. */
  connect?: Omit<NodeConnectionOptions, "servers">;
  /** Manager options beyond the connection, node, bucket and TTL. */
  manager?: Omit<LeaseManagerOptions, "nc" | "node" | "bucket" | "ttl">;
}

/**
 * Connects to NATS_URL, reconnecting forever every 100 ms, and opens a
 * lease manager for LEASE_NODE on LEASE_BUCKET with LEASE_TTL.
 *
 * @param options What the script sets beyond that.
 * @returns The connection and the manager.
 */
export async function openLeases(
  options: OpenLeasesOptions = {},
): Promise<{ nc: NatsConnection; leases: LeaseManager }> {
  const nc = await connect({
    servers: env.NATS_URL!.split(","),
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
    ...options.connect,
  });
  const leases = await createLeaseManager({
    nc,
    node: env.LEASE_NODE!,
    bucket: env.LEASE_BUCKET!,
    ttl: Number(env.LEASE_TTL),
    ...options.manager,
  });
  return { nc, leases };
}
