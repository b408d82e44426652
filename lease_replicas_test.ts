// Tests for unsafeReplicaReason (lease.ts): on real
// servers, that a replicated stream counts as safe only when every one of
// its peers is seen running nats-server 2.9.21 or later (nats-server#4320),
// whatever server the client is connected to. The cluster tests name their
// binaries explicitly, so they run the same whichever server NATS_SERVER_BIN
// selects, and skip, saying why, when a binary is missing.

// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import { execFile } from "node:child_process";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { createBucket } from "./test_util/lease_helpers.ts";
import {
  NatsCluster,
  NatsServer,
  natsServerBinary,
} from "./test_util/nats_server.ts";
import {
  casSafeVersion,
  createLeaseManager,
  unsafeReplicaReason,
} from "./lease.ts";

const CURRENT = decodeURIComponent(
  new URL("./.tools/bin/nats-server", import.meta.url).pathname,
);
const OLDEST = "/usr/sbin/nats-server";
const TEST_TIMEOUT = 60_000;
/** The budget given to every check. */
const CHECK_MS = 2_000;

function missing(...binaries: string[]): string | undefined {
  const absent = binaries.filter((file) => {
    try {
      fs.accessSync(file, fs.constants.X_OK);
      return false;
    } catch {
      return true;
    }
  });
  return absent.length === 0
    ? undefined
    : `missing ${
      absent.join(" and ")
    }: run 'bash scripts/setup.sh' to build .tools/bin/nats-server (2.15.2) and install Debian's nats-server (2.9.10)`;
}

/** Test options, and the title with the skip reason (not every runner prints it). */
function needs(
  title: string,
  ...binaries: string[]
): [string, { skip: string | false; timeout: number }] {
  const skip = missing(...binaries);
  if (skip !== undefined) {
    console.warn(`lease_replicas_test.ts: skipping '${title}': ${skip}`);
  }
  return [
    skip === undefined ? title : `${title} [skipped: ${skip}]`,
    { skip: skip ?? false, timeout: TEST_TIMEOUT },
  ];
}

type Connection = Awaited<ReturnType<typeof connect>>;

/** Runs `lease ARGS` under this test's runtime, to its exit. */
function cli(
  args: string[],
): Promise<{ code: number; out: string; err: string }> {
  const file = fileURLToPath(new URL("./cli.ts", import.meta.url));
  const [cmd, pre] = "Deno" in globalThis
    ? [process.execPath, ["run", "-A", file]]
    : [process.execPath, [file]];
  const env: Record<string, string | undefined> = { ...process.env };
  delete env.NODE_TEST_CONTEXT;
  return new Promise((resolve, reject) => {
    execFile(cmd, [...pre, ...args], { env }, (err, out, errOut) => {
      const code = err === null ? 0 : (err as { code?: unknown }).code;
      if (typeof code !== "number") reject(err);
      else resolve({ code, out, err: errOut });
    });
  });
}

async function withBucket(
  nc: Connection,
  bucket: string,
  replicas: number,
): Promise<void> {
  // With a TTL, so that createLeaseManager accepts the bucket as a lease
  // bucket.
  await createBucket(nc, bucket, { replicas, ttl: 2000 });
}

/** Runs the check, asserting it also returns within its budget. */
async function check(
  nc: Connection,
  stream: string,
  timeoutMs = CHECK_MS,
): Promise<string | undefined> {
  // Without the API check, which would block on a paused server.
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  const started = performance.now();
  const reason = await unsafeReplicaReason(nc, jsm, stream, timeoutMs);
  const took = performance.now() - started;
  // Liveness: the check keeps to its budget, whatever the servers answer;
  // 500 ms on top are for timers firing late on a loaded machine. A check
  // that spent a budget per request, or waited for set-up's 20 s, would
  // take far longer.
  assert.ok(
    took < timeoutMs + 500,
    `the check took ${Math.round(took)} ms with a ${timeoutMs} ms budget`,
  );
  return reason;
}

test("casSafeVersion() accepts releases from 2.9.21 on and rejects older ones, pre-releases of the fix and garbage", () => {
  for (
    const v of [
      "2.9.21",
      "v2.9.21",
      "2.9.25",
      "2.10.0",
      "2.10.1-RC.1",
      "2.11.0",
      "2.15.2",
      "3.0.0",
    ]
  ) {
    assert.equal(casSafeVersion(v), true, v);
  }
  for (
    const v of [
      "2.9.20",
      "2.9.10",
      "2.8.4",
      "1.99.99",
      "2.9.21-RC.1",
      "2.10.0-beta.44",
      "",
      "unknown",
      "2.9",
    ]
  ) {
    assert.equal(casSafeVersion(v), false, v);
  }
});

