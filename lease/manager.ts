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
 *    new epoch and the two-TTL grace of an unexplained gap. A renewal never
 *    takes a key that is not held: when the operation before it found the
 *    tenure over, it does nothing, and only a caller (a guard, `held()`)
 *    acquires.
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
 *    when an entry expires; and this manager taking the key itself, for
 *    any of its callers); a renewal by the same holder only moves that
 *    timer (which is why our own new entry after our old one, seen as such
 *    a renewal, must wake our waiters at the take instead). A waiter that
 *    found the server unavailable backs off (50 ms, doubling to TTL/3), but
 *    such news, or the connection coming back, wakes it sooner. The one thing it feeds into a decision is when a
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
 * ## The fenced layout (`createLeaseManager({ fenced: true })`; see
 * `lease/fenced.ts` and `design/fenced.md`)
 * Tenure entries live at `_lease.k.<key>` and move only at a change of
 * holder; each names, by its tag, the session of the manager that wrote it
 * (`lease/session.ts`), whose one entry, renewed every TTL/3 with a TTL of
 * its own, keeps every key of that manager. Points 1-4 and 9 change; 5-8
 * and 10 hold as written, with "renewal" read as the session's.
 * - F1. **The server fences.** A fenced write of the tenure at epoch E is
 *   stored only while the key's tenure entry is still at revision E: the
 *   check and the write are one step at the stream leader (nats-server
 *   2.11+; `Port.publish`, `Port.commit`). A successor's compare-and-set
 *   moves the entry past E, so no fenced write of a tenure is stored after
 *   a later tenure of its key began. The simulator's PF checks this on
 *   the stored log, not on the manager's word.
 * - F2. **The epoch moves only when the holder changes**: nothing of the
 *   manager's renewals writes a tenure entry, so a fenced write in flight
 *   is never refused by our own renewal.
 * - F3. **A session ends for good**: its renewal is a compare-and-set on
 *   its own last revision, and an expiry (a `MaxAge` marker) or a delete
 *   moves that revision, so it is never revived. When it ends, every key
 *   it kept ends with it at once, and a new session (a new id) takes keys
 *   anew.
 * - F4. **What a fenced key is vouched for by**: the session's last
 *   confirmed renewal, sent at `s`, keeps the session's entry until at
 *   least `s + TTL` (stamped on arrival, a TTL rounded up to whole
 *   seconds, expiry never early). With no grace to absorb clock drift,
 *   `throwIfLost()`, `held()`, events and lease-checked guards vouch only
 *   until `s + TTL - 2ρ·TTL` of the local clock (point 9's margin), which
 *   is also when the session gives itself up. A guard with `check: "cas"` reads the tenure entry from the
 *   stream leader at its commit point instead of writing it (F2). Only
 *   writes that are not fenced rest on this; F1 needs none of it.
 * - F5. **A takeover owes no grace.** A key is taken when its tenure
 *   entry is free (none, a delete, a marker), or names a session that is
 *   over: its entry gone, expired or never there, or its connection gone
 *   (the server answers its probe "no responders" at once; a paused or
 *   cut-off holder's probe times out, which proves nothing). The second
 *   may displace a holder that is alive but whose connection the server
 *   dropped; F1 still holds, and that holder's writes that are not fenced
 *   are the store's to refuse, as they always are after a grace runs out.
 *   Residue: a probe through a server that has not yet learned of the
 *   holder's subscription (a route, a leaf node) is answered "no
 *   responders" too (the port's `serve` resolves once the holder's own
 *   server has it; a route carried it within 1.5 ms here). Residue: a
 *   delete of a live holder's tenure entry behind its back (an operator,
 *   `lease release`) frees the key at once, and nothing renews that entry,
 *   so the holder learns of it only at its next guard with `check: "cas"`,
 *   `held()` or refused fenced write; until then its `throwIfLost()` and
 *   lease-checked guards still vouch (F1 still holds). Waiters learn of a
 *   session's end from a watch of its entry (read itself each TTL/3 too)
 *   and probe its connection every SESSION_CHECK; only the acquire path's
 *   own check, which reads the entry from the leader, takes a key.
 * - F6. **A server that loses acknowledged writes** can lose a tenure
 *   entry's write: a successor may then take the key at the same revision
 *   E, and the old holder's fenced writes expecting E land under the new
 *   tenure. A lease sends a fenced write only while `throwIfLost()` passes,
 *   so from the drop that such a restart causes (point 10's suspension)
 *   and after its tenure ends it sends none; what remains is a write sent
 *   before the drop and delivered after it (nats.js resends what it held),
 *   and a holder whose connection did not drop (a leaf client, a cluster
 *   peer that kept running). Fenced buckets need `sync_interval: always`,
 *   or replicas whose quorum kept the write (see Durability).
 *
 * @module
 */

import { abortReason, onAbort, raceAbort } from "./_async.ts";
import { encoder, entryId, type Seen, toSeen } from "./entry.ts";
import { errText, NotHolderError, UnavailableError } from "./errors.ts";
import {
  type AcquiredFrom,
  LeaseAcquiredEvent,
  LeaseDefunctEvent,
  LeaseLostEvent,
  LeaseReleasedEvent,
  LeaseRenewedEvent,
  RenewalFailedEvent,
} from "./events.ts";
import { checkKey, checkSignal, describe } from "./input.ts";
import type { Session } from "./session.ts";
import {
  BucketGone,
  type Fence,
  type LinkChange,
  type Port,
  type RawEntry,
  WriteRefused,
  type WriteResult,
} from "./port.ts";
import {
  batch,
  EXPIRY_MARGIN,
  EXPIRY_STEP,
  EXPIRY_WINDOW,
  FIRST_BACKOFF,
  KeyState,
  KeyWatch,
  type Listener,
  type Pending,
  SessionWatch,
  Tenure,
  type TenureReport,
} from "./state.ts";
import {
  type CloseResult,
  type FencedOp,
  type GuardCheck,
  type GuardOptions,
  type HealthOptions,
  type Holder,
  type Lease,
  leaseCheckMargin,
  type LeaseHealth,
  type LeaseManager,
  type WatchOptions,
} from "./types.ts";

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
  /**
   * The longest key taken, in characters: a longer one is refused with a
   * TypeError before anything is sent (see `maxKeyLength` in
   * `lease/input.ts`). No limit when omitted.
   */
  maxKey?: number;
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
  /**
   * Internal (issue 33; `createLeaseManager` does not offer it yet): the
   * fenced layout of `design/fenced.md`. Absent: the classic layout.
   */
  fenced?: FencedSettings;
}

