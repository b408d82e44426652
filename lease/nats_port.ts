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
  JetStreamApiError,
  type JetStreamClient,
  type JetStreamManager,
  PubHeaders,
  type StoredMsg,
  type StreamInfo,
} from "@nats-io/jetstream";
import {
  conflictRevision,
  decoder,
  isNoResponders,
  isStreamNotFound,
  rawEntry,
  within,
} from "./_nats.ts";
import { KV_OPERATION_HDR } from "./entry.ts";
import {
  BucketGone,
  type CommitResult,
  type Fence,
  type LinkChange,
  type Port,
  type RawEntry,
  WriteRefused,
  type WriteResult,
} from "./port.ts";
import {
  casSafeVersion,
  census,
  currentMarkerLife,
  fenceVersion,
  type MarkerProof,
  markersVersion,
  uncommittable,
  unfencedServer,
  untimedServer,
} from "./servers.ts";
import { ReplyTrust } from "./trust.ts";

// ---------------------------------------------------------------------------
// The production port: nats.js, `performance.now()` and `setTimeout`.

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

/**
 * The two headers of a fence, filled directly as `write` fills its own:
 * the revision, and the other subject it is checked on (2.11+).
 */
function fenceHeaders(fence: Fence): MsgHdrsImpl {
  const h = new MsgHdrsImpl();
  h.headers.set(PubHeaders.ExpectedLastSubjectSequenceHdr, [
    String(fence.seq),
  ]);
  h.headers.set(PubHeaders.ExpectedLastSubjectSequenceSubjectHdr, [
    fence.subject,
  ]);
  return h;
}

/**
 * A batch message's reply: `undefined` for the empty one that stages a
 * message, the commit's ack, or the conflict the fence met; throws any
 * other error the server sent.
 */
/** nats-server's error code for a batch sent to a stream without `allow_atomic`. */
const ATOMIC_DISABLED = 10174;

