/**
 * A 3-node nats-server cluster whose routes all run through
 * {@linkcode NatsProxy}s, so a test can partition two servers' Raft traffic
 * while every server stays up and keeps serving its clients: a real
 * network fault that leaves one replica behind.
 *
 * Each server `n{i}` listens for routes on a private port behind proxy `i`,
 * advertises the proxy's port, and dials its peers through their proxies, so
 * every route connection passes exactly one proxy. Route compression is
 * off so the proxies can read the frames. Needs nats-server 2.10 or later
 * (the `compression` option).
 *
 * @module
 */

import * as net from "node:net";
import { type Direction, type Frame, NatsProxy } from "./proxy.ts";
import { NatsServer } from "./nats_server.ts";

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen({ host: "127.0.0.1", port: 0 }, () => {
      const port = (server.address() as net.AddressInfo).port;
      server.close(() => resolve(port));
    });
  });
}

/** A cluster with proxied routes. */
export class ProxiedCluster {
  readonly servers: NatsServer[];
  readonly proxies: NatsProxy[];
  /** Pairs of server names whose Raft traffic (`$NRG.>`) is dropped. */
  readonly #cut = new Set<string>();
  /** Raft frames dropped so far. */
  dropped = 0;

  private constructor(servers: NatsServer[], proxies: NatsProxy[]) {
    this.servers = servers;
    this.proxies = proxies;
    const ids = new Map<string, string>();
    proxies.forEach((p, i) => {
      const target = `n${i}`;
      p.onFrame = (f: Frame, _dir: Direction, conn) => {
        if (f.op === "INFO") {
          // Every INFO names one server by id and name, gossip included.
          try {
            const info = JSON.parse(f.line.slice(5));
            if (info.server_id && info.server_name) {
              ids.set(info.server_id, info.server_name);
            }
          } catch {
            // not JSON
          }
        }
        if (this.#cut.size === 0 || !f.subject?.startsWith("$NRG.")) return;
        const dialer = (conn.dialerId && ids.get(conn.dialerId)) ??
          conn.dialerName;
        if (dialer === undefined) return;
        if (this.#cut.has(pairKey(dialer, target))) {
          this.dropped++;
          return "drop";
        }
      };
    });
  }

  /**
   * Starts `n` JetStream servers named `n0`... with routes through proxies.
   *
   * @param n How many servers.
   */
  static async start(n = 3): Promise<ProxiedCluster> {
    // A route port is free when picked but not yet bound, so a server's
    // random client port can take it first (a CI run saw n1 listen for
    // clients on its own route port): start again on new ports then.
    for (let attempt = 1;; attempt++) {
      try {
        return await ProxiedCluster.#startOnce(n);
      } catch (err) {
        if (attempt >= 3 || !/address already in use/.test(String(err))) {
          throw err;
        }
      }
    }
  }

  static async #startOnce(n: number): Promise<ProxiedCluster> {
    const real: number[] = [];
    while (real.length < n) {
      const p = await freePort();
      if (!real.includes(p)) real.push(p);
    }
    const proxies = await Promise.all(real.map((p) => NatsProxy.start(p)));
    const started = await Promise.allSettled(
      real.map((port, i) =>
        NatsServer.start({
          jetstream: true,
          extraConfig: [
            `server_name: "n${i}"`,
            `cluster {`,
            `  name: "proxied"`,
            `  listen: "127.0.0.1:${port}"`,
            `  advertise: "127.0.0.1:${proxies[i]!.port}"`,
            `  compression: off`,
            `  routes: [${
              proxies.filter((_, j) => j !== i).map((p) =>
                `"nats-route://127.0.0.1:${p.port}"`
              ).join(", ")
            }]`,
            `}`,
          ].join("\n"),
        })
      ),
    );
    const servers = started.flatMap((r) =>
      r.status === "fulfilled" ? [r.value] : []
    );
    const cluster = new ProxiedCluster(servers, proxies);
    const failed = started.find((r) => r.status === "rejected");
    if (failed) {
      await cluster.close();
      throw failed.reason;
    }
    try {
      await cluster.waitForMetaLeader(30_000);
    } catch (err) {
      await cluster.close();
      throw err;
    }
    return cluster;
  }

  /**
   * Waits until every server names the same JetStream meta leader and that
   * leader sees every peer as current.
   */
  async waitForMetaLeader(timeout: number): Promise<void> {
    const end = performance.now() + timeout;
    let last: unknown[] = [];
    while (performance.now() < end) {
      last = await Promise.all(this.servers.map(async (s) => {
        try {
          const res = await fetch(`${s.httpUrl}/jsz`, {
            signal: AbortSignal.timeout(2_000),
          });
          return res.ok ? await res.json() : (await res.body?.cancel(), null);
        } catch {
          return null;
        }
      }));
      type Meta = {
        leader?: string;
        replicas?: { name: string; current?: boolean }[];
      };
      const metas = last.map((j) =>
        (j as { meta_cluster?: Meta } | null)?.meta_cluster
      );
      const leader = metas[0]?.leader;
      const i = this.servers.findIndex((_, k) => `n${k}` === leader);
      const ok = leader !== undefined && leader !== "" && i >= 0 &&
        metas.every((m) => m?.leader === leader) &&
        this.servers.every((_, k) =>
          k === i ||
          (metas[i]?.replicas ?? []).some((r) =>
            r.name === `n${k}` && r.current === true
          )
        );
      if (ok) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(
      `Cannot find a JetStream meta leader in the proxied cluster within ${timeout} ms: ${
        JSON.stringify(last)
      }`,
    );
  }

  /** Client URLs, in index order. */
  get urls(): string[] {
    return this.servers.map((s) => s.url);
  }

  /** Drops the Raft traffic between servers `a` and `b` (names) both ways. */
  cut(a: string, b: string): void {
    this.#cut.add(pairKey(a, b));
  }

  /** Lets Raft traffic between `a` and `b` flow again. */
  heal(a: string, b: string): void {
    this.#cut.delete(pairKey(a, b));
  }

  /** Heals every cut. */
  healAll(): void {
    this.#cut.clear();
  }

  /** Kills every server and closes the proxies. */
  async close(): Promise<void> {
    this.#cut.clear();
    await Promise.allSettled(this.servers.map((s) => s[Symbol.asyncDispose]()));
    await Promise.allSettled(this.proxies.map((p) => p.close()));
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

function pairKey(a: string, b: string): string {
  return a < b ? `${a}|${b}` : `${b}|${a}`;
}
