/**
 * `lease ls` and the prefix/bucket-wide `lease watch`: every key's last
 * entry in one pass of a consumer over the bucket's stream (last message
 * per subject), never one read per key. Used by cli/views.ts.
 *
 * A KV `watch()` would hide the headers that tell a lease manager's clean
 * release (a delete tagged with its `Nats-Msg-Id`) from anyone else's delete,
 * and a server's expiry marker (`Nats-Marker-Reason`) from a purge; so this
 * reads the stream's messages with their headers, as lease.ts does.
 *
 * On a fenced bucket (design/fenced.md, "Layout") a lease is its tenure
 * entry, `_lease.k.<key>`, which no renewal touches: the holder's session
 * entry, `_lease.s.<id>` (named by the tenure entry's tag), is what is
 * renewed and what expires. So both are read, in the same pass, and a
 * tenure whose session is over is `orphaned`. Data keys (any other key of
 * the bucket) and session entries are never listed as leases.
 *
 * Leases kept in a stream of the user's (`--stream NAME --lease-subjects
 * PREFIX`, lease/stream.ts) are read the same way: their tenure entries
 * are `PREFIX.k.<key>`, their sessions `PREFIX.s.<id>`, and the stream's
 * other messages (the appends) are never listed. Such a stream records no
 * lease TTL: a session's life is its entry's own `Nats-TTL`.
 *
 * @module
 */

import type { MsgHdrs, NatsConnection } from "@nats-io/nats-core";
import { nanos } from "@nats-io/nats-core";
import {
  AckPolicy,
  type Consumer,
  type ConsumerMessages,
  DeliverPolicy,
  jetstream,
  JetStreamApiCodes,
  JetStreamApiError,
  type JetStreamManager,
  jetstreamManager,
  type JsMsg,
  type StreamInfo,
} from "@nats-io/jetstream";
import { rawEntry } from "../lease/_nats.ts";
import { toSeen } from "../lease/entry.ts";
import { fencedTtl, SESSION_PREFIX, TENURE_PREFIX } from "./fenced.ts";
import { streamRefusal } from "./stream.ts";

/** Leases kept in a stream of the user's: `--stream`, `--lease-subjects`. */
export interface StreamPlace {
  /** The stream. */
  readonly stream: string;
  /** The subject prefix the leases live under in it. */
  readonly leaseSubjects: string;
}

/** Where the leases are: a bucket's name, or a stream of the user's. */
export type Place = string | StreamPlace;

/**
 * What a key's last entry says:
 * - `held`: a holder's entry, renewed less than a TTL ago;
 * - `released`: a lease manager's clean release (a delete it tagged);
 * - `expired`: a holder's entry a TTL or more old that the server still
 *   shows (expiry is late), or the server's `MaxAge` expiry marker;
 * - `removed`: any other delete or purge (`lease release`, `kv.delete`,
 *   `kv.purge`), or a server marker of another reason;
 * - `orphaned` (fenced buckets only): a tenure entry whose holder's
 *   session is over (its entry expired, deleted or never there, or past
 *   its TTL): the next node to ask takes the key at once.
 */
export type KeyState =
  | "held"
  | "released"
  | "expired"
  | "removed"
  | "orphaned";

/** One key of the bucket, as `lease ls` prints it. */
export interface KeyRow {
  /** The key (without the bucket's subject prefix). */
  readonly key: string;
  /** What its last entry says. */
  readonly state: KeyState;
  /** The holder's node id (`held` and a holder's `expired` entry), else null. */
  readonly holder: string | null;
  /** The holder's fencing epoch (as `lease holder` prints it), else null. */
  readonly epoch: number | null;
  /** The KV revision of the last entry (a renewal moves it, not the epoch). */
  readonly revision: number;
  /** Milliseconds since the server stored the last entry (its last renewal). */
  readonly renewedAgoMs: number;
  /**
   * Milliseconds until a holder's entry reaches the bucket's TTL (negative
   * once past it); null for a marker or a bucket without a TTL.
   */
  readonly expiresInMs: number | null;
  /**
   * Fenced buckets only: the id of the session the tenure entry names
   * (null when it names none).
   */
  readonly session?: string | null;
}

