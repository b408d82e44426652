import { KEY_RE } from "./entry.ts";

// ---------------------------------------------------------------------------
// Input checks: every one runs before anything is sent to the server.

export const BUCKET_RE: RegExp = /^[-\w]+$/;
/** A JetStream domain: one subject token. */
export const DOMAIN_RE: RegExp = /^[^\s.*>]+$/;
/** A stream name: nats-server refuses these characters in one. */
export const STREAM_RE: RegExp = /^[^\s.*>/\\]+$/;

export function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number" || typeof value === "boolean") {
    return String(value);
  }
  return value === null ? "null" : typeof value;
}

/**
 * The longest control line nats-server takes from a client, in bytes: its
 * `max_control_line` (4096 unless configured), counted over what follows
 * `PUB `/`HPUB ` up to the CR LF: the subject, the reply subject and the
 * sizes. A longer line makes the server close the connection ("Maximum
 * Control Line Exceeded"), dropping every lease on it, and the request is
 * never answered: so a key that would make one must be refused up front.
 * Measured on nats-server 2.15.2 and 2.9.10: a line of exactly 4096 bytes
 * is taken, one of 4097 is not.
 */
export const MAX_CONTROL_LINE = 4096;

/**
 * The room a key's longest request leaves around the key, apart from the
 * API prefix, the inbox prefix and the bucket name (twice). That request
 * creates a watch's ordered consumer; nats.js 3.4 puts the filter subject
 * in the request's subject:
 *
 *     PUB <api>.CONSUMER.CREATE.KV_<bucket>.<nuid>_<serial>.$KV.<bucket>.<key> <inbox>.<nuid>.<token> <size>
 *
 * The others are shorter for any bucket: the direct get (`<api>.DIRECT.GET.
 * KV_<bucket>.$KV.<bucket>.<key>`, same reply, size 0) by 48 bytes, and a
 * compare-and-set (`HPUB [<api>.]$KV.<bucket>.<key>`, our reply with its
 * counter, two sizes) by at least the bucket's length plus 49. A name or a
 * nuid is 22 characters, a request's reply token 8. The consumer's serial
 * grows by one each time nats.js re-creates it (also on every failed
 * attempt while a server has no JetStream leader, without bound), so it
 * gets the 16 digits of 2^53; the request's JSON (the consumer's config
 * with the filter subject) stays under 10,000 bytes for any key that fits,
 * so 4 digits.
 */
const WATCH_OVERHEAD = ".CONSUMER.CREATE.KV_".length + ".".length + 22 +
  "_".length + 16 + ".$KV.".length + ".".length + " ".length + ".".length +
  22 + ".".length + 8 + " ".length + 4;

/**
 * The longest key a lease manager takes on `bucket`: the longest whose
 * requests all fit in nats-server's default control line (see
 * {@linkcode MAX_CONTROL_LINE}). 3,967 characters on bucket `leases` with
 * nats.js's defaults; each character of the bucket's name costs two, and a
 * JetStream domain costs its length plus one.
 *
 * @param bucket The bucket's name.
 * @param apiPrefix The JetStream API prefix requests go to: `$JS.API`, or
 *   `$JS.<domain>.API` through a domain.
 * @param inboxPrefix The connection's inbox prefix (nats.js: `_INBOX`).
 */
export function maxKeyLength(
  bucket: string,
  apiPrefix: string = "$JS.API",
  inboxPrefix: string = "_INBOX",
): number {
  return MAX_CONTROL_LINE - WATCH_OVERHEAD - apiPrefix.length -
    inboxPrefix.length - 2 * bucket.length;
}

/**
 * The longest key a lease manager takes on the leases kept in `stream`
 * under `leaseSubjects` (the stream layout): a watch's consumer subject
 * names the stream and the tenure's subject (`<leaseSubjects>.k.<key>`)
 * where a bucket's names `KV_<bucket>` and `$KV.<bucket>.`, so as a bucket
 * whose name is half as long as both together (at least as long as it is).
 *
 * @param stream The stream's name.
 * @param leaseSubjects The prefix the leases live under.
 * @param apiPrefix The JetStream API prefix, as {@linkcode maxKeyLength}.
 * @param inboxPrefix The connection's inbox prefix.
 */
export function maxStreamKeyLength(
  stream: string,
  leaseSubjects: string,
  apiPrefix: string = "$JS.API",
  inboxPrefix: string = "_INBOX",
): number {
  return maxKeyLength(
    "x".repeat(Math.ceil((stream.length + leaseSubjects.length + 3) / 2)),
    apiPrefix,
    inboxPrefix,
  );
}

/** A `boolean` option, or a TypeError naming it. */
export function checkBoolean(name: string, value: unknown): void {
  if (value !== undefined && typeof value !== "boolean") {
    throw new TypeError(
      `Cannot create lease manager as '${name}' must be a boolean: received ${
        describe(value)
      }`,
    );
  }
}

/** What {@linkcode checkSharedOptions} resolved. */
export interface SharedOptions {
  readonly replicas: number;
  readonly check: "cas" | "lease";
  readonly idleRelease: number | undefined;
}

