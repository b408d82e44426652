/**
 * Launches real `nats-server` processes for tests, benchmarks and the chaos
 * harness. Runs unchanged on Deno, Bun and Node 24: it uses `node:*` modules
 * only, never `Deno.*` or `Bun.*`.
 *
 * Each server gets a private temp directory holding its config, its log, the
 * ports file and (unless given) its JetStream `store_dir`. The config asks for
 * random ports (`port: -1`); once the server has reported them, they are
 * written back into the config so that {@linkcode NatsServer.restart} brings
 * the process back on the same ports, where a reconnecting client finds it.
 *
 * Server output goes to a log file, never to a pipe: a pipe would have to be
 * drained for as long as the server runs, or the server would block on write
 * and stall the very test that is watching it. The log is printed only when
 * startup fails.
 *
 * @example Start a server and connect to it
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { NatsServer } from "./nats_server.ts";
 *
 * await using ns = await NatsServer.start();
 * const nc = await connect({ servers: ns.url, maxReconnectAttempts: -1 });
 * await ns.restart(); // same port, same store_dir
 * await nc.close();
 * ```
 *
 * @module
 */

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";

/** Options for {@linkcode NatsServer.start}. */
export interface NatsServerOptions {
  /**
   * Path of the `nats-server` executable.
   *
   * @default {natsServerBinary()}
   */
  binary?: string;
  /**
   * Enable JetStream with a `store_dir` on disk.
   *
   * @default {true}
   */
  jetstream?: boolean;
  /**
   * JetStream domain (the `domain` of the `jetstream` block), for a hub and
   * its leaf nodes: a client reaches this server's JetStream from a leaf
   * node through `$JS.<domain>.API`.
   *
   * @default {none}
   */
  domain?: string;
  /**
   * Also listen for WebSocket clients (without TLS) on a random loopback
   * port, reported as {@linkcode NatsServer.wsUrl}.
   *
   * @default {false}
   */
  websocket?: boolean;
  /**
   * Config text appended verbatim after the generated config; a later
   * top-level key overrides an earlier one.
   *
   * @default {""}
   */
  extraConfig?: string;
  /**
   * JetStream `store_dir`. A directory passed here belongs to the caller and
   * is not deleted on dispose.
   *
   * @default {a new temp directory, deleted on dispose}
   */
  storeDir?: string;
  /**
   * Milliseconds to wait for the server to accept TCP connections before
   * giving up.
   *
   * @default {15000}
   */
  startTimeout?: number;
}

/** Options for {@linkcode NatsCluster.start}. */
export interface NatsClusterOptions
  extends Omit<NatsServerOptions, "jetstream" | "storeDir"> {
  /**
   * Cluster name written into every server's `cluster` block.
   *
   * @default {"nats-lease"}
   */
  name?: string;
  /**
   * Milliseconds to wait for the JetStream meta group to elect a leader that
   * sees every peer as current.
   *
   * @default {30000}
   */
  leaderTimeout?: number;
  /**
   * Executable per server, for a cluster of mixed versions: server `i` (named
   * `n{i}`) runs `binaries[i]`; a missing or `undefined` entry falls back to
   * {@linkcode NatsServerOptions.binary}. Each server's
   * {@linkcode NatsServer.version} tells which one it runs.
   *
   * Measured with 2.15.2 and 2.9.10: they form one cluster with one
   * JetStream meta group only when 2.9.10 nodes are the majority (e.g.
   * `[old, new, old]`, up in 0.3-16 s). The meta leader is then always a
   * 2.9.10 node; a stream leader may be either. A 2.15.2 voter with an empty
   * log grants a vote with the flags byte 3 (granted | empty), which 2.9.10
   * (`msg[16] == 1`) reads as a refusal, so `[new, old, new]` elected no meta
   * leader in 30 s, even with `pool_size: -1`. (The log's "Not possible to
   * have a dedicated route for account "$SYS"" errors are harmless: 2.15
   * falls back to an unpooled route.)
   *
   * @default {every server runs `binary`}
   */
  binaries?: readonly (string | undefined)[];
}

/** The ports a server reported in its ports file. */
interface Ports {
  client: number;
  http: number;
  ws?: number;
}

const DEFAULT_START_TIMEOUT = 15_000;
const DEFAULT_LEADER_TIMEOUT = 30_000;
const STOP_GRACE = 2_000;
const LOG_TAIL = 8_192;

function repoBinary(): string {
  return decodeURIComponent(
    new URL("../.tools/bin/nats-server", import.meta.url).pathname,
  );
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

function onPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? "").split(path.delimiter)) {
    if (dir === "") continue;
    const candidate = path.join(dir, name);
    if (isExecutable(candidate)) return candidate;
  }
  return undefined;
}

/**
 * Finds the `nats-server` executable to launch: `$NATS_SERVER_BIN` when set,
 * else the repo's `.tools/bin/nats-server` (built by `scripts/setup.sh`), else
 * `nats-server` on `PATH`, else `/usr/sbin/nats-server` (Debian's package).
 *
 * @returns The absolute path of an executable file.
 * @throws {Error} When `$NATS_SERVER_BIN` names a missing file, or no
 * candidate exists; the message says to run `scripts/setup.sh`.
 *
 * @example Pick the binary
 * ```ts ignore
 * const bin = natsServerBinary(); // e.g. "/repo/.tools/bin/nats-server"
 * ```
 */