/** A message of the bucket's stream, as a row is made from it. */
export interface StoredMsg {
  readonly seq: number;
  readonly headers: MsgHdrs | undefined;
  readonly data: Uint8Array;
  /** The server's timestamp, ms since the epoch. */
  readonly time: number;
}

/** The bucket's stream name. */
function streamOf(bucket: string): string {
  return `KV_${bucket}`;
}

/**
 * Reads a key's last message into a row, as the lease manager reads an
 * entry (`toSeen` in lease/entry.ts): the same headers, the same epoch.
 *
 * @param key The key.
 * @param m The message: its revision, headers, body and server timestamp (ms).
 * @param now The server's time now, in ms since the epoch.
 * @param ttl The bucket's TTL in ms (0: none).
 * @returns The row.
 */
export function rowOf(
  key: string,
  m: StoredMsg,
  now: number,
  ttl: number,
): KeyRow {
  // The classification the manager itself decides by (lease/entry.ts).
  const seen = toSeen(rawEntry(m.seq, m.headers, m.data));
  const age = Math.max(0, now - m.time);
  const base = { key, revision: m.seq, renewedAgoMs: Math.round(age) };
  if (seen.kind !== "put") {
    return {
      ...base,
      state: seen.kind,
      holder: null,
      epoch: null,
      expiresInMs: null,
    };
  }
  const left = ttl > 0 ? Math.round(ttl - age) : null;
  return {
    ...base,
    state: left !== null && left <= 0 ? "expired" : "held",
    holder: seen.node,
    epoch: seen.epoch,
    expiresInMs: left,
  };
}

/**
 * The session id a fenced tenure entry names: the instance of its tag
 * (`lease:<session>:<epoch>:<counter>`, lease/entry.ts).
 */
export function sessionOf(m: StoredMsg): string | undefined {
  return toSeen(rawEntry(m.seq, m.headers, m.data)).instance;
}

/**
 * Reads a fenced bucket's tenure entry into a row, with the last message of
 * the session it names (`undefined`: none). Held while that session's last
 * entry is a put younger than its TTL (the lease TTL in whole seconds, as
 * its `Nats-TTL` says); `renewedAgoMs` and `expiresInMs` are then the
 * session's, since the session's renewals keep the key. Anything else of
 * the session (expired, deleted, never there) makes the tenure `orphaned`.
 *
 * @param key The lease key (without `_lease.k.`).
 * @param tenure The tenure entry's last message.
 * @param session The last message of the session it names, if any.
 * @param now The server's time now, in ms since the epoch.
 * @param ttl The bucket's lease TTL in ms.
 * @returns The row.
 *
 * @example
 * ```ts ignore
 * const row = fencedRowOf("orders", tenureMsg, sessionMsg, Date.now(), 2000);
 * if (row.state === "orphaned") console.log(`${row.key}: free to take`);
 * ```
 */
export function fencedRowOf(
  key: string,
  tenure: StoredMsg,
  session: StoredMsg | undefined,
  now: number,
  ttl: number,
): KeyRow {
  const seen = toSeen(rawEntry(tenure.seq, tenure.headers, tenure.data));
  const age = Math.round(Math.max(0, now - tenure.time));
  const base = { key, revision: tenure.seq, session: seen.instance ?? null };
  if (seen.kind !== "put") {
    return {
      ...base,
      state: seen.kind,
      holder: null,
      epoch: null,
      renewedAgoMs: age,
      expiresInMs: null,
    };
  }
  const held = { ...base, holder: seen.node, epoch: seen.epoch };
  const s = session === undefined
    ? undefined
    : toSeen(rawEntry(session.seq, session.headers, session.data));
  if (s?.kind !== "put") {
    return { ...held, state: "orphaned", renewedAgoMs: age, expiresInMs: null };
  }
  const sessionAge = Math.max(0, now - session!.time);
  // A stream records no lease TTL (ttl 0): the session entry's own says.
  const life = ttl > 0
    ? Math.ceil(ttl / 1000) * 1000
    : messageTtl(session!.headers);
  if (life === undefined) {
    // Its expiry's marker will say when it is over.
    return {
      ...held,
      state: "held",
      renewedAgoMs: Math.round(sessionAge),
      expiresInMs: null,
    };
  }
  const left = Math.round(life - sessionAge);
  return {
    ...held,
    state: left > 0 ? "held" : "orphaned",
    renewedAgoMs: Math.round(sessionAge),
    expiresInMs: left,
  };
}

