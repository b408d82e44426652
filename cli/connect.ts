/**
 * Connecting `lease` to its bucket: the connection (retried for ever once
 * up), the lease manager over it, and the server's refusals worded for the
 * command line (a missing bucket, another TTL, the override's flag).
 *
 * @module
 */

import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import {
  jetstream,
  JetStreamApiCodes,
  JetStreamApiError,
} from "@nats-io/jetstream";
import {
  createLeaseManager,
  type LeaseManager,
  maxKeyLength,
  MIN_TTL,
  UnavailableError,
} from "../lease.ts";
import { markersVersion } from "../lease/servers.ts";
import { LONGEST_SUFFIX as SEMAPHORE_SUFFIX } from "../semaphore.ts";
import { type Args, UsageError } from "./args.ts";
import { EXIT } from "./exit.ts";
import {
  bucketLayout,
  fencedTtl,
  type Layout,
  TENURE_PREFIX,
} from "./fenced.ts";

/** No server of `--servers` could be reached (exit 68). */
export class NoServerError extends Error {
  override name = "NoServerError";
}

/**
 * Connects to `--servers`, reconnecting for ever once connected; throws
 * {@linkcode NoServerError} when none answers.
 */
export async function dial(a: Args): Promise<NatsConnection> {
  try {
    return await connect({
      servers: a.servers,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
    });
  } catch (err) {
    throw new NoServerError(
      `cannot connect to ${a.servers.join(",")}: ${(err as Error).message}`,
    );
  }
}

/**
 * A connection and a lease manager on `--bucket` (created with
 * `createBucket`, fenced with `run --fenced`); a refusal is thrown worded
 * for the command line. The manager's layout is the bucket's, read from
 * its stream metadata: one stream-info request before the manager's own.
 */
export async function open(
  a: Args,
  opts: {
    createBucket: boolean;
    node?: string;
    /** A connection and the layout already read on it, to use. */
    on?: { nc: NatsConnection; layout: Layout | undefined };
  },
): Promise<{ nc: NatsConnection; leases: LeaseManager; fenced: boolean }> {
  if (a.stream !== undefined) return await openStream(a, opts);
  const nc = opts.on?.nc ?? await dial(a);
  let fenced: boolean;
  try {
    // Unreadable (no JetStream, say): the manager's own set-up says why.
    const layout = opts.on !== undefined
      ? opts.on.layout
      : await bucketLayout(nc, a).catch(() => undefined);
    fenced = layout?.fenced ?? (opts.createBucket && a.fenced);
    if (fenced || a.fenced) fencedRefusal(nc, a, layout);
  } catch (err) {
    await nc.close().catch(() => {});
    throw err;
  }
  try {
    const leases = await createLeaseManager({
      nc,
      node: opts.node ?? a.node,
      bucket: a.bucket,
      createBucket: opts.createBucket,
      allowUnverifiedReplicas: a.allowUnverifiedReplicas,
      ...(fenced ? { fenced: true } : {}),
      ...(a.domain === undefined ? {} : { domain: a.domain }),
      ...(a.ttl === undefined ? {} : { ttl: a.ttl }),
    });
    return { nc, leases, fenced };
  } catch (err) {
    const why = await openFailure(nc, a, opts.createBucket, err);
    await nc.close().catch(() => {});
    throw why;
  }
}

/**
 * A connection and a lease manager over `--stream`'s leases under
 * `--lease-subjects` (never creating or changing the stream); a refusal is
 * thrown worded for the command line: a server before 2.11.2 (exit 69,
 * before anything is sent), a missing stream or one that cannot hold
 * leases (exit 69, naming each setting, as createLeaseManager does).
 */
async function openStream(
  a: Args,
  opts: { node?: string; on?: { nc: NatsConnection } },
): Promise<{ nc: NatsConnection; leases: LeaseManager; fenced: boolean }> {
  const nc = opts.on?.nc ?? await dial(a);
  try {
    const version = nc.info?.version ?? "";
    if (!markersVersion(version)) {
      throw new UnavailableError(
        a.key,
        `--stream: the leases cannot be kept in stream '${a.stream}' as the server runs nats-server ${
          version || "of an unknown version"
        }: leases in a stream need 2.11.2 or later (a check on another subject, and a per-message TTL that expires into a marker); nothing was sent`,
      );
    }
    const leases = await createLeaseManager({
      nc,
      node: opts.node ?? a.node,
      stream: a.stream!,
      leaseSubjects: a.leaseSubjects!,
      allowUnverifiedReplicas: a.allowUnverifiedReplicas,
      ...(a.ttl === undefined ? {} : { ttl: a.ttl }),
    });
    return { nc, leases, fenced: true };
  } catch (err) {
    await nc.close().catch(() => {});
    if (err instanceof UnavailableError) throw err;
    // A TypeError: an option the command line let through (its own
    // message names it); anything else, the stream's or its servers'.
    if (err instanceof TypeError) throw new UsageError(err.message);
    throw new UnavailableError(
      a.key,
      (err as Error).message.replace(
        "pass allowUnverifiedReplicas: true",
        "pass --allow-unverified-replicas",
      ),
      { cause: err },
    );
  }
}

/**
 * What `run --fenced`, or any subcommand on a fenced bucket, cannot do,
 * thrown before the manager sends anything: `--fenced` on a classic
 * bucket, a server before 2.11.2, a key too long for a tenure entry's
 * subject (`_lease.k.KEY`).
 */
