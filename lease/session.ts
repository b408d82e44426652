/**
 * A manager's session on a fenced bucket (issue 33; `design/fenced.md`,
 * "Layout" and its points F3 and F4). Not used by the manager yet: step 3
 * of the design's order of work builds the fenced layout on it.
 *
 * One entry per manager and bucket, whose value is the node id and whose
 * `Nats-TTL` is the lease TTL (rounded up to whole seconds, so the server
 * keeps it at least as long as we vouch for it). It is created expecting no
 * entry and renewed every TTL/3 by compare-and-set on its own last
 * revision, so one message per period keeps every key held under it.
 *
 * Why a session ends for good (F3): the server replaces an entry nobody
 * renewed with a `MaxAge` marker at a new revision, and a delete or any
 * other write moves the revision too, so a renewal expecting ours fails
 * from then on; a session is never revived, a manager opens a new one.
 *
 * What it vouches for (F4): a renewal sent at local time `s` and applied
 * keeps the entry until at least `s + TTL` (stamped on arrival, kept its
 * whole TTL; expiry is never early), so the session vouches until
 * `s + TTL - 2ρ·TTL` of the local clock (ρ = `CLOCK_RATE_BOUND`, the margin
 * of the safety argument's point 9). A renewal whose reply was lost may have
 * been applied: the next one's "wrong last sequence: N" names the entry at
 * N, which is read from the stream leader, and adopted only if it carries
 * one of this session's tags (its send time is then known). Anything else
 * at N ends the session.
 *
 * While it lives, a responder on the probe subject answers for this
 * connection; once the session ends it stops, so that waiters' probes get
 * "no responders" at once and take the keys over, which the fence makes
 * safe (F1, F5).
 *
 * @module
 */

import { BucketGone, type Port, type Responder } from "./port.ts";
import { CLOCK_RATE_BOUND } from "./types.ts";

/** Where a session lives, and for how long a renewal keeps it. */
export interface SessionOptions {
  /** The port of the manager's connection. */
  readonly port: Port;
  /** The subject of the session's entry, given its id. */
  readonly subject: (id: string) => string;
  /** The subject its responder answers on, given its id (outside the stream). */
  readonly probe: (id: string) => string;
  /** The node id: the entry's value. */
  readonly node: string;
  /** The lease TTL, ms: 1,000 or more. */
  readonly ttl: number;
  /**
   * The session's id (default: a new one from the port). A manager passes
   * its instance id, so that the tag of every tenure entry it writes names
   * its session.
   */
  readonly id?: string;
}

/** How many unanswered renewals' send times are kept for a later read to recognise. */
const KEEP_UNANSWERED = 64;

/** A manager's session; see the module's description. */
export class Session {
  /** The session's id (random): the last token of its subjects. */
  readonly id: string;
  /** The subject of its entry. */
  readonly subject: string;
  /** The subject its responder answers on. */
  readonly probeSubject: string;
  readonly #port: Port;
  readonly #node: string;
  readonly #ttl: number;
  readonly #ttlSeconds: number;
  readonly #responder: Responder;
  #revision: number;
  /** Local send time of the latest renewal known to be applied. */
  #confirmed: number;
  #counter = 0;
  /** Send times of this session's writes by tag, until answered or resolved. */
  readonly #sent = new Map<string, number>();
  #timer: unknown;
  #deadlineTimer: unknown;
  #ended: string | undefined;
  #closing = false;
  readonly #lostFns: ((why: string) => void)[] = [];
  readonly #renewedFns: ((sent: number) => void)[] = [];

  private constructor(
    o: SessionOptions,
    id: string,
    responder: Responder,
    revision: number,
    confirmed: number,
  ) {
    this.#port = o.port;
    this.#node = o.node;
    this.#ttl = o.ttl;
    this.#ttlSeconds = Math.ceil(o.ttl / 1000);
    this.id = id;
    this.subject = o.subject(id);
    this.probeSubject = o.probe(id);
    this.#responder = responder;
    this.#revision = revision;
    this.#confirmed = confirmed;
  }

