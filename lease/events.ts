/**
 * How a key was found when this node took it, as
 * {@linkcode LeaseAcquiredEvent.found} reports it:
 * - `"fresh"`: no entry (never used, or expired without a marker);
 * - `"released"`: a lease manager's clean release;
 * - `"expired"`: an expiry marker (the previous holder stopped renewing);
 * - `"removed"`: deleted or purged by someone other than its holder;
 * - `"stood-still"`: another holder's entry, unrenewed for a whole TTL;
 * - `"own"`: an entry of this node id from another process, adopted at
 *   once (`restartGrace: false`);
 * - `"lapsed"`: our own entry, renewed after our deadline had passed (a
 *   new tenure);
 * - `"recovered"`: our own acquire, whose reply was lost, found applied;
 * - `"session-ended"` (fenced layout): another holder's tenure entry whose
 *   session's entry expired, was deleted, or was never there;
 * - `"crashed"` (fenced layout): another holder's tenure entry whose
 *   session's connection is gone (the server answered its probe "no
 *   responders").
 */
export type AcquiredFrom =
  | "session-ended"
  | "crashed"
  | "fresh"
  | "released"
  | "expired"
  | "removed"
  | "stood-still"
  | "own"
  | "lapsed"
  | "recovered";

/**
 * Dispatched (type `"acquired"`) when this node begins a tenure of a key.
 *
 * @example Log takeovers
 * ```ts ignore
 * leases.addEventListener("acquired", (e) => {
 *   console.log(`${e.key}: epoch ${e.epoch}, found ${e.found}, grace ${e.grace} ms`);
 * });
 * ```
 */
export class LeaseAcquiredEvent extends Event {
  /** The store key. */
  readonly key: string;
  /** The new tenure's fencing epoch. */
  readonly epoch: number;
  /** The new tenure's id ({@linkcode Lease.tenure}). */
  readonly tenure: string;
  /** The failover grace owed before the first write, in milliseconds. */
  readonly grace: number;
  /** How the key was found. */
  readonly found: AcquiredFrom;

  /**
   * Made by the manager; exported for listeners' types and tests.
   *
   * @param key The store key.
   * @param epoch The fencing epoch.
   * @param tenure The tenure's id.
   * @param grace The grace in milliseconds.
   * @param found How the key was found.
   */
  constructor(
    key: string,
    epoch: number,
    tenure: string,
    grace: number,
    found: AcquiredFrom,
  ) {
    super("acquired");
    this.key = key;
    this.epoch = epoch;
    this.tenure = tenure;
    this.grace = grace;
    this.found = found;
  }
}

/**
 * Why a tenure ended other than by a release, as
 * {@linkcode LeaseLostEvent.reason} reports it:
 * - `"overwritten"`: another node's entry replaced ours
 *   ({@linkcode LeaseLostEvent.holder} names it);
 * - `"deleted"`: our entry was deleted or purged, or expired;
 * - `"expired"`: the deadline passed without a confirmed renewal (the
 *   server unreachable, or the process paused);
 * - `"unproven"`: a renewal crossed a lost connection, and the server it
 *   came back to may have applied it over another holder's entry;
 * - `"defunct"`: the manager stopped for good (the bucket deleted or
 *   re-created, the connection closed, the server lost writes it had
 *   acknowledged); a {@linkcode LeaseDefunctEvent} says why.
 */
export type LostReason =
  | "overwritten"
  | "deleted"
  | "expired"
  | "unproven"
  | "defunct";

/**
 * Dispatched (type `"lost"`) when a tenure of this node ends other than by
 * its release: its leases' signals have aborted.
 *
 * @example Count losses by reason
 * ```ts ignore
 * leases.addEventListener("lost", (e) => {
 *   console.warn(`lost ${e.key} (epoch ${e.epoch}): ${e.reason}`, e.holder ?? "");
 * });
 * ```
 */
export class LeaseLostEvent extends Event {
  /** The store key. */
  readonly key: string;
  /** The ended tenure's fencing epoch. */
  readonly epoch: number;
  /** The ended tenure's id ({@linkcode Lease.tenure}). */
  readonly tenure: string;
  /** Why it ended. */
  readonly reason: LostReason;
  /** The node that took the key, when the reason is `"overwritten"`. */
  readonly holder: string | undefined;
  /** The error the tenure's leases were aborted with. */
  readonly error: Error;

  /**
   * Made by the manager; exported for listeners' types and tests.
   *
   * @param key The store key.
   * @param epoch The fencing epoch.
   * @param tenure The tenure's id.
   * @param reason Why it ended.
   * @param holder The node that took the key, if known.
   * @param error The abort reason of the tenure's leases.
   */
  constructor(
    key: string,
    epoch: number,
    tenure: string,
    reason: LostReason,
    holder: string | undefined,
    error: Error,
  ) {
    super("lost");
    this.key = key;
    this.epoch = epoch;
    this.tenure = tenure;
    this.reason = reason;
    this.holder = holder;
    this.error = error;
  }
}

