import { createInbox, type Msg, type NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager, StreamInfo } from "@nats-io/jetstream";
import { isTimeout, within } from "./_nats.ts";
import { errText } from "./errors.ts";
import { MAX_BATCH } from "./port.ts";

// ---------------------------------------------------------------------------
// Replicated buckets: nats-server before 2.9.21 lets two compare-and-set
// updates of one revision both succeed on a stream with more than one
// replica (nats-server#4320). The fix is in the stream leader's write path
// and any replica can become leader, so every peer must run a fixed
// release, not only the server this client is connected to. An ordinary
// account can learn the peers from stream info (server names, no
// versions) and every server's version from the account-scoped
// `$SYS.REQ.ACCOUNT.PING.STATZ` with `{"include_unused":true}` (both on
// 2.9.10 and 2.15.2, whenever the server has a system account, which the
// default config creates). `$SYS.REQ.SERVER.PING.*` needs the system
// account; `nc.info` and `_nats.ver` describe one server only.

/** Account-scoped STATZ: every server of the cluster answers for itself. */
const STATZ_SUBJECT = "$SYS.REQ.ACCOUNT.PING.STATZ";
/** Without it only servers where this account has connections answer. */
const STATZ_BODY = JSON.stringify({ include_unused: true });
/**
 * The ping is sent again this often until every peer has answered: a ping
 * or an answer lost on a busy cluster would otherwise fail the whole check.
 */
const STATZ_RESEND_MS = 1_000;

type Triple = readonly [number, number, number];

/** The first release with the fix for nats-server#4320. */
const FIXED: Triple = [2, 9, 21];
/**
 * The fix reached the 2.10 branch in July 2023, during the 2.10.0 betas, so
 * a pre-release of 2.10.0 (or of 2.9.21) may lack it.
 */
const LAST_UNSURE_PRERELEASE: Triple = [2, 10, 0];

function compare(a: Triple, b: Triple): number {
  return a[0] - b[0] || a[1] - b[1] || a[2] - b[2];
}

function parseVersion(
  version: string,
): { v: Triple; pre: boolean } | undefined {
  const m = /^v?(\d+)\.(\d+)\.(\d+)(-[^\s+]+)?/.exec(version);
  return m === null ? undefined : {
    v: [Number(m[1]), Number(m[2]), Number(m[3])],
    pre: m[4] !== undefined,
  };
}

/**
 * Whether a server version string is a release with the fix: `2.9.21` or
 * later, where a pre-release of 2.9.21 or 2.10.0 does not count.
 */
export function casSafeVersion(version: string): boolean {
  const parsed = parseVersion(version);
  if (parsed === undefined || compare(parsed.v, FIXED) < 0) return false;
  return !parsed.pre || compare(parsed.v, LAST_UNSURE_PRERELEASE) > 0;
}

/** Of two versions reported under one server name, the one to judge by. */
function worseVersion(a: string, b: string): string {
  if (!casSafeVersion(a)) return a;
  if (!casSafeVersion(b)) return b;
  return compare(parseVersion(a)!.v, parseVersion(b)!.v) <= 0 ? a : b;
}

/** What one STATZ round learnt: the worst version seen per server name. */
interface Census {
  versions: Map<string, string>;
  /** Why the round ended before every peer answered, when it knows. */
  failure?: string;
}

/** The parts of a `$SYS` reply this check reads. */
interface ServerApiReply {
  server?: { name?: unknown; ver?: unknown };
}

/**
 * Sends an account-scoped STATZ ping, again each STATZ_RESEND_MS, and
 * gathers the replies until every name in `wanted` has answered or `ms` have
 * passed; with `enough`, also `settle` ms after the replies first satisfy
 * it, as long as `settle` says when it is first met (the servers that are up
 * answer within milliseconds; one that is down would hold the round for all
 * of `ms`). Never rejects.
 */
