/**
 * The fenced layout's subjects (issue 33, `design/fenced.md`, "Layout"),
 * and a manager on it over a port: what `createLeaseManager` builds for
 * `fenced: true` once the bucket and its servers are proven, and what the
 * simulator and the tests build on ports of their own.
 *
 * @module
 */

import {
  type FencedSettings,
  Manager,
  type ManagerSettings,
} from "./manager.ts";
import type { Port } from "./port.ts";
import { Session } from "./session.ts";

/** Where a fenced bucket keeps a key's tenure entry: `_lease.k.<key>`. */
export const TENURE_PREFIX = "_lease.k.";

/** Where a fenced bucket keeps a manager's session entry: `_lease.s.<id>`. */
export const SESSION_PREFIX = "_lease.s.";

/**
 * The stream metadata that marks a fenced bucket, and its lease TTL (ms):
 * written by `createLeaseManager` when it creates one, read by it and by
 * the `lease` command to tell the layouts apart.
 */
export const LAYOUT_KEY = "nats-lease.layout";
/** See {@linkcode LAYOUT_KEY}. */
export const TTL_KEY = "nats-lease.ttl";

/**
 * A fenced bucket's lease TTL (ms) from its stream metadata: `undefined`
 * for a bucket of the classic layout (no layout mark), -1 for a fenced one
 * whose TTL cannot be read. Such a bucket cannot be joined safely (every
 * manager's session must use one TTL): -1 fails the TTL checks that follow.
 */
export function fencedBucketTtl(
  metadata: Record<string, string> | undefined,
): number | undefined {
  if (metadata?.[LAYOUT_KEY] !== "fenced") return undefined;
  const ttl = Number(metadata[TTL_KEY]);
  return Number.isInteger(ttl) && ttl > 0 ? ttl : -1;
}

/** The subjects of a fenced bucket named `bucket`. */
export function fencedSubjects(
  bucket: string,
): Omit<FencedSettings, "session" | "reopen"> {
  return {
    tenure: (key) => `$KV.${bucket}.${TENURE_PREFIX}${key}`,
    data: (key) => `$KV.${bucket}.${key}`,
    sessionSubject: (id) => `$KV.${bucket}.${SESSION_PREFIX}${id}`,
    // Outside the stream: a request there reaches only the responder.
    probeSubject: (id) => `$LEASE.${bucket}.probe.${id}`,
  };
}

/**
 * Whether the subject filter `pattern` (a stream's subject, maybe with `*`
 * and `>` wildcards) matches every subject that starts with `subject`'s
 * tokens when `prefix` is true, else `subject` itself.
 */
export function subjectCovers(
  pattern: string,
  subject: string,
  prefix = false,
): boolean {
  const p = pattern.split(".");
  const t = subject.split(".");
  for (let i = 0; i < p.length; i++) {
    if (p[i] === ">") return i < t.length || prefix;
    if (i >= t.length) return false;
    if (p[i] !== "*" && p[i] !== t[i]) return false;
  }
  // A prefix's deeper subjects need a `>` the pattern did not have.
  return !prefix && p.length === t.length;
}

/**
 * The subjects of the leases kept in the user's stream under `prefix`
 * (the `stream` option), whose subjects are `streamSubjects`: appends may
 * go to any subject the stream covers outside the prefix.
 */
export function streamLeaseSubjects(
  stream: string,
  prefix: string,
  streamSubjects: readonly string[],
): Omit<FencedSettings, "session" | "reopen"> {
  return {
    tenure: (key) => `${prefix}.k.${key}`,
    append: (subject) => {
      // The server would store a write to another stream's subject after
      // checking the fence there (no tenure: "wrong last sequence"), and
      // one to no stream's subject never: both refused here, with reasons.
      if (!SUBJECT_RE.test(subject)) {
        throw new TypeError(
          `Cannot publish to '${subject}' as it is not a subject: non-empty '.'-separated tokens without whitespace, '*' or '>'`,
        );
      }
      if (subject === prefix || subject.startsWith(`${prefix}.`)) {
        throw new TypeError(
          `Cannot publish to '${subject}' as subjects under '${prefix}' hold the leases themselves`,
        );
      }
      if (!streamSubjects.some((p) => subjectCovers(p, subject))) {
        throw new TypeError(
          `Cannot publish to '${subject}' as it is not a subject of stream '${stream}' (${
            streamSubjects.join(", ")
          })`,
        );
      }
    },
    sessionSubject: (id) => `${prefix}.s.${id}`,
    probeSubject: (id) => `$LEASE.${stream}.probe.${id}`,
  };
}

/** A subject without wildcards or whitespace, of non-empty tokens. */
export const SUBJECT_RE: RegExp = /^[^.*>\s]+(\.[^.*>\s]+)*$/;

/**
 * Opens this manager's session on the fenced bucket `settings.bucket`, then
 * runs the protocol on it over `port`.
 *
 * @param port The clock, timers and server operations.
 * @param settings The resolved options (a TTL of 1,000 ms or more).
 * @param subjects Where the leases live: a fenced bucket's subjects by
 *   default, or {@linkcode streamLeaseSubjects} of a user's stream.
 * @returns The manager.
 * @throws {RangeError} A TTL below 1,000 ms, or a server that cannot
 * expire the session's entry into a marker (before 2.11.2).
 */
export async function fencedManagerOnPort(
  port: Port,
  settings: Omit<ManagerSettings, "fenced">,
  subjects: Omit<FencedSettings, "session" | "reopen"> = fencedSubjects(
    settings.bucket,
  ),
): Promise<Manager> {
  const open = (id?: string) =>
    Session.open({
      port,
      subject: subjects.sessionSubject,
      probe: subjects.probeSubject,
      node: settings.node,
      ttl: settings.ttl,
      ...(id !== undefined ? { id } : {}),
    });
  let session: Session;
  try {
    session = await open();
  } catch (err) {
    // The manager that would own the port never came to be: end what the
    // port opened (its reply subscription, its checks of late peers).
    port.close?.();
    throw err;
  }
  return new Manager(port, {
    ...settings,
    fenced: { ...subjects, session, reopen: open },
  });
}
