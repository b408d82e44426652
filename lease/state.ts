import type { Seen } from "./entry.ts";
import type { LostReason } from "./events.ts";

// ---------------------------------------------------------------------------
// Per-key state.

interface Batch {
  promise: Promise<void>;
  resolve: () => void;
  reject: (err: unknown) => void;
  /**
   * The callers that asked for it other than the renewal timer (a guard,
   * `held()`): only they may have it acquire a key that is not held.
   */
  callers: number;
}

export function batch(): Batch {
  let resolve!: () => void;
  let reject!: (err: unknown) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  // A batch nobody awaits (a background renewal) must not surface as an
  // unhandled rejection.
  promise.catch(() => {});
  return { promise, resolve, reject, callers: 0 };
}

/**
 * One holder's continuous tenure of a key: one epoch, one loss signal, and
 * the deadline until which the manager vouches for it.
 */
export class Tenure {
  readonly epoch: number;
  /** {@linkcode Lease.tenure}: this manager's instance id and a count. */
  readonly id: string;
  readonly controller: AbortController = new AbortController();
  /** Local monotonic time until which the last confirmed CAS vouches for us. */
  validUntil = 0;
  /**
   * Not vouched for while set (point 10): the connection was lost, and the
   * server it comes back to may have lost our acknowledged writes. Cleared
   * when it comes back to the same server process, or once the key's last
   * entry proves to be still ours.
   */
  suspended = false;
  /** The manager's count of `"other"` reconnects when it was suspended. */
  suspendedAt = 0;
  /**
   * A write of ours was in flight when the connection was lost: it may be
   * applied by the server we reconnect to, after the suspension began.
   */
  crossed = false;
  /**
   * A CAS of this tenure timed out, and no later one was answered on the
   * same connection: nats.js may still hold it unsent (a paused process
   * wakes with its timers before its socket's news), and then sends it to
   * whatever server the connection comes back to. At a drop this counts
   * as a write in flight.
   */
  unanswered = false;

  /** Told once when the tenure ends, and why (the manager's events). */
  readonly #report: TenureReport | undefined;

  constructor(epoch: number, id: string, report?: TenureReport) {
    this.epoch = epoch;
    this.id = id;
    this.#report = report;
  }

  /** Ends the tenure: the signal aborts and the deadline stops at `now`. */
  end(reason: unknown, now: number, why: TenureEnd = "expired"): void {
    if (this.controller.signal.aborted) return;
    this.validUntil = Math.min(this.validUntil, now);
    this.controller.abort(reason);
    this.#report?.(this, reason, why);
  }
}

/** Why a tenure ended: a loss, or its release. */
type TenureEnd = LostReason | "released";

/** Hears of a tenure's end. */
export type TenureReport = (t: Tenure, reason: unknown, why: TenureEnd) => void;

/** An acquiring CAS whose reply we have not seen. */
export interface Pending {
  counter: number;
  grace: number;
  sent: number;
  /** The manager's highest applied revision when it was sent. */
  floor: number;
  /** How many drops the connection had seen when it was sent. */
  downs: number;
  /** The marker proof that left with it, if its grace waits for one. */
  proof?: Promise<number>;
}

export class KeyState {
  readonly key: string;
  readonly subject: string;
  /** We believe we hold the key (possibly unconfirmed after a timeout). */
  held = false;
  /** The revision we last wrote (valid when held). */
  rev = 0;
  /** The current (or last) tenure; its epoch is the revision it began at. */
  tenure: Tenure | undefined;
  /** Local monotonic time of the next background renewal. */
  renewAt = 0;
  /** No write before this monotonic time (failover grace). */
  notBefore = 0;
  /** This process saw another node hold the key. */
  sawForeign = false;
  /** The first acquire tried a CAS expecting no entry without reading. */
  probed = false;
  /** The last foreign holder seen. */
  foreign: string | undefined;
  /**
   * A foreign entry's revision, who wrote it (node and tag, `entryId`) and
   * when we first saw it (for stale-entry takeover). The writer is kept
   * beside the revision because a server that lost an acknowledged tail
   * numbers new writes with the lost revisions again: a live holder's
   * fresh entry may carry the revision we saw a TTL ago on another one.
   */
  observed: { seq: number; id: string; at: number } | undefined;
  /** Our acquiring CASes whose fate we do not know yet. */
  pending: Pending[] = [];
  /** One server operation per key at a time; guards arriving meanwhile share the next. */
  busy = false;
  next: Batch | undefined;
  /** Resolves when no server operation is running for the key. */
  idle: Promise<void> = Promise.resolve();
  /** The renewal slot this key is planned in (0: none). */
  renewSlot = 0;
  expiryTimer: unknown;
  /** Guarded writes running now, and who waits for them to settle. */
  writes = 0;
  drained: (() => void)[] = [];
  /** Set while `release()` or `close()` gives the key up. */
  releasing: Promise<boolean> | undefined;
  /**
   * Given up and forgotten. An operation still in flight when the release
   * stopped waiting for it may land later: it must not bring the key back
   * to life (it is left to expire, unrenewed).
   */
  gone = false;
  /** When a guard last used the key (for `idleRelease`). */
  lastUse = 0;
  /** The renewal timer asked for the next operation (for `renewed`). */
  renewalDue = false;

