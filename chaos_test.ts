// test.sh: node only: these check the harness and its checker, tools of
// this repository rather than the library in a runtime; chaos/ci.sh runs
// the harness itself, and the lease tests cover 2.9.10 and every runtime.
// Tests of the chaos checker: its checks on hand-made histories, then short
// harness runs against a real nats-server (the correct workers must show no
// violation; the deliberately broken ones must be caught). Runs under
// `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN picks the
// server binary; CHAOS_SEED fixes the seed (default: a new one per run,
// printed in every failure).
import { describe } from "node:test";
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import {
  checkHistory,
  type FaultRecord,
  type WriteRecord,
} from "./chaos/check.ts";
import { FencedStore } from "./chaos/store.ts";
import { natsServerBinary } from "./test_util/nats_server.ts";

const TTL = 1000;
const OPTS = { ttl: TTL, slack: 750, handover: 100, runEnd: 1e9 };

let nextId = 0;
/** A write on `k` from process `proc` at `epoch` spanning store seqs [b, e], times in ms. */
function write(
  proc: string,
  epoch: number,
  b: number,
  e: number,
  extra: Partial<WriteRecord> = {},
): WriteRecord {
  return {
    id: ++nextId,
    key: "k",
    node: proc,
    proc,
    epoch,
    called: b * 10 - 2,
    start: b * 10,
    end: e * 10,
    beginSeq: b,
    beginAt: b * 10,
    endSeq: e,
    endAt: e * 10,
    status: "accepted",
    reason: undefined,
    ...extra,
  };
}

function fault(f: Partial<FaultRecord> & Pick<FaultRecord, "kind">) {
  return { index: 0, at: 0, end: 0, keys: [], recovered: true, ...f };
}

