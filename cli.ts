/**
 * The `lease` command: run a program only while this node holds a lease,
 * with its fencing epoch in the environment; show, watch or evict holders.
 *
 * ```sh
 * deno run -A cli.ts run nightly-report -- ./report.sh   # from a clone
 * bun cli.ts holder nightly-report --json
 * node cli.ts watch nightly-report
 * node cli.ts shards orders --count 32
 * ```
 *
 * Exit status of `lease run`: the command's own (128 + the signal number
 * when a signal ended it), or one of {@linkcode EXIT}.
 *
 * @module
 */

import process from "node:process";
import { type ChildProcess, spawn } from "node:child_process";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import {
  jetstream,
  JetStreamApiCodes,
  JetStreamApiError,
} from "@nats-io/jetstream";
import { type KeyRow, type KeysWatch, listKeys, watchKeys } from "./cli_ls.ts";
import {
  cgroupProcs,
  freezeCgroup,
  makeCgroup,
  removeCgroup,
  signalCgroup,
} from "./cli_cgroup.ts";
import {
  createLeaseManager,
  type GuardOptions,
  type Holder,
  type Lease,
  type LeaseAcquiredEvent,
  type LeaseManager,
  MIN_TTL,
  NotHolderError,
  UnavailableError,
} from "./lease.ts";
import {
  LimitMismatchError,
  MAX_SEMAPHORE_LIMIT,
  semaphore,
} from "./semaphore.ts";
import {
  assignShards,
  DEFAULT_MAX_MEMBERS,
  MAX_SHARDS,
  memberKey,
  shardKey,
} from "./shards.ts";

/**
 * The exit statuses of `lease` itself (BSD sysexits where one fits).
 *
 * @example
 * ```ts ignore
 * if (status === EXIT.LOST) console.error("the lease was lost: the command was stopped");
 * ```
 */
export const EXIT: {
  /** Bad arguments: an unknown subcommand or option, a missing KEY or --node. */
  readonly USAGE: 64;
  /** An invalid KEY. */
  readonly BAD_KEY: 65;
  /** A duration (--ttl, --kill-after) that is not a whole number of ms, or out of range. */
  readonly BAD_DURATION: 66;
  /** `lease run` without a command after `--`. */
  readonly NO_COMMAND: 67;
  /** No server could be reached. */
  readonly NO_SERVER: 68;
  /** The server has no JetStream, refused the bucket, or stopped answering. */
  readonly UNAVAILABLE: 69;
  /** The watchdog of `lease run` did not start, or died: the command was not started, or was stopped. */
  readonly NO_WATCHDOG: 70;
  /** `lease run --contain`: this machine does not let lease make a cgroup. */
  readonly NO_CONTAIN: 71;
  /**
   * The lease was lost while the command ran; the command was stopped. The
   * default of `--lost-status`: pick another there if the command itself
   * may exit 75.
   */
  readonly LOST: 75;
  /** `lease release`: the key is not held by the node named. */
  readonly NOT_HOLDER: 1;
  /**
   * `lease run -n N`: a slot of KEY is held under another limit (a
   * {@linkcode LimitMismatchError}); nothing was run.
   */
  readonly LIMIT_MISMATCH: 76;
} = {
  USAGE: 64,
  BAD_KEY: 65,
  BAD_DURATION: 66,
  NO_COMMAND: 67,
  NO_SERVER: 68,
  UNAVAILABLE: 69,
  NO_WATCHDOG: 70,
  NO_CONTAIN: 71,
  LOST: 75,
  NOT_HOLDER: 1,
  LIMIT_MISMATCH: 76,
};

/** How long `lease release` keeps trying while the holder keeps renewing. */
const RELEASE_BOUND_MS = 5_000;

type Sub = "run" | "holder" | "watch" | "ls" | "release" | "shards";
const SUBS: readonly Sub[] = [
  "run",
  "holder",
  "watch",
  "ls",
  "release",
  "shards",
];

function isSub(word: string | undefined): word is Sub {
  return (SUBS as readonly (string | undefined)[]).includes(word);
}

/**
 * An option of the command line. The table below is the one source of the
 * parser's flags and of every usage text, general or a subcommand's.
 */
interface Opt {
  readonly flag: string;
  readonly short?: string;
  /** The value's placeholder; none for a switch. */
  readonly arg?: string;
  /** The subcommands that take it. */
  readonly subs: readonly Sub[];
  /** Needed by those subcommands. */
  readonly required?: boolean;
  /** Its line (or lines) in a usage text. */
  readonly text: string;
}

const OPTIONS: readonly Opt[] = [
  {
    flag: "--servers",
    arg: "URL",
    subs: SUBS,
    text: "NATS server(s), comma-separated (default: $NATS_URL,\n" +
      "then 127.0.0.1:4222)",
  },
  {
    flag: "--bucket",
    arg: "NAME",
    subs: SUBS,
    text: "lease bucket (default: leases)",
  },
  {
    flag: "--domain",
    arg: "NAME",
    subs: SUBS,
    text: "JetStream domain of the bucket, for a client of a leaf node\n" +
      "whose bucket is in the hub's domain (default: the server's own)",
  },
  {
    flag: "--node",
    arg: "ID",
    subs: ["release"],
    required: true,
    text: "the holder to evict",
  },
  {
    flag: "--ttl",
    arg: "MS",
    subs: ["run"],
    text: "lease TTL when the bucket is created (default 15000; an\n" +
      "existing bucket's TTL is adopted, and must match when given)",
  },
  {
    flag: "--node",
    arg: "ID",
    subs: ["run"],
    text: "holder id (default: host name and process id)",
  },
  {
    flag: "--limit",
    short: "-n",
    arg: "N",
    subs: ["run"],
    text: "run CMD in one of N slots of KEY (at most N at once)",
  },
  {
    flag: "--kill-after",
    arg: "MS",
    subs: ["run"],
    text: "SIGTERM to SIGKILL (default: a quarter of the TTL)",
  },
  {
    flag: "--lost-status",
    arg: "N",
    subs: ["run"],
    text:
      `exit status when the lease is lost (1-255, default ${EXIT.LOST}):\n` +
      "pick one CMD never exits with, to tell the two apart",
  },
  {
    flag: "--contain",
    subs: ["run"],
    text: "run CMD in a cgroup (v2) of its own and stop every process\n" +
      "in it, also those that left its process group (Linux,\n" +
      `where lease may make a cgroup; exits ${EXIT.NO_CONTAIN} if it may not)`,
  },
  {
    flag: "--allow-unverified-replicas",
    subs: ["run", "holder", "watch", "shards"],
    text: "skip the check of the bucket's servers' versions",
  },
  {
    flag: "--json",
    subs: ["holder", "watch"],
    text: 'print {"key":..,"holder":{"node":..,"epoch":..}|null} lines',
  },
  {
    flag: "--prefix",
    arg: "P",
    subs: ["watch", "ls"],
    text: "only the keys below P (P.<anything>)",
  },
  {
    flag: "--all",
    subs: ["watch"],
    text: "every key of the bucket, instead of KEY",
  },
  {
    flag: "--json",
    subs: ["ls"],
    text: 'print one {"key":..,"holder":..,"epoch":..,"revision":..,\n' +
      '"renewedAgoMs":..,"expiresInMs":..,"state":..} line per key',
  },
  {
    flag: "--count",
    arg: "N",
    subs: ["shards"],
    required: true,
    text: `the group's shard count (1-${MAX_SHARDS})`,
  },
  {
    flag: "--max-members",
    arg: "N",
    subs: ["shards"],
    text: `the group's membership slots (default ${DEFAULT_MAX_MEMBERS})`,
  },
  {
    flag: "--json",
    subs: ["shards"],
    text: 'print {"group":..,"members":[..],"shards":[{"shard":..,\n' +
      '"holder":{"node":..,"epoch":..}|null,"target":..},..]}',
  },
  {
    flag: "--help",
    short: "-h",
    subs: SUBS,
    text: "print the help of lease, or of the subcommand",
  },
];

