/**
 * Single-writer leases over a NATS JetStream KV bucket: the face of the
 * module. It resolves the options of {@linkcode createLeaseManager}, sets the
 * bucket up, and hands the protocol core (`lease/manager.ts`, whose head
 * holds the safety argument) the production port over nats.js
 * (`lease/nats_port.ts`).
 *
 * @module
 */

// The module's files, from the seam outwards:
// - lease/port.ts      the seam: what the core needs of the world (`Port`);
// - lease/manager.ts   the protocol core (`Manager`), with the numbered safety
//                      argument at its head; lease/state.ts its per-key state;
// - lease/entry.ts     the wire format of an entry (key, tag, headers);
// - lease/types.ts, lease/events.ts, lease/errors.ts   the public contract;
// - lease/input.ts     input checks, run before anything is sent;
// - lease/trust.ts     point 7's reply gate, run by both ports;
// - lease/nats_port.ts the production port over nats.js;
// - lease/servers.ts   server versions, stream peers and marker life;
// - lease/_nats.ts, lease/_async.ts   small helpers of the two sides.
// The core (manager.ts and what it imports) reads no clock, timer or random
// source and imports no runtime or transport module; layering_test.ts holds
// it to that.

import type { NatsConnection } from "@nats-io/nats-core";
import {
  jetstream,
  type JetStreamManager,
  jetstreamManager,
} from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { abortReason } from "./lease/_async.ts";
import {
  isStreamNotFound,
  setupJetStream,
  setupRequests,
  whileUnrouted,
} from "./lease/_nats.ts";
import {
  BUCKET_RE,
  checkDuration,
  checkSharedOptions,
  describe,
  maxKeyLength,
  maxStreamKeyLength,
  STREAM_RE,
} from "./lease/input.ts";
import { Manager, type ManagerSettings } from "./lease/manager.ts";
import {
  fencedBucketTtl,
  fencedManagerOnPort,
  LAYOUT_KEY,
  SUBJECT_RE,
  TENURE_PREFIX,
  TTL_KEY,
} from "./lease/fenced.ts";
import { natsPort } from "./lease/nats_port.ts";
import { streamManager } from "./lease/stream.ts";
import {
  atomicVersion,
  casSafeVersion,
  markersVersion,
  proveServers,
} from "./lease/servers.ts";
import {
  DEFAULT_TTL,
  type LeaseManager,
  type LeaseManagerOptions,
  MIN_TTL,
} from "./lease/types.ts";

export {
  CLOCK_RATE_BOUND,
  DEFAULT_TTL,
  leaseCheckMargin,
  MIN_TTL,
  SETUP_TIMEOUT,
} from "./lease/types.ts";
export type {
  CloseResult,
  Connection,
  FencedOp,
  GuardCheck,
  GuardOptions,
  HealthOptions,
  Holder,
  Lease,
  LeaseHealth,
  LeaseManager,
  LeaseManagerOptions,
  WatchOptions,
} from "./lease/types.ts";
export {
  type AcquiredFrom,
  LeaseAcquiredEvent,
  LeaseDefunctEvent,
  type LeaseEventMap,
  LeaseLostEvent,
  LeaseReleasedEvent,
  LeaseRenewedEvent,
  type LostReason,
  RenewalFailedEvent,
} from "./lease/events.ts";
export { NotHolderError, UnavailableError } from "./lease/errors.ts";
export {
  BucketGone,
  type LinkChange,
  type Port,
  type RawEntry,
  type WriteRequest,
  type WriteResult,
} from "./lease/port.ts";
export {
  keyRoom,
  keyTooLong,
  MAX_CONTROL_LINE,
  maxKeyLength,
} from "./lease/input.ts";
export { managerOnPort, type ManagerSettings } from "./lease/manager.ts";
export { casSafeVersion, unsafeReplicaReason } from "./lease/servers.ts";

