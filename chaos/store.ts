/**
 * The fenced store of the chaos harness: the "database" the workers' guarded
 * writes go to. It lives in the harness process and speaks HTTP on
 * 127.0.0.1, so no NATS fault reaches it.
 *
 * A write is two requests, so that it has a duration the store can see:
 * - `POST /begin {key, node, proc, epoch, called, start}` opens it;
 * - `POST /commit {id, end}` closes it.
 *
 * Both are fenced: refused when the epoch is older than the newest epoch the
 * store has accepted for the key (a `begin` that passes raises the newest
 * epoch). So a holder that froze mid-write and wakes after a successor
 * began has its commit refused. Every request gets the next number of one
 * sequence, which orders the history exactly (see `check.ts`).
 *
 * @module
 */

import * as http from "node:http";
import type { AddressInfo } from "node:net";
import type { WriteRecord } from "./check.ts";

const encoder = new TextEncoder();

/** What `POST /begin` carries. */
export interface BeginRequest {
  /** The store key. */
  key: string;
  /** The writer's lease node id. */
  node: string;
  /** The writing process (see `WriteRecord.proc`). */
  proc: string;
  /** The fencing epoch from the lease. */
  epoch: number;
  /** Worker clock: when `guard()` was called. */
  called: number;
  /** Worker clock: when the write started. */
  start: number;
}

/** The store's answer to a request. */
export interface StoreReply {
  /** Accepted. */
  ok: boolean;
  /** The write's id (for `begin`). */
  id?: number;
  /** Why it was refused. */
  reason?: string;
}

/** The fenced store: fences by epoch and records every write. */
export class FencedStore {
  /** Every write, in order of its `begin`. */
  readonly writes: WriteRecord[] = [];
  #seq = 0;
  readonly #newest = new Map<string, number>();
  readonly #open = new Map<number, WriteRecord>();
  readonly #last = new Map<string, WriteRecord>();

  /**
   * Opens a write, unless its epoch is older than the newest accepted one.
   *
   * @param req The write.
   * @returns The verdict and the write's id.
   */
  begin(req: BeginRequest): StoreReply {
    const seq = ++this.#seq;
    const at = Date.now();
    const newest = this.#newest.get(req.key) ?? 0;
    const ok = req.epoch >= newest;
    const w: WriteRecord = {
      id: this.writes.length + 1,
      key: req.key,
      node: req.node,
      proc: req.proc,
      epoch: req.epoch,
      called: req.called,
      start: req.start,
      end: undefined,
      beginSeq: seq,
      beginAt: at,
      endSeq: seq,
      endAt: at,
      status: ok ? "unfinished" : "rejected-begin",
      reason: ok ? undefined : `epoch ${req.epoch} is older than ${newest}`,
    };
    this.writes.push(w);
    if (!ok) return { ok, id: w.id, reason: w.reason! };
    this.#newest.set(req.key, req.epoch);
    this.#open.set(w.id, w);
    this.#last.set(req.key, w);
    return { ok, id: w.id };
  }

  /**
   * Closes a write: accepted unless a newer epoch began meanwhile.
   *
   * @param id The write's id from `begin`.
   * @param end Worker clock when the commit was sent.
   * @returns The verdict.
   */
  commit(id: number, end: number): StoreReply {
    const w = this.#open.get(id);
    if (!w) return { ok: false, reason: `no open write ${id}` };
    this.#open.delete(id);
    w.endSeq = ++this.#seq;
    w.endAt = Date.now();
    w.end = end;
    const newest = this.#newest.get(w.key) ?? 0;
    if (w.epoch < newest) {
      w.status = "rejected-commit";
      w.reason = `epoch ${newest} began while epoch ${w.epoch} was writing`;
      return { ok: false, reason: w.reason };
    }
    w.status = "accepted";
    return { ok: true };
  }

  /**
   * Ends the open writes of a process that will never commit (it was
   * killed, or the run is over).
   *
   * @param proc The process, or `undefined` for every process.
   * @param reason Why.
   */
  abandon(proc: string | undefined, reason: string): void {
    for (const [id, w] of this.#open) {
      if (proc !== undefined && w.proc !== proc) continue;
      this.#open.delete(id);
      w.endSeq = ++this.#seq;
      w.endAt = Date.now();
      w.reason = reason;
    }
  }

  /**
   * The last write begun on `key` (accepted at begin), if any.
   *
   * @param key The store key.
   * @returns The write.
   */
  last(key: string): WriteRecord | undefined {
    return this.#last.get(key);
  }

  /**
   * The writes open now.
   *
   * @returns Them, oldest first.
   */
  open(): WriteRecord[] {
    return [...this.#open.values()];
  }
}

/**
 * Serves `store` over HTTP on a random port of 127.0.0.1.
 *
 * @param store The store.
 * @returns The base URL and a function that stops the server.
 */
export async function serveStore(
  store: FencedStore,
): Promise<{ url: string; close: () => Promise<void> }> {
  const server = http.createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (d: string) => body += d);
    req.on("end", () => {
      let reply: StoreReply;
      let status = 200;
      try {
        const input = JSON.parse(body);
        if (req.method === "POST" && req.url === "/begin") {
          reply = store.begin(input as BeginRequest);
        } else if (req.method === "POST" && req.url === "/hello") {
          // Lets a worker open its connection before its first write.
          reply = { ok: true };
        } else if (req.method === "POST" && req.url === "/commit") {
          reply = store.commit(Number(input.id), Number(input.end));
        } else {
          status = 404;
          reply = { ok: false, reason: `no route ${req.method} ${req.url}` };
        }
      } catch (err) {
        status = 400;
        reply = { ok: false, reason: String(err) };
      }
      const text = JSON.stringify(reply);
      res.writeHead(status, {
        "content-type": "application/json",
        "content-length": encoder.encode(text).length,
      });
      res.end(text);
    });
  });
  // Workers keep their connections open between writes.
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen({ host: "127.0.0.1", port: 0 }, resolve);
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections?.();
        server.close(() => resolve());
      }),
  };
}
