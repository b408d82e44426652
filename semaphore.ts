/**
 * Counting semaphores over leases: at most `limit` holders of a name at once,
 * each in a slot that is an ordinary lease with its own key and fencing epoch.
 *
 * ## Why a free function
 * {@linkcode semaphore} takes a {@linkcode LeaseManager} and uses only its
 * public interface (`guard`, `held`, `holders`, `watch`, `campaign`,
 * `release`), so the
 * lease protocol, its safety argument and its simulator cover every slot as
 * they cover any key, and `lease.ts` does not grow for a recipe: the one
 * method added to the interface for it, {@linkcode LeaseManager.holders},
 * is general (any family of leases needs to list its members). A method on
 * the manager would only forward to this function.
 *
 * ## Keys, under `<name>.` in the manager's bucket
 * - `<name>.n<limit>.<i>`: slot `i` (0 ≤ i < limit). Its name records the
 *   limit it was taken under (`r<limit>` instead of `n<limit>` for a
 *   contender made with `resize: true`).
 * - `<name>.next`: the turnstile. Every slot is taken by the turnstile's
 *   holder, so takers are serialised: the one that holds it counts the held
 *   slots (read from the stream leader) and takes a free one, or waits for
 *   one while newcomers wait for the turnstile.
 * - `<name>.q.<id>-<n>`: a ticket, one per waiting contender (`<id>` names
 *   the process, `n` is reused). Its epoch (a KV revision, so a global
 *   order) is its place in the queue.
 *
 * ## Limit agreement
 * The limit is recorded in the bucket by the held slots' own keys, so the
 * record lives exactly as long as a slot is held and cannot expire under a
 * holder (each slot is a lease kept alive by its holder). A contender that
 * asks another limit than a held slot's gets a {@linkcode LimitMismatchError}
 * naming both and takes nothing. When no slot is held, nothing is recorded
 * and the first taker's limit holds. Since every slot is taken under the
 * turnstile, the count of held slots its holder reads is exact (see
 * {@linkcode Semaphore} for the argument).
 *
 * To change the limit while everyone keeps working, give the new limit with
 * `resize: true` to contenders one at a time (a rolling restart). A resizing
 * contender counts every held slot, whatever its limit, against its own
 * limit and takes slots recorded as `r<limit>`; a strict contender counts an
 * `r` slot against its own limit instead of refusing it. So at any instant
 * no more slots are held than the largest limit in use, and once the last
 * old contender is gone, no more than the new limit. Drop `resize` in a
 * second roll to get strict checking back.
 *
 * ## Fairness: first come, first served
 * A contender that finds the semaphore busy (a ticket queued, or the
 * turnstile held by another node) takes a ticket and waits for the ticket
 * just ahead of it (by epoch) to go; the first in line then waits for the
 * turnstile, whose holder alone takes the next freed slot. So waiters are
 * served in the order of their tickets' epochs; a newcomer that finds no
 * ticket and the turnstile free goes to the turnstile at once and can pass
 * a waiter only in the instant between its census and the first waiter's
 * compare-and-set. A crashed waiter's ticket expires after one TTL.
 *
 * ## One manager, one local lock
 * A manager holds one lease per key, and a guard on a key it holds joins
 * that tenure: within a process the turnstile alone cannot keep two of the
 * manager's contenders apart. They take a local lock first, one per manager
 * and name, found by the manager behind the object given to
 * {@linkcode semaphore}, so a semaphore made over a wrapper that forwards the
 * manager's events (`instrument()` of `otel.ts`) shares it with one made
 * over the manager.
 *
 * ## Held across time: `idleRelease`
 * A manager made with `idleRelease` gives up keys no guard used for that
 * long, but never a key a campaign leads. A slot held by
 * {@linkcode Semaphore.acquire}, and the turnstile while its holder waits
 * for a slot, are used by no guard while held, so each is pinned by a
 * campaign on its key, which wins at once with the tenure already held and
 * is never iterated further (it cannot win another tenure). The pin's end
 * releases the key. Each pin watches its key: one consumer while it holds.
 *
 * @example Three report builders at most
 * ```ts ignore
 * import { createLeaseManager, semaphore } from "@nats-lease/lease";
 *
 * const leases = await createLeaseManager({ nc, node: "builder-7" });
 * const reports = semaphore(leases, "reports", { limit: 3 });
 * await reports.guard(async (lease) => {
 *   console.log(`slot ${lease.slot} (${lease.key}), epoch ${lease.epoch}`);
 *   await build(lease.signal);
 * }, { wait: true });
 * ```
 *
 * @module
 */

import {
  type FencedOp,
  type GuardCheck,
  type GuardOptions,
  type Holder,
  keyRoom,
  keyTooLong,
  type Lease,
  type LeaseManager,
  NotHolderError,
} from "./lease.ts";

/** The largest `limit` a semaphore accepts. */
export const MAX_SEMAPHORE_LIMIT = 10_000;