/**
 * The fenced layout: where tenure entries and data live, and the sessions
 * that keep this manager's keys (`lease/session.ts`).
 */
export interface FencedSettings {
  /** The manager's session; its id becomes the manager's instance id. */
  readonly session: Session;
  /** Opens a new session with the given id, after the last one ended. */
  readonly reopen: (id: string) => Promise<Session>;
  /** The subject of a key's tenure entry. */
  readonly tenure: (key: string) => string;
  /**
   * The subject of a data key, which fenced puts and deletes store: on a
   * bucket. Absent on a stream, which takes appends instead.
   */
  readonly data?: (key: string) => string;
  /**
   * On a stream: throws a TypeError unless `subject` may take a fenced
   * append (a subject of the stream, outside the leases' own). Absent on
   * a bucket.
   */
  readonly append?: (subject: string) => void;
  /** The subject of a session's entry, given its id. */
  readonly sessionSubject: (id: string) => string;
  /** The subject a session's responder answers on, given its id. */
  readonly probeSubject: (id: string) => string;
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

/** What a lease of the fenced layout needs for its fenced writes. */
interface FenceContext {
  /** The key's tenure entry: the subject every fenced write is checked against. */
  readonly subject: string;
  /** The subject of a data key (a bucket). */
  readonly data?: (key: string) => string;
  /** Checks an append's subject (a stream). */
  readonly append?: (subject: string) => void;
  /** Request timeout, ms. */
  readonly timeout: number;
  /** The server refused a write of this tenure: it is over. */
  readonly refused: (conflict: number) => void;
}

/** The prefix of the fenced layout's own subjects, which data keys may not use. */
const RESERVED = "_lease.";

/** A fenced write's refusal on a classic bucket, before anything is sent. */
function notFenced(verb: string, key: string): TypeError {
  return new TypeError(
    `Cannot ${verb} '${key}' as the lease bucket is not fenced: only a fenced bucket's server refuses a stale write`,
  );
}

/**
 * On a fenced bucket, how long one check of another manager's session
 * serves (ms), and how often a key's waiters probe the session of its
 * holder: a crashed holder's key is taken within about this much of the
 * server seeing its connection close. The session's entry is watched
 * meanwhile (its expiry wakes the waiters), and read itself only each
 * TTL/3, so a waiting manager sends about 40 probes a second per session
 * it waits on, and no JetStream request (measured on 2.15.2: a waiter's
 * messages halved, 373 to 191 in 5 s).
 */
const SESSION_CHECK = 25;

/** The longest a probe of a session waits (ms): silence proves nothing. */
const PROBE_TIMEOUT = 250;

/** A lease handed to one guarded write; reads its tenure's live deadline. */
class HeldLease implements Lease {
  readonly key: string;
  readonly node: string;
  readonly epoch: number;
  readonly tenure: string;
  readonly signal: AbortSignal;
  readonly #tenure: Tenure;
  readonly #port: Port;
  readonly #fence: FenceContext | undefined;

