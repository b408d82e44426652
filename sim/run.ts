/**
 * The simulator's command line.
 *
 * ```sh
 * deno run -A sim/run.ts --seeds 1000            # histories 0..999 on ../lease.ts
 * deno run -A sim/run.ts --seconds 60 --from 5000
 * deno run -A sim/run.ts --trace 1234             # one history, its full trace
 * deno run -A sim/run.ts --reduce 1234            # the failure with fewest faults
 * deno run -A sim/run.ts --lease sim/.mutants/x/lease.ts --seeds 500
 * deno run -A sim/run.ts --mutant 1 --seeds 10000 # a mutant, to its first failure
 * deno run -A sim/run.ts --mutant 1 --trace 20     # a mutant's history
 * deno run -A sim/run.ts --mutants --seeds 10000  # every mutant: the table
 * ```
 *
 * Also runs under `node sim/run.ts` and `bun sim/run.ts`. `SIM_LEASE` is
 * the default of `--lease`. Exit status: 0 no violation, 1 violations, 2
 * bad usage or a crash.
 *
 * @module
 */

import process from "node:process";
import { loadLease } from "./load.ts";
import {
  expectedProperties,
  findMutant,
  type Mutant,
  MUTANTS,
  writeMutant,
} from "./mutants.ts";
import {
  type HistoryResult,
  type LeaseModule,
  makePlan,
  type Plan,
  runHistory,
  type SimOptions,
  type Violation,
} from "./world.ts";

/** Parsed command line. */
export interface Args {
  seeds: number | undefined;
  from: number;
  seconds: number | undefined;
  lease: string | undefined;
  mutant: string | undefined;
  mutants: boolean;
  /** With --mutants: do not hunt the mutants no property is expected to catch. */
  expectedOnly: boolean;
  trace: number | undefined;
  reduce: number | undefined;
  stop: boolean;
  options: SimOptions;
}

const USAGE = `usage: sim/run.ts [--seeds N] [--from S] [--seconds T]
                  [--lease FILE | --mutant ID | --mutants [--expected-only]]
                  [--trace SEED] [--reduce SEED] [--stop] [--blind-kind blind|escape]
                  [--exact-timers P] [--length TTLS] [--clock-epsilon E]
                  [--focus MUTANT]`;

/**
 * Parses the command line.
 *
 * @param argv The arguments after the script.
 * @returns The settings.
 * @throws {RangeError} An argument is unknown or malformed.
 */
export function parseArgs(argv: readonly string[]): Args {
  const a: Args = {
    seeds: undefined,
    from: 0,
    seconds: undefined,
    lease: undefined,
    mutant: undefined,
    mutants: false,
    expectedOnly: false,
    trace: undefined,
    reduce: undefined,
    stop: false,
    options: {},
  };
  const num = (name: string, v: string | undefined): number => {
    const n = Number(v);
    if (v === undefined || v === "" || !Number.isFinite(n) || n < 0) {
      throw new RangeError(
        `${name} needs a non-negative number: received ${
          JSON.stringify(v)
        }\n${USAGE}`,
      );
    }
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i]!.split("=", 2) as [string, string?];
    const value = () => inline ?? argv[++i];
    switch (flag) {
      case "--seeds":
        a.seeds = Math.floor(num(flag, value()));
        break;
      case "--from":
        a.from = Math.floor(num(flag, value()));
        break;
      case "--seconds":
        a.seconds = num(flag, value());
        break;
      case "--lease":
        a.lease = value();
        break;
      case "--mutant":
        a.mutant = value();
        break;
      case "--mutants":
        a.mutants = true;
        break;
      case "--expected-only":
        a.expectedOnly = true;
        break;
      case "--trace":
        a.trace = Math.floor(num(flag, value()));
        break;
      case "--reduce":
        a.reduce = Math.floor(num(flag, value()));
        break;
      case "--stop":
        a.stop = true;
        break;
      case "--blind-kind": {
        const k = value();
        if (k !== "blind" && k !== "escape") {
          throw new RangeError(`--blind-kind is blind or escape\n${USAGE}`);
        }
        a.options.blindKind = k;
        break;
      }
      case "--exact-timers":
        a.options.exactTimersChance = num(flag, value());
        break;
      case "--length":
        a.options.length = num(flag, value());
        break;
      case "--focus": {
        // The histories a mutant's hunt narrows to, on the module under test.
        const id = value() ?? "";
        a.options = { ...a.options, ...findMutant(id).focus };
        break;
      }
      case "--clock-epsilon":
        a.options.clockEpsilon = num(flag, value());
        break;
      case "-h":
      case "--help":
        throw new RangeError(USAGE);
      default:
        throw new RangeError(`unknown argument '${argv[i]}'\n${USAGE}`);
    }
  }
  return a;
}

