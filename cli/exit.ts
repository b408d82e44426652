/**
 * How `lease` ends and what it says: its exit statuses, and its one-line
 * messages on stderr.
 *
 * @module
 */

import process from "node:process";

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
   * `LimitMismatchError` of `semaphore()`); nothing was run.
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

/** Says `line` on stderr, as `lease: LINE`. */
export function say(line: string): void {
  process.stderr.write(`lease: ${line}\n`);
}
