/**
 * A testing kit for code that uses the lease library: real lease managers
 * (the same `Manager` that `createLeaseManager` builds, over an in-memory
 * port) on an in-memory JetStream KV server, in virtual time. A failover
 * that takes 30 s on a real server (a crashed holder's TTL, then the grace)
 * takes milliseconds here, and the faults are what the real ones do to a
 * manager, as the library's simulator has them (which runs on this same
 * server, process model and scheduler: `testing/`).
 *
 * No nats-server, no network, no `node:*` module: it runs wherever the
 * library runs. `mod.ts` never imports it.
 *
 * Time is virtual ({@linkcode TestClock}): by default a driver moves it on
 * by itself whenever the test's code is idle, so an `await` of a guard
 * returns after the virtual round trip, and a `{ wait: true }` across a
 * 15 s grace after 15 virtual seconds and a few real milliseconds. Every
 * `Lease.deadline` and `t.clock.now()` reads that clock (starting at 0),
 * not `performance.now()`.
 *
 * @example A crashed holder's key taken over after its TTL and the grace
 * ```ts
 * import { createTestLeases } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases({ ttl: 15_000 });
 * const a = t.manager({ node: "a" });
 * const b = t.manager({ node: "b" });
 * await a.guard("report", (lease) => t.recordWrite(lease));
 * t.crash("a"); // nothing released: its entry expires after the TTL
 * await b.guard("report", (lease) => t.recordWrite(lease), { wait: true });
 * console.log(`b writes at ${t.clock.now()} ms of virtual time`); // about 30,000
 * t.assertNoOverlap();
 * ```
 *
 * @module
 */

import {
  BUCKET_RE,
  checkDuration,
  checkSharedOptions,
  describe,
  maxKeyLength,
} from "./lease/input.ts";
import { managerOnPort, type ManagerSettings } from "./lease/manager.ts";
import { BucketGone } from "./lease/port.ts";
import { markerLifeOf, markersVersion } from "./lease/servers.ts";
import { ReplyTrust } from "./lease/trust.ts";
import {
  DEFAULT_TTL,
  type Lease,
  type LeaseManager,
  type LeaseManagerOptions,
  MIN_TTL,
} from "./lease/types.ts";
import { SimKv } from "./testing/kv.ts";
import { type Network, SimNode } from "./testing/node.ts";
import {
  macrotasks,
  Scheduler,
  type SimEvent,
  type Turns,
} from "./testing/scheduler.ts";
import { Trace } from "./testing/trace.ts";

export type { Lease, LeaseManager, LeaseManagerOptions };

/**
 * How the clock of {@linkcode createTestLeases} moves (see
 * {@linkcode TestLeasesOptions.clock}).
 *
 * @example Hold the world still between two steps
 * ```ts
 * import { createTestLeases } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases({ clock: "manual" });
 * await t.clock.advance(5_000); // time moves only so
 * ```
 */
export type TestClockMode = "virtual" | "manual" | "real";

/**
 * Options of {@linkcode createTestLeases}.
 *
 * @example A short TTL on a server without markers, with a trace
 * ```ts
 * import { createTestLeases } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases({
 *   ttl: 2_000,
 *   version: "2.10.22",
 *   trace: true,
 * });
 * ```
 */
export interface TestLeasesOptions {
  /**
   * The TTL, in ms, of the buckets the managers create (a manager's own
   * `ttl`, when it creates a bucket, wins; on an existing bucket it must
   * match, as on a real server).
   * @default {15000}
   */
  ttl?: number;
  /**
   * Subject delete markers: a bucket a manager creates gets them (when the
   * manager's own `markers` is not false and `version` has them), so a key
   * whose entry expired can be taken at once once the marker is gone.
   * @default {true}
   */
  markers?: boolean;
  /**
   * The nats-server release to behave as, e.g. `"2.10.22"`: markers from
   * 2.11.2, as `createLeaseManager` checks them.
   * @default {a current release}
   */
  version?: string;
  /**
   * `"virtual"`: virtual time, moved on by a driver whenever the test's
   * code is idle (a macrotask passed with nothing due now), and by
   * {@linkcode TestClock.advance}. `"manual"`: virtual time that moves only
   * on {@linkcode TestClock.advance} and {@linkcode TestClock.runUntilIdle}
   * (an `await` on a manager must then be raced against them). `"real"`:
   * the same server and processes in real time, for code that waits on
   * real timers of its own; `advance()` then throws.
   * @default {"virtual"}
   */
  clock?: TestClockMode;
  /**
   * The one-way delay of every message between a manager and the server,
   * in ms of the clock.
   * @default {0.5}
   */
  latency?: number;
  /**
   * The virtual time, in ms, past which the `"virtual"` driver stops moving
   * time by itself: a test that waits for what never comes (or leaves the
   * kit open with a key held, renewed forever) then ends instead of
   * spinning, and {@linkcode TestLeases.close} throws.
   * @default {86400000}
   */
  maxTime?: number;
  /**
   * Record a readable trace of every request, reply, expiry and fault,
   * for {@linkcode TestLeases.trace}.
   * @default {false}
   */
  trace?: boolean;
}

/**
 * The options of {@linkcode TestLeases.manager}: those of
 * `createLeaseManager` without `nc` (the in-memory server is the
 * connection). `fenced`, `stream` and `leaseSubjects` are not offered by
 * the kit yet; `domain`, `replicas` and `allowUnverifiedReplicas` are
 * checked and change nothing (the bucket is one in-memory server).
 *
 * @example A lease-checked manager that releases idle keys
 * ```ts
 * import {
 *   createTestLeases,
 *   type TestManagerOptions,
 * } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases();
 * const options: TestManagerOptions = {
 *   node: "a",
 *   check: "lease",
 *   idleRelease: 60_000,
 * };
 * const a = t.manager(options);
 * ```
 */
