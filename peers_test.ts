// test.sh: first server only: the comparison starts its own servers (two
// nats-servers, etcd, redis-server); what differs between NATS servers is
// covered by the lease tests.

// Checks that `bench/peers.ts --smoke` runs every system through every row,
// not its figures: each row of the report has a figure for each system.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import type { PeersReport } from "./bench/peers.ts";

const runtime = "Deno" in globalThis
  ? "deno"
  : "Bun" in globalThis
  ? "bun"
  : "node";

const script = fileURLToPath(new URL("./bench/peers.ts", import.meta.url));

test(
  "bench/peers.ts --smoke runs ours on both servers, etcd and Redis through rows 1 to 6",
  {
    skip: runtime === "node" ? false : "run once, under node --test",
    timeout: 120_000,
  },
  async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "peers-test-"));
    const out = path.join(dir, "report.json");
    try {
      // A child of `node --test` that saw this would report to the runner.
      const env = { ...process.env };
      delete env.NODE_TEST_CONTEXT;
      const child = spawn(process.execPath, [script, "--smoke", "--out", out], {
        env,
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stdout = "";
      let stderr = "";
      child.stdout.setEncoding("utf8").on("data", (s: string) => stdout += s);
      child.stderr.setEncoding("utf8").on("data", (s: string) => stderr += s);
      const code = await new Promise<number | null>((resolve, reject) => {
        child.once("error", reject);
        child.once("close", resolve);
      });
      assert.equal(code, 0, `peers.ts --smoke failed:\n${stderr}`);
      assert.match(stdout, /\| row \| nats\/cas \|/);

      const report = JSON.parse(fs.readFileSync(out, "utf8")) as PeersReport;
      for (const v of ["nats-server", "etcd", "redis"]) {
        assert.match(report.versions[v] ?? "", /^\d+\.\d+\.\d+/, v);
      }
      for (const [column, runs] of Object.entries(report.runs)) {
        const [f] = runs;
        assert.ok(f !== undefined, `${column} ran no run`);
        const rows: (keyof typeof f)[] = [
          "latencyP50",
          "latencyP99",
          "opsPerSec",
        ];
        if (!column.endsWith("/lease")) {
          rows.push(
            "acquireReleaseMs",
            "requestsPerCycle",
            "failoverMs",
            "handoverMs",
          );
          assert.ok(f.paused !== undefined, `${column} has no row 6`);
        }
        for (const row of rows) {
          const x = f[row];
          assert.ok(
            typeof x === "number" && Number.isFinite(x) && x > 0,
            `${column} has no figure for ${row}: ${x}`,
          );
        }
      }
      assert.deepEqual(
        Object.keys(report.runs).sort(),
        [
          "etcd",
          "nats-always/cas",
          "nats-always/lease",
          "nats-fenced-always/cas",
          "nats-fenced-always/lease",
          "nats-fenced/cas",
          "nats-fenced/lease",
          "nats/cas",
          "nats/lease",
          "redis",
          "redis-always",
        ],
      );
      // Row 6 as each system is built: the late write of a paused holder is
      // refused by etcd's transaction and by our epoch, and lands in Redis.
      assert.equal(report.runs.etcd?.[0]?.paused?.landed, false);
      assert.notEqual(report.runs["nats/cas"]?.[0]?.paused?.refusedBy, null);
      assert.equal(report.runs.redis?.[0]?.paused?.refusedBy, null);
      assert.equal(report.runs["redis-always"]?.[0]?.paused?.refusedBy, null);
      // On a fenced bucket neither the holder's late put nor the same
      // message sent past its lease's check is stored: the server refuses.
      const fencedRow6 = report.runs["nats-fenced/cas"]?.[0]?.paused as
        | { landed: boolean; sent?: { stored: boolean } }
        | undefined;
      assert.equal(fencedRow6?.landed, false);
      assert.equal(fencedRow6?.sent?.stored, false);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  },
);
