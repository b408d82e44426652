import {
  type MsgHdrs,
  type NatsConnection,
  TimeoutError,
} from "@nats-io/nats-core";
import {
  JetStreamApiCodes,
  JetStreamApiError,
  type JetStreamManager,
  jetstreamManager,
  PubHeaders,
} from "@nats-io/jetstream";
import { KV_OPERATION_HDR, MARKER_REASON_HDR } from "./entry.ts";
import type { RawEntry } from "./port.ts";
import { raceAbort } from "./_async.ts";
import { errText } from "./errors.ts";
import { SETUP_TIMEOUT } from "./types.ts";

// What nats.js's answers and errors mean, and the timeouts and retries of
// set-up and the production port (real time: never imported by the core).

export const decoder: TextDecoder = new TextDecoder();

/** The revision the server names in a "wrong last sequence: N" rejection. */
export function conflictRevision(err: unknown): number | undefined {
  if (
    !(err instanceof JetStreamApiError) ||
    (err.code !== JetStreamApiCodes.StreamWrongLastSequence &&
      err.code !== JetStreamApiCodes.StreamWrongLastSequenceUnknown)
  ) return undefined;
  const m = /wrong last sequence: (\d+)/.exec(err.message);
  return m ? Number(m[1]) : -1;
}

/**
 * The API error "JetStream system temporarily unavailable": a cluster whose
 * meta group has no leader (an election) answers a JetStream request so;
 * nats.js's `JetStreamApiCodes` does not name it.
 */
export const JS_TEMPORARILY_UNAVAILABLE = 10008;

/** Whether a JetStream API request was refused because the stream does not exist. */
export function isStreamNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError &&
    err.code === JetStreamApiCodes.StreamNotFound;
}

/**
 * Each attempt of a set-up read gets this long (or the request timeout, if
 * longer) before it is asked again, within {@linkcode SETUP_TIMEOUT}.
 */
export const SETUP_ATTEMPT = 5_000;

/** The first attempt of a set-up read (or the request timeout, if longer). */
export const SETUP_FIRST_ATTEMPT = 1_000;

/** Whether `err` is a request that got no answer in time. */
export function isTimeout(err: unknown): boolean {
  return err instanceof TimeoutError ||
    (err instanceof Error && err.name === "TimeoutError");
}

/**
 * Runs a set-up request again, with a growing pause, while a JetStream
 * cluster answers that it is temporarily unavailable (10008: it has no meta
 * leader) or gives no answer at all, until `deadline` (performance.now()
 * time). A cluster drops a JetStream API request that reaches it while the
 * meta group elects a leader, and answers none later (seen on 2.15.2 right
 * after a restart, lease_lost_tail_test.ts, and for a bucket's creation in
 * a landing CI run). Only for requests safe to repeat: reads, and a create
 * that ends in the same state however often it is made. Any other answer
 * or error is the request's own.
 */
export async function whileLeaderless<T>(
  request: (timeout: number) => Promise<T>,
  deadline: number,
  signal: AbortSignal | undefined,
  attempts: { first: number; most: number },
): Promise<T> {
  // A request dropped during an election is asked again only once its
  // attempt times out: the first attempts are short, so set-up follows a
  // leader elected within a second or two, and they grow to `most` for a
  // cluster that is merely slow to answer.
  let timeout = Math.min(attempts.first, attempts.most);
  for (let pause = 100;; pause = Math.min(2 * pause, 1000)) {
    try {
      return await request(timeout);
    } catch (err) {
      const leaderless = err instanceof JetStreamApiError &&
        err.code === JS_TEMPORARILY_UNAVAILABLE;
      const again = leaderless || isTimeout(err);
      if (!again || performance.now() + pause >= deadline) throw err;
      if (isTimeout(err)) timeout = Math.min(2 * timeout, attempts.most);
    }
    await sleepUnless(pause, signal);
  }
}

