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
  /**
   * `Nats-TTL` in whole seconds (1 or more): the entry's own life
   * (nats-server 2.11+, a stream with `allow_msg_ttl`), after which the
   * server replaces it with a `MaxAge` marker. Only a session's entry has
   * one (issue 33); a server that does not honour it refuses the write
   * (10166) or, before 2.11, ignores the header, which is why a session
   * refuses such a server before sending.
   */
  readonly ttl?: number;
}

/**
 * What a write's reply said: `{ seq }` when it was applied at that revision;
 * `{ conflict }` when the key's last revision was not `expect`, with the
 * revision the server named (-1 when it named none).
 */
export type WriteResult = { readonly seq: number } | {
  readonly conflict: number;
};

/**
 * The check that fences a write (nats-server 2.11 or later): the server
 * stores it only while the last revision of `subject`, another subject of
 * the same stream (a tenure's entry), is still `seq`.
 */
export interface Fence {
  /** The subject checked: `$KV.<bucket>.<key>` of the tenure's entry. */
  readonly subject: string;
  /** The revision that subject's last message must have: the tenure's. */
  readonly seq: number;
}

/** A write fenced by a tenure's entry (see {@linkcode Port.publish}). */
export interface PublishRequest {
  /** Where it is stored: a subject of the bucket's stream. */
  readonly subject: string;
  /** `"DEL"` stores a KV delete marker (`data` empty); a put by default. */
  readonly op?: "PUT" | "DEL";
  /** The body. */
  readonly data: Uint8Array;
  /** The check it is stored under. */
  readonly fence: Fence;
  /** `Nats-Msg-Id`, when the caller wants the server to drop a repeat. */
  readonly msgId?: string;
  /** Milliseconds to wait for the reply before it counts as unanswered. */
  readonly timeout: number;
}

/** Writes stored all or none, each fenced (see {@linkcode Port.commit}). */
export interface CommitRequest {
  /** The messages, in order: 1 to {@linkcode MAX_BATCH}. */
  readonly writes: readonly {
    readonly subject: string;
    /** `"DEL"` stores a KV delete marker; a put by default. */
    readonly op?: "PUT" | "DEL";
    readonly data: Uint8Array;
  }[];
  /** The check every message is stored under. */
  readonly fence: Fence;
  /** Milliseconds to wait for each reply before the batch counts as unanswered. */
  readonly timeout: number;
}

/** The most messages nats-server takes in one atomic batch. */
export const MAX_BATCH = 1000;

/**
 * What a commit's reply said: `{ seq, count }` when every message was
 * stored (the last one's sequence, and how many); `{ conflict }` when the
 * fence refused the batch, none of it stored.
 */
export type CommitResult = { readonly seq: number; readonly count: number } | {
  readonly conflict: number;
};

/**
 * What a probe of a session's responder learned (see {@linkcode Port.probe}):
 * `"alive"` when it answered; `"gone"` when the server said at once that
 * nothing listens on the subject (the responder's connection is closed, or
 * was never there); `"unknown"` when nothing came in time (a paused or
 * cut-off holder, a lost request, a slow route), which proves nothing.
 */
export type ProbeResult = "alive" | "gone" | "unknown";

/** A responder started by {@linkcode Port.serve}. */
export interface Responder {
  /** Ends it: the subscription is removed, and probes get `"gone"` once the server has seen that. */
  stop(): void;
}

/** A port's write or read found that the bucket's stream does not exist. */
export class BucketGone extends Error {
  /** Makes the error. */
  constructor(message = "the lease bucket does not exist") {
    super(message);
    this.name = "BucketGone";
  }
}

/**
 * A fenced write or commit that the server answered with an error other
 * than the fence's conflict (a batch refused, a limit): nothing of it was
 * stored, unlike a write that got no answer.
 */
export class WriteRefused extends Error {
  /** Makes the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "WriteRefused";
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
   * Optional (issue 33, not used by the manager yet): publishes a write
   * fenced by `req.fence`. `{ seq }` when stored at that sequence;
   * `{ conflict }` when the fence's subject has moved on, with the last
   * revision the server named for it (-1 when it named none): the tenure
   * is over and the write was not stored. The same reply gate as
   * {@linkcode Port.write} holds back a success after an unanswered
   * request or a silence. Rejects with a `RangeError`, before anything is
   * sent, when the server cannot be proven to honour the fence (a release
   * before 2.11 ignores the check on another subject).
   */
  publish?(req: PublishRequest): Promise<WriteResult>;
  /**
   * Optional (issue 33, not used by the manager yet): commits `req.writes`
   * as one atomic batch (nats-server 2.12 or later, a stream with
   * `allow_atomic`), every message fenced by `req.fence`, so a batch is
   * stored whole under the tenure or not at all; see
   * {@linkcode CommitResult}. The reply gate holds back a commit as it does
   * a write. Rejects with a `RangeError`, before anything is sent, for an
   * empty batch or one above {@linkcode MAX_BATCH}, and on a server that
   * cannot be proven to commit atomically (before 2.12 the batch headers
   * are ignored and each message stored or refused on its own).
   */
  commit?(req: CommitRequest): Promise<CommitResult>;
  /**
   * Optional (issue 33, not used by the manager yet): answers every request
   * on `subject` (a session's probe subject, outside the stream) with an
   * empty reply, for as long as this connection is up, so that a probe
   * from elsewhere tells a closed connection from a live one. Resolves once
   * the server this connection is on has the subscription (a probe through
   * that server cannot get `"gone"` from then on while the connection
   * lasts; through another server of a cluster, once the interest has
   * crossed the route). After a reconnect the client subscribes again; a
   * probe in between gets `"gone"`. Rejects when the connection is closed.
   */
  serve?(subject: string): Promise<Responder>;
  /**
   * Optional (issue 33, not used by the manager yet): one request to
   * `subject`, answered by its {@linkcode Port.serve} responder; see
   * {@linkcode ProbeResult}. Never rejects. Only `"gone"` says anything
   * about the holder, and only that its connection is not at the server:
   * a takeover on it is for fenced keys alone (the safety argument's F5).
   */
  probe?(subject: string, timeout: number): Promise<ProbeResult>;
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
