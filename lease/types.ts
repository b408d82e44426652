import type { LeaseEventMap } from "./events.ts";

/** The lease TTL used when none is given and the bucket does not exist yet. */
export const DEFAULT_TTL = 15_000;

/** The smallest TTL that renewal (every TTL/3, with request timeouts) can work with. */
export const MIN_TTL = 500;

/**
 * The least time in milliseconds that each request of
 * {@linkcode createLeaseManager} waits for its answer. Set-up is off the
 * write path, and the server may take this long: it answers the creation of
 * a replicated bucket once the stream's raft group has a leader, and when
 * the first vote fails, nats-server holds the next election 4 to 9 s later.
 * A cluster that answers "JetStream system temporarily unavailable" (no
 * meta leader yet, as while its servers start or after one restarts) is
 * asked again until this long has passed since set-up began, and so is a
 * read that got no answer within 5 s (or `timeout`, if longer): a cluster
 * electing a leader drops requests without answering them.
 *
 * @example How long set-up may wait, whatever `timeout` says
 * ```ts
 * import { SETUP_TIMEOUT } from "@nats-lease/lease";
 * // With { timeout: 1_000 }, renewals and guards give up after 1 s, but
 * // binding or creating the bucket waits up to this long:
 * console.log(SETUP_TIMEOUT); // 20000
 * ```
 */
export const SETUP_TIMEOUT = 20_000;

/**
 * The bound assumed on how far any process's monotonic clock (and the
 * server's) runs from real time: 0.1%, twice NTP's largest slew (500 ppm)
 * plus a crystal's error. The failover grace absorbs it, and
 * {@linkcode leaseCheckMargin} is derived from it.
 *
 * @example The margin of a 15 s lease
 * ```ts
 * import { CLOCK_RATE_BOUND } from "@nats-lease/lease";
 * console.log(2 * CLOCK_RATE_BOUND * 15_000); // 30 ms
 * ```
 */
export const CLOCK_RATE_BOUND = 0.001;

/**
 * How far, at least, the deadline of a held lease must be for a guard with
 * `check: "lease"` to write without a round trip: `2 × CLOCK_RATE_BOUND ×
 * ttl`. A write started that early starts while the key's entry is still
 * on the server and nobody else can have taken the key (see point 9 of
 * this module's safety argument).
 *
 * @param ttl The lease TTL in milliseconds.
 * @returns The margin in milliseconds.
 *
 * @example How far a 15 s lease's deadline must be
 * ```ts
 * import { leaseCheckMargin } from "@nats-lease/lease";
 * console.log(leaseCheckMargin(15_000)); // 30
 * ```
 */
export function leaseCheckMargin(ttl: number): number {
  return 2 * CLOCK_RATE_BOUND * ttl;
}

/** Options of {@linkcode LeaseManager.health}. */
export interface HealthOptions {
  /**
   * A held key with less than this many milliseconds before its deadline
   * is reported in {@linkcode LeaseHealth.expiring}.
   * @default {ttl / 3}
   */
  margin?: number;
}

/**
 * What {@linkcode LeaseManager.health} reports: whether the manager can
 * still vouch for what it holds, and if not, why.
 */
export interface LeaseHealth {
  /**
   * The manager can vouch for every key it holds: not closed, not defunct,
   * connected, no renewal overdue and no key within the margin of its
   * deadline.
   */
  readonly ok: boolean;
  /** `close()` was called or the signal aborted. */
  readonly closed: boolean;
  /** Why the manager stopped for good, if it has. */
  readonly defunct: string | undefined;
  /** The connection is up (a lost one suspends every lease). */
  readonly connected: boolean;
  /** The keys this manager holds. */
  readonly held: number;
  /**
   * Held keys whose renewal has not been sent for more than a renewal
   * interval (TTL/3) past its time: the process is starved or its event
   * loop blocked. Renewals that are sent and fail (a server down) are
   * retried on time and show in `expiring` instead.
   */
  readonly overdue: readonly string[];
  /** Held keys with less than the margin left before their deadline. */
  readonly expiring: readonly string[];
}

