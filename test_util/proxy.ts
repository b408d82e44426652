/**
 * A TCP proxy for the NATS protocol, for tests that need real network faults
 * between a client and a server, or between two servers of a cluster: a
 * reply that arrives too late (held server-to-client bytes), a stalled
 * connection (both directions held), or a partition of one kind of traffic
 * (frames dropped by subject).
 *
 * It splits each direction into whole protocol frames (a control line, plus
 * the payload for `PUB`, `HPUB`, `MSG`, `HMSG`, `RMSG`, `HRMSG`), so a frame is
 * either forwarded whole, held (and forwarded later, in order) or dropped
 * whole, never cut. It speaks plain text only: no TLS, and route
 * compression must be off (`compression: off` in the `cluster` block).
 *
 * Runs unchanged on Deno, Bun and Node: `node:net` only.
 *
 * @example Make the reply to a compare-and-set arrive too late
 * ```ts ignore
 * await using proxy = await NatsProxy.start(ns.port);
 * const nc = await connect({ servers: proxy.url });
 * proxy.onFrame = (f, dir) => {
 *   if (dir === "up" && f.subject === "$KV.leases.k") proxy.holdFor("down", 500);
 * };
 * ```
 *
 * @module
 */

import * as net from "node:net";

/** `"up"`: from the dialer (client) to the target; `"down"`: back. */
export type Direction = "up" | "down";

/** One protocol frame. */
export interface Frame {
  /** The operation, upper case: `PUB`, `HPUB`, `MSG`, `RMSG`, `INFO`, `PING`... */
  readonly op: string;
  /** The subject of a message frame (`PUB`, `MSG`, `RMSG`...). */
  readonly subject: string | undefined;
  /** The control line without `\r\n`. */
  readonly line: string;
  /** The whole frame as sent. */
  readonly bytes: Uint8Array;
}

/** One proxied TCP connection. */
export interface ProxiedConnection {
  /** The `name` from the dialer's `CONNECT`: a server's id on a route. */
  readonly dialerId: string | undefined;
  /** The `server_name` from the `INFO` the dialer sent (routes send one). */
  readonly dialerName: string | undefined;
  /** The `server_name` from the `INFO` the target sent. */
  readonly targetName: string | undefined;
}

/** What {@linkcode NatsProxy.onFrame} decides: forward (default) or drop. */
export type Verdict = "pass" | "drop" | void;

const PAYLOAD_OPS = new Set(["PUB", "HPUB", "MSG", "HMSG", "RMSG", "HRMSG"]);
const decoder = new TextDecoder();

