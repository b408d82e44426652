/**
 * This library beside etcd and Redis (issue 18): the same six rows for each
 * system, every server on this machine, systems interleaved within each run.
 *
 * Systems: ours on nats-server with the default `sync_interval` and with
 * `jetstream { sync_interval: always }` (only the second fsyncs before it
 * acknowledges, as etcd does), each on a classic bucket (the data written
 * to a second bucket, the epoch its token) and on a fenced bucket
 * (`fenced: true`, issue 33: the data written by the lease's fenced put,
 * which the server itself refuses once the tenure is over), etcd (`etcd3`: `Lock`, `Election`, a
 * transaction comparing the lock key's create revision) and Redis (`redlock`
 * over `ioredis`, one instance: without persistence, and as `redis-always`
 * with `appendonly yes` and `appendfsync always`, which fsyncs before it
 * acknowledges). See `_peers_systems.ts` for what each guarded write does.
 * With more than one run, a cell gives the median, then the lowest and
 * highest over the runs in brackets.
 *
 * Rows: (1) guarded-write latency, one writer, held key; (2) throughput, 64
 * writers over 256 held keys; (3) acquire and release of a free key, time and
 * requests, and (3b) the server's floor beside it, in the same loop: two bare
 * requests through the system's plain client, no lock library, that create
 * a fresh key only if it is absent and delete it (`openFloor` in
 * `_peers_systems.ts`), and a round trip that stores nothing; (4) failover
 * after SIGKILL of the holder at TTL 5 s, and after SIGSTOP (row 6's pause,
 * from the stop to the successor's write); (5) clean handover; (6) a holder
 * paused 2 TTL between its check and its write. On a fenced bucket row 6
 * also sends, once the holder wakes, the message its put would send (the
 * fence's headers at its epoch) by a bare publish, past the lease's own
 * check: what the server does with a late fenced write.
 *
 * ```sh
 * bash bench/peers.sh [--smoke]          # setup, then this under Node 24
 * node_modules/.bin/node bench/peers.ts [--smoke] [--runs N] [--out FILE]
 * node_modules/.bin/deno run -A bench/peers.ts
 * ```
 *
 * Prints three Markdown tables to stdout (every row against ours with
 * `check: "cas"`; ours with fsync, classic and fenced, against etcd; row 3
 * against each server's floor and against Redlock's row 3) and progress to
 * stderr; writes the report as JSON to
 * `bench-results/peers-<runtime>.json` (or `--out`).
 *
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { canConnect, NatsServer } from "../test_util/nats_server.ts";
import {
  type Endpoints,
  type Floor,
  type Held,
  openFloor,
  openPeer,
  type Peer,
  type SystemName,
} from "./_peers_systems.ts";

// ---------------------------------------------------------------------------
// Settings.

/** How much work each row does. */
export interface PeersConfig {
  mode: "smoke" | "full";
  /** Interleaved runs; every figure is the median over runs. */
  runs: number;
  /** Sequential guarded writes per system per run (row 1). */
  latencyOps: number;
  /** Milliseconds of 64 writers per system per run (row 2). */
  phaseMs: number;
  /** Acquire-and-release cycles per system per run (row 3). */
  acquireOps: number;
  /** TTL of rows 4 to 6 (etcd rounds it to whole seconds, at least 2 s). */
  ttl: number;
}

/** The settings of a mode. */
export function peersConfig(
  mode: "smoke" | "full",
  runs?: number,
): PeersConfig {
  return mode === "smoke"
    ? {
      mode,
      runs: 1,
      latencyOps: 30,
      phaseMs: 200,
      acquireOps: 10,
      ttl: 1_000,
    }
    : {
      mode,
      runs: runs ?? 5,
      latencyOps: 1_000,
      phaseMs: 2_000,
      acquireOps: 100,
      ttl: 5_000,
    };
}

/** The column of one system (and for ours, one guard check). */
export type Column =
  | "nats/cas"
  | "nats/lease"
  | "nats-always/cas"
  | "nats-always/lease"
  | "nats-fenced/cas"
  | "nats-fenced/lease"
  | "nats-fenced-always/cas"
  | "nats-fenced-always/lease"
  | "etcd"
  | "redis"
  | "redis-always";

const COLUMNS: Column[] = [
  "nats/cas",
  "nats/lease",
  "nats-always/cas",
  "nats-always/lease",
  "nats-fenced/cas",
  "nats-fenced/lease",
  "nats-fenced-always/cas",
  "nats-fenced-always/lease",
  "etcd",
  "redis",
  "redis-always",
];
const SYSTEMS: SystemName[] = [
  "nats",
  "nats-always",
  "nats-fenced",
  "nats-fenced-always",
  "etcd",
  "redis",
  "redis-always",
];
/** Rows 1 and 2 take a long TTL so that no renewal falls in a phase. */
const LONG_TTL = 60_000;

