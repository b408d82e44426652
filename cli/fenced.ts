/**
 * `lease` on a fenced bucket (design/fenced.md): how the command tells the
 * layout from the bucket's stream metadata, where a fenced bucket keeps its
 * tenure and session entries, and `lease put` / `lease delete`, the fenced
 * writes of a command run under `lease run`.
 *
 * Why `put` and `delete` need no session of their own (F1 of
 * lease/manager.ts): the server stores a fenced write only while the key's
 * tenure entry is still at the epoch the write names, checking and storing
 * in one step. So a command that outlives its `lease run`, or whose tenure
 * another node took over, has its writes refused by the server itself; no
 * word of the client's decides anything.
 *
 * @module
 */

import process from "node:process";
import { headers, type NatsConnection } from "@nats-io/nats-core";
import {
  jetstream,
  JetStreamApiError,
  jetstreamManager,
} from "@nats-io/jetstream";
import { conflictRevision, isNoResponders } from "../lease/_nats.ts";
import { KV_OPERATION_HDR } from "../lease/entry.ts";
import { fenceVersion } from "../lease/servers.ts";
import {
  fencedBucketTtl as fencedTtl,
  SESSION_PREFIX,
  TENURE_PREFIX,
} from "../lease/fenced.ts";
import { UnavailableError } from "../lease.ts";
import { type Args, type TenureEnv, UsageError } from "./args.ts";
import { dial, isStreamNotFound, noBucket } from "./connect.ts";
import { EXIT, say } from "./exit.ts";

export { fencedTtl, SESSION_PREFIX, TENURE_PREFIX };

/** A bucket's layout, as its stream's metadata says. */
export interface Layout {
  /** Fenced (design/fenced.md), or the classic layout. */
  readonly fenced: boolean;
  /** The lease TTL in ms: a fenced bucket's metadata, a classic one's max age. */
  readonly ttl: number;
}

/**
 * Reads the layout of `--bucket` with one stream-info request: `undefined`
 * when the bucket does not exist.
 *
 * @example
 * ```ts ignore
 * const layout = await bucketLayout(nc, a);
 * if (layout?.fenced) console.log(`fenced, TTL ${layout.ttl} ms`);
 * ```
 */
export async function bucketLayout(
  nc: NatsConnection,
  a: Pick<Args, "bucket" | "domain">,
): Promise<Layout | undefined> {
  const jsm = await jetstreamManager(nc, {
    checkAPI: false,
    ...(a.domain === undefined ? {} : { domain: a.domain }),
  });
  try {
    const si = await jsm.streams.info(`KV_${a.bucket}`);
    const ttl = fencedTtl(si.config.metadata);
    return ttl === undefined
      ? { fenced: false, ttl: Math.round(si.config.max_age / 1_000_000) }
      : { fenced: true, ttl };
  } catch (err) {
    if (isStreamNotFound(err)) return undefined;
    throw err;
  }
}

/**
 * Reads all of stdin: the value of `lease put KEY -` (and the data of
 * `lease publish SUBJECT -`).
 */
export async function readStdin(): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  for await (const c of process.stdin as AsyncIterable<Uint8Array | string>) {
    chunks.push(typeof c === "string" ? new TextEncoder().encode(c) : c);
  }
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/**
 * `lease put KEY VALUE` and `lease delete KEY`: one write to the data key
 * KEY of LEASE_BUCKET, fenced by LEASE_KEY's tenure at LEASE_EPOCH, sent
 * from a connection of its own. Prints the write's revision; resolves 0, or
 * {@linkcode EXIT}'s `NOT_HOLDER` when the server refused it because the
 * tenure is over.
 *
 * Everything that can be checked is checked before sending: the
 * environment and the key (by the parser), then the bucket's layout (a
 * classic bucket has no tenure entries to fence by: its keys are the
 * leases themselves, renewed in place) and the server's version (one
 * before 2.11 ignores the fence and checks the write's own subject).
 *
 * @example
 * ```ts ignore
 * process.exitCode = await fencedWrite(parse(["put", "orders.total", "42"]));
 * ```
 */