/** Options of {@linkcode semaphore}. */
export interface SemaphoreOptions {
  /**
   * How many holders at once: an integer from 1 to
   * {@linkcode MAX_SEMAPHORE_LIMIT}. Every contender must ask the same one
   * (see `resize`).
   */
  limit: number;
  /**
   * Change the limit while contenders with another limit still hold slots:
   * count their slots against this limit instead of refusing them with
   * {@linkcode LimitMismatchError}. Give it, with the new limit, to
   * contenders one at a time; drop it once none runs the old limit.
   * @default {false}
   */
  resize?: boolean;
}

/** Options of {@linkcode Semaphore.guard}. */
export interface SemaphoreGuardOptions {
  /**
   * Wait in line for a slot instead of rejecting with
   * {@linkcode SemaphoreFullError} when all slots are held or others wait.
   * @default {false}
   */
  wait?: boolean;
  /**
   * Aborting it gives up the wait (the guard rejects with its reason, having
   * taken nothing), or aborts the slot lease's signal once the write runs.
   * @default {undefined}
   */
  signal?: AbortSignal;
  /**
   * Passed to {@linkcode LeaseManager.guard}. A slot is always newly
   * acquired, so the write comes right after the acquiring compare-and-set
   * whatever this says.
   * @default {the manager's `check`}
   */
  check?: GuardCheck;
}

/** Options of {@linkcode Semaphore.acquire}. */
export interface SemaphoreAcquireOptions {
  /**
   * Aborting it gives up the wait: `acquire` rejects with its reason, having
   * taken nothing. It does not end a slot already handed out.
   * @default {undefined}
   */
  signal?: AbortSignal;
}

/** A lease on one slot of a semaphore. */
export interface SlotLease extends Lease {
  /** The slot's index, from 0 to `limit - 1`; `key` names the slot. */
  readonly slot: number;
}

/**
 * A slot held by {@linkcode Semaphore.acquire}, until `release()` or
 * `await using` lets it go. It is renewed in the background meanwhile,
 * whatever the manager's `idleRelease` (the slot is pinned against it); watch
 * `signal`, call `throwIfLost()` before each commit, and fence with `epoch`.
 */
export interface HeldSlot extends SlotLease, AsyncDisposable {
  /**
   * Releases the slot (as {@linkcode LeaseManager.release} does) so the
   * next waiter takes it at once. Safe to call twice.
   */
  release(): Promise<void>;
}

/**
 * At most `limit` holders of a name at once; made by {@linkcode semaphore}.
 *
 * Why never more than `limit`: a slot is taken only by the turnstile's
 * holder, after a compare-and-set on the slot, and only if the turnstile's
 * lease is still vouched for when that CAS has succeeded. Any other taker's
 * turnstile tenure therefore began after that point (the lease argument:
 * one holder per tenure, the successor after the deadline and the grace),
 * and its count of held slots, read from the stream leader after it took
 * the turnstile, includes this slot. Within a process, takers are also
 * serialised locally, by one lock per manager whichever object (the manager
 * or a wrapper such as `instrument()`) they reach it through: the manager's
 * guards would let two of its contenders share the turnstile's tenure.
 *
 * @example Hold a slot for longer work
 * ```ts ignore
 * const sem = semaphore(leases, "api-clients", { limit: 5 });
 * await using slot = await sem.acquire({ signal });
 * await serve(slot.epoch, slot.signal); // released when the block ends
 * ```
 */
export interface Semaphore {
  /** The semaphore's name: the prefix of its keys. */
  readonly name: string;
  /** The limit this contender asks. */
  readonly limit: number;
  /**
   * Runs `write(lease)` in one free slot, then releases the slot. The write
   * runs right after the compare-and-set that took the slot; `lease.slot`
   * is its index and `lease.key` its key, `lease.epoch` its fencing epoch.
   *
   * @typeParam T What `write` returns.
   * @param write The write, with the slot's lease.
   * @param options `wait` to wait in line, a `signal`, and `check`.
   * @returns What `write` returns; what it throws is rethrown after the slot is released.
   * @throws {SemaphoreFullError} All slots are held or others wait (only without `wait`).
   * @throws {LimitMismatchError} A held slot was taken under another limit; nothing was taken.
   * @throws {UnavailableError} The server could not be reached; nothing was written.
   * @throws {TypeError} `write` is not a function, an option has the wrong type, or the manager is closed.
   * @throws {unknown} The reason of `options.signal`, when it aborts before the write started.
   *
   * @example Wait for a slot
   * ```ts ignore
   * const n = await sem.guard((lease) => store.append(lease.key, lease.epoch), {
   *   wait: true,
   *   signal: AbortSignal.timeout(60_000),
   * });
   * ```
   */
  guard<T>(
    write: (lease: SlotLease) => T | Promise<T>,
    options?: SemaphoreGuardOptions,
  ): Promise<T>;
  /**
   * Waits in line for a free slot and returns it held, for longer work;
   * release it with `release()` or `await using`. Held until then, renewed
   * in the background, also on a manager made with `idleRelease`.
   *
   * @param options A signal to give up waiting.
   * @returns The held slot.
   * @throws {LimitMismatchError} A held slot was taken under another limit.
   * @throws {UnavailableError} The bucket is gone or the connection closed.
   * @throws {TypeError} The manager is closed or an option has the wrong type.
   * @throws {unknown} The reason of `options.signal`, when it aborts first.
   *
   * @example Hold a slot until done
   * ```ts ignore
   * const slot = await sem.acquire();
   * try {
   *   await work(slot);
   * } finally {
   *   await slot.release();
   * }
   * ```
   */
  acquire(options?: SemaphoreAcquireOptions): Promise<HeldSlot>;
  /**
   * Reads who holds the slots now (a hint, like
   * {@linkcode LeaseManager.holders}): slot key to holder.
   *
   * @returns The held slots, whatever limit they were taken under.
   * @throws {UnavailableError} The server could not be reached.
   *
   * @example Show the holders
   * ```ts ignore
   * for (const [key, h] of await sem.holders()) console.log(key, h.node);
   * ```
   */
  holders(): Promise<Map<string, Holder>>;
}

