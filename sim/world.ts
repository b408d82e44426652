/**
 * One simulated history: a plan drawn from the seed (which faults are on,
 * how often, the bucket's kind, the workload), then 2-4 lease managers (the
 * real `managerOnPort` of the lease module under test) guarding writes on
 * 1-3 keys of one simulated bucket in virtual time, then the property
 * checks of `check.ts` over what happened.
 *
 * A seed reproduces a history bit for bit: every choice comes from seeded
 * streams, every clock and timer is virtual, and the scheduler drains the
 * microtasks between events.
 *
 * @module
 */

import type { ManagerSettings } from "../lease/manager.ts";
import type { Port, WriteRequest, WriteResult } from "../lease/port.ts";
import type { Lease, LeaseManager } from "../lease/types.ts";
import {
  type Carried,
  check,
  type Disturbance,
  type Episode,
  type History,
  type LeafCut,
  type Proof,
  type TailResidue,
} from "./check.ts";
import { MAX_LOST, SimKv, type Stored } from "../testing/kv.ts";
import {
  type Fate,
  type Network,
  type PortParts,
  SimNode,
} from "../testing/node.ts";
import { stream } from "./random.ts";
import { Scheduler } from "../testing/scheduler.ts";
import { Trace } from "../testing/trace.ts";

/**
 * What the simulator needs of a lease module (`../lease/` or a mutant's copy
 * of it): the protocol core, and the parts of a port that production and the
 * simulator share.
 */
export interface LeaseModule extends PortParts {
  managerOnPort(port: Port, settings: ManagerSettings): LeaseManager;
}

/** How a guarded write behaves. */
export type WriteKind =
  /** Calls `throwIfLost()` right before its commit point. */
  | "careful"
  /** Commits at its end without any check (awaited by the guard). */
  | "blind"
  /** Returns at once and commits later without any check (escapes the guard). */
  | "escape";

/** Settings of a batch of histories. */
export interface SimOptions {
  /** TTLs to draw from, ms. @default {[1000, 2500]} */
  ttls?: readonly number[];
  /** Clock-rate bound: every clock runs at 1 ± at most this. @default {1e-3} */
  epsilon?: number;
  /**
   * The clock-rate bound the simulated clocks really keep, when it differs
   * from `epsilon` (the bound lease.ts and the checks assume): a run with
   * clocks beyond the assumed bound. @default {epsilon}
   */
  clockEpsilon?: number;
  /**
   * The gap between two answers, in TTLs, after which the simulated port
   * checks the stream before trusting a success, as natsPort does after a
   * silence longer than the TTL; `Infinity` removes that check.
   * @default {1}
   */
  portSilence?: number;
  /** Length of a history, in TTLs. @default {12} */
  length?: number;
  /** Probability that each fault of the menu is on in a history. @default {0.5} */
  faultChance?: number;
  /**
   * Probability that markers change at run time, in the histories with
   * markers (see {@linkcode Plan.markerEdit}). @default {faultChance}
   */
  markerEditChance?: number;
  /** Probability of a bucket deletion and re-creation in a history. @default {0.1} */
  recreateChance?: number;
  /**
   * Probability of a server restart that loses its last acknowledged
   * messages in a history (see {@linkcode Plan.serverRestart}). @default {0.25}
   */
  restartChance?: number;
  /** Probability of connection blips (down, then back on the same server). @default {0.25} */
  blipChance?: number;
  /**
   * Probability that a history has clients of a leaf node, which a server
   * restart drops no connection of (see {@linkcode Plan.leafShare}).
   * @default {0.5}
   */
  leafChance?: number;
  /** Probability of a crash-and-replace liveness episode (P5). @default {0.3} */
  livenessChance?: number;
  /** Kind of the non-careful writes. @default {"blind"} */
  blindKind?: "blind" | "escape";
  /** Share of non-careful writes, in the histories that have them (half). @default {0.2} */
  blindShare?: number;
  /**
   * Probability that a history's timers fire exactly when due. Exact timers
   * expose float-equality assumptions (see README, "Findings").
   * @default {0}
   */
  exactTimersChance?: number;
  /** Record a trace. @default {false} */
  trace?: boolean;
  /** Changes to the drawn plan (used to reduce a failing seed). */
  override?: Partial<Plan>;
}

/** Everything a seed decides before the history starts. */
export interface Plan {
  ttl: number;
  epsilon: number;
  /** The bound the clocks really keep (see {@linkcode SimOptions.clockEpsilon}). */
  clockEpsilon: number;
  /** See {@linkcode SimOptions.portSilence}, in ms. */
  portSilence: number;
  timeout: number;
  settleTimeout: number;
  /** History length, ms. */
  duration: number;
  managers: number;
  keys: number;
  /** Subject delete markers on the bucket. */
  markers: boolean;
  markerTTL: number;
  /**
   * On a bucket with markers, a change of them while the managers run (at
   * `markerEditAt` × the history's length): a stream edit that removes the
   * marker TTL or lowers it to 1 s, or the server rolled back to a release
   * without markers. Drawn from a stream of its own.
   */
  markerEdit: "remove" | "lower" | "rollback" | undefined;
  markerEditAt: number;
  /** Operations each replica lags ([0] is the leader). */
  lags: number[];
  /** Expiry late by 0-250 ms (else exactly on time). */
  lateExpiry: boolean;
  /** Clock rates differ from 1 (within epsilon). */
  skew: boolean;
  /** Largest one-way network delay, ms. */
  maxDelay: number;
  /** Timers fire exactly when due (else up to 1 ms late, like a real event loop). */
  exactTimers: boolean;
  lostRequest: number;
  lostReply: number;
  lateReply: number;
  /** Mean time between pauses of one process, ms (0: none). */
  pauseEvery: number;
  /** With pauses on: probability that a process pauses right after sending a request. */
  pauseOnSend: number;
  freeze: boolean;
  timersFirst: boolean;
  /** Mean time between operator deletes/purges, ms (0: none). */
  operatorEvery: number;
  purgeShare: number;
  /** Operator operations come in bursts of 3-6. */
  bursts: boolean;
  /** The bucket is deleted and re-created once. */
  recreate: boolean;
  /** One process's connection closes for good. */
  connClose: boolean;
  /** One process crashes. */
  crash: boolean;
  /** Mean time between close() calls, ms (0: none). */
  closeEvery: number;
  /** A crashed or closed process is replaced by a new one with its node id. */
  restart: boolean;
  /** Mean time between release(key) calls per manager, ms (0: none). */
  releaseEvery: number;
  idleRelease: number | undefined;
  /** Mean time between guards per manager, ms. */
  guardEvery: number;
  blindShare: number;
  blindKind: "blind" | "escape";
  /**
   * Share of guards that wait (`wait: true`) instead of being refused, each
   * giving up after a while by its signal. Drawn from a stream of its own,
   * so that plans and workloads drawn before it stay as they were.
   */
  waitShare: number;
  /**
   * Share of guards made with `check: "lease"` (0: every guard proves the
   * lease by a compare-and-set). Drawn from a stream of its own.
   */
  leaseShare: number;
  /**
   * In histories with lease-checked guards: probability that a write's
   * start schedules another lease-checked guard on its key just before
   * its deadline (within three margins of it), where the margin matters
   * once renewals fail.
   */
  hugs: number;
  /**
   * Probability that a write's reply, as it reaches its process, starts a
   * network partition of that process (0.3-2 TTL): its lease then runs
   * out on the last confirmed renewal while the process keeps running.
   * Drawn from a stream of its own.
   */
  partitions: number;
  /** Crash a holder mid-history and check that a contender takes over (P5). */
  liveness: boolean;
  /**
   * A server restart at `restartAt` × the history's length that loses its
   * last `lostTail` acknowledged messages (reusing their sequences), and
   * drops every connection: each comes back, as another server process,
   * `restartGap` ms later plus up to two delays. Drawn from a stream of its
   * own, as are the blips.
   */
  serverRestart: boolean;
  restartAt: number;
  lostTail: number;
  /** The lost tail reaches back to (and over) the latest holder's acquire. */
  coverAcquire: boolean;
  /**
   * Instead of at `restartAt`, the restart comes as a holder sends its
   * first renewal after an acquire (not before `restartAt`), pausing that
   * holder with the renewal still inside it (frozen) for the server's
   * downtime and up to TTL/2 more, and losing just the acquire: the held
   * renewal then reaches the restarted server, where the acquire's
   * sequence may have been reused by another holder (hole R2). Only set
   * by a focus, never drawn.
   */
  crossAtRestart: boolean;
  restartGap: number;
  /** Mean time between connection blips (down, back on the same server), ms (0: none). */
  blipEvery: number;
  /**
   * Share of node ids whose processes are clients of a leaf node of the
   * server with the bucket (issue 31, point 3): the server's restart
   * drops none of their connections, so their managers are told nothing
   * (0: none). Drawn from a stream of its own, as are `leafGap` and
   * `coverCreation`.
   */
  leafShare: number;
  /** How long after the restarted server is back it answers the leaf node's clients, ms. */
  leafGap: number;
  /**
   * With `coverAcquire`: the lost tail reaches back over the latest acquire
   * that created its key (the key had no entry before it), so the key is
   * left with no entry at all while its holder holds it (issue 31, point 2).
   */
  coverCreation: boolean;
  /**
   * Probability that a renewal's send meets a storm: 15-40 operator
   * deletes and purges on its key, each within one network delay of the
   * last, so the renewal's revisions keep moving (0: none).
   */
  storms: number;
}

