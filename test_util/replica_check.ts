/**
 * Proves, from an ordinary client, that every server holding a replica of a
 * stream runs a nats-server release whose replicated compare-and-set is
 * serialised. Before 2.9.21 two `kv.update(key, value, sameRevision)` calls
 * can both succeed on a stream with more than one replica (nats-server#4320,
 * fixed by commit 244dda809). The fix is in the stream leader's write path,
 * and any replica can become the leader, so every peer counts, not only the
 * server the client happens to be connected to (`nc.info.version`).
 *
 * Written to move into `lease.ts`: it uses only `@nats-io/nats-core` and
 * `@nats-io/jetstream` APIs and Web-standard globals.
 *
 * What an ordinary client (default account, no system-account credentials)
 * can learn, measured on nats-server 2.9.10 and 2.15.2:
 *
 * - `$JS.API.STREAM.INFO.<stream>` names the peers: `cluster.leader` and
 *   `cluster.replicas[].name` are server names (the server ID when no
 *   `server_name` is configured). It carries no versions. A standalone
 *   2.9.10 server omits `cluster`; a standalone 2.15.2 server sends only
 *   `cluster.leader`. `config.metadata["_nats.ver"]` (2.11+) is not the
 *   peers' versions: on a cluster of two 2.9.10 nodes and one 2.15.2 node it
 *   read `2.15.2` on a stream with two 2.9.10 replicas.
 * - `$SYS.REQ.ACCOUNT.PING.STATZ` is imported into every account from the
 *   system account (both versions, whenever a system account exists, which
 *   the default config creates). Each server answers with `server.name` and
 *   `server.ver`, but by default only a server where the account has local
 *   connections. With the body `{"include_unused":true}` every server in the
 *   cluster answers. (`{"unused":true}` is ignored: `unused` is the name of
 *   the HTTP `/accstatz` query parameter, not of the JSON field.)
 * - `$SYS.REQ.ACCOUNT.PING.CONNZ` (and `$SYS.REQ.SERVER.PING.CONNZ`, mapped
 *   to the same thing) is answered by every server, with the same `server`
 *   block, but lists connections: heavier, no extra information.
 * - `$SYS.REQ.SERVER.PING.VARZ`, `$SYS.REQ.SERVER.PING` and
 *   `$SYS.REQ.SERVER.PING.STATSZ` need the system account: no responders.
 *   `$SYS.REQ.USER.INFO` answers on 2.10+ only, from the local server.
 * - `$JS.API.INFO` and `nc.info` describe only the connected server.
 *
 * @module
 */

import { createInbox, type Msg, type NatsConnection } from "@nats-io/nats-core";
import type { JetStreamManager, StreamInfo } from "@nats-io/jetstream";

/** Account-scoped STATZ: every server of the cluster answers for itself. */
const STATZ_SUBJECT = "$SYS.REQ.ACCOUNT.PING.STATZ";
/** Without it only servers where this account has connections answer. */
const STATZ_BODY = JSON.stringify({ include_unused: true });

type Triple = readonly [number, number, number];

/** The first release with the fix for nats-server#4320. */
const FIXED: Triple = [2, 9, 21];
/**
 * The fix reached the 2.10 branch in July 2023, during the 2.10.0 betas, so
 * a pre-release of 2.10.0 (or of 2.9.21) may lack it.
 */
const LAST_UNSURE_PRERELEASE: Triple = [2, 10, 0];

function compare(a: Triple, b: Triple): number {
  return a[0] - b[0] || a[1] - b[1] || a[2] - b[2];
}

function parseVersion(
  version: string,
): { v: Triple; pre: boolean } | undefined {
  const m = /^v?(\d+)\.(\d+)\.(\d+)(-[^\s+]+)?/.exec(version);
  return m === null ? undefined : {
    v: [Number(m[1]), Number(m[2]), Number(m[3])],
    pre: m[4] !== undefined,
  };
}

