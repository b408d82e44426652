/**
 * Single-writer leases over a NATS JetStream KV bucket.
 *
 * ## The model
 * One KV entry per store key. Its value is the holder's node id (raw UTF-8,
 * so a node running the Go design this ports can share the bucket), and the
 * bucket's max age is the lease TTL: an entry nobody renews disappears.
 *
 * ## What is guaranteed
 * A guarded write of one tenure (one holder's continuous hold of a key)
 * overlaps a write of another tenure of the same key only if the earlier
 * write ran past its lease's deadline by more than the grace (one TTL), and
 * then the later write carries the greater epoch, so a store that rejects
 * stale epochs refuses the late one. The simulator in `sim/` checks this
 * (P1) and four more properties on every history it explores: epochs grow
 * from tenure to tenure (P2); no write starts after its lease's
 * `throwIfLost()` would throw (P3); a CAS that succeeded is never reported
 * lost (P4); a crashed holder is replaced within TTL + late expiry + grace
 * + a small bound (P5).
 *
 * ## Assumptions
 * - Clocks: each process measures time with a monotonic clock whose rate
 *   differs from real time by a small bound (the simulator uses 0.1%); the
 *   grace absorbs that drift over one TTL. The clients' wall clocks do not
 *   matter. The server's do: nats-server expires an entry by comparing its
 *   wall clock with the entry's timestamp, so a forward step of a server's
 *   clock (a one-off NTP correction) expires entries early, and a successor
 *   may start inside a live holder's deadline. Slew server clocks; never
 *   step them forward while leases are held.
 * - Durability: the server keeps every write it acknowledged. By default
 *   JetStream acknowledges a write before it reaches the disk and syncs
 *   every two minutes, so an OS crash, a power failure or a store restored
 *   from a copy can lose an acknowledged tail. The stream then numbers new
 *   writes with the lost revisions again. What this breaks, as measured on
 *   2.15.2 by a review that restored an older copy of the store under
 *   running managers: a fresh process found the key empty and took it at once
 *   while the holder, whose acquire was lost, went on writing for 2.5 s;
 *   a holder's renewal expecting revision 3 was applied on top of the
 *   successor's entry at revision 3, so both held under epoch 1; with
 *   `markers: false` the grace kept them apart but epochs still repeated.
 *   Run the server with `jetstream { sync_interval: always }` (every write
 *   is synced before it is acknowledged) where leases fence anything that
 *   matters. Without it, point 10 keeps holders apart when the lost tail
 *   comes with a restart that drops their connections, with the residue it
 *   lists; epochs may still repeat (10).
 * - The server: the stream leader applies a compare-and-set atomically
 *   (nats-server 2.9.21+ on replicated streams, checked where the client
 *   can see the servers: at start-up the leader and a quorum of the peers,
 *   and a peer that was down then once a second until it answers; one on
 *   an older release stops the manager for good). Residue: such a peer
 *   elected leader within a second of coming back, before its first
 *   answer, is trusted meanwhile. It expires an entry no earlier than its
 *   max age after stamping it (late by up to ~250 ms is fine).
 * - Nothing edits the stream behind the KV API: a stream purge, a message
 *   delete or a re-created bucket can erase the history this argument
 *   reads (a re-created bucket is detected when seen, see 6). Deleting or
 *   purging a key through the KV API is allowed and costs only time.
 * - Markers: a stream edit that removes or lowers the marker TTL, and a
 *   server rolled back to a release without markers, are seen at the next
 *   decision on an empty key (3), which proves markers afresh; nothing
 *   else depends on them. What that cannot see is listed in 3: an edit or
 *   rollback together with a holder's expiry inside one compare-and-set's
 *   flight, markers removed and restored again around a holder's expiry,
 *   and a cluster peer rolled back under the same name. So raise or
 *   restore a marker TTL only when no entry or tombstone of a lease key
 *   can have expired under the lower setting within the last TTL.
 *
 * ## The safety argument, in one place
 * 1. **Only a compare-and-set authorises a write.** Every guarded write is
 *    preceded by a publish with `Nats-Expected-Last-Subject-Sequence` set to
 *    the revision we last wrote. The stream leader applies it only if nobody
 *    wrote the key since, so its success proves, at that moment, that we
 *    still hold the lease. Reads may come from a stale replica and only
 *    choose what to try next; an acquiring CAS expects exactly the
 *    revision it read, so what it decided from that entry is what it
 *    overwrites. With `check: "lease"` that CAS may be the last renewal
 *    rather than one sent for this write: 9 says why that is enough.
 * 2. **A monotonic deadline bounds what a success is worth.** A CAS sent at
 *    local time `t` keeps the entry alive on the server until at least
 *    `t + ttl` (the server stamps it on arrival, after `t`), so we vouch
 *    for the lease until `t + ttl` (`Lease.deadline`) and no longer. The
 *    lease's `signal` aborts there, driven by a timer and by every piece of
 *    manager code that runs (a paused process may run the write first);
 *    `throwIfLost()` reads the clock, so it is exact at the commit point.
 * 3. **A takeover waits out what the previous holder may still do.** The
 *    grace keeps a displaced holder that passed its commit-point check
 *    just before its deadline a full TTL to finish. What the last entry
 *    says decides how long the successor waits:
 *    - no entry, or the server's `MaxAge` marker: the holder's deadline has
 *      passed (expiry is never early), so one TTL;
 *    - no entry, on a bucket whose markers (nats-server 2.11.2+) are
 *      proven to live `life` when the grace is decided: the CAS expecting
 *      no entry succeeds only if no entry or tombstone of the key expired
 *      within that life, and expiry comes at or after the holder's
 *      deadline, so one TTL less the life (none when it lasts a TTL).
 *      Start-up's proof only turns this path on: a stream edit can remove
 *      or shorten the marker TTL, and a server can be rolled back to a
 *      release without markers, while managers run. So a stream-info
 *      request leaves right behind the CAS (same flush, shared by the
 *      acquisitions that send their CAS in the same turn), reads the
 *      configuration and the servers again (the connected server's
 *      version when it alone holds the stream, else every peer must be
 *      one whose version start-up checked), and the grace is decided once
 *      both are answered: a failed, late or shorter answer leaves the full
 *      grace, or one TTL less the shorter life. An acquire recognised
 *      after its reply was lost, with no drop of the connection since it
 *      was sent, is owed the same: losing a reply changes nothing the
 *      CAS's success proves, but the CAS may have been applied any time
 *      before the read that found it, so a second proof is read then,
 *      after it was applied, and the shorter life of the two decides (one
 *      that crossed a drop is owed two TTLs, 10). What remains: the
 *      server handles the two requests apart, so an edit (or rollback)
 *      and the holder's expiry both between the proof's read and the
 *      CAS's application (about one round trip) go unseen, unless a
 *      second proof reads the edit; markers removed or lowered, then
 *      restored or raised before the (last) proof is read, with the
 *      holder's expiry in between and less than the raised life before
 *      the CAS (it left no marker, or a shorter one, and the
 *      configuration proves the longer life); and a cluster peer restarted
 *      on an older release under a name start-up checked, unless the
 *      stream info read then no longer shows a marker TTL. Assumes
 *      nothing removed a live holder's entry without a marker
 *      (`kv.purge`, a stream purge or message delete);
 *    - a holder's entry that stood still for one TTL of our own time (a
 *      replica late to expire), counted from when this manager first saw
 *      that revision, by a read or through its watch (either comes after
 *      the holder sent it): its deadline has passed too, so one TTL;
 *    - a delete tagged by a lease manager's clean release: none. A release
 *      is clean only after the holder's writes settled, its own grace was
 *      over (a release inside it would hand on a skip it was not owed) and
 *      its lease was still confirmed;
 *    - any other delete or purge (an operator's `kv.delete`): the holder
 *      may be alive and up to one TTL from its deadline, so two TTLs.
 * 4. **The epoch fences what the grace cannot.** The epoch is the revision
 *    at which a holder's tenure began; every later holder's tenure begins
 *    at a higher revision, so a store that rejects epochs older than the
 *    newest it has seen refuses a paused holder that wakes up late.
 * 5. **Ambiguous answers are resolved, not guessed.** A CAS whose reply
 *    timed out may have been applied. We keep our claim and retry the CAS
 *    with the old revision; a "wrong last sequence: N" answer names the
 *    entry that won, and we read that revision from the stream leader (a
 *    lagging replica may not have it yet; not found there means "gone
 *    since", so we ask again rather than conclude). Our writes are tagged
 *    in `Nats-Msg-Id` with a per-process instance id, the epoch (0 for an
 *    acquire) and a counter, so our own renewal or acquire is recognised,
 *    and a restarted process with the same node id is not mistaken for us.
 * 6. **A tenure never outlives its deadline.** A renewal sent after the
 *    deadline passed may still succeed (a replica late to expire, or a
 *    re-created bucket that reached our revision again), but we cannot know
 *    what happened while we did not vouch: it starts a new tenure, with a
 *    new epoch and the two-TTL grace of an unexplained gap.
 * 7. **A bucket that disappears stops the manager for good.** It is seen
 *    when a request finds no stream; when revisions go backwards (within
 *    one stream they only grow); and, after any unanswered request or,
 *    once the manager has written, any silence of more than a TTL between
 *    two answers (a paused process sends nothing and times nothing out),
 *    by comparing the stream's creation time before the next success is
 *    trusted. The manager then stops vouching for every lease and never
 *    re-creates the bucket. Not seen: a bucket deleted and re-created
 *    between two answers less than a TTL apart, whose new stream reached
 *    the holder's revision on the key. Deleting the bucket under live
 *    holders is outside the guarantee (see Assumptions): the successor
 *    finds no trace of them.
 * 8. **Waiting authorises nothing.** A guard with `wait: true`, a campaign
 *    and a watch follow a key through one shared watch (an ordered consumer
 *    on the key's subject), a hint that may lag like any read. What it
 *    reports decides when a waiter runs the acquire path of 1-3 again (a
 *    release, a delete, an expiry marker, another node's entry; one TTL
 *    after the holder's last renewal was seen, when its entry has stood
 *    still that long; and, where no marker will come, reads every 25 ms
 *    for at most 600 ms after that, as servers before 2.11 send nothing
 *    when an entry expires); a renewal by the same holder only moves that
 *    timer. A waiter that found the server unavailable backs off (50 ms,
 *    doubling to TTL/3), but such news, or the connection coming back,
 *    wakes it sooner. The one thing it feeds into a decision is when a
 *    holder's revision was first seen, which the stood-still rule of 3
 *    counts from:
 *    the watch delivers an entry only after its holder sent it, so that
 *    time is never early. A campaign's lease is a
 *    guard's lease, and a release ends the tenure (its signal aborts)
 *    before its delete is sent, so a waiter can see the key free only
 *    after the previous leader was told to stop.
 * 9. **A lease-checked guard writes on the last renewal's strength.** With
 *    `check: "lease"`, a guard on a key this manager holds, past its grace,
 *    runs the write at once if its clock reads at least
 *    `m = 2ρ·TTL` before the deadline (ρ = `CLOCK_RATE_BOUND`, each
 *    clock's rate within 1 ± ρ of real time). Let the last confirmed CAS
 *    be sent at real time s. The write starts by real time
 *    s + (TTL - m)/(1 - ρ), which is before s + TTL/(1 + ρ) because
 *    m/TTL ≥ 1 - (1 - ρ)/(1 + ρ) = 2ρ/(1 + ρ). And no other tenure can
 *    begin before s + TTL/(1 + ρ): a successor's CAS succeeds only after
 *    our entry expired (stamped after s, kept a TTL of the server's
 *    clock), or after the successor saw it stand still for a TTL of its
 *    own clock (first seen after s), or after an out-of-band change. So,
 *    out-of-band changes aside, the entry of our tenure is still the key's
 *    last on the stream leader when the write starts, as a CAS would have
 *    proven, and the write starts before the deadline, so 3 and 4 hold as
 *    for any guarded write. What is given up: an operator's delete or a
 *    foreign overwrite is noticed at the next renewal (at most TTL/3
 *    later), not at the next write (a delete still owes a successor two
 *    TTLs, 3), and writes go on through an outage that keeps the
 *    connection (a paused server, a stalled network) until the margin; a
 *    dropped connection stops them at once (10). Too
 *    small a margin, or clocks faster than assumed, lets a write start
 *    after a successor's CAS: the simulator shows both (sim/README.md).
 * 10. **A lost connection suspends every lease until it is proven again.**
 *    A server can lose writes it acknowledged only across a restart
 *    (durability above), and a restart drops every connection to it. From
 *    the moment the client sees its connection drop, no lease of the
 *    manager is vouched for: `throwIfLost()` throws, lease-checked guards
 *    take the CAS path, and nothing is sent on any key until the
 *    connection is back (nats.js would hold it and send it to whatever
 *    server answers next). Back on the same server process (the same
 *    `server_id`), which lost nothing, the leases count again at once. On
 *    another process (a restart, or another server of the cluster), each
 *    held key's last entry is read from the stream leader before anything
 *    else is sent on it: our own entry at the revision we last confirmed
 *    proves it kept; anything else at or below that revision, or no entry
 *    at all in a read sent before our deadline (our entry cannot have
 *    expired yet), proves the server lost writes it acknowledged, so
 *    revisions and epochs repeat and the manager stops for good (as for a
 *    re-created bucket, 7). A
 *    reply to a write sent before the drop and received after it is not
 *    trusted: it may have been applied by the new process over a revision
 *    it reused. Nor is our entry above the revision we last confirmed when
 *    a write of ours was in flight at the drop, or had gone unanswered
 *    since the last one answered (a client may still hold it and send it to
 *    the new process): the tenure ends (`"unproven"`). A release after an
 *    unanswered write leaves the key to expire rather than delete what may
 *    by then be another holder's entry. So a successor that takes a key the lost tail emptied,
 *    even at once, never writes beside this holder's writes from the
 *    drop on. Residue: a server whose machine vanishes without closing
 *    connections is noticed at the holder's next send (a CAS guard at
 *    once, a renewal within TTL/3), and lease-checked writes until then
 *    are outside the guarantee; a holder connected to a cluster server
 *    that kept running while the servers holding the stream lost a tail
 *    is not suspended, nor is one whose server is a leaf node of the one
 *    with the bucket (it sees no drop when that one restarts): each
 *    notices at its next renewal (within TTL/3), where a key with no
 *    entry, or with a revision below its own, stops the manager for good
 *    (a renewal's CAS that finds our own revision reused by the successor
 *    succeeds, and only `tenure` tells the two apart), and its
 *    lease-checked writes until then are outside the guarantee, as are a
 *    write running across the restart and a commit check (`throwIfLost()`)
 *    made before it notices, whatever `check` says; and the
 *    successor's epoch may equal the lost
 *    holder's, so a store that refuses only older epochs accepts both
 *    tenures' writes (before and after the restart) under one epoch.
 *    A process paused across the restart may also run a write's commit
 *    check before its event loop sees the drop, and pass it on a deadline
 *    whose renewal the server lost, while a successor that found the key
 *    emptied writes (the simulator's finding 8).
 *    `Lease.tenure` names each tenure uniquely: a store that refuses the
 *    newest epoch it accepted when another tenure sends it (as well as
 *    older epochs) never accepts two tenures under one epoch, at the cost
 *    of refusing that successor until it takes the key anew.
 *
 * @module
 */

import {
  ClosedConnectionError,
  createInbox,
  type Msg,
  type MsgHdrs,
  MsgHdrsImpl,
  type NatsConnection,
  NoRespondersError,
  type Subscription,
  TimeoutError,
} from "@nats-io/nats-core";
import {
  type ApiError,
  type Consumer,
  type ConsumerMessages,
  DeliverPolicy,
  jetstream,
  JetStreamApiError,
  type JetStreamClient,
  type JetStreamManager,
  jetstreamManager,
  type StoredMsg,
  type StreamInfo,
} from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";

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
 * - `"recovered"`: our own acquire, whose reply was lost, found applied.
 */