test(
  ...needs(
    "R3 on three 2.15.2 servers is proven safe, R1 is safe, and a stopped replica is reported as not visible",
    CURRENT,
  ),
  async () => {
    await using cluster = await NatsCluster.start(3, { binary: CURRENT });
    const nc = await connect({ servers: cluster.servers[0]!.url });
    try {
      await withBucket(nc, "r3", 3);
      await withBucket(nc, "r1", 1);
      assert.equal(await check(nc, "KV_r3"), undefined);
      assert.equal(await check(nc, "KV_r1"), undefined);

      // A replica that does not answer cannot be proven: it could come back
      // on an older binary and lead. The client's own server stays up.
      const leader = await cluster.streamLeader("KV_r3");
      const victim = [1, 2].find((i) => i !== leader)!;
      await cluster.kill(victim);
      // The full budget: with a peer just killed, stream info can be slow on
      // a loaded machine, and a timeout there is a different (also failing)
      // reason from the one this test is about.
      const reason = await check(nc, "KV_r3");
      assert.match(
        reason ?? "",
        new RegExp(`n${victim} is not visible to this account`),
      );
      assert.match(reason ?? "", /nats-server#4320/);
    } finally {
      await nc.close();
    }
  },
);

test(
  ...needs(
    "R3 on a cluster with 2.9.10 JetStream peers names each of them, though the client is connected to a 2.15.2 node",
    CURRENT,
    OLDEST,
  ),
  async () => {
    // 2.9.10 nodes must be the majority: a 2.15.2 voter with an empty log
    // grants a vote with flags 1|2, which 2.9.10 reads as a refusal, and two
    // 2.15.2 nodes beside one 2.9.10 node elected no meta leader in 30 s.
    await using cluster = await NatsCluster.start(3, {
      binaries: [OLDEST, CURRENT, OLDEST],
    });
    assert.deepEqual(cluster.servers.map((s) => s.version), [
      "2.9.10",
      "2.15.2",
      "2.9.10",
    ]);
    const nc = await connect({ servers: cluster.servers[1]!.url });
    try {
      // The old guard looked only at this, and passed.
      assert.equal(nc.info?.version, "2.15.2");
      await withBucket(nc, "mixed", 3);
      const reason = await check(nc, "KV_mixed");
      assert.match(reason ?? "", /KV_mixed/);
      assert.match(reason ?? "", /n0 (\(leader\) )?runs 2\.9\.10/);
      assert.match(reason ?? "", /n2 (\(leader\) )?runs 2\.9\.10/);
      assert.doesNotMatch(reason ?? "", /n1 /);

      await withBucket(nc, "single", 1);
      assert.equal(await check(nc, "KV_single"), undefined);

      // createLeaseManager refuses the R3 bucket before anything is written,
      // names the old peers and the override; the override is honoured.
      await assert.rejects(
        createLeaseManager({ nc, node: "a", bucket: "mixed", ttl: 2000 }),
        (e: Error) =>
          /n0 (\(leader\) )?runs 2\.9\.10/.test(e.message) &&
          /allowUnverifiedReplicas/.test(e.message),
      );
      const kv = await new Kvm(nc).open("mixed");
      assert.equal(await kv.get("k"), null, "nothing was written");
      const m = await createLeaseManager({
        nc,
        node: "a",
        bucket: "mixed",
        allowUnverifiedReplicas: true,
      });
      await m.close();
      // The command refuses it too, naming its own flag, and takes the
      // override as a flag.
      const refused = await cli([
        "holder",
        "k",
        "--servers",
        cluster.servers[1]!.url,
        "--bucket",
        "mixed",
      ]);
      assert.equal(refused.code, 69, refused.err);
      assert.match(refused.err, /runs 2\.9\.10/);
      assert.match(refused.err, /--allow-unverified-replicas/);
      const allowed = await cli([
        "holder",
        "k",
        "--servers",
        cluster.servers[1]!.url,
        "--bucket",
        "mixed",
        "--allow-unverified-replicas",
      ]);
      assert.equal(allowed.code, 0, allowed.err);
      assert.equal(allowed.out.trim(), "k: none");
      // R1 on the same cluster is accepted without any override.
      const m1 = await createLeaseManager({ nc, node: "a", bucket: "single" });
      await m1.close();
    } finally {
      await nc.close();
    }
  },
);

test(...needs("R1 on a single 2.9.10 server is safe", OLDEST), async () => {
  await using ns = await NatsServer.start({ binary: OLDEST });
  const nc = await connect({ servers: ns.url });
  try {
    await withBucket(nc, "r1", 1);
    assert.equal(await check(nc, "KV_r1"), undefined);
  } finally {
    await nc.close();
  }
});

test(
  "a missing stream, and a server that answers nothing, give a reason within the budget",
  {
    timeout: TEST_TIMEOUT,
  },
  async () => {
    await using ns = await NatsServer.start({ binary: natsServerBinary() });
    const nc = await connect({ servers: ns.url });
    try {
      await withBucket(nc, "r1", 1);
      assert.equal(await check(nc, "KV_r1"), undefined);
      assert.match(
        (await check(nc, "KV_absent")) ?? "",
        /KV_absent.*cannot read its stream info: stream not found/,
      );
      await ns.pause();
      try {
        assert.match(
          (await check(nc, "KV_r1", 500)) ?? "",
          /cannot read its stream info: stream info got no answer within \d+ ms/,
        );
      } finally {
        await ns.resume();
      }
    } finally {
      await nc.close();
    }
  },
);

// A rolling restart takes one server of three down at a time. Set-up must
// not wait for the one that is down: the leader and a quorum, proven, are
// enough to start, and the late peer is checked when it appears.

/** Kills a server that does not lead KV_<bucket>; returns its index. */
async function killFollower(
  cluster: NatsCluster,
  bucket: string,
): Promise<number> {
  const leader = await cluster.streamLeader(`KV_${bucket}`);
  const victim = [0, 1, 2].find((i) => i !== leader && i !== 0)!;
  await cluster.kill(victim);
  // The killed one may have led the meta group; without a meta leader no
  // JetStream request is answered, whatever this library does.
  await cluster.waitForMetaLeader();
  return victim;
}

/** How long a first guarded write on a never-used key takes. */
async function firstWrite(
  m: Awaited<ReturnType<typeof createLeaseManager>>,
  key: string,
): Promise<number> {
  const started = performance.now();
  await m.guard(key, () => {}, {
    wait: true,
    signal: AbortSignal.timeout(30_000),
  });
  return performance.now() - started;
}

test(
  ...needs(
    "createLeaseManager on an R3 bucket with one of three servers down starts within 2 s, and a never-used key is taken at once",
    CURRENT,
  ),
  async () => {
    await using cluster = await NatsCluster.start(3, { binary: CURRENT });
    // The client stays on n0, which is never the one killed.
    const nc = await connect({ servers: cluster.servers[0]!.url });
    try {
      const ttl = 2_000;
      // Made by the manager, so it has markers (their life is the TTL).
      const first = await createLeaseManager({
        nc,
        node: "maker",
        bucket: "roll",
        ttl,
        replicas: 3,
      });
      await first.close();
      await killFollower(cluster, "roll");
      // Longer than a marker lives: whatever the killed server did is
      // older than what the marker proof vouches for (currentMarkerLife).
      await new Promise((r) => setTimeout(r, ttl + 500));

      const started = performance.now();
      const m = await createLeaseManager({ nc, node: "a", bucket: "roll" });
      const setup = performance.now() - started;
      try {
        // The goal is 2 s; before, set-up waited its whole 20 s
        // budget for the dead server's STATZ answer and then refused.
        assert.ok(setup < 2_000, `set-up took ${Math.round(setup)} ms`);
        assert.equal(m.health().ok, true);
        // No grace: markers prove the key never had a holder within their
        // life. A grace would be at least the TTL.
        const took = await firstWrite(m, "fresh");
        assert.ok(
          took < ttl / 2,
          `the first write took ${Math.round(took)} ms`,
        );
        console.log(
          `one of three down: set-up ${Math.round(setup)} ms, first write ${
            Math.round(took)
          } ms`,
        );
      } finally {
        await m.close();
      }
    } finally {
      await nc.close();
    }
  },
);

test(
  ...needs(
    "a peer that was down at start-up is proven when it comes back, and one that comes back older than 2.9.21 stops the manager",
    CURRENT,
    OLDEST,
  ),
  async () => {
    await using cluster = await NatsCluster.start(3, { binary: CURRENT });
    const nc = await connect({ servers: cluster.servers[0]!.url });
    try {
      const ttl = 2_000;
      const first = await createLeaseManager({
        nc,
        node: "maker",
        bucket: "late",
        ttl,
        replicas: 3,
      });
      await first.close();
      const victim = await killFollower(cluster, "late");
      const m = await createLeaseManager({ nc, node: "a", bucket: "late" });
      const defunct: string[] = [];
      m.addEventListener("defunct", (e) => defunct.push(e.reason));
      try {
        // Back on a release with the fix: trusted once it answers, and it
        // joins the marker proof, so a never-used key owes no grace (while
        // unproven and just heard from, it would owe one).
        await cluster.servers[victim]!.restart();
        await new Promise((r) => setTimeout(r, 2_500));
        assert.deepEqual(defunct, []);
        const took = await firstWrite(m, "after-return");
        assert.ok(
          took < ttl / 2,
          `the first write took ${Math.round(took)} ms`,
        );
      } finally {
        await m.close();
      }

      // Down again, and a new manager starts without it; then it comes
      // back on 2.9.10, which lets two compare-and-sets of one revision both
      // succeed when it leads (nats-server#4320): the manager stops.
      await cluster.kill(victim);
      await cluster.waitForMetaLeader();
      const m2 = await createLeaseManager({ nc, node: "b", bucket: "late" });
      const stopped = new Promise<string>((resolve) =>
        m2.addEventListener("defunct", (e) => resolve(e.reason), { once: true })
      );
      try {
        await m2.guard("k", () => {}, {
          wait: true,
          signal: AbortSignal.timeout(30_000),
        });
        const back = performance.now();
        await cluster.servers[victim]!.restart({ binary: OLDEST });
        // One census round a second: 5 s is the round, the old server's
        // start and a loaded machine; without the late check it never stops.
        const why = await Promise.race([
          stopped,
          new Promise<string>((_, reject) =>
            setTimeout(
              () => reject(new Error("the manager did not stop within 5 s")),
              5_000,
            )
          ),
        ]);
        const after = performance.now() - back;
        assert.match(
          why,
          new RegExp(
            `server n${victim}.*runs nats-server 2\\.9\\.10.*nats-server#4320`,
          ),
        );
        assert.equal(m2.health().ok, false);
        assert.equal(m2.health().defunct, why);
        await assert.rejects(m2.guard("k", () => {}), /2\.9\.10/);
        console.log(
          `an old peer back: manager stopped ${
            Math.round(after)
          } ms after its restart began`,
        );
      } finally {
        await m2.close();
      }
    } finally {
      await nc.close();
    }
  },
);

test(
  ...needs(
    "createLeaseManager right after the stream's leader was killed waits for the election and starts",
    CURRENT,
  ),
  async () => {
    await using cluster = await NatsCluster.start(3, { binary: CURRENT });
    const first = await connect({ servers: cluster.servers[0]!.url });
    try {
      const m0 = await createLeaseManager({
        nc: first,
        node: "maker",
        bucket: "elect",
        ttl: 2_000,
        replicas: 3,
      });
      await m0.close();
    } finally {
      await first.close();
    }
    const leader = (await cluster.streamLeader("KV_elect"))!;
    const other = [0, 1, 2].find((i) => i !== leader)!;
    const nc = await connect({ servers: cluster.servers[other]!.url });
    try {
      await cluster.kill(leader);
      // At once: stream info may name no leader yet (or the old one); the
      // census then waits for one to be named rather than refuse, and the
      // dead server is left to be checked when it comes back.
      const started = performance.now();
      const m = await createLeaseManager({ nc, node: "a", bucket: "elect" });
      const took = performance.now() - started;
      try {
        await m.guard("k", () => {}, {
          wait: true,
          signal: AbortSignal.timeout(30_000),
        });
        assert.equal(m.health().defunct, undefined);
        console.log(
          `stream leader killed: set-up took ${Math.round(took)} ms`,
        );
      } finally {
        await m.close();
      }
    } finally {
      await nc.close();
    }
  },
);