  constructor(
    key: string,
    node: string,
    tenure: Tenure,
    signal: AbortSignal,
    port: Port,
    fence?: FenceContext,
  ) {
    this.key = key;
    this.node = node;
    this.epoch = tenure.epoch;
    this.tenure = tenure.id;
    this.signal = signal;
    this.#tenure = tenure;
    this.#port = port;
    this.#fence = fence;
  }

  put(key: string, value: Uint8Array | string): Promise<number> {
    try {
      const subject = this.#fenced("put", key)(key);
      const data = typeof value === "string" ? encoder.encode(value) : value;
      if (!(data instanceof Uint8Array)) {
        throw new TypeError(
          `Cannot put '${key}' as 'value' must be a string or a Uint8Array: received ${
            describe(value)
          }`,
        );
      }
      return this.#publish(this.#fence!, key, subject, "PUT", data);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  delete(key: string): Promise<number> {
    try {
      const subject = this.#fenced("delete", key)(key);
      return this.#publish(
        this.#fence!,
        key,
        subject,
        "DEL",
        new Uint8Array(0),
      );
    } catch (err) {
      return Promise.reject(err);
    }
  }

  publish(subject: string, data: Uint8Array | string): Promise<number> {
    try {
      const to = this.#appendable("publish to", subject);
      const bytes = typeof data === "string" ? encoder.encode(data) : data;
      if (!(bytes instanceof Uint8Array)) {
        throw new TypeError(
          `Cannot publish to '${subject}' as 'data' must be a string or a Uint8Array: received ${
            describe(data)
          }`,
        );
      }
      // A plain append: no KV operation header, so a reader of the stream
      // sees the message as published.
      return this.#publish(this.#fence!, subject, to, "PUT", bytes);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  async commit(
    ops: readonly FencedOp[],
  ): Promise<{ seq: number; count: number }> {
    if (!Array.isArray(ops)) {
      throw new TypeError(
        `Cannot commit on '${this.key}' as 'ops' must be an array: received ${
          describe(ops)
        }`,
      );
    }
    const f = this.#fence;
    if (f === undefined) throw notFenced("commit on", this.key);
    const commit = this.#port.commit;
    if (commit === undefined) {
      throw new TypeError(
        `Cannot commit on '${this.key}' as this port cannot commit batches`,
      );
    }
    const writes = ops.map((op) => {
      if (op !== null && typeof op === "object" && "publish" in op) {
        const append = this.#appendable("commit", op.publish);
        const v = op.data;
        const data = typeof v === "string" ? encoder.encode(v) : v;
        if (!(data instanceof Uint8Array)) {
          throw new TypeError(
            `Cannot commit an append to '${op.publish}' as its 'data' must be a string or a Uint8Array: received ${
              describe(v)
            }`,
          );
        }
        return { subject: append, op: "PUT" as const, data };
      }
      if (op !== null && typeof op === "object" && "put" in op) {
        const subject = this.#fenced("commit", op.put)(op.put);
        const v = op.value;
        const data = typeof v === "string" ? encoder.encode(v) : v;
        if (!(data instanceof Uint8Array)) {
          throw new TypeError(
            `Cannot commit a put of '${op.put}' as its 'value' must be a string or a Uint8Array: received ${
              describe(v)
            }`,
          );
        }
        return { subject, op: "PUT" as const, data };
      }
      if (op !== null && typeof op === "object" && "delete" in op) {
        const subject = this.#fenced("commit", op.delete)(op.delete);
        return {
          subject,
          op: "DEL" as const,
          data: new Uint8Array(0),
        };
      }
      throw new TypeError(
        `Cannot commit on '${this.key}' as each op must be { put, value }, { delete } or { publish, data }: received ${
          describe(op)
        }`,
      );
    });
    return await this.#send<{ seq: number; count: number }>(
      f,
      `the fenced commit on '${this.key}'`,
      (fence) => commit({ writes, fence, timeout: f.timeout }),
    );
  }

