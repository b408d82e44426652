/**
 * The properties checked on every history, over what the workload saw
 * (guarded writes, in true time) and what the simulated server applied. P3
 * and P4 are also checked while the history runs (in `world.ts`), at the
 * instant they concern, and P9 only there; the rest are checked here, after
 * it.
 *
 * Notation: true (virtual) time t; process p's clock reads
 * L_p(t) = offset_p + rate_p·t with |rate_p - 1| <= ε; TTL is the bucket's
 * max age and the lease TTL. A *tenure* is one manager instance's
 * continuous hold of a key, named by its epoch (the revision of the
 * acquiring compare-and-set) in one incarnation of the bucket. Its
 * *vouching bound* at time t is TTL after the send time (its own clock) of
 * the latest compare-and-set of the tenure the server applied before t: the
 * latest deadline the manager could honestly report. The statements, their
 * assumptions and the derivation of P1's allowance are in `README.md`.
 *
 * @module
 */

import { keyOf, type Stored } from "../testing/kv.ts";
import type { SimNode } from "../testing/node.ts";
import {
  type GuardCall,
  type Plan,
  type TenureRec,
  tenureWrite,
  type Violation,
  type WriteRec,
} from "./world.ts";

/** Something that may legitimately cost a manager its lease (for P6). */
export interface Disturbance {
  /** A process (`who` = its label), a key, or everything. */
  readonly scope: "node" | "key" | "all";
  readonly who: string;
  /** True-time interval it covers. */
  readonly t0: number;
  readonly t1: number;
  readonly why: string;
}

/** A liveness episode (P5): the holder crashed at `t`. */
export interface Episode {
  readonly t: number;
  readonly key: string;
  readonly holder: string;
  /** The fresh contender's label. */
  readonly contender: string;
  /** Lose the reply of the contender's first acquiring CAS. */
  readonly loseReply: boolean;
  lostReplyUsed: boolean;
  /** When the holder's last entry stopped being the key's last message. */
  gone: number | undefined;
  /** Latest time the server may take for that: crash + delay + TTL + late. */
  readonly serverBound: number;
  /** Time allowed from `gone` to the next write's start. */
  readonly bound: number;
}

/**
 * An answer that showed a manager that the server lost writes it had
 * acknowledged, on a tenure a restart took writes of (P10): no entry at
 * all in the leader read after its connection came back or in answer to a
 * renewal, either sent before the lease's deadline, or a revision below
 * the one a renewal expected.
 */
export interface Proof {
  readonly mgr: string;
  readonly key: string;
  /** True time the manager got the answer. */
  readonly t: number;
  readonly what: string;
}

/**
 * A tenure of a leaf client (issue 31, point 3) that vouched at a server
 * restart whose lost tail took its entry (the key's last message after it
 * is no put of the tenure) or a put of it acknowledged to the client; the
 * leaf client was told nothing.
 */
export interface LeafCut {
  readonly mgr: string;
  readonly key: string;
  readonly epoch: number;
  /** Its `Lease.tenure`. */
  readonly tenure: string;
  /** True time its acquiring put was applied. */
  readonly acquiredAt: number;
  /** True time of the restart. */
  readonly loss: number;
  /** True time the restarted server answers this leaf client again. */
  readonly leafBack: number;
}

/**
 * A leaf client's renewal carried across a lost tail (nothing told it of
 * the restart) that landed on another tenure's entry at a reused revision.
 */
export interface Carried {
  /** True time it was applied. */
  readonly t: number;
  readonly key: string;
  /** The tenure that renewed (its manager and epoch). */
  readonly by: { readonly mgr: string; readonly epoch: number };
  /** The tenure whose entry it replaced, when that was a manager's put. */
  readonly over: { readonly mgr: string; readonly epoch: number } | undefined;
}

/** Everything a history recorded, for the checks. */
export interface History {
  readonly plan: Plan;
  readonly writes: readonly WriteRec[];
  readonly log: readonly Stored[];
  readonly lifecycle: readonly { t: number; event: "deleted" | "created" }[];
  readonly nodes: ReadonlyMap<string, SimNode>;
  readonly disturbances: readonly Disturbance[];
  readonly releases: readonly {
    mgr: string;
    key: string | undefined;
    t: number;
  }[];
  readonly episodes: readonly Episode[];
  readonly guardCalls: readonly GuardCall[];
  /** release(key) (`key`) and close() (`key` undefined) calls, when they resolved. */
  readonly givenUp: readonly {
    mgr: string;
    key: string | undefined;
    called: number;
    t: number;
  }[];
  readonly tenures: readonly TenureRec[];
  /** Server restarts that lost acknowledged messages (`SimKv.losses`). */
  readonly losses: readonly { t: number; k: number; from: number }[];
  /** Managers that went defunct for writes the server lost, when first seen. */
  readonly defunct: ReadonlyMap<string, number>;
  /** The messages of `log` a restart lost. */
  readonly lost: ReadonlySet<Stored>;
  /** Server restarts that lost messages: when, when back, when back for every leaf client. */
  readonly restarts: readonly { t: number; back: number; leafBack: number }[];
  /** Leaf clients' tenures a restart took the entry of (P10). */
  readonly leafCuts: readonly LeafCut[];
  /** Renewals carried across a lost tail onto another tenure's entry. */
  readonly carried: readonly Carried[];
  /** Answers that showed a manager the server lost its acknowledged writes (P10). */
  readonly proofs: readonly Proof[];
  /** Tenures that ended (the managers' `lost` and `released` events). */
  readonly ends: readonly {
    mgr: string;
    tenure: string;
    t: number;
    reason: string;
  }[];
}