export function natsServerBinary(): string {
  const fromEnv = process.env.NATS_SERVER_BIN;
  if (fromEnv !== undefined && fromEnv !== "") {
    const resolved = path.resolve(fromEnv);
    if (isExecutable(resolved)) return resolved;
    throw new Error(
      `Cannot launch nats-server as NATS_SERVER_BIN is not an executable file: received '${fromEnv}'. Run 'bash scripts/setup.sh' to build .tools/bin/nats-server and install /usr/sbin/nats-server, or unset NATS_SERVER_BIN.`,
    );
  }
  const local = repoBinary();
  if (isExecutable(local)) return local;
  const found = onPath("nats-server");
  if (found !== undefined) return found;
  if (isExecutable("/usr/sbin/nats-server")) return "/usr/sbin/nats-server";
  throw new Error(
    `Cannot find nats-server: looked at $NATS_SERVER_BIN, '${local}', PATH and '/usr/sbin/nats-server'. Run 'bash scripts/setup.sh' to build it into .tools/bin (needs Go) and install Debian's nats-server package.`,
  );
}

const versions = new Map<string, string>();

function binaryVersion(binary: string): string {
  let version = versions.get(binary);
  if (version === undefined) {
    let out: string;
    try {
      // Prints e.g. "nats-server: v2.15.2".
      out = execFileSync(binary, ["--version"], {
        encoding: "utf8",
        stdio: ["ignore", "pipe", "pipe"],
      });
    } catch (error) {
      throw new Error(
        `Cannot run '${binary} --version': ${
          error instanceof Error ? error.message : String(error)
        }. Run 'bash scripts/setup.sh' to install nats-server.`,
        { cause: error },
      );
    }
    version = /v?(\d+\.\d+\.\d+[^\s]*)/.exec(out)?.[1] ?? out.trim();
    versions.set(binary, version);
  }
  return version;
}

// Signals go through `process.kill(pid)`, never `ChildProcess.kill()`: Deno's
// `kill()` sets `signalCode` at once (before the process has exited) and
// ignores every later call, so SIGTERM-then-SIGKILL would silently skip the
// SIGKILL. Exit is therefore tracked from the 'exit' event alone.
class Proc {
  readonly child: ChildProcess;
  readonly pid: number;
  exited = false;
  exitCode: number | null = null;
  exitSignal: string | null = null;
  spawnError: Error | undefined;
  readonly #exit: Promise<void>;

  constructor(child: ChildProcess) {
    this.child = child;
    this.pid = child.pid ?? -1;
    this.#exit = new Promise((resolve) => {
      child.once("exit", (code, signal) => {
        this.exited = true;
        this.exitCode = code;
        this.exitSignal = signal;
        live.delete(this);
        resolve();
      });
    });
    // Spawn failures (ENOENT, EACCES) arrive as 'error' and may come with no
    // 'exit'; record them instead of crashing on an unhandled event.
    child.on("error", (error) => {
      this.spawnError = error;
      if (this.pid === -1) this.exited = true;
    });
    // Unref'd so a server never keeps the test process alive; the exit hook
    // below kills whatever is left.
    child.unref();
    live.add(this);
    installExitHook();
  }

  signal(signal: "SIGKILL" | "SIGTERM" | "SIGSTOP" | "SIGCONT"): void {
    // Once exited, the pid may belong to another process.
    if (this.exited || this.pid === -1) return;
    try {
      process.kill(this.pid, signal);
    } catch {
      // Exited between the check and the signal.
    }
  }

  /** Resolves `true` once exited, or `false` after `timeout` ms. */
  async waitForExit(timeout: number): Promise<boolean> {
    if (this.exited) return true;
    // An unref'd child does not keep the event loop alive, so awaiting its
    // exit could let the runtime quit mid-await; hold a ref while waiting.
    this.child.ref();
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      return await Promise.race([
        this.#exit.then(() => true),
        new Promise<boolean>((resolve) => {
          timer = setTimeout(() => resolve(false), timeout);
        }),
      ]);
    } finally {
      clearTimeout(timer);
      this.child.unref();
    }
  }

  /** Sends SIGKILL and waits for the exit. */
  async kill(): Promise<void> {
    this.signal("SIGKILL");
    if (!(await this.waitForExit(10_000))) {
      throw new Error(`nats-server pid ${this.pid} survived SIGKILL for 10 s`);
    }
  }
}

// Servers still running when the process exits are killed here, so that a
// test that forgets to dispose leaves no orphan behind.
const live = new Set<Proc>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  const killAll = (): void => {
    for (const proc of live) proc.signal("SIGKILL");
  };
  process.on("exit", killAll);
  // `deno test` ends without emitting process 'exit'; it fires 'unload'.
  const target = globalThis as {
    addEventListener?: (type: string, listener: () => void) => void;
  };
  if (typeof target.addEventListener === "function") {
    target.addEventListener("unload", killAll);
  }
}