/** What each subcommand is for: a line for the general usage, then more. */
const SUBCOMMANDS: Record<
  Sub,
  { readonly summary: string; readonly about: string; readonly notes?: string }
> = {
  run: {
    summary: "run CMD only while holding KEY",
    about:
      `Waits for its turn on KEY (a watch, no polling), then runs CMD in a process
group of its own with LEASE_KEY, LEASE_NODE, LEASE_EPOCH and LEASE_TENURE
in its environment, renewing the lease while it runs. When CMD exits the lease is
released at once and lease exits with CMD's status (128 + N for signal N).
While it waits it says on stderr who holds KEY.

If the lease is lost (the server unreachable past the TTL, an eviction),
CMD's process group gets SIGTERM, then SIGKILL after --kill-after, and lease
exits with the --lost-status (default ${EXIT.LOST}). SIGINT and SIGTERM sent to lease are passed on to CMD.
While the connection to the server is down, CMD is frozen (SIGSTOP): a
restarted server may have lost the lease's renewals. It runs on (SIGCONT) once
the lease is proven again, and is killed (SIGKILL) if it is not.
A watchdog process does the same if lease cannot: at once when lease is
killed (SIGKILL), and at the lease's deadline when lease is paused (SIGSTOP)
or frozen; a successor starts only after the TTL and the grace. CMD starts
only once the watchdog says it is running, and is stopped if it dies or stops
answering for a second (exit ${EXIT.NO_WATCHDOG}). A process that leaves CMD's process group (setsid, a double fork)
is out of reach of both, unless --contain: fence its writes with LEASE_EPOCH
(and LEASE_TENURE, see docs/safety.md).

With -n N, KEY names a semaphore of N slots (at most N commands at once): CMD
runs in one free slot, with LEASE_SLOT its index and LEASE_KEY and LEASE_EPOCH
its key and epoch, after waiting in line (first come, first served) while all
are held. Every run of KEY must give the same N.`,
    notes:
      `Exit statuses of its own: ${EXIT.USAGE} bad arguments, ${EXIT.BAD_KEY} an invalid KEY, ${EXIT.BAD_DURATION} a bad
duration, ${EXIT.NO_COMMAND} no command after --, ${EXIT.NO_SERVER} no server reachable, ${EXIT.UNAVAILABLE} no JetStream (or the server stopped
answering before the command started), ${EXIT.NO_WATCHDOG} the watchdog did not start or died, ${EXIT.LOST}
(or --lost-status) lease lost while CMD ran, ${EXIT.LIMIT_MISMATCH} (-n) a slot of KEY is held under
another N.`,
  },
  holder: {
    summary: "print who holds KEY",
    about:
      `Prints the holder of KEY and its epoch ("none" when nobody holds it). A read:
a hint that a lagging replica may serve late.`,
  },
  watch: {
    summary: "print every change of holder",
    about:
      `Prints the holder of KEY, then a line for every change (new holder, release,
expiry), until interrupted. With --prefix P (the keys below P) or --all (the
whole bucket), one line per key first, then one per change of any of them,
with why a key is free: "KEY: none (released|expired|removed)". Renewals are
not changes.`,
  },
  ls: {
    summary: "list the keys, their holders and states",
    about:
      `Lists every key of the bucket (or those below --prefix P) in one pass over
the bucket's stream: its holder and epoch, how long ago its entry was written
(its last renewal, by the server's timestamp), the time left before the TTL,
and its state: held; released (a lease manager's clean release); expired (an
entry past the TTL still shown, or the server's expiry marker); removed (a
delete or purge by anyone else, such as lease release). Keys whose entry
expired without a marker (servers before 2.11, or buckets without markers)
are gone from the bucket and not listed. A read: hints.`,
  },
  shards: {
    summary: "print the members and each shard's owner",
    about:
      `Prints the members of shard group GROUP (the holders of its membership
slots), then each shard's owner and epoch ("none" when nobody holds it) and,
when it differs, the member the shard is moving to (its target for the
members seen). Reads: hints that a lagging replica may serve late.`,
  },
  release: {
    summary: "evict ID's stuck lease on KEY",
    about:
      `Evicts a stuck holder: deletes KEY's entry if (and only if) ID holds it, by
compare-and-delete on that entry's revision. The holder's command is stopped
at its next renewal; a successor still waits out the grace (an eviction is not
a clean release). While ID keeps renewing, the entry is read again and the
delete retried for up to ${
        RELEASE_BOUND_MS / 1000
      } s. Exits ${EXIT.NOT_HOLDER} when ID does not hold KEY, ${EXIT.UNAVAILABLE} when
the entry changed under every attempt (nothing was evicted).`,
  },
};

function optionWords(o: Opt): string {
  return o.arg === undefined ? o.flag : `${o.flag} ${o.arg}`;
}

/** Options as an indented table, continuation lines under the text. */
function optionTable(opts: readonly Opt[]): string {
  const label = (o: Opt) =>
    o.short === undefined ? optionWords(o) : `${o.short}, ${optionWords(o)}`;
  const width = Math.max(...opts.map((o) => label(o).length)) + 2;
  return opts.map((o) =>
    `  ${label(o).padEnd(width)}${
      o.text.replaceAll("\n", `\n  ${" ".repeat(width)}`)
    }`
  ).join("\n");
}

/** The options `lease watch` takes in place of KEY. */
const ALT_FLAGS: readonly string[] = ["--prefix", "--all"];

/**
 * A subcommand's synopsis. `brief`, for the general usage, leaves out what
 * every subcommand takes and folds two or more options into "[options]".
 */
function synopsis(sub: Sub, brief: boolean): string {
  const opts = OPTIONS.filter((o) =>
    o.subs.includes(sub) && o.flag !== "--help"
  );
  const optional = opts.filter((o) =>
    !o.required && !(brief && o.subs.length === SUBS.length) &&
    !(sub === "watch" && ALT_FLAGS.includes(o.flag))
  );
  // `watch` takes KEY, or --prefix or --all in its place; `ls` no KEY.
  const alt = (o: Opt) => sub === "watch" && ALT_FLAGS.includes(o.flag);
  return [
    "lease",
    sub,
    ...(sub === "ls" ? [] : [
      [
        sub === "shards" ? "GROUP" : "KEY",
        ...opts.filter(alt).map(optionWords),
      ].join("|"),
    ]),
    ...opts.filter((o) => o.required).map(optionWords),
    ...(brief && optional.length > 1
      ? ["[options]"]
      : optional.map((o) => `[${optionWords(o)}]`)),
    ...(sub === "run" ? ["--", "CMD", "[ARGS...]"] : []),
  ].join(" ");
}

/**
 * The usage of lease (`sub` ""), or of one subcommand: with `full` (for
 * --help) also what it does; without (after a mistake) its synopsis and
 * options only.
 */