/**
 * The options of a lease manager that `createLeaseManager` and the testing
 * kit's `manager()` check alike, with the same messages: `node`, `domain`,
 * `replicas`, the boolean options, `check`, `idleRelease` and `signal`.
 * The bucket, the TTL and its timeouts are each caller's own.
 *
 * @param options The options as given.
 * @returns The resolved `replicas`, `check` and `idleRelease`.
 * @throws {TypeError} An option has the wrong type.
 * @throws {RangeError} `replicas` or `idleRelease` is out of range.
 */
export function checkSharedOptions(options: {
  readonly node?: unknown;
  readonly domain?: unknown;
  readonly replicas?: unknown;
  readonly restartGrace?: unknown;
  readonly createBucket?: unknown;
  readonly allowUnverifiedReplicas?: unknown;
  readonly markers?: unknown;
  readonly fenced?: unknown;
  readonly check?: unknown;
  readonly idleRelease?: unknown;
  readonly signal?: unknown;
}): SharedOptions {
  const { node, domain, signal } = options;
  if (typeof node !== "string" || node.trim() === "") {
    throw new TypeError(
      `Cannot create lease manager as 'node' must be a non-blank string: received ${
        describe(node)
      }`,
    );
  }
  // One subject token: the domain goes into `$JS.<domain>.API`.
  if (
    domain !== undefined &&
    (typeof domain !== "string" || !DOMAIN_RE.test(domain))
  ) {
    throw new TypeError(
      `Cannot create lease manager as 'domain' must be a non-empty JetStream domain name without whitespace, '.', '*' or '>': received ${
        describe(domain)
      }`,
    );
  }
  const replicas = options.replicas ?? 1;
  if (
    typeof replicas !== "number" || !Number.isInteger(replicas) ||
    replicas < 1 || replicas > 5
  ) {
    throw new RangeError(
      `Cannot create lease manager as 'replicas' must be an integer from 1 to 5: received ${
        describe(replicas)
      }`,
    );
  }
  checkBoolean("restartGrace", options.restartGrace);
  checkBoolean("createBucket", options.createBucket);
  checkBoolean("allowUnverifiedReplicas", options.allowUnverifiedReplicas);
  checkBoolean("markers", options.markers);
  checkBoolean("fenced", options.fenced);
  const { check } = options;
  if (check !== undefined && check !== "cas" && check !== "lease") {
    throw new TypeError(
      `Cannot create lease manager as 'check' must be "cas" or "lease": received ${
        describe(check)
      }`,
    );
  }
  const idleRelease = options.idleRelease === undefined
    ? undefined
    : checkDuration("idleRelease", options.idleRelease, 1, 2 ** 31 - 1);
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `Cannot create lease manager as 'signal' must be an AbortSignal: received ${
        describe(signal)
      }`,
    );
  }
  return { replicas, check: check ?? "cas", idleRelease };
}

/** A long value as a message shows it: its start, and its length. */
function preview(key: string): string {
  return `${JSON.stringify(key.slice(0, 24))}... (${key.length} characters)`;
}

/**
 * `key` of a call: a valid key, of at most `max` characters (the bucket's
 * {@linkcode maxKeyLength}; a longer key would get the connection closed
 * on its first request, see {@linkcode MAX_CONTROL_LINE}).
 */
export function checkKey(
  verb: string,
  key: unknown,
  max: number = Infinity,
): asserts key is string {
  if (typeof key !== "string" || !KEY_RE.test(key)) {
    throw new TypeError(
      `Cannot ${verb} as 'key' must be ASCII letters, digits, '-', '_', '/' or '=' in non-empty '.'-separated tokens: received ${
        describe(key)
      }`,
    );
  }
  if (key.length > max) throw keyTooLong(verb, "key", key, max);
}

/**
 * The TypeError of a key (or of a name that becomes keys) too long for its
 * bucket: it names the limit and the length, not the whole value.
 */
export function keyTooLong(
  verb: string,
  name: string,
  value: string,
  max: number,
  what: string = "",
): TypeError {
  return new TypeError(
    `Cannot ${verb} as '${name}' must be at most ${max} characters long on this bucket${what} (a longer subject would overflow nats-server's ${MAX_CONTROL_LINE}-byte control line, and the server would close the connection): received ${
      preview(value)
    }`,
  );
}

/**
 * The longest key `manager` takes (its `maxKey`), for the recipes
 * (semaphores, shards) that build keys from a name and check the name once,
 * up front: Infinity for a manager that does not say.
 */
export function keyRoom(manager: object): number {
  const max = (manager as { maxKey?: unknown }).maxKey;
  return typeof max === "number" ? max : Infinity;
}

/** `signal` of a call on `key`: an AbortSignal or undefined. */
export function checkSignal(verb: string, key: string, signal: unknown): void {
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `Cannot ${verb} on '${key}' as 'signal' must be an AbortSignal: received ${
        describe(signal)
      }`,
    );
  }
}

export function checkDuration(
  name: string,
  value: unknown,
  min: number,
  max: number,
): number {
  if (
    typeof value !== "number" || !Number.isFinite(value) || value < min ||
    value > max
  ) {
    throw new RangeError(
      `Cannot create lease manager as '${name}' must be a finite number of milliseconds from ${min} to ${max}: received ${
        describe(value)
      }`,
    );
  }
  return value;
}
