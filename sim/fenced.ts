/**
 * Random histories on a fenced bucket (issue 33): 2-4 managers of the
 * fenced layout (`fencedManagerOnPort`, `lease/fenced.ts`) on the simulated
 * server with the fencing features of 2.15.2, each guarding writes on 1-3
 * keys whose write is a fenced put or an atomic commit of data keys, under
 * the network's and processes' faults: lost and late replies, pauses
 * (some right after a send), partitions, connection blips, crashes the
 * server sees at once or never, `close()`, `release()`, an operator's
 * deletes of tenure and session entries, and writes that stall inside
 * their lease. Not here: a server that loses acknowledged writes (F6, a
 * residue of the layout) and bucket deletion.
 *
 * What is checked, on what the server stored, never on the managers' word:
 * - **PF** (`checkPF`): no fenced write of a tenure is stored after a later
 *   tenure of its key began;
 * - **PF0**: every stored data write carries a fence on its key's tenure
 *   entry (a write the lease sends unfenced would escape PF);
 * - **PR**: a fenced write is refused only once its tenure's entry has
 *   moved on (a fence on the wrong subject or revision refuses a holder);
 * - **P3**: no write starts while its lease's `throwIfLost()` throws;
 * - **P7**: a closed manager keeps no timer of its own (or its session's)
 *   armed;
 * - **P5F** (a liveness episode in some histories): once a holder crashes
 *   and every other fault stops, another manager (a new one waits for the
 *   key, beside those already waiting) starts a write under a lease of
 *   its key within a bound: a few session checks after a crash the server sees,
 *   one TTL of its session (rounded up to seconds) and the server's
 *   lateness after one it does not.
 *
 * @module
 */

import process from "node:process";
import { fencedManagerOnPort } from "../lease/fenced.ts";
import type { Manager } from "../lease/manager.ts";
import { BucketGone } from "../lease/port.ts";
import { ReplyTrust } from "../lease/trust.ts";
import type { Lease } from "../lease/types.ts";
import { checkPF } from "./check.ts";
import { type KvFlaw, SimKv } from "../testing/kv.ts";
import {
  type Fate,
  type Network,
  responderStopped,
  SimNode,
} from "../testing/node.ts";
import { stream } from "./random.ts";
import { Scheduler } from "../testing/scheduler.ts";
import { Trace } from "../testing/trace.ts";
import { drawFate, type Violation } from "./world.ts";

/** Everything a seed decides before a fenced history starts. */
export interface FencedPlan {
  ttl: number;
  managers: number;
  keys: number;
  maxDelay: number;
  markerTTL: number;
  lateExpiry: boolean;
  lostRequest: number;
  lostReply: number;
  lateReply: number;
  /** Mean time between pauses of one process, ms (0: none). */
  pauseEvery: number;
  pauseOnSend: number;
  /** Probability that a write's reply starts a partition of its process. */
  partitions: number;
  /** Mean time between connection blips, ms (0: none). */
  blipEvery: number;
  /** Mean time between operator deletes of a tenure or session entry, ms (0: none). */
  operatorEvery: number;
  crash: boolean;
  /** The server sees the crash at once (a killed process) or never (a lost host). */
  crashSeen: boolean;
  closeEvery: number;
  releaseEvery: number;
  guardEvery: number;
  waitShare: number;
  leaseShare: number;
  /** Share of writes that stall up to 2 TTLs before writing. */
  stallShare: number;
  /** Share of writes that commit two data keys at once. */
  commitShare: number;
  /** A liveness episode (P5F) at the middle of the history. */
  liveness: boolean;
  /** History length, ms. */
  duration: number;
}

/** What a fenced history found. */
export interface FencedResult {
  readonly seed: number;
  readonly plan: FencedPlan;
  readonly violations: readonly Violation[];
  /** Fenced writes the server stored, and those it refused. */
  readonly stored: number;
  readonly refused: number;
  /** Takeovers by how the key was found (`crashed`, `session-ended`, ...). */
  readonly found: Readonly<Record<string, number>>;
  /** The liveness episode: ms from the crash to the contender's stored write. */
  readonly takeover: { ms: number | undefined; bound: number } | undefined;
  readonly trace: Trace;
}