export type AcquiredFrom =
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
   * @throws {TypeError} The key is invalid, `write` is not a function, `wait` is not a boolean, `check` is neither `"cas"` nor `"lease"`, or the manager is closed (also while waiting).
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
   * @throws {TypeError} The key is invalid or the manager is closed.
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
   * @throws {TypeError} The key is invalid or the manager is closed.
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
 * The server could not be reached or answered too late, or the bucket is
 * gone; the write was not run. The lease may still be held: a later guard
 * finds out.
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
// clock, its timers, the three server operations it needs, and (optional)
// a watch of one key's subject. Production
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
  /**
   * Watches one subject: calls `onEntry` with its current last entry
   * (`null` when there is none), then with every later message on it, in
   * stream order and each at most once (with its headers, as
   * {@linkcode Port.read} gives them). It may skip messages that a later one
   * replaced before they could be delivered, and after a reconnect it
   * resumes with the subject's last entry. Never rejects: while the server
   * cannot be reached it delivers nothing and keeps trying. An expiry with
   * no subject delete marker delivers nothing (the manager's timers cover
   * it). `stop()` ends the watch and resolves once what it opened on the
   * server is gone (or could not be removed in time); no call follows it.
   * When it finds the bucket's stream deleted or re-created (checked only
   * after its consumer failed), it calls `onGone` once with why, and ends.
   *
   * Optional: without it, the manager reads the key every TTL/3 while
   * someone waits for it or watches it, and treats what it reads as the
   * watch's messages.
   */
  watch?(
    subject: string,
    onEntry: (e: RawEntry | null) => void,
    onGone?: (why: string) => void,
  ): { stop(): Promise<void> };
  /**
   * How long, in ms, the bucket's stream keeps a marker after an entry (or a
   * tombstone) of a key expires, as the stream's configuration and the
   * servers serving it show when the request is answered; 0 when that
   * cannot be proven (no markers, or shorter than a margin; a server that
   * is too old or was not proven at start-up; an error; no answer within
   * `timeout`). Never rejects. The request is sent before the call returns,
   * so one made right after {@linkcode Port.write} goes out with that write
   * (nats.js flushes both in one socket write).
   *
   * Optional: without it, the manager never takes any part of a grace off
   * on the strength of markers (what start-up proved may have changed
   * since: a stream edit, a server rolled back).
   */
  markerLife?(timeout: number): Promise<number>;
  /**
   * Optional: the subjects matching `filter` that have a message in the
   * stream, as the stream leader reports them. Without it,
   * {@linkcode LeaseManager.holders} rejects with a `TypeError`.
   */
  subjects?(filter: string, timeout: number): Promise<string[]>;
  /**
   * Optional: calls `fn` at each change of the connection, in order:
   * `"down"` when it is lost, `"same"` when it is back on the server
   * process it last had (which kept all it acknowledged), `"other"` when
   * it is back on another server process: a restarted server, which may
   * have lost writes it acknowledged (a tail not yet on disk), or another
   * server of a cluster. The first `"down"` is reported before any reply
   * sent after it is delivered. Without it, the manager never suspends a
   * lease for a lost connection (see the safety argument, point 10).
   */
  onLink?(fn: (change: LinkChange) => void): void;
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
  /** Settles when the connection closes for good. */
  closed(): Promise<unknown>;
  /**
   * Optional: called once when `close()` is done, after which the manager
   * sends nothing more; frees what the port holds for it (production: the
   * reply subscription it shares with other managers on the connection,
   * once none uses it and no reply is due).
   */
  close?(): void;
}

/** A change of the connection, as {@linkcode Port.onLink} reports it. */
export type LinkChange = "down" | "same" | "other";

// ---------------------------------------------------------------------------
// Input checks: every one runs before anything is sent to the server.

const KEY_RE = /^[-/=\w]+(\.[-/=\w]+)*$/;
const BUCKET_RE = /^[-\w]+$/;
/** A JetStream domain: one subject token. */
const DOMAIN_RE = /^[^\s.*>]+$/;

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
// What an entry says.

const encoder = new TextEncoder();

/** Our tag: `lease:<instance>:<epoch>:<counter>`; epoch 0 on an acquire. */
const TAG_RE = /^lease:([^:]+):(\d+):(\d+)$/;

/**
 * How the last entry of a key bears on a contender:
 * - `put`: a holder's entry;
 * - `released`: a lease manager's clean release (a delete tagged like our
 *   writes, written only after the holder's writes settled, its own grace
 *   was over and its lease was still confirmed): no grace;
 * - `expired`: no entry, or the server's `MaxAge` marker: the holder's
 *   deadline has passed (expiry is late, never early), so one grace;
 * - `removed`: any other delete or purge (an operator's `kv.delete`): the
 *   holder may still be inside its deadline, so one TTL plus the grace.
 */
interface Seen {
  seq: number;
  kind: "put" | "released" | "expired" | "removed";
  node: string;
  /** The tenure epoch from our tag, else the revision. */
  epoch: number;
  /** The instance and counter from our tag, when the entry carries one. */
  instance: string | undefined;
  counter: number;
  /** Whether the tag says this is an acquire (epoch 0). */
  acquire: boolean;
}

/**
 * Who wrote an entry, as far as it says: its node, and our tag's instance
 * and counter when it carries one (unique per write of a manager). Two
 * entries at one revision with different ids are different writes.
 */
function entryId(seen: Seen): string {
  return `${seen.node}\u0000${seen.instance ?? ""}\u0000${seen.counter}`;
}