  /**
   * The data key subjects, after checking that `key` may be written by a
   * fenced put or delete (a fenced bucket's data key).
   */
  #fenced(verb: string, key: string): (key: string) => string {
    const f = this.#fence;
    if (f === undefined) throw notFenced(verb, key);
    if (f.data === undefined) {
      throw new TypeError(
        `Cannot ${verb} '${key}' as the leases live in a stream, which takes appends: use publish(subject, data)`,
      );
    }
    checkKey(verb, key);
    if (key.startsWith(RESERVED)) {
      throw new TypeError(
        `Cannot ${verb} '${key}' as keys under '${RESERVED}' hold the leases themselves`,
      );
    }
    return f.data;
  }

  /** `subject`, after checking that a fenced append may go there. */
  #appendable(verb: string, subject: string): string {
    const f = this.#fence;
    if (f === undefined) throw notFenced(verb, String(subject));
    if (f.append === undefined) {
      throw new TypeError(
        `Cannot ${verb} '${subject}' as the leases live in a KV bucket, which takes puts and deletes: use put(key, value)`,
      );
    }
    if (typeof subject !== "string") {
      throw new TypeError(
        `Cannot ${verb} a subject as 'subject' must be a string: received ${
          describe(subject)
        }`,
      );
    }
    f.append(subject);
    return subject;
  }

  async #publish(
    f: FenceContext,
    key: string,
    subject: string,
    op: "PUT" | "DEL",
    data: Uint8Array,
  ): Promise<number> {
    const publish = this.#port.publish;
    if (publish === undefined) {
      throw new TypeError(
        `Cannot write '${key}' as this port cannot publish fenced writes`,
      );
    }
    const res = await this.#send<{ seq: number }>(
      f,
      `the fenced write of '${key}'`,
      (fence) => publish({ subject, op, data, fence, timeout: f.timeout }),
    );
    return res.seq;
  }

  /**
   * Sends one fenced request of this tenure and settles it. Sent only
   * while this lease is vouched for (F6): the server fences it anyway,
   * except after losing the writes it acknowledged, when our epoch's
   * revision may have been handed to a successor. A refusal ends the
   * tenure here too; no answer may mean it was stored.
   */
  async #send<R extends { seq: number }>(
    f: FenceContext,
    what: string,
    send: (fence: Fence) => Promise<R | { readonly conflict: number }>,
  ): Promise<R> {
    this.throwIfLost();
    let res: R | { readonly conflict: number };
    try {
      res = await send({ subject: f.subject, seq: this.epoch });
    } catch (err) {
      if (err instanceof RangeError || err instanceof TypeError) throw err;
      // An error the server answered with is not a lost reply: nothing
      // of the write was stored.
      const answered = err instanceof WriteRefused;
      throw new UnavailableError(
        this.key,
        answered
          ? `${what} was refused by the server, and nothing of it was stored: ${
            errText(err)
          }`
          : `${what} got no answer (it may have been stored): ${errText(err)}`,
        { cause: err },
      );
    }
    if ("conflict" in res) {
      f.refused(res.conflict);
      throw this.#refused(res.conflict);
    }
    return res;
  }

  #refused(conflict: number): NotHolderError {
    return new NotHolderError(
      this.key,
      undefined,
      undefined,
      `Lease on '${this.key}' is over: the server refused a write of the tenure at epoch ${this.epoch}, as the key's tenure entry is now at revision ${conflict}`,
    );
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
      this.#fence,
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