/**
 * A message's own TTL in ms, from its `Nats-TTL` header (`2s`, or whole
 * seconds); `undefined` when it has none that says one.
 */
export function messageTtl(headers: MsgHdrs | undefined): number | undefined {
  const m = /^(\d+)(s|m|h)?$/.exec(headers?.get("Nats-TTL") ?? "");
  if (m === null) return undefined;
  const unit = m[2] === "h" ? 3_600_000 : m[2] === "m" ? 60_000 : 1_000;
  const ms = Number(m[1]) * unit;
  return ms > 0 ? ms : undefined;
}

/** The bucket's TTL, and the server's clock as far as it tells it. */
export interface BucketView {
  /** The stream of the bucket (or the user's stream that holds the leases). */
  readonly stream: string;
  /** What messages call it: `bucket 'NAME'` or `stream 'NAME'`. */
  readonly name: string;
  /**
   * The subject prefix of the lease entries: `$KV.<bucket>.`, a fenced
   * bucket's `$KV.<bucket>._lease.k.`, or a stream's `<leaseSubjects>.k.`.
   */
  readonly keys: string;
  /** Fenced: the subject prefix of the sessions' entries. */
  readonly sessions?: string;
  /**
   * The bucket's TTL in ms: its max age, or a fenced bucket's lease TTL
   * from its metadata; 0 when it has none (a stream: each session's
   * entry says its own).
   */
  readonly ttl: number;
  /** Whether the bucket is fenced (its stream metadata says so). */
  readonly fenced: boolean;
  /**
   * The server's time now, in ms since the epoch: the time its stream info
   * reported (servers 2.10 and later) moved on by the monotonic clock, else
   * this machine's clock.
   */
  now(): number;
}

/**
 * Reads the bucket's stream info: its TTL and the server's clock.
 *
 * @param jsm The JetStream manager.
 * @param bucket The bucket.
 * @returns What `lease ls` needs of it.
 * @throws {JetStreamApiError} The stream does not exist (`JetStreamApiCodes.StreamNotFound`), or another refusal.
 */
export async function viewBucket(
  jsm: JetStreamManager,
  bucket: string,
): Promise<BucketView> {
  const stream = streamOf(bucket);
  const { si, now } = await timedInfo(jsm, stream);
  const fenced = fencedTtl(si.config.metadata);
  return {
    stream,
    name: `bucket '${bucket}'`,
    keys: `$KV.${bucket}.${fenced !== undefined ? TENURE_PREFIX : ""}`,
    ...(fenced !== undefined
      ? { sessions: `$KV.${bucket}.${SESSION_PREFIX}` }
      : {}),
    ttl: fenced ?? Math.round(si.config.max_age / 1_000_000),
    fenced: fenced !== undefined,
    now,
  };
}

/**
 * Reads a stream's info, and the server's clock from it: the time its
 * answer was stamped with (servers 2.10 and later), moved on by the
 * monotonic clock; else this machine's clock.
 */
async function timedInfo(
  jsm: JetStreamManager,
  stream: string,
): Promise<{ si: StreamInfo; now: () => number }> {
  const t0 = performance.now();
  const si = await jsm.streams.info(stream);
  const t1 = performance.now();
  const ts = Date.parse((si as { ts?: string }).ts ?? "");
  // The server stamped its answer somewhere in the round trip: its middle.
  const offset = Number.isFinite(ts) ? ts - (t0 + t1) / 2 : undefined;
  return {
    si,
    now: () => offset === undefined ? Date.now() : offset + performance.now(),
  };
}

/**
 * Reads the info of a stream of the user's that holds leases: its
 * subjects must cover the tenure entries (else a `UsageError` says so).
 *
 * @param jsm The JetStream manager.
 * @param at The stream and the leases' subject prefix.
 * @returns What `lease ls` needs of it.
 * @throws {JetStreamApiError} The stream does not exist (`JetStreamApiCodes.StreamNotFound`), or another refusal.
 */
