/**
 * Benchmarks the lease module against the limit the server itself sets:
 * every figure is printed beside a bare JetStream KV baseline measured in the
 * same run, on the same connection and server, so the ratios hold on a noisy
 * machine. Runs unchanged on Deno, Bun and Node 24.
 *
 * Rows: (1) guard latency, `check: "cas"` and `check: "lease"`, beside a
 * bare CAS and a bare get; (2) throughput of 64 concurrent guards over 256
 * keys beside 64 concurrent bare CASes; (3) one-key throughput with 64
 * writers and with one, for both checks, beside the same loop calling the
 * write itself; (4) one manager renewing N leases, and where that breaks;
 * (5) failover after a SIGKILL and after close(); (6) memory per held lease.
 *
 * ```sh
 * deno task bench [--smoke]          # every row under Deno
 * bash bench/run.sh [--smoke] [--all] # and rows 1-3 under Bun and Node too
 * node bench/bench.ts --smoke --rows 1,3
 * bun bench/bench.ts --rows 4 --leases 50000 --hold 30000 --steps ""
 * deno run -A bench/bench.ts --combine bench-results/*.json
 * ```
 *
 * Writes a Markdown table to stdout, progress to stderr, and the report as
 * JSON to `bench-results/<runtime>.json` (or `--out`). Ratios are medians of
 * per-run ratios, so they can differ from the ratio of the medians shown.
 *
 * @module
 */

import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";
import { setImmediate } from "node:timers";
import { fileURLToPath } from "node:url";
import * as v8 from "node:v8";
import * as vm from "node:vm";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  jetstream,
  type JetStreamClient,
  jetstreamManager,
} from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";
import {
  createLeaseManager,
  type GuardOptions,
  type LeaseManager,
  NotHolderError,
  UnavailableError,
} from "../mod.ts";
import { NatsServer } from "../test_util/nats_server.ts";

// ---------------------------------------------------------------------------
// Settings.

/** How much work each row does; `--smoke` only checks that it all runs. */
export interface BenchConfig {
  /** `"smoke"` or `"full"`. */
  mode: "smoke" | "full";
  /** Rows to run (1 to 6; 6 rides on 4). */
  rows: Set<number>;
  /** Repeats of rows 1 to 3; each figure is the median of the repeats. */
  runs: number;
  /** Sequential operations per kind per repeat in row 1. */
  latencyOps: number;
  /** Milliseconds per kind per repeat in rows 2 and 3. */
  phaseMs: number;
  /** Leases, TTL and hold time of row 4's target run. */
  scale: { n: number; ttl: number; holdMs: number };
  /**
   * Lease counts for the breaking-point search: above the target's count
   * while leases hold, below it once they are lost.
   */
  breakSteps: number[];
  /** Hold time of each breaking-point step. */
  breakHoldMs: number;
  /** Hold time of row 4's bare CAS baseline (a rate: needs less time). */
  bareHoldMs: number;
  /** Lease TTL and repeats of row 5. */
  failover: { ttl: number; runs: number };
}

/** The settings of a mode. */
export function config(
  mode: "smoke" | "full",
  rows?: Set<number>,
): BenchConfig {
  const all = new Set([1, 2, 3, 4, 5, 6]);
  if (mode === "smoke") {
    return {
      mode,
      rows: rows ?? all,
      runs: 3,
      latencyOps: 100,
      phaseMs: 150,
      scale: { n: 300, ttl: 1_000, holdMs: 1_200 },
      breakSteps: [600],
      breakHoldMs: 800,
      bareHoldMs: 800,
      failover: { ttl: 500, runs: 1 },
    };
  }
  return {
    mode,
    rows: rows ?? all,
    // Many short interleaved repeats: load from other processes on a shared
    // machine then falls on both sides of a ratio alike.
    runs: 11,
    latencyOps: 1_500,
    phaseMs: 1_200,
    scale: { n: 10_000, ttl: 5_000, holdMs: 60_000 },
    breakSteps: [
      1_000,
      2_500,
      5_000,
      7_500,
      15_000,
      20_000,
      30_000,
      50_000,
      75_000,
      100_000,
    ],
    breakHoldMs: 30_000,
    bareHoldMs: 15_000,
    failover: { ttl: 2_000, runs: 5 },
  };
}

// ---------------------------------------------------------------------------
// The report.

/** Percentiles of one latency sample, in milliseconds. */
export interface Latency {
  p50: number;
  p99: number;
}

/** One phase of concurrent work. */
export interface Rate {
  /** Completed operations per second. */
  opsPerSec: number;
  /** Latency percentiles of single operations, ms. */
  p50: number;
  p99: number;
  /** Client process CPU time per operation, µs. */
  cpuUsPerOp: number;
  /** Messages the server received per operation (from /varz in_msgs). */
  serverMsgsPerOp: number;
}

/** One write's one-key rates with 64 writers and with one. */
export interface OneKey {
  /** `concurrency` writers on one key. */
  concurrent: Rate;
  /** One writer. */
  sequential: Rate;
}

/**
 * Row 3 for one write: `guard(key, write, { check: "lease" })` on a held
 * key beside the same loop calling `write` itself, no guard.
 */
export interface LeaseWrite {
  /** What the write does. */
  write: string;
  lease: OneKey;
  direct: OneKey;
  /** Medians over repeats of lease rate / direct rate. */
  ratioConcurrent: number;
  ratioSequential: number;
}

/** One run of row 4. */
export interface ScaleRun {
  n: number;
  ttl: number;
  holdMs: number;
  /** Time to acquire all N leases, ms. */
  acquireMs: number;
  /** Leases not acquired (the acquire phase ran out of retries). */
  notAcquired: number;
  /** Leases whose signal aborted before close(): all causes, then by cause. */
  lost: number;
  /** Of those, the ones lost before the last key was acquired. */
  lostDuringAcquire: number;
  lostNotHolder: number;
  lostExpired: number;
  /** Messages the server received per second during the hold (/varz in_msgs). */
  serverInMsgsPerSec: number;
  /** What one CAS per lease per TTL/3 comes to. */
  expectedRenewalsPerSec: number;
  /** Client CPU during the hold, as a share of one core (1 = one core busy). */
  cpuShare: number;
  /** nats-server CPU during the hold, share of one core; null off Linux. */
  serverCpuShare: number | null;
  /** Client CPU per renewal, µs. */
  cpuUsPerRenewal: number;
  /** Event-loop delay (setTimeout drift) during the hold, ms. */
  loopDelayP50: number;
  loopDelayP99: number;
  loopDelayMax: number;
  /** Heap and RSS growth per held lease, bytes. */
  heapBytesPerLease: number;
  rssBytesPerLease: number;
  /** Time close() took to release every lease, ms. */
  closeMs: number;
}

/**
 * Row 4's baseline: the same N keys renewed by bare CAS at the same rate,
 * issued from one shared timer (a timing wheel), as the limit the server
 * and the client library set.
 */
export interface BareScaleRun {
  n: number;
  ttl: number;
  holdMs: number;
  /** Keys whose CAS was answered after the previous one's send time + TTL, or found the entry gone. */
  lost: number;
  /** Successful CAS renewals per second. */
  renewalsPerSec: number;
  serverInMsgsPerSec: number;
  expectedRenewalsPerSec: number;
  cpuShare: number;
  serverCpuShare: number | null;
  cpuUsPerRenewal: number;
  loopDelayP50: number;
  loopDelayP99: number;
  loopDelayMax: number;
}

/** One failover measurement series. */
export interface Failover {
  /** Median ms from the holder's death or close request to the successor's first write. */
  ms: number;
  /** Every repeat, ms. */
  runs: number[];
}

