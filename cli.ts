/**
 * The `lease` command: run a program only while this node holds a lease,
 * with its fencing epoch in the environment; show, watch or evict holders.
 *
 * ```sh
 * deno run -A cli.ts run nightly-report -- ./report.sh   # from a clone
 * bun cli.ts holder nightly-report --json
 * node cli.ts watch nightly-report
 * node cli.ts shards orders --count 32
 * ```
 *
 * Exit status of `lease run`: the command's own (128 + the signal number
 * when a signal ended it), or one of {@linkcode EXIT}.
 *
 * @module
 */

import process from "node:process";
import { type ChildProcess, spawn } from "node:child_process";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import {
  jetstream,
  JetStreamApiCodes,
  JetStreamApiError,
} from "@nats-io/jetstream";
import { type KeyRow, type KeysWatch, listKeys, watchKeys } from "./cli_ls.ts";
import {
  cgroupProcs,
  freezeCgroup,
  makeCgroup,
  removeCgroup,
  signalCgroup,
} from "./cli_cgroup.ts";
import {
  createLeaseManager,
  type GuardOptions,
  type Holder,
  type Lease,
  type LeaseAcquiredEvent,
  type LeaseManager,
  MIN_TTL,
  NotHolderError,
  UnavailableError,
} from "./lease.ts";
import {
  LimitMismatchError,
  MAX_SEMAPHORE_LIMIT,
  semaphore,
} from "./semaphore.ts";
import {
  assignShards,
  DEFAULT_MAX_MEMBERS,
  MAX_SHARDS,
  memberKey,
  shardKey,
} from "./shards.ts";

// Run as a program (not imported): Deno and Bun say so; Node 24 by argv.
const meta = import.meta as { main?: boolean };
if (
  meta.main ??
    (process.argv[1] !== undefined &&
      path.resolve(process.argv[1]) === fileURLToPath(import.meta.url))
) {
  process.exit(await main(process.argv.slice(2)));
}