export function census(
  nc: NatsConnection,
  wanted: readonly string[],
  ms: number,
  enough?: {
    met(versions: ReadonlyMap<string, string>): boolean;
    settle(versions: ReadonlyMap<string, string>): number;
  },
  signal?: AbortSignal,
): Promise<Census> {
  const result: Census = { versions: new Map() };
  return new Promise<Census>((resolve) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    let settling: ReturnType<typeof setTimeout> | undefined;
    let resend: ReturnType<typeof setInterval> | undefined;
    let sub: { unsubscribe(): void } | undefined;
    let finished = false;
    const finish = (failure?: string): void => {
      if (finished) return;
      finished = true;
      if (failure !== undefined) result.failure = failure;
      clearTimeout(timer);
      clearTimeout(settling);
      clearInterval(resend);
      try {
        sub?.unsubscribe();
      } catch {
        // The connection closed meanwhile; nothing is left to release.
      }
      resolve(result);
    };
    const onReply = (msg: Msg): void => {
      if (msg.data.length === 0 && msg.headers?.code === 503) {
        finish(
          `no server answered ${STATZ_SUBJECT} (no responders: the account imports no system services, e.g. when the server runs without a system account)`,
        );
        return;
      }
      let reply: ServerApiReply;
      try {
        reply = msg.json<ServerApiReply>();
      } catch {
        return;
      }
      const name = reply.server?.name;
      const ver = reply.server?.ver;
      if (typeof name !== "string" || typeof ver !== "string") return;
      const seen = result.versions.get(name);
      result.versions.set(
        name,
        seen === undefined ? ver : worseVersion(seen, ver),
      );
      if (wanted.every((peer) => result.versions.has(peer))) {
        finish();
      } else if (
        enough !== undefined && settling === undefined &&
        enough.met(result.versions)
      ) {
        settling = setTimeout(() => finish(), enough.settle(result.versions));
      }
    };
    try {
      // The connection's own inbox prefix, when it has one, keeps the reply
      // subject inside what a restricted user may subscribe to.
      const prefix = (nc as { options?: { inboxPrefix?: string } }).options
        ?.inboxPrefix;
      const inbox = createInbox(prefix);
      sub = nc.subscribe(inbox, {
        callback: (err, msg) => {
          if (err !== null) {
            finish(`the reply subscription failed: ${err.message}`);
          } else {
            onReply(msg);
          }
        },
      });
      timer = setTimeout(() => finish(), Math.max(0, ms));
      const ping = (): void => {
        try {
          nc.publish(STATZ_SUBJECT, STATZ_BODY, { reply: inbox });
        } catch (err) {
          finish(`cannot send ${STATZ_SUBJECT}: ${errText(err)}`);
        }
      };
      resend = setInterval(ping, STATZ_RESEND_MS);
      signal?.addEventListener("abort", () => finish(), { once: true });
      ping();
    } catch (err) {
      finish(
        `cannot send ${STATZ_SUBJECT}: ${
          err instanceof Error ? err.message : String(err)
        }`,
      );
    }
  });
}

/** Pause between stream info reads while a new stream's peers are listed. */
const PEER_RETRY_MS = 50;

/**
 * Checks that every peer of a stream runs nats-server 2.9.21 or later, the
 * first release where compare-and-set on a replicated stream is safe
 * (nats-server#4320).
 *
 * Reads the peers (`cluster.leader` and `cluster.replicas[].name`) from
 * stream info, then asks every server for its version with the
 * account-scoped `$SYS.REQ.ACCOUNT.PING.STATZ` (body
 * `{"include_unused":true}`, sent again each second), gathering replies
 * until each peer has answered or the time is up. A stream with one
 * replica is always safe: a single-peer stream has no Raft group, and the
 * server checks the expected sequence under the stream lock.
 *
 * It fails closed: a peer that does not answer (offline, in a cluster this
 * account's requests do not reach, or a server without a system account)
 * makes the stream unproven, as does stream info that names fewer peers
 * than the configured replicas.
 *
 * What it cannot see: it is a snapshot. The meta leader may later give the
 * stream a peer that was not checked (replicas scaled up, a peer removed
 * and replaced, the stream moved by a placement change), and a checked
 * server may be restarted on an older binary under the same name. Re-run it
 * when the stream's peer set or leader changes, or periodically, to narrow
 * that window; no client-side check can close it.
 *
 * @param nc The connection to ask through.
 * @param jsm A JetStream manager on `nc` (its API prefix or domain is used
 * for stream info).
 * @param stream Stream name, e.g. `"KV_leases"`.
 * @param timeoutMs Upper bound, in milliseconds, for the whole check.
 * @returns `undefined` when every peer is proven to run 2.9.21 or later;
 * otherwise one sentence saying what could not be proven and why.
 *
 * @example Refuse a replicated bucket on old servers
 * ```ts ignore
 * const why = await unsafeReplicaReason(nc, jsm, "KV_leases", 2_000);
 * if (why !== undefined) throw new Error(why);
 * ```
 */
