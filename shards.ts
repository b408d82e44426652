/**
 * Shard ownership over leases: the shards `0..count-1` of a group are split
 * among the live members, each shard an ordinary lease with its own key and
 * fencing epoch.
 *
 * ## Why a free function
 * {@linkcode shards} is written only against the public
 * {@linkcode LeaseManager} interface (`guard`, `held`, `watch`,
 * `release`, `holder`, `holders` to name a count that differs, and the
 * `acquired`, `lost` and `released` events to hand a key on in its grace),
 * so it adds no protocol: every shard is a lease, and what the
 * safety argument of `lease/manager.ts` says of a lease holds for each shard. Taking
 * the manager as an argument rather than adding a method keeps `lease.ts`
 * (the protocol core) from growing for a recipe, and lets any object that
 * implements the interface (a test double, a wrapper) drive it.
 *
 * ## Keys
 * - `<group>.members.<slot>`: membership. A member holds one of
 *   `maxMembers` slots, the value being its node id. A listing of keys
 *   (`holders`) would have to be repeated to notice a change, so members
 *   find each other by watching every slot (one watch per slot, no
 *   polling): the slots are bounded for that reason.
 * - `<group>.members.<slot>.n<count>`: the count of the member in that
 *   slot, taken before the slot and released after it (see "Count
 *   agreement").
 * - `<group>.shards.<i>`: shard `i`, held by its owner.
 *
 * ## Balance and stickiness
 * The target owner of each shard is {@linkcode assignShards} of the member
 * set: rendezvous hashing with a balancing pass, a deterministic function
 * that every member computes alike. A member waits for and holds the shards it is
 * the target of and releases the others; a join or leave moves only about
 * `count / members` shards, and shards that do not move are never released.
 *
 * ## Count agreement
 * Members with different counts compute different targets, and a shard that
 * neither's target gives itself stays without an owner, with no error from
 * the leases (each shard is still single-writer). So every member records
 * its count where it announces itself: a lease value is the holder's node
 * id and nothing else, so the count goes in a key's name, the count key
 * beside its slot. A member takes its count key before its slot and
 * releases it after, so whoever sees a member in a slot finds its count
 * recorded; it reads it once per (slot, tenure) it sees, never per write.
 * The group's count is the count of its longest-standing member (the
 * lowest slot epoch, a revision of one stream, so all members order them
 * alike): a member whose count differs fails its iteration with
 * {@linkcode ShardCountMismatchError} before it takes any shard (it decides
 * nothing until the counts of the members it sees are read), and the
 * others leave it out of their targets, so their shards never move to a
 * member that will not hold them. A member that records no count (an
 * older version of this module) is taken to agree.
 *
 * ## Writes
 * A shard moved away is released as soon as the writes under its lease
 * settled. A guard on its key without that lease's signal, still running
 * then or called later, may acquire the free key again before the new
 * owner's waiting guard does, and keeps it: the member no longer lists it,
 * and the new owner waits. {@linkcode ShardLease.guard} passes the lease's
 * own signal to every guard. That signal aborts when the shard is to move,
 * before the release starts (a hold releases its key only once its
 * tenure's write ended, and that write ends on this abort): a guard under
 * way rejects at the abort and sends nothing more on the key, and a later
 * one is refused at once, so no guard through a shard's lease reaches the
 * key after its release.
 *
 * ## Handing on in the grace
 * A key the manager takes over (from a holder that stopped renewing, after
 * someone else's delete, or fresh where expiry markers are not proven)
 * comes with the failover grace: the manager holds it, but no write runs
 * until it is over (a TTL, two after a foreign delete; `lease.ts`, point
 * 3). A release inside the grace is not clean (it would hand on a skip it
 * was not owed), so the key would be left to expire, and its next owner
 * would wait for that (up to a TTL after our last renewal) and then a
 * grace of its own: two TTLs after the move, and two more each time the
 * next change moves it again inside that owner's grace. So a shard, slot
 * or count key that is to be given up while its grace runs is released
 * when the grace is over, cleanly, and its next owner takes it at once:
 * no later than the grace allowed anyway. The manager's `acquired` event
 * says how long the grace is; a `lost` or `released` event of that tenure
 * ends the wait. Nothing is written meanwhile: a shard's lease is handed
 * out only after its grace, and this member no longer lists the shard.
 * Leaving waits for those graces too, in the order `leave` gives.
 *
 * @module
 */

import {
  type FencedOp,
  type GuardOptions,
  type Holder,
  type Lease,
  type LeaseAcquiredEvent,
  type LeaseLostEvent,
  type LeaseManager,
  type LeaseReleasedEvent,
  NotHolderError,
  UnavailableError,
} from "./lease.ts";
import { checkNameRoom } from "./semaphore.ts";

/**
 * Default of {@linkcode ShardsOptions.maxMembers}: how many members a group
 * can have at once.
 *
 * @example Room for more workers
 * ```ts ignore
 * shards(leases, "orders", { count: 256, maxMembers: 2 * DEFAULT_MAX_MEMBERS });
 * ```
 */
export const DEFAULT_MAX_MEMBERS = 16;
/**
 * The largest {@linkcode ShardsOptions.count}. Each member computes
 * {@linkcode assignShards} on every change of members, in time that grows
 * with shards times members.
 *
 * @example Check a configured count
 * ```ts ignore
 * if (count > MAX_SHARDS) throw new RangeError(`at most ${MAX_SHARDS} shards`);
 * ```
 */
export const MAX_SHARDS = 4096;
/** The largest {@linkcode ShardsOptions.maxMembers}. */
const MAX_MEMBER_SLOTS = 256;
/** The most (shard, member) pairs {@linkcode assignShards} ranks. */
const MAX_PAIRS = MAX_SHARDS * MAX_MEMBER_SLOTS;

const KEY_RE = /^[-/=\w]+(\.[-/=\w]+)*$/;

/**
 * Options of {@linkcode shards}.
 *
 * @example 32 shards, until Ctrl-C
 * ```ts ignore
 * const stop = new AbortController();
 * process.once("SIGINT", () => stop.abort());
 * const options: ShardsOptions = { count: 32, signal: stop.signal };
 * for await (const a of shards(leases, "orders", options)) console.log(a.added);
 * ```
 */
