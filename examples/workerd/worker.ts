/**
 * Fenced leases in a Cloudflare Worker (workerd), over WebSocket.
 *
 * Two ways to hold a lease in workerd, because the runtime treats a
 * stateless request and a Durable Object differently:
 *
 * - `POST /write/KEY`: a stateless request opens its own connection and
 *   lease manager, does one guarded write with `wait: true`, and closes
 *   both before it answers. A connection cannot be shared between requests:
 *   workerd refuses an I/O object (the WebSocket, the manager's abort
 *   signals) made by one request when another touches it ("Cannot perform
 *   I/O on behalf of a different request").
 * - `/holder/NAME/start?key=KEY`, `/status`, `/stop`: a Durable Object
 *   ({@linkcode LeaseHolder}) that keeps one connection and campaigns for
 *   KEY across requests; the manager's own timers renew the lease while no
 *   request is in flight.
 * - `POST /fenced/KEY?data=DATA&puts=N`: a stateless request as
 *   `/write/KEY`, on a fenced bucket (`fenced: true`, nats-server 2.11.2+):
 *   under the lease it puts `<node>:<epoch>` to the data key DATA of the
 *   same bucket N times (default 1), with `lease.put`, which the server
 *   itself refuses once the tenure is over; readers read DATA with plain
 *   `@nats-io/kv`.
 *
 * The write appends two messages to the JetStream stream `LEASE_JOURNAL`
 * (subject `lease-journal.KEY`): `start` and `end`, each with the node and
 * the fencing epoch. The stream's order shows whether two writes ever
 * overlapped, and the server stamps each message's time on one clock for
 * every writer (workerd's own `Date.now()` advances only at I/O).
 *
 * Bundle it into one ES module (esbuild, `--platform=browser` so that
 * tweetnacl's optional `require("crypto")` is dropped) and run it with
 * miniflare: see `serve.ts` beside it, and docs/runtimes.md.
 *
 * @module
 */

import { type NatsConnection, wsconnect } from "@nats-io/nats-core";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  createLeaseManager,
  type Lease,
  type LeaseAcquiredEvent,
  type LeaseLostEvent,
  type LeaseManager,
} from "../../mod.ts";

/** The bindings this worker reads. */
export interface Env {
  /** The server's WebSocket URL(s), comma-separated, with scheme and port. */
  NATS_WS_URL: string;
  /** The lease bucket. @default {"leases"} */
  LEASE_BUCKET?: string;
  /** The lease TTL in ms; must match an existing bucket's. @default {15000} */
  LEASE_TTL?: string;
  /** The fenced bucket of `POST /fenced/KEY`. @default {"fenced-leases"} */
  LEASE_FENCED_BUCKET?: string;
  /** The Durable Object namespace of {@linkcode LeaseHolder}. */
  HOLDER: DurableObjectNamespace;
}

/** The parts of the Durable Object API this worker uses. */
interface DurableObjectNamespace {
  idFromName(name: string): unknown;
  get(id: unknown): { fetch(request: Request): Promise<Response> };
}

/** One guarded write, as `POST /write/KEY` reports it. */
export interface WriteRecord {
  node: string;
  epoch: number;
  /** Journal sequence of the write's `start` message. */
  startSeq: number;
  /** Journal sequence of the write's `end` message. */
  endSeq: number;
}

/** One guarded request on the fenced bucket, as `POST /fenced/KEY` reports it. */
export interface FencedRecord {
  node: string;
  epoch: number;
  /** How the key was found when this request took it (`acquired`'s `found`). */
  found: string | undefined;
  /** Each put in order: the value and the revision the server stored it at. */
  puts: { value: string; revision: number }[];
}

const JOURNAL_STREAM = "LEASE_JOURNAL";
const JOURNAL_SUBJECT = "lease-journal";
// How long a stateless request waits for the key before it gives up: a
// request must answer, and an abandoned waiter would hold a watch open.
const WAIT_MS = 10_000;
// How long the write holds the lease, so that overlapping writes would show.
const WRITE_MS = 20;

