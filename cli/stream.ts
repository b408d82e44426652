/**
 * `lease` on leases kept in a stream of the user's (`--stream NAME
 * --lease-subjects PREFIX`; lease/stream.ts, design/fenced.md's "The
 * stream layout"): the stream's refusals worded for the command line, and
 * `lease publish`, the fenced append of a command run by
 * `lease run --stream`.
 *
 * Why `publish` needs no session of its own, as `lease put` on a fenced
 * bucket (cli/fenced.ts): the server stores an append only while the
 * key's tenure entry (`PREFIX.k.KEY`) is still at the sequence the append
 * names, checking and storing in one step. So a command that outlives its
 * `lease run`, or whose tenure another node took over, has its appends
 * refused by the server itself.
 *
 * @module
 */

import type { NatsConnection } from "@nats-io/nats-core";
import {
  jetstream,
  jetstreamManager,
  type StreamConfig,
  type StreamInfo,
} from "@nats-io/jetstream";
import process from "node:process";
import { isNoResponders, isStreamNotFound } from "../lease/_nats.ts";
import { LAYOUT_KEY, subjectCovers } from "../lease/fenced.ts";
import { UnavailableError } from "../lease.ts";
import { type Args, type StreamTenureEnv, UsageError } from "./args.ts";
import { dial, noStream } from "./connect.ts";
import { EXIT } from "./exit.ts";
import { readStdin, refusedWrite, refuseUnfenced } from "./fenced.ts";

/**
 * Throws a {@linkcode UsageError} when stream `stream` (its `config`)
 * cannot hold leases under `prefix` as the command line names them: a
 * lease bucket's own stream (`--bucket` reads it), or one whose subjects do
 * not cover the tenure entries `PREFIX.k.>` (a wrong `--lease-subjects`,
 * whose listing would be empty and whose fence could never hold).
 *
 * @example
 * ```ts ignore
 * streamRefusal((await jsm.streams.info("ORDERS")).config, "ORDERS", "orders.lease");
 * ```
 */
export function streamRefusal(
  config: StreamConfig,
  stream: string,
  prefix: string,
): void {
  if (config.metadata?.[LAYOUT_KEY] !== undefined) {
    throw new UsageError(
      `stream '${stream}' is a lease bucket's own stream${
        stream.startsWith("KV_") ? ` (bucket '${stream.slice(3)}')` : ""
      }: pass --bucket NAME instead of --stream and --lease-subjects`,
    );
  }
  const subjects = config.subjects ?? [];
  if (!subjects.some((p) => subjectCovers(p, `${prefix}.k`, true))) {
    throw new UsageError(
      `stream '${stream}' keeps no leases under '${prefix}': its subjects (${
        subjects.join(", ") || "none"
      }) do not cover '${prefix}.k.>', where the tenure entries would be: check --lease-subjects (LEASE_SUBJECTS in a command run by lease run --stream)`,
    );
  }
}

/**
 * Reads the info of `--stream` (or LEASE_STREAM), with its refusals worded
 * for the command line: no JetStream or no such stream (exit 69).
 */
async function streamInfo(
  nc: NatsConnection,
  a: Args,
  stream: string,
): Promise<StreamInfo> {
  try {
    const jsm = await jetstreamManager(nc, { checkAPI: false });
    return await jsm.streams.info(stream);
  } catch (err) {
    if (isStreamNotFound(err)) throw noStream(a, stream);
    throw new UnavailableError(
      a.key,
      isNoResponders(err)
        ? `no JetStream answers for stream '${stream}': ${
          (err as Error).message
        }`
        : (err as Error).message,
      { cause: err },
    );
  }
}

/**
 * `lease publish SUBJECT DATA`: one append to SUBJECT of LEASE_STREAM,
 * fenced by LEASE_KEY's tenure entry (`LEASE_SUBJECTS.k.LEASE_KEY`) at
 * LEASE_EPOCH, sent from a connection of its own. Prints the message's
 * stream sequence; resolves 0, or {@linkcode EXIT}'s `NOT_HOLDER` when the
 * server refused it because the tenure is over.
 *
 * Everything that can be checked is checked before sending: the
 * environment and SUBJECT's form (by the parser), then, from one
 * stream-info request, that the stream keeps the leases under
 * LEASE_SUBJECTS and that its subjects cover SUBJECT (an append to no
 * stream's subject is never stored; one to another stream's would be
 * checked against a tenure that stream never had), and the server's
 * version (one before 2.11 ignores the fence's subject).
 *
 * @example
 * ```ts ignore
 * process.exitCode = await streamPublish(parse(["publish", "orders.created", "{}"]));
 * ```
 */
export async function streamPublish(a: Args): Promise<number> {
  const t = a.streamTenure!;
  const subject = a.subject!;
  const data = a.value === "-"
    ? await readStdin()
    : new TextEncoder().encode(a.value ?? "");
  const nc = await dial(a);
  try {
    const si = await streamInfo(nc, a, t.stream);
    streamRefusal(si.config, t.stream, t.leaseSubjects);
    const subjects = si.config.subjects ?? [];
    if (!subjects.some((p) => subjectCovers(p, subject))) {
      throw new UsageError(
        `invalid subject ${
          JSON.stringify(subject)
        }: not a subject of stream '${t.stream}' (its subjects: ${
          subjects.join(", ") || "none"
        }), where the fence would not hold; nothing was sent`,
        EXIT.BAD_KEY,
      );
    }
    refuseUnfenced(nc, a.key);
    return await appendFenced(nc, t, subject, data);
  } finally {
    await nc.close();
  }
}

/** Sends the one fenced append and says how it went. */
async function appendFenced(
  nc: NatsConnection,
  t: StreamTenureEnv,
  subject: string,
  data: Uint8Array,
): Promise<number> {
  const js = jetstream(nc);
  try {
    // A plain append, as Lease.publish sends it: no KV operation header.
    const ack = await js.publish(subject, data, {
      // The fence (F1): stored only while the tenure entry of LEASE_KEY
      // is still the one at LEASE_EPOCH. A retry after "no responders"
      // is safe: nothing was stored.
      expect: {
        lastSubjectSequence: t.epoch,
        lastSubjectSequenceSubject: `${t.leaseSubjects}.k.${t.key}`,
      },
    });
    process.stdout.write(`${ack.seq}\n`);
    return 0;
  } catch (err) {
    return refusedWrite(
      err,
      t.key,
      `append to '${subject}'`,
      (now) =>
        `not stored: the tenure of '${t.key}' at epoch ${t.epoch} is over (${
          now > 0
            ? `its tenure entry is at sequence ${now} now: another node took '${t.key}'`
            : "its tenure entry is gone: released, evicted or purged"
        }), so the server refused the append to '${subject}'`,
    );
  }
}
