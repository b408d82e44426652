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
 * **The server's fencing features** (nats-kv-facts.md section 12; the
 * fenced layout of `design/fenced.md`), held to real servers by
 * `sim_conformance_test.ts` (2.15.2 and 2.10.22); the rules it does not
 * replay (10166, 10174, the order of the TTL refusals, the same batches
 * on 2.9.10) were measured by hand on the same servers, December 2026:
 * - **A check on another subject** ({@linkcode KvWrite.expectSubject}, the
 *   `Nats-Expected-Last-Subject-Sequence-Subject` header): the write is
 *   stored only while that subject's last sequence is `expect` (0: it has
 *   no message); a conflict names that subject's last sequence. The header
 *   without a sequence is refused (10193).
 * - **Per-message TTL** ({@linkcode KvWrite.ttl}, `Nats-TTL`, on a stream
 *   with `allow_msg_ttl`): the message expires at its own stamp + TTL (in
 *   whole seconds, capped by a max age) + late, never early, into a
 *   `MaxAge` marker when markers are on, else just goes. A max age of 0
 *   means no age limit: data without a TTL stays. A TTL below 1 s is
 *   refused (10165), and so is any TTL on a stream without
 *   `allow_msg_ttl` (10166). The order, as measured: without
 *   `allow_msg_ttl`, 10165 or 10166 before the expected sequence is
 *   checked; with it, a conflict before 10165.
 * - **Atomic batches** ({@linkcode SimKv.batch}, 2.12+, `allow_atomic`):
 *   all or nothing. Each message is judged against the stream as it was
 *   before the batch, in order, and the first failure refuses the whole
 *   batch: its own conflict (10071 naming the checked subject's last
 *   sequence), a check against a subject written earlier in the same
 *   batch (10164, "wrong last sequence" with no number), a
 *   `Nats-Msg-Id` seen before or twice in the batch (10201), the TTL
 *   refusals above; a stream without `allow_atomic` refuses it (10174).
 *   The ack names the last sequence and the count. A stream-wide
 *   `Nats-Expected-Last-Sequence` is not modelled.
 * - **The server's version** ({@linkcode KvConfig.version}): below 2.11
 *   the `-Subject` header and `Nats-TTL` are ignored (the write is checked
 *   against its own subject, so a fenced write with an epoch above 0 is
 *   refused; its TTL never expires it), and below 2.12 the batch headers
 *   are ignored: **each message of a "batch" is stored on its own as a
 *   plain publish**, nothing all or nothing about it (measured on 2.10.22
 *   and 2.9.10: a batch whose fenced first message was refused still
 *   stored the two after it). 2.11.x was not measured: it is modelled as
 *   2.12 without batches.
 * - **Where the model cannot match a real server**: the moment of an expiry
 *   (real ones are 0-250 ms late; `late` draws it, the conformance test
 *   compares what is stored, not when); a TTL given in other units than
 *   whole seconds (`"1500ms"` was accepted, its rounding not measured);
 *   the 10 s idle abandonment of a batch, the 50 batches in flight and the
 *   1,000-message limit (a batch here arrives whole); a flow of replies
 *   for the messages inside a batch (the client asks only for the first
 *   and the commit); how a rollback ({@linkcode SimKv.editMarkers}) treats
 *   standing per-message TTLs (not measured: the version does not change).
 * - **Model mutants** ({@linkcode KvConfig.flaw}): one deliberate bug each,
 *   for showing that the conformance test and property PF catch a model
 *   that gets a rule wrong.
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
  /**
   * The subject its `Nats-Expected-Last-Subject-Sequence-Subject` header
   * named (stored with the message whether or not the server honoured it).
   */
  readonly expectSubject?: string | undefined;
  /** The sequence it expected, if it carried the header. */
  readonly expect?: number | undefined;
  /** Its `Nats-TTL`, ms, as sent. */
  readonly ttl?: number | undefined;
  /**
   * The batch it was sent in (its `Nats-Batch-Id`): committed as one on
   * 2.12+, a plain publish on an older server.
   */
  readonly batch?: string | undefined;
  /**
   * The checks on other subjects that the messages of its batch carried
   * (what the sender meant to fence it by), as sent: the stream itself
   * does not keep them when the message that carried one was refused and
   * the others stored (a server below 2.12).
   */
  readonly batchFences?: readonly Fence[] | undefined;
}

