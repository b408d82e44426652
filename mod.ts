/**
 * Single-writer leases over NATS JetStream KV, with fencing epochs.
 *
 * Each store key gets a lease in a KV bucket: the entry's value is the
 * holder's node id, its revision the fencing epoch, the bucket's TTL the
 * lease TTL. {@linkcode LeaseManager.guard} runs a write only after a
 * compare-and-set confirmed this node holds the key, and refuses it when the
 * server cannot be reached.
 *
 * @example Guard writes to a store
 * ```ts ignore
 * import { connect } from "@nats-io/transport-node";
 * import { createLeaseManager, NotHolderError } from "@nats-lease/lease";
 *
 * const nc = await connect({ servers: "127.0.0.1:4222" });
 * const controller = new AbortController();
 * const leases = await createLeaseManager({ nc, node: "node-a", signal: controller.signal });
 * try {
 *   await leases.guard("orders", ({ epoch }) => console.log("append at epoch", epoch));
 * } catch (err) {
 *   if (!(err instanceof NotHolderError)) throw err;
 *   console.log("another node writes orders:", err.holder);
 * }
 * controller.abort(); // releases the lease for the next node
 * await leases.close();
 * await nc.close();
 * ```
 *
 * @module
 */

export {
  type AcquiredFrom,
  CLOCK_RATE_BOUND,
  type CloseResult,
  type Connection,
  createLeaseManager,
  DEFAULT_TTL,
  type FencedOp,
  type GuardCheck,
  type GuardOptions,
  type HealthOptions,
  type Holder,
  type Lease,
  LeaseAcquiredEvent,
  leaseCheckMargin,
  LeaseDefunctEvent,
  type LeaseEventMap,
  type LeaseHealth,
  LeaseLostEvent,
  type LeaseManager,
  type LeaseManagerOptions,
  LeaseReleasedEvent,
  LeaseRenewedEvent,
  type LostReason,
  MIN_TTL,
  NotHolderError,
  RenewalFailedEvent,
  SETUP_TIMEOUT,
  UnavailableError,
  type WatchOptions,
} from "./lease.ts";
export {
  type HeldSlot,
  LimitMismatchError,
  MAX_SEMAPHORE_LIMIT,
  type Semaphore,
  semaphore,
  type SemaphoreAcquireOptions,
  SemaphoreFullError,
  type SemaphoreGuardOptions,
  type SemaphoreOptions,
  type SlotLease,
} from "./semaphore.ts";
export {
  assignShards,
  DEFAULT_MAX_MEMBERS,
  MAX_SHARDS,
  memberKey,
  type ShardAssignment,
  ShardCountMismatchError,
  shardKey,
  type ShardLease,
  shards,
  type ShardsOptions,
} from "./shards.ts";