describe("checkHistory()", () => {
  test("checkHistory() passes sequential writes whose epochs grow at each holder change", () => {
    const r = checkHistory(
      [
        write("a", 5, 1, 2),
        write("a", 5, 3, 4),
        write("b", 9, 5, 6),
        write("a", 12, 7, 8),
      ],
      [],
      OPTS,
    );
    assert.deepEqual(r.violations, []);
  });

  test("checkHistory() reports overlapping writes of two nodes (check 1)", () => {
    const r = checkHistory(
      [write("a", 5, 1, 3), write("b", 9, 2, 4)],
      [],
      OPTS,
    );
    assert.deepEqual(r.violations.map((v) => v.check), [1]);
  });

  test("checkHistory() excuses an overlap only for a fenced write of a node paused past TTL + grace (check 1)", () => {
    // The older write spans 2.5 TTL and its node was stopped in between.
    const older = write("a", 5, 1, 4, {
      called: 0,
      endAt: 2.5 * TTL,
      status: "rejected-commit",
    });
    const paused = fault({
      kind: "holder-pause",
      proc: "a",
      paused: { from: 10, to: 2.4 * TTL },
    });
    const ok = checkHistory([older, write("b", 9, 2, 3)], [paused], OPTS);
    assert.deepEqual(ok.violations, []);
    assert.equal(ok.exemptWrites, 1);
    // Not fenced: a violation even though paused.
    const accepted = { ...older, status: "accepted" as const };
    assert.equal(
      checkHistory([accepted, write("b", 9, 2, 3)], [paused], OPTS)
        .violations[0]?.check,
      1,
    );
    // Fenced and paused, but the successor came in before TTL + grace: the
    // grace was skipped.
    const short = { ...older, endAt: 1.5 * TTL };
    assert.equal(
      checkHistory([short, write("b", 9, 2, 3)], [paused], OPTS)
        .violations[0]?.check,
      1,
    );
    // Fenced and slow, but never paused.
    assert.equal(
      checkHistory([older, write("b", 9, 2, 3)], [], OPTS).violations[0]
        ?.check,
      1,
    );
  });

  test("checkHistory() tells writers apart by process: a restarted process reusing a node id is another writer (checks 1 and 4)", () => {
    const r = checkHistory(
      [
        write("a", 5, 1, 3),
        { ...write("a2", 5, 2, 4), node: "a" },
      ],
      [],
      OPTS,
    );
    assert.deepEqual(r.violations.map((v) => v.check), [1, 4]);
  });

  test("checkHistory() reports two nodes writing at once with the same epoch (check 1)", () => {
    const r = checkHistory(
      [write("a", 5, 1, 4), write("b", 5, 2, 3)],
      [],
      OPTS,
    );
    assert.match(r.violations[0]!.message, /same epoch/);
  });

  test("checkHistory() reports a fence that accepted an older epoch (check 2)", () => {
    const r = checkHistory(
      [write("a", 9, 1, 2), write("b", 5, 3, 4)],
      [],
      OPTS,
    );
    assert.deepEqual(r.violations.map((v) => v.check).sort(), [2, 4]);
  });

  test("checkHistory() reports a write whose guard call and start both fall inside an outage, and only such writes (check 3)", () => {
    const outage = fault({
      kind: "server-kill",
      outage: { from: 1000, to: 2000 },
    });
    const inside = write("a", 5, 1, 2, { called: 1001, start: 1999 });
    const before = write("a", 5, 3, 4, { called: 1000, start: 1500 });
    const after = write("a", 5, 5, 6, { called: 1500, start: 2000 });
    const r = checkHistory([inside, before, after], [outage], OPTS);
    assert.deepEqual(r.violations.map((v) => [v.check, v.writes]), [[3, [
      inside.id,
    ]]]);
  });

  test("checkHistory() reports a holder change without a greater epoch (check 4)", () => {
    const r = checkHistory(
      [
        write("a", 5, 1, 2),
        write("b", 5, 3, 4, { status: "accepted" }),
      ],
      [],
      OPTS,
    );
    assert.deepEqual(r.violations.map((v) => v.check), [4]);
  });

  test("checkHistory() bounds failover after a kill by TTL + grace + slack and after a clean shutdown by the handover bound (check 5)", () => {
    const kill = fault({ kind: "holder-kill", proc: "a", at: 0, keys: ["k"] });
    const fast = checkHistory(
      [write("a", 5, 1, 2, { start: -50, endAt: -40 }), {
        ...write("b", 9, 3, 4),
        start: 2 * TTL + 700,
      }],
      [kill],
      OPTS,
    );
    assert.deepEqual(fast.violations, []);
    assert.equal(fast.failovers[0]!.ms, 2 * TTL + 700);
    const slow = checkHistory(
      [{ ...write("b", 9, 3, 4), start: 2 * TTL + 800 }],
      [kill],
      OPTS,
    );
    assert.deepEqual(slow.violations.map((v) => v.check), [5]);

    // Clean shutdown: measured from the end of the holder's last write.
    const term = fault({ kind: "holder-term", proc: "a", at: 0, keys: ["k"] });
    const r = checkHistory(
      [
        write("a", 5, 1, 2, { start: -10, endAt: 30 }),
        { ...write("b", 9, 3, 4), start: 120 },
      ],
      [term],
      OPTS,
    );
    assert.deepEqual(r.violations, []);
    assert.equal(r.failovers[0]!.ms, 90);
    const late = checkHistory(
      [
        { ...write("b", 9, 3, 4), start: 101 },
      ],
      [term],
      OPTS,
    );
    assert.deepEqual(late.violations.map((v) => v.check), [5]);
  });

  test("checkHistory() extends a liveness bound by the time the victim or the successor was stalled (check 5)", () => {
    const term = fault({ kind: "holder-term", proc: "a", at: 0, keys: ["k"] });
    const successor = { ...write("b", 9, 3, 4), start: 150 };
    const stalls = [
      { proc: "a", from: 10, to: 50 },
      { proc: "b", from: 40, to: 70 },
      { proc: "c", from: 0, to: 180 }, // a bystander does not count
    ];
    const r = checkHistory([successor], [term], { ...OPTS, stalls });
    assert.deepEqual(r.violations, []);
    assert.equal(r.failovers[0]!.stalledMs, 60);
    assert.equal(r.stallExcused, 1);
    const worse = checkHistory([{ ...successor, start: 161 + 60 }], [term], {
      ...OPTS,
      stalls,
    });
    assert.deepEqual(worse.violations.map((v) => v.check), [5]);
  });

  test("checkHistory() reports a fault the run never recovered from (check 5)", () => {
    const r = checkHistory(
      [],
      [fault({ kind: "server-kill", recovered: false })],
      OPTS,
    );
    assert.deepEqual(r.violations.map((v) => v.check), [5]);
  });
});