/** A property violation. */
export interface Violation {
  readonly property: string;
  /** True time at which it showed. */
  readonly t: number;
  readonly key: string | undefined;
  readonly message: string;
}

/** What one history found. */
export interface HistoryResult {
  readonly seed: number;
  readonly plan: Plan;
  readonly violations: readonly Violation[];
  /** Events run. */
  readonly steps: number;
  /** Guarded writes started and committed. */
  readonly writes: number;
  readonly commits: number;
  /** Overlapping writes P1 allows because the later one's epoch fences the earlier. */
  readonly fencedOverlaps: number;
  /** P7 breaches of the known finding 4 (see `CheckResult.orphans`). */
  readonly orphans: number;
  /** Overlaps P1 allows as point 10's residue for leaf clients (see `CheckResult.leafResidue`). */
  readonly leafResidue: TailResidue;
  /** See `CheckResult.leafNotice`. */
  readonly leafNotice: readonly { ms: number; bound: number }[];
  /** See `CheckResult.leafOverlaps`. */
  readonly leafOverlaps: readonly string[];
  /** Leaf clients' tenures a restart took the entry of. */
  readonly leafCuts: number;
  /** Answers that showed a manager the server lost its acknowledged writes (P10). */
  readonly proofs: number;
  /**
   * Liveness episodes (P5): the crash, when the holder's entry went, the next
   * write's start and P5's limit for it (true time, ms).
   */
  readonly takeovers: readonly {
    crash: number;
    gone: number | undefined;
    next: number | undefined;
    limit: number | undefined;
  }[];
  readonly trace: Trace;
}

/** A guarded write as the workload saw it (times are true time, ms). */
export interface WriteRec {
  readonly id: number;
  readonly mgr: string;
  readonly key: string;
  readonly epoch: number;
  readonly kind: WriteKind;
  /** The stream incarnation when it started. */
  readonly incarnation: number;
  readonly start: number;
  readonly startLocal: number;
  /** `lease.deadline` when it started (its node's clock). */
  readonly startDeadline: number;
  /** When it reached its commit point (check or not). */
  checkAt?: number;
  committed: boolean;
  commit?: number;
  commitLocal?: number;
  /** `lease.deadline` at the commit (its node's clock). */
  commitDeadline?: number;
  /** Why the commit check threw. */
  reason?: string;
  /**
   * A lease-checked guard ran it with no round trip (its start is vouched
   * by the last renewal, not by a compare-and-set of its own).
   */
  readonly fast: boolean;
  /**
   * True time at which the server applied the put that began its tenure
   * (a tenure is a manager instance, an epoch and this: a restart that
   * lost a tail can hand the same epoch to the same manager again).
   */
  readonly acquiredAt: number;
}

/** A manager in the history. */
interface Mgr {
  readonly label: string;
  readonly nodeId: string;
  readonly node: SimNode;
  readonly mgr: LeaseManager;
  closing: boolean;
  /** A replacement with its node id was scheduled. */
  replaced: boolean;
}

const DURATIONS = [
  [0.7, 0, 1 / 20],
  [0.2, 1 / 20, 1 / 2],
  [0.1, 1 / 2, 1.5],
] as const;

/**
 * Draws the plan of history `seed`.
 *
 * @param seed The seed.
 * @param o The batch settings.
 * @returns The plan.
 */