/** Draws the plan of fenced history `seed`. */
export function makeFencedPlan(
  seed: number,
  override: Partial<FencedPlan> = {},
): FencedPlan {
  const r = stream(seed, "fencedplan");
  const on = () => r.chance(0.5);
  const ttl = r.pick([1000, 2000]);
  const plan: FencedPlan = {
    ttl,
    managers: 2 + r.int(3),
    keys: 1 + r.int(3),
    maxDelay: r.pick([1, 5, 20]),
    markerTTL: r.pick([1000, 5000]),
    lateExpiry: on(),
    lostRequest: on() ? r.between(0.003, 0.05) : 0,
    lostReply: on() ? r.between(0.003, 0.05) : 0,
    lateReply: on() ? r.between(0.003, 0.05) : 0,
    pauseEvery: on() ? r.between(2, 8) * ttl : 0,
    pauseOnSend: r.between(0, 0.02),
    partitions: on() ? r.between(0.002, 0.02) : 0,
    blipEvery: on() ? r.between(2, 8) * ttl : 0,
    operatorEvery: on() ? r.between(2, 8) * ttl : 0,
    crash: r.chance(0.3),
    crashSeen: on(),
    closeEvery: r.chance(0.3) ? r.between(3, 12) * ttl : 0,
    releaseEvery: on() ? r.between(0.5, 4) * ttl : 0,
    guardEvery: r.between(0.05, 0.5) * ttl,
    waitShare: on() ? r.between(0.1, 0.6) : 0,
    leaseShare: on() ? r.between(0.3, 1) : 0,
    stallShare: on() ? r.between(0.02, 0.2) : 0,
    commitShare: on() ? r.between(0.1, 0.5) : 0,
    liveness: r.chance(0.3),
    duration: 12 * ttl,
  };
  return Object.assign(plan, override);
}

/** How long a session check and its round trips may take, at most. */
const CHECKS = 4 * 25;

/**
 * Runs fenced history `seed`.
 *
 * @param seed The seed.
 * @param options A trace, and changes to the drawn plan.
 * @returns What it found.
 */