  /**
   * Opens a session: starts its responder, then creates its entry
   * (expecting none), and renews it from then on.
   *
   * @param o Where and how long.
   * @returns The session, vouching from the creation's send time.
   * @throws {RangeError} Before anything is sent: a TTL below 1,000 ms;
   * from the port, a server that cannot expire the entry into a marker
   * (before 2.11.2).
   * @throws {TypeError} When the port has no responder (`serve`).
   * @throws {Error} When the entry could not be created (the port's
   * error; `BucketGone` when the stream is missing).
   */
  static async open(o: SessionOptions): Promise<Session> {
    if (!(o.ttl >= 1000) || !Number.isFinite(o.ttl)) {
      throw new RangeError(
        `Cannot open a session as 'ttl' must be a finite number of milliseconds of at least 1000 (entries expire in whole seconds): received ${o.ttl}`,
      );
    }
    const port = o.port;
    if (port.serve === undefined) {
      throw new TypeError(
        "Cannot open a session as the port has no responder (serve)",
      );
    }
    const id = o.id ?? port.newInstanceId();
    const responder = await port.serve(o.probe(id));
    const sent = port.now();
    let res;
    try {
      res = await port.write({
        subject: o.subject(id),
        op: "PUT",
        value: new TextEncoder().encode(o.node),
        expect: 0,
        msgId: `session:${id}:0`,
        timeout: o.ttl / 4,
        ttl: Math.ceil(o.ttl / 1000),
      });
    } catch (err) {
      responder.stop();
      throw err;
    }
    if (!("seq" in res)) {
      responder.stop();
      // A fresh random id's subject has no entry: someone else wrote there.
      throw new Error(
        `Cannot open a session as its new subject '${
          o.subject(id)
        }' already has an entry (revision ${res.conflict})`,
      );
    }
    const s = new Session(o, id, responder, res.seq, sent);
    s.#plan(sent + o.ttl / 3);
    return s;
  }

  /** The revision of the session's entry, as far as the last answer showed. */
  get revision(): number {
    return this.#revision;
  }

