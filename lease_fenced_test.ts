// A manager on a fenced bucket (issue 33: `createLeaseManager({ fenced:
// true })`, and the internal `fencedManagerOnPort` where a test needs what
// createLeaseManager refuses), on a
// real nats-server, against a holder in a process of its own
// (test_util/fenced_child.ts) that puts to a data key every 50 ms under one
// lease: SIGKILLed, its key is taken as soon as the server answers its
// session's probe "no responders", far inside the TTL; SIGSTOPped, its key
// is taken once its session's entry expires, and when it wakes its next put
// is refused by the server itself: nothing it writes after the takeover is
// stored. A server before 2.11.2 is refused before anything is written.
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary.
// test.sh: fenced servers too
import { test } from "./test_util/server_logs.ts";
import * as fs from "node:fs";
import process from "node:process";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { markersVersion } from "./lease/servers.ts";
import {
  createLeaseManager,
  type LeaseAcquiredEvent,
  type LeaseManager,
} from "./mod.ts";
import { signal, startChild } from "./test_util/child.ts";
import { uniq, versionOf } from "./test_util/lease_helpers.ts";
import { fencedManager } from "./test_util/port.ts";
import { NatsProxy } from "./test_util/proxy.ts";
import {
  NatsServer,
  natsServerBinary,
  pauseProcess,
  resumeProcess,
} from "./test_util/nats_server.ts";

const CHILD = new URL("./test_util/fenced_child.ts", import.meta.url)
  .pathname;
const TTL = 5000;
const ROLLBACK_BIN = process.env.NATS_ROLLBACK_BIN ??
  fileURLToPath(new URL("./.tools/bin/nats-server-2.10.22", import.meta.url));
const ROLLBACK_VERSION = fs.existsSync(ROLLBACK_BIN)
  ? versionOf(ROLLBACK_BIN)
  : undefined;
const FENCED = markersVersion(versionOf(natsServerBinary()))
  ? false
  : "fenced buckets need nats-server 2.11.2 or later";

/**
 * A fenced bucket whose lease TTL is `ttl`, and managers on it for `node`
 * over `nc`: through createLeaseManager (which creates the bucket on the
 * first open), or, for a request timeout past the TTL (which
 * createLeaseManager refuses), through the internal `fencedManager` on
 * the bucket a first open made. `kvm: true` makes a bare KV bucket with
 * markers instead (no fenced mark), for the internal path alone.
 */
async function fencedBucket(nc: NatsConnection, ttl = TTL, kvm = false) {
  const bucket = uniq("fb");
  if (kvm) await new Kvm(nc).create(bucket, { history: 1, markerTTL: 1000 });
  const open = async (
    node: string,
    on: NatsConnection = nc,
    timeout?: number,
  ) => {
    const m: LeaseManager = timeout === undefined && !kvm
      ? await createLeaseManager({ nc: on, node, bucket, fenced: true, ttl })
      : await fencedManager(on, bucket, node, ttl, timeout);
    const found: string[] = [];
    m.addEventListener("acquired", (e) => {
      const a = e as LeaseAcquiredEvent;
      found.push(`${a.found} ${a.grace}`);
    });
    return { m, found };
  };
  const value = async (key: string) =>
    (await (await new Kvm(nc).open(bucket)).get(key))?.string();
  return { bucket, open, value };
}

test(
  "a fenced bucket's manager on a server before 2.11.2 is refused before anything is written",
  {
    skip: FENCED ? false : "this server honours fenced buckets",
  },
  async () => {
    await using ns = await NatsServer.start();
    const nc = await connect({ servers: ns.url });
    try {
      const { open, bucket } = await fencedBucket(nc, TTL, true);
      await assert.rejects(open("a"), (err: Error) => {
        assert.ok(err instanceof RangeError, String(err));
        assert.match(err.message, /needs 2\.11\.2 or later/);
        return true;
      });
      const jsm = await jetstreamManager(nc);
      assert.equal((await jsm.streams.info(`KV_${bucket}`)).state.messages, 0);
    } finally {
      await nc.close();
    }
  },
);