/**
 * All slots of a semaphore are held, or others wait in line (so a newcomer
 * defers to them); {@linkcode SemaphoreFullError.holders} lists the slots'
 * holders. A {@linkcode NotHolderError}, so code that handles a busy lease
 * handles a full semaphore.
 *
 * @example Report who holds the slots
 * ```ts ignore
 * try {
 *   await sem.guard(write);
 * } catch (err) {
 *   if (err instanceof SemaphoreFullError) console.log([...err.holders.keys()]);
 * }
 * ```
 */
export class SemaphoreFullError extends NotHolderError {
  /** The held slots: key to holder. */
  readonly holders: ReadonlyMap<string, Holder>;
  /** The limit the refused contender asked. */
  readonly limit: number;

  /**
   * Makes the error.
   *
   * @param name The semaphore's name.
   * @param limit The limit asked.
   * @param holders The held slots.
   * @param queued Whether others wait in line.
   */
  constructor(
    name: string,
    limit: number,
    holders: ReadonlyMap<string, Holder>,
    queued = false,
  ) {
    const list = [...holders].map(([k, h]) => `${k} by '${h.node}'`)
      .join(", ");
    super(
      name,
      undefined,
      undefined,
      `Semaphore '${name}' (limit ${limit}) is full: ${
        queued && holders.size < limit ? "others wait in line; " : ""
      }held: ${list || "none"}`,
    );
    this.name = "SemaphoreFullError";
    this.holders = holders;
    this.limit = limit;
  }
}

/**
 * A contender asked another limit than a held slot was taken under; it took
 * nothing. Either configuration is wrong, or a change of the limit is under
 * way: see `resize` in {@linkcode SemaphoreOptions}.
 *
 * @example Tell a misconfiguration
 * ```ts ignore
 * try {
 *   await sem.guard(write);
 * } catch (err) {
 *   if (err instanceof LimitMismatchError) {
 *     console.error(`asked ${err.asked}, recorded ${err.recorded} by ${err.holder}`);
 *   }
 * }
 * ```
 */
export class LimitMismatchError extends RangeError {
  /** The semaphore's name. */
  readonly semaphore: string;
  /** The limit this contender asked. */
  readonly asked: number;
  /** The limit recorded by a held slot. */
  readonly recorded: number;
  /** That slot's key. */
  readonly key: string;
  /** That slot's holder. */
  readonly holder: string;

  /**
   * Makes the error.
   *
   * @param semaphore The semaphore's name.
   * @param asked The limit asked.
   * @param recorded The limit recorded.
   * @param key The slot that records it.
   * @param holder That slot's holder.
   */
  constructor(
    semaphore: string,
    asked: number,
    recorded: number,
    key: string,
    holder: string,
  ) {
    super(
      `Cannot take a slot of semaphore '${semaphore}' with limit ${asked}: its slot '${key}', held by '${holder}', records limit ${recorded} (give every contender the same limit, or change it with 'resize: true')`,
    );
    this.name = "LimitMismatchError";
    this.semaphore = semaphore;
    this.asked = asked;
    this.recorded = recorded;
    this.key = key;
    this.holder = holder;
  }
}

// ---------------------------------------------------------------------------

const NAME_RE = /^[-/=\w]+(\.[-/=\w]+)*$/;
const SLOT_RE = /^([nr])(\d+)\.(\d+)$/;