/** What one benchmark run reports; `null` rows were not run. */
export interface BenchReport {
  schema: 1;
  mode: "smoke" | "full";
  startedAt: string;
  durationMs: number;
  machine: {
    cores: number;
    cpuModel: string;
    memoryGiB: number;
    platform: string;
  };
  runtime: { name: "deno" | "bun" | "node"; version: string };
  server: { version: string; storage: "file"; replicas: 1 };
  /** First 12 hex digits of the SHA-256 of the lease module measured (`lease.ts`, then `lease/*.ts` by name). */
  leaseSha256: string;
  runs: number;
  latency: null | {
    ops: number;
    guard: Latency;
    cas: Latency;
    get: Latency;
    /** Diagnostic: a bare CAS carrying a `Nats-Msg-Id` as the lease's does. */
    casMsgId: Latency;
    /** Median over repeats of guard p50 / CAS p50. */
    ratioP50: number;
    target: number;
    met: boolean;
    /** Client CPU per op, µs. */
    guardCpuUs: number;
    casCpuUs: number;
    casMsgIdCpuUs: number;
    /** `guard(key, write, { check: "lease" })` on a held key, its write a counter bump, interleaved with the rest. */
    lease: {
      guard: Latency;
      /** Client CPU per op, µs. */
      cpuUs: number;
      /** Share of those guards whose write ran within the call (no round trip). */
      fastShare: number;
      /** Median over repeats of CAS guard p50 / lease guard p50. */
      speedupP50: number;
      target: number;
      met: boolean;
    };
  };
  throughput: null | {
    concurrency: number;
    keys: number;
    guard: Rate;
    cas: Rate;
    /** Diagnostic: bare CASes carrying a `Nats-Msg-Id` as the lease's do. */
    casMsgId: Rate;
    /** Median over repeats of guard rate / CAS rate. */
    ratio: number;
    target: number;
    met: boolean;
  };
  sameKey: null | {
    concurrency: number;
    /** `check: "cas"` guards of `noop`. */
    concurrent: Rate;
    sequential: Rate;
    /** Median over repeats of concurrent rate / sequential rate. */
    speedup: number;
    /** `check: "lease"` guards beside direct calls, per write; `noop` first. */
    lease: { noop: LeaseWrite; cpu: LeaseWrite; hop: LeaseWrite };
    /** Medians over repeats of lease(noop) rate / CAS(noop) rate. */
    leaseOverCasConcurrent: number;
    leaseOverCasSequential: number;
  };
  scale: null | {
    target: ScaleRun;
    targetBare: BareScaleRun;
    met: boolean;
    /** Breaking-point search, each lease run beside its bare baseline. */
    steps: { lease: ScaleRun; bare: BareScaleRun }[];
    /** Most leases held with none lost, and the first count that lost some. */
    heldWithoutLoss: number;
    brokeAt: number | null;
    /** Bare CAS rate of row 2 × TTL/3: the lease count the server could renew at most. */
    predictedLimit: number | null;
  };
  failover: null | {
    ttl: number;
    graceMs: number;
    /** TTL + grace: the bound on failover after a crash. */
    bound: number;
    /** The successor retries guard() itself (sleeping `retryAfter`, or 5 ms). */
    kill: Failover;
    close: Failover;
    /** The successor waits in one guard({ wait: true }). */
    killWait: Failover;
    closeWait: Failover;
    /** guard({ wait: true }) on a bucket without expiry markers. */
    killWaitNoMarkers: Failover;
    /** Whether the bucket of `kill` and `killWait` has expiry markers. */
    markers: boolean;
    /**
     * A never-used key: the first guard's ms (median) beside a bare
     * `kv.create` of another new key, on the bucket with markers and on
     * the one without.
     */
    fresh: { guard: number; create: number; guardNoMarkers: number };
  };
  memory: null | {
    n: number;
    heapBytesPerLease: number;
    rssBytesPerLease: number;
    /** Whether a full GC ran before each heap reading. */
    gc: boolean;
  };
}

// ---------------------------------------------------------------------------
// Runtime facts, by feature checks.

interface DenoLike {
  version: { deno: string };
}
interface BunLike {
  version: string;
  gc?: (force: boolean) => void;
}

function runtime(): BenchReport["runtime"] {
  const g = globalThis as { Deno?: DenoLike; Bun?: BunLike };
  if (typeof g.Deno?.version?.deno === "string") {
    return { name: "deno", version: g.Deno.version.deno };
  }
  if (typeof g.Bun?.version === "string") {
    return { name: "bun", version: g.Bun.version };
  }
  return { name: "node", version: process.versions.node ?? "unknown" };
}

/** The command that runs a TypeScript file on this runtime. */
export function scriptCommand(file: string): string[] {
  const g = globalThis as { Deno?: DenoLike };
  return g.Deno ? [process.execPath, "run", "-A", file] : [
    process.execPath,
    file,
  ];
}

/** A full GC, when the runtime lets us ask for one. */
function findGc(): (() => void) | undefined {
  const bun = (globalThis as { Bun?: BunLike }).Bun;
  if (typeof bun?.gc === "function") return () => bun.gc!(true);
  const exposed = (globalThis as { gc?: () => void }).gc;
  if (typeof exposed === "function") return exposed;
  try {
    v8.setFlagsFromString("--expose-gc");
    const gc: unknown = vm.runInNewContext("gc");
    if (typeof gc === "function") return gc as () => void;
  } catch {
    // No V8 flags here: heap readings include garbage.
  }
  return undefined;
}

const gc = findGc();

function collect(): void {
  gc?.();
  gc?.();
}

/** CPU time of a process in ms (Linux /proc), or null. */
function processCpuMs(pid: number): number | null {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the ")" that closes the command name; utime and stime
    // are fields 14 and 15, in clock ticks (100 per second on Linux).
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------------------
// Small tools.

function percentile(values: number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = Float64Array.from(values).sort();
  const i = Math.min(
    sorted.length - 1,
    Math.max(0, Math.ceil(p * sorted.length) - 1),
  );
  return sorted[i]!;
}

function median(values: number[]): number {
  return percentile(values, 0.5);
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function cpuUs(): number {
  const u = process.cpuUsage();
  return u.user + u.system;
}

interface Varz {
  in_msgs: number;
  out_msgs: number;
}

async function varz(ns: NatsServer): Promise<Varz> {
  const res = await fetch(`${ns.httpUrl}/varz`);
  const v = await res.json() as Varz;
  return { in_msgs: v.in_msgs, out_msgs: v.out_msgs };
}

/** Samples event-loop delay as the drift of a 10 ms setTimeout chain. */
function loopSampler(): { stop(): number[] } {
  const interval = 10;
  const drift: number[] = [];
  let due = performance.now() + interval;
  let timer = setTimeout(function tick() {
    const now = performance.now();
    drift.push(Math.max(0, now - due));
    due = now + interval;
    timer = setTimeout(tick, interval);
  }, interval);
  return {
    stop() {
      clearTimeout(timer);
      return drift;
    },
  };
}

/** Runs `op` in `workers` loops for `ms`; returns the rate and latencies. */
async function phase(
  ns: NatsServer,
  ms: number,
  workers: number,
  op: (worker: number, i: number) => unknown,
): Promise<Rate> {
  const latencies: number[] = [];
  const v0 = await varz(ns);
  const c0 = cpuUs();
  const t0 = performance.now();
  const end = t0 + ms;
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      for (let i = 0; performance.now() < end; i++) {
        const s = performance.now();
        await op(w, i);
        latencies.push(performance.now() - s);
      }
    }),
  );
  const wall = performance.now() - t0;
  const cpu = cpuUs() - c0;
  const v1 = await varz(ns);
  const n = latencies.length;
  return {
    opsPerSec: n / (wall / 1000),
    p50: percentile(latencies, 0.5),
    p99: percentile(latencies, 0.99),
    cpuUsPerOp: cpu / n,
    serverMsgsPerOp: (v1.in_msgs - v0.in_msgs) / n,
  };
}

function medianRate(rates: Rate[]): Rate {
  const m = (f: (r: Rate) => number) => median(rates.map(f));
  return {
    opsPerSec: m((r) => r.opsPerSec),
    p50: m((r) => r.p50),
    p99: m((r) => r.p99),
    cpuUsPerOp: m((r) => r.cpuUsPerOp),
    serverMsgsPerOp: m((r) => r.serverMsgsPerOp),
  };
}