test(
  "a SIGKILLed holder's fenced key is taken as soon as the server says its connection is gone, far inside the TTL, with no grace",
  {
    skip: FENCED,
  },
  async () => {
    await using ns = await NatsServer.start();
    const nc = await connect({ servers: ns.url });
    const { bucket, open, value } = await fencedBucket(nc);
    const child = startChild<{ ev: string; epoch?: number }>(CHILD, {
      NATS_URL: ns.url,
      LEASE_BUCKET: bucket,
      LEASE_NODE: "child",
      LEASE_TTL: String(TTL),
      LEASE_KEY: "k",
      DATA_KEY: "x",
    });
    const { m, found } = await open("parent");
    try {
      const { epoch } = await child.until((e) => e.ev === "holding");
      let t0 = 0;
      const taken = m.guard("k", async (lease) => {
        const took = performance.now() - t0;
        await lease.put("x", "parent");
        return { took, epoch: lease.epoch };
      }, { wait: true });
      await new Promise((r) => setTimeout(r, 200));
      t0 = performance.now();
      signal(child.pid, "SIGKILL");
      const got = await taken;
      console.log(
        `taken ${got.took.toFixed(1)} ms after the SIGKILL (TTL ${TTL} ms)`,
      );
      assert.deepEqual(found, ["crashed 0"]);
      assert.ok(got.epoch > epoch!);
      assert.ok(got.took < TTL / 2, `taken ${got.took} ms after the SIGKILL`);
      assert.equal(await value("x"), "parent");
    } finally {
      await child.stop();
      await m.close();
      await nc.close();
    }
  },
);

test(
  "a SIGSTOPped holder's fenced key is taken once its session expires, and its next put when it wakes is refused: nothing it writes after the takeover is stored",
  {
    skip: FENCED,
  },
  async () => {
    await using ns = await NatsServer.start();
    const nc = await connect({ servers: ns.url });
    const ttl = 2000;
    const { bucket, open, value } = await fencedBucket(nc, ttl);
    const child = startChild<
      { ev: string; n?: number; name?: string; at?: number }
    >(CHILD, {
      NATS_URL: ns.url,
      LEASE_BUCKET: bucket,
      LEASE_NODE: "child",
      LEASE_TTL: String(ttl),
      LEASE_KEY: "k",
      DATA_KEY: "x",
    }, { untilMs: 30_000 });
    const { m, found } = await open("parent");
    try {
      await child.until((e) => e.ev === "holding");
      await pauseProcess(child.pid);
      const stopped = performance.now();
      const { took, landed } = await m.guard("k", async (lease) => {
        await lease.put("x", "parent");
        return { took: performance.now() - stopped, landed: Date.now() };
      }, { wait: true });
      const renewed = child.events.filter((e) => e.ev === "renewed").at(-1);
      console.log(
        `taken ${
          took.toFixed(0)
        } ms after the SIGSTOP (TTL ${ttl}); the successor's put landed ${
          (landed - renewed!.at!).toFixed(0)
        } ms after the holder's last renewal seen before it`,
      );
      assert.deepEqual(found, ["session-ended 0"]);
      // Not before its session could have expired: a TTL after the last
      // renewal the holder reported (a later one only makes that sooner;
      // the two processes' clocks are this machine's, 20 ms of slack).
      assert.ok(
        landed - renewed!.at! > ttl - 20,
        `landed ${landed - renewed!.at!} ms after`,
      );
      // Its session expired: at most a TTL after its last renewal (which was
      // before the stop), plus the server's lateness and our checks.
      assert.ok(took < ttl + 1500, `taken ${took} ms after the SIGSTOP`);
      assert.equal(await value("x"), "parent");
      await resumeProcess(child.pid);
      // Refused before it is sent (its lease is no longer vouched for), or
      // by the server: either way not stored.
      const refused = await child.until((e) => e.ev === "refused");
      assert.ok(
        refused.name === "UnavailableError" ||
          refused.name === "NotHolderError",
        JSON.stringify(refused),
      );
      assert.equal(await value("x"), "parent", "its late put was not stored");
    } finally {
      await child.stop();
      await m.close();
      await nc.close();
    }
  },
);