function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number" || typeof value === "boolean") {
    return String(value);
  }
  return value === null ? "null" : typeof value;
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("aborted", "AbortError");
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  if (signal?.aborted) return Promise.reject(abortReason(signal));
  return new Promise((resolve, reject) => {
    const done = () => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    };
    const timer = setTimeout(done, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortReason(signal!));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

interface SlotInfo {
  readonly holder: Holder;
  readonly limit: number;
  readonly resize: boolean;
  readonly index: number;
}

interface Census {
  readonly slots: Map<string, SlotInfo>;
  readonly tickets: Map<string, Holder>;
  readonly turnstile: Holder | undefined;
}

/** A FIFO lock per manager and name: one node holds the turnstile for all its contenders. */
class LocalLock {
  #held = false;
  readonly #queue: (() => void)[] = [];
  readonly #tickets: boolean[] = [];
  /**
   * Names this process's tickets: a hash of the node id and a random part,
   * so two processes never share a ticket key. Ticket keys are reused
   * (`<id>-<n>`, the smallest `n` free), so the keys under a name stay as
   * few as the waiters, which keeps each census short.
   */
  readonly id: string;

  constructor(node: string) {
    let h = 0x811c9dc5;
    for (let i = 0; i < node.length; i++) {
      h = Math.imul(h ^ node.charCodeAt(i), 0x01000193) >>> 0;
    }
    this.id = `${h.toString(16).padStart(8, "0")}${
      crypto.randomUUID().slice(0, 8)
    }`;
  }

  takeTicket(): number {
    let n = this.#tickets.indexOf(false);
    if (n < 0) n = this.#tickets.length;
    this.#tickets[n] = true;
    return n;
  }

  returnTicket(n: number): void {
    this.#tickets[n] = false;
  }

  get busy(): boolean {
    return this.#held;
  }

  tryLock(): boolean {
    if (this.#held) return false;
    this.#held = true;
    return true;
  }

  lock(signal: AbortSignal | undefined): Promise<void> {
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    if (this.tryLock()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const grant = () => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      };
      const onAbort = () => {
        const i = this.#queue.indexOf(grant);
        if (i >= 0) this.#queue.splice(i, 1);
        reject(abortReason(signal!));
      };
      this.#queue.push(grant);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  unlock(): void {
    const next = this.#queue.shift();
    if (next) next(); // stays held, by the next in line
    else this.#held = false;
  }
}

/**
 * The longest key the manager behind `leases` takes (Infinity when it does
 * not say): a recipe that builds keys from a name checks the name against
 * it up front, rather than fail on a key made from it halfway through.
 */
function keyRoomBehind(leases: LeaseManager): number {
  return keyRoom(managerBehind(leases));
}

/**
 * Throws the TypeError of {@linkcode keyTooLong} when `name`, with the
 * `added` characters the keys made from it add, is longer than the manager
 * behind `leases` takes (see {@linkcode keyRoomBehind}).
 */
export function checkNameRoom(
  leases: LeaseManager,
  verb: string,
  what: string,
  name: string,
  added: number,
): void {
  const room = keyRoomBehind(leases) - added;
  if (name.length > room) {
    throw keyTooLong(
      verb,
      what,
      name,
      room,
      `, its keys adding up to ${added} characters to it`,
    );
  }
}

/**
 * What a semaphore's longest key adds to its name: a ticket's
 * `.q.<id>-<n>`, with room for any `n` (16 digits, up to 2^53); a slot's
 * `.n<limit>.<i>` (at most 12) and the turnstile's `.next` are shorter.
 */
export const LONGEST_SUFFIX: number = ".q.".length + 16 + "-".length + 16;

/**
 * The local locks, by the manager behind the object a semaphore was made
 * with, then by name. One manager holds one lease per key, whichever object
 * its guards come through: a guard on the turnstile (or a slot) that this
 * manager already holds joins that tenure instead of being refused. So the
 * turnstile is exclusive within a process only if every contender that
 * reaches the manager, through any object, takes the same local lock first.
 */
const locks = new WeakMap<object, Map<string, LocalLock>>();

/** An event type nobody listens for, sent once per {@linkcode semaphore} call. */
const IDENTITY_PROBE = "nats-lease:semaphore-identity";

/**
 * The manager that stands behind `leases`. A wrapper that forwards the
 * manager's calls (as `instrument()` in otel.ts does) forwards its events
 * too, so a probe event dispatched through the wrapper reaches its
 * listener with the wrapped manager as `target`. An object that does not
 * forward events is taken for a manager of its own.
 */
export function managerBehind(leases: LeaseManager): object {
  let target: object | undefined;
  const listener = (event: Event) => {
    if (typeof event.target === "object" && event.target !== null) {
      target = event.target;
    }
  };
  try {
    leases.addEventListener(IDENTITY_PROBE, listener);
    try {
      leases.dispatchEvent(new Event(IDENTITY_PROBE));
    } finally {
      leases.removeEventListener(IDENTITY_PROBE, listener);
    }
  } catch {
    // Not an event target after all: the object is its own manager.
  }
  return target ?? leases;
}

function localLock(leases: LeaseManager, name: string): LocalLock {
  const manager = managerBehind(leases);
  let byName = locks.get(manager);
  if (!byName) locks.set(manager, byName = new Map());
  let lock = byName.get(name);
  if (!lock) byName.set(name, lock = new LocalLock(leases.node));
  return lock;
}

/**
 * Keeps `lease`'s key out of the manager's `idleRelease` until the returned
 * function is called; that function ends the pin and releases the key.
 *
 * `idleRelease` gives up a key no guard used for a while, but never one a
 * campaign leads (see {@linkcode LeaseManager.campaign}). A campaign on a
 * key this manager holds wins at once, with the tenure already held: its
 * first iteration is a guard on the key, which joins that tenure. So a
 * campaign that is never iterated past its first lease pins the tenure,
 * and cannot win another: it would only campaign again when iterated.
 *
 * If the tenure ended before the campaign's guard ran, the campaign may
 * have won a new one, outside the turnstile: that tenure, which nothing
 * else knows of, is let go at once. The pin then does nothing, and the
 * holder learns of the loss from `lease.signal`, as without a pin.
 */
async function pin(
  leases: LeaseManager,
  lease: Lease,
): Promise<() => Promise<void>> {
  const none = () => Promise.resolve();
  if (lease.signal.aborted) return none;
  const ctl = new AbortController();
  const signal = AbortSignal.any([ctl.signal, lease.signal]);
  let it: AsyncIterator<Lease>;
  let first: IteratorResult<Lease>;
  try {
    it = leases.campaign(lease.key, { signal })[Symbol.asyncIterator]();
    first = await it.next();
  } catch {
    // The manager is closed or its bucket gone: nothing to pin, and the
    // tenure ends (or ended) with it.
    return none;
  }
  if (first.done) return none;
  if (first.value.tenure !== lease.tenure) {
    ctl.abort();
    await it.return?.();
    return none;
  }
  let ended: Promise<void> | undefined;
  return () =>
    ended ??= (async () => {
      ctl.abort();
      // Resumed at its `yield`, the campaign stops leading and releases
      // the key (unless the manager is closing: close() releases it).
      await it.return?.();
    })().catch(() => {});
}

class SlotLeaseImpl implements SlotLease {
  readonly slot: number;
  readonly #lease: Lease;

  constructor(lease: Lease, slot: number) {
    this.#lease = lease;
    this.slot = slot;
  }
  get key(): string {
    return this.#lease.key;
  }
  get node(): string {
    return this.#lease.node;
  }
  get epoch(): number {
    return this.#lease.epoch;
  }
  get tenure(): string {
    return this.#lease.tenure;
  }
  get signal(): AbortSignal {
    return this.#lease.signal;
  }
  get deadline(): number {
    return this.#lease.deadline;
  }
  throwIfLost(): void {
    this.#lease.throwIfLost();
  }

  // Fenced writes are fenced by the wrapped lease's tenure entry: the
  // server refuses them once that tenure is over, whatever this wrapper
  // believes.
  put(key: string, value: Uint8Array | string): Promise<number> {
    return this.#lease.put(key, value);
  }

  delete(key: string): Promise<number> {
    return this.#lease.delete(key);
  }

  commit(ops: readonly FencedOp[]): Promise<{ seq: number; count: number }> {
    return this.#lease.commit(ops);
  }

  publish(subject: string, data: Uint8Array | string): Promise<number> {
    return this.#lease.publish(subject, data);
  }
}

class HeldSlotImpl extends SlotLeaseImpl implements HeldSlot {
  readonly #leases: LeaseManager;
  readonly #unpin: () => Promise<void>;
  #released: Promise<void> | undefined;

  constructor(
    leases: LeaseManager,
    lease: Lease,
    slot: number,
    unpin: () => Promise<void>,
  ) {
    super(lease, slot);
    this.#leases = leases;
    this.#unpin = unpin;
  }
  release(): Promise<void> {
    // The pin's end releases the key; release() again in case there was
    // no pin (a tenure that ended before it).
    return this.#released ??= this.#unpin().then(() =>
      this.#leases.release(this.key)
    );
  }
  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }
}