/**
 * The NATS connection a manager works over: any `NatsConnection` of
 * `@nats-io/nats-core`, made with any transport (`@nats-io/transport-node`,
 * `wsconnect`, ...). Declared by the members the manager itself calls, so
 * the published types stand on their own; JetStream requests go through
 * nats.js, which uses the rest of the connection.
 *
 * @example Connect with the Node transport
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * const nc: Connection = await connect({ servers: "127.0.0.1:4222" });
 * ```
 */
export interface Connection {
  /** The info of the server this client is connected to (not of the servers that hold the bucket). */
  readonly info?: { readonly version: string } | undefined;
  /**
   * Optional: calls `fn` once, with why, if the port finds that the
   * servers holding the bucket can no longer be trusted with a
   * compare-and-set (a peer that was down at start-up came back on a
   * release older than 2.9.21, nats-server#4320). Registering starts the
   * port's checks of such peers; `close` ends them.
   */
  onDistrust?(fn: (why: string) => void): void;
  /** Whether the connection is closed for good. */
  isClosed(): boolean;
  /** Settles when the connection is closed for good: the manager then stops vouching for every lease. */
  closed(): Promise<void | Error>;
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
   * JetStream domain that holds the bucket, for a client whose server is a
   * leaf node of the one with the bucket (JetStream API requests cross a
   * leaf connection only when addressed to a domain, `$JS.<domain>.API`).
   * Every JetStream request the manager makes (set-up, reads, watches) goes
   * to that domain, and its compare-and-set publishes go to
   * `$JS.<domain>.API.$KV.<bucket>.<key>`, which that domain maps to the
   * bucket's subject (as nats.js's KV does), so a bucket of the same name
   * in the leaf's own domain is never written.
   * @default {the domain of the server the client is connected to}
   */
  domain?: string;
  /**
   * Create the bucket when it does not exist. `false` refuses to start
   * instead: a bucket deleted and re-created restarts revisions, and so
   * epochs, at 1 (see the README on re-creating a bucket).
   * @default {true}
   */
  createBucket?: boolean;
  /**
   * Replicas of the bucket, used only when this call creates it.
   * @default {1}
   */
  replicas?: number;
  /**
   * Accept a replicated bucket whose servers could not be proven to be
   * nats-server 2.9.21 or later (older ones let two compare-and-set updates
   * of one revision both succeed, nats-server#4320). Without it, set-up
   * needs the stream's leader and a quorum of its peers to answer with such
   * a release; a peer that is down then needs no override: it is checked
   * once a second until it answers, and one on an older release stops the
   * manager. Only for operators who know every server that may ever hold
   * the bucket's stream (or whose servers have no system account to ask).
   * @default {false}
   */
  allowUnverifiedReplicas?: boolean;
  /**
   * Use subject delete markers (nats-server 2.11.2 or later) to take a key
   * that has no entry at once. A bucket this call creates gets markers
   * that outlive its max age; an existing bucket's configuration and the
   * versions of the servers that hold it are checked at start-up, and
   * without proof the grace applies as before. When an entry expires the
   * server leaves a marker for the marker's life, and a compare-and-set
   * that expects no entry at all fails while one is there, so its success
   * proves the last holder's deadline passed at least that long ago. As
   * markers can be removed, shortened or lost to a rolled-back server
   * while managers run, each such compare-and-set goes out with a
   * stream-info request (in the same flush: still one round trip) that
   * proves them again, and the grace is decided on that answer.
   *
   * `false` creates buckets without markers and always waits the grace on
   * an empty key. Choose it when something may remove a lease entry
   * without leaving a marker: `kv.purge(key)` (a purge tombstone expires
   * without one), `jsm.streams.purge`, `jsm.streams.deleteMessage` or
   * `kv.purgeDeletes` on the bucket while a holder may be alive.
   * @default {true}
   */
  markers?: boolean;
  /**
   * How a guard on a key this node already holds proves the lease before
   * its write: `"cas"` by a compare-and-set sent after the call (one round
   * trip; an operator's delete or a foreign overwrite is caught at the next
   * write), `"lease"` by the deadline of the last renewal when it is at
   * least {@linkcode leaseCheckMargin} away (no round trip; such a change
   * is caught at the next renewal, at most TTL/3 later, and writes go on
   * through a short outage until that margin before the deadline). Either
   * way the epoch stays the fence. A guard's own `check` overrides it.
   * @default {"cas"}
   */
  check?: GuardCheck;
  /**
   * Aborting this signal shuts the manager down, as
   * {@linkcode LeaseManager.close} does.
   * @default {undefined}
   */
  signal?: AbortSignal;
  /**
   * Time in milliseconds to wait for each server request before treating it
   * as unanswered (the write is refused, the lease kept if the CAS may have
   * landed). At most the TTL in force (given or adopted). The requests of
   * {@linkcode createLeaseManager} itself (binding or creating the bucket,
   * checking its servers) wait at least {@linkcode SETUP_TIMEOUT} instead.
   * @default {Math.min(ttl / 4, 5000)}
   */
  timeout?: number;
  /**
   * How long {@linkcode LeaseManager.close} and
   * {@linkcode LeaseManager.release} wait for in-flight writes to settle,
   * renewing the lease meanwhile, before they stop vouching for it. A key
   * whose writes did not settle is left to expire, not released.
   * @default {the TTL}
   */
  settleTimeout?: number;
  /**
   * Release a key automatically once no guard has used it for this many
   * milliseconds, so a process that touches many keys does not renew them
   * all until `close()`. `undefined` keeps every acquired key until
   * `release()` or `close()`.
   * @default {undefined}
   */
  idleRelease?: number;
  /**
   * Wait one TTL before the first write after acquiring a key that
   * expired, even if this process never saw another holder.
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
  /**
   * Use a fenced bucket (nats-server 2.11.2 or later on every server that
   * holds it): the server itself refuses a write made through
   * {@linkcode Lease.put}, {@linkcode Lease.delete} or
   * {@linkcode Lease.commit} once its tenure is over, so no grace is
   * owed. A key is taken one TTL after its holder's last renewal, or
   * milliseconds after the holder's connection is gone (a crash), and one
   * heartbeat per manager keeps all its keys. Data keys live in the same
   * bucket, readable with plain `@nats-io/kv`; the leases live under
   * `_lease.`. Writes to any other store must still check the epoch.
   *
   * A bucket this call creates is marked as fenced in its stream metadata;
   * a classic bucket is refused, and a classic manager refuses a fenced
   * bucket. Never point the Go implementation or an older release of this
   * library at a fenced bucket: they cannot see the mark. `ttl` must be at
   * least 1,000 ms; `markers` and `restartGrace` do not apply.
   * @default {false}
   */
  fenced?: boolean;
  /**
   * Keep the leases in this JetStream stream of yours instead of a KV
   * bucket (the fenced layout, nats-server 2.11.2 or later): each lease
   * then offers {@linkcode Lease.publish}, which appends to the stream only
   * while its tenure lasts, so a stale holder's late append is refused by
   * the server itself. The leases live under `leaseSubjects`, which the
   * stream's subjects must cover. The stream is never created or changed:
   * set-up refuses one without `allow_msg_ttl`, a subject delete marker TTL
   * of 1 s or more, or `allow_rollup_hdrs`, and one with a max age,
   * `max_msgs`, `max_bytes` or a retention other than `limits` (those would
   * drop a long-held tenure's entry: a spurious takeover). Every manager on the stream must use the same
   * `leaseSubjects`. `bucket`, `createBucket`, `replicas`, `markers`,
   * `restartGrace` and `domain` do not apply, and `fenced` is implied.
   * @default {undefined}
   */
  stream?: string;
  /**
   * With `stream`, the subject prefix the leases live under: a key's
   * tenure is `<leaseSubjects>.k.<key>`, a manager's session
   * `<leaseSubjects>.s.<id>`. Required with `stream`; appends under it are
   * refused.
   * @default {undefined}
   */
  leaseSubjects?: string;
}