export function makePlan(seed: number, o: SimOptions = {}): Plan {
  const r = stream(seed, "plan");
  const chance = o.faultChance ?? 0.5;
  // Every value is drawn, used or not, so an override leaves the rest as is.
  const draw = <T>(on: boolean, value: T, off: T): T => on ? value : off;
  const ttl = r.pick(o.ttls ?? [1000, 2500]);
  const epsilon = o.epsilon ?? 1e-3;
  const lagOn = r.chance(chance);
  const lag1 = 1 + r.int(8);
  const lag2 = 1 + r.int(16);
  const twoLagging = r.chance(0.5);
  const plan: Plan = {
    ttl,
    epsilon,
    clockEpsilon: o.clockEpsilon ?? epsilon,
    portSilence: (o.portSilence ?? 1) * ttl,
    timeout: ttl / 4,
    settleTimeout: ttl,
    duration: (o.length ?? 12) * ttl,
    managers: 2 + r.int(3),
    keys: 1 + r.int(3),
    markers: r.chance(0.5),
    markerTTL: r.pick([1000, 2000, 5000]),
    lags: lagOn ? (twoLagging ? [0, lag1, lag2] : [0, lag1]) : [0],
    lateExpiry: r.chance(chance),
    skew: r.chance(chance),
    maxDelay: r.pick([1, 5, 20]),
    exactTimers: r.chance(o.exactTimersChance ?? 0),
    lostRequest: draw(r.chance(chance), r.between(0.003, 0.05), 0),
    lostReply: draw(r.chance(chance), r.between(0.003, 0.05), 0),
    lateReply: draw(r.chance(chance), r.between(0.003, 0.05), 0),
    pauseEvery: draw(r.chance(chance), r.between(2, 8) * ttl, 0),
    pauseOnSend: r.between(0, 0.02),
    freeze: r.chance(0.5),
    timersFirst: r.chance(0.5),
    operatorEvery: draw(r.chance(chance), r.between(1, 8) * ttl, 0),
    purgeShare: r.next(),
    bursts: r.chance(0.3),
    recreate: r.chance(o.recreateChance ?? 0.1),
    connClose: r.chance(0.1),
    crash: r.chance(0.25),
    closeEvery: draw(r.chance(0.3), r.between(3, 12) * ttl, 0),
    restart: r.chance(0.7),
    releaseEvery: draw(r.chance(chance), r.between(0.5, 4) * ttl, 0),
    idleRelease: draw(r.chance(0.25), r.between(0.3, 2) * ttl, undefined),
    guardEvery: r.between(0.05, 0.5) * ttl,
    blindShare: draw(r.chance(0.5), o.blindShare ?? 0.2, 0),
    blindKind: o.blindKind ?? "blind",
    liveness: r.chance(o.livenessChance ?? 0.3),
    storms: draw(r.chance(0.3), r.between(0.02, 0.2), 0),
    waitShare: 0,
    leaseShare: 0,
    hugs: 0,
    partitions: 0,
    markerEdit: undefined,
    markerEditAt: 0,
    serverRestart: false,
    restartAt: 0,
    lostTail: 0,
    coverAcquire: false,
    crossAtRestart: false,
    restartGap: 0,
    blipEvery: 0,
    leafShare: 0,
    leafGap: 0,
    coverCreation: false,
  };
  const rw = stream(seed, "waitplan");
  plan.waitShare = rw.chance(0.5) ? rw.between(0.1, 0.6) : 0;
  const rc = stream(seed, "checkplan");
  plan.leaseShare = rc.chance(0.5) ? rc.between(0.5, 1) : 0;
  plan.hugs = rc.chance(0.7) ? rc.between(0.1, 0.5) : 0;
  const rp = stream(seed, "partitionplan");
  plan.partitions = rp.chance(chance) ? rp.between(0.002, 0.02) : 0;
  const rm = stream(seed, "markerplan");
  const edit = rm.chance(o.markerEditChance ?? chance);
  const editKind = rm.pick(["remove", "lower", "rollback"] as const);
  plan.markerEditAt = rm.between(0.05, 0.8);
  plan.markerEdit = edit ? editKind : undefined;
  const rr = stream(seed, "restartplan");
  plan.serverRestart = rr.chance(o.restartChance ?? 0.25);
  plan.restartAt = rr.between(0.15, 0.85);
  plan.lostTail = 1 + rr.int(8);
  plan.coverAcquire = rr.chance(0.5);
  plan.restartGap = rr.between(1, ttl / 2);
  plan.blipEvery = rr.chance(o.blipChance ?? 0.25) ? rr.between(2, 8) * ttl : 0;
  const rl = stream(seed, "leafplan");
  plan.leafShare = rl.chance(o.leafChance ?? 0.5) ? rl.between(0.3, 1) : 0;
  plan.leafGap = rl.between(0, ttl / 2);
  plan.coverCreation = rl.chance(0.5);
  Object.assign(plan, o.override);
  // Only markers can be removed, lowered or rolled back.
  if (!plan.markers) plan.markerEdit = undefined;
  // The liveness episode needs a manager that can still act: none made
  // defunct by the bucket or its connection, none giving keys up on its own.
  // A restart that lost acknowledged messages may leave managers defunct
  // or proving their leases when the episode starts.
  if (
    plan.recreate || plan.connClose || plan.idleRelease !== undefined ||
    plan.serverRestart
  ) {
    plan.liveness = false;
  }
  return plan;
}

/** A guard() call of the workload: when it was made and when it settled. */
export interface GuardCall {
  readonly mgr: string;
  readonly key: string;
  readonly t0: number;
  t1?: number;
}

/**
 * A tenure the workload saw (for P8): from its first write's start until
 * its lease signal aborted (`end`), in true time.
 */
export interface TenureRec {
  readonly mgr: string;
  readonly key: string;
  readonly epoch: number;
  readonly from: number;
  end?: number;
}

/**
 * Runs history `seed` on `lib`.
 *
 * @param seed The seed.
 * @param lib The lease module under test.
 * @param o The batch settings.
 * @returns What the history found.
 */