/**
 * P8's allowance past TTL/3 between two renewals of one tenure, on the
 * manager's clock: a renewal slot (TTL/30), a timer's lateness (1 ms) and
 * an operation in flight that the renewal waits for (up to 12 one-way
 * delays: three attempts of a compare-and-set and a read-back).
 *
 * @param ttl The TTL, ms.
 * @param maxDelay The largest one-way delay, ms.
 * @returns The allowance, ms.
 */
export function renewalSlack(ttl: number, maxDelay: number): number {
  return ttl / 30 + 1 + 12 * maxDelay;
}

/**
 * P1's allowance: how far past its vouching bound (true time) the earlier
 * of two overlapping writes must have committed. The successor's first
 * write comes at least TTL (its own clock) after the later of (a) the
 * holder's last applied CAS expiring or being seen standing still for TTL
 * of the successor's clock, or (b) an operator delete, after which it waits
 * two TTLs; see README.md for the derivation.
 *
 * @param ttl The TTL, ms.
 * @param epsilon The clock-rate bound.
 * @returns The allowance, ms.
 */
export function allowance(ttl: number, epsilon: number): number {
  return ttl * (2 / (1 + epsilon) - 1 / (1 - epsilon));
}

/**
 * How long after the restarted server answers a leaf client again (on its
 * clock) the client may still vouch for a tenure whose entry the restart
 * took, as point 10's residue in `lease.ts` bounds it: it notices at its
 * next renewal, "within TTL/3", with P8's allowance for a renewal (a slot,
 * a timer's lateness, an operation in flight). A fault of its own (a
 * pause, a lost request) restarts the count when it ends.
 *
 * @param ttl The TTL, ms.
 * @param maxDelay The largest one-way delay, ms.
 * @returns The bound, ms.
 */
export function leafBound(ttl: number, maxDelay: number): number {
  return ttl / 3 + renewalSlack(ttl, maxDelay);
}

/** Overlaps that P1 allows as point 10's residue for a leaf client, by what vouched for the leaf's write. */
export interface TailResidue {
  /** A blind write begun before the restart (as for any client: only the epoch could fence it). */
  blind: number;
  /** A lease-checked write begun with no round trip on a renewal the restart lost. */
  start: number;
  /** A careful write whose commit check passed on a renewal the restart lost. */
  commit: number;
  /** A write begun on a compare-and-set the restart lost, answered after it. */
  crossed: number;
  /** A renewal that landed on the successor's entry at the reused revision: the two tenures merged. */
  merged: number;
  /**
   * Not an overlap (counted by `world.ts`, and a disturbance of the key for
   * P6 and P9): a leaf client's renewal carried across the lost tail that
   * landed on another tenure's entry at a reused revision.
   */
  carried: number;
}

/** What {@linkcode check} found. */
export interface CheckResult {
  readonly violations: Violation[];
  /**
   * Overlapping committed writes of two tenures that P1 allows (the earlier
   * ran past its deadline by more than the allowance, the later has the
   * greater epoch): what only the epoch fences.
   */
  readonly fencedOverlaps: number;
  /**
   * P7 breaches of finding 4 in README.md (a key state forgotten by a
   * release while its acquire was in flight goes on renewing): reported,
   * not counted as violations while lease.ts has the bug.
   */
  readonly orphans: number;
  /** Overlaps allowed as point 10's residue for leaf clients, by kind. */
  readonly leafResidue: TailResidue;
  /**
   * For each leaf client's tenure a restart took the entry of, with no
   * fault of the client's own in between, how long after the server
   * answered it again the tenure ended (ms of its clock, when later than
   * that; `NaN` when it never ended), and what {@linkcode leafBound}
   * allowed.
   */
  readonly leafNotice: { ms: number; bound: number }[];
  /** The overlaps counted in `leafResidue`, described. */
  readonly leafOverlaps: string[];
}