/** A check on another subject: stored only while `subject` is at `epoch`. */
export interface Fence {
  readonly subject: string;
  readonly epoch: number;
}

/** A batch as its messages are stored with it. */
interface BatchTag {
  readonly id: string;
  readonly fences: readonly Fence[];
}

/** What the leader answered to a write. */
export type KvWriteResult = { seq: number; duplicate?: boolean } | {
  conflict: number;
} | "gone";

/** A refusal other than a conflict: the server's error code and text. */
export interface KvRefusal {
  readonly refused: number;
  readonly description: string;
}

/** What the leader answered to a publish, refusals included. */
export type KvPublishResult = KvWriteResult | KvRefusal;

/**
 * What the server answered to an atomic batch: committed whole (the last
 * sequence and the count), a conflict or a refusal of the whole, or, from a
 * server below 2.12, each message's own answer (`unbatched`: the batch
 * headers were ignored and every message stored or refused on its own).
 */
export type KvBatchResult =
  | { seq: number; count: number }
  | { conflict: number }
  | KvRefusal
  | { unbatched: KvPublishResult[] }
  | "gone";

/** A publish as the server receives it. */
export interface KvWrite {
  readonly subject: string;
  readonly op: "PUT" | "DEL";
  readonly value: string;
  /**
   * `Nats-Expected-Last-Subject-Sequence` (0: no message); `undefined`
   * for a write without a check (inside a batch).
   */
  readonly expect?: number | undefined;
  /**
   * `Nats-Expected-Last-Subject-Sequence-Subject` (2.11+): check `expect`
   * against this subject's last sequence instead of the write's own.
   */
  readonly expectSubject?: string | undefined;
  /** `Nats-TTL` in ms (2.11+, the stream's `allow_msg_ttl`). */
  readonly ttl?: number | undefined;
  /** `Nats-Msg-Id`, for de-duplication. */
  readonly msgId?: string | undefined;
}

/**
 * A deliberate bug of the model (a model mutant): `subject-check-ignored`
 * checks a write naming another subject against its own (what servers
 * below 2.11 do); `subject-check-skipped` stores it without any check;
 * `batch-partial` stores a batch's messages up to the first that fails;
 * `ttl-ignored` never expires a message by its own TTL.
 */
export type KvFlaw =
  | "subject-check-ignored"
  | "subject-check-skipped"
  | "batch-partial"
  | "ttl-ignored";

/** Every {@linkcode KvFlaw}. */
export const KV_FLAWS: readonly KvFlaw[] = [
  "subject-check-ignored",
  "subject-check-skipped",
  "batch-partial",
  "ttl-ignored",
];

/** The bucket's settings for one history. */
export interface KvConfig {
  /** The bucket's max age: the lease TTL, ms (0: no limit). */
  readonly maxAge: number;
  /** Subject delete markers (nats-server 2.11+ with `markerTTL`) at the start. */
  readonly markers: boolean;
  /** The marker TTL asked for, ms (rounded down to whole seconds by the server). */
  readonly markerTTL: number;
  /** Lateness of one expiry, ms (>= 0). */
  readonly late: () => number;
  /** Operations each replica is behind the leader; index 0 is the leader (0). */
  readonly lags: readonly number[];
  /**
   * The server's version, e.g. `"2.10.22"`: which fencing features it
   * honours.
   *
   * @default {a current release: all of them}
   */
  readonly version?: string;
  /**
   * The stream's `allow_msg_ttl`.
   *
   * @default {false}
   */
  readonly msgTTL?: boolean;
  /**
   * The stream's `allow_atomic` (2.12+).
   *
   * @default {false}
   */
  readonly atomic?: boolean;
  /** A model mutant: one rule deliberately wrong. */
  readonly flaw?: KvFlaw;
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
  /** Batches sent so far (their ids). */
  #batches = 0;
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
    return Math.min(Math.floor(this.markerTTL / 1000) * 1000, this.#maxAge);
  }