function batchReply(msg: Msg): CommitResult | undefined {
  if (msg.data.length === 0) {
    const code = msg.headers?.code ?? 0;
    if (code >= 300) {
      throw code === 503 ? new NoRespondersError(msg.subject) : new Error(
        `unexpected status ${code} ${msg.headers?.description ?? ""}`,
      );
    }
    return undefined;
  }
  let v: { seq?: unknown; count?: unknown; error?: ApiError };
  try {
    v = JSON.parse(decoder.decode(msg.data));
  } catch (err) {
    throw new Error("invalid JetStream batch ack", { cause: err });
  }
  if (v.error) {
    const err = new JetStreamApiError(v.error);
    const at = conflictRevision(err);
    if (at !== undefined) return { conflict: at };
    throw err;
  }
  if (typeof v.seq === "number" && typeof v.count === "number") {
    return { seq: v.seq, count: v.count };
  }
  throw new Error("invalid JetStream batch ack");
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

export function natsPort(
  nc: NatsConnection,
  js: JetStreamClient,
  jsm: JetStreamManager,
  stream: string,
  direct: boolean,
  created: string,
  silence: number,
  markers: MarkerProof,
  late: LatePeers,
  rollup = false,
): Port {
  // Point 7: a success after an unanswered request or a silence counts only
  // once a stream-info request sent after it shows the stream we started on
  // (the gate is `ReplyTrust`, which the simulator runs too).
  const trust = new ReplyTrust(() => performance.now(), silence);
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
  // A request that failed, or whose identity check did, as the manager
  // sees it: `BucketGone` when the stream is gone, else the error.
  const failed = async (err: unknown): Promise<never> => {
    if (err instanceof BucketGone) throw err;
    return await gone(err);
  };
  // A fenced write's error that the server answered (not the fence's
  // conflict, which resolves): nothing was stored, which the manager says.
  const answered = (err: unknown): never => {
    throw err instanceof JetStreamApiError
      ? new WriteRefused(err.message, { cause: err })
      : err;
  };
  const applied = (res: WriteResult) => "seq" in res;
  // A write through the shared reply subscription, behind the reply gate.
  const send = (
    subject: string,
    data: Uint8Array,
    h: MsgHdrs,
    timeout: number,
  ): Promise<WriteResult> =>
    trust.settle(
      inbox.request(writePrefix + subject, data, h, timeout),
      applied,
      applied,
      checkIdentity,
    ).catch(failed);
  return {
    now: () => performance.now(),
    setTimer: (fn, ms) => setTimeout(fn, ms),
    clearTimer: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
    newInstanceId: () => crypto.randomUUID().replaceAll("-", ""),
    write(req) {
      if (req.ttl !== undefined) {
        const no = untimedServer(req.subject, nc.info?.version ?? "");
        if (no !== undefined) return Promise.reject(no);
      }
      // What `js.publish` sends, without its per-request cost (see
      // `ReplyInbox`): the same headers, one shared reply subscription.
      // Filled directly: `set()` validates and canonicalises every name
      // and value (in Bun a sixth of a renewal's CPU), and these are ours:
      // canonical names, values that cannot hold CR or LF.
      const h = new MsgHdrsImpl();
      h.headers.set(PubHeaders.MsgIdHdr, [req.msgId]);
      h.headers.set(PubHeaders.ExpectedLastSubjectSequenceHdr, [
        String(req.expect),
      ]);
      if (req.op === "DEL") h.headers.set(KV_OPERATION_HDR, ["DEL"]);
      // A stream of the user's keeps every message of a subject: each
      // lease entry's write replaces the ones before it, as a bucket's
      // history of 1 does. The server checks the expected sequence first.
      if (rollup) h.headers.set("Nats-Rollup", ["sub"]);
      if (req.ttl !== undefined) {
        h.headers.set(PubHeaders.MessageTTL, [`${req.ttl}s`]);
      }
      return send(req.subject, req.value, h, req.timeout);
    },
    publish(req) {
      // Judged by the server this connection is on. Of a cluster, only it
      // is known here: a stream leader on a release before 2.11 would check
      // the write's own subject instead, which refuses it (no message of
      // another subject has the fence's sequence): never stored unfenced.
      const version = nc.info?.version ?? "";
      if (!fenceVersion(version)) {
        return Promise.reject(unfencedServer(req.subject, version));
      }
      const h = fenceHeaders(req.fence);
      if (req.op === "DEL") h.headers.set(KV_OPERATION_HDR, ["DEL"]);
      if (req.msgId !== undefined) {
        h.headers.set(PubHeaders.MsgIdHdr, [req.msgId]);
      }
      return send(req.subject, req.data, h, req.timeout).catch(answered);
    },
    commit(req) {
      const n = req.writes.length;
      const no = uncommittable(n, nc.info?.version ?? "");
      if (no !== undefined) return Promise.reject(no);
      const id = crypto.randomUUID().replaceAll("-", "");
      // Every message fenced, not only the first: a server that ignored
      // the batch would then still refuse each late one.
      const headersOf = (i: number): MsgHdrs => {
        const h = fenceHeaders(req.fence);
        if (req.writes[i]!.op === "DEL") {
          h.headers.set(KV_OPERATION_HDR, ["DEL"]);
        }
        h.headers.set("Nats-Batch-Id", [id]);
        h.headers.set("Nats-Batch-Sequence", [String(i + 1)]);
        if (i === n - 1) h.headers.set("Nats-Batch-Commit", ["1"]);
        return h;
      };
      const ask = (i: number) =>
        nc.request(writePrefix + req.writes[i]!.subject, req.writes[i]!.data, {
          headers: headersOf(i),
          timeout: req.timeout,
        });
      // As nats.js's batch publisher sends one (its add() would drop the
      // fence): the first message and the commit as requests, the others
      // without a reply. The server stages the batch and answers the first
      // with an empty message, or with the error that ends the batch.
      const send = async (): Promise<CommitResult> => {
        if (n > 1) {
          const staged = batchReply(await ask(0));
          if (staged !== undefined) return staged;
          for (let i = 1; i < n - 1; i++) {
            const w = req.writes[i]!;
            nc.publish(writePrefix + w.subject, w.data, {
              headers: headersOf(i),
            });
          }
        }
        const done = batchReply(await ask(n - 1));
        if (done === undefined || ("seq" in done && done.count !== n)) {
          throw new Error(
            `invalid JetStream batch ack: ${
              done === undefined ? "empty" : `${done.count} of ${n} messages`
            }`,
          );
        }
        return done;
      };
      return trust.settle(
        send(),
        (r) => "seq" in r,
        (r) => "seq" in r,
        checkIdentity,
      ).catch((err) => {
        // The stream's atomic batches are off (an edit, or a stream made
        // without them): an answer, not a lost reply, and nothing stored.
        if (err instanceof JetStreamApiError && err.code === ATOMIC_DISABLED) {
          throw new TypeError(
            `Cannot commit as stream '${stream}' has atomic batches turned off (allow_atomic): nothing was stored`,
            { cause: err },
          );
        }
        return failed(err).catch(answered);
      });
    },
    async serve(subject) {
      // A plain subscription on this connection: the server drops it the
      // moment it sees the connection close (a process killed, a socket
      // reset), and then answers a probe "no responders" at once. nats.js
      // subscribes again after a reconnect. The flush's PONG comes after
      // the server processed the SUB.
      const sub = nc.subscribe(subject, {
        callback: (err, msg) => {
          if (err === null) msg.respond();
        },
      });
      try {
        await nc.flush();
      } catch (err) {
        // A drop before the PONG fails the flush while nats.js keeps the
        // subscription for the reconnect: nobody could stop it then.
        sub.unsubscribe();
        throw err;
      }
      return { stop: () => sub.unsubscribe() };
    },
    async probe(subject, timeout) {
      try {
        await nc.request(subject, undefined, { timeout });
        return "alive";
      } catch (err) {
        // Only the server's immediate "no responders" says anything: a
        // timeout is what a paused or cut-off holder looks like too.
        return isNoResponders(err) ? "gone" : "unknown";
      }
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
    // A Direct Get may be answered by any replica, which may lag; the
    // MSG.GET API is answered by the stream leader only.
    const sm: StoredMsg | null = await trust.settle(
      direct && !query.leader
        ? jsm.direct.getMessage(stream, q)
        : jsm.streams.getMessage(stream, q),
      () => false,
      () => true,
      checkIdentity,
    ).catch(failed);
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
