/**
 * The command line of `lease`: its options (one table, the source of the
 * parser's flags and of every usage text), the subcommands' help, and the
 * parser. A mistake is a {@linkcode UsageError} carrying its exit status,
 * thrown before anything connects.
 *
 * @module
 */

import process from "node:process";
import * as os from "node:os";
import { MAX_CONTROL_LINE, maxKeyLength, MIN_TTL } from "../lease.ts";
import { maxStreamKeyLength, STREAM_RE } from "../lease/input.ts";
import {
  LONGEST_SUFFIX as SEMAPHORE_SUFFIX,
  MAX_SEMAPHORE_LIMIT,
} from "../semaphore.ts";
import {
  DEFAULT_MAX_MEMBERS,
  MAX_SHARDS,
  memberKey,
  shardKey,
} from "../shards.ts";
import { SUBJECT_RE } from "../lease/fenced.ts";
import { EXIT } from "./exit.ts";

/** How long `lease release` keeps trying while the holder keeps renewing. */
export const RELEASE_BOUND_MS = 5_000;

/** A subcommand of `lease`. */
export type Sub =
  | "run"
  | "holder"
  | "watch"
  | "ls"
  | "release"
  | "shards"
  | "put"
  | "delete"
  | "publish";
/** The operators' subcommands, which the general usage lists first. */
const SUBS: readonly Sub[] = [
  "run",
  "holder",
  "watch",
  "ls",
  "release",
  "shards",
];
/**
 * The fenced writes of a command run by `lease run`: `put` and `delete` on
 * a fenced bucket (cli/fenced.ts), `publish` with `--stream`
 * (cli/stream.ts). They take their tenure from its environment.
 */
const TENURE_SUBS: readonly Sub[] = ["put", "delete", "publish"];
const ALL_SUBS: readonly Sub[] = [...SUBS, ...TENURE_SUBS];
/** The subcommands that work on a bucket: all but `publish`. */
const BUCKET_SUBS: readonly Sub[] = [...SUBS, "put", "delete"];
/**
 * The subcommands that take `--stream` and `--lease-subjects` (leases in a
 * stream of the user's); `publish` reads them from the environment.
 */
const STREAM_SUBS: readonly Sub[] = ["run", "holder", "watch", "ls"];