/** Totals of a batch of histories. */
export interface BatchResult {
  histories: number;
  failed: number;
  /** Failing seeds per property, in order. */
  byProperty: Map<string, number[]>;
  /** The first failing history. */
  first: HistoryResult | undefined;
  steps: number;
  ms: number;
  /** Seeds that showed finding 4 (P7 breaches, also counted as failures). */
  orphans: number[];
  /** Leaf clients' tenures a restart took the entry of, and the histories with one. */
  leafCuts: number;
  leafHistories: number;
  /** Answers that showed a manager the server lost its acknowledged writes (P10). */
  proofs: number;
  /** Overlaps allowed as point 10's residue for leaf clients, by kind, with the first seed of each. */
  leafResidue: Map<string, { n: number; first: number }>;
  /**
   * The latest a leaf client's cut tenure ended after the server answered
   * it again, ms, with the bound P10 allowed and the seed.
   */
  leafNotice: { ms: number; bound: number; seed: number } | undefined;
  /** Cut tenures that never ended within their history. */
  leafNeverEnded: number;
}

/**
 * Runs histories `from`, `from + 1`, ... until `seeds` of them ran or
 * `seconds` passed (whichever is given first; with neither, 100).
 *
 * @param lib The lease module.
 * @param o Which seeds, for how long, and the simulator's settings.
 * @returns The totals.
 */
export async function runBatch(
  lib: LeaseModule,
  o: {
    from: number;
    seeds?: number | undefined;
    seconds?: number | undefined;
    stop?: boolean;
    options?: SimOptions;
    onFail?: (r: HistoryResult) => void;
  },
): Promise<BatchResult> {
  const t0 = performance.now();
  const limit = o.seeds ?? (o.seconds === undefined ? 100 : Infinity);
  const res: BatchResult = {
    histories: 0,
    failed: 0,
    byProperty: new Map(),
    first: undefined,
    steps: 0,
    ms: 0,
    orphans: [],
    leafCuts: 0,
    leafHistories: 0,
    proofs: 0,
    leafResidue: new Map(),
    leafNotice: undefined,
    leafNeverEnded: 0,
  };
  for (let s = o.from; res.histories < limit; s++) {
    if (
      o.seconds !== undefined && performance.now() - t0 >= o.seconds * 1000
    ) break;
    const r = await runHistory(s, lib, o.options);
    res.histories++;
    res.steps += r.steps;
    if (r.orphans > 0) res.orphans.push(s);
    res.leafCuts += r.leafCuts;
    if (r.leafCuts > 0) res.leafHistories++;
    res.proofs += r.proofs;
    for (const [k, n] of Object.entries(r.leafResidue)) {
      if (n === 0) continue;
      const e = res.leafResidue.get(k);
      if (e) e.n += n;
      else res.leafResidue.set(k, { n, first: s });
    }
    for (const { ms, bound } of r.leafNotice) {
      if (Number.isNaN(ms)) res.leafNeverEnded++;
      else if (
        !res.leafNotice || ms / bound > res.leafNotice.ms / res.leafNotice.bound
      ) {
        res.leafNotice = { ms, bound, seed: s };
      }
    }
    if (r.violations.length > 0) {
      res.failed++;
      res.first ??= r;
      for (const p of new Set(r.violations.map((v) => v.property))) {
        let list = res.byProperty.get(p);
        if (!list) res.byProperty.set(p, list = []);
        list.push(s);
      }
      o.onFail?.(r);
      if (o.stop) break;
    }
  }
  res.ms = performance.now() - t0;
  return res;
}

/**
 * Describes a violation with the trace leading to it (the history is run
 * again with tracing on; a seed reproduces it).
 *
 * @param lib The lease module.
 * @param seed The seed.
 * @param v The violation.
 * @param options The simulator's settings.
 * @param lines How many trace lines.
 * @returns The report.
 */