export async function runFencedHistory(
  seed: number,
  options: {
    trace?: boolean;
    override?: Partial<FencedPlan>;
    /** A deliberate bug of the simulated server, to show the checks catch it. */
    flaw?: KvFlaw;
  } = {},
): Promise<FencedResult> {
  const plan = makeFencedPlan(seed, options.override);
  const { ttl } = plan;
  const sched = new Scheduler();
  const trace = new Trace(options.trace ?? false);
  const rNet = stream(seed, "fnet");
  const rFault = stream(seed, "ffaults");
  const rWork = stream(seed, "fwork");
  const rLate = stream(seed, "flate");
  const kv = new SimKv(sched, trace, "fb", {
    maxAge: 0,
    markers: true,
    markerTTL: plan.markerTTL,
    late: () => plan.lateExpiry ? rLate.between(0, 250) : 0,
    lags: [0],
    msgTTL: true,
    atomic: true,
    ...(options.flaw !== undefined ? { flaw: options.flaw } : {}),
  });
  const keys = Array.from({ length: plan.keys }, (_, i) => `k${i + 1}`);
  const violations: Violation[] = [];
  const violate = (property: string, key: string | undefined, m: string) => {
    violations.push({ property, t: sched.now, key, message: m });
    trace.add(sched.now, key, "CHECK", () => `${property} VIOLATED: ${m}`);
  };
  let quiet = false;
  const net: Network = {
    delay: () => rNet.between(0.05, plan.maxDelay),
    fate(): Fate {
      const x = rNet.next();
      return quiet ? "ok" : drawFate(x, plan);
    },
    lateBy: () => rNet.between(1, ttl),
    timerLate: () => rNet.next(),
    replica: () => 0,
    freeze: rFault.chance(0.5),
    timersFirst: rFault.chance(0.5),
    sent(node) {
      if (plan.pauseEvery > 0 && !quiet && rFault.chance(plan.pauseOnSend)) {
        const len = pauseLength();
        sched.at(sched.now, () => {
          if (!quiet) node.pause(sched.now + len);
        }, { pure: true });
      }
    },
    replied(node) {
      if (plan.partitions > 0 && !quiet && rFault.chance(plan.partitions)) {
        node.partition(sched.now + rFault.between(0.3, 2) * ttl);
      }
    },
    disturbed() {},
    crossedReply: () => rNet.chance(0.5),
    crashSeen: () => plan.crashSeen,
  };
  const pauseLength = (): number => {
    const x = rFault.next();
    return x < 0.5
      ? rFault.between(1, ttl / 5)
      : x < 0.8
      ? rFault.between(ttl / 5, ttl)
      : rFault.between(ttl, 3 * ttl);
  };

  interface Mgr {
    readonly label: string;
    readonly node: SimNode;
    mgr: Manager | undefined;
    closing: boolean;
  }
  const mgrs: Mgr[] = [];
  const found: Record<string, number> = {};
  /** Why the server stopped hearing each process, when (drops, crashes). */
  const cut: { label: string; t0: number; t1: number }[] = [];
  // PT: a key is taken from another holder's tenure entry only when the
  // session it names is over, at the server or at its owner (which then
  // stops answering its probes), or its process's connection was gone (a
  // crash, a close, a drop) within the last TTL: never from a live,
  // connected holder.
  kv.onWrite = (e, replaced) => {
    if (
      !e.key.startsWith("_lease.k.") || e.operation !== undefined ||
      replaced === undefined || replaced.operation !== undefined ||
      replaced.marker !== undefined
    ) return;
    const session = /^lease:([^:]+):/.exec(replaced.msgId ?? "")?.[1];
    if (
      session === undefined ||
      /^lease:([^:]+):/.exec(e.msgId ?? "")?.[1] === session
    ) {
      return;
    }
    const entry = kv.last(`$KV.fb._lease.s.${session}`);
    if (
      entry === undefined || entry.operation !== undefined ||
      entry.marker !== undefined
    ) return;
    const label = session.replace(/i\d+$/, "").replaceAll("r", "'");
    const node = mgrs.find((m) => m.label === label)?.node;
    const gone = node === undefined || node.dead || node.closed ||
      node.linkDown || responderStopped(kv, `$LEASE.fb.probe.${session}`) ||
      cut.some((c) => c.label === label && c.t1 >= sched.now - ttl);
    if (!gone) {
      violate(
        "PT",
        e.key.slice("_lease.k.".length),
        `${e.writer} took the key @${e.seq} from ${replaced.writer}'s tenure @${replaced.seq}, whose session ${session} is live at the server and connected`,
      );
    }
  };
  let stored = 0;
  let refused = 0;
  /** Guarded writes as they started: who, on which key, when. */
  const starts: { mgr: string; key: string; t: number }[] = [];
  let writeIds = 0;
  const live = (m: Mgr) => !m.node.dead && !m.closing && m.mgr !== undefined;

  const addManager = (label: string, after?: (m: Mgr) => void): Mgr => {
    const node = new SimNode(
      sched,
      kv,
      net,
      trace,
      label,
      1 + (rFault.next() * 2 - 1) * 1e-3,
      rFault.between(0, 1e6),
      { BucketGone, ReplyTrust },
      ttl,
    );
    const m: Mgr = { label, node, mgr: undefined, closing: false };
    mgrs.push(m);
    fencedManagerOnPort(node.port, {
      node: label,
      ttl,
      timeout: ttl / 4,
      bucket: "fb",
      restartGrace: true,
      settleTimeout: ttl,
      idleRelease: undefined,
      markerLife: 0,
      signal: undefined,
    }).then((mgr) => {
      m.mgr = mgr;
      mgr.addEventListener("acquired", (e) => {
        const f = (e as Event & { found: string }).found;
        found[f] = (found[f] ?? 0) + 1;
      });
      trace.add(sched.now, undefined, label, () => "manager started");
      if (after) after(m);
      else workload(m);
    }, (err: Error) => {
      trace.add(sched.now, undefined, label, () => `no start: ${err.message}`);
      // A session that could not be opened (a lost reply): try again.
      if (!node.dead && !node.closed) {
        sched.at(sched.now + ttl / 3, () => {
          mgrs.splice(mgrs.indexOf(m), 1);
          addManager(label, after);
        }, { pure: true });
      }
    });
    return m;
  };

  // A guarded write: a fenced put (or a commit of two data keys), maybe
  // after a stall inside the lease.
  const guard = (m: Mgr, key: string, wait: boolean): Promise<boolean> => {
    const node = m.node;
    const id = ++writeIds;
    const check = rWork.chance(plan.leaseShare) ? "lease" as const : "cas";
    let options: { wait?: true; signal?: AbortSignal; check: typeof check } = {
      check,
    };
    let writing = false;
    if (wait) {
      const ac = new AbortController();
      node.after(
        () => {
          if (!writing) ac.abort(new Error("gave up waiting"));
        },
        rWork.between(0.5, 4) * ttl,
        "timer",
      );
      options = { ...options, wait: true, signal: ac.signal };
    }
    const stall = rWork.chance(plan.stallShare)
      ? rWork.between(0, 2 * ttl)
      : rWork.between(0, ttl / 50);
    const commit = rWork.chance(plan.commitShare);
    return m.mgr!.guard(key, async (lease: Lease) => {
      writing = true;
      starts.push({ mgr: m.label, key, t: sched.now });
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
      if (!(node.local() < lease.deadline)) {
        violate(
          "P3",
          key,
          `write #${id} of ${m.label} started past its deadline`,
        );
      }
      await new Promise<void>((r) => node.after(r, stall, "io"));
      const fenced = lease;
      const value = `${m.label}:${lease.epoch}:${id}`;
      try {
        if (commit) {
          await fenced.commit([
            { put: `d.${key}`, value },
            { put: `d.${key}.b`, value },
          ]);
        } else await fenced.put(`d.${key}`, value);
        stored++;
        trace.add(sched.now, key, m.label, () => `write #${id} stored`);
        return true;
      } catch (err) {
        // Refused by the server (not before sending: a lease no longer
        // vouched for sends nothing).
        if (/the server refused/.test((err as Error).message)) {
          refused++;
          // PR: refused only once the tenure is over at the server (its
          // entry only moves on, so one still at the epoch now was then).
          const t = kv.last(`$KV.fb._lease.k.${key}`);
          if (
            t !== undefined && t.seq === lease.epoch &&
            t.operation === undefined && t.marker === undefined
          ) {
            violate(
              "PR",
              key,
              `write #${id} of ${m.label} was refused while its tenure's entry is still @${lease.epoch}`,
            );
          }
        }
        trace.add(
          sched.now,
          key,
          m.label,
          () => `write #${id} not stored: ${(err as Error).message}`,
        );
        return false;
      }
    }, options).catch((err: Error) => {
      trace.add(
        sched.now,
        key,
        m.label,
        () => `guard #${id} rejected: ${err.name}: ${err.message}`,
      );
      return false;
    });
  };

  function workload(m: Mgr): void {
    const tick = () => {
      if (!live(m) || quiet) return;
      void guard(m, rWork.pick(keys), rWork.chance(plan.waitShare));
      m.node.after(tick, rWork.exp(plan.guardEvery), "timer");
    };
    m.node.after(tick, rWork.exp(plan.guardEvery), "timer");
    if (plan.releaseEvery > 0) {
      const rel = () => {
        if (!live(m) || quiet) return;
        void m.mgr!.release(rWork.pick(keys));
        m.node.after(rel, rWork.exp(plan.releaseEvery), "timer");
      };
      m.node.after(rel, rWork.exp(plan.releaseEvery), "timer");
    }
  }

  const every = (mean: number, fn: () => void) => {
    if (mean <= 0) return;
    const next = () => {
      sched.at(sched.now + rFault.exp(mean), () => {
        if (!quiet) fn();
        next();
      }, { pure: true });
    };
    next();
  };
  const anyUp = () => {
    const up = mgrs.filter((m) => !m.node.dead && !m.node.closed);
    return up.length > 0 ? rFault.pick(up) : undefined;
  };
  every(plan.pauseEvery / plan.managers, () => {
    anyUp()?.node.pause(sched.now + pauseLength());
  });
  every(plan.blipEvery, () => {
    const m = anyUp();
    if (m === undefined) return;
    const until = sched.now + rFault.between(1, ttl / 2);
    cut.push({ label: m.label, t0: sched.now, t1: until });
    m.node.drop(until, "same");
  });
  every(plan.operatorEvery, () => {
    // An operator's delete of a tenure entry, or of a session's entry.
    if (rFault.chance(0.5)) kv.operatorDelete(`_lease.k.${rFault.pick(keys)}`);
    else {
      const s = [...kv.log].reverse().find((e) =>
        e.key.startsWith("_lease.s.") && e.operation === undefined &&
        e.marker === undefined
      );
      if (s) kv.operatorDelete(s.key);
    }
  });
  every(plan.closeEvery, () => {
    const m = mgrs.filter(live);
    if (m.length === 0) return;
    const c = rFault.pick(m);
    if (c.node.paused) return;
    c.closing = true;
    c.mgr!.close().then(() => {
      if (c.node.armed.size > 0 && !c.node.dead) {
        violate(
          "P7",
          undefined,
          `${c.label}'s close() resolved with ${c.node.armed.size} timer(s) still armed`,
        );
      }
    });
  });
  if (plan.crash) {
    sched.at(rFault.between(0.1, 0.9) * plan.duration, () => {
      if (quiet) return;
      const up = mgrs.filter((m) => !m.node.dead);
      if (up.length > 0) rFault.pick(up).node.crash();
    }, { pure: true });
  }

  // P5F: crash a key's holder; a waiting contender must store a write.
  let takeover: FencedResult["takeover"];
  if (plan.liveness) {
    sched.at(0.5 * plan.duration, () => {
      const holders = keys.flatMap((key) => {
        const e = kv.last(`$KV.fb._lease.k.${key}`);
        const h = e && e.operation === undefined && e.marker === undefined
          ? mgrs.find((m) => m.label === e.writer && live(m))
          : undefined;
        return h ? [{ key, h }] : [];
      });
      if (
        holders.length === 0 ||
        mgrs.some((m) => m.node.paused || m.node.linkDown || m.node.partitioned)
      ) return;
      const { key, h } = rFault.pick(holders);
      quiet = true;
      const t = sched.now;
      const bound = plan.crashSeen
        ? CHECKS + 20 * plan.maxDelay + ttl / 4
        : Math.ceil(ttl / 1000) * 1000 + 250 + CHECKS + 20 * plan.maxDelay +
          ttl / 4;
      takeover = { ms: undefined, bound };
      trace.add(t, key, "sim", () => `liveness: crash ${h.label}`);
      h.node.crash();
      addManager("c", (c) => {
        const attempt = () => {
          if (sched.now > t + bound + ttl) return;
          void guard(c, key, true).then((ok) => {
            if (!ok) attempt();
          });
        };
        attempt();
      });
      sched.at(t + bound + 2 * ttl, () => {
        const first = starts.find((w) =>
          w.key === key && w.mgr !== h.label && w.t >= t
        );
        takeover!.ms = first === undefined ? undefined : first.t - t;
        if (takeover!.ms === undefined || takeover!.ms > bound) {
          violate(
            "P5F",
            key,
            `no write by a contender within ${
              bound.toFixed(0)
            } ms of ${h.label}'s crash (${
              plan.crashSeen ? "seen" : "unseen"
            } by the server): ${takeover!.ms?.toFixed(1) ?? "none"}`,
          );
        }
      }, { pure: true });
    }, { pure: true });
  }

  for (let i = 0; i < plan.managers; i++) addManager(`m${i + 1}`);
  await sched.run(plan.duration + (plan.liveness ? 4 * ttl + 1000 : 0));

  // PF, and PF0: every data write fenced by its key's tenure entry.
  violations.push(...checkPF(kv.log));
  for (const e of kv.log) {
    if (!e.key.startsWith("d.")) continue;
    const key = e.key.slice(2).replace(/\.b$/, "");
    const fences = e.batch !== undefined
      ? (e.batchFences ?? []).map((f) => f.subject)
      : [e.expectSubject];
    if (!fences.every((s) => s === `$KV.fb._lease.k.${key}`)) {
      violations.push({
        property: "PF0",
        t: e.stamp,
        key,
        message: `${e.writer}'s data write @${e.seq} is fenced by ${
          fences.join(", ") || "nothing"
        }, not the key's tenure entry`,
      });
    }
  }
  violations.sort((a, b) => a.t - b.t);
  return { seed, plan, violations, stored, refused, found, takeover, trace };
}