/**
 * Property PF (`design/fenced.md`, F1), over what the server applied: no
 * data write fenced on tenure E of a key is stored after the write that
 * began a later tenure of that key.
 *
 * The log says which is which. A fenced write is a message whose
 * `Nats-Expected-Last-Subject-Sequence-Subject` names another subject T
 * (the key's tenure entry) and whose expected sequence is E (the epoch). A
 * message sent in a batch is fenced by every such check its batch carried
 * (`Stored.batchFences`, recorded as sent: a server below 2.12 stores the
 * batch's other messages even when the one with the check was refused,
 * and PF reports them). A later tenure of the key began with a put on T
 * after the tenure entry at E (any put on T when E names none there, as 0
 * does). The check reads the headers as sent, whatever the server did
 * with them, so it also judges a server that ignores them (below 2.11) or
 * a model that gets them wrong. A restart that loses the later tenure's
 * acknowledged put still counts it (the log keeps lost messages): the
 * design's residue for servers that lose acknowledged writes, reported,
 * not hidden.
 *
 * @param log Every message the server applied, in order.
 * @returns One violation per fenced write stored too late.
 */
export function checkPF(log: readonly Stored[]): Violation[] {
  const out: Violation[] = [];
  const fenceOf = (e: Stored) =>
    e.expectSubject !== undefined && e.expectSubject !== e.subject &&
      e.expect !== undefined
      ? { tenure: e.expectSubject, epoch: e.expect }
      : undefined;
  const fencesOf = (e: Stored) =>
    e.batch !== undefined
      ? (e.batchFences ?? []).map((f) => ({
        tenure: f.subject,
        epoch: f.epoch,
      }))
      : [fenceOf(e)].filter((f) => f !== undefined);
  // The tenure subjects, and the puts on each, in log order.
  const tenures = new Set<string>();
  for (const e of log) {
    for (const f of fencesOf(e)) tenures.add(`${e.incarnation}|${f.tenure}`);
  }
  const puts = new Map<string, { e: Stored }[]>();
  for (const e of log) {
    const id = `${e.incarnation}|${e.subject}`;
    if (e.operation !== undefined || e.marker !== undefined) continue;
    if (tenures.has(id)) {
      let list = puts.get(id);
      if (!list) puts.set(id, list = []);
      list.push({ e });
    }
    const own = fenceOf(e);
    for (const f of fencesOf(e)) {
      const onT = puts.get(`${e.incarnation}|${f.tenure}`) ?? [];
      let from = -1;
      for (const [i, p] of onT.entries()) if (p.e.seq === f.epoch) from = i;
      const later = onT.slice(from + 1).find((p) => p.e.seq !== f.epoch);
      if (later === undefined) continue;
      out.push({
        property: "PF",
        t: e.stamp,
        key: keyOf(f.tenure),
        message: `${e.writer}'s write @${e.seq} to ${
          keyOf(e.subject)
        }, fenced on tenure ${f.epoch} of ${f.tenure}${
          own === undefined ? ` (by its batch ${e.batch})` : ""
        }, was stored at ${
          e.stamp.toFixed(3)
        }, after @${later.e.seq} by ${later.e.writer} began a later tenure at ${
          later.e.stamp.toFixed(3)
        }`,
      });
    }
  }
  return out;
}

/**
 * Checks P1, P2, P3 (the deadline part), P5, P6, P7, P8 and PF
 * ({@linkcode checkPF}) on a finished history (P7 also checks, as close()
 * resolves, that no timer is armed).
 *
 * @param h The history.
 * @returns The violations found, and how many overlaps only the epoch fences.
 */