/** Runs the phases in a rotating order per repeat, so neither side always goes first. */
async function interleaved<T>(
  runs: number,
  phases: (() => Promise<T>)[],
): Promise<T[][]> {
  const out: T[][] = phases.map(() => []);
  for (let r = 0; r < runs; r++) {
    for (let k = 0; k < phases.length; k++) {
      const i = (r + k) % phases.length;
      out[i]!.push(await phases[i]!());
    }
  }
  return out;
}

const noop = (): void => {};

/** A guard that proves a held lease by its last renewal, not by a CAS. */
const LEASE: GuardOptions = { check: "lease" };

const scratch = Uint8Array.from({ length: 1024 }, (_, i) => (i * 31) & 255);
let sink = 0;

/**
 * Row 3's writes: nothing at all, a small fixed amount of CPU work, and one
 * async step that is not a server round trip. The last two show whether a
 * lease-checked guard's rate is set by the write or by the library.
 */
const WRITES: Record<
  "noop" | "cpu" | "hop",
  { what: string; fn: () => unknown }
> = {
  noop: { what: "noop", fn: noop },
  cpu: {
    what: "FNV-1a over 1 KiB",
    fn: () => {
      let h = 0x811c9dc5;
      for (let i = 0; i < scratch.length; i++) {
        h = Math.imul(h ^ scratch[i]!, 0x01000193);
      }
      // Kept where the optimiser cannot drop the loop.
      sink ^= h;
    },
  },
  hop: {
    what: "await one setImmediate",
    fn: () => new Promise<void>((resolve) => setImmediate(resolve)),
  },
};

// ---------------------------------------------------------------------------
// Rows 1 to 3: one manager and one bare KV handle on one connection.

/**
 * A bare CAS with the wire shape of the lease's: expected-sequence header
 * plus a unique `Nats-Msg-Id`, which the server checks against its
 * duplicate window. Splits the guard's overhead into wire and client parts.
 */
function casWithMsgId(
  js: JetStreamClient,
): (key: string, rev: number) => Promise<number> {
  const data = new TextEncoder().encode("bench");
  const instance = crypto.randomUUID().replaceAll("-", "");
  let counter = 0;
  return async (key, rev) =>
    (await js.publish(`$KV.bench.${key}`, data, {
      expect: { lastSubjectSequence: rev },
      msgID: `lease:${instance}:1:${++counter}`,
    })).seq;
}

async function rowLatency(
  cfg: BenchConfig,
  leases: LeaseManager,
  kv: KV,
  js: JetStreamClient,
): Promise<NonNullable<BenchReport["latency"]>> {
  await leases.guard("lat.lease", noop);
  await leases.guard("lat.check", noop);
  // A write that runs within guard() leaves its mark before guard() returns:
  // that tells a lease-checked guard from one that fell back to a CAS.
  let ran = 0;
  const mark = (): void => {
    ran++;
  };
  let slow = 0;
  let rev = await kv.put("lat.bare", "bench");
  let revId = await kv.put("lat.msgid", "bench");
  const withId = casWithMsgId(js);
  const sequential = async (op: () => Promise<unknown>) => {
    const lat: number[] = [];
    const c0 = cpuUs();
    for (let i = 0; i < cfg.latencyOps; i++) {
      const s = performance.now();
      await op();
      lat.push(performance.now() - s);
    }
    return {
      p50: percentile(lat, 0.5),
      p99: percentile(lat, 0.99),
      cpu: (cpuUs() - c0) / cfg.latencyOps,
    };
  };
  const [guard, cas, get, casMsgId, lease] = await interleaved(cfg.runs, [
    () => sequential(() => leases.guard("lat.lease", noop)),
    () =>
      sequential(async () => rev = await kv.update("lat.bare", "bench", rev)),
    () => sequential(() => kv.get("lat.bare")),
    () => sequential(async () => revId = await withId("lat.msgid", revId)),
    () =>
      sequential(() => {
        const before = ran;
        const done = leases.guard("lat.check", mark, LEASE);
        if (ran === before) slow++;
        return done;
      }),
  ]);
  const ratios = guard!.map((g, i) => g.p50 / cas![i]!.p50);
  const speedupP50 = median(guard!.map((g, i) => g.p50 / lease![i]!.p50));
  const ratioP50 = median(ratios);
  const pick = (xs: { p50: number; p99: number }[]): Latency => ({
    p50: median(xs.map((x) => x.p50)),
    p99: median(xs.map((x) => x.p99)),
  });
  return {
    ops: cfg.latencyOps,
    guard: pick(guard!),
    cas: pick(cas!),
    get: pick(get!),
    casMsgId: pick(casMsgId!),
    ratioP50,
    target: 1.15,
    met: ratioP50 <= 1.15,
    guardCpuUs: median(guard!.map((g) => g.cpu)),
    casCpuUs: median(cas!.map((c) => c.cpu)),
    casMsgIdCpuUs: median(casMsgId!.map((c) => c.cpu)),
    lease: {
      guard: pick(lease!),
      cpuUs: median(lease!.map((l) => l.cpu)),
      fastShare: 1 - slow / (cfg.runs * cfg.latencyOps),
      speedupP50,
      target: 50,
      met: speedupP50 >= 50,
    },
  };
}

const CONCURRENCY = 64;
const KEYS = 256;

async function rowThroughput(
  cfg: BenchConfig,
  ns: NatsServer,
  leases: LeaseManager,
  kv: KV,
  js: JetStreamClient,
): Promise<NonNullable<BenchReport["throughput"]>> {
  const leaseKeys = Array.from({ length: KEYS }, (_, i) => `tp.lease.${i}`);
  const bareKeys = Array.from({ length: KEYS }, (_, i) => `tp.bare.${i}`);
  const idKeys = Array.from({ length: KEYS }, (_, i) => `tp.msgid.${i}`);
  const revs = await Promise.all(bareKeys.map((k) => kv.put(k, "bench")));
  const idRevs = await Promise.all(idKeys.map((k) => kv.put(k, "bench")));
  const withId = casWithMsgId(js);
  await Promise.all(leaseKeys.map((k) => leases.guard(k, noop)));
  // Worker w owns keys w, w+64, w+128, w+192: no two workers share a key,
  // so bare CASes never conflict and guards never share a round trip.
  const slot = (w: number, i: number) =>
    w + CONCURRENCY * (i % (KEYS / CONCURRENCY));
  const [guard, cas, casMsgId] = await interleaved(cfg.runs, [
    () =>
      phase(
        ns,
        cfg.phaseMs,
        CONCURRENCY,
        (w, i) => leases.guard(leaseKeys[slot(w, i)]!, noop),
      ),
    () =>
      phase(ns, cfg.phaseMs, CONCURRENCY, async (w, i) => {
        const k = slot(w, i);
        revs[k] = await kv.update(bareKeys[k]!, "bench", revs[k]!);
      }),
    () =>
      phase(ns, cfg.phaseMs, CONCURRENCY, async (w, i) => {
        const k = slot(w, i);
        idRevs[k] = await withId(idKeys[k]!, idRevs[k]!);
      }),
  ]);
  const ratio = median(guard!.map((g, i) => g.opsPerSec / cas![i]!.opsPerSec));
  return {
    concurrency: CONCURRENCY,
    keys: KEYS,
    guard: medianRate(guard!),
    cas: medianRate(cas!),
    casMsgId: medianRate(casMsgId!),
    ratio,
    target: 0.8,
    met: ratio >= 0.8,
  };
}