/**
 * Dispatched (type `"released"`) when this node gives a key up, by
 * {@linkcode LeaseManager.release}, {@linkcode LeaseManager.close}, the
 * manager's signal or `idleRelease`.
 *
 * @example See releases that left the key to expire
 * ```ts ignore
 * leases.addEventListener("released", (e) => {
 *   if (!e.clean) console.warn(`${e.key} left to expire: its successor waits the grace`);
 * });
 * ```
 */
export class LeaseReleasedEvent extends Event {
  /** The store key. */
  readonly key: string;
  /** The ended tenure's fencing epoch. */
  readonly epoch: number;
  /** The ended tenure's id ({@linkcode Lease.tenure}). */
  readonly tenure: string;
  /**
   * Whether the entry was deleted by a clean release, so a successor takes
   * the key at once; `false`: left to expire (writes still running, the
   * grace still running, or the server unreachable).
   */
  readonly clean: boolean;

  /**
   * Made by the manager; exported for listeners' types and tests.
   *
   * @param key The store key.
   * @param epoch The fencing epoch.
   * @param tenure The tenure's id.
   * @param clean Whether the release deleted the entry.
   */
  constructor(key: string, epoch: number, tenure: string, clean: boolean) {
    super("released");
    this.key = key;
    this.epoch = epoch;
    this.tenure = tenure;
    this.clean = clean;
  }
}

/**
 * Dispatched (type `"renewal-failed"`) when a renewal of a held key got no
 * answer or could not be sent; the manager retries while the deadline
 * allows.
 *
 * @example Warn before a lease runs out
 * ```ts ignore
 * leases.addEventListener("renewal-failed", (e) => {
 *   console.warn(`${e.key}: renewal failed, ${Math.round(e.remaining)} ms left`, e.error.message);
 * });
 * ```
 */
export class RenewalFailedEvent extends Event {
  /** The store key. */
  readonly key: string;
  /** The tenure's fencing epoch. */
  readonly epoch: number;
  /** Why the renewal failed. */
  readonly error: Error;
  /** Milliseconds left before the deadline (0 once it has passed). */
  readonly remaining: number;

  /**
   * Made by the manager; exported for listeners' types and tests.
   *
   * @param key The store key.
   * @param epoch The fencing epoch.
   * @param error Why it failed.
   * @param remaining Milliseconds left before the deadline.
   */
  constructor(key: string, epoch: number, error: Error, remaining: number) {
    super("renewal-failed");
    this.key = key;
    this.epoch = epoch;
    this.error = error;
    this.remaining = remaining;
  }
}

/**
 * Dispatched (type `"renewed"`) when a renewal the manager made on its own
 * timer confirmed a held key. Guards that renew a key on their way (the
 * default CAS check) dispatch nothing: a key they keep busy is rarely
 * renewed by the timer, and their round trip is the guard's own.
 *
 * @example Log slow renewals
 * ```ts ignore
 * leases.addEventListener("renewed", (e) => {
 *   if (e.duration > 100) console.warn(`${e.key}: renewal took ${e.duration} ms`);
 * });
 * ```
 */
export class LeaseRenewedEvent extends Event {
  /** The store key. */
  readonly key: string;
  /** The tenure's fencing epoch. */
  readonly epoch: number;
  /**
   * Milliseconds from the renewal's start until the server confirmed it:
   * one round trip, more when a reply was lost and the key was read.
   */
  readonly duration: number;

  /**
   * Made by the manager; exported for listeners' types and tests.
   *
   * @param key The store key.
   * @param epoch The fencing epoch.
   * @param duration Milliseconds the renewal took.
   */
  constructor(key: string, epoch: number, duration: number) {
    super("renewed");
    this.key = key;
    this.epoch = epoch;
    this.duration = duration;
  }
}

/**
 * Dispatched (type `"defunct"`) once, when the manager stops vouching for
 * anything for good: the bucket deleted or re-created, the connection
 * closed, or the server found to have lost writes it acknowledged.
 *
 * @example Restart the process when the manager is defunct
 * ```ts ignore
 * leases.addEventListener("defunct", (e) => {
 *   console.error("lease manager stopped:", e.reason);
 *   process.exitCode = 1;
 * });
 * ```
 */
export class LeaseDefunctEvent extends Event {
  /** Why the manager stopped. */
  readonly reason: string;

  /**
   * Made by the manager; exported for listeners' types and tests.
   *
   * @param reason Why the manager stopped.
   */
  constructor(reason: string) {
    super("defunct");
    this.reason = reason;
  }
}

/** The events a {@linkcode LeaseManager} dispatches, by type. */
export interface LeaseEventMap {
  /** A tenure began. */
  acquired: LeaseAcquiredEvent;
  /** A tenure ended other than by a release. */
  lost: LeaseLostEvent;
  /** A key was given up. */
  released: LeaseReleasedEvent;
  /** A renewal failed. */
  "renewal-failed": RenewalFailedEvent;
  /** The renewal timer renewed a key. */
  renewed: LeaseRenewedEvent;
  /** The manager stopped for good. */
  defunct: LeaseDefunctEvent;
}
