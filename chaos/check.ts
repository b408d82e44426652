/**
 * The checks of the chaos harness, run after the fact on the recorded
 * history: the writes as the fenced store saw them and the faults as the
 * harness injected them. Pure functions, so they can be tested on
 * hand-made histories (see `chaos_test.ts`).
 *
 * ## Clocks and order
 * - **Order** on one key comes from the store's sequence numbers: the store
 *   is one process and numbers every request it handles, so "write B began
 *   before write A ended" is exact, not a clock comparison.
 * - **Times** are `Date.now()` milliseconds: every process on the machine
 *   reads the same system clock, so worker, store and harness times compare
 *   directly, at 1 ms resolution. Comparisons that could be fooled by
 *   truncation to whole milliseconds are strict (see check 3).
 *
 * ## A write
 * A guarded write is the interval from the store receiving its `begin` (with
 * key, node and epoch) to the store receiving its `commit`. The store fences
 * both: each is refused when its epoch is older than the newest epoch the
 * store has accepted for the key. A write is therefore `accepted` (both
 * passed), `rejected-begin`, `rejected-commit` (a newer epoch began while it
 * ran), or `unfinished` (its process was killed or the run ended first; its
 * interval ends when the harness saw that).
 *
 * @module
 */

/** How a write ended at the fenced store. */
export type WriteStatus =
  | "accepted"
  | "rejected-begin"
  | "rejected-commit"
  | "unfinished";

/** One guarded write as the fenced store recorded it. */
export interface WriteRecord {
  /** Store-assigned id. */
  readonly id: number;
  /** The store key (lease key). */
  readonly key: string;
  /** The writer's lease node id. */
  readonly node: string;
  /**
   * The writing process. The checks tell writers apart by process, not by
   * node id: a process restarted with a dead one's node id is another
   * writer.
   */
  readonly proc: string;
  /** The fencing epoch the writer presented. */
  readonly epoch: number;
  /** Worker clock: when `guard()` was called for this write. */
  readonly called: number;
  /** Worker clock: when the write callback started. */
  readonly start: number;
  /** Worker clock: when the write callback sent its commit (absent if it never did). */
  end: number | undefined;
  /** Store order of the `begin`. */
  readonly beginSeq: number;
  /** Store clock: when the `begin` arrived. */
  readonly beginAt: number;
  /** Store order of the commit, the refusal or the abandonment (= `beginSeq` if refused at begin). */
  endSeq: number;
  /** Store clock of `endSeq`. */
  endAt: number;
  /** How the write ended. */
  status: WriteStatus;
  /** Why it was refused or abandoned. */
  reason: string | undefined;
}

/** The fault kinds the harness injects. */
export type FaultKind =
  | "holder-kill"
  | "holder-pause"
  | "holder-term"
  | "holder-restart"
  | "server-kill"
  | "server-pause"
  | "leader-kill"
  | "leader-pause";

/** A time interval in `Date.now()` milliseconds. */
export interface Span {
  /** Start, inclusive. */
  readonly from: number;
  /** End. */
  readonly to: number;
}

/** One injected fault. */
export interface FaultRecord {
  /** Index in the run. */
  readonly index: number;
  /** What was done. */
  readonly kind: FaultKind;
  /** When the fault was injected (signal sent). */
  readonly at: number;
  /** When the fault was lifted (SIGCONT, restart, replacement started). */
  end: number;
  /** The worker process hit, for holder faults. */
  readonly proc?: string;
  /** Its lease node id. */
  readonly node?: string;
  /** The lease node id of the replacement process (equal to `node` when it reuses it). */
  readonly replacement?: string;
  /** The server hit (`n0`...), for server faults. */
  readonly server?: string;
  /** Keys the hit worker held when hit: it was their last writer, within one TTL. */
  readonly keys: readonly string[];
  /** For a paused worker: when it was stopped and continued. */
  paused?: Span;
  /**
   * For server faults: an interval in which no compare-and-set could be
   * acknowledged (see check 3 for how the harness bounds it).
   */
  outage?: Span;
  /** The run found every key written again after the fault (false: it gave up waiting). */
  recovered: boolean;
}