/**
 * A held lease, handed to a guarded write.
 *
 * Three lines of defence, from cheapest to strongest: `signal` aborts
 * promptly in a live process; `throwIfLost()` is exact at the instant it is
 * called (it reads the clock), so call it right before the commit point;
 * the `epoch` is the last line, for a store that can reject stale epochs.
 */
export interface Lease {
  /** The store key. */
  readonly key: string;
  /** This process's node id. */
  readonly node: string;
  /**
   * The fencing epoch: the KV revision at which this node's tenure began.
   * Constant while the node holds the key; strictly greater for any later
   * holder (within one incarnation of the bucket, on a server that keeps
   * what it acknowledged: after a lost tail an epoch may repeat, and
   * {@linkcode Lease.tenure} tells the two tenures apart).
   */
  readonly epoch: number;
  /**
   * An opaque id of this tenure, unique to it among every manager's
   * tenures: the epoch alone is not, once a server has lost writes it
   * acknowledged and numbers new ones with the lost revisions again (the
   * safety argument's durability assumption, point 10). A store that keeps,
   * with the newest epoch it accepted, the tenure that wrote under it, and
   * refuses an older epoch or that epoch from another tenure, never accepts
   * two tenures' writes under one epoch. A holder refused that way took the
   * key at a reused revision: release it and take it again (the stream's
   * sequence moves past the stale epoch with every write).
   *
   * @example A store fenced by epoch and tenure
   * ```ts ignore
   * let newest = { epoch: 0, tenure: "" };
   * function accept(lease: Lease): void {
   *   const { epoch, tenure } = lease;
   *   if (epoch < newest.epoch || (epoch === newest.epoch && tenure !== newest.tenure)) {
   *     throw new Error(`fenced: epoch ${epoch} of tenure ${tenure} after ${newest.epoch} of ${newest.tenure}`);
   *   }
   *   newest = { epoch, tenure };
   * }
   * await leases.guard("orders", (lease) => accept(lease));
   * ```
   */
  readonly tenure: string;
  /**
   * Aborts as soon as the manager learns the lease is lost (a renewal found
   * another holder), can no longer vouch for it (the deadline passed), the
   * key is released, or the guard's own signal aborts. A timer drives it,
   * so after the process was paused it may abort late: use
   * {@linkcode Lease.throwIfLost} at the commit point.
   */
  readonly signal: AbortSignal;
  /**
   * The instant, on the `performance.now()` clock, until which the manager
   * vouches for the lease: one TTL after the last confirmed renewal was
   * sent. It moves forward while renewals succeed, and stops moving when
   * the lease ends.
   */
  readonly deadline: number;
  /**
   * Throws the loss reason if `signal` aborted, or an
   * {@linkcode UnavailableError} if the deadline has passed or while the
   * lease is suspended: from the moment the connection drops until it is
   * back on the same server process, or the server it comes back to has
   * confirmed the lease (a restarted server may have lost the writes that
   * renewed it). A suspension does not abort `signal`: the lease may count
   * again. Made for "check right before you commit".
   */
  throwIfLost(): void;
  /**
   * On a fenced bucket (`fenced: true`), stores `value` under the data key
   * `key` of the same bucket, fenced by this tenure: the server itself
   * refuses it once another tenure took the lease, so a paused or cut-off
   * holder's late write is never stored. Readers read the key with plain
   * `@nats-io/kv`. Keys under `_lease.` are refused. On a classic bucket
   * it rejects with a `TypeError` and sends nothing.
   *
   * @param key The data key, a valid KV key outside `_lease.`.
   * @param value The value.
   * @returns The entry's revision.
   * @throws {NotHolderError} The server refused it: the tenure is over.
   * @throws {UnavailableError} The lease cannot be vouched for now, or no
   * answer came (the write may have been stored).
   * @example Store a value only while holding the lease
   * ```ts ignore
   * await leases.guard("orders", (lease) => lease.put("orders.total", "42"));
   * ```
   */
  put(key: string, value: Uint8Array | string): Promise<number>;
  /**
   * On a fenced bucket, deletes the data key `key`, fenced by this tenure
   * as {@linkcode Lease.put} is.
   *
   * @param key The data key.
   * @returns The delete marker's revision.
   * @example Delete a value only while holding the lease
   * ```ts ignore
   * await leases.guard("orders", (lease) => lease.delete("orders.draft"));
   * ```
   */
  delete(key: string): Promise<number>;
  /**
   * On a fenced bucket, stores 1 to 1,000 puts and deletes of data keys all
   * or nothing, fenced by this tenure: nats-server 2.12 or later, on a
   * bucket with atomic batches (`allow_atomic`, set when the manager
   * created the bucket on such servers). On a stream (`stream`), the same
   * for appends (`{ publish, data }`), on a stream with `allow_atomic`. A
   * refused commit stores nothing.
   *
   * @param ops The writes, in order.
   * @returns The last write's revision, and how many were stored.
   * @example Two writes that land together or not at all
   * ```ts ignore
   * await leases.guard("orders", (lease) =>
   *   lease.commit([{ put: "orders.total", value: "42" }, { delete: "orders.draft" }])
   * );
   * ```
   */
  commit(ops: readonly FencedOp[]): Promise<{ seq: number; count: number }>;
  /**
   * On a manager created with `stream`, appends `data` to `subject` of that
   * stream, fenced by this tenure: the server itself refuses it once
   * another tenure took the lease. The subject must be one the stream's
   * subjects cover, outside `leaseSubjects`; anything else is refused with
   * a `TypeError` before anything is sent, as it is on a bucket.
   *
   * @param subject The subject to append to.
   * @param data The message.
   * @returns The message's stream sequence.
   * @throws {NotHolderError} The server refused it: the tenure is over.
   * @throws {UnavailableError} The lease cannot be vouched for now, or no
   * answer came (the message may have been stored).
   * @example Append to an order log only while holding its lease
   * ```ts ignore
   * await leases.guard("orders", (lease) => lease.publish("orders.created", '{"id":1}'));
   * ```
   */
  publish(subject: string, data: Uint8Array | string): Promise<number>;
}