export interface ShardsOptions {
  /**
   * How many shards the group has: shards are numbered `0..count-1`. Every
   * member of a group must pass the same count: one whose count differs
   * from the group's (its longest-standing member's) fails with
   * {@linkcode ShardCountMismatchError}. At most {@linkcode MAX_SHARDS}.
   */
  count: number;
  /**
   * Aborting it leaves the group: the iteration ends (it returns), and this
   * member's shards and membership are released at once, so the others
   * take its shards within milliseconds; a key it took over within the
   * last TTL, whose failover grace still runs, when that grace is over
   * (released inside it, the key would be left to expire, which keeps the
   * others waiting longer).
   * @default {undefined}
   */
  signal?: AbortSignal;
  /**
   * How many members the group can have at once (membership slots, each
   * watched by every member). A node that finds every slot taken waits as a
   * standby, owning nothing, until one frees. Every member of a group must
   * pass the same value. At most 256.
   * @default {16}
   */
  maxMembers?: number;
}

/**
 * The lease of one shard a member owns, as {@linkcode ShardAssignment.owned}
 * gives it: a {@linkcode Lease} (key `<group>.shards.<i>`, fencing epoch,
 * loss signal) with the guard to write to the shard through.
 *
 * @example Write shard 3 while this member owns it
 * ```ts ignore
 * const lease = a.owned.get(3)!;
 * await lease.guard((l) => store.append(3, l.epoch, record));
 * ```
 */
export interface ShardLease extends Lease {
  /** The shard number. */
  readonly shard: number;
  /**
   * Runs `write` under this shard's lease, as
   * {@linkcode LeaseManager.guard} on {@linkcode Lease.key} does, while this
   * member owns the shard under this lease; refuses it once the lease ended
   * (the shard is to move to another member, the member left, or the lease
   * was lost), without taking the key again: a shard that moved away stays
   * with its new owner. A shard the member owns again later comes under a
   * new lease, in a later assignment; this one keeps refusing.
   *
   * @typeParam T What `write` returns.
   * @param write The write; it gets the lease of this guard (the shard's epoch and tenure, a signal that also follows `options.signal`).
   * @param options A signal to give up, and the guard's `check` (see {@linkcode GuardOptions}).
   * @returns What `write` returns; what it throws is rethrown unchanged.
   * @throws {NotHolderError} This lease ended before `write` started (a guard under way included); `write` was not called.
   * @throws {UnavailableError} The server could not be reached or answered too late; `write` was not called.
   * @throws {TypeError} `write` is not a function, `options` not an object, `signal` not an `AbortSignal`, `check` neither `"cas"` nor `"lease"`, or the manager is closed.
   * @throws {unknown} The reason of `options.signal` when it aborts before the write started.
   *
   * @example Write until the shard moves
   * ```ts ignore
   * const lease = a.owned.get(i)!;
   * while (!lease.signal.aborted) {
   *   await lease.guard((l) => store.append(i, l.epoch, next()))
   *     .catch((err) => { if (!(err instanceof NotHolderError)) throw err; });
   * }
   * ```
   */
  guard<T>(
    write: (lease: Lease) => T | Promise<T>,
    options?: Omit<GuardOptions, "wait">,
  ): Promise<T>;
}

/**
 * One assignment yielded by {@linkcode shards}: what this member owns now.
 *
 * @example Start and stop a worker per shard
 * ```ts ignore
 * for await (const a of shards(leases, "orders", { count: 32, signal })) {
 *   for (const i of a.removed) workers.get(i)?.stop();
 *   for (const i of a.added) workers.set(i, startWorker(i, a.owned.get(i)!));
 *   console.log(`${a.owned.size} shards, members: ${a.members.join(" ")}`);
 * }
 * ```
 */
export interface ShardAssignment {
  /**
   * The shards this member owns, each with its lease. Write to shard `i`
   * with `owned.get(i).guard(write)` ({@linkcode ShardLease.guard}), which
   * refuses once the shard moved away instead of taking its key again.
   */
  readonly owned: ReadonlyMap<number, ShardLease>;
  /** Shards owned now and not in the previous assignment (or under a new lease since), in order. */
  readonly added: readonly number[];
  /** Shards owned in the previous assignment and not now (or under a new lease since), in order. */
  readonly removed: readonly number[];
  /** The members seen whose count agrees (node ids, sorted), this member included once it holds a slot. */
  readonly members: readonly string[];
}

/**
 * The lease key of shard `shard` of `group`.
 *
 * @param group The group name (a lease key).
 * @param shard The shard number.
 * @returns The key, `<group>.shards.<shard>`.
 *
 * @example Who holds shard 3
 * ```ts ignore
 * import { shardKey } from "@nats-lease/lease";
 * console.log(await leases.holder(shardKey("orders", 3))); // key "orders.shards.3"
 * ```
 */
export function shardKey(group: string, shard: number): string {
  return `${group}.shards.${shard}`;
}

/**
 * The lease key of membership slot `slot` of `group`.
 *
 * @param group The group name (a lease key).
 * @param slot The slot number.
 * @returns The key, `<group>.members.<slot>`.
 *
 * @example The first slot
 * ```ts ignore
 * import { memberKey } from "@nats-lease/lease";
 * console.log(memberKey("orders", 0)); // "orders.members.0"
 * ```
 */
export function memberKey(group: string, slot: number): string {
  return `${group}.members.${slot}`;
}

/** The key that records the count of the member in slot `slot`. */
function countKey(group: string, slot: number, count: number): string {
  return `${memberKey(group, slot)}.n${count}`;
}

/**
 * This member's count differs from its group's: the count recorded by the
 * group's longest-standing member (the one whose slot has the lowest
 * epoch). The member took no shard, and its iteration ended, having left
 * the group; the other members left it out of their targets. Either
 * configuration is wrong, or the count is being changed: stop every member
 * of the group, or start the new count under another group name.
 *
 * @example Tell a misconfiguration
 * ```ts ignore
 * try {
 *   for await (const a of shards(leases, "orders", { count: 32, signal })) run(a);
 * } catch (err) {
 *   if (err instanceof ShardCountMismatchError) {
 *     console.error(`count ${err.asked}, but ${err.holder} records ${err.recorded}`);
 *   }
 *   throw err;
 * }
 * ```
 */