export type TestManagerOptions = Omit<LeaseManagerOptions, "nc">;

/**
 * The kit's clock: virtual time in ms, from 0 (see
 * {@linkcode TestLeases.clock}).
 *
 * @example Time a takeover
 * ```ts
 * import { createTestLeases } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases({ ttl: 15_000 });
 * const a = t.manager({ node: "a" });
 * await a.guard("report", () => {});
 * await a.release("report");
 * const t0 = t.clock.now();
 * await t.manager({ node: "b" }).guard("report", () => {});
 * // 3 ms: a compare-and-set expecting no entry meets the release, a read,
 * // and the compare-and-set on it (three round trips of 2 x 0.5 ms)
 * console.log(`${t.clock.now() - t0} ms`);
 * ```
 */
export interface TestClock {
  /**
   * The time now, in ms: what every manager's clock and every
   * `Lease.deadline` read.
   *
   * @returns The time.
   * @example Read the virtual clock
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases();
   * console.log(t.clock.now()); // 0
   * ```
   */
  now(): number;
  /**
   * Moves time on by `ms`, running every timer, delivery and expiry due
   * meanwhile in order, and letting promises settle after each. The
   * automatic driver waits meanwhile, so time is exactly `now() + ms`
   * when it resolves.
   *
   * @param ms How far, in ms (0 or more).
   * @returns When time has moved on.
   * @throws {RangeError} `ms` is not a finite number of 0 or more.
   * @throws {TypeError} The clock is `"real"`, or the kit is closed.
   * @example Let a lease's TTL run out while its holder is paused
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases({ ttl: 15_000 });
   * const a = t.manager({ node: "a" });
   * await a.guard("report", () => {});
   * t.pause("a", 40_000);
   * await t.clock.advance(40_000);
   * ```
   */
  advance(ms: number): Promise<void>;
  /**
   * Runs every event that is not a manager's timer, in order, until the
   * next one is (or none is left): requests and replies in flight land,
   * watches deliver, due expiries happen, paused processes that are due
   * resume. Time moves to the last event run. In `"real"` mode it waits,
   * in real time, until only timers are left.
   *
   * @returns When only the managers' timers are left.
   * @throws {TypeError} The kit is closed.
   * @example Let a guard started in manual mode land
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases({ clock: "manual" });
   * const a = t.manager({ node: "a" });
   * const written = a.guard("report", (lease) => lease.epoch);
   * await t.clock.runUntilIdle();
   * console.log(await written); // the epoch
   * ```
   */
  runUntilIdle(): Promise<void>;
}

/**
 * Why a tenure ended, as {@linkcode TestTenure.ended} says: `"released"`,
 * `"crashed"` ({@linkcode TestLeases.crash}), or the reason of the
 * manager's `lost` event.
 *
 * @example Count the tenures lost
 * ```ts
 * import { createTestLeases } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases();
 * const lost = t.history().tenures.filter((x) =>
 *   x.ended !== undefined && x.ended !== "released"
 * );
 * console.log(lost.length); // 0
 * ```
 */
export type TestTenureEnd =
  | "released"
  | "overwritten"
  | "deleted"
  | "expired"
  | "unproven"
  | "defunct"
  | "crashed";

/**
 * One tenure of a key, as {@linkcode TestLeases.history} lists it.
 *
 * @example The grace a takeover owed
 * ```ts
 * import { createTestLeases } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases({ ttl: 15_000 });
 * await t.manager({ node: "a" }).guard("report", () => {});
 * t.crash("a");
 * await t.manager({ node: "b" }).guard("report", () => {}, { wait: true });
 * const b = t.history().tenures.at(-1)!;
 * console.log(b.writable - b.from); // 15000
 * ```
 */
export interface TestTenure {
  /** The bucket. */
  readonly bucket: string;
  /** The key. */
  readonly key: string;
  /** The holder's node id. */
  readonly node: string;
  /** The fencing epoch. */
  readonly epoch: number;
  /** The tenure's id (`Lease.tenure`). */
  readonly tenure: string;
  /** When the manager began it (its `acquired` event), ms of the clock. */
  readonly from: number;
  /** When it could write first: `from` plus the grace it owed. */
  readonly writable: number;
  /** When it ended, if it did. */
  readonly to: number | undefined;
  /** Why it ended, if it did. */
  readonly ended: TestTenureEnd | undefined;
}

/**
 * A write recorded by {@linkcode TestLeases.recordWrite}.
 *
 * @example The epochs a store was written under
 * ```ts
 * import { createTestLeases } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases();
 * await t.manager({ node: "a" }).guard("report", (l) => t.recordWrite(l));
 * console.log(t.history().writes.map((w) => w.epoch)); // [1]
 * ```
 */
export interface TestWrite {
  /** The bucket. */
  readonly bucket: string;
  /** The key. */
  readonly key: string;
  /** The writer's node id. */
  readonly node: string;
  /** The epoch it was made under. */
  readonly epoch: number;
  /** The tenure it was made under. */
  readonly tenure: string;
  /** When it took effect, ms of the clock. */
  readonly at: number;
}

/**
 * What {@linkcode TestLeases.history} returns.
 *
 * @example Who held a key, in turn
 * ```ts
 * import { createTestLeases } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases();
 * const { tenures } = t.history();
 * console.log(tenures.map((x) => `${x.node}@${x.epoch}`).join(" → "));
 * ```
 */