/**
 * Waits until Linux reports the process as stopped (`T`) or not, so that
 * `pause()` returns only once the server has really frozen. Without `/proc`
 * it returns at once.
 */
async function waitForStopState(pid: number, stopped: boolean): Promise<void> {
  const deadline = performance.now() + 2_000;
  while (performance.now() < deadline) {
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    } catch {
      return;
    }
    // The state follows the parenthesised command name.
    const state = stat.slice(
      stat.lastIndexOf(")") + 2,
      stat.lastIndexOf(")") + 3,
    );
    if ((state === "T" || state === "t") === stopped) return;
    await delay(5);
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Whether a TCP connection to `port` on 127.0.0.1 succeeds now.
 *
 * @example Check that a killed server is gone
 * ```ts ignore
 * await ns.kill();
 * console.log(await canConnect(ns.port)); // false
 * ```
 */
export function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ host: "127.0.0.1", port });
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => {
      socket.destroy();
      resolve(false);
    });
  });
}

/**
 * Returns a TCP port that was free a moment ago, by binding port 0 on
 * loopback and releasing it.
 */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.once("error", reject);
    server.listen({ host: "127.0.0.1", port: 0 }, () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null
        ? address.port
        : 0;
      server.close(() => resolve(port));
    });
  });
}

function portOf(urls: unknown): number | undefined {
  if (!Array.isArray(urls) || typeof urls[0] !== "string") return undefined;
  return Number(new URL(urls[0]).port);
}

/** Servers started and not yet disposed, for {@linkcode serverLogs}. */
const liveServers = new Set<NatsServer>();
/** Log tails of disposed servers (a test's own `await using` servers are
 * disposed before its error reaches a wrapper), newest last, with the
 * {@linkcode serverLogMark} at which each was disposed. */
const disposedTails: { mark: number; text: string }[] = [];
let logMark = 0;

function serverTail(s: NatsServer, lines: number): string {
  const name = /server_name: "([^"]+)"/.exec(readTail(s.configFile))?.[1];
  const tail = readTail(s.logFile).trimEnd().split("\n").slice(-lines);
  return `--- ${name ?? "server"} ${s.url} (${s.version}${
    s.running ? "" : ", not running"
  }) ---\n${tail.join("\n")}\n`;
}

/**
 * A mark to pass to {@linkcode serverLogs}: servers disposed after it are
 * included there.
 *
 * @returns The mark.
 *
 * @example
 * ```ts ignore
 * const mark = serverLogMark();
 * ```
 */
export function serverLogMark(): number {
  return ++logMark;
}

/**
 * The last `lines` lines of the log of every server of this process that
 * is still running, or was disposed after `since`, each under a heading
 * with its name and URL; "" when there is none. What a failed test appends
 * to its error (see `server_logs.ts`), so that a CI log alone says what the
 * servers saw.
 *
 * @param since A mark from {@linkcode serverLogMark}.
 * @param lines How many lines of each log.
 * @returns The tails, or "".
 *
 * @example
 * ```ts ignore
 * console.error(serverLogs(serverLogMark(), 10));
 * ```
 */
export function serverLogs(since: number, lines = 15): string {
  return [
    ...disposedTails.filter((d) => d.mark >= since).map((d) => d.text),
    ...[...liveServers].map((s) => serverTail(s, lines)),
  ].join("");
}

function readTail(file: string): string {
  try {
    const text = fs.readFileSync(file, "utf8");
    return text.length > LOG_TAIL ? "…" + text.slice(-LOG_TAIL) : text;
  } catch {
    return "";
  }
}

/**
 * Sends `SIGSTOP` to a process: it stays alive with its sockets open but
 * answers nothing, like a server stuck in a long GC pause or a frozen VM. The
 * signal is sent before this returns; the promise resolves once Linux reports
 * the process stopped.
 *
 * @param pid The process to freeze.
 * @returns A promise that resolves when the process is stopped; it never
 * rejects.
 * @throws {Error} When the process does not exist.
 *
 * @example Freeze and thaw a process
 * ```ts ignore
 * await pauseProcess(ns.pid);
 * await resumeProcess(ns.pid);
 * ```
 */
export function pauseProcess(pid: number): Promise<void> {
  process.kill(pid, "SIGSTOP");
  return waitForStopState(pid, true);
}

/**
 * Sends `SIGCONT` to a process stopped by {@linkcode pauseProcess}. The
 * signal is sent before this returns; the promise resolves once the process
 * runs again.
 *
 * @param pid The process to thaw.
 * @returns A promise that resolves when the process runs; it never rejects.
 * @throws {Error} When the process does not exist.
 *
 * @example Freeze and thaw a process
 * ```ts ignore
 * await pauseProcess(ns.pid);
 * await resumeProcess(ns.pid);
 * ```
 */
export function resumeProcess(pid: number): Promise<void> {
  process.kill(pid, "SIGCONT");
  return waitForStopState(pid, false);
}