/**
 * Creates a lease manager over a JetStream KV bucket, creating the bucket
 * (TTL = lease TTL, history 1) if it does not exist and `createBucket`
 * allows.
 *
 * @param options The connection, this node's id and the settings.
 * @returns The manager, ready to guard writes.
 * @throws {TypeError} `nc` is missing, `node` is blank, or an option has the wrong type.
 * @throws {RangeError} `ttl`, `timeout`, `settleTimeout`, `idleRelease` or `replicas` is out of range, or the existing bucket's TTL does not fit.
 * @throws {Error} The server has no JetStream; the bucket is missing and `createBucket` is false; or the bucket is replicated and its servers cannot be proven to be 2.9.21 or later.
 *
 * @example Guard writes to a store
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { createLeaseManager } from "@nats-lease/lease";
 *
 * const nc = await connect({ servers: "127.0.0.1:4222" });
 * await using leases = await createLeaseManager({ nc, node: "node-a", ttl: 5_000 });
 * await leases.guard("orders", ({ epoch }) => console.log("writing at epoch", epoch));
 * await nc.close();
 * ```
 */
export async function createLeaseManager(
  options: LeaseManagerOptions,
): Promise<LeaseManager> {
  const o = resolveOptions(options);
  if (o.signal?.aborted) throw abortReason(o.signal);
  if (o.stream !== undefined) {
    return await streamManager({
      ...o,
      stream: o.stream,
      leaseSubjects: o.leaseSubjects!,
    });
  }
  const nc = o.nc;
  const { total: setupTimeout, deadline: setupDeadline, attempt, ask } =
    setupRequests(
      o.timeout,
      o.signal,
    );
  // `$JS.<domain>.API` in place of `$JS.API` for every request below.
  const domain = o.domain === undefined ? {} : { domain: o.domain };
  const jsm = await setupJetStream(nc, ask, o.domain);
  const existing = await ask(async (timeout) =>
    bucketStatus(
      await jetstreamManager(nc, { timeout, ...domain, checkAPI: false }),
      o.bucket,
    )
  );
  if (existing) {
    // The layout comes first: a fenced bucket has no max age, and a
    // manager of one layout on the other's bucket would read tenure
    // entries as data, or data as leases (design/fenced.md, "Layout").
    const fencedTtl = fencedBucketTtl(existing.metadata);
    if (o.fencedBucket !== (fencedTtl !== undefined)) {
      throw new Error(
        o.fencedBucket
          ? `Cannot create lease manager with fenced: true as bucket '${o.bucket}' is a classic lease bucket (or not a lease bucket): use another bucket for fenced leases, or omit 'fenced'`
          : `Cannot create lease manager on bucket '${o.bucket}' as it is a fenced bucket: pass fenced: true`,
      );
    }
    if (fencedTtl !== undefined) existing.ttl = fencedTtl;
    if (existing.ttl <= 0) {
      throw new RangeError(
        `Cannot create lease manager as bucket '${o.bucket}' has no TTL, so its leases would never expire: use a bucket made with a TTL`,
      );
    }
    if (options.ttl !== undefined && existing.ttl !== o.ttl) {
      throw new RangeError(
        `Cannot create lease manager as bucket '${o.bucket}' has a TTL of ${existing.ttl} ms but 'ttl' is ${o.ttl} ms: pass ttl: ${existing.ttl}, omit 'ttl' to adopt it, or use another bucket`,
      );
    }
    if (existing.ttl < MIN_TTL) {
      throw new RangeError(
        `Cannot create lease manager as bucket '${o.bucket}' has a TTL of ${existing.ttl} ms, below the minimum of ${MIN_TTL} ms`,
      );
    }
    o.ttl = existing.ttl;
    adoptTtl(o, options);
  } else if (!o.createBucket) {
    throw new Error(
      `Cannot create lease manager as bucket '${o.bucket}' does not exist and 'createBucket' is false`,
    );
  }
  const replicas = existing?.replicas ?? options.replicas ?? 1;
  // Refused before anything is created or written: below 2.11 a fenced
  // write's check is ignored, and below 2.11.2 a session's entry expires
  // without a marker (nats-server#6741). The servers that hold the
  // bucket are checked below.
  if (o.fencedBucket && !markersVersion(nc.info?.version ?? "")) {
    throw new RangeError(fencedServersRefusal(
      o.bucket,
      `the server runs nats-server ${
        nc.info?.version ?? "of an unknown version"
      }`,
    ));
  }
  // A bucket about to be created: refuse early if even the server we are
  // connected to is too old; its peers are checked once it exists.
  if (
    replicas > 1 && !existing && !o.allowUnverifiedReplicas &&
    !casSafeVersion(nc.info?.version ?? "")
  ) {
    throw new Error(
      `Cannot create lease manager on a bucket with ${replicas} replicas as nats-server ${
        nc.info?.version ?? "(unknown version)"
      } may let two compare-and-set updates with the same revision both succeed on a replicated stream (fixed in 2.9.21, nats-server#4320): upgrade the servers to 2.9.21 or later, or use a bucket with 1 replica`,
    );
  }
  let direct = existing?.direct;
  let created = existing?.created;
  if (direct === undefined) {
    // Markers outlive the max age (the marker TTL is whole seconds), so a
    // marker lasts exactly the max age, the path the server never runs
    // early. Asked for only where the server we talk to has them; whether
    // the bucket got them is checked below either way.
    const withMarkers = o.markers && markersVersion(nc.info?.version ?? "");
    const ttlSeconds = Math.ceil(o.ttl / 1000);
    // Safe to repeat: `Kvm.create` reads the stream's info first and adds
    // it only when the server says it is missing, and an add with the same
    // config as the stream has succeeds (a concurrent creator's add
    // included), so a repeat never makes a second bucket or changes one.
    const kv = await ask(
      () =>
        new Kvm(jetstream(nc, { timeout: attempt, ...domain })).create(
          o.bucket,
          o.fencedBucket
            // No max age: tenure entries and data stay until replaced or
            // deleted; only a session's entry expires, by its own TTL,
            // into a marker that lives about as long as a session's entry.
            ? {
              history: 1,
              replicas,
              markerTTL: ttlSeconds * 1000,
              metadata: {
                [LAYOUT_KEY]: "fenced",
                [TTL_KEY]: String(o.ttl),
              },
            }
            : {
              ttl: o.ttl,
              history: 1,
              replicas,
              ...(withMarkers ? { markerTTL: (ttlSeconds + 1) * 1000 } : {}),
            },
        ),
    );
    // Created now, or concurrently by another process: read what it is.
    const status = await ask(() => kv.status());
    const config = status.streamInfo.config;
    const fencedTtl = fencedBucketTtl(config.metadata);
    if (o.fencedBucket !== (fencedTtl !== undefined)) {
      throw new Error(
        `Cannot create lease manager on bucket '${o.bucket}' as another process created it ${
          o.fencedBucket ? "without" : "with"
        } fenced: true at the same time`,
      );
    }
    if (fencedTtl !== undefined) {
      if (fencedTtl !== o.ttl) {
        throw new RangeError(
          `Cannot create lease manager as bucket '${o.bucket}' has a TTL of ${fencedTtl} ms but 'ttl' is ${o.ttl} ms`,
        );
      }
      // Atomic batches (lease.commit) where this server has them; a
      // commit checks the server's version again before each batch.
      if (atomicVersion(nc.info?.version ?? "") && !config.allow_atomic) {
        await ask(async (timeout) =>
          await (await jetstreamManager(nc, {
            timeout,
            ...domain,
            checkAPI: false,
          })).streams.update(
            `KV_${o.bucket}`,
            {
              ...config,
              allow_atomic: true,
            } as Parameters<JetStreamManager["streams"]["update"]>[1],
          )
        );
      }
    } else if (status.ttl !== o.ttl) {
      throw new RangeError(
        `Cannot create lease manager as bucket '${o.bucket}' has a TTL of ${status.ttl} ms but 'ttl' is ${o.ttl} ms`,
      );
    }
    direct = status.streamInfo.config.allow_direct === true;
    created = status.streamInfo.created;
  }
  const casCheck = replicas > 1 && !o.allowUnverifiedReplicas;
  const proof = await proveServers(
    nc,
    jsm,
    `KV_${o.bucket}`,
    setupTimeout,
    casCheck,
    o.fencedBucket ? "fenced" : o.markers,
  );
  if (proof.refuse === undefined && o.fencedBucket && proof.markers.life <= 0) {
    // Told apart for the operator: an edit of the stream, or its servers.
    if (!(existing?.markerTtl === undefined || existing.markerTtl >= 1000)) {
      throw new RangeError(
        `Cannot create lease manager on fenced bucket '${o.bucket}' as its stream has no subject delete markers (subject_delete_marker_ttl was removed): a session ends by its entry's expiry into a marker, so restore a marker TTL of ${
          Math.ceil(o.ttl / 1000)
        } s`,
      );
    }
    throw new RangeError(fencedServersRefusal(
      o.bucket,
      "not every server holding it could be proven to run 2.11.2 or later, with the bucket's markers",
    ));
  }
  if (proof.refuse !== undefined) {
    throw new Error(
      `Cannot create lease manager on bucket '${o.bucket}'. ${proof.refuse} Upgrade the servers, use a bucket with 1 replica, or pass allowUnverifiedReplicas: true if you know every server that may hold the bucket`,
    );
  }
  o.markerLife = proof.markers.life;
  const js = jetstream(nc, { timeout: o.timeout, ...domain });
  const opsJsm = await jetstreamManager(nc, {
    timeout: o.timeout,
    ...domain,
    checkAPI: false,
  });
  if (o.signal?.aborted) throw abortReason(o.signal);
  const port = () =>
    natsPort(
      nc,
      js,
      opsJsm,
      `KV_${o.bucket}`,
      direct,
      created!,
      o.ttl,
      proof.markers,
      { pending: proof.pending, casCheck },
    );
  // A fenced manager's session is written now, and a bucket created just
  // now may not be routed yet (see whileUnrouted).
  return o.fencedBucket
    ? await whileUnrouted(
      () => fencedManagerOnPort(port(), o),
      setupDeadline,
      o.signal,
    )
    : new Manager(port(), o);
}