function indexOfCrlf(buf: Uint8Array, from: number): number {
  for (let i = from; i + 1 < buf.length; i++) {
    if (buf[i] === 13 && buf[i + 1] === 10) return i;
  }
  return -1;
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  if (a.length === 0) return b;
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

/** Splits a byte stream into frames; keeps a partial frame for the next chunk. */
class FrameSplitter {
  #buf: Uint8Array = new Uint8Array(0);

  push(chunk: Uint8Array): Frame[] {
    this.#buf = concat(this.#buf, chunk);
    const frames: Frame[] = [];
    let at = 0;
    for (;;) {
      const eol = indexOfCrlf(this.#buf, at);
      if (eol < 0) break;
      const line = decoder.decode(this.#buf.subarray(at, eol));
      const tokens = line.trim().split(/\s+/);
      const op = (tokens[0] ?? "").toUpperCase();
      let end = eol + 2;
      let subject: string | undefined;
      if (PAYLOAD_OPS.has(op)) {
        const size = Number(tokens[tokens.length - 1]);
        end += size + 2;
        if (end > this.#buf.length) break;
        // Between servers a message may name its account first ("RMSG $G
        // subj ..."), or not, on a route pinned to one account; an account
        // name has no dot, a subject here always has one.
        subject = tokens[1];
        if (
          tokens.length > 3 && !tokens[1]!.includes(".") &&
          op !== "PUB" && op !== "HPUB"
        ) subject = tokens[2];
      }
      frames.push({
        op,
        subject,
        line,
        bytes: this.#buf.slice(at, end),
      });
      at = end;
    }
    this.#buf = this.#buf.slice(at);
    return frames;
  }
}

class Pipe implements ProxiedConnection {
  dialerId: string | undefined;
  dialerName: string | undefined;
  targetName: string | undefined;
  readonly client: net.Socket;
  readonly server: net.Socket;
  readonly #proxy: NatsProxy;
  readonly #split = { up: new FrameSplitter(), down: new FrameSplitter() };
  readonly #queued: { up: Uint8Array[]; down: Uint8Array[] } = {
    up: [],
    down: [],
  };

  constructor(proxy: NatsProxy, client: net.Socket, server: net.Socket) {
    this.#proxy = proxy;
    this.client = client;
    this.server = server;
    client.on("data", (d: Uint8Array) => this.#onData("up", d));
    server.on("data", (d: Uint8Array) => this.#onData("down", d));
    const end = () => this.destroy();
    for (const s of [client, server]) {
      s.on("error", end);
      s.on("close", end);
    }
  }

  #onData(dir: Direction, chunk: Uint8Array): void {
    for (const frame of this.#split[dir].push(chunk)) {
      if (frame.op === "CONNECT" && dir === "up") {
        try {
          const name = JSON.parse(frame.line.slice(8)).name;
          if (typeof name === "string") this.dialerId ??= name;
        } catch {
          // not JSON: leave it unknown
        }
      }
      if (frame.op === "INFO") {
        try {
          const name = JSON.parse(frame.line.slice(5)).server_name;
          // Only the first INFO names the sender; later ones gossip about
          // other servers.
          if (typeof name === "string") {
            if (dir === "up") this.dialerName ??= name;
            else this.targetName ??= name;
          }
        } catch {
          // not JSON: leave the name unknown
        }
      }
      let verdict: Verdict;
      try {
        verdict = this.#proxy.onFrame?.(frame, dir, this);
      } catch {
        verdict = "pass";
      }
      if (verdict === "drop") continue;
      if (this.#proxy.isHeld(dir) || this.#queued[dir].length > 0) {
        this.#queued[dir].push(frame.bytes);
        continue;
      }
      this.#send(dir, frame.bytes);
    }
  }

  #send(dir: Direction, bytes: Uint8Array): void {
    const to = dir === "up" ? this.server : this.client;
    if (!to.destroyed) to.write(bytes);
  }

  /** Forwards what was held in `dir`, in order, unless it is held again. */
  flush(dir: Direction): void {
    if (this.#proxy.isHeld(dir)) return;
    const q = this.#queued[dir].splice(0);
    if (q.length > 0) this.#send(dir, q.reduce(concat));
  }

  destroy(): void {
    this.client.destroy();
    this.server.destroy();
    this.#proxy.forget(this);
  }
}

/**
 * A listening proxy in front of one `host:port`. Every accepted connection
 * dials the target; bytes flow through as whole frames.
 */
export class NatsProxy {
  /** Port the proxy listens on (127.0.0.1). */
  readonly port: number;
  /** `nats://127.0.0.1:PORT`. */
  readonly url: string;
  /** Port of the target on 127.0.0.1. */
  readonly target: number;
  /**
   * Called for every frame before it is forwarded; returning `"drop"`
   * discards it. The proxy's hold state is read after this returns, so a
   * hook may start a hold that already covers the frame it is looking at.
   */
  onFrame:
    | ((frame: Frame, dir: Direction, conn: ProxiedConnection) => Verdict)
    | undefined;
  readonly #server: net.Server;
  readonly #pipes = new Set<Pipe>();
  readonly #held = { up: false, down: false };
  readonly #timers = new Set<ReturnType<typeof setTimeout>>();

  private constructor(server: net.Server, port: number, target: number) {
    this.#server = server;
    this.port = port;
    this.url = `nats://127.0.0.1:${port}`;
    this.target = target;
  }

  /**
   * Listens on a port (random unless given) and proxies to `target`.
   *
   * @param target The target port on 127.0.0.1.
   * @param port The port to listen on; 0 for a random one.
   */
  static start(target: number, port = 0): Promise<NatsProxy> {
    return new Promise((resolve, reject) => {
      let proxy: NatsProxy | undefined;
      const server = net.createServer((client) => {
        if (!proxy) return client.destroy();
        client.setNoDelay(true);
        const upstream = net.connect({ host: "127.0.0.1", port: proxy.target });
        upstream.setNoDelay(true);
        const p = proxy;
        p.#pipes.add(new Pipe(p, client, upstream));
      });
      server.once("error", reject);
      server.listen(port, "127.0.0.1", () => {
        const addr = server.address() as net.AddressInfo;
        proxy = new NatsProxy(server, addr.port, target);
        resolve(proxy);
      });
    });
  }

  /** Whether frames in `dir` are being held. */
  isHeld(dir: Direction): boolean {
    return this.#held[dir];
  }

  /** Holds every frame in `dir` (or both) until {@linkcode NatsProxy.release}. */
  hold(dir: Direction | "both"): void {
    if (dir !== "down") this.#held.up = true;
    if (dir !== "up") this.#held.down = true;
  }

  /** Forwards what was held in `dir` (or both), in order, and stops holding. */
  release(dir: Direction | "both"): void {
    if (dir !== "down") this.#held.up = false;
    if (dir !== "up") this.#held.down = false;
    for (const p of this.#pipes) {
      if (dir !== "down") p.flush("up");
      if (dir !== "up") p.flush("down");
    }
  }

  /** Holds `dir` for `ms` milliseconds, then releases it. */
  holdFor(dir: Direction | "both", ms: number): void {
    this.hold(dir);
    const t = setTimeout(() => {
      this.#timers.delete(t);
      this.release(dir);
    }, ms);
    this.#timers.add(t);
  }

  /** Closes every proxied connection (both ends see the connection drop). */
  dropConnections(): void {
    for (const p of [...this.#pipes]) p.destroy();
  }

  /** @internal */
  forget(p: Pipe): void {
    this.#pipes.delete(p);
  }

  /** Stops listening and closes every connection. Safe to call twice. */
  async close(): Promise<void> {
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    this.#held.up = this.#held.down = false;
    this.dropConnections();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }

  /** Same as {@linkcode NatsProxy.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