/**
 * One write of {@linkcode Lease.commit}: on a fenced bucket, a put of
 * `value` to a data key or a delete of one; on a stream (the `stream`
 * option), an append of `data` to a subject of it.
 */
export type FencedOp =
  | { readonly put: string; readonly value: Uint8Array | string }
  | { readonly delete: string }
  | { readonly publish: string; readonly data: Uint8Array | string };

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
  /**
   * Wait until this node holds the key and any failover grace is over, then
   * write, instead of rejecting with {@linkcode NotHolderError}. A waiting
   * guard retries the ordinary acquire path (read, compare-and-set, grace)
   * when the key's watch reports a change that may let it in (a release, a
   * delete, an expiry, another node's entry), when the holder's entry is
   * due to have expired (on a bucket without expiry markers, which sends no
   * message when an entry expires, reads from one TTL after its last
   * renewal was seen, every 25 ms, for at most 600 ms), at
   * the end of the grace, or after an {@linkcode UnavailableError} (backing
   * off from 50 ms to TTL/3, but woken sooner by such a change, or when the
   * connection comes back). Waiting decides only when to try again;
   * nothing but a successful compare-and-set lets the write run.
   *
   * The wait ends when `signal` aborts (the guard rejects with its reason,
   * having written nothing), when the manager closes (the guard rejects as
   * any guard after close does), or when the bucket is gone or the
   * connection closed for good (it rejects with that
   * {@linkcode UnavailableError}). Waiters of one key share one watch.
   * @default {false}
   */
  wait?: boolean;
  /**
   * How this guard proves the lease when this node already holds the key;
   * see {@linkcode LeaseManagerOptions.check}. With `"lease"`, a held key
   * whose deadline is at least {@linkcode leaseCheckMargin} away runs
   * `write` at once, within this call; otherwise the guard takes the
   * `"cas"` path.
   * @default {the manager's `check`}
   */
  check?: GuardCheck;
}

