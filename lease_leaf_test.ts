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
import * as net from "node:net";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import {
  createLeaseManager,
  type LeaseManager,
  UnavailableError,
} from "./mod.ts";
import {
  conn,
  eventually,
  guardUntil,
  sleep,
  uniq,
} from "./test_util/lease_helpers.ts";
import { NatsServer } from "./test_util/nats_server.ts";
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

/** Prints measured figures (ms). */
function report(what: string, figures: Record<string, number>): void {
  const text = Object.entries(figures).map(([k, v]) =>
    `${k}=${Math.round(v)} ms`
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

describe("leases across a leaf node, JetStream domain 'hub'", () => {
  let hub: NatsServer;
  let leaf: NatsServer;
  let proxy: Proxy;
  const conns: NatsConnection[] = [];
  const managers: LeaseManager[] = [];

  before(async () => {
    const leafPort = await freePort();
    hub = await NatsServer.start({
      domain: "hub",
      extraConfig: [
        `server_name: "hub"`,
        `leafnodes { listen: "127.0.0.1:${leafPort}" }`,
      ].join("\n"),
    });
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