function toSeen(e: RawEntry): Seen {
  const tag = TAG_RE.exec(e.msgId ?? "");
  const tagged = tag ? Number(tag[2]) : 0;
  let kind: Seen["kind"];
  if (e.marker !== undefined) {
    kind = e.marker === "MaxAge" ? "expired" : "removed";
  } else if (e.operation === "DEL") kind = tag ? "released" : "removed";
  else if (e.operation === "PURGE") kind = "removed";
  else kind = "put";
  return {
    seq: e.seq,
    kind,
    node: kind === "put" ? e.value : "",
    epoch: tagged > 0 ? tagged : e.seq,
    instance: tag?.[1],
    counter: tag ? Number(tag[3]) : 0,
    acquire: tag !== null && tagged === 0,
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

/**
 * One holder's continuous tenure of a key: one epoch, one loss signal, and
 * the deadline until which the manager vouches for it.
 */
class Tenure {
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
type TenureReport = (t: Tenure, reason: unknown, why: TenureEnd) => void;

/** An acquiring CAS whose reply we have not seen. */
interface Pending {
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

class KeyState {
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
const EXPIRY_MARGIN = 300;

/**
 * Without markers, the fallback looks for the expiry from the end of the TTL
 * (2.9.10 expires entries nearly on time) every {@linkcode EXPIRY_STEP} ms
 * until this long after it (twice the lateness above, for a loaded server):
 * at most 25 reads per holder that stopped renewing, then every TTL/10.
 */
const EXPIRY_WINDOW = 600;

/** The pause between two of those reads. */
const EXPIRY_STEP = 25;

/**
 * The first pause after an UnavailableError of a waiting guard; it doubles
 * to TTL/3, unless news of the key or the connection's return ends it.
 */
const FIRST_BACKOFF = 50;

/** News of a key for a watch iterator: `undefined` when the watch ended. */
type Listener = (seen: Seen | null | undefined) => void;

/**
 * One watch of one key, shared by every waiting guard, campaign and watch
 * iterator of the key, and stopped when the last of them leaves. It only
 * decides when a waiter tries the acquire path again; it authorises
 * nothing (a watch is a read, and may lag).
 */
class KeyWatch {
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

  constructor(key: string, subject: string) {
    this.key = key;
    this.subject = subject;
  }
}

/**
 * What the protocol core needs besides its {@linkcode Port}: the resolved
 * options. `createLeaseManager` makes these; the simulator makes its own.
 */
export interface ManagerSettings {
  /** This process's node id. */
  node: string;
  /** Lease TTL in ms (the bucket's max age). */
  ttl: number;
  /** Request timeout in ms. */
  timeout: number;
  /** The bucket name; subjects are `$KV.<bucket>.<key>`. */
  bucket: string;
  /** See {@linkcode LeaseManagerOptions.restartGrace}. */
  restartGrace: boolean;
  /** See {@linkcode LeaseManagerOptions.settleTimeout}. */
  settleTimeout: number;
  /** See {@linkcode LeaseManagerOptions.idleRelease}. */
  idleRelease: number | undefined;
  /**
   * How long, in ms, start-up proved the stream leader keeps a marker after
   * an entry of the key expires or a tombstone of it expires. 0: not proven
   * (no markers, or servers that could not be checked). It turns on the
   * fast path for empty keys (a compare-and-set expecting no entry, sent
   * without reading first) and paces the watches; the grace itself is
   * shortened only by what {@linkcode Port.markerLife} proves alongside
   * each such compare-and-set, never by this.
   */
  markerLife: number;
  /** See {@linkcode LeaseManagerOptions.check}; `"cas"` when omitted. */
  check?: GuardCheck;
  /** Aborting it closes the manager. */
  signal: AbortSignal | undefined;
}

/**
 * Runs the protocol over `port`. Internal: the simulator's entry point;
 * users call {@linkcode createLeaseManager}.
 *
 * @param port The clock, timers and server operations.
 * @param settings The resolved options.
 * @returns The manager.
 */
export function managerOnPort(
  port: Port,
  settings: ManagerSettings,
): LeaseManager {
  return new Manager(port, settings);
}

function errText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** A lease handed to one guarded write; reads its tenure's live deadline. */
class HeldLease implements Lease {
  readonly key: string;
  readonly node: string;
  readonly epoch: number;
  readonly tenure: string;
  readonly signal: AbortSignal;
  readonly #tenure: Tenure;
  readonly #port: Port;

  constructor(
    key: string,
    node: string,
    tenure: Tenure,
    signal: AbortSignal,
    port: Port,
  ) {
    this.key = key;
    this.node = node;
    this.epoch = tenure.epoch;
    this.tenure = tenure.id;
    this.signal = signal;
    this.#tenure = tenure;
    this.#port = port;
  }

  get deadline(): number {
    return this.#tenure.validUntil;
  }

  /** The same lease, whose signal also aborts when `signal` does. */
  following(signal: AbortSignal | undefined): HeldLease {
    if (!signal) return this;
    return new HeldLease(
      this.key,
      this.node,
      this.#tenure,
      AbortSignal.any([this.signal, signal]),
      this.#port,
    );
  }

  throwIfLost(): void {
    if (this.signal.aborted) throw this.signal.reason;
    if (this.#tenure.suspended) throw suspendedError(this.key);
    const now = this.#port.now();
    if (now >= this.#tenure.validUntil) {
      const err = expiredError(this.key);
      // The timer may not have run yet (a paused process): end it now.
      this.#tenure.end(err, now);
      throw err;
    }
  }
}

function suspendedError(key: string): UnavailableError {
  return new UnavailableError(
    key,
    `Lease on '${key}' is not vouched for: the connection to the server was lost, and the lease counts again only once the server it comes back to confirms it`,
  );
}

function expiredError(key: string): UnavailableError {
  return new UnavailableError(
    key,
    `Lease on '${key}' could not be renewed within its TTL`,
  );
}

// ---------------------------------------------------------------------------

class Manager extends EventTarget implements LeaseManager {
  readonly node: string;
  readonly ttl: number;
  readonly bucket: string;
  readonly #port: Port;
  readonly #nodeBytes: Uint8Array;
  readonly #timeout: number;
  readonly #restartGrace: boolean;
  readonly #markerLife: number;
  readonly #settleTimeout: number;
  readonly #idleRelease: number | undefined;
  readonly #check: GuardCheck;
  /** See {@linkcode leaseCheckMargin}. */
  readonly #margin: number;
  /** Tags our writes so a restarted process with our node id is told apart. */
  readonly #instance: string;
  #counter = 0;
  /** Tenures this manager has begun: {@linkcode Lease.tenure}'s count. */
  #tenures = 0;
  /**
   * The highest revision any of our writes was applied at. Revisions only
   * grow within one stream, so a write applied at or below the value this
   * had when the write was sent proves the bucket was deleted and
   * re-created (epochs restarted).
   */
  #maxRev = 0;
  /** Set when the bucket is gone or was replaced: we vouch for nothing again. */
  #defunct: string | undefined;
  readonly #keys = new Map<string, KeyState>();
  /** Renewal slots: planned time → keys, served by one timer. */
  readonly #slots = new Map<number, KeyState[]>();
  readonly #quantum: number;
  #tickTimer: unknown;
  #tickAt = Infinity;
  /** Set by close(): no new guards. */
  #closing: Promise<CloseResult> | undefined;
  /** Set once close() has released everything: no renewals. */
  #stopped = false;
  readonly #signal: AbortSignal | undefined;
  readonly #onAbort = () => void this.close();
  /** One watch per key, while anyone waits for or watches the key. */
  readonly #watches = new Map<string, KeyWatch>();
  /** Aborted by close(): ends every wait, campaign and watch iterator. */
  readonly #closeCtl = new AbortController();
  /** Keys a campaign leads: `idleRelease` leaves them alone. */
  readonly #leading = new Map<string, number>();
  /** The marker proof the acquisitions sent in this turn share (#markerProof). */
  #proof: Promise<number> | undefined;
  /** The connection is up, as far as {@linkcode Port.onLink} told us. */
  #linkUp = true;
  /** How often the connection was lost: a reply that crossed a loss is not trusted. */
  #downs = 0;
  /** How often it came back, and the waiting guards to wake when it does. */
  #ups = 0;
  readonly #upWaiters = new Set<() => void>();
  /** Each listener's guard against its own exceptions. */
  readonly #guarded = new WeakMap<
    EventListenerOrEventListenerObject,
    EventListener
  >();
  /** Someone listened for `renewed`: only then is one made per renewal. */
  #renewedHeard = false;
  /** A report that tells the manager's listeners of `st`'s tenure's end. */
  #reporter(st: KeyState): TenureReport {
    return (t, reason, why) => {
      if (why === "released") return;
      const err = reason instanceof Error
        ? reason
        : new UnavailableError(st.key, String(reason));
      this.#emit(
        new LeaseLostEvent(
          st.key,
          t.epoch,
          t.id,
          why,
          why === "overwritten" ? st.foreign : undefined,
          err,
        ),
      );
    };
  }
  /** How often it came back on another server process. */
  #moves = 0;

  constructor(port: Port, o: ManagerSettings) {
    super();
    this.#port = port;
    this.node = o.node;
    this.ttl = o.ttl;
    this.#quantum = Math.min(o.ttl / 30, 50);
    this.bucket = o.bucket;
    this.#nodeBytes = encoder.encode(o.node);
    this.#timeout = o.timeout;
    this.#restartGrace = o.restartGrace;
    this.#markerLife = Math.max(0, Math.min(o.markerLife, o.ttl));
    this.#settleTimeout = o.settleTimeout;
    this.#idleRelease = o.idleRelease;
    this.#check = o.check ?? "cas";
    this.#margin = leaseCheckMargin(o.ttl);
    this.#instance = port.newInstanceId();
    this.#signal = o.signal;
    this.#signal?.addEventListener("abort", this.#onAbort, { once: true });
    // A connection closed for good can neither renew nor release: stop the
    // timers (so the process can exit) and stop vouching for any lease.
    void port.closed().then(() => this.#connectionClosed());
    port.onLink?.((change) => this.#onLink(change));
    // A server whose compare-and-set cannot be trusted makes every epoch
    // doubtful (two holders may both succeed on one revision): stop.
    port.onDistrust?.((why) => this.#goDefunct(why));
  }

  /**
   * Point 10: a lost connection may be a server restart that lost the
   * tail of what it acknowledged, our latest renewals included, and
   * another process may then take the key at once, even at one of our
   * revisions. So every lease stops being vouched for when the connection
   * drops, and counts again when it comes back to the same server process
   * (which lost nothing), or once the key's last entry on the server it
   * comes back to is proven ours (#verify, before anything else is sent on
   * the key).
   */
  #onLink(change: LinkChange): void {
    if (change === "down") {
      this.#linkUp = false;
      this.#downs++;
      for (const st of this.#keys.values()) {
        // An acquire still unanswered may be applied by the other server,
        // at a revision that is another holder's there: if it shows up as
        // ours later, it is owed the longest grace.
        for (const p of st.pending) p.grace = Math.max(p.grace, 2 * this.ttl);
        const t = st.tenure;
        if (!st.held || !t || t.controller.signal.aborted) continue;
        if (!t.suspended) {
          t.suspended = true;
          t.suspendedAt = this.#moves;
        }
        if (st.busy || t.unanswered) t.crossed = true;
      }
      return;
    }
    this.#linkUp = true;
    this.#ups++;
    // Waiting guards that found the server unavailable try again now.
    for (const wake of [...this.#upWaiters]) wake();
    if (change === "other") this.#moves++;
    const now = this.#port.now();
    for (const st of this.#keys.values()) {
      const t = st.tenure;
      if (!st.held || !t?.suspended) continue;
      if (change === "same" && t.suspendedAt === this.#moves && !t.crossed) {
        // The same server process all along: nothing it acknowledged is
        // lost, and nothing of ours crossed the gap.
        t.suspended = false;
      } else if (!this.#stopped && !this.#defunct) {
        // Prove the lease at once rather than at the next renewal.
        st.renewAt = now;
        this.#plan(st, now);
      }
    }
  }

  /**
   * Ends the suspension of `st`'s tenure (point 10), or its tenure, or the
   * manager: reads the key's last entry from the stream leader of the
   * server we are now connected to. Our entry at the revision we last
   * confirmed proves the server kept it (a write of ours still in flight
   * can then only land on our own entry). Anything else at or below that
   * revision proves the server lost writes it acknowledged to us: revisions
   * are then reused, so no epoch or revision of this manager can be
   * trusted again, and it stops for good. A later entry of another node is
   * an ordinary loss; a later entry of ours is ours unless a write of ours
   * crossed the gap (it may have landed on a revision reused by another
   * holder), when the tenure ends and the key is acquired anew.
   */
  async #verify(st: KeyState): Promise<void> {
    const t = st.tenure!;
    const downs = this.#downs;
    // Our entry cannot have expired on the server before our deadline
    // (expiry is never early, 3), so no entry at all in a read sent before
    // it means the server lost our writes, as an older entry would.
    const sentInTenure = this.#port.now() < t.validUntil;
    let seen: Seen | null;
    try {
      seen = await this.#read(st.subject, undefined, true);
    } catch (err) {
      this.#retryRenewal(st);
      throw new UnavailableError(
        st.key,
        `cannot tell whether the lease survived the lost connection: ${
          errText(err)
        }`,
        { cause: err },
      );
    }
    if (downs !== this.#downs || !this.#linkUp) {
      this.#retryRenewal(st);
      throw new UnavailableError(st.key, suspendedError(st.key).message);
    }
    if (st.tenure !== t || !st.held) return;
    const ours = this.#ours(st, seen);
    if (ours && seen!.seq === st.rev) {
      t.suspended = false;
      t.crossed = false;
      return;
    }
    if (
      (seen === null && sentInTenure) || (seen !== null && seen.seq <= st.rev)
    ) {
      this.#goDefunct(
        `the server lost writes it had acknowledged: revision ${st.rev} of '${st.key}' was ours, and after the connection came back the key ${
          seen === null
            ? "has no entry at all, which an expiry cannot explain before our deadline"
            : `'s last revision is ${seen.seq}${
              ours
                ? ""
                : ` (${
                  seen.kind === "put" ? `held by ${seen.node}` : "no holder"
                })`
            }`
        } (run nats-server with jetstream { sync_interval: always }), so revisions and epochs repeat; this manager vouches for nothing more`,
      );
      throw new UnavailableError(st.key, this.#defunct!);
    }
    if (ours && !t.crossed) {
      // Our own CAS, applied before the connection dropped, whose reply was
      // lost with it.
      st.rev = seen!.seq;
      t.suspended = false;
      return;
    }
    // Gone without a trace after our deadline (an expiry), another node's,
    // or ours but possibly
    // applied on another holder's reused revision: this tenure is over.
    if (ours) {
      t.end(
        new UnavailableError(
          st.key,
          `Lease on '${st.key}' ended: a renewal crossed the lost connection, and the server it came back to may have applied it over another holder's entry`,
        ),
        this.#port.now(),
        "unproven",
      );
    }
    this.#lost(st, ours ? null : seen);
  }

  #state(key: string): KeyState {
    let st = this.#keys.get(key);
    if (!st) {
      st = new KeyState(key, this.#subject(key));
      this.#keys.set(key, st);
    }
    return st;
  }

  #subject(key: string): string {
    return `$KV.${this.bucket}.${key}`;
  }

  #tag(epoch: number): string {
    return `lease:${this.#instance}:${epoch}:${++this.#counter}`;
  }

  guard<T>(
    key: string,
    write: (lease: Lease) => T | Promise<T>,
    options?: GuardOptions,
  ): Promise<T> {
    try {
      // A key with state here passed the check before: no regex per write.
      const known = typeof key === "string" ? this.#keys.get(key) : undefined;
      if (!known) checkKey("guard a write", key);
      if (typeof write !== "function") {
        throw new TypeError(
          `Cannot guard a write on '${key}' as 'write' must be a function: received ${
            describe(write)
          }`,
        );
      }
      const wait = options?.wait;
      if (wait !== undefined && typeof wait !== "boolean") {
        throw new TypeError(
          `Cannot guard a write on '${key}' as 'wait' must be a boolean: received ${
            describe(wait)
          }`,
        );
      }
      const check = options?.check;
      if (check !== undefined && check !== "cas" && check !== "lease") {
        throw new TypeError(
          `Cannot guard a write on '${key}' as 'check' must be "cas" or "lease": received ${
            describe(check)
          }`,
        );
      }
      const signal = options?.signal;
      if (
        known && (check ?? this.#check) === "lease" &&
        this.#fresh(known, signal)
      ) {
        return this.#run(known, write, signal, true);
      }
      return wait
        ? this.#guardWait(key, write, signal, true)
        : this.#guardOnce(key, write, signal, true);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /**
   * One attempt of a guard: the acquire or renewal path, then the write.
   * With `follow`, the lease's signal also follows the caller's signal for
   * the length of the write.
   */
  async #guardOnce<T>(
    key: string,
    write: (lease: Lease) => T | Promise<T>,
    signal: AbortSignal | undefined,
    follow: boolean,
  ): Promise<T> {
    if (signal?.aborted) throw abortReason(signal);
    this.#checkOpen("guard a write", key);
    let st: KeyState;
    for (;;) {
      st = await this.#claim(key, signal);
      // A key in its grace needs no round trip to be refused.
      const wait = st.held ? st.notBefore - this.#port.now() : 0;
      if (wait > 0) throw new NotHolderError(key, undefined, Math.ceil(wait));
      try {
        await this.#sync(st, signal);
      } catch (err) {
        throw this.#unavailable("guard a write", key, err);
      }
      // A release that began while we waited owns the key now: no write
      // may start under a lease being given up. Claim it again after.
      if (!st.releasing) break;
    }

    if (signal?.aborted) throw abortReason(signal);
    this.#checkOpen("guard a write", key);
    if (this.#defunct) throw this.#unavailable("guard a write", key);
    if (!st.held) throw new NotHolderError(key, st.foreign);
    const now = this.#port.now();
    if (now < st.notBefore) {
      throw new NotHolderError(key, undefined, Math.ceil(st.notBefore - now));
    }
    if (st.tenure!.suspended) throw suspendedError(key);
    this.#vouch(st, now);
    if (st.tenure!.controller.signal.aborted) {
      // The CAS landed but took so long that it no longer vouches for us.
      throw new UnavailableError(
        key,
        `Cannot guard a write on '${key}': the lease was confirmed too late to write under it`,
      );
    }
    return this.#run(st, write, signal, follow);
  }

  /**
   * Whether a `check: "lease"` guard may write on `st` now with no round
   * trip (safety argument, point 9): held, past its grace, not being given
   * up, and its deadline at least the margin away. Reads the clock once;
   * the write then starts in this same synchronous step. Anything else
   * (including an aborted caller's signal) takes the CAS path, which says
   * why not.
   */
  #fresh(st: KeyState, signal?: AbortSignal): boolean {
    const t = st.tenure;
    if (
      !t || !st.held || st.releasing || st.gone || this.#closing ||
      this.#defunct || t.controller.signal.aborted || t.suspended ||
      signal?.aborted || this.#port.isClosed()
    ) return false;
    const now = this.#port.now();
    if (now < st.notBefore || t.validUntil - now < this.#margin) return false;
    // A renewal overdue by two slots means the event loop has not run our
    // timers or read our replies (a loop of guards that never yields):
    // this guard takes the CAS path, which waits for them and renews.
    if (now > st.renewAt + 2 * this.#quantum) return false;
    st.lastUse = now;
    return true;
  }

  /**
   * Runs `write` under `st`'s current tenure, which vouches for it now. Not
   * an async function: a write that returns a plain value settles the guard
   * without an extra turn (it is most of what a lease-checked guard costs).
   */
  #run<T>(
    st: KeyState,
    write: (lease: Lease) => T | Promise<T>,
    signal: AbortSignal | undefined,
    follow: boolean,
  ): Promise<T> {
    const tenure = st.tenure!;
    // With a caller's signal, one controller follows both for the length of
    // the write; its listeners go when it settles, so a long-lived caller
    // signal does not collect one dependent per guard.
    const tenureSignal = tenure.controller.signal;
    let leaseSignal = tenureSignal;
    let unfollow: (() => void) | undefined;
    if (signal && follow) {
      const follow = new AbortController();
      const onTenure = () => follow.abort(tenureSignal.reason);
      const onCaller = () => follow.abort(signal.reason);
      tenureSignal.addEventListener("abort", onTenure, { once: true });
      signal.addEventListener("abort", onCaller, { once: true });
      leaseSignal = follow.signal;
      unfollow = () => {
        tenureSignal.removeEventListener("abort", onTenure);
        signal.removeEventListener("abort", onCaller);
      };
    }
    const settled = () => {
      unfollow?.();
      if (--st.writes === 0) {
        for (const r of st.drained.splice(0)) r();
      }
    };
    st.writes++;
    let out: T | Promise<T>;
    try {
      out = write(
        new HeldLease(st.key, this.node, tenure, leaseSignal, this.#port),
      );
    } catch (err) {
      settled();
      return Promise.reject(err);
    }
    if (
      out !== null && (typeof out === "object" || typeof out === "function") &&
      typeof (out as { then?: unknown }).then === "function"
    ) {
      const p = Promise.resolve(out);
      p.then(settled, settled);
      return p;
    }
    settled();
    return Promise.resolve(out);
  }

  async held(key: string): Promise<boolean> {
    checkKey("check a lease", key);
    this.#checkOpen("check a lease", key);
    const st = await this.#claim(key, undefined);
    try {
      await this.#sync(st, undefined);
    } catch (err) {
      throw this.#unavailable("check the lease", key, err);
    }
    return st.held && !this.#defunct;
  }

  async holder(key: string): Promise<Holder | null> {
    checkKey("read a holder", key);
    this.#checkOpen("read a holder", key);
    let seen: Seen | null;
    try {
      seen = await this.#read(this.#subject(key), undefined, false);
    } catch (err) {
      throw this.#unavailable("read the holder", key, err);
    }
    if (!seen || seen.kind !== "put") return null;
    return { node: seen.node, epoch: seen.epoch };
  }

  async holders(prefix: string): Promise<Map<string, Holder>> {
    checkKey("list holders", prefix);
    this.#checkOpen("list holders", prefix);
    const subjects = this.#port.subjects;
    if (subjects === undefined) {
      throw new TypeError(
        `Cannot list holders under '${prefix}' as this port cannot list keys`,
      );
    }
    const base = this.#subject(prefix);
    const found = new Map<string, Holder>();
    try {
      let listed: string[];
      try {
        listed = await subjects(`${base}.>`, this.#timeout);
      } catch (err) {
        if (err instanceof BucketGone) this.#goDefunct(err.message);
        throw err;
      }
      const seen = await Promise.all(
        listed.map((s) => this.#read(s, undefined, true)),
      );
      seen.forEach((e, i) => {
        if (e?.kind !== "put") return;
        const key = listed[i]!.slice(base.length - prefix.length);
        found.set(key, { node: e.node, epoch: e.epoch });
      });
    } catch (err) {
      throw err instanceof UnavailableError ? err : new UnavailableError(
        prefix,
        `Cannot list holders under '${prefix}': ${
          this.#defunct ?? errText(err)
        }`,
        { cause: err },
      );
    }
    return new Map([...found].sort(([a], [b]) => a < b ? -1 : a > b ? 1 : 0));
  }

  /**
   * A guard that waits its turn: tries the ordinary guard path, and on a
   * refusal waits (for the grace, for news of the key, or a backoff) and
   * tries again. Waiting only decides when the acquire path (read, CAS,
   * grace) runs again; nothing here lets a write run without it.
   */
  async #guardWait<T>(
    key: string,
    write: (lease: Lease) => T | Promise<T>,
    signal: AbortSignal | undefined,
    follow: boolean,
  ): Promise<T> {
    let kw: KeyWatch | undefined;
    let backoff = FIRST_BACKOFF;
    try {
      for (;;) {
        const mark = kw?.wakes;
        const news = kw?.news;
        const ups = this.#ups;
        let started = false;
        try {
          return await this.#guardOnce(
            key,
            (lease) => {
              started = true;
              // Nothing waits on the key any more: its watch (a consumer
              // on the server) ends now, not when a long write does.
              if (kw) this.#unwatch(kw);
              kw = undefined;
              return write(lease);
            },
            signal,
            follow,
          );
        } catch (err) {
          // What the write threw is the caller's, and is never retried.
          if (started) throw err;
          if (signal?.aborted) throw abortReason(signal);
          if (
            !(err instanceof NotHolderError || err instanceof UnavailableError)
          ) throw err;
          // A bucket that is gone, or a connection closed for good, never
          // comes back: waiting would never end.
          if (
            err instanceof UnavailableError &&
            (this.#defunct !== undefined || this.#port.isClosed())
          ) throw err;
          this.#checkOpen("guard a write", key);
          if (err instanceof NotHolderError && err.retryAfter !== undefined) {
            backoff = FIRST_BACKOFF;
            await this.#pause(err.retryAfter, signal);
          } else if (err instanceof NotHolderError) {
            backoff = FIRST_BACKOFF;
            kw ??= this.#watchKey(key);
            // News that came while we tried may already have let us in.
            if (mark === undefined || kw.wakes === mark) {
              await this.#awaitWake(kw, signal);
            }
          } else if (this.#ups !== ups) {
            // The connection came back while we tried: try again at once.
            backoff = FIRST_BACKOFF;
          } else if (kw === undefined || kw.news === news) {
            // Unavailable: back off, so an outage is not met with a stream
            // of failed requests, but wake, as a waiter on the key does, at
            // news of it (a release the watch saw while we failed to read),
            // and when the connection comes back.
            const back = await this.#backOff(kw, backoff, signal);
            backoff = back
              ? FIRST_BACKOFF
              : Math.min(backoff * 2, this.ttl / 3);
          }
        }
      }
    } finally {
      if (kw) this.#unwatch(kw);
    }
  }

  /** Resolves after `ms`, or at close(); rejects when `signal` aborts. */
  #pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
    return this.#until(signal, (done) => {
      const timer = this.#port.setTimer(done, ms);
      return () => this.#port.clearTimer(timer);
    });
  }

  /**
   * Resolves after `ms`, at news of `kw` (not a wake after a failed
   * fallback read, which tells a guard that failed nothing new), when the
   * connection comes back (with `true`), or at close(); rejects when
   * `signal` aborts.
   */
  async #backOff(
    kw: KeyWatch | undefined,
    ms: number,
    signal: AbortSignal | undefined,
  ): Promise<boolean> {
    const ups = this.#ups;
    await this.#until(signal, (done) => {
      const timer = this.#port.setTimer(done, ms);
      const news = kw?.news;
      const onNews = () => {
        if (kw!.news !== news) done();
      };
      kw?.waiters.add(onNews);
      this.#upWaiters.add(done);
      return () => {
        this.#port.clearTimer(timer);
        kw?.waiters.delete(onNews);
        this.#upWaiters.delete(done);
      };
    });
    return this.#ups !== ups;
  }

  /** Resolves at news of `kw` that may let a waiter in, or at close(). */
  #awaitWake(kw: KeyWatch, signal: AbortSignal | undefined): Promise<void> {
    return this.#until(signal, (done) => {
      if (kw.stopped) {
        done();
        return () => {};
      }
      kw.waiters.add(done);
      this.#armWatch(kw);
      return () => kw.waiters.delete(done);
    });
  }

  /**
   * Resolves when `start` calls its `done`, or at close(); rejects with the
   * reason when `signal` aborts. `start` returns its own cleanup.
   */
  #until(
    signal: AbortSignal | undefined,
    start: (done: () => void) => () => void,
  ): Promise<void> {
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    return new Promise<void>((resolve, reject) => {
      const closing = this.#closeCtl.signal;
      let stop = (): unknown => undefined;
      const cleanup = () => {
        stop();
        signal?.removeEventListener("abort", onAbort);
        closing.removeEventListener("abort", done);
      };
      const done = () => {
        cleanup();
        resolve();
      };
      const onAbort = () => {
        cleanup();
        reject(abortReason(signal!));
      };
      if (closing.aborted) return resolve();
      signal?.addEventListener("abort", onAbort, { once: true });
      closing.addEventListener("abort", done, { once: true });
      stop = start(done);
    });
  }

  campaign(key: string, options?: WatchOptions): AsyncIterable<Lease> {
    checkKey("campaign", key);
    this.#checkOpen("campaign", key);
    return this.#campaign(key, options?.signal);
  }

  async *#campaign(
    key: string,
    signal: AbortSignal | undefined,
  ): AsyncGenerator<Lease, void, undefined> {
    if (signal?.aborted || this.#closing) return;
    const kw = this.#watchKey(key);
    let led = false;
    try {
      for (;;) {
        let lease: Lease;
        try {
          // The lease follows its tenure and the campaign's signal for as
          // long as it lives, not only for the (empty) write.
          lease = await this.#guardWait(
            key,
            (l) => (l as HeldLease).following(signal),
            signal,
            false,
          );
        } catch (err) {
          if (signal?.aborted || this.#closing) return;
          throw err;
        }
        led = true;
        this.#leading.set(key, (this.#leading.get(key) ?? 0) + 1);
        try {
          yield lease;
          await this.#until(signal, (done) => {
            const ls = lease.signal;
            if (ls.aborted) {
              done();
              return () => {};
            }
            ls.addEventListener("abort", done, { once: true });
            return () => ls.removeEventListener("abort", done);
          }).catch(() => {});
        } finally {
          const n = (this.#leading.get(key) ?? 1) - 1;
          if (n > 0) this.#leading.set(key, n);
          else this.#leading.delete(key);
        }
        if (signal?.aborted || this.#closing) return;
      }
    } finally {
      this.#unwatch(kw);
      // close() releases every key itself.
      if (led && !this.#closing) await this.release(key);
    }
  }

  watch(key: string, options?: WatchOptions): AsyncIterable<Holder | null> {
    checkKey("watch a lease", key);
    this.#checkOpen("watch a lease", key);
    return this.#watchHolders(key, options?.signal);
  }

  async *#watchHolders(
    key: string,
    signal: AbortSignal | undefined,
  ): AsyncGenerator<Holder | null, void, undefined> {
    if (signal?.aborted || this.#closing) return;
    const kw = this.#watchKey(key);
    const queue: (Holder | null)[] = [];
    let last: Holder | null | undefined;
    let notify: (() => void) | undefined;
    const listener: Listener = (seen) => {
      if (seen !== undefined) {
        const h = seen?.kind === "put"
          ? { node: seen.node, epoch: seen.epoch }
          : null;
        // A renewal by the same holder is no news.
        const same = last !== undefined &&
          (h === null || last === null
            ? h === last
            : h.node === last.node && h.epoch === last.epoch);
        if (same) return;
        last = h;
        queue.push(h);
      }
      notify?.();
    };
    const wake = () => notify?.();
    kw.listeners.add(listener);
    signal?.addEventListener("abort", wake);
    this.#closeCtl.signal.addEventListener("abort", wake);
    if (kw.seen !== undefined) listener(kw.seen);
    this.#armWatch(kw);
    try {
      for (;;) {
        if (signal?.aborted || this.#closing) return;
        if (kw.stopped) {
          // A bucket deleted or re-created (not a connection closed for
          // good, which only ends the iteration): the caller must know.
          if (this.#defunct !== undefined && !this.#port.isClosed()) {
            throw new UnavailableError(key, this.#defunct);
          }
          return;
        }
        const h = queue.shift();
        if (h !== undefined) {
          yield h;
          continue;
        }
        await new Promise<void>((r) => notify = r);
        notify = undefined;
      }
    } finally {
      kw.listeners.delete(listener);
      signal?.removeEventListener("abort", wake);
      this.#closeCtl.signal.removeEventListener("abort", wake);
      this.#unwatch(kw);
    }
  }

  /** The key's watch, started by its first user. */
  #watchKey(key: string): KeyWatch {
    let kw = this.#watches.get(key);
    if (!kw) {
      const w = kw = new KeyWatch(key, this.#subject(key));
      this.#watches.set(key, w);
      if (this.#port.watch) {
        w.handle = this.#port.watch(
          w.subject,
          (e) => this.#onNews(w, e === null ? null : toSeen(e)),
          (why) => this.#goDefunct(why),
        );
      }
      this.#armWatch(w);
      // A defunct manager's watches are over: this one too.
      if (this.#defunct !== undefined) void this.#endWatch(w);
    }
    kw.users++;
    return kw;
  }

  #unwatch(kw: KeyWatch): void {
    if (--kw.users > 0 || kw.stopped) return;
    void this.#endWatch(kw);
  }

  /** Stops `kw` for good; resolves when what it opened is removed. */
  #endWatch(kw: KeyWatch): Promise<void> {
    if (kw.stopped) return Promise.resolve();
    kw.stopped = true;
    if (this.#watches.get(kw.key) === kw) this.#watches.delete(kw.key);
    this.#port.clearTimer(kw.timer);
    kw.timer = undefined;
    this.#wake(kw);
    for (const l of [...kw.listeners]) l(undefined);
    const stopped = kw.handle?.stop() ?? Promise.resolve();
    kw.handle = undefined;
    return stopped.catch(() => {});
  }

  /**
   * News of a key: from the port's watch, or from a fallback read. Wakes
   * the waiters unless it is a renewal by the holder already seen (or the
   * first news, naming another node's entry, when the waiters were just
   * refused by it).
   */
  #onNews(kw: KeyWatch, seen: Seen | null): void {
    if (kw.stopped) return;
    const prev = kw.seen;
    if (seen !== null) {
      if (seen.seq <= kw.lastSeq) return;
      kw.lastSeq = seen.seq;
    } else if (prev === null) return;
    kw.seen = seen;
    kw.seenAt = this.#port.now();
    // Another holder's entry, seen now: its CAS was sent before the server
    // stored it, so before now, and its holder's deadline is within one
    // TTL of now. The acquire path's "stood still for one TTL" rule may
    // count from here, as from a read of its own. Only a newer revision:
    // a lagging watch must not move an observation back.
    const st = this.#keys.get(kw.key);
    if (
      st !== undefined && seen?.kind === "put" &&
      seen.seq > (st.observed?.seq ?? 0)
    ) {
      st.observed = { seq: seen.seq, id: entryId(seen), at: kw.seenAt };
    }
    const renewal = seen?.kind === "put" &&
      (prev === undefined
        ? seen.node !== this.node
        : prev?.kind === "put" && prev.node === seen.node);
    for (const l of [...kw.listeners]) l(seen);
    // A renewal only moves the fallback timer.
    if (!renewal) this.#wake(kw);
    this.#armWatch(kw);
  }

  #wake(kw: KeyWatch, failed = false): void {
    kw.wakes++;
    if (!failed) kw.news++;
    for (const w of [...kw.waiters]) w();
  }

  /**
   * (Re)arms the fallback timer of `kw`: when an expiry without a marker
   * is due, from the last news of a holder's entry plus one TTL, every 25
   * ms for 600 ms, so a waiter learns of it within 25 ms (a bucket with
   * markers is told by one, and reads only 300 ms late); then every TTL/10
   * while the entry stays; every
   * TTL/10 while waiters wait though the watch shows no holder (a reader
   * lagging behind the watch); every TTL/3 without `Port.watch` or before
   * the watch's first news.
   */
  #armWatch(kw: KeyWatch): void {
    this.#port.clearTimer(kw.timer);
    kw.timer = undefined;
    if (kw.stopped || kw.reading || this.#stopped) return;
    const now = this.#port.now();
    let at: number;
    if (!this.#port.watch || kw.seen === undefined) at = now + this.ttl / 3;
    else if (kw.seen?.kind === "put") {
      const due = kw.seenAt + this.ttl;
      // At `due` the entry has stood still for a TTL: waiters may take it
      // over (then the grace). Without markers, a bounded burst of reads
      // follows, to report the expiry itself; never while the holder
      // renews: each renewal moves `seenAt`, and the timer.
      if (now < due) at = due;
      else if (this.#markerLife === 0 && now < due + EXPIRY_WINDOW) {
        at = now + EXPIRY_STEP;
      } else at = Math.max(due + EXPIRY_MARGIN, now + this.ttl / 10);
    } else if (kw.waiters.size > 0) at = now + this.ttl / 10;
    else return;
    kw.timer = this.#port.setTimer(() => void this.#onWatchTimer(kw), at - now);
  }

  /**
   * The fallback: reads the key, as news; if that brings none, wakes the
   * waiters anyway when the entry is overdue (a replica late to expire is
   * left to the acquire path's own rule) or the watch shows no holder.
   */
  async #onWatchTimer(kw: KeyWatch): Promise<void> {
    kw.timer = undefined;
    if (kw.stopped) return;
    const before = kw.wakes;
    let ok = true;
    kw.reading = true;
    try {
      const seen = await this.#read(kw.subject, undefined, false);
      kw.reading = false;
      this.#onNews(kw, seen);
    } catch {
      ok = false;
    } finally {
      kw.reading = false;
    }
    if (kw.stopped) return;
    if (kw.wakes === before) {
      // Woken without news: once when the entry has stood still for a TTL
      // (its holder's deadline has passed, so the acquire path may take it
      // over), then on every tick from when the server should have expired
      // it (a replica late to expire, or reads that fail).
      const s = kw.seen;
      const now = this.#port.now();
      const due = kw.seenAt + this.ttl;
      const first = s?.kind === "put" && now >= due &&
        kw.dueWake !== kw.seenAt;
      const overdue = s?.kind !== "put" ||
        now >= due + (this.#markerLife === 0 ? EXPIRY_WINDOW : EXPIRY_MARGIN);
      if (first) kw.dueWake = kw.seenAt;
      if (!ok || first || overdue) this.#wake(kw, !ok);
    }
    this.#armWatch(kw);
  }

  /** The key's state for a guard: after any release of it has finished. */
  async #claim(
    key: string,
    signal: AbortSignal | undefined,
  ): Promise<KeyState> {
    for (;;) {
      const st = this.#state(key);
      if (!st.releasing) {
        st.lastUse = this.#port.now();
        return st;
      }
      await (signal ? raceAbort(st.releasing, signal) : st.releasing);
      this.#checkOpen("guard a write", key);
    }
  }

  #checkOpen(verb: string, key: string): void {
    if (this.#closing) {
      throw new TypeError(
        `Cannot ${verb} on '${key}' as the lease manager is closed`,
        this.#signal?.aborted ? { cause: this.#signal.reason } : undefined,
      );
    }
  }

  /** An UnavailableError that says which call could not be served. */
  #unavailable(verb: string, key: string, err?: unknown): unknown {
    if (err !== undefined && !(err instanceof UnavailableError)) return err;
    const why = this.#defunct ?? (err as UnavailableError).message;
    return new UnavailableError(key, `Cannot ${verb} on '${key}': ${why}`, {
      cause: err instanceof UnavailableError ? err.cause ?? err : undefined,
    });
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
    return signal ? raceAbort(b.promise, signal) : b.promise;
  }

  async #pump(st: KeyState): Promise<void> {
    st.busy = true;
    let finish!: () => void;
    st.idle = new Promise((r) => finish = r);
    while (st.next) {
      const b = st.next;
      st.next = undefined;
      try {
        if (this.#defunct) throw new UnavailableError(st.key, this.#defunct);
        // A key given up sends nothing more: its guards see the release
        // and claim the key again once it has finished.
        const timed = st.renewalDue;
        st.renewalDue = false;
        if (!this.#givenUp(st)) {
          if (st.held) {
            // Timed only when a listener will hear of it: a CAS guard's
            // batch reads no clock for this.
            const t = st.tenure!;
            const t0 = timed && this.#renewedHeard ? this.#port.now() : 0;
            await this.#renew(st);
            if (timed && this.#renewedHeard && st.held && st.tenure === t) {
              this.#emit(
                new LeaseRenewedEvent(st.key, t.epoch, this.#port.now() - t0),
              );
            }
          } else await this.#acquire(st);
        }
        b.resolve();
      } catch (err) {
        this.#renewalFailed(st, err);
        b.reject(err);
      }
    }
    st.busy = false;
    finish();
  }

  /**
   * Publishes on `st`'s key if its last revision is `expect`. Unanswered
   * requests reject with UnavailableError; a missing bucket makes the
   * manager defunct.
   */
  async #write(
    st: KeyState,
    op: "PUT" | "DEL",
    expect: number,
    msgId: string,
  ): Promise<WriteResult> {
    // Every revision we saw applied before sending is below the one this
    // write gets, if it is applied in the same stream.
    const floor = this.#maxRev;
    let res: WriteResult;
    try {
      res = await this.#port.write({
        subject: st.subject,
        op,
        value: op === "PUT" ? this.#nodeBytes : new Uint8Array(0),
        expect,
        msgId,
        timeout: this.#timeout,
      });
    } catch (err) {
      if (err instanceof BucketGone) this.#goDefunct(err.message);
      throw new UnavailableError(st.key, errText(err), { cause: err });
    }
    if ("seq" in res) {
      if (res.seq <= floor) {
        this.#goDefunct(
          `the bucket '${this.bucket}' was deleted and re-created (revision ${res.seq} after ${floor}), so its epochs restarted`,
        );
        throw new UnavailableError(st.key, this.#defunct!);
      }
      this.#maxRev = Math.max(this.#maxRev, res.seq);
    }
    return res;
  }

  /**
   * The marker life the stream's current configuration and servers prove,
   * asked for right after an acquiring CAS that expects no entry (so the
   * request goes out in the same flush) and settling to 0 when unproven
   * (no answer within the timeout, or a port without
   * {@linkcode Port.markerLife}). One request serves every acquisition that
   * sends its CAS before the current turn (this run of code and its
   * microtasks) ends, so a proof is never one sent a round trip before the
   * CAS it decides for.
   */
  #markerProof(): Promise<number> {
    const port = this.#port;
    if (port.markerLife === undefined) return Promise.resolve(0);
    let p = this.#proof;
    if (p === undefined) {
      let asked: Promise<number>;
      try {
        asked = port.markerLife(this.#timeout);
      } catch {
        asked = Promise.resolve(0);
      }
      p = this.#proof = asked.then(
        (life) => Number.isFinite(life) && life > 0 ? life : 0,
        () => 0,
      );
      const mine = p;
      queueMicrotask(() => {
        if (this.#proof === mine) this.#proof = undefined;
      });
    }
    return p;
  }

  async #read(
    subject: string,
    seq: number | undefined,
    leader: boolean,
  ): Promise<Seen | null> {
    let e: RawEntry | null;
    try {
      e = await this.#port.read(
        subject,
        seq === undefined ? { leader } : { seq, leader },
        this.#timeout,
      );
    } catch (err) {
      if (err instanceof BucketGone) this.#goDefunct(err.message);
      throw err;
    }
    return e ? toSeen(e) : null;
  }

  #ours(st: KeyState, seen: Seen | null): boolean {
    return seen !== null && seen.kind === "put" &&
      seen.node === this.node && seen.instance === this.#instance &&
      st.tenure !== undefined && seen.epoch === st.tenure.epoch;
  }

  /**
   * Whether `st` was given up: released or closed, or being released with
   * nothing held. Its loops stop there, so nothing is sent on a key after
   * its release() resolved (a request in flight then may still land: an
   * acquire that lands is ignored and expires, see #tookOver).
   */
  #givenUp(st: KeyState): boolean {
    return st.gone || (st.releasing !== undefined && !st.held);
  }

  /** Renews a lease we believe we hold: the steady-state round trip. */
  /**
   * Tells the listeners of a renewal that failed on a tenure still going
   * (off the guard's path: only a failed CAS gets here).
   */
  #renewalFailed(st: KeyState, err: unknown): void {
    const t = st.tenure;
    if (
      !st.held || !t || t.controller.signal.aborted ||
      !(err instanceof UnavailableError)
    ) return;
    const left = Math.max(0, t.validUntil - this.#port.now());
    this.#emit(new RenewalFailedEvent(st.key, t.epoch, err, left));
  }

  async #renew(st: KeyState): Promise<void> {
    const epoch = st.tenure!.epoch;
    for (let attempt = 0; attempt < 3; attempt++) {
      if (attempt > 0 && this.#givenUp(st)) return;
      // Point 10: nothing is sent while the connection is down (nats.js
      // would hold it and send it to whatever server comes back), and a
      // suspended lease is proven before its CAS goes out.
      if (!this.#linkUp) {
        this.#retryRenewal(st);
        throw new UnavailableError(st.key, suspendedError(st.key).message);
      }
      if (st.tenure!.suspended) {
        await this.#verify(st);
        if (!st.held || st.tenure!.suspended) return;
      }
      const sent = this.#port.now();
      const downs = this.#downs;
      let res: WriteResult;
      try {
        res = await this.#write(st, "PUT", st.rev, this.#tag(epoch));
      } catch (err) {
        // No answer: the CAS may or may not have landed. Keep the claim
        // (the next CAS on the old revision settles it) and let the
        // deadline withdraw our vouching if this lasts. It may not even
        // have left the process yet: see Tenure.unanswered.
        st.tenure!.unanswered = true;
        this.#retryRenewal(st);
        throw new UnavailableError(
          st.key,
          `the lease could not be renewed: ${errText(err)}`,
          { cause: (err as Error).cause ?? err },
        );
      }
      if (downs !== this.#downs) {
        // Sent before the connection dropped, answered after: the server
        // that applied it may have lost what came before. #verify decides.
        this.#retryRenewal(st);
        throw new UnavailableError(st.key, suspendedError(st.key).message);
      }
      if ("seq" in res) {
        if (sent >= st.tenure!.validUntil) {
          // A tenure never outlives its deadline. We stopped vouching before
          // this CAS was sent, so what happened meanwhile is unknown (a
          // bucket re-created behind our back can even bring our revision
          // back under another holder): start a new tenure, with a new epoch
          // and the grace owed to a holder that may be one TTL from its
          // deadline.
          this.#tookOver(st, res.seq, 2 * this.ttl, sent, "lapsed");
          return;
        }
        st.rev = res.seq;
        // Answered on the connection an unanswered CAS went out on, and
        // behind it: that one has reached this server already.
        st.tenure!.unanswered = false;
        this.#confirmed(st, sent);
        return;
      }
      const at = res.conflict;
      if (at > 0 && at < st.rev) {
        // The key's last revision is below one we wrote: only a new stream
        // numbers like that, or one that lost the writes it acknowledged.
        this.#goDefunct(
          `the bucket '${this.bucket}' was deleted and re-created, or its server lost writes it had acknowledged (key '${st.key}' at revision ${at} after our ${st.rev}), so its epochs restarted`,
        );
        throw new UnavailableError(st.key, this.#defunct!);
      }
      if (at === 0 && sent < st.tenure!.validUntil) {
        // No entry at all, in answer to a CAS sent before our deadline: our
        // entry cannot have expired yet (3), and a delete or purge through
        // the KV API leaves an entry. So the server lost the writes it
        // acknowledged, which point 10 sees only through a dropped
        // connection: a client whose server is a leaf node of the one with
        // the bucket sees none when that one restarts.
        this.#goDefunct(
          `the server lost writes it had acknowledged: revision ${st.rev} of '${st.key}' was ours, and the key has no entry at all, which an expiry cannot explain before our deadline (run nats-server with jetstream { sync_interval: always }), so revisions and epochs repeat; this manager vouches for nothing more`,
        );
        throw new UnavailableError(st.key, this.#defunct!);
      }
      // Someone's write won. If it is ours (an earlier CAS whose reply we
      // never got), carry on from it; otherwise the lease is lost. The read
      // goes to the stream leader: a lagging replica may not have our own
      // write yet, and must not turn it into a loss.
      let seen: Seen | null;
      try {
        seen = at === 0 ? null : await this.#read(
          st.subject,
          at > 0 ? at : undefined,
          true,
        );
      } catch (err) {
        this.#retryRenewal(st);
        throw new UnavailableError(
          st.key,
          `cannot tell whether the lease is still held: ${errText(err)}`,
          { cause: err },
        );
      }
      if (this.#ours(st, seen)) {
        st.rev = seen!.seq;
        continue;
      }
      if (seen === null && at > 0) {
        // The revision the server named is gone already (overwritten or
        // expired since): unknown, not lost. The next CAS names the newer
        // one.
        continue;
      }
      this.#lost(st, seen);
      return;
    }
    // Revisions kept moving under us: keep trying, the deadline bounds it.
    this.#retryRenewal(st);
    throw new UnavailableError(
      st.key,
      "the lease could not be renewed: its revisions kept moving",
    );
  }

  /** Tries to take a key we do not hold; at most a few reads and CASes. */
  async #acquire(st: KeyState): Promise<void> {
    for (let attempt = 0; attempt < 3; attempt++) {
      if (attempt > 0 && this.#givenUp(st)) return;
      let seen: Seen | null = null;
      // On a key this state never looked at, with markers proven, try the
      // CAS that expects no entry before reading: a never-used key is then
      // taken in one round trip, and anything else makes it fail (it names
      // what is there) and we read as usual. Only the CAS's success
      // matters for the grace below, never the skipped read.
      const probe = attempt === 0 && this.#markerLife > 0 && !st.probed;
      st.probed = true;
      // A read and the CAS built on it must meet one server process
      // (point 10): a restarted one may have reused the revision we read.
      const downs = this.#downs;
      try {
        // Any replica will do: the CAS below decides, and it names the
        // revision it expects, whose content we read here.
        if (!probe) seen = await this.#read(st.subject, undefined, false);
      } catch (err) {
        throw new UnavailableError(
          st.key,
          `the lease could not be read: ${errText(err)}`,
          { cause: err },
        );
      }
      const now = this.#port.now();
      if (
        seen?.kind === "put" && seen.acquire &&
        seen.instance === this.#instance
      ) {
        const p = st.pending.find((p) => p.counter === seen.counter);
        if (p) {
          // Our own acquiring CAS, whose reply was lost: we hold the key,
          // with the grace an answer would have left (below). (Only this
          // manager writes with its instance id.) The same re-creation
          // check as for an answered write applies.
          if (seen.seq <= p.floor) {
            this.#goDefunct(
              `the bucket '${this.bucket}' was deleted and re-created (revision ${seen.seq} after ${p.floor}), so its epochs restarted`,
            );
            throw new UnavailableError(st.key, this.#defunct!);
          }
          // The reply, not the CAS, was lost: what the CAS's success
          // proves is what an answered one proves (3). Its marker proof
          // was read about when the CAS went in, and the CAS may have been
          // applied any time before our read saw it, so a second proof,
          // asked now (after it was applied), must agree: only markers
          // removed and restored between the two go unseen. A drop since
          // it was sent already owes the longest grace (#onLink).
          if (p.proof !== undefined) {
            const lives = await Promise.all([p.proof, this.#markerProof()]);
            if (p.downs === this.#downs) {
              p.grace = this.ttl - Math.min(this.ttl, ...lives);
            }
          }
          this.#maxRev = Math.max(this.#maxRev, seen.seq);
          this.#tookOver(st, seen.seq, p.grace, p.sent, "recovered");
          return;
        }
      }
      const unknownPast = this.#restartGrace || st.sawForeign;
      let grace: number;
      // How the key was found, for the "acquired" event.
      let found: AcquiredFrom;
      // Whether a marker proof goes out with the CAS (see below).
      let prove = false;
      if (seen === null) {
        found = "fresh";
        // No entry (in the replica we read). The CAS below expects none
        // on the leader. Without markers, a key never held and one whose
        // holder expired look alike: its deadline has passed, but it may
        // be paused mid-write, so the full grace.
        grace = unknownPast ? this.ttl : 0;
        // With markers that live `life`, the CAS succeeds only if the last
        // entry or tombstone expired (never early, and at or after its
        // holder's deadline) more than `life` ago, so only the rest of the
        // grace is owed. What start-up proved may have changed since (the
        // stream edited, a server rolled back): the life is proven again
        // by a request sent with the CAS, and the grace decided once both
        // are answered.
        prove = unknownPast && this.#markerLife > 0;
      } else if (seen.kind === "expired") {
        // A marker: a holder's deadline passed recently; the full grace.
        found = "expired";
        grace = unknownPast ? this.ttl : 0;
      } else if (seen.kind === "released") {
        // A lease manager's clean release.
        found = "released";
        grace = 0;
      } else if (seen.kind === "removed") {
        found = "removed";
        // Deleted or purged by someone else while the holder may still be
        // inside its deadline (at most one TTL away): wait that out, then
        // the grace.
        grace = 2 * this.ttl;
      } else if (seen.node === this.node && !this.#restartGrace) {
        // Our node id, written by another process: the Go reference adopts
        // such an entry at once, and restartGrace: false asks for that.
        found = "own";
        grace = 0;
      } else {
        found = "stood-still";
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
        // The same entry, not merely the same revision (see `observed`).
        if (
          st.observed?.seq !== seen.seq || st.observed.id !== entryId(seen)
        ) {
          st.observed = { seq: seen.seq, id: entryId(seen), at: now };
          return;
        }
        if (now - st.observed.at < this.ttl) return;
        grace = this.ttl;
      }
      if (!this.#linkUp || downs !== this.#downs) {
        throw new UnavailableError(
          st.key,
          "the lease could not be acquired: the connection to the server was lost",
        );
      }
      const expect = seen === null ? 0 : seen.seq;
      const sent = this.#port.now();
      const msgId = this.#tag(0);
      // Bounded: an attempt forgotten here that lands after all is taken
      // for another process's entry with our node id (safe, only slower).
      const floor = this.#maxRev;
      // An attempt recognised later (its reply lost) is owed what it
      // would have been owed answered, its marker proof included.
      const pending: Pending = {
        counter: this.#counter,
        grace,
        sent,
        floor,
        downs,
      };
      if (st.pending.push(pending) > 8) st.pending.shift();
      let res: WriteResult;
      let proof: Promise<number> | undefined;
      try {
        const writing = this.#write(st, "PUT", expect, msgId);
        // Sent right behind the CAS, in the same flush: one round trip.
        if (prove) proof = pending.proof = this.#markerProof();
        res = await writing;
      } catch (err) {
        throw new UnavailableError(
          st.key,
          `the lease could not be acquired: ${errText(err)}`,
          { cause: (err as Error).cause ?? err },
        );
      }
      if (!("seq" in res)) {
        st.pending.pop(); // refused, so it never lands
        if (downs !== this.#downs) {
          throw new UnavailableError(
            st.key,
            "the lease could not be acquired: the connection to the server was lost",
          );
        }
        continue; // the key moved: look again
      }
      if (downs !== this.#downs) {
        // Applied by a server we reached after the connection dropped,
        // over a revision we read before: it may have been another
        // holder's there, alive and one TTL from its deadline.
        proof = undefined;
        grace = Math.max(grace, 2 * this.ttl);
      }
      if (proof !== undefined) {
        // Markers as they are now, answered about when the CAS was
        // applied; unproven (0) leaves the full grace.
        const life = await proof;
        grace = this.ttl - Math.min(this.ttl, life);
      }
      this.#tookOver(st, res.seq, grace, sent, found);
      return;
    }
  }

  /** Our acquiring CAS sent at `sent` was applied at `seq`. */
  #tookOver(
    st: KeyState,
    seq: number,
    grace: number,
    sent: number,
    found: AcquiredFrom,
  ): void {
    // An acquire that lands after its key was given up: nobody renews it,
    // so it expires, and a later claim waits for it like any holder's.
    if (st.gone) return;
    st.held = true;
    st.rev = seq;
    const t = st.tenure = new Tenure(
      seq,
      `${this.#instance}.${++this.#tenures}`,
      this.#reporter(st),
    );
    st.pending = [];
    st.observed = undefined;
    st.foreign = undefined;
    // The grace runs from now, which is after the CAS was applied: the
    // previous holder's deadline was at most `grace - ttl` before that.
    st.notBefore = grace > 0 ? this.#port.now() + grace : 0;
    this.#emit(new LeaseAcquiredEvent(st.key, seq, t.id, grace, found));
    this.#confirmed(st, sent);
  }

  /** A CAS sent at `sent` succeeded: we hold the key until `sent + ttl`. */
  #confirmed(st: KeyState, sent: number): void {
    if (st.gone) return;
    let t = st.tenure!;
    if (t.controller.signal.aborted) {
      // The deadline passed before this confirmation came: same epoch, but
      // leases handed out before keep their ended signal.
      t = st.tenure = new Tenure(t.epoch, t.id, this.#reporter(st));
      this.#emit(
        new LeaseAcquiredEvent(st.key, t.epoch, t.id, 0, "lapsed"),
      );
    }
    // The server stamps the entry when the CAS arrives, after `sent`, and
    // expires it no earlier than a TTL later.
    t.validUntil = Math.max(t.validUntil, sent + this.ttl);
    st.renewAt = sent + this.ttl / 3;
    // Both deadlines only move forward here, so a timer armed for an
    // earlier one fires early and re-arms itself: a guarded write touches
    // no timer in steady state.
    st.expiryTimer ??= this.#port.setTimer(
      () => this.#onExpiry(st),
      Math.max(0, t.validUntil - this.#port.now()),
    );
    if (st.renewSlot === 0) this.#plan(st, st.renewAt);
    // A reply that arrives after a pause may confirm a deadline that has
    // already passed.
    this.#vouch(st, this.#port.now());
  }

  /**
   * After an unanswered renewal: retry soon while the lease may still be
   * saved, then only every TTL/3 (an outage must not turn every held key
   * into a stream of timed-out requests).
   */
  #retryRenewal(st: KeyState): void {
    const now = this.#port.now();
    const saving = st.tenure !== undefined && now < st.tenure.validUntil;
    st.renewAt = now + (saving ? this.ttl / 10 : this.ttl / 3);
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
    if (this.#stopped || st.gone || this.#port.isClosed()) return;
    let slot = Math.ceil(at / this.#quantum) * this.#quantum;
    // Floating point may round the product below `at`; a slot at or
    // before the one being served would be served again, forever.
    if (slot < at) slot += this.#quantum;
    // A key planned in several slots acts only in the one it names.
    st.renewSlot = slot;
    const keys = this.#slots.get(slot);
    if (keys) keys.push(st);
    else this.#slots.set(slot, [st]);
    if (slot < this.#tickAt) this.#arm(slot);
  }

  #arm(slot: number): void {
    this.#port.clearTimer(this.#tickTimer);
    this.#tickAt = slot;
    this.#tickTimer = this.#port.setTimer(
      () => this.#tick(),
      Math.max(0, slot - this.#port.now()),
    );
  }

  #tick(): void {
    this.#tickTimer = undefined;
    this.#tickAt = Infinity;
    const now = this.#port.now();
    let next = Infinity;
    // A snapshot: slots planned while serving these wait for the next tick.
    for (const [slot, keys] of [...this.#slots]) {
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
    if (!st.held || this.#stopped || this.#port.isClosed()) return;
    // After a pause, this may be the first code that runs: stop vouching
    // before anything else does.
    this.#vouch(st, now);
    if (
      this.#idleRelease !== undefined && !st.releasing && st.writes === 0 &&
      !this.#leading.has(st.key) && now - st.lastUse >= this.#idleRelease
    ) {
      void this.#giveUp(st, now);
      return;
    }
    // A guard may have renewed since this was planned: plan anew from then.
    if (st.renewAt > now) this.#plan(st, st.renewAt);
    else {
      st.renewalDue = true;
      void this.#sync(st, undefined);
    }
  }

  #stopRenewals(): void {
    this.#port.clearTimer(this.#tickTimer);
    this.#tickTimer = undefined;
    this.#tickAt = Infinity;
    this.#slots.clear();
    for (const st of this.#keys.values()) st.renewSlot = 0;
  }

  /** Ends the tenure if its deadline has passed. */
  #vouch(st: KeyState, now: number): void {
    const t = st.tenure;
    if (t && st.held && now >= t.validUntil) t.end(expiredError(st.key), now);
  }

  /** At the deadline of the last confirmed CAS, writes must stop. */
  #onExpiry(st: KeyState): void {
    st.expiryTimer = undefined;
    if (!st.held || !st.tenure) return;
    const now = this.#port.now();
    const left = st.tenure.validUntil - now;
    if (left > 0) {
      st.expiryTimer = this.#port.setTimer(() => this.#onExpiry(st), left);
      return;
    }
    this.#vouch(st, now);
  }

  #clearExpiry(st: KeyState): void {
    this.#port.clearTimer(st.expiryTimer);
    st.expiryTimer = undefined;
  }

  #lost(st: KeyState, seen: Seen | null): void {
    st.held = false;
    st.sawForeign = true;
    st.foreign = seen?.kind === "put" ? seen.node : undefined;
    st.renewSlot = 0;
    this.#clearExpiry(st);
    st.tenure?.end(
      new NotHolderError(st.key, st.foreign),
      this.#port.now(),
      st.foreign === undefined ? "deleted" : "overwritten",
    );
  }

  /** Stops vouching for every lease, for good, with `why`. */
  #goDefunct(why: string): void {
    if (this.#defunct) return;
    this.#defunct = why;
    this.#stopRenewals();
    const now = this.#port.now();
    for (const st of this.#keys.values()) {
      this.#clearExpiry(st);
      if (st.held) {
        st.held = false;
        st.tenure?.end(new UnavailableError(st.key, why), now, "defunct");
      }
    }
    // Nothing can come back to a watch now: end every one (its waiters
    // then find the manager defunct, its iterators end).
    for (const kw of [...this.#watches.values()]) void this.#endWatch(kw);
    // A manager closed before its connection was has nothing to report.
    if (!this.#stopped) this.#emit(new LeaseDefunctEvent(why));
  }

  #connectionClosed(): void {
    this.#goDefunct("the NATS connection is closed");
  }

  release(key: string): Promise<void> {
    checkKey("release a lease", key);
    const st = this.#keys.get(key);
    if (!st) return Promise.resolve();
    return this.#giveUp(st, this.#port.now() + this.#settleTimeout).then(
      () => {},
    );
  }

  /**
   * Gives `st` up (release or close): settle, release if clean, forget.
   * Resolves `true` when our entry was deleted cleanly.
   */
  #giveUp(st: KeyState, settleBy: number): Promise<boolean> {
    st.releasing ??= this.#releaseKey(st, settleBy).finally(() => {
      st.gone = true;
      if (this.#keys.get(st.key) === st) this.#keys.delete(st.key);
    });
    return st.releasing;
  }

  async #releaseKey(st: KeyState, settleBy: number): Promise<boolean> {
    // Renewals go on while writes settle: a write must not lose its lease
    // because the process is shutting down.
    while (st.writes > 0) {
      const left = settleBy - this.#port.now();
      if (left <= 0) break;
      await this.#waitFor(
        new Promise<void>((r) => st.drained.push(r)),
        left,
      );
    }
    if (st.busy) await this.#waitFor(st.idle, this.#timeout);
    st.renewSlot = 0;
    this.#clearExpiry(st);
    const now = this.#port.now();
    const t = st.tenure;
    // Only a release that leaves nothing owed may let a successor skip the
    // grace: our writes settled, our own grace (owed to the holder before
    // us) is over, and our lease is still confirmed, so nobody else can
    // have written since our revision. Not after an unanswered CAS: if it
    // reaches a restarted server that reused our revision for another
    // holder, our delete, sent the same way, would free that holder's key
    // as a clean release.
    const live = st.held && t !== undefined && !t.controller.signal.aborted;
    const clean = st.held && !st.busy && st.writes === 0 &&
      now >= st.notBefore && t !== undefined && now < t.validUntil &&
      !t.suspended && !t.unanswered && this.#linkUp && !this.#defunct &&
      !this.#port.isClosed();
    // The tenure ends before the delete is sent: once a successor can see
    // the key free, this node's lease signal has aborted.
    t?.end(
      new NotHolderError(
        st.key,
        undefined,
        undefined,
        `Lease on '${st.key}' was released`,
      ),
      this.#port.now(),
      "released",
    );
    let released = false;
    if (clean) {
      st.busy = true;
      try {
        // Compare-and-delete on our own revision: it can only remove our
        // entry, and our tag marks it as a clean release.
        const res = await this.#write(st, "DEL", st.rev, this.#tag(t.epoch));
        released = "seq" in res;
      } catch {
        // Unanswered: it may have landed; if not, the entry expires.
      } finally {
        st.busy = false;
      }
    }
    st.held = false;
    // Given up from here on, before the caller hears of it: a reply still
    // in flight must not make this state hold or renew again.
    st.gone = true;
    if (live) {
      this.#emit(new LeaseReleasedEvent(st.key, t!.epoch, t!.id, released));
    }
    return released;
  }

  /** Resolves when `p` settles or after `ms`, whichever is first. */
  #waitFor(p: Promise<unknown>, ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = this.#port.setTimer(resolve, ms);
      const done = () => {
        this.#port.clearTimer(timer);
        resolve();
      };
      p.then(done, done);
    });
  }

  override addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void {
    if (listener === null) return;
    if (type === "renewed") this.#renewedHeard = true;
    let guarded = this.#guarded.get(listener);
    if (!guarded) {
      // A listener's exception would otherwise reach the runtime as an
      // uncaught error (and end a Deno or Node process): the manager's
      // state is already changed when it runs, so report and go on.
      guarded = (event: Event) => {
        try {
          if (typeof listener === "function") listener.call(this, event);
          else listener.handleEvent(event);
        } catch (err) {
          console.error(
            `lease manager: a '${event.type}' listener threw:`,
            err,
          );
        }
      };
      this.#guarded.set(listener, guarded);
    }
    super.addEventListener(type, guarded, options);
  }

  override removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void {
    if (listener === null) return;
    super.removeEventListener(
      type,
      this.#guarded.get(listener) ?? listener,
      options,
    );
  }

  /**
   * Dispatches `event` after the current task's state changes are done:
   * a listener that calls back into the manager finds it consistent.
   */
  #emit(event: Event): void {
    queueMicrotask(() => this.dispatchEvent(event));
  }

  health(options: HealthOptions = {}): LeaseHealth {
    const margin = options.margin ?? this.ttl / 3;
    if (typeof margin !== "number" || !(margin >= 0)) {
      throw new RangeError(
        `Cannot read health as 'margin' must be a non-negative number of milliseconds: received ${
          String(margin)
        }`,
      );
    }
    const now = this.#port.now();
    const overdue: string[] = [];
    const expiring: string[] = [];
    let held = 0;
    for (const st of this.#keys.values()) {
      const t = st.tenure;
      if (!st.held || !t || t.controller.signal.aborted) continue;
      held++;
      if (now - st.renewAt > this.ttl / 3) overdue.push(st.key);
      if (t.suspended || t.validUntil - now < margin) expiring.push(st.key);
    }
    const closed = this.#closing !== undefined || this.#stopped;
    const connected = this.#linkUp && !this.#port.isClosed();
    return {
      ok: !closed && this.#defunct === undefined && connected &&
        overdue.length === 0 && expiring.length === 0,
      closed,
      defunct: this.#defunct,
      connected,
      held,
      overdue,
      expiring,
    };
  }

  close(): Promise<CloseResult> {
    if (!this.#closing) {
      this.#closing = this.#shutdown();
      this.#closeCtl.abort();
    }
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  async #shutdown(): Promise<CloseResult> {
    this.#signal?.removeEventListener("abort", this.#onAbort);
    // Waiting guards, campaigns and watch iterators end now; what the
    // watches opened on the server is removed while the keys settle.
    const unwatched = Promise.all(
      [...this.#watches.values()].map((kw) => this.#endWatch(kw)),
    );
    const settleBy = this.#port.now() + this.#settleTimeout;
    const keys = [...this.#keys.values()];
    const held = keys.map((st) => st.held || st.pending.length > 0);
    const done = await Promise.all(
      keys.map((st) => this.#giveUp(st, settleBy)),
    );
    this.#stopped = true;
    this.#stopRenewals();
    for (const st of keys) this.#clearExpiry(st);
    this.#keys.clear();
    await this.#waitFor(unwatched, this.#timeout);
    this.#port.close?.();
    const released: string[] = [];
    const unreleased: string[] = [];
    keys.forEach((st, i) => {
      if (done[i]) released.push(st.key);
      else if (held[i]) unreleased.push(st.key);
    });
    return { released, unreleased };
  }
}

/** `p`, or the signal's reason if it aborts first. */
function raceAbort<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(abortReason(signal));
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(abortReason(signal));
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(resolve, reject).finally(() =>
      signal.removeEventListener("abort", onAbort)
    );
  });
}