/**
 * One `nats-server` process listening on 127.0.0.1, with JetStream by
 * default. Create it with {@linkcode NatsServer.start}; dispose of it with
 * `await using` or {@linkcode NatsServer[Symbol.asyncDispose]}.
 *
 * @example Restart a server under a connected client
 * ```ts ignore
 * await using ns = await NatsServer.start();
 * const nc = await connect({ servers: ns.url, maxReconnectAttempts: -1 });
 * await ns.kill();
 * await ns.restart(); // the client reconnects to the same port
 * ```
 */
export class NatsServer {
  /** The `nats-server` executable this server runs (a restart may change it). */
  get binary(): string {
    return this.#binary;
  }
  /** Version of {@linkcode NatsServer.binary}, e.g. `"2.15.2"`. */
  get version(): string {
    return this.#version;
  }
  /** Client port on 127.0.0.1; unchanged across restarts. */
  readonly port: number;
  /** Client URL, `nats://127.0.0.1:PORT`. */
  readonly url: string;
  /** Monitoring URL, `http://127.0.0.1:PORT` (serves `/varz`, `/jsz`...). */
  readonly httpUrl: string;
  /** WebSocket URL `ws://127.0.0.1:PORT` when started with `websocket`. */
  readonly wsUrl: string | undefined;
  /** JetStream `store_dir` (the server keeps its data in `jetstream/` below). */
  readonly storeDir: string;
  /** Private temp directory holding the config, log and ports file. */
  readonly dir: string;
  /** Path of the server's config file. */
  readonly configFile: string;
  /** Path of the file receiving the server's stdout and stderr. */
  readonly logFile: string;

  #binary: string;
  #version: string;
  #proc: Proc;
  #options: NatsServerOptions;
  #ownsStoreDir: boolean;
  #paused = false;
  #disposed = false;

  private constructor(
    init: {
      binary: string;
      version: string;
      ports: Ports;
      dir: string;
      storeDir: string;
      ownsStoreDir: boolean;
      proc: Proc;
      options: NatsServerOptions;
    },
  ) {
    this.#binary = init.binary;
    this.#version = init.version;
    this.port = init.ports.client;
    this.url = `nats://127.0.0.1:${init.ports.client}`;
    this.httpUrl = `http://127.0.0.1:${init.ports.http}`;
    this.wsUrl = init.ports.ws === undefined
      ? undefined
      : `ws://127.0.0.1:${init.ports.ws}`;
    this.dir = init.dir;
    this.storeDir = init.storeDir;
    this.configFile = path.join(init.dir, "server.conf");
    this.logFile = path.join(init.dir, "server.log");
    this.#ownsStoreDir = init.ownsStoreDir;
    this.#proc = init.proc;
    this.#options = init.options;
    liveServers.add(this);
    liveServers.add(this);
  }