describe("FencedStore", () => {
  test("FencedStore refuses an older epoch at begin and at commit once a newer one began", () => {
    const store = new FencedStore();
    const a = store.begin({
      key: "k",
      node: "a",
      proc: "a",
      epoch: 5,
      called: 0,
      start: 0,
    });
    assert.equal(a.ok, true);
    const b = store.begin({
      key: "k",
      node: "b",
      proc: "b",
      epoch: 9,
      called: 0,
      start: 0,
    });
    assert.equal(b.ok, true);
    assert.equal(store.commit(a.id!, 0).ok, false);
    assert.equal(store.commit(b.id!, 0).ok, true);
    const late = store.begin({
      key: "k",
      node: "a",
      proc: "a",
      epoch: 5,
      called: 0,
      start: 0,
    });
    assert.equal(late.ok, false);
    assert.deepEqual(store.writes.map((w) => w.status), [
      "rejected-commit",
      "accepted",
      "rejected-begin",
    ]);
    // Another key has its own fence.
    assert.equal(
      store.begin({
        key: "j",
        node: "a",
        proc: "a",
        epoch: 1,
        called: 0,
        start: 0,
      }).ok,
      true,
    );
  });
});

// ---------------------------------------------------------------------------
// The harness against a real server.

const CHAOS = fileURLToPath(new URL("./chaos/chaos.ts", import.meta.url));
const SEED = process.env.CHAOS_SEED ?? String(Date.now() % 1_000_000);

function serverVersion(): string {
  const out = execFileSync(natsServerBinary(), ["--version"], {
    encoding: "utf8",
  });
  return /v?(\d+\.\d+\.\d+)/.exec(out)?.[1] ?? out.trim();
}

function casSafeOnReplicas(version: string): boolean {
  const [maj = 0, min = 0, pat = 0] = version.split(".").map(Number);
  return maj > 2 || (maj === 2 && (min > 9 || pat >= 21));
}

interface ChaosReport {
  result: string;
  violations: Record<string, number>;
  faults: Record<string, { count: number }>;
  writes: { run: number; accepted: number; unguarded: number };
  errors: string[];
}

/** Runs chaos.ts under the current runtime; returns its exit code, output and JSON report. */
async function runChaos(
  args: string[],
): Promise<{ code: number | null; out: string; report: ChaosReport }> {
  const json = path.join(
    fs.mkdtempSync(path.join(os.tmpdir(), "chaos-test-")),
    "report.json",
  );
  // Feature check, not name sniffing: Deno needs `run -A`.
  const argv = "Deno" in globalThis
    ? ["run", "-A", CHAOS, ...args, "--json", json]
    : [CHAOS, ...args, "--json", json];
  const child = spawn(process.execPath, argv, {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, NO_COLOR: "1" },
  });
  let out = "";
  child.stdout!.setEncoding("utf8");
  child.stderr!.setEncoding("utf8");
  child.stdout!.on("data", (d: string) => out += d);
  child.stderr!.on("data", (d: string) => out += d);
  const code = await new Promise<number | null>((resolve) =>
    child.on("exit", (c) => resolve(c))
  );
  let report: ChaosReport;
  try {
    report = JSON.parse(fs.readFileSync(json, "utf8"));
  } catch {
    throw new Error(`chaos.ts wrote no report (exit ${code}):\n${out}`);
  } finally {
    fs.rmSync(path.dirname(json), { recursive: true, force: true });
  }
  return { code, out, report };
}