// ---------------------------------------------------------------------------
// The production port: nats.js, `performance.now()` and `setTimeout`.

const decoder = new TextDecoder();

/** The revision the server names in a "wrong last sequence: N" rejection. */
function conflictRevision(err: unknown): number | undefined {
  if (
    !(err instanceof JetStreamApiError) ||
    (err.code !== 10071 && err.code !== 10164)
  ) return undefined;
  const m = /wrong last sequence: (\d+)/.exec(err.message);
  return m ? Number(m[1]) : -1;
}

function isStreamNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError && err.code === 10059;
}

/**
 * Each attempt of a set-up read gets this long (or the request timeout, if
 * longer) before it is asked again, within {@linkcode SETUP_TIMEOUT}.
 */
const SETUP_ATTEMPT = 5_000;

/** The first attempt of a set-up read (or the request timeout, if longer). */
const SETUP_FIRST_ATTEMPT = 1_000;

/** Whether `err` is a request that got no answer in time. */
function isTimeout(err: unknown): boolean {
  return err instanceof TimeoutError ||
    (err instanceof Error && err.name === "TimeoutError");
}

/**
 * Runs a set-up request again, with a growing pause, while a JetStream
 * cluster answers that it is temporarily unavailable (10008: it has no meta
 * leader) or gives no answer at all, until `deadline` (performance.now()
 * time). A cluster drops a JetStream API request that reaches it while the
 * meta group elects a leader, and answers none later (seen on 2.15.2 right
 * after a restart, lease_lost_tail_test.ts, and for a bucket's creation in
 * a landing CI run). Only for requests safe to repeat: reads, and a create
 * that ends in the same state however often it is made. Any other answer
 * or error is the request's own.
 */
