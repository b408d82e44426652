/**
 * The production port (`lease/natsPort`) on a connection, as tests,
 * children and benches of the fenced layout (issue 33) build it before
 * `createLeaseManager` offers that layout: on a bucket's stream, or bare
 * (for `serve` and `probe`, which use only the connection).
 *
 * @module
 */

import type { NatsConnection } from "@nats-io/nats-core";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { fencedManagerOnPort } from "../lease/fenced.ts";
import type { Manager } from "../lease/manager.ts";
import { natsPort } from "../lease/nats_port.ts";
import type { Port } from "../lease/port.ts";

/**
 * The production port on `nc`.
 *
 * @param nc The connection.
 * @param stream The bucket's stream (`KV_<bucket>`); none for a bare port,
 * whose stream operations must not be used.
 * @param ttl The lease TTL, ms: the port's silence before it checks the
 * stream again.
 * @param timeout Request timeout, ms (createLeaseManager's default: TTL/4).
 * @returns The port.
 * @example A port on a bucket's stream
 * ```ts ignore
 * const port = await portOn(nc, `KV_${bucket}`, 2000);
 * ```
 */
export async function portOn(
  nc: NatsConnection,
  stream?: string,
  ttl = 5000,
  timeout: number = ttl / 4,
): Promise<Port> {
  const jsm = await jetstreamManager(nc, { timeout });
  const si = stream === undefined ? undefined : await jsm.streams.info(stream);
  return natsPort(
    nc,
    jetstream(nc, { timeout }),
    jsm,
    stream ?? "unused",
    si?.config.allow_direct === true,
    si?.created ?? "",
    ttl,
    { life: 0, peers: new Set() },
    { pending: [], casCheck: false },
  );
}

/**
 * A fenced-layout manager for `node` on bucket `bucket` (stream
 * `KV_<bucket>`), over a port from {@linkcode portOn}: the settings
 * `createLeaseManager` would resolve (a settle timeout of 1 s, no idle
 * release, no grace to decide).
 *
 * @param nc The connection.
 * @param bucket The fenced bucket.
 * @param node The node id.
 * @param ttl The lease TTL, ms.
 * @param timeout Request timeout, ms (default TTL/4).
 * @returns The manager.
 * @example
 * ```ts ignore
 * const m = await fencedManager(nc, bucket, "a", 2000);
 * ```
 */
export async function fencedManager(
  nc: NatsConnection,
  bucket: string,
  node: string,
  ttl: number,
  timeout: number = ttl / 4,
): Promise<Manager> {
  return await fencedManagerOnPort(
    await portOn(nc, `KV_${bucket}`, ttl, timeout),
    {
      node,
      ttl,
      timeout,
      bucket,
      restartGrace: true,
      settleTimeout: 1000,
      idleRelease: undefined,
      markerLife: 0,
      signal: undefined,
    },
  );
}
