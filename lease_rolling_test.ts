// test.sh: node only: what it tests is the cluster's rolling restart under many leases; the manager's runtimes meet R3 buckets, killed leaders and set-up with a peer down in lease_cluster_test.ts and lease_replicas_test.ts
// A rolling restart of a three-server cluster under three lease managers
// holding 100 keys of an R3 bucket and writing to a store fenced by epoch:
// each server is killed and started again in turn, and while it is down one
// manager is closed and made anew (set-up with a peer down). No two holders
// may write one key at once, the store must never see an epoch go back,
// every manager restart must succeed, and the test reports how long each
// server restart kept writes refused.
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  createLeaseManager,
  type LeaseManager,
  NotHolderError,
  UnavailableError,
} from "./mod.ts";
import { sleep } from "./test_util/lease_helpers.ts";
import { FencedStore } from "./test_util/fenced_store.ts";
import { NatsCluster, natsServerBinary } from "./test_util/nats_server.ts";
import { clusterConn as conn, versionOf } from "./test_util/lease_helpers.ts";
import { casSafeVersion } from "./lease.ts";

const TTL = 2_000;
const KEYS = Array.from({ length: 100 }, (_, i) => `k${i}`);
const version = versionOf(natsServerBinary());
// Replicated buckets are refused before 2.9.21 (nats-server#4320).
const casSafe = casSafeVersion(version);

interface Worker {
  name: string;
  nc: NatsConnection;
  m: LeaseManager;
}

test(
  `a rolling restart of three servers under three managers holding 100 keys: no overlap, no epoch going back, every manager restart succeeds${
    casSafe ? "" : ` [skipped: nats-server ${version} refuses R3 buckets]`
  }`,
  { skip: !casSafe, timeout: 180_000 },
  async () => {
    await using cluster = await NatsCluster.start(3);
    const store = new FencedStore();
    /** When each write was accepted, for the gaps per server restart. */
    const oks: number[] = [];
    let refused = 0;
    const restarts: string[] = [];
    const start = async (i: number): Promise<Worker> => {
      const nc = await conn(cluster, i);
      const began = performance.now();
      const m = await createLeaseManager({
        nc,
        node: `w${i}`,
        bucket: "rolling",
        ttl: TTL,
        replicas: 3,
      });
      restarts.push(`w${i} ${Math.round(performance.now() - began)} ms`);
      return { name: `w${i}`, nc, m };
    };
    const workers: Worker[] = [];
    for (let i = 0; i < 3; i++) workers.push(await start(i));

    let running = true;
    const loop = async (slot: number): Promise<void> => {
      while (running) {
        const w = workers[slot]!;
        for (const key of KEYS) {
          if (!running || workers[slot] !== w) break;
          try {
            await w.m.guard(key, async (lease) => {
              await store.write(key, w.name, lease.epoch, lease.tenure);
            });
            oks.push(performance.now());
          } catch (err) {
            if (err instanceof UnavailableError) refused++;
            else if (!(err instanceof NotHolderError)) {
              // A manager being closed by the test rejects its guards.
              if (!/closed/i.test(String(err))) throw err;
            }
          }
        }
        await sleep(20);
      }
    };
    const loops = [0, 1, 2].map((slot) => loop(slot));

    const windows: { server: number; from: number; to: number }[] = [];
    const metas: string[] = [];
    try {
      await sleep(2_000);
      for (let s = 0; s < 3; s++) {
        const from = performance.now();
        await cluster.kill(s);
        // How long the cluster takes to have a meta leader again (the
        // killed server may have led it): no JetStream request is answered
        // meanwhile, whatever the client does.
        const meta = cluster.waitForMetaLeader().then(() =>
          metas.push(`n${s} ${Math.round(performance.now() - from)} ms`)
        );
        // A manager restarts while the server is down: set-up with a peer
        // of the R3 stream missing must succeed (it waited 20 s and
        // refused before).
        const slot = (s + 1) % 3;
        const old = workers[slot]!;
        await old.m.close();
        await old.nc.close();
        workers[slot] = await start(slot);
        await meta;
        await sleep(2_000);
        await cluster.servers[s]!.restart();
        await cluster.waitForMetaLeader();
        await sleep(2_000);
        windows.push({ server: s, from, to: performance.now() });
      }
    } finally {
      running = false;
      await Promise.allSettled(loops);
      for (const w of workers) {
        await w.m.close().catch(() => {});
        await w.nc.close().catch(() => {});
      }
    }
    await Promise.all(loops);

    // The longest stretch with no write accepted on any key, per server
    // restart: how long that restart kept writes refused.
    const gaps = windows.map(({ server, from, to }) => {
      const inside = oks.filter((t) => t >= from && t <= to);
      let longest = 0;
      let prev = from;
      for (const t of inside) {
        longest = Math.max(longest, t - prev);
        prev = t;
      }
      longest = Math.max(longest, to - prev);
      return `n${server} ${Math.round(longest)} ms`;
    });
    console.log(
      `rolling restart: ${store.accepted} writes accepted, ${refused} guards refused (UnavailableError); longest gap with no write, per server restart: ${
        gaps.join(", ")
      }; meta leader back after each kill: ${
        metas.join(", ")
      }; manager set-ups (the first three before any kill, then one right after each kill): ${
        restarts.join(", ")
      }`,
    );
    assert.deepEqual(store.overlaps, []);
    assert.deepEqual(store.selfOverlaps, []);
    assert.deepEqual(store.regressions, []);
    assert.deepEqual(store.sameEpochTwoTenures, []);
    // Writes went on through the restarts (a test that wrote nothing would
    // pass the checks above).
    for (const { from, to } of windows) {
      assert.ok(
        oks.some((t) => t >= from && t <= to),
        "no write was accepted during a server restart",
      );
    }
  },
);