/**
 * How a guard proves that this node holds the lease, see
 * {@linkcode LeaseManagerOptions.check}.
 *
 * @example A write on the strength of the last renewal
 * ```ts ignore
 * const check: GuardCheck = "lease";
 * await leases.guard("orders", write, { check });
 * ```
 */
export type GuardCheck = "cas" | "lease";

/** Options of {@linkcode LeaseManager.campaign} and {@linkcode LeaseManager.watch}. */
export interface WatchOptions {
  /**
   * Aborting it ends the iteration (it returns; it does not throw).
   * @default {undefined}
   */
  signal?: AbortSignal;
}

/**
 * What {@linkcode LeaseManager.close} did with the keys it still held. A key
 * already released before `close()` (by {@linkcode LeaseManager.release}, or
 * by leaving a {@linkcode LeaseManager.campaign} loop) is in neither list:
 * after a campaign loop, `{ released: [], unreleased: [] }` means nothing
 * was left to hand on.
 */
export interface CloseResult {
  /** Keys released by compare-and-delete: a successor takes them at once. */
  readonly released: readonly string[];
  /**
   * Keys this manager held or may have held but could not release cleanly
   * (writes still running after `settleTimeout`, the failover grace still
   * running, the server unreachable): their entries expire after at most
   * one TTL, and a successor then waits the grace.
   */
  readonly unreleased: readonly string[];
}