/** What a batch of fenced histories found. */
export interface FencedBatch {
  readonly histories: number;
  readonly failed: number;
  /** The first failing history. */
  readonly first: FencedResult | undefined;
  readonly stored: number;
  readonly refused: number;
  readonly found: Readonly<Record<string, number>>;
  /** The slowest liveness takeover, ms, and its bound. */
  readonly slowest: { ms: number; bound: number } | undefined;
}

/**
 * Runs fenced histories `from` .. `from + seeds - 1`, to the first failure
 * when `stop`.
 *
 * @param o Which seeds, the server's flaw if any, and whether to stop.
 * @returns What they found.
 */
export async function runFencedBatch(
  o: { from?: number; seeds: number; flaw?: KvFlaw; stop?: boolean },
): Promise<FencedBatch> {
  const from = o.from ?? 0;
  let failed = 0;
  let first: FencedResult | undefined;
  let stored = 0;
  let refused = 0;
  const found: Record<string, number> = {};
  let slowest: FencedBatch["slowest"];
  let n = 0;
  for (let seed = from; seed < from + o.seeds; seed++) {
    n++;
    const r = await runFencedHistory(
      seed,
      o.flaw !== undefined ? { flaw: o.flaw } : {},
    );
    stored += r.stored;
    refused += r.refused;
    for (const [k, v] of Object.entries(r.found)) {
      found[k] = (found[k] ?? 0) + v;
    }
    const ms = r.takeover?.ms;
    if (ms !== undefined && (slowest === undefined || ms > slowest.ms)) {
      slowest = { ms, bound: r.takeover!.bound };
    }
    if (r.violations.length > 0) {
      failed++;
      first ??= r;
      if (o.stop) break;
    }
  }
  return { histories: n, failed, first, stored, refused, found, slowest };
}