const violations = (r: ChaosReport): number =>
  Object.values(r.violations).reduce((a, b) => a + b, 0);

describe("chaos harness against a real nats-server", () => {
  // The harness starts Deno, Bun and Node workers itself, whatever runs
  // this file, and CI runs a minute of it per mode besides (chaos/ci.sh):
  // this clean run is made once per server, under Deno.
  const onlyDeno = "Deno" in globalThis
    ? false
    : "made under Deno only: the harness starts its own Deno, Bun and Node workers whatever runtime runs this file";
  test(
    `chaos.ts in single-server mode finds no violation in a short run of mixed faults (seed ${SEED})${
      onlyDeno ? ` [skipped: ${onlyDeno}]` : ""
    }`,
    { skip: onlyDeno },
    async () => {
      const { code, out, report } = await runChaos([
        "--mode",
        "single",
        "--seconds",
        "18",
        "--seed",
        SEED,
        "--ttl",
        String(TTL),
        // check 5 after a clean shutdown (holder-term): the harness's 100 ms
        // default is a speed figure (chaos/RESULTS.md reports 35 ms worst),
        // not a behaviour this test asserts under CI load. What it asserts
        // is that the successor waits for neither the expiry (at least 2/3
        // TTL away, as holders renew every TTL/3) nor a grace (a TTL or
        // two): anything below TTL/2 proves that.
        "--handover",
        String(TTL / 2),
      ]);
      assert.equal(violations(report), 0, out);
      assert.deepEqual(report.errors, [], out);
      assert.equal(code, 0, out);
      assert.ok(report.writes.accepted > 100, out);
      const injected = Object.values(report.faults).reduce(
        (n, f) => n + f.count,
        0,
      );
      assert.ok(injected >= 4, `only ${injected} faults\n${out}`);
    },
  );

  test(`chaos.ts catches the broken variants: unguarded writes during an outage and writes during the grace (seed ${SEED})`, async () => {
    const [blind, nograce] = await Promise.all([
      runChaos([
        "--seconds",
        "3",
        "--workers",
        "3",
        "--seed",
        SEED,
        "--broken",
        "blind",
        "--faults",
        "server-pause",
      ]),
      runChaos([
        "--seconds",
        "6",
        "--workers",
        "3",
        "--seed",
        SEED,
        "--broken",
        "nograce",
        "--faults",
        "holder-pause",
        "--holder-pause",
        "1.5,1.8",
      ]),
    ]);
    assert.equal(blind.code, 1, blind.out);
    assert.ok(blind.report.writes.unguarded > 0, blind.out);
    assert.ok(
      (blind.report.violations[
        "3. no write ran while the server or quorum was unreachable"
      ] ?? 0) > 0,
      blind.out,
    );
    assert.equal(nograce.code, 1, nograce.out);
    assert.ok(
      (nograce.report.violations[
        "1. no overlapping writes of two writers on a key (unless fenced, paused)"
      ] ?? 0) > 0,
      nograce.out,
    );
  });

  const version = serverVersion();
  // Named in the title too: not every runner prints a skip's reason.
  const skip = casSafeOnReplicas(version)
    ? undefined
    : `nats-server ${version} refuses replicated lease buckets by design (its compare-and-set on replicated streams is unsafe before 2.9.21, nats-server#4320); cluster mode needs 2.9.21 or later`;
  test(
    `chaos.ts in cluster mode finds no violation with the stream leader killed and paused (seed ${SEED})${
      skip ? ` [skipped: ${skip}]` : ""
    }`,
    { skip: skip ?? false },
    async () => {
      const { code, out, report } = await runChaos([
        "--mode",
        "cluster",
        "--seconds",
        "5",
        "--workers",
        "3",
        "--seed",
        SEED,
        "--faults",
        "leader-kill,leader-pause",
      ]);
      assert.equal(violations(report), 0, out);
      assert.equal(code, 0, out);
      assert.ok(
        report.faults["leader-kill"]!.count +
            report.faults["leader-pause"]!.count >= 1,
        out,
      );
    },
  );
});
