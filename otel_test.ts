// test.sh: first server only: instrument() wraps the public interface; what
// differs between NATS servers is covered by the lease tests.
// instrument() of otel.ts against a real nats-server, read through the real
// OpenTelemetry SDK: a holder change and a loss in lease.transitions, guard
// durations and counts with their attributes, rejections by error class,
// perKey, nothing recorded after stop(), and examples/otel_prometheus.ts
// scraped over HTTP. Runs under `deno test -A`, `bun test` and
// `node --test`; NATS_SERVER_BIN picks the server binary.
import { after, describe } from "node:test";
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { before, test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import process from "node:process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  type CollectionResult,
  DataPointType,
  MeterProvider,
  MetricReader,
} from "@opentelemetry/sdk-metrics";
import { createLeaseManager, type LeaseManager } from "./mod.ts";
import { instrument, type InstrumentedLeaseManager } from "./otel.ts";
import { conn, eventually, sleep, uniq } from "./test_util/lease_helpers.ts";
import { NatsServer } from "./test_util/nats_server.ts";

/** A reader the test collects from when it likes. */
class Reader extends MetricReader {
  protected onShutdown(): Promise<void> {
    return Promise.resolve();
  }
  protected onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
}

/** One data point: its attributes, and a sum's value or a histogram's count and sum. */
interface Point {
  attrs: Record<string, unknown>;
  value?: number;
  count?: number;
  sum?: number;
}

/** Every data point of every metric, by metric name. */
async function collect(reader: Reader): Promise<Map<string, Point[]>> {
  const { resourceMetrics, errors }: CollectionResult = await reader.collect();
  assert.deepEqual(errors, []);
  const out = new Map<string, Point[]>();
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const metric of scope.metrics) {
      const points = out.get(metric.descriptor.name) ?? [];
      for (const dp of metric.dataPoints) {
        const v = dp.value as number | { count: number; sum?: number };
        points.push(
          typeof v === "number"
            ? { attrs: { ...dp.attributes }, value: v }
            : { attrs: { ...dp.attributes }, count: v.count, sum: v.sum ?? 0 },
        );
      }
      out.set(metric.descriptor.name, points);
    }
  }
  return out;
}

/** The point of `name` whose attributes are exactly `attrs`. */
function point(
  metrics: Map<string, Point[]>,
  name: string,
  attrs: Record<string, unknown>,
): Point | undefined {
  return metrics.get(name)?.find((p) =>
    JSON.stringify(Object.entries(p.attrs).sort()) ===
      JSON.stringify(Object.entries(attrs).sort())
  );
}

/**
 * The instruments of the Markdown table in `file` (lines after `prefix`):
 * name to kind and unit.
 */