async function rowSameKey(
  cfg: BenchConfig,
  ns: NatsServer,
  leases: LeaseManager,
): Promise<NonNullable<BenchReport["sameKey"]>> {
  await leases.guard("hot", noop);
  await leases.guard("hot.check", noop);
  const names = ["noop", "cpu", "hop"] as const;
  // Per write: lease-checked guards (64 writers, one), then the same loop
  // calling the write itself (64, one); all interleaved with the CAS guards.
  const phases = [
    () => phase(ns, cfg.phaseMs, CONCURRENCY, () => leases.guard("hot", noop)),
    () => phase(ns, cfg.phaseMs, 1, () => leases.guard("hot", noop)),
    ...names.flatMap((name) => {
      const write = WRITES[name].fn;
      return [
        () =>
          phase(
            ns,
            cfg.phaseMs,
            CONCURRENCY,
            () => leases.guard("hot.check", write, LEASE),
          ),
        () =>
          phase(
            ns,
            cfg.phaseMs,
            1,
            () => leases.guard("hot.check", write, LEASE),
          ),
        () => phase(ns, cfg.phaseMs, CONCURRENCY, write),
        () => phase(ns, cfg.phaseMs, 1, write),
      ];
    }),
  ];
  const [concurrent, sequential, ...rest] = await interleaved(
    cfg.runs,
    phases,
  );
  const perRun = (a: Rate[], b: Rate[]) =>
    median(a.map((x, i) => x.opsPerSec / b[i]!.opsPerSec));
  const lease = (k: number): LeaseWrite => {
    const [l64, l1, d64, d1] = rest.slice(4 * k, 4 * k + 4) as [
      Rate[],
      Rate[],
      Rate[],
      Rate[],
    ];
    return {
      write: WRITES[names[k]!].what,
      lease: { concurrent: medianRate(l64), sequential: medianRate(l1) },
      direct: { concurrent: medianRate(d64), sequential: medianRate(d1) },
      ratioConcurrent: perRun(l64, d64),
      ratioSequential: perRun(l1, d1),
    };
  };
  return {
    concurrency: CONCURRENCY,
    concurrent: medianRate(concurrent!),
    sequential: medianRate(sequential!),
    speedup: perRun(concurrent!, sequential!),
    lease: { noop: lease(0), cpu: lease(1), hop: lease(2) },
    leaseOverCasConcurrent: perRun(rest[0]!, concurrent!),
    leaseOverCasSequential: perRun(rest[1]!, sequential!),
  };
}

// ---------------------------------------------------------------------------
// Row 4 (and 6): one manager renewing N leases.

async function scaleRun(
  ns: NatsServer,
  n: number,
  ttl: number,
  holdMs: number,
): Promise<ScaleRun> {
  const bucket = `scale_${n}`;
  const nc = await connect({ servers: ns.url });
  try {
    const keys = Array.from({ length: n }, (_, i) => `k.${i}`);
    const signals: (AbortSignal | undefined)[] = new Array(n).fill(undefined);
    const leases = await createLeaseManager({
      nc,
      node: "scale",
      bucket,
      ttl,
      restartGrace: false,
    });
    collect();
    const heap0 = process.memoryUsage().heapUsed;
    const rss0 = process.memoryUsage().rss;

    // Acquire every key through a guard, keeping its lease signal: it
    // aborts when the lease is lost or can no longer be vouched for.
    const t0 = performance.now();
    let next = 0;
    let notAcquired = 0;
    await Promise.all(Array.from({ length: 256 }, async () => {
      while (next < n) {
        const i = next++;
        for (let attempt = 0;; attempt++) {
          try {
            await leases.guard(keys[i]!, (lease) => {
              signals[i] = lease.signal;
            });
            break;
          } catch (err) {
            if (attempt >= 5) {
              notAcquired++;
              break;
            }
            if (!(err instanceof UnavailableError)) throw err;
            await sleep(ttl / 10);
          }
        }
      }
    }));
    const acquireMs = performance.now() - t0;
    const lostDuringAcquire = signals.filter((s) => s?.aborted).length;
    collect();
    const heap1 = process.memoryUsage().heapUsed;
    const rss1 = process.memoryUsage().rss;

    const sampler = loopSampler();
    const v0 = await varz(ns);
    const c0 = cpuUs();
    const s0 = processCpuMs(ns.pid);
    const h0 = performance.now();
    await sleep(holdMs);
    const wall = performance.now() - h0;
    const cpu = cpuUs() - c0;
    const s1 = processCpuMs(ns.pid);
    const v1 = await varz(ns);
    const drift = sampler.stop();

    let lostNotHolder = 0;
    let lostExpired = 0;
    for (const s of signals) {
      if (!s?.aborted) continue;
      if (s.reason instanceof NotHolderError) lostNotHolder++;
      else lostExpired++;
    }
    const c1 = performance.now();
    await leases.close();
    const closeMs = performance.now() - c1;
    const kvm = new Kvm(nc);
    await dropBucket(kvm, bucket);

    const renewals = v1.in_msgs - v0.in_msgs;
    return {
      n,
      ttl,
      holdMs,
      acquireMs,
      notAcquired,
      lost: lostNotHolder + lostExpired,
      lostDuringAcquire,
      lostNotHolder,
      lostExpired,
      serverInMsgsPerSec: renewals / (wall / 1000),
      expectedRenewalsPerSec: n / (ttl / 3 / 1000),
      cpuShare: cpu / 1000 / wall,
      serverCpuShare: s0 === null || s1 === null ? null : (s1 - s0) / wall,
      cpuUsPerRenewal: renewals > 0 ? cpu / renewals : NaN,
      loopDelayP50: percentile(drift, 0.5),
      loopDelayP99: percentile(drift, 0.99),
      loopDelayMax: percentile(drift, 1),
      heapBytesPerLease: (heap1 - heap0) / n,
      rssBytesPerLease: (rss1 - rss0) / n,
      closeMs,
    };
  } finally {
    await nc.close();
  }
}

/** Deletes a bucket to free the server for the next run; best effort. */
async function dropBucket(kvm: Kvm, bucket: string): Promise<void> {
  try {
    await (await kvm.open(bucket)).destroy();
  } catch {
    // A server still digesting the run: the next run uses another bucket.
  }
}

/** A "wrong last sequence" answer: the entry moved or expired. */
function isConflict(err: unknown): boolean {
  return err instanceof Error && /wrong last sequence/.test(err.message);
}

