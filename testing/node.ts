/**
 * A simulated process: its monotonic clock, its timers, its connection to
 * the simulated KV, and the {@linkcode Port} the manager under test runs on.
 *
 * - **Clock**: `local = offset + rate × true`, with `rate` within the
 *   history's bound (|rate - 1| <= epsilon). Timers fire when the local
 *   clock reaches their due time, never before, and up to 1 ms after (an
 *   event loop's granularity; a history may make them exact).
 * - **Network**: a request reaches the server after a seeded one-way delay,
 *   in the order the process sent its requests (one TCP connection); the
 *   reply comes back after another delay. The history's fault menu may lose
 *   the request, lose the reply after the write was applied, or delay the
 *   reply past the timeout. The port rejects a request at its timeout.
 * - **Pause**: a paused process runs nothing; its timers and replies wait
 *   until it resumes (in the order they came due, or timers first, as the
 *   history chose); requests it sent that have not reached the server yet
 *   wait too if the history freezes in-flight writes.
 * - **Crash**: the process never runs again; nothing is released.
 * - **Connection close**: `closed()` settles, `isClosed()` turns true,
 *   requests in flight and later ones reject.
 * - **Partition**: for a while every request and reply is lost (requests
 *   time out) and watches deliver nothing; when it heals, each watch
 *   resumes with its subject's last entry, as after a reconnect.
 * - **Watch**: the subject's last entry one round trip after the call,
 *   then every message the leader appends on the subject, each one
 *   one-way delay later and in order (an expiry without a marker sends
 *   nothing).
 * - **Like the production port** (`natsPort` in `../lease/nats_port.ts`): after a
 *   request went unanswered, the next successful write is returned only
 *   after a stream-info round trip shows the stream is the incarnation the
 *   manager started on (else `BucketGone`).
 * - **Connection drops** ({@linkcode SimNode.drop}; `Port.onLink`): at a
 *   server restart, or a blip of one connection, the port reports
 *   `"down"` (an event of the process, at the drop: a paused process
 *   sees it when it resumes, before any reply that came after), then
 *   `"other"` (a restarted server) or `"same"` (a blip) when it
 *   reconnects. Requests on the wire at the drop are lost; a reply the
 *   old server sent that had not arrived is lost or delivered after
 *   `"down"`. A request sent while down, or still inside a paused process
 *   (with frozen requests) at the drop, is held as nats.js holds it and
 *   sent to the server at the reconnect. Watches go silent while down and
 *   resume with the last entry.
 * - **Marker proof** (`Port.markerLife`): a stream-info request, sent in
 *   order behind the requests sent before it (so after the compare-and-set
 *   it follows), answered with the marker life the bucket proves when it
 *   arrives ({@linkcode SimKv.provenMarkerLife}); 0 when lost or late.
 * - **A leaf client** ({@linkcode SimNode.leaf}; issue 31, point 3): its
 *   connection is to a leaf node of the server with the bucket (the hub),
 *   so a restart of the hub drops no connection of its own and the port
 *   reports nothing ({@linkcode SimNode.hubRestart}). Until the hub answers
 *   the leaf again, a request that reaches it is lost (it was on the way to
 *   the hub: it times out) or answered "no responders" at once (the leaf
 *   knows no route), half each; a reply the hub sent before it went down
 *   that had not arrived is lost or delivered, half each; watches go
 *   silent and resume with the last entry once the hub answers.
 * - **Session responders** (`Port.serve`, `Port.probe`; issue 33): each
 *   simulated server keeps the subscriptions it has heard of, as nats-server
 *   keeps interest per connection. A `serve` sends its SUB, with the
 *   flush's PING right behind it, in order behind the process's earlier
 *   requests; the server has the subject from the SUB's arrival, and the
 *   call resolves when the PONG is back, one delay later. A responder
 *   counts at the server only while its connection is open and up: a drop
 *   removes the interest (the server forgets a connection it lost), and
 *   the SUB the client sends again at the reconnect brings it back one
 *   delay after it (as nats.js resubscribes); a leaf client's interest is
 *   gone while the hub is down behind its leaf node; a crash removes it at
 *   once (the killed process's socket closes), unless the history says the
 *   server did not see it (`Network.crashSeen`: a host that vanished, whose
 *   connection the server keeps until its pings fail, later than a
 *   history). A paused or partitioned responder still counts: the server
 *   cannot tell. A `stop()` sends the UNSUB; the subject goes when it
 *   arrives. A probe is a request like the others (the prober's order,
 *   fate, partition, drop and leaf outage; a closed prober gets
 *   `"unknown"`). At the server, with no responder that counts, the reply
 *   is "no responders" (`"gone"`), one delay later; else the server writes
 *   the request to each responder's connection, where it arrives one delay
 *   later as an event of that process (a paused one reads it when it
 *   resumes, a dead one never, a partitioned or dropped one loses it), and
 *   the empty reply goes back through the server to the prober (`"alive"`).
 *   Anything else times out: `"unknown"`. A leaf prober whose hub is down
 *   may get "no responders" from its leaf node: a `"gone"` that is false,
 *   as a real leaf node gives it.
 *
 * @module
 */

import type {
  CommitRequest,
  CommitResult,
  Port,
  ProbeResult,
  PublishRequest,
  RawEntry,
  Responder,
  WriteRequest,
  WriteResult,
} from "../lease/port.ts";
import {
  fenceVersion,
  uncommittable,
  unfencedServer,
  untimedServer,
} from "../lease/servers.ts";
import type { ReplyTrust } from "../lease/trust.ts";
import type { SimKv, Stored } from "./kv.ts";
import { keyOf } from "./kv.ts";
import type { EventKind, Scheduler, SimEvent, Target } from "./scheduler.ts";
import type { Trace } from "./trace.ts";