export async function fencedWrite(a: Args): Promise<number> {
  const t = a.tenure!;
  const data = a.sub === "delete"
    ? new Uint8Array(0)
    : a.value === "-"
    ? await readStdin()
    : new TextEncoder().encode(a.value ?? "");
  const nc = await dial(a);
  try {
    const layout = await bucketLayout(nc, a).catch((err) => {
      throw isNoResponders(err)
        ? new UnavailableError(
          a.key,
          `no JetStream answers for bucket '${a.bucket}': ${
            (err as Error).message
          }`,
          { cause: err },
        )
        : err;
    });
    if (layout === undefined) throw noBucket(a);
    if (!layout.fenced) {
      throw new UsageError(
        `bucket '${a.bucket}' is a classic lease bucket, not a fenced one: its leases have no tenure entries for the server to fence a write by (its keys are the leases themselves), so lease ${a.sub} sends nothing there (use a bucket made by lease run --fenced, or fence the write with LEASE_EPOCH in your own store)`,
      );
    }
    refuseUnfenced(nc, a.key);
    return await publishFenced(nc, a, t, data);
  } finally {
    await nc.close();
  }
}

/**
 * Throws when the server `nc` is on would ignore the fence (before 2.11),
 * so that `lease put`, `delete` and `publish` send nothing there.
 */
export function refuseUnfenced(nc: NatsConnection, key: string): void {
  const version = nc.info?.version ?? "";
  if (!fenceVersion(version)) {
    throw new UnavailableError(
      key,
      `the server runs nats-server ${
        version || "of an unknown version"
      }, which ignores the fence (it needs 2.11 or later): nothing was sent`,
    );
  }
}

/** Sends the one fenced write and says how it went. */
async function publishFenced(
  nc: NatsConnection,
  a: Args,
  t: TenureEnv,
  data: Uint8Array,
): Promise<number> {
  const at = a.domain === undefined ? {} : { domain: a.domain };
  // Through a domain, as the manager's port writes: to
  // `$JS.<domain>.API.$KV.<bucket>.<key>`, which that domain maps to the
  // bucket's subject (a bare `$KV.` subject could land in a bucket of the
  // same name in a leaf's own domain).
  const prefix = a.domain === undefined ? "" : `$JS.${a.domain}.API.`;
  const h = headers();
  if (a.sub === "delete") h.set(KV_OPERATION_HDR, "DEL");
  const js = jetstream(nc, at);
  try {
    const ack = await js.publish(`${prefix}$KV.${a.bucket}.${a.key}`, data, {
      headers: h,
      // The fence (F1): stored only while the tenure entry of LEASE_KEY is
      // still the one at LEASE_EPOCH. A retry after "no responders" is
      // safe: nothing was stored.
      expect: {
        lastSubjectSequence: t.epoch,
        lastSubjectSequenceSubject: `$KV.${a.bucket}.${TENURE_PREFIX}${t.key}`,
      },
    });
    process.stdout.write(`${ack.seq}\n`);
    return 0;
  } catch (err) {
    return refusedWrite(
      err,
      a.key,
      `write to '${a.key}'`,
      (now) =>
        `not ${
          a.sub === "delete" ? "deleted" : "stored"
        }: the tenure of '${t.key}' at epoch ${t.epoch} is over (${
          now > 0
            ? `its tenure entry is at revision ${now} now`
            : "its tenure entry moved"
        }: another node took '${t.key}', or it was released or evicted), so the server refused the write to '${a.key}'`,
    );
  }
}

/**
 * How a fenced write of `lease put`, `delete` or `publish` failed: a
 * refusal by the fence says `refused(now)` and exits NOT_HOLDER; any other
 * answer stored nothing, and no answer may have stored it, each said as an
 * {@linkcode UnavailableError}.
 */
export function refusedWrite(
  err: unknown,
  key: string,
  what: string,
  refused: (now: number) => string,
): number {
  const now = conflictRevision(err);
  if (now === undefined) {
    throw new UnavailableError(
      key,
      err instanceof JetStreamApiError
        ? `the server refused the fenced ${what} (${err.message}): nothing was stored`
        : `the fenced ${what} got no answer (${
          (err as Error).message
        }): it may or may not have been stored`,
      { cause: err },
    );
  }
  say(refused(now));
  return EXIT.NOT_HOLDER;
}
