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
 * Opens this manager's session on the fenced bucket `settings.bucket`, then
 * runs the protocol on it over `port`.
 *
 * @param port The clock, timers and server operations.
 * @param settings The resolved options (a TTL of 1,000 ms or more).
 * @returns The manager.
 * @throws {RangeError} A TTL below 1,000 ms, or a server that cannot
 * expire the session's entry into a marker (before 2.11.2).
 */
export async function fencedManagerOnPort(
  port: Port,
  settings: Omit<ManagerSettings, "fenced">,
): Promise<Manager> {
  const subjects = fencedSubjects(settings.bucket);
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
