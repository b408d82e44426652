/**
 * The fenced layout in a stream of the user's (`createLeaseManager({
 * stream, leaseSubjects })`, issue 33, `design/fenced.md`, "The stream
 * layout"): set-up proves the stream can hold leases without changing it,
 * then runs the fenced manager over it.
 *
 * What differs from a fenced bucket, and why each check is here:
 * - the stream keeps every message of a subject, so every lease entry's
 *   write is a rollup of its subject (`allow_rollup_hdrs`, no
 *   `deny_purge`), or each renewal would stay forever;
 * - a max age, a limit of messages or bytes, or a retention other than
 *   `limits` (a work queue, interest) would drop a tenure entry
 *   that is written once per tenure, so a key held long enough would look
 *   free: a takeover from a live holder (its fenced writes are still
 *   refused, F1, but it is a failover nobody asked for). Refused;
 * - a session's end is its entry's expiry into a marker (F3, F5), so the
 *   stream must take per-message TTLs and place markers;
 * - an append to a subject of another stream would be checked against a
 *   tenure subject that stream never had, and one to no stream's subject
 *   is never stored: both refused before sending (see
 *   `streamLeaseSubjects`).
 *
 * @module
 */

import type { NatsConnection } from "@nats-io/nats-core";
import {
  jetstream,
  jetstreamManager,
  type StreamConfig,
} from "@nats-io/jetstream";
import {
  isStreamNotFound,
  setupJetStream,
  setupRequests,
  whileUnrouted,
} from "./_nats.ts";
import {
  fencedManagerOnPort,
  LAYOUT_KEY,
  streamLeaseSubjects,
  subjectCovers,
} from "./fenced.ts";
import type { Manager, ManagerSettings } from "./manager.ts";
import { natsPort } from "./nats_port.ts";
import { markersVersion, proveServers } from "./servers.ts";
import { abortReason } from "./_async.ts";

/** What set-up of a stream's leases needs, its options resolved. */
export interface StreamSetup extends Omit<ManagerSettings, "fenced"> {
  readonly nc: NatsConnection;
  /** The user's stream. */
  readonly stream: string;
  /** The subject prefix the leases live under. */
  readonly leaseSubjects: string;
  readonly allowUnverifiedReplicas: boolean;
}

/**
 * The settings of `config` that keep it from holding leases under
 * `prefix`, one sentence each; empty when it can.
 */
export function streamRefusals(
  config: StreamConfig,
  prefix: string,
): string[] {
  const out: string[] = [];
  const c = config as StreamConfig & {
    allow_msg_ttl?: boolean;
    subject_delete_marker_ttl?: number;
  };
  if (c.metadata?.[LAYOUT_KEY] !== undefined) {
    out.push(
      "it is a lease bucket's stream (pass its bucket name as 'bucket' instead)",
    );
  }
  if (c.mirror) out.push("it is a mirror, which takes no writes");
  // A work queue drops a message its consumer acknowledged, an interest
  // stream one every consumer did (or at once, without consumers): a
  // tenure or session entry gone, and the key taken from a live holder.
  if (c.retention !== undefined && c.retention !== "limits") {
    out.push(
      `its retention is '${c.retention}', which drops lease entries once consumed (use 'limits')`,
    );
  }
  if (c.sealed) out.push("it is sealed");
  const subjects = c.subjects ?? [];
  for (const part of ["k", "s"]) {
    const sub = `${prefix}.${part}`;
    if (!subjects.some((p) => subjectCovers(p, sub, true))) {
      out.push(
        `its subjects (${
          subjects.join(", ") || "none"
        }) do not cover '${sub}.>'`,
      );
    }
  }
  if (c.allow_msg_ttl !== true) {
    out.push(
      "it has no 'allow_msg_ttl' (a session's entry expires by its own TTL)",
    );
  }
  if (!((c.subject_delete_marker_ttl ?? 0) >= 1e9)) {
    out.push(
      "its 'subject_delete_marker_ttl' is not 1 s or more (a session's expiry must leave a marker)",
    );
  }
  if (c.allow_rollup_hdrs !== true || c.deny_purge === true) {
    out.push(
      "it has no 'allow_rollup_hdrs', or has 'deny_purge' (each lease entry's write replaces the ones before it)",
    );
  }
  for (
    const [name, value] of [
      ["max_age", c.max_age],
      ["max_msgs", c.max_msgs],
      ["max_bytes", c.max_bytes],
    ] as const
  ) {
    if (typeof value === "number" && value > 0) {
      out.push(
        `it has a '${name}' (${value}), which would drop a long-held tenure's entry and let another node take the key`,
      );
    }
  }
  return out;
}