export interface TestHistory {
  /** Every tenure, in the order they began. */
  readonly tenures: readonly TestTenure[];
  /** Every recorded write, in the order they were made. */
  readonly writes: readonly TestWrite[];
}

/**
 * Thrown by {@linkcode TestLeases.assertNoOverlap}: a write made under a
 * tenure took effect once a later tenure of its key could write, so an
 * unfenced store could have taken both holders' writes at once.
 *
 * @example Catch an overlap
 * ```ts
 * import {
 *   createTestLeases,
 *   type Lease,
 *   LeaseOverlapError,
 * } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases();
 * const a = t.manager({ node: "a" });
 * let late: Lease | undefined;
 * await a.guard("report", (lease) => {
 *   late = lease;
 * });
 * await a.release("report");
 * await t.manager({ node: "b" }).guard("report", () => {});
 * t.recordWrite(late!); // after the release: it escaped
 * try {
 *   t.assertNoOverlap();
 * } catch (err) {
 *   if (!(err instanceof LeaseOverlapError)) throw err;
 *   console.log(err.write.node, err.later.node); // a b
 * }
 * ```
 */
export class LeaseOverlapError extends Error {
  /** The write that came too late. */
  readonly write: TestWrite;
  /** The tenure it was made under. */
  readonly tenure: TestTenure;
  /** The later tenure of the same key that could already write. */
  readonly later: TestTenure;

  /**
   * Made by {@linkcode TestLeases.assertNoOverlap}.
   *
   * @param write The write.
   * @param tenure Its tenure.
   * @param later The later tenure.
   */
  constructor(write: TestWrite, tenure: TestTenure, later: TestTenure) {
    super(
      `Lease overlap on '${write.key}' (bucket '${write.bucket}'): node '${write.node}' wrote under epoch ${write.epoch} (tenure from ${
        ms(tenure.from)
      }) at ${
        ms(write.at)
      }, after node '${later.node}' could write under epoch ${later.epoch} (tenure from ${
        ms(later.from)
      }, writable from ${ms(later.writable)})`,
    );
    this.name = "LeaseOverlapError";
    this.write = write;
    this.tenure = tenure;
    this.later = later;
  }
}

/**
 * The kit made by {@linkcode createTestLeases}: managers, faults, checks
 * and the clock.
 *
 * @example Close it with the test's scope
 * ```ts
 * import { createTestLeases } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases();
 * await t.manager({ node: "a" }).guard("report", () => {});
 * ```
 */
