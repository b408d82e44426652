// Small helpers shared by the lease test files.
import {
  type Lease,
  type LeaseManager,
  NotHolderError,
  UnavailableError,
} from "../mod.ts";

/** Resolves after `ms` milliseconds. */
export const sleep = (ms: number): Promise<void> =>
  new Promise((r) => setTimeout(r, ms));

/** Polls `pred` every `pause` ms until it holds; fails after `ms`. */
export async function eventually(
  pred: () => boolean | Promise<boolean>,
  ms: number,
  what: string,
  pause = 10,
): Promise<void> {
  const end = performance.now() + ms;
  while (!(await pred())) {
    if (performance.now() >= end) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await sleep(pause);
  }
}

let seq = 0;
/** A name no other test in this process uses, for buckets. */
export const uniq = (prefix: string): string =>
  `${prefix}${Date.now() % 1e6}x${seq++}`;

/**
 * Guards until the write runs, retrying on NotHolderError (a holder, or the
 * grace) and UnavailableError (an election, a restart), for at most `limit`
 * ms; then rethrows the last error.
 */
export async function guardUntil<T>(
  m: LeaseManager,
  key: string,
  write: (l: Lease) => T | Promise<T>,
  limit: number,
  pause = 5,
): Promise<T> {
  const end = performance.now() + limit;
  for (;;) {
    try {
      return await m.guard(key, write);
    } catch (err) {
      if (
        !(err instanceof NotHolderError || err instanceof UnavailableError) ||
        performance.now() > end
      ) throw err;
      await sleep(pause);
    }
  }
}
