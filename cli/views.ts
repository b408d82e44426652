/**
 * The read-only subcommands of `lease`: `holder`, `watch` (one key, or
 * `--prefix`/`--all`), `ls` and `shards`. They print what they read; none
 * writes to the bucket. On a fenced bucket `holder` and `watch` read the
 * tenure and session entries themselves (cli/ls.ts) rather than through a
 * lease manager, which would open a session there: a write. (`shards`
 * still does, through the manager.) Leases kept in a stream of the user's
 * (`--stream`, `--lease-subjects`) are read as a fenced bucket's are.
 *
 * @module
 */

import process from "node:process";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  type KeyRow,
  type KeysWatch,
  listKeys,
  type Place,
  watchKeys,
} from "./ls.ts";
import { UnavailableError } from "../lease.ts";
import { assignShards, memberKey, shardKey } from "../shards.ts";
import type { Args } from "./args.ts";
import { bucketFailure, dial, open } from "./connect.ts";
import { bucketLayout, type Layout } from "./fenced.ts";

function holderLine(
  a: Args,
  h: { node: string; epoch: number } | null,
): string {
  if (a.json) return JSON.stringify({ key: a.key, holder: h });
  return h === null ? `${a.key}: none` : `${a.key}: ${h.node} epoch ${h.epoch}`;
}

/**
 * A fenced bucket's line for KEY: its holder, or none; a tenure whose
 * session is over is "orphaned", with the node and epoch it was (JSON: an
 * `orphaned` field added to the classic shape).
 */
function tenureLine(a: Args, row: KeyRow | undefined): string {
  if (row?.state !== "orphaned") {
    return holderLine(
      a,
      row?.state === "held" ? { node: row.holder!, epoch: row.epoch! } : null,
    );
  }
  const was = { node: row.holder!, epoch: row.epoch! };
  return a.json
    ? JSON.stringify({ key: a.key, holder: null, orphaned: was })
    : `${a.key}: none (orphaned: ${was.node} epoch ${was.epoch}, its session is over)`;
}

/**
 * A connection, and the bucket's layout read on it (one stream-info
 * request; undefined when it cannot be read, and the manager's set-up
 * then says why). With `--stream`, no bucket to read: the leases in it
 * are fenced.
 */
async function connectLayout(
  a: Args,
): Promise<{ nc: NatsConnection; layout: Layout | undefined }> {
  const nc = await dial(a);
  if (a.stream !== undefined) return { nc, layout: { fenced: true, ttl: 0 } };
  return { nc, layout: await bucketLayout(nc, a).catch(() => undefined) };
}

/** Where the leases are: `--stream` under `--lease-subjects`, or `--bucket`. */
function placeOf(a: Args): Place {
  return a.stream !== undefined
    ? { stream: a.stream, leaseSubjects: a.leaseSubjects! }
    : a.bucket;
}

/** The one tenure row of KEY on a fenced bucket (undefined: no entry). */
async function tenureRow(
  nc: NatsConnection,
  a: Args,
): Promise<KeyRow | undefined> {
  try {
    return (await listKeys(nc, placeOf(a), a.key, a.domain, true))[0];
  } catch (err) {
    throw bucketFailure(a, err);
  }
}

/** `lease holder KEY`: one line, the holder and its epoch or none. */
export async function holder(a: Args): Promise<number> {
  const on = await connectLayout(a);
  if (on.layout?.fenced) {
    try {
      await print(tenureLine(a, await tenureRow(on.nc, a)) + "\n");
      return 0;
    } finally {
      await on.nc.close();
    }
  }
  const { nc, leases } = await open(a, {
    createBucket: false,
    node: `lease-cli-${process.pid}`,
    on,
  });
  try {
    process.stdout.write(holderLine(a, await leases.holder(a.key)) + "\n");
    return 0;
  } finally {
    await leases.close();
    await nc.close();
  }
}

/** `lease watch KEY`: the holder, then a line per change, until a signal. */
export async function watch(a: Args): Promise<number> {
  const on = await connectLayout(a);
  if (on.layout?.fenced) {
    // The holder first, as on a classic bucket (even with no entry), then
    // a line per change; the watch's first row repeats it, unprinted.
    let last = tenureLine(a, await tenureRow(on.nc, a));
    process.stdout.write(last + "\n");
    return await follow(a, on.nc, true, (row) => {
      const line = tenureLine(a, row);
      if (line !== last) process.stdout.write(line + "\n");
      last = line;
    });
  }
  const { nc, leases } = await open(a, {
    createBucket: false,
    node: `lease-cli-${process.pid}`,
    on,
  });
  const stop = new AbortController();
  const onSig = () => stop.abort();
  process.on("SIGINT", onSig);
  process.on("SIGTERM", onSig);
  try {
    for await (const h of leases.watch(a.key, { signal: stop.signal })) {
      process.stdout.write(holderLine(a, h) + "\n");
    }
    return 0;
  } finally {
    process.off("SIGINT", onSig);
    process.off("SIGTERM", onSig);
    await leases.close();
    await nc.close();
  }
}

/**
 * Writes to stdout and resolves once it is handed on: `main()`'s caller
 * exits the process at once, which would cut a long listing short on a
 * pipe (Node writes to pipes asynchronously).
 */
function print(text: string): Promise<void> {
  return new Promise((resolve, reject) =>
    process.stdout.write(text, (err) => err ? reject(err) : resolve())
  );
}