  /**
   * Until when (local clock, the port's) the session vouches for its keys:
   * the last confirmed renewal's send time plus the TTL less `2ρ·TTL`.
   * `-Infinity` once it ended.
   */
  get deadline(): number {
    if (this.#ended !== undefined) return -Infinity;
    return this.#confirmed + this.#ttl * (1 - 2 * CLOCK_RATE_BOUND);
  }

  /**
   * The local send time of the latest renewal (or the creation) known to
   * be applied: the entry lives on the server until at least a TTL later.
   */
  get confirmedAt(): number {
    return this.#confirmed;
  }

  /**
   * Calls `fn` with {@linkcode Session.confirmedAt} each time a renewal is
   * confirmed (by its reply, or recognised after its reply was lost).
   *
   * @param fn Told the confirmed send time.
   */
  onRenewed(fn: (sent: number) => void): void {
    this.#renewedFns.push(fn);
  }

  /** Why the session ended (`undefined` while it lives). */
  get ended(): string | undefined {
    return this.#ended;
  }

  /**
   * Calls `fn` once, with why, when the session ends other than by
   * {@linkcode Session.close}: every key held under it is lost then.
   *
   * @param fn Told why.
   */
  onLost(fn: (why: string) => void): void {
    this.#lostFns.push(fn);
  }

  /**
   * Ends the session: no more renewals, its entry deleted (tagged,
   * expecting its revision; a failure leaves it to expire) and its
   * responder stopped. Lost callbacks are not called.
   *
   * @returns Once the delete was answered or gave up.
   */
  async close(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    const live = this.#ended === undefined;
    this.#end("closed", false);
    if (!live) return;
    try {
      await this.#port.write({
        subject: this.subject,
        op: "DEL",
        value: new Uint8Array(),
        expect: this.#revision,
        msgId: this.#tag(),
        timeout: this.#ttl / 4,
      });
    } catch {
      // Unanswered or refused: the entry expires by its own TTL.
    }
  }

  #tag(): string {
    return `session:${this.id}:${++this.#counter}`;
  }

  /** Arms the next renewal at local time `at`, and the deadline's check. */
  #plan(at: number): void {
    const port = this.#port;
    port.clearTimer(this.#timer);
    port.clearTimer(this.#deadlineTimer);
    const now = port.now();
    this.#timer = port.setTimer(
      () => void this.#renew(),
      Math.max(0, at - now),
    );
    this.#deadlineTimer = port.setTimer(
      () => this.#checkDeadline(),
      Math.max(0, this.deadline - now),
    );
  }

  #checkDeadline(): void {
    if (this.#ended !== undefined) return;
    if (this.#port.now() >= this.deadline) {
      this.#end(
        `no renewal of session ${this.id} was confirmed within its TTL (${this.#ttl} ms)`,
        true,
      );
    }
  }

  async #renew(): Promise<void> {
    if (this.#ended !== undefined) return;
    const port = this.#port;
    const tag = this.#tag();
    const sent = port.now();
    this.#sent.set(tag, sent);
    if (this.#sent.size > KEEP_UNANSWERED) {
      this.#sent.delete(this.#sent.keys().next().value!);
    }
    let res;
    try {
      res = await port.write({
        subject: this.subject,
        op: "PUT",
        value: new TextEncoder().encode(this.#node),
        expect: this.#revision,
        msgId: tag,
        timeout: this.#ttl / 4,
        ttl: this.#ttlSeconds,
      });
    } catch (err) {
      if (err instanceof BucketGone) return this.#end(err.message, true);
      // Unanswered: it may have been applied; the next one finds out.
      return this.#retry();
    }
    if (this.#ended !== undefined) return;
    if ("seq" in res) {
      this.#sent.delete(tag);
      this.#confirm(res.seq, sent);
      return this.#plan(sent + this.#ttl / 3);
    }
    await this.#resolve(res.conflict);
  }

  /** After an unanswered renewal: again soon, while the deadline allows. */
  #retry(): void {
    if (this.#ended !== undefined) return;
    this.#plan(this.#port.now() + this.#ttl / 10);
  }

  #confirm(revision: number, sent: number): void {
    this.#revision = revision;
    this.#confirmed = Math.max(this.#confirmed, sent);
    for (const fn of this.#renewedFns) fn(this.#confirmed);
  }

  /**
   * A renewal was refused: the entry is at `conflict` now. Ours only if
   * it carries one of our tags (a renewal whose reply was lost).
   */
  async #resolve(conflict: number): Promise<void> {
    if (conflict <= 0) return this.#retry();
    let e;
    try {
      e = await this.#port.read(
        this.subject,
        { seq: conflict, leader: true },
        this.#ttl / 4,
      );
    } catch (err) {
      if (err instanceof BucketGone) return this.#end(err.message, true);
      return this.#retry();
    }
    if (this.#ended !== undefined) return;
    // Not found at the leader: the entry moved on since (a later write
    // replaced it in the one-per-subject stream); ask again.
    if (e === null) return this.#retry();
    const sent = e.msgId === undefined ? undefined : this.#sent.get(e.msgId);
    if (
      sent !== undefined && e.operation === undefined &&
      e.marker === undefined && e.value === this.#node
    ) {
      this.#sent.delete(e.msgId!);
      this.#confirm(e.seq, sent);
      // Renew on top of it at once: what it proves is only as fresh as
      // its send time.
      return this.#plan(this.#port.now());
    }
    this.#end(
      `session ${this.id}'s entry was replaced at revision ${e.seq} (${
        e.marker !== undefined
          ? `expired: ${e.marker} marker`
          : e.operation ?? "another write"
      })`,
      true,
    );
  }

  #end(why: string, tell: boolean): void {
    if (this.#ended !== undefined) return;
    this.#ended = why;
    this.#port.clearTimer(this.#timer);
    this.#port.clearTimer(this.#deadlineTimer);
    this.#sent.clear();
    // Probes get "no responders" from now on: waiters take the keys at
    // once, which the fence makes safe.
    this.#responder.stop();
    if (tell) { for (const fn of this.#lostFns.splice(0)) fn(why); }
  }
}