/** The parameters the checks need. */
export interface CheckOptions {
  /** Lease TTL in ms; the failover grace is one TTL. */
  readonly ttl: number;
  /** Slack allowed on top of TTL + grace for failover after a kill, in ms. */
  readonly slack: number;
  /** Bound on handover after a clean shutdown, in ms. */
  readonly handover: number;
  /** When the run stopped injecting and measuring (faults after it are not measured). */
  readonly runEnd: number;
  /**
   * Intervals in which a process could not run (its event loop was late by
   * more than the monitor's threshold): CPU starvation, or SIGSTOP. A
   * liveness bound is extended by the time the processes it depends on
   * were stalled.
   */
  readonly stalls?: readonly (Span & { readonly proc: string })[];
}

/** The numbered checks of issue 4. */
export const CHECKS = {
  1: "no overlapping writes of two writers on a key (unless fenced, paused)",
  2: "the fence never accepted an older epoch",
  3: "no write ran while the server or quorum was unreachable",
  4: "holder changes have strictly increasing epochs",
  5: "liveness: failover within bounds",
} as const;

/** A broken promise, found in the history. */
export interface Violation {
  /** Which check (see {@linkcode CHECKS}). */
  readonly check: keyof typeof CHECKS;
  /** The store key, when one is involved. */
  readonly key?: string;
  /** What was seen. */
  readonly message: string;
  /** Ids of the writes involved. */
  readonly writes?: readonly number[];
  /** Index of the fault involved. */
  readonly fault?: number;
}

/** A failover measured after one fault on one key. */
export interface Failover {
  /** Index of the fault. */
  readonly fault: number;
  /** Its kind. */
  readonly kind: FaultKind;
  /** The key; `*` for server faults, which measure the slowest key. */
  readonly key: string;
  /** Milliseconds until another process wrote, or `null` if nobody did. */
  readonly ms: number | null;
  /** The bound checked, or `null` when only reported. */
  readonly bound: number | null;
  /** Milliseconds of that time in which the victim or the successor was stalled. */
  readonly stalledMs: number;
}

/** Everything the checks found. */
export interface CheckResult {
  /** Broken promises; the run fails unless empty. */
  readonly violations: Violation[];
  /** Overlapping pairs excused by check 1's exception (older write fenced, its node paused past TTL + grace). */
  readonly exemptOverlaps: number;
  /** Distinct older writes in those pairs. */
  readonly exemptWrites: number;
  /** Failover and recovery times per fault and key. */
  readonly failovers: Failover[];
  /** Failovers above their bound only by time their processes were stalled. */
  readonly stallExcused: number;
}

/**
 * Checks a recorded history against the five promises of issue 4.
 *
 * 1. **Overlap.** Two writes of different processes on one key overlap when each
 *    began (in store order) before the other ended. Allowed only when the
 *    older-epoch write (a) was refused by the fence, (b) belongs to a process
 *    stopped by SIGSTOP at some time between its `guard()` call and its end,
 *    and (c) ended at least TTL + grace after its `guard()` call: a holder
 *    paused past TTL plus grace. Nothing less can let a successor in: the
 *    write was authorised by a compare-and-set sent after `called`, the
 *    entry it renewed lives at least a TTL after that, and the successor
 *    then waits a grace, so a correct successor begins no earlier than
 *    `called` + TTL + grace. A successor that skips the grace is caught by
 *    (c) when the pause lies between one TTL and TTL + grace.
 * 2. **Fence.** Per key, the epochs of accepted commits, in store order,
 *    never decrease.
 * 3. **Reachability.** `guard()` runs a write only after a compare-and-set
 *    sent after the call was acknowledged; so some instant of
 *    `[called, start]` must lie outside every server outage. A write whose
 *    `called` is strictly after an outage's start and whose `start` is
 *    strictly before its end ran on no acknowledgement: a violation. (Strict
 *    comparisons of whole milliseconds from one clock are sound: `a > b` on
 *    truncated values implies it on the real ones.)
 * 4. **Epochs.** Per key, in store order, each write not excused by check 1
 *    has an epoch strictly greater than the previous one's when the process
 *    changed, and not smaller when it did not.
 * 5. **Liveness.** After SIGKILL of a holder, another process starts a write on
 *    each of its keys within TTL + grace + `slack` of the kill; after SIGTERM
 *    (clean shutdown), within `handover` ms of the later of the signal and
 *    the end of the holder's last write at the store (`close()` lets that
 *    write finish first). "Starts" is the write callback's start on the
 *    successor's clock, so that the time its `begin` spends reaching the
 *    store is not counted. The bound is extended by the time the victim or
 *    the successor was measurably stalled (`options.stalls`: its event loop
 *    ran late, so it could not act, whatever the lease did); such cases are
 *    counted in `stallExcused`. A fault the run could not recover from is a
 *    violation too. Pauses and server faults are measured (to the first
 *    write after the fault was lifted) and reported, not bounded.
 *
 * @param writes The writes, in any order.
 * @param faults The faults, in any order.
 * @param options TTL, slack and bounds.
 * @returns The violations and the measurements.
 */