export async function explain(
  lib: LeaseModule,
  seed: number,
  v: Violation,
  options: SimOptions = {},
  lines = 40,
): Promise<string> {
  const r = await runHistory(seed, lib, { ...options, trace: true });
  return `seed ${seed}: ${v.property} at ${v.t.toFixed(3)} ms${
    v.key ? ` on ${v.key}` : ""
  }: ${v.message}\n  plan: ${describePlan(r.plan)}\n${
    r.trace.format(v.key, lines, v.t).replace(/^/gm, "  ")
  }`;
}

/** The plan's faults, in a line. */
export function describePlan(p: Plan): string {
  const on: string[] = [
    `ttl ${p.ttl}`,
    `${p.managers} managers`,
    `${p.keys} keys`,
    p.markers ? `markers (${p.markerTTL} ms)` : "no markers",
    `delay <= ${p.maxDelay} ms`,
  ];
  if (p.lags.length > 1) on.push(`replica lags [${p.lags.slice(1)}]`);
  if (p.lateExpiry) on.push("late expiry");
  if (p.skew) on.push(`clock skew (ε ${p.epsilon})`);
  if (p.exactTimers) on.push("exact timers");
  if (p.lostRequest) on.push(`lost requests ${p.lostRequest.toFixed(3)}`);
  if (p.lostReply) on.push(`lost replies ${p.lostReply.toFixed(3)}`);
  if (p.lateReply) on.push(`late replies ${p.lateReply.toFixed(3)}`);
  if (p.pauseEvery) {
    on.push(
      `pauses every ~${p.pauseEvery.toFixed(0)} ms${
        p.freeze ? " (freezing requests)" : ""
      }${p.timersFirst ? " (timers first on resume)" : ""}`,
    );
  }
  if (p.operatorEvery) {
    on.push(
      `operator delete/purge every ~${p.operatorEvery.toFixed(0)} ms${
        p.bursts ? " in bursts" : ""
      }`,
    );
  }
  if (p.markerEdit !== undefined) {
    on.push(
      `${
        p.markerEdit === "remove"
          ? "marker TTL removed"
          : p.markerEdit === "lower"
          ? "marker TTL lowered to 1 s"
          : "server rolled back to a release without markers"
      } at ${(p.markerEditAt * p.duration).toFixed(0)} ms`,
    );
  }
  if (p.recreate) on.push("bucket re-created");
  if (p.serverRestart) {
    on.push(
      `server restart at ${(p.restartAt * p.duration).toFixed(0)} ms losing ${
        p.coverAcquire ? "back over an acquire" : `${p.lostTail} messages`
      }`,
    );
  }
  if (p.blipEvery) {
    on.push(`connection blips every ~${p.blipEvery.toFixed(0)} ms`);
  }
  if (p.connClose) on.push("a connection closes");
  if (p.crash) on.push("a crash");
  if (p.closeEvery) on.push(`close() every ~${p.closeEvery.toFixed(0)} ms`);
  if (p.releaseEvery) {
    on.push(`release() every ~${p.releaseEvery.toFixed(0)} ms`);
  }
  if (p.idleRelease !== undefined) {
    on.push(`idleRelease ${p.idleRelease.toFixed(0)} ms`);
  }
  if (p.blindShare) on.push(`${p.blindShare * 100}% ${p.blindKind} writes`);
  if (p.waitShare) {
    on.push(`${(p.waitShare * 100).toFixed(0)}% of guards wait`);
  }
  if (p.liveness) on.push("liveness episode");
  return on.join(", ");
}

/** Plan changes a reduction tries, in order: each removes a fault or some load. */
const REDUCTIONS: ((p: Plan) => Partial<Plan>)[] = [
  () => ({ recreate: false }),
  () => ({ serverRestart: false }),
  () => ({ blipEvery: 0 }),
  () => ({ connClose: false }),
  () => ({ crash: false }),
  () => ({ closeEvery: 0 }),
  () => ({ liveness: false }),
  () => ({ operatorEvery: 0 }),
  () => ({ bursts: false }),
  () => ({ pauseEvery: 0 }),
  () => ({ lostRequest: 0 }),
  () => ({ lostReply: 0 }),
  () => ({ lateReply: 0 }),
  () => ({ lags: [0] }),
  () => ({ lateExpiry: false }),
  () => ({ skew: false }),
  () => ({ releaseEvery: 0 }),
  () => ({ idleRelease: undefined }),
  () => ({ blindShare: 0 }),
  () => ({ waitShare: 0 }),
  () => ({ markerEdit: undefined }),
  () => ({ markers: false }),
  (p) => ({ keys: Math.max(1, p.keys - 1) }),
  (p) => ({ managers: Math.max(2, p.managers - 1) }),
];