export async function unsafeReplicaReason(
  nc: NatsConnection,
  jsm: JetStreamManager,
  stream: string,
  timeoutMs: number,
): Promise<string | undefined> {
  const deadline = performance.now() + timeoutMs;
  const left = (): number => Math.max(0, deadline - performance.now());
  const subject =
    `Cannot prove that every peer of stream '${stream}' runs nats-server 2.9.21 or later, which compare-and-set on a replicated stream needs (nats-server#4320)`;
  const peers = await readPeers(jsm, stream, left);
  if (typeof peers === "string") return `${subject}: ${peers}`;
  const { info, unique, replicas } = peers;
  if (replicas <= 1 && unique.length <= 1) return undefined;
  if (unique.length < replicas) {
    return `${subject}: ${namesTooFew(info, unique, replicas)}`;
  }

  const budget = left();
  const { versions, failure } = await census(nc, unique, budget);
  const problems: string[] = [];
  const unseen: string[] = [];
  for (const peer of unique) {
    const ver = versions.get(peer);
    const label = peer === info.cluster?.leader ? `${peer} (leader)` : peer;
    if (ver === undefined) unseen.push(label);
    else if (!casSafeVersion(ver)) problems.push(`${label} runs ${ver}`);
  }
  if (unseen.length > 0) {
    problems.push(
      `${unseen.join(", ")} ${
        unseen.length === 1 ? "is" : "are"
      } not visible to this account (${
        failure ??
          `no answer to ${STATZ_SUBJECT} within ${Math.round(budget)} ms`
      })`,
    );
  }
  return problems.length === 0
    ? undefined
    : `${subject}: ${problems.join("; ")}.`;
}

/**
 * Whether `version` is release `first` or later; a pre-release of `first`
 * itself does not count.
 */
function releaseAtLeast(version: string, first: Triple): boolean {
  const parsed = parseVersion(version);
  if (parsed === undefined) return false;
  const c = compare(parsed.v, first);
  return c > 0 || (c === 0 && !parsed.pre);
}

/** The first release whose markers are right for TTL expiries and in clusters. */
const MARKERS_FIXED: Triple = [2, 11, 2];

/** Whether a server version has trustworthy subject delete markers. */
export function markersVersion(version: string): boolean {
  return releaseAtLeast(version, MARKERS_FIXED);
}

/**
 * The first release that checks a publish against another subject's last
 * sequence (`Nats-Expected-Last-Subject-Sequence-Subject`); before it the
 * header is ignored and the check made against the publish's own subject
 * (nats-kv-facts.md §12).
 */
const FENCE_FIRST: Triple = [2, 11, 0];

/** Whether a server version honours a fence (the check on another subject). */
export function fenceVersion(version: string): boolean {
  return releaseAtLeast(version, FENCE_FIRST);
}

/** The first release that commits a batch atomically (`allow_atomic`). */
const ATOMIC_FIRST: Triple = [2, 12, 0];

/** Whether a server version commits an atomic batch all or nothing. */
export function atomicVersion(version: string): boolean {
  return releaseAtLeast(version, ATOMIC_FIRST);
}