export async function viewStream(
  jsm: JetStreamManager,
  at: StreamPlace,
): Promise<BucketView> {
  const { si, now } = await timedInfo(jsm, at.stream);
  streamRefusal(si.config, at.stream, at.leaseSubjects);
  return {
    stream: at.stream,
    name: `stream '${at.stream}'`,
    keys: `${at.leaseSubjects}.k.`,
    sessions: `${at.leaseSubjects}.s.`,
    ttl: 0,
    fenced: true,
    now,
  };
}

/** The view of `at`: a bucket's, or a stream's. */
function viewOf(jsm: JetStreamManager, at: Place): Promise<BucketView> {
  return typeof at === "string" ? viewBucket(jsm, at) : viewStream(jsm, at);
}

function msgOf(m: JsMsg): StoredMsg {
  return {
    seq: m.seq,
    headers: m.headers,
    data: m.data,
    time: Math.floor(Number(m.info.timestampNanos) / 1_000_000),
  };
}

/**
 * Which keys a listing or watch covers: those below `prefix` (every key
 * when undefined), or with `exact` the one key `prefix` names.
 */
interface Scope {
  readonly prefix: string | undefined;
  readonly exact?: boolean;
}

/**
 * Where a bucket's leases are, as stream subjects: the filter of their
 * entries, the prefix to strip from a subject to get the key, and on a
 * fenced bucket the filter of the sessions too.
 */
function leaseSubjects(
  view: BucketView,
  scope: Scope,
): { filter: string; skip: number; sessions?: string } {
  const base = view.keys;
  const filter = scope.exact
    ? `${base}${scope.prefix}`
    : scope.prefix === undefined
    ? `${base}>`
    : `${base}${scope.prefix}.>`;
  return view.sessions !== undefined
    ? {
      filter,
      skip: base.length,
      sessions: `${view.sessions}>`,
    }
    : { filter, skip: base.length };
}

/** How long a listing may go without a message before it gives up. */
const STALL_MS = 5_000;

/**
 * Lists every key of the bucket below `prefix` (`prefix.<anything>`; every
 * key when undefined), sorted: one ephemeral consumer that delivers the
 * last message of each subject, read until it reports nothing pending, then
 * deleted; then the stream's subject list, against which a key written
 * while we read and so missed is read by itself. On a fenced bucket the
 * keys are the leases' tenure entries, read with their sessions' entries in
 * the same pass (see the module's description).
 *
 * @param nc The connection.
 * @param bucket The bucket, or the stream of the user's that holds the
 *   leases.
 * @param prefix A valid key, or undefined for the whole bucket.
 * @param domain The JetStream domain of the bucket, or undefined for the
 *   connected server's own (never with a stream).
 * @param exact List only the key `prefix` names (`lease holder` on a
 *   fenced bucket).
 * @returns The rows, sorted by key.
 * @throws {JetStreamApiError} The bucket does not exist (`JetStreamApiCodes.StreamNotFound`), or another refusal.
 * @throws {Error} The server went quiet for 5 s in the middle of the listing.
 */
