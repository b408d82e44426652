/**
 * The demo: three nodes contend for one store key, and the timeline shows
 * who writes, at which epoch, what happens when the holder crashes, and what
 * happens when it shuts down cleanly.
 *
 *     bash scripts/demo.sh                        # installs what is missing, then runs this
 *     deno run -A examples/demo.ts                # starts its own nats-server
 *     NATS_URL=nats://host:4222 deno run -A examples/demo.ts
 *
 * Each node is a separate process (demo_node.ts) with its own connection, so
 * a crash can be a real one: SIGKILL, after which nothing is released and
 * the others must wait for the lease to expire. It also runs under Node 24
 * (`node examples/demo.ts`) and Bun (`bun examples/demo.ts`).
 *
 * The demo itself watches the key (a KV watch writes nothing), so that it
 * can say what took the revisions that an epoch skips.
 *
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import process from "node:process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { type KV, Kvm, KvWatchInclude } from "@nats-io/kv";
import { createLeaseManager } from "../mod.ts";
import { NatsServer } from "../test_util/nats_server.ts";

const TTL = 1_000; // what demo_node.ts uses
const KEY = "orders";
const NODES = ["node-a", "node-b", "node-c"];
const DEADLINE = 45_000; // the demo takes about 10 s; give up well before a minute

/** One line a node printed (see demo_node.ts), with when it arrived. */
interface Event {
  at: number;
  node: string;
  event: string;
  n?: number;
  epoch?: number;
  grace?: number;
  holder?: string;
  message?: string;
}

const t0 = performance.now();
const events: Event[] = [];
const waiters = new Set<() => void>();
const children = new Map<string, ChildProcess>();
let lastWriter: string | undefined;
/** What took each revision of the key: a node id (its entry) or "DEL"/"PURGE". */
const revisions = new Map<number, string>();

function elapsed(at = performance.now()): string {
  return `${Math.round(at - t0)} ms`.padStart(9);
}

/** Prints one timeline line: elapsed time, who, what. */
function line(who: string, what: string, at?: number): void {
  console.log(`${elapsed(at)}  ${who.padEnd(7)}  ${what}`);
}

function phase(title: string): void {
  console.log(`\n── ${title}`);
}

function describe(e: Event): string {
  switch (e.event) {
    case "ready":
      return "connected, lease manager ready";
    case "waiting":
      return `waiting: '${KEY}' is held by ${e.holder}`;
    case "took":
      return e.grace! > 0
        ? `took '${KEY}' (epoch ${e.epoch}), waiting out the failover grace (${e.grace} ms left) before its first write`
        : `took '${KEY}' (epoch ${e.epoch}), no grace owed: it may write at once`;
    case "leader":
      return `elected by campaign(): holds '${KEY}' at epoch ${e.epoch}`;
    case "write":
      return `write #${e.n} under the lease, epoch ${e.epoch}`;
    case "unavailable":
      return `write refused, NATS unavailable: ${e.message}`;
    case "stopped":
      return e.node === lastWriter
        ? "close() released the lease; connection closed"
        : "close(); connection closed";
    default:
      return JSON.stringify(e);
  }
}

/** Resolves with the first event (from now on, or already seen) that matches. */
function waitFor(
  what: string,
  match: (e: Event) => boolean,
  since = 0,
): Promise<Event> {
  return new Promise((resolve, reject) => {
    const check = () => {
      const found = events.slice(since).find(match);
      if (found) {
        waiters.delete(check);
        clearTimeout(timer);
        resolve(found);
      }
    };
    const timer = setTimeout(() => {
      waiters.delete(check);
      reject(new Error(`the demo timed out waiting for ${what}`));
    }, 15_000);
    waiters.add(check);
    check();
  });
}

/** The node that has written `count` times since event index `since`. */
async function writerOf(count: number, since: number): Promise<Event> {
  return await waitFor(
    `a node to write ${count} times`,
    (e) =>
      e.event === "write" &&
      events.slice(since).filter((w) =>
          w.event === "write" && w.node === e.node
        ).length >= count,
    since,
  );
}

function startNode(node: string, servers: string, bucket: string): void {
  const script = fileURLToPath(new URL("./demo_node.ts", import.meta.url));
  // Each node runs on the runtime running this demo.
  const args = "Deno" in globalThis
    ? ["run", "--allow-net", "--allow-env", script]
    : [script];
  const child = spawn(process.execPath, args, {
    stdio: ["ignore", "pipe", "inherit"],
    env: {
      ...process.env,
      NODE_ID: node,
      NATS_URL: servers,
      DEMO_BUCKET: bucket,
      DEMO_KEY: KEY,
      NO_COLOR: "1",
    },
  });
  children.set(node, child);
  createInterface({ input: child.stdout! }).on("line", (text) => {
    let e: Event;
    try {
      e = { at: performance.now(), ...JSON.parse(text) };
    } catch {
      console.log(`${elapsed()}  ${node.padEnd(7)}  ${text}`);
      return;
    }
    events.push(e);
    if (e.event === "write") lastWriter = e.node;
    line(e.node, describe(e), e.at);
    for (const w of [...waiters]) w();
  });
}

