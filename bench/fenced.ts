/**
 * Measures the fenced layout (issue 33; `fencedManagerOnPort`, which
 * `createLeaseManager` does not offer yet) on a real nats-server, each
 * against a bare operation in the same run:
 *
 * - a fenced put by a held lease, against a bare `js.publish` to the same
 *   stream (one at a time, `--n` each, interleaved in rounds);
 * - a lease-checked guard whose write is a fenced put, against the same;
 * - an atomic commit of 10 fenced puts (2.12+), against 10 bare publishes
 *   sent at once;
 * - taking and releasing a free key (a guard and `release`): on the
 *   fenced layout, and on the classic one in the same run.
 *
 * ```sh
 * node bench/fenced.ts                  # --n 2000
 * deno run -A bench/fenced.ts --n 500
 * bun bench/fenced.ts --smoke
 * ```
 *
 * Progress goes to stderr; a Markdown table and a JSON line to stdout.
 *
 * @module
 */

import process from "node:process";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { createLeaseManager } from "../mod.ts";
import type { Manager } from "../lease/manager.ts";
import { atomicVersion } from "../lease/servers.ts";
import { NatsServer } from "../test_util/nats_server.ts";
import { fencedManager as managerOn } from "../test_util/port.ts";

function parse(argv: string[]): { n: number } {
  if (argv.length === 1 && argv[0] === "--smoke") return { n: 20 };
  if (argv.length === 0) return { n: 2000 };
  const n = Number(argv[1]);
  if (argv.length !== 2 || argv[0] !== "--n" || !(n >= 1)) {
    throw new RangeError(
      `Usage: fenced.ts [--smoke | --n N]: received ${argv.join(" ")}`,
    );
  }
  return { n };
}

function p50(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
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

/** A fenced bucket (atomic batches where the server has them) and a manager on it. */
async function fencedManager(
  nc: NatsConnection,
  bucket: string,
  atomic: boolean,
): Promise<Manager> {
  await new Kvm(nc).create(bucket, { history: 1, markerTTL: 1000 });
  const jsm = await jetstreamManager(nc);
  let si = await jsm.streams.info(`KV_${bucket}`);
  if (atomic) {
    si = await jsm.streams.update(
      `KV_${bucket}`,
      { ...si.config, allow_atomic: true } as Parameters<
        typeof jsm.streams.update
      >[1],
    );
  }
  return await managerOn(nc, bucket, "bench", 5000, 1250);
}

async function main(): Promise<void> {
  const { n } = parse(process.argv.slice(2));
  const ns = await NatsServer.start();
  const nc = await connect({ servers: ns.url });
  try {
    const atomic = atomicVersion(ns.version);
    const m = await fencedManager(nc, "bench_fenced", atomic);
    const classic = await createLeaseManager({
      nc,
      node: "bench",
      bucket: "bench_classic",
      ttl: 5000,
      restartGrace: false,
    });
    const js = jetstream(nc);
    const enc = new TextEncoder();
    const body = enc.encode("x".repeat(64));
    process.stderr.write(
      `fenced: ${n} of each on nats-server ${ns.version}, ${runtime()}\n`,
    );
    const bare: number[] = [];
    const put: number[] = [];
    const guarded: number[] = [];
    const bare10: number[] = [];
    const commit10: number[] = [];
    const freeFenced: number[] = [];
    const freeClassic: number[] = [];
    // One held lease for the bare fenced puts.
    let lease!: Lease;
    let done!: () => void;
    const held = m.guard("k", (l) => {
      lease = l;
      return new Promise<void>((r) => done = r);
    });
    while (lease === undefined) await new Promise((r) => setTimeout(r, 1));
    const time = async (xs: number[], f: () => Promise<unknown>) => {
      const t = performance.now();
      await f();
      xs.push(performance.now() - t);
    };
    // Warm-up, then rounds in which each operation runs once in turn.
    for (let i = 0; i < Math.min(50, n); i++) {
      await js.publish("$KV.bench_fenced.d.bare", body);
      await lease.put("d.fenced", body);
    }
    for (let i = 0; i < n; i++) {
      await time(bare, () => js.publish("$KV.bench_fenced.d.bare", body));
      await time(put, () => lease.put("d.fenced", body));
    }
    done();
    await held;
    for (let i = 0; i < n; i++) {
      await time(
        guarded,
        () =>
          m.guard(
            "k",
            (l) => l.put("d.fenced", body),
            { check: "lease" },
          ),
      );
    }
    const rounds = Math.max(1, Math.floor(n / 10));
    for (let i = 0; i < rounds; i++) {
      await time(
        bare10,
        () =>
          Promise.all(
            Array.from(
              { length: 10 },
              (_, j) => js.publish(`$KV.bench_fenced.d.b${j}`, body),
            ),
          ),
      );
      if (atomic) {
        await time(
          commit10,
          () =>
            m.guard("k", (l) =>
              l.commit(
                Array.from({ length: 10 }, (_, j) => ({
                  put: `d.c${j}`,
                  value: body,
                })),
              ), { check: "lease" }),
        );
      }
    }
    await m.release("k");
    for (let i = 0; i < rounds; i++) {
      const key = `free${i}`;
      await time(freeFenced, async () => {
        await m.guard(key, () => {});
        await m.release(key);
      });
      await time(freeClassic, async () => {
        await classic.guard(key, () => {});
        await classic.release(key);
      });
    }
    const ms = (x: number) => `${(x * 1000).toFixed(0)} µs`;
    const rows: [string, number, number][] = [
      ["fenced put by a held lease", p50(put), p50(bare)],
      ["lease-checked guard + fenced put", p50(guarded), p50(bare)],
      ...(atomic
        ? [[
          "guard + atomic commit of 10",
          p50(commit10),
          p50(bare10),
        ] as [string, number, number]]
        : []),
      [
        "free key: guard + release, fenced",
        p50(freeFenced),
        p50(freeClassic),
      ],
    ];
    console.log("| operation | p50 | against | its p50 | ratio |");
    console.log("| --- | --- | --- | --- | --- |");
    const against = [
      "bare js.publish",
      "bare js.publish",
      "10 bare publishes at once",
      "the same on the classic layout",
    ];
    rows.forEach(([what, a, b], i) =>
      console.log(
        `| ${what} | ${ms(a)} | ${against[atomic ? i : i === 2 ? 3 : i]} | ${
          ms(b)
        } | ${(a / b).toFixed(2)}× |`,
      )
    );
    console.log(JSON.stringify({
      server: ns.version,
      runtime: runtime(),
      n,
      p50: {
        bare: p50(bare),
        put: p50(put),
        guarded: p50(guarded),
        bare10: p50(bare10),
        commit10: atomic ? p50(commit10) : null,
        freeFenced: p50(freeFenced),
        freeClassic: p50(freeClassic),
      },
    }));
    await m.close();
    await classic.close();
  } finally {
    await nc.close();
    await ns.stop();
  }
}

await main();