async function whileLeaderless<T>(
  request: (timeout: number) => Promise<T>,
  deadline: number,
  signal: AbortSignal | undefined,
  attempts: { first: number; most: number },
): Promise<T> {
  // A request dropped during an election is asked again only once its
  // attempt times out: the first attempts are short, so set-up follows a
  // leader elected within a second or two, and they grow to `most` for a
  // cluster that is merely slow to answer.
  let timeout = Math.min(attempts.first, attempts.most);
  for (let pause = 100;; pause = Math.min(2 * pause, 1000)) {
    try {
      return await request(timeout);
    } catch (err) {
      const leaderless = err instanceof JetStreamApiError &&
        err.code === 10008;
      const again = leaderless || isTimeout(err);
      if (!again || performance.now() + pause >= deadline) throw err;
      if (isTimeout(err)) timeout = Math.min(2 * timeout, attempts.most);
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const wait = new Promise<void>((r) => timer = setTimeout(r, pause));
    try {
      await (signal ? raceAbort(wait, signal) : wait);
    } finally {
      clearTimeout(timer);
    }
  }
}

/** A write waiting for its reply in a {@linkcode ReplyInbox}. */
interface PendingWrite {
  readonly subject: string;
  readonly deadline: number;
  readonly resolve: (res: WriteResult) => void;
  readonly reject: (err: unknown) => void;
}

/**
 * Request-reply for the compare-and-set publishes, which a process holding
 * many leases sends thousands of a second. `js.publish` costs about what the
 * server's work on the message does: per request nats.js builds two `Error`
 * objects for their stack traces (most of its cost), arms a timer, and
 * parses the whole JSON ack. Here one wildcard subscription per connection
 * takes every reply (a counter is the request's token), one timer, armed
 * only while replies are due, sweeps out the ones past their timeout, and
 * the ack is read for its `seq` alone; anything else in it (an API error, an
 * odd ack) is parsed in full. What a write promises is unchanged: no answer
 * (timeout, a 503 "no responders" status, a closed connection) rejects, an
 * API error rejects as nats.js's `JetStreamApiError`, except a wrong last
 * sequence, which resolves as a conflict.
 */
class ReplyInbox {
  readonly #nc: NatsConnection;
  #prefix = "";
  #sub: Subscription | undefined;
  readonly #pending = new Map<string, PendingWrite>();
  #token = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** Managers (ports) using it: the subscription goes when none does. */
  #users = 0;

  constructor(nc: NatsConnection) {
    this.#nc = nc;
    void nc.closed().then(() => this.#failAll(new ClosedConnectionError()));
  }

  request(
    subject: string,
    data: Uint8Array,
    h: MsgHdrs,
    timeout: number,
  ): Promise<WriteResult> {
    return new Promise((resolve, reject) => {
      const token = (++this.#token).toString(36);
      const deadline = performance.now() + timeout;
      try {
        const prefix = this.#subscribe();
        this.#pending.set(token, { subject, deadline, resolve, reject });
        this.#nc.publish(subject, data, { reply: prefix + token, headers: h });
      } catch (err) {
        this.#pending.delete(token);
        reject(err);
        return;
      }
      // A timer armed earlier re-arms itself for what is left when it fires.
      if (this.#timer === undefined) this.#arm(deadline);
    });
  }

  /** A manager starts using it. */
  retain(): void {
    this.#users++;
  }

  /** A manager is done with it. */
  release(): void {
    this.#users = Math.max(0, this.#users - 1);
    this.#idle();
  }

  /** Unsubscribes once no manager uses it and no reply is due. */
  #idle(): void {
    if (this.#users > 0 || this.#pending.size > 0) return;
    this.#disarm();
    const sub = this.#sub;
    this.#sub = undefined;
    if (sub !== undefined && !sub.isClosed()) sub.unsubscribe();
  }

  /** The reply subjects' prefix; (re)subscribes if needed. */
  #subscribe(): string {
    if (this.#sub !== undefined && !this.#sub.isClosed()) return this.#prefix;
    // The connection's inbox prefix, as nats.js's own requests use it (a
    // user's permissions may allow replies only there).
    const o = (this.#nc as { options?: { inboxPrefix?: string } }).options;
    this.#prefix = `${createInbox(o?.inboxPrefix)}.`;
    this.#sub = this.#nc.subscribe(`${this.#prefix}*`, {
      callback: (err, msg) => {
        if (err) this.#failAll(err);
        else this.#reply(msg);
      },
    });
    return this.#prefix;
  }

  #reply(msg: Msg): void {
    const subject = msg.subject;
    if (!subject.startsWith(this.#prefix)) return;
    const token = subject.slice(this.#prefix.length);
    const p = this.#pending.get(token);
    if (p === undefined) return; // timed out already
    this.#pending.delete(token);
    if (this.#pending.size === 0) {
      this.#disarm();
      this.#idle();
    }
    const data = msg.data;
    if (data.length === 0) {
      // A status, not an ack: 503 when no stream listens on the subject.
      const code = msg.headers?.code;
      p.reject(
        code === 503 ? new NoRespondersError(p.subject) : new Error(
          `unexpected status ${code} ${msg.headers?.description ?? ""}`,
        ),
      );
      return;
    }
    const seq = ackSeq(data);
    if (seq > 0) p.resolve({ seq });
    else settleAck(data, p);
  }

  #arm(at: number): void {
    this.#timer = setTimeout(
      () => this.#sweep(),
      Math.max(0, at - performance.now()),
    );
  }

  #disarm(): void {
    if (this.#timer === undefined) return;
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #sweep(): void {
    this.#timer = undefined;
    const now = performance.now();
    let next = Infinity;
    const due: string[] = [];
    for (const [token, p] of this.#pending) {
      if (p.deadline <= now) due.push(token);
      else if (p.deadline < next) next = p.deadline;
    }
    // After the process stalled (a long GC, a busy loop), timers run before
    // the replies that arrived meanwhile are read from the socket: give
    // them one more turn of the event loop. A reply is worth the same late
    // (the lease's deadline counts from the send), so this only waits.
    if (due.length > 0) {
      setTimeout(() => {
        for (const token of due) {
          const p = this.#pending.get(token);
          if (p === undefined) continue;
          this.#pending.delete(token);
          p.reject(new TimeoutError());
        }
        if (this.#pending.size === 0) {
          this.#disarm();
          this.#idle();
        }
      }, 0);
    }
    // A few ms late, so that one sweep serves a batch sent together.
    if (next < Infinity) this.#arm(next + 5);
  }

  #failAll(err: unknown): void {
    this.#disarm();
    this.#sub = undefined;
    const all = [...this.#pending.values()];
    this.#pending.clear();
    for (const p of all) p.reject(err);
  }
}

/** One {@linkcode ReplyInbox} per connection, shared by its managers. */
const inboxes = new WeakMap<NatsConnection, ReplyInbox>();

function replyInbox(nc: NatsConnection): ReplyInbox {
  let inbox = inboxes.get(nc);
  if (inbox === undefined) inboxes.set(nc, inbox = new ReplyInbox(nc));
  return inbox;
}

/**
 * The `seq` of a plain publish ack (`{"stream":"KV_b","seq":7}`, maybe with
 * `"duplicate":true`, which names the first write's `seq`), or -1 for
 * anything else.
 */
function ackSeq(data: Uint8Array): number {
  const s = decoder.decode(data);
  if (s.includes('"error"')) return -1;
  const at = s.indexOf('"seq":');
  if (at < 0) return -1;
  let seq = 0;
  let i = at + 6;
  for (let c = s.charCodeAt(i); c >= 48 && c <= 57; c = s.charCodeAt(++i)) {
    seq = seq * 10 + c - 48;
  }
  return i > at + 6 ? seq : -1;
}

/** Settles `p` by an ack that {@linkcode ackSeq} did not read. */
function settleAck(data: Uint8Array, p: PendingWrite): void {
  let v: { seq?: unknown; stream?: unknown; error?: ApiError };
  try {
    v = JSON.parse(decoder.decode(data));
  } catch (err) {
    p.reject(new Error("invalid JetStream publish ack", { cause: err }));
    return;
  }
  if (v.error) {
    const err = new JetStreamApiError(v.error);
    const at = conflictRevision(err);
    if (at !== undefined) p.resolve({ conflict: at });
    else p.reject(err);
  } else if (typeof v.seq === "number" && v.seq > 0 && v.stream) {
    p.resolve({ seq: v.seq });
  } else {
    p.reject(new Error("invalid JetStream publish ack"));
  }
}

/** The peers start-up could not reach, for the port to check later. */
interface LatePeers {
  /** Server names that did not answer start-up's census. */
  pending: readonly string[];
  /** Whether a release before 2.9.21 among them must stop the manager. */
  casCheck: boolean;
}

/**
 * How long each census round of {@linkcode watchLatePeers} waits: one ping
 * a round, so a manager with a peer down sends one a second until it is
 * back; each server answers it for itself.
 */
const LATE_PEER_ROUND_MS = 1_000;

/**
 * Checks the peers that did not answer start-up's census, one round each
 * LATE_PEER_ROUND_MS until every one has answered: a peer on a release
 * with the compare-and-set fix is trusted from then on, and joins the
 * marker proof when it has trustworthy markers; one on an older release
 * calls `onDistrust` (when `late.casCheck`) and the checks end. Stops at
 * `stop()` or when the connection closes, leaving no timer behind.
 */
function watchLatePeers(
  nc: NatsConnection,
  stream: string,
  late: LatePeers,
  markers: MarkerProof,
  onDistrust: (why: string) => void,
): { stop(): void } {
  const pending = new Set(late.pending);
  const ctl = new AbortController();
  if (!late.casCheck && markers.life <= 0) pending.clear();
  const loop = async (): Promise<void> => {
    while (pending.size > 0 && !ctl.signal.aborted && !nc.isClosed()) {
      const began = performance.now();
      const { versions } = await census(
        nc,
        [...pending],
        LATE_PEER_ROUND_MS,
        undefined,
        ctl.signal,
      );
      if (ctl.signal.aborted) return;
      for (const name of [...pending]) {
        const ver = versions.get(name);
        if (ver === undefined) continue;
        if (late.casCheck && !casSafeVersion(ver)) {
          onDistrust(
            `server ${name}, a peer of the lease bucket's stream '${stream}' that was down when this manager started, runs nats-server ${ver}, which may let two compare-and-set updates of one revision both succeed on a replicated stream (nats-server#4320): upgrade it to 2.9.21 or later`,
          );
          return;
        }
        pending.delete(name);
        if (markersVersion(ver)) markers.peers.add(name);
      }
      // A round cut short (the ping could not be sent, no responders):
      // wait out the rest of it rather than ask again in a tight loop.
      const rest = LATE_PEER_ROUND_MS - (performance.now() - began);
      if (pending.size > 0 && rest > 0) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(() => {
            wake = undefined;
            resolve();
          }, rest);
          wake = () => {
            clearTimeout(t);
            resolve();
          };
        });
      }
    }
  };
  let wake: (() => void) | undefined;
  void loop();
  return {
    stop: () => {
      ctl.abort();
      wake?.();
    },
  };
}