function exited(node: string): Promise<number | string | null> {
  const child = children.get(node)!;
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve(child.exitCode ?? child.signalCode);
  }
  return new Promise((resolve) =>
    child.once("exit", (code, signal) => resolve(code ?? signal))
  );
}

async function run(servers: string, bucket: string): Promise<boolean> {
  phase(
    `Three nodes start at once and campaign for '${KEY}' (lease TTL ${TTL} ms)`,
  );
  for (const node of NODES) startNode(node, servers, bucket);
  const elected = await writerOf(1, 0);
  const ready = events.find((e) =>
    e.node === elected.node && e.event === "ready"
  )!;
  line(
    "demo",
    `fresh key: ${elected.node} wrote ${
      Math.round(elected.at - ready.at)
    } ms after it was ready (${
      elected.at - ready.at < TTL
        ? "at once: the server proves the key was never used"
        : "after the grace: this server cannot tell a never-used key from an expired one"
    })`,
  );
  const first = await writerOf(3, 0);
  const holder1 = first.node;

  phase(`${holder1} crashes (SIGKILL): it never releases the lease`);
  const crashIndex = events.length;
  const crashAt = performance.now();
  children.get(holder1)!.kill("SIGKILL");
  line(holder1, "killed");
  await exited(holder1);
  line(
    "demo",
    `the others must wait for the lease to expire (${TTL} ms after its last renewal), then the grace (${TTL} ms)`,
  );
  const second = await writerOf(1, crashIndex);
  const holder2 = second.node;
  line(
    "demo",
    `failover: ${holder2} wrote ${
      Math.round(second.at - crashAt)
    } ms after the crash, epoch ${first.epoch} → ${second.epoch}`,
  );
  await explainSkip(first, second);
  await writerOf(3, crashIndex);

  phase(`${holder2} shuts down cleanly (SIGINT → close() releases the lease)`);
  const closeIndex = events.length;
  // Timed from the signal: the successor may write before the old holder's
  // close() has also closed its connection and reported back.
  const closeAt = performance.now();
  children.get(holder2)!.kill("SIGINT");
  await waitFor(
    `${holder2} to release`,
    (e) => e.node === holder2 && e.event === "stopped",
    closeIndex,
  );
  const third = await writerOf(1, closeIndex);
  const holder3 = third.node;
  line(
    "demo",
    `handover: ${holder3} wrote ${
      Math.round(third.at - closeAt)
    } ms after it was told to stop, with no grace, epoch ${second.epoch} → ${third.epoch}`,
  );
  await explainSkip(second, third);
  await writerOf(3, closeIndex);

  phase(`${holder3} shuts down too`);
  children.get(holder3)!.kill("SIGINT");
  await waitFor(
    `${holder3} to stop`,
    (e) => e.node === holder3 && e.event === "stopped",
  );
  await Promise.all(NODES.map(exited));

  return summarize(crashAt, closeAt);
}

let explained = false;

/**
 * Says, at each epoch that skips, what took the revisions in between (as
 * the demo's own watch of the key saw them); the first time, also why an
 * epoch skips at all. After the crash they are the dead holder's
 * renewals; after the clean handover, the old holder's renewals (those of
 * its grace included) and then its release, a delete, which takes a
 * revision of its own.
 */
