/**
 * Another node holds the key, or this node just took it over and the grace
 * is running (then {@linkcode NotHolderError.retryAfter} says for how long).
 *
 * @example Retry after the grace
 * ```ts ignore
 * try {
 *   await leases.guard("orders", write);
 * } catch (err) {
 *   if (err instanceof NotHolderError && err.retryAfter !== undefined) {
 *     await new Promise((r) => setTimeout(r, err.retryAfter));
 *   }
 * }
 * ```
 */
export class NotHolderError extends Error {
  /** The store key. */
  readonly key: string;
  /** The node seen holding the key, when known (`undefined` in the grace). */
  readonly holder: string | undefined;
  /** Whole milliseconds until the grace ends and this node may write; `undefined` when another node holds the key. */
  readonly retryAfter: number | undefined;

  /**
   * Makes the error.
   *
   * @param key The store key.
   * @param holder The node seen holding the key.
   * @param retryAfter Milliseconds until the grace ends.
   * @param message Overrides the message.
   */
  constructor(
    key: string,
    holder?: string,
    retryAfter?: number,
    message?: string,
  ) {
    super(
      message ??
        (retryAfter !== undefined
          ? `Lease on '${key}' was just acquired: writes wait out the failover grace, retry in ${
            Math.ceil(retryAfter)
          } ms`
          : holder === undefined
          ? `Lease on '${key}' is not held by this node`
          : `Lease on '${key}' is held by node '${holder}'`),
    );
    this.name = "NotHolderError";
    this.key = key;
    this.holder = holder;
    this.retryAfter = retryAfter;
  }
}

/**
 * The server could not be reached or answered too late, or the bucket is
 * gone; the write was not run. The lease may still be held: a later guard
 * finds out.
 *
 * @example Tell outage from contention
 * ```ts ignore
 * try {
 *   await leases.guard("orders", write);
 * } catch (err) {
 *   if (err instanceof UnavailableError) console.warn("NATS unreachable, write refused", err.cause);
 * }
 * ```
 */
export class UnavailableError extends Error {
  /** The store key. */
  readonly key: string;

  /**
   * Makes the error.
   *
   * @param key The store key.
   * @param message What went wrong.
   * @param options The underlying error as `cause`.
   */
  constructor(key: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "UnavailableError";
    this.key = key;
  }
}

export function errText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
