/**
 * Measures a semaphore (semaphore.ts) on a real nats-server: `--contenders`
 * managers (each its own node id and connection, in this process) run
 * `--rounds` guarded writes of `--write` ms each through one semaphore of
 * `--limit` slots, with `wait: true`, back to back. Prints:
 *
 * - the most writes running at any instant (must be ≤ the limit);
 * - throughput against the ideal of `limit` writes at once;
 * - each guard's wait (call to write), and the worst contender's total;
 * - the handover: from a write's end (the slot is released right after) to
 *   the next write's start, while contenders were waiting.
 *
 * ```sh
 * node bench/semaphore.ts                    # limit 3, 12 contenders, 200 ms
 * deno run -A bench/semaphore.ts --rounds 10
 * bun bench/semaphore.ts --smoke
 * ```
 *
 * Progress goes to stderr, a Markdown row and a JSON line to stdout.
 *
 * @module
 */

import process from "node:process";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { createLeaseManager, type LeaseManager, semaphore } from "../mod.ts";
import { NatsServer } from "../test_util/nats_server.ts";

interface Settings {
  limit: number;
  contenders: number;
  rounds: number;
  write: number;
  ttl: number;
}

function parse(argv: string[]): Settings {
  const s: Settings = {
    limit: 3,
    contenders: 12,
    rounds: 10,
    write: 200,
    ttl: 2000,
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--smoke") {
      s.rounds = 2;
      s.write = 20;
      continue;
    }
    const k = a.replace(/^--/, "") as keyof Settings;
    const v = Number(argv[++i]);
    if (!(k in s) || !Number.isFinite(v) || v <= 0) {
      throw new RangeError(
        `Usage: semaphore.ts [--smoke] [--limit N] [--contenders N] [--rounds N] [--write ms] [--ttl ms]: received ${a}`,
      );
    }
    s[k] = v;
  }
  return s;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? NaN;
}

function runtime(): string {
  const g = globalThis as {
    Deno?: { version: { deno: string } };
    Bun?: { version: string };
  };
  if (g.Deno) return `deno ${g.Deno.version.deno}`;
  if (g.Bun) return `bun ${g.Bun.version}`;
  return `node ${process.versions.node}`;
}

async function main(): Promise<void> {
  const s = parse(process.argv.slice(2));
  const ns = await NatsServer.start();
  const conns: NatsConnection[] = [];
  const managers: LeaseManager[] = [];
  try {
    for (let i = 0; i < s.contenders; i++) {
      const nc = await connect({ servers: ns.url });
      conns.push(nc);
      managers.push(
        await createLeaseManager({
          nc,
          node: `c${i}`,
          bucket: "bench_sem",
          ttl: s.ttl,
          restartGrace: false,
        }),
      );
    }
    // Warm up: every contender takes a slot once, so no key is fresh.
    await Promise.all(
      managers.map((m) =>
        semaphore(m, "sem", { limit: s.limit }).guard(() => {}, { wait: true })
      ),
    );
    await sleep(100);

    let running = 0;
    let peak = 0;
    const starts: number[] = [];
    const ends: number[] = [];
    const waits: number[] = [];
    const totalWait = new Array<number>(s.contenders).fill(0);
    const t0 = performance.now();
    process.stderr.write(
      `semaphore: limit ${s.limit}, ${s.contenders} contenders × ${s.rounds} writes of ${s.write} ms on nats-server ${ns.version}, ${runtime()}\n`,
    );
    await Promise.all(managers.map(async (m, i) => {
      const sem = semaphore(m, "sem", { limit: s.limit });
      for (let r = 0; r < s.rounds; r++) {
        const called = performance.now();
        await sem.guard(async () => {
          const at = performance.now();
          waits.push(at - called);
          totalWait[i]! += at - called;
          starts.push(at);
          peak = Math.max(peak, ++running);
          await sleep(s.write);
          running--;
          ends.push(performance.now());
        }, { wait: true });
      }
    }));
    const elapsed = performance.now() - t0;
    const writes = s.contenders * s.rounds;
    const ideal = Math.ceil(writes / s.limit) * s.write;
    // Handover: pair each write start after the first `limit` with the
    // earliest write end not yet paired (every contender waits meanwhile).
    const st = [...starts].sort((a, b) => a - b).slice(s.limit);
    const en = [...ends].sort((a, b) => a - b);
    const handovers = st.map((t, k) => t - en[k]!).filter((h) => h >= 0);
    const result = {
      runtime: runtime(),
      server: ns.version,
      ...s,
      writes,
      peak,
      elapsedMs: Math.round(elapsed),
      idealMs: ideal,
      efficiency: +(ideal / elapsed).toFixed(3),
      writesPerS: +(writes / (elapsed / 1000)).toFixed(2),
      idealWritesPerS: +(s.limit * 1000 / s.write).toFixed(2),
      waitP50: Math.round(pct(waits, 50)),
      waitP99: Math.round(pct(waits, 99)),
      waitMax: Math.round(Math.max(...waits)),
      fairWait: Math.round(
        ((s.contenders - s.limit) / s.limit) * s.write,
      ),
      worstTotalWait: Math.round(Math.max(...totalWait)),
      bestTotalWait: Math.round(Math.min(...totalWait)),
      handoverP50: +pct(handovers, 50).toFixed(1),
      handoverP99: +pct(handovers, 99).toFixed(1),
      handoverMax: +Math.max(...handovers).toFixed(1),
    };
    console.log(
      "| runtime | server | max concurrent | writes/s (ideal) | efficiency | wait p50 / p99 / max (fair share) | total wait best / worst contender | handover p50 / p99 / max |",
    );
    console.log("| - | - | - | - | - | - | - | - |");
    console.log(
      `| ${result.runtime} | ${result.server} | ${peak} of ${s.limit} | ${result.writesPerS} (${result.idealWritesPerS}) | ${
        (result.efficiency * 100).toFixed(1)
      }% | ${result.waitP50} / ${result.waitP99} / ${result.waitMax} ms (${result.fairWait} ms) | ${result.bestTotalWait} / ${result.worstTotalWait} ms | ${result.handoverP50} / ${result.handoverP99} / ${result.handoverMax} ms |`,
    );
    console.log(JSON.stringify(result));
    if (peak > s.limit) {
      throw new Error(`${peak} writes ran at once, above the limit ${s.limit}`);
    }
  } finally {
    await Promise.allSettled(managers.map((m) => m.close()));
    await Promise.allSettled(conns.map((c) => c.close()));
    await ns[Symbol.asyncDispose]();
  }
}

await main();