/** What happens to one request on the network. */
export type Fate = "ok" | "lostRequest" | "lostReply" | "lateReply";

/** The network and fault choices a node asks the history for. */
export interface Network {
  /** One-way delay of a message, ms. */
  delay(): number;
  /** The fate of a request from `node` (`write` with its request). */
  fate(node: SimNode, what: "write" | "read", req?: WriteRequest): Fate;
  /** How far past the timeout a late reply comes, ms. */
  lateBy(): number;
  /** How late a timer fires after its due time, ms (an event loop's granularity). */
  timerLate(): number;
  /** Which copy serves a Direct Get (0: the leader). */
  replica(): number;
  /** Requests of a paused process that have not reached the server wait for it. */
  readonly freeze: boolean;
  /** A resumed process runs its due timers before its due replies. */
  readonly timersFirst: boolean;
  /** Called after `node` sent a request (a history may pause it right then). */
  sent(node: SimNode, key: string, req?: WriteRequest): void;
  /** Called when a write's reply reached `node` (a history may partition it right then). */
  replied(node: SimNode, key: string): void;
  /** Tells the history a fault touched `node` over [t0, t1] (true time). */
  disturbed(node: SimNode, t0: number, t1: number, why: string): void;
  /** Whether a reply the old server sent before a drop is still delivered (after `"down"`). */
  crossedReply(): boolean;
  /**
   * A leaf client's request reaching its leaf node while the hub is down:
   * lost (it times out), or answered "no responders" at once. Default: lost.
   */
  outage?(node: SimNode): "lost" | "noResponders";
  /** Whether a reply the hub sent before it went down still reaches a leaf client. Default: yes. */
  hubReply?(node: SimNode): boolean;
  /**
   * Whether the server saw `node`'s crash: `true` when the killed process's
   * socket closed and the server dropped its subscriptions at once; `false`
   * for a host that vanished, whose connection the server keeps (and sends
   * probes to) until its pings fail, later than a history lasts. Asked at
   * most once per crashed process, by the first probe that meets it.
   * Default: seen.
   */
  crashSeen?(node: SimNode): boolean;
  /**
   * Called as the port is asked for a request on a key; the function it
   * returns, if any, hears the answer the manager gets (after the port's
   * identity check; never a rejection), as it gets it.
   */
  observe?(node: SimNode, r: Observed): ((answer: unknown) => void) | undefined;
}

/** A port request as {@linkcode Network.observe} sees it. */
export interface Observed {
  readonly key: string;
  readonly what: "write" | "read";
  /** The read's query (a read of a key). */
  readonly query?: { readonly seq?: number; readonly leader: boolean };
  /** The write (a write). */
  readonly req?: WriteRequest;
  /** The process's clock when the port was asked. */
  readonly local: number;
}

/** The error class the port must reject with when the bucket is gone. */
export type BucketGoneClass = new (message?: string) => Error;

/**
 * What a port takes from the lease module under test: its `BucketGone`, and
 * its reply gate (`lease/trust.ts`), which this port runs as the production
 * port does, so that a mutant of the gate is a mutant of both.
 */
export interface PortParts {
  /** The class the port rejects with when the bucket is gone. */
  readonly BucketGone: BucketGoneClass;
  /** The gate of safety point 7. */
  readonly ReplyTrust: typeof ReplyTrust;
}

interface Pending {
  settled: boolean;
  resolve: (v: never) => void;
  reject: (err: unknown) => void;
  /** Its timeout; none for a serve's wait for its PONG. */
  timer: SimEvent | undefined;
}

/** A subscription made by {@linkcode Port.serve}. */
interface Sub {
  readonly subject: string;
  readonly node: SimNode;
  /**
   * The connection generation whose SUB the server has (-1: none yet); the
   * server forgets it when that connection drops.
   */
  gen: number;
  /** Unsubscribed by the process: it answers nothing more. */
  stopped: boolean;
  /** The `serve()` call, settled by the first PONG behind one of its SUBs. */
  readonly ready: Pending;
}

/**
 * Each simulated server's interest: per subject, the subscriptions whose
 * SUB reached it and whose UNSUB has not. Whether one still counts (its
 * connection up, its process not seen dead) is asked when a probe arrives.
 * Beside the bucket rather than in it: core subjects are not the stream's.
 */
const interest = new WeakMap<SimKv, Map<string, Set<Sub>>>();

/**
 * Whether a process's responder on `subject` has been stopped (its UNSUB
 * sent): for the checks, which ask whether a session was over at its owner.
 *
 * @param kv The simulated server.
 * @param subject A responder's subject.
 * @returns `true` once every responder ever started on it was stopped.
 */
export function responderStopped(kv: SimKv, subject: string): boolean {
  const subs = interest.get(kv)?.get(subject);
  return subs === undefined || [...subs].every((s) => s.stopped);
}

function interestIn(kv: SimKv, subject: string): Set<Sub> {
  let bySubject = interest.get(kv);
  if (bySubject === undefined) {
    bySubject = new Map();
    interest.set(kv, bySubject);
  }
  let subs = bySubject.get(subject);
  if (subs === undefined) {
    subs = new Set();
    bySubject.set(subject, subs);
  }
  return subs;
}

/**
 * A reply the server gives later than the request's arrival: `start` runs
 * then and calls `answer` when the reply leaves the server (a request it
 * forwarded to a responder, whose reply came back through it).
 */
class Relay<T> {
  readonly start: (answer: (reply: T) => void) => void;
  // No parameter property: Node runs this file by stripping types only.
  constructor(start: (answer: (reply: T) => void) => void) {
    this.start = start;
  }
}

/** The server's 503 status: nothing listens on the request's subject. */
class NoResponders extends Error {
  constructor() {
    super("no responders");
  }
}