/** Row 6 for one system, one run. */
export interface Paused {
  /** The paused holder's token and the successor's. */
  holderToken: number | null;
  successorToken: number | null;
  /** Whether the late write reached the system's store and landed there. */
  landed: boolean;
  /** What turned it away, if anything. */
  refusedBy: string | null;
  /** What the holder printed once it woke (`wrote true`, `refused ...`). */
  answer?: string;
  /**
   * Fenced buckets: the message the holder's put would send (the fence's
   * headers at its epoch), sent by a bare publish once it woke, past the
   * lease's own check: whether the server stored it, and its answer.
   */
  sent?: { stored: boolean; answer: string };
  /** Fenced buckets: the data key's value after both, as the server has it. */
  stored?: string | null;
}

/** Per-run figures of one system. */
export interface RunFigures {
  latencyP50?: number;
  latencyP99?: number;
  opsPerSec?: number;
  acquireReleaseMs?: number;
  requestsPerCycle?: number;
  /**
   * Row 3b, in row 3's loop: two bare requests (create a fresh key if it is
   * absent, then delete it), their sum and the first alone; on NATS the
   * same two with acks on one shared reply subscription; and a round trip
   * that stores nothing. Medians over the loop, ms.
   */
  floorMs?: number;
  floorFirstMs?: number;
  floorLeanMs?: number;
  pingMs?: number;
  /** Row 3b's requests per pair, as the server counts them. */
  floorRequests?: number;
  failoverMs?: number;
  /** Row 6's pause: from the SIGSTOP to the successor's first write. */
  stoppedFailoverMs?: number;
  handoverMs?: number;
  paused?: Paused;
}

/** The whole report. */
export interface PeersReport {
  mode: "smoke" | "full";
  /** TTL of rows 4 to 6, ms. */
  ttl: number;
  runtime: string;
  versions: Record<string, string>;
  loadAverage: { start: number[]; end: number[] };
  learns: Record<string, string>;
  /** `runs[column][run]`. */
  runs: Record<string, RunFigures[]>;
}

// ---------------------------------------------------------------------------
// Servers.

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

interface Server {
  url: string;
  version: string;
  /** Requests the server has handled so far (for row 3). */
  requests(): Promise<number>;
  stop(): Promise<void>;
}

async function spawnServer(
  cmd: string,
  args: string[],
  port: number,
  dir: string,
): Promise<ChildProcess> {
  const log = fs.openSync(path.join(dir, "server.log"), "a");
  const child = spawn(cmd, args, { stdio: ["ignore", log, log] });
  fs.closeSync(log);
  const deadline = performance.now() + 15_000;
  while (!(await canConnect(port))) {
    if (child.exitCode !== null || performance.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(
        `Cannot start '${cmd}' on port ${port}:\n${
          fs.readFileSync(path.join(dir, "server.log"), "utf8").slice(-2000)
        }`,
      );
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return child;
}

async function stopChild(child: ChildProcess, dir: string): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGTERM");
    await Promise.race([exited, new Promise((r) => setTimeout(r, 3_000))]);
    child.kill("SIGKILL");
  }
  fs.rmSync(dir, { recursive: true, force: true });
}

async function startNats(always: boolean): Promise<Server> {
  const storeDir = fs.mkdtempSync(path.join(os.tmpdir(), "peers-nats-"));
  const ns = await NatsServer.start(
    always
      ? {
        jetstream: false,
        storeDir,
        extraConfig: `jetstream { store_dir: ${
          JSON.stringify(storeDir)
        }, sync_interval: always }`,
      }
      : { storeDir },
  );
  return {
    url: ns.url,
    version: ns.version,
    async requests() {
      const varz = await (await fetch(`${ns.httpUrl}/varz`)).json();
      return (varz as { in_msgs: number }).in_msgs;
    },
    async stop() {
      await ns[Symbol.asyncDispose]();
      fs.rmSync(storeDir, { recursive: true, force: true });
    },
  };
}

async function startEtcd(): Promise<Server> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "peers-etcd-"));
  const [client, peer] = [await freePort(), await freePort()];
  const url = `http://127.0.0.1:${client}`;
  const child = await spawnServer(
    "etcd",
    [
      "--name=peers",
      `--data-dir=${path.join(dir, "data")}`,
      `--listen-client-urls=${url}`,
      `--advertise-client-urls=${url}`,
      `--listen-peer-urls=http://127.0.0.1:${peer}`,
      `--initial-advertise-peer-urls=http://127.0.0.1:${peer}`,
      `--initial-cluster=peers=http://127.0.0.1:${peer}`,
      "--logger=zap",
      "--log-level=warn",
    ],
    client,
    dir,
  );
  const version = (await (await fetch(`${url}/version`)).json()) as {
    etcdserver: string;
  };
  return {
    url,
    version: version.etcdserver,
    async requests() {
      const text = await (await fetch(`${url}/metrics`)).text();
      let n = 0;
      for (
        const m of text.matchAll(/^grpc_server_started_total\{.*\} (\S+)$/gm)
      ) {
        n += Number(m[1]);
      }
      return n;
    },
    stop: () => stopChild(child, dir),
  };
}