/** Whether `word` names a subcommand. */
export function isSub(word: string | undefined): word is Sub {
  return (ALL_SUBS as readonly (string | undefined)[]).includes(word);
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
    subs: ALL_SUBS,
    text: "NATS server(s), comma-separated (default: $NATS_URL, then\n" +
      "127.0.0.1:4222; put, delete, publish: $LEASE_SERVERS first)",
  },
  {
    flag: "--bucket",
    arg: "NAME",
    subs: BUCKET_SUBS,
    text: "lease bucket (default: leases; put and delete: $LEASE_BUCKET,\n" +
      "which it must match when given; not with --stream)",
  },
  {
    flag: "--domain",
    arg: "NAME",
    subs: BUCKET_SUBS,
    text: "JetStream domain of the bucket, for a client of a leaf node\n" +
      "whose bucket is in the hub's domain (default: the server's own;\n" +
      "put and delete: $LEASE_DOMAIN; not with --stream)",
  },
  {
    flag: "--stream",
    arg: "NAME",
    subs: STREAM_SUBS,
    text: "keep the leases in this stream of yours, not in a bucket",
  },
  {
    flag: "--lease-subjects",
    arg: "PREFIX",
    subs: STREAM_SUBS,
    text: "with --stream: their subject prefix (PREFIX.k.KEY, PREFIX.s.ID)",
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
    flag: "--fenced",
    subs: ["run"],
    text: "create the bucket fenced when it does not exist (an existing\n" +
      "bucket's layout is read from it; --fenced on a classic one is\n" +
      "refused)",
  },
  {
    flag: "--limit",
    short: "-n",
    arg: "N",
    subs: ["run"],
    text: "run CMD in one of N slots of KEY (at most N at once)",
  },
  {
    flag: "--resize",
    subs: ["run"],
    text: "with -n: change N while runs with another N hold slots",
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
    text: "skip the check of the bucket's (or stream's) servers' versions",
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
    subs: ALL_SUBS,
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
(and LEASE_BUCKET, LEASE_SERVERS, and LEASE_DOMAIN with --domain) in its
environment, renewing the lease while it runs. When CMD exits the lease is
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
are held. Every run of KEY must give the same N, or lease exits ${EXIT.LIMIT_MISMATCH}.
To change N while runs go on, give the new N with --resize: such a run counts
every held slot, whatever its N, against its own, and a run without it counts
those slots against its own N, so at most the larger N run at once. Once no
run with the old N is left, --resize may be dropped.

On a fenced bucket (read from the bucket; --fenced creates one), the epoch is
the revision of KEY's tenure entry, and CMD may write data keys of the bucket
with 'lease put KEY VALUE' and 'lease delete KEY': the server stores them only
while this tenure lasts. A takeover needs no grace there: a crashed holder's
key is taken within milliseconds. An eviction or takeover is seen within a
third of the TTL, and CMD is then stopped.

With --stream NAME --lease-subjects PREFIX, the leases live in that stream of
yours (fenced, as on a fenced bucket; nats-server 2.11.2 or later; the stream is
never created or changed): KEY's tenure entry is PREFIX.k.KEY. --bucket,
--domain and --fenced do not apply, and --ttl (1000 or more) is this run's own:
give every run on the stream the same. CMD gets LEASE_STREAM and LEASE_SUBJECTS
instead of LEASE_BUCKET and LEASE_DOMAIN, and may append to the stream with
'lease publish SUBJECT DATA': the server stores an append only while this
tenure lasts.`,
    notes:
      `Exit statuses of its own: ${EXIT.USAGE} bad arguments, ${EXIT.BAD_KEY} an invalid KEY (or one too
long for the bucket), ${EXIT.BAD_DURATION} a bad duration, ${EXIT.NO_COMMAND} no command after --, ${EXIT.NO_SERVER} no server reachable, ${EXIT.UNAVAILABLE} no JetStream (or the server stopped
answering before the command started), ${EXIT.NO_WATCHDOG} the watchdog did not start or died, ${EXIT.LOST}
(or --lost-status) lease lost while CMD ran, ${EXIT.LIMIT_MISMATCH} (-n) a slot of KEY is held under
another N.`,
  },
  holder: {
    summary: "print who holds KEY",
    about:
      `Prints the holder of KEY and its epoch ("none" when nobody holds it). A read:
a hint that a lagging replica may serve late. On a fenced bucket, a tenure
whose holder's session is over prints "none (orphaned: NODE epoch N)": the
next node to ask takes it at once. With --stream NAME --lease-subjects PREFIX,
KEY's tenure entry in that stream (PREFIX.k.KEY), read in the same way.`,
  },
  watch: {
    summary: "print every change of holder",
    about:
      `Prints the holder of KEY, then a line for every change (new holder, release,
expiry), until interrupted. With --prefix P (the keys below P) or --all (the
whole bucket), one line per key first, then one per change of any of them,
with why a key is free: "KEY: none (released|expired|removed)". Renewals are
not changes. On a fenced bucket only the leases' tenure entries are followed
(never the data keys or the sessions), and a tenure whose holder's session
ended shows as "KEY: none (orphaned: NODE epoch N)". With --stream NAME
--lease-subjects PREFIX, the same for the tenure entries in that stream.`,
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
are gone from the bucket and not listed. A read: hints.

On a fenced bucket it lists the leases' tenure entries only (not the data
keys, nor the sessions): RENEWED and EXPIRES IN are those of the holder's
session, and a tenure whose session is over is "orphaned" (free to take).
With --stream NAME --lease-subjects PREFIX, the same for the leases in that
stream: the tenure entries under PREFIX.k., never the stream's other
messages nor the sessions (PREFIX.s.).`,
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
the entry changed under every attempt (nothing was evicted). On a fenced
bucket it deletes KEY's tenure entry: a successor takes KEY at once, the
server refuses the evicted holder's fenced writes from then on, and its
lease run stops its command within a third of the TTL.`,
  },
  put: {
    summary: "store VALUE at KEY, fenced by the tenure",
    about:
      `For a command run by 'lease run' on a fenced bucket: stores VALUE (or stdin,
with -) at the data key KEY of LEASE_BUCKET, in one write fenced by the tenure
of LEASE_KEY at LEASE_EPOCH, and prints its revision. The server stores it only
while that tenure lasts: once another node took LEASE_KEY (or the tenure was
released or evicted), it refuses the write, nothing is stored, and put exits
${EXIT.NOT_HOLDER}. It needs no session of its own, so a command that outlives its lease run
writes nothing. Readers read KEY with any KV client. Keys under '_lease.' hold
the leases themselves and are refused.`,
    notes:
      `Exit statuses: 0 stored, ${EXIT.NOT_HOLDER} refused (the tenure is over), ${EXIT.USAGE} bad arguments or
environment (no LEASE_EPOCH, a classic bucket), ${EXIT.BAD_KEY} an invalid KEY, ${EXIT.NO_SERVER} no server
reachable, ${EXIT.UNAVAILABLE} no JetStream, no such bucket, or no answer (then it may be stored).`,
  },
  publish: {
    summary: "append DATA to SUBJECT, fenced by the tenure",
    about:
      `For a command run by 'lease run --stream NAME --lease-subjects PREFIX': appends
DATA (or stdin, with -) to SUBJECT of the stream LEASE_STREAM, in one publish
fenced by the tenure of LEASE_KEY at LEASE_EPOCH (its entry
LEASE_SUBJECTS.k.LEASE_KEY), from a connection of its own, and prints the
message's stream sequence. The server stores it only while that tenure lasts:
once another node took LEASE_KEY (or the tenure was released or evicted), it
refuses the append, nothing is stored, and publish exits ${EXIT.NOT_HOLDER}. Refused before
anything is sent: a SUBJECT with wildcards or under LEASE_SUBJECTS (the leases
themselves) and, after one stream-info request, one the stream's subjects do
not cover.`,
    notes:
      `Exit statuses: 0 stored, ${EXIT.NOT_HOLDER} refused (the tenure is over), ${EXIT.USAGE} bad arguments or
environment (no LEASE_STREAM or LEASE_EPOCH), ${EXIT.BAD_KEY} an invalid SUBJECT (a pattern,
under LEASE_SUBJECTS, or not one of the stream's), ${EXIT.NO_SERVER} no server reachable,
${EXIT.UNAVAILABLE} no JetStream, no such stream, or no answer (then it may be stored).`,
  },
  delete: {
    summary: "delete KEY, fenced by the tenure",
    about:
      `For a command run by 'lease run' on a fenced bucket: deletes the data key KEY
of LEASE_BUCKET (a KV delete), in one write fenced by the tenure of LEASE_KEY at
LEASE_EPOCH, as 'lease put' stores, and prints its revision; exits ${EXIT.NOT_HOLDER} when the
server refused it because the tenure is over.`,
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

/**
 * Whether every subcommand on a bucket takes `o` (`publish`, on a stream,
 * takes only `--servers` and `--help` of those): the general usage lists
 * these once, and a brief synopsis leaves them out.
 */
function everywhere(o: Opt): boolean {
  return BUCKET_SUBS.every((s) => o.subs.includes(s));
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
    !o.required && !(brief && everywhere(o)) &&
    !(sub === "watch" && ALT_FLAGS.includes(o.flag))
  );
  // `watch` takes KEY, or --prefix or --all in its place; `ls` no KEY.
  const alt = (o: Opt) => sub === "watch" && ALT_FLAGS.includes(o.flag);
  return [
    "lease",
    sub,
    ...(sub === "ls" ? [] : [
      [
        sub === "shards" ? "GROUP" : sub === "publish" ? "SUBJECT" : "KEY",
        ...opts.filter(alt).map(optionWords),
      ].join("|"),
    ]),
    ...(sub === "put" ? ["VALUE|-"] : sub === "publish" ? ["DATA|-"] : []),
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
export function usage(sub: Sub | "", full: boolean): string {
  if (sub === "") {
    const line = (s: Sub) => [synopsis(s, true), SUBCOMMANDS[s].summary];
    const lines = SUBS.map(line);
    const tenure = TENURE_SUBS.map(line);
    const width = Math.max(...[...lines, ...tenure].map(([l]) => l!.length)) +
      3;
    const table = (ls: string[][]) =>
      ls.map(([l, summary]) => `  ${l!.padEnd(width)}${summary}`);
    return [
      `usage: lease <${SUBS.join("|")}> KEY [options]`,
      "",
      ...table(lines),
      "",
      "In a command run by lease run on a fenced bucket (put, delete) or",
      "with --stream (publish):",
      ...table(tenure),
      "",
      "Options for every subcommand (publish: --servers and --help only):",
      optionTable(OPTIONS.filter(everywhere)),
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

/**
 * A mistake on the command line (or an option the bucket refuses): its
 * message, the exit status, and whose usage to print after it.
 */
export class UsageError extends Error {
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

/**
 * The tenure `lease put` and `lease delete` write under: what `lease run`
 * gives its command (LEASE_BUCKET, LEASE_KEY, LEASE_EPOCH).
 */
export interface TenureEnv {
  /** LEASE_BUCKET. */
  readonly bucket: string;
  /** LEASE_KEY: the lease key (a slot's key under `-n`). */
  readonly key: string;
  /** LEASE_EPOCH: the revision of the key's tenure entry. */
  readonly epoch: number;
}

/**
 * Reads LEASE_BUCKET, LEASE_KEY and LEASE_EPOCH for `lease put` and
 * `lease delete`; throws a {@linkcode UsageError} naming what is missing
 * or malformed.
 */
function tenureEnv(
  env: Record<string, string | undefined>,
  sub: string,
): TenureEnv {
  if (!env.LEASE_BUCKET && env.LEASE_STREAM) {
    // A tenure in a stream fences appends, not KV writes: no bucket to
    // write to (and a stream's subjects are no KV keys).
    throw new UsageError(
      `lease ${sub} writes to a fenced bucket, but this command runs under lease run --stream (LEASE_STREAM is ${
        JSON.stringify(env.LEASE_STREAM)
      }), whose tenure fences appends to that stream: use lease publish SUBJECT DATA; nothing was sent`,
    );
  }
  const names = ["LEASE_BUCKET", "LEASE_KEY", "LEASE_EPOCH"] as const;
  const missing = names.filter((n) => !env[n]);
  if (missing.length > 0) {
    throw new UsageError(
      `lease ${sub} writes under the tenure of a command run by lease run on a fenced bucket, and ${
        missing.join(", ")
      } ${
        missing.length === 1 ? "is" : "are"
      } not set: run it inside such a command (lease run --fenced KEY -- sh -c 'lease ${sub} ...'); nothing was sent`,
    );
  }
  const epoch = epochEnv(env);
  if (!/^[-\w]+$/.test(env.LEASE_BUCKET!) || !KEY_RE.test(env.LEASE_KEY!)) {
    throw new UsageError(
      `LEASE_BUCKET and LEASE_KEY must name a bucket and a key: received ${
        JSON.stringify(env.LEASE_BUCKET)
      } and ${JSON.stringify(env.LEASE_KEY)}; nothing was sent`,
    );
  }
  return { bucket: env.LEASE_BUCKET!, key: env.LEASE_KEY!, epoch };
}

/** LEASE_EPOCH, checked: the tenure entry's revision (from 1). */
function epochEnv(env: Record<string, string | undefined>): number {
  const epoch = Number(env.LEASE_EPOCH);
  if (
    !/^\d+$/.test(env.LEASE_EPOCH!) || !Number.isSafeInteger(epoch) ||
    epoch < 1
  ) {
    throw new UsageError(
      `LEASE_EPOCH must be the tenure's revision (a whole number from 1): received ${
        JSON.stringify(env.LEASE_EPOCH)
      }; nothing was sent`,
    );
  }
  return epoch;
}

/**
 * The tenure `lease publish` appends under: what `lease run --stream`
 * gives its command (LEASE_STREAM, LEASE_SUBJECTS, LEASE_KEY, LEASE_EPOCH).
 */
export interface StreamTenureEnv {
  /** LEASE_STREAM: the stream the leases live in. */
  readonly stream: string;
  /** LEASE_SUBJECTS: the subject prefix they live under. */
  readonly leaseSubjects: string;
  /** LEASE_KEY: the lease key (a slot's key under `-n`). */
  readonly key: string;
  /** LEASE_EPOCH: the stream sequence of the key's tenure entry. */
  readonly epoch: number;
}

/**
 * Reads LEASE_STREAM, LEASE_SUBJECTS, LEASE_KEY and LEASE_EPOCH for `lease
 * publish`; throws a {@linkcode UsageError} naming what is missing or
 * malformed (or, under a `lease run` on a bucket, what to use instead).
 */
function streamTenureEnv(
  env: Record<string, string | undefined>,
): StreamTenureEnv {
  if (!env.LEASE_STREAM && env.LEASE_BUCKET) {
    throw new UsageError(
      `lease publish appends to a stream, but this command runs under lease run on bucket ${
        JSON.stringify(env.LEASE_BUCKET)
      } (LEASE_BUCKET), whose tenure fences writes to that bucket: use lease put KEY VALUE or lease delete KEY (on a fenced bucket), or run the command with lease run --stream NAME --lease-subjects PREFIX; nothing was sent`,
    );
  }
  const names = [
    "LEASE_STREAM",
    "LEASE_SUBJECTS",
    "LEASE_KEY",
    "LEASE_EPOCH",
  ] as const;
  const missing = names.filter((n) => !env[n]);
  if (missing.length > 0) {
    throw new UsageError(
      `lease publish appends under the tenure of a command run by lease run --stream, and ${
        missing.join(", ")
      } ${
        missing.length === 1 ? "is" : "are"
      } not set: run it inside such a command (lease run --stream NAME --lease-subjects PREFIX KEY -- sh -c 'lease publish ...'); nothing was sent`,
    );
  }
  const epoch = epochEnv(env);
  if (
    !STREAM_RE.test(env.LEASE_STREAM!) ||
    !SUBJECT_RE.test(env.LEASE_SUBJECTS!) || !KEY_RE.test(env.LEASE_KEY!)
  ) {
    throw new UsageError(
      `LEASE_STREAM, LEASE_SUBJECTS and LEASE_KEY must name a stream, a subject prefix and a key: received ${
        JSON.stringify(env.LEASE_STREAM)
      }, ${JSON.stringify(env.LEASE_SUBJECTS)} and ${
        JSON.stringify(env.LEASE_KEY)
      }; nothing was sent`,
    );
  }
  return {
    stream: env.LEASE_STREAM!,
    leaseSubjects: env.LEASE_SUBJECTS!,
    key: env.LEASE_KEY!,
    epoch,
  };
}

/** The command line, parsed: the subcommand, its KEY and its options. */
export interface Args {
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
  /** `--resize` of `run -n`: the semaphore's `resize`. */
  resize: boolean;
  /** `--prefix P` of `ls` and `watch`. */
  prefix?: string;
  /** `watch --all`. */
  all: boolean;
  help: boolean;
  command: string[];
  limit?: number;
  /** `run --fenced`: create the bucket fenced when it does not exist. */
  fenced: boolean;
  /** `put KEY VALUE`: the value as given (`-`: read stdin). */
  value?: string;
  /** `put` and `delete`: the tenure, from the environment. */
  tenure?: TenureEnv;
  /** `--stream NAME`: the leases live in this stream of the user's. */
  stream?: string;
  /** `--lease-subjects PREFIX`: with `--stream`, where they live in it. */
  leaseSubjects?: string;
  /** `publish SUBJECT DATA`: the subject (DATA is `value`). */
  subject?: string;
  /** `publish`: the tenure in a stream, from the environment. */
  streamTenure?: StreamTenureEnv;
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

/**
 * `put` and `delete`: the tenure from the environment, and the bucket,
 * servers and domain `lease run` gave its command unless given here. A
 * `--bucket` other than LEASE_BUCKET is refused: the epoch is a revision
 * of LEASE_BUCKET's stream, and means nothing in another.
 */
function tenureArgs(
  a: Args,
  given: string[],
  fail: (message: string, code?: number) => UsageError,
): void {
  const env = process.env;
  a.tenure = tenureEnv(env, a.sub);
  if (given.includes("--bucket") && a.bucket !== a.tenure.bucket) {
    throw fail(
      `--bucket ${a.bucket} is not LEASE_BUCKET (${a.tenure.bucket}), the bucket of the tenure lease ${a.sub} writes under: omit --bucket`,
    );
  }
  a.bucket = a.tenure.bucket;
  if (!given.includes("--servers") && env.LEASE_SERVERS) {
    a.servers = env.LEASE_SERVERS.split(",");
  }
  if (!given.includes("--domain") && env.LEASE_DOMAIN) {
    if (!/^[^\s.*>]+$/.test(env.LEASE_DOMAIN)) {
      throw fail(
        `LEASE_DOMAIN needs a JetStream domain: received ${
          JSON.stringify(env.LEASE_DOMAIN)
        }`,
      );
    }
    a.domain = env.LEASE_DOMAIN;
  }
}

/**
 * `publish`: the tenure in a stream from the environment, and the servers
 * `lease run --stream` gave its command unless `--servers` is given.
 */
function streamTenureArgs(a: Args, given: string[]): void {
  a.streamTenure = streamTenureEnv(process.env);
  a.key = a.streamTenure.key;
  if (!given.includes("--servers") && process.env.LEASE_SERVERS) {
    a.servers = process.env.LEASE_SERVERS.split(",");
  }
}

/** The options that say where the leases are in a bucket, not a stream. */
const BUCKET_FLAGS: readonly string[] = ["--bucket", "--domain", "--fenced"];

/**
 * `--stream NAME --lease-subjects PREFIX`: both, and none of the options
 * of a bucket (checked before anything connects).
 */
function streamArgs(
  a: Args,
  given: string[],
  fail: (message: string, code?: number) => UsageError,
): void {
  if (a.stream === undefined) {
    throw fail(
      `--lease-subjects names where the leases live in a stream of yours: give the stream with --stream NAME`,
    );
  }
  if (a.leaseSubjects === undefined) {
    throw fail(
      `--stream needs --lease-subjects PREFIX, the subject prefix the leases live under in stream '${a.stream}' (KEY's tenure entry is PREFIX.k.KEY)`,
    );
  }
  const bucketFlag = BUCKET_FLAGS.find((f) => given.includes(f));
  if (bucketFlag !== undefined) {
    throw fail(
      `${bucketFlag} does not apply with --stream: the leases live in stream '${a.stream}' under '${a.leaseSubjects}', not in a bucket, so omit ${bucketFlag}`,
    );
  }
  // Fenced, as a fenced bucket is: a session's TTL is whole seconds.
  if (a.ttl !== undefined && a.ttl < 1000) {
    throw fail(
      `--ttl must be at least 1000 ms for leases in a stream (a session's entry expires by a per-message TTL of whole seconds): received ${a.ttl}`,
      EXIT.BAD_DURATION,
    );
  }
}

/**
 * The longest SUBJECT of `lease publish`: its publish's control line
 * (`HPUB <subject> <reply> <sizes>`) must fit the server's, with room for
 * nats.js's reply inbox and the sizes.
 */
const MAX_PUBLISH_SUBJECT = MAX_CONTROL_LINE - 128;

/**
 * `publish SUBJECT DATA`: its words, and SUBJECT checked against what can
 * be known before connecting (exit 65): a subject, not a pattern, outside
 * LEASE_SUBJECTS, short enough for the server's control line.
 */
function publishWords(
  a: Args,
  rest: string[],
  command: boolean,
  fail: (message: string, code?: number) => UsageError,
): Args {
  if (rest.length !== 3) {
    throw fail(
      `lease publish needs SUBJECT and DATA (- reads DATA from stdin): received ${
        rest.length - 1
      } word${rest.length === 2 ? "" : "s"}`,
    );
  }
  if (command) throw fail("lease publish takes no command");
  const subject = rest[1]!;
  const prefix = a.streamTenure!.leaseSubjects;
  if (!SUBJECT_RE.test(subject)) {
    throw fail(
      `invalid subject ${
        JSON.stringify(subject)
      }: one subject to append to, non-empty '.'-separated tokens without whitespace, '*' or '>' (not a pattern); nothing was sent`,
      EXIT.BAD_KEY,
    );
  }
  if (subject === prefix || subject.startsWith(`${prefix}.`)) {
    throw fail(
      `invalid subject ${
        JSON.stringify(subject)
      }: subjects under '${prefix}' (LEASE_SUBJECTS) hold the leases themselves; nothing was sent`,
      EXIT.BAD_KEY,
    );
  }
  if (subject.length > MAX_PUBLISH_SUBJECT) {
    throw fail(
      `SUBJECT ${
        JSON.stringify(subject.slice(0, 24))
      }... is ${subject.length} characters long: at most ${MAX_PUBLISH_SUBJECT}, or the publish would overflow nats-server's ${MAX_CONTROL_LINE}-byte control line and the server would close the connection; nothing was sent`,
      EXIT.BAD_KEY,
    );
  }
  a.subject = subject;
  a.value = rest[2]!;
  return a;
}

/** Parses the command line; throws {@linkcode UsageError} on bad input. */
export function parse(argv: string[]): Args {
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
    resize: false,
    all: false,
    help: false,
    command,
    fenced: false,
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
    // `--opt=value` as well as `--opt value`; `-n=3` as well as `-n 3`.
    const eq = word.indexOf("=");
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
    // A value that must say something: an empty (or blank) one would only
    // fail after connecting, or not at all (`release --node ""` would
    // report that "" does not hold the key).
    const text = (what: string): string => {
      const v = value();
      if (v.trim() === "") {
        throw fail(`${flag} needs ${what}: received ${JSON.stringify(v)}`);
      }
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
      case "--fenced":
        a.fenced = true;
        break;
      case "--resize":
        a.resize = true;
        break;
      case "--allow-unverified-replicas":
        a.allowUnverifiedReplicas = true;
        break;
      case "--servers": {
        const v = text("one or more server URLs, comma-separated");
        a.servers = v.split(",");
        if (a.servers.some((u) => u.trim() === "")) {
          throw fail(
            `--servers needs server URLs, comma-separated, none empty: received ${
              JSON.stringify(v)
            }`,
          );
        }
        break;
      }
      case "--bucket": {
        // Checked here, not after connecting: the keys' room depends on it.
        const v = text("a bucket name");
        if (!/^[-\w]+$/.test(v)) {
          throw fail(
            `--bucket needs a bucket name (ASCII letters, digits, '-' or '_'): received ${
              JSON.stringify(v)
            }`,
          );
        }
        a.bucket = v;
        break;
      }
      case "--stream": {
        const v = text("a stream name");
        if (!STREAM_RE.test(v)) {
          throw fail(
            `--stream needs a stream name (no whitespace, '.', '*', '>', '/' or '\\'): received ${
              JSON.stringify(v)
            }`,
          );
        }
        a.stream = v;
        break;
      }
      case "--lease-subjects": {
        const v = text("a subject prefix");
        if (!SUBJECT_RE.test(v)) {
          const stem = /^(.*?)\.?[>*]$/.exec(v)?.[1];
          throw fail(
            `--lease-subjects needs the subject prefix the leases live under (e.g. orders.lease): non-empty '.'-separated tokens without whitespace, '*' or '>'${
              stem !== undefined && SUBJECT_RE.test(stem)
                ? ` (a prefix, not a pattern: --lease-subjects ${stem})`
                : ""
            }: received ${JSON.stringify(v)}`,
          );
        }
        a.leaseSubjects = v;
        break;
      }
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
        a.node = text("a node id");
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
  if (
    (sub === "release" || sub === "shards") &&
    (given.includes("--stream") || given.includes("--lease-subjects"))
  ) {
    throw fail(
      `lease ${sub} does not support leases in a stream (--stream) yet: run, holder, watch, ls and publish do`,
    );
  }
  const other = given.find((f) =>
    !OPTIONS.some((o) => o.flag === f && o.subs.includes(sub))
  );
  if (other !== undefined) throw fail(`lease ${sub} has no option ${other}`);
  if (a.resize && a.limit === undefined) {
    throw fail("--resize changes the N of -n N: give -n too");
  }
  if (sub === "put" || sub === "delete") tenureArgs(a, given, fail);
  if (sub === "publish") streamTenureArgs(a, given);
  if (given.includes("--stream") || given.includes("--lease-subjects")) {
    streamArgs(a, given, fail);
  }
  // The longest key of the bucket (lease connects with nats.js's default
  // inbox prefix): a longer one would make the server close the connection
  // on its first request, so it is refused here, before connecting.
  const room = a.stream !== undefined && a.leaseSubjects !== undefined
    ? maxStreamKeyLength(a.stream, a.leaseSubjects)
    : maxKeyLength(
      a.bucket,
      a.domain === undefined ? "$JS.API" : `$JS.${a.domain}.API`,
    );
  const tooLong = (
    what: string,
    v: string,
    max: number,
    code: number,
    why = "",
  ) =>
    fail(
      `${what} ${
        JSON.stringify(v.slice(0, 24))
      }... is ${v.length} characters long: at most ${max} ${
        a.stream !== undefined
          ? `in stream '${a.stream}' under '${a.leaseSubjects}'`
          : `on bucket '${a.bucket}'${
            a.domain === undefined ? "" : ` in domain '${a.domain}'`
          }`
      }${why}, or a subject would overflow nats-server's ${MAX_CONTROL_LINE}-byte control line and the server would close the connection`,
      code,
    );
  // A key below P (`P.x`) is at least two characters longer.
  if (a.prefix !== undefined && a.prefix.length > room - 2) {
    throw tooLong("--prefix", a.prefix, room - 2, EXIT.USAGE);
  }
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
  if (sub === "publish") return publishWords(a, rest, dash >= 0, fail);
  if (rest.length !== (sub === "put" ? 3 : 2)) {
    if (sub === "put") {
      throw fail(
        `lease put needs KEY and VALUE (- reads VALUE from stdin): received ${
          rest.length - 1
        } word${rest.length === 2 ? "" : "s"}`,
      );
    }
    throw fail(
      rest.length < 2
        ? `lease ${sub} needs a KEY${
          sub === "watch" ? " (or --prefix P, or --all)" : ""
        }`
        : `lease ${sub} takes one KEY: received ${rest.slice(1).join(" ")}`,
    );
  }
  a.key = rest[1]!;
  if (sub === "put") a.value = rest[2]!;
  if (!KEY_RE.test(a.key)) {
    throw fail(
      `invalid key ${
        JSON.stringify(a.key)
      }: letters, digits, '-', '_', '/', '=' in '.'-separated tokens`,
      EXIT.BAD_KEY,
    );
  }
  if ((sub === "put" || sub === "delete") && a.key.startsWith("_lease.")) {
    throw fail(
      `invalid key ${
        JSON.stringify(a.key)
      }: keys under '_lease.' hold the leases themselves; nothing was sent`,
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
  // What the keys made from KEY add to it: a semaphore's (-n), a shard
  // group's (the members' and the shards' keys lease shards reads).
  const added = a.limit !== undefined
    ? SEMAPHORE_SUFFIX
    : sub === "shards"
    ? Math.max(
      memberKey(a.key, a.maxMembers - 1).length,
      shardKey(a.key, a.count - 1).length,
    ) - a.key.length
    : 0;
  if (a.key.length > room - added) {
    throw tooLong(
      sub === "shards" ? "GROUP" : "KEY",
      a.key,
      room - added,
      EXIT.BAD_KEY,
      added === 0
        ? ""
        : sub === "shards"
        ? ` (its shards' and members' keys add up to ${added} characters to it)`
        : ` with -n (its slots' and tickets' keys add up to ${added} characters to it)`,
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
  // The longest timer delay: createLeaseManager refuses a longer TTL, but
  // only after connecting.
  if (a.ttl !== undefined && a.ttl > 2 ** 31 - 1) {
    throw fail(
      `--ttl must be at most ${2 ** 31 - 1} ms: received ${a.ttl}`,
      EXIT.BAD_DURATION,
    );
  }
  return a;
}
