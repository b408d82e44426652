/**
 * Single-writer leases over a NATS JetStream KV bucket.
 *
 * ## The model
 * One KV entry per store key. Its value is the holder's node id (raw UTF-8,
 * so a node running the Go design this ports can share the bucket), and the
 * bucket's max age is the lease TTL: an entry nobody renews disappears.
 *
 * ## The safety argument, in one place
 * 1. **Only a compare-and-set authorises a write.** Every guarded write is
 *    preceded by a publish with `Nats-Expected-Last-Subject-Sequence` set to
 *    the revision we last wrote. The stream leader applies it only if nobody
 *    wrote the key since, so its success proves, at that moment, that we
 *    still hold the lease. Reads (`get`) may come from a stale replica and
 *    are only ever used to choose what to try next; they never authorise.
 * 2. **A monotonic deadline bounds what a success is worth.** A CAS sent at
 *    local time `t` keeps the entry alive on the server until at least
 *    `t + ttl` (the server stamps it on arrival, after `t`), so we trust the
 *    lease until `t + ttl` and no longer: at that deadline the lease's
 *    `signal` aborts and no new write starts without another CAS.
 * 3. **A takeover waits one TTL (the grace)**, so that a displaced holder
 *    that passed its commit-point check just before losing the lease has a
 *    full TTL to finish. The grace is skipped only when the successor can
 *    see that the previous holder released the key cleanly (a delete
 *    marker written by compare-and-delete after its writes settled).
 * 4. **The epoch fences what the grace cannot.** The epoch is the revision
 *    at which a holder's tenure began; every later holder's tenure begins
 *    at a higher revision, so a store that rejects epochs older than the
 *    newest it has seen refuses a paused holder that wakes up late.
 * 5. **Ambiguous answers are resolved, not guessed.** A CAS whose reply
 *    timed out may have been applied. We keep our claim and retry the CAS
 *    with the old revision; a "wrong last sequence: N" answer names the
 *    entry that won, and we read that exact revision (immutable, so any
 *    replica's copy is right) to see if it is our own write. Our writes are
 *    tagged with a per-process instance id and the epoch in `Nats-Msg-Id`,
 *    so a restarted process with the same node id is not mistaken for us.
 *
 * @module
 */

import type { NatsConnection } from "@nats-io/nats-core";
import {
  jetstream,
  JetStreamApiError,
  type JetStreamClient,
  type JetStreamManager,
  jetstreamManager,
  type StoredMsg,
} from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";

/** The lease TTL used when none is given and the bucket does not exist yet. */
export const DEFAULT_TTL = 15_000;

/** The smallest TTL that renewal (every TTL/3, with request timeouts) can work with. */
export const MIN_TTL = 500;

/**
 * The NATS connection a manager works over: any `NatsConnection` of
 * `@nats-io/nats-core`, made with any transport (`@nats-io/transport-node`,
 * `wsconnect`, ...). Declared by the members the manager itself reads, so
 * the published types stand on their own.
 *
 * @example Connect with the Node transport
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * const nc: Connection = await connect({ servers: "127.0.0.1:4222" });
 * ```
 */
export interface Connection {
  /** The server's info; its `version` decides whether replicated buckets are safe. */
  readonly info?: { readonly version: string } | undefined;
  /** Whether the connection is closed for good. */
  isClosed(): boolean;
  /** Request-reply, on which JetStream runs. */
  request(subject: string): Promise<unknown>;
}

/** Options of {@linkcode createLeaseManager}. */
export interface LeaseManagerOptions {
  /**
   * The caller's NATS connection, over any transport. The manager never
   * closes it.
   */
  nc: Connection;
  /**
   * This process's id across the cluster, stored as the lease entry's value.
   * Must not be blank.
   */
  node: string;
  /**
   * Lease TTL in milliseconds: the bucket's max age. When omitted, an
   * existing bucket's TTL is adopted; when given, it must match it.
   * @default {15000}
   */
  ttl?: number;
  /**
   * Name of the KV bucket that holds the leases.
   * @default {"leases"}
   */
  bucket?: string;
  /**
   * Replicas of the bucket, used only when this call creates it.
   * @default {1}
   */
  replicas?: number;
  /**
   * Aborting this signal shuts the manager down, as
   * {@linkcode LeaseManager.close} does.
   * @default {undefined}
   */
  signal?: AbortSignal;
  /**
   * Time in milliseconds to wait for each server request before treating it
   * as unanswered (the write is refused, the lease kept if the CAS may have
   * landed). At most the TTL.
   * @default {Math.min(ttl / 4, 5000)}
   */
  timeout?: number;
  /**
   * Wait one TTL before the first write after acquiring a key that was not
   * cleanly released, even if this process never saw another holder.
   *
   * `true` (the default) is the safe choice: a process that starts just
   * after a paused holder's lease expired cannot tell that holder is still
   * alive, so it waits for it; and an entry with this node id written by
   * another process (a previous incarnation, or a second copy) is treated
   * like any other holder's: left to expire, then the grace. `false`
   * follows the Go reference: wait only when this process itself saw a
   * foreign holder, and adopt an entry with this node id at once. A fresh
   * process then writes at once, but may overlap a paused holder's last
   * write (the epoch still fences it).
   * @default {true}
   */
  restartGrace?: boolean;
}