/**
 * Why both ports refuse a fenced commit before sending it: an empty batch,
 * one above the server's limit, or a server before 2.12; `undefined` when
 * it may go.
 */
export function uncommittable(
  count: number,
  version: string,
): RangeError | undefined {
  if (!Number.isInteger(count) || count < 1 || count > MAX_BATCH) {
    return new RangeError(
      `Cannot commit a batch of ${count} messages: a batch holds 1 to ${MAX_BATCH}`,
    );
  }
  if (!atomicVersion(version)) {
    return new RangeError(
      `Cannot commit an atomic batch as the server runs nats-server ${
        version || "of an unknown version"
      }: atomic batches need 2.12 or later, and an older server stores each message on its own`,
    );
  }
  return undefined;
}

/**
 * The error both ports reject a fenced write with, before sending it, on a
 * server that does not honour the fence.
 */
export function unfencedServer(subject: string, version: string): RangeError {
  return new RangeError(
    `Cannot publish a fenced write to '${subject}' as the server runs nats-server ${
      version || "of an unknown version"
    }: the check on another subject (Nats-Expected-Last-Subject-Sequence-Subject) needs 2.11 or later, and an older server ignores it`,
  );
}

/**
 * The error both ports reject a write with a TTL of its own (a session's
 * entry) with, before sending it, on a server without markers for such
 * expiries: before 2.11 the `Nats-TTL` header is ignored (the entry would
 * never expire), and before 2.11.2 its expiry leaves no marker
 * (nats-server#6741), so nobody watching would see the session end.
 *
 * @param subject Where the write was to go.
 * @param version The server's version.
 * @returns The error, or `undefined` when the server honours it.
 */
export function untimedServer(
  subject: string,
  version: string,
): RangeError | undefined {
  if (markersVersion(version)) return undefined;
  return new RangeError(
    `Cannot write an entry with its own TTL to '${subject}' as the server runs nats-server ${
      version || "of an unknown version"
    }: a per-message TTL (Nats-TTL) that expires into a marker needs 2.11.2 or later, and an older server ignores it or leaves no marker`,
  );
}

/**
 * A marker whose own TTL governs (not the max age) was seen to vanish up
 * to 5 ms before its TTL had run from its timestamp; this much is taken
 * off its life.
 */
const MARKER_EARLY_MARGIN = 50;

/**
 * What start-up proved about markers: how long they live (0: not proven),
 * and the servers holding the stream whose versions were checked then.
 */
export interface MarkerProof {
  life: number;
  /** Grows when a peer that was down at start-up is proven later. */
  peers: Set<string>;
}

/**
 * The marker life a stream's configuration gives: the max age when the
 * marker TTL is longer (the max-age path, never early), else the marker
 * TTL in whole seconds less a margin; 0 without markers. The simulator's
 * bucket proves its markers with this same rule.
 *
 * @param markerTtlMs The stream's subject delete marker TTL, in ms (0: none).
 * @param maxAgeMs The stream's max age, in ms (0: none).
 * @returns The marker life, in ms.
 */
export function markerLifeOf(markerTtlMs: number, maxAgeMs: number): number {
  const markerMs = Math.floor(markerTtlMs / 1000) * 1000;
  if (!(markerMs > 0) || !(maxAgeMs > 0)) return 0;
  const life = markerMs > maxAgeMs ? maxAgeMs : markerMs - MARKER_EARLY_MARGIN;
  return life > 0 ? life : 0;
}

/** {@linkcode markerLifeOf} for a stream's configuration, as stream info gives it. */
function configuredMarkerLife(info: StreamInfo): number {
  const cfg = info.config as {
    max_age?: number;
    subject_delete_marker_ttl?: number;
  };
  return markerLifeOf(
    (cfg.subject_delete_marker_ttl ?? 0) / 1e6,
    (cfg.max_age ?? 0) / 1e6,
  );
}