/**
 * Finds, for a failing seed, a plan with fewer faults that still fails the
 * same property (greedy: each reduction is kept if the failure stays).
 *
 * @param lib The lease module.
 * @param seed The seed.
 * @param options The simulator's settings.
 * @returns The reduced failure, or `undefined` if the seed passes.
 */
export async function reduce(
  lib: LeaseModule,
  seed: number,
  options: SimOptions = {},
): Promise<{ result: HistoryResult; override: Partial<Plan> } | undefined> {
  let best = await runHistory(seed, lib, options);
  const property = best.violations[0]?.property;
  if (property === undefined) return undefined;
  let override: Partial<Plan> = { ...options.override };
  const fails = (r: HistoryResult) =>
    r.violations.some((v) => v.property === property);
  for (const step of REDUCTIONS) {
    const base = makePlan(seed, { ...options, override });
    const change = step(base);
    if (Object.entries(change).every(([k, v]) => base[k as keyof Plan] === v)) {
      continue;
    }
    const next = { ...override, ...change };
    const r = await runHistory(seed, lib, { ...options, override: next });
    if (fails(r)) {
      override = next;
      best = r;
    }
  }
  // Shorter: stop one TTL after the failure.
  const v = best.violations.find((v) => v.property === property)!;
  const duration = Math.ceil((v.t + best.plan.ttl) / best.plan.ttl) *
    best.plan.ttl;
  if (duration < best.plan.duration) {
    const next = { ...override, duration };
    const r = await runHistory(seed, lib, { ...options, override: next });
    if (fails(r)) {
      override = next;
      best = r;
    }
  }
  return { result: best, override };
}

/** One row of the mutant table. */
export interface MutantRow {
  readonly mutant: Mutant;
  /** The first failing seed, or `undefined` if none failed within the budget. */
  readonly seed: number | undefined;
  /** Histories run up to and including the first failure. */
  readonly histories: number;
  readonly property: string | undefined;
  readonly ms: number;
}

/**
 * Runs a mutant from seed `from` until its first failure that the
 * unmutated module does not share, at most `budget` histories.
 *
 * @param m The mutant.
 * @param from The first seed.
 * @param budget The most histories to run.
 * @param options The simulator's settings.
 * @param real The unmutated module (default: `../lease.ts`).
 * @returns The row.
 */
export async function hunt(
  m: Mutant,
  from: number,
  budget: number,
  options: SimOptions = {},
  real?: LeaseModule,
): Promise<MutantRow> {
  const lib = await loadLease(writeMutant(m));
  const base = real ?? await loadLease();
  const t0 = performance.now();
  const baseSettings = { ...options, ...m.focus };
  const settings = { ...baseSettings, ...m.options };
  for (let s = from; s < from + budget; s++) {
    const r = await runHistory(s, lib, settings);
    if (r.violations.length === 0) continue;
    // A failure counts only if the unmutated module does not fail the same
    // property on the same seed.
    const b = await runHistory(s, base, baseSettings);
    const known = new Set(b.violations.map((v) => v.property));
    // Only the property the mutant is expected to break counts (any, for a
    // mutant no property is expected to catch: the hunt then only shows
    // that none does).
    const wanted = expectedProperties(m);
    const own = r.violations.find((v) =>
      !known.has(v.property) &&
      (wanted.length === 0 || wanted.includes(v.property))
    );
    if (own) {
      return {
        mutant: m,
        seed: s,
        histories: s - from + 1,
        property: own.property,
        ms: performance.now() - t0,
      };
    }
  }
  return {
    mutant: m,
    seed: undefined,
    histories: budget,
    property: undefined,
    ms: performance.now() - t0,
  };
}