function usage(sub: Sub | "", full: boolean): string {
  if (sub === "") {
    const lines = SUBS.map((s) => [synopsis(s, true), SUBCOMMANDS[s].summary]);
    const width = Math.max(...lines.map(([l]) => l!.length)) + 3;
    return [
      `usage: lease <${SUBS.join("|")}> KEY [options]`,
      "",
      ...lines.map(([l, summary]) => `  ${l!.padEnd(width)}${summary}`),
      "",
      "Options for every subcommand:",
      optionTable(OPTIONS.filter((o) => o.subs.length === SUBS.length)),
      "",
      "'lease <subcommand> --help' says more.",
    ].join("\n");
  }
  const { about, notes } = SUBCOMMANDS[sub];
  return [
    `usage: ${synopsis(sub, false)}`,
    ...(full ? ["", about] : []),
    "",
    "Options:",
    optionTable(OPTIONS.filter((o) => o.subs.includes(sub))),
    ...(full
      ? notes === undefined ? [] : ["", notes]
      : ["", `'lease ${sub} --help' says more.`]),
  ].join("\n");
}

const KEY_RE = /^[-/=\w]+(\.[-/=\w]+)*$/;

type Sig = "SIGINT" | "SIGTERM" | "SIGKILL";

class UsageError extends Error {
  override name = "UsageError";
  readonly code: number;
  /** Whose usage to print after the message: lease's (""), or none (null). */
  readonly usage: Sub | "" | null;
  constructor(
    message: string,
    code: number = EXIT.USAGE,
    usage: Sub | "" | null = null,
  ) {
    super(message);
    this.code = code;
    this.usage = usage;
  }
}

class NoServerError extends Error {
  override name = "NoServerError";
}

async function dial(a: Args): Promise<NatsConnection> {
  try {
    return await connect({
      servers: a.servers,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
    });
  } catch (err) {
    throw new NoServerError(
      `cannot connect to ${a.servers.join(",")}: ${(err as Error).message}`,
    );
  }
}

interface Args {
  count: number;
  maxMembers: number;
  sub: string;
  key: string;
  servers: string[];
  bucket: string;
  /** `--domain NAME`: the JetStream domain every request is addressed to. */
  domain?: string;
  ttl?: number;
  node: string;
  killAfter?: number;
  lostStatus: number;
  contain: boolean;
  /** `--allow-unverified-replicas`: createLeaseManager's override. */
  allowUnverifiedReplicas: boolean;
  json: boolean;
  /** `--prefix P` of `ls` and `watch`. */
  prefix?: string;
  /** `watch --all`. */
  all: boolean;
  help: boolean;
  command: string[];
  limit?: number;
}

function duration(
  flag: string,
  value: string | undefined,
  fail: (message: string, code: number) => UsageError,
): number {
  const n = Number(value);
  if (value === undefined || !/^\d+$/.test(value) || !Number.isSafeInteger(n)) {
    throw fail(
      `${flag} needs a duration in milliseconds (a whole number): received ${
        JSON.stringify(value ?? null)
      }`,
      EXIT.BAD_DURATION,
    );
  }
  return n;
}