/** A duration for the table: `850ms`, `12.3s`, `4m05s`. */
function ago(ms: number): string {
  const sign = ms < 0 ? "-" : "";
  const v = Math.abs(ms);
  if (v < 1_000) return `${sign}${v}ms`;
  if (v < 60_000) return `${sign}${(v / 1_000).toFixed(1)}s`;
  const s = Math.floor(v / 1_000);
  return `${sign}${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
}

/** `lease ls`: every key (below --prefix), one pass over the stream. */
export async function ls(a: Args): Promise<number> {
  const nc = await dial(a);
  try {
    let rows: KeyRow[];
    try {
      rows = await listKeys(nc, placeOf(a), a.prefix, a.domain);
    } catch (err) {
      throw bucketFailure(a, err);
    }
    if (a.json) {
      await print(
        rows.map((r) =>
          JSON.stringify({
            key: r.key,
            holder: r.holder,
            epoch: r.epoch,
            revision: r.revision,
            renewedAgoMs: r.renewedAgoMs,
            expiresInMs: r.expiresInMs,
            state: r.state,
            // Fenced buckets: the session the tenure entry names.
            ...(r.session === undefined ? {} : { session: r.session }),
          }) + "\n"
        ).join(""),
      );
      return 0;
    }
    const table = [
      ["KEY", "STATE", "HOLDER", "EPOCH", "REVISION", "RENEWED", "EXPIRES IN"],
      ...rows.map((r) => [
        r.key,
        r.state,
        r.holder ?? "-",
        r.epoch === null ? "-" : String(r.epoch),
        String(r.revision),
        `${ago(r.renewedAgoMs)} ago`,
        r.expiresInMs === null || r.expiresInMs <= 0 ? "-" : ago(r.expiresInMs),
      ]),
    ];
    const widths = table[0]!.map((_, i) =>
      Math.max(...table.map((row) => row[i]!.length))
    );
    await print(
      table.map((row) =>
        row.map((c, i) => i === row.length - 1 ? c : c.padEnd(widths[i]!))
          .join("  ").trimEnd() + "\n"
      ).join(""),
    );
    return 0;
  } finally {
    await nc.close();
  }
}

/** `lease watch --prefix P` / `--all`: a line per key, then per change. */
export async function watchMany(a: Args): Promise<number> {
  return await follow(a, await dial(a), false, (r) => {
    const holder = r.state === "held"
      ? { node: r.holder!, epoch: r.epoch! }
      : null;
    process.stdout.write(
      (a.json
        ? JSON.stringify({
          key: r.key,
          holder,
          state: r.state,
          revision: r.revision,
        })
        : r.state === "orphaned"
        ? `${r.key}: none (orphaned: ${r.holder} epoch ${r.epoch}, its session is over)`
        : holder === null
        ? `${r.key}: none (${r.state})`
        : `${r.key}: ${holder.node} epoch ${holder.epoch}`) + "\n",
    );
  });
}

/**
 * Follows `--prefix`, `--all` or (`exact`) KEY with {@linkcode watchKeys}
 * on `nc`, calling `show` per change, until a signal or the bucket's
 * deletion; closes `nc`.
 */
async function follow(
  a: Args,
  nc: NatsConnection,
  exact: boolean,
  show: (row: KeyRow) => void,
): Promise<number> {
  const stop = new AbortController();
  const onSig = () => stop.abort();
  process.on("SIGINT", onSig);
  process.on("SIGTERM", onSig);
  try {
    let w: KeysWatch;
    try {
      w = await watchKeys(
        nc,
        placeOf(a),
        exact ? a.key : a.prefix,
        a.domain,
        show,
        exact,
      );
    } catch (err) {
      throw bucketFailure(a, err);
    }
    let ended: Error | undefined;
    if (!stop.signal.aborted) {
      ended = await Promise.race([
        w.ended,
        new Promise<undefined>((r) =>
          stop.signal.addEventListener("abort", () => r(undefined), {
            once: true,
          })
        ),
      ]);
    }
    await w.stop();
    if (ended !== undefined) {
      throw new UnavailableError(
        a.key,
        `${
          a.stream !== undefined
            ? `stream '${a.stream}'`
            : `bucket '${a.bucket}'`
        } was deleted: the watch ended (${ended.message})`,
        { cause: ended },
      );
    }
    return 0;
  } finally {
    process.off("SIGINT", onSig);
    process.off("SIGTERM", onSig);
    await nc.close();
  }
}

/** `lease shards`: the members, then each shard's holder and target. */
export async function shardsView(a: Args): Promise<number> {
  const { nc, leases } = await open(a, {
    createBucket: false,
    node: `lease-cli-${process.pid}`,
  });
  try {
    const slots = await Promise.all(
      Array.from(
        { length: a.maxMembers },
        (_, i) => leases.holder(memberKey(a.key, i)),
      ),
    );
    const members = [
      ...new Set(slots.flatMap((h) => h ? [h.node] : [])),
    ].sort();
    const holders = await Promise.all(
      Array.from(
        { length: a.count },
        (_, i) => leases.holder(shardKey(a.key, i)),
      ),
    );
    const target = new Map<number, string>();
    for (const [m, ss] of assignShards(a.count, members)) {
      for (const s of ss) target.set(s, m);
    }
    if (a.json) {
      process.stdout.write(
        JSON.stringify({
          group: a.key,
          members,
          shards: holders.map((h, i) => ({
            shard: i,
            holder: h,
            target: target.get(i) ?? null,
          })),
        }) + "\n",
      );
      return 0;
    }
    const lines = [
      `members (${members.length}): ${members.join(" ") || "none"}`,
    ];
    holders.forEach((h, i) => {
      const to = target.get(i);
      lines.push(
        `shard ${i}: ${h === null ? "none" : `${h.node} epoch ${h.epoch}`}${
          to !== undefined && to !== h?.node ? ` (moving to ${to})` : ""
        }`,
      );
    });
    process.stdout.write(lines.join("\n") + "\n");
    return 0;
  } finally {
    await leases.close();
    await nc.close();
  }
}
