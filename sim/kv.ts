/**
 * A simulated JetStream KV bucket: the stream of one bucket, with history 1,
 * as `../../shared/notes/nats-kv-facts.md` (sections 2, 3, 4 and 10)
 * describes the real one.
 *
 * - **Compare-and-set** at the stream leader, atomically: expected 0
 *   succeeds only when the key has neither an entry nor a marker; expected
 *   N only when the key's last message is N. A conflict names the key's
 *   last sequence, 0 when it has none. A `Nats-Msg-Id` seen before in this
 *   stream is a duplicate: acknowledged with the first sequence, not
 *   applied again (the server's de-duplication window is longer than a
 *   history).
 * - **History 1**: a new message on a key removes the previous one, so a
 *   read of a superseded sequence finds nothing.
 * - **Replicas** apply the leader's log in order, each `lag` operations
 *   behind (a replica that fell behind, nats-server #4162, #4710, #4754). A
 *   Direct Get may be served by any of them: an older state, or nothing for
 *   a sequence not applied yet. The stream leader (`STREAM.MSG.GET`) serves
 *   the current state.
 * - **Expiry** at stamp + max age + late (late, never early): on a bucket
 *   with subject delete markers the entry (a put or a DEL tombstone) is
 *   replaced, as a new message with a new sequence, by a marker with
 *   `Nats-Marker-Reason: MaxAge`, which itself expires after
 *   min(marker TTL in whole seconds, max age) + late, leaving nothing; on an
 *   old bucket the entry just goes. A PURGE tombstone goes without a marker.
 *   Expiry is an operation of the log, so a lagging replica expires late.
 * - **Operator** `kv.delete` (an untagged DEL tombstone) and `kv.purge` (a
 *   PURGE tombstone that rolls the key up) on any key, at any time.
 * - **Marker changes at run time** (nats-kv-facts.md section 11): a stream
 *   edit that removes the marker TTL (no marker from then on, and the
 *   markers standing go at once, the worst case), one that lowers it
 *   (markers from then on live the new life, and standing ones go once
 *   they are that old), and a rollback to a release without markers (none
 *   written from then on, the configuration no longer shows them, and the
 *   server's version is too old; standing markers stay until their max
 *   age). {@linkcode SimKv.provenMarkerLife} is what a stream-info request
 *   proves at that moment.
 * - **Bucket deletion** makes every request fail with "stream not found";
 *   re-creating it starts a new stream whose sequences restart at 1.
 * - **A server restart that loses its last k acknowledged messages**
 *   ({@linkcode SimKv.loseTail}; durability in `lease.ts`'s header: a tail
 *   not yet synced to disk, an OS crash or a store restored from a copy):
 *   the stream's last sequence goes back by k and the next writes reuse
 *   those numbers; each key's last message (history 1) is what it was
 *   before the lost ones, on the leader and every replica; the lost
 *   messages' expiries are gone, and a restored entry expires at its own
 *   due time (at once if that passed: a marker after the restart, as
 *   measured in nats-kv-facts.md section 11). The lost messages stay in
 *   `log` (they were applied and acknowledged) and are listed in `lost`.
 *
 * The server's clock is true time. Every applied message is logged for the
 * property checks (`log`), with who sent it and when by their own clock.
 *
 * @module
 */

import { markerLifeOf } from "../lease/servers.ts";
import type { Scheduler } from "./scheduler.ts";
import type { Trace } from "./trace.ts";

/** A message as stored: one key's last entry. */
export interface Stored {
  readonly seq: number;
  readonly subject: string;
  readonly key: string;
  readonly operation: "DEL" | "PURGE" | undefined;
  readonly marker: string | undefined;
  readonly msgId: string | undefined;
  readonly value: string;
  /** True time the leader applied it. */
  readonly stamp: number;
  /** The stream incarnation (1, then 2 after a re-creation, ...). */
  readonly incarnation: number;
  /** The process label that sent it; `operator`; or `server` for a marker. */
  readonly writer: string;
  /** The sender's clock when it sent it (for a process's write). */
  readonly sendLocal: number | undefined;
}