export async function listKeys(
  nc: NatsConnection,
  bucket: Place,
  prefix: string | undefined,
  domain?: string,
  exact = false,
): Promise<KeyRow[]> {
  const at = domain === undefined ? {} : { domain };
  const jsm = await jetstreamManager(nc, at);
  const view = await viewOf(jsm, bucket);
  const where = leaseSubjects(view, { prefix, exact });
  const last = await lastPerSubject(nc, jsm, view, where, at);
  // A key written while we read can be missed: the write removes the last
  // message the consumer was to deliver (history 1), and the server may
  // report nothing pending before it delivers the new one (seen on 2.9.10
  // with a holder renewing during the listing). The stream's subject list
  // names every key in one request; a key missing from what we read is read
  // by itself, which is rare.
  const si = await jsm.streams.info(view.stream, {
    subjects_filter: where.filter,
  });
  const read = (subject: string) =>
    readLast(jsm, view.stream, subject).then((m) => {
      if (m !== undefined) last.set(subject, m);
    });
  for (const subject of Object.keys(si.state.subjects ?? {})) {
    if (!last.has(subject)) await read(subject);
  }
  const now = view.now();
  const rows: KeyRow[] = [];
  for (const [subject, m] of last) {
    if (where.sessions !== undefined && !subject.startsWith(prefixOf(where))) {
      continue; // a session's entry: not a lease
    }
    const key = subject.slice(where.skip);
    if (!view.fenced) {
      rows.push(rowOf(key, m, now, view.ttl));
      continue;
    }
    // A session the pass did not deliver (written while we read): read it.
    const id = sessionOf(m);
    const sessionSubject = `${view.sessions}${id}`;
    if (id !== undefined && !last.has(sessionSubject)) {
      await read(sessionSubject);
    }
    rows.push(
      fencedRowOf(
        key,
        m,
        id === undefined ? undefined : last.get(sessionSubject),
        now,
        view.ttl,
      ),
    );
  }
  return rows.sort((a, b) => a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
}

/** The subject prefix of the keys a listing or watch covers. */
function prefixOf(where: { filter: string; skip: number }): string {
  return where.filter.slice(0, where.skip);
}

/** A subject's last message read by itself; undefined when it has none. */
async function readLast(
  jsm: JetStreamManager,
  stream: string,
  subject: string,
): Promise<StoredMsg | undefined> {
  try {
    const sm = await jsm.streams.getMessage(stream, { last_by_subj: subject });
    if (sm === null) return undefined;
    return {
      seq: sm.seq,
      headers: sm.header,
      data: sm.data,
      time: sm.time.getTime(),
    };
  } catch {
    // Gone since (expired or purged): not listed, as if read a moment later.
    return undefined;
  }
}

/**
 * The last message of every subject `where` covers (and of every session,
 * on a fenced bucket), by subject, from one ephemeral consumer.
 */
async function lastPerSubject(
  nc: NatsConnection,
  jsm: JetStreamManager,
  view: BucketView,
  where: { filter: string; sessions?: string },
  at: { domain?: string },
): Promise<Map<string, StoredMsg>> {
  const ci = await jsm.consumers.add(view.stream, {
    ack_policy: AckPolicy.None,
    deliver_policy: DeliverPolicy.LastPerSubject,
    // Two filters only on a fenced bucket: its servers (2.11.2+) take
    // them, and a 2.9 server would not.
    ...(where.sessions === undefined
      ? { filter_subject: where.filter }
      : { filter_subjects: [where.filter, where.sessions] }),
    mem_storage: true,
    inactive_threshold: nanos(30_000),
  });
  const last = new Map<string, StoredMsg>();
  try {
    if (ci.num_pending > 0) {
      const c = await jetstream(nc, at).consumers.get(view.stream, ci.name);
      const msgs = await c.consume({ max_messages: 1_000 });
      let stalled = false;
      let timer = setTimeout(() => {
        stalled = true;
        msgs.stop();
      }, STALL_MS);
      try {
        for await (const m of msgs) {
          clearTimeout(timer);
          timer = setTimeout(() => {
            stalled = true;
            msgs.stop();
          }, STALL_MS);
          // A key written while we read comes again: the later one wins.
          last.set(m.subject, msgOf(m));
          if (m.info.pending === 0) break;
        }
      } finally {
        clearTimeout(timer);
        msgs.stop();
      }
      if (stalled) {
        throw new Error(
          `the server sent nothing for ${STALL_MS} ms while listing ${view.name}`,
        );
      }
    }
  } finally {
    await jsm.consumers.delete(view.stream, ci.name).catch(() => {});
  }
  return last;
}

/** A bucket-wide (or prefix) watch; see {@linkcode watchKeys}. */
export interface KeysWatch {
  /** Stops the watch and deletes what it opened on the server. */
  stop(): Promise<void>;
  /**
   * Resolves when the watch ended on its own: the bucket's stream was
   * deleted (a `JetStreamApiError`, stream not found). Never resolves
   * otherwise.
   */
  readonly ended: Promise<Error>;
}

/**
 * Watches every key below `prefix` (the whole bucket when undefined):
 * calls `onChange` with each key's current state, then once per change of
 * holder (a new holder or tenure, a release, a delete, an expiry);
 * renewals are not changes. An expiry is reported when a held entry
 * reaches the TTL unrenewed (by the server's timestamp), whether or not
 * the server writes a marker (2.9 and 2.10 write none). Follows the stream
 * with an ordered consumer from the last message of each subject; when
 * nats.js recreates that consumer (a reconnect, a gap) it starts a fresh
 * one, and the per-key state makes the replay print nothing twice. When
 * the bucket is deleted, the watch ends (see {@linkcode KeysWatch.ended}).
 *
 * On a fenced bucket it follows the tenure entries and the sessions'
 * entries: a tenure whose session ends (expires unrenewed, is deleted)
 * changes to `orphaned`. Nothing is reported before the first pass over
 * both is read, so that a tenure read before its session's latest renewal
 * is not reported orphaned for a moment.
 *
 * @param nc The connection.
 * @param bucket The bucket, or the stream of the user's that holds the
 *   leases.
 * @param prefix A valid key, or undefined for the whole bucket.
 * @param domain The JetStream domain of the bucket, or undefined for the
 *   connected server's own (never with a stream).
 * @param onChange Called for each change.
 * @param exact Watch only the key `prefix` names (`lease watch KEY` on a
 *   fenced bucket).
 * @returns The watch, to stop.
 * @throws {JetStreamApiError} The bucket does not exist (`JetStreamApiCodes.StreamNotFound`), or another refusal.
 */
export async function watchKeys(
  nc: NatsConnection,
  bucket: Place,
  prefix: string | undefined,
  domain: string | undefined,
  onChange: (row: KeyRow) => void,
  exact = false,
): Promise<KeysWatch> {
  const at = domain === undefined ? {} : { domain };
  const jsm = await jetstreamManager(nc, at);
  const view = await viewOf(jsm, bucket);
  const js = jetstream(nc, at);
  const where = leaseSubjects(view, { prefix, exact });
  const keyBase = prefixOf(where);
  const sessionBase = view.sessions ?? "";
  /** Per key: who it is held by (see `whoOf`), the entry, its expiry timer. */
  const keys = new Map<
    string,
    {
      who: string;
      seq: number;
      timer?: ReturnType<typeof setTimeout> | undefined;
    }
  >();
  /** Fenced: each tenure's last message, and each session's. */
  const tenures = new Map<string, StoredMsg>();
  const sessions = new Map<string, StoredMsg>();
  /** Fenced: until the first pass is read, rows wait (see above). */
  let caughtUp = !view.fenced;
  let stopped = false;
  let consumer: Consumer | undefined;
  let messages: ConsumerMessages | undefined;
  let wake: (() => void) | undefined;
  let backoff: ReturnType<typeof setTimeout> | undefined;
  let end!: (err: Error) => void;
  const ended = new Promise<Error>((resolve) => end = resolve);
  /** The stream's own answer: gone, or anything else (kept watching). */
  const gone = (): Promise<Error | undefined> =>
    jsm.streams.info(view.stream).then(
      () => undefined,
      (err) =>
        err instanceof JetStreamApiError &&
          err.code === JetStreamApiCodes.StreamNotFound
          ? err
          : undefined,
    );

  /** What a change of holder is: held by whom, orphaned from whom, or free. */
  const whoOf = (row: KeyRow): string =>
    row.state === "held"
      ? `${row.holder}#${row.epoch}`
      : row.state === "orphaned"
      ? `orphaned ${row.holder}#${row.epoch}`
      : "";
  /** A held row once its TTL ran out unrenewed. */
  const lapsed = (row: KeyRow): KeyRow =>
    view.fenced ? { ...row, state: "orphaned", expiresInMs: 0 } : {
      ...row,
      state: "expired",
      renewedAgoMs: row.renewedAgoMs + row.expiresInMs!,
      expiresInMs: 0,
    };

  const show = (row: KeyRow): void => {
    const k = keys.get(row.key) ?? { who: "", seq: 0 };
    if (row.revision < k.seq) return;
    clearTimeout(k.timer);
    k.timer = undefined;
    k.seq = row.revision;
    const who = whoOf(row);
    const first = !keys.has(row.key);
    keys.set(row.key, k);
    if (first || who !== k.who) {
      k.who = who;
      onChange(row);
    }
    if (row.state === "held" && row.expiresInMs !== null) {
      // No event comes for an expiry without a marker (nor before a
      // session's marker): time it ourselves.
      const seq = row.revision;
      k.timer = setTimeout(() => {
        if (stopped || k.seq !== seq) return;
        k.timer = undefined;
        const late = lapsed(row);
        if (k.who === "" || k.who === whoOf(late)) return;
        k.who = whoOf(late);
        onChange(late);
      }, row.expiresInMs + 1);
    }
  };

  /** Fenced: the row of a tenure key with what is known of its session. */
  const showTenure = (key: string): void => {
    const t = tenures.get(key)!;
    const id = sessionOf(t);
    show(
      fencedRowOf(
        key,
        t,
        id === undefined ? undefined : sessions.get(id),
        view.now(),
        view.ttl,
      ),
    );
  };

  const onMessage = (m: JsMsg): void => {
    if (!view.fenced) {
      show(rowOf(m.subject.slice(where.skip), msgOf(m), view.now(), view.ttl));
      return;
    }
    if (m.subject.startsWith(sessionBase)) {
      const id = m.subject.slice(sessionBase.length);
      sessions.set(id, msgOf(m));
      if (caughtUp) {
        for (const [key, t] of tenures) {
          if (sessionOf(t) === id) showTenure(key);
        }
      }
    } else if (m.subject.startsWith(keyBase)) {
      const key = m.subject.slice(where.skip);
      tenures.set(key, msgOf(m));
      if (caughtUp) showTenure(key);
    }
    if (!caughtUp && m.info.pending === 0) {
      caughtUp = true;
      for (const key of [...tenures.keys()].sort()) showTenure(key);
    }
  };

  const drop = async (): Promise<void> => {
    const c = consumer;
    consumer = undefined;
    // An ordered consumer left behind lingers on the server for minutes.
    await c?.delete().catch(() => {});
  };

  const loop = async (): Promise<void> => {
    for (let fails = 0; !stopped && !nc.isClosed();) {
      try {
        consumer = await js.consumers.get(view.stream, {
          filter_subjects: where.sessions === undefined
            ? where.filter
            : [where.filter, where.sessions],
          deliver_policy: DeliverPolicy.LastPerSubject,
        });
        if (stopped) break;
        // A deleted stream (or consumer) ends the iteration with an error
        // instead of retrying in silence; the stream's own info says which.
        // A pull of 10 s (nats.js's default: 30 s) has idle heartbeats
        // every 5 s, and two missed ones make nats.js look for the
        // consumer: the fallback when a deleted stream's consumer is not
        // told (2.9.10 under load, once in a CI run).
        const msgs = messages = await consumer.consume({
          max_messages: 1_000,
          expires: 10_000,
          abort_on_missing_resource: true,
        });
        if (stopped) msgs.stop();
        void (async () => {
          for await (const s of msgs.status()) {
            // See lease.ts watchSubject: a recreated ordered consumer may
            // go quiet; start a fresh one from the last messages instead.
            if (s.type === "ordered_consumer_recreated") {
              msgs.stop();
              return;
            }
          }
        })().catch(() => {});
        for await (const m of msgs) {
          fails = 0;
          onMessage(m);
        }
      } catch {
        fails++;
      }
      await drop();
      if (stopped || nc.isClosed()) break;
      const err = await gone();
      if (err !== undefined) {
        if (!stopped) end(err);
        break;
      }
      await new Promise<void>((resolve) => {
        wake = resolve;
        backoff = setTimeout(resolve, Math.min(100 * 2 ** fails, 5_000));
      });
    }
  };
  const done = loop();
  return {
    ended,
    async stop(): Promise<void> {
      stopped = true;
      clearTimeout(backoff);
      wake?.();
      for (const k of keys.values()) clearTimeout(k.timer);
      messages?.stop();
      await done;
      await drop();
    },
  };
}