/** What the turnstile's holder is doing: the slot it took, then leaving. */
interface Turn {
  /** The turnstile's lease, checked once the slot's CAS has succeeded. */
  readonly lease: Lease;
  /**
   * Keeps the turnstile out of `idleRelease` until `leave()`: called before
   * each wait while holding it, which uses the key no more than holding a
   * slot does. Idempotent.
   */
  pin(): Promise<void>;
  /** Releases the turnstile and the local lock; idempotent. */
  leave(): Promise<void>;
}

class SemaphoreImpl implements Semaphore {
  readonly name: string;
  readonly limit: number;
  readonly #leases: LeaseManager;
  readonly #resize: boolean;
  readonly #lock: LocalLock;
  readonly #turnstile: string;

  constructor(
    leases: LeaseManager,
    name: string,
    limit: number,
    resize: boolean,
  ) {
    this.#leases = leases;
    this.name = name;
    this.limit = limit;
    this.#resize = resize;
    this.#lock = localLock(leases, name);
    this.#turnstile = `${name}.next`;
  }

  #slotKey(i: number): string {
    return `${this.name}.${this.#resize ? "r" : "n"}${this.limit}.${i}`;
  }

  /** The index of one of our own slot keys, else -1. */
  #slotIndex(key: string): number {
    const i = Number(key.slice(key.lastIndexOf(".") + 1));
    return Number.isInteger(i) && this.#slotKey(i) === key ? i : -1;
  }

  async holders(): Promise<Map<string, Holder>> {
    const c = await this.#census();
    return new Map([...c.slots].map(([k, s]) => [k, s.holder]));
  }

  async #census(): Promise<Census> {
    const all = await this.#leases.holders(this.name);
    const slots = new Map<string, SlotInfo>();
    const tickets = new Map<string, Holder>();
    let turnstile: Holder | undefined;
    const base = this.name.length + 1;
    for (const [key, holder] of all) {
      const rest = key.slice(base);
      const m = SLOT_RE.exec(rest);
      if (m) {
        slots.set(key, {
          holder,
          resize: m[1] === "r",
          limit: Number(m[2]),
          index: Number(m[3]),
        });
      } else if (rest.startsWith("q.")) tickets.set(key, holder);
      else if (rest === "next") turnstile = holder;
    }
    return { slots, tickets, turnstile };
  }

  #mismatch(c: Census): LimitMismatchError | undefined {
    if (this.#resize) return undefined;
    for (const [key, s] of c.slots) {
      if (!s.resize && s.limit !== this.limit) {
        return new LimitMismatchError(
          this.name,
          this.limit,
          s.limit,
          key,
          s.holder.node,
        );
      }
    }
    return undefined;
  }

  #full(c: Census, queued: boolean): SemaphoreFullError {
    return new SemaphoreFullError(
      this.name,
      this.limit,
      new Map([...c.slots].map(([k, s]) => [k, s.holder])),
      queued,
    );
  }

  guard<T>(
    write: (lease: SlotLease) => T | Promise<T>,
    options: SemaphoreGuardOptions = {},
  ): Promise<T> {
    if (typeof write !== "function") {
      return Promise.reject(
        new TypeError(
          `Cannot guard a slot of '${this.name}' as 'write' must be a function: received ${
            describe(write)
          }`,
        ),
      );
    }
    const bad = checkOptions("guard a slot", this.name, options);
    if (bad) return Promise.reject(bad);
    if (options.signal?.aborted) {
      return Promise.reject(abortReason(options.signal));
    }
    return this.#guard(write, options);
  }

  async #guard<T>(
    write: (lease: SlotLease) => T | Promise<T>,
    options: SemaphoreGuardOptions,
  ): Promise<T> {
    const { key, value, turn } = await this.#take(
      options.wait === true,
      options.signal,
      (lease, slot) => write(new SlotLeaseImpl(lease, slot)),
      {
        // The write's lease aborts with the guard's signal, as a guard's does.
        ...(options.signal ? { signal: options.signal } : {}),
        ...(options.check ? { check: options.check } : {}),
      },
    );
    try {
      return await value;
    } finally {
      await Promise.all([turn.leave(), this.#leases.release(key)]);
    }
  }

  acquire(options: SemaphoreAcquireOptions = {}): Promise<HeldSlot> {
    const bad = checkOptions("acquire a slot", this.name, options);
    if (bad) return Promise.reject(bad);
    if (options.signal?.aborted) {
      return Promise.reject(abortReason(options.signal));
    }
    return this.#acquire(options.signal);
  }

  async #acquire(signal: AbortSignal | undefined): Promise<HeldSlot> {
    const leases = this.#leases;
    const { value, turn } = await this.#take(
      true,
      signal,
      // Pinned inside the acquiring guard: its write is in flight until the
      // pin holds, and `idleRelease` leaves a key with a write in flight
      // alone, so there is no instant in which the slot could go idle.
      async (lease, slot) =>
        new HeldSlotImpl(leases, lease, slot, await pin(leases, lease)),
      {}, // the wait's signal must not end the slot once handed out
    );
    await turn.leave();
    return value;
  }

  /**
   * Takes a slot and runs `body` in its acquiring guard. Resolves once the
   * body started (its result as `value`), with the turnstile being left.
   */
  async #take<R>(
    wait: boolean,
    signal: AbortSignal | undefined,
    body: (lease: Lease, slot: number) => R | Promise<R>,
    opts: GuardOptions,
  ): Promise<{ key: string; slot: number; value: Promise<R>; turn: Turn }> {
    const turn = await this.#enter(wait, signal);
    let ok = false;
    try {
      let freed: number | undefined;
      for (;;) {
        if (freed !== undefined) {
          // A slot of ours was freed while we held the turnstile: nobody
          // took a slot since our census, so the count only fell.
          const key = this.#slotKey(freed);
          const got = await this.#trySlot(
            key,
            freed,
            turn,
            body,
            opts,
            signal,
          );
          if (got !== undefined) {
            ok = true;
            return { key, slot: freed, value: got.value, turn };
          }
          freed = undefined;
        }
        const c = await this.#census();
        const mismatch = this.#mismatch(c);
        if (mismatch) throw mismatch;
        let free = -1;
        if (c.slots.size < this.limit) {
          for (let i = 0; i < this.limit; i++) {
            if (!c.slots.has(this.#slotKey(i))) {
              free = i;
              break;
            }
          }
        }
        if (free < 0) {
          if (!wait) throw this.#full(c, false);
          await turn.pin();
          const key = await this.#waitForChange(c, signal);
          const mine = key === undefined ? -1 : this.#slotIndex(key);
          if (mine >= 0) freed = mine;
          continue;
        }
        const key = this.#slotKey(free);
        const got = await this.#trySlot(key, free, turn, body, opts, signal);
        if (got === undefined) continue; // held by another after all
        ok = true;
        return { key, slot: free, value: got.value, turn };
      }
    } finally {
      if (!ok) await turn.leave();
    }
  }

  /**
   * The acquiring guard on one slot: `undefined` when another node holds
   * it; waits out our own grace (a crashed holder's slot) and tries again.
   */
  async #trySlot<R>(
    key: string,
    slot: number,
    turn: Turn,
    body: (lease: Lease, slot: number) => R | Promise<R>,
    opts: GuardOptions,
    signal: AbortSignal | undefined,
  ): Promise<{ value: Promise<R> } | undefined> {
    for (;;) {
      let started!: () => void;
      const begun = new Promise<void>((r) => started = r);
      const value = this.#leases.guard(key, (lease) => {
        // Nobody else took a slot since our census: the turnstile is ours.
        turn.lease.throwIfLost();
        started();
        void turn.leave();
        return body(lease, slot);
      }, opts);
      value.catch(() => {}); // handled by whoever awaits it
      try {
        await Promise.race([begun, value]);
        return { value }; // wrapped: an async function would await it
      } catch (err) {
        if (!(err instanceof NotHolderError)) {
          // The turnstile lapsed, or the server failed: let the slot go.
          await this.#leases.release(key);
          throw err;
        }
        if (err.retryAfter === undefined) return undefined;
        await turn.pin();
        await sleep(err.retryAfter, signal).catch(async (reason) => {
          await this.#leases.release(key);
          throw reason;
        });
      }
    }
  }

  /**
   * Resolves when a slot in `c` changes holder: with its key when it was
   * freed, `undefined` when it changed otherwise (or the watch ended).
   */
  async #waitForChange(
    c: Census,
    signal: AbortSignal | undefined,
  ): Promise<string | undefined> {
    const ctl = new AbortController();
    const stop = signal ? AbortSignal.any([signal, ctl.signal]) : ctl.signal;
    let freed: string | undefined;
    try {
      await Promise.race([...c.slots].map(async ([key, s]) => {
        for await (const h of this.#leases.watch(key, { signal: stop })) {
          if (h === null) freed ??= key;
          if (h === null || h.epoch !== s.holder.epoch) return;
        }
      }));
    } finally {
      ctl.abort();
    }
    if (signal?.aborted) throw abortReason(signal);
    return freed;
  }

  /**
   * Takes the turnstile: at once when nobody waits, else after a ticket's
   * turn in line. Without `wait`, rejects when it would have to wait.
   */
  async #enter(wait: boolean, signal: AbortSignal | undefined): Promise<Turn> {
    const leases = this.#leases;
    const c = await this.#census();
    const mismatch = this.#mismatch(c);
    if (mismatch) throw mismatch;
    const busy = c.tickets.size > 0 || this.#lock.busy ||
      (c.turnstile !== undefined && c.turnstile.node !== leases.node);
    let ticket: string | undefined;
    let lease: Lease | undefined;
    try {
      if (!busy) {
        // Nobody in line: straight to the turnstile, unless another node
        // took it since the census; then in line like anyone.
        if (wait) await this.#lock.lock(signal);
        else if (!this.#lock.tryLock()) throw this.#full(c, true);
        try {
          lease = await this.#tryTurnstile(signal);
        } finally {
          if (lease === undefined) this.#lock.unlock();
        }
      }
      if (lease === undefined) {
        if (!wait) throw this.#full(c, true);
        ticket = await this.#queue(signal);
        await this.#lock.lock(signal);
        try {
          lease = await leases.guard(this.#turnstile, (l) => l, {
            wait: true,
            ...(signal ? { signal } : {}),
          });
        } catch (err) {
          this.#lock.unlock();
          throw err;
        }
      }
    } finally {
      // Holding the turnstile (or giving up), we leave the line: the next
      // ticket's holder goes to the turnstile.
      if (ticket !== undefined) this.#dropTicket(ticket);
    }
    const held = lease;
    let pinned: Promise<() => Promise<void>> | undefined;
    let left: Promise<void> | undefined;
    return {
      lease: held,
      pin: async () => {
        await (pinned ??= pin(leases, held));
      },
      leave: () =>
        left ??= (async () => {
          if (pinned) await (await pinned)();
          await leases.release(this.#turnstile);
        })().catch(() => {}).finally(() => this.#lock.unlock()),
    };
  }

  /**
   * One attempt at the turnstile: its lease, or `undefined` when another
   * node holds it. Waits out our own grace on a turnstile nobody used for a
   * while (a fresh key, or one whose holder crashed).
   */
  async #tryTurnstile(
    signal: AbortSignal | undefined,
  ): Promise<Lease | undefined> {
    const key = this.#turnstile;
    for (;;) {
      try {
        return await this.#leases.guard(key, (l) => l);
      } catch (err) {
        if (!(err instanceof NotHolderError)) throw err;
        if (err.retryAfter === undefined) return undefined;
        await sleep(err.retryAfter, signal).catch(async (reason) => {
          await this.#leases.release(key);
          throw reason;
        });
      }
    }
  }

  /**
   * Waits in line: takes a ticket, then waits until no ticket ahead of it
   * is left. Resolves with the ticket's key, still held.
   */
  async #queue(signal: AbortSignal | undefined): Promise<string> {
    const leases = this.#leases;
    const n = this.#lock.takeTicket();
    const ticket = `${this.name}.q.${this.#lock.id}-${n}`;
    let ok = false;
    try {
      await leases.held(ticket);
      for (;;) {
        if (signal?.aborted) throw abortReason(signal);
        const c = await this.#census();
        const mismatch = this.#mismatch(c);
        if (mismatch) throw mismatch;
        const mine = c.tickets.get(ticket)?.epoch ?? Infinity;
        let ahead: [string, Holder] | undefined;
        for (const [k, h] of c.tickets) {
          if (h.epoch < mine && (!ahead || h.epoch > ahead[1].epoch)) {
            ahead = [k, h];
          }
        }
        if (!ahead) {
          ok = true;
          return ticket;
        }
        const [key, h] = ahead;
        const ctl = new AbortController();
        const stop = signal
          ? AbortSignal.any([signal, ctl.signal])
          : ctl.signal;
        try {
          for await (const now of leases.watch(key, { signal: stop })) {
            if (now === null || now.epoch !== h.epoch) break;
          }
        } finally {
          ctl.abort();
        }
      }
    } finally {
      if (!ok) this.#dropTicket(ticket);
    }
  }

  /** Leaves the line: the ticket's key is used again by a later waiter. */
  #dropTicket(ticket: string): void {
    const n = Number(ticket.slice(ticket.lastIndexOf("-") + 1));
    void this.#leases.release(ticket).catch(() => {}).finally(() =>
      this.#lock.returnTicket(n)
    );
  }
}