function summary(b: BatchResult, what: string): string {
  const rate = b.histories / (b.ms / 1000);
  const props = [...b.byProperty].map(([p, seeds]) =>
    `${p}: ${seeds.length} (first seeds ${seeds.slice(0, 5).join(", ")})`
  );
  const known = b.orphans.length
    ? `; finding 4 (a forgotten state renews on) in ${b.orphans.length} (first seeds ${
      b.orphans.slice(0, 5).join(", ")
    })`
    : "";
  const residue = [...b.leafResidue].map(([k, e]) =>
    `${k} ${e.n} (first seed ${e.first})`
  );
  const leaf = b.leafCuts > 0
    ? `; leaf clients: ${b.leafCuts} tenures lost their entry unseen in ${b.leafHistories} histories, residue overlaps ${
      residue.length ? residue.join(", ") : "none"
    }, latest end ${
      b.leafNotice
        ? `${
          b.leafNotice.ms.toFixed(1)
        } ms after the server answered the leaf client (bound ${
          b.leafNotice.bound.toFixed(1)
        } ms; seed ${b.leafNotice.seed})`
        : "none after the server answered"
    }${b.leafNeverEnded ? `, ${b.leafNeverEnded} never ended` : ""}`
    : "";
  return `${what}: ${b.histories} histories, ${b.failed} failed${
    props.length ? ` [${props.join("; ")}]` : ""
  }${known}; lost tails shown to managers ${b.proofs}${leaf}; ${
    (b.ms / 1000).toFixed(1)
  } s, ${rate.toFixed(0)} histories/s, ${
    (b.steps / b.histories).toFixed(0)
  } events/history`;
}

async function main(argv: readonly string[]): Promise<number> {
  let a: Args;
  try {
    a = parseArgs(argv);
  } catch (err) {
    console.error((err as Error).message);
    return 2;
  }
  // A mutant with --trace or --reduce is simply the module under test.
  if (
    a.mutant !== undefined && (a.trace !== undefined || a.reduce !== undefined)
  ) {
    const m = findMutant(a.mutant);
    a.lease = writeMutant(m);
    a.options = { ...a.options, ...m.focus, ...m.options };
    a.mutant = undefined;
  }
  if (a.mutants || a.mutant !== undefined) {
    const list = a.mutants ? MUTANTS : [findMutant(a.mutant!)];
    const budget = a.seeds ?? 10_000;
    let missed = 0;
    console.log(
      "| hole | mutant | expected | caught by | seed | histories to first failure | time |",
    );
    console.log("|---|---|---|---|---|---|---|");
    const real = await loadLease(a.lease);
    for (const m of list) {
      if (a.expectedOnly && m.expect === undefined) {
        console.log(
          `| ${m.hole} | ${m.name} | none (${m.why}) | not hunted | – | – | – |`,
        );
        continue;
      }
      const row = await hunt(
        m,
        a.from,
        Math.max(budget, m.budget ?? 0),
        a.options,
        real,
      );
      if (m.expect !== undefined && row.seed === undefined) missed++;
      console.log(
        `| ${m.hole} | ${m.name} | ${m.expect ?? `none (${m.why})`} | ${
          row.property ?? "not caught"
        } | ${row.seed ?? "–"} | ${
          row.seed === undefined ? `none in ${row.histories}` : row.histories
        } | ${(row.ms / 1000).toFixed(1)} s |`,
      );
    }
    return missed > 0 ? 1 : 0;
  }
  const lib = await loadLease(a.lease);
  if (a.trace !== undefined) {
    const r = await runHistory(a.trace, lib, { ...a.options, trace: true });
    console.log(`plan: ${describePlan(r.plan)}`);
    console.log(r.trace.format(undefined, Infinity));
    for (const v of r.violations) {
      console.log(`${v.property} at ${v.t.toFixed(3)}: ${v.message}`);
    }
    for (const o of r.leafOverlaps) {
      console.log(`allowed as point 10's residue for a leaf client: ${o}`);
    }
    return r.violations.length > 0 ? 1 : 0;
  }
  if (a.reduce !== undefined) {
    const red = await reduce(lib, a.reduce, a.options);
    if (!red) {
      console.log(`seed ${a.reduce} passes`);
      return 0;
    }
    const v = red.result.violations[0]!;
    console.log(`reduced plan changes: ${JSON.stringify(red.override)}`);
    console.log(
      await explain(
        lib,
        a.reduce,
        v,
        { ...a.options, override: red.override },
        60,
      ),
    );
    return 1;
  }
  const b = await runBatch(lib, {
    from: a.from,
    seeds: a.seeds,
    seconds: a.seconds,
    stop: a.stop,
    options: a.options,
  });
  if (b.first) {
    const v = b.first.violations[0]!;
    console.log(await explain(lib, b.first.seed, v, a.options));
  }
  console.log(
    summary(
      b,
      `sim ${
        a.lease ?? process.env.SIM_LEASE ?? "lease.ts"
      } from seed ${a.from}`,
    ),
  );
  return b.failed > 0 ? 1 : 0;
}

if (import.meta.main ?? process.argv[1]?.endsWith("run.ts")) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err) => {
      console.error(err);
      process.exit(2);
    },
  );
}