/** A held lease, handed to a guarded write. */
export interface Lease {
  /** The store key. */
  readonly key: string;
  /** This process's node id. */
  readonly node: string;
  /**
   * The fencing epoch: the KV revision at which this node's tenure began.
   * Constant while the node holds the key; strictly greater for any later
   * holder.
   */
  readonly epoch: number;
  /**
   * Aborts as soon as the manager learns the lease is lost (a renewal found
   * another holder) or can no longer vouch for it (the deadline of the last
   * confirmed renewal passed), or when the guard's own signal aborts.
   */
  readonly signal: AbortSignal;
}

/** Who holds a key, as reported by {@linkcode LeaseManager.holder}. */
export interface Holder {
  /** The holder's node id. */
  readonly node: string;
  /** The holder's fencing epoch (for holders that do not tag it: the entry's revision). */
  readonly epoch: number;
}

/** Options of {@linkcode LeaseManager.guard}. */
export interface GuardOptions {
  /**
   * Aborting it rejects the guard with its reason if the write has not
   * started yet, and aborts the lease's signal if it has.
   * @default {undefined}
   */
  signal?: AbortSignal;
}

/** A lease manager, made by {@linkcode createLeaseManager}. */
export interface LeaseManager extends AsyncDisposable {
  /** This process's node id. */
  readonly node: string;
  /** The lease TTL in milliseconds in force (given or adopted from the bucket). */
  readonly ttl: number;
  /** The name of the KV bucket. */
  readonly bucket: string;
  /**
   * Runs `write` under the lease of `key`: acquires or renews it by
   * compare-and-set, enforces the failover grace, and calls `write` only
   * after a CAS sent after this call confirmed that this node holds the key.
   * In steady state this costs one server round trip; concurrent guards on
   * one key share it.
   *
   * @typeParam T What `write` returns.
   * @param key The store key: ASCII letters, digits, `-`, `_`, `/`, `=` and non-empty `.`-separated tokens.
   * @param write The write; it gets the {@linkcode Lease} with the fencing epoch and a loss signal.
   * @param options A signal to stop waiting.
   * @returns What `write` returns; what it throws is rethrown unchanged, and the lease stays held.
   * @throws {NotHolderError} Another node holds the key, or the grace after a takeover is running.
   * @throws {UnavailableError} The server could not be reached or answered too late; `write` was not called.
   * @throws {TypeError} The key is invalid or the manager is closed.
   *
   * @example Guard a write
   * ```ts ignore
   * const n = await leases.guard("orders", ({ epoch }) => store.append(epoch, record));
   * ```
   */
  guard<T>(
    key: string,
    write: (lease: Lease) => T | Promise<T>,
    options?: GuardOptions,
  ): Promise<T>;
  /**
   * Acquires or renews the lease of `key` and reports whether this node
   * holds it (also while the grace runs).
   *
   * @param key The store key.
   * @returns `true` when this node holds the key.
   * @throws {UnavailableError} The server could not be reached.
   *
   * @example Check a lease
   * ```ts ignore
   * if (await leases.held("orders")) console.log("this node writes orders");
   * ```
   */
  held(key: string): Promise<boolean>;
  /**
   * Reads who holds `key`, to route writes to it. A read, so a hint: it
   * may be a moment stale.
   *
   * @param key The store key.
   * @returns The holder, or `null` when nobody holds the key.
   * @throws {UnavailableError} The server could not be reached.
   *
   * @example Route a write
   * ```ts ignore
   * const h = await leases.holder("orders");
   * if (h && h.node !== leases.node) forwardTo(h.node);
   * ```
   */
  holder(key: string): Promise<Holder | null>;
  /**
   * Shuts down: new guards reject, renewals stop, in-flight writes settle,
   * then each held lease is released by compare-and-delete on our own
   * revision so a successor takes over at once. Safe to call twice.
   *
   * @returns A promise that resolves when every lease is released or expired.
   *
   * @example Shut down
   * ```ts ignore
   * await leases.close();
   * ```
   */
  close(): Promise<void>;
}

/**
 * Another node holds the key, or this node just took it over and the grace
 * is running (then {@linkcode NotHolderError.retryAfter} says for how long).
 *
 * @example Retry after the grace
 * ```ts ignore
 * try {
 *   await leases.guard("orders", write);
 * } catch (err) {
 *   if (err instanceof NotHolderError && err.retryAfter !== undefined) {
 *     await new Promise((r) => setTimeout(r, err.retryAfter));
 *   }
 * }
 * ```
 */
export class NotHolderError extends Error {
  /** The store key. */
  readonly key: string;
  /** The node seen holding the key, when known (`undefined` in the grace). */
  readonly holder: string | undefined;
  /** Whole milliseconds until the grace ends and this node may write; `undefined` when another node holds the key. */
  readonly retryAfter: number | undefined;

  /**
   * Makes the error.
   *
   * @param key The store key.
   * @param holder The node seen holding the key.
   * @param retryAfter Milliseconds until the grace ends.
   * @param message Overrides the message.
   */
  constructor(
    key: string,
    holder?: string,
    retryAfter?: number,
    message?: string,
  ) {
    super(
      message ??
        (retryAfter !== undefined
          ? `Lease on '${key}' was just acquired: writes wait out the failover grace, retry in ${
            Math.ceil(retryAfter)
          } ms`
          : holder === undefined
          ? `Lease on '${key}' is not held by this node`
          : `Lease on '${key}' is held by node '${holder}'`),
    );
    this.name = "NotHolderError";
    this.key = key;
    this.holder = holder;
    this.retryAfter = retryAfter;
  }
}