export function checkHistory(
  writes: readonly WriteRecord[],
  faults: readonly FaultRecord[],
  options: CheckOptions,
): CheckResult {
  const violations: Violation[] = [];
  const byKey = new Map<string, WriteRecord[]>();
  for (const w of writes) {
    const list = byKey.get(w.key) ?? [];
    list.push(w);
    byKey.set(w.key, list);
  }
  for (const list of byKey.values()) {
    list.sort((a, b) => a.beginSeq - b.beginSeq);
  }

  const pauses = faults.flatMap((f) =>
    f.paused && f.proc !== undefined ? [{ proc: f.proc, ...f.paused }] : []
  );
  /** The write was fenced, and its node frozen while it ran past TTL + grace. */
  const excused = (w: WriteRecord): boolean =>
    (w.status === "rejected-begin" || w.status === "rejected-commit") &&
    // Both clocks truncate to whole ms: allow 2 ms of rounding.
    w.endAt - w.called >= 2 * options.ttl - 2 &&
    pauses.some((p) =>
      p.proc === w.proc && p.from <= w.endAt && p.to >= w.called
    );

  // 1. Overlap, by a sweep over begins in store order.
  let exemptOverlaps = 0;
  const exempt = new Set<number>();
  for (const [key, list] of byKey) {
    let active: WriteRecord[] = [];
    for (const w of list) {
      active = active.filter((a) => a.endSeq > w.beginSeq);
      for (const a of active) {
        if (a.proc === w.proc) continue;
        const [older, newer] = a.epoch <= w.epoch ? [a, w] : [w, a];
        if (older.epoch === newer.epoch) {
          violations.push({
            check: 1,
            key,
            message:
              `processes '${a.proc}' and '${w.proc}' wrote '${key}' at once with the same epoch ${a.epoch}`,
            writes: [a.id, w.id],
          });
        } else if (excused(older)) {
          exemptOverlaps++;
          exempt.add(older.id);
        } else {
          violations.push({
            check: 1,
            key,
            message:
              `'${older.proc}' (epoch ${older.epoch}, ${older.status}) and '${newer.proc}' (epoch ${newer.epoch}) wrote '${key}' at once; the older write was ${
                older.status === "accepted" || older.status === "unfinished"
                  ? "not fenced"
                  : "fenced but its node was not paused past TTL + grace"
              }`,
            writes: [older.id, newer.id],
          });
        }
      }
      if (w.endSeq > w.beginSeq) active.push(w);
    }
  }

  // 2. Fence monotonicity.
  for (const [key, list] of byKey) {
    const commits = list.filter((w) => w.status === "accepted")
      .sort((a, b) => a.endSeq - b.endSeq);
    let newest: WriteRecord | undefined;
    for (const w of commits) {
      if (newest && w.epoch < newest.epoch) {
        violations.push({
          check: 2,
          key,
          message:
            `the store accepted epoch ${w.epoch} from '${w.proc}' after epoch ${newest.epoch} from '${newest.proc}'`,
          writes: [newest.id, w.id],
        });
      }
      if (!newest || w.epoch > newest.epoch) newest = w;
    }
  }

  // 3. Reachability.
  const outages = faults.flatMap((f) =>
    f.outage ? [{ fault: f.index, ...f.outage }] : []
  );
  for (const w of writes) {
    const o = outages.find((o) => w.called > o.from && w.start < o.to);
    if (o) {
      violations.push({
        check: 3,
        key: w.key,
        message: `'${w.proc}' ran a write on '${w.key}' (guard called ${
          w.called - o.from
        } ms into the outage, write started ${
          o.to - w.start
        } ms before it ended) while no compare-and-set could be acknowledged`,
        writes: [w.id],
        fault: o.fault,
      });
    }
  }

  // 4. Epochs across holder changes.
  for (const [key, list] of byKey) {
    let prev: WriteRecord | undefined;
    for (const w of list) {
      if (excused(w)) continue;
      if (prev) {
        const bad = w.proc === prev.proc
          ? w.epoch < prev.epoch
          : w.epoch <= prev.epoch;
        if (bad) {
          violations.push({
            check: 4,
            key,
            message:
              `'${w.proc}' wrote '${key}' at epoch ${w.epoch} after '${prev.proc}' at epoch ${prev.epoch}`,
            writes: [prev.id, w.id],
          });
        }
      }
      prev = w;
    }
  }

  // 5. Liveness.
  const failovers: Failover[] = [];
  const byBegin = [...writes].sort((a, b) => a.beginSeq - b.beginSeq);
  const ran = (w: WriteRecord) => w.status !== "rejected-begin";
  let stallExcused = 0;
  /** Total time in [from, to] in which any of `procs` was stalled. */
  const stalled = (procs: string[], from: number, to: number): number => {
    const spans = (options.stalls ?? [])
      .filter((x) => procs.includes(x.proc) && x.to > from && x.from < to)
      .map((x) => [Math.max(x.from, from), Math.min(x.to, to)] as const)
      .sort((a, b) => a[0] - b[0]);
    let total = 0;
    let end = from;
    for (const [a, b] of spans) {
      if (b > end) {
        total += b - Math.max(a, end);
        end = b;
      }
    }
    return total;
  };
  for (const f of [...faults].sort((a, b) => a.index - b.index)) {
    if (!f.recovered) {
      violations.push({
        check: 5,
        message:
          `no progress on every key after ${f.kind} #${f.index}: the run gave up waiting`,
        fault: f.index,
      });
    }
    if (f.kind.startsWith("holder-")) {
      for (const key of f.keys) {
        const next = byBegin.find((w) =>
          w.key === key && w.proc !== f.proc && w.start >= f.at && ran(w)
        );
        let from = f.at;
        let bound: number | null = null;
        if (f.kind === "holder-kill") {
          bound = 2 * options.ttl + options.slack;
        } else if (f.kind === "holder-term") {
          bound = options.handover;
          // close() first lets the write in progress finish.
          for (const w of byBegin) {
            if (
              w.key === key && w.proc === f.proc &&
              (!next || w.endSeq < next.beginSeq)
            ) from = Math.max(from, w.endAt);
          }
        }
        const ms = next ? next.start - from : null;
        const stalledMs = next
          ? stalled([f.proc ?? "", next.proc], from, next.start)
          : 0;
        failovers.push({
          fault: f.index,
          kind: f.kind,
          key,
          ms,
          bound,
          stalledMs,
        });
        const late = ms === null
          ? bound !== null && options.runEnd - from > bound
          : bound !== null && ms - stalledMs > bound;
        if (ms !== null && bound !== null && ms > bound && !late) {
          stallExcused++;
        }
        if (late) {
          violations.push({
            check: 5,
            key,
            message: ms === null
              ? `nobody wrote '${key}' after ${f.kind} of '${f.proc}' (#${f.index}) within ${bound} ms`
              : `'${key}' changed hands ${ms} ms after ${f.kind} of '${f.proc}' (#${f.index}), above the bound of ${bound} ms (${stalledMs} ms of it stalled)`,
            fault: f.index,
            ...(next ? { writes: [next.id] } : {}),
          });
        }
      }
    } else {
      // Server faults: how long after the fault was lifted every key was
      // written again.
      let worst: number | null = 0;
      for (const key of byKey.keys()) {
        const next = byBegin.find((w) =>
          w.key === key && w.start >= f.end && w.status === "accepted"
        );
        if (!next) {
          worst = null;
          break;
        }
        worst = Math.max(worst, next.start - f.end);
      }
      failovers.push({
        fault: f.index,
        kind: f.kind,
        key: "*",
        ms: worst,
        bound: null,
        stalledMs: 0,
      });
    }
  }
  return {
    violations,
    exemptOverlaps,
    exemptWrites: exempt.size,
    failovers,
    stallExcused,
  };
}