/** Words as they would be typed to a shell, to copy back. */
function shellLine(words: readonly string[]): string {
  return words.map((w) =>
    /^[\w@%+=:,./-]+$/.test(w) ? w : `'${w.replaceAll("'", `'\\''`)}'`
  ).join(" ");
}

/** Parses the command line; throws {@linkcode UsageError} on bad input. */
function parse(argv: string[]): Args {
  const dash = argv.indexOf("--");
  const own = dash < 0 ? argv : argv.slice(0, dash);
  const command = dash < 0 ? [] : argv.slice(dash + 1);
  const a: Args = {
    count: 0,
    maxMembers: DEFAULT_MAX_MEMBERS,
    sub: "",
    key: "",
    servers: (process.env.NATS_URL || "127.0.0.1:4222").split(","),
    bucket: "leases",
    node: `${os.hostname()}-${process.pid}`,
    lostStatus: EXIT.LOST,
    contain: false,
    allowUnverifiedReplicas: false,
    json: false,
    all: false,
    help: false,
    command,
  };
  const rest: string[] = [];
  const given: string[] = [];
  // A mistake shows the usage of the subcommand typed (it may come after
  // the mistake), or lease's when there is none.
  const fail = (message: string, code: number = EXIT.USAGE) => {
    const sub = rest[0] ?? own.find(isSub);
    return new UsageError(message, code, isSub(sub) ? sub : "");
  };
  for (let i = 0; i < own.length; i++) {
    const word = own[i]!;
    if (!word.startsWith("-") || word === "-") {
      // A word after `lease run KEY` with no `--` anywhere: the command, the
      // `--` forgotten. Its own options (`sh -c`) would otherwise read as
      // unknown options of lease.
      if (rest[0] === "run" && rest.length === 2 && dash < 0) {
        if (a.help) break;
        throw new UsageError(
          `put -- before the command: ${
            shellLine(["lease", ...own.slice(0, i), "--", ...own.slice(i)])
          }`,
        );
      }
      rest.push(word);
      continue;
    }
    // `--opt=value` as well as `--opt value`.
    const eq = word.startsWith("--") ? word.indexOf("=") : -1;
    const flag = eq < 0 ? word : word.slice(0, eq);
    const inline = eq < 0 ? undefined : word.slice(eq + 1);
    const opt = OPTIONS.find((o) => o.flag === flag || o.short === flag);
    if (opt === undefined) throw fail(`unknown option ${flag}`);
    if (opt.arg === undefined && inline !== undefined) {
      throw fail(`${flag} takes no value: received ${word}`);
    }
    given.push(opt.flag);
    const value = (): string => {
      if (inline !== undefined) return inline;
      const v = own[++i];
      if (v === undefined) throw fail(`${flag} needs a value`);
      return v;
    };
    switch (opt.flag) {
      case "--help":
        a.help = true;
        break;
      case "--json":
        a.json = true;
        break;
      case "--all":
        a.all = true;
        break;
      case "--prefix": {
        const v = value();
        if (!KEY_RE.test(v)) {
          const stem = /^(.*?)\.?[>*]$/.exec(v)?.[1];
          throw fail(
            `invalid --prefix ${JSON.stringify(v)}: ${
              stem !== undefined && KEY_RE.test(stem)
                ? `a key, not a pattern (the keys below it are listed): --prefix ${stem}`
                : "a key (letters, digits, '-', '_', '/', '=' in '.'-separated tokens); the keys below it are listed"
            }`,
          );
        }
        a.prefix = v;
        break;
      }
      case "--contain":
        a.contain = true;
        break;
      case "--allow-unverified-replicas":
        a.allowUnverifiedReplicas = true;
        break;
      case "--servers":
        a.servers = value().split(",");
        break;
      case "--bucket":
        a.bucket = value();
        break;
      case "--domain": {
        // One subject token: requests go to `$JS.<domain>.API.>`.
        const v = value();
        if (!/^[^\s.*>]+$/.test(v)) {
          throw fail(
            `--domain needs a JetStream domain (one subject token: no '.', '*', '>' or spaces): received ${
              JSON.stringify(v)
            }`,
          );
        }
        a.domain = v;
        break;
      }
      case "--node":
        a.node = value();
        break;
      case "--ttl":
        a.ttl = duration(flag, inline ?? own[++i], fail);
        break;
      case "--kill-after":
        a.killAfter = duration(flag, inline ?? own[++i], fail);
        break;
      case "--limit": {
        const v = value();
        a.limit = Number(v);
        if (
          !/^\d+$/.test(v) || a.limit < 1 || a.limit > MAX_SEMAPHORE_LIMIT
        ) {
          throw fail(
            `${flag} needs a number of slots from 1 to ${MAX_SEMAPHORE_LIMIT}: received ${
              JSON.stringify(v)
            }`,
          );
        }
        break;
      }
      case "--count":
      case "--max-members": {
        const v = value();
        const n = Number(v);
        const max = flag === "--count" ? MAX_SHARDS : 256;
        if (!/^\d+$/.test(v) || n < 1 || n > max) {
          throw fail(
            `${flag} needs a whole number from 1 to ${max}: received ${
              JSON.stringify(v)
            }`,
          );
        }
        if (flag === "--count") a.count = n;
        else a.maxMembers = n;
        break;
      }
      case "--lost-status": {
        const v = value();
        a.lostStatus = Number(v);
        if (!/^\d+$/.test(v) || a.lostStatus < 1 || a.lostStatus > 255) {
          throw fail(
            `--lost-status needs an exit status from 1 to 255: received ${
              JSON.stringify(v)
            }`,
          );
        }
        break;
      }
    }
  }
  a.sub = rest[0] ?? "";
  if (a.help) return a;
  if (!isSub(a.sub)) {
    throw fail(
      a.sub === ""
        ? `a subcommand is needed: ${SUBS.slice(0, -1).join(", ")} or ${
          SUBS.at(-1)
        }`
        : `unknown subcommand ${JSON.stringify(a.sub)}`,
    );
  }
  const sub = a.sub;
  const other = given.find((f) =>
    !OPTIONS.some((o) => o.flag === f && o.subs.includes(sub))
  );
  if (other !== undefined) throw fail(`lease ${sub} has no option ${other}`);
  if ((sub === "ls" || a.prefix !== undefined || a.all) && dash >= 0) {
    throw fail(`lease ${sub} takes no command`);
  }
  if (sub === "ls") {
    if (rest.length > 1) {
      throw fail(
        `lease ls takes no KEY (--prefix P lists the keys below P): received ${
          rest.slice(1).join(" ")
        }`,
      );
    }
    return a;
  }
  if (sub === "watch" && (a.prefix !== undefined || a.all)) {
    if (a.prefix !== undefined && a.all) {
      throw fail("lease watch takes --prefix or --all, not both");
    }
    if (rest.length > 1) {
      throw fail(
        `lease watch takes KEY or ${
          a.all ? "--all" : "--prefix"
        }, not both: received ${rest.slice(1).join(" ")}`,
      );
    }
    return a;
  }
  if (rest.length !== 2) {
    throw fail(
      rest.length < 2
        ? `lease ${sub} needs a KEY${
          sub === "watch" ? " (or --prefix P, or --all)" : ""
        }`
        : `lease ${sub} takes one KEY: received ${rest.slice(1).join(" ")}`,
    );
  }
  a.key = rest[1]!;
  if (!KEY_RE.test(a.key)) {
    throw fail(
      `invalid key ${
        JSON.stringify(a.key)
      }: letters, digits, '-', '_', '/', '=' in '.'-separated tokens`,
      EXIT.BAD_KEY,
    );
  }
  if (sub === "run" && command.length === 0) {
    throw fail("lease run needs a command after --", EXIT.NO_COMMAND);
  }
  if (sub !== "run" && dash >= 0) {
    throw fail(`lease ${sub} takes no command`);
  }
  const missing = OPTIONS.find((o) =>
    o.required && o.subs.includes(sub) && !given.includes(o.flag)
  );
  if (missing !== undefined) {
    throw fail(
      `lease ${sub} needs ${optionWords(missing)} (${missing.text})`,
    );
  }
  if (
    a.ttl !== undefined && a.killAfter !== undefined && a.killAfter >= a.ttl
  ) {
    throw fail(
      `--kill-after must be below the TTL (${a.ttl} ms), so that the command is gone before a successor starts: received ${a.killAfter}`,
      EXIT.BAD_DURATION,
    );
  }
  if (a.ttl !== undefined && a.ttl < MIN_TTL) {
    throw fail(
      `--ttl must be at least ${MIN_TTL} ms: received ${a.ttl}`,
      EXIT.BAD_DURATION,
    );
  }
  return a;
}

function say(line: string): void {
  process.stderr.write(`lease: ${line}\n`);
}

async function open(
  a: Args,
  opts: { createBucket: boolean; node?: string },
): Promise<{ nc: NatsConnection; leases: LeaseManager }> {
  const nc = await dial(a);
  try {
    const leases = await createLeaseManager({
      nc,
      node: opts.node ?? a.node,
      bucket: a.bucket,
      createBucket: opts.createBucket,
      allowUnverifiedReplicas: a.allowUnverifiedReplicas,
      ...(a.domain === undefined ? {} : { domain: a.domain }),
      ...(a.ttl === undefined ? {} : { ttl: a.ttl }),
    });
    return { nc, leases };
  } catch (err) {
    const why = await openFailure(nc, a, opts.createBucket, err);
    await nc.close().catch(() => {});
    throw why;
  }
}

/**
 * The bucket's TTL in ms, or `undefined` when it does not exist. Read on
 * the failure paths only, to word their messages for the command line.
 */
async function bucketTtl(
  nc: NatsConnection,
  a: Args,
): Promise<number | undefined> {
  try {
    return (await (await kvm(nc, a).open(a.bucket)).status()).ttl;
  } catch (err) {
    if (isStreamNotFound(err)) return undefined;
    throw err;
  }
}

/** A KV manager whose requests go to `--domain`, when given. */
function kvm(nc: NatsConnection, a: Args): Kvm {
  return new Kvm(
    a.domain === undefined ? nc : jetstream(nc, { domain: a.domain }),
  );
}

function isStreamNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError &&
    err.code === JetStreamApiCodes.StreamNotFound;
}

function noBucket(a: Args): UnavailableError {
  return new UnavailableError(
    a.key,
    `bucket '${a.bucket}' does not exist on ${a.servers.join(",")}${
      a.domain === undefined ? "" : ` in JetStream domain '${a.domain}'`
    } (lease run creates it): check --bucket and --servers${
      a.domain === undefined ? "" : " and --domain"
    }`,
  );
}

/**
 * Why createLeaseManager() refused, worded for the command line (its own
 * messages name its API: 'ttl', 'createBucket'), from the bucket as it is
 * rather than from the text of those messages.
 */
async function openFailure(
  nc: NatsConnection,
  a: Args,
  createBucket: boolean,
  err: unknown,
): Promise<Error> {
  if (err instanceof TypeError) return new UsageError(err.message);
  if (!(err instanceof RangeError) && createBucket) {
    return new UnavailableError(a.key, (err as Error).message, { cause: err });
  }
  // null: the bucket could not be read either (no JetStream, say).
  const ttl = await bucketTtl(nc, a).catch(() => null);
  if (err instanceof RangeError) {
    if (ttl === null || ttl === undefined) return new UsageError(err.message);
    if (ttl <= 0) {
      return new UsageError(
        `bucket '${a.bucket}' has no TTL, so its leases would never expire: use another --bucket`,
      );
    }
    if (a.ttl !== undefined && ttl !== a.ttl) {
      return new UsageError(
        `bucket '${a.bucket}' has a TTL of ${ttl} ms: pass --ttl ${ttl} (or omit --ttl), or use another --bucket`,
      );
    }
    if (ttl < MIN_TTL) {
      return new UsageError(
        `bucket '${a.bucket}' has a TTL of ${ttl} ms, below the ${MIN_TTL} ms a lease needs: use another --bucket`,
      );
    }
    return new UsageError(err.message);
  }
  if (ttl === undefined) return noBucket(a);
  return new UnavailableError(
    a.key,
    // The override's name on the command line.
    (err as Error).message.replace(
      "pass allowUnverifiedReplicas: true",
      "pass --allow-unverified-replicas",
    ),
    { cause: err },
  );
}

/** Kills a process group; false when it is gone. */
function killGroup(
  pid: number,
  signal: Sig | "SIGSTOP" | "SIGCONT",
): boolean {
  try {
    process.kill(-pid, signal);
    return true;
  } catch {
    return false;
  }
}

function groupAlive(pid: number): boolean {
  try {
    process.kill(-pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * How long to wait for the watchdog's "stopping" after the command ended by
 * a signal we did not send: its line is written before its signal.
 */
const WATCHDOG_WORD_MS = 100;

/** How long the watchdog may take to load and say "ready". */
const WATCHDOG_READY_MS = 15_000;

/**
 * How long the watchdog may leave our ticks unanswered before we stop the
 * command ourselves: a watchdog stopped by SIGSTOP (or starved) could not
 * stop the command if `lease` were then killed. Long enough for a loaded
 * machine's scheduling delays (its answer is one line), short enough that
 * `lease` and its watchdog must both fail within one second of each other
 * for the command to outlive them.
 */
const WATCHDOG_SILENCE_MS = 1_000;

interface Watchdog {
  /** Sends a line (a deadline, "pgid N" or "done"). */
  send(line: string): void;
  /** True until the watchdog process has exited. */
  alive(): boolean;
  /** Ends it with SIGKILL (one that stopped answering). */
  kill(): void;
  /**
   * Milliseconds since the oldest tick it has not answered was sent (0 when
   * every tick is answered).
   */
  silence(): number;
  /** Resolves when it exits, with how it ended. */
  exited: Promise<string>;
  /**
   * Resolves true once it says it is stopping the command (its deadline
   * passed, or our pipe closed), or false after `ms` without that.
   */
  stopping(ms: number): Promise<boolean>;
}

/**
 * Starts cli_watchdog.ts under this runtime, in a process group of its own
 * (so a signal to ours or to the command's does not reach it), and resolves
 * once it says "ready": a watchdog that cannot load its module (a path that
 * does not resolve offline, a compiled binary without it) would otherwise
 * leave the command unprotected with no notice. It stops the command's group
 * when our lease runs out without news from us (we are paused) or our pipe
 * to it closes (we were killed).
 */
async function startWatchdog(
  killAfter: number,
  contain: boolean,
): Promise<Watchdog> {
  const file = import.meta.resolve("./cli_watchdog.ts");
  const script = file.startsWith("file:") ? fileURLToPath(file) : file;
  // Deno lets a program touch /sys (the cgroup of --contain) only with
  // every permission.
  const args = "Deno" in globalThis
    ? ["run", contain ? "--allow-all" : "--allow-run", script]
    : [script];
  const w = spawn(process.execPath, [...args, String(killAfter)], {
    stdio: ["pipe", "pipe", "pipe"],
    detached: true,
  });
  let running = true;
  let err = "";
  const exited = new Promise<string>((resolve) => {
    w.once("error", (e) => {
      running = false;
      resolve(`it could not be started: ${e.message}`);
    });
    w.once("exit", (code, signal) => {
      running = false;
      resolve(signal ? `it was killed by ${signal}` : `it exited ${code}`);
    });
  });
  w.stdin!.on("error", () => {});
  w.stderr!.setEncoding("utf8").on("data", (d: string) => {
    err = (err + d).slice(-2000);
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  let partial = "";
  let stopping = false;
  /** When the oldest tick not yet answered with "ok" was sent. */
  let unanswered: number | undefined;
  const onStopping = new Set<() => void>();
  try {
    await Promise.race([
      new Promise<void>((resolve) => {
        w.stdout!.setEncoding("utf8").on("data", (d: string) => {
          const lines = (partial + d).split("\n");
          partial = lines.pop()!.slice(-100);
          for (const line of lines) {
            if (line === "ready") resolve();
            else if (line === "ok") unanswered = undefined;
            else if (line === "stopping" && !stopping) {
              stopping = true;
              for (const f of onStopping) f();
            }
          }
        });
      }),
      exited.then((how) => {
        // The runtime's own report, e.g. "Error: Cannot find module ...".
        const lines = err.split("\n").map((l) => l.trim()).filter(Boolean);
        const why = lines.find((l) => /error/i.test(l)) ?? lines.at(-1);
        throw new Error(`${how}${why ? `: ${why}` : ""}`);
      }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () =>
            reject(new Error(`it did not start in ${WATCHDOG_READY_MS} ms`)),
          WATCHDOG_READY_MS,
        );
      }),
    ]);
  } catch (e) {
    w.kill("SIGKILL");
    throw e;
  } finally {
    clearTimeout(timer);
  }
  // Its stderr now goes to ours, as before; its pipes no longer keep us up.
  w.stderr!.removeAllListeners("data");
  w.stderr!.on("data", (d: string) => process.stderr.write(d));
  w.unref();
  (w.stdout as unknown as { unref?: () => void }).unref?.();
  (w.stderr as unknown as { unref?: () => void }).unref?.();
  return {
    send: (line) => {
      if (/^-?\d+$/.test(line)) unanswered ??= performance.now();
      w.stdin?.write(`${line}\n`);
    },
    alive: () => running,
    kill: () => void w.kill("SIGKILL"),
    silence: () =>
      unanswered === undefined ? 0 : performance.now() - unanswered,
    exited,
    stopping: (ms) =>
      stopping ? Promise.resolve(true) : new Promise<boolean>((resolve) => {
        const t = setTimeout(() => {
          onStopping.delete(done);
          resolve(false);
        }, ms);
        const done = () => {
          clearTimeout(t);
          resolve(true);
        };
        onStopping.add(done);
      }),
  };
}

async function run(a: Args): Promise<number> {
  const { nc, leases } = await open(a, { createBucket: true });
  const killAfter = a.killAfter ?? Math.floor(leases.ttl / 4);
  if (killAfter >= leases.ttl) {
    await leases.close();
    await nc.close();
    throw new UsageError(
      `--kill-after must be below the TTL (${leases.ttl} ms), so that the command is gone before a successor starts: received ${killAfter}`,
      EXIT.BAD_DURATION,
    );
  }
  // The watchdog first, while nothing is held: no command runs without one.
  let watchdog: Watchdog;
  try {
    watchdog = await startWatchdog(killAfter, a.contain);
  } catch (err) {
    say(
      `the watchdog did not start (${
        (err as Error).message
      }): not running the command`,
    );
    await leases.close();
    await nc.close();
    return EXIT.NO_WATCHDOG;
  }
  let cgroup: string | undefined;
  if (a.contain) {
    try {
      cgroup = makeCgroup(`lease-${process.pid}-${Date.now()}`);
    } catch (err) {
      say(`--contain: ${(err as Error).message}: not running the command`);
      watchdog.send("done");
      await leases.close();
      await nc.close();
      return EXIT.NO_CONTAIN;
    }
  }
  // Set while the command runs: what to do the moment nats.js reports the
  // connection lost.
  let onDrop: (() => void) | undefined;
  const link = nc.status();
  void (async () => {
    try {
      for await (const s of link) if (s.type === "disconnect") onDrop?.();
    } catch {
      // ends with the connection
    }
  })();
  const waiting = new AbortController();
  let forwarded: Sig | undefined;
  let child: ChildProcess | undefined;
  const onSignal = (sig: Sig) => {
    forwarded ??= sig;
    if (child?.pid !== undefined) killGroup(child.pid, sig);
    else waiting.abort(new Error(`interrupted by ${sig}`));
  };
  const onInt = () => onSignal("SIGINT");
  const onTerm = () => onSignal("SIGTERM");
  process.on("SIGINT", onInt);
  process.on("SIGTERM", onTerm);
  // Until the command starts, say who it waits for.
  const untilStarted = new AbortController();
  const reported = a.limit === undefined
    ? reportWaiting(leases, a, untilStarted.signal)
    : reportSlots(leases, a, untilStarted.signal);
  // With -n, one of the semaphore's slots: the lease is the slot's.
  const sem = a.limit === undefined
    ? undefined
    : semaphore(leases, a.key, { limit: a.limit });
  const guard = <T>(
    write: (lease: Lease & { readonly slot?: number }) => Promise<T>,
    options: GuardOptions,
  ): Promise<T> =>
    sem === undefined
      ? leases.guard(a.key, write, options)
      : sem.guard(write, options);
  let status: number;
  try {
    status = await guard(async (lease) => {
      untilStarted.abort();
      if (!watchdog.alive()) {
        say(
          `the watchdog died while waiting (${await watchdog
            .exited}): not running the command`,
        );
        return EXIT.NO_WATCHDOG;
      }
      say(
        lease.slot === undefined
          ? `holding '${a.key}' as ${a.node}, epoch ${lease.epoch}`
          : `holding slot ${lease.slot} of '${a.key}' ('${lease.key}') as ${a.node}, epoch ${lease.epoch}`,
      );
      // With --contain the command enters its cgroup before it execs, so
      // everything it starts is born inside.
      const [file, args] = cgroup === undefined
        ? [a.command[0]!, a.command.slice(1)]
        : ["sh", [
          "-c",
          'echo $$ > "$0/cgroup.procs" && exec "$@"',
          cgroup,
          ...a.command,
        ]];
      child = spawn(file, args, {
        stdio: "inherit",
        detached: true, // a process group of its own, to stop as a whole
        env: {
          ...process.env,
          LEASE_KEY: lease.key,
          LEASE_NODE: a.node,
          LEASE_EPOCH: String(lease.epoch),
          LEASE_TENURE: lease.tenure,
          ...(lease.slot === undefined
            ? {}
            : { LEASE_SLOT: String(lease.slot) }),
        },
      });
      const exited = new Promise<number>((resolve) => {
        child!.once("error", (err) => {
          say(`cannot run ${a.command[0]}: ${err.message}`);
          resolve(127);
        });
        child!.once("exit", (code, signal) => {
          resolve(
            code ?? 128 + (signal ? osSignal(signal) : 0),
          );
        });
      });
      const pid = child.pid;
      let tick: ReturnType<typeof setInterval> | undefined;
      let stopped:
        | "lost"
        | "deadline"
        | "watchdog"
        | "silent watchdog"
        | undefined;
      // The last deadline seen while the lease was vouched for: a lease
      // that ends before it cannot have lost its entry to expiry.
      let vouched = lease.deadline;
      // The command's process group, and with --contain its cgroup.
      const kill = (sig: Sig) => {
        killGroup(pid!, sig);
        if (cgroup !== undefined) signalCgroup(cgroup, sig);
      };
      const running = () =>
        groupAlive(pid!) ||
        (cgroup !== undefined && cgroupProcs(cgroup).length > 0);
      const stop = () => {
        if (frozen) {
          // Frozen since the connection dropped: the server it comes back
          // to may have lost our writes and given the key to another holder
          // at once (point 10), so the command must not run again, not even
          // to handle a SIGTERM.
          kill("SIGKILL");
          return;
        }
        kill("SIGTERM");
        setTimeout(() => {
          if (running()) kill("SIGKILL");
        }, killAfter).unref?.();
      };
      // Point 10 of the safety argument, applied to the command: from the
      // moment the connection drops, the lease is not vouched for until the
      // manager proves it again, so the command is frozen (SIGSTOP, and with
      // --contain its cgroup's freezer) and thawed only once the lease
      // counts again; a lease that does not come back kills it frozen.
      let frozen = false;
      const freeze = (on: boolean, why: string) => {
        if (frozen === on || pid === undefined) return;
        frozen = on;
        if (on) {
          if (cgroup !== undefined) freezeCgroup(cgroup, true);
          killGroup(pid, "SIGSTOP");
        } else {
          killGroup(pid, "SIGCONT");
          if (cgroup !== undefined) freezeCgroup(cgroup, false);
        }
        say(why);
      };
      const suspended = () => {
        if (lease.signal.aborted || performance.now() >= lease.deadline) {
          return false;
        }
        try {
          lease.throwIfLost();
          return false;
        } catch {
          return true;
        }
      };
      const frozenWhy =
        `the connection to the server was lost: '${lease.key}' is not vouched for until the server proves it kept it, and the command is frozen (SIGSTOP) until then`;
      if (pid !== undefined) {
        // Sent in the tick the command was spawned in, before any await: a
        // lease killed from here on leaves a watchdog that knows the group.
        if (cgroup !== undefined) watchdog.send(`cgroup ${cgroup}`);
        watchdog.send(`pgid ${pid}`);
        // How long the lease is still vouched for, every tick: if we stop
        // sending (paused), the watchdog stops the command at the deadline.
        const every = Math.min(250, leases.ttl / 10);
        let lastTick = performance.now();
        const tell = () => {
          const now = performance.now();
          // A tick much later than due means we were paused: the watchdog's
          // answers may be waiting unread behind this timer, so its silence
          // is judged at the next tick.
          const onTime = now - lastTick < 2 * every + 100;
          lastTick = now;
          if (
            onTime && stopped === undefined &&
            watchdog.silence() > WATCHDOG_SILENCE_MS && running()
          ) {
            stopped = "silent watchdog";
            say(
              `the watchdog has not answered for ${
                Math.round(watchdog.silence())
              } ms (stopped by SIGSTOP, or starved): it could not stop the command if lease were killed, so lease stops it now`,
            );
            stop();
          }
          if (!lease.signal.aborted) vouched = lease.deadline;
          if (stopped === undefined) {
            if (suspended()) freeze(true, frozenWhy);
            else if (frozen && !lease.signal.aborted) {
              freeze(
                false,
                `'${lease.key}' is proven again (epoch ${lease.epoch}): the command continues (SIGCONT)`,
              );
            }
          }
          watchdog.send(`${Math.floor(lease.deadline - now)}`);
        };
        tell();
        tick = setInterval(tell, every);
        // The drop is acted on at once, not at the next tick: the manager
        // suspends the lease when nats.js reports it, and so do we.
        onDrop = () => {
          if (stopped === undefined && running()) freeze(true, frozenWhy);
        };
        // A dead watchdog can no longer stop the command if we freeze: stop
        // it now rather than run unprotected.
        void watchdog.exited.then((how) => {
          if (stopped !== undefined || !running()) {
            return;
          }
          stopped = "watchdog";
          say(`the watchdog died (${how}): stopping the command`);
          stop();
        });
      }
      const onLost = () => {
        if (pid === undefined || stopped !== undefined) return;
        // A signal passed on lets the command end by itself, unless it is
        // frozen: it cannot act on the signal, and must not run again.
        if (forwarded !== undefined && !frozen) return;
        stopped = "lost";
        say(
          `lost '${lease.key}': ${
            whyLost(
              lease.signal.reason,
              performance.now() < vouched,
              leases.ttl,
            )
          }; ${
            frozen
              ? "killing the command, frozen since the connection dropped (SIGKILL: it must not run again)"
              : "stopping the command"
          }`,
        );
        stop();
      };
      lease.signal.addEventListener("abort", onLost, { once: true });
      let code = await exited;
      // Ended by a signal we did not send: the watchdog may have stopped it
      // at the lease's deadline a moment before our own timer saw it pass
      // (timers may fire a millisecond early). It says so on its stdout
      // before it signals, so its word is on the way if it did.
      if (
        stopped === undefined && forwarded === undefined && code > 128 &&
        await watchdog.stopping(WATCHDOG_WORD_MS)
      ) {
        stopped = "deadline";
        say(
          `lost '${lease.key}': its deadline passed; the watchdog stopped the command`,
        );
      }
      const own = stopped === undefined ? code : undefined;
      lease.signal.removeEventListener("abort", onLost);
      onDrop = undefined;
      // What it started may outlive it: stop the rest of its group (and
      // of its cgroup).
      if (pid !== undefined && running()) {
        kill("SIGTERM");
        const end = performance.now() + killAfter;
        while (running() && performance.now() < end) {
          await new Promise((r) => setTimeout(r, 20));
        }
        if (running()) kill("SIGKILL");
      }
      clearInterval(tick);
      watchdog.send("done");
      // One that does not answer may never read it.
      if (stopped === "silent watchdog") watchdog.kill();
      // The watchdog may have stopped the command at the deadline a moment
      // before our own abort handler ran: the lease ended either way.
      if (
        stopped === "lost" || stopped === "deadline" ||
        (forwarded === undefined && stopped === undefined &&
          (lease.signal.aborted || performance.now() >= lease.deadline))
      ) {
        code = a.lostStatus;
      } else if (stopped === "watchdog" || stopped === "silent watchdog") {
        code = EXIT.NO_WATCHDOG;
      } else if (own === a.lostStatus) {
        say(
          `the command itself exited ${own}, the --lost-status; the lease was held until it ended`,
        );
      }
      return code;
    }, { wait: true, signal: waiting.signal });
  } catch (err) {
    if (waiting.signal.aborted) {
      status = 128 + osSignal(forwarded ?? "SIGINT");
    } else {
      watchdog.send("done");
      await leases.close().catch(() => {});
      await nc.close().catch(() => {});
      throw err;
    }
  } finally {
    process.off("SIGINT", onInt);
    process.off("SIGTERM", onTerm);
    untilStarted.abort();
    await reported;
  }
  watchdog.send("done");
  if (cgroup !== undefined && !(await removeCgroup(cgroup))) {
    say(
      `could not remove the cgroup ${cgroup}: a process in it would not exit`,
    );
  }
  const { unreleased } = await leases.close();
  if (unreleased.length > 0) {
    say(`'${a.key}' could not be released cleanly: it expires after the TTL`);
  }
  await nc.close();
  return status;
}

/** With -n: once the wait has lasted a moment, says who holds the slots. */
async function reportSlots(
  leases: LeaseManager,
  a: Args,
  signal: AbortSignal,
): Promise<void> {
  await new Promise((r) => {
    const t = setTimeout(r, 250);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      r(undefined);
    }, { once: true });
  });
  if (signal.aborted) return;
  try {
    const held = await semaphore(leases, a.key, { limit: a.limit! }).holders();
    if (signal.aborted) return;
    say(
      `waiting for one of ${a.limit} slots of '${a.key}', held by ${
        [...held].map(([k, h]) => `${h.node} (${k}, epoch ${h.epoch})`)
          .join(", ") || "nobody (others wait in line)"
      }`,
    );
  } catch {
    // A hint only: the guard reports what stops the run.
  }
}

/**
 * How long an entry under our own node id may show in the watch before the
 * manager's "acquired" event says it is ours: the event follows the
 * compare-and-set's reply, which may arrive after the watch's news of it.
 * Past that, it is another process run with the same `--node`.
 */
const OWN_ENTRY_SETTLE_MS = 250;

/**
 * Says on stderr who `lease run` waits for: once, then at each change of
 * holder, and once when it took the key but waits out the failover grace.
 * A hint from the manager's watch until `signal` aborts (the command
 * starts); the guard alone decides when that is.
 */
async function reportWaiting(
  leases: LeaseManager,
  a: Args,
  signal: AbortSignal,
): Promise<void> {
  let last: Holder | undefined;
  let took = false;
  // The epoch of our own tenure, from the manager's event: an entry under
  // our node id is ours only with it (another process may share the id).
  let ours: number | undefined;
  let onOurs: (() => void) | undefined;
  const onAcquired = (e: LeaseAcquiredEvent) => {
    if (e.key !== a.key) return;
    ours = e.epoch;
    onOurs?.();
  };
  leases.addEventListener("acquired", onAcquired);
  try {
    for await (const h of leases.watch(a.key, { signal })) {
      if (h === null || signal.aborted) continue;
      if (h.node === a.node && ours !== h.epoch) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, OWN_ENTRY_SETTLE_MS);
          onOurs = () => {
            clearTimeout(t);
            resolve();
          };
        });
        onOurs = undefined;
        if (signal.aborted) continue;
      }
      if (h.node === a.node && ours === h.epoch) {
        if (took) continue;
        took = true;
        const grace = await graceLeft(leases, a.key);
        if (grace !== undefined && !signal.aborted) {
          say(
            `took '${a.key}' (epoch ${h.epoch}), waiting out the failover grace (${grace} ms) before starting the command`,
          );
        }
        continue;
      }
      if (last?.node === h.node && last.epoch === h.epoch) continue;
      const same = h.node === a.node
        ? ", another process run with the same --node"
        : "";
      say(
        last === undefined
          ? `waiting for '${a.key}', held by ${h.node} (epoch ${h.epoch})${same}`
          : `still waiting for '${a.key}', now held by ${h.node} (epoch ${h.epoch})${same}`,
      );
      last = h;
    }
  } catch {
    // A hint only: the guard reports what stops the run.
  } finally {
    leases.removeEventListener("acquired", onAcquired);
  }
}

/**
 * Milliseconds of failover grace left on a key this manager has taken, or
 * `undefined` when there is none (or the key is not ours). A guard refuses
 * with the time left during the grace without a round trip; past it, with
 * `check: "lease"`, it writes nothing and costs none.
 */
async function graceLeft(
  leases: LeaseManager,
  key: string,
): Promise<number | undefined> {
  try {
    await leases.guard(key, () => {}, { check: "lease" });
    return undefined;
  } catch (err) {
    return err instanceof NotHolderError ? err.retryAfter : undefined;
  }
}

/**
 * Why a lease ended, for "lost 'K': ...". `early`: it ended before its
 * deadline, so its entry was still there unless something removed it (an
 * entry expires at the earliest at the holder's deadline).
 */
function whyLost(reason: unknown, early: boolean, ttl: number): string {
  if (reason instanceof NotHolderError && reason.holder !== undefined) {
    return `it is now held by ${reason.holder}: its entry was written over, or deleted and then taken`;
  }
  if (reason instanceof NotHolderError) {
    return `its entry was deleted (an eviction with lease release --node, or the bucket was purged)${
      early ? "" : " or expired"
    }`;
  }
  if (reason instanceof UnavailableError && !early) {
    return `no renewal was confirmed within the TTL (${ttl} ms): the server was unreachable or slow, or lease was paused`;
  }
  return reason instanceof Error ? reason.message : String(reason);
}

/** A signal's number, for the shell's 128 + N convention. */
function osSignal(name: string): number {
  return (os.constants.signals as Record<string, number>)[name] ?? 0;
}

function holderLine(
  a: Args,
  h: { node: string; epoch: number } | null,
): string {
  if (a.json) return JSON.stringify({ key: a.key, holder: h });
  return h === null ? `${a.key}: none` : `${a.key}: ${h.node} epoch ${h.epoch}`;
}

async function holder(a: Args): Promise<number> {
  const { nc, leases } = await open(a, {
    createBucket: false,
    node: `lease-cli-${process.pid}`,
  });
  try {
    process.stdout.write(holderLine(a, await leases.holder(a.key)) + "\n");
    return 0;
  } finally {
    await leases.close();
    await nc.close();
  }
}

async function watch(a: Args): Promise<number> {
  const { nc, leases } = await open(a, {
    createBucket: false,
    node: `lease-cli-${process.pid}`,
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

/** A bucket's refusal, worded for the command line. */
function bucketFailure(a: Args, err: unknown): unknown {
  if (isStreamNotFound(err)) return noBucket(a);
  if (err instanceof JetStreamApiError) {
    return new UnavailableError(a.key, err.message, { cause: err });
  }
  return err;
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
async function ls(a: Args): Promise<number> {
  const nc = await dial(a);
  try {
    let rows: KeyRow[];
    try {
      rows = await listKeys(nc, a.bucket, a.prefix, a.domain);
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
async function watchMany(a: Args): Promise<number> {
  const nc = await dial(a);
  const stop = new AbortController();
  const onSig = () => stop.abort();
  process.on("SIGINT", onSig);
  process.on("SIGTERM", onSig);
  try {
    let w: KeysWatch;
    try {
      w = await watchKeys(nc, a.bucket, a.prefix, a.domain, (r) => {
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
            : holder === null
            ? `${r.key}: none (${r.state})`
            : `${r.key}: ${holder.node} epoch ${holder.epoch}`) + "\n",
        );
      });
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
        `bucket '${a.bucket}' was deleted: the watch ended (${ended.message})`,
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
async function shardsView(a: Args): Promise<number> {
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

async function release(a: Args): Promise<number> {
  const nc = await dial(a);
  try {
    const kv = await kvm(nc, a).open(a.bucket).catch((err) => {
      throw new UnavailableError(a.key, (err as Error).message, { cause: err });
    });
    // The holder renews by compare-and-set, so its entry's revision moves
    // every TTL/3 (and on every CAS-checked guard). A renewal that lands
    // between our read and our compare-and-delete makes the server refuse
    // the delete ("wrong last sequence"). That refusal deleted nothing, so
    // reading again and deleting the new revision is safe, provided the
    // node named still holds the key: an eviction must never remove a
    // successor's entry.
    const until = Date.now() + RELEASE_BOUND_MS;
    for (let attempt = 1;; attempt++) {
      const e = await kv.get(a.key);
      const node = e?.operation === "PUT" ? e.string() : undefined;
      if (node !== a.node) {
        say(
          `'${a.key}' is ${
            node === undefined ? "not held by anyone" : `held by ${node}`
          }, not by ${a.node}: nothing evicted`,
        );
        return EXIT.NOT_HOLDER;
      }
      try {
        // An untagged delete on exactly that entry: a successor treats it
        // as an operator's delete and waits the holder's TTL and the grace.
        await kv.delete(a.key, { previousSeq: e!.revision });
      } catch (err) {
        const raced = err instanceof JetStreamApiError &&
          (err.code === 10071 || err.code === 10164);
        if (!raced) throw err;
        if (Date.now() < until) continue;
        say(
          `'${a.key}' changed under each of ${attempt} attempts in ${RELEASE_BOUND_MS} ms ` +
            `(${a.node} keeps writing it): nothing evicted; try again`,
        );
        return EXIT.UNAVAILABLE;
      }
      say(
        `evicted ${a.node} from '${a.key}' (revision ${e!.revision}` +
          (attempt > 1 ? `, attempt ${attempt})` : ")"),
      );
      return 0;
    }
  } catch (err) {
    if (isStreamNotFound(err)) throw noBucket(a);
    if (err instanceof JetStreamApiError) {
      // An answer the server gave, not a crash of ours: say it plainly.
      throw new UnavailableError(a.key, err.message, { cause: err });
    }
    throw err;
  } finally {
    await nc.close();
  }
}

/**
 * Runs the `lease` command with `argv` (without the runtime and script) and
 * resolves with its exit status. Prints to stdout and stderr.
 *
 * @param argv The arguments, e.g. `["holder", "orders", "--json"]`.
 * @returns The exit status.
 *
 * @example
 * ```ts ignore
 * process.exitCode = await main(process.argv.slice(2));
 * ```
 */
export async function main(argv: string[]): Promise<number> {
  let a: Args;
  try {
    a = parse(argv);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    say(err.message);
    if (err.usage !== null) {
      process.stderr.write(`${usage(err.usage, false)}\n`);
    }
    return err.code;
  }
  if (a.help) {
    process.stdout.write(`${usage(isSub(a.sub) ? a.sub : "", true)}\n`);
    return 0;
  }
  try {
    switch (a.sub) {
      case "run":
        return await run(a);
      case "holder":
        return await holder(a);
      case "watch":
        return a.prefix !== undefined || a.all
          ? await watchMany(a)
          : await watch(a);
      case "ls":
        return await ls(a);
      case "shards":
        return await shardsView(a);
      default:
        return await release(a);
    }
  } catch (err) {
    if (err instanceof UsageError) {
      say(err.message);
      return err.code;
    }
    if (err instanceof NoServerError) {
      say(err.message);
      return EXIT.NO_SERVER;
    }
    if (err instanceof UnavailableError) {
      say(err.message);
      return EXIT.UNAVAILABLE;
    }
    if (err instanceof LimitMismatchError) {
      say(err.message);
      return EXIT.LIMIT_MISMATCH;
    }
    throw err;
  }
}

// Run as a program (not imported): Deno and Bun say so; Node 24 by argv.
const meta = import.meta as { main?: boolean };
if (
  meta.main ??
    (process.argv[1] !== undefined &&
      path.resolve(process.argv[1]) === fileURLToPath(import.meta.url))
) {
  process.exit(await main(process.argv.slice(2)));
}