// Whether this isolate has made sure the journal stream exists. Only a
// boolean may outlive a request: a promise or connection may not.
let journalReady = false;

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const url = new URL(request.url);
    const parts = url.pathname.split("/").filter(Boolean);
    try {
      if (parts[0] === "write" && parts[1] && request.method === "POST") {
        return Response.json(await writeOnce(env, parts[1]));
      }
      if (parts[0] === "fenced" && parts[1] && request.method === "POST") {
        const data = url.searchParams.get("data");
        if (!data) throw new Error("fenced needs ?data=");
        const puts = Number(url.searchParams.get("puts") ?? 1);
        return Response.json(await fencedWrite(env, parts[1], data, puts));
      }
      if (parts[0] === "holder" && parts[1]) {
        // One Durable Object per name; it sees the path from /holder on.
        const stub = env.HOLDER.get(env.HOLDER.idFromName(parts[1]));
        return await stub.fetch(new Request(url, request));
      }
      return new Response("not found\n", { status: 404 });
    } catch (err) {
      return Response.json({ error: String(err) }, { status: 500 });
    }
  },
};

/**
 * A stateless request's write: connect, wait for the key, append to the
 * journal under the lease, then release and disconnect before answering,
 * so the next waiter gets the key at once and nothing outlives the request.
 */
async function writeOnce(env: Env, key: string): Promise<WriteRecord> {
  const nc = await wsconnect({ servers: env.NATS_WS_URL.split(",") });
  try {
    if (!journalReady) await ensureJournal(nc);
    const leases = await createLeaseManager({
      nc,
      node: `worker-${crypto.randomUUID().slice(0, 8)}`,
      ...managerOptions(env),
    });
    try {
      return await leases.guard(key, (lease) => journaledWrite(nc, lease), {
        wait: true,
        signal: AbortSignal.timeout(WAIT_MS),
      });
    } finally {
      await leases.close();
    }
  } finally {
    await nc.close();
  }
}

/**
 * A stateless request's fenced writes: as {@linkcode writeOnce}, on a fenced
 * bucket, with `lease.put` to `dataKey` of the same bucket. The server
 * stores a put only while this request's tenure of `key` is current, so a
 * put that arrives after a successor took the key is refused, whatever
 * this request believed. The connection carries the manager's session
 * (renewals, and the responder that tells waiters it is alive): both end
 * with `close()` before the request answers.
 */
async function fencedWrite(
  env: Env,
  key: string,
  dataKey: string,
  puts: number,
): Promise<FencedRecord> {
  const node = `worker-${crypto.randomUUID().slice(0, 8)}`;
  const nc = await wsconnect({
    servers: env.NATS_WS_URL.split(","),
    name: node,
  });
  try {
    const leases = await createLeaseManager({
      nc,
      node,
      fenced: true,
      bucket: env.LEASE_FENCED_BUCKET ?? "fenced-leases",
      ...(env.LEASE_TTL ? { ttl: Number(env.LEASE_TTL) } : {}),
    });
    let found: string | undefined;
    leases.addEventListener("acquired", (e: LeaseAcquiredEvent) => {
      if (e.key === key) found = e.found;
    });
    try {
      return await leases.guard(key, async (lease) => {
        const record: FencedRecord = {
          node,
          epoch: lease.epoch,
          found,
          puts: [],
        };
        for (let i = 0; i < puts; i++) {
          if (i > 0) await new Promise((r) => setTimeout(r, WRITE_MS));
          const value = `${node}:${lease.epoch}`;
          record.puts.push({
            value,
            revision: await lease.put(dataKey, value),
          });
        }
        return record;
      }, { wait: true, signal: AbortSignal.timeout(WAIT_MS) });
    } finally {
      await leases.close();
    }
  } finally {
    await nc.close();
  }
}

/**
 * A Durable Object that campaigns for one key and keeps the lease across
 * requests: one connection and one manager per object, made by `start`,
 * renewed by the manager's timers between requests, ended by `stop`.
 */
export class LeaseHolder {
  #env: Env;
  #nc: NatsConnection | undefined;
  #leases: LeaseManager | undefined;
  #campaign: AbortController | undefined;
  #key = "";
  #lease: Lease | undefined;
  #tenures: number[] = [];
  #renewals = 0;
  #lost: string[] = [];
  // A plain interval beside the manager's timers, to see whether timers run
  // while no request is in flight.
  #ticks = 0;
  #ticker: ReturnType<typeof setInterval> | undefined;

  constructor(_state: unknown, env: Env) {
    this.#env = env;
  }

  async fetch(request: Request): Promise<Response> {
    try {
      return await this.#route(request);
    } catch (err) {
      return Response.json({ error: String(err) }, { status: 500 });
    }
  }