/** What the leader answered to a write. */
export type KvWriteResult = { seq: number; duplicate?: boolean } | {
  conflict: number;
} | "gone";

/** A compare-and-set publish as the server receives it. */
export interface KvWrite {
  readonly subject: string;
  readonly op: "PUT" | "DEL";
  readonly value: string;
  readonly expect: number;
  readonly msgId: string;
}

/** The bucket's settings for one history. */
export interface KvConfig {
  /** The bucket's max age: the lease TTL, ms. */
  readonly maxAge: number;
  /** Subject delete markers (nats-server 2.11+ with `markerTTL`) at the start. */
  readonly markers: boolean;
  /** The marker TTL asked for, ms (rounded down to whole seconds by the server). */
  readonly markerTTL: number;
  /** Lateness of one expiry, ms (>= 0). */
  readonly late: () => number;
  /** Operations each replica is behind the leader; index 0 is the leader (0). */
  readonly lags: readonly number[];
}

interface Change {
  op: number;
  entry: Stored | null;
}

/** How many operations a replica may lag at most. */
export const MAX_LAG = 32;

/** Parses the bucket and key out of `$KV.<bucket>.<key>`. */
export function keyOf(subject: string): string {
  const i = subject.indexOf(".", 4);
  return subject.slice(i + 1);
}

/** The simulated bucket. */
export class SimKv {
  readonly bucket: string;
  readonly cfg: KvConfig;
  readonly #sched: Scheduler;
  readonly #trace: Trace;
  /** Current stream incarnation (starts at 1). */
  incarnation = 1;
  /** The bucket is deleted (until re-created). */
  gone = false;
  /** Expiries leave markers now (a fault may turn it off). */
  markers: boolean;
  /** The marker TTL the configuration shows now, ms (0: none). */
  markerTTL: number;
  /** The server was rolled back to a release without markers. */
  rolledBack = false;
  #seq = 0;
  /** Operations applied by the leader (the replicas' log position). */
  #ops = 0;
  readonly #last = new Map<string, Stored>();
  readonly #history = new Map<string, Change[]>();
  readonly #msgIds = new Map<string, number>();
  /** Every message applied, in all incarnations, in order. */
  readonly log: Stored[] = [];
  /** The messages of `log` a restart lost ({@linkcode SimKv.loseTail}). */
  readonly lost: Set<Stored> = new Set();
  /** Restarts that lost a tail: when, how many messages, from which sequence. */
  readonly losses: { t: number; k: number; from: number }[] = [];
  /** The latest messages of this incarnation that no restart lost, oldest first. */
  #recent: Stored[] = [];
  /**
   * Per subject, its latest changes in this incarnation (`null`: it expired
   * without a marker): what a restart that loses a tail restores.
   */
  readonly #chain = new Map<string, (Stored | null)[]>();
  /** Bucket deletions and re-creations, in true time. */
  readonly lifecycle: { t: number; event: "deleted" | "created" }[] = [];
  /** Called whenever a key's last message changes (`null`: none left). */
  onChange: ((key: string, last: Stored | null) => void) | undefined;
  /**
   * Called with every message the leader appends (an expiry without a
   * marker appends nothing, as on a real server): the watches' feed.
   */
  readonly appended: Set<(e: Stored) => void> = new Set();
  /** Called with every compare-and-set applied and the message it replaced. */
  onWrite: ((e: Stored, replaced: Stored | undefined) => void) | undefined;

  /**
   * @param sched The event queue (for expiries).
   * @param trace The trace.
   * @param bucket The bucket name.
   * @param cfg Its settings.
   */
  constructor(sched: Scheduler, trace: Trace, bucket: string, cfg: KvConfig) {
    this.#sched = sched;
    this.#trace = trace;
    this.bucket = bucket;
    this.cfg = cfg;
    this.markers = cfg.markers;
    this.markerTTL = cfg.markers ? cfg.markerTTL : 0;
  }

  /** The subject of `key`. */
  subject(key: string): string {
    return `$KV.${this.bucket}.${key}`;
  }