/** A simulated process. */
export class SimNode implements Target {
  /** Its label in traces (`m1`, `m1'` after a restart, ...). */
  readonly label: string;
  readonly rate: number;
  readonly offset: number;
  paused = false;
  dead = false;
  /** True time of the crash. */
  diedAt: number = Infinity;
  closed = false;
  /** Cut off from the server (see {@linkcode SimNode.partition}). */
  partitioned = false;
  /** True time at which the current partition heals. */
  healAt = 0;
  /** What each open watch does when a partition heals. */
  readonly #resync = new Set<() => void>();
  /** True time at which the current pause ends. */
  resumeAt = 0;
  /** The connection is down (see {@linkcode SimNode.drop}). */
  linkDown = false;
  /** True times at which the manager was told `"down"` (its port's `onLink`). */
  readonly downSeen: number[] = [];
  /** Connection generation: one more at each drop. */
  #gen = 0;
  /** The generation whose `"down"` the manager has been told. */
  #told = 0;
  /** When the connection comes back, and as what. */
  #upAt = 0;
  #upAs: "same" | "other" = "same";
  /** Requests held while down, sent at the reconnect (as nats.js does). */
  #heldSends: (() => void)[] = [];
  readonly #linkFns: ((c: "down" | "same" | "other") => void)[] = [];
  /** Its `Port.serve` subscriptions not stopped: sent again at each reconnect. */
  readonly #subs = new Set<Sub>();
  /** Whether the server saw the crash (asked once, by the first probe that needs it). */
  #crashSeen: boolean | undefined;
  /**
   * A client of a leaf node: a restart of the server with the bucket (the
   * hub) drops none of its connections ({@linkcode SimNode.hubRestart}).
   */
  leaf = false;
  /** The hub's latest outage seen by this leaf client: [from, until) in true time. */
  #outageFrom = 0;
  #outageUntil = 0;
  readonly port: Port;
  readonly #sched: Scheduler;
  readonly #kv: SimKv;
  readonly #net: Network;
  readonly #trace: Trace;
  readonly #BucketGone: BucketGoneClass;
  #held: SimEvent[] = [];
  #lastArrival = 0;
  /** The stream incarnation the manager started on. */
  readonly #created: number;
  /** Point 7's gate, the module's own: unanswered requests and silences. */
  readonly #trust: ReplyTrust;
  #instances = 0;
  readonly #inflight = new Set<Pending>();
  /** Every request the process sent (for P7 and P8): true time, key, kind. */
  /**
   * Every request sent: `begun` is when the port call it serves began (an
   * identity check is sent later than the read or write it belongs to).
   */
  readonly sends: {
    t: number;
    key: string;
    what: "write" | "read";
    begun: number;
  }[] = [];
  /** The port's timers that are armed (set, neither fired nor cleared). */
  readonly armed: Set<SimEvent> = new Set();
  #closedResolve!: () => void;
  readonly #closedPromise: Promise<void>;

  /**
   * @param sched The event queue.
   * @param kv The bucket.
   * @param net The network and its faults.
   * @param trace The trace.
   * @param label Its label.
   * @param rate Its clock rate.
   * @param offset Its clock offset.
   * @param parts The lease module's `BucketGone` and reply gate.
   * @param silence The gap between answers (ms, its clock) that makes it suspect: the TTL.
   */
  constructor(
    sched: Scheduler,
    kv: SimKv,
    net: Network,
    trace: Trace,
    label: string,
    rate: number,
    offset: number,
    parts: PortParts,
    silence: number,
  ) {
    this.#sched = sched;
    this.#kv = kv;
    this.#net = net;
    this.#trace = trace;
    this.label = label;
    this.rate = rate;
    this.offset = offset;
    this.#BucketGone = parts.BucketGone;
    this.#created = kv.incarnation;
    this.#trust = new parts.ReplyTrust(() => this.local(), silence);
    this.#closedPromise = new Promise<void>((r) => this.#closedResolve = r);
    this.port = this.#makePort();
  }

  /** Its clock at true time `t` (default: now). */
  local(t: number = this.#sched.now): number {
    return this.offset + this.rate * t;
  }

  /** The true time at which its clock reads `local` (never earlier). */
  trueOf(local: number): number {
    let t = (local - this.offset) / this.rate;
    while (this.offset + this.rate * t < local) {
      t += Math.max(1e-9, Math.abs(t) * 1e-15);
    }
    return t;
  }

  hold(ev: SimEvent): void {
    this.#held.push(ev);
  }

  /**
   * Runs `fn` after `ms` of this process's clock.
   *
   * @param fn What.
   * @param ms Delay on its clock.
   * @param kind A timer, or the completion of I/O (for the order after a pause).
   * @returns The event.
   */
  after(fn: () => void, ms: number, kind: EventKind): SimEvent {
    let due = this.trueOf(this.local() + Math.max(0, ms));
    if (kind === "timer") due += this.#net.timerLate();
    return this.#sched.at(due, fn, { target: this, kind });
  }

