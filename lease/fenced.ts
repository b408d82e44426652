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

/** The subjects of a fenced bucket named `bucket`. */
export function fencedSubjects(
  bucket: string,
): Omit<FencedSettings, "session" | "reopen"> {
  return {
    tenure: (key) => `$KV.${bucket}.${TENURE_PREFIX}${key}`,
    data: (key) => `$KV.${bucket}.${key}`,
    sessionSubject: (id) => `$KV.${bucket}._lease.s.${id}`,
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