function checkOptions(
  verb: string,
  name: string,
  options: unknown,
): TypeError | undefined {
  if (typeof options !== "object" || options === null) {
    return new TypeError(
      `Cannot ${verb} of '${name}' as 'options' must be an object: received ${
        describe(options)
      }`,
    );
  }
  const o = options as Record<string, unknown>;
  if (o.wait !== undefined && typeof o.wait !== "boolean") {
    return new TypeError(
      `Cannot ${verb} of '${name}' as 'wait' must be a boolean: received ${
        describe(o.wait)
      }`,
    );
  }
  if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) {
    return new TypeError(
      `Cannot ${verb} of '${name}' as 'signal' must be an AbortSignal: received ${
        describe(o.signal)
      }`,
    );
  }
  if (o.check !== undefined && o.check !== "cas" && o.check !== "lease") {
    return new TypeError(
      `Cannot ${verb} of '${name}' as 'check' must be "cas" or "lease": received ${
        describe(o.check)
      }`,
    );
  }
  return undefined;
}

/**
 * Makes a counting semaphore named `name` over `leases`: at most `limit`
 * holders at once, across every process that uses the same bucket and name,
 * each in a slot that is a lease with its own key (`<name>.n<limit>.<i>`)
 * and fencing epoch. Nothing is sent until a guard or acquire runs.
 *
 * A free function rather than a method of {@linkcode LeaseManager}: it is
 * written against the manager's public interface only, so it works with
 * any manager and adds nothing to the lease protocol. Semaphores of one
 * name made over a manager and over a wrapper that forwards its events
 * (`instrument(leases)`) are one manager's: they share its local lock.
 *
 * @param leases The lease manager whose bucket holds the slots.
 * @param name The semaphore's name, a valid key; its keys are below it.
 * @param options The `limit`, and `resize` to change it while others run.
 * @returns The semaphore.
 * @throws {TypeError} `leases` is not a lease manager, `name` is not a valid key or is too long for the manager's bucket (its keys add up to 36 characters to it), or `resize` is not a boolean.
 * @throws {RangeError} `limit` is not an integer from 1 to {@linkcode MAX_SEMAPHORE_LIMIT}.
 *
 * @example At most three builds at once
 * ```ts ignore
 * const builds = semaphore(leases, "builds", { limit: 3 });
 * await builds.guard(async ({ slot, epoch }) => {
 *   console.log(`building in slot ${slot} under epoch ${epoch}`);
 * }, { wait: true });
 * ```
 */
