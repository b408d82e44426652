// Leases from the far side of a leaf node (issue 17, part 3). A hub server
// runs JetStream in domain "hub" with a leafnodes listener; a leaf server
// runs JetStream of its own in domain "edge" and connects to the hub
// through a TCP proxy in this process, so that the test can cut the leaf
// connection (and only it) and restore it. Edge clients connect to the leaf
// and pass `domain: "hub"`; hub clients connect to the hub. They contend for
// one key in the hub's bucket.
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary (2.9.10 has leaf nodes and JetStream domains).
import { after, describe } from "node:test";
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { before, test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import {
  createLeaseManager,
  type GuardCheck,
  type LeaseManager,
  UnavailableError,
} from "./mod.ts";
import {
  conn,
  eventually,
  guardUntil,
  sleep,
  uniq,
  versionOf,
} from "./test_util/lease_helpers.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";
import { type LeaseRun, startLease as lease } from "./test_util/cli_run.ts";

/**
 * Long enough that the outage below (about 1 s: the leaf retries its hub
 * every second) ends well inside it; short, as without subject delete
 * markers (2.9.10) a new key's first writer waits out one TTL of grace.
 */
const TTL = 4000;

/**
 * How late a waiter across the leaf may get the key after a clean release.
 * Measured (deno, bun, node; 2.15.2 and 2.9.10): 2-6 ms each way.
 * A waiter that missed the release learns of it one TTL later at worst.
 */
const PROMPT = 1000;

/** Prints measured figures (numbers in ms). */
function report(what: string, figures: Record<string, number | string>): void {
  const text = Object.entries(figures).map(([k, v]) =>
    typeof v === "number" ? `${k}=${Math.round(v)} ms` : `${k}=${v}`
  ).join(", ");
  console.log(`  [figures] ${what}: ${text}`);
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/**
 * A TCP proxy on loopback to `target`, standing for the network between a
 * leaf node and its hub. `cut()` drops every connection and refuses new
 * ones until `restore()`.
 */
class Proxy {
  readonly port: number;
  #server: net.Server;
  #open = true;
  #sockets = new Set<net.Socket>();

  private constructor(server: net.Server, port: number) {
    this.#server = server;
    this.port = port;
  }

  static start(target: number): Promise<Proxy> {
    return new Promise((resolve, reject) => {
      let proxy: Proxy;
      const server = net.createServer((client) => {
        if (!proxy.#open) {
          client.destroy();
          return;
        }
        const upstream = net.connect(target, "127.0.0.1");
        for (const [a, b] of [[client, upstream], [upstream, client]]) {
          proxy.#sockets.add(a!);
          a!.on("data", (d) => b!.write(d));
          a!.on("error", () => b!.destroy());
          a!.on("close", () => {
            proxy.#sockets.delete(a!);
            b!.destroy();
          });
        }
      });
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => {
        proxy = new Proxy(server, (server.address() as net.AddressInfo).port);
        resolve(proxy);
      });
    });
  }

  cut(): void {
    this.#open = false;
    for (const s of this.#sockets) s.destroy();
  }

  restore(): void {
    this.#open = true;
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }
}

/** How many leaf connections a server reports on `/leafz`. */
async function leafCount(ns: NatsServer): Promise<number> {
  const res = await fetch(`${ns.httpUrl}/leafz`, {
    signal: AbortSignal.timeout(2_000),
  });
  return ((await res.json()) as { leafnodes?: number }).leafnodes ?? 0;
}

/**
 * A hub (JetStream domain `hub`) and a leaf (domain `edge`) whose leaf
 * connection runs through a proxy, once the leaf has connected; what was
 * started is stopped again if a later step fails.
 */
async function hubAndLeaf(): Promise<
  { hub: NatsServer; proxy: Proxy; leaf: NatsServer }
> {
  const leafPort = await freePort();
  const hub = await NatsServer.start({
    domain: "hub",
    extraConfig: [
      `server_name: "hub"`,
      `leafnodes { listen: "127.0.0.1:${leafPort}" }`,
    ].join("\n"),
  });
  let proxy: Proxy | undefined;
  let leaf: NatsServer | undefined;
  try {
    proxy = await Proxy.start(leafPort);
    leaf = await NatsServer.start({
      domain: "edge",
      extraConfig: [
        `server_name: "leaf"`,
        `leafnodes { remotes: [ { url: "nats-leaf://127.0.0.1:${proxy.port}" } ] }`,
      ].join("\n"),
    });
    await eventually(
      async () => (await leafCount(hub)) === 1,
      10_000,
      "the leaf node to connect",
      50,
    );
    return { hub, proxy, leaf };
  } catch (err) {
    await proxy?.close();
    await leaf?.[Symbol.asyncDispose]();
    await hub[Symbol.asyncDispose]();
    throw err;
  }
}

describe("leases across a leaf node, JetStream domain 'hub'", () => {
  let hub: NatsServer;
  let leaf: NatsServer;
  let proxy: Proxy;
  const conns: NatsConnection[] = [];
  const managers: LeaseManager[] = [];

  before(async () => {
    ({ hub, proxy, leaf } = await hubAndLeaf());
  });

  after(async () => {
    await Promise.allSettled(managers.map((m) => m.close()));
    await Promise.allSettled(conns.map((nc) => nc.close()));
    await proxy?.close();
    await leaf?.[Symbol.asyncDispose]();
    await hub?.[Symbol.asyncDispose]();
  });

  async function manager(
    ns: NatsServer,
    node: string,
    bucket: string,
    domain?: string,
  ): Promise<LeaseManager> {
    const nc = await conn(ns.url);
    conns.push(nc);
    const m = await createLeaseManager({
      nc,
      node,
      bucket,
      ttl: TTL,
      ...(domain === undefined ? {} : { domain }),
    });
    managers.push(m);
    return m;
  }

  test("guard() on leaf and hub clients never overlaps, epochs grow, and a clean handover across the leaf takes milliseconds", async () => {
    const bucket = uniq("leaf");
    // A bucket of the same name in the leaf's own domain: its stream
    // listens on the same `$KV.<bucket>.>` subjects, and must store nothing.
    const leafNc = await conn(leaf.url);
    conns.push(leafNc);
    await new Kvm(leafNc).create(bucket, { ttl: TTL, history: 1 });
    const leafJsm = await jetstreamManager(leafNc);
    // The hub creates its bucket; the edge clients find it through the
    // domain. One hub client names its own domain, which works as well.
    const hubA = await manager(hub, "hub-a", bucket);
    const hubB = await manager(hub, "hub-b", bucket, "hub");
    const edgeA = await manager(leaf, "edge-a", bucket, "hub");
    const edgeB = await manager(leaf, "edge-b", bucket, "hub");
    const all = [hubA, hubB, edgeA, edgeB];
    const names = ["hub-a", "hub-b", "edge-a", "edge-b"];

    const key = "k";
    let inside = 0;
    const writes: { who: string; epoch: number; start: number }[] = [];
    const rounds = 4;
    await Promise.all(all.map(async (m, i) => {
      for (let r = 0; r < rounds; r++) {
        await m.guard(key, async ({ epoch }) => {
          inside++;
          assert.equal(inside, 1, `${names[i]} writes while another does`);
          writes.push({ who: names[i]!, epoch, start: performance.now() });
          await sleep(10);
          inside--;
        }, { wait: true });
        await m.release(key);
      }
    }));
    assert.equal(writes.length, all.length * rounds);
    for (let i = 1; i < writes.length; i++) {
      assert.ok(
        writes[i]!.epoch > writes[i - 1]!.epoch,
        `epoch ${writes[i]!.epoch} (${writes[i]!.who}) after ${
          writes[i - 1]!.epoch
        } (${writes[i - 1]!.who})`,
      );
    }

    // A clean handover each way: a holder on one side releases while the
    // waiter on the other side waits in guard({ wait: true }).
    const handover = async (
      from: LeaseManager,
      to: LeaseManager,
      toName: string,
    ): Promise<number> => {
      const first = await from.guard(key, ({ epoch }) => epoch);
      const holder = await to.holder(key);
      assert.equal(holder?.epoch, first, "the other side sees the holder");
      let took = 0;
      const waiting = to.guard(key, ({ epoch }) => {
        took = performance.now();
        return epoch;
      }, { wait: true });
      await sleep(200); // the waiter is watching
      const released = performance.now();
      await from.release(key);
      const epoch = await waiting;
      assert.ok(epoch > first, `${toName} took a greater epoch`);
      await to.release(key);
      return took - released;
    };
    const edgeToHub = await handover(edgeA, hubA, "hub-a");
    const hubToEdge = await handover(hubB, edgeB, "edge-b");
    const stray = (await leafJsm.streams.info(`KV_${bucket}`)).state.messages;
    assert.equal(stray, 0, "writes that landed in the leaf's own bucket");
    report("handover across the leaf after release()", {
      edgeToHub,
      hubToEdge,
    });
    assert.ok(edgeToHub < PROMPT, `edge to hub took ${edgeToHub} ms`);
    assert.ok(hubToEdge < PROMPT, `hub to edge took ${hubToEdge} ms`);
  });

  test("guard() on the edge holder rejects with UnavailableError while the leaf connection is down, and succeeds once it is back", async () => {
    const bucket = uniq("leafcut");
    await manager(hub, "hub-c", bucket);
    const edge = await manager(leaf, "edge-c", bucket, "hub");
    const key = "k";
    const first = await edge.guard(key, ({ epoch }) => epoch, { wait: true });

    const cutAt = performance.now();
    proxy.cut();
    await eventually(
      async () => (await leafCount(leaf)) === 0,
      5_000,
      "the leaf to see its hub connection gone",
      20,
    );
    // Several guards while it is down: each refused, the write never run.
    let ran = 0;
    const failures: number[] = [];
    for (let i = 0; i < 3; i++) {
      const t0 = performance.now();
      await assert.rejects(
        edge.guard(key, () => {
          ran++;
        }),
        (e) => e instanceof UnavailableError && e.key === key,
      );
      failures.push(performance.now() - t0);
      await sleep(100);
    }
    assert.equal(ran, 0, "no write ran without the hub");

    proxy.restore();
    const restoredAt = performance.now();
    const epoch = await guardUntil(edge, key, ({ epoch }) => epoch, 2 * TTL);
    const back = performance.now();
    assert.ok(epoch >= first, `epoch ${epoch} after ${first}`);
    report("leaf connection cut", {
      outage: restoredAt - cutAt,
      slowestRefusal: Math.max(...failures),
      firstWriteAfterRestore: back - restoredAt,
    });
    assert.ok(
      back - restoredAt < 2 * TTL,
      `the first write came ${back - restoredAt} ms after the restore`,
    );
    console.log(
      `  edge holder wrote at epoch ${epoch} after the outage (${
        epoch === first ? "the same lease" : "a new lease"
      })`,
    );
  });

  test("the lease command on the leaf with --domain hub: holder, ls, run (a clean handover from a hub holder), watch and release --node all reach the hub's bucket; without --domain it is missing (exit 69); a bad --domain exits 64", async () => {
    const bucket = uniq("leafcli");
    const hubM = await manager(hub, "hub-d", bucket);
    const key = "job";
    const e1 = await hubM.guard(key, ({ epoch }) => epoch, { wait: true });
    const on = ["--servers", leaf.url, "--bucket", bucket, "--domain", "hub"];
    const done = async (r: LeaseRun, what: string): Promise<string> => {
      const code = await r.exited;
      assert.equal(code, 0, `${what}: exit ${code}\n${r.out()}\n${r.err()}`);
      return r.out();
    };

    assert.equal(
      await done(lease(["holder", key, ...on]), "lease holder"),
      `${key}: hub-d epoch ${e1}\n`,
    );
    const ls = await done(lease(["ls", ...on, "--json"]), "lease ls");
    const rows = ls.trim().split("\n").map((l) => JSON.parse(l));
    assert.deepEqual(
      rows.map((r) => [r.key, r.holder, r.epoch, r.state]),
      [[key, "hub-d", e1, "held"]],
      ls,
    );
    // The leaf's own domain has no such bucket.
    const plain = lease([
      "holder",
      key,
      "--servers",
      leaf.url,
      "--bucket",
      bucket,
    ]);
    assert.equal(await plain.exited, 69, plain.err());
    assert.match(plain.err(), /does not exist/);
    // A domain that is not one subject token: refused before connecting.
    const bad = lease(["holder", key, ...on.slice(0, 4), "--domain", "hub.x"]);
    assert.equal(await bad.exited, 64, bad.err());
    assert.match(bad.err(), /--domain needs a JetStream domain/);

    const watch = lease(["watch", key, ...on, "--json"]);
    try {
      await eventually(
        () => Promise.resolve(watch.out().includes('"hub-d"')),
        10_000,
        "lease watch to print the hub holder",
        20,
      );
      // lease run waits its turn on the leaf, and gets the key at once
      // when the hub holder releases it.
      const run = lease([
        "run",
        key,
        ...on,
        "--node",
        "edge-cli",
        "--",
        "sh",
        "-c",
        'echo "epoch=$LEASE_EPOCH"',
      ]);
      await eventually(
        () => Promise.resolve(run.err().includes("hub-d")),
        10_000,
        "lease run to say who holds the key",
        20,
      );
      await hubM.release(key);
      const ran = await done(run, "lease run");
      const e2 = Number(/epoch=(\d+)/.exec(ran)?.[1]);
      assert.ok(e2 > e1, `lease run wrote at epoch ${e2} after ${e1}`);

      // The hub takes it back at once (a clean release), and an operator
      // on the leaf evicts it.
      const e3 = await hubM.guard(key, ({ epoch }) => epoch, { wait: true });
      assert.ok(e3 > e2, `epoch ${e3} after ${e2}`);
      await done(
        lease(["release", key, ...on, "--node", "hub-d"]),
        "lease release",
      );
      assert.equal(await hubM.holder(key), null);
      // The watch on the leaf saw the first holder, and the eviction after
      // the hub took the key back.
      const seen = () =>
        watch.out().trim().split("\n").map((l) => {
          const h = JSON.parse(l).holder;
          return h === null ? "none" : `${h.node}#${h.epoch}`;
        });
      await eventually(
        () => {
          const s = seen();
          const at = s.indexOf(`hub-d#${e3}`);
          return Promise.resolve(at >= 0 && s.slice(at).includes("none"));
        },
        10_000,
        "lease watch to print the eviction",
        20,
      );
      // (lease run's short tenure may be replaced before the watch reads it:
      // the bucket keeps one entry per key.)
      assert.equal(seen()[0], `hub-d#${e1}`, seen().join(", "));
    } finally {
      watch.child.kill("SIGKILL");
      await watch.exited;
    }
  });
});

const VERSION = versionOf(natsServerBinary());

/**
 * The lost-tail scenario's TTL: renewals every second, and the hub's
 * restart (a few hundred ms) plus the leaf's way back to it (the leaf
 * retries its hub every second) end well inside one TTL of the holder's
 * last renewal.
 */
const TAIL_TTL = 3000;

/**
 * How much later than one renewal interval (TTL/3) after the restored hub
 * first answers the leaf the holder may still write. While its deadline
 * runs, a failed renewal is retried every TTL/10; one that left just
 * before the hub answered and went unanswered waits out its timeout
 * (TTL/4) first: TTL/4 + TTL/10 = 1050 ms. Then a slot of the renewal
 * timer (50 ms), a round trip through the leaf, and the scheduling of a
 * shared 2-core machine.
 */
const TAIL_SLACK = 250;

/**
 * How many times the edge renews `k` before the hub is killed. The hub
 * client's revision of `k` when the edge's first compare-and-set after the
 * restart lands: its acquire's, plus one per renewal in the at most ~2 s
 * until then (the leaf retries its hub every second, the edge its renewal
 * within TTL/3), so two more at most; the edge's is its epoch plus this.
 */
const RENEWALS = 4;

/** Resolves with the time at which `$JS.hub.API` first answers on `nc`. */
async function hubAnswers(nc: NatsConnection): Promise<number> {
  for (;;) {
    try {
      await nc.request("$JS.hub.API.INFO", undefined, { timeout: 200 });
      return performance.now();
    } catch {
      await sleep(5);
    }
  }
}

/** Whether `pred` holds within `ms`. */
async function within(pred: () => boolean, ms: number): Promise<boolean> {
  const end = performance.now() + ms;
  while (!pred()) {
    if (performance.now() > end) return false;
    await sleep(10);
  }
  return true;
}

// Issue 31, point 3. A client of a leaf node keeps its connection when the
// hub restarts: only the leaf's connection to the hub drops. So point 10
// of lease.ts (a lost connection suspends every lease) never suspends its
// leases, and a hub that comes back on an older copy of its store (an
// acknowledged tail lost, as in lease_lost_tail_test.ts) is noticed only
// at the holder's next compare-and-set: one that finds the key with no
// entry at all, or at a revision below its own, before its deadline makes
// the manager defunct. The hub's store is copied while it is paused (the
// bucket, no `k`), the edge client takes `k` and writes every 10 ms; the
// hub is killed right after a renewal, the copy put back and the hub
// restarted on the same ports; a fresh hub client takes `k`.
// - "successor first": the leaf's way back to the hub is held (the proxy
//   refuses it) until the hub client's acquire has landed, as happens
//   anyway when the hub client connects before the leaf retries its hub.
//   The edge's renewal then finds `k` at the hub client's revision, below
//   its own; its lease-checked writes until then overlap the hub client's
//   (the residue of point 10, measured here).
// - "holder first": the hub client waits until the edge manager has
//   stopped; the edge's renewal finds `k` with no entry at all.
describe("a hub restart that lost acknowledged writes, seen from a client of the leaf", () => {
  type Order = "successor first" | "holder first";

  async function lostTailOnHub(check: GuardCheck, order: Order) {
    const snapshots = fs.mkdtempSync(path.join(os.tmpdir(), "lease-leaftail-"));
    const conns: NatsConnection[] = [];
    const managers: LeaseManager[] = [];
    let hub: NatsServer | undefined;
    let leaf: NatsServer | undefined;
    let proxy: Proxy | undefined;
    let stop = false;
    let loop: Promise<void> | undefined;
    try {
      ({ hub, proxy, leaf } = await hubAndLeaf());
      const bucket = uniq("leaftail");
      const ncEdge = await conn(leaf.url);
      const ncProbe = await conn(leaf.url);
      conns.push(ncEdge, ncProbe);
      let edgeDrops = 0;
      void (async () => {
        for await (const s of ncEdge.status()) {
          if (s.type === "disconnect") edgeDrops++;
        }
      })();
      const edge = await createLeaseManager({
        nc: ncEdge,
        node: "edge",
        bucket,
        ttl: TAIL_TTL,
        domain: "hub",
      });
      managers.push(edge);
      let defunctAt = NaN;
      let why = "";
      edge.addEventListener("defunct", (e) => {
        defunctAt = performance.now();
        why = e.reason;
      });
      // How each of the edge's tenures ended, and how many it began.
      const lost: string[] = [];
      let acquired = 0;
      edge.addEventListener("lost", (e) => lost.push(e.reason));
      edge.addEventListener("acquired", () => acquired++);
      // The hub's store with the bucket and no `k`, copied while paused.
      const snap = path.join(snapshots, "hub");
      await hub.pause();
      try {
        fs.cpSync(hub.storeDir, snap, { recursive: true });
      } finally {
        await hub.resume();
      }
      const [epochA, tenure, idA] = await guardUntil(
        edge,
        "k",
        (l) => [l.epoch, l.signal, l.tenure] as const,
        3 * TAIL_TTL,
      );
      // Writes of this tenure only (a later one of the same manager would
      // be a new lease).
      const writes: number[] = [];
      loop = (async () => {
        while (!stop && edge.health().defunct === undefined) {
          await edge.guard("k", (l) => {
            if (l.signal === tenure) writes.push(performance.now());
          }, { check }).catch(() => {});
          await sleep(10);
        }
      })();
      // Killed right after a confirmation, so the edge's deadline runs
      // about a TTL past the kill, and once the edge's revision of `k` is
      // well past its epoch: the hub client's entry climbs from the same
      // epoch, one revision per renewal (every TTL/3), and the edge's next
      // compare-and-set must find it below its own. One that finds it at
      // exactly the edge's revision succeeds, both tenures under one
      // epoch (measured: a single renewal before the kill let the hub
      // client's first renewal land there); only Lease.tenure tells them
      // apart (docs/safety.md). Above it, the edge loses `k` as to any
      // other holder, and only its other keys' renewals can say more.
      if (check === "lease") {
        for (let i = 0; i < RENEWALS; i++) {
          await new Promise((resolve) =>
            edge.addEventListener("renewed", resolve, { once: true })
          );
        }
      } else {
        await eventually(() => writes.length >= 2, TAIL_TTL, "two writes");
        const n = writes.length;
        await eventually(() => writes.length > n, TAIL_TTL, "a write", 1);
      }
      if (order === "successor first") proxy.cut();
      await hub.kill();
      const killed = performance.now();
      const answered = hubAnswers(ncProbe);
      fs.rmSync(hub.storeDir, { recursive: true, force: true });
      fs.cpSync(snap, hub.storeDir, { recursive: true });
      await hub.restart();
      const restarted = performance.now();
      const ncHub = await conn(hub.url);
      conns.push(ncHub);
      const other = await createLeaseManager({
        nc: ncHub,
        node: "hub",
        bucket,
        ttl: TAIL_TTL,
      });
      managers.push(other);
      if (order === "successor first") {
        const p = proxy;
        other.addEventListener("acquired", () => p.restore(), { once: true });
      } else if (!await within(() => !isNaN(defunctAt), 2 * TAIL_TTL)) {
        stop = true;
        await loop;
        const holder = await other.holder("k");
        assert.fail(
          `the edge manager is not defunct ${
            Math.round(performance.now() - await answered)
          } ms after the restored hub answered the leaf; it holds k: ${await edge
            .held("k")}, holder on the hub: ${
            JSON.stringify(holder)
          }, ${writes.length} writes of the first tenure, leaf disconnects ${edgeDrops}`,
        );
      }
      let bEnded = NaN;
      let bLost = "";
      other.addEventListener("lost", (e) => {
        bEnded = performance.now();
        bLost = e.reason;
      });
      const [bFirst, epochB, idB] = await other.guard(
        "k",
        (l) => [performance.now(), l.epoch, l.tenure] as const,
        { wait: true, signal: AbortSignal.timeout(6 * TAIL_TTL) },
      );
      const reachable = await answered;
      const stopped = await within(() => !isNaN(defunctAt), 2 * TAIL_TTL);
      stop = true;
      await loop;
      const late = writes.filter((t) => t >= bFirst);
      const last = Math.max(...writes);
      report(`lost tail on the hub, leaf client, check ${check}, ${order}`, {
        server: VERSION,
        leafClientDisconnects: String(edgeDrops),
        hubRestartedAfterKill: restarted - killed,
        hubAnswersLeafAfterKill: reachable - killed,
        hubClientFirstWriteAfterKill: bFirst - killed,
        edgeLastWriteAfterHubAnswers: last - reachable,
        edgeDefunctAfterHubAnswers: defunctAt - reachable,
        edgeWritesAfterHubClientFirst: String(late.length),
        overlap: late.length === 0 ? 0 : Math.max(...late) - bFirst,
        epochs: `${epochA} (edge) then ${epochB} (hub client)`,
        edgeTenures: `${acquired}, ended ${lost.join(", ")}`,
        hubClientTenure: isNaN(bEnded)
          ? "kept"
          : `${bLost} ${Math.round(bEnded - bFirst)} ms after its first write`,
        why: why.slice(0, 120),
      });
      assert.equal(edgeDrops, 0, "the leaf client saw its connection drop");
      assert.ok(stopped, "the edge manager did not go defunct");
      // Stopped at the compare-and-set that saw the lost tail: not first
      // reported as an ordinary loss, after which the manager, still
      // healthy, would take the emptied key again under a repeated epoch.
      assert.deepEqual([acquired, lost], [1, ["defunct"]]);
      assert.match(why, /lost writes it had acknowledged/);
      assert.equal(edge.health().defunct, why);
      if (order === "holder first") assert.match(why, /no entry at all/);
      const bound = TAIL_TTL / 3 + TAIL_SLACK;
      assert.ok(
        last - reachable <= bound,
        `the edge wrote ${
          Math.round(last - reachable)
        } ms after the restored hub answered the leaf (bound ${bound} ms)`,
      );
      assert.ok(
        defunctAt - reachable <= bound,
        `the edge manager stopped ${
          Math.round(defunctAt - reachable)
        } ms after the restored hub answered the leaf (bound ${bound} ms)`,
      );
      assert.notEqual(idB, idA, "two tenures share an id");
      if (check === "cas" || order === "holder first") {
        assert.deepEqual(
          late.map((t) => Math.round(t - bFirst)),
          [],
          "the edge wrote after the hub client's first write began (ms after it)",
        );
      }
    } finally {
      stop = true;
      await loop;
      await Promise.allSettled(managers.map((m) => m.close()));
      await Promise.allSettled(conns.map((nc) => nc.close()));
      await proxy?.close();
      await leaf?.[Symbol.asyncDispose]();
      await hub?.[Symbol.asyncDispose]();
      fs.rmSync(snapshots, { recursive: true, force: true });
    }
  }

  test(
    'guard() with check "lease" on a leaf client stops within TTL/3 of the restored hub answering, its manager defunct, when a hub client took the key the lost tail emptied first',
    { timeout: 60_000 },
    () => lostTailOnHub("lease", "successor first"),
  );

  test(
    'guard() with check "lease" on a leaf client stops within TTL/3 of the restored hub answering, its manager defunct, when its renewal finds the key with no entry at all',
    { timeout: 60_000 },
    () => lostTailOnHub("lease", "holder first"),
  );

  test(
    'guard() with check "cas" on a leaf client never writes after a hub client\'s first write on the key a lost tail emptied, and its manager goes defunct',
    { timeout: 60_000 },
    () => lostTailOnHub("cas", "successor first"),
  );
});