export async function runHistory(
  seed: number,
  lib: LeaseModule,
  o: SimOptions = {},
): Promise<HistoryResult> {
  const plan = makePlan(seed, o);
  const { ttl, epsilon } = plan;
  const sched = new Scheduler();
  const trace = new Trace(o.trace ?? false);
  const rLate = stream(seed, "late");
  const rNet = stream(seed, "net");
  const rReplica = stream(seed, "replica");
  const rWork = stream(seed, "workload");
  const rFault = stream(seed, "faults");
  const rClock = stream(seed, "clock");
  const rTimer = stream(seed, "timers");
  const rPause = stream(seed, "pauses");
  const rStorm = stream(seed, "storms");
  const rWait = stream(seed, "wait");
  const rCheck = stream(seed, "check");
  const rPart = stream(seed, "partitions");
  const rRestart = stream(seed, "restart");
  const rLeaf = stream(seed, "leaf");
  const pauseLength = (): number => {
    const x = rPause.next();
    return x < 0.5
      ? rPause.between(1, ttl / 5)
      : x < 0.8
      ? rPause.between(ttl / 5, ttl)
      : x < 0.95
      ? rPause.between(ttl, 3 * ttl)
      : rPause.between(3 * ttl, 8 * ttl);
  };
  const kv = new SimKv(sched, trace, "leases", {
    maxAge: ttl,
    markers: plan.markers,
    markerTTL: plan.markerTTL,
    late: () => plan.lateExpiry ? rLate.between(0, 250) : 0,
    lags: plan.lags,
  });
  const keys = Array.from({ length: plan.keys }, (_, i) => `k${i + 1}`);
  const violations: Violation[] = [];
  const violate = (
    property: string,
    key: string | undefined,
    message: string,
  ) => {
    violations.push({ property, t: sched.now, key, message });
    trace.add(
      sched.now,
      key,
      "CHECK",
      () => `${property} VIOLATED: ${message}`,
    );
  };
  const disturbances: Disturbance[] = [];
  const writes: WriteRec[] = [];
  const releases: { mgr: string; key: string | undefined; t: number }[] = [];
  const episodes: Episode[] = [];
  const guardCalls: GuardCall[] = [];
  const givenUp: {
    mgr: string;
    key: string | undefined;
    called: number;
    t: number;
  }[] = [];
  const tenures: TenureRec[] = [];
  const nodes = new Map<string, SimNode>();
  const mgrs: Mgr[] = [];
  /** When each process's put at each revision was applied, latest first. */
  const applied = new Map<string, number>();
  kv.appended.add((e) => {
    if (e.operation === undefined && e.marker === undefined) {
      applied.set(`${e.writer}|${e.key}|${e.seq}`, e.stamp);
    }
  });
  /**
   * Managers that went defunct because the server lost writes it had
   * acknowledged (point 10): when the workload first saw it.
   */
  const defunct = new Map<string, number>();
  const sawDefunct = (m: Mgr, err: unknown) => {
    if (
      !defunct.has(m.label) &&
      /lost writes it had acknowledged/.test((err as Error)?.message ?? "")
    ) defunct.set(m.label, sched.now);
  };
  let quiet = false;
  /** The server restart (at most one per history) happened. */
  let restarted = false;
  let episode: Episode | undefined;
  /** The latest lease each manager handed to a write on each key, and when its tenure's put was applied. */
  const leases = new Map<string, { lease: Lease; acquiredAt: number }>();
  /** Node ids of leaf clients (drawn as each id first appears). */
  const leafIds = new Map<string, boolean>();
  /** Server restarts that lost messages: when, when back, when back for the leaf node. */
  const restarts: { t: number; back: number; leafBack: number }[] = [];
  /** Tenures of leaf clients that a restart took the entry of while they vouched. */
  const leafCuts: LeafCut[] = [];
  /** Answers that showed a manager the server lost writes it acknowledged (P10). */
  const proofs: Proof[] = [];
  /** Puts acknowledged to each process: `label|key|seq`. */
  const acked = new Set<string>();
  /**
   * Renewals of leaf clients carried across a restart that lost their
   * tenure's writes (nothing told them of it) that landed on another
   * tenure's entry at a reused revision: point 10's residue for leaf
   * clients ("a renewal's CAS that finds our own revision reused by the
   * successor succeeds"). To the tenure they landed on, an out-of-band
   * change of the key, as an operator's delete is. (Any other client saw
   * the drop, and lease.ts must not trust such a renewal: mutant R2.)
   */
  const carried: Carried[] = [];
  kv.onWrite = (e, replaced) => {
    const epoch = tagEpoch(e.msgId) ?? 0;
    if (
      epoch === 0 || restarts.length === 0 || replaced === undefined ||
      !nodes.get(e.writer)?.leaf ||
      replaced.stamp < restarts[0]!.t ||
      tenureWrite(replaced, e.writer, epoch) ||
      ![...kv.lost].some((l) =>
        l.key === e.key && tenureWrite(l, e.writer, epoch)
      )
    ) return;
    const over = replaced.operation === undefined &&
        replaced.marker === undefined &&
        replaced.writer !== "operator" && replaced.writer !== "server"
      ? {
        mgr: replaced.writer,
        epoch: tagEpoch(replaced.msgId) || replaced.seq,
      }
      : undefined;
    carried.push({
      t: sched.now,
      key: e.key,
      by: { mgr: e.writer, epoch },
      over,
    });
    disturbances.push({
      scope: "key",
      who: e.key,
      t0: sched.now,
      t1: sched.now,
      why: "a renewal carried across a lost tail landed at a reused revision",
    });
    trace.add(
      sched.now,
      e.key,
      "sim",
      () =>
        `${e.writer}'s renewal (epoch ${epoch}) was carried across the lost tail: it landed on ${replaced.writer}'s @${replaced.seq}`,
    );
  };
  /** Tenures that ended: the managers' "lost" and "released" events. */
  const ends: { mgr: string; tenure: string; t: number; reason: string }[] = [];

  // A storm of operator deletes and purges on a key, each within one
  // network delay of the last: a renewal in flight finds its revisions
  // moving on every attempt.
  const storm = (key: string) => {
    const n = 15 + rStorm.int(26);
    let t = sched.now;
    trace.add(t, key, "sim", () => `storm of ${n} operator writes`);
    for (let i = 0; i < n; i++) {
      // No purges on marker buckets: a purge tombstone expires without a
      // marker, which the fast path for empty keys assumes never happens
      // while a holder may be alive (see LeaseManagerOptions.markers).
      const p = rStorm.chance(0.5) && !plan.markers;
      sched.at(t, () => {
        if (quiet) return;
        disturbances.push({
          scope: "key",
          who: key,
          t0: sched.now,
          t1: sched.now,
          why: p ? "purge" : "delete",
        });
        if (p) kv.operatorPurge(key);
        else kv.operatorDelete(key);
      }, { pure: true });
      t += rStorm.between(0.1, plan.maxDelay);
    }
  };

  const net: Network = {
    delay: () => rNet.between(0.05, plan.maxDelay),
    fate(node: SimNode, what: "write" | "read", req?: WriteRequest): Fate {
      const x = rNet.next();
      if (quiet) {
        if (
          episode && !episode.lostReplyUsed && episode.loseReply &&
          node.label === episode.contender && what === "write" &&
          req !== undefined && /^lease:[^:]+:0:/.test(req.msgId)
        ) {
          episode.lostReplyUsed = true;
          return "lostReply";
        }
        return "ok";
      }
      return drawFate(x, plan);
    },
    sent(node, key, req) {
      if (
        plan.storms > 0 && !quiet && req !== undefined && req.op === "PUT" &&
        req.expect > 0 && rStorm.chance(plan.storms)
      ) {
        storm(key);
      }
      if (
        plan.crossAtRestart && plan.serverRestart && !quiet && !restarted &&
        req?.op === "PUT" && req.expect > 0 &&
        sched.now >= plan.restartAt * plan.duration &&
        kv.tailSeq() === req.expect &&
        /^lease:[^:]+:0:/.test(
          kv.recent().find((e) => e.seq === req.expect)?.msgId ?? "",
        )
      ) {
        // The first renewal after an acquire that is the bucket's last
        // message: freeze it inside its paused sender, and restart the
        // server losing that acquire.
        const len = plan.restartGap + rRestart.between(0, ttl / 2);
        sched.at(sched.now, () => {
          if (!quiet) node.pause(sched.now + len);
        }, { pure: true });
        // A microsecond later: the writes begun with the renewal started
        // before the loss, as the checks' residue rule counts them.
        sched.at(sched.now + 0.001, () => restartServer(1), { pure: true });
        return;
      }
      // Pauses aimed at the moment a request is in flight, the window
      // where a late reply meets a passed deadline.
      if (plan.pauseEvery > 0 && !quiet && rPause.chance(plan.pauseOnSend)) {
        const len = pauseLength();
        sched.at(sched.now, () => {
          if (!quiet) node.pause(sched.now + len);
        }, { pure: true });
      }
    },
    replied(node) {
      if (plan.partitions > 0 && !quiet && rPart.chance(plan.partitions)) {
        node.partition(sched.now + rPart.between(0.3, 2) * ttl);
      }
    },
    lateBy: () => rNet.between(1, ttl),
    timerLate: () => plan.exactTimers ? 0 : rTimer.next(),
    replica: () => quiet ? 0 : rReplica.int(plan.lags.length),
    freeze: plan.freeze,
    timersFirst: plan.timersFirst,
    disturbed(node, t0, t1, why) {
      disturbances.push({ scope: "node", who: node.label, t0, t1, why });
    },
    crossedReply: () => rRestart.chance(0.5),
    outage: () => rLeaf.chance(0.5) ? "lost" : "noResponders",
    hubReply: () => rLeaf.chance(0.5),
    observe(node, r) {
      // The writes acknowledged to each process (a leaf client's tenure
      // whose acknowledged put a restart lost must stop: P10).
      const ack = r.what === "write"
        ? (answer: unknown) => {
          const res = answer as WriteResult;
          if ("seq" in res) acked.add(`${node.label}|${r.key}|${res.seq}`);
        }
        : undefined;
      // P10: the answers that show a manager the server lost writes it had
      // acknowledged, as lease.ts reads them: no entry at all, in the
      // leader read after the connection came back (#verify) or in answer
      // to a renewal, sent before the lease's deadline; or a revision
      // below the one a renewal expected.
      const h = leases.get(`${node.label}|${r.key}`);
      if (!h) return ack;
      const { lease, acquiredAt } = h;
      const verify = r.what === "read" && r.query?.leader === true &&
        r.query.seq === undefined;
      const renewal = r.what === "write" && r.req?.op === "PUT" &&
        r.req.expect > 0 && tagEpoch(r.req.msgId) === lease.epoch;
      if (!verify && !renewal) return ack;
      const before = r.local < lease.deadline;
      const downs = node.downSeen.length;
      return (answer) => {
        ack?.(answer);
        // A drop since: lease.ts asks again rather than decide.
        if (node.downSeen.length !== downs || node.linkDown) return;
        // Still the same tenure, and its deadline still ahead of the send.
        if (!(r.local < lease.deadline)) return;
        let what: string | undefined;
        if (verify) {
          if (answer === null && before && node.local() < lease.deadline) {
            what =
              "no entry at all in the leader read after the connection came back, sent before its deadline";
          }
        } else {
          const res = answer as WriteResult;
          if ("conflict" in res && res.conflict === 0 && before) {
            what =
              "no entry at all in answer to a renewal sent before its deadline";
          } else if (
            "conflict" in res && res.conflict > 0 &&
            res.conflict < r.req!.expect
          ) {
            what = `revision ${res.conflict} in answer to a renewal expecting ${
              r.req!.expect
            }`;
          }
        }
        if (what === undefined) return;
        // Only where a restart lost writes of this tenure.
        const cut = [...kv.lost].some((e) =>
          e.stamp >= acquiredAt && tenureWrite(e, node.label, lease.epoch)
        );
        if (!cut) return;
        proofs.push({ mgr: node.label, key: r.key, t: sched.now, what });
        trace.add(
          sched.now,
          r.key,
          "sim",
          () => `${node.label} sees a lost tail: ${what}`,
        );
      };
    },
  };

  const newNode = (label: string): SimNode => {
    const rate = plan.skew
      ? 1 +
        (rClock.chance(0.3) ? rClock.pick([-1, 1]) : rClock.between(-1, 1)) *
          plan.clockEpsilon
      : 1;
    const node = new SimNode(
      sched,
      kv,
      net,
      trace,
      label,
      rate,
      rClock.between(0, 1e6),
      lib,
      plan.portSilence,
    );
    nodes.set(label, node);
    return node;
  };

  const settings = (nodeId: string): ManagerSettings => ({
    node: nodeId,
    ttl,
    timeout: plan.timeout,
    bucket: "leases",
    restartGrace: true,
    // What createLeaseManager proves from the stream's configuration (the
    // simulated servers are all recent enough when markers are on).
    markerLife: plan.markers
      ? (Math.floor(plan.markerTTL / 1000) * 1000 > ttl
        ? ttl
        : Math.floor(plan.markerTTL / 1000) * 1000 - 50)
      : 0,
    settleTimeout: plan.settleTimeout,
    idleRelease: plan.idleRelease,
    signal: undefined,
  });

  const addManager = (label: string, nodeId: string): Mgr => {
    const node = newNode(label);
    if (!leafIds.has(nodeId)) leafIds.set(nodeId, rLeaf.chance(plan.leafShare));
    node.leaf = leafIds.get(nodeId)!;
    const m: Mgr = {
      label,
      nodeId,
      node,
      mgr: lib.managerOnPort(node.port, settings(nodeId)),
      closing: false,
      replaced: false,
    };
    mgrs.push(m);
    m.mgr.addEventListener("lost", (e) => {
      ends.push({
        mgr: label,
        tenure: e.tenure,
        t: sched.now,
        reason: e.reason,
      });
    });
    m.mgr.addEventListener("released", (e) => {
      ends.push({
        mgr: label,
        tenure: e.tenure,
        t: sched.now,
        reason: "released",
      });
    });
    trace.add(
      sched.now,
      undefined,
      label,
      () =>
        `manager started (node ${nodeId}, clock rate ${node.rate.toFixed(6)}${
          node.leaf ? ", a client of the leaf node" : ""
        })`,
    );
    workload(m);
    return m;
  };

  const live = (m: Mgr) => !m.node.dead && !m.closing;

  // ---- P4: the manager never reports a landed CAS of the tenure as lost.
  const watched = new WeakSet<AbortSignal>();
  const watch = (m: Mgr, key: string, signal: AbortSignal, epoch: number) => {
    if (watched.has(signal)) return;
    watched.add(signal);
    const inc = kv.incarnation;
    const tenure: TenureRec = { mgr: m.label, key, epoch, from: sched.now };
    tenures.push(tenure);
    signal.addEventListener("abort", () => {
      tenure.end = sched.now;
      const reason = signal.reason as Error | undefined;
      sawDefunct(m, reason);
      trace.add(
        sched.now,
        key,
        m.label,
        () =>
          `lease epoch ${epoch} aborted: ${reason?.name}: ${reason?.message}`,
      );
      if (
        reason?.name !== "NotHolderError" || /was released/.test(reason.message)
      ) return;
      const last = kv.last(kv.subject(key));
      // A leaf client may be answered, after a restart it is not told of,
      // about messages the restart then lost (a delete over our entry): the
      // entry the restart brought back is not what it was shown.
      const restored = m.node.leaf && last !== undefined &&
        [...kv.lost].some((e) => e.key === key && e.seq > last.seq);
      if (
        last && kv.incarnation === inc && tenureWrite(last, m.label, epoch) &&
        !restored
      ) {
        violate(
          "P4",
          key,
          `${m.label} reported its lease (epoch ${epoch}) lost while the key's last entry is its own write @${last.seq}`,
        );
      }
    }, { once: true });
  };

  // ---- The workload: guarded writes.
  let writeIds = 0;
  const guard = (
    m: Mgr,
    key: string,
    kind: WriteKind,
    duration: number,
    hug = false,
  ) => {
    const node = m.node;
    const id = ++writeIds;
    const lease = hug || rCheck.chance(plan.leaseShare);
    // A waiting guard gives up after 0.5-4 TTLs (its signal aborts).
    const waitMs = rWait.chance(plan.waitShare)
      ? rWait.between(0.5, 4) * ttl
      : 0;
    let options:
      | { wait?: true; signal?: AbortSignal; check?: "lease" }
      | undefined = lease ? { check: "lease" } : undefined;
    let writing = false;
    // Set once guard() returned: a write that starts before is one that a
    // lease-checked guard ran with no round trip (the CAS path awaits one).
    let returned = false;
    if (waitMs > 0) {
      // It gives up only while waiting: a caller's signal that aborts
      // during the write ends that write (as it should), which P6 would
      // take for a lost lease.
      const ac = new AbortController();
      node.after(
        () => {
          if (!writing) ac.abort(new Error("gave up waiting"));
        },
        waitMs,
        "timer",
      );
      options = { ...options, wait: true, signal: ac.signal };
    }
    trace.add(
      sched.now,
      key,
      m.label,
      () =>
        `guard #${id} (${kind}, ${duration.toFixed(1)} ms${
          waitMs > 0 ? `, waits up to ${waitMs.toFixed(1)} ms` : ""
        }${lease ? `, check lease${hug ? ", hugs the deadline" : ""}` : ""})`,
    );
    const call: GuardCall = { mgr: m.label, key, t0: sched.now };
    guardCalls.push(call);
    m.mgr.guard(key, (lease) => {
      writing = true;
      const t = sched.now;
      const local = node.local();
      const rec: WriteRec = {
        id,
        mgr: m.label,
        key,
        epoch: lease.epoch,
        kind,
        incarnation: kv.incarnation,
        acquiredAt: applied.get(`${m.label}|${key}|${lease.epoch}`) ?? NaN,
        fast: !returned,
        start: t,
        startLocal: local,
        startDeadline: lease.deadline,
        committed: false,
      };
      writes.push(rec);
      leases.set(`${m.label}|${key}`, { lease, acquiredAt: rec.acquiredAt });
      trace.add(
        t,
        key,
        m.label,
        () =>
          `write #${id} starts: epoch ${lease.epoch}, deadline ${
            node.trueOf(lease.deadline).toFixed(3)
          }`,
      );
      // P3 at the start: the write runs only while the lease is vouched for.
      try {
        lease.throwIfLost();
      } catch (err) {
        violate(
          "P3",
          key,
          `write #${id} of ${m.label} started although throwIfLost() throws: ${
            (err as Error).message
          }`,
        );
      }
      if (!(local < lease.deadline)) {
        violate(
          "P3",
          key,
          `write #${id} of ${m.label} started at its clock ${
            local.toFixed(3)
          }, not before its deadline ${lease.deadline.toFixed(3)}`,
        );
      }
      // P9: a write a lease-checked guard ran with no round trip starts
      // while its tenure's entry is still the key's last on the leader,
      // unless an operator (or a bucket deletion) removed it within the
      // TTL before, which that mode notices only at the next renewal (and
      // likewise a renewal carried across a lost tail: see `carried`).
      if (!returned) {
        const last = kv.last(kv.subject(key));
        const since = t - 1.1 * ttl / (1 - plan.clockEpsilon);
        if (
          !(last && tenureWrite(last, m.label, lease.epoch)) &&
          !disturbances.some((d) =>
            d.t1 >= since &&
            (d.scope === "all" || (d.scope === "key" && d.who === key))
          )
        ) {
          violate(
            "P9",
            key,
            `write #${id} of ${m.label} (epoch ${lease.epoch}) started with no round trip at ${
              t.toFixed(3)
            }, deadline ${
              node.trueOf(lease.deadline).toFixed(3)
            }, but the key's last message is ${
              last
                ? `${last.writer}'s @${last.seq} (${
                  last.marker ?? last.operation ?? "put"
                })`
                : "none"
            }`,
          );
        }
      }
      // Another lease-checked guard just before the deadline (in its clock).
      if (lease && !hug && plan.hugs > 0 && rCheck.chance(plan.hugs)) {
        const margin = 2 * plan.epsilon * ttl;
        const at = lease.deadline - rCheck.between(0, 3 * margin);
        node.after(
          () => {
            if (live(m)) {
              guard(m, key, "careful", rCheck.between(0, ttl / 50), true);
            }
          },
          Math.max(0, at - node.local()),
          "timer",
        );
      }
      // With a caller's signal (a waiting guard), `lease.signal` follows the
      // tenure only while the write runs, so it cannot tell when the tenure
      // ends; the guards without one track it.
      if (!options?.signal) watch(m, key, lease.signal, lease.epoch);
      const finish = () => {
        rec.checkAt = sched.now;
        if (kind === "careful") {
          try {
            lease.throwIfLost();
          } catch (err) {
            rec.reason = `${(err as Error).name}: ${(err as Error).message}`;
            sawDefunct(m, err);
            trace.add(
              sched.now,
              key,
              m.label,
              () => `write #${id} refused at its commit point: ${rec.reason}`,
            );
            return;
          }
        }
        rec.committed = true;
        rec.commit = sched.now;
        rec.commitLocal = node.local();
        rec.commitDeadline = lease.deadline;
        trace.add(
          sched.now,
          key,
          m.label,
          () =>
            `write #${id} commits (${kind}, epoch ${lease.epoch}, started ${
              t.toFixed(3)
            }, deadline ${node.trueOf(lease.deadline).toFixed(3)})`,
        );
        if (kind === "careful" && !(rec.commitLocal < lease.deadline)) {
          violate(
            "P3",
            key,
            `careful write #${id} of ${m.label} passed throwIfLost() at its clock ${
              rec.commitLocal.toFixed(3)
            }, not before its deadline ${lease.deadline.toFixed(3)}`,
          );
        }
      };
      if (kind === "escape") {
        node.after(finish, duration, "io");
        return;
      }
      return new Promise<void>((resolve) =>
        node.after(
          () => {
            finish();
            resolve();
          },
          duration,
          "io",
        )
      );
    }, options).then(
      () => {
        call.t1 = sched.now;
      },
      (err: Error) => {
        call.t1 = sched.now;
        sawDefunct(m, err);
        trace.add(
          sched.now,
          key,
          m.label,
          () => `guard #${id} rejected: ${err.name}: ${err.message}`,
        );
      },
    );
    returned = true;
  };

  const duration = (): number => {
    const x = rWork.next();
    let acc = 0;
    for (const [p, lo, hi] of DURATIONS) {
      acc += p;
      if (x < acc) return rWork.between(lo * ttl, hi * ttl);
    }
    return rWork.between(0, ttl / 20);
  };

  function workload(m: Mgr): void {
    const tick = () => {
      if (!live(m)) return;
      // During a liveness episode the watched key has its own cadence.
      const choices = episode && quiet
        ? keys.filter((k) => k !== episode!.key)
        : keys;
      if (choices.length > 0) {
        const kind: WriteKind = rWork.chance(plan.blindShare)
          ? plan.blindKind
          : "careful";
        guard(m, rWork.pick(choices), kind, duration());
      }
      m.node.after(tick, rWork.exp(plan.guardEvery), "timer");
    };
    m.node.after(tick, rWork.exp(plan.guardEvery), "timer");
    if (plan.releaseEvery > 0) {
      const rel = () => {
        if (!live(m)) return;
        if (!quiet) {
          const key = rWork.pick(keys);
          const t0 = sched.now;
          releases.push({ mgr: m.label, key, t: t0 });
          trace.add(t0, key, m.label, () => `release() called`);
          m.mgr.release(key).then(
            () => {
              givenUp.push({ mgr: m.label, key, called: t0, t: sched.now });
              trace.add(sched.now, key, m.label, () => `release() done`);
            },
            (err: Error) =>
              trace.add(
                sched.now,
                key,
                m.label,
                () => `release() failed: ${err.message}`,
              ),
          );
        }
        m.node.after(rel, rWork.exp(plan.releaseEvery), "timer");
      };
      m.node.after(rel, rWork.exp(plan.releaseEvery), "timer");
    }
  }

  // ---- Faults that come from outside the processes.
  const pick = (list: Mgr[]): Mgr | undefined =>
    list.length > 0 ? rFault.pick(list) : undefined;

  if (plan.pauseEvery > 0) {
    const next = () => {
      sched.at(sched.now + rFault.exp(plan.pauseEvery / plan.managers), () => {
        const m = pick(mgrs.filter((m) => !m.node.dead));
        const len = pauseLength();
        if (m && !quiet) m.node.pause(sched.now + len);
        next();
      }, { pure: true });
    };
    next();
  }

  if (plan.operatorEvery > 0) {
    const next = () => {
      sched.at(sched.now + rFault.exp(plan.operatorEvery), () => {
        const key = rFault.pick(keys);
        const purge = rFault.next() < plan.purgeShare;
        const n = plan.bursts && rFault.chance(0.5) ? 3 + rFault.int(4) : 1;
        let t = sched.now;
        for (let i = 0; i < n; i++) {
          const p = (i === 0 ? purge : rFault.chance(0.5)) && !plan.markers;
          sched.at(t, () => {
            if (quiet) return;
            disturbances.push({
              scope: "key",
              who: key,
              t0: sched.now,
              t1: sched.now,
              why: p ? "purge" : "delete",
            });
            if (p) kv.operatorPurge(key);
            else kv.operatorDelete(key);
          }, { pure: true });
          t += rFault.between(0.5, 5);
        }
        next();
      }, { pure: true });
    };
    next();
  }

  if (plan.markerEdit !== undefined) {
    const kind = plan.markerEdit;
    sched.at(plan.markerEditAt * plan.duration, () => kv.editMarkers(kind), {
      pure: true,
    });
  }

  if (plan.recreate) {
    const td = rFault.between(0.2, 0.6) * plan.duration;
    // The gap outlasts every deadline vouched before the deletion.
    const gap = ttl / (1 - epsilon) + rFault.between(1, ttl);
    sched.at(td, () => {
      disturbances.push({
        scope: "all",
        who: "bucket",
        t0: td,
        t1: Infinity,
        why: "bucket deleted",
      });
      kv.deleteBucket();
    }, { pure: true });
    sched.at(td + gap, () => kv.createBucket(), { pure: true });
  }

  // A server restart that loses its last acknowledged messages (point 10
  // of lease.ts; durability in its header): every connection drops and
  // comes back to another server process.
  function restartServer(lose?: number): void {
    if (quiet || kv.gone || restarted) return;
    restarted = true;
    {
      const t = sched.now;
      let k = lose ?? plan.lostTail;
      if (plan.coverAcquire) {
        // Back to (and over) the latest acquire still in reach: a holder
        // whose tenure the server forgets, renewals and all. With
        // coverCreation, the latest one that created its key, when one is
        // in reach: its holder's key is then left with no entry at all.
        const acquires = kv.recent().filter((e) =>
          /^lease:[^:]+:0:/.test(e.msgId ?? "")
        );
        const acq = (plan.coverCreation
          ? acquires.find((e) =>
            kv.createdKey(e)
          )
          : undefined) ?? acquires[0];
        if (acq && lose === undefined) {
          k = kv.tailSeq() - acq.seq + 1 + rRestart.int(2);
        }
      }
      // The tenures leaf clients vouch for now: the restart may take their
      // entries, and nothing tells them.
      const vouched = mgrs.filter((m) => m.node.leaf && !m.node.dead).flatMap(
        (m) =>
          keys.flatMap((key) => {
            const h = leases.get(`${m.label}|${key}`);
            return h && m.node.local() < h.lease.deadline
              ? [{ m, key, ...h }]
              : [];
          }),
      );
      const lost = kv.loseTail(Math.min(k, MAX_LOST));
      const back = t + plan.restartGap;
      const leafBack = back + plan.leafGap;
      const leaves = mgrs.some((m) => m.node.leaf && !m.node.dead);
      disturbances.push({
        scope: "all",
        who: "server",
        t0: t,
        t1: (leaves ? Math.max(back, leafBack) : back) + 2 * plan.maxDelay +
          plan.timeout,
        why: `server restart (lost ${lost.length})`,
      });
      const answers = new Map<string, number>();
      for (const m of mgrs) {
        const jitter = rRestart.between(0, 2 * plan.maxDelay);
        // A leaf client's connection is to the leaf node, which stays up.
        if (m.node.leaf) {
          m.node.hubRestart(leafBack + jitter);
          answers.set(m.label, leafBack + jitter);
        } else m.node.drop(back + jitter, "other");
      }
      restarts.push({ t, back, leafBack: leafBack + 2 * plan.maxDelay });
      for (const v of vouched) {
        // Cut: the key's last message is no put of the tenure now, or a put
        // of it acknowledged to its client is lost (its next renewal then
        // expects a revision the server no longer has).
        const ours = (e: Stored) =>
          e.stamp >= v.acquiredAt && tenureWrite(e, v.m.label, v.lease.epoch);
        const last = kv.last(kv.subject(v.key));
        if (
          last && ours(last) &&
          !lost.some((e) =>
            e.key === v.key && ours(e) &&
            acked.has(`${v.m.label}|${v.key}|${e.seq}`)
          )
        ) continue;
        leafCuts.push({
          mgr: v.m.label,
          key: v.key,
          epoch: v.lease.epoch,
          tenure: v.lease.tenure,
          acquiredAt: v.acquiredAt,
          loss: t,
          leafBack: answers.get(v.m.label)!,
        });
        trace.add(
          t,
          v.key,
          "sim",
          () =>
            `leaf client ${v.m.label}'s tenure (epoch ${v.lease.epoch}) lost its entry or its last acknowledged put; it is told nothing`,
        );
      }
    }
  }
  if (plan.serverRestart && !plan.crossAtRestart) {
    sched.at(plan.restartAt * plan.duration, () => restartServer());
  }

  // Connection blips: one process's connection drops and comes back to the
  // same server process, which lost nothing.
  if (plan.blipEvery > 0) {
    const next = () => {
      sched.at(sched.now + rRestart.exp(plan.blipEvery), () => {
        const up = mgrs.filter((m) => !m.node.dead && !m.node.closed);
        const m = up.length > 0 ? rRestart.pick(up) : undefined;
        const len = rRestart.between(1, ttl / 2);
        if (m && !quiet) {
          disturbances.push({
            scope: "node",
            who: m.label,
            t0: sched.now,
            t1: sched.now + len + plan.timeout,
            why: "connection blip",
          });
          m.node.drop(sched.now + len, "same");
        }
        next();
      });
    };
    next();
  }

  const replace = (m: Mgr) => {
    if (!plan.restart || m.replaced) return;
    m.replaced = true;
    sched.at(sched.now + rFault.between(0, 2 * ttl), () => {
      let label = `${m.label}'`;
      while (nodes.has(label)) label += "'";
      // A process starts only on an existing bucket (createBucket: false).
      const start = () => {
        if (quiet) return;
        if (kv.gone) sched.at(sched.now + ttl, start);
        else addManager(label, m.nodeId);
      };
      start();
    });
  };

  if (plan.crash) {
    sched.at(rFault.between(0.1, 0.9) * plan.duration, () => {
      const m = pick(mgrs.filter((m) => !m.node.dead));
      if (!m || quiet) return;
      m.node.crash();
      replace(m);
    });
  }

  if (plan.connClose) {
    sched.at(rFault.between(0.1, 0.9) * plan.duration, () => {
      const m = pick(mgrs.filter((m) => !m.node.dead));
      if (m && !quiet) m.node.closeConnection();
    });
  }

  if (plan.closeEvery > 0) {
    const next = () => {
      sched.at(sched.now + rFault.exp(plan.closeEvery), () => {
        const m = pick(mgrs.filter(live));
        if (m && !quiet && !m.node.paused) {
          m.closing = true;
          const called = sched.now;
          releases.push({ mgr: m.label, key: undefined, t: sched.now });
          trace.add(sched.now, undefined, m.label, () => `close() called`);
          m.mgr.close().then(
            (r) => {
              givenUp.push({
                mgr: m.label,
                key: undefined,
                called,
                t: sched.now,
              });
              trace.add(
                sched.now,
                undefined,
                m.label,
                () =>
                  `close() done: released [${r.released}], unreleased [${r.unreleased}]`,
              );
              // P7: a closed manager keeps no timer armed.
              if (m.node.armed.size > 0 && !m.node.dead) {
                violate(
                  "P7",
                  undefined,
                  `${m.label}'s close() resolved with ${m.node.armed.size} timer(s) of the manager still armed`,
                );
              }
            },
            (err: Error) =>
              trace.add(
                sched.now,
                undefined,
                m.label,
                () => `close() failed: ${err.message}`,
              ),
          );
          replace(m);
        }
        next();
      });
    };
    next();
  }

  // ---- P5: crash the holder of a key, then a contender must take over.
  const g = ttl / 10;
  if (plan.liveness) {
    sched.at(rFault.between(0.35, 0.5) * plan.duration, () => {
      const candidates = keys.flatMap((key) => {
        const last = kv.last(kv.subject(key));
        const h =
          last && last.operation === undefined && last.marker === undefined
            ? mgrs.find((m) => m.label === last.writer && !m.node.dead)
            : undefined;
        return h ? [{ key, h }] : [];
      });
      // Every process that may act must be running: nothing held back by a
      // pause lands inside the window.
      if (
        candidates.length === 0 ||
        mgrs.some((m) => m.node.paused || m.node.linkDown)
      ) return;
      const { key, h } = rFault.pick(candidates);
      const t = sched.now;
      const maxDelay = plan.maxDelay;
      const bound = (ttl + plan.timeout + 3 * g) / (1 - epsilon) +
        14 * maxDelay;
      episode = {
        t,
        key,
        holder: h.label,
        contender: "c",
        loseReply: rFault.chance(0.5),
        lostReplyUsed: false,
        gone: undefined,
        serverBound: t + maxDelay + ttl + (plan.lateExpiry ? 250 : 0),
        bound,
      };
      episodes.push(episode);
      const ep = episode;
      quiet = true;
      trace.add(
        t,
        key,
        "sim",
        () =>
          `liveness episode: crash holder ${h.label}; contender c and every live manager guard every ${g} ms; no faults`,
      );
      h.node.crash();
      kv.onChange = (k, e) => {
        if (k === key && ep.gone === undefined && e?.writer !== h.label) {
          ep.gone = sched.now;
        }
      };
      const c = addManager("c", "nc");
      const until = ep.serverBound + bound + 2 * ttl;
      for (const m of mgrs.filter(live)) {
        const tick = () => {
          if (!live(m) || sched.now > until) return;
          guard(m, key, "careful", rWork.between(0, ttl / 50));
          m.node.after(tick, g, "timer");
        };
        if (m === c) tick();
        else m.node.after(tick, rWork.between(0, g), "timer");
      }
      sched.at(until, () => {
        quiet = false;
        kv.onChange = undefined;
      });
    });
  }

  for (let i = 0; i < plan.managers; i++) addManager(`m${i + 1}`, `n${i + 1}`);

  await sched.run(plan.duration);

  const history: History = {
    plan,
    writes,
    log: kv.log,
    lifecycle: kv.lifecycle,
    nodes,
    disturbances,
    releases,
    episodes,
    guardCalls,
    givenUp,
    tenures,
    losses: kv.losses,
    defunct,
    lost: kv.lost,
    restarts,
    leafCuts,
    carried,
    proofs,
    ends,
  };
  const checked = check(history);
  violations.push(...checked.violations);
  violations.sort((a, b) => a.t - b.t);
  return {
    seed,
    plan,
    violations,
    steps: sched.steps,
    writes: writes.length,
    commits: writes.filter((w) => w.committed).length,
    fencedOverlaps: checked.fencedOverlaps,
    orphans: checked.orphans,
    leafResidue: { ...checked.leafResidue, carried: carried.length },
    leafNotice: checked.leafNotice,
    leafOverlaps: checked.leafOverlaps,
    leafCuts: leafCuts.length,
    proofs: proofs.length,
    takeovers: episodes.map((ep) => ({
      crash: ep.t,
      gone: ep.gone,
      next: writes.find((w) =>
        w.key === ep.key && w.mgr !== ep.holder && w.start >= ep.t
      )?.start,
      limit: ep.gone === undefined ? undefined : ep.gone + ep.bound,
    })),
    trace,
  };
}