function fencedServersRefusal(bucket: string, why: string): string {
  return `Cannot create lease manager with fenced: true on bucket '${bucket}' as ${why}: a fenced bucket needs nats-server 2.11.2 or later (a check on another subject, and a per-message TTL that expires into a marker) on every server that holds it`;
}

async function bucketStatus(
  jsm: JetStreamManager,
  bucket: string,
): Promise<
  | {
    ttl: number;
    replicas: number;
    direct: boolean;
    created: string;
    metadata: Record<string, string> | undefined;
    /** The subject delete marker TTL, ms (0: none). */
    markerTtl: number;
  }
  | undefined
> {
  try {
    const si = await jsm.streams.info(`KV_${bucket}`);
    return {
      ttl: Math.round(si.config.max_age / 1_000_000),
      metadata: si.config.metadata,
      replicas: si.config.num_replicas,
      direct: si.config.allow_direct === true,
      created: si.created,
      markerTtl: ((si.config as { subject_delete_marker_ttl?: number })
        .subject_delete_marker_ttl ?? 0) / 1e6,
    };
  } catch (err) {
    if (isStreamNotFound(err)) return undefined;
    throw err;
  }
}

function defaultTimeout(ttl: number): number {
  return Math.min(ttl / 4, 5_000);
}

interface Resolved extends ManagerSettings {
  /** Only its type was checked (a `request` method); nats.js uses the rest. */
  nc: NatsConnection;
  createBucket: boolean;
  allowUnverifiedReplicas: boolean;
  markers: boolean;
  domain: string | undefined;
  /** The `fenced` option (ManagerSettings.fenced is the layout's wiring). */
  fencedBucket: boolean;
  /** The `stream` option: the leases live in this stream of the user's. */
  stream: string | undefined;
  leaseSubjects: string | undefined;
}