export interface TestLeases extends AsyncDisposable {
  /** The TTL, in ms, of the buckets the managers create. */
  readonly ttl: number;
  /** The clock. */
  readonly clock: TestClock;
  /**
   * A lease manager on the in-memory server: the same class
   * `createLeaseManager` returns, with the same options (less `nc`),
   * checked the same way. Several managers may share a node id (a second
   * process of one node); faults by node id reach the latest one.
   *
   * @param options `createLeaseManager`'s options without `nc`.
   * @returns The manager.
   * @throws {TypeError} An option is invalid, is one the kit does not
   *   offer (`fenced`, `stream`, `leaseSubjects`, `nc`), or the kit is closed.
   * @throws {RangeError} A duration is out of range, or `ttl` differs from
   *   the TTL of a bucket that exists.
   * @throws {Error} `createBucket: false` and the bucket does not exist.
   * @throws {unknown} `signal` had aborted: its reason.
   * @example Two managers
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases();
   * const a = t.manager({ node: "a" });
   * const b = t.manager({ node: "b", check: "lease" });
   * await a.guard("report", () => {});
   * await a.release("report");
   * await b.guard("report", () => {}); // at once: a released it
   * ```
   */
  manager(options: TestManagerOptions): LeaseManager;
  /**
   * Pauses the latest process of `node` for `ms` (a GC stall, a SIGSTOP, a
   * VM migration): it runs nothing, and its timers and the replies it gets
   * wait until it resumes; what it sent before still reaches the server.
   * A pause while paused lasts until the later end.
   *
   * @param node The node id.
   * @param ms How long, in ms of the clock.
   * @throws {TypeError} No live process has that node id, or the kit is closed.
   * @throws {RangeError} `ms` is not a finite number of 0 or more.
   * @example Pause a holder past its TTL
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases();
   * const a = t.manager({ node: "a" });
   * await a.guard("report", () => {});
   * t.pause("a", 40_000);
   * ```
   */
  pause(node: string, ms: number): void;
  /**
   * Kills the latest process of `node`: it never runs again, releases
   * nothing, and its manager's pending calls never settle. Its entries
   * expire after the TTL. A new `manager({ node })` is a restarted process.
   *
   * @param node The node id.
   * @throws {TypeError} No live process has that node id, or the kit is closed.
   * @example Crash a holder
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases();
   * const a = t.manager({ node: "a" });
   * await a.guard("report", () => {});
   * t.crash("a");
   * ```
   */
  crash(node: string): void;
  /**
   * Expires `key`'s entry now, as the bucket's max age would when due: into
   * a `MaxAge` marker on a bucket with markers, else it just goes. Its
   * holder learns of it at its next renewal.
   *
   * @param key The key.
   * @param bucket The bucket.
   * @returns Whether the key had an entry to expire.
   * @throws {TypeError} The bucket does not exist, or the kit is closed.
   * @example Expire a held key under its holder
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases();
   * const a = t.manager({ node: "a" });
   * await a.guard("report", () => {});
   * t.expire("report");
   * ```
   */
  expire(key: string, bucket?: string): boolean;
  /**
   * Records a write that takes effect now under `lease`, for
   * {@linkcode TestLeases.history} and
   * {@linkcode TestLeases.assertNoOverlap}: call it where the code under
   * test commits (a fake store's put), not where its guard starts.
   *
   * @param lease A lease one of this kit's managers handed to a write.
   * @throws {TypeError} `lease` is no lease of this kit's managers.
   * @example A fake store that records its writes
   * ```ts
   * import { createTestLeases, type Lease } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases();
   * const rows: string[] = [];
   * const store = {
   *   append(lease: Lease, row: string): void {
   *     t.recordWrite(lease);
   *     rows.push(row);
   *   },
   * };
   * const a = t.manager({ node: "a" });
   * await a.guard("report", (lease) => store.append(lease, "row 1"));
   * ```
   */
  recordWrite(lease: Lease): void;
  /**
   * Every tenure the managers began and every write recorded, so far.
   *
   * @returns Copies, in the order they happened.
   * @example List the tenures of a key
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases();
   * const a = t.manager({ node: "a" });
   * await a.guard("report", () => {});
   * await a.release("report");
   * for (const x of t.history().tenures) {
   *   console.log(x.key, x.node, x.epoch, x.from, x.to, x.ended); // report a 1 ... released
   * }
   * ```
   */
  history(): TestHistory;
  /**
   * Checks that no recorded write took effect once a later tenure of its
   * key (by the order they began) could write: a write that escaped its
   * lease (made after the lease ended, with no `throwIfLost()` at the
   * commit point) while a successor held the key. A tenure can write from
   * its `acquired` event plus the grace it owed; with the protocol kept,
   * every earlier tenure's deadline has passed by then, so a write that
   * checks its lease right before committing never lands after it.
   *
   * @throws {LeaseOverlapError} The first such write, naming both tenures,
   *   their epochs and the times.
   * @example Check at the end of a test
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases();
   * const a = t.manager({ node: "a" });
   * await a.guard("report", (lease) => t.recordWrite(lease));
   * t.assertNoOverlap();
   * ```
   */
  assertNoOverlap(): void;
  /**
   * The trace recorded with `trace: true`: one line per request, reply,
   * expiry, fault and delivery, with the time and who.
   *
   * @param key Only the lines about this key (and those about no key).
   * @returns The lines, one per row; empty without `trace: true`.
   * @example Print what happened
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * await using t = createTestLeases({ trace: true });
   * const a = t.manager({ node: "a" });
   * await a.guard("report", () => {});
   * console.log(t.trace("report"));
   * ```
   */
  trace(key?: string): string;
  /**
   * Closes every manager whose process is alive (as their `close()` does:
   * keys released), then stops the driver: no timer, message channel or
   * other real handle of the kit is left. Safe to call twice.
   *
   * @returns When done.
   * @throws {Error} A manager did not close within ten TTLs of virtual
   *   time, an event of the in-memory world threw, or the `"virtual"`
   *   driver passed `maxTime`.
   * @example Close at the end of a test
   * ```ts
   * import { createTestLeases } from "@nats-lease/lease/testing";
   *
   * const t = createTestLeases();
   * try {
   *   await t.manager({ node: "a" }).guard("report", () => {});
   * } finally {
   *   await t.close();
   * }
   * ```
   */
  close(): Promise<void>;
}

/** `ms` of the clock, as messages show it. */
function ms(t: number): string {
  return `${Number(t.toFixed(3))} ms`;
}

/** A process of the kit: one manager on one simulated process. */
interface Proc {
  readonly node: string;
  readonly sim: SimNode;
  readonly manager: LeaseManager;
  readonly bucket: string;
}

interface MutableTenure {
  bucket: string;
  key: string;
  node: string;
  epoch: number;
  tenure: string;
  from: number;
  writable: number;
  to: number | undefined;
  ended: TestTenureEnd | undefined;
}

/**
 * Moves the scheduler: a lock that `advance()`, `runUntilIdle()` and the
 * automatic driver take in turn (one `run` at a time), and the driver.
 */
class Driver {
  readonly #sched: Scheduler;
  readonly #mode: TestClockMode;
  readonly #maxTime: number;
  readonly #clock: () => number;
  #auto: boolean;
  #busy = false;
  readonly #queue: (() => void)[] = [];
  readonly #freed: (() => void)[] = [];
  #wake: (() => void) | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #stopped = false;
  #loop: Promise<void> | undefined;
  /** What broke the world (an event threw), or the time limit. */
  failure: Error | undefined;

  constructor(
    sched: Scheduler,
    mode: TestClockMode,
    maxTime: number,
    clock: () => number,
  ) {
    this.#sched = sched;
    this.#mode = mode;
    this.#maxTime = maxTime;
    this.#clock = clock;
    this.#auto = mode !== "manual";
    sched.onSchedule = () => this.#poke();
  }

