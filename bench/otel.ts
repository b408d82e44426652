/**
 * What `instrument()` (otel.ts) adds to a guard, measured in one run beside
 * the same manager unmeasured, against a local nats-server this script
 * starts: the p50 of CAS-checked guards, and the mean of lease-checked
 * guards (default options, and with `leaseDurations: true`), with the real
 * OpenTelemetry SDK (`@opentelemetry/sdk-metrics`) collecting. Also the
 * SDK's own cost of one histogram record and one clock read, for scale.
 * Runs unchanged on Deno, Bun and Node 24.
 *
 * ```sh
 * node_modules/.bin/deno run -A bench/otel.ts [--smoke]
 * node_modules/.bin/bun bench/otel.ts
 * node_modules/.bin/node bench/otel.ts
 * ```
 *
 * Prints a Markdown table to stdout and progress to stderr.
 *
 * @module
 */

import process from "node:process";
import { connect } from "@nats-io/transport-node";
import {
  AggregationTemporality,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from "@opentelemetry/sdk-metrics";
import { createLeaseManager, type GuardOptions } from "../mod.ts";
import { instrument } from "../otel.ts";
import { NatsServer } from "../test_util/nats_server.ts";

const smoke = process.argv.includes("--smoke");
/** Interleaved repeats of every measurement; medians are reported. */
const RUNS = smoke ? 2 : 9;
/** CAS-checked guards per repeat (each a server round trip). */
const CAS_OPS = smoke ? 50 : 1_000;
/** Lease-checked guards per repeat. */
const LEASE_OPS = smoke ? 2_000 : 200_000;

const LEASE: GuardOptions = { check: "lease" };
const noop = (): void => {};

function percentile(values: number[], p: number): number {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
}
const median = (xs: number[]): number => percentile(xs, 0.5);

function provider(): MeterProvider {
  const exporter = new InMemoryMetricExporter(
    AggregationTemporality.CUMULATIVE,
  );
  return new MeterProvider({
    readers: [
      new PeriodicExportingMetricReader({
        exporter,
        exportIntervalMillis: 3_600_000,
      }),
    ],
  });
}

const runtime = "Deno" in globalThis
  ? `Deno ${
    (globalThis as unknown as { Deno: { version: { deno: string } } })
      .Deno.version.deno
  }`
  : "Bun" in globalThis
  ? `Bun ${(globalThis as unknown as { Bun: { version: string } }).Bun.version}`
  : `Node ${process.versions.node}`;

const ns = await NatsServer.start();
const nc = await connect({ servers: ns.url });
const leases = await createLeaseManager({
  nc,
  node: "bench-otel",
  bucket: "bench-otel",
  ttl: 15_000,
});
const providers = [provider(), provider()];
const measured = instrument(leases, { meter: providers[0]!.getMeter("b") });
const timed = instrument(leases, {
  meter: providers[1]!.getMeter("b"),
  leaseDurations: true,
});

try {
  await leases.guard("cas", noop, { wait: true });
  await leases.guard("lease", noop, { wait: true });

  // A lease-checked guard runs its write within guard(): one that did not
  // fell back to a CAS (its deadline too close) and is counted apart.
  let ran = 0;
  let slow = 0;
  const mark = (): void => {
    ran++;
  };
  const casP50 = async (m: typeof leases): Promise<number> => {
    const lat: number[] = [];
    for (let i = 0; i < CAS_OPS; i++) {
      const t = performance.now();
      await m.guard("cas", noop);
      lat.push(performance.now() - t);
    }
    return median(lat) * 1000;
  };
  const leaseMean = async (m: typeof leases): Promise<number> => {
    const t = performance.now();
    for (let i = 0; i < LEASE_OPS; i++) {
      const before = ran;
      const p = m.guard("lease", mark, LEASE);
      if (ran === before) slow++;
      await p;
    }
    return (performance.now() - t) / LEASE_OPS * 1000;
  };

  const results = {
    casPlain: [] as number[],
    casMeasured: [] as number[],
    leasePlain: [] as number[],
    leaseMeasured: [] as number[],
    leaseTimed: [] as number[],
  };
  // Warm-up, then interleaved repeats, so drift on the shared machine hits
  // every variant alike.
  await leaseMean(leases);
  await leaseMean(measured);
  await leaseMean(timed);
  await casP50(leases);
  await casP50(measured);
  for (let r = 0; r < RUNS; r++) {
    console.error(`run ${r + 1}/${RUNS}`);
    const order = r % 2 === 0;
    if (order) {
      results.casPlain.push(await casP50(leases));
      results.casMeasured.push(await casP50(measured));
    } else {
      results.casMeasured.push(await casP50(measured));
      results.casPlain.push(await casP50(leases));
    }
    if (order) {
      results.leasePlain.push(await leaseMean(leases));
      results.leaseMeasured.push(await leaseMean(measured));
      results.leaseTimed.push(await leaseMean(timed));
    } else {
      results.leaseTimed.push(await leaseMean(timed));
      results.leaseMeasured.push(await leaseMean(measured));
      results.leasePlain.push(await leaseMean(leases));
    }
  }

  // The SDK's own costs, for scale.
  const meter = providers[0]!.getMeter("micro");
  const h = meter.createHistogram("micro.duration", { unit: "s" });
  const attrs = Object.freeze({ "lease.check": "cas", "outcome": "ok" });
  const MICRO = smoke ? 10_000 : 1_000_000;
  let sink = 0;
  const micro = (f: (i: number) => void): number => {
    for (let i = 0; i < MICRO / 10; i++) f(i);
    const t = performance.now();
    for (let i = 0; i < MICRO; i++) f(i);
    return (performance.now() - t) / MICRO * 1e6;
  };
  const recordNs = micro((i) => h.record(i * 1e-9, attrs));
  const nowNs = micro(() => {
    sink += performance.now();
  });

  void sink;

  const us = (x: number) => `${x.toFixed(3)} µs`;
  const cp = median(results.casPlain);
  const cm = median(results.casMeasured);
  const ratios = results.casMeasured.map((m, i) => m / results.casPlain[i]!);
  const lp = median(results.leasePlain);
  const lm = median(results.leaseMeasured);
  const lt = median(results.leaseTimed);
  const diffs = results.leaseMeasured.map((m, i) => m - results.leasePlain[i]!);
  const tdiffs = results.leaseTimed.map((m, i) => m - results.leasePlain[i]!);
  console.log(
    `\n${runtime}, nats-server ${ns.version}, ${RUNS} interleaved runs (medians; per-run differences in brackets)\n`,
  );
  console.log("| measurement | without | with instrument() | difference |");
  console.log("| --- | --- | --- | --- |");
  console.log(
    `| CAS guard p50 (${CAS_OPS} guards a run) | ${us(cp)} | ${us(cm)} | ${
      ((median(ratios) - 1) * 100).toFixed(1)
    } % (median of per-run ratios) |`,
  );
  console.log(
    `| lease-checked guard mean (${LEASE_OPS} a run) | ${us(lp)} | ${
      us(lm)
    } | +${us(median(diffs))} [${us(Math.min(...diffs))} … ${
      us(Math.max(...diffs))
    }] |`,
  );
  console.log(
    `| the same, \`leaseDurations: true\` | ${us(lp)} | ${us(lt)} | +${
      us(median(tdiffs))
    } [${us(Math.min(...tdiffs))} … ${us(Math.max(...tdiffs))}] |`,
  );
  console.log(
    `\nSDK histogram record with 2 attributes: ${
      recordNs.toFixed(0)
    } ns; performance.now(): ${
      nowNs.toFixed(0)
    } ns. Lease-checked guards that fell back to a CAS: ${slow}.`,
  );
} finally {
  measured.stop();
  timed.stop();
  await leases.close();
  await Promise.all(providers.map((p) => p.shutdown()));
  await nc.close();
  await ns[Symbol.asyncDispose]();
}