export class Manager extends EventTarget implements LeaseManager {
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
  /**
   * The longest key taken ({@linkcode ManagerSettings.maxKey}); the
   * recipes read it to check a name up front (`keyRoom`).
   */
  readonly maxKey: number;
  /** See {@linkcode leaseCheckMargin}. */
  readonly #margin: number;
  /**
   * Tags our writes so a restarted process with our node id is told apart.
   * On a fenced bucket it is the id of the current session, so a tenure
   * entry's tag names the session that keeps it (a new session, a new id).
   */
  #instance: string;
  /** The fenced layout (issue 33), or `undefined` for the classic one. */
  readonly #fenced: FencedSettings | undefined;
  /** The current session of the fenced layout (`undefined` between two). */
  #session: Session | undefined;
  /** Session checks waiting on a probe's answer: close() ends them. */
  readonly #probeWaits = new Set<(a: AcquiredFrom | undefined) => void>();
  /**
   * Recent checks of other managers' sessions, by session id; `full` when
   * the check read the session's entry too (not only probed it).
   */
  readonly #sessionChecks = new Map<
    string,
    { at: number; full: boolean; dead: Promise<AcquiredFrom | undefined> }
  >();
  /** Watches of other managers' sessions that waiters here wait on. */
  readonly #sessionWatches = new Map<string, SessionWatch>();
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
    this.maxKey = o.maxKey ?? Infinity;
    this.#margin = leaseCheckMargin(o.ttl);
    this.#fenced = o.fenced;
    this.#session = o.fenced?.session;
    this.#instance = this.#session?.id ?? port.newInstanceId();
    if (this.#session) this.#follow(this.#session);
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
        // (No grace on a fenced bucket: the server fences.)
        if (!this.#fenced) {
          for (const p of st.pending) {
            p.grace = Math.max(p.grace, 2 * this.ttl);
          }
        }
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
    if (this.#fenced) return this.#fenced.tenure(key);
    return `$KV.${this.bucket}.${key}`;
  }

  // -------------------------------------------------------------------------
  // The fenced layout (issue 33, design/fenced.md): a key is held while its
  // tenure entry names this manager's session (by its tag) and the session
  // lives; the session's renewals keep every such key. Safety rests on the
  // server's check of each fenced write against the tenure entry (F1); the
  // rest (takeover with no grace, F5) only decides who may try.

  /** Hears `s`'s renewals and its end. */
  #follow(s: Session): void {
    s.onRenewed((sent) => {
      if (s !== this.#session) return;
      for (const st of this.#keys.values()) {
        const t = st.tenure;
        if (st.held && t && !t.controller.signal.aborted && !t.suspended) {
          this.#confirmed(st, sent);
        }
      }
    });
    s.onLost((why) => {
      if (s !== this.#session) return;
      this.#session = undefined;
      const now = this.#port.now();
      // Every key of the session at once (point 5 of issue 33): its entry
      // may expire, or has, and waiters elsewhere take the keys then.
      for (const st of this.#keys.values()) {
        if (!st.held) continue;
        st.held = false;
        this.#clearExpiry(st);
        st.tenure?.end(
          new UnavailableError(
            st.key,
            `Lease on '${st.key}' ended with this manager's session: ${why}`,
          ),
          now,
          "expired",
        );
      }
      void this.#reopen();
    });
  }

  /** Opens a new session after the last one ended, retrying every TTL/3. */
  async #reopen(): Promise<void> {
    const f = this.#fenced!;
    while (!this.#closing && !this.#stopped && !this.#defunct) {
      const id = this.#port.newInstanceId();
      try {
        const s = await f.reopen(id);
        if (this.#closing || this.#stopped || this.#defunct) {
          await s.close();
          return;
        }
        this.#session = s;
        this.#instance = id;
        this.#follow(s);
        return;
      } catch {
        await this.#pause(this.ttl / 3, undefined);
      }
    }
  }

  /**
   * Whether the session that `seen` (another holder's tenure entry) names
   * is over: `"session-ended"` when its entry is gone, expired or never
   * was (or the entry names none), `"crashed"` when the server says
   * nothing answers its probe; `undefined` while it may live. One check per
   * session serves every key and waiter for {@linkcode SESSION_CHECK} ms.
   * Rejects when the server cannot be read.
   */
  #sessionOver(
    seen: Seen,
    readEntry = true,
  ): Promise<AcquiredFrom | undefined> {
    const f = this.#fenced!;
    const id = seen.instance;
    if (id === undefined) return Promise.resolve("session-ended");
    const now = this.#port.now();
    const hit = this.#sessionChecks.get(id);
    if (
      hit !== undefined && now - hit.at < SESSION_CHECK &&
      (hit.full || !readEntry)
    ) return hit.dead;
    const probe = this.#port.probe;
    // Both in one flush: the entry from the stream leader (a lagging
    // replica may not have a new session yet), the probe from the server.
    // A waiter whose session watch is live probes only: the watch tells it
    // of the entry's end, and only the acquire path's check (which reads
    // the entry) may take the key.
    const entry = readEntry
      ? this.#read(f.sessionSubject(id), undefined, true)
      : Promise.resolve({ kind: "put" } as const);
    const answer = probe === undefined
      ? Promise.resolve("unknown" as const)
      : probe(f.probeSubject(id), Math.min(this.#timeout, PROBE_TIMEOUT));
    // The entry decides alone once it shows the session over. Else the
    // probe may still say "gone", which comes within a round trip; a paused
    // or cut-off holder's probe times out, and a check does not wait for
    // that (silence proves nothing).
    const dead = entry.then((e) => {
      if (e === null || e.kind !== "put") return "session-ended" as const;
      // Once closing, no timer of ours may outlive close().
      if (this.#closing) return undefined;
      return new Promise<AcquiredFrom | undefined>((resolve) => {
        const done = (a: AcquiredFrom | undefined) => {
          this.#port.clearTimer(timer);
          this.#probeWaits.delete(done);
          resolve(a);
        };
        const timer = this.#port.setTimer(() => done(undefined), SESSION_CHECK);
        this.#probeWaits.add(done);
        void answer.then((a) => done(a === "gone" ? "crashed" : undefined));
      });
    });
    this.#sessionChecks.set(id, { at: now, full: readEntry, dead });
    dead.catch(() => this.#sessionChecks.delete(id));
    if (this.#sessionChecks.size > 1024) {
      for (const [k, v] of this.#sessionChecks) {
        if (now - v.at >= SESSION_CHECK) this.#sessionChecks.delete(k);
      }
    }
    return dead;
  }

  /** The fence of `st`'s current tenure, for its leases' fenced writes. */
  #fenceOf(st: KeyState): FenceContext | undefined {
    const f = this.#fenced;
    if (f === undefined) return undefined;
    const t = st.tenure;
    return {
      subject: st.subject,
      ...(f.data !== undefined ? { data: f.data } : {}),
      ...(f.append !== undefined ? { append: f.append } : {}),
      timeout: this.#timeout,
      refused: () => {
        // The server saw the tenure entry move: another tenure began.
        if (st.tenure === t && st.held) this.#lost(st, null);
      },
    };
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
      if (!known) checkKey("guard a write", key, this.maxKey);
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
      checkSignal("guard a write", key, signal);
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
    // the write; its waits go when it settles, so a long-lived caller
    // signal does not collect one dependent per guard (and concurrent
    // guards share one listener on it, onAbort).
    const tenureSignal = tenure.controller.signal;
    let leaseSignal = tenureSignal;
    let unfollow: (() => void) | undefined;
    if (signal && follow) {
      const follow = new AbortController();
      const offTenure = onAbort(
        tenureSignal,
        () => follow.abort(tenureSignal.reason),
      );
      const offCaller = onAbort(signal, () => follow.abort(signal.reason));
      leaseSignal = follow.signal;
      unfollow = () => {
        offTenure();
        offCaller();
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
        new HeldLease(
          st.key,
          this.node,
          tenure,
          leaseSignal,
          this.#port,
          this.#fenceOf(st),
        ),
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
    checkKey("check a lease", key, this.maxKey);
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
    checkKey("read a holder", key, this.maxKey);
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
    checkKey("list holders", prefix, this.maxKey);
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
      if (closing.aborted) return resolve();
      let stop = (): unknown => undefined;
      const cleanup = () => {
        stop();
        offCaller?.();
        offClose();
      };
      const done = () => {
        cleanup();
        resolve();
      };
      // Every wait shares one listener per signal (onAbort): a manager's
      // close is waited on by all its waiting guards and campaigns.
      const offCaller = signal && onAbort(signal, () => {
        cleanup();
        reject(abortReason(signal));
      });
      const offClose = onAbort(closing, done);
      stop = start(done);
    });
  }

  campaign(key: string, options?: WatchOptions): AsyncIterable<Lease> {
    checkKey("campaign", key, this.maxKey);
    this.#checkOpen("campaign", key);
    checkSignal("campaign", key, options?.signal);
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
    checkKey("watch a lease", key, this.maxKey);
    this.#checkOpen("watch a lease", key);
    checkSignal("watch a lease", key, options?.signal);
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
    // Shared listeners (onAbort): a shards member has 16 such iterators.
    const offCaller = signal && onAbort(signal, wake);
    const offClose = onAbort(this.#closeCtl.signal, wake);
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
      offCaller?.();
      offClose();
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
    const stopped = Promise.all([
      kw.handle?.stop(),
      this.#leaveSession(kw),
    ]);
    kw.handle = undefined;
    return stopped.then(() => {}, () => {});
  }

  /** Lets the session watch of `id` wake `kw`'s waiters, opening it if need be. */
  #joinSession(kw: KeyWatch, id: string): void {
    let sw = this.#sessionWatches.get(id);
    if (sw === undefined) {
      const w = sw = new SessionWatch(id);
      this.#sessionWatches.set(id, w);
      if (this.#port.watch) {
        w.handle = this.#port.watch(
          this.#fenced!.sessionSubject(id),
          (e) => this.#onSessionNews(w, e === null ? null : toSeen(e)),
        );
      }
    }
    sw.keys.add(kw);
    kw.session = sw;
  }

  /**
   * Detaches `kw` from its session watch; the last key to leave stops it.
   * Resolves when what the watch opened is removed.
   */
  #leaveSession(kw: KeyWatch): Promise<void> {
    const sw = kw.session;
    if (sw === undefined) return Promise.resolve();
    kw.session = undefined;
    sw.keys.delete(kw);
    if (sw.keys.size > 0 || this.#sessionWatches.get(sw.id) !== sw) {
      return Promise.resolve();
    }
    this.#sessionWatches.delete(sw.id);
    const stopped = sw.handle?.stop() ?? Promise.resolve();
    sw.handle = undefined;
    return stopped.catch(() => {});
  }

  /**
   * News of a session's entry. Its end (none, a marker, a delete) wakes
   * the waiters of every key whose holder it kept; they retry the acquire
   * path, whose own check decides (a wake never takes a key).
   */
  #onSessionNews(sw: SessionWatch, seen: Seen | null): void {
    if (this.#sessionWatches.get(sw.id) !== sw) return;
    if (seen?.kind === "put") {
      sw.live = true;
      return;
    }
    sw.live = false;
    this.#sessionChecks.delete(sw.id);
    for (const kw of [...sw.keys]) this.#wake(kw);
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
    // The session a fenced key's waiters wait on: the one its holder's
    // tenure entry names, while anyone waits (not our own).
    const waitedOn = this.#fenced && !kw.stopped && !this.#stopped &&
        kw.seen?.kind === "put" && kw.waiters.size > 0 &&
        kw.seen.instance !== this.#instance
      ? kw.seen.instance
      : undefined;
    if (kw.session !== undefined && kw.session.id !== waitedOn) {
      void this.#leaveSession(kw);
    }
    if (kw.stopped || kw.reading || this.#stopped) return;
    const now = this.#port.now();
    let at: number;
    if (!this.#port.watch || kw.seen === undefined) at = now + this.ttl / 3;
    else if (this.#fenced && kw.seen?.kind === "put") {
      // Another holder's tenure entry never moves while it holds: only
      // its session tells. Checked while anyone waits for the key: the
      // session's watch tells of its entry's end, and a probe every
      // SESSION_CHECK of its connection's.
      if (kw.waiters.size === 0) return;
      if (waitedOn !== undefined && kw.session === undefined) {
        this.#joinSession(kw, waitedOn);
      }
      at = now + SESSION_CHECK;
    } else if (kw.seen?.kind === "put") {
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
    const held = kw.seen;
    if (this.#fenced && this.#port.watch && held?.kind === "put") {
      // A fenced key's waiters wake when the holder's session is over (or
      // cannot be checked: they then meet the failure themselves).
      let over: AcquiredFrom | undefined;
      let ok = true;
      kw.reading = true;
      try {
        // A live session watch tells of the entry's end; the entry is
        // still read each TTL/3, in case the watch missed it.
        const sw = kw.session;
        const now = this.#port.now();
        const full = sw?.live !== true || now - sw.readAt >= this.ttl / 3;
        if (full && sw !== undefined) sw.readAt = now;
        over = held.instance === this.#instance
          ? undefined
          : await this.#sessionOver(held, full);
      } catch {
        ok = false;
      } finally {
        kw.reading = false;
      }
      if (kw.stopped) return;
      if (!ok || over !== undefined) this.#wake(kw, !ok);
      this.#armWatch(kw);
      return;
    }
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
  #sync(
    st: KeyState,
    signal: AbortSignal | undefined,
    renewal = false,
  ): Promise<void> {
    let b = st.next;
    const fresh = b === undefined;
    b ??= st.next = batch();
    // Counted before the pump starts: it runs up to its first await now.
    if (!renewal) b.callers++;
    if (fresh && !st.busy) void this.#pump(st);
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
        // The renewal timer's batch for a key lost while it waited its
        // turn (the operation before it found the key gone) has nothing to
        // renew, and must not acquire: that would take the key back for
        // no caller, and hold it, renewed, from every other node, while a
        // waiter of this manager, asleep on the key's watch, sees our new
        // entry as a renewal of the old one and never wakes (CI saw a
        // campaign lead no more after a server restart).
        if (!this.#givenUp(st) && (st.held || b.callers > 0)) {
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
    if (this.#fenced) return await this.#checkTenure(st);
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

  /**
   * A fenced key's commit-point check (a guard with `check: "cas"`, or
   * `held()`): the tenure entry, read from the stream leader, is still
   * ours. Nothing is written: a renewal of the key would move its epoch
   * (F2); the session's renewals keep it.
   */
  async #checkTenure(st: KeyState): Promise<void> {
    if (!this.#linkUp) {
      throw new UnavailableError(st.key, suspendedError(st.key).message);
    }
    if (st.tenure!.suspended) {
      await this.#verify(st);
      if (!st.held || st.tenure!.suspended) return;
    }
    const downs = this.#downs;
    let seen: Seen | null;
    try {
      seen = await this.#read(st.subject, undefined, true);
    } catch (err) {
      throw new UnavailableError(
        st.key,
        `the lease could not be checked: ${errText(err)}`,
        { cause: err },
      );
    }
    if (downs !== this.#downs) {
      throw new UnavailableError(st.key, suspendedError(st.key).message);
    }
    if (!st.held) return;
    if (this.#ours(st, seen) && seen!.seq === st.rev) return;
    this.#lost(st, seen);
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
      const probe = attempt === 0 && !st.probed &&
        (this.#markerLife > 0 || this.#fenced !== undefined);
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
      if (this.#fenced) {
        // No grace: a late write of the holder before us is refused by the
        // server once our compare-and-set moves the tenure entry (F1).
        grace = 0;
        if (this.#session === undefined || this.#session.ended) {
          throw new UnavailableError(
            st.key,
            "the lease could not be acquired: this manager's session ended, and a new one is not open yet",
          );
        }
        if (seen === null) found = "fresh";
        else if (seen.kind !== "put") found = seen.kind;
        else if (seen.instance === this.#instance) found = "own";
        else {
          st.sawForeign = true;
          st.foreign = seen.node;
          let over: AcquiredFrom | undefined;
          try {
            over = await this.#sessionOver(seen);
          } catch (err) {
            throw new UnavailableError(
              st.key,
              `the lease's holder could not be checked: ${errText(err)}`,
              { cause: err },
            );
          }
          // Its session lives: the key is held.
          if (over === undefined) return;
          found = over;
        }
      } else if (seen === null) {
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
    // On a fenced bucket the session keeps the key: vouched for as long as
    // its last confirmed renewal lets it be.
    this.#confirmed(st, this.#fenced ? this.#session?.confirmedAt ?? 0 : sent);
    // Our waiters on the key retry now, and find it ours (in its grace, or
    // ready): when the entry before was ours too, the watch takes the new
    // one for a renewal of it and wakes nobody, and our renewals keep
    // moving its fallback timer, so an acquire made for another caller
    // (held(), a guard that does not wait) would leave them asleep.
    const kw = this.#watches.get(st.key);
    if (kw !== undefined && kw.waiters.size > 0) this.#wake(kw);
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
    // expires it no earlier than a TTL later. On a fenced bucket no grace
    // absorbs the drift of our clock over that TTL (point 3 does so for the
    // classic layout): a key is vouched for only until its session's own
    // deadline, 2ρ·TTL earlier (F4, as point 9's margin).
    const life = this.#fenced ? this.ttl - this.#margin : this.ttl;
    t.validUntil = Math.max(t.validUntil, sent + life);
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
    if (this.#fenced) {
      // The session renews; a suspended lease is proven here (point 10).
      if (st.tenure?.suspended && this.#linkUp) {
        st.renewalDue = true;
        void this.#sync(st, undefined, true);
      }
      st.renewAt = now + this.ttl / 3;
      this.#plan(st, st.renewAt);
      return;
    }
    // A guard may have renewed since this was planned: plan anew from then.
    if (st.renewAt > now) this.#plan(st, st.renewAt);
    else {
      st.renewalDue = true;
      void this.#sync(st, undefined, true);
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
    // No more renewals of the session either: its keys are lost here now.
    const session = this.#session;
    this.#session = undefined;
    void session?.close();
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
    checkKey("release a lease", key, this.maxKey);
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
    for (const done of [...this.#probeWaits]) done(undefined);
    // The keys are released: the session's entry goes, and its responder.
    const session = this.#session;
    this.#session = undefined;
    if (session) await this.#waitFor(session.close(), this.#timeout);
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