export class ShardCountMismatchError extends RangeError {
  /** The group's name. */
  readonly group: string;
  /** The count this member was given. */
  readonly asked: number;
  /** The count the group's longest-standing member records. */
  readonly recorded: number;
  /** That member's count key, `<group>.members.<slot>.n<recorded>`. */
  readonly key: string;
  /** That member's node id. */
  readonly holder: string;

  /**
   * Makes the error.
   *
   * @param group The group's name.
   * @param asked The count this member was given.
   * @param recorded The count recorded.
   * @param key The key that records it.
   * @param holder Its holder.
   */
  constructor(
    group: string,
    asked: number,
    recorded: number,
    key: string,
    holder: string,
  ) {
    super(
      `Cannot follow the shards of '${group}' with count ${asked}: the group's longest-standing member '${holder}' records count ${recorded} in '${key}' (give every member the same count, or start the new count under another group name)`,
    );
    this.name = "ShardCountMismatchError";
    this.group = group;
    this.asked = asked;
    this.recorded = recorded;
    this.key = key;
    this.holder = holder;
  }
}

function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number" || typeof value === "boolean") {
    return String(value);
  }
  if (value === null) return "null";
  if (value === undefined) return "undefined";
  return typeof value;
}

function checkCount(verb: string, count: unknown): asserts count is number {
  if (typeof count !== "number") {
    throw new TypeError(
      `Cannot ${verb} as 'count' must be a number: received ${describe(count)}`,
    );
  }
  if (!Number.isInteger(count) || count < 1 || count > MAX_SHARDS) {
    throw new RangeError(
      `Cannot ${verb} as 'count' must be a whole number from 1 to ${MAX_SHARDS}: received ${count}`,
    );
  }
}