/** Waits `ms`, or rejects with `signal`'s reason when it aborts first. */
async function sleepUnless(
  ms: number,
  signal: AbortSignal | undefined,
): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const wait = new Promise<void>((r) => timer = setTimeout(r, ms));
  try {
    await (signal ? raceAbort(wait, signal) : wait);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Set-up's requests for `createLeaseManager` with request timeout
 * `timeout`: off the write path, they may take up to
 * {@linkcode SETUP_TIMEOUT} together (`deadline`), and `ask` sends one,
 * asked again while the stream has no leader (see
 * {@linkcode whileLeaderless}; every set-up request is safe to repeat).
 */
export function setupRequests(
  timeout: number,
  signal: AbortSignal | undefined,
): {
  /** The whole set-up's time (ms), and when it ends. */
  total: number;
  deadline: number;
  /** The longest single attempt (ms). */
  attempt: number;
  ask: <T>(request: (timeout: number) => Promise<T>) => Promise<T>;
} {
  const total = Math.max(timeout, SETUP_TIMEOUT);
  const deadline = performance.now() + total;
  const attempts = {
    first: Math.max(timeout, SETUP_FIRST_ATTEMPT),
    most: Math.min(total, Math.max(timeout, SETUP_ATTEMPT)),
  };
  return {
    total,
    deadline,
    attempt: attempts.most,
    ask: (request) => whileLeaderless(request, deadline, signal, attempts),
  };
}

/**
 * The JetStream manager set-up starts with (through `domain`'s API when
 * given), or an Error saying that no server offers JetStream there.
 */
export async function setupJetStream(
  nc: NatsConnection,
  ask: <T>(request: (timeout: number) => Promise<T>) => Promise<T>,
  domain: string | undefined,
): Promise<JetStreamManager> {
  try {
    return await ask((timeout) =>
      jetstreamManager(nc, {
        timeout,
        ...(domain === undefined ? {} : { domain }),
      })
    );
  } catch (err) {
    if (!isNoResponders(err)) throw err;
    throw new Error(
      `Cannot create lease manager as ${
        domain === undefined
          ? "the NATS server does not offer JetStream (start nats-server with -js, or enable JetStream for this account)"
          : `no server answers for JetStream domain '${domain}' (check the domain name, and that the leaf node is connected to the server with that domain)`
      }: ${errText(err)}`,
      { cause: err },
    );
  }
}

/**
 * `open()` asked again while it fails with "no responders", until
 * `deadline`: just after a replicated stream is created, the server a
 * client is on may not yet route its subjects to it, and a session's first
 * write (which set-up sends) gets "no responders" (2 of 3 runs on an R3
 * bucket here). Nothing of such a write is stored, so asking again is
 * safe; each attempt opens a new session.
 */
export async function whileUnrouted<T>(
  open: () => Promise<T>,
  deadline: number,
  signal: AbortSignal | undefined,
): Promise<T> {
  for (let pause = 50;; pause = Math.min(2 * pause, 1000)) {
    try {
      return await open();
    } catch (err) {
      if (!isNoResponders(err) || performance.now() + pause >= deadline) {
        throw err;
      }
    }
    await sleepUnless(pause, signal);
  }
}

/** A write waiting for its reply in a {@linkcode ReplyInbox}. */

export function isNoResponders(err: unknown): boolean {
  for (let e = err, i = 0; e instanceof Error && i < 4; e = e.cause, i++) {
    // nats.js reports "no responders" to a JetStream request as a
    // JetStreamNotEnabled error (a misleading name) with the cause inside.
    if (
      e.name === "NoRespondersError" || e.name === "JetStreamNotEnabled" ||
      /no responders/i.test(e.message)
    ) {
      return true;
    }
  }
  return false;
}

/** Resolves like `p`, or rejects with a timeout error after `ms`. */
export function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
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

/**
 * An entry as the server stored it, from a message's revision, headers and
 * body: the production port's reads and watches, and `lease ls`, parse it
 * so.
 *
 * @param seq The stream sequence (the KV revision).
 * @param h The message's headers.
 * @param data The message's body.
 * @returns The entry.
 */
export function rawEntry(
  seq: number,
  h: MsgHdrs | undefined,
  data: Uint8Array,
): RawEntry {
  const op = h?.get(KV_OPERATION_HDR);
  return {
    seq,
    operation: op === "DEL" || op === "PURGE" ? op : undefined,
    marker: h?.get(MARKER_REASON_HDR) || undefined,
    msgId: h?.get(PubHeaders.MsgIdHdr) || undefined,
    value: decoder.decode(data),
  };
}