  /** Pauses the process until true time `until`. */
  pause(until: number): void {
    if (this.dead) return;
    const t0 = this.#sched.now;
    this.#net.disturbed(this, t0, until, "pause");
    if (this.paused) {
      if (until <= this.resumeAt) return;
      this.resumeAt = until;
    } else {
      this.paused = true;
      this.resumeAt = until;
      this.#trace.add(
        t0,
        undefined,
        this.label,
        () =>
          `paused until ${until.toFixed(3)} (${(until - t0).toFixed(1)} ms)`,
      );
    }
    this.#sched.at(until, () => this.#resume(), { pure: true });
  }

  #resume(): void {
    if (!this.paused || this.dead || this.#sched.now < this.resumeAt) return;
    this.paused = false;
    const held = this.#held;
    this.#held = [];
    const timersFirst = this.#net.timersFirst;
    held.sort((a, b) => {
      if (timersFirst && a.kind !== b.kind) return a.kind === "timer" ? -1 : 1;
      return a.due - b.due || a.seq - b.seq;
    });
    this.#trace.add(
      this.#sched.now,
      undefined,
      this.label,
      () => `resumed (${held.length} events held)`,
    );
    for (const ev of held) this.#sched.requeue(ev);
  }

  /**
   * Cuts the process off from the server until true time `until`: its
   * requests and the replies to it are lost, its watches deliver nothing.
   */
  partition(until: number): void {
    if (this.dead || this.closed) return;
    const t0 = this.#sched.now;
    this.#net.disturbed(this, t0, until, "partition");
    if (this.partitioned && until <= this.healAt) return;
    if (!this.partitioned) {
      this.#trace.add(
        t0,
        undefined,
        this.label,
        () =>
          `partitioned until ${until.toFixed(3)} (${
            (until - t0).toFixed(1)
          } ms)`,
      );
    }
    this.partitioned = true;
    this.healAt = until;
    this.#sched.at(until, () => {
      if (!this.partitioned || this.#sched.now < this.healAt) return;
      this.partitioned = false;
      this.#trace.add(this.#sched.now, undefined, this.label, () => `healed`);
      for (const fn of this.#resync) fn();
    }, { pure: true });
  }

  /**
   * The connection drops now and comes back at true time `until`, to the
   * same server process (`"same"`: a blip) or another (`"other"`: the
   * server restarted). Overlapping drops come back once, as `"other"` if
   * either was.
   */
  drop(until: number, as: "same" | "other"): void {
    if (this.dead || this.closed) return;
    const sched = this.#sched;
    const t0 = sched.now;
    this.#net.disturbed(this, t0, until, `connection lost (${as})`);
    if (this.linkDown) {
      this.#upAt = Math.max(this.#upAt, until);
      if (as === "other") this.#upAs = "other";
      return;
    }
    this.linkDown = true;
    this.#gen++;
    this.#upAt = until;
    this.#upAs = as;
    const gen = this.#gen;
    this.#trace.add(
      t0,
      undefined,
      this.label,
      () => `connection lost (back at ${until.toFixed(3)}, ${as})`,
    );
    // Told as the process runs: before any reply delivered after the drop.
    sched.at(t0, () => {
      this.#told = gen;
      this.downSeen.push(sched.now);
      for (const fn of this.#linkFns) fn("down");
    }, { target: this, kind: "io" });
    const up = () => {
      if (this.#gen !== gen || this.dead) return;
      if (sched.now < this.#upAt) {
        sched.at(this.#upAt, up, { pure: true });
        return;
      }
      this.linkDown = false;
      const change = this.#upAs;
      this.#trace.add(
        sched.now,
        undefined,
        this.label,
        () => `connection back (${change})`,
      );
      sched.at(sched.now, () => {
        for (const fn of this.#linkFns) fn(change);
      }, { target: this, kind: "io" });
      if (this.closed) return;
      // nats.js sends its subscriptions first on a new connection, then
      // what it held.
      for (const sub of this.#subs) this.#subscribe(sub);
      const held = this.#heldSends;
      this.#heldSends = [];
      for (const send of held) send();
      for (const fn of this.#resync) fn();
    };
    sched.at(until, up, { pure: true });
  }

  /**
   * The hub restarts behind this leaf client's leaf node and answers it
   * again at true time `until`: the client's connection stays up and its
   * manager is told nothing (see the module's description).
   */
  hubRestart(until: number): void {
    if (this.dead || this.closed) return;
    const sched = this.#sched;
    this.#outageFrom = sched.now;
    this.#outageUntil = Math.max(this.#outageUntil, until);
    this.#trace.add(
      sched.now,
      undefined,
      this.label,
      () =>
        `the hub went down behind the leaf node (connection kept, nothing told; the hub answers again at ${
          until.toFixed(3)
        })`,
    );
    sched.at(until, () => {
      if (sched.now < this.#outageUntil || this.dead) return;
      this.#trace.add(
        sched.now,
        undefined,
        this.label,
        () => `the hub answers the leaf node again`,
      );
      if (this.closed || this.linkDown) return;
      for (const fn of this.#resync) fn();
    }, { pure: true });
  }

  /** The hub is down behind this leaf client now. */
  #hubDown(): boolean {
    const now = this.#sched.now;
    return now >= this.#outageFrom && now < this.#outageUntil;
  }

  /** The process stops for good. */
  crash(): void {
    if (this.dead) return;
    this.dead = true;
    this.diedAt = this.#sched.now;
    this.paused = false;
    this.#held = [];
    this.#trace.add(this.#sched.now, undefined, this.label, () => `crashed`);
  }

  /** The connection closes for good. */
  closeConnection(): void {
    if (this.closed || this.dead) return;
    this.closed = true;
    this.#net.disturbed(this, this.#sched.now, Infinity, "connection closed");
    this.#trace.add(
      this.#sched.now,
      undefined,
      this.label,
      () => `connection closed`,
    );
    const pending = [...this.#inflight];
    this.#inflight.clear();
    this.#sched.at(this.#sched.now, () => {
      for (const p of pending) {
        this.#settle(p, undefined, new Error("connection closed"));
      }
      this.#closedResolve();
    }, { target: this });
  }

  #settle(p: Pending, value: unknown, err?: unknown): void {
    if (p.settled) return;
    p.settled = true;
    if (p.timer !== undefined) this.#sched.cancel(p.timer);
    this.#inflight.delete(p);
    if (err !== undefined) p.reject(err);
    else p.resolve(value as never);
  }

  /**
   * Sends a request: `serve` runs at the server when it arrives and returns
   * the reply (or an Error to reject with, or a {@linkcode Relay} that
   * gives the reply later).
   */
  #request<T>(
    what: "write" | "read",
    key: string | undefined,
    timeout: number,
    describe: () => string,
    serve: () => T | Error | Relay<T | Error>,
    req?: WriteRequest,
    begun?: number,
  ): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const sched = this.#sched;
      const t0 = sched.now;
      const p: Pending = {
        settled: false,
        resolve: resolve as (v: never) => void,
        reject,
        timer: undefined as unknown as SimEvent,
      };
      if (this.closed) {
        p.timer = sched.at(t0, () => {}, { pure: true });
        sched.at(
          t0,
          () => this.#settle(p, undefined, new Error("connection closed")),
          { target: this },
        );
        return;
      }
      this.#inflight.add(p);
      this.sends.push({ t: t0, key: key ?? "*", what, begun: begun ?? t0 });
      p.timer = this.after(
        () => {
          this.#trace.add(
            sched.now,
            key,
            this.label,
            () => `${describe()}: timed out`,
          );
          this.#settle(p, undefined, new Error("timeout"));
        },
        timeout,
        "timer",
      );
      let told = false;
      const transmit = () => {
        if (this.closed) return;
        // Sent while down: nats.js holds it and sends it to whatever
        // server the connection comes back to, even once the request has
        // timed out (its reply then goes nowhere).
        if (this.linkDown) {
          this.#trace.add(
            sched.now,
            key,
            this.label,
            () => `${describe()}: held until the connection is back`,
          );
          this.#heldSends.push(transmit);
          return;
        }
        const ts = sched.now;
        const gen = this.#gen;
        const drawn = this.#net.fate(this, what, req);
        const fate = this.partitioned ? "lostRequest" : drawn;
        if (fate !== "ok") {
          this.#net.disturbed(
            this,
            ts,
            t0 + timeout / this.rate + 1,
            fate,
          );
        }
        this.#trace.add(
          ts,
          key,
          this.label,
          () => `→ ${describe()}${fate === "ok" ? "" : ` [${fate}]`}`,
        );
        if (!told) {
          told = true;
          this.#net.sent(this, key ?? "*", req);
        }
        if (fate === "lostRequest") return;
        const arrival = Math.max(ts + this.#net.delay(), this.#lastArrival);
        this.#lastArrival = arrival;
        sched.at(arrival, () => {
          if (gen !== this.#gen) {
            // The connection dropped since. Still inside a paused process
            // (frozen): nats.js sends it on the next connection. On the
            // wire: lost with the old connection.
            if (sched.now > arrival) transmit();
            return;
          }
          if (this.#hubDown()) {
            // A leaf client while the hub is down: lost on the way, or no
            // route from the leaf node.
            const how = this.#net.outage?.(this) ?? "lost";
            this.#trace.add(
              sched.now,
              key,
              this.label,
              () =>
                `${describe()}: the hub is down (${
                  how === "lost" ? "lost" : "no responders"
                })`,
            );
            if (how === "lost") return;
            sched.at(sched.now + this.#net.delay(), () => {
              if (p.settled || this.partitioned) return;
              this.#settle(p, undefined, new NoResponders());
            }, { target: this, kind: "io" });
            return;
          }
          const answer = (reply: T | Error) => {
            const served = sched.now;
            if (fate === "lostReply") return;
            const back = fate === "lateReply"
              ? timeout / this.rate + this.#net.lateBy()
              : this.#net.delay();
            sched.at(sched.now + back, () => {
              if (p.settled || this.partitioned) return;
              if (
                this.#outageFrom > served && this.#outageFrom <= sched.now &&
                !(this.#net.hubReply?.(this) ?? true)
              ) {
                // Sent by the hub before it went down, not yet here: lost
                // with the hub's connection to the leaf node.
                return;
              }
              if (gen !== this.#gen) {
                // Sent by the server before the drop, not yet here: lost, or
                // delivered after "down" (never before it).
                if (this.#told !== this.#gen || !this.#net.crossedReply()) {
                  return;
                }
                this.#trace.add(
                  sched.now,
                  key,
                  this.label,
                  () => `${describe()}: reply crossed the lost connection`,
                );
              }
              if (reply instanceof Error) this.#settle(p, undefined, reply);
              else {
                this.#settle(p, reply);
                if (what === "write") this.#net.replied(this, key ?? "*");
              }
            }, { target: this, kind: "io" });
          };
          const reply = serve();
          if (reply instanceof Relay) reply.start(answer);
          else answer(reply);
        }, { target: this.#net.freeze ? this : undefined, pure: true });
      };
      transmit();
    });
  }

  /** A stream-info request: rejects with BucketGone unless the stream is the one we started on. */
  async #checkIdentity(
    key: string,
    timeout: number,
    begun: number,
  ): Promise<void> {
    const kv = this.#kv;
    const inc = await this.#request<number>(
      "read",
      key,
      timeout,
      () => "stream info (identity check)",
      () => kv.gone ? new this.#BucketGone() : kv.incarnation,
      undefined,
      begun,
    );
    if (inc !== this.#created) {
      throw new this.#BucketGone(
        `the lease bucket's stream was deleted and re-created (incarnation ${this.#created}, now ${inc})`,
      );
    }
  }

  #makePort(): Port {
    const kv = this.#kv;
    const sched = this.#sched;
    return {
      now: () => this.local(),
      setTimer: (fn, ms) => {
        const ev: SimEvent = this.after(
          () => {
            this.armed.delete(ev);
            fn();
          },
          ms,
          "timer",
        );
        this.armed.add(ev);
        return ev;
      },
      clearTimer: (h) => {
        if (h !== undefined && h !== null) {
          sched.cancel(h as SimEvent);
          this.armed.delete(h as SimEvent);
        }
      },
      newInstanceId: () =>
        `${this.label.replaceAll("'", "r")}i${++this.#instances}`,
      write: async (req: WriteRequest): Promise<WriteResult> => {
        // As the production port: an entry with its own TTL (a session's)
        // is refused before sending on a server that cannot expire it into
        // a marker.
        const version = kv.cfg.version;
        if (req.ttl !== undefined && version !== undefined) {
          const no = untimedServer(req.subject, version);
          if (no !== undefined) throw no;
        }
        const begun = sched.now;
        const key = keyOf(req.subject);
        const sendLocal = this.local();
        const heard = this.#net.observe?.(this, {
          key,
          what: "write",
          req,
          local: sendLocal,
        });
        const value = new TextDecoder().decode(req.value);
        // Point 7's gate, as the production port runs it: after an
        // unanswered request or a silence, a success counts only once the
        // stream is seen to be the one the manager started on.
        const applied = (r: WriteResult) => "seq" in r;
        const res = await this.#trust.settle(
          this.#request<WriteResult>(
            "write",
            key,
            req.timeout,
            () => `${req.op} expect ${req.expect} ${req.msgId}`,
            () => {
              const w = {
                subject: req.subject,
                op: req.op,
                value,
                expect: req.expect,
                msgId: req.msgId,
              };
              // With a TTL the server may refuse it (a stream without
              // `allow_msg_ttl`), which only `publish` answers.
              const r = req.ttl === undefined
                ? kv.write(w, this.label, sendLocal)
                : kv.publish(
                  { ...w, ttl: req.ttl * 1000 },
                  this.label,
                  sendLocal,
                );
              if (r !== "gone" && "refused" in r) {
                this.#trace.add(
                  sched.now,
                  key,
                  "server",
                  () => `${this.label} ${req.op}: refused (${r.refused})`,
                );
                return new Error(`${r.description} (${r.refused})`);
              }
              this.#trace.add(
                sched.now,
                key,
                "server",
                () =>
                  `${this.label} ${req.op} expect ${req.expect}: ${
                    r === "gone"
                      ? "stream not found"
                      : "seq" in r
                      ? `applied @${r.seq}${r.duplicate ? " (duplicate)" : ""}`
                      : `wrong last sequence: ${r.conflict}`
                  }`,
              );
              if (r === "gone") return new this.#BucketGone();
              return "seq" in r ? { seq: r.seq } : { conflict: r.conflict };
            },
            req,
          ),
          applied,
          applied,
          () => this.#checkIdentity(key, req.timeout, begun),
        );
        heard?.(res);
        return res;
      },
      publish: async (req: PublishRequest): Promise<WriteResult> => {
        // As the production port: refused before sending on a server that
        // ignores the check on another subject.
        const version = kv.cfg.version;
        if (version !== undefined && !fenceVersion(version)) {
          throw unfencedServer(req.subject, version);
        }
        const begun = sched.now;
        const key = keyOf(req.subject);
        const sendLocal = this.local();
        const value = new TextDecoder().decode(req.data);
        const what = () =>
          `fenced publish on ${req.fence.subject} @${req.fence.seq}`;
        const applied = (r: WriteResult) => "seq" in r;
        return await this.#trust.settle(
          this.#request<WriteResult>(
            "write",
            key,
            req.timeout,
            what,
            () => {
              const r = kv.publish(
                {
                  subject: req.subject,
                  op: req.op ?? "PUT",
                  value,
                  expect: req.fence.seq,
                  expectSubject: req.fence.subject,
                  msgId: req.msgId,
                },
                this.label,
                sendLocal,
              );
              this.#trace.add(
                sched.now,
                key,
                "server",
                () =>
                  `${this.label} ${what()}: ${
                    r === "gone"
                      ? "stream not found"
                      : "seq" in r
                      ? `stored @${r.seq}${r.duplicate ? " (duplicate)" : ""}`
                      : "conflict" in r
                      ? `wrong last sequence: ${r.conflict}`
                      : `refused (${r.refused})`
                  }`,
              );
              if (r === "gone") return new this.#BucketGone();
              if ("refused" in r) {
                return new Error(`${r.description} (${r.refused})`);
              }
              return "seq" in r ? { seq: r.seq } : { conflict: r.conflict };
            },
          ),
          applied,
          applied,
          () => this.#checkIdentity(key, req.timeout, begun),
        );
      },
      commit: async (req: CommitRequest): Promise<CommitResult> => {
        // As the production port: refused before sending when it cannot
        // be committed atomically. Sent here as one request: the network's
        // faults meet the batch as a whole (a lost request stores none of
        // it, a lost reply leaves it committed, unknown to the sender), as
        // the server's all-or-nothing commit makes them.
        const no = uncommittable(req.writes.length, kv.cfg.version ?? "2.15.2");
        if (no !== undefined) throw no;
        const begun = sched.now;
        const key = keyOf(req.writes[0]!.subject);
        const sendLocal = this.local();
        const decoder = new TextDecoder();
        const what = () =>
          `fenced commit of ${req.writes.length} on ${req.fence.subject} @${req.fence.seq}`;
        const applied = (r: CommitResult) => "seq" in r;
        return await this.#trust.settle(
          this.#request<CommitResult>(
            "write",
            key,
            req.timeout,
            what,
            () => {
              const r = kv.batch(
                req.writes.map((w) => ({
                  subject: w.subject,
                  op: w.op ?? "PUT",
                  value: decoder.decode(w.data),
                  expect: req.fence.seq,
                  expectSubject: req.fence.subject,
                })),
                this.label,
                sendLocal,
              );
              this.#trace.add(
                sched.now,
                key,
                "server",
                () =>
                  `${this.label} ${what()}: ${
                    r === "gone"
                      ? "stream not found"
                      : "count" in r
                      ? `committed @${r.seq}`
                      : "conflict" in r
                      ? `wrong last sequence: ${r.conflict}`
                      : "refused" in r
                      ? `refused (${r.refused})`
                      : "not atomic"
                  }`,
              );
              if (r === "gone") return new this.#BucketGone();
              if ("count" in r) return { seq: r.seq, count: r.count };
              if ("conflict" in r) return { conflict: r.conflict };
              if ("refused" in r) {
                return new Error(`${r.description} (${r.refused})`);
              }
              return new Error("the batch was not committed atomically");
            },
          ),
          applied,
          applied,
          () => this.#checkIdentity(key, req.timeout, begun),
        );
      },
      read: (subject, query, timeout): Promise<RawEntry | null> => {
        const begun = sched.now;
        const key = keyOf(subject);
        const replica = query.leader ? 0 : this.#net.replica();
        const what = `read ${
          query.seq === undefined ? "last" : `@${query.seq}`
        }${query.leader ? " (leader)" : ""}`;
        const heard = this.#net.observe?.(this, {
          key,
          what: "read",
          query,
          local: this.local(),
        });
        // Point 7's gate, as the production port runs it: a read after an
        // unanswered request or a silence counts only once the stream is the
        // one we started on.
        return this.#trust.settle(
          this.#request<RawEntry | null>(
            "read",
            key,
            timeout,
            () => what,
            () => {
              const r = kv.read(subject, query.seq, replica);
              this.#trace.add(
                sched.now,
                key,
                "server",
                () =>
                  `${this.label} ${what}${
                    replica > 0
                      ? ` on replica ${replica} (lag ${kv.cfg.lags[replica]})`
                      : ""
                  }: ${r === "gone" ? "stream not found" : describeStored(r)}`,
              );
              if (r === "gone") return new this.#BucketGone();
              return r === null ? null : toRaw(r);
            },
          ),
          () => false,
          () => true,
          () => this.#checkIdentity(key, timeout, begun),
        ).then((entry) => {
          heard?.(entry);
          return entry;
        });
      },
      watch: (subject, onEntry) => this.#watch(subject, onEntry),
      markerLife: (timeout): Promise<number> =>
        this.#request<number>(
          "read",
          undefined,
          timeout,
          () => "stream info (marker proof)",
          () => {
            const life = kv.gone ? 0 : kv.provenMarkerLife();
            this.#trace.add(
              sched.now,
              undefined,
              "server",
              () => `${this.label} stream info: marker life ${life} ms`,
            );
            return life;
          },
        ).catch(() => 0),
      serve: (subject) => this.#serve(subject),
      probe: (subject, timeout): Promise<ProbeResult> =>
        // Recorded in `sends` as a request on no key ("*"), as the marker
        // proof is: P7 then holds a closed manager to sending no probe
        // either, while P7's check of a released key and P8's renewals,
        // which look at one key's requests (P8 at writes alone), never
        // count it.
        this.#request<ProbeResult>(
          "read",
          undefined,
          timeout,
          () => `probe ${subject}`,
          () => this.#probed(subject),
        ).catch((err: unknown): ProbeResult =>
          err instanceof NoResponders ? "gone" : "unknown"
        ),
      onLink: (fn) => {
        this.#linkFns.push(fn);
      },
      isClosed: () => this.closed,
      closed: () => this.#closedPromise,
    };
  }

  /** {@linkcode Port.serve}: see the module's description. */
  #serve(subject: string): Promise<Responder> {
    return new Promise<Responder>((resolve, reject) => {
      // nats.js refuses to subscribe on a closed connection.
      if (this.closed) {
        reject(new Error("connection closed"));
        return;
      }
      const responder: Responder = { stop: () => this.#unsubscribe(sub) };
      const sub: Sub = {
        subject,
        node: this,
        gen: -1,
        stopped: false,
        ready: {
          settled: false,
          resolve: () => resolve(responder),
          reject,
          timer: undefined,
        },
      };
      this.#subs.add(sub);
      // A close before the PONG rejects it, as it does a request.
      this.#inflight.add(sub.ready);
      this.#trace.add(
        this.#sched.now,
        undefined,
        this.label,
        () => `serve ${subject}`,
      );
      // While down, the reconnect sends it.
      if (!this.linkDown) this.#subscribe(sub);
    });
  }

  /** Sends `sub`'s SUB, and the flush's PING behind it, on this connection. */
  #subscribe(sub: Sub): void {
    const sched = this.#sched;
    const gen = this.#gen;
    const arrival = Math.max(sched.now + this.#net.delay(), this.#lastArrival);
    this.#lastArrival = arrival;
    this.#trace.add(
      sched.now,
      undefined,
      this.label,
      () => `→ SUB ${sub.subject}`,
    );
    sched.at(arrival, () => {
      // On the wire at a drop: lost with the connection; the reconnect
      // sends it again.
      if (gen !== this.#gen || this.closed) return;
      interestIn(this.#kv, sub.subject).add(sub);
      sub.gen = gen;
      this.#trace.add(
        sched.now,
        undefined,
        "server",
        () => `${this.label} SUB ${sub.subject}`,
      );
      if (sub.ready.settled) return;
      // The PONG to the PING behind it: from then the server has it. A
      // PONG lost in a drop leaves the call waiting for the next one.
      sched.at(sched.now + this.#net.delay(), () => {
        if (gen === this.#gen) this.#settle(sub.ready, undefined);
      }, { target: this, kind: "io" });
    }, { target: this.#net.freeze ? this : undefined, pure: true });
  }

  /** {@linkcode Responder.stop}: the UNSUB, in order behind earlier sends. */
  #unsubscribe(sub: Sub): void {
    if (sub.stopped) return;
    sub.stopped = true;
    this.#subs.delete(sub);
    const sched = this.#sched;
    this.#trace.add(
      sched.now,
      undefined,
      this.label,
      () => `→ UNSUB ${sub.subject}`,
    );
    const forget = () => interest.get(this.#kv)?.get(sub.subject)?.delete(sub);
    // Closed or down: the server has already forgotten it with the
    // connection, and no reconnect sends it again.
    if (this.closed || this.linkDown || this.dead) {
      forget();
      return;
    }
    const arrival = Math.max(sched.now + this.#net.delay(), this.#lastArrival);
    this.#lastArrival = arrival;
    sched.at(arrival, () => {
      forget();
      this.#trace.add(
        sched.now,
        undefined,
        "server",
        () => `${this.label} UNSUB ${sub.subject}`,
      );
    }, { target: this.#net.freeze ? this : undefined, pure: true });
  }

  /**
   * Whether the server counts `sub` as listening now: its SUB came on the
   * connection the server has, and the server has not seen that
   * connection go (closed, dropped, cut off with the hub behind a leaf
   * node, or its process killed). A paused or partitioned process counts:
   * the server cannot tell.
   */
  #listening(sub: Sub): boolean {
    if (
      sub.gen !== this.#gen || this.closed || this.linkDown || this.#hubDown()
    ) return false;
    if (!this.dead) return true;
    this.#crashSeen ??= this.#net.crashSeen?.(this) ?? true;
    return !this.#crashSeen;
  }

  /**
   * A probe of `subject` arriving at the server: "no responders" when
   * nothing listens, else forwarded to each responder, answered when the
   * first reply comes back through the server.
   */
  #probed(subject: string): NoResponders | Relay<ProbeResult> {
    const subs = [...interest.get(this.#kv)?.get(subject) ?? []].filter((s) =>
      s.node.#listening(s)
    );
    this.#trace.add(
      this.#sched.now,
      undefined,
      "server",
      () =>
        `${this.label} probe ${subject}: ${
          subs.length === 0
            ? "no responders"
            : `to ${subs.map((s) => s.node.label).join(", ")}`
        }`,
    );
    if (subs.length === 0) return new NoResponders();
    return new Relay((answer) => {
      for (const sub of subs) sub.node.#respond(sub, () => answer("alive"));
    });
  }

  /**
   * The server writes a probe to `sub`'s connection: it arrives one delay
   * later as an event of this process, which sends its empty reply back to
   * the server (`replied`, at the reply's arrival there).
   */
  #respond(sub: Sub, replied: () => void): void {
    const sched = this.#sched;
    const gen = this.#gen;
    const forwarded = sched.now;
    // Cut off: the server's write goes nowhere.
    if (this.partitioned) return;
    sched.at(sched.now + this.#net.delay(), () => {
      if (
        gen !== this.#gen || this.closed || this.partitioned ||
        // The hub dropped the leaf node's connection since: lost with it.
        this.#outageFrom > forwarded || sub.stopped
      ) return;
      this.#trace.add(
        sched.now,
        undefined,
        this.label,
        () => `answers probe ${sub.subject}`,
      );
      const arrival = Math.max(
        sched.now + this.#net.delay(),
        this.#lastArrival,
      );
      this.#lastArrival = arrival;
      sched.at(arrival, () => {
        if (gen === this.#gen) replied();
      }, { target: this.#net.freeze ? this : undefined, pure: true });
    }, { target: this, kind: "io" });
  }

  /** {@linkcode Port.watch}: see the module's description. */
  #watch(
    subject: string,
    onEntry: (e: RawEntry | null) => void,
  ): { stop(): Promise<void> } {
    const kv = this.#kv;
    const sched = this.#sched;
    const key = keyOf(subject);
    let stopped = false;
    let lastDue = 0;
    const deliver = (e: Stored | null, due: number) => {
      lastDue = Math.max(due, lastDue);
      sched.at(lastDue, () => {
        if (
          stopped || this.closed || this.partitioned || this.linkDown ||
          this.#hubDown()
        ) return;
        this.#trace.add(
          sched.now,
          key,
          this.label,
          () => `watch: ${describeStored(e)}`,
        );
        onEntry(e === null ? null : toRaw(e));
      }, { target: this, kind: "io" });
    };
    // The subject's last entry, read at the server one delay from now.
    const start = () => {
      if (this.closed || this.partitioned || this.linkDown || this.#hubDown()) {
        return;
      }
      sched.at(sched.now + this.#net.delay(), () => {
        if (stopped || kv.gone) return;
        deliver(kv.last(subject) ?? null, sched.now + this.#net.delay());
      }, { pure: true });
    };
    const onAppend = (e: Stored) => {
      if (
        e.subject !== subject || stopped || this.partitioned ||
        this.linkDown || this.#hubDown()
      ) return;
      deliver(e, sched.now + this.#net.delay());
    };
    kv.appended.add(onAppend);
    this.#resync.add(start);
    start();
    return {
      stop: () => {
        stopped = true;
        kv.appended.delete(onAppend);
        this.#resync.delete(start);
        // The consumer's deletion: one round trip.
        const back = 2 * this.#net.delay();
        return new Promise<void>((resolve) => {
          sched.at(sched.now + back, resolve, { pure: true });
        });
      },
    };
  }
}

function toRaw(e: Stored): RawEntry {
  return {
    seq: e.seq,
    operation: e.operation,
    marker: e.marker,
    msgId: e.msgId,
    value: e.value,
  };
}

/** A message in a trace. */
export function describeStored(e: Stored | null | undefined): string {
  if (!e) return "none";
  const what = e.marker
    ? `marker ${e.marker}`
    : e.operation
    ? `${e.operation}${e.msgId ? ` ${e.msgId}` : " (untagged)"}`
    : `PUT ${e.value} ${e.msgId ?? ""}`;
  return `@${e.seq} ${what}`;
}