/** A 32-bit score of (member, shard): FNV-1a, then murmur3's finaliser. */
function score(member: string, shard: number): number {
  let h = 0x811c9dc5;
  const s = `${member}\u0000${shard}`;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * The target owner of each shard for a member set: a deterministic function
 * of `count` and the set (the order and repeats of `members` do not
 * matter), which every member computes alike.
 *
 * Rendezvous hashing with a balancing pass: each (shard, member) pair gets
 * a hash score, and the pairs are taken from the highest score down; a pair
 * assigns its shard to its member unless the shard is taken or the member
 * is full. A member is full at `floor(count / n)` shards once
 * `count mod n` members have reached `ceil(count / n)`, so every member
 * ends with one of the two. When one member joins or leaves, a shard moves
 * only if its pair with the joiner outranks its current assignment, or its
 * owner left, or balance forces it: about `count / n` shards move.
 *
 * @param count The number of shards, from 1 to {@linkcode MAX_SHARDS}.
 * @param members The members' node ids.
 * @returns Each member's shards, in ascending order (every member has an entry, possibly empty).
 * @throws {TypeError} `count` is not a number, or `members` is not an array of non-empty strings.
 * @throws {RangeError} `count` is not a whole number from 1 to {@linkcode MAX_SHARDS}, or `count` times the number of distinct members exceeds 1,048,576 ({@linkcode MAX_SHARDS} × 256).
 *
 * @example Who should own shard 7
 * ```ts ignore
 * import { assignShards } from "@nats-lease/lease";
 * const targets = assignShards(16, ["node-a", "node-b", "node-c"]);
 * const owner = [...targets].find(([, s]) => s.includes(7))?.[0];
 * console.log(owner, targets.get("node-a")!.length); // 5 or 6 shards each
 * ```
 */
export function assignShards(
  count: number,
  members: readonly string[],
): Map<string, number[]> {
  checkCount("assign shards", count);
  if (
    !Array.isArray(members) ||
    members.some((m) => typeof m !== "string" || m === "")
  ) {
    throw new TypeError(
      `Cannot assign shards as 'members' must be an array of non-empty strings: received ${
        Array.isArray(members)
          ? `[${members.map(describe).join(", ")}]`
          : describe(members)
      }`,
    );
  }
  const ms = [...new Set(members)].sort();
  const out = new Map<string, number[]>(ms.map((m) => [m, []]));
  const n = ms.length;
  if (count * n > MAX_PAIRS) {
    throw new RangeError(
      `Cannot assign shards as 'count' times the number of members must be at most ${MAX_PAIRS}: received ${count} × ${n}`,
    );
  }
  if (n === 0) return out;
  const q = Math.floor(count / n);
  const r = count % n;
  // Each pair as one exact float64: (2^32 - 1 - score) * 2^20 + pair index,
  // so a plain numeric sort orders the pairs by score (highest first), ties
  // by shard, then member (names sorted). count * n <= 2^20 (MAX_SHARDS
  // shards, 256 members), so the sum stays below 2^53.
  const pairs = new Float64Array(count * n);
  for (let s = 0; s < count; s++) {
    for (let m = 0; m < n; m++) {
      const p = s * n + m;
      pairs[p] = (0xffffffff - score(ms[m]!, s)) * 0x100000 + p;
    }
  }
  pairs.sort();
  const load = new Array<number>(n).fill(0);
  const owner = new Int32Array(count).fill(-1);
  let atCeil = 0;
  let left = count;
  for (const key of pairs) {
    const p = key % 0x100000;
    const s = Math.floor(p / n), m = p % n;
    if (owner[s] !== -1) continue;
    const l = load[m]!;
    if (l < q || (l === q && atCeil < r)) {
      owner[s] = m;
      load[m] = l + 1;
      if (l === q) atCeil++;
      if (--left === 0) break;
    }
  }
  for (let s = 0; s < count; s++) out.get(ms[owner[s]!]!)!.push(s);
  return out;
}

const groupsInUse = new WeakMap<LeaseManager, Set<string>>();

/**
 * Joins `group` as a member and follows which of its shards `0..count-1`
 * this node owns: an async iterable of {@linkcode ShardAssignment}s, one
 * each time the shards owned or the members seen change (changes that come
 * while the loop body runs are folded into the next one).
 *
 * - **Membership.** The member holds one slot lease
 *   (`<group>.members.<slot>`, of `maxMembers`) and watches every slot. A
 *   member that crashes drops out when its slot's entry expires (the TTL);
 *   one that leaves (`break`, a throw out of the loop, `signal`, or the
 *   manager's `close()`) releases its shards and its slot at once (a key
 *   still in its failover grace once that is over, see below).
 * - **Ownership.** The member waits for and holds each shard that
 *   {@linkcode assignShards} gives it for the members seen (a guard with
 *   `wait: true` whose write lasts the tenure, so the key is renewed in the
 *   background and never idle-released), and releases each shard it no
 *   longer gets. A shard it keeps is never released. A shard's lease
 *   signal aborts as soon as the shard is to move, and its key is released
 *   once the writes on it settled, so before any other member can take it;
 *   the next owner takes it within milliseconds of the release. A shard
 *   this member took over within the last TTL, still in its failover
 *   grace (never handed out), is released when the grace is over, cleanly,
 *   not at once: released inside the grace it would be left to expire, and
 *   its next owner would wait about two TTLs. A leaving
 *   member releases its shards before its slot, so the others find them
 *   free when they learn it left. A crashed owner's shards are taken after
 *   its entries expire and the failover grace (a TTL) runs. A tenure lost
 *   (the server unreachable past the TTL) ends that shard's lease; the
 *   member then waits for the shard again, under a new epoch.
 * - **Writes.** Write to shard `i` with `owned.get(i).guard(write)`
 *   ({@linkcode ShardLease.guard}): it refuses with
 *   {@linkcode NotHolderError} once the shard is to move away, instead of
 *   taking its key again, and `write` gets the shard's fencing epoch for
 *   the store, as any guard does. A guard on the key with no lease signal
 *   (`leases.guard(key, write)`) can take a shard that just moved away back
 *   from its new owner, and keep it.
 * - **Count.** Every member records its count beside its slot; one whose
 *   count differs from the group's (its longest-standing member's) throws
 *   {@linkcode ShardCountMismatchError} before it takes any shard, and the
 *   others leave it out.
 *
 * The members only agree on the target once their views of the slots agree:
 * while a change propagates (a few milliseconds of watch latency), two
 * members may both want a shard, and the lease makes one of them wait. A
 * node runs one iteration per group per manager at a time.
 *
 * @param leases The lease manager; its node id is the member's id.
 * @param group The group name: a lease key (ASCII letters, digits, `-`, `_`, `/`, `=`, `.`-separated).
 * @param options The shard count, a signal to leave, and the number of membership slots.
 * @returns The assignments, starting once this node's view of the group is complete.
 * @throws {TypeError} `leases` is not a lease manager, `group` is not a valid key, `signal` is not an `AbortSignal`, or a number option is not a number; when iterating starts, `group` is too long for the manager's bucket with the keys made from it, another iteration of the same group on this manager is running, or the manager is closed. A manager closed later ends the iteration quietly, as a leave does.
 * @throws {RangeError} `count` is not a whole number from 1 to {@linkcode MAX_SHARDS}, or `maxMembers` not one from 1 to 256.
 * @throws {UnavailableError} While iterating: the bucket is gone or the connection closed for good.
 * @throws {ShardCountMismatchError} While iterating: the group's longest-standing member records another count; this member took no shard and left.
 *
 * @example Process the shards this node owns
 * ```ts ignore
 * import { shards } from "@nats-lease/lease";
 *
 * for await (const a of shards(leases, "orders", { count: 32, signal })) {
 *   for (const i of a.removed) stopWorker(i);
 *   for (const i of a.added) {
 *     const lease = a.owned.get(i)!;
 *     // Refused (NotHolderError) once shard i moved away.
 *     startWorker(i, (record) =>
 *       lease.guard((l) => store.append(i, l.epoch, record)));
 *   }
 * }
 * ```
 */
export function shards(
  leases: LeaseManager,
  group: string,
  options: ShardsOptions,
): AsyncIterable<ShardAssignment> {
  const verb = `follow the shards of '${group}'`;
  if (
    typeof leases !== "object" || leases === null ||
    typeof leases.guard !== "function" ||
    typeof leases.watch !== "function" ||
    typeof leases.held !== "function" ||
    typeof leases.holder !== "function" ||
    typeof leases.release !== "function"
  ) {
    throw new TypeError(
      `Cannot follow shards as 'leases' must be a LeaseManager: received ${
        describe(leases)
      }`,
    );
  }
  if (typeof group !== "string" || !KEY_RE.test(group)) {
    throw new TypeError(
      `Cannot follow shards as 'group' must be a lease key (letters, digits, '-', '_', '/', '=' in '.'-separated tokens): received ${
        describe(group)
      }`,
    );
  }
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `Cannot ${verb} as 'options' must be an object with 'count': received ${
        describe(options)
      }`,
    );
  }
  const { count, signal } = options;
  checkCount(verb, count);
  const slots = options.maxMembers ?? DEFAULT_MAX_MEMBERS;
  if (typeof slots !== "number") {
    throw new TypeError(
      `Cannot ${verb} as 'maxMembers' must be a number: received ${
        describe(slots)
      }`,
    );
  }
  if (!Number.isInteger(slots) || slots < 1 || slots > MAX_MEMBER_SLOTS) {
    throw new RangeError(
      `Cannot ${verb} as 'maxMembers' must be a whole number from 1 to ${MAX_MEMBER_SLOTS}: received ${slots}`,
    );
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `Cannot ${verb} as 'signal' must be an AbortSignal: received ${
        describe(signal)
      }`,
    );
  }
  // The group's longest keys: its last slot's count key, its last shard's.
  const added = Math.max(
    countKey(group, slots - 1, count).length,
    shardKey(group, count - 1).length,
  ) - group.length;
  return {
    [Symbol.asyncIterator]: () => {
      // Asked of the manager only now: shards() itself calls nothing on it.
      checkNameRoom(leases, "follow shards", "group", group, added);
      return follow(new Member(leases, group, count, slots, signal));
    },
  };
}