/**
 * Proves `o.stream` can hold leases under `o.leaseSubjects` and runs the
 * fenced manager over it. Nothing is created or changed, on the stream or
 * elsewhere, before every check passed; then the manager's session entry
 * is the first write.
 *
 * @param o The resolved options.
 * @returns The manager.
 */
export async function streamManager(o: StreamSetup): Promise<Manager> {
  const nc = o.nc;
  const { total: setupTimeout, deadline: setupDeadline, ask } = setupRequests(
    o.timeout,
    o.signal,
  );
  const version = nc.info?.version ?? "";
  // Below 2.11 a fenced append's check is ignored, below 2.11.2 a
  // session's entry expires without a marker (nats-server#6741).
  if (!markersVersion(version)) {
    throw new RangeError(
      `Cannot create lease manager on stream '${o.stream}' as the server runs nats-server ${
        version || "of an unknown version"
      }: leases in a stream need nats-server 2.11.2 or later (a check on another subject, and a per-message TTL that expires into a marker) on every server that holds it`,
    );
  }
  const jsm = await setupJetStream(nc, ask, undefined);
  let info;
  try {
    info = await ask(async (timeout) =>
      await (await jetstreamManager(nc, { timeout, checkAPI: false })).streams
        .info(o.stream)
    );
  } catch (err) {
    if (isStreamNotFound(err)) {
      throw new Error(
        `Cannot create lease manager as stream '${o.stream}' does not exist: create it (this library never creates or changes a stream of yours) with subjects covering '${o.leaseSubjects}.>', allow_msg_ttl, a subject_delete_marker_ttl of 1 s or more, and allow_rollup_hdrs`,
        { cause: err },
      );
    }
    throw err;
  }
  const refusals = streamRefusals(info.config, o.leaseSubjects);
  if (refusals.length > 0) {
    throw new Error(
      `Cannot create lease manager on stream '${o.stream}' as ${
        refusals.join("; ")
      }`,
    );
  }
  const replicas = info.config.num_replicas;
  const casCheck = replicas > 1 && !o.allowUnverifiedReplicas;
  const proof = await proveServers(
    nc,
    jsm,
    o.stream,
    setupTimeout,
    casCheck,
    "fenced",
  );
  if (proof.refuse !== undefined) {
    throw new Error(
      `Cannot create lease manager on stream '${o.stream}'. ${proof.refuse} Upgrade the servers, or pass allowUnverifiedReplicas: true if you know every server that may hold the stream`,
    );
  }
  if (proof.markers.life <= 0) {
    throw new RangeError(
      `Cannot create lease manager on stream '${o.stream}' as not every server holding it could be proven to run nats-server 2.11.2 or later, with the stream's markers`,
    );
  }
  if (o.signal?.aborted) throw abortReason(o.signal);
  const opsJsm = await jetstreamManager(nc, {
    timeout: o.timeout,
    checkAPI: false,
  });
  // A stream without allow_atomic refuses a commit at its first message,
  // which the port reports as a TypeError with nothing stored.
  const port = () =>
    natsPort(
      nc,
      jetstream(nc, { timeout: o.timeout }),
      opsJsm,
      o.stream,
      info.config.allow_direct === true,
      info.created,
      o.ttl,
      proof.markers,
      { pending: proof.pending, casCheck },
      true,
    );
  const subjects = streamLeaseSubjects(
    o.stream,
    o.leaseSubjects,
    info.config.subjects ?? [],
  );
  // The session is written now: a stream created just now may not be
  // routed yet (see whileUnrouted).
  return await whileUnrouted(
    () =>
      fencedManagerOnPort(
        port(),
        { ...o, markerLife: proof.markers.life },
        subjects,
      ),
    setupDeadline,
    o.signal,
  );
}