/**
 * The server could not be reached or answered too late; the write was not
 * run. The lease may still be held: a later guard finds out.
 *
 * @example Tell outage from contention
 * ```ts ignore
 * try {
 *   await leases.guard("orders", write);
 * } catch (err) {
 *   if (err instanceof UnavailableError) console.warn("NATS unreachable, write refused", err.cause);
 * }
 * ```
 */
export class UnavailableError extends Error {
  /** The store key. */
  readonly key: string;

  /**
   * Makes the error.
   *
   * @param key The store key.
   * @param message What went wrong.
   * @param options The underlying error as `cause`.
   */
  constructor(key: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "UnavailableError";
    this.key = key;
  }
}

// ---------------------------------------------------------------------------
// The seam. The protocol below talks to the world only through a `Port`: its
// clock, its timers, and the three server operations it needs. Production
// passes `natsPort` (nats.js and `performance.now()`/`setTimeout`); the
// simulator in `sim/` passes a virtual KV and virtual time, and so runs this
// exact code. Not exported from `mod.ts`.

/** The last entry of a key (or the message at a revision), as stored. */
export interface RawEntry {
  /** The stream sequence: the KV revision. */
  readonly seq: number;
  /** The `KV-Operation` header: `undefined` for a plain put or a server marker. */
  readonly operation: "DEL" | "PURGE" | undefined;
  /** The `Nats-Marker-Reason` header of a server-written marker (e.g. `"MaxAge"`). */
  readonly marker: string | undefined;
  /** The `Nats-Msg-Id` header: how our writes are tagged. */
  readonly msgId: string | undefined;
  /** The body: the holder's node id for a put, empty for a marker. */
  readonly value: string;
}

/** A compare-and-set publish on one key's subject. */
export interface WriteRequest {
  /** `$KV.<bucket>.<key>`. */
  readonly subject: string;
  /** `"PUT"` writes `value`; `"DEL"` writes a KV delete marker (empty body). */
  readonly op: "PUT" | "DEL";
  /** The node id, for a put. */
  readonly value: Uint8Array;
  /** `Nats-Expected-Last-Subject-Sequence`: 0 when the key must have no entry. */
  readonly expect: number;
  /** `Nats-Msg-Id`, the tag that lets us recognise the write later. */
  readonly msgId: string;
  /** Milliseconds to wait for the reply before the write counts as unanswered. */
  readonly timeout: number;
}

/**
 * What a write's reply said: `{ seq }` when it was applied at that revision;
 * `{ conflict }` when the key's last revision was not `expect`, with the
 * revision the server named (-1 when it named none).
 */
export type WriteResult = { readonly seq: number } | {
  readonly conflict: number;
};

/** A port's write or read found that the bucket's stream does not exist. */
export class BucketGone extends Error {
  /** Makes the error. */
  constructor(message = "the lease bucket does not exist") {
    super(message);
    this.name = "BucketGone";
  }
}

/**
 * Everything the protocol needs from the world. A write or read that gets no
 * answer (timeout, no responders, closed connection) rejects; one that finds
 * the bucket missing rejects with {@linkcode BucketGone}.
 */
export interface Port {
  /** Monotonic milliseconds. */
  now(): number;
  /** Calls `fn` once after `ms` milliseconds of this clock. */
  setTimer(fn: () => void, ms: number): unknown;
  /** Cancels a timer (a no-op for `undefined` or a fired one). */
  clearTimer(handle: unknown): void;
  /** An id that no other manager uses, for tagging this manager's writes. */
  newInstanceId(): string;
  /** Publishes `req`; see {@linkcode WriteResult}. */
  write(req: WriteRequest): Promise<WriteResult>;
  /**
   * The last entry on `subject` (or, with `seq`, the message at that
   * revision if it is on `subject`); `null` when there is none. With
   * `leader: true` the stream leader answers (read-your-writes, as far as
   * the server gives it); otherwise any replica may, and may lag.
   */
  read(
    subject: string,
    query: { readonly seq?: number; readonly leader: boolean },
    timeout: number,
  ): Promise<RawEntry | null>;
  /** Whether the connection is closed for good. */
  isClosed(): boolean;
  /** Settles when the connection closes for good. */
  closed(): Promise<unknown>;
}

// ---------------------------------------------------------------------------
// Input checks: every one runs before anything is sent to the server.

const KEY_RE = /^[-/=\w]+(\.[-/=\w]+)*$/;
const BUCKET_RE = /^[-\w]+$/;

function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number" || typeof value === "boolean") {
    return String(value);
  }
  return value === null ? "null" : typeof value;
}

function checkKey(verb: string, key: unknown): asserts key is string {
  if (typeof key !== "string" || !KEY_RE.test(key)) {
    throw new TypeError(
      `Cannot ${verb} as 'key' must be ASCII letters, digits, '-', '_', '/' or '=' in non-empty '.'-separated tokens: received ${
        describe(key)
      }`,
    );
  }
}

function checkDuration(
  name: string,
  value: unknown,
  min: number,
  max: number,
): number {
  if (
    typeof value !== "number" || !Number.isFinite(value) || value < min ||
    value > max
  ) {
    throw new RangeError(
      `Cannot create lease manager as '${name}' must be a finite number of milliseconds from ${min} to ${max}: received ${
        describe(value)
      }`,
    );
  }
  return value;
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("aborted", "AbortError");
}

// ---------------------------------------------------------------------------
// Server facts.

/** The revision the server names in a "wrong last sequence: N" rejection. */
function conflictRevision(err: unknown): number | undefined {
  if (
    !(err instanceof JetStreamApiError) ||
    (err.code !== 10071 && err.code !== 10164)
  ) return undefined;
  const m = /wrong last sequence: (\d+)/.exec(err.message);
  return m ? Number(m[1]) : -1;
}