  constructor(key: string, subject: string) {
    this.key = key;
    this.subject = subject;
  }
}

/**
 * How late, at most, the server's expiry of an entry is taken to be: it
 * expires entries 80-250 ms after their max age (measured on 2.9.10 and
 * 2.15.2), and an expiry without a subject delete marker sends no message.
 */
export const EXPIRY_MARGIN = 300;

/**
 * Without markers, the fallback looks for the expiry from the end of the TTL
 * (2.9.10 expires entries nearly on time) every {@linkcode EXPIRY_STEP} ms
 * until this long after it (twice the lateness above, for a loaded server):
 * at most 25 reads per holder that stopped renewing, then every TTL/10.
 */
export const EXPIRY_WINDOW = 600;

/** The pause between two of those reads. */
export const EXPIRY_STEP = 25;

/**
 * The first pause after an UnavailableError of a waiting guard; it doubles
 * to TTL/3, unless news of the key or the connection's return ends it.
 */
export const FIRST_BACKOFF = 50;

/** News of a key for a watch iterator: `undefined` when the watch ended. */
export type Listener = (seen: Seen | null | undefined) => void;

/**
 * One watch of one key, shared by every waiting guard, campaign and watch
 * iterator of the key, and stopped when the last of them leaves. It only
 * decides when a waiter tries the acquire path again; it authorises
 * nothing (a watch is a read, and may lag).
 */
export class KeyWatch {
  readonly key: string;
  readonly subject: string;
  /** Waiting guards, campaigns and watch iterators using it. */
  users = 0;
  handle: { stop(): Promise<void> } | undefined;
  stopped = false;
  /** The last news: `undefined` before the first. */
  seen: Seen | null | undefined;
  /** When `seen` came, or was last renewed by the same holder. */
  seenAt = 0;
  /** The highest revision seen: older news (a lagging read) is dropped. */
  lastSeq = 0;
  /** Counts the news that may let a waiter in. */
  wakes = 0;
  /** Counts those wakes that did not follow a failed fallback read. */
  news = 0;
  /** The `seenAt` whose entry the waiters were last woken for as overdue. */
  dueWake = -1;
  /** Waiting guards to wake on such news (or the fallback timer). */
  readonly waiters: Set<() => void> = new Set();
  readonly listeners: Set<Listener> = new Set();
  /** The fallback (and, without `Port.watch`, polling) timer. */
  timer: unknown;
  /** A fallback read is running. */
  reading = false;
  /**
   * On a fenced bucket, the watch of the session that the holder's tenure
   * entry names, while anyone waits for the key: its end wakes them.
   */
  session: SessionWatch | undefined;

  constructor(key: string, subject: string) {
    this.key = key;
    this.subject = subject;
  }
}

/**
 * A watch of another manager's session entry (the fenced layout), shared by
 * the keys whose waiters wait on that session: an expiry marker or a delete
 * wakes them at once, so they need not read the entry on every check.
 */
export class SessionWatch {
  readonly id: string;
  /** The keys whose waiters it wakes. */
  readonly keys: Set<KeyWatch> = new Set();
  handle: { stop(): Promise<void> } | undefined;
  /** The watch's last news showed the session's entry live. */
  live = false;
  /** When a check last read the entry itself (the port's clock). */
  readAt = 0;

  constructor(id: string) {
    this.id = id;
  }
}