function natsPort(
  nc: NatsConnection,
  js: JetStreamClient,
  jsm: JetStreamManager,
  stream: string,
  direct: boolean,
  created: string,
  silence: number,
  markers: MarkerProof,
  late: LatePeers,
): Port {
  // After a request went unanswered, the bucket may have been deleted and
  // re-created meanwhile, and a new stream can number a key's revisions
  // just as the old one did, so a CAS on our old revision may succeed
  // there. A success that arrives while some unanswered request is not yet
  // covered is trusted only once a stream-info request sent after it shows
  // the stream we started on. One such check runs at a time, shared by
  // every success that arrived before it was sent; the successes that come
  // while it runs share the next one (thousands of leases whose renewals
  // timed out together must not send thousands of them).
  //
  // So may it during a silence: a process paused (or starved) for longer
  // than a TTL sent nothing and timed nothing out, and the new stream may
  // have passed our revision, so our renewal fails as if another node had
  // taken over, and our next acquire would succeed there under a restarted
  // epoch. An answer that comes more than `silence` ms after the previous
  // one therefore counts as an unanswered request, once the manager has
  // written anything (one that never did has no old epoch to go back on, so
  // a waiter that only watched still takes a released key in one round
  // trip). Holders renew every TTL/3, so this costs a busy manager nothing;
  // an idle one pays one stream-info request after each silence.
  let unanswered = 0;
  let covered = 0;
  let lastAnswer = performance.now();
  let wrote = false;
  const heard = (applied: boolean): void => {
    const now = performance.now();
    if (wrote && now - lastAnswer > silence) unanswered++;
    lastAnswer = now;
    if (applied) wrote = true;
  };
  const suspect = () => unanswered > covered;
  let checking: Promise<void> | undefined;
  let queued: Promise<void> | undefined;
  const confirmStream = (): Promise<void> => {
    if (checking === undefined) {
      const covers = unanswered;
      checking = checkIdentity().then(() => {
        covered = Math.max(covered, covers);
      }).finally(() => checking = undefined);
      return checking;
    }
    // The check running now may have been sent before this success came.
    return queued ??= checking.catch(() => {}).then(() => {
      queued = undefined;
      return confirmStream();
    });
  };
  const checkIdentity = async (): Promise<void> => {
    let si;
    try {
      si = await jsm.streams.info(stream);
    } catch (err) {
      if (isStreamNotFound(err)) {
        throw new BucketGone(`the lease bucket's stream '${stream}' is gone`);
      }
      throw err;
    }
    if (si.created !== created) {
      throw new BucketGone(
        `the lease bucket's stream '${stream}' was deleted and re-created (created ${created}, now ${si.created}), so its revisions and epochs restarted`,
      );
    }
  };
  // No stream listens on the subject: an election, or a deleted bucket.
  // Only the second is for good; one stream-info request tells them apart,
  // and only on this failure path.
  const gone = async (err: unknown): Promise<never> => {
    if (isNoResponders(err)) {
      try {
        await jsm.streams.info(stream);
      } catch (infoErr) {
        if (isStreamNotFound(infoErr)) {
          throw new BucketGone(`the lease bucket's stream '${stream}' is gone`);
        }
      }
    }
    if (isStreamNotFound(err)) {
      throw new BucketGone(`the lease bucket's stream '${stream}' is gone`);
    }
    throw err;
  };
  const apiPrefix = jsm.getOptions().apiPrefix ?? "$JS.API";
  // Through a domain, writes go to `$JS.<domain>.API.$KV.<bucket>.<key>`,
  // which that domain's servers map to the bucket's subject, as nats.js's
  // own KV does. A bare `$KV.` publish from a leaf node would also land in
  // a bucket of the same name in the leaf's own domain, and its ack could
  // come from there.
  const writePrefix = apiPrefix === "$JS.API" ? "" : `${apiPrefix}.`;
  let statusIter: { stop?: () => void } | undefined;
  let lateWatch: { stop(): void } | undefined;
  const inbox = replyInbox(nc);
  inbox.retain();
  // A success after an unanswered request counts once the stream is
  // proven the same; an error of that check fails the write as below.
  const verified = async (res: WriteResult): Promise<WriteResult> => {
    try {
      await confirmStream();
    } catch (err) {
      return failed(err);
    }
    return res;
  };
  const failed = async (err: unknown): Promise<WriteResult> => {
    if (err instanceof BucketGone) throw err;
    unanswered++;
    return await gone(err);
  };
  return {
    now: () => performance.now(),
    setTimer: (fn, ms) => setTimeout(fn, ms),
    clearTimer: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
    newInstanceId: () => crypto.randomUUID().replaceAll("-", ""),
    write(req) {
      // What `js.publish` sends, without its per-request cost (see
      // `ReplyInbox`): the same headers, one shared reply subscription.
      // Filled directly: `set()` validates and canonicalises every name
      // and value (in Bun a sixth of a renewal's CPU), and these are ours:
      // canonical names, values that cannot hold CR or LF.
      const h = new MsgHdrsImpl();
      h.headers.set("Nats-Msg-Id", [req.msgId]);
      h.headers.set("Nats-Expected-Last-Subject-Sequence", [
        String(req.expect),
      ]);
      if (req.op === "DEL") h.headers.set("KV-Operation", ["DEL"]);
      return inbox.request(
        writePrefix + req.subject,
        req.value,
        h,
        req.timeout,
      ).then(
        (res) => {
          heard("seq" in res);
          return suspect() && "seq" in res ? verified(res) : res;
        },
        failed,
      );
    },
    read,
    watch(subject, onEntry, onGone) {
      // Asked only after the watch's consumer failed: one stream info.
      const probe = () =>
        checkIdentity().then(
          () => undefined,
          (err) => err instanceof BucketGone ? err.message : undefined,
        );
      return watchSubject(nc, js, stream, subject, read, onEntry, {
        probe,
        onGone,
      });
    },
    async subjects(filter, timeout) {
      let si: StreamInfo;
      try {
        si = await within(
          jsm.streams.info(stream, { subjects_filter: filter }),
          timeout,
          "stream info",
        );
      } catch (err) {
        if (isStreamNotFound(err)) {
          throw new BucketGone(
            `the lease bucket's stream '${stream}' is gone`,
          );
        }
        throw err;
      }
      return Object.keys(si.state.subjects ?? {});
    },
    markerLife(timeout) {
      // Without markers proven at start-up the manager never asks.
      if (markers.life <= 0) return Promise.resolve(0);
      // A bare request, published before this returns (nats.js's request
      // does not await first), so it leaves in the compare-and-set's flush.
      let reply: Promise<Msg>;
      try {
        reply = nc.request(`${apiPrefix}.STREAM.INFO.${stream}`, undefined, {
          timeout,
        });
      } catch {
        return Promise.resolve(0);
      }
      return reply.then((msg) => {
        const info = msg.json<StreamInfo & { error?: ApiError }>();
        if (info.error !== undefined || typeof info.config !== "object") {
          return 0;
        }
        return currentMarkerLife(info, nc, markers);
      }).catch(() => 0);
    },
    onLink(fn) {
      statusIter = followLink(nc, fn);
    },
    onDistrust(fn) {
      lateWatch ??= watchLatePeers(nc, stream, late, markers, fn);
    },
    isClosed: () => nc.isClosed(),
    closed: () => nc.closed(),
    close: () => {
      inbox.release();
      statusIter?.stop?.();
      lateWatch?.stop();
    },
  };

  async function read(
    subject: string,
    query: { readonly seq?: number; readonly leader: boolean },
  ): Promise<RawEntry | null> {
    const q = query.seq === undefined
      ? { last_by_subj: subject }
      : { seq: query.seq };
    let sm: StoredMsg | null;
    try {
      // A Direct Get may be answered by any replica, which may lag; the
      // MSG.GET API is answered by the stream leader only.
      sm = direct && !query.leader
        ? await jsm.direct.getMessage(stream, q)
        : await jsm.streams.getMessage(stream, q);
    } catch (err) {
      unanswered++;
      return await gone(err);
    }
    heard(false);
    if (suspect()) await confirmStream();
    if (!sm || sm.subject !== subject) return null;
    return rawEntry(sm.seq, sm.header, sm.data);
  }
}