function isConflict(err: unknown): boolean {
  return conflictRevision(err) !== undefined;
}

/** nats-server fixed the replicated CAS race (nats-server#4320) in 2.9.21. */
function casSafeOnReplicas(version: string | undefined): boolean {
  const m = /^v?(\d+)\.(\d+)\.(\d+)/.exec(version ?? "");
  if (!m) return false;
  const [maj, min, pat] = [Number(m[1]), Number(m[2]), Number(m[3])];
  if (maj !== 2) return maj > 2;
  if (min !== 9) return min > 9;
  return pat >= 21;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** What the last entry of a key says. */
interface Seen {
  seq: number;
  op: "PUT" | "DEL" | "PURGE";
  node: string;
  /** The tenure epoch from our `Nats-Msg-Id` tag, else the revision. */
  epoch: number;
  /** The instance id from our tag, when the entry carries one. */
  instance: string | undefined;
}

const TAG_RE = /^lease:([^:]+):(\d+):\d+$/;

function toSeen(sm: StoredMsg): Seen {
  const op = sm.header?.get("KV-Operation") ||
    (sm.header?.has("Nats-Marker-Reason") ? "PURGE" : "PUT");
  const tag = TAG_RE.exec(sm.header?.get("Nats-Msg-Id") ?? "");
  const tagged = tag ? Number(tag[2]) : 0;
  return {
    seq: sm.seq,
    op: op === "DEL" || op === "PURGE" ? op : "PUT",
    node: decoder.decode(sm.data),
    epoch: tagged > 0 ? tagged : sm.seq,
    instance: tag?.[1],
  };
}

// ---------------------------------------------------------------------------
// Per-key state.

interface Batch {
  promise: Promise<void>;
  resolve: () => void;
  reject: (err: unknown) => void;
}

function batch(): Batch {
  let resolve!: () => void;
  let reject!: (err: unknown) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  // A batch nobody awaits (a background renewal) must not surface as an
  // unhandled rejection.
  promise.catch(() => {});
  return { promise, resolve, reject };
}

class KeyState {
  readonly key: string;
  readonly subject: string;
  /** We believe we hold the key (possibly unconfirmed after a timeout). */
  held = false;
  /** The revision we last wrote (valid when held). */
  rev = 0;
  /** The revision our tenure began at (valid when held). */
  epoch = 0;
  /** Local monotonic time until which the last confirmed CAS vouches for us. */
  validUntil = 0;
  /** Local monotonic time of the next background renewal. */
  renewAt = 0;
  /** No write before this monotonic time (failover grace). */
  notBefore = 0;
  /** This process saw another node hold the key. */
  sawForeign = false;
  /** The last foreign holder seen. */
  foreign: string | undefined;
  /** A foreign entry's revision and when we first saw it (for stale-entry takeover). */
  observed: { seq: number; at: number } | undefined;
  /** Aborts when the current tenure ends or can no longer be vouched for. */
  controller: AbortController | undefined;
  /** One server operation per key at a time; guards arriving meanwhile share the next. */
  busy = false;
  next: Batch | undefined;
  /** The renewal slot this key is planned in (0: none). */
  renewSlot = 0;
  expiryTimer: ReturnType<typeof setTimeout> | undefined;
  /** Guarded writes running now, and who waits for them to settle. */
  writes = 0;
  drained: (() => void) | undefined;
  /** Resolves when no server operation is running for the key. */
  idle: Promise<void> = Promise.resolve();

  constructor(key: string, subject: string) {
    this.key = key;
    this.subject = subject;
  }
}

// ---------------------------------------------------------------------------

interface Resolved {
  nc: NatsConnection; // checked to be one in resolveOptions
  node: string;
  ttl: number;
  timeout: number;
  restartGrace: boolean;
  bucket: string;
  signal: AbortSignal | undefined;
}

class Manager implements LeaseManager {
  readonly node: string;
  readonly ttl: number;
  readonly bucket: string;
  readonly #nodeBytes: Uint8Array;
  readonly #timeout: number;
  readonly #restartGrace: boolean;
  readonly #nc: NatsConnection;
  readonly #js: JetStreamClient;
  readonly #jsm: JetStreamManager;
  readonly #kv: KV;
  readonly #stream: string;
  readonly #direct: boolean;
  /** Tags our writes so a restarted process with our node id is told apart. */
  readonly #instance: string = crypto.randomUUID().replaceAll("-", "");
  #counter = 0;
  readonly #keys = new Map<string, KeyState>();
  /** Renewal slots: planned time → keys, served by one timer. */
  readonly #slots = new Map<number, KeyState[]>();
  readonly #quantum: number;
  #tickTimer: ReturnType<typeof setTimeout> | undefined;
  #tickAt = Infinity;
  #closing: Promise<void> | undefined;
  readonly #signal: AbortSignal | undefined;
  readonly #onAbort = () => void this.close();

  constructor(
    o: Resolved,
    js: JetStreamClient,
    jsm: JetStreamManager,
    kv: KV,
    direct: boolean,
  ) {
    this.node = o.node;
    this.ttl = o.ttl;
    this.#quantum = Math.min(o.ttl / 30, 50);
    this.bucket = o.bucket;
    this.#nodeBytes = encoder.encode(o.node);
    this.#timeout = o.timeout;
    this.#restartGrace = o.restartGrace;
    this.#nc = o.nc;
    this.#js = js;
    this.#jsm = jsm;
    this.#kv = kv;
    this.#stream = `KV_${o.bucket}`;
    this.#direct = direct;
    this.#signal = o.signal;
    this.#signal?.addEventListener("abort", this.#onAbort, { once: true });
    // A connection closed for good can neither renew nor release: stop the
    // timers (so the process can exit) and stop vouching for any lease.
    void o.nc.closed().then(() => this.#connectionClosed());
  }

  #state(key: string): KeyState {
    let st = this.#keys.get(key);
    if (!st) {
      st = new KeyState(key, `$KV.${this.bucket}.${key}`);
      this.#keys.set(key, st);
    }
    return st;
  }

  async guard<T>(
    key: string,
    write: (lease: Lease) => T | Promise<T>,
    options?: GuardOptions,
  ): Promise<T> {
    checkKey("guard a write", key);
    if (typeof write !== "function") {
      throw new TypeError(
        `Cannot guard a write on '${key}' as 'write' must be a function: received ${
          describe(write)
        }`,
      );
    }
    const signal = options?.signal;
    if (signal?.aborted) throw abortReason(signal);
    this.#checkOpen("guard a write", key);
    const st = this.#state(key);
    // A key in its grace needs no round trip to be refused.
    const wait = st.held ? st.notBefore - performance.now() : 0;
    if (wait > 0) throw new NotHolderError(key, undefined, Math.ceil(wait));

    await this.#sync(st, signal);

    if (signal?.aborted) throw abortReason(signal);
    this.#checkOpen("guard a write", key);
    if (!st.held) throw new NotHolderError(key, st.foreign);
    const now = performance.now();
    if (now < st.notBefore) {
      throw new NotHolderError(key, undefined, Math.ceil(st.notBefore - now));
    }
    if (
      now >= st.validUntil || !st.controller || st.controller.signal.aborted
    ) {
      // The CAS landed but took so long that it no longer vouches for us.
      throw new UnavailableError(
        key,
        `Lease on '${key}' was confirmed too late to write under it`,
      );
    }
    // With a caller's signal, one controller follows both for the length of
    // the write; its listeners go in `finally`, so a long-lived caller
    // signal does not collect one dependent per guard.
    const tenure = st.controller.signal;
    let leaseSignal = tenure;
    let unfollow: (() => void) | undefined;
    if (signal) {
      const follow = new AbortController();
      const onTenure = () => follow.abort(tenure.reason);
      const onCaller = () => follow.abort(signal.reason);
      tenure.addEventListener("abort", onTenure, { once: true });
      signal.addEventListener("abort", onCaller, { once: true });
      leaseSignal = follow.signal;
      unfollow = () => {
        tenure.removeEventListener("abort", onTenure);
        signal.removeEventListener("abort", onCaller);
      };
    }
    const lease: Lease = {
      key,
      node: this.node,
      epoch: st.epoch,
      signal: leaseSignal,
    };
    st.writes++;
    try {
      return await write(lease);
    } finally {
      unfollow?.();
      if (--st.writes === 0) st.drained?.();
    }
  }

  async held(key: string): Promise<boolean> {
    checkKey("check a lease", key);
    this.#checkOpen("check a lease", key);
    const st = this.#state(key);
    await this.#sync(st, undefined);
    return st.held;
  }

  async holder(key: string): Promise<Holder | null> {
    checkKey("read a holder", key);
    this.#checkOpen("read a holder", key);
    const st = this.#state(key);
    let seen: Seen | null;
    try {
      seen = await this.#read(st);
    } catch (err) {
      throw new UnavailableError(
        key,
        `Cannot read the holder of '${key}': ${errText(err)}`,
        { cause: err },
      );
    }
    if (!seen || seen.op !== "PUT") return null;
    return { node: seen.node, epoch: seen.epoch };
  }

  #checkOpen(verb: string, key: string): void {
    if (this.#closing) {
      throw new TypeError(
        `Cannot ${verb} on '${key}' as the lease manager is closed`,
        this.#signal?.aborted ? { cause: this.#signal.reason } : undefined,
      );
    }
  }

  /**
   * Resolves after one server operation that started after this call has
   * finished for `st`. Callers arriving while an operation runs share the
   * next one, so a hot key costs one round trip per batch, not per guard,
   * and no guard's CAS fails another's.
   */
  #sync(st: KeyState, signal: AbortSignal | undefined): Promise<void> {
    let b = st.next;
    if (!b) {
      b = st.next = batch();
      if (!st.busy) void this.#pump(st);
    }
    if (!signal) return b.promise;
    const done = b.promise;
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => reject(abortReason(signal));
      signal.addEventListener("abort", onAbort, { once: true });
      done.then(resolve, reject).finally(() =>
        signal.removeEventListener("abort", onAbort)
      );
    });
  }

  async #pump(st: KeyState): Promise<void> {
    st.busy = true;
    let finish!: () => void;
    st.idle = new Promise((r) => finish = r);
    while (st.next) {
      const b = st.next;
      st.next = undefined;
      try {
        await (st.held ? this.#renew(st) : this.#acquire(st));
        b.resolve();
      } catch (err) {
        b.reject(err);
      }
    }
    st.busy = false;
    finish();
  }

  /** Publishes our node id on `st`'s key if its last revision is `expect`. */
  async #cas(st: KeyState, expect: number, epoch: number): Promise<number> {
    const ack = await this.#js.publish(st.subject, this.#nodeBytes, {
      expect: { lastSubjectSequence: expect },
      msgID: `lease:${this.#instance}:${epoch}:${++this.#counter}`,
      timeout: this.#timeout,
    });
    return ack.seq;
  }

  async #read(st: KeyState, seq?: number): Promise<Seen | null> {
    const query = seq ? { seq } : { last_by_subj: st.subject };
    const sm = this.#direct
      ? await this.#jsm.direct.getMessage(this.#stream, query)
      : await this.#jsm.streams.getMessage(this.#stream, query);
    if (!sm || sm.subject !== st.subject) return null;
    return toSeen(sm);
  }

  #ours(st: KeyState, seen: Seen | null): boolean {
    return seen !== null && seen.op === "PUT" && seen.node === this.node &&
      seen.instance === this.#instance && seen.epoch === st.epoch;
  }

  /** Renews a lease we believe we hold: the steady-state round trip. */
  async #renew(st: KeyState): Promise<void> {
    for (let attempt = 0; attempt < 3; attempt++) {
      const sent = performance.now();
      try {
        st.rev = await this.#cas(st, st.rev, st.epoch);
        this.#confirmed(st, sent);
        return;
      } catch (err) {
        const at = conflictRevision(err);
        if (at === undefined) {
          // No answer: the CAS may or may not have landed. Keep the claim
          // (the next CAS on the old revision settles it) and let the
          // deadline timer withdraw our vouching if this lasts.
          this.#retryRenewal(st);
          throw new UnavailableError(
            st.key,
            `Cannot renew the lease on '${st.key}': ${errText(err)}`,
            { cause: err },
          );
        }
        // Someone's write won. If it is ours (an earlier CAS whose reply we
        // never got), carry on from it; otherwise the lease is lost.
        let seen: Seen | null;
        try {
          // at === 0: the entry expired; at < 0: the server did not say.
          seen = at === 0
            ? null
            : await this.#read(st, at > 0 ? at : undefined);
        } catch (readErr) {
          this.#retryRenewal(st);
          throw new UnavailableError(
            st.key,
            `Cannot tell whether the lease on '${st.key}' is still held: ${
              errText(readErr)
            }`,
            { cause: readErr },
          );
        }
        if (this.#ours(st, seen)) {
          st.rev = seen!.seq;
          continue;
        }
        this.#lost(st, seen);
        return;
      }
    }
    throw new UnavailableError(
      st.key,
      `Cannot renew the lease on '${st.key}': revisions kept moving`,
    );
  }

  /** Tries to take a key we do not hold; at most a few reads and CASes. */
  async #acquire(st: KeyState): Promise<void> {
    for (let attempt = 0; attempt < 3; attempt++) {
      let seen: Seen | null;
      try {
        seen = await this.#read(st);
      } catch (err) {
        throw new UnavailableError(
          st.key,
          `Cannot read the lease on '${st.key}': ${errText(err)}`,
          { cause: err },
        );
      }
      const now = performance.now();
      const unknownPast = this.#restartGrace || st.sawForeign;
      let grace: boolean;
      let resume = false;
      if (seen === null || seen.op === "PURGE") {
        // Absent: never held, or expired. An expired holder may be paused
        // mid-write, and we cannot tell which.
        grace = unknownPast;
      } else if (seen.op === "DEL") {
        // Released by compare-and-delete after the holder's writes settled.
        grace = false;
      } else if (this.#ours(st, seen)) {
        // Our own tenure, e.g. after a timeout: nobody wrote in between.
        grace = false;
        resume = true;
      } else if (seen.node === this.node && !this.#restartGrace) {
        // Our node id, written by another process: the Go reference adopts
        // such an entry at once, and restartGrace: false asks for that.
        grace = false;
      } else {
        // Another node, or our node id written by another process (a
        // previous incarnation, or a second copy): either may be alive and
        // inside its deadline, so wait for the entry to expire like any
        // holder's, then the grace.
        st.sawForeign = true;
        st.foreign = seen.node;
        // A holder that has not renewed for a full TTL of our own time has
        // stopped trusting its lease (its deadline is at most TTL after its
        // last CAS, which was before we first saw it). The server normally
        // expires it first; this covers replicas that are late to expire.
        if (st.observed?.seq !== seen.seq) {
          st.observed = { seq: seen.seq, at: now };
          return;
        }
        if (now - st.observed.at < this.ttl) return;
        grace = true;
      }
      const expect = seen === null ? 0 : seen.seq;
      const sent = performance.now();
      let rev: number;
      try {
        rev = await this.#cas(st, expect, resume ? st.epoch : 0);
      } catch (err) {
        if (isConflict(err)) continue; // the key moved: look again
        throw new UnavailableError(
          st.key,
          `Cannot acquire the lease on '${st.key}': ${errText(err)}`,
          { cause: err },
        );
      }
      st.held = true;
      st.rev = rev;
      if (!resume) st.epoch = rev;
      st.observed = undefined;
      st.foreign = undefined;
      st.notBefore = grace ? performance.now() + this.ttl : 0;
      this.#confirmed(st, sent);
      return;
    }
  }

  /** A CAS sent at `sent` succeeded: we hold the key until `sent + ttl`. */
  #confirmed(st: KeyState, sent: number): void {
    st.validUntil = sent + this.ttl;
    st.renewAt = sent + this.ttl / 3;
    if (!st.controller || st.controller.signal.aborted) {
      st.controller = new AbortController();
    }
    // Both deadlines only move forward here, so a timer armed for an
    // earlier one fires early and re-arms itself: a guarded write touches
    // no timer in steady state.
    st.expiryTimer ??= setTimeout(
      () => this.#onExpiry(st),
      Math.max(0, st.validUntil - performance.now()),
    );
    if (st.renewSlot === 0) this.#plan(st, st.renewAt);
  }

  /**
   * After an unanswered renewal: retry soon while the lease may still be
   * saved, then only every TTL/3 (an outage must not turn every held key
   * into a stream of timed-out requests).
   */
  #retryRenewal(st: KeyState): void {
    const saving = performance.now() < st.validUntil;
    this.#scheduleRenewal(st, saving ? this.ttl / 10 : this.ttl / 3);
  }

  /** Renews `delay` ms from now (sooner than planned, after a failure). */
  #scheduleRenewal(st: KeyState, delay: number): void {
    st.renewAt = performance.now() + delay;
    this.#plan(st, st.renewAt);
  }

  /**
   * Plans a renewal of `st` at `at` or up to one quantum later. All keys of
   * a manager share one timer over slots of `#quantum` ms, so the renewals
   * due in a slot are published in one macrotask and nats.js writes them
   * to the socket together, instead of one timer, one task and one socket
   * write per lease. A quantum is at most TTL/30, so a renewal planned for
   * TTL/3 still leaves most of the TTL to retry in.
   */
  #plan(st: KeyState, at: number): void {
    if (this.#closing || this.#nc.isClosed()) return;
    const slot = Math.ceil(at / this.#quantum) * this.#quantum;
    // A key planned in several slots acts only in the one it names.
    st.renewSlot = slot;
    const keys = this.#slots.get(slot);
    if (keys) keys.push(st);
    else this.#slots.set(slot, [st]);
    if (slot < this.#tickAt) this.#arm(slot);
  }

  #arm(slot: number): void {
    clearTimeout(this.#tickTimer);
    this.#tickAt = slot;
    this.#tickTimer = setTimeout(
      () => this.#tick(),
      Math.max(0, slot - performance.now()),
    );
  }

  #tick(): void {
    this.#tickTimer = undefined;
    this.#tickAt = Infinity;
    const now = performance.now();
    let next = Infinity;
    for (const [slot, keys] of this.#slots) {
      if (slot > now) {
        next = Math.min(next, slot);
        continue;
      }
      this.#slots.delete(slot);
      for (const st of keys) {
        if (st.renewSlot === slot) {
          st.renewSlot = 0;
          this.#onRenew(st, now);
        }
      }
    }
    // #onRenew may have planned slots of its own and armed the timer.
    if (next < this.#tickAt) this.#arm(next);
  }

  #onRenew(st: KeyState, now: number): void {
    if (!st.held || this.#closing || this.#nc.isClosed()) return;
    // A guard may have renewed since this was planned: plan anew from then.
    if (st.renewAt > now) this.#plan(st, st.renewAt);
    else void this.#sync(st, undefined);
  }

  #stopRenewals(): void {
    clearTimeout(this.#tickTimer);
    this.#tickTimer = undefined;
    this.#tickAt = Infinity;
    this.#slots.clear();
    for (const st of this.#keys.values()) st.renewSlot = 0;
  }

  /** At the deadline of the last confirmed CAS, writes must stop. */
  #onExpiry(st: KeyState): void {
    st.expiryTimer = undefined;
    if (!st.held) return;
    const left = st.validUntil - performance.now();
    if (left > 0) {
      st.expiryTimer = setTimeout(() => this.#onExpiry(st), left);
      return;
    }
    st.controller?.abort(
      new UnavailableError(
        st.key,
        `Lease on '${st.key}' could not be renewed within its TTL`,
      ),
    );
  }

  #lost(st: KeyState, seen: Seen | null): void {
    st.held = false;
    st.sawForeign = true;
    st.foreign = seen?.op === "PUT" ? seen.node : undefined;
    st.renewSlot = 0;
    clearTimeout(st.expiryTimer);
    st.expiryTimer = undefined;
    st.controller?.abort(new NotHolderError(st.key, st.foreign));
  }

  #connectionClosed(): void {
    this.#stopRenewals();
    for (const st of this.#keys.values()) {
      clearTimeout(st.expiryTimer);
      st.expiryTimer = undefined;
      if (st.held) {
        st.held = false;
        st.controller?.abort(
          new UnavailableError(
            st.key,
            `Lease on '${st.key}' can no longer be renewed: the NATS connection is closed`,
          ),
        );
      }
    }
  }

  close(): Promise<void> {
    if (!this.#closing) this.#closing = this.#shutdown();
    return this.#closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  async #shutdown(): Promise<void> {
    this.#signal?.removeEventListener("abort", this.#onAbort);
    this.#stopRenewals();
    await Promise.all([...this.#keys.values()].map((st) => this.#release(st)));
    this.#keys.clear();
  }

  /** Waits for `st`'s writes and server operation, then deletes our entry. */
  async #release(st: KeyState): Promise<void> {
    if (st.writes > 0) {
      await new Promise<void>((r) => st.drained = r);
    }
    while (st.busy) await st.idle;
    // Compare-and-delete on our own revision: it can only remove our entry.
    // A retry after a lost reply is safe for the same reason; it fails once
    // anything (our delete included) has been written after our revision.
    while (
      st.held && performance.now() < st.validUntil && !this.#nc.isClosed()
    ) {
      try {
        await this.#kv.delete(st.key, { previousSeq: st.rev });
        break;
      } catch (err) {
        if (isConflict(err)) break;
        await new Promise((r) => setTimeout(r, Math.min(50, this.ttl / 20)));
      }
    }
    st.held = false;
    clearTimeout(st.expiryTimer);
    st.expiryTimer = undefined;
    st.controller?.abort(
      new NotHolderError(
        st.key,
        undefined,
        undefined,
        `Lease on '${st.key}' was released by close()`,
      ),
    );
  }
}

function errText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * Creates a lease manager over a JetStream KV bucket, creating the bucket
 * (TTL = lease TTL, history 1) if it does not exist.
 *
 * @param options The connection, this node's id and the settings.
 * @returns The manager, ready to guard writes.
 * @throws {TypeError} `nc` is missing, `node` is blank, or `bucket` is not a valid name.
 * @throws {RangeError} `ttl`, `timeout` or `replicas` is out of range, or the existing bucket has another TTL than `ttl`.
 * @throws {Error} The bucket is replicated on a server older than 2.9.21, whose compare-and-set is unsafe.
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
  const nc = o.nc;
  // Creating a replicated stream can take longer than a lease operation may.
  const setupTimeout = Math.max(o.timeout, 5_000);
  const jsm = await jetstreamManager(nc, { timeout: setupTimeout });
  const existing = await bucketStatus(jsm, o.bucket);
  if (existing) {
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
    if (options.timeout === undefined) o.timeout = defaultTimeout(o.ttl);
  }
  const replicas = existing?.replicas ?? options.replicas ?? 1;
  if (replicas > 1 && !casSafeOnReplicas(nc.info?.version)) {
    throw new Error(
      `Cannot create lease manager on a bucket with ${replicas} replicas as nats-server ${
        nc.info?.version ?? "(unknown version)"
      } may let two compare-and-set updates with the same revision both succeed on a replicated stream (fixed in 2.9.21, nats-server#4320): upgrade the servers to 2.9.21 or later, or use a bucket with 1 replica`,
    );
  }
  let direct = existing?.direct;
  if (direct === undefined) {
    const created = await new Kvm(jetstream(nc, { timeout: setupTimeout }))
      .create(o.bucket, { ttl: o.ttl, history: 1, replicas });
    // Created now, or concurrently by another process: read what it is.
    const status = await created.status();
    if (status.ttl !== o.ttl) {
      throw new RangeError(
        `Cannot create lease manager as bucket '${o.bucket}' has a TTL of ${status.ttl} ms but 'ttl' is ${o.ttl} ms`,
      );
    }
    direct = status.streamInfo.config.allow_direct === true;
  }
  const js = jetstream(nc, { timeout: o.timeout });
  const kv = await new Kvm(js).open(o.bucket, { allow_direct: direct });
  const opsJsm = await jetstreamManager(nc, {
    timeout: o.timeout,
    checkAPI: false,
  });
  if (o.signal?.aborted) throw abortReason(o.signal);
  return new Manager(o, js, opsJsm, kv, direct);
}

