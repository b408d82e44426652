// test.sh: first server only: a test of the launcher; every test that
// starts 2.9.10 (single servers and clusters) goes through it too.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";
import {
  canConnect,
  NatsCluster,
  NatsServer,
  natsServerBinary,
} from "./nats_server.ts";

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Retries `fn` until it resolves, rethrowing its last error at the deadline. */
async function eventually<T>(
  fn: () => Promise<T>,
  timeout = 20_000,
): Promise<T> {
  const deadline = performance.now() + timeout;
  for (;;) {
    try {
      return await fn();
    } catch (error) {
      if (performance.now() > deadline) throw error;
    }
    await delay(100);
  }
}

function timeout<T>(p: Promise<T>, ms: number): Promise<T | "timeout"> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    p,
    new Promise<"timeout">((resolve) => {
      timer = setTimeout(() => resolve("timeout"), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

// Short JetStream timeouts keep retries during outages quick.
async function openKv(
  nc: Connection,
  bucket: string,
  replicas = 1,
): Promise<KV> {
  return await new Kvm(jetstream(nc, { timeout: 2_000 })).create(bucket, {
    replicas,
  });
}

type Connection = Awaited<ReturnType<typeof connect>>;

/** Resolves at the connection's next "reconnect" status event. */
async function nextReconnect(nc: Connection): Promise<void> {
  for await (const s of nc.status()) if (s.type === "reconnect") return;
}

const reconnecting = { maxReconnectAttempts: -1, reconnectTimeWait: 100 };

test("natsServerBinary() returns NATS_SERVER_BIN and throws with setup advice when it is missing", () => {
  const saved = process.env.NATS_SERVER_BIN;
  try {
    const bin = natsServerBinary();
    assert.ok(bin.endsWith("nats-server"), bin);
    process.env.NATS_SERVER_BIN = "/nonexistent/nats-server";
    assert.throws(() => natsServerBinary(), /scripts\/setup\.sh/);
  } finally {
    if (saved === undefined) delete process.env.NATS_SERVER_BIN;
    else process.env.NATS_SERVER_BIN = saved;
  }
});

test("NatsServer.start() rejects with a clear error when the binary cannot run", async () => {
  await assert.rejects(
    NatsServer.start({ binary: "/nonexistent/nats-server" }),
    /Cannot run '\/nonexistent\/nats-server --version'.*setup\.sh/,
  );
});

test("NatsServer.start() rejects with the server output when the config is bad", async () => {
  await assert.rejects(
    NatsServer.start({ extraConfig: "this is { not a valid config" }),
    (error: Error) => {
      assert.match(error.message, /exited during startup/);
      assert.match(error.message, /--- server output ---\n.+/);
      return true;
    },
  );
});

test("NatsServer.restart() comes back on the same port with KV data after stop()", async () => {
  await using ns = await NatsServer.start();
  assert.match(ns.version, /^\d+\.\d+\.\d+/);
  assert.equal(ns.url, `nats://127.0.0.1:${ns.port}`);
  assert.equal(ns.wsUrl, undefined);
  const varz = await (await fetch(`${ns.httpUrl}/varz`)).json();
  assert.equal(varz.port, ns.port);
  assert.equal(varz.version, ns.version);

  const nc = await connect({ servers: ns.url, ...reconnecting });
  try {
    const kv = await openKv(nc, "restart");
    await kv.put("k", "v1");
    const pid = ns.pid;
    const reconnected = nextReconnect(nc);
    await ns.stop();
    assert.equal(ns.running, false);
    assert.equal(await canConnect(ns.port), false);

    assert.equal(await ns.restart(), ns);
    assert.notEqual(ns.pid, pid);
    assert.equal(ns.running, true);
    assert.notEqual(await timeout(reconnected, 10_000), "timeout");
    const entry = await eventually(() => kv.get("k"));
    assert.equal(entry?.string(), "v1");
  } finally {
    await nc.close();
  }
});

test("NatsServer.kill() then restart() lets a reconnecting client find the same port", async () => {
  await using ns = await NatsServer.start();
  const nc = await connect({ servers: ns.url, ...reconnecting });
  try {
    const kv = await openKv(nc, "crash");
    await kv.put("k", "v1");
    const port = ns.port;
    const reconnected = nextReconnect(nc);
    await ns.kill();
    assert.equal(ns.running, false);
    assert.equal(await canConnect(port), false);

    await ns.restart();
    assert.equal(ns.port, port);
    assert.notEqual(await timeout(reconnected, 10_000), "timeout");
    // The bucket's stream survives SIGKILL; a value written milliseconds
    // before the kill need not, as the file store flushes asynchronously.
    const revision = await eventually(() => kv.put("k", "v2"));
    assert.ok(revision >= 1);
    assert.equal((await kv.get("k"))?.string(), "v2");
  } finally {
    await nc.close();
  }
});

test("NatsServer.restart({ binary }) brings the same store back on another executable, and refuses one that cannot run before stopping the server", async () => {
  // A copy under another file name (as .tools/bin/nats-server-2.10.22 is
  // kept): the server names its ports file after it.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "nats-bin-"));
  const other = path.join(dir, "nats-server-other");
  fs.copyFileSync(natsServerBinary(), other);
  fs.chmodSync(other, 0o755);
  try {
    await using ns = await NatsServer.start();
    const nc = await connect({ servers: ns.url, ...reconnecting });
    try {
      const kv = await openKv(nc, "rebinary");
      await kv.put("k", "v1");
      const pid = ns.pid;
      await assert.rejects(
        ns.restart({ binary: path.join(dir, "missing") }),
        /Cannot run/,
      );
      assert.equal(ns.pid, pid, "the running server was left alone");
      assert.equal(ns.running, true);
      const reconnected = nextReconnect(nc);
      await ns.stop();
      assert.equal(await ns.restart({ binary: other }), ns);
      assert.equal(ns.binary, other);
      assert.match(ns.version, /^\d+\.\d+\.\d+/);
      assert.notEqual(await timeout(reconnected, 10_000), "timeout");
      const entry = await eventually(() => kv.get("k"));
      assert.equal(entry?.string(), "v1");
    } finally {
      await nc.close();
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("NatsServer.restart() waits out a socket that took the dead server's port meanwhile", async () => {
  await using ns = await NatsServer.start();
  await ns.kill();
  // What an outgoing connection's ephemeral source port can do by chance.
  const squatter = net.createServer();
  await new Promise<void>((resolve, reject) => {
    squatter.once("error", reject);
    squatter.listen(ns.port, "127.0.0.1", () => resolve());
  });
  const freed = delay(700).then(() =>
    new Promise<void>((resolve) => squatter.close(() => resolve()))
  );
  await ns.restart();
  await freed;
  assert.equal(ns.running, true);
  assert.equal(await canConnect(ns.port), true);
});

test("NatsServer.pause() freezes the server until resume()", async () => {
  await using ns = await NatsServer.start({ jetstream: false });
  const nc = await connect({ servers: ns.url, ...reconnecting });
  try {
    await ns.pause();
    assert.equal(ns.paused, true);
    assert.equal(await timeout(nc.rtt(), 300), "timeout");
    await ns.resume();
    assert.equal(ns.paused, false);
    assert.equal(typeof await timeout(nc.rtt(), 5_000), "number");
  } finally {
    await nc.close();
  }
});

test("NatsServer.start({ websocket: true }) listens for WebSocket clients and disposes twice", async () => {
  const ns = await NatsServer.start({ websocket: true, jetstream: false });
  try {
    assert.ok(ns.wsUrl !== undefined);
    const wsPort = Number(new URL(ns.wsUrl).port);
    assert.notEqual(wsPort, ns.port);
    assert.equal(await canConnect(wsPort), true);
    const varz = await (await fetch(`${ns.httpUrl}/varz`)).json();
    assert.equal(varz.websocket?.port, wsPort);
  } finally {
    await ns[Symbol.asyncDispose]();
    await ns[Symbol.asyncDispose]();
  }
  assert.equal(ns.running, false);
});

test("NatsCluster.start(3) elects leaders and an R3 bucket survives killing its stream leader", async () => {
  await using cluster = await NatsCluster.start(3);
  assert.equal(cluster.servers.length, 3);
  assert.equal(new Set(cluster.urls).size, 3);
  const meta = await cluster.metaLeader();
  assert.ok(meta !== undefined && meta >= 0 && meta < 3);

  const nc = await connect({ servers: cluster.urls, ...reconnecting });
  try {
    const kv = await eventually(() => openKv(nc, "failover", 3));
    await eventually(() => kv.put("k", "v1"));
    const stream = "KV_failover";
    const first = await eventually(async () => {
      const i = await cluster.streamLeader(stream);
      assert.ok(i !== undefined, "no stream leader yet");
      return i;
    });

    await cluster.kill(first);
    await eventually(async () => {
      const i = await cluster.streamLeader(stream);
      assert.ok(i !== undefined && i !== first, `leader is still ${i}`);
      return i;
    });
    assert.equal((await eventually(() => kv.get("k")))?.string(), "v1");
    const revision = await eventually(() => kv.put("k", "v2"));

    await cluster.restart(first);
    assert.equal(cluster.servers[first]?.running, true);
    await cluster.waitForMetaLeader();
    // The restarted node is back when it has caught up on the stream.
    await eventually(async () => {
      const url = `${cluster.servers[first]?.httpUrl}/jsz?streams=true`;
      const jsz = await (await fetch(url)).json();
      const detail = jsz.account_details?.[0]?.stream_detail?.find((
        s: { name: string },
      ) => s.name === stream);
      assert.ok(detail?.state?.last_seq >= revision, JSON.stringify(detail));
    });
    assert.equal((await kv.get("k"))?.string(), "v2");
  } finally {
    await nc.close();
  }
});

test("NatsCluster.start() rejects 'binaries' naming more servers than 'n' before starting any", async () => {
  await assert.rejects(
    NatsCluster.start(2, { binaries: ["a", "b", "c"] }),
    (error: unknown) =>
      error instanceof RangeError &&
      /3 binaries for 2 servers/.test(error.message),
  );
});