/**
 * A request's fate from a uniform draw `x`, by the history's shares of lost
 * requests, lost replies and late replies.
 */
export function drawFate(
  x: number,
  p: Pick<Plan, "lostRequest" | "lostReply" | "lateReply">,
): Fate {
  if (x < p.lostRequest) return "lostRequest";
  if (x < p.lostRequest + p.lostReply) return "lostReply";
  if (x < p.lostRequest + p.lostReply + p.lateReply) return "lateReply";
  return "ok";
}

/** The tag epoch of one of the lease manager's writes (`lease:<instance>:<epoch>:<n>`). */
export function tagEpoch(msgId: string | undefined): number | undefined {
  const m = /^lease:[^:]+:(\d+):\d+$/.exec(msgId ?? "");
  return m ? Number(m[1]) : undefined;
}

/**
 * Whether `e` is a put written by `writer` in its tenure of epoch `epoch`:
 * the put that began it (at revision `epoch`: an acquire, or a renewal sent
 * after the old tenure's deadline) or one tagged with that epoch.
 */
export function tenureWrite(e: Stored, writer: string, epoch: number): boolean {
  if (
    e.writer !== writer || e.operation !== undefined || e.marker !== undefined
  ) {
    return false;
  }
  return e.seq === epoch || tagEpoch(e.msgId) === epoch;
}
