// A member of a shard group run as a child process by shards_test.ts and
// bench/shards.ts, so that they can SIGKILL a real member. It prints one
// JSON line per event on stdout:
//   {"ev":"ready"}                                    connected, manager open
//   {"ev":"assign","t":..,"owned":{"3":17,..},"added":[..],"removed":[..],"members":[..]}
//   {"ev":"w","w":[[shard,epoch,start,end],..]}       writes since the last line
//   {"ev":"leaving"}                                  SIGTERM received: leaving now
//   {"ev":"closed","released":[..],"unreleased":[..]} after SIGTERM: left and closed
//   {"ev":"acq","key":..,"found":..,"grace":..}       the manager's "acquired" event
//   {"ev":"rel","key":..,"clean":..}                  the manager's "released" event
// Times are wall-clock milliseconds with a fraction (performance.timeOrigin
// + performance.now()), shared by the processes of one machine.
//
// Environment: NATS_URL (comma-separated), LEASE_BUCKET, LEASE_TTL,
// SHARDS_GROUP, SHARDS_COUNT, LEASE_NODE, SHARDS_WRITE_MS (each owned shard
// is written every this many ms through its lease's guard, with check:
// "lease"; 0: no writes).
//
// On SIGTERM the member leaves (the signal aborts), closes the manager and
// the connection, prints "closed" and must then exit by itself: a timer or
// a consumer left behind would keep it alive.
import process from "node:process";
import { shards } from "../mod.ts";
import type { ShardLease } from "../shards.ts";
import { env, openLeases, reporter } from "./child_preamble.ts";

const now = () => performance.timeOrigin + performance.now();
const say = reporter(now);

const { nc, leases } = await openLeases({
  connect: { ignoreClusterUpdates: true },
});
// The manager's own account of each takeover and release, so the bench can
// tell which path a late takeover took (lease.ts, point 3).
leases.addEventListener(
  "acquired",
  (e) => say("acq", { key: e.key, found: e.found, grace: e.grace }),
);
leases.addEventListener(
  "released",
  (e) => say("rel", { key: e.key, clean: e.clean }),
);
const stop = new AbortController();
process.on("SIGTERM", () => {
  say("leaving");
  stop.abort();
});
say("ready");

const writeMs = Number(env.SHARDS_WRITE_MS ?? 0);
const writes: number[][] = [];
const writers = new Map<number, Promise<void>>();
const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((r) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      r();
    }
    signal.addEventListener("abort", done, { once: true });
  });

/** Writes shard `s` every writeMs until its lease's signal aborts. */
async function writer(s: number, lease: ShardLease): Promise<void> {
  while (!lease.signal.aborted) {
    try {
      await lease.guard((l) => {
        const a = now();
        l.throwIfLost();
        writes.push([s, l.epoch, a, now()]);
      }, { check: "lease" });
    } catch {
      // Refused (moved away, unavailable): the loop condition decides.
    }
    await sleep(writeMs, lease.signal);
  }
}

const flush = writeMs > 0
  ? setInterval(() => {
    if (writes.length) say("w", { w: writes.splice(0) });
  }, 100)
  : undefined;

for await (
  const a of shards(leases, env.SHARDS_GROUP!, {
    count: Number(env.SHARDS_COUNT),
    signal: stop.signal,
  })
) {
  say("assign", {
    owned: Object.fromEntries([...a.owned].map(([s, l]) => [s, l.epoch])),
    added: a.added,
    removed: a.removed,
    members: a.members,
  });
  if (writeMs > 0) {
    for (const s of a.added) {
      const w = writer(s, a.owned.get(s)!);
      writers.set(s, w);
    }
  }
}
await Promise.all(writers.values());
clearInterval(flush);
if (writes.length) say("w", { w: writes.splice(0) });
const r = await leases.close();
await nc.close();
say("closed", { released: r.released, unreleased: r.unreleased });