async function bucketStatus(
  jsm: JetStreamManager,
  bucket: string,
): Promise<{ ttl: number; replicas: number; direct: boolean } | undefined> {
  try {
    const si = await jsm.streams.info(`KV_${bucket}`);
    return {
      ttl: Math.round(si.config.max_age / 1_000_000),
      replicas: si.config.num_replicas,
      direct: si.config.allow_direct === true,
    };
  } catch (err) {
    if (err instanceof JetStreamApiError && err.code === 10059) {
      return undefined;
    }
    throw err;
  }
}

function defaultTimeout(ttl: number): number {
  return Math.min(ttl / 4, 5_000);
}

function resolveOptions(options: LeaseManagerOptions): Resolved {
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `Cannot create lease manager as 'options' must be an object: received ${
        describe(options)
      }`,
    );
  }
  const { nc, node, bucket = "leases", signal } = options;
  if (
    typeof nc !== "object" || nc === null ||
    typeof (nc as { request?: unknown }).request !== "function"
  ) {
    throw new TypeError(
      `Cannot create lease manager as 'nc' must be a NatsConnection: received ${
        describe(nc)
      }`,
    );
  }
  if (typeof node !== "string" || node.trim() === "") {
    throw new TypeError(
      `Cannot create lease manager as 'node' must be a non-blank string: received ${
        describe(node)
      }`,
    );
  }
  if (typeof bucket !== "string" || !BUCKET_RE.test(bucket)) {
    throw new TypeError(
      `Cannot create lease manager as 'bucket' must be ASCII letters, digits, '-' or '_': received ${
        describe(bucket)
      }`,
    );
  }
  const ttl = checkDuration(
    "ttl",
    options.ttl ?? DEFAULT_TTL,
    MIN_TTL,
    2 ** 31 - 1,
  );
  const timeout = options.timeout === undefined
    ? defaultTimeout(ttl)
    : checkDuration("timeout", options.timeout, 1, ttl);
  const replicas = options.replicas ?? 1;
  if (!Number.isInteger(replicas) || replicas < 1 || replicas > 5) {
    throw new RangeError(
      `Cannot create lease manager as 'replicas' must be an integer from 1 to 5: received ${
        describe(replicas)
      }`,
    );
  }
  if (
    options.restartGrace !== undefined &&
    typeof options.restartGrace !== "boolean"
  ) {
    throw new TypeError(
      `Cannot create lease manager as 'restartGrace' must be a boolean: received ${
        describe(options.restartGrace)
      }`,
    );
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `Cannot create lease manager as 'signal' must be an AbortSignal: received ${
        describe(signal)
      }`,
    );
  }
  return {
    // Everything else of a NatsConnection is used through nats.js itself.
    nc: nc as unknown as NatsConnection,
    node,
    ttl,
    timeout,
    restartGrace: options.restartGrace ?? true,
    bucket,
    signal,
  };
}
