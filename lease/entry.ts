import type { RawEntry } from "./port.ts";

// ---------------------------------------------------------------------------
// What an entry says.

export const KEY_RE: RegExp = /^[-/=\w]+(\.[-/=\w]+)*$/;

export const encoder: TextEncoder = new TextEncoder();

/**
 * The header a KV delete or purge carries (`DEL`, `PURGE`); nats.js's KV
 * does not export its name.
 */
export const KV_OPERATION_HDR = "KV-Operation";

/**
 * The header of a delete marker the server writes when an entry expires or
 * is removed (`MaxAge`, `Remove`, `Purge`; nats-server 2.11+); nats.js does
 * not name it.
 */
export const MARKER_REASON_HDR = "Nats-Marker-Reason";

/** Our tag: `lease:<instance>:<epoch>:<counter>`; epoch 0 on an acquire. */
const TAG_RE = /^lease:([^:]+):(\d+):(\d+)$/;

/**
 * How the last entry of a key bears on a contender:
 * - `put`: a holder's entry;
 * - `released`: a lease manager's clean release (a delete tagged like our
 *   writes, written only after the holder's writes settled, its own grace
 *   was over and its lease was still confirmed): no grace;
 * - `expired`: no entry, or the server's `MaxAge` marker: the holder's
 *   deadline has passed (expiry is late, never early), so one grace;
 * - `removed`: any other delete or purge (an operator's `kv.delete`): the
 *   holder may still be inside its deadline, so one TTL plus the grace.
 */
export interface Seen {
  seq: number;
  kind: "put" | "released" | "expired" | "removed";
  node: string;
  /** The tenure epoch from our tag, else the revision. */
  epoch: number;
  /** The instance and counter from our tag, when the entry carries one. */
  instance: string | undefined;
  counter: number;
  /** Whether the tag says this is an acquire (epoch 0). */
  acquire: boolean;
}

/**
 * Who wrote an entry, as far as it says: its node, and our tag's instance
 * and counter when it carries one (unique per write of a manager). Two
 * entries at one revision with different ids are different writes.
 */
export function entryId(seen: Seen): string {
  return `${seen.node}\u0000${seen.instance ?? ""}\u0000${seen.counter}`;
}

export function toSeen(e: RawEntry): Seen {
  const tag = TAG_RE.exec(e.msgId ?? "");
  const tagged = tag ? Number(tag[2]) : 0;
  let kind: Seen["kind"];
  if (e.marker !== undefined) {
    kind = e.marker === "MaxAge" ? "expired" : "removed";
  } else if (e.operation === "DEL") kind = tag ? "released" : "removed";
  else if (e.operation === "PURGE") kind = "removed";
  else kind = "put";
  return {
    seq: e.seq,
    kind,
    node: kind === "put" ? e.value : "",
    epoch: tagged > 0 ? tagged : e.seq,
    instance: tag?.[1],
    counter: tag ? Number(tag[3]) : 0,
    acquire: tag !== null && tagged === 0,
  };
}