async function bareScaleRun(
  ns: NatsServer,
  n: number,
  ttl: number,
  holdMs: number,
): Promise<BareScaleRun> {
  const bucket = `bare_${n}`;
  const nc = await connect({ servers: ns.url });
  try {
    const js = jetstream(nc, { timeout: ttl / 4 });
    const kv = await new Kvm(js).create(bucket, { ttl, history: 1 });
    const keys = Array.from({ length: n }, (_, i) => `k.${i}`);
    const revs = new Float64Array(n);
    const validUntil = new Float64Array(n);
    const lostKey = new Uint8Array(n);
    let lost = 0;
    let renewed = 0;
    const loss = (i: number) => {
      if (lostKey[i]) return;
      lostKey[i] = 1;
      lost++;
    };

    // One timer for all keys: each tick sends every renewal that is due,
    // so the client library writes them to the socket together.
    const period = ttl / 3;
    const tick = 20;
    const slots = Math.ceil(period / tick) + 2;
    const wheel: number[][] = Array.from({ length: slots }, () => []);
    let slot = 0;
    let tickAt = performance.now();
    const schedule = (i: number, at: number) => {
      const ahead = Math.min(
        slots - 1,
        Math.max(1, Math.ceil((at - tickAt) / tick)),
      );
      wheel[(slot + ahead) % slots]!.push(i);
    };
    const renew = (i: number) => {
      if (lostKey[i]) return;
      const sent = performance.now();
      kv.update(keys[i]!, "bench", revs[i]!).then((rev) => {
        if (performance.now() > validUntil[i]!) loss(i);
        revs[i] = rev;
        validUntil[i] = sent + ttl;
        renewed++;
        schedule(i, sent + period);
      }, (err) => {
        if (isConflict(err)) loss(i);
        else schedule(i, performance.now() + ttl / 10);
      });
    };
    const timer = setInterval(() => {
      const now = performance.now();
      while (tickAt + tick <= now) {
        tickAt += tick;
        slot = (slot + 1) % slots;
        const due = wheel[slot]!;
        wheel[slot] = [];
        for (const i of due) renew(i);
      }
    }, tick);

    let next = 0;
    await Promise.all(Array.from({ length: 256 }, async () => {
      while (next < n) {
        const i = next++;
        for (let attempt = 0;; attempt++) {
          const sent = performance.now();
          try {
            revs[i] = await kv.put(keys[i]!, "bench");
            validUntil[i] = sent + ttl;
            schedule(i, sent + period);
            break;
          } catch (err) {
            // As for the leases: a few tries, then the key counts as lost.
            if (attempt >= 5 || isConflict(err)) {
              loss(i);
              break;
            }
            await sleep(ttl / 10);
          }
        }
      }
    }));

    const sampler = loopSampler();
    const v0 = await varz(ns);
    const c0 = cpuUs();
    const s0 = processCpuMs(ns.pid);
    const r0 = renewed;
    const h0 = performance.now();
    await sleep(holdMs);
    const wall = performance.now() - h0;
    const cpu = cpuUs() - c0;
    const count = renewed - r0;
    const s1 = processCpuMs(ns.pid);
    const v1 = await varz(ns);
    const drift = sampler.stop();
    clearInterval(timer);
    // Let the last answers in before the connection closes.
    await sleep(Math.min(ttl / 4, 500));
    await dropBucket(new Kvm(nc), bucket);
    return {
      n,
      ttl,
      holdMs,
      lost,
      renewalsPerSec: count / (wall / 1000),
      serverInMsgsPerSec: (v1.in_msgs - v0.in_msgs) / (wall / 1000),
      expectedRenewalsPerSec: n / (period / 1000),
      cpuShare: cpu / 1000 / wall,
      serverCpuShare: s0 === null || s1 === null ? null : (s1 - s0) / wall,
      cpuUsPerRenewal: count > 0 ? cpu / count : NaN,
      loopDelayP50: percentile(drift, 0.5),
      loopDelayP99: percentile(drift, 0.99),
      loopDelayMax: percentile(drift, 1),
    };
  } finally {
    await nc.close();
  }
}

// ---------------------------------------------------------------------------
// Row 5: failover to a successor in this process.

interface Child {
  lines: AsyncIterator<string>;
  kill(): void;
  close(): void;
  exited: Promise<void>;
}