async function* follow(
  m: Member,
): AsyncGenerator<ShardAssignment, void, undefined> {
  m.start();
  try {
    for (;;) {
      const a = await m.next();
      if (a === null) return;
      yield a;
    }
  } finally {
    await m.leave();
  }
}

/** One key this member holds or waits for (a shard, its slot). */
interface Hold {
  readonly stop: AbortController;
  /** Resolves when the hold ended and the key was released. */
  readonly done: Promise<void>;
}

/**
 * Another node seen in a slot, for one tenure of that slot, and its count:
 * `undefined` while it is read, `null` when it records none.
 */
interface Peer {
  readonly node: string;
  readonly epoch: number;
  count: number | null | undefined;
}

/** A shard's lease, with the guard that refuses once it ended. */
class OwnedShard implements ShardLease {
  readonly #lease: Lease;
  readonly #leases: LeaseManager;
  readonly #group: string;
  readonly shard: number;
  readonly key: string;
  readonly node: string;
  readonly epoch: number;
  readonly tenure: string;
  readonly signal: AbortSignal;

  constructor(
    lease: Lease,
    leases: LeaseManager,
    group: string,
    shard: number,
  ) {
    this.#lease = lease;
    this.#leases = leases;
    this.#group = group;
    this.shard = shard;
    this.key = lease.key;
    this.node = lease.node;
    this.epoch = lease.epoch;
    this.tenure = lease.tenure;
    this.signal = lease.signal;
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

  #refusal(): NotHolderError {
    return new NotHolderError(
      this.key,
      undefined,
      undefined,
      `Cannot write shard ${this.shard} of '${this.#group}' under its lease of epoch ${this.epoch}: that lease ended (the shard moved away, the member left, or the lease was lost); write through the lease of the latest assignment`,
    );
  }

  guard<T>(
    write: (lease: Lease) => T | Promise<T>,
    options: Omit<GuardOptions, "wait"> = {},
  ): Promise<T> {
    const verb = `guard a write on shard ${this.shard} of '${this.#group}'`;
    if (typeof write !== "function") {
      return Promise.reject(
        new TypeError(
          `Cannot ${verb} as 'write' must be a function: received ${
            describe(write)
          }`,
        ),
      );
    }
    if (typeof options !== "object" || options === null) {
      return Promise.reject(
        new TypeError(
          `Cannot ${verb} as 'options' must be an object: received ${
            describe(options)
          }`,
        ),
      );
    }
    const { signal, check } = options;
    if (signal !== undefined && !(signal instanceof AbortSignal)) {
      return Promise.reject(
        new TypeError(
          `Cannot ${verb} as 'signal' must be an AbortSignal: received ${
            describe(signal)
          }`,
        ),
      );
    }
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.signal.aborted) return Promise.reject(this.#refusal());
    // The lease's signal aborts when the shard is to move, before its key
    // is released (`#hold` releases only once the tenure's write ended): a
    // guard that has it rejects at that abort wherever it stands, and sends
    // nothing on the key after the release, so it cannot take the key
    // back from the shard's next owner.
    const both = signal ? AbortSignal.any([this.signal, signal]) : this.signal;
    let started = false;
    return this.#leases.guard(this.key, (l) => {
      started = true;
      // The write runs under this lease's own tenure or not at all.
      if (l.tenure !== this.tenure) throw this.#refusal();
      return write(l);
    }, check === undefined ? { signal: both } : { signal: both, check })
      .catch((err: unknown) => {
        if (
          !started && this.signal.aborted &&
          !(signal?.aborted && err === signal.reason)
        ) throw this.#refusal();
        throw err;
      });
  }
}