/**
 * One redis-server. With `always`, its append-only file is on and fsynced
 * before each write is acknowledged (`appendfsync always`), as etcd does
 * and `nats-always` does: the like-for-like durability; without, nothing
 * is persisted (Redis's fastest, and what a lock server is often run as).
 */
async function startRedis(always = false): Promise<Server> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "peers-redis-"));
  const port = await freePort();
  const child = await spawnServer(
    "redis-server",
    [
      "--port",
      String(port),
      "--bind",
      "127.0.0.1",
      "--dir",
      dir,
      "--save",
      "",
      ...(always
        ? ["--appendonly", "yes", "--appendfsync", "always"]
        : ["--appendonly", "no"]),
    ],
    port,
    dir,
  );
  const url = `redis://127.0.0.1:${port}`;
  const info = async (section = "server"): Promise<string> => {
    const { Redis } = await import("ioredis");
    const r = new Redis(url);
    try {
      return await r.info(section);
    } finally {
      r.disconnect();
    }
  };
  const version = /redis_version:(\S+)/.exec(await info())?.[1] ?? "?";
  if (always && !/^aof_enabled:1\s*$/m.test(await info("persistence"))) {
    throw new Error("redis-server did not turn its append-only file on");
  }
  return {
    url,
    version,
    async requests() {
      // Requests from clients: Redlock sends only scripts (EVALSHA, EVAL
      // the first time), row 3b's floor SET, DEL and PING. A script's own
      // calls count under their own names: each of Redlock's acquires
      // calls EXISTS, then SET; each release GET, then DEL (an extend GET,
      // then SET): those are taken off, leaving what clients sent.
      const stats = await info("commandstats");
      const calls = (cmd: string): number =>
        Number(
          new RegExp(`^cmdstat_${cmd}:calls=(\\d+)`, "m").exec(stats)?.[1] ?? 0,
        );
      const n = calls("evalsha") + calls("eval") + calls("ping") +
        (calls("set") - calls("exists")) + (calls("del") - calls("get"));
      return n;
    },
    stop: () => stopChild(child, dir),
  };
}

// ---------------------------------------------------------------------------
// Statistics.

function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? NaN;
}