/**
 * The marker life of a fenced bucket's stream (`wantMarkers: "fenced"`):
 * it has no max age, so a session entry's own TTL expires it, and the
 * marker TTL governs. Proven like a classic bucket's markers, this says
 * every server holding the stream runs 2.11.2 or later: the release whose
 * per-message TTLs leave markers, which also checks a fenced write's
 * subject (2.11).
 */
function fencedMarkerLife(info: StreamInfo): number {
  const cfg = info.config as { subject_delete_marker_ttl?: number };
  return markerLifeOf((cfg.subject_delete_marker_ttl ?? 0) / 1e6, Infinity);
}

/** The servers stream info names as holding the stream. */
function streamPeers(info: StreamInfo): string[] {
  return [
    info.cluster?.leader,
    ...(info.cluster?.replicas ?? []).map((r) => r.name),
  ].filter((name): name is string => typeof name === "string" && name !== "");
}

/** Whether only the server this connection is on holds the stream. */
function heldHere(nc: NatsConnection, peers: readonly string[]): boolean {
  return peers.length === 0 ||
    (peers.length === 1 && peers[0] === nc.info?.server_name);
}

/**
 * After a quorum of a replicated stream's peers (the leader among them)
 * has answered the start-up census, how long the others get: servers that
 * are up answer within milliseconds, and one that is down (a rolling
 * restart) would otherwise hold set-up for its whole budget.
 */
const QUORUM_SETTLE_MS = 300;

/**
 * A replica the leader has not heard from for this long counts as down:
 * two of the Raft heartbeats it sends each second (measured on 2.15.2: an
 * idle replica's `active` climbs to about 1 s, then falls back), so one
 * beat late on a loaded machine still counts as up.
 */
const DOWN_AFTER_MS = 2_000;

/** How long the others get after a quorum when no peer looks down. */
const LATE_ANSWER_MS = 2_000;

/**
 * What start-up proved of the servers holding the bucket's stream: why it
 * must be refused (compare-and-set is not proven safe on it), the marker
 * proof, and the peers that did not answer in time, which the port checks
 * when they appear (`watchLatePeers`).
 */
interface ServerProof {
  refuse: string | undefined;
  markers: MarkerProof;
  pending: string[];
}

/**
 * Start-up's check of the servers holding the bucket's stream, for two
 * proofs at once: that compare-and-set is safe on it (`casCheck`, a
 * replicated stream whose every peer must run 2.9.21 or later,
 * nats-server#4320) and how long it keeps markers (its configuration, and
 * 2.11.2 or later on every server holding it; with `wantMarkers:
 * "fenced"`, of a fenced bucket's stream). Never rejects.
 *
 * A replicated stream is accepted once its leader and a quorum of its
 * peers answered with safe versions and no answering peer runs an unsafe
 * one; a peer that did not answer (down, restarting) is left `pending`.
 * That is enough for now: #4320 is in the leader's write path, and a peer
 * that is down leads nothing; before it can lead again it must be up, and
 * then it answers the port's census within a second (the assumption
 * about the server, in the safety argument). Markers are proven only for the peers that answered;
 * each grace decision checks the stream's peers again (currentMarkerLife).
 */