function fencedRefusal(
  nc: NatsConnection,
  a: Args,
  layout: Layout | undefined,
): void {
  if (layout !== undefined && !layout.fenced) {
    throw new UsageError(
      `--fenced: bucket '${a.bucket}' exists and is a classic lease bucket, whose server would not refuse a stale write: omit --fenced to use it as it is, or pass another --bucket for a fenced one`,
    );
  }
  const version = nc.info?.version ?? "";
  if (!markersVersion(version)) {
    throw new UnavailableError(
      a.key,
      `${
        layout === undefined
          ? `--fenced: cannot create bucket '${a.bucket}'`
          : `bucket '${a.bucket}' is fenced, but cannot be used`
      } as the server runs nats-server ${
        version || "of an unknown version"
      }: a fenced bucket needs 2.11.2 or later (a check on another subject, and a per-message TTL that expires into a marker)`,
    );
  }
  const room = maxKeyLength(
    a.bucket,
    a.domain === undefined ? "$JS.API" : `$JS.${a.domain}.API`,
  ) - TENURE_PREFIX.length -
    (a.limit === undefined ? 0 : SEMAPHORE_SUFFIX);
  if (a.sub === "run" && a.key.length > room) {
    throw new UsageError(
      `KEY ${
        JSON.stringify(a.key.slice(0, 24))
      }... is ${a.key.length} characters long: at most ${room} on fenced bucket '${a.bucket}', whose tenure entries add '${TENURE_PREFIX}' to it, or a subject would overflow nats-server's control line`,
      EXIT.BAD_KEY,
    );
  }
}

/**
 * The bucket's TTL in ms (a fenced bucket's from its metadata), or
 * `undefined` when it does not exist. Read on the failure paths only, to
 * word their messages for the command line.
 */
async function bucketTtl(
  nc: NatsConnection,
  a: Args,
): Promise<number | undefined> {
  try {
    const status = await (await kvm(nc, a).open(a.bucket)).status();
    return fencedTtl(status.streamInfo.config.metadata) ?? status.ttl;
  } catch (err) {
    if (isStreamNotFound(err)) return undefined;
    throw err;
  }
}

/** A KV manager whose requests go to `--domain`, when given. */
export function kvm(nc: NatsConnection, a: Args): Kvm {
  return new Kvm(
    a.domain === undefined ? nc : jetstream(nc, { domain: a.domain }),
  );
}

/** Whether the server says the bucket's stream does not exist. */
export function isStreamNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError &&
    err.code === JetStreamApiCodes.StreamNotFound;
}

/** The error of a subcommand whose bucket does not exist (exit 69). */
export function noBucket(a: Args): UnavailableError {
  return new UnavailableError(
    a.key,
    `bucket '${a.bucket}' does not exist on ${a.servers.join(",")}${
      a.domain === undefined ? "" : ` in JetStream domain '${a.domain}'`
    } (lease run creates it): check --bucket and --servers${
      a.domain === undefined ? "" : " and --domain"
    }`,
  );
}

/**
 * Why createLeaseManager() refused, worded for the command line (its own
 * messages name its API: 'ttl', 'createBucket'), from the bucket as it is
 * rather than from the text of those messages.
 */
async function openFailure(
  nc: NatsConnection,
  a: Args,
  createBucket: boolean,
  err: unknown,
): Promise<Error> {
  if (err instanceof TypeError) return new UsageError(err.message);
  if (!(err instanceof RangeError) && createBucket) {
    return new UnavailableError(a.key, (err as Error).message, { cause: err });
  }
  // null: the bucket could not be read either (no JetStream, say).
  const ttl = await bucketTtl(nc, a).catch(() => null);
  if (err instanceof RangeError) {
    if (ttl === null || ttl === undefined) return new UsageError(err.message);
    if (ttl <= 0) {
      return new UsageError(
        `bucket '${a.bucket}' has no TTL, so its leases would never expire: use another --bucket`,
      );
    }
    if (a.ttl !== undefined && ttl !== a.ttl) {
      return new UsageError(
        `bucket '${a.bucket}' has a TTL of ${ttl} ms: pass --ttl ${ttl} (or omit --ttl), or use another --bucket`,
      );
    }
    if (ttl < MIN_TTL) {
      return new UsageError(
        `bucket '${a.bucket}' has a TTL of ${ttl} ms, below the ${MIN_TTL} ms a lease needs: use another --bucket`,
      );
    }
    return new UsageError(err.message);
  }
  if (ttl === undefined) return noBucket(a);
  return new UnavailableError(
    a.key,
    // The override's name on the command line.
    (err as Error).message.replace(
      "pass allowUnverifiedReplicas: true",
      "pass --allow-unverified-replicas",
    ),
    { cause: err },
  );
}

/**
 * The error of a subcommand whose stream (`--stream`, or LEASE_STREAM for
 * `publish`) does not exist (exit 69).
 */
export function noStream(
  a: Args,
  stream: string = a.stream ?? "",
): UnavailableError {
  return new UnavailableError(
    a.key,
    `stream '${stream}' does not exist on ${
      a.servers.join(",")
    } (lease never creates or changes a stream of yours: create it with subjects covering the --lease-subjects prefix's '.>', allow_msg_ttl, a subject_delete_marker_ttl of 1 s or more and allow_rollup_hdrs): check --stream and --servers`,
  );
}

/** A bucket's (or `--stream`'s) refusal, worded for the command line. */
export function bucketFailure(a: Args, err: unknown): unknown {
  if (isStreamNotFound(err)) {
    return a.stream !== undefined ? noStream(a) : noBucket(a);
  }
  if (err instanceof JetStreamApiError) {
    return new UnavailableError(a.key, err.message, { cause: err });
  }
  return err;
}