const median = (xs: number[]): number => {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

const log = (msg: string): void => {
  process.stderr.write(`peers: ${msg}\n`);
};

// ---------------------------------------------------------------------------
// Rows 1 to 3, in this process.

async function rowLatency(
  peer: Peer,
  ops: number,
  r: number,
): Promise<RunFigures> {
  const held = await peer.acquire(`lat.${r}`, LONG_TTL);
  try {
    for (let i = 0; i < 20; i++) await held.write(`w${i}`);
    const times: number[] = [];
    for (let i = 0; i < ops; i++) {
      const t = performance.now();
      if (!(await held.write(`v${i}`))) {
        throw new Error("guarded write refused");
      }
      times.push(performance.now() - t);
    }
    return {
      latencyP50: percentile(times, 0.5),
      latencyP99: percentile(times, 0.99),
    };
  } finally {
    await held.release();
  }
}

async function rowThroughput(
  peer: Peer,
  ms: number,
  r: number,
): Promise<RunFigures> {
  const held: Held[] = [];
  for (let k = 0; k < 256; k++) {
    held.push(await peer.acquire(`tp.${r}.${k}`, LONG_TTL));
  }
  try {
    let done = 0;
    const end = performance.now() + ms;
    const t0 = performance.now();
    await Promise.all(Array.from({ length: 64 }, async (_, w) => {
      for (let i = 0; performance.now() < end; i++) {
        if (!(await held[w + 64 * (i % 4)]!.write(`v${i}`))) {
          throw new Error("guarded write refused");
        }
        done++;
      }
    }));
    return { opsPerSec: done / ((performance.now() - t0) / 1000) };
  } finally {
    await Promise.all(held.map((h) => h.release()));
  }
}

/**
 * Rows 3 and 3b: each pass of the loop takes and releases a fresh key
 * through the lock (row 3), sends the floor's two requests for another
 * fresh key, pings, and on NATS sends the floor's two through one shared
 * reply subscription, in an order turned each pass. First the floor's
 * requests and the ping's are counted alone (a warm-up), to be taken off
 * the loop's count.
 */
async function rowAcquire(
  peer: Peer,
  server: Server,
  floor: Floor,
  ops: number,
  r: number,
): Promise<RunFigures> {
  const warm = Math.min(10, ops);
  const counts: number[] = [await server.requests()];
  for (let i = 0; i < warm; i++) await floor.createDelete(`w.${r}.${i}`);
  counts.push(await server.requests());
  for (let i = 0; i < warm; i++) await floor.ping();
  counts.push(await server.requests());
  for (let i = 0; i < warm; i++) await floor.createDeleteLean?.(`w.${r}.${i}`);
  counts.push(await server.requests());
  const [floorReq, pingReq, leanReq] = [0, 1, 2].map((k) =>
    (counts[k + 1]! - counts[k]!) / warm
  ) as [number, number, number];
  const times: number[] = [];
  const floors: number[] = [];
  const firsts: number[] = [];
  const leans: number[] = [];
  const pings: number[] = [];
  const steps: ((i: number) => Promise<void>)[] = [
    async (i) => {
      const t = performance.now();
      const held = await peer.acquire(`acq.${r}.${i}`, LONG_TTL);
      await held.release();
      times.push(performance.now() - t);
    },
    async (i) => {
      const [a, b] = await floor.createDelete(`${r}.${i}`);
      floors.push(a + b);
      firsts.push(a);
    },
    async () => {
      const t = performance.now();
      await floor.ping();
      pings.push(performance.now() - t);
    },
  ];
  if (floor.createDeleteLean !== undefined) {
    const lean = floor.createDeleteLean;
    steps.push(async (i) => void leans.push(await lean(`${r}.${i}`)));
  }
  const before = await server.requests();
  for (let i = 0; i < ops; i++) {
    for (let j = 0; j < steps.length; j++) {
      await steps[(i + j) % steps.length]!(i);
    }
  }
  const after = await server.requests();
  const others = floorReq + pingReq +
    (floor.createDeleteLean === undefined ? 0 : leanReq);
  return {
    acquireReleaseMs: median(times),
    // The reading itself counts on none of the servers.
    requestsPerCycle: (after - before) / ops - others,
    floorMs: median(floors),
    floorFirstMs: median(firsts),
    ...(leans.length > 0 ? { floorLeanMs: median(leans) } : {}),
    pingMs: median(pings),
    floorRequests: floorReq,
  };
}

// ---------------------------------------------------------------------------
// Rows 4 to 6, against a holder in a child process.

interface Child {
  proc: ChildProcess;
  next(): Promise<string>;
  send(line: string): void;
  exited: Promise<void>;
}

function startHolder(
  system: SystemName,
  ep: Endpoints,
  key: string,
  ttl: number,
  window: number,
): Child {
  const file = fileURLToPath(new URL("./_peers_child.ts", import.meta.url));
  const deno = (globalThis as { Deno?: unknown }).Deno !== undefined;
  const argv = deno ? ["run", "-A", file] : [file];
  const proc = spawn(process.execPath, [
    ...argv,
    system,
    JSON.stringify(ep),
    key,
    String(ttl),
    String(window),
  ], { stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise<void>((r) => proc.once("exit", () => r()));
  const lines = createInterface({ input: proc.stdout! })
    [Symbol.asyncIterator]();
  return {
    proc,
    async next() {
      const { value, done } = await lines.next();
      if (done) throw new Error(`The ${system} holder exited before it spoke`);
      return value;
    },
    send: (line) => void proc.stdin!.write(`${line}\n`),
    exited,
  };
}

/**
 * Sends `sig` to the holder by pid. Deno's `ChildProcess.kill()` marks the
 * child killed after the first signal and sends no later one, so a SIGCONT
 * after a SIGSTOP never arrived there (row 6 hung under Deno). Sending to a
 * process that has exited already is not an error here.
 */
function signal(child: Child, sig: NodeJS.Signals): void {
  try {
    process.kill(child.proc.pid!, sig);
  } catch (err) {
    if ((err as { code?: string }).code !== "ESRCH") throw err;
  }
}

async function expect(child: Child, word: string): Promise<string> {
  const line = await child.next();
  if (!line.startsWith(word)) {
    throw new Error(`The holder said '${line}' where '${word}' was expected`);
  }
  return line.slice(word.length).trim();
}

async function rowFailover(
  system: SystemName,
  ep: Endpoints,
  peer: Peer,
  ttl: number,
  key: string,
  how: "kill" | "release",
): Promise<number> {
  const child = startHolder(system, ep, key, ttl, 0);
  try {
    await expect(child, "held");
    const waiting = peer.waitAndWrite(key, ttl, "successor");
    // The successor is waiting when the holder goes, as in a service.
    await new Promise((r) => setTimeout(r, 300));
    const t0 = performance.now();
    if (how === "kill") signal(child, "SIGKILL");
    else child.send("release");
    const { at } = await waiting;
    return at - t0;
  } finally {
    signal(child, "SIGKILL");
    await child.exited;
  }
}

const isFenced = (system: SystemName): boolean =>
  system === "nats-fenced" || system === "nats-fenced-always";

async function rowPaused(
  system: SystemName,
  ep: Endpoints,
  peer: Peer,
  ttl: number,
  key: string,
): Promise<{ paused: Paused; stoppedFailoverMs: number }> {
  const child = startHolder(system, ep, key, ttl, 200);
  try {
    const token = await expect(child, "held");
    child.send("write late");
    await expect(child, "checked");
    signal(child, "SIGSTOP");
    const stopped = performance.now();
    const successor = await peer.waitAndWrite(key, ttl, "successor");
    const stoppedFailoverMs = successor.at - stopped;
    const left = 2 * ttl - (performance.now() - stopped);
    if (left > 0) await new Promise((r) => setTimeout(r, left));
    signal(child, "SIGCONT");
    const line = await child.next();
    const holderToken = token === "-" ? null : Number(token);
    const successorToken = successor.token ?? null;
    const landed = line === "wrote true";
    if (isFenced(system)) {
      // The same message once more, past the lease's own check: the
      // server's fence alone decides.
      child.send("send late");
      const sentLine = await expect(child, "sent");
      const stored = sentLine.startsWith("true");
      const value = await peer.stored!(key, ttl);
      const refusedBy = landed
        ? null
        : /the server refused/.test(line)
        ? "the server (its fenced put)"
        : `its lease's own check before sending (${
          /^refused (\w+)/.exec(line)?.[1] ?? line
        })`;
      return {
        paused: {
          holderToken,
          successorToken,
          landed,
          refusedBy,
          answer: line,
          sent: { stored, answer: sentLine.replace(/^\S+ /, "") },
          stored: value ?? null,
        },
        stoppedFailoverMs,
      };
    }
    // A store that keeps the highest token it has accepted and turns away
    // lower ones (examples/fenced_store.ts) would refuse the late write when
    // it carries a token below the successor's.
    const fenced = holderToken !== null && successorToken !== null &&
      holderToken < successorToken;
    const refusedBy = system === "etcd"
      ? (landed ? null : "etcd's txn compare (create revision)")
      : fenced
      ? "a fenced store (epoch below the successor's)"
      : null;
    return {
      paused: { holderToken, successorToken, landed, refusedBy, answer: line },
      stoppedFailoverMs,
    };
  } finally {
    signal(child, "SIGCONT");
    signal(child, "SIGKILL");
    await child.exited;
  }
}

// ---------------------------------------------------------------------------
// The run.

/** Runs the comparison and returns the report. */
export async function runPeers(cfg: PeersConfig): Promise<PeersReport> {
  const loadStart = os.loadavg();
  log(`${cfg.mode}: starting nats-server twice, etcd and redis-server twice`);
  const nats = await startNats(false);
  const natsAlways = await startNats(true);
  // A fenced bucket lives on the same server as the classic one, beside it.
  const servers: Record<SystemName, Server> = {
    nats,
    "nats-always": natsAlways,
    "nats-fenced": nats,
    "nats-fenced-always": natsAlways,
    etcd: await startEtcd(),
    redis: await startRedis(),
    "redis-always": await startRedis(true),
  };
  const endpoints = (s: SystemName): Endpoints => ({
    nats: servers[s].url,
    etcd: servers.etcd.url,
    redis: servers[s === "redis-always" ? s : "redis"].url,
  });
  const runs: Record<string, RunFigures[]> = {};
  const learns: Record<string, string> = {};
  for (const c of COLUMNS) runs[c] = [];
  try {
    for (let r = 0; r < cfg.runs; r++) {
      // Rotate the order each run so no system always goes first.
      const order = COLUMNS.map((_, i) => COLUMNS[(i + r) % COLUMNS.length]!);
      const figs = new Map<Column, RunFigures>(order.map((c) => [c, {}]));
      for (const col of order) {
        const [sys, check] = col.split("/") as [
          SystemName,
          "cas" | "lease" | undefined,
        ];
        log(`run ${r + 1}/${cfg.runs}: ${col}, rows 1-3`);
        const peer = await openPeer(
          sys,
          endpoints(sys),
          "bench",
          check ?? "cas",
        );
        try {
          Object.assign(
            figs.get(col)!,
            await rowLatency(peer, cfg.latencyOps, r),
          );
          Object.assign(
            figs.get(col)!,
            await rowThroughput(peer, cfg.phaseMs, r),
          );
          if (check !== "lease") {
            const floor = await openFloor(sys, endpoints(sys), LONG_TTL);
            try {
              Object.assign(
                figs.get(col)!,
                await rowAcquire(peer, servers[sys], floor, cfg.acquireOps, r),
              );
            } finally {
              await floor.close();
            }
          }
        } finally {
          await peer.close();
        }
      }
      const sysOrder = SYSTEMS.map((_, i) =>
        SYSTEMS[(i + r) % SYSTEMS.length]!
      );
      for (const sys of sysOrder) {
        log(`run ${r + 1}/${cfg.runs}: ${sys}, rows 4-6 (TTL ${cfg.ttl} ms)`);
        const col = (sys.startsWith("nats") ? `${sys}/cas` : sys) as Column;
        const peer = await openPeer(sys, endpoints(sys), "successor");
        learns[sys] = peer.learns;
        try {
          const f = figs.get(col)!;
          f.failoverMs = await rowFailover(
            sys,
            endpoints(sys),
            peer,
            cfg.ttl,
            `el.kill.${r}`,
            "kill",
          );
          f.handoverMs = await rowFailover(
            sys,
            endpoints(sys),
            peer,
            cfg.ttl,
            `el.hand.${r}`,
            "release",
          );
          Object.assign(
            f,
            await rowPaused(sys, endpoints(sys), peer, cfg.ttl, `el.stop.${r}`),
          );
        } finally {
          await peer.close();
        }
      }
      for (const c of COLUMNS) runs[c]!.push(figs.get(c)!);
    }
  } finally {
    for (const s of new Set(Object.values(servers))) {
      await s.stop().catch(() => {});
    }
  }
  const denoVersion = (globalThis as { Deno?: { version: { deno: string } } })
    .Deno?.version.deno;
  return {
    mode: cfg.mode,
    ttl: cfg.ttl,
    runtime: denoVersion
      ? `Deno ${denoVersion}`
      : `Node ${process.versions.node}`,
    versions: {
      "nats-server": servers.nats.version,
      etcd: servers.etcd.version,
      redis: servers.redis.version,
      ...packageVersions(),
    },
    loadAverage: { start: loadStart, end: os.loadavg() },
    learns,
    runs,
  };
}

function packageVersions(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of ["etcd3", "redlock", "ioredis", "@nats-io/kv"]) {
    const file = fileURLToPath(
      new URL(`../node_modules/${name}/package.json`, import.meta.url),
    );
    out[name] =
      (JSON.parse(fs.readFileSync(file, "utf8")) as { version: string })
        .version;
  }
  return out;
}

// ---------------------------------------------------------------------------
// The table.

const fmt = (x: number | undefined, unit: string, digits = 0): string =>
  x === undefined || !Number.isFinite(x) ? "—" : `${
    x.toLocaleString("en-US", {
      maximumFractionDigits: digits,
      minimumFractionDigits: digits,
    })
  }${unit}`;

const ms = (x: number | undefined): string =>
  x === undefined ? "—" : x < 10 ? fmt(x * 1000, " µs") : fmt(x, " ms");

/**
 * The median over runs of one figure and its median ratio to `base` (each
 * run's figure over the same run's base), with the range of each.
 */
function stat(
  report: PeersReport,
  col: Column,
  pick: (f: RunFigures) => number | undefined,
  base: Column = "nats/cas",
): { value: number; ratio: number; values: number[]; ratios: number[] } {
  const mine = report.runs[col]!.map(pick);
  const theirs = report.runs[base]!.map(pick);
  const values = mine.map((x) => x ?? NaN).filter(Number.isFinite);
  const ratios = mine.map((x, i) => (x ?? NaN) / (theirs[i] ?? NaN))
    .filter(Number.isFinite);
  return {
    value: median(values),
    ratio: median(ratios),
    values,
    ratios,
  };
}

/** " [lowest–highest]" of `xs` as `show` prints them, or "" for one run. */
function range(xs: number[], show: (x: number) => string): string {
  if (xs.length < 2) return "";
  return ` [${show(Math.min(...xs))}–${show(Math.max(...xs))}]`;
}

/** The rows as Markdown: one column per system, ratios against ours. */
export function table(report: PeersReport): string {
  const cell = (
    col: Column,
    pick: (f: RunFigures) => number | undefined,
    show: (x: number) => string,
  ): string => {
    const { value, ratio, values, ratios } = stat(report, col, pick);
    if (!Number.isFinite(value)) return "—";
    const times = (x: number) => fmt(x, "×", 2);
    return col === "nats/cas"
      ? `${show(value)}${range(values, show)}`
      : `${show(value)} (${times(ratio)}${range(ratios, times)})`;
  };
  const rows: string[][] = [];
  const row = (
    name: string,
    f: (c: Column) => string,
    cols = COLUMNS,
  ): void => {
    rows.push([name, ...COLUMNS.map((c) => (cols.includes(c) ? f(c) : "—"))]);
  };
  row("1. guarded write p50", (c) => cell(c, (f) => f.latencyP50, ms));
  row("1. guarded write p99", (c) => cell(c, (f) => f.latencyP99, ms));
  row(
    "2. writes/s, 64 writers × 256 keys",
    (c) => cell(c, (f) => f.opsPerSec, (x) => fmt(x, "/s")),
  );
  const once = COLUMNS.filter((c) => !c.endsWith("/lease"));
  row(
    "3. acquire + release",
    (c) => cell(c, (f) => f.acquireReleaseMs, ms),
    once,
  );
  row(
    "3. server requests per acquire + release",
    (c) =>
      fmt(median(report.runs[c]!.map((f) => f.requestsPerCycle ?? NaN)), "", 1),
    once,
  );
  row(
    "3b. the server's floor: two bare requests",
    (c) => cell(c, (f) => f.floorMs, ms),
    once,
  );
  row(
    "3b. the first of them alone (one bare write)",
    (c) => cell(c, (f) => f.floorFirstMs, ms),
    once,
  );
  row(
    "3b. the two, acks on one shared reply subscription",
    (c) => cell(c, (f) => f.floorLeanMs, ms),
    once.filter((c) => c.startsWith("nats")),
  );
  row(
    "3b. a round trip that stores nothing (PING)",
    (c) => cell(c, (f) => f.pingMs, ms),
    once,
  );
  row(
    "3b. server requests per floor",
    (c) =>
      fmt(median(report.runs[c]!.map((f) => f.floorRequests ?? NaN)), "", 1),
    once,
  );
  row(
    `4. failover after SIGKILL, TTL ${report.ttl / 1000} s`,
    (c) => cell(c, (f) => f.failoverMs, ms),
    once,
  );
  row(
    `4. failover after SIGSTOP (row 6), TTL ${report.ttl / 1000} s`,
    (c) => cell(c, (f) => f.stoppedFailoverMs, ms),
    once,
  );
  row("5. clean handover", (c) => cell(c, (f) => f.handoverMs, ms), once);
  row("6. paused holder's late write landed", (c) => {
    const p = report.runs[c]!.map((f) => f.paused).filter((x) =>
      x !== undefined
    );
    return `${p.filter((x) => x.landed).length}/${p.length}`;
  }, once);
  row("6. refused by a token", (c) => {
    const p = report.runs[c]!.map((f) => f.paused).filter((x) =>
      x !== undefined
    );
    const by = [...new Set(p.map((x) => x.refusedBy ?? "none"))].join("; ");
    return `${p.filter((x) => x.refusedBy !== null).length}/${p.length}: ${by}`;
  }, once);
  const fencedCols = once.filter((c) => c.startsWith("nats-fenced"));
  row("6. its message sent past the lease's check landed", (c) => {
    const p = report.runs[c]!.map((f) => f.paused?.sent).filter((x) =>
      x !== undefined
    );
    const by = [...new Set(p.map((x) => x.stored ? "stored" : x.answer))]
      .join("; ");
    return `${p.filter((x) => x.stored).length}/${p.length}: ${by}`;
  }, fencedCols);
  row("6. data key afterwards: the successor's", (c) => {
    const p = report.runs[c]!.map((f) => f.paused).filter((x) =>
      x?.stored !== undefined
    );
    const ok = p.filter((x) =>
      x!.stored === `${x!.successorToken} successor`
    ).length;
    return `${ok}/${p.length}`;
  }, fencedCols);
  const head = ["row", ...COLUMNS];
  return [head, head.map(() => "---"), ...rows]
    .map((r) => `| ${r.join(" | ")} |`)
    .join("\n") + "\n";
}

/**
 * Ours with fsync, classic and fenced, against etcd (which always fsyncs):
 * each cell the median over runs of ours over etcd in the same run, with
 * the range. Below 1× ours is faster (or, for writes/s, slower).
 */
export function versusEtcd(report: PeersReport): string {
  const cols: Column[] = [
    "nats-always/cas",
    "nats-always/lease",
    "nats-fenced-always/cas",
    "nats-fenced-always/lease",
  ];
  const times = (x: number) => fmt(x, "×", 2);
  const rows: [string, (f: RunFigures) => number | undefined, boolean][] = [
    ["1. guarded write p50", (f) => f.latencyP50, false],
    ["2. writes/s, 64 writers × 256 keys", (f) => f.opsPerSec, false],
    ["3. acquire + release", (f) => f.acquireReleaseMs, true],
    ["4. failover after SIGKILL", (f) => f.failoverMs, true],
    ["4. failover after SIGSTOP", (f) => f.stoppedFailoverMs, true],
    ["5. clean handover", (f) => f.handoverMs, true],
  ];
  const lines = rows.map(([name, pick, once]) => [
    name,
    ...cols.map((c) => {
      if (once && c.endsWith("/lease")) return "—";
      const { ratio, ratios } = stat(report, c, pick, "etcd");
      return Number.isFinite(ratio)
        ? `${times(ratio)}${range(ratios, times)}`
        : "—";
    }),
  ]);
  const head = ["ours over etcd, same run", ...cols];
  return [head, head.map(() => "---"), ...lines]
    .map((r) => `| ${r.join(" | ")} |`)
    .join("\n") + "\n";
}

/** Where a column's Redlock of the same durability is. */
const redlockOf = (col: Column): Column =>
  col.includes("always") || col === "etcd" ? "redis-always" : "redis";

/**
 * Row 3 beside row 3b, one line per system: its acquire + release over its
 * own server's floor, and ours and the floors over Redlock's acquire +
 * release of the same durability (Redis without persistence for the
 * default columns, with `appendfsync always` for the fsync ones and etcd),
 * each ratio the median over runs of the run's own ratio, with the range.
 */
export function versusFloor(report: PeersReport): string {
  const cols = COLUMNS.filter((c) => !c.endsWith("/lease"));
  const times = (x: number) => fmt(x, "×", 2);
  const ratio = (
    col: Column,
    pick: (f: RunFigures) => number | undefined,
    base: Column,
    basePick: (f: RunFigures) => number | undefined,
  ): string => {
    const mine = report.runs[col]!.map(pick);
    const theirs = report.runs[base]!.map(basePick);
    const ratios = mine.map((x, i) => (x ?? NaN) / (theirs[i] ?? NaN))
      .filter(Number.isFinite);
    return ratios.length === 0
      ? "—"
      : `${times(median(ratios))}${range(ratios, times)}`;
  };
  const value = (col: Column, pick: (f: RunFigures) => number | undefined) => {
    const xs = report.runs[col]!.map((f) => pick(f) ?? NaN)
      .filter(Number.isFinite);
    return xs.length === 0 ? "—" : `${ms(median(xs))}${range(xs, ms)}`;
  };
  const a = (f: RunFigures) => f.acquireReleaseMs;
  const floor = (f: RunFigures) => f.floorMs;
  const first = (f: RunFigures) => f.floorFirstMs;
  const lines = cols.map((c) => [
    c,
    redlockOf(c),
    value(c, a),
    value(c, floor),
    ratio(c, a, c, floor),
    ratio(c, a, redlockOf(c), a),
    ratio(c, floor, redlockOf(c), a),
    ratio(c, floor, redlockOf(c), floor),
    ratio(c, first, redlockOf(c), first),
    ratio(c, (f) => f.pingMs, redlockOf(c), (f) => f.pingMs),
  ]);
  const head = [
    "same run",
    "its Redlock",
    "3. acquire + release",
    "3b. floor: two bare requests",
    "3 over its floor",
    "3 over Redlock's 3",
    "floor over Redlock's 3",
    "floor over Redis's floor",
    "one bare write over Redis's",
    "PING over Redis's",
  ];
  return [head, head.map(() => "---"), ...lines]
    .map((r) => `| ${r.join(" | ")} |`)
    .join("\n") + "\n";
}

// ---------------------------------------------------------------------------
// Command line.

if (import.meta.main ?? process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  const smoke = args.includes("--smoke");
  const runsAt = args.indexOf("--runs");
  const outAt = args.indexOf("--out");
  const cfg = peersConfig(
    smoke ? "smoke" : "full",
    runsAt === -1 ? undefined : Number(args[runsAt + 1]),
  );
  const report = await runPeers(cfg);
  const runtime = report.runtime.split(" ")[0]!.toLowerCase();
  const out = outAt === -1
    ? `bench-results/peers-${runtime}${smoke ? "-smoke" : ""}.json`
    : args[outAt + 1]!;
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.writeFileSync(out, JSON.stringify(report, null, 2) + "\n");
  process.stdout.write(
    `${report.runtime}; ${
      Object.entries(report.versions).map(([k, v]) => `${k} ${v}`).join(", ")
    }; load average ${report.loadAverage.start[0]!.toFixed(1)} → ${
      report.loadAverage.end[0]!.toFixed(1)
    }\n\n${table(report)}\n${versusEtcd(report)}\n${
      versusFloor(report)
    }\nHow a waiting successor learns: ${
      Object.entries(report.learns).map(([k, v]) => `${k}: ${v}`).join("; ")
    }\n`,
  );
  process.exit(0);
}
