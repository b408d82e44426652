/**
 * Measures the fenced layout (issue 33; `createLeaseManager({ fenced: true })`)
 * on a real nats-server, each against a bare operation in the same run:
 *
 * - a fenced put by a held lease, against a bare `js.publish` to the same
 *   stream (one at a time, `--n` each, interleaved in rounds);
 * - a lease-checked guard whose write is a fenced put, against the same;
 * - an atomic commit of 10 fenced puts (2.12+), against 10 bare publishes
 *   sent at once;
 * - taking and releasing a free key (a guard and `release`): on the
 *   fenced layout, on the classic one, and the server's floor for it, in
 *   the same rounds: two bare `js.publish`es, each awaited, to a fresh
 *   subject of the fenced bucket's stream (the first expecting no entry,
 *   the second a KV delete marker, `KV-Operation: DEL`);
 * - throughput: 64 writers over 256 held keys, each write a fenced put by
 *   the key's held lease (and, as a second figure, a lease-checked guard
 *   whose write is that put), against 64 writers each sending one bare
 *   `js.publish` at a time to the same stream, over the same 256 subjects.
 *   A bare `js.publish` costs the client more than the manager's port does
 *   (nats.js builds two `Error`s, a timer and a parsed ack per request; see
 *   `ReplyInbox` in `lease/nats_port.ts`), so a third kind of phase sends
 *   the same bare publishes through one shared reply subscription, as the
 *   port does, without the fence, and a fourth the same with the fence's two
 *   headers (the lease's epoch on its tenure entry's subject), past the
 *   lease's own code: the server's share of the fence's cost (and a fifth
 *   with two headers of the same sizes that the server does not act on, to
 *   tell the headers' cost from the check's). Phases
 *   of each kind alternate (the order turned each round); each ratio is the
 *   median over rounds of each round's fenced rate over its bare rate
 *   (issue 33's goal: at least 0.9× a bare `js.publish`).
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
import { headers, type MsgHdrs, type NatsConnection } from "@nats-io/nats-core";
import { jetstream } from "@nats-io/jetstream";
import { createLeaseManager, type Lease } from "../mod.ts";
import { atomicVersion } from "../lease/servers.ts";
import { NatsServer } from "../test_util/nats_server.ts";

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

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length === 0 ? NaN : s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/**
 * Bare publishes to a stream whose acks come back on one shared wildcard
 * subscription, matched by a counter (as the manager's port sends its
 * writes): no fence, no per-request timer or parsed ack. An ack carrying
 * an error rejects.
 */
function inboxPublisher(nc: NatsConnection): {
  publish(
    subject: string,
    data: Uint8Array,
    fence?: { subject: string; seq: number; inert?: boolean },
  ): Promise<void>;
  close(): void;
} {
  const prefix = `_INBOX.${crypto.randomUUID().replaceAll("-", "")}.`;
  const pending = new Map<string, (data: Uint8Array) => void>();
  const dec = new TextDecoder();
  const sub = nc.subscribe(`${prefix}*`, {
    callback: (err, msg) => {
      if (err !== null) return;
      const k = msg.subject.slice(prefix.length);
      const done = pending.get(k);
      pending.delete(k);
      done?.(msg.data);
    },
  });
  let n = 0;
  return {
    publish(subject, data, fence) {
      let h: MsgHdrs | undefined;
      if (fence !== undefined) {
        h = headers();
        // Inert: names of the same length that JetStream ignores.
        const x = fence.inert ? "X-Bnch" : "Nats-E";
        h.set(`${x}xpected-Last-Subject-Sequence`, String(fence.seq));
        h.set(`${x}xpected-Last-Subject-Sequence-Subject`, fence.subject);
      }
      return new Promise((resolve, reject) => {
        const k = (++n).toString(36);
        pending.set(k, (ack) => {
          if (ack.length === 0 || dec.decode(ack).includes('"error"')) {
            reject(new Error(`publish to ${subject}: ${dec.decode(ack)}`));
          } else resolve();
        });
        nc.publish(
          subject,
          data,
          h === undefined
            ? { reply: prefix + k }
            : { reply: prefix + k, headers: h },
        );
      });
    },
    close: () => sub.unsubscribe(),
  };
}

/** Writers at once, and held keys they write (writer w: keys w + 64·j). */
const WRITERS = 64;
const KEYS = 256;

/**
 * Runs `WRITERS` writers for `ms` milliseconds, writer `w` calling
 * `write(k)` on keys `w, w + 64, w + 128, w + 192` in turn, one write at a
 * time; returns writes per second.
 */
async function phase(
  ms: number,
  write: (k: number) => Promise<unknown>,
): Promise<number> {
  let done = 0;
  const t0 = performance.now();
  const end = t0 + ms;
  await Promise.all(Array.from({ length: WRITERS }, async (_, w) => {
    for (let i = 0; performance.now() < end; i++) {
      await write(w + WRITERS * (i % (KEYS / WRITERS)));
      done++;
    }
  }));
  return done / ((performance.now() - t0) / 1000);
}