export function semaphore(
  leases: LeaseManager,
  name: string,
  options: SemaphoreOptions,
): Semaphore {
  if (
    typeof leases !== "object" || leases === null ||
    typeof (leases as Partial<LeaseManager>).guard !== "function" ||
    typeof (leases as Partial<LeaseManager>).holders !== "function"
  ) {
    throw new TypeError(
      `Cannot create a semaphore as 'leases' must be a LeaseManager: received ${
        describe(leases)
      }`,
    );
  }
  if (typeof name !== "string" || !NAME_RE.test(name)) {
    throw new TypeError(
      `Cannot create a semaphore as 'name' must be ASCII letters, digits, '-', '_', '/' or '=' in non-empty '.'-separated tokens: received ${
        describe(name)
      }`,
    );
  }
  checkNameRoom(leases, "create a semaphore", "name", name, LONGEST_SUFFIX);
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `Cannot create semaphore '${name}' as 'options' must be an object with a 'limit': received ${
        describe(options)
      }`,
    );
  }
  const { limit, resize = false } = options;
  if (
    typeof limit !== "number" || !Number.isInteger(limit) || limit < 1 ||
    limit > MAX_SEMAPHORE_LIMIT
  ) {
    throw new RangeError(
      `Cannot create semaphore '${name}' as 'limit' must be an integer from 1 to ${MAX_SEMAPHORE_LIMIT}: received ${
        describe(limit)
      }`,
    );
  }
  if (typeof resize !== "boolean") {
    throw new TypeError(
      `Cannot create semaphore '${name}' as 'resize' must be a boolean: received ${
        describe(resize)
      }`,
    );
  }
  return new SemaphoreImpl(leases, name, limit, resize);
}