/** The state of one member of one group, for one iteration. */
class Member {
  readonly #leases: LeaseManager;
  readonly #group: string;
  readonly #count: number;
  readonly #slots: number;
  readonly #signal: AbortSignal | undefined;
  /** Aborted when the member leaves: ends the watches and shard holds. */
  readonly #stop = new AbortController();
  /** What each slot's watch last said; `undefined` until its first answer. */
  readonly #holders: (Holder | null | undefined)[];
  #heard = 0;
  #slot: number | undefined;
  /** Whether the watch of our slot has shown us in it since we took it. */
  #seenInSlot = false;
  #joining = false;
  /** Our view is complete and we joined, or found every slot taken. */
  #settled = false;
  #slotHold: Hold | undefined;
  /** The hold of our count key, taken before the slot, released after it. */
  #countHold: Hold | undefined;
  /** The other nodes in the slots and their counts, by slot. */
  readonly #peers: (Peer | undefined)[];
  /** A count of a node seen in a slot is being read: decide nothing yet. */
  #pending = false;
  /** A stopped slot hold (then its count key's), until its release is done. */
  #slotStopping: Promise<void> = Promise.resolve();
  /** Stopped shard holds, until their releases are done. */
  readonly #stopping = new Map<number, Promise<void>>();
  readonly #holds = new Map<number, Hold>();
  readonly #owned = new Map<number, OwnedShard>();
  #members: readonly string[] = [];
  #targetOf = "";
  #target = new Set<number>();
  /** Tasks to wait for on leaving (watches, holds being stopped). */
  readonly #tasks = new Set<Promise<void>>();
  #wake: (() => void) | undefined;
  #dirty = false;
  #failure: { error: unknown } | undefined;
  #ended = false;
  #leaving: Promise<void> | undefined;
  #last:
    | { owned: Map<number, OwnedShard>; members: readonly string[] }
    | undefined;
  #registered = false;
  #retry: ReturnType<typeof setTimeout> | undefined;
  /** Joins in a row kept from a free slot by its count key. */
  #blocked = 0;
  readonly #onAbort = () => this.#end();
  /**
   * Keys of this group the manager took with a grace still running (see
   * "Handing on in the grace"), by key: the tenure, when the grace ends
   * (`performance.now()`), and who waits for it.
   */
  readonly #graces = new Map<
    string,
    { tenure: string; until: number; waiters: Set<() => void> }
  >();
  readonly #onAcquired = (e: Event) => {
    const { key, tenure, grace } = e as LeaseAcquiredEvent;
    if (!key.startsWith(`${this.#group}.`)) return;
    this.#graceEnded(key);
    // The event comes in a microtask after the manager set the grace's
    // end from its clock: ours, read now, is no earlier.
    if (grace > 0) {
      this.#graces.set(key, {
        tenure,
        until: performance.now() + grace,
        waiters: new Set(),
      });
    }
  };
  readonly #onEnded = (e: Event) => {
    const { key, tenure } = e as LeaseLostEvent | LeaseReleasedEvent;
    if (this.#graces.get(key)?.tenure === tenure) this.#graceEnded(key);
  };

  constructor(
    leases: LeaseManager,
    group: string,
    count: number,
    slots: number,
    signal: AbortSignal | undefined,
  ) {
    this.#leases = leases;
    this.#group = group;
    this.#count = count;
    this.#slots = slots;
    this.#signal = signal;
    this.#holders = new Array<Holder | null | undefined>(slots).fill(
      undefined,
    );
    this.#peers = new Array<Peer | undefined>(slots).fill(undefined);
  }

  start(): void {
    if (this.#signal?.aborted) {
      this.#ended = true;
      return;
    }
    let inUse = groupsInUse.get(this.#leases);
    if (!inUse) groupsInUse.set(this.#leases, inUse = new Set());
    if (inUse.has(this.#group)) {
      throw new TypeError(
        `Cannot follow the shards of '${this.#group}' as this lease manager already follows them: one iteration per group per node`,
      );
    }
    inUse.add(this.#group);
    this.#registered = true;
    this.#signal?.addEventListener("abort", this.#onAbort, { once: true });
    // A manager without events (a test double) hands keys on as before:
    // at once, so those in their grace are left to expire.
    if (typeof this.#leases.addEventListener === "function") {
      this.#leases.addEventListener("acquired", this.#onAcquired);
      this.#leases.addEventListener("lost", this.#onEnded);
      this.#leases.addEventListener("released", this.#onEnded);
    }
    for (let s = 0; s < this.#slots; s++) this.#track(this.#watchSlot(s));
  }

  /** Forgets the grace of `key` and wakes who waits for its end. */
  #graceEnded(key: string): void {
    const g = this.#graces.get(key);
    if (!g) return;
    this.#graces.delete(key);
    for (const w of g.waiters) w();
  }

  /**
   * Resolves once the grace of our tenure of `key` is over, or that tenure
   * ended (lost, released, the manager closed): at once when there is none.
   * A release then is clean (see "Handing on in the grace").
   */
  async #graceOver(key: string): Promise<void> {
    for (;;) {
      const g = this.#graces.get(key);
      if (!g) return;
      // A timer may fire a millisecond early: a release before the
      // grace's end would not be clean.
      const left = g.until - performance.now();
      if (left <= 0) return this.#graceEnded(key);
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(t);
          g.waiters.delete(done);
          resolve();
        };
        const t = setTimeout(done, left + 2);
        g.waiters.add(done);
      });
    }
  }

  #track(p: Promise<void>): void {
    this.#tasks.add(p);
    p.finally(() => this.#tasks.delete(p));
  }

  #fail(error: unknown): void {
    this.#failure ??= { error };
    this.#end();
  }

  /** Ends the iteration and starts leaving at once (see `leave`). */
  #end(): void {
    this.#ended = true;
    clearTimeout(this.#retry);
    this.#stop.abort();
    this.#changed();
    void this.leave();
  }

  #changed(): void {
    this.#dirty = true;
    const w = this.#wake;
    this.#wake = undefined;
    w?.();
  }

  async #watchSlot(slot: number): Promise<void> {
    try {
      const key = memberKey(this.#group, slot);
      for await (
        const h of this.#leases.watch(key, { signal: this.#stop.signal })
      ) {
        if (this.#holders[slot] === undefined) this.#heard++;
        this.#holders[slot] = h;
        this.#see(slot, h);
        if (slot === this.#slot) {
          if (h?.node === this.#leases.node) {
            this.#seenInSlot = true;
            this.#settled = true;
          } else if (this.#seenInSlot) this.#lostSlot();
        }
        this.#reconcile();
      }
      // The watch ended without our stop: the manager closed (the member
      // ends), or the connection closed for good, which the iteration
      // reports as it documents (a campaign's guard rejects alike).
      if (this.#stop.signal.aborted) return;
      if (this.#leases.health?.().closed === false) {
        this.#fail(
          new UnavailableError(
            this.#group,
            `Cannot follow the shards of '${this.#group}': the NATS connection is closed`,
          ),
        );
      } else this.#end();
    } catch (err) {
      if (!this.#stop.signal.aborted) this.#fail(err);
    }
  }

  /** Starts reading the count of a node newly seen in `slot`. */
  #see(slot: number, h: Holder | null): void {
    const p = this.#peers[slot];
    if (h === null || h.node === this.#leases.node) {
      this.#peers[slot] = undefined;
      return;
    }
    if (p && p.node === h.node && p.epoch === h.epoch) return;
    const peer: Peer = { node: h.node, epoch: h.epoch, count: undefined };
    this.#peers[slot] = peer;
    this.#track(this.#readCount(slot, peer));
  }

  /**
   * Reads the count `peer` records beside `slot`: it took its count key
   * before the slot, so the key is there once the slot shows it. One read
   * of the key our own count would have; a listing of the slot's keys only
   * when that is not the peer's (to name its count, or find none).
   */
  async #readCount(slot: number, peer: Peer): Promise<void> {
    const current = () =>
      !this.#stop.signal.aborted && this.#peers[slot] === peer;
    while (current()) {
      try {
        const mine = await this.#leases.holder(
          countKey(this.#group, slot, this.#count),
        );
        let count: number | null = null;
        if (mine?.node === peer.node) count = this.#count;
        else if (typeof this.#leases.holders === "function") {
          const base = `${memberKey(this.#group, slot)}.n`;
          const keys = await this.#leases.holders(memberKey(this.#group, slot));
          for (const [key, h] of keys) {
            const n = Number(key.slice(base.length));
            if (
              h.node === peer.node && key.startsWith(base) &&
              Number.isInteger(n) && n >= 1
            ) count = n;
          }
        }
        if (!current()) return;
        peer.count = count;
        this.#reconcile();
        return;
      } catch (err) {
        if (!current()) return;
        // A manager that cannot list keys: the count stays unknown.
        if (err instanceof TypeError) {
          peer.count = null;
          this.#reconcile();
          return;
        }
        if (!(err instanceof UnavailableError)) return this.#fail(err);
        await new Promise<void>((resolve) => {
          const done = () => {
            clearTimeout(t);
            this.#stop.signal.removeEventListener("abort", done);
            resolve();
          };
          const t = setTimeout(done, this.#leases.ttl / 3);
          this.#stop.signal.addEventListener("abort", done, { once: true });
        });
      }
    }
  }

  /** Our slot shows another holder or none: take a slot again. */
  #lostSlot(): void {
    const c = this.#slotHold;
    const k = this.#countHold;
    this.#slot = undefined;
    this.#seenInSlot = false;
    this.#slotHold = undefined;
    this.#countHold = undefined;
    c?.stop.abort();
    // The count key goes after the slot, so that whoever still sees us in
    // the slot finds our count.
    this.#slotStopping = (async () => {
      await c?.done;
      k?.stop.abort();
      await k?.done;
    })();
    this.#reconcile();
  }

  /** Takes a free slot, trying those the watches show free in order. */
  async #join(): Promise<void> {
    if (this.#joining || this.#slot !== undefined) return;
    this.#joining = true;
    try {
      // A slot given up is released before any slot is taken again.
      await this.#slotStopping;
      let blocked = false;
      for (let s = 0; s < this.#slots; s++) {
        if (this.#stop.signal.aborted) return;
        const h = this.#holders[s];
        if (h !== null && h?.node !== this.#leases.node) continue;
        const key = memberKey(this.#group, s);
        // The count first: whoever sees us in the slot finds it recorded.
        // A count key held by another node (one trying this slot with our
        // count, or one that left and releases it after its slot) sends us
        // to the next slot.
        const ck = countKey(this.#group, s, this.#count);
        if (!(await this.#leases.held(ck))) {
          blocked = true;
          continue;
        }
        let got = false;
        try {
          got = !this.#stop.signal.aborted && await this.#leases.held(key);
        } finally {
          if (!got) await this.#leases.release(ck).catch(() => {});
        }
        if (!got) continue;
        if (this.#stop.signal.aborted) {
          await this.#leases.release(key);
          await this.#leases.release(ck);
          return;
        }
        this.#slot = s;
        this.#seenInSlot = this.#holders[s]?.node === this.#leases.node;
        if (this.#seenInSlot) this.#settled = true;
        // The holds keep the slot and count renewed (and out of
        // `idleRelease`) and release them when stopped.
        this.#slotHold = this.#hold(key, () => {}, undefined, false);
        this.#countHold = this.#hold(ck, () => {}, undefined, false);
        this.#blocked = 0;
        this.#reconcile();
        return;
      }
      // Every slot taken: a standby. A slot's watch reports when one frees,
      // but not when a count key that kept us from a free slot goes: its
      // holder releases it milliseconds after its slot, or it expires with
      // the slot, so try again soon, backing off from 50 ms to TTL/3.
      this.#settled = true;
      if (blocked) {
        clearTimeout(this.#retry);
        this.#retry = setTimeout(
          () => this.#reconcile(),
          Math.min(this.#leases.ttl / 3, 50 * 2 ** this.#blocked++),
        );
      }
    } catch (err) {
      if (this.#stop.signal.aborted) return;
      if (!(err instanceof UnavailableError)) return this.#fail(err);
      // The server did not answer: try again a third of a TTL later (a
      // slot's watch may have no news to wake us with).
      clearTimeout(this.#retry);
      this.#retry = setTimeout(() => this.#reconcile(), this.#leases.ttl / 3);
    } finally {
      this.#joining = false;
      this.#changed();
    }
  }

  /**
   * Holds `key` until stopped: a guard that waits for the key (`wait:
   * true`), whose write lasts the whole tenure. `onLease` gets each
   * tenure's lease; its signal follows the guard's, so stopping aborts it
   * at once, then the write ends and the key is released. A tenure lost
   * (the lease not renewed in time, taken over) ends the write too, and the
   * guard waits for the key again.
   *
   * Not a campaign: a campaign keeps a watch of its key (a consumer on the
   * server) for as long as it runs, and opening hundreds of them at once
   * queues the server's other requests, the acquisitions' among them, behind
   * their creation. A waiting guard opens a watch only while another node
   * holds the key, and closes it once it got the key. A running write also
   * keeps the key out of `idleRelease`.
   */
  #hold(
    key: string,
    onLease: (lease: Lease) => void,
    after?: Promise<void>,
    withMember = true,
  ): Hold {
    const stop = new AbortController();
    // The slot outlives the member's stop: leaving releases the shards
    // first, then the slot (see `leave`).
    const signal = withMember
      ? AbortSignal.any([stop.signal, this.#stop.signal])
      : stop.signal;
    const done = (async () => {
      // A hold of the same key being stopped releases it first: its
      // release must not end this hold's tenure.
      if (after) await after;
      try {
        while (!signal.aborted) {
          await this.#leases.guard(
            key,
            (lease) =>
              new Promise<void>((resolve) => {
                onLease(lease);
                if (lease.signal.aborted) return resolve();
                lease.signal.addEventListener("abort", () => resolve(), {
                  once: true,
                });
              }),
            { wait: true, signal },
          );
        }
      } catch (err) {
        if (signal.aborted) return;
        // A closed manager: the member ends, as the slots' watches do.
        if (err instanceof TypeError) this.#end();
        else this.#fail(err);
      } finally {
        // Released only once the tenure's write ended (its signal aborted),
        // so no write of ours runs when a successor can see the key free;
        // and, a key still in its grace, once that is over.
        await this.#graceOver(key);
        await this.#leases.release(key).catch(() => {});
      }
    })();
    this.#track(done);
    return { stop, done };
  }

  /** Holds the shards targeted at us and releases the others. */
  #reconcile(): void {
    if (this.#ended) return;
    if (this.#heard < this.#slots) return;
    // Counts (see "Count agreement"): a node whose count is being read
    // holds every decision back (a few milliseconds), since it may be the
    // longest-standing member and make us fail; until then the shards we
    // hold stay held. One whose count differs is no member to us.
    const members = new Set<string>();
    let oldest:
      | { epoch: number; count: number; slot: number; node: string }
      | undefined;
    this.#pending = false;
    for (let s = 0; s < this.#slots; s++) {
      const h = this.#holders[s];
      if (!h) continue;
      let count: number | null | undefined = this.#count;
      if (h.node === this.#leases.node) {
        members.add(h.node);
        // Our own slot counts for its age once it shows us.
        if (s !== this.#slot || !this.#seenInSlot) count = null;
      } else {
        count = this.#peers[s]?.count;
        if (count === undefined) this.#pending = true;
        else if (count === null || count === this.#count) members.add(h.node);
      }
      if (typeof count === "number" && (!oldest || h.epoch < oldest.epoch)) {
        oldest = { epoch: h.epoch, count, slot: s, node: h.node };
      }
    }
    if (this.#pending) return;
    if (oldest && oldest.count !== this.#count) {
      return this.#fail(
        new ShardCountMismatchError(
          this.#group,
          this.#count,
          oldest.count,
          countKey(this.#group, oldest.slot, oldest.count),
          oldest.node,
        ),
      );
    }
    const sorted = [...members].sort();
    const id = sorted.join("\u0000");
    if (id !== this.#members.join("\u0000")) {
      this.#members = sorted;
      this.#changed();
    }
    if (this.#slot === undefined) void this.#join();
    const mine = this.#slot !== undefined && this.#seenInSlot &&
      members.has(this.#leases.node);
    const targetOf = mine ? id : "";
    if (targetOf !== this.#targetOf) {
      this.#targetOf = targetOf;
      this.#target = new Set(
        mine ? assignShards(this.#count, sorted).get(this.#leases.node) : [],
      );
    }
    for (const [shard, c] of this.#holds) {
      if (this.#target.has(shard)) continue;
      this.#holds.delete(shard);
      c.stop.abort();
      const done = c.done.finally(() => {
        if (this.#stopping.get(shard) === done) this.#stopping.delete(shard);
      });
      this.#stopping.set(shard, done);
    }
    for (const shard of this.#target) {
      if (!this.#holds.has(shard)) this.#startShard(shard);
    }
    this.#changed();
  }

  #startShard(shard: number): void {
    const key = shardKey(this.#group, shard);
    const c = this.#hold(key, (held) => {
      if (this.#holds.get(shard) !== c || held.signal.aborted) return;
      const lease = new OwnedShard(held, this.#leases, this.#group, shard);
      this.#owned.set(shard, lease);
      lease.signal.addEventListener("abort", () => {
        if (this.#owned.get(shard) === lease) this.#owned.delete(shard);
        this.#changed();
      }, { once: true });
      this.#changed();
    }, this.#stopping.get(shard));
    this.#holds.set(shard, c);
  }

  /** The next assignment to yield, or `null` once the iteration ended. */
  async next(): Promise<ShardAssignment | null> {
    for (;;) {
      if (this.#failure) throw this.#failure.error;
      if (this.#ended) return null;
      if (
        this.#dirty && this.#settled && !this.#joining && !this.#pending
      ) {
        this.#dirty = false;
        const a = this.#assignment();
        if (a) return a;
      }
      await new Promise<void>((r) => this.#wake = r);
    }
  }

  #assignment(): ShardAssignment | null {
    const owned = new Map(
      [...this.#owned].filter(([, l]) => !l.signal.aborted).sort((a, b) =>
        a[0] - b[0]
      ),
    );
    const last = this.#last;
    if (
      last && last.members === this.#members &&
      last.owned.size === owned.size &&
      [...owned].every(([s, l]) => last.owned.get(s) === l)
    ) return null;
    const before = last?.owned ?? new Map<number, OwnedShard>();
    const added = [...owned].filter(([s, l]) => before.get(s) !== l).map((
      [s],
    ) => s);
    const removed = [...before].filter(([s, l]) => owned.get(s) !== l).map((
      [s],
    ) => s).sort((a, b) => a - b);
    this.#last = { owned, members: this.#members };
    return { owned, added, removed, members: this.#members };
  }

  /**
   * Leaves the group: stops every watch and shard hold (each shard's
   * lease signal aborts at once) and releases the shards, then the slot,
   * then its count key, and resolves when nothing of this iteration runs
   * any more. Shards go
   * first so that the others, who take them when they see the slot free,
   * find them free already: one compare-and-set each, instead of waiting
   * on a watch they would first have to open. A key in its failover grace
   * is released when that is over (see "Handing on in the grace"), still
   * in this order: a shard's grace holds the slot back.
   */
  leave(): Promise<void> {
    if (this.#leaving) return this.#leaving;
    let done!: () => void;
    this.#leaving = new Promise<void>((r) => done = r);
    void (async () => {
      this.#end();
      this.#signal?.removeEventListener("abort", this.#onAbort);
      const slot = this.#slotHold;
      const count = this.#countHold;
      for (;;) {
        const shardTasks = [...this.#tasks].filter((t) =>
          t !== slot?.done && t !== count?.done
        );
        if (shardTasks.length === 0) break;
        await Promise.all(shardTasks);
      }
      slot?.stop.abort();
      await slot?.done;
      count?.stop.abort();
      while (this.#tasks.size > 0) await Promise.all([...this.#tasks]);
      if (this.#slot !== undefined) {
        const key = memberKey(this.#group, this.#slot);
        const ck = countKey(this.#group, this.#slot, this.#count);
        await this.#graceOver(key);
        await this.#leases.release(key).catch(() => {});
        await this.#graceOver(ck);
        await this.#leases.release(ck).catch(() => {});
      }
      if (typeof this.#leases.removeEventListener === "function") {
        this.#leases.removeEventListener("acquired", this.#onAcquired);
        this.#leases.removeEventListener("lost", this.#onEnded);
        this.#leases.removeEventListener("released", this.#onEnded);
      }
      if (this.#registered) groupsInUse.get(this.#leases)?.delete(this.#group);
    })().finally(done);
    return this.#leaving;
  }
}
