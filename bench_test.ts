// Checks that the benchmark runs and reports under this runtime, not its
// figures: `bench/bench.ts --smoke` must exit 0, print a table with every row
// and write a JSON report whose fields are all present and finite.

// test.sh: first server only: the benchmark script's smoke run; what differs
// between servers is covered by the lease tests.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import type { BenchReport } from "./bench/bench.ts";
import { natsServerBinary } from "./test_util/nats_server.ts";

const bench = fileURLToPath(new URL("./bench/bench.ts", import.meta.url));

/** Runs a TypeScript file on the runtime running this test. */
function runScript(
  file: string,
  args: string[],
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const isDeno = typeof (globalThis as { Deno?: unknown }).Deno === "object";
  const argv = isDeno ? ["run", "-A", file, ...args] : [file, ...args];
  // A child of `node --test` that saw this would report to the runner.
  const env = { ...process.env };
  delete env.NODE_TEST_CONTEXT;
  const child = spawn(process.execPath, argv, {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (s: string) => stdout += s);
  child.stderr.setEncoding("utf8").on("data", (s: string) => stderr += s);
  return new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr }));
  });
}

/** Fields every smoke report must carry as finite numbers. */
const NUMBERS = [
  "durationMs",
  "machine.cores",
  "latency.guard.p50",
  "latency.guard.p99",
  "latency.cas.p50",
  "latency.cas.p99",
  "latency.get.p50",
  "latency.get.p99",
  "latency.casMsgId.p50",
  "latency.ratioP50",
  "latency.guardCpuUs",
  "latency.casCpuUs",
  "latency.lease.guard.p50",
  "latency.lease.guard.p99",
  "latency.lease.cpuUs",
  "latency.lease.fastShare",
  "latency.lease.speedupP50",
  "latency.lease.target",
  "throughput.guard.opsPerSec",
  "throughput.guard.p99",
  "throughput.cas.opsPerSec",
  "throughput.casMsgId.opsPerSec",
  "throughput.ratio",
  "sameKey.concurrent.opsPerSec",
  "sameKey.concurrent.p99",
  "sameKey.concurrent.serverMsgsPerOp",
  "sameKey.sequential.opsPerSec",
  "sameKey.speedup",
  "sameKey.leaseOverCasConcurrent",
  "sameKey.leaseOverCasSequential",
  ...["noop", "cpu", "hop"].flatMap((write) =>
    [
      "lease.concurrent.opsPerSec",
      "lease.concurrent.p99",
      "lease.concurrent.serverMsgsPerOp",
      "lease.sequential.opsPerSec",
      "lease.sequential.p99",
      "direct.concurrent.opsPerSec",
      "direct.sequential.opsPerSec",
      "ratioConcurrent",
      "ratioSequential",
    ].map((field) => `sameKey.lease.${write}.${field}`)
  ),
  "scale.target.n",
  "scale.target.lost",
  "scale.target.serverInMsgsPerSec",
  "scale.target.cpuShare",
  "scale.target.cpuUsPerRenewal",
  "scale.target.loopDelayP99",
  "scale.targetBare.lost",
  "scale.targetBare.renewalsPerSec",
  "scale.targetBare.cpuUsPerRenewal",
  "scale.heldWithoutLoss",
  "scale.predictedLimit",
  "failover.ttl",
  "failover.bound",
  "failover.kill.ms",
  "failover.close.ms",
  "memory.heapBytesPerLease",
];

/** Fields that may be null: no loss found; no /proc to read CPU from. */
const NULLABLE = new Set(["brokeAt", "serverCpuShare"]);

function at(value: unknown, dotted: string): unknown {
  return dotted.split(".").reduce<unknown>(
    (v, k) => (v as Record<string, unknown> | null)?.[k],
    value,
  );
}

function leaves(
  value: unknown,
  where: string,
  out: [string, unknown][],
): [string, unknown][] {
  if (value !== null && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) {
      leaves(v, where ? `${where}.${k}` : k, out);
    }
  } else out.push([where, value]);
  return out;
}

// The benchmark's figures are measured on the current server only; its
// smoke check runs there too, not again on the oldest supported one.
const serverVersion = /v?(\d+)\.(\d+)\.(\d+)/.exec(
  spawnSync(natsServerBinary(), ["--version"], { encoding: "utf8" }).stdout ??
    "",
);
const oldServer = serverVersion !== null &&
  Number(serverVersion[1]) * 100 + Number(serverVersion[2]) < 211;
const skip = oldServer
  ? `the benchmark runs on the current server, this is ${serverVersion![0]}`
  : false;

test(
  `bench.ts --smoke prints every row and writes a report of finite numbers${
    skip ? ` [skipped: ${skip}]` : ""
  }`,
  {
    timeout: 60_000,
    skip,
  },
  async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bench-test-"));
    try {
      const out = path.join(dir, "report.json");
      const run = await runScript(bench, ["--smoke", "--out", out]);
      assert.equal(run.code, 0, `bench.ts failed:\n${run.stderr}`);

      for (const n of [1, 2, 3, 4, 5, 6]) {
        assert.match(run.stdout, new RegExp(`^\\| ${n} \\| `, "m"));
      }
      // Rows 1 and 3 show the lease-checked guard beside the CAS guard.
      assert.match(run.stdout, /^\| 1 \| guard latency, check: "lease"/m);
      assert.match(run.stdout, /^\| 3 \| check: "lease" guards on one key/m);

      const report = JSON.parse(fs.readFileSync(out, "utf8")) as BenchReport;
      assert.equal(report.schema, 1);
      assert.equal(report.mode, "smoke");
      assert.match(report.server.version, /^\d+\.\d+\.\d+/);
      assert.ok(["deno", "bun", "node"].includes(report.runtime.name));
      for (const field of NUMBERS) {
        const v = at(report, field);
        assert.ok(
          typeof v === "number" && Number.isFinite(v),
          `${field} should be a finite number: received ${JSON.stringify(v)}`,
        );
      }
      // JSON turns NaN and Infinity into null: no other field may be null.
      for (const [where, v] of leaves(report, "", [])) {
        const key = where.slice(where.lastIndexOf(".") + 1);
        assert.ok(
          v !== null || NULLABLE.has(key),
          `${where} should not be null`,
        );
        if (typeof v === "number") {
          assert.ok(Number.isFinite(v), `${where} should be finite`);
        }
      }
      assert.ok(
        report.scale!.steps.length > 0,
        "the breaking-point search ran",
      );
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  `bench/fenced.ts --smoke prints each row beside its bare operation, and finite medians${
    skip ? ` [skipped: ${skip}]` : ""
  }`,
  { timeout: 60_000, skip },
  async () => {
    const run = await runScript(
      fileURLToPath(new URL("./bench/fenced.ts", import.meta.url)),
      ["--smoke"],
    );
    assert.equal(run.code, 0, `bench/fenced.ts failed:\n${run.stderr}`);
    for (
      const row of [
        /^\| fenced put by a held lease \| .* \| bare js\.publish \|/m,
        /^\| lease-checked guard \+ fenced put \|/m,
        /^\| free key: guard \+ release, fenced \| .* \| the same on the classic layout \|/m,
      ]
    ) assert.match(run.stdout, row);
    const report = JSON.parse(run.stdout.trim().split("\n").at(-1)!) as {
      p50: Record<string, number | null>;
    };
    for (const [k, v] of Object.entries(report.p50)) {
      if (k === "commit10" && v === null) continue; // before 2.12
      assert.ok(typeof v === "number" && v > 0 && Number.isFinite(v), k);
    }
  },
);