  async #route(request: Request): Promise<Response> {
    const url = new URL(request.url);
    const action = url.pathname.split("/")[3];
    if (action === "start") {
      return Response.json(await this.#start(url.searchParams.get("key")));
    }
    if (action === "status") return Response.json(this.#status());
    if (action === "write") {
      // A write by this object's manager, under the lease it already holds.
      const leases = this.#leases;
      if (!leases || !this.#nc) throw new Error("not started");
      const nc = this.#nc;
      return Response.json(
        await leases.guard(this.#key, (lease) => journaledWrite(nc, lease), {
          wait: true,
          signal: AbortSignal.timeout(WAIT_MS),
        }),
      );
    }
    if (action === "stop") return Response.json(await this.#stop());
    return new Response("not found\n", { status: 404 });
  }

  /** Connects and campaigns for `key`; answers once the first tenure is won. */
  async #start(key: string | null): Promise<unknown> {
    if (!key) throw new Error("start needs ?key=");
    if (this.#leases) return this.#status();
    this.#key = key;
    // The object keeps its lease between requests: reconnect forever.
    this.#nc = await wsconnect({
      servers: this.#env.NATS_WS_URL.split(","),
      maxReconnectAttempts: -1,
    });
    if (!journalReady) await ensureJournal(this.#nc);
    const leases = await createLeaseManager({
      nc: this.#nc,
      node: `holder-${crypto.randomUUID().slice(0, 8)}`,
      ...managerOptions(this.#env),
    });
    this.#leases = leases;
    leases.addEventListener("renewed", () => this.#renewals++);
    leases.addEventListener("lost", (e: LeaseLostEvent) => {
      this.#lost.push(`${e.reason} at epoch ${e.epoch}`);
    });
    this.#ticker = setInterval(() => this.#ticks++, 100);
    this.#campaign = new AbortController();
    const won = Promise.withResolvers<void>();
    // The campaign outlives this request: a Durable Object may keep I/O and
    // timers across requests, which a stateless worker may not.
    (async () => {
      for await (
        const lease of leases.campaign(key, { signal: this.#campaign!.signal })
      ) {
        this.#lease = lease;
        this.#tenures.push(lease.epoch);
        won.resolve();
      }
    })().catch((err) => {
      this.#lost.push(`campaign ended: ${err}`);
      won.reject(err);
    });
    const timeout = AbortSignal.timeout(WAIT_MS);
    await Promise.race([
      won.promise,
      new Promise((_, reject) =>
        timeout.addEventListener("abort", () => reject(timeout.reason))
      ),
    ]);
    return this.#status();
  }

  #status() {
    return {
      node: this.#leases?.node,
      key: this.#key,
      leading: this.#lease !== undefined && !this.#lease.signal.aborted,
      epoch: this.#lease?.epoch,
      tenures: this.#tenures,
      renewals: this.#renewals,
      lost: this.#lost,
      ticks: this.#ticks,
      connectionClosed: this.#nc?.isClosed(),
    };
  }

  async #stop(): Promise<unknown> {
    clearInterval(this.#ticker);
    this.#campaign?.abort();
    const closed = await this.#leases?.close();
    await this.#nc?.close();
    const status = this.#status();
    this.#leases = undefined;
    this.#nc = undefined;
    return { ...status, closed };
  }
}

function managerOptions(env: Env): { bucket?: string; ttl?: number } {
  return {
    ...(env.LEASE_BUCKET ? { bucket: env.LEASE_BUCKET } : {}),
    ...(env.LEASE_TTL ? { ttl: Number(env.LEASE_TTL) } : {}),
  };
}

/** Creates the journal stream if it does not exist (idempotent). */
async function ensureJournal(nc: NatsConnection): Promise<void> {
  const jsm = await jetstreamManager(nc);
  try {
    await jsm.streams.info(JOURNAL_STREAM);
  } catch {
    await jsm.streams.add({
      name: JOURNAL_STREAM,
      subjects: [`${JOURNAL_SUBJECT}.>`],
    });
  }
  journalReady = true;
}

/**
 * The guarded write: `start` and `end` in the journal with node and epoch,
 * `WRITE_MS` apart. Each append waits for the server's acknowledgement, so
 * a write that overlapped another would leave the other's message between
 * its two.
 */
export async function journaledWrite(
  nc: NatsConnection,
  lease: Lease,
): Promise<WriteRecord> {
  const js = jetstream(nc);
  const subject = `${JOURNAL_SUBJECT}.${lease.key}`;
  const entry = (phase: string) =>
    JSON.stringify({ phase, node: lease.node, epoch: lease.epoch });
  const start = await js.publish(subject, entry("start"));
  await new Promise((resolve) => setTimeout(resolve, WRITE_MS));
  lease.throwIfLost(); // right before the commit point
  const end = await js.publish(subject, entry("end"));
  return {
    node: lease.node,
    epoch: lease.epoch,
    startSeq: start.seq,
    endSeq: end.seq,
  };
}