export function check(h: History): CheckResult {
  const out: Violation[] = [];
  let fencedOverlaps = 0;
  let orphans = 0;
  const leafResidue: TailResidue = {
    blind: 0,
    start: 0,
    commit: 0,
    crossed: 0,
    merged: 0,
    carried: 0,
  };
  const leafNotice: { ms: number; bound: number }[] = [];
  const leafOverlaps: string[] = [];
  const { ttl, epsilon } = h.plan;
  const v = (
    property: string,
    t: number,
    key: string | undefined,
    message: string,
  ) => out.push({ property, t, key, message });

  // The server's puts per writer, key and incarnation, in order.
  const puts = new Map<string, Stored[]>();
  for (const e of h.log) {
    if (e.operation !== undefined || e.marker !== undefined) continue;
    const id = `${e.writer}|${e.key}|${e.incarnation}`;
    let list = puts.get(id);
    if (!list) puts.set(id, list = []);
    list.push(e);
  }
  /** The vouching bound of `w`'s tenure at true time t, on its clock. */
  const bound = (w: WriteRec, t: number): number | undefined => {
    let best: number | undefined;
    for (const e of puts.get(`${w.mgr}|${w.key}|${w.incarnation}`) ?? []) {
      if (e.stamp > t) break;
      // Only this tenure's puts: after a lost tail, the same manager may
      // begin another tenure at the same revision.
      if (e.stamp < w.acquiredAt) continue;
      if (tenureWrite(e, w.mgr, w.epoch)) {
        best = Math.max(best ?? -Infinity, e.sendLocal! + ttl);
      }
    }
    return best;
  };
  const node = (w: WriteRec) => h.nodes.get(w.mgr)!;

  // ---- Point 10 for leaf clients (issue 31, point 3).
  /** The restart that lost a put of `w`'s tenure, if one did. */
  const lossOf = (w: WriteRec) => {
    let at: { t: number; back: number; leafBack: number } | undefined;
    for (const e of h.lost) {
      if (
        e.key !== w.key || e.incarnation !== w.incarnation ||
        !(e.stamp >= w.acquiredAt) || !tenureWrite(e, w.mgr, w.epoch)
      ) continue;
      const r = h.restarts.find((r) => r.t >= e.stamp);
      if (r && (!at || r.t < at.t)) at = r;
    }
    return at;
  };
  /** The stamp of the newest put of `w`'s tenure applied by true time t. */
  const newestPut = (w: WriteRec, t: number): number => {
    let best = -Infinity;
    for (const e of puts.get(`${w.mgr}|${w.key}|${w.incarnation}`) ?? []) {
      if (e.stamp > t) break;
      if (e.stamp >= w.acquiredAt && tenureWrite(e, w.mgr, w.epoch)) {
        best = e.stamp;
      }
    }
    return best;
  };
  /**
   * The landing of a renewal carried across a lost tail on another
   * tenure's entry at a reused revision (`History.carried`) that `w`'s
   * tenure took part in, by or over, if one did: the two tenures merged
   * (point 10's residue: only `Lease.tenure` tells them apart).
   */
  const mergeOf = (w: WriteRec): Carried | undefined =>
    h.carried.find((c) =>
      c.key === w.key && c.t >= w.acquiredAt &&
      ((c.by.mgr === w.mgr && c.by.epoch === w.epoch) ||
        (c.over?.mgr === w.mgr && c.over.epoch === w.epoch))
    );
  /**
   * Until when (true time) a leaf client may vouch for a tenure the restart
   * at `loss` took the entry of: {@linkcode leafBound} after the server
   * answers its leaf node again, and after each fault of its own that
   * overlaps that.
   */
  const leafEnd = (mgr: string, loss: number, leafBack: number): number => {
    const n = h.nodes.get(mgr)!;
    const b = leafBound(ttl, h.plan.maxDelay);
    let end = n.trueOf(n.local(leafBack) + b);
    for (let changed = true; changed;) {
      changed = false;
      for (const d of h.disturbances) {
        if (d.scope !== "node" || d.who !== mgr || d.t0 > end || d.t1 < loss) {
          continue;
        }
        const e = n.trueOf(n.local(d.t1) + b);
        if (e > end) {
          end = e;
          changed = true;
        }
      }
    }
    return end;
  };
  /**
   * Whether `w`, a leaf client's write, began after a restart that lost a
   * put of its tenure, on the strength of a put from before the restart.
   */
  const leafStale = (w: WriteRec): boolean => {
    if (!node(w).leaf) return false;
    const r = lossOf(w);
    return r !== undefined && w.start >= r.t && newestPut(w, w.start) < r.t;
  };
  /**
   * Whether `w` began after its tenure merged with another at a reused
   * revision (point 10's residue: epochs repeat or go back there): any
   * write of the tenure whose renewal was carried over the other's entry,
   * and the other's until leafBound() after it.
   */
  const mergedLate = (w: WriteRec): boolean => {
    const c = mergeOf(w);
    if (c === undefined || w.start < c.t) return false;
    if (c.by.mgr === w.mgr && c.by.epoch === w.epoch) return true;
    return w.start < leafEnd(w.mgr, c.t, c.t);
  };
  /**
   * Why an overlap of `x`, a leaf client's write, with `y`, begun after the
   * restart, is point 10's residue, if it is: the restart lost a put of
   * x's tenure, and every instant after the restart at which x was vouched
   * for (its start, and a careful write's commit check) came before
   * {@linkcode leafEnd} and rested on a put from before the restart; or
   * x's tenure merged with the successor's at a reused revision.
   */
  const leafResidueOf = (
    x: WriteRec,
    y: WriteRec,
  ): keyof TailResidue | undefined => {
    const c = mergeOf(x);
    if (c?.over !== undefined && c === mergeOf(y)) {
      // The merged tenures side by side: the one merged over until it
      // notices (its next compare-and-set fails), within leafBound().
      const over = c.over!.mgr === x.mgr ? x : y;
      const end = leafEnd(over.mgr, c.t, c.t);
      const late = [
        over.start,
        ...(over.kind === "careful" && over.committed ? [over.commit!] : []),
      ].some((v) => v >= end);
      if (!late) return "merged";
    }
    if (!node(x).leaf) return undefined;
    const r = lossOf(x);
    if (!r || y.start < r.t) return undefined;
    const end = leafEnd(x.mgr, r.t, r.leafBack);
    const moments = [
      x.start,
      ...(x.kind === "careful" && x.committed ? [x.commit!] : []),
    ].filter((v) => v >= r.t);
    if (!moments.every((v) => v < end && newestPut(x, v) < r.t)) {
      return undefined;
    }
    if (x.start < r.t) return moments.length === 0 ? "blind" : "commit";
    return x.fast ? "start" : "crossed";
  };

  // P2 (epoch is a real acquiring revision) and P3 (deadline part).
  for (const w of h.writes) {
    const began = (puts.get(`${w.mgr}|${w.key}|${w.incarnation}`) ?? [])
      .some((e) => e.seq === w.epoch && e.stamp <= w.start);
    if (!began) {
      v(
        "P2",
        w.start,
        w.key,
        `write #${w.id} of ${w.mgr} carries epoch ${w.epoch}, which is no revision ${w.mgr} wrote on this key in bucket incarnation ${w.incarnation}`,
      );
      continue;
    }
    const b = bound(w, w.start);
    if (b === undefined || w.startDeadline > b + 1e-9) {
      v(
        "P3",
        w.start,
        w.key,
        `write #${w.id} of ${w.mgr} started with deadline ${
          w.startDeadline.toFixed(3)
        }, beyond TTL after its tenure's last applied CAS (${b?.toFixed(3)})`,
      );
    }
    if (w.kind === "careful" && w.committed) {
      const bc = bound(w, w.commit!);
      if (bc === undefined || w.commitDeadline! > bc + 1e-9) {
        v(
          "P3",
          w.commit!,
          w.key,
          `careful write #${w.id} of ${w.mgr} committed under deadline ${
            w.commitDeadline!.toFixed(3)
          }, beyond TTL after its tenure's last applied CAS (${
            bc?.toFixed(3)
          })`,
        );
      } else if (!(w.commitLocal! < bc)) {
        v(
          "P3",
          w.commit!,
          w.key,
          `careful write #${w.id} of ${w.mgr} committed at its clock ${
            w.commitLocal!.toFixed(3)
          }, past its tenure's vouching bound ${bc.toFixed(3)}`,
        );
      }
    }
  }

  // Writes per key and incarnation, by start.
  const groups = new Map<string, WriteRec[]>();
  for (const w of h.writes) {
    const id = `${w.key}|${w.incarnation}`;
    let list = groups.get(id);
    if (!list) groups.set(id, list = []);
    list.push(w);
  }
  const G = allowance(ttl, epsilon);
  /** How many restarts that lost acknowledged messages came by true time t. */
  const eraOf = (t: number) => h.losses.filter((l) => l.t <= t).length;
  /** One tenure: one manager instance, one epoch, one acquiring put. */
  const sameTenure = (a: WriteRec, b: WriteRec) =>
    a.mgr === b.mgr && a.epoch === b.epoch &&
    (a.acquiredAt === b.acquiredAt ||
      (Number.isNaN(a.acquiredAt) && Number.isNaN(b.acquiredAt)));
  for (const list of groups.values()) {
    list.sort((a, b) => a.start - b.start || a.id - b.id);
    // P2: in the order writes start, epochs never go back, except across a
    // restart that lost acknowledged messages: the stream then numbers new
    // writes with the lost revisions again (point 10's residue: epochs may
    // repeat, or go back), so epochs are compared within each stretch
    // between such restarts.
    let top: WriteRec | undefined;
    let era = 0;
    for (const w of list) {
      // A leaf client's write begun after the restart on its tenure's
      // entry from before it (that it did not know was lost) belongs to
      // the stretch before: point 10's residue for leaf clients, whose
      // bound P10 checks.
      if (leafStale(w) || mergedLate(w)) continue;
      const e = eraOf(w.start);
      if (e !== era) {
        era = e;
        top = undefined;
      }
      if (top && w.epoch < top.epoch) {
        v(
          "P2",
          w.start,
          w.key,
          `write #${w.id} of ${w.mgr} started with epoch ${w.epoch} after write #${top.id} of ${top.mgr} started with epoch ${top.epoch}`,
        );
      }
      if (!top || w.epoch > top.epoch) top = w;
    }
    // P1: overlapping committed writes of two tenures.
    const done = list.filter((w) => w.committed);
    for (let i = 0; i < done.length; i++) {
      const w1 = done[i]!;
      const c1 = w1.commit!;
      for (let j = i + 1; j < done.length; j++) {
        const w2 = done[j]!;
        if (w2.start >= c1) break;
        if (sameTenure(w1, w2)) continue;
        const b = bound(w1, c1);
        const d1 = b === undefined ? -Infinity : node(w1).trueOf(b);
        const overrun = c1 - d1;
        // A restart that lost acknowledged messages between the starts:
        // what point 10 promises instead (see README.md, P1).
        const lossAt = h.losses.find((l) => w1.start < l.t && l.t <= w2.start)
          ?.t;
        const residue = leafResidueOf(w1, w2) ?? leafResidueOf(w2, w1);
        if (overrun > G && (w2.epoch > w1.epoch || lossAt !== undefined)) {
          fencedOverlaps++;
        } else if (
          lossAt !== undefined && w1.kind !== "careful" && !node(w1).leaf &&
          w1.start < (node(w1).downSeen.find((t) => t >= lossAt) ?? Infinity)
        ) {
          // An unchecked write already running when its process learnt of
          // the drop: only the epoch could fence it, and the successor's may
          // repeat it (point 10's residue).
          fencedOverlaps++;
        } else if (residue !== undefined) {
          // A leaf client, told nothing of the restart, vouched on what the
          // restart lost, before it could notice (point 10's residue).
          leafResidue[residue]++;
          leafOverlaps.push(
            `${residue}: write #${w1.id} of ${w1.mgr} (${w1.kind}${
              w1.fast ? ", no round trip" : ""
            }, epoch ${w1.epoch}, ${w1.start.toFixed(3)}–${
              c1.toFixed(3)
            }) overlaps write #${w2.id} of ${w2.mgr} (${w2.kind}${
              w2.fast ? ", no round trip" : ""
            }, epoch ${w2.epoch}, ${w2.start.toFixed(3)}–${
              w2.commit!.toFixed(3)
            })`,
          );
        } else {
          v(
            "P1",
            c1,
            w1.key,
            `write #${w1.id} of ${w1.mgr} (${w1.kind}, epoch ${w1.epoch}, ${
              w1.start.toFixed(3)
            }–${c1.toFixed(3)}, deadline ${d1.toFixed(3)}, overrun ${
              overrun.toFixed(3)
            } ms) overlaps write #${w2.id} of ${w2.mgr} (epoch ${w2.epoch}, ${
              w2.start.toFixed(3)
            }–${w2.commit!.toFixed(3)}); allowed only past an overrun of ${
              G.toFixed(3)
            } ms and with a greater epoch${
              lossAt === undefined
                ? ""
                : ` (or, across the lost tail at ${
                  lossAt.toFixed(3)
                }, for an unchecked write started before its process saw the drop)`
            }`,
          );
        }
      }
    }
  }

  // P2 across a re-creation: nobody who vouched in the old bucket vouches
  // in the new one.
  for (let i = 0; i + 1 < h.lifecycle.length; i++) {
    const del = h.lifecycle[i]!;
    const cre = h.lifecycle[i + 1]!;
    if (del.event !== "deleted" || cre.event !== "created") continue;
    const vouches = (w: WriteRec) => [
      w.start,
      ...(w.kind === "careful" && w.committed ? [w.commit!] : []),
    ];
    const before = new Set(
      h.writes.filter((w) => vouches(w).some((t) => t < del.t)).map((w) =>
        w.mgr
      ),
    );
    for (const w of h.writes) {
      if (!before.has(w.mgr)) continue;
      const t = vouches(w).find((t) => t >= cre.t);
      if (t !== undefined) {
        v(
          "P2",
          t,
          w.key,
          `${w.mgr} vouched before the bucket was deleted (${
            del.t.toFixed(3)
          }) and again after it was re-created (${
            cre.t.toFixed(3)
          }): write #${w.id}, epoch ${w.epoch}`,
        );
      }
    }
  }

  // P5: a crashed holder is replaced in time.
  for (const ep of h.episodes) {
    if (ep.gone === undefined) {
      v(
        "P5",
        ep.t,
        ep.key,
        `the crashed holder ${ep.holder}'s entry never went`,
      );
      continue;
    }
    if (ep.gone > ep.serverBound) {
      v(
        "P5",
        ep.gone,
        ep.key,
        `the crashed holder ${ep.holder}'s entry went at ${
          ep.gone.toFixed(3)
        }, after TTL + late expiry (${ep.serverBound.toFixed(3)})`,
      );
    }
    const next = h.writes.find((w) =>
      w.key === ep.key && w.mgr !== ep.holder && w.start >= ep.t
    );
    const limit = ep.gone + ep.bound;
    if (!next || next.start > limit) {
      v(
        "P5",
        limit,
        ep.key,
        `no write on the key from the holder's crash (${
          ep.t.toFixed(3)
        }) until ${limit.toFixed(3)} (its entry went at ${
          ep.gone.toFixed(3)
        }; next write ${
          next ? `at ${next.start.toFixed(3)} by ${next.mgr}` : "never"
        })`,
      );
    }
  }

  // P6: a careful write of an undisturbed manager keeps its lease.
  for (const w of h.writes) {
    if (w.kind !== "careful" || w.committed || w.checkAt === undefined) {
      continue;
    }
    const from = w.start - ttl;
    const to = w.checkAt;
    const touched = h.disturbances.some((d) =>
      d.t0 <= to && d.t1 >= from &&
      (d.scope === "all" || (d.scope === "node" && d.who === w.mgr) ||
        (d.scope === "key" && d.who === w.key))
    );
    if (touched) continue;
    const givenUp = h.releases.some((r) =>
      r.mgr === w.mgr && (r.key === undefined || r.key === w.key) &&
      r.t <= to && to - r.t >= 0.99 * h.plan.settleTimeout
    );
    if (givenUp) continue;
    v(
      "P6",
      to,
      w.key,
      `careful write #${w.id} of ${w.mgr} (started ${
        w.start.toFixed(3)
      }) was refused at its commit point (${w.reason}) though nothing disturbed ${w.mgr} or the key since one TTL before it started`,
    );
  }
  // P7: after release(key) or close() resolves, nothing more on the key
  // (after close(), nothing at all) until a guard on it starts again.
  for (const g of h.givenUp) {
    const n = h.nodes.get(g.mgr)!;
    const again = (key: string) =>
      Math.min(
        ...h.guardCalls.filter((c) =>
          c.mgr === g.mgr && c.key === key && c.t0 >= g.t
        ).map((c) => c.t0),
        Infinity,
      );
    // A guard still running when the release resolved has taken the key
    // up again (its acquire may hold it anew): as if it started after.
    const running = g.key !== undefined &&
      h.guardCalls.some((c) =>
        c.mgr === g.mgr && c.key === g.key && c.t0 <= g.t &&
        (c.t1 === undefined || c.t1 >= g.t)
      );
    // release() and close() wait at most one timeout for an operation in
    // flight: when a request of the manager's own went unanswered, it
    // paused, or an operator wrote on the key meanwhile, that operation
    // may outlive them by its retries.
    const late = h.disturbances.some((d) =>
        d.t0 <= g.t && d.t1 >= g.called &&
        ((d.scope === "node" && d.who === g.mgr) ||
          (d.scope === "key" && (g.key === undefined || d.who === g.key)))
      )
      ? g.t + 2 * ttl
      : g.t;
    // A request that serves a port call begun before the release resolved
    // (the identity check after a read's answer) belongs to that call:
    // release() does not wait for a waiter's watch read, for one.
    const bad = running
      ? undefined
      : n.sends.find((s) =>
        s.t > late && s.begun > g.t &&
        (g.key === undefined || (s.key === g.key && s.t < again(g.key)))
      );
    // Finding 4: an earlier release of the key resolved while a guard's
    // acquire on it was in flight, and that acquire's state, forgotten,
    // renews on.
    const orphaned = bad !== undefined && g.key !== undefined &&
      h.givenUp.some((e) =>
        e.mgr === g.mgr && e.key === g.key && e.t < g.t &&
        h.guardCalls.some((c) =>
          c.mgr === g.mgr && c.key === g.key && c.t0 <= e.t &&
          (c.t1 === undefined || c.t1 >= e.t)
        )
      );
    // Fixed in lease.ts (a state given up ignores an acquire that lands
    // late): counted, and a violation like any other.
    if (orphaned) orphans++;
    if (bad) {
      v(
        "P7",
        bad.t,
        bad.key,
        `${g.mgr} sent a ${bad.what} on '${bad.key}' at ${
          bad.t.toFixed(3)
        } after its ${
          g.key === undefined ? "close()" : "release()"
        } resolved at ${g.t.toFixed(3)}${
          g.key === undefined ? "" : ", with no guard on the key since"
        }`,
      );
    }
  }

  // P8: while a manager vouches for a tenure, it renews at least every
  // TTL/3 + slack of its own clock, unless disturbed in that gap.
  const limit = ttl / 3 + renewalSlack(ttl, h.plan.maxDelay);
  for (const tr of h.tenures) {
    const n = h.nodes.get(tr.mgr)!;
    const end = Math.min(tr.end ?? Infinity, n.diedAt, h.plan.duration);
    const sends = n.sends.filter((s) =>
      s.key === tr.key && s.what === "write" && s.t <= end
    ).map((s) => s.t);
    // From the moment it vouches: a tenure can start on an older send (an
    // acquire whose reply was lost and is recognised later), and how old that
    // send is is P3's matter (the deadline), not a renewal that stopped.
    let prev = tr.from;
    const gap = (t0: number, t1: number): boolean => {
      if (n.local(t1) - n.local(t0) <= limit) return false;
      return !h.disturbances.some((d) =>
        d.t0 <= t1 && d.t1 >= t0 &&
        (d.scope === "all" || (d.scope === "node" && d.who === tr.mgr))
      );
    };
    let at: [number, number] | undefined;
    for (const t of sends) {
      if (t <= tr.from) continue;
      if (!at && gap(prev, t)) at = [prev, t];
      prev = t;
    }
    if (!at && gap(prev, end)) at = [prev, end];
    if (at) {
      v(
        "P8",
        at[1],
        tr.key,
        `${tr.mgr} vouched for epoch ${tr.epoch} (from ${
          tr.from.toFixed(3)
        } until ${end.toFixed(3)}) but sent no write on the key from ${
          at[0].toFixed(3)
        } to ${at[1].toFixed(3)} (${
          (n.local(at[1]) - n.local(at[0])).toFixed(3)
        } ms of its clock; allowed ${limit.toFixed(3)})`,
      );
    }
  }
  // P10: a manager that went defunct because the server lost writes it had
  // acknowledged vouches for nothing after: no write starts, no commit
  // check passes.
  for (const [mgr, t] of h.defunct) {
    for (const w of h.writes) {
      if (w.mgr !== mgr) continue;
      const at = w.start > t
        ? w.start
        : w.kind === "careful" && w.committed && w.commit! > t
        ? w.commit!
        : undefined;
      if (at !== undefined) {
        v(
          "P10",
          at,
          w.key,
          `${mgr} went defunct at ${
            t.toFixed(3)
          } (the server lost writes it had acknowledged) but vouched for write #${w.id} (epoch ${w.epoch}) at ${
            at.toFixed(3)
          }`,
        );
      }
    }
  }
  // P10 (issue 31, point 2): a manager shown that the server lost writes
  // it had acknowledged (no entry at all where its entry cannot have
  // expired yet, or a revision below its own) vouches for nothing after.
  for (const p of h.proofs) {
    for (const w of h.writes) {
      if (w.mgr !== p.mgr) continue;
      const at = w.start > p.t
        ? w.start
        : w.kind === "careful" && w.committed && w.commit! > p.t
        ? w.commit!
        : undefined;
      if (at === undefined) continue;
      v(
        "P10",
        at,
        w.key,
        `${p.mgr} was shown at ${
          p.t.toFixed(3)
        } that the server lost writes it had acknowledged on '${p.key}' (${p.what}), but vouched for write #${w.id} (epoch ${w.epoch}) at ${
          at.toFixed(3)
        }`,
      );
      break;
    }
  }
  // P10 for leaf clients (issue 31, point 3): a tenure whose entry a
  // restart took while it vouched, with nothing told, vouches for nothing
  // once leafBound() has passed since the server answered the leaf node
  // again, unless a renewal of it landed on the successor's entry at the
  // reused revision (then only Lease.tenure tells them apart).
  for (const c of h.leafCuts) {
    const n = h.nodes.get(c.mgr)!;
    const ended = h.ends.find((e) =>
      e.mgr === c.mgr && e.tenure === c.tenure && e.t >= c.loss
    );
    const back = c.leafBack;
    if (
      h.carried.some((m) =>
        m.key === c.key && m.by.mgr === c.mgr && m.by.epoch === c.epoch &&
        m.t >= c.acquiredAt
      )
    ) continue;
    // How long it took, for the summary: only where no fault of its own
    // (a pause, a lost request) came in between.
    const until = ended?.t ?? Math.min(n.diedAt, h.plan.duration);
    const own = h.disturbances.some((d) =>
      d.scope === "node" && d.who === c.mgr && d.t0 <= until &&
      d.t1 >= c.loss
    );
    if (!own) {
      const bound = leafBound(ttl, h.plan.maxDelay);
      if (ended === undefined) leafNotice.push({ ms: NaN, bound });
      else if (ended.t > back) {
        leafNotice.push({ ms: n.local(ended.t) - n.local(back), bound });
      }
    }
    const end = leafEnd(c.mgr, c.loss, c.leafBack);
    for (const w of h.writes) {
      if (
        w.mgr !== c.mgr || w.key !== c.key || w.epoch !== c.epoch ||
        !(w.acquiredAt === c.acquiredAt)
      ) continue;
      const at = w.start >= end
        ? w.start
        : w.kind === "careful" && w.committed && w.commit! >= end
        ? w.commit!
        : undefined;
      if (at === undefined) continue;
      v(
        "P10",
        at,
        w.key,
        `leaf client ${c.mgr}'s tenure (epoch ${c.epoch}) lost its entry in the restart at ${
          c.loss.toFixed(3)
        } (nothing told), the server answered the leaf node again by ${
          back.toFixed(3)
        }, yet it vouched for write #${w.id} at ${at.toFixed(3)}, after ${
          end.toFixed(3)
        } (TTL/3 + ${
          renewalSlack(ttl, h.plan.maxDelay).toFixed(1)
        } ms of its clock after that, or after a fault of its own)`,
      );
      break;
    }
  }
  out.push(...checkPF(h.log));
  return {
    violations: out,
    fencedOverlaps,
    orphans,
    leafResidue,
    leafNotice,
    leafOverlaps,
  };
}