/**
 * Whether a server version string is a release with the fix: `2.9.21` or
 * later, where a pre-release of 2.9.21 or 2.10.0 does not count.
 */
export function casSafeVersion(version: string): boolean {
  const parsed = parseVersion(version);
  if (parsed === undefined || compare(parsed.v, FIXED) < 0) return false;
  return !parsed.pre || compare(parsed.v, LAST_UNSURE_PRERELEASE) > 0;
}

/** Of two versions reported under one server name, the one to judge by. */
function worseVersion(a: string, b: string): string {
  if (!casSafeVersion(a)) return a;
  if (!casSafeVersion(b)) return b;
  return compare(parseVersion(a)!.v, parseVersion(b)!.v) <= 0 ? a : b;
}

/** What one STATZ round learnt: the worst version seen per server name. */
interface Census {
  versions: Map<string, string>;
  /** Why the round ended before every peer answered, when it knows. */
  failure?: string;
}

/** The parts of a `$SYS` reply this check reads. */
interface ServerApiReply {
  server?: { name?: unknown; ver?: unknown };
}

/**
 * Sends one account-scoped STATZ ping and gathers the replies until every
 * name in `wanted` has answered or `ms` have passed. Never rejects.
 */
function census(
  nc: NatsConnection,
  wanted: readonly string[],
  ms: number,
): Promise<Census> {
  const result: Census = { versions: new Map() };
  return new Promise<Census>((resolve) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    let sub: { unsubscribe(): void } | undefined;
    let finished = false;
    const finish = (failure?: string): void => {
      if (finished) return;
      finished = true;
      if (failure !== undefined) result.failure = failure;
      clearTimeout(timer);
      try {
        sub?.unsubscribe();
      } catch {
        // The connection closed meanwhile; nothing is left to release.
      }
      resolve(result);
    };
    const onReply = (msg: Msg): void => {
      if (msg.data.length === 0 && msg.headers?.code === 503) {
        finish(
          `no server answered ${STATZ_SUBJECT} (no responders: the account imports no system services, e.g. when the server runs without a system account)`,
        );
        return;
      }
      let reply: ServerApiReply;
      try {
        reply = msg.json<ServerApiReply>();
      } catch {
        return;
      }
      const name = reply.server?.name;
      const ver = reply.server?.ver;
      if (typeof name !== "string" || typeof ver !== "string") return;
      const seen = result.versions.get(name);
      result.versions.set(
        name,
        seen === undefined ? ver : worseVersion(seen, ver),
      );
      if (wanted.every((peer) => result.versions.has(peer))) finish();
    };
    try {
      // The connection's own inbox prefix, when it has one, keeps the reply
      // subject inside what a restricted user may subscribe to.
      const prefix = (nc as { options?: { inboxPrefix?: string } }).options
        ?.inboxPrefix;
      const inbox = createInbox(prefix);
      sub = nc.subscribe(inbox, {
        callback: (err, msg) => {
          if (err !== null) {
            finish(`the reply subscription failed: ${err.message}`);
          } else {
            onReply(msg);
          }
        },
      });
      timer = setTimeout(() => finish(), Math.max(0, ms));
      nc.publish(STATZ_SUBJECT, STATZ_BODY, { reply: inbox });
    } catch (err) {
      finish(
        `cannot send ${STATZ_SUBJECT}: ${
          err instanceof Error ? err.message : String(err)
        }`,
      );
    }
  });
}

