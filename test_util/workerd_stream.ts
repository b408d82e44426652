/**
 * A worker for `workerd_test.ts`: stateless requests that hold leases kept
 * in a stream of the user's (`createLeaseManager({ stream, leaseSubjects
 * })`, nats-server 2.11.2+) and append to that stream under them with
 * `lease.publish`, which the server itself refuses once another tenure
 * took the key.
 *
 * - `POST /stream/KEY?stream=S&lease=P&subject=SUBJ&appends=N`: as the
 *   example's `POST /fenced/KEY` (examples/workerd/worker.ts), on stream S
 *   with the leases under P: opens its own connection (named after its
 *   node) and manager, waits for KEY, appends `<node>:<epoch>` to SUBJ N
 *   times (default 1), then closes both before it answers.
 *
 * @module
 */

import { wsconnect } from "@nats-io/nats-core";
import { createLeaseManager, type LeaseAcquiredEvent } from "../mod.ts";

interface Env {
  NATS_WS_URL: string;
  LEASE_TTL?: string;
}

/** One request's appends, as `POST /stream/KEY` reports them. */
export interface StreamRecord {
  node: string;
  epoch: number;
  /** How the key was found when this request took it (`acquired`'s `found`). */
  found: string | undefined;
  /** Each append in order: the data and the stream sequence it got. */
  appends: { value: string; seq: number }[];
}

// How long a request waits for the key before it gives up.
const WAIT_MS = 10_000;
// The pause between two appends of one request.
const APPEND_MS = 20;

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const url = new URL(request.url);
    const parts = url.pathname.split("/").filter(Boolean);
    try {
      const q = url.searchParams;
      const [stream, leaseSubjects, subject] = ["stream", "lease", "subject"]
        .map((p) => q.get(p));
      if (
        parts[0] === "stream" && parts[1] && request.method === "POST" &&
        stream && leaseSubjects && subject
      ) {
        return Response.json(
          await appendOnce(env, parts[1], {
            stream,
            leaseSubjects,
            subject,
            appends: Number(q.get("appends") ?? 1),
          }),
        );
      }
      return new Response("not found\n", { status: 404 });
    } catch (err) {
      return Response.json({ error: String(err) }, { status: 500 });
    }
  },
};

async function appendOnce(
  env: Env,
  key: string,
  o: {
    stream: string;
    leaseSubjects: string;
    subject: string;
    appends: number;
  },
): Promise<StreamRecord> {
  const node = `worker-${crypto.randomUUID().slice(0, 8)}`;
  const nc = await wsconnect({
    servers: env.NATS_WS_URL.split(","),
    name: node,
  });
  try {
    const leases = await createLeaseManager({
      nc,
      node,
      stream: o.stream,
      leaseSubjects: o.leaseSubjects,
      ...(env.LEASE_TTL ? { ttl: Number(env.LEASE_TTL) } : {}),
    });
    let found: string | undefined;
    leases.addEventListener("acquired", (e: LeaseAcquiredEvent) => {
      if (e.key === key) found = e.found;
    });
    try {
      return await leases.guard(key, async (lease) => {
        const record: StreamRecord = {
          node,
          epoch: lease.epoch,
          found,
          appends: [],
        };
        for (let i = 0; i < o.appends; i++) {
          if (i > 0) await new Promise((r) => setTimeout(r, APPEND_MS));
          const value = `${node}:${lease.epoch}`;
          record.appends.push({
            value,
            seq: await lease.publish(o.subject, value),
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