async function main(): Promise<void> {
  const { n } = parse(process.argv.slice(2));
  const ns = await NatsServer.start();
  const nc = await connect({ servers: ns.url });
  try {
    const atomic = atomicVersion(ns.version);
    // The bucket it creates has atomic batches where the server has them.
    const m = await createLeaseManager({
      nc,
      node: "bench",
      bucket: "bench_fenced",
      ttl: 5000,
      fenced: true,
    });
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
    const freeBare: number[] = [];
    const del = headers();
    del.set("KV-Operation", "DEL");
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
    // The three in turn, the order turned each round.
    for (let i = 0; i < rounds; i++) {
      const key = `free${i}`;
      const steps = [
        () =>
          time(freeFenced, async () => {
            await m.guard(key, () => {});
            await m.release(key);
          }),
        () =>
          time(freeClassic, async () => {
            await classic.guard(key, () => {});
            await classic.release(key);
          }),
        () =>
          time(freeBare, async () => {
            const subject = `$KV.bench_fenced.d.${key}`;
            await js.publish(subject, body, {
              expect: { lastSubjectSequence: 0 },
            });
            await js.publish(subject, undefined, { headers: del });
          }),
      ];
      for (let j = 0; j < steps.length; j++) await steps[(i + j) % 3]!();
    }
    // Throughput: 256 keys held by one guard each, whose leases the writers
    // use; the bare writers publish to the same stream's data subjects.
    const tpRounds = n >= 2000 ? 5 : n >= 200 ? 3 : 1;
    const tpMs = n >= 2000 ? 2000 : n >= 200 ? 1000 : 200;
    const leases: Lease[] = [];
    const releases: (() => void)[] = [];
    const holding = Array.from(
      { length: KEYS },
      (_, k) =>
        m.guard(`tp${k}`, (l) => {
          leases[k] = l;
          return new Promise<void>((r) => releases.push(r));
        }),
    );
    const failed = Promise.all(holding).then(() => {
      throw new Error("the throughput guards ended before their writes");
    });
    while (releases.length < KEYS) {
      await Promise.race([failed, new Promise((r) => setTimeout(r, 1))]);
    }
    failed.catch(() => {});
    const tp = {
      bare: [] as number[],
      inbox: [] as number[],
      inboxFenced: [] as number[],
      inboxHeaders: [] as number[],
      put: [] as number[],
      guarded: [] as number[],
    };
    const inbox = inboxPublisher(nc);
    const kinds: [keyof typeof tp, (k: number) => Promise<unknown>][] = [
      ["bare", (k) => js.publish(`$KV.bench_fenced.d.tb${k}`, body)],
      ["inbox", (k) => inbox.publish(`$KV.bench_fenced.d.tb${k}`, body)],
      ["inboxFenced", (k) =>
        inbox.publish(`$KV.bench_fenced.d.tp${k}`, body, {
          subject: `$KV.bench_fenced._lease.k.tp${k}`,
          seq: leases[k]!.epoch,
        })],
      ["inboxHeaders", (k) =>
        inbox.publish(`$KV.bench_fenced.d.tb${k}`, body, {
          subject: `$KV.bench_fenced._lease.k.tp${k}`,
          seq: leases[k]!.epoch,
          inert: true,
        })],
      ["put", (k) => leases[k]!.put(`d.tp${k}`, body)],
    ];
    for (const [, write] of kinds) await phase(Math.min(tpMs, 300), write);
    for (let r = 0; r < tpRounds; r++) {
      const order = kinds.map((_, i) => kinds[(i + r) % kinds.length]!);
      for (const [kind, write] of order) {
        process.stderr.write(`fenced: throughput round ${r + 1}, ${kind}\n`);
        tp[kind].push(await phase(tpMs, write));
      }
    }
    for (const r of releases) r();
    await Promise.all(holding);
    // The same with a lease-checked guard around each put (the manager
    // holds the keys; a guard finds them held and sends only the put),
    // paired with a bare phase of its own.
    const guardedBare: number[] = [];
    for (let r = 0; r < tpRounds; r++) {
      const pair: [number[], (k: number) => Promise<unknown>][] = [
        [guardedBare, (k) => js.publish(`$KV.bench_fenced.d.tb${k}`, body)],
        [tp.guarded, (k) =>
          m.guard(
            `tp${k}`,
            (l) => l.put(`d.tp${k}`, body),
            { check: "lease" },
          )],
      ];
      for (const [xs, write] of r % 2 === 0 ? pair : pair.reverse()) {
        xs.push(await phase(tpMs, write));
      }
    }
    await Promise.all(
      Array.from({ length: KEYS }, (_, k) => m.release(`tp${k}`)),
    );
    inbox.close();
    const ratioPut = median(tp.put.map((x, i) => x / tp.bare[i]!));
    const ratioPutInbox = median(tp.put.map((x, i) => x / tp.inbox[i]!));
    const ratioInboxFenced = median(
      tp.inboxFenced.map((x, i) => x / tp.inbox[i]!),
    );
    const ratioInboxHeaders = median(
      tp.inboxHeaders.map((x, i) => x / tp.inbox[i]!),
    );
    const ratioGuarded = median(
      tp.guarded.map((x, i) => x / guardedBare[i]!),
    );
    const ms = (x: number) => `${(x * 1000).toFixed(0)} µs`;
    const floor = "two bare js.publish, create then delete";
    const rows: [string, number, string, number][] = [
      ["fenced put by a held lease", p50(put), "bare js.publish", p50(bare)],
      [
        "lease-checked guard + fenced put",
        p50(guarded),
        "bare js.publish",
        p50(bare),
      ],
      ...(atomic
        ? [[
          "guard + atomic commit of 10",
          p50(commit10),
          "10 bare publishes at once",
          p50(bare10),
        ] as [string, number, string, number]]
        : []),
      [
        "free key: guard + release, fenced",
        p50(freeFenced),
        "the same on the classic layout",
        p50(freeClassic),
      ],
      [
        "free key: guard + release, fenced",
        p50(freeFenced),
        floor,
        p50(freeBare),
      ],
      [
        "free key: guard + release, classic",
        p50(freeClassic),
        floor,
        p50(freeBare),
      ],
    ];
    console.log("| operation | p50 | against | its p50 | ratio |");
    console.log("| --- | --- | --- | --- | --- |");
    for (const [what, a, against, b] of rows) {
      console.log(
        `| ${what} | ${ms(a)} | ${against} | ${ms(b)} | ${
          (a / b).toFixed(2)
        }× |`,
      );
    }
    const rate = (x: number) => `${Math.round(x).toLocaleString("en-US")}/s`;
    const span = (xs: number[]) =>
      xs.length < 2
        ? ""
        : ` [${xs.map((x) => x.toFixed(2)).sort().at(0)}–${
          xs.map((x) => x.toFixed(2)).sort().at(-1)
        }]`;
    console.log("");
    console.log(
      `| ${WRITERS} writers over ${KEYS} keys, ${tpRounds} × ${tpMs} ms | writes/s | against | its writes/s | ratio (median of rounds) |`,
    );
    console.log("| --- | --- | --- | --- | --- |");
    console.log(
      `| fenced puts by held leases | ${
        rate(median(tp.put))
      } | bare js.publish | ${rate(median(tp.bare))} | ${ratioPut.toFixed(2)}×${
        span(tp.put.map((x, i) => x / tp.bare[i]!))
      } |`,
    );
    console.log(
      `| fenced puts by held leases | ${
        rate(median(tp.put))
      } | bare publish, one shared reply subscription | ${
        rate(median(tp.inbox))
      } | ${ratioPutInbox.toFixed(2)}×${
        span(tp.put.map((x, i) => x / tp.inbox[i]!))
      } |`,
    );
    console.log(
      `| the same with two inert headers of the fence's sizes | ${
        rate(median(tp.inboxHeaders))
      } | bare publish, one shared reply subscription | ${
        rate(median(tp.inbox))
      } | ${ratioInboxHeaders.toFixed(2)}×${
        span(tp.inboxHeaders.map((x, i) => x / tp.inbox[i]!))
      } |`,
    );
    console.log(
      `| the same, fenced: its headers, no lease code | ${
        rate(median(tp.inboxFenced))
      } | bare publish, one shared reply subscription | ${
        rate(median(tp.inbox))
      } | ${ratioInboxFenced.toFixed(2)}×${
        span(tp.inboxFenced.map((x, i) => x / tp.inbox[i]!))
      } |`,
    );
    console.log(
      `| lease-checked guards, each a fenced put | ${
        rate(median(tp.guarded))
      } | bare js.publish | ${rate(median(guardedBare))} | ${
        ratioGuarded.toFixed(2)
      }×${span(tp.guarded.map((x, i) => x / guardedBare[i]!))} |`,
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
        freeBare: p50(freeBare),
      },
      throughput: {
        writers: WRITERS,
        keys: KEYS,
        rounds: tpRounds,
        phaseMs: tpMs,
        bare: tp.bare,
        inbox: tp.inbox,
        inboxFenced: tp.inboxFenced,
        inboxHeaders: tp.inboxHeaders,
        put: tp.put,
        guardedBare,
        guarded: tp.guarded,
        ratioPut,
        ratioPutInbox,
        ratioInboxFenced,
        ratioInboxHeaders,
        ratioGuarded,
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