/**
 * A lease manager, made by {@linkcode createLeaseManager}.
 *
 * - {@linkcode LeaseManager.guard} runs a write under the lease of a key,
 *   or refuses it; with `wait: true` it waits its turn instead.
 * - {@linkcode LeaseManager.campaign} elects a leader: a lease per tenure.
 * - {@linkcode LeaseManager.holder} and {@linkcode LeaseManager.watch} tell
 *   who holds a key, once or as it changes (hints, to route by).
 * - {@linkcode LeaseManager.release} and {@linkcode LeaseManager.close}
 *   hand keys on at once.
 *
 * @example Wait for a key, then elect a leader on another
 * ```ts ignore
 * await leases.guard("orders", write, { wait: true, signal });
 * for await (const lease of leases.campaign("scheduler", { signal })) {
 *   await lead(lease); // until lease.signal aborts
 * }
 * ```
 */
export interface LeaseManager extends AsyncDisposable, EventTarget {
  /** This process's node id. */
  readonly node: string;
  /** The lease TTL in milliseconds in force (given or adopted from the bucket). */
  readonly ttl: number;
  /** The name of the KV bucket. */
  readonly bucket: string;
  /**
   * Runs `write` under the lease of `key`: acquires or renews it by
   * compare-and-set, enforces the failover grace, and (with the default
   * `check: "cas"`) calls `write` only after a CAS sent after this call
   * confirmed that this node holds the key. In steady state this costs one
   * server round trip; concurrent guards on one key share it. With
   * `check: "lease"`, a key held with its deadline at least
   * {@linkcode leaseCheckMargin} away costs none: the write runs at once,
   * inside this call, on the strength of the last renewal's CAS.
   *
   * A key once acquired is renewed in the background (every TTL/3) until
   * {@linkcode LeaseManager.release}, `close()`, or `idleRelease`.
   *
   * @typeParam T What `write` returns.
   * @param key The store key: ASCII letters, digits, `-`, `_`, `/`, `=` and non-empty `.`-separated tokens.
   * @param write The write; it gets the {@linkcode Lease} with the fencing epoch, deadline and loss signal.
   * @param options A signal to stop waiting, `wait` to wait for the key instead of being refused, and `check: "lease"` to write on a held key with no round trip while its deadline is far enough.
   * @returns What `write` returns; what it throws is rethrown unchanged, and the lease stays held.
   * @throws {NotHolderError} Another node holds the key, or the grace after a takeover is running; `write` was not called. Never with `wait: true`.
   * @throws {UnavailableError} The server could not be reached, answered too late, or the bucket is gone; `write` was not called. With `wait: true`, only when the bucket is gone or the connection closed for good.
   * @throws {TypeError} The key is invalid, `write` is not a function, `wait` is not a boolean, `check` is neither `"cas"` nor `"lease"`, `signal` is not an `AbortSignal`, or the manager is closed (also while waiting).
   * @throws {unknown} With `wait: true`, the reason of `options.signal` when it aborts before the write started.
   *
   * @example Guard a write
   * ```ts ignore
   * const n = await leases.guard("orders", (lease) => {
   *   const record = prepare();
   *   lease.throwIfLost(); // right before the commit point
   *   return store.append(lease.epoch, record);
   * });
   * // Or wait (at most a minute) for the node that holds the key to let go:
   * await leases.guard("orders", write, { wait: true, signal: AbortSignal.timeout(60_000) });
   * // Or, on a key this node holds, write on the last renewal's strength:
   * await leases.guard("orders", write, { check: "lease" });
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
   * @throws {TypeError} The key is invalid or the manager is closed.
   *
   * @example Check a lease
   * ```ts ignore
   * if (await leases.held("orders")) console.log("this node writes orders");
   * ```
   */
  held(key: string): Promise<boolean>;
  /**
   * Reads who holds `key`, to route writes to it. A read, so a hint: it
   * may be a moment stale. Keeps no state for the key.
   *
   * @param key The store key.
   * @returns The holder, or `null` when nobody holds the key.
   * @throws {UnavailableError} The server could not be reached.
   * @throws {TypeError} The key is invalid or the manager is closed.
   *
   * @example Route a write
   * ```ts ignore
   * const h = await leases.holder("orders");
   * if (h && h.node !== leases.node) forwardTo(h.node);
   * ```
   */
  holder(key: string): Promise<Holder | null>;
  /**
   * Reads who holds each key under `prefix` (the keys `prefix.<anything>`),
   * for recipes that keep a family of leases (a semaphore's slots, a
   * group's members) and for dashboards. Every entry is read from the
   * stream leader, so a key this or another manager acquired before the
   * call began is seen (as far as the server gives read-your-writes); keys
   * released, deleted or expired are left out. Like
   * {@linkcode LeaseManager.holder} it keeps no state and authorises
   * nothing: by the time it resolves a holder may have changed.
   *
   * @param prefix A valid key; the keys listed are those below it.
   * @returns Each held key under `prefix`, with its holder.
   * @throws {UnavailableError} The server could not be reached.
   * @throws {TypeError} The prefix is not a valid key or the manager is closed.
   *
   * @example List a family of leases
   * ```ts ignore
   * for (const [key, h] of await leases.holders("reports")) {
   *   console.log(`${key} is held by ${h.node} under epoch ${h.epoch}`);
   * }
   * ```
   */
  holders(prefix: string): Promise<Map<string, Holder>>;
  /**
   * Gives up the lease of `key`: waits for its in-flight writes to settle
   * (renewing meanwhile, at most `settleTimeout`), deletes our entry by
   * compare-and-delete on our own revision so a successor takes over at
   * once, aborts the lease signal, stops renewing and forgets the key. A
   * release that cannot be clean (writes still running, the failover grace
   * still running, the lease no longer confirmed) leaves the entry to
   * expire instead, so the successor waits the grace. Once it resolves,
   * nothing more is sent on the key (a request already in flight may still
   * be answered) unless a guard on it runs, which acquires it again.
   * Resolves at once for a key not held.
   *
   * @param key The store key.
   * @returns A promise that resolves when the key is released or left to expire.
   * @throws {TypeError} The key is invalid.
   *
   * @example Release a key this node is done with
   * ```ts ignore
   * await leases.guard("import-2026-12", (l) => runImport(l.epoch));
   * await leases.release("import-2026-12");
   * ```
   */
  release(key: string): Promise<void>;
  /**
   * Leader election on `key`: yields a {@linkcode Lease} each time this node
   * becomes the holder and any failover grace is over, then waits until
   * that lease's `signal` aborts (the tenure ended: lost, not renewed in
   * time, or released) and campaigns again. Each tenure is won by the
   * ordinary acquire path (read, compare-and-set, grace), as a guard with
   * `wait: true` wins it, so a yielded lease has a greater epoch than any
   * earlier holder's.
   *
   * The lease is renewed in the background while the campaign leads
   * (`idleRelease` does not apply); the leader's work runs outside a
   * guarded write, so check `signal` or `throwIfLost()` before each step
   * and fence what it writes with the epoch. Ends (returns) when
   * `options.signal` aborts or the manager closes; leaving the loop
   * (`break`, a throw, or the signal) releases the key as
   * {@linkcode LeaseManager.release} does, also for other guards of this
   * manager on the key. Iterations of one key share one watch with that
   * key's waiting guards and watch iterators.
   *
   * @param key The store key.
   * @param options A signal that ends the campaign.
   * @returns The tenures won, as leases, one at a time.
   * @throws {TypeError} The key is invalid, `signal` is not an `AbortSignal`, or the manager is closed.
   * @throws {UnavailableError} While iterating: the bucket is gone or the connection closed for good.
   *
   * @example Run a singleton job on whichever node leads
   * ```ts ignore
   * for await (const lease of leases.campaign("scheduler", { signal })) {
   *   while (!lease.signal.aborted) {
   *     lease.throwIfLost();
   *     await runOnce(lease.epoch);
   *   }
   * }
   * ```
   */
  campaign(key: string, options?: WatchOptions): AsyncIterable<Lease>;
  /**
   * Follows who holds `key`: yields the current holder (`null` when nobody
   * holds it), then every change in order, with its epoch: a new holder, a
   * release, a delete, an expiry. Renewals by the same holder yield
   * nothing. A hint, like {@linkcode LeaseManager.holder}: it comes from a
   * watch that may lag (a replica behind the stream leader, a reconnect),
   * so route by it but never let it authorise a write. Changes between two
   * reads may be missed when the consumer falls behind, but never reordered.
   * Servers before 2.11 (or buckets without subject delete markers) send no
   * message when an entry expires: the `null` then comes from reads made
   * every 25 ms from one TTL after the holder's last renewal was seen.
   *
   * Ends (returns) when `options.signal` aborts, the manager closes, or the
   * connection closes for good; throws {@linkcode UnavailableError} when
   * the manager finds its bucket deleted or re-created. Iterators of one
   * key share one watch.
   *
   * @param key The store key.
   * @param options A signal that ends the iteration.
   * @returns The holder, then each change of holder.
   * @throws {TypeError} The key is invalid, `signal` is not an `AbortSignal`, or the manager is closed.
   * @throws {UnavailableError} While iterating: the bucket was deleted or re-created.
   *
   * @example Route writes to the holder
   * ```ts ignore
   * for await (const holder of leases.watch("orders", { signal })) {
   *   router.set("orders", holder?.node ?? null);
   * }
   * ```
   */
  watch(key: string, options?: WatchOptions): AsyncIterable<Holder | null>;
  /**
   * Shuts down: new guards reject at once, waiting guards reject, campaigns
   * and watch iterators end, and every watch is stopped (its server
   * consumer deleted); in-flight writes settle (their
   * leases renewed meanwhile, at most `settleTimeout`); then each held lease
   * is released as {@linkcode LeaseManager.release} does, each attempt
   * bounded by the request timeout. Safe to call twice.
   *
   * @returns Which keys were released and which were left to expire.
   *
   * @example Shut down
   * ```ts ignore
   * const { unreleased } = await leases.close();
   * if (unreleased.length) console.warn("left to expire:", unreleased);
   * ```
   */
  close(): Promise<CloseResult>;
  /**
   * Whether this manager can still vouch for what it holds, and why not,
   * read from its own state (no server round trip): made for readiness and
   * liveness probes.
   *
   * @throws {RangeError} `margin` is not a non-negative number.
   *
   * @example A health endpoint
   * ```ts ignore
   * Deno.serve({ port: 8080 }, () => {
   *   const h = leases.health();
   *   return Response.json(h, { status: h.ok ? 200 : 503 });
   * });
   * ```
   */
  health(options?: HealthOptions): LeaseHealth;
  /**
   * Listens for one of the {@linkcode LeaseEventMap} events. Events are
   * dispatched after the change they report, never on a guard's path that
   * changes nothing; a listener that throws is reported on the console and
   * breaks nothing.
   *
   * @example Log every lost lease
   * ```ts ignore
   * leases.addEventListener("lost", (e) => console.warn(e.key, e.reason));
   * ```
   */
  addEventListener<K extends keyof LeaseEventMap>(
    type: K,
    listener: (event: LeaseEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions,
  ): void;
  /**
   * Listens for an event by name, as on any `EventTarget`.
   *
   * @example Listen once
   * ```ts ignore
   * leases.addEventListener("defunct", () => process.exit(1), { once: true });
   * ```
   */
  addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  /**
   * Removes a listener added by {@linkcode LeaseManager.addEventListener}.
   *
   * @example Stop logging
   * ```ts ignore
   * const log = (e: LeaseLostEvent) => console.warn(e.key, e.reason);
   * leases.addEventListener("lost", log);
   * leases.removeEventListener("lost", log);
   * ```
   */
  removeEventListener<K extends keyof LeaseEventMap>(
    type: K,
    listener: (event: LeaseEventMap[K]) => void,
    options?: boolean | EventListenerOptions,
  ): void;
  /**
   * Removes a listener by event name, as on any `EventTarget`.
   *
   * @example Remove a listener object
   * ```ts ignore
   * leases.removeEventListener("released", handler);
   * ```
   */
  removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
}