  /** The key's last message on the leader: the truth the properties compare with. */
  last(subject: string): Stored | undefined {
    return this.gone ? undefined : this.#last.get(subject);
  }

  /** The effective life of a marker now: min(marker TTL in whole seconds, max age). */
  get markerLife(): number {
    return Math.min(
      Math.floor(this.markerTTL / 1000) * 1000,
      this.cfg.maxAge,
    );
  }

  /**
   * What a stream-info request answered now proves, by the production rule
   * (`markerLifeOf` in `lease/servers.ts`); 0 without markers or on a
   * rolled-back server (its configuration shows none, and its version is
   * too old).
   */
  provenMarkerLife(): number {
    if (this.rolledBack || !this.markers) return 0;
    return markerLifeOf(this.markerTTL, this.cfg.maxAge);
  }

  /**
   * Changes the markers at run time: `remove` (a stream edit that drops the
   * marker TTL), `lower` (an edit to a marker TTL of 1 s), `rollback` (the
   * server restarted on a release without markers).
   */
  editMarkers(kind: "remove" | "lower" | "rollback"): void {
    if (this.gone || !this.markers) return;
    const now = this.#sched.now;
    let cut: number | undefined;
    if (kind === "lower") {
      this.markerTTL = Math.min(this.markerTTL, 1000);
      cut = this.markerLife;
    } else {
      this.markers = false;
      this.markerTTL = 0;
      if (kind === "rollback") this.rolledBack = true;
      else cut = 0;
    }
    this.#trace.add(
      now,
      undefined,
      "operator",
      () =>
        kind === "lower"
          ? `stream edit: marker TTL lowered to ${this.markerTTL} ms`
          : kind === "remove"
          ? "stream edit: marker TTL removed"
          : "server rolled back to a release without markers",
    );
    if (cut === undefined) return;
    // The markers standing now go once they are `cut` old (at once when
    // older): the worst a real server might do.
    const inc = this.incarnation;
    for (const e of this.#last.values()) {
      if (e.marker === undefined) continue;
      this.#sched.at(
        Math.max(now, e.stamp + cut),
        () => this.#expire(e, inc),
        { pure: true },
      );
    }
  }

  /**
   * Applies a compare-and-set publish at the leader.
   *
   * @param w The publish.
   * @param writer Who sent it.
   * @param sendLocal Their clock when they sent it.
   * @returns The acknowledgement, the conflict, or `"gone"`.
   */
  write(w: KvWrite, writer: string, sendLocal: number): KvWriteResult {
    if (this.gone) return "gone";
    const dup = this.#msgIds.get(w.msgId);
    if (dup !== undefined) return { seq: dup, duplicate: true };
    const cur = this.#last.get(w.subject);
    const curSeq = cur?.seq ?? 0;
    if (curSeq !== w.expect) return { conflict: curSeq };
    const e = this.#append(w.subject, {
      operation: w.op === "DEL" ? "DEL" : undefined,
      marker: undefined,
      msgId: w.msgId,
      value: w.op === "DEL" ? "" : w.value,
      writer,
      sendLocal,
    });
    this.#msgIds.set(w.msgId, e.seq);
    this.onWrite?.(e, cur);
    return { seq: e.seq };
  }

  /**
   * Reads the key's last message, or the message at `seq` if it is the
   * key's, as replica `replica` has it (0: the leader).
   *
   * @param subject The key's subject.
   * @param seq A sequence, or `undefined` for the last message.
   * @param replica Which copy answers.
   * @returns The message, `null`, or `"gone"`.
   */
  read(
    subject: string,
    seq: number | undefined,
    replica: number,
  ): Stored | null | "gone" {
    if (this.gone) return "gone";
    const lag = this.cfg.lags[replica] ?? 0;
    let e: Stored | null;
    if (lag === 0) e = this.#last.get(subject) ?? null;
    else {
      const upTo = this.#ops - lag;
      e = null;
      const h = this.#history.get(subject);
      if (h) {
        for (let i = h.length - 1; i >= 0; i--) {
          if (h[i]!.op <= upTo) {
            e = h[i]!.entry;
            break;
          }
        }
      }
    }
    if (e === null) return null;
    return seq === undefined || e.seq === seq ? e : null;
  }

  /** An operator's `kv.delete(key)`: an untagged DEL tombstone. */
  operatorDelete(key: string): void {
    if (this.gone) return;
    const e = this.#append(this.subject(key), {
      operation: "DEL",
      marker: undefined,
      msgId: undefined,
      value: "",
      writer: "operator",
      sendLocal: undefined,
    });
    this.#trace.add(
      this.#sched.now,
      key,
      "operator",
      () => `kv.delete → DEL @${e.seq}`,
    );
  }

  /** An operator's `kv.purge(key)`: a PURGE tombstone. */
  operatorPurge(key: string): void {
    if (this.gone) return;
    const e = this.#append(this.subject(key), {
      operation: "PURGE",
      marker: undefined,
      msgId: undefined,
      value: "",
      writer: "operator",
      sendLocal: undefined,
    });
    this.#trace.add(
      this.#sched.now,
      key,
      "operator",
      () => `kv.purge → PURGE @${e.seq}`,
    );
  }

  /** Deletes the bucket: every request fails until it is re-created. */
  deleteBucket(): void {
    if (this.gone) return;
    this.gone = true;
    this.#last.clear();
    this.#history.clear();
    this.#msgIds.clear();
    this.#recent = [];
    this.#chain.clear();
    this.lifecycle.push({ t: this.#sched.now, event: "deleted" });
    this.#trace.add(
      this.#sched.now,
      undefined,
      "operator",
      () => `bucket deleted`,
    );
  }

  /** Re-creates the bucket: a new stream, sequences from 1. */
  createBucket(): void {
    if (!this.gone) return;
    this.gone = false;
    this.incarnation++;
    this.#seq = 0;
    this.#ops = 0;
    this.lifecycle.push({ t: this.#sched.now, event: "created" });
    this.#trace.add(
      this.#sched.now,
      undefined,
      "operator",
      () =>
        `bucket re-created (incarnation ${this.incarnation}, revisions from 1)`,
    );
  }

  #append(
    subject: string,
    m: Pick<
      Stored,
      "operation" | "marker" | "msgId" | "value" | "writer" | "sendLocal"
    >,
  ): Stored {
    const e: Stored = {
      seq: ++this.#seq,
      subject,
      key: keyOf(subject),
      stamp: this.#sched.now,
      incarnation: this.incarnation,
      ...m,
    };
    this.#last.set(subject, e);
    this.#change(subject, e);
    this.log.push(e);
    this.#recent.push(e);
    if (this.#recent.length > 2 * MAX_LOST) this.#recent.shift();
    this.#link(subject, e);
    for (const fn of this.appended) fn(e);
    const life = e.marker !== undefined ? this.markerLife : this.cfg.maxAge;
    const inc = this.incarnation;
    this.#sched.at(
      e.stamp + life + this.cfg.late(),
      () => this.#expire(e, inc),
      { pure: true },
    );
    return e;
  }

  #change(subject: string, entry: Stored | null): void {
    const op = ++this.#ops;
    let h = this.#history.get(subject);
    if (!h) this.#history.set(subject, h = []);
    h.push({ op, entry });
    this.onChange?.(keyOf(subject), entry);
    // Keep the state each replica may still be at: the newest change at or
    // before `op - MAX_LAG`, and everything after it.
    while (h.length > 1 && h[1]!.op <= op - MAX_LAG) h.shift();
  }

  #expire(e: Stored, inc: number): void {
    if (this.gone || inc !== this.incarnation) return;
    if (this.#last.get(e.subject) !== e) return; // superseded
    if (this.markers && e.marker === undefined && e.operation !== "PURGE") {
      const m = this.#append(e.subject, {
        operation: undefined,
        marker: "MaxAge",
        msgId: undefined,
        value: "",
        writer: "server",
        sendLocal: undefined,
      });
      this.#trace.add(
        this.#sched.now,
        e.key,
        "server",
        () =>
          `expired @${e.seq} (stamped ${
            e.stamp.toFixed(3)
          }) → MaxAge marker @${m.seq}`,
      );
      return;
    }
    this.#last.delete(e.subject);
    this.#change(e.subject, null);
    this.#link(e.subject, null);
    this.#trace.add(
      this.#sched.now,
      e.key,
      "server",
      () => `expired @${e.seq}${e.marker ? " (marker)" : ""} → no entry`,
    );
  }

  #link(subject: string, e: Stored | null): void {
    let c = this.#chain.get(subject);
    if (!c) this.#chain.set(subject, c = []);
    c.push(e);
    if (c.length > 4 * MAX_LOST) c.shift();
  }

  /**
   * Whether the key of `e`, a message of this incarnation, had no entry at
   * all right before `e` (so a restart that loses `e` and what came after
   * leaves it with none).
   */
  createdKey(e: Stored): boolean {
    const c = this.#chain.get(e.subject) ?? [];
    const i = c.indexOf(e);
    return i >= 0 && (i === 0 || c[i - 1] === null);
  }

  /** The sequence of the latest message a restart could lose now (0: none). */
  tailSeq(): number {
    return this.#recent.at(-1)?.seq ?? 0;
  }

  /**
   * The latest messages a restart could lose, newest first (at most
   * {@linkcode MAX_LOST} × 2).
   */
  recent(): readonly Stored[] {
    return [...this.#recent].reverse();
  }

  /**
   * A server restart that loses the last `k` messages it acknowledged (at
   * most those of this incarnation that it still has): sequences go back
   * by k and are reused; each key they touched gets back its message from
   * before them (leader and replicas alike), whose expiry is scheduled
   * again at its due time, or at once if that has passed.
   *
   * @param k How many messages.
   * @returns The messages lost.
   */
  loseTail(k: number): Stored[] {
    const now = this.#sched.now;
    if (this.gone) return [];
    const n = Math.min(k, this.#recent.length);
    const lost = this.#recent.splice(this.#recent.length - n, n);
    if (lost.length === 0) return lost;
    const from = lost[0]!.seq;
    this.#seq = from - 1;
    const subjects = new Set<string>();
    for (const e of lost) {
      this.lost.add(e);
      if (e.msgId !== undefined) this.#msgIds.delete(e.msgId);
      subjects.add(e.subject);
    }
    const inc = this.incarnation;
    for (const subject of subjects) {
      const c = this.#chain.get(subject)!;
      // Drop the lost messages and every expiry that came after them.
      const first = c.findIndex((x) => x !== null && x.seq >= from);
      if (first >= 0) c.length = first;
      const back = c.at(-1) ?? null;
      if (back === null) this.#last.delete(subject);
      else {
        this.#last.set(subject, back);
        const life = back.marker !== undefined
          ? this.markerLife
          : this.cfg.maxAge;
        this.#sched.at(
          Math.max(now, back.stamp + life + this.cfg.late()),
          () => this.#expire(back, inc),
          { pure: true },
        );
      }
      // Every copy restarts from the same store: no replica keeps what the
      // leader lost.
      this.#history.set(subject, [{ op: 0, entry: back }]);
      this.onChange?.(keyOf(subject), back);
    }
    this.losses.push({ t: now, k: lost.length, from });
    this.#trace.add(
      now,
      undefined,
      "server",
      () =>
        `restarted, lost its last ${lost.length} acknowledged message(s) @${from}..@${
          lost.at(-1)!.seq
        } (${
          [...subjects].map((s) =>
            `${keyOf(s)} back to ${describeLast(this.#last.get(s))}`
          ).join(", ")
        }); next write @${from}`,
    );
    return lost;
  }
}

/** The most messages one restart loses (k is drawn up to this). */
export const MAX_LOST = 16;

function describeLast(e: Stored | undefined): string {
  if (!e) return "none";
  return `@${e.seq} ${e.marker ?? e.operation ?? `PUT ${e.writer}`}`;
}