/** Checks the options that depend on the TTL, once the TTL in force is known. */
function adoptTtl(o: Resolved, options: LeaseManagerOptions): void {
  o.timeout = options.timeout === undefined
    ? defaultTimeout(o.ttl)
    : checkDuration("timeout", options.timeout, 1, o.ttl);
  o.settleTimeout = options.settleTimeout === undefined
    ? o.ttl
    : checkDuration("settleTimeout", options.settleTimeout, 0, 2 ** 31 - 1);
}

/**
 * The options of the stream layout (`stream`): a stream name, a subject
 * prefix for the leases, and none of the options that only a bucket has.
 */
function checkStreamOptions(options: LeaseManagerOptions): void {
  const { stream, leaseSubjects } = options;
  if (typeof stream !== "string" || !STREAM_RE.test(stream)) {
    throw new TypeError(
      `Cannot create lease manager as 'stream' must be a stream name without whitespace, '.', '*', '>', '/' or '\\': received ${
        describe(stream)
      }`,
    );
  }
  if (typeof leaseSubjects !== "string" || !SUBJECT_RE.test(leaseSubjects)) {
    throw new TypeError(
      `Cannot create lease manager on stream '${stream}' as 'leaseSubjects' must be the subject prefix the leases live under (e.g. "orders.lease"), without wildcards or whitespace: received ${
        describe(leaseSubjects)
      }`,
    );
  }
  for (
    const name of [
      "bucket",
      "createBucket",
      "replicas",
      "markers",
      "restartGrace",
      "domain",
    ] as const
  ) {
    if (options[name] !== undefined) {
      throw new TypeError(
        `Cannot create lease manager with 'stream' and '${name}': the leases live in stream '${stream}', so omit '${name}'`,
      );
    }
  }
  if (options.fenced === false) {
    throw new TypeError(
      `Cannot create lease manager with 'stream' and fenced: false: leases in a stream are always fenced`,
    );
  }
}