  /** The max age as a life: 0 in the configuration means none. */
  get #maxAge(): number {
    return this.cfg.maxAge > 0 ? this.cfg.maxAge : Infinity;
  }

  /** Whether the server's version is at least `major.minor`. */
  #atLeast(major: number, minor: number): boolean {
    if (this.cfg.version === undefined) return true;
    const [a = 0, b = 0] = this.cfg.version.split(".").map(Number);
    return a > major || (a === major && b >= minor);
  }

  /** How long `e` lives from its stamp (`Infinity`: until replaced). */
  #lifeOf(e: Stored): number {
    if (e.marker !== undefined) return this.markerLife;
    if (
      e.ttl !== undefined && this.#atLeast(2, 11) &&
      this.cfg.flaw !== "ttl-ignored"
    ) {
      // Rounded down to whole seconds, and capped by the max age.
      return Math.min(Math.floor(e.ttl / 1000) * 1000, this.#maxAge);
    }
    return this.#maxAge;
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
   * Applies a compare-and-set publish at the leader (one that the server
   * refuses only by a conflict: {@linkcode SimKv.publish} for the rest).
   *
   * @param w The publish.
   * @param writer Who sent it.
   * @param sendLocal Their clock when they sent it.
   * @returns The acknowledgement, the conflict, or `"gone"`.
   * @throws {TypeError} When the server would refuse it otherwise (a TTL).
   */
  write(w: KvWrite, writer: string, sendLocal: number): KvWriteResult {
    const r = this.publish(w, writer, sendLocal);
    if (r !== "gone" && "refused" in r) {
      throw new TypeError(
        `Cannot apply a write that the server refuses (${r.refused} ${r.description}): use SimKv.publish()`,
      );
    }
    return r;
  }

  /**
   * Applies a publish at the leader, with the fencing headers as the
   * configured server version honours them.
   *
   * @param w The publish.
   * @param writer Who sent it.
   * @param sendLocal Their clock when they sent it.
   * @returns The acknowledgement, the conflict, a refusal, or `"gone"`.
   */
  publish(w: KvWrite, writer: string, sendLocal: number): KvPublishResult {
    return this.#publish(w, writer, sendLocal, undefined);
  }

  #publish(
    w: KvWrite,
    writer: string,
    sendLocal: number,
    batch: BatchTag | undefined,
  ): KvPublishResult {
    if (this.gone) return "gone";
    if (w.msgId !== undefined) {
      const dup = this.#msgIds.get(w.msgId);
      if (dup !== undefined) return { seq: dup, duplicate: true };
    }
    const no = this.#judge(w, undefined);
    if (no !== undefined) return no;
    return { seq: this.#store(w, writer, sendLocal, batch).seq };
  }

  /**
   * Applies an atomic batch at the leader (2.12+): every message or none.
   * Below 2.12 the batch headers mean nothing to the server, and each
   * message is a plain publish of its own.
   *
   * @param ws The messages, in order (the last one carries the commit).
   * @param writer Who sent them.
   * @param sendLocal Their clock when they sent them.
   * @returns The commit's acknowledgement or the whole batch's refusal.
   * @throws {RangeError} For an empty batch, or one above the server's
   * 1,000 messages (not modelled).
   */
  batch(
    ws: readonly KvWrite[],
    writer: string,
    sendLocal: number,
  ): KvBatchResult {
    if (ws.length < 1 || ws.length > 1000) {
      throw new RangeError(
        `Cannot model an atomic batch of ${ws.length} messages: expected 1 to 1,000`,
      );
    }
    if (this.gone) return "gone";
    // Its id is stored with each message (the `Nats-Batch-Id` header), by
    // an old server too, where it joins nothing.
    const tag: BatchTag = {
      id: `batch${++this.#batches}`,
      fences: ws.flatMap((w) =>
        w.expectSubject !== undefined && w.expect !== undefined &&
          w.expectSubject !== w.subject
          ? [{ subject: w.expectSubject, epoch: w.expect }]
          : []
      ),
    };
    if (!this.#atLeast(2, 12)) {
      return {
        unbatched: ws.map((w) => this.#publish(w, writer, sendLocal, tag)),
      };
    }
    if (!this.cfg.atomic) {
      return { refused: 10174, description: "atomic publish is disabled" };
    }
    const written = new Set<string>();
    const ids = new Set<string>();
    let failed: KvRefusal | { conflict: number } | undefined;
    let upTo = ws.length;
    for (const [i, w] of ws.entries()) {
      if (
        w.msgId !== undefined &&
        (this.#msgIds.has(w.msgId) || ids.has(w.msgId))
      ) {
        failed = {
          refused: 10201,
          description: "atomic publish batch contains duplicate message id",
        };
      } else failed = this.#judge(w, written);
      if (failed !== undefined) {
        upTo = i;
        break;
      }
      written.add(w.subject);
      if (w.msgId !== undefined) ids.add(w.msgId);
    }
    if (failed !== undefined && this.cfg.flaw !== "batch-partial") {
      return failed;
    }
    let last = 0;
    for (const w of ws.slice(0, upTo)) {
      last = this.#store(w, writer, sendLocal, tag).seq;
    }
    return failed ?? { seq: last, count: ws.length };
  }

  /**
   * Why the server refuses `w` now, if it does, against the stream as it
   * is (a batch's messages: as it was before the batch, `written` holding
   * the subjects the batch wrote before `w`).
   */
  #judge(
    w: KvWrite,
    written: ReadonlySet<string> | undefined,
  ): KvRefusal | { conflict: number } | undefined {
    const modern = this.#atLeast(2, 11);
    if (modern && w.expectSubject !== undefined && w.expect === undefined) {
      return {
        refused: 10193,
        description: "missing sequence for expected last sequence per subject",
      };
    }
    const badTTL = w.ttl !== undefined && !(w.ttl >= 1000);
    const invalidTTL = {
      refused: 10165,
      description: "invalid per-message TTL",
    };
    if (modern && w.ttl !== undefined && !this.cfg.msgTTL) {
      return badTTL ? invalidTTL : {
        refused: 10166,
        description: "per-message TTL is disabled",
      };
    }
    if (w.expect !== undefined) {
      const other = modern && w.expectSubject !== undefined;
      const skip = other && this.cfg.flaw === "subject-check-skipped";
      const checked = other && this.cfg.flaw !== "subject-check-ignored"
        ? w.expectSubject!
        : w.subject;
      if (!skip && written?.has(checked)) {
        return { refused: 10164, description: "wrong last sequence" };
      }
      const cur = this.#last.get(checked)?.seq ?? 0;
      if (!skip && cur !== w.expect) return { conflict: cur };
    }
    if (modern && badTTL) return invalidTTL;
    return undefined;
  }

  #store(
    w: KvWrite,
    writer: string,
    sendLocal: number,
    batch: BatchTag | undefined,
  ): Stored {
    const cur = this.#last.get(w.subject);
    const e = this.#append(w.subject, {
      operation: w.op === "DEL" ? "DEL" : undefined,
      marker: undefined,
      msgId: w.msgId,
      value: w.op === "DEL" ? "" : w.value,
      writer,
      sendLocal,
      ...(w.expect !== undefined ? { expect: w.expect } : {}),
      ...(w.expectSubject !== undefined
        ? { expectSubject: w.expectSubject }
        : {}),
      ...(w.ttl !== undefined ? { ttl: w.ttl } : {}),
      ...(batch !== undefined
        ? { batch: batch.id, batchFences: batch.fences }
        : {}),
    });
    if (w.msgId !== undefined) this.#msgIds.set(w.msgId, e.seq);
    this.onWrite?.(e, cur);
    return e;
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

  /**
   * Expires the key's last message now, as its max age would when due: a
   * put or a DEL tombstone becomes a `MaxAge` marker on a bucket with
   * markers, else goes; a marker or a PURGE tombstone goes (the testing
   * kit's `expire(key)`).
   *
   * @param key The key.
   * @returns Whether the key had a message to expire.
   */
  expireNow(key: string): boolean {
    const e = this.last(this.subject(key));
    if (e === undefined) return false;
    this.#expire(e, this.incarnation);
    return true;
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
      | "operation"
      | "marker"
      | "msgId"
      | "value"
      | "writer"
      | "sendLocal"
      | "expect"
      | "expectSubject"
      | "ttl"
      | "batch"
      | "batchFences"
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
    const life = this.#lifeOf(e);
    const inc = this.incarnation;
    if (life !== Infinity) {
      this.#sched.at(
        e.stamp + life + this.cfg.late(),
        () => this.#expire(e, inc),
        { pure: true },
      );
    }
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
        const life = this.#lifeOf(back);
        if (life !== Infinity) {
          this.#sched.at(
            Math.max(now, back.stamp + life + this.cfg.late()),
            () => this.#expire(back, inc),
            { pure: true },
          );
        }
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