test(
  `a fenced manager's server rolled back to ${
    ROLLBACK_VERSION ?? "2.10.22"
  } (same store and port), then forward again: not one fenced write is stored on the old server, every guard there is refused, and writes resume once the new server is back`,
  {
    skip: FENCED ||
      (ROLLBACK_VERSION === undefined
        ? `no ${ROLLBACK_BIN} (scripts/setup.sh builds it; NATS_ROLLBACK_BIN names another)`
        : markersVersion(ROLLBACK_VERSION)
        ? `${ROLLBACK_BIN} is ${ROLLBACK_VERSION}, which has fenced buckets`
        : false),
  },
  async () => {
    await using ns = await NatsServer.start();
    const current = ns.binary;
    const nc = await connect({
      servers: ns.url,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 100,
    });
    const ttl = 2000;
    const { open, value } = await fencedBucket(nc, ttl);
    const { m } = await open("a");
    // A writer that tries a fenced put every 50 ms, and what came of each.
    let server = ns.version;
    const stored: { n: number; server: string }[] = [];
    const refused = new Map<string, number>();
    let stop = false;
    const writer = (async () => {
      for (let n = 1; !stop; n++) {
        const on = server;
        try {
          await m.guard("k", (l) => l.put("x", String(n)));
          stored.push({ n, server: on });
        } catch (err) {
          const k = `${(err as Error).name} on ${on}`;
          refused.set(k, (refused.get(k) ?? 0) + 1);
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    try {
      while (stored.length < 5) await new Promise((r) => setTimeout(r, 50));
      server = "stopping";
      await ns.stop();
      const before = stored.at(-1)!.n;
      await ns.restart({ binary: ROLLBACK_BIN });
      server = ns.version;
      // Longer than the TTL: the session cannot be renewed there either.
      await new Promise((r) => setTimeout(r, 2 * ttl));
      assert.deepEqual(
        stored.filter((s) => s.server === ROLLBACK_VERSION),
        [],
        "a fenced write stored on the old server",
      );
      assert.equal(await value("x"), String(before), "what the old server has");
      assert.ok(
        (refused.get(`RangeError on ${ROLLBACK_VERSION}`) ?? 0) +
            (refused.get(`UnavailableError on ${ROLLBACK_VERSION}`) ?? 0) > 10,
        JSON.stringify([...refused]),
      );
      server = "stopping";
      await ns.stop();
      await ns.restart({ binary: current });
      server = ns.version;
      const back = performance.now();
      while (!stored.some((s) => s.server === ns.version && s.n > before)) {
        assert.ok(
          performance.now() - back < 10 * ttl,
          `no write on ${ns.version} again: ${JSON.stringify([...refused])}`,
        );
        await new Promise((r) => setTimeout(r, 50));
      }
      console.log(
        `writing again ${
          (performance.now() - back).toFixed(0)
        } ms after ${ns.version} was back; refused meanwhile: ${
          JSON.stringify([...refused])
        }`,
      );
    } finally {
      stop = true;
      await writer;
      await m.close();
      await nc.close();
    }
  },
);

test(
  "a holder cut off after its lease's check passed: its put, held on the way (a proxy holds its outgoing bytes), reaches the server after the successor took the key over its expired session, and the server refuses it",
  {
    skip: FENCED,
  },
  async () => {
    await using ns = await NatsServer.start();
    await using proxy = await NatsProxy.start(ns.port);
    const ncA = await connect({ servers: proxy.url });
    const nc = await connect({ servers: ns.url });
    const ttl = 2000;
    const { open, value } = await fencedBucket(nc, ttl);
    // B opens first: it creates the bucket. A waits long for its replies
    // (past the TTL, so through the internal path): the refusal of its
    // held put comes back once the proxy lets it through.
    const b = await open("b");
    const a = await open("a", ncA, 5 * ttl);
    let late: Promise<unknown> | undefined;
    try {
      await a.m.guard("k", async (lease) => {
        await lease.put("x", "a1");
        // The commit point's check passes, then everything A sends waits in
        // the network: the put, and the session's renewals.
        lease.throwIfLost();
        proxy.hold("up");
        late = lease.put("x", "a-late").catch((e) => e);
      });
      const took = await b.m.guard("k", async (lease) => {
        await lease.put("x", "b1");
        return lease.epoch;
      }, { wait: true, signal: AbortSignal.timeout(5 * ttl) });
      assert.deepEqual(b.found, ["session-ended 0"]);
      proxy.release("up");
      const err = await late as Error;
      assert.equal(err.name, "NotHolderError", String(err));
      assert.match(err.message, /the server refused/);
      assert.match(err.message, new RegExp(`now at revision ${took}\\b`));
      assert.equal(await value("x"), "b1", "the server refused A's late put");
    } finally {
      await a.m.close();
      await b.m.close();
      await ncA.close();
      await nc.close();
    }
  },
);