function resolveOptions(options: LeaseManagerOptions): Resolved {
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `Cannot create lease manager as 'options' must be an object: received ${
        describe(options)
      }`,
    );
  }
  const { nc, node, signal, stream } = options;
  const bucket = options.bucket ?? stream ?? "leases";
  if (
    typeof nc !== "object" || nc === null ||
    typeof (nc as { request?: unknown }).request !== "function" ||
    typeof (nc as { closed?: unknown }).closed !== "function"
  ) {
    throw new TypeError(
      `Cannot create lease manager as 'nc' must be a NatsConnection: received ${
        describe(nc)
      }`,
    );
  }
  const shared = checkSharedOptions(options);
  if (stream !== undefined) checkStreamOptions(options);
  else if (options.leaseSubjects !== undefined) {
    throw new TypeError(
      `Cannot create lease manager with 'leaseSubjects' but no 'stream': it names where the leases live in a stream of yours`,
    );
  } else if (typeof bucket !== "string" || !BUCKET_RE.test(bucket)) {
    throw new TypeError(
      `Cannot create lease manager as 'bucket' must be ASCII letters, digits, '-' or '_': received ${
        describe(bucket)
      }`,
    );
  }
  const { domain } = options;
  // Keys are refused past this length before anything is sent: a longer
  // one would get the connection closed by the server on its first request.
  const inboxPrefix =
    (nc as { options?: { inboxPrefix?: string } }).options?.inboxPrefix ||
    undefined;
  const maxKey = stream === undefined
    ? maxKeyLength(
      bucket,
      domain === undefined ? "$JS.API" : `$JS.${domain}.API`,
      inboxPrefix,
    )
    : maxStreamKeyLength(
      stream,
      options.leaseSubjects!,
      "$JS.API",
      inboxPrefix,
    );
  if (maxKey < 1) {
    throw new TypeError(
      `Cannot create lease manager as 'bucket' is too long: its subjects would leave no room for a key in nats-server's control line: received a name of ${bucket.length} characters`,
    );
  }
  const ttl = checkDuration(
    "ttl",
    options.ttl ?? DEFAULT_TTL,
    MIN_TTL,
    2 ** 31 - 1,
  );
  const fenced = options.fenced ?? stream !== undefined;
  if (fenced) {
    // A fenced bucket always has markers (a session's end is its entry's
    // expiry into one) and owes no grace: the server refuses a late write.
    for (const name of ["markers", "restartGrace"] as const) {
      if (options[name] !== undefined) {
        throw new TypeError(
          `Cannot create lease manager with fenced: true and '${name}': a fenced bucket ${
            name === "markers" ? "always has markers" : "owes no grace"
          }, so omit '${name}'`,
        );
      }
    }
    if (options.ttl !== undefined && options.ttl < 1000) {
      throw new RangeError(
        `Cannot create lease manager with fenced: true as 'ttl' must be at least 1000 ms (a session's entry expires in whole seconds): received ${
          describe(options.ttl)
        }`,
      );
    }
  }
  const o: Resolved = {
    nc: nc as unknown as NatsConnection,
    node: node as string,
    ttl,
    timeout: 0,
    settleTimeout: 0,
    idleRelease: shared.idleRelease,
    check: shared.check,
    restartGrace: options.restartGrace ?? true,
    markers: options.markers ?? true,
    markerLife: 0,
    createBucket: options.createBucket ?? true,
    allowUnverifiedReplicas: options.allowUnverifiedReplicas ?? false,
    domain,
    bucket,
    // A fenced bucket's tenure subject is longer: `_lease.k.<key>`.
    maxKey: fenced && stream === undefined
      ? maxKey - TENURE_PREFIX.length
      : maxKey,
    signal,
    fencedBucket: fenced,
    stream,
    leaseSubjects: options.leaseSubjects,
  };
  // Checked against the given (or default) TTL now, and again against an
  // existing bucket's TTL once it is adopted.
  adoptTtl(o, options);
  return o;
}