/** One line about a batch. */
export function fencedSummary(b: FencedBatch, what: string): string {
  const found = Object.entries(b.found).sort().map(([k, v]) => `${k} ${v}`)
    .join(", ");
  return `${what}: ${b.histories} histories, ${b.failed} failed; fenced writes stored ${b.stored}, refused ${b.refused}; takeovers: ${found}${
    b.slowest === undefined
      ? ""
      : `; slowest liveness takeover ${b.slowest.ms.toFixed(1)} ms (bound ${
        b.slowest.bound.toFixed(0)
      } ms)`
  }`;
}

const FENCED_USAGE =
  `usage: sim/fenced.ts [--seeds N] [--from S] [--flaw FLAW] [--stop] [--trace SEED]`;

async function fencedMain(argv: string[]): Promise<number> {
  let seeds = 1000;
  let from = 0;
  let flaw: KvFlaw | undefined;
  let stop = false;
  let trace: number | undefined;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const v = () => {
      const x = argv[++i];
      if (x === undefined) throw new RangeError(`${a} needs a value`);
      return x;
    };
    if (a === "--seeds") seeds = Number(v());
    else if (a === "--from") from = Number(v());
    else if (a === "--flaw") flaw = v() as KvFlaw;
    else if (a === "--stop") stop = true;
    else if (a === "--trace") trace = Number(v());
    else {
      console.error(FENCED_USAGE);
      return 2;
    }
  }
  if (trace !== undefined) {
    const r = await runFencedHistory(trace, {
      trace: true,
      ...(flaw !== undefined ? { flaw } : {}),
    });
    console.log(JSON.stringify(r.plan));
    console.log(r.trace.format(undefined, Infinity));
    for (const v of r.violations) console.log(`${v.property}: ${v.message}`);
    return r.violations.length > 0 ? 1 : 0;
  }
  const b = await runFencedBatch({
    from,
    seeds,
    stop,
    ...(flaw !== undefined ? { flaw } : {}),
  });
  if (b.first) {
    for (const v of b.first.violations.slice(0, 5)) {
      console.log(`seed ${b.first.seed}: ${v.property}: ${v.message}`);
    }
  }
  console.log(
    fencedSummary(
      b,
      `sim fenced from seed ${from}${flaw ? ` on a server with ${flaw}` : ""}`,
    ),
  );
  return b.failed > 0 ? 1 : 0;
}

if (import.meta.main ?? process.argv[1]?.endsWith("fenced.ts")) {
  fencedMain(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err) => {
      console.error(err);
      process.exit(2);
    },
  );
}