/**
 * Reports the connection's losses and returns to `fn` (see
 * {@linkcode Port.onLink}), telling a return to the same server process
 * from one to another by the `server_id` the server announces: a new
 * process (a restart) announces a new one. nats.js dispatches a status
 * when it notices the loss, before it reconnects, so `"down"` comes before
 * any reply that crossed the gap. Returns the status iterator, to stop.
 */
function followLink(
  nc: NatsConnection,
  fn: (change: LinkChange) => void,
): { stop?: () => void } {
  const it = nc.status();
  let server = nc.info?.server_id;
  let down = false;
  void (async () => {
    try {
      for await (const s of it) {
        if (s.type === "disconnect" && !down) {
          down = true;
          fn("down");
        } else if (s.type === "reconnect" && down) {
          down = false;
          const now = nc.info?.server_id;
          const same = now !== undefined && now === server;
          server = now;
          fn(same ? "same" : "other");
        }
      }
    } catch {
      // The iterator ends with the connection; nothing to report then.
    }
  })();
  return it as { stop?: () => void };
}

function rawEntry(
  seq: number,
  h: MsgHdrs | undefined,
  data: Uint8Array,
): RawEntry {
  const op = h?.get("KV-Operation");
  return {
    seq,
    operation: op === "DEL" || op === "PURGE" ? op : undefined,
    marker: h?.get("Nats-Marker-Reason") || undefined,
    msgId: h?.get("Nats-Msg-Id") || undefined,
    value: decoder.decode(data),
  };
}