function startHolder(
  url: string,
  bucket: string,
  key: string,
  ttl: number,
): Child {
  const file = fileURLToPath(new URL("./_failover_child.ts", import.meta.url));
  const [cmd, ...args] = scriptCommand(file);
  const child = spawn(cmd!, [...args, url, bucket, key, String(ttl)], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  const lines = createInterface({ input: child.stdout! })
    [Symbol.asyncIterator]();
  return {
    lines,
    kill: () => child.kill("SIGKILL"),
    close: () => child.stdin!.write("close\n"),
    exited,
  };
}

async function expectLine(child: Child, want: string): Promise<void> {
  const { value, done } = await child.lines.next();
  if (done || value.trim() !== want) {
    throw new Error(
      `Cannot run the failover benchmark as the holder said ${
        done ? "nothing" : JSON.stringify(value)
      } where '${want}' was expected`,
    );
  }
}

/** Polls guard() until a write runs; returns when it did. */
async function firstWrite(
  leases: LeaseManager,
  key: string,
  until: number,
): Promise<number> {
  for (;;) {
    try {
      await leases.guard(key, noop);
      return performance.now();
    } catch (err) {
      if (performance.now() > until) throw err;
      if (err instanceof NotHolderError && err.retryAfter !== undefined) {
        await sleep(err.retryAfter);
      } else if (
        err instanceof NotHolderError || err instanceof UnavailableError
      ) {
        await sleep(5);
      } else {
        throw err;
      }
    }
  }
}

async function failoverOnce(
  ns: NatsServer,
  successor: LeaseManager,
  key: string,
  how: "kill" | "close",
  wait = false,
): Promise<number> {
  const ttl = successor.ttl;
  const child = startHolder(ns.url, successor.bucket, key, ttl);
  try {
    await expectLine(child, "held");
    // Let the successor see the holder, as a running peer would have.
    await successor.guard(key, noop).then(
      () => {
        throw new Error(`The successor got '${key}' while the holder held it`);
      },
      (err) => {
        if (!(err instanceof NotHolderError)) throw err;
      },
    );
    let t0 = 0;
    // A waiter is already waiting when the holder goes, as in a service.
    const waiting = wait
      ? successor.guard(key, () => performance.now(), {
        wait: true,
        signal: AbortSignal.timeout(15 * ttl),
      })
      : undefined;
    if (waiting) await sleep(50);
    t0 = performance.now();
    if (how === "kill") child.kill();
    else child.close();
    const t1 = waiting
      ? await waiting
      : await firstWrite(successor, key, t0 + 10 * ttl);
    if (how === "close") await expectLine(child, "closed");
    return t1 - t0;
  } finally {
    child.kill();
    await child.exited;
  }
}

async function rowFailover(
  cfg: BenchConfig,
  ns: NatsServer,
  nc: NatsConnection,
): Promise<NonNullable<BenchReport["failover"]>> {
  const ttl = cfg.failover.ttl;
  const successor = await createLeaseManager({
    nc,
    node: "successor",
    bucket: "failover",
    ttl,
  });
  const plain = await createLeaseManager({
    nc,
    node: "successor",
    bucket: "failover_plain",
    ttl,
    markers: false,
  });
  try {
    const markers = ((await jetstreamManager(nc).then((jsm) =>
      jsm.streams.info("KV_failover")
    )).config as { subject_delete_marker_ttl?: number })
      .subject_delete_marker_ttl !== undefined;
    const kv = await new Kvm(nc).open("failover");
    const series = (): number[] => [];
    const [kill, close, killWait, closeWait, killPlain] = [
      series(),
      series(),
      series(),
      series(),
      series(),
    ];
    const [freshGuard, freshCreate, freshPlain] = [
      series(),
      series(),
      series(),
    ];
    for (let r = 0; r < cfg.failover.runs; r++) {
      kill.push(await failoverOnce(ns, successor, `kill.${r}`, "kill"));
      close.push(await failoverOnce(ns, successor, `close.${r}`, "close"));
      killWait.push(
        await failoverOnce(ns, successor, `killw.${r}`, "kill", true),
      );
      closeWait.push(
        await failoverOnce(ns, successor, `closew.${r}`, "close", true),
      );
      killPlain.push(await failoverOnce(ns, plain, `killp.${r}`, "kill", true));
      let t = performance.now();
      await kv.create(`bare.${r}`, "x");
      freshCreate.push(performance.now() - t);
      t = performance.now();
      // Waits the grace where the server has no markers (before 2.11.2).
      await successor.guard(`fresh.${r}`, noop, { wait: true });
      freshGuard.push(performance.now() - t);
      t = performance.now();
      await plain.guard(`fresh.${r}`, noop, { wait: true });
      freshPlain.push(performance.now() - t);
    }
    return {
      ttl,
      graceMs: ttl,
      bound: 2 * ttl,
      kill: { ms: median(kill), runs: kill },
      close: { ms: median(close), runs: close },
      killWait: { ms: median(killWait), runs: killWait },
      closeWait: { ms: median(closeWait), runs: closeWait },
      killWaitNoMarkers: { ms: median(killPlain), runs: killPlain },
      markers,
      fresh: {
        guard: median(freshGuard),
        create: median(freshCreate),
        guardNoMarkers: median(freshPlain),
      },
    };
  } finally {
    await successor.close();
    await plain.close();
  }
}

// ---------------------------------------------------------------------------
// The whole run.

/**
 * Runs the benchmark on a server of its own and returns the report.
 *
 * @param cfg What to run, from {@linkcode config}.
 * @param log Receives progress lines.
 * @returns The report.
 */
export async function runBench(
  cfg: BenchConfig,
  log: (line: string) => void = noop,
): Promise<BenchReport> {
  const started = performance.now();
  const report: BenchReport = {
    schema: 1,
    mode: cfg.mode,
    startedAt: new Date().toISOString(),
    durationMs: 0,
    machine: {
      cores: os.cpus().length,
      cpuModel: os.cpus()[0]?.model ?? "unknown",
      memoryGiB: Math.round(os.totalmem() / 2 ** 30),
      platform: `${os.platform()} ${os.arch()}`,
    },
    runtime: runtime(),
    server: { version: "", storage: "file", replicas: 1 },
    leaseSha256: leaseModuleHash(),
    runs: cfg.runs,
    latency: null,
    throughput: null,
    sameKey: null,
    scale: null,
    failover: null,
    memory: null,
  };
  const ns = await NatsServer.start();
  report.server.version = ns.version;
  const nc = await connect({ servers: ns.url });
  try {
    if (cfg.rows.has(1) || cfg.rows.has(2) || cfg.rows.has(3)) {
      const leases = await createLeaseManager({
        nc,
        node: "bench",
        bucket: "bench",
        ttl: 60_000,
        restartGrace: false,
      });
      const js = jetstream(nc);
      const kv = await new Kvm(js).open("bench");
      try {
        if (cfg.rows.has(1)) {
          log("row 1: guard latency");
          report.latency = await rowLatency(cfg, leases, kv, js);
        }
        if (cfg.rows.has(2)) {
          log("row 2: throughput across keys");
          report.throughput = await rowThroughput(cfg, ns, leases, kv, js);
        }
        if (cfg.rows.has(3)) {
          log("row 3: same-key concurrency");
          report.sameKey = await rowSameKey(cfg, ns, leases);
        }
      } finally {
        await leases.close();
      }
    }
    if (cfg.rows.has(4) || cfg.rows.has(6)) {
      const { n, ttl, holdMs } = cfg.scale;
      log(`row 4: ${n} leases, TTL ${ttl} ms, for ${holdMs} ms`);
      const target = await scaleRun(ns, n, ttl, holdMs);
      const bareHold = Math.min(holdMs, cfg.bareHoldMs);
      log(`row 4: bare CAS baseline, ${n} keys for ${bareHold} ms`);
      const targetBare = await bareScaleRun(ns, n, ttl, bareHold);
      const steps: { lease: ScaleRun; bare: BareScaleRun }[] = [];
      const holds = (r: ScaleRun) => r.lost === 0 && r.notAcquired === 0;
      let heldWithoutLoss = holds(target) ? n : 0;
      let brokeAt: number | null = holds(target) ? null : n;
      if (cfg.rows.has(4)) {
        // Up from the target while leases hold; down from it once lost.
        const up = holds(target);
        const tries = up
          ? cfg.breakSteps.filter((s) => s > n).sort((a, b) => a - b)
          : cfg.breakSteps.filter((s) => s < n).sort((a, b) => b - a);
        for (const step of tries) {
          log(`row 4: ${step} leases for ${cfg.breakHoldMs} ms`);
          const lease = await scaleRun(ns, step, ttl, cfg.breakHoldMs);
          const bareStepHold = Math.min(cfg.breakHoldMs, cfg.bareHoldMs);
          log(`row 4: bare CAS baseline, ${step} keys for ${bareStepHold} ms`);
          const bare = await bareScaleRun(ns, step, ttl, bareStepHold);
          steps.push({ lease, bare });
          if (holds(lease)) heldWithoutLoss = Math.max(heldWithoutLoss, step);
          else brokeAt = brokeAt === null ? step : Math.min(brokeAt, step);
          if (up !== holds(lease)) break;
        }
      }
      const bare = report.throughput?.cas.opsPerSec;
      report.scale = {
        target,
        targetBare,
        met: holds(target),
        steps,
        heldWithoutLoss,
        brokeAt,
        predictedLimit: bare === undefined
          ? null
          : Math.round(bare * ttl / 3 / 1000),
      };
      report.memory = {
        n,
        heapBytesPerLease: target.heapBytesPerLease,
        rssBytesPerLease: target.rssBytesPerLease,
        gc: gc !== undefined,
      };
    }
    if (cfg.rows.has(5)) {
      log("row 5: failover");
      report.failover = await rowFailover(cfg, ns, nc);
    }
  } finally {
    await nc.close();
    try {
      await ns[Symbol.asyncDispose]();
    } catch (err) {
      // The figures are in; a server slow to die must not lose them.
      log(`could not stop nats-server: ${String(err)}`);
    }
  }
  report.durationMs = performance.now() - started;
  return report;
}

// ---------------------------------------------------------------------------
// Tables.

function ms(x: number): string {
  if (!Number.isFinite(x)) return "–";
  if (x < 0.01) return `${(x * 1000).toFixed(1)} µs`;
  if (x < 1) return `${Math.round(x * 1000)} µs`;
  if (x < 10) return `${x.toFixed(2)} ms`;
  return `${Math.round(x).toLocaleString("en-US")} ms`;
}

function num(x: number, digits = 0): string {
  if (!Number.isFinite(x)) return "–";
  return x.toLocaleString("en-US", {
    maximumFractionDigits: digits,
    minimumFractionDigits: digits,
  });
}

function pct(x: number | null): string {
  return x === null || !Number.isFinite(x) ? "–" : `${Math.round(x * 100)}%`;
}

function check(met: boolean): string {
  return met ? "met" : "**missed**";
}

function scaleCells(s: ScaleRun): string {
  return `${num(s.n)} leases, ${s.holdMs / 1000} s: **${num(s.lost)} lost**` +
    (s.lost ? ` (${num(s.lostDuringAcquire)} while acquiring)` : "") +
    `, acquired in ${ms(s.acquireMs)}` +
    (s.notAcquired ? ` (${num(s.notAcquired)} not acquired)` : "") +
    `; ${num(s.serverInMsgsPerSec)} msgs/s in (${
      num(s.expectedRenewalsPerSec)
    } expected); client CPU ${pct(s.cpuShare)}, server ${
      pct(s.serverCpuShare)
    }; loop p99 ${ms(s.loopDelayP99)}; ${
      num(s.cpuUsPerRenewal, 1)
    } µs CPU/renewal`;
}

function bareCells(b: BareScaleRun): string {
  return `bare kv.update, one timer, ${b.holdMs / 1000} s: ${
    num(b.lost)
  } lost; ${num(b.renewalsPerSec)} CAS/s; client CPU ${
    pct(b.cpuShare)
  }, server ${pct(b.serverCpuShare)}; loop p99 ${ms(b.loopDelayP99)}; ${
    num(b.cpuUsPerRenewal, 1)
  } µs CPU/renewal`;
}

/**
 * Renders a report as a Markdown table.
 *
 * @param r The report.
 * @returns The table, with a heading line naming the machine.
 */
export function table(r: BenchReport): string {
  const out: string[] = [
    `nats-lease bench (${r.mode}): ${r.runtime.name} ${r.runtime.version}, nats-server ${r.server.version} (R1, file storage), ${r.machine.cores} cores (${r.machine.cpuModel}), ${r.machine.platform}, lease.ts ${r.leaseSha256}; rows 1-3 are medians of ${r.runs} interleaved runs, ratios medians of per-run ratios`,
    "",
    "| # | measure | lease | baseline (same run) | ratio | target |",
    "| - | - | - | - | - | - |",
  ];
  const row = (...cells: string[]) => out.push(`| ${cells.join(" | ")} |`);
  const l = r.latency;
  if (l) {
    row(
      "1",
      `guard latency, one key, sequential (p50 / p99)`,
      `${ms(l.guard.p50)} / ${ms(l.guard.p99)}`,
      `CAS ${ms(l.cas.p50)} / ${ms(l.cas.p99)}; get ${ms(l.get.p50)} / ${
        ms(l.get.p99)
      }`,
      `${num(l.ratioP50, 2)}×`,
      `≤ ${l.target}× ${check(l.met)}`,
    );
    row(
      "1",
      "client CPU per op",
      `${num(l.guardCpuUs, 1)} µs`,
      `CAS ${num(l.casCpuUs, 1)} µs`,
      `${num(l.guardCpuUs / l.casCpuUs, 2)}×`,
      "",
    );
    row(
      "1",
      "diagnostic: CAS + Nats-Msg-Id (the lease's wire message), p50 / p99",
      "",
      `${ms(l.casMsgId.p50)} / ${ms(l.casMsgId.p99)}; ${
        num(l.casMsgIdCpuUs, 1)
      } µs CPU`,
      `${num(l.casMsgId.p50 / l.cas.p50, 2)}× CAS`,
      "",
    );
    const q = l.lease;
    row(
      "1",
      `guard latency, check: "lease", held key, sequential (p50 / p99); ${
        pct(q.fastShare)
      } with no round trip, ${num(q.cpuUs, 1)} µs CPU/op`,
      `${ms(q.guard.p50)} / ${ms(q.guard.p99)}`,
      `CAS guard ${ms(l.guard.p50)} / ${ms(l.guard.p99)}; kv.update ${
        ms(l.cas.p50)
      } / ${ms(l.cas.p99)}`,
      `CAS guard ${num(q.speedupP50, 0)}× slower`,
      `≥ ${q.target}× ${check(q.met)}`,
    );
  }
  const t = r.throughput;
  if (t) {
    row(
      "2",
      `throughput, ${t.concurrency} concurrent over ${t.keys} keys`,
      `${num(t.guard.opsPerSec)}/s (p99 ${ms(t.guard.p99)}, ${
        num(t.guard.cpuUsPerOp, 1)
      } µs CPU/op)`,
      `CAS ${num(t.cas.opsPerSec)}/s (p99 ${ms(t.cas.p99)}, ${
        num(t.cas.cpuUsPerOp, 1)
      } µs CPU/op)`,
      `${num(t.ratio, 2)}×`,
      `≥ ${t.target}× ${check(t.met)}`,
    );
    row(
      "2",
      "diagnostic: CAS + Nats-Msg-Id (the lease's wire message)",
      "",
      `${num(t.casMsgId.opsPerSec)}/s (p99 ${ms(t.casMsgId.p99)}, ${
        num(t.casMsgId.cpuUsPerOp, 1)
      } µs CPU/op)`,
      `${num(t.casMsgId.opsPerSec / t.cas.opsPerSec, 2)}× CAS`,
      "",
    );
  }
  const s = r.sameKey;
  if (s) {
    row(
      "3",
      `${s.concurrency} concurrent guards on one key`,
      `${num(s.concurrent.opsPerSec)}/s, p99 ${ms(s.concurrent.p99)}, ${
        num(s.concurrent.serverMsgsPerOp, 3)
      } server msgs/guard`,
      `one at a time ${num(s.sequential.opsPerSec)}/s, p99 ${
        ms(s.sequential.p99)
      }`,
      `${num(s.speedup, 1)}×`,
      "",
    );
    for (const w of [s.lease.noop, s.lease.cpu, s.lease.hop]) {
      const noop = w === s.lease.noop;
      row(
        "3",
        `check: "lease" guards on one key, write = ${w.write}: ${s.concurrency} writers / one`,
        `${num(w.lease.concurrent.opsPerSec)}/s / ${
          num(w.lease.sequential.opsPerSec)
        }/s, p99 ${ms(w.lease.concurrent.p99)} / ${
          ms(w.lease.sequential.p99)
        }, ${num(w.lease.concurrent.serverMsgsPerOp, 4)} server msgs/guard`,
        `write called directly ${num(w.direct.concurrent.opsPerSec)}/s / ${
          num(w.direct.sequential.opsPerSec)
        }/s` +
          (noop
            ? `; CAS guard ${num(s.concurrent.opsPerSec)}/s / ${
              num(s.sequential.opsPerSec)
            }/s`
            : ""),
        `${num(w.ratioConcurrent, 2)}× / ${num(w.ratioSequential, 2)}× direct` +
          (noop
            ? `; ${num(s.leaseOverCasConcurrent, 0)}× / ${
              num(s.leaseOverCasSequential, 0)
            }× CAS guard`
            : ""),
        "",
      );
    }
  }
  const sc = r.scale;
  if (sc) {
    row(
      "4",
      `renewal scale, TTL ${sc.target.ttl / 1000} s`,
      scaleCells(sc.target),
      bareCells(sc.targetBare),
      `${
        num(sc.target.cpuUsPerRenewal / sc.targetBare.cpuUsPerRenewal, 2)
      }× bare kv.update's CPU/renewal`,
      `0 lost ${check(sc.met)}`,
    );
    for (const step of sc.steps) {
      row(
        "4",
        "breaking point search",
        scaleCells(step.lease),
        bareCells(step.bare),
        `${
          num(step.lease.cpuUsPerRenewal / step.bare.cpuUsPerRenewal, 2)
        }× bare kv.update's CPU/renewal`,
        "",
      );
    }
    row(
      "4",
      "breaking point",
      `${
        sc.heldWithoutLoss > 0
          ? `held ${num(sc.heldWithoutLoss)} with 0 lost`
          : "lost leases at every count tried"
      }; ${
        sc.brokeAt === null
          ? "no loss at any count tried"
          : `lost leases at ${num(sc.brokeAt)}`
      }`,
      `bare CAS rate of row 2 × TTL/3 ≈ ${
        sc.predictedLimit === null ? "–" : num(sc.predictedLimit)
      } leases`,
      "",
      "",
    );
  }
  const f = r.failover;
  if (f) {
    row(
      "5",
      "failover after SIGKILL, to successor's first write",
      ms(f.kill.ms),
      `TTL + grace ${ms(f.bound)}`,
      `${num(f.kill.ms / f.bound, 2)}×`,
      "",
    );
    row(
      "5",
      "failover after close(), to successor's first write",
      ms(f.close.ms),
      `TTL + grace ${ms(f.bound)}`,
      `${num(f.close.ms / f.bound, 3)}×`,
      "",
    );
    row(
      "5",
      `the same, the successor in guard({ wait: true }): SIGKILL / close()${
        f.markers ? " (bucket with expiry markers)" : ""
      }`,
      `${ms(f.killWait.ms)} / ${ms(f.closeWait.ms)}`,
      `TTL + grace ${ms(f.bound)}`,
      `${num(f.killWait.ms / f.bound, 2)}× / ${
        num(f.closeWait.ms / f.bound, 3)
      }×`,
      "",
    );
    row(
      "5",
      "SIGKILL, guard({ wait: true }), bucket without markers",
      ms(f.killWaitNoMarkers.ms),
      `TTL + grace ${ms(f.bound)}`,
      `${num(f.killWaitNoMarkers.ms / f.bound, 2)}×`,
      "",
    );
    row(
      "5",
      "a never-used key's first guard: with markers / without",
      `${ms(f.fresh.guard)} / ${ms(f.fresh.guardNoMarkers)}`,
      `bare kv.create ${ms(f.fresh.create)}`,
      `${num(f.fresh.guard / f.fresh.create, 1)}× / ${
        num(f.fresh.guardNoMarkers / f.fresh.create, 0)
      }×`,
      "",
    );
  }
  const m = r.memory;
  if (m) {
    row(
      "6",
      `memory per held lease (${num(m.n)} leases${m.gc ? ", after GC" : ""})`,
      `${num(m.heapBytesPerLease)} B heap`,
      `${num(m.rssBytesPerLease)} B RSS`,
      "",
      "",
    );
  }
  return out.join("\n");
}

/**
 * Renders rows 1 and 2 of several reports (one per runtime) side by side,
 * then both checks of rows 1 and 3, then row 4 where it ran.
 *
 * @param reports The reports.
 * @returns A Markdown table.
 */
export function combinedTable(reports: BenchReport[]): string {
  const first = reports[0];
  const out: string[] = [
    `nats-lease bench, per runtime: nats-server ${
      [...new Set(reports.map((r) => r.server.version))].join(", ")
    } (R1, file storage), ${first?.machine.cores ?? "?"} cores (${
      first?.machine.cpuModel ?? "?"
    }), ${first?.mode ?? "?"} mode`,
    "",
    "| runtime | guard p50 / p99 | CAS p50 / p99 | get p50 / p99 | guard/CAS p50 | guards/s (64 over 256 keys) | CAS/s | guard/CAS rate |",
    "| - | - | - | - | - | - | - | - |",
  ];
  for (const r of reports) {
    const l = r.latency;
    const t = r.throughput;
    out.push(
      `| ${r.runtime.name} ${r.runtime.version} | ${
        l ? `${ms(l.guard.p50)} / ${ms(l.guard.p99)}` : "–"
      } | ${l ? `${ms(l.cas.p50)} / ${ms(l.cas.p99)}` : "–"} | ${
        l ? `${ms(l.get.p50)} / ${ms(l.get.p99)}` : "–"
      } | ${l ? `${num(l.ratioP50, 2)}× (${check(l.met)})` : "–"} | ${
        t ? num(t.guard.opsPerSec) : "–"
      } | ${t ? num(t.cas.opsPerSec) : "–"} | ${
        t ? `${num(t.ratio, 2)}× (${check(t.met)})` : "–"
      } |`,
    );
  }
  const leased = reports.filter((r) => r.latency !== null || r.sameKey);
  if (leased.length > 0) {
    out.push(
      "",
      `| runtime | check: "lease" guard p50 / p99 | CAS guard p50 / p99 | kv.update p50 / p99 | CAS/lease guard p50 | one key, ${CONCURRENCY} writers / one, per second: lease guard | CAS guard | write called directly | lease/direct |`,
      "| - | - | - | - | - | - | - | - | - |",
    );
    for (const r of leased) {
      const l = r.latency;
      const s = r.sameKey;
      const w = s?.lease.noop;
      out.push(
        `| ${r.runtime.name} ${r.runtime.version} | ${
          l ? `${ms(l.lease.guard.p50)} / ${ms(l.lease.guard.p99)}` : "–"
        } | ${l ? `${ms(l.guard.p50)} / ${ms(l.guard.p99)}` : "–"} | ${
          l ? `${ms(l.cas.p50)} / ${ms(l.cas.p99)}` : "–"
        } | ${
          l
            ? `${num(l.lease.speedupP50, 0)}× (≥ ${l.lease.target}× ${
              check(l.lease.met)
            })`
            : "–"
        } | ${
          w
            ? `${num(w.lease.concurrent.opsPerSec)} / ${
              num(w.lease.sequential.opsPerSec)
            }`
            : "–"
        } | ${
          s
            ? `${num(s.concurrent.opsPerSec)} / ${num(s.sequential.opsPerSec)}`
            : "–"
        } | ${
          w
            ? `${num(w.direct.concurrent.opsPerSec)} / ${
              num(w.direct.sequential.opsPerSec)
            }`
            : "–"
        } | ${
          s
            ? [s.lease.noop, s.lease.cpu, s.lease.hop].map((x) =>
              `${x.write}: ${num(x.ratioConcurrent, 2)}× / ${
                num(x.ratioSequential, 2)
              }×`
            ).join("; ")
            : "–"
        } |`,
      );
    }
  }
  const scaled = reports.filter((r) => r.scale !== null);
  if (scaled.length > 0) {
    out.push(
      "",
      "| runtime | row 4: leases held, TTL, time | lost | client CPU | loop delay p99 | µs CPU/renewal (bare CAS, one timer) | breaking point |",
      "| - | - | - | - | - | - | - |",
    );
    for (const r of scaled) {
      const t = r.scale!.target;
      const b = r.scale!.targetBare;
      out.push(
        `| ${r.runtime.name} ${r.runtime.version} | ${num(t.n)}, ${
          t.ttl / 1000
        } s, ${t.holdMs / 1000} s | ${num(t.lost)} (${check(r.scale!.met)}) | ${
          pct(t.cpuShare)
        } | ${ms(t.loopDelayP99)} | ${num(t.cpuUsPerRenewal, 1)} (${
          num(b.cpuUsPerRenewal, 1)
        }) | ${
          r.scale!.brokeAt === null
            ? `none up to ${num(r.scale!.heldWithoutLoss)}`
            : `held ${num(r.scale!.heldWithoutLoss)}, lost at ${
              num(r.scale!.brokeAt)
            }`
        } |`,
      );
    }
  }
  return out.join("\n");
}

// ---------------------------------------------------------------------------
// Command line.

function usage(why: string): never {
  throw new TypeError(
    `${why}. Usage: bench.ts [--smoke] [--rows 1,2,...] [--leases N] [--hold ms] [--steps N,N,...] [--out file.json] | --combine report.json...`,
  );
}

async function main(argv: string[]): Promise<void> {
  let mode: "smoke" | "full" = "full";
  let rows: Set<number> | undefined;
  let out: string | undefined;
  let leases: number | undefined;
  let hold: number | undefined;
  let steps: number[] | undefined;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--smoke") mode = "smoke";
    else if (arg === "--rows") {
      const list = argv[++i] ?? "";
      rows = new Set(list.split(",").map(Number));
      if ([...rows].some((r) => !Number.isInteger(r) || r < 1 || r > 6)) {
        usage(`'--rows' must list rows 1 to 6: received '${list}'`);
      }
    } else if (arg === "--leases") {
      leases = Number(argv[++i]);
      if (!Number.isInteger(leases) || leases < 1) {
        usage(`'--leases' must be a positive integer: received '${argv[i]}'`);
      }
    } else if (arg === "--hold") {
      hold = Number(argv[++i]);
      if (!Number.isFinite(hold) || hold <= 0) {
        usage(
          `'--hold' must be a positive number of ms: received '${argv[i]}'`,
        );
      }
    } else if (arg === "--steps") {
      const list = argv[++i] ?? "";
      steps = list === "" ? [] : list.split(",").map(Number);
      if (steps.some((n) => !Number.isInteger(n) || n < 1)) {
        usage(`'--steps' must list lease counts: received '${list}'`);
      }
    } else if (arg === "--out") {
      out = argv[++i] ?? usage("'--out' needs a file");
    } else if (arg === "--combine") {
      const reports = argv.slice(i + 1).map((f) =>
        JSON.parse(fs.readFileSync(f, "utf8")) as BenchReport
      );
      console.log(combinedTable(reports));
      return;
    } else usage(`Unknown argument '${arg}'`);
  }
  const cfg = config(mode, rows);
  if (leases !== undefined) cfg.scale.n = leases;
  if (hold !== undefined) cfg.scale.holdMs = cfg.breakHoldMs = hold;
  if (steps !== undefined) cfg.breakSteps = steps;
  const report = await runBench(
    cfg,
    (line) => console.error(`[${runtime().name}] ${line}`),
  );
  const file = out ?? fileURLToPath(
    new URL(`../bench-results/${report.runtime.name}.json`, import.meta.url),
  );
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, JSON.stringify(report, null, 2) + "\n");
  console.log(table(report));
  console.log(`\nreport: ${file}`);
}

if (import.meta.main) await main(process.argv.slice(2));

/** Hashes `lease.ts` and the files of `lease/`, in name order. */
function leaseModuleHash(): string {
  const hash = createHash("sha256");
  const dir = new URL("../lease/", import.meta.url);
  hash.update(fs.readFileSync(new URL("../lease.ts", import.meta.url)));
  for (const name of fs.readdirSync(dir).sort()) {
    if (name.endsWith(".ts")) hash.update(fs.readFileSync(new URL(name, dir)));
  }
  return hash.digest("hex").slice(0, 12);
}