export async function proveServers(
  nc: NatsConnection,
  jsm: JetStreamManager,
  stream: string,
  timeoutMs: number,
  casCheck: boolean,
  wantMarkers: boolean | "fenced",
): Promise<ServerProof> {
  const unproven = (): MarkerProof => ({ life: 0, peers: new Set() });
  const deadline = performance.now() + timeoutMs;
  const left = (): number => Math.max(0, deadline - performance.now());
  const subject =
    `Cannot prove that a quorum of the peers of stream '${stream}', its leader among them, runs nats-server 2.9.21 or later, which compare-and-set on a replicated stream needs (nats-server#4320)`;
  const peers = await readPeers(jsm, stream, left);
  if (typeof peers === "string") {
    return {
      refuse: casCheck ? `${subject}: ${peers}` : undefined,
      markers: unproven(),
      pending: [],
    };
  }
  const { info, unique, replicas } = peers;
  const single = replicas <= 1 && unique.length <= 1;
  if (!single && unique.length < replicas) {
    return {
      refuse: casCheck
        ? `${subject}: ${namesTooFew(info, unique, replicas)}`
        : undefined,
      markers: unproven(),
      pending: [],
    };
  }
  const life = wantMarkers === "fenced"
    ? fencedMarkerLife(info)
    : wantMarkers
    ? configuredMarkerLife(info)
    : 0;
  if (single) {
    // One peer: compare-and-set is safe (no Raft group; the expected
    // sequence is checked under the stream lock). Markers need its version.
    if (life <= 0) {
      return { refuse: undefined, markers: unproven(), pending: [] };
    }
    if (heldHere(nc, unique)) {
      return {
        refuse: undefined,
        markers: markersVersion(nc.info?.version ?? "")
          ? { life, peers: new Set(unique) }
          : unproven(),
        pending: [],
      };
    }
  }
  if (!casCheck && life <= 0) {
    return { refuse: undefined, markers: unproven(), pending: [] };
  }
  let leader = info.cluster?.leader;
  const quorum = Math.floor(replicas / 2) + 1;
  const budget = left();
  // Stream info's `active` (nanoseconds since the leader last heard from a
  // replica) tells a peer that is down from one slow to answer. Once a
  // quorum has answered, the peers still silent in the census get just
  // QUORUM_SETTLE_MS more when each of them has also been silent to the
  // leader that long (down); when any of them looks up, up to
  // LATE_ANSWER_MS, so a loaded machine still proves them all here. Judged
  // per missing peer: on a loaded cluster one replica's heartbeat (each
  // second) can run late while the one that is slow to answer is another,
  // and CI once saw that cost a never-used key its one-round-trip write.
  const silentFor = new Map(
    (info.cluster?.replicas ?? []).map((r) => [r.name, (r.active ?? 0) / 1e6]),
  );
  const { versions, failure } = await census(nc, unique, budget, {
    met: (seen) =>
      (leader === undefined || seen.has(leader)) &&
      unique.filter((p) => seen.has(p)).length >= quorum,
    settle: (seen) =>
      unique.every((p) =>
          seen.has(p) || (silentFor.get(p) ?? 0) > DOWN_AFTER_MS
        )
        ? QUORUM_SETTLE_MS
        : LATE_ANSWER_MS,
  });
  const answered = unique.filter((p) => versions.has(p));
  const pending = unique.filter((p) => !versions.has(p));
  if (
    casCheck && !single && leader === undefined &&
    answered.every((p) => casSafeVersion(versions.get(p)!))
  ) {
    // A stream electing a leader (its leader just killed): nothing to
    // refuse yet, so wait for one to be named, and judge by it.
    leader = await electedLeader(jsm, stream, left);
  }
  let refuse: string | undefined;
  if (casCheck && !single) {
    const label = (p: string) => p === leader ? `${p} (leader)` : p;
    const problems = answered.filter((p) => !casSafeVersion(versions.get(p)!))
      .map((p) => `${label(p)} runs ${versions.get(p)}`);
    const missing = leader === undefined
      ? "it has no leader"
      : !versions.has(leader)
      ? `its leader ${leader} is not visible to this account`
      : answered.length < quorum
      ? `only ${answered.join(", ")} of its ${replicas} peers answered`
      : undefined;
    if (missing !== undefined) {
      problems.push(
        `${missing} (${
          failure ??
            `no answer to ${STATZ_SUBJECT} within ${Math.round(budget)} ms`
        })`,
      );
    }
    if (problems.length > 0) refuse = `${subject}: ${problems.join("; ")}.`;
  }
  const markers = life > 0 && answered.length > 0 &&
      answered.every((p) => markersVersion(versions.get(p)!))
    ? { life, peers: new Set(answered) }
    : unproven();
  return { refuse, markers, pending };
}