  /** Starts the driver (in manual mode only when `force`: for `close()`). */
  start(force = false): void {
    if (force) this.#auto = true;
    if (!this.#auto || this.#loop !== undefined || this.#stopped) return;
    this.#loop = this.#mode === "real" ? this.#realLoop() : this.#virtualLoop();
  }

  /** Stops the driver and waits for its loop to end. */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#poke();
    for (const fn of this.#freed.splice(0)) fn();
    await this.#loop;
  }

  /** Settles when the driver's loop has ended (stopped, broken, or past `maxTime`). */
  ended(): Promise<void> {
    return this.#loop ?? new Promise<void>(() => {});
  }

  #poke(): void {
    if (this.#timer !== undefined) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
    }
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  /** Waits for an event to be scheduled (or `ms` of real time, or a stop). */
  #sleep(ms?: number): Promise<void> {
    return new Promise<void>((resolve) => {
      this.#wake = resolve;
      if (ms !== undefined) {
        this.#timer = setTimeout(() => {
          this.#timer = undefined;
          this.#poke();
        }, ms);
      }
    });
  }

  acquire(): Promise<void> {
    if (!this.#busy) {
      this.#busy = true;
      return Promise.resolve();
    }
    return new Promise<void>((resolve) => this.#queue.push(resolve));
  }

  release(): void {
    const next = this.#queue.shift();
    if (next !== undefined) {
      next();
      return;
    }
    this.#busy = false;
    for (const fn of this.#freed.splice(0)) fn();
  }

  /** Runs the scheduler to `until` under the lock's holder; a throw breaks the world. */
  async run(until: number): Promise<void> {
    try {
      await this.#sched.run(until);
    } catch (err) {
      this.failure ??= new Error(
        `The testing kit's in-memory world broke: an event threw: ${
          (err as Error)?.message ?? String(err)
        }`,
        { cause: err },
      );
      this.#stopped = true;
      throw this.failure;
    }
  }

  /** Whether the lock is held or wanted; if so, waits until it is free. */
  #taken(): Promise<void> | undefined {
    if (!this.#busy && this.#queue.length === 0) return undefined;
    return new Promise<void>((resolve) => this.#freed.push(resolve));
  }

  async #virtualLoop(): Promise<void> {
    const turns: Turns = macrotasks();
    try {
      while (!this.#stopped) {
        // One macrotask first: the test's code has run all it could.
        await turns.next();
        if (this.#stopped) break;
        const taken = this.#taken();
        if (taken !== undefined) {
          await taken;
          continue;
        }
        const next = this.#sched.peek();
        if (next === undefined) {
          await this.#sleep();
          continue;
        }
        if (next.time > this.#maxTime) {
          this.failure ??= new Error(
            `The testing kit's virtual clock passed maxTime (${this.#maxTime} ms) by itself: a test waited for what never came, or left a key held with the kit open`,
          );
          break;
        }
        this.#busy = true;
        try {
          await this.run(next.time);
        } catch {
          break;
        } finally {
          this.release();
        }
      }
    } finally {
      turns.close();
    }
  }

  async #realLoop(): Promise<void> {
    const turns: Turns = macrotasks();
    try {
      while (!this.#stopped) {
        const taken = this.#taken();
        if (taken !== undefined) {
          await taken;
          continue;
        }
        this.#busy = true;
        try {
          await this.run(this.#clock());
        } catch {
          break;
        } finally {
          this.release();
        }
        if (this.#stopped) break;
        const next = this.#sched.peek();
        if (next === undefined) await this.#sleep();
        else {
          const wait = next.time - this.#clock();
          if (wait > 0) await this.#sleep(wait);
          else await turns.next();
        }
      }
    } finally {
      if (this.#timer !== undefined) clearTimeout(this.#timer);
      this.#timer = undefined;
      turns.close();
    }
  }
}

/** The next event is a timer of a process (not a delivery, expiry or resume). */
function isTimer(ev: SimEvent | undefined): boolean {
  return ev === undefined || (ev.kind === "timer" && ev.target !== undefined);
}

class Kit implements TestLeases {
  readonly ttl: number;
  readonly clock: TestClock;
  readonly #markers: boolean;
  readonly #version: string | undefined;
  readonly #latency: number;
  readonly #mode: TestClockMode;
  readonly #sched: Scheduler;
  readonly #trace: Trace;
  readonly #driver: Driver;
  readonly #net: Network;
  readonly #buckets = new Map<string, SimKv>();
  readonly #procs: Proc[] = [];
  readonly #labels = new Set<string>();
  readonly #tenures: MutableTenure[] = [];
  readonly #byTenure = new Map<string, MutableTenure>();
  /** The process each tenure is of, by tenure id. */
  readonly #owners = new Map<string, Proc>();
  readonly #writes: TestWrite[] = [];
  #closing: Promise<void> | undefined;

  constructor(
    o: Required<Omit<TestLeasesOptions, "version">> & {
      version: string | undefined;
    },
  ) {
    this.ttl = o.ttl;
    this.#markers = o.markers;
    this.#version = o.version;
    this.#latency = o.latency;
    this.#mode = o.clock;
    const base = performance.now();
    const real = () => performance.now() - base;
    this.#sched = new Scheduler(o.clock === "real" ? real : undefined);
    this.#trace = new Trace(o.trace);
    this.#driver = new Driver(this.#sched, o.clock, o.maxTime, real);
    const latency = o.latency;
    // No random faults: every message arrives, after `latency`, in order;
    // timers fire when due. Faults come from the test (pause, crash, ...).
    this.#net = {
      delay: () => latency,
      fate: () => "ok",
      lateBy: () => 0,
      timerLate: () => 0,
      replica: () => 0,
      freeze: false,
      // A resumed process runs its due timers before its due replies, as
      // Node's event loop runs its timers phase before polling for I/O.
      timersFirst: true,
      sent: () => {},
      replied: () => {},
      disturbed: () => {},
      crossedReply: () => false,
    };
    const sched = this.#sched;
    this.clock = {
      now: () => sched.now,
      advance: (ms) => this.#advance(ms),
      runUntilIdle: () => this.#runUntilIdle(),
    };
    this.#driver.start();
  }

  #open(verb: string): void {
    if (this.#closing !== undefined) {
      throw new TypeError(`Cannot ${verb} as the test leases are closed`);
    }
  }

  async #advance(ms: number): Promise<void> {
    this.#open("advance the clock");
    if (this.#mode === "real") {
      throw new TypeError(
        `Cannot advance the clock of test leases made with clock: "real": it is the real clock`,
      );
    }
    if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) {
      throw new RangeError(
        `Cannot advance the clock as 'ms' must be a finite number of milliseconds of 0 or more: received ${
          describe(ms)
        }`,
      );
    }
    await this.#driver.acquire();
    try {
      this.#failed();
      await this.#driver.run(this.#sched.now + ms);
    } finally {
      this.#driver.release();
    }
  }

  async #runUntilIdle(): Promise<void> {
    this.#open("run the clock until idle");
    if (this.#mode === "real") {
      while (!isTimer(this.#sched.peek())) {
        this.#failed();
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
      return;
    }
    await this.#driver.acquire();
    try {
      for (;;) {
        this.#failed();
        const next = this.#sched.peek();
        if (isTimer(next)) break;
        await this.#driver.run(next!.time);
      }
    } finally {
      this.#driver.release();
    }
  }

  #failed(): void {
    if (this.#driver.failure) throw this.#driver.failure;
  }

  #bucket(name: string): SimKv | undefined {
    return this.#buckets.get(name);
  }

  manager(options: TestManagerOptions): LeaseManager {
    this.#open("create test lease manager");
    const o = checkOptions(options, this.ttl);
    let kv = this.#bucket(o.bucket);
    if (kv === undefined) {
      if (o.createBucket === false) {
        throw new Error(
          `Cannot create lease manager as bucket '${o.bucket}' does not exist and 'createBucket' is false`,
        );
      }
      const ttl = o.ttl ?? this.ttl;
      // As createLeaseManager creates it: markers that outlive the max
      // age, where the server has them and the manager wants them.
      const markers = this.#markers && o.markers !== false &&
        (this.#version === undefined || markersVersion(this.#version));
      kv = new SimKv(this.#sched, this.#trace, o.bucket, {
        maxAge: ttl,
        markers,
        markerTTL: (Math.ceil(ttl / 1000) + 1) * 1000,
        late: () => 0,
        lags: [0],
        ...(this.#version === undefined ? {} : { version: this.#version }),
      });
      this.#buckets.set(o.bucket, kv);
    } else if (o.ttl !== undefined && o.ttl !== kv.cfg.maxAge) {
      throw new RangeError(
        `Cannot create lease manager as bucket '${o.bucket}' has a TTL of ${kv.cfg.maxAge} ms but 'ttl' is ${o.ttl} ms: pass ttl: ${kv.cfg.maxAge}, omit 'ttl' to adopt it, or use another bucket`,
      );
    }
    const ttl = kv.cfg.maxAge;
    const timeout = o.timeout === undefined
      ? Math.min(ttl / 4, 5_000)
      : checkDuration("timeout", o.timeout, 1, ttl);
    const settleTimeout = o.settleTimeout === undefined
      ? ttl
      : checkDuration("settleTimeout", o.settleTimeout, 0, 2 ** 31 - 1);
    const settings: ManagerSettings = {
      node: o.node,
      ttl,
      timeout,
      bucket: o.bucket,
      maxKey: o.maxKey,
      restartGrace: o.restartGrace ?? true,
      settleTimeout,
      idleRelease: o.idleRelease,
      // What start-up proves from the stream's configuration.
      markerLife: o.markers !== false && kv.markers
        ? markerLifeOf(kv.markerTTL, kv.cfg.maxAge)
        : 0,
      check: o.check ?? "cas",
      signal: o.signal,
    };
    const sim = new SimNode(
      this.#sched,
      kv,
      this.#net,
      this.#trace,
      this.#label(o.node),
      1,
      0,
      { BucketGone, ReplyTrust },
      ttl,
    );
    const manager = managerOnPort(sim.port, settings);
    const proc: Proc = { node: o.node, sim, manager, bucket: o.bucket };
    this.#procs.push(proc);
    this.#follow(proc);
    return manager;
  }

  /**
   * A label no other process of the kit has, whose instance ids (the label,
   * `i` and a count) no other label's can equal: letters, digits, `_`, `-`
   * and `~`.
   */
  #label(node: string): string {
    const base = node.replace(/[^\w-]/g, "_");
    let label = base;
    for (let n = 2; this.#labels.has(label); n++) label = `${base}~${n}`;
    this.#labels.add(label);
    return label;
  }

  /** Tracks the tenures of a process's manager through its events. */
  #follow(p: Proc): void {
    const end = (tenure: string, why: TestTenureEnd) => {
      const t = this.#byTenure.get(tenure);
      if (t === undefined || t.ended !== undefined) return;
      t.to = this.#sched.now;
      t.ended = why;
    };
    p.manager.addEventListener("acquired", (e) => {
      const now = this.#sched.now;
      const t: MutableTenure = {
        bucket: p.bucket,
        key: e.key,
        node: p.node,
        epoch: e.epoch,
        tenure: e.tenure,
        from: now,
        writable: now + e.grace,
        to: undefined,
        ended: undefined,
      };
      this.#tenures.push(t);
      this.#byTenure.set(e.tenure, t);
      this.#owners.set(e.tenure, p);
    });
    p.manager.addEventListener("released", (e) => end(e.tenure, "released"));
    p.manager.addEventListener("lost", (e) => end(e.tenure, e.reason));
  }

  /** The latest process of `node` that has not crashed. */
  #proc(verb: string, node: string): Proc {
    this.#open(verb);
    for (let i = this.#procs.length - 1; i >= 0; i--) {
      const p = this.#procs[i]!;
      if (p.node === node && !p.sim.dead) return p;
    }
    throw new TypeError(
      `Cannot ${verb} as no live process has node id ${
        describe(node)
      }: make one with manager({ node })`,
    );
  }

  pause(node: string, ms: number): void {
    const p = this.#proc(`pause node ${describe(node)}`, node);
    if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) {
      throw new RangeError(
        `Cannot pause node ${
          describe(node)
        } as 'ms' must be a finite number of milliseconds of 0 or more: received ${
          describe(ms)
        }`,
      );
    }
    p.sim.pause(this.#sched.now + ms);
  }

  crash(node: string): void {
    const p = this.#proc(`crash node ${describe(node)}`, node);
    p.sim.crash();
    const now = this.#sched.now;
    for (const t of this.#tenures) {
      if (t.ended === undefined && this.#owners.get(t.tenure) === p) {
        t.to = now;
        t.ended = "crashed";
      }
    }
  }

  expire(key: string, bucket = "leases"): boolean {
    this.#open(`expire ${describe(key)}`);
    if (typeof key !== "string" || key === "") {
      throw new TypeError(
        `Cannot expire a key as 'key' must be a non-empty string: received ${
          describe(key)
        }`,
      );
    }
    const kv = this.#bucket(bucket);
    if (kv === undefined) {
      throw new TypeError(
        `Cannot expire ${describe(key)} as bucket ${
          describe(bucket)
        } does not exist: a manager creates it`,
      );
    }
    return kv.expireNow(key);
  }

  recordWrite(lease: Lease): void {
    const t = typeof lease === "object" && lease !== null
      ? this.#byTenure.get(lease.tenure)
      : undefined;
    if (t === undefined) {
      throw new TypeError(
        `Cannot record a write as 'lease' is no lease of this kit's managers: received ${
          describe(lease)
        }`,
      );
    }
    this.#writes.push({
      bucket: t.bucket,
      key: t.key,
      node: t.node,
      epoch: t.epoch,
      tenure: t.tenure,
      at: this.#sched.now,
    });
  }

  history(): TestHistory {
    return {
      tenures: this.#tenures.map((t) => ({ ...t })),
      writes: this.#writes.map((w) => ({ ...w })),
    };
  }

  assertNoOverlap(): void {
    for (const w of this.#writes) {
      const own = this.#byTenure.get(w.tenure)!;
      const i = this.#tenures.indexOf(own);
      const later = this.#tenures.slice(i + 1).find((t) =>
        t.bucket === w.bucket && t.key === w.key && t.writable <= w.at
      );
      if (later !== undefined) {
        throw new LeaseOverlapError(w, { ...own }, { ...later });
      }
    }
  }

  trace(key?: string): string {
    return this.#trace.format(key, Infinity);
  }

  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    // Closing takes virtual time (each release is a round trip): a manual
    // clock is driven for it.
    this.#driver.start(true);
    const live = this.#procs.filter((p) => !p.sim.dead);
    let settled = false;
    const closed = Promise.allSettled(live.map((p) => p.manager.close()))
      .then(() => {
        settled = true;
      });
    // Bounded in virtual time: a manager whose close() never settles is a
    // finding, not a hang.
    const bound = 10 * this.ttl;
    let stuck = false;
    const late = new Promise<void>((resolve) => {
      this.#sched.at(this.#sched.now + bound, () => {
        stuck = true;
        resolve();
      }, { pure: true });
    });
    await Promise.race([closed, late, this.#driver.ended()]);
    await this.#driver.stop();
    if (this.#driver.failure) throw this.#driver.failure;
    if (stuck && !settled) {
      throw new Error(
        `Cannot close test leases as a manager did not close within ${bound} ms (ten TTLs) of virtual time`,
      );
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** The options of `manager()` that shape it, checked as createLeaseManager checks them. */
interface Checked {
  node: string;
  bucket: string;
  maxKey: number;
  /** The `ttl` given, if any. */
  ttl: number | undefined;
  timeout: number | undefined;
  settleTimeout: number | undefined;
  idleRelease: number | undefined;
  check: "cas" | "lease" | undefined;
  restartGrace: boolean | undefined;
  createBucket: boolean | undefined;
  markers: boolean | undefined;
  signal: AbortSignal | undefined;
}

/**
 * Checks `manager()`'s options with the rules and messages of
 * `createLeaseManager` (its option checks live in `lease.ts`, beside
 * nats.js: the kit runs the shared parts of `lease/input.ts` and mirrors
 * the rest).
 */
function checkOptions(options: TestManagerOptions, kitTtl: number): Checked {
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `Cannot create lease manager as 'options' must be an object: received ${
        describe(options)
      }`,
    );
  }
  const given = options as TestManagerOptions & { nc?: unknown };
  if (given.nc !== undefined) {
    throw new TypeError(
      `Cannot create test lease manager with 'nc': the testing kit's in-memory server is its connection, so omit 'nc'`,
    );
  }
  for (const name of ["stream", "leaseSubjects"] as const) {
    if (options[name] !== undefined) {
      throw new TypeError(
        `Cannot create test lease manager with '${name}': the testing kit does not offer leases in a stream yet`,
      );
    }
  }
  // The checks createLeaseManager makes of the same options.
  const shared = checkSharedOptions(options);
  if (options.fenced === true) {
    throw new TypeError(
      `Cannot create test lease manager with fenced: true: the testing kit does not offer fenced buckets yet`,
    );
  }
  const { node, signal, domain } = options;
  const bucket = options.bucket ?? "leases";
  if (typeof bucket !== "string" || !BUCKET_RE.test(bucket)) {
    throw new TypeError(
      `Cannot create lease manager as 'bucket' must be ASCII letters, digits, '-' or '_': received ${
        describe(bucket)
      }`,
    );
  }
  const maxKey = maxKeyLength(
    bucket,
    domain === undefined ? "$JS.API" : `$JS.${domain}.API`,
  );
  if (maxKey < 1) {
    throw new TypeError(
      `Cannot create lease manager as 'bucket' is too long: its subjects would leave no room for a key in nats-server's control line: received a name of ${bucket.length} characters`,
    );
  }
  const ttl = options.ttl === undefined
    ? undefined
    : checkDuration("ttl", options.ttl, MIN_TTL, 2 ** 31 - 1);
  // Checked against the TTL in force once the bucket is known; against
  // the given (or the kit's) TTL now, as createLeaseManager does first.
  const first = ttl ?? kitTtl;
  if (options.timeout !== undefined) {
    checkDuration("timeout", options.timeout, 1, first);
  }
  if (options.settleTimeout !== undefined) {
    checkDuration("settleTimeout", options.settleTimeout, 0, 2 ** 31 - 1);
  }
  if (signal?.aborted) {
    throw signal.reason ?? new DOMException("aborted", "AbortError");
  }
  return {
    node,
    bucket,
    maxKey,
    ttl,
    timeout: options.timeout,
    settleTimeout: options.settleTimeout,
    idleRelease: shared.idleRelease,
    check: shared.check,
    restartGrace: options.restartGrace,
    createBucket: options.createBucket,
    markers: options.markers,
    signal,
  };
}

/**
 * Makes a testing kit: an in-memory JetStream KV server with a virtual
 * clock, on which {@linkcode TestLeases.manager} makes real lease managers,
 * and faults and checks for tests of failovers. Close it at the end of
 * the test (`await using`, or {@linkcode TestLeases.close}): with a key
 * held, its driver keeps renewing it otherwise.
 *
 * @param options The TTL, markers, server version and clock mode.
 * @returns The kit.
 * @throws {RangeError} `ttl`, `latency` or `maxTime` is out of range.
 * @throws {TypeError} `clock`, `markers`, `version` or `trace` is invalid.
 * @example A paused holder's late write caught
 * ```ts
 * import {
 *   createTestLeases,
 *   type Lease,
 *   LeaseOverlapError,
 * } from "@nats-lease/lease/testing";
 *
 * await using t = createTestLeases({ ttl: 15_000 });
 * const a = t.manager({ node: "a" });
 * const b = t.manager({ node: "b" });
 * // a's write returns at once and commits later, unchecked: it escapes.
 * let late: Lease | undefined;
 * await a.guard("report", (lease) => {
 *   late = lease;
 * });
 * t.pause("a", 40_000); // a stalls before its commit
 * await b.guard("report", (lease) => t.recordWrite(lease), { wait: true });
 * await t.clock.advance(10_000); // a resumes, and commits
 * t.recordWrite(late!);
 * try {
 *   t.assertNoOverlap();
 * } catch (err) {
 *   if (!(err instanceof LeaseOverlapError)) throw err;
 *   console.log(err.message); // names both tenures, their epochs and times
 * }
 * ```
 */
export function createTestLeases(options: TestLeasesOptions = {}): TestLeases {
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `Cannot create test leases as 'options' must be an object: received ${
        describe(options)
      }`,
    );
  }
  const ttl = options.ttl === undefined ? DEFAULT_TTL : options.ttl;
  if (
    typeof ttl !== "number" || !Number.isFinite(ttl) || ttl < MIN_TTL ||
    ttl > 2 ** 31 - 1
  ) {
    throw new RangeError(
      `Cannot create test leases as 'ttl' must be a finite number of milliseconds from ${MIN_TTL} to ${
        2 ** 31 - 1
      }: received ${describe(ttl)}`,
    );
  }
  const clock = options.clock ?? "virtual";
  if (clock !== "virtual" && clock !== "manual" && clock !== "real") {
    throw new TypeError(
      `Cannot create test leases as 'clock' must be "virtual", "manual" or "real": received ${
        describe(clock)
      }`,
    );
  }
  for (const name of ["markers", "trace"] as const) {
    if (options[name] !== undefined && typeof options[name] !== "boolean") {
      throw new TypeError(
        `Cannot create test leases as '${name}' must be a boolean: received ${
          describe(options[name])
        }`,
      );
    }
  }
  const { version } = options;
  if (
    version !== undefined &&
    (typeof version !== "string" || !/^\d+\.\d+\.\d+/.test(version))
  ) {
    throw new TypeError(
      `Cannot create test leases as 'version' must be a nats-server release such as "2.10.22": received ${
        describe(version)
      }`,
    );
  }
  const latency = options.latency ?? 0.5;
  if (
    typeof latency !== "number" || !Number.isFinite(latency) || latency < 0 ||
    latency > ttl
  ) {
    throw new RangeError(
      `Cannot create test leases as 'latency' must be a finite number of milliseconds from 0 to the TTL (${ttl}): received ${
        describe(latency)
      }`,
    );
  }
  const maxTime = options.maxTime ?? 86_400_000;
  if (typeof maxTime !== "number" || !(maxTime > 0)) {
    throw new RangeError(
      `Cannot create test leases as 'maxTime' must be a positive number of milliseconds: received ${
        describe(maxTime)
      }`,
    );
  }
  return new Kit({
    ttl,
    markers: options.markers ?? true,
    version,
    clock,
    latency,
    maxTime,
    trace: options.trace ?? false,
  });
}