async function explainSkip(before: Event, after: Event): Promise<void> {
  const from = before.epoch!, to = after.epoch!;
  if (to <= from + 1) return;
  // The demo's watch hears of a revision on its own connection, usually
  // before a node's report of what came after it: give it a moment.
  for (
    let waited = 0;
    waited < 1_000 && !revisions.has(to - 1);
    waited += 10
  ) {
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  const rule = explained
    ? ""
    : "an epoch is the KV revision its tenure began at, and every write to the bucket takes the next revision: ";
  explained = true;
  // A holder renews every TTL/3 while no guarded write renews it, as
  // during its grace, and each guarded write is a compare-and-set.
  const every = `every ${Math.round(TTL / 3)} ms`;
  const graced = events.some((e) =>
    e.event === "took" && e.node === before.node && e.epoch === from &&
    e.grace! > 0
  );
  const renewals = graced
    ? `${every} while it waited out the grace, then a compare-and-set per guarded write, or ${every} without one`
    : `a compare-and-set per guarded write, or ${every} without one`;
  const runs: { first: number; last: number; what: string }[] = [];
  for (let rev = from + 1; rev < to; rev++) {
    const took = revisions.get(rev);
    const what = took === undefined
      ? "not seen by the demo's watch"
      : took === "DEL"
      ? `${before.node}'s release (the delete its close() wrote, tagged so that the next holder owes no grace)`
      : took === "PURGE"
      ? "the server's marker for an expired entry"
      : took === before.node
      ? `${took}'s renewals (${renewals})`
      : `${took}'s entry`;
    const run = runs.at(-1);
    if (run && run.what === what && run.last === rev - 1) run.last = rev;
    else runs.push({ first: rev, last: rev, what });
  }
  const spans = runs.map((r) =>
    `${r.first === r.last ? r.first : `${r.first}–${r.last}`} ${
      r.first === r.last ? "was" : "were"
    } ${r.what}`
  );
  line(
    "demo",
    `why ${from} → ${to}: ${rule}${
      spans.join(", ")
    }, so ${after.node}'s take got ${to}`,
  );
}

/**
 * Records what took each revision of the key, from its first: the bucket
 * is created (by a lease manager, as the nodes would) before the nodes
 * start, so the watch misses none.
 */
async function recordRevisions(
  nc: NatsConnection,
  bucket: string,
): Promise<void> {
  const setup = await createLeaseManager({
    nc,
    node: "demo",
    bucket,
    ttl: TTL,
  });
  await setup.close();
  const kv: KV = await new Kvm(nc).open(bucket);
  const watch = await kv.watch({
    key: KEY,
    include: KvWatchInclude.AllHistory,
  });
  void (async () => {
    for await (const e of watch) {
      revisions.set(
        e.revision,
        e.operation === "PUT" ? e.string() : e.operation,
      );
    }
  })();
}

/** Checks the timeline: one writer at a time, each new holder with a higher epoch. */
function summarize(crashAt: number, closeAt: number): boolean {
  phase("Summary");
  const writes = events.filter((e) => e.event === "write");
  const tenures: {
    node: string;
    epoch: number;
    from: number;
    to: number;
    n: number;
  }[] = [];
  for (const w of writes) {
    const last = tenures.at(-1);
    if (last && last.node === w.node && last.epoch === w.epoch) {
      last.to = w.at;
      last.n++;
    } else {
      tenures.push({
        node: w.node,
        epoch: w.epoch!,
        from: w.at,
        to: w.at,
        n: 1,
      });
    }
  }
  for (const t of tenures) {
    console.log(
      `  ${t.node}  epoch ${String(t.epoch).padStart(3)}  ${t.n} writes  ${
        elapsed(t.from).trim()
      } … ${elapsed(t.to).trim()}`,
    );
  }
  const holders = new Set(tenures.map((t) => t.node)).size;
  const increasing = tenures.every((t, i) =>
    i === 0 || t.epoch > tenures[i - 1]!.epoch
  );
  const failover = tenures[1] ? tenures[1].from - crashAt : NaN;
  const handover = tenures[2] ? tenures[2].from - closeAt : NaN;
  const ok = tenures.length === 3 && holders === 3 && increasing &&
    failover >= TTL; // at least the grace, after the expiry
  console.log(
    ok
      ? `  ✓ one writer at a time, 3 tenures, each epoch higher than the last; failover took ${
        Math.round(failover)
      } ms (expiry + grace), the clean handover ${Math.round(handover)} ms`
      : `  ✗ unexpected timeline: ${JSON.stringify(tenures)}`,
  );
  return ok;
}

async function main(): Promise<number> {
  let server: NatsServer | undefined;
  let servers = process.env.NATS_URL;
  let bucket = "demo";
  if (servers) {
    // Someone else's server: use a fresh bucket and delete it afterwards.
    bucket = `lease-demo-${Date.now().toString(36)}`;
    console.log(`Using NATS_URL=${servers}, bucket '${bucket}'`);
  } else {
    server = await NatsServer.start();
    servers = server.url;
    console.log(
      `Started nats-server ${server.version} on ${servers} (set NATS_URL to use your own)`,
    );
  }
  const nc = await connect({
    servers: servers.split(","),
    maxReconnectAttempts: -1,
  });
  const deadline = setTimeout(() => {
    console.error(`The demo did not finish within ${DEADLINE} ms`);
    for (const child of children.values()) child.kill("SIGKILL");
    process.exit(1);
  }, DEADLINE);
  try {
    await recordRevisions(nc, bucket);
    return (await run(servers, bucket)) ? 0 : 1;
  } catch (err) {
    console.error(
      `\nThe demo failed: ${err instanceof Error ? err.message : err}`,
    );
    return 1;
  } finally {
    for (const child of children.values()) {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGKILL");
      }
    }
    if (!server) {
      await new Kvm(nc).open(bucket).then((kv) => kv.destroy()).catch(() => {});
    }
    await nc.close();
    await server?.[Symbol.asyncDispose]();
    clearTimeout(deadline);
  }
}

process.exitCode = await main();