/** Resolves like `p`, or rejects with a timeout error after `ms`. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    p,
    new Promise<never>((_, reject) => {
      timer = setTimeout(
        () =>
          reject(
            new Error(`${what} got no answer within ${Math.round(ms)} ms`),
          ),
        Math.max(0, ms),
      );
    }),
  ]).finally(() => clearTimeout(timer));
}

function errText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * Checks that every peer of a stream runs nats-server 2.9.21 or later, the
 * first release where compare-and-set on a replicated stream is safe
 * (nats-server#4320).
 *
 * Reads the peers (`cluster.leader` and `cluster.replicas[].name`) from
 * stream info, then asks every server for its version with one
 * account-scoped `$SYS.REQ.ACCOUNT.PING.STATZ` (body
 * `{"include_unused":true}`), gathering replies until each peer has answered
 * or the time is up. A stream with one replica is always safe: a single-peer
 * stream has no Raft group, and the server checks the expected sequence
 * under the stream lock.
 *
 * It fails closed: a peer that does not answer (offline, in a cluster this
 * account's requests do not reach, or a server without a system account)
 * makes the stream unproven, as does stream info that names fewer peers
 * than the configured replicas.
 *
 * What it cannot see: it is a snapshot. The meta leader may later give the
 * stream a peer that was not checked (replicas scaled up, a peer removed
 * and replaced, the stream moved by a placement change), and a checked
 * server may be restarted on an older binary under the same name. Re-run it
 * when the stream's peer set or leader changes, or periodically, to narrow
 * that window; no client-side check can close it.
 *
 * @param nc The connection to ask through.
 * @param jsm A JetStream manager on `nc` (its API prefix or domain is used
 * for stream info).
 * @param stream Stream name, e.g. `"KV_leases"`.
 * @param timeoutMs Upper bound, in milliseconds, for the whole check.
 * @returns `undefined` when every peer is proven to run 2.9.21 or later;
 * otherwise one sentence saying what could not be proven and why.
 *
 * @example Refuse a replicated bucket on old servers
 * ```ts ignore
 * const why = await unsafeReplicaReason(nc, jsm, "KV_leases", 2_000);
 * if (why !== undefined) throw new Error(why);
 * ```
 */
export async function unsafeReplicaReason(
  nc: NatsConnection,
  jsm: JetStreamManager,
  stream: string,
  timeoutMs: number,
): Promise<string | undefined> {
  const deadline = performance.now() + timeoutMs;
  const left = (): number => Math.max(0, deadline - performance.now());
  const subject =
    `Cannot prove that every peer of stream '${stream}' runs nats-server 2.9.21 or later, which compare-and-set on a replicated stream needs (nats-server#4320)`;

  let info: StreamInfo;
  try {
    info = await within(jsm.streams.info(stream), left(), "stream info");
  } catch (err) {
    return `${subject}: cannot read its stream info: ${errText(err)}.`;
  }
  const replicas = info.config.num_replicas ?? 1;
  const peers = [
    info.cluster?.leader,
    ...(info.cluster?.replicas ?? []).map((r) => r.name),
  ].filter((name): name is string => typeof name === "string" && name !== "");
  const unique = [...new Set(peers)];
  if (replicas <= 1 && unique.length <= 1) return undefined;
  if (unique.length < replicas) {
    return `${subject}: its stream info names ${unique.length} of its ${replicas} peers (${
      unique.length === 0 ? "none" : unique.join(", ")
    }${
      info.cluster?.leader ? "" : "; it has no leader"
    }), so the others cannot be checked.`;
  }

  const budget = left();
  const { versions, failure } = await census(nc, unique, budget);
  const problems: string[] = [];
  const unseen: string[] = [];
  for (const peer of unique) {
    const ver = versions.get(peer);
    const label = peer === info.cluster?.leader ? `${peer} (leader)` : peer;
    if (ver === undefined) unseen.push(label);
    else if (!casSafeVersion(ver)) problems.push(`${label} runs ${ver}`);
  }
  if (unseen.length > 0) {
    problems.push(
      `${unseen.join(", ")} ${
        unseen.length === 1 ? "is" : "are"
      } not visible to this account (${
        failure ??
          `no answer to ${STATZ_SUBJECT} within ${Math.round(budget)} ms`
      })`,
    );
  }
  return problems.length === 0
    ? undefined
    : `${subject}: ${problems.join("; ")}.`;
}