function documentedInstruments(
  file: string,
  prefix: string,
): Map<string, { kind: string; unit: string | undefined }> {
  const text = readFileSync(new URL(file, import.meta.url), "utf8");
  const out = new Map<string, { kind: string; unit: string | undefined }>();
  for (const line of text.split("\n")) {
    if (!line.startsWith(prefix)) continue;
    const row = /^\| `(lease\.[a-z.]+)` +\| (\w+) +\| `([^`]+)` +\|/.exec(
      line.slice(prefix.length),
    );
    if (row) out.set(row[1]!, { kind: row[2]!, unit: row[3]! });
  }
  return out;
}

/** The SDK's type and unit of every metric collected, by name. */
async function descriptors(
  reader: Reader,
): Promise<Map<string, { type: string; unit: string }>> {
  const { resourceMetrics, errors } = await reader.collect();
  assert.deepEqual(errors, []);
  const out = new Map<string, { type: string; unit: string }>();
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const m of scope.metrics) {
      const type = m.dataPointType === DataPointType.HISTOGRAM
        ? "histogram"
        : m.dataPointType === DataPointType.SUM
        ? m.isMonotonic ? "monotonic sum" : "sum"
        : DataPointType[m.dataPointType];
      out.set(m.descriptor.name, { type, unit: m.descriptor.unit });
    }
  }
  return out;
}

/** What the SDK reports of an instrument of `kind`, as `descriptors` names it. */
function reported(kind: string): string {
  return /Histogram/.test(kind)
    ? "histogram"
    : /UpDownCounter/.test(kind)
    ? "sum"
    : /Counter/.test(kind)
    ? "monotonic sum"
    : `(a kind not in the table: ${kind})`;
}

describe("instrument()", () => {
  let ns: NatsServer;
  const conns: NatsConnection[] = [];
  const managers: LeaseManager[] = [];
  const providers: MeterProvider[] = [];

  before(async () => {
    ns = await NatsServer.start();
  });

  after(async () => {
    await Promise.allSettled(managers.map((m) => m.close()));
    await Promise.allSettled(conns.map((c) => c.close()));
    await Promise.allSettled(providers.map((p) => p.shutdown()));
    await ns?.[Symbol.asyncDispose]();
  });

  async function manager(
    node: string,
    bucket: string,
    check?: "cas" | "lease",
  ): Promise<LeaseManager> {
    const nc = await conn(ns.url);
    conns.push(nc);
    // A short TTL: on a server without expiry markers (2.9.10) every fresh
    // key owes a grace of one TTL.
    const m = await createLeaseManager({
      nc,
      node,
      bucket,
      ttl: 1000,
      ...(check === undefined ? {} : { check }),
    });
    managers.push(m);
    return m;
  }

  /** Takes `key`, waiting out any holder and grace, in one guard. */
  async function acquire(m: LeaseManager, key: string): Promise<void> {
    await m.guard(key, () => {}, {
      wait: true,
      signal: AbortSignal.timeout(10_000),
    });
  }

  /** A manager measured on a provider of its own, and that provider's reader. */
  async function measured(
    node: string,
    bucket: string,
    options: { perKey?: boolean; leaseDurations?: boolean } = {},
  ): Promise<{ m: InstrumentedLeaseManager; reader: Reader }> {
    const reader = new Reader();
    const provider = new MeterProvider({ readers: [reader] });
    providers.push(provider);
    const m = instrument(await manager(node, bucket), {
      meter: provider.getMeter("test"),
      ...options,
    });
    return { m, reader };
  }

  test("lease.transitions and lease.held follow a holder change (release, takeover) and a loss (overwritten)", async () => {
    const bucket = uniq("otel");
    const { m: a, reader: ra } = await measured("a", bucket);
    const { m: b, reader: rb } = await measured("b", bucket);
    await acquire(a, "k");
    let ma = await collect(ra);
    assert.equal(point(ma, "lease.held", {})?.value, 1);
    const waiting = b.guard("k", () => {}, {
      wait: true,
      signal: AbortSignal.timeout(10_000),
    });
    await a.release("k");
    await waiting;
    await sleep(10); // events are dispatched in a microtask after the change
    ma = await collect(ra);
    let mb = await collect(rb);
    const acquired = { "lease.transition": "acquired" };
    const released = { "lease.transition": "released" };
    assert.equal(point(ma, "lease.transitions", acquired)?.value, 1);
    assert.equal(point(ma, "lease.transitions", released)?.value, 1);
    assert.equal(point(ma, "lease.held", {})?.value, 0);
    assert.equal(point(mb, "lease.transitions", acquired)?.value, 1);
    assert.equal(point(mb, "lease.held", {})?.value, 1);

    // Another node's write over b's entry: b's next guard finds it lost.
    const kv = await new Kvm(conns.at(-1)!).open(bucket);
    await kv.put("k", "intruder");
    await assert.rejects(b.guard("k", () => {}), { name: "NotHolderError" });
    await sleep(10);
    mb = await collect(rb);
    assert.equal(
      point(mb, "lease.transitions", {
        "lease.transition": "lost",
        "lease.lost.reason": "overwritten",
      })?.value,
      1,
    );
    assert.equal(point(mb, "lease.held", {})?.value, 0);
    for (const p of [...ma.values(), ...mb.values()].flat()) {
      assert.ok(!("lease.key" in p.attrs), "a key attribute without perKey");
    }
  });

  test("lease.renewal.duration times the renewals; a paused server and a deleted bucket show as losses, failed renewals and nothing held", async () => {
    const bucket = uniq("otel");
    const { m: a, reader } = await measured("a", bucket);
    const losses: string[] = [];
    a.addEventListener("lost", (e) => losses.push(e.reason));
    await acquire(a, "k");
    // The manager's TTL is 1000 ms: its timer renews every 333 ms.
    let got = await collect(reader);
    await eventually(
      async () => {
        got = await collect(reader);
        return (point(got, "lease.renewal.duration", {})?.count ?? 0) >= 2;
      },
      3000,
      "two renewals to be timed",
    );
    const timed = point(got, "lease.renewal.duration", {})!;
    // The unit is seconds. A renewal to a local server takes about a
    // millisecond (0.001 s), so an average under 50 ms (0.05 s) leaves a
    // loaded 2-core runner fifty times that; milliseconds recorded under
    // the unit "s" would average about 0.3-2 and fail it.
    assert.ok(
      timed.sum! > 0 && timed.sum! < 0.05 * timed.count!,
      `renewals average ${timed.sum! / timed.count!} s: ${
        JSON.stringify(timed)
      }`,
    );

    // The server frozen past the deadline: renewals fail, the tenure ends.
    await ns.pause();
    let paused: Map<string, Point[]>;
    try {
      await eventually(() => losses.length > 0, 5000, "the loss by pause");
      await sleep(10);
      // Read while the server is still paused. A lapsed tenure keeps its
      // claim, so once the server answers again, a renewal may land and the
      // manager hold the key again ("lapsed", lease.held 1 again): a CI run
      // under load saw it before a read made 10 ms after the resume.
      paused = await collect(reader);
    } finally {
      await ns.resume();
    }
    assert.equal(
      point(paused, "lease.transitions", {
        "lease.transition": "lost",
        "lease.lost.reason": "expired",
      })?.value,
      1,
    );
    assert.equal(point(paused, "lease.held", {})?.value, 0);
    await sleep(10);
    got = await collect(reader);
    const failed = point(got, "lease.renewal.failures", {
      "error.type": "UnavailableError",
    });
    assert.ok(
      (failed?.value ?? 0) >= 1,
      JSON.stringify(got.get("lease.renewal.failures")),
    );

    // Held again (by a lapsed renewal that landed, or by this guard), then
    // the bucket deleted under it.
    await acquire(a, "k");
    got = await collect(reader);
    assert.equal(point(got, "lease.held", {})?.value, 1);
    const jsm = await jetstreamManager(conns.at(-1)!);
    await jsm.streams.delete(`KV_${bucket}`);
    await eventually(() => losses.length > 1, 5000, "the loss by deletion");
    await sleep(10);
    got = await collect(reader);
    assert.deepEqual(losses, ["expired", "defunct"]);
    assert.equal(
      point(got, "lease.transitions", {
        "lease.transition": "lost",
        "lease.lost.reason": "defunct",
      })?.value,
      1,
    );
    assert.equal(
      point(got, "lease.transitions", { "lease.transition": "acquired" })
        ?.value,
      2,
    );
    assert.equal(point(got, "lease.held", {})?.value, 0);
  });

  test("guard() counts every guard by check and outcome, and times CAS guards (lease-checked ones with leaseDurations)", async () => {
    const bucket = uniq("otel");
    const { m, reader } = await measured("a", bucket);
    const reader2 = new Reader();
    const provider2 = new MeterProvider({ readers: [reader2] });
    providers.push(provider2);
    const timed = instrument(m, {
      meter: provider2.getMeter("test"),
      leaseDurations: true,
    });
    await acquire(m, "k"); // acquire (and any grace)
    for (let i = 0; i < 3; i++) await m.guard("k", () => {});
    for (let i = 0; i < 2; i++) {
      await m.guard("k", () => {}, { check: "lease" });
    }
    await timed.guard("k", () => {}, { check: "lease" });
    await assert.rejects(
      m.guard("k", async () => {
        await sleep(100);
        throw new RangeError("the write failed");
      }),
      RangeError,
    );
    const got = await collect(reader);
    const casOk = { "lease.check": "cas", "lease.guard.outcome": "ok" };
    const leaseOk = { "lease.check": "lease", "lease.guard.outcome": "ok" };
    const casErr = {
      "lease.check": "cas",
      "lease.guard.outcome": "error",
      "error.type": "RangeError",
    };
    // acquire()'s guard, then three.
    assert.equal(point(got, "lease.guards", casOk)?.value, 4);
    // `timed` wraps `m`: its guard is one of m's too.
    assert.equal(point(got, "lease.guards", leaseOk)?.value, 3);
    const d = point(got, "lease.guard.duration", casOk);
    assert.equal(d?.count, 4);
    assert.ok(d.sum! > 0 && d.sum! < 4 * 5, `sum ${d.sum} s`);
    assert.equal(point(got, "lease.guard.duration", leaseOk), undefined);
    const failed = point(got, "lease.guard.duration", casErr);
    assert.equal(failed?.count, 1);
    // In seconds: its write took 100 ms.
    assert.ok(failed.sum! >= 0.1 && failed.sum! < 10, `sum ${failed.sum} s`);
    // A write's own error is not a rejection.
    assert.equal(got.get("lease.guard.rejections"), undefined);
    const got2 = await collect(reader2);
    assert.equal(point(got2, "lease.guard.duration", leaseOk)?.count, 1);
    timed.stop();
  });

  test("instrument()'s check names the manager's default: a guard without its own check counts as that, and one naming cas as cas", async () => {
    // A manager made with check: "lease" guards with the lease check unless
    // a call says otherwise; instrument() cannot read that option, so it is
    // told, and must use it for every guard that names none.
    const bucket = uniq("otel");
    const reader = new Reader();
    const provider = new MeterProvider({ readers: [reader] });
    providers.push(provider);
    const m = instrument(await manager("a", bucket, "lease"), {
      meter: provider.getMeter("test"),
      check: "lease",
    });
    await acquire(m, "k");
    for (let i = 0; i < 2; i++) await m.guard("k", () => {});
    await m.guard("k", () => {}, { check: "cas" });
    const got = await collect(reader);
    const leaseOk = { "lease.check": "lease", "lease.guard.outcome": "ok" };
    const casOk = { "lease.check": "cas", "lease.guard.outcome": "ok" };
    // acquire()'s guard names no check either.
    assert.equal(point(got, "lease.guards", leaseOk)?.value, 3);
    assert.equal(point(got, "lease.guards", casOk)?.value, 1);
    // Lease-checked guards are not timed without leaseDurations.
    assert.equal(point(got, "lease.guard.duration", leaseOk), undefined);
    assert.equal(point(got, "lease.guard.duration", casOk)?.count, 1);
  });

  test("a rejected guard is counted in lease.guard.rejections by error class", async () => {
    const bucket = uniq("otel");
    const a = await manager("a", bucket);
    const { m: b, reader } = await measured("b", bucket);
    await acquire(a, "k");
    await assert.rejects(b.guard("k", () => {}), { name: "NotHolderError" });
    await assert.rejects(b.guard("k", () => {}), { name: "NotHolderError" });
    await assert.rejects(b.guard("not a key!", () => {}), TypeError);
    const got = await collect(reader);
    assert.equal(
      point(got, "lease.guard.rejections", { "error.type": "NotHolderError" })
        ?.value,
      2,
    );
    assert.equal(
      point(got, "lease.guard.rejections", { "error.type": "TypeError" })
        ?.value,
      1,
    );
    const notHolder = {
      "lease.check": "cas",
      "lease.guard.outcome": "not_holder",
    };
    assert.equal(point(got, "lease.guards", notHolder)?.value, 2);
    assert.equal(
      point(got, "lease.guard.duration", {
        ...notHolder,
        "error.type": "NotHolderError",
      })?.count,
      2,
    );
  });

  test("every instrument has the name, kind and unit docs/observability.md and instrument()'s JSDoc give it, as made and as the SDK reports it", async () => {
    const documented = [
      documentedInstruments("docs/observability.md", ""),
      documentedInstruments("otel.ts", " * "),
    ];
    assert.equal(documented[0]!.size, 7, "the table of docs/observability.md");
    assert.deepEqual(documented[1], documented[0], "otel.ts against the docs");
    const doc = documented[0]!;
    // What instrument() asks the meter for, seen on its way to a real
    // SDK meter.
    const reader = new Reader();
    const provider = new MeterProvider({ readers: [reader] });
    providers.push(provider);
    const real = provider.getMeter("units");
    const made = new Map<string, { kind: string; unit: string | undefined }>();
    const meter = new Proxy(real, {
      get(target, prop) {
        const v = Reflect.get(target, prop);
        if (typeof v !== "function") return v;
        const kind = typeof prop === "string" && /^create(\w+)$/.exec(prop);
        if (!kind) return v.bind(target);
        return (name: string, options?: { unit?: string }) => {
          assert.ok(!made.has(name), `${name} made twice`);
          made.set(name, { kind: kind[1]!, unit: options?.unit });
          return v.call(target, name, options);
        };
      },
    });
    const bucket = uniq("otel");
    const other = await manager("other", bucket);
    const m = instrument(await manager("u", bucket), { meter });
    assert.deepEqual(made, doc);
    // Every instrument but lease.renewal.failures recorded once at least,
    // so that the SDK reports it with its descriptor.
    await acquire(m, "k");
    await acquire(other, "x");
    await assert.rejects(m.guard("x", () => {}), { name: "NotHolderError" });
    let got = new Map<string, { type: string; unit: string }>();
    await eventually(
      async () => {
        got = await descriptors(reader);
        return got.has("lease.renewal.duration");
      },
      3000,
      "a renewal to be timed (TTL/3 = 333 ms)",
    );
    assert.deepEqual(
      [...got.keys()].sort(),
      [...doc.keys()].filter((n) => n !== "lease.renewal.failures").sort(),
    );
    for (const [name, d] of got) {
      const want = doc.get(name)!;
      assert.deepEqual(
        d,
        { type: reported(want.kind), unit: want.unit },
        name,
      );
    }
    m.stop();
  });

  test("perKey adds lease.key to guards and transitions; bad options throw TypeError", async () => {
    const bucket = uniq("otel");
    const { m, reader } = await measured("a", bucket, { perKey: true });
    await Promise.all([acquire(m, "k1"), acquire(m, "k2")]);
    assert.throws(
      () => instrument(m, { check: "fast" as "cas" }),
      /'check' must be "cas" or "lease": received "fast"/,
    );
    assert.throws(
      () => instrument(m, { perKey: "yes" as unknown as boolean }),
      /'perKey' must be a boolean: received "yes"/,
    );
    await sleep(10);
    const got = await collect(reader);
    for (const key of ["k1", "k2"]) {
      assert.equal(
        point(got, "lease.transitions", {
          "lease.transition": "acquired",
          "lease.key": key,
        })?.value,
        1,
      );
      assert.equal(
        point(got, "lease.guards", {
          "lease.check": "cas",
          "lease.guard.outcome": "ok",
          "lease.key": key,
        })?.value,
        1,
      );
    }
  });

  test("attributes tell apart two managers measured on one meter, lease.held included; bad attributes throw TypeError", async () => {
    const reader = new Reader();
    const provider = new MeterProvider({ readers: [reader] });
    providers.push(provider);
    const meter = provider.getMeter("test");
    const a = instrument(await manager("a", uniq("otel")), {
      meter,
      attributes: { "lease.bucket": "one" },
    });
    const b = instrument(await manager("b", uniq("otel")), {
      meter,
      attributes: { "lease.bucket": "two" },
    });
    await acquire(a, "k1");
    await Promise.all([acquire(b, "k1"), acquire(b, "k2")]);
    await sleep(10);
    const got = await collect(reader);
    const one = { "lease.bucket": "one" };
    const two = { "lease.bucket": "two" };
    assert.equal(point(got, "lease.held", one)?.value, 1);
    assert.equal(point(got, "lease.held", two)?.value, 2);
    const ok = { "lease.check": "cas", "lease.guard.outcome": "ok" };
    assert.equal(point(got, "lease.guards", { ...ok, ...one })?.value, 1);
    assert.equal(point(got, "lease.guards", { ...ok, ...two })?.value, 2);
    assert.equal(
      point(got, "lease.transitions", {
        "lease.transition": "acquired",
        ...two,
      })?.value,
      2,
    );
    for (const p of [...got.values()].flat()) {
      assert.ok("lease.bucket" in p.attrs, JSON.stringify(p.attrs));
    }
    assert.throws(
      () => instrument(a, { attributes: { "lease.key": "x" } }),
      /attribute 'lease.key' is set by the instrumentation itself/,
    );
    assert.throws(
      () => instrument(a, { attributes: { n: Number.NaN } }),
      /attribute 'n' must be a string, a finite number or a boolean: received NaN/,
    );
    assert.throws(
      () =>
        instrument(a, { attributes: [] as unknown as Record<string, string> }),
      /'attributes' must be an object: received an array/,
    );
    a.stop();
    b.stop();
  });

  test("stop() flushes what was measured, then records nothing more; the manager keeps working", async () => {
    const bucket = uniq("otel");
    const { m, reader } = await measured("a", bucket);
    await acquire(m, "k");
    // Enough lease-checked, timed guards to schedule a flush: stop() must
    // not leave its timer behind.
    const timed = instrument(m, {
      meter: new MeterProvider({ readers: [] }).getMeter("x"),
      leaseDurations: true,
    });
    for (let i = 0; i < 100; i++) {
      await timed.guard("k", () => {}, { check: "lease" });
    }
    timed.stop();
    for (let i = 0; i < 3; i++) await m.guard("k", () => {});
    m.stop();
    m.stop(); // twice is fine
    assert.equal(m.stopped, true);
    const before = await collect(reader);
    const casOk = { "lease.check": "cas", "lease.guard.outcome": "ok" };
    assert.equal(point(before, "lease.guard.duration", casOk)?.count, 4);
    for (let i = 0; i < 3; i++) await m.guard("k", () => {});
    await assert.rejects(m.guard("bad key!", () => {}), TypeError);
    await m.release("k");
    await acquire(m, "k");
    await sleep(10);
    const later = await collect(reader);
    assert.deepEqual(
      point(later, "lease.guard.duration", casOk),
      point(before, "lease.guard.duration", casOk),
    );
    assert.deepEqual(
      later.get("lease.transitions"),
      before.get("lease.transitions"),
    );
    assert.equal(later.get("lease.guard.rejections"), undefined);
    assert.equal(await m.held("k"), true);
    {
      using scoped = instrument(m, {
        meter: new MeterProvider().getMeter("y"),
      });
      await scoped.guard("k", () => {});
    }
  });

  test(
    "examples/otel_prometheus.ts: /metrics shows the holder change in the counters",
    {
      timeout: 30_000,
    },
    async () => {
      const root = fileURLToPath(new URL(".", import.meta.url));
      const env: Record<string, string | undefined> = {
        ...process.env,
        NATS_URL: ns.url,
        HOLD_MS: "20000",
        TTL_MS: "1000",
        LEASE_KEY: uniq("report"),
        NO_COLOR: "1",
      };
      delete env.NODE_TEST_CONTEXT;
      const args = "Deno" in globalThis
        ? ["run", "--allow-net", "--allow-env", "examples/otel_prometheus.ts"]
        : ["examples/otel_prometheus.ts"];
      const child = spawn(process.execPath, args, {
        cwd: root,
        env,
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stderr = "";
      child.stderr!.on("data", (d) => stderr += d);
      const exited = new Promise<number | null>((r) =>
        child.once("exit", (code) => r(code))
      );
      try {
        const lines: string[] = [];
        createInterface({ input: child.stdout! }).on(
          "line",
          (l) => lines.push(l),
        );
        await eventually(
          () => lines.some((l) => l.startsWith("node-b holds")),
          20_000,
          "node-b to take the key",
          20,
        ).catch((err) => {
          throw new Error(`${err.message}\n${lines.join("\n")}\n${stderr}`);
        });
        const url = /^metrics: (\S+)$/.exec(lines[0] ?? "")?.[1];
        assert.ok(url, lines.join("\n"));
        const text = await (await fetch(url)).text();
        const samples = text.split("\n").flatMap((l) => {
          const m = /^(\w+)(?:\{(.*)\})? (\S+)/.exec(l);
          if (m === null) return [];
          const labels: Record<string, string> = {};
          for (const [, k, v] of (m[2] ?? "").matchAll(/(\w+)="([^"]*)"/g)) {
            labels[k!] = v!;
          }
          return [{ name: m[1]!, labels, value: Number(m[3]) }];
        });
        const value = (
          node: string,
          name: string,
          labels: Record<string, string> = {},
        ): number | undefined =>
          samples.find((s) =>
            s.name === name && s.labels.otel_scope_name === node &&
            Object.entries(labels).every(([k, v]) => s.labels[k] === v)
          )?.value;
        const acquired = { lease_transition: "acquired" };
        const released = { lease_transition: "released" };
        assert.equal(
          value("node-a", "lease_transitions_total", acquired),
          1,
          text,
        );
        assert.equal(
          value("node-a", "lease_transitions_total", released),
          1,
          text,
        );
        assert.equal(
          value("node-b", "lease_transitions_total", acquired),
          1,
          text,
        );
        assert.equal(
          value("node-b", "lease_guard_rejections_total", {
            error_type: "NotHolderError",
          }),
          1,
          text,
        );
        assert.equal(value("node-a", "lease_held"), 0, text);
        assert.equal(value("node-b", "lease_held"), 1, text);
      } finally {
        child.kill("SIGTERM");
        await exited;
      }
    },
  );

  test("attributes tell apart two managers' failed renewals: lease.renewal.failures carries them, while a paused server fails both", async () => {
    const reader = new Reader();
    const provider = new MeterProvider({ readers: [reader] });
    providers.push(provider);
    const meter = provider.getMeter("test");
    const a = instrument(await manager("a", uniq("otel")), {
      meter,
      attributes: { "lease.bucket": "one" },
    });
    const b = instrument(await manager("b", uniq("otel")), {
      meter,
      attributes: { "lease.bucket": "two" },
    });
    const losses: string[] = [];
    for (const m of [a, b]) {
      m.addEventListener("lost", (e) => losses.push(e.reason));
    }
    await Promise.all([acquire(a, "k"), acquire(b, "k")]);
    // Frozen past the TTL (1000 ms): every renewal of both fails.
    await ns.pause();
    try {
      await eventually(() => losses.length >= 2, 5000, "both losses by pause");
    } finally {
      await ns.resume();
    }
    await sleep(10);
    const failures = (await collect(reader)).get("lease.renewal.failures") ??
      [];
    const text = JSON.stringify(failures);
    for (const bucket of ["one", "two"]) {
      const mine = failures.filter((p) => p.attrs["lease.bucket"] === bucket);
      assert.ok(
        mine.reduce((n, p) => n + (p.value ?? 0), 0) >= 1,
        `no failed renewal of '${bucket}': ${text}`,
      );
    }
    for (const p of failures) {
      assert.ok("lease.bucket" in p.attrs, text);
      assert.ok("error.type" in p.attrs, text);
    }
    a.stop();
    b.stop();
  });
});