/**
 * Reads a stream's peers from its stream info, again while a stream
 * created a moment ago does not list them all yet; a sentence when stream
 * info cannot be read.
 */
async function readPeers(
  jsm: JetStreamManager,
  stream: string,
  left: () => number,
): Promise<
  { info: StreamInfo; unique: string[]; replicas: number } | string
> {
  for (;;) {
    let info: StreamInfo;
    try {
      info = await within(jsm.streams.info(stream), left(), "stream info");
    } catch (err) {
      // Unanswered (a leader election drops requests): ask again.
      if (isTimeout(err) && left() >= 2 * PEER_RETRY_MS) continue;
      return `cannot read its stream info: ${errText(err)}.`;
    }
    const replicas = info.config.num_replicas ?? 1;
    const unique = [...new Set(streamPeers(info))];
    // A stream created a moment ago may not list every peer or a leader
    // yet; read again while the budget allows rather than refuse a bucket
    // that is still forming. Fewer names only ever makes the check fail, so
    // waiting for them cannot let an unproven peer through.
    if (
      (replicas <= 1 && unique.length <= 1) || unique.length >= replicas ||
      left() < 2 * PEER_RETRY_MS
    ) {
      return { info, unique, replicas };
    }
    await new Promise((r) => setTimeout(r, PEER_RETRY_MS));
  }
}

/**
 * Reads stream info again until it names a leader or the budget is spent;
 * the leader's name, if one was named.
 */
async function electedLeader(
  jsm: JetStreamManager,
  stream: string,
  left: () => number,
): Promise<string | undefined> {
  while (left() >= 2 * PEER_RETRY_MS) {
    await new Promise((r) => setTimeout(r, PEER_RETRY_MS));
    try {
      const info = await within(
        jsm.streams.info(stream),
        left(),
        "stream info",
      );
      if (info.cluster?.leader) return info.cluster.leader;
    } catch {
      // Unanswered during the election: ask again.
    }
  }
  return undefined;
}

/** Says that stream info names fewer peers than the stream's replicas. */
function namesTooFew(
  info: StreamInfo,
  unique: readonly string[],
  replicas: number,
): string {
  return `its stream info names ${unique.length} of its ${replicas} peers (${
    unique.length === 0 ? "none" : unique.join(", ")
  }${
    info.cluster?.leader ? "" : "; it has no leader"
  }), so the others cannot be checked.`;
}

/**
 * The marker life stream info read just now proves, for a manager whose
 * start-up proved `proven`: the configuration as it is now (an edit may
 * have removed or shortened the marker TTL), and the servers as they are
 * now: the one this connection is on, when it alone holds the stream, must
 * run 2.11.2 or later by the version it announced on this connection
 * (after a reconnect, that of the server it reconnected to); otherwise
 * every server holding the stream must be one whose version start-up
 * checked. 0 when unproven.
 */
export function currentMarkerLife(
  info: StreamInfo,
  nc: NatsConnection,
  proven: MarkerProof,
): number {
  if (proven.life <= 0) return 0;
  const life = configuredMarkerLife(info);
  if (life <= 0) return 0;
  const peers = streamPeers(info);
  if (heldHere(nc, peers)) {
    return markersVersion(nc.info?.version ?? "") ? life : 0;
  }
  // A peer not proven (down at start-up, and not yet seen since) does not
  // count once it has been silent for longer than a marker lives: whatever
  // it did while it ran (expire a key without a marker, as a release before
  // 2.11.2 would) is older than the life this proof vouches for, and while
  // it stays silent it leads nothing. Stream info's `active` is the time
  // since the leader last heard from it (measured: it grows from the kill
  // on, and `current` stays true for seconds after), in nanoseconds.
  const silentFor = new Map(
    (info.cluster?.replicas ?? []).map((r) => [r.name, (r.active ?? 0) / 1e6]),
  );
  return peers.every((p) =>
      proven.peers.has(p) ||
      (p !== info.cluster?.leader && (silentFor.get(p) ?? 0) > life)
    )
    ? life
    : 0;
}