/**
 * How long a watch's pull waits at the server, in ms; nats.js sends idle
 * heartbeats every half of it and reports two missed ones, so a watch
 * whose consumer vanished without a word is noticed within 10-15 s
 * (nats.js's default pull waits 30 s, so 30 s). Costs one pull request per
 * watch every 10 s while nothing changes.
 */
const WATCH_PULL_EXPIRES = 10_000;

/**
 * {@linkcode Port.watch} over nats.js: reads the subject's last entry, then
 * follows it with an ordered pull consumer on the bucket's stream, filtered
 * to the subject, from its last message (`last_per_subject`). A KV
 * `watch()` would hide the headers that tell a clean release from an
 * operator's delete, and a server's expiry marker from a purge. The
 * consumer recreates itself after a reconnect or a gap; if it gives up, a
 * new one starts after a backoff. Deliveries are deduplicated by revision.
 *
 * When nats.js (3.4) recreates the ordered consumer (after a reconnect
 * that finds it gone, as after a server restart, or a gap), it keeps the
 * count of messages the old consumer's pull still owed: the new pull asks
 * for only the rest (one message of 64), and nothing pulls again until two
 * idle heartbeats are missed (30 s by default, 10 s with our shorter pull).
 * Such a watch reports one message and
 * then goes quiet, and waiters fall back to reads once per TTL. So once it
 * has recreated itself, the watch starts a fresh consumer instead (from
 * the subject's last message, as always: nothing in between is missed).
 */
function watchSubject(
  nc: NatsConnection,
  js: JetStreamClient,
  stream: string,
  subject: string,
  read: (
    subject: string,
    query: { readonly leader: boolean },
  ) => Promise<RawEntry | null>,
  onEntry: (e: RawEntry | null) => void,
  gone?: {
    probe: () => Promise<string | undefined>;
    onGone: ((why: string) => void) | undefined;
  },
): { stop(): Promise<void> } {
  let stopped = false;
  /** The consumer failed or was deleted: the stream may be gone. */
  let suspect = false;
  /** The consumer's pull found no responder: start a fresh consumer. */
  let unheard = false;
  let last = -1;
  let consumer: Consumer | undefined;
  let messages: ConsumerMessages | undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let wake: (() => void) | undefined;
  const deliver = (e: RawEntry | null): void => {
    if (stopped) return;
    if (e === null) {
      // Only as the first news: later, the consumer tells what replaced it.
      if (last >= 0) return;
      last = 0;
    } else {
      if (e.seq <= last) return;
      last = e.seq;
    }
    onEntry(e);
  };
  const drop = async (): Promise<void> => {
    const c = consumer;
    consumer = undefined;
    // An ordered consumer left behind lingers on the server for minutes.
    await c?.delete().catch(() => {});
  };
  const run = async (): Promise<void> => {
    // A connection closed for good ends the watch: nothing can come back.
    for (let fails = 0; !stopped && !nc.isClosed();) {
      try {
        // The current entry first (or its absence, which the consumer
        // cannot report); the consumer then starts at the subject's last
        // message, so nothing between the two is missed.
        if (last < 0) deliver(await read(subject, { leader: false }));
        if (stopped) return;
        consumer = await js.consumers.get(stream, {
          filter_subjects: subject,
          deliver_policy: DeliverPolicy.LastPerSubject,
        });
        if (stopped) return;
        const msgs = messages = await consumer.consume({
          max_messages: 64,
          expires: WATCH_PULL_EXPIRES,
        });
        if (stopped) msgs.stop();
        void (async () => {
          // Ends when `msgs` stops.
          for await (const s of msgs.status()) {
            if (s.type === "ordered_consumer_recreated") {
              // Only now: `consumer` names the recreated one, which drop()
              // then deletes rather than leaving it to linger.
              msgs.stop();
              return;
            }
            // The pull reached no consumer: on a cluster, a new consumer's
            // pull can arrive before the consumer listens on the server
            // that hosts it. nats.js (3.4) then only marks the ordered
            // consumer for a reset and pulls again after two missed idle
            // heartbeats, which never come from a consumer that never got
            // the pull: 10-15 s of silence, in which an expiry marker goes
            // unseen and waiters fall back to a read a TTL later (seen in
            // the shard bench: a few shards of a killed worker taken a TTL
            // late). A fresh consumer starts from the subject's last
            // message, so nothing is missed.
            if (s.type === "no_responders") {
              unheard = true;
              msgs.stop();
              return;
            }
            // A deleted bucket takes its consumers with it, and nats.js
            // would retry in silence: stop, and ask the stream below. The
            // server does not always say so (2.9.10 under load once left
            // the pull unanswered, with no "consumer deleted"): two missed
            // idle heartbeats are the fallback, and a fresh consumer is
            // what the watch wants then anyway.
            if (
              s.type === "consumer_deleted" || s.type === "stream_not_found" ||
              s.type === "heartbeats_missed"
            ) {
              suspect = true;
              msgs.stop();
              return;
            }
          }
        })().catch(() => {});
        for await (const m of msgs) {
          fails = 0;
          deliver(rawEntry(m.seq, m.headers, m.data));
        }
      } catch {
        fails++;
        suspect = true;
      }
      if (stopped || nc.isClosed()) return;
      // Repeated, it backs off like a failure (a message resets it).
      if (unheard) {
        unheard = false;
        fails++;
      }
      if (suspect && gone?.onGone) {
        // A deleted or re-created bucket never comes back to this watch:
        // say so, so that its waiters and iterators stop waiting.
        suspect = false;
        const why = await gone.probe();
        if (stopped) return;
        if (why !== undefined) {
          gone.onGone(why);
          return;
        }
      }
      await drop();
      await new Promise<void>((resolve) => {
        wake = resolve;
        timer = setTimeout(resolve, Math.min(100 * 2 ** fails, 5_000));
      });
    }
  };
  const running = run();
  return {
    async stop() {
      if (stopped) return;
      stopped = true;
      clearTimeout(timer);
      wake?.();
      messages?.stop();
      await running;
      await drop();
    },
  };
}

function isNoResponders(err: unknown): boolean {
  for (let e = err, i = 0; e instanceof Error && i < 4; e = e.cause, i++) {
    // nats.js reports "no responders" to a JetStream request as a
    // JetStreamNotEnabled error (a misleading name) with the cause inside.
    if (
      e.name === "NoRespondersError" || e.name === "JetStreamNotEnabled" ||
      /no responders/i.test(e.message)
    ) {
      return true;
    }
  }
  return false;
}

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
 * it (the servers that are up answer within milliseconds; one that is down
 * would hold the round for all of `ms`). Never rejects.
 */
function census(
  nc: NatsConnection,
  wanted: readonly string[],
  ms: number,
  enough?: {
    met(versions: ReadonlyMap<string, string>): boolean;
    settle: number;
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
        settling = setTimeout(() => finish(), enough.settle);
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

/** Resolves like `p`, or rejects with a timeout error after `ms`. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    p,
    new Promise<never>((_, reject) => {
      timer = setTimeout(
        () =>
          reject(
            new Error(`${what} got no answer within ${Math.round(ms)} ms`),
          ),
        Math.max(0, ms),
      );
    }),
  ]).finally(() => clearTimeout(timer));
}

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

/** The first release whose markers are right for TTL expiries and in clusters. */
const MARKERS_FIXED: Triple = [2, 11, 2];

/** Whether a server version has trustworthy subject delete markers. */
function markersVersion(version: string): boolean {
  const parsed = parseVersion(version);
  if (parsed === undefined) return false;
  const c = compare(parsed.v, MARKERS_FIXED);
  return c > 0 || (c === 0 && !parsed.pre);
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
interface MarkerProof {
  life: number;
  /** Grows when a peer that was down at start-up is proven later. */
  peers: Set<string>;
}

/**
 * The marker life a stream's configuration gives: the max age when the
 * marker TTL is longer (the max-age path, never early), else the marker
 * TTL in whole seconds less a margin; 0 without markers.
 */
function configuredMarkerLife(info: StreamInfo): number {
  const cfg = info.config as {
    max_age?: number;
    subject_delete_marker_ttl?: number;
  };
  const markerMs = Math.floor((cfg.subject_delete_marker_ttl ?? 0) / 1e9) *
    1000;
  const maxAge = (cfg.max_age ?? 0) / 1e6;
  if (!(markerMs > 0) || !(maxAge > 0)) return 0;
  const life = markerMs > maxAge ? maxAge : markerMs - MARKER_EARLY_MARGIN;
  return life > 0 ? life : 0;
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

/** A replica the leader has not heard from for this long counts as down. */
const DOWN_AFTER_MS = 1_500;

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
 * 2.11.2 or later on every server holding it). Never rejects.
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
async function proveServers(
  nc: NatsConnection,
  jsm: JetStreamManager,
  stream: string,
  timeoutMs: number,
  casCheck: boolean,
  wantMarkers: boolean,
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
  const life = wantMarkers ? configuredMarkerLife(info) : 0;
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
  // replica) tells a peer that is down from one slow to answer: only when
  // some peer has been silent that long is the quorum given just
  // QUORUM_SETTLE_MS more; otherwise every peer looks up, and the others get
  // up to LATE_ANSWER_MS, so a loaded machine still proves them all here.
  const silent = (info.cluster?.replicas ?? []).some((r) =>
    (r.active ?? 0) / 1e6 > DOWN_AFTER_MS
  );
  const { versions, failure } = await census(nc, unique, budget, {
    met: (seen) =>
      (leader === undefined || seen.has(leader)) &&
      unique.filter((p) => seen.has(p)).length >= quorum,
    settle: silent ? QUORUM_SETTLE_MS : LATE_ANSWER_MS,
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
function currentMarkerLife(
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
  const nc = o.nc;
  // Set-up is off the write path, so it may wait longer than a lease
  // operation: see SETUP_TIMEOUT.
  const setupTimeout = Math.max(o.timeout, SETUP_TIMEOUT);
  const setupDeadline = performance.now() + setupTimeout;
  // Every set-up request is safe to repeat (see whileLeaderless).
  // Requests get shorter attempts, asked again until the set-up deadline.
  const attempt = Math.min(setupTimeout, Math.max(o.timeout, SETUP_ATTEMPT));
  const ask = <T>(request: (timeout: number) => Promise<T>) =>
    whileLeaderless(request, setupDeadline, o.signal, {
      first: Math.max(o.timeout, SETUP_FIRST_ATTEMPT),
      most: attempt,
    });
  // `$JS.<domain>.API` in place of `$JS.API` for every request below.
  const domain = o.domain === undefined ? {} : { domain: o.domain };
  let jsm: JetStreamManager;
  try {
    jsm = await ask((timeout) => jetstreamManager(nc, { timeout, ...domain }));
  } catch (err) {
    if (isNoResponders(err)) {
      throw new Error(
        `Cannot create lease manager as ${
          o.domain === undefined
            ? "the NATS server does not offer JetStream (start nats-server with -js, or enable JetStream for this account)"
            : `no server answers for JetStream domain '${o.domain}' (check the domain name, and that the leaf node is connected to the server with that domain)`
        }: ${errText(err)}`,
        { cause: err },
      );
    }
    throw err;
  }
  const existing = await ask(async (timeout) =>
    bucketStatus(
      await jetstreamManager(nc, { timeout, ...domain, checkAPI: false }),
      o.bucket,
    )
  );
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
    adoptTtl(o, options);
  } else if (!o.createBucket) {
    throw new Error(
      `Cannot create lease manager as bucket '${o.bucket}' does not exist and 'createBucket' is false`,
    );
  }
  const replicas = existing?.replicas ?? options.replicas ?? 1;
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
    // Safe to repeat: `Kvm.create` reads the stream's info first and adds
    // it only when the server says it is missing, and an add with the same
    // config as the stream has succeeds (a concurrent creator's add
    // included), so a repeat never makes a second bucket or changes one.
    const kv = await ask(
      () =>
        new Kvm(jetstream(nc, { timeout: attempt, ...domain })).create(
          o.bucket,
          {
            ttl: o.ttl,
            history: 1,
            replicas,
            ...(withMarkers
              ? { markerTTL: (Math.floor(o.ttl / 1000) + 1) * 1000 }
              : {}),
          },
        ),
    );
    // Created now, or concurrently by another process: read what it is.
    const status = await ask(() => kv.status());
    if (status.ttl !== o.ttl) {
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
    o.markers,
  );
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
  return new Manager(
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
    ),
    o,
  );
}

async function bucketStatus(
  jsm: JetStreamManager,
  bucket: string,
): Promise<
  | { ttl: number; replicas: number; direct: boolean; created: string }
  | undefined
> {
  try {
    const si = await jsm.streams.info(`KV_${bucket}`);
    return {
      ttl: Math.round(si.config.max_age / 1_000_000),
      replicas: si.config.num_replicas,
      direct: si.config.allow_direct === true,
      created: si.created,
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

function checkBoolean(name: string, value: unknown): void {
  if (value !== undefined && typeof value !== "boolean") {
    throw new TypeError(
      `Cannot create lease manager as '${name}' must be a boolean: received ${
        describe(value)
      }`,
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
  const { nc, node, bucket = "leases", signal } = options;
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
  const { domain } = options;
  // One subject token: the domain goes into `$JS.<domain>.API`.
  if (
    domain !== undefined &&
    (typeof domain !== "string" || !DOMAIN_RE.test(domain))
  ) {
    throw new TypeError(
      `Cannot create lease manager as 'domain' must be a non-empty JetStream domain name without whitespace, '.', '*' or '>': received ${
        describe(domain)
      }`,
    );
  }
  const ttl = checkDuration(
    "ttl",
    options.ttl ?? DEFAULT_TTL,
    MIN_TTL,
    2 ** 31 - 1,
  );
  const replicas = options.replicas ?? 1;
  if (!Number.isInteger(replicas) || replicas < 1 || replicas > 5) {
    throw new RangeError(
      `Cannot create lease manager as 'replicas' must be an integer from 1 to 5: received ${
        describe(replicas)
      }`,
    );
  }
  checkBoolean("restartGrace", options.restartGrace);
  checkBoolean("createBucket", options.createBucket);
  checkBoolean("allowUnverifiedReplicas", options.allowUnverifiedReplicas);
  checkBoolean("markers", options.markers);
  if (
    options.check !== undefined && options.check !== "cas" &&
    options.check !== "lease"
  ) {
    throw new TypeError(
      `Cannot create lease manager as 'check' must be "cas" or "lease": received ${
        describe(options.check)
      }`,
    );
  }
  const idleRelease = options.idleRelease === undefined
    ? undefined
    : checkDuration("idleRelease", options.idleRelease, 1, 2 ** 31 - 1);
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `Cannot create lease manager as 'signal' must be an AbortSignal: received ${
        describe(signal)
      }`,
    );
  }
  const o: Resolved = {
    nc: nc as unknown as NatsConnection,
    node,
    ttl,
    timeout: 0,
    settleTimeout: 0,
    idleRelease,
    check: options.check ?? "cas",
    restartGrace: options.restartGrace ?? true,
    markers: options.markers ?? true,
    markerLife: 0,
    createBucket: options.createBucket ?? true,
    allowUnverifiedReplicas: options.allowUnverifiedReplicas ?? false,
    domain,
    bucket,
    signal,
  };
  // Checked against the given (or default) TTL now, and again against an
  // existing bucket's TTL once it is adopted.
  adoptTtl(o, options);
  return o;
}