  /**
   * Writes a config to a new temp directory, spawns `nats-server` and waits
   * until its client port accepts TCP connections.
   *
   * @param options How to configure the server.
   * @returns The running server.
   * @throws {Error} When no binary is found, or the server exits or does not
   * listen within `startTimeout`; the message includes the server's log.
   *
   * @example Start a server with WebSocket
   * ```ts ignore
   * await using ns = await NatsServer.start({ websocket: true });
   * console.log(ns.url, ns.wsUrl, ns.version);
   * ```
   */
  static async start(options: NatsServerOptions = {}): Promise<NatsServer> {
    const binary = options.binary ?? natsServerBinary();
    const version = binaryVersion(binary);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "nats-server-"));
    const ownsStoreDir = options.storeDir === undefined;
    const storeDir = options.storeDir ?? path.join(dir, "store");
    const random: Ports = { client: -1, http: -1 };
    if (options.websocket === true) random.ws = -1;
    try {
      fs.writeFileSync(
        path.join(dir, "server.conf"),
        renderConfig(options, random, dir, storeDir),
      );
      const { proc, ports } = await launch(binary, dir, options);
      return new NatsServer({
        binary,
        version,
        ports,
        dir,
        storeDir,
        ownsStoreDir,
        proc,
        options,
      });
    } catch (error) {
      fs.rmSync(dir, { recursive: true, force: true });
      throw error;
    }
  }

  /** Process id of the current server process (changes on restart). */
  get pid(): number {
    return this.#proc.pid;
  }

  /** Whether the current process is still alive (possibly paused). */
  get running(): boolean {
    return !this.#proc.exited;
  }

  /** Whether the process is stopped by {@linkcode NatsServer.pause}. */
  get paused(): boolean {
    return this.#paused && this.running;
  }

  /**
   * Kills the server with `SIGKILL`, like a crash, and waits for it to exit.
   * Does nothing when it has already exited.
   *
   * @throws {Error} When the process is still alive 10 s later.
   *
   * @example Crash the server
   * ```ts ignore
   * await ns.kill();
   * ```
   */
  async kill(): Promise<void> {
    await this.#proc.kill();
    this.#paused = false;
  }

  /**
   * Stops the server with `SIGTERM` (a clean shutdown that flushes
   * JetStream), then `SIGKILL` if it has not exited after two seconds.
   *
   * @example Shut the server down cleanly
   * ```ts ignore
   * await ns.stop();
   * ```
   */
  async stop(): Promise<void> {
    const proc = this.#proc;
    proc.signal("SIGTERM");
    // A stopped process only acts on SIGTERM once continued.
    if (this.#paused) proc.signal("SIGCONT");
    if (!(await proc.waitForExit(STOP_GRACE))) await proc.kill();
    this.#paused = false;
  }

  /**
   * Restarts the server on the same ports and `store_dir`. A running server
   * is killed first (`SIGKILL`); call {@linkcode NatsServer.stop} before for a
   * clean shutdown. The object is reused: it returns `this` with a new
   * {@linkcode NatsServer.pid}.
   *
   * @param options `binary`: run another `nats-server` executable from now
   * on (an upgrade or a rollback on the same store), which
   * {@linkcode NatsServer.binary} and {@linkcode NatsServer.version} then
   * name.
   * @returns This server, running again.
   * @throws {Error} When the server has been disposed, `binary` cannot be
   * run, or the server does not come back within `startTimeout`.
   *
   * @example Crash and restart
   * ```ts ignore
   * await ns.kill();
   * await ns.restart();
   * ```
   *
   * @example Roll back to an older release on the same store
   * ```ts ignore
   * await ns.stop();
   * await ns.restart({ binary: ".tools/bin/nats-server-2.10.22" });
   * console.log(ns.version); // "2.10.22"
   * ```
   */
  async restart(options: { binary?: string } = {}): Promise<NatsServer> {
    if (this.#disposed) {
      throw new Error(
        `Cannot restart nats-server on port ${this.port} as it has been disposed`,
      );
    }
    if (options.binary !== undefined) {
      // Checked before the running server is touched.
      const version = binaryVersion(options.binary);
      this.#binary = options.binary;
      this.#version = version;
    }
    await this.kill();
    // Its ports are fixed now, and while it was down any socket could take
    // one of them: an outgoing connection's ephemeral source port (the other
    // servers keep dialling its route port) comes from the same range. Such
    // a connection is short-lived: try again for a while.
    let proc: Proc;
    for (let attempt = 1;; attempt++) {
      try {
        ({ proc } = await launch(this.binary, this.dir, this.#options));
        break;
      } catch (err) {
        if (attempt >= 25 || !/address already in use/.test(String(err))) {
          throw err;
        }
        await delay(200);
      }
    }
    this.#proc = proc;
    this.#paused = false;
    return this;
  }

  /**
   * Freezes the server with `SIGSTOP`: connections stay open but nothing is
   * answered, so clients see timeouts rather than disconnects. The signal is
   * sent before this returns, so it may be called without `await`; the
   * promise resolves once the process is stopped and never rejects. Does
   * nothing when the server is not running.
   *
   * @returns A promise that resolves when the process is stopped.
   *
   * @example Freeze the server for a second
   * ```ts ignore
   * await ns.pause();
   * await new Promise((r) => setTimeout(r, 1000));
   * await ns.resume();
   * ```
   */
  pause(): Promise<void> {
    if (!this.running) return Promise.resolve();
    this.#paused = true;
    this.#proc.signal("SIGSTOP");
    return waitForStopState(this.pid, true);
  }

  /**
   * Thaws a server frozen by {@linkcode NatsServer.pause} with `SIGCONT`. Like
   * `pause()`, the signal is sent before this returns and the promise never
   * rejects. Does nothing when the server is not running.
   *
   * @returns A promise that resolves when the process runs again.
   *
   * @example Freeze the server for a second
   * ```ts ignore
   * await ns.pause();
   * await new Promise((r) => setTimeout(r, 1000));
   * await ns.resume();
   * ```
   */
  resume(): Promise<void> {
    if (!this.running) return Promise.resolve();
    this.#paused = false;
    this.#proc.signal("SIGCONT");
    return waitForStopState(this.pid, false);
  }

  /**
   * Kills the server and deletes its temp directory (and its `store_dir`
   * unless the caller supplied it). Safe to call twice.
   *
   * @example Dispose explicitly
   * ```ts ignore
   * await ns[Symbol.asyncDispose]();
   * ```
   */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    liveServers.delete(this);
    await this.kill();
    disposedTails.push({ mark: logMark, text: serverTail(this, 15) });
    if (disposedTails.length > 12) disposedTails.shift();
    fs.rmSync(this.dir, { recursive: true, force: true });
    if (this.#ownsStoreDir) {
      fs.rmSync(this.storeDir, { recursive: true, force: true });
    }
  }
}

function renderConfig(
  options: NatsServerOptions,
  ports: Ports,
  dir: string,
  storeDir: string,
): string {
  const lines = [
    `host: "127.0.0.1"`,
    `port: ${ports.client}`,
    `http: "127.0.0.1:${ports.http}"`,
    `ports_file_dir: ${JSON.stringify(dir)}`,
  ];
  if (options.jetstream !== false) {
    const domain = options.domain === undefined
      ? ""
      : `, domain: ${JSON.stringify(options.domain)}`;
    lines.push(
      `jetstream { store_dir: ${JSON.stringify(storeDir)}${domain} }`,
    );
  }
  if (ports.ws !== undefined) {
    lines.push(
      `websocket { host: "127.0.0.1", port: ${ports.ws}, no_tls: true }`,
    );
  }
  if (options.extraConfig !== undefined) lines.push(options.extraConfig);
  return lines.join("\n") + "\n";
}

/**
 * Spawns the server on the config in `dir`, waits for its ports file and its
 * client port, then pins the reported ports into the config so that later
 * launches reuse them.
 */
async function launch(
  binary: string,
  dir: string,
  options: NatsServerOptions,
): Promise<{ proc: Proc; ports: Ports }> {
  const configFile = path.join(dir, "server.conf");
  const logFile = path.join(dir, "server.log");
  const log = fs.openSync(logFile, "a");
  let proc: Proc;
  try {
    proc = new Proc(
      spawn(binary, ["-c", configFile], { stdio: ["ignore", log, log] }),
    );
  } finally {
    // The child holds its own copy of the descriptor.
    fs.closeSync(log);
  }

  const timeout = options.startTimeout ?? DEFAULT_START_TIMEOUT;
  const deadline = performance.now() + timeout;
  const fail = async (why: string): Promise<never> => {
    await proc.kill().catch(() => {});
    const tail = readTail(logFile);
    throw new Error(
      `Cannot start nats-server '${binary}' with config '${configFile}' as ${why}.\n` +
        `--- config ---\n${readTail(configFile)}` +
        `--- server output ---\n${tail === "" ? "(none)\n" : tail}`,
      proc.spawnError === undefined ? undefined : { cause: proc.spawnError },
    );
  };
  const exitedEarly = (): string =>
    proc.spawnError !== undefined
      ? `it could not be spawned: ${proc.spawnError.message}`
      : `it exited during startup (code ${proc.exitCode}, signal ${proc.exitSignal})`;

  // Named after the executable's file name (a build kept as
  // `nats-server-2.10.22` writes `nats-server-2.10.22_<pid>.ports`).
  const portsFile = path.join(
    dir,
    `${path.basename(binary)}_${proc.pid}.ports`,
  );
  let ports: Ports | undefined;
  while (ports === undefined) {
    if (proc.exited || proc.spawnError !== undefined) {
      return await fail(exitedEarly());
    }
    if (performance.now() > deadline) {
      return await fail(`it wrote no ports file within ${timeout} ms`);
    }
    try {
      const parsed = JSON.parse(fs.readFileSync(portsFile, "utf8"));
      const client = portOf(parsed.nats);
      const http = portOf(parsed.monitoring);
      if (client !== undefined && http !== undefined) {
        ports = { client, http };
        const ws = portOf(parsed.websocket);
        if (ws !== undefined) ports.ws = ws;
      }
    } catch {
      // Not written yet, or caught half-written.
    }
    if (ports === undefined) await delay(20);
  }

  while (!(await canConnect(ports.client))) {
    if (proc.exited) return await fail(exitedEarly());
    if (performance.now() > deadline) {
      return await fail(
        `port ${ports.client} accepted no connection within ${timeout} ms`,
      );
    }
    await delay(20);
  }

  const config = fs.readFileSync(configFile, "utf8")
    .replace(/^port: -1$/m, `port: ${ports.client}`)
    .replace(/^http: "127\.0\.0\.1:-1"$/m, `http: "127.0.0.1:${ports.http}"`)
    .replace(
      /(websocket \{ host: "127\.0\.0\.1", port: )-1\b/,
      `$1${ports.ws}`,
    );
  fs.writeFileSync(configFile, config);
  fs.rmSync(portsFile, { force: true });
  return { proc, ports };
}

/**
 * The parts of a `/jsz?streams=true` reply the cluster reads, checked against
 * 2.9.10 and 2.15.2, which agree on them: `meta_cluster.leader` is the
 * leader's `server_name` and is absent before an election. 2.9.10 lists
 * `meta_cluster.replicas` on the leader only; 2.15 lists them everywhere,
 * but a follower's list shows the other followers as not current, so only
 * the leader's list is read. Streams come under
 * `account_details[].stream_detail[]` with `streams=true` alone
 * (`accounts=true` changes nothing), each server listing only the streams
 * it hosts a replica of, with `cluster.leader` as a server name.
 */
interface Jsz {
  meta_cluster?: {
    leader?: string;
    cluster_size?: number;
    replicas?: { name: string; current?: boolean }[];
  };
  account_details?: {
    stream_detail?: { name: string; cluster?: { leader?: string } }[];
  }[];
}

/**
 * A cluster of `nats-server` processes on loopback with JetStream, named
 * `n0`, `n1`... after their index in {@linkcode NatsCluster.servers}. Create it
 * with {@linkcode NatsCluster.start}.
 *
 * @example Kill the leader of a replicated KV bucket
 * ```ts ignore
 * await using cluster = await NatsCluster.start(3);
 * const nc = await connect({ servers: cluster.urls, maxReconnectAttempts: -1 });
 * const kv = await new Kvm(nc).create("b", { replicas: 3 });
 * const leader = await cluster.streamLeader("KV_b");
 * if (leader !== undefined) await cluster.kill(leader);
 * ```
 */
export class NatsCluster {
  /** The servers, index `i` named `n{i}`. */
  readonly servers: readonly NatsServer[];
  /** Cluster name. */
  readonly name: string;
  #disposed = false;

  private constructor(name: string, servers: NatsServer[]) {
    this.name = name;
    this.servers = servers;
  }

  /**
   * Starts `n` servers with routes to each other and waits until the
   * JetStream meta group has a leader that sees every peer as current, so an
   * R`n` stream can be created right away.
   *
   * @param n Number of servers.
   * @param options How to configure every server.
   * @returns The running cluster.
   * @throws {RangeError} When `n` is not a positive integer, or `binaries`
   * has more than `n` entries.
   * @throws {Error} When a server fails to start or no meta leader is
   * elected within `leaderTimeout`.
   *
   * @example Start three servers
   * ```ts ignore
   * await using cluster = await NatsCluster.start(3);
   * console.log(cluster.urls, await cluster.metaLeader());
   * ```
   */
  static async start(
    n = 3,
    options: NatsClusterOptions = {},
  ): Promise<NatsCluster> {
    if (!Number.isInteger(n) || n < 1) {
      throw new RangeError(
        `Cannot start cluster as 'n' must be a positive integer: received ${n}`,
      );
    }
    const { binaries } = options;
    if (binaries !== undefined && binaries.length > n) {
      throw new RangeError(
        `Cannot start cluster as 'binaries' names more servers than 'n': received ${binaries.length} binaries for ${n} servers`,
      );
    }
    const name = options.name ?? "nats-lease";
    // A route port is free when picked but not yet bound, so one server's
    // random client port can take another's route port first: start again
    // on new ports when that happens.
    for (let attempt = 1;; attempt++) {
      try {
        return await NatsCluster.#startOnce(n, name, options);
      } catch (err) {
        if (attempt >= 3 || !/address already in use/.test(String(err))) {
          throw err;
        }
      }
    }
  }

  static async #startOnce(
    n: number,
    name: string,
    options: NatsClusterOptions,
  ): Promise<NatsCluster> {
    const { name: _name, leaderTimeout, binaries, ...serverOptions } = options;
    // Routes name every peer's cluster port, so those ports must be known
    // before any server starts; client and monitoring ports stay random.
    const routePorts: number[] = [];
    while (routePorts.length < n) {
      const port = await freePort();
      if (!routePorts.includes(port)) routePorts.push(port);
    }
    const routes = routePorts.map((p) => `"nats-route://127.0.0.1:${p}"`);
    const started = await Promise.allSettled(
      routePorts.map((port, i) =>
        NatsServer.start({
          ...serverOptions,
          ...(binaries?.[i] === undefined ? {} : { binary: binaries[i] }),
          jetstream: true,
          extraConfig: [
            `server_name: "n${i}"`,
            `cluster {`,
            `  name: ${JSON.stringify(name)}`,
            `  listen: "127.0.0.1:${port}"`,
            `  routes: [${routes.join(", ")}]`,
            `}`,
            options.extraConfig ?? "",
          ].join("\n"),
        })
      ),
    );
    const servers = started.flatMap((r) =>
      r.status === "fulfilled" ? [r.value] : []
    );
    const cluster = new NatsCluster(name, servers);
    const failed = started.find((r) => r.status === "rejected");
    if (failed !== undefined) {
      await cluster[Symbol.asyncDispose]();
      throw failed.reason;
    }
    try {
      await cluster.waitForMetaLeader(leaderTimeout ?? DEFAULT_LEADER_TIMEOUT);
    } catch (error) {
      await cluster[Symbol.asyncDispose]();
      throw error;
    }
    return cluster;
  }

  /** Client URLs of all servers, in index order. */
  get urls(): string[] {
    return this.servers.map((s) => s.url);
  }

  #server(i: number): NatsServer {
    const server = this.servers[i];
    if (server === undefined) {
      throw new RangeError(
        `Cannot select cluster server as 'i' must be an index below ${this.servers.length}: received ${i}`,
      );
    }
    return server;
  }

  /**
   * Kills server `i` with `SIGKILL`.
   *
   * @param i Index of the server.
   * @throws {RangeError} When `i` is out of range.
   *
   * @example Crash the second server
   * ```ts ignore
   * await cluster.kill(1);
   * ```
   */
  async kill(i: number): Promise<void> {
    await this.#server(i).kill();
  }

  /**
   * Restarts server `i` on its old ports and `store_dir`; it rejoins the
   * cluster through its routes.
   *
   * @param i Index of the server.
   * @returns The restarted server.
   * @throws {RangeError} When `i` is out of range.
   *
   * @example Bring the second server back
   * ```ts ignore
   * await cluster.restart(1);
   * ```
   */
  restart(i: number): Promise<NatsServer> {
    return this.#server(i).restart();
  }

  /**
   * Freezes server `i` with `SIGSTOP`; see {@linkcode NatsServer.pause}.
   *
   * @param i Index of the server.
   * @returns A promise that resolves when the process is stopped.
   * @throws {RangeError} When `i` is out of range.
   *
   * @example Freeze and thaw the first server
   * ```ts ignore
   * await cluster.pause(0);
   * await cluster.resume(0);
   * ```
   */
  pause(i: number): Promise<void> {
    return this.#server(i).pause();
  }

  /**
   * Thaws server `i` with `SIGCONT`; see {@linkcode NatsServer.resume}.
   *
   * @param i Index of the server.
   * @returns A promise that resolves when the process runs again.
   * @throws {RangeError} When `i` is out of range.
   *
   * @example Freeze and thaw the first server
   * ```ts ignore
   * await cluster.pause(0);
   * await cluster.resume(0);
   * ```
   */
  resume(i: number): Promise<void> {
    return this.#server(i).resume();
  }

  /**
   * Fetches `/jsz` (with stream details) from every server that is running
   * and not paused; a paused server would never answer.
   */
  async #jsz(): Promise<(Jsz | undefined)[]> {
    return await Promise.all(this.servers.map(async (s) => {
      if (!s.running || s.paused) return undefined;
      try {
        const res = await fetch(`${s.httpUrl}/jsz?streams=true`, {
          signal: AbortSignal.timeout(2_000),
        });
        if (!res.ok) {
          await res.body?.cancel();
          return undefined;
        }
        return await res.json() as Jsz;
      } catch {
        return undefined;
      }
    }));
  }

  /**
   * Finds the server leading a stream. Only a server's own claim counts: a
   * follower may still name a leader that has just died.
   *
   * @param stream Stream name, e.g. `"KV_mybucket"` for KV bucket `mybucket`.
   * @returns Index of the leader, or `undefined` when no running server
   * leads the stream (e.g. during an election).
   *
   * @example Find a bucket's leader
   * ```ts ignore
   * const i = await cluster.streamLeader("KV_leases");
   * ```
   */
  async streamLeader(stream: string): Promise<number | undefined> {
    const replies = await this.#jsz();
    const i = replies.findIndex((jsz, i) =>
      jsz?.account_details?.some((account) =>
        account.stream_detail?.some((s) =>
          s.name === stream && s.cluster?.leader === `n${i}`
        )
      ) ?? false
    );
    return i === -1 ? undefined : i;
  }

  /**
   * Finds the JetStream meta leader, by the same rule as
   * {@linkcode NatsCluster.streamLeader}.
   *
   * @returns Index of the meta leader, or `undefined` when none.
   *
   * @example Find the meta leader
   * ```ts ignore
   * const i = await cluster.metaLeader();
   * ```
   */
  async metaLeader(): Promise<number | undefined> {
    const replies = await this.#jsz();
    const i = replies.findIndex((jsz, i) =>
      jsz?.meta_cluster?.leader === `n${i}`
    );
    return i === -1 ? undefined : i;
  }

  /**
   * Waits until a meta leader is elected that every running server agrees
   * on and that sees every running peer as current. Both 2.9.10 and 2.15
   * report `meta_cluster.leader` by server name; only the leader lists
   * `meta_cluster.replicas`.
   *
   * @param timeout Milliseconds to wait.
   * @returns Index of the meta leader.
   * @throws {Error} When no such leader appears in time.
   *
   * @example Wait after restarting a server
   * ```ts ignore
   * await cluster.restart(0);
   * await cluster.waitForMetaLeader();
   * ```
   */
  async waitForMetaLeader(
    timeout: number = DEFAULT_LEADER_TIMEOUT,
  ): Promise<number> {
    const deadline = performance.now() + timeout;
    let last: (Jsz | undefined)[] = [];
    while (performance.now() < deadline) {
      last = await this.#jsz();
      const up = this.servers.flatMap((s, i) =>
        s.running && !s.paused ? [`n${i}`] : []
      );
      const leader = last.findIndex((jsz, i) =>
        jsz?.meta_cluster?.leader === `n${i}`
      );
      const agreed = last.every((jsz, i) =>
        !up.includes(`n${i}`) || jsz?.meta_cluster?.leader === `n${leader}`
      );
      const replicas = last[leader]?.meta_cluster?.replicas ?? [];
      const current = up.every((name) =>
        name === `n${leader}` ||
        replicas.some((r) => r.name === name && r.current === true)
      );
      if (leader !== -1 && agreed && current) return leader;
      await delay(100);
    }
    const logs = this.servers
      .map((s, i) => `--- n${i} (${s.url}) ---\n${readTail(s.logFile)}`)
      .join("");
    throw new Error(
      `Cannot find a JetStream meta leader in cluster '${this.name}' within ${timeout} ms; last meta_cluster per server: ${
        JSON.stringify(last.map((j) => j?.meta_cluster ?? null))
      }\n${logs}`,
    );
  }

  /**
   * Kills every server and deletes their temp directories. Safe to call
   * twice.
   *
   * @example Dispose explicitly
   * ```ts ignore
   * await cluster[Symbol.asyncDispose]();
   * ```
   */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    await Promise.all(this.servers.map((s) => s[Symbol.asyncDispose]()));
  }
}
