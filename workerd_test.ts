// test.sh: node only: the lease manager under test runs in workerd (through miniflare), not in the test's runtime
// Leases in the Cloudflare Workers runtime (issue 17, part 2). The worker of
// examples/workerd/worker.ts, bundled by esbuild, runs in workerd through
// miniflare and connects to a real nats-server over WebSocket with
// `wsconnect`; this process is a Node holder of the same keys over TCP.
//
// - Stateless requests: each opens its own connection and manager and does
//   one guarded write with `wait: true`; concurrent requests and the Node
//   holder append `start`/`end` to a JetStream journal, whose order shows
//   that no two writes overlapped and that epochs never went down.
// - A Durable Object campaigns for a key and keeps it for 3.5 TTLs with no
//   request in flight: its timers fire, its WebSocket stays open, the
//   manager's own renewals keep the lease.
// - What workerd does to a stateless request's timers and connection once
//   it has answered, asserted as observed (test_util/workerd_probe.ts).
// - Why plain workerd cannot reach 127.0.0.1 while miniflare can: its
//   default network allows public addresses only.
// - On a fenced bucket (nats-server 2.11.2+): stateless requests and Node
//   holders put "<node>:<epoch>" to one data key under one lease, and the
//   revisions the server stored them at show the epochs never going down;
//   a Node holder cut off (its frames held in a proxy) loses the key to a
//   waiting request once its session expires, and its put, delivered after
//   the takeover, is refused by the server; after each request answered,
//   its session's entry is deleted and never renewed again, its probe
//   subject has no responder and its connection is closed.
// - With the leases in a stream of the user's (`stream`, `leaseSubjects`,
//   nats-server 2.11.2+; test_util/workerd_stream.ts): stateless requests
//   and Node holders append "<node>:<epoch>" to one subject with
//   lease.publish, and the sequences show the epochs never going down; a
//   Node holder cut off the same way loses the key to a waiting request,
//   and its append, delivered after the takeover, is refused by the server.
// The limits are written down in docs/runtimes.md.
//
// Runs under `node --test` only (Node 24, which runs this TypeScript as is).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { Miniflare } from "miniflare";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import {
  createLeaseManager,
  type Holder,
  type Lease,
  type LeaseManager,
  NotHolderError,
} from "./mod.ts";
import { markersVersion } from "./lease/servers.ts";
import { conn, sleep, versionOf } from "./test_util/lease_helpers.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";
import { type Frame, NatsProxy } from "./test_util/proxy.ts";
import type { StreamRecord } from "./test_util/workerd_stream.ts";
import { COMPATIBILITY_DATE, startWorker } from "./examples/workerd/serve.ts";
import {
  type FencedRecord,
  journaledWrite,
  type WriteRecord,
} from "./examples/workerd/worker.ts";

/**
 * Short, to keep the file near 20 s, yet long enough that a renewal delayed
 * by a loaded CI machine (event-loop stalls of a second were seen there)
 * does not end a lease the test expects kept.
 */
const TTL = 2000;
const BUCKET = "workerd";
/** The fenced bucket of the worker's `POST /fenced/KEY` (same TTL). */
const FENCED_BUCKET = "workerd-fenced";
/** Why the fenced-bucket test is skipped: a server before 2.11.2. */
const NO_FENCED = markersVersion(versionOf(natsServerBinary()))
  ? false
  : "fenced buckets need nats-server 2.11.2 or later";
/** Why the stream-layout test is skipped: a server before 2.11.2. */
const NO_STREAM = NO_FENCED &&
  "leases in a stream need nats-server 2.11.2 or later";
/** Every wait below is bounded by this. */
const WAIT = 10_000;
/** The workerd binary miniflare runs (npm package `workerd`). */
const WORKERD = decodeURIComponent(
  new URL("./node_modules/.bin/workerd", import.meta.url).pathname,
);

let ns: NatsServer;
let mf: Miniflare;
let nc: NatsConnection;
let node: LeaseManager;

before(async () => {
  ns = await NatsServer.start({ websocket: true });
  nc = await conn(ns.url);
  // The journal, as the worker would create it on first use; made here so
  // that the Node holder can write first.
  await (await jetstreamManager(nc)).streams.add({
    name: "LEASE_JOURNAL",
    subjects: ["lease-journal.>"],
  });
  node = await createLeaseManager({
    nc,
    node: "node-holder",
    bucket: BUCKET,
    ttl: TTL,
  });
  mf = await startWorker({
    natsWsUrl: ns.wsUrl!,
    bucket: BUCKET,
    ttl: TTL,
    fencedBucket: FENCED_BUCKET,
  });
});

after(async () => {
  // Each step runs even when one before it failed, so that nothing is left
  // to keep `node --test` from exiting.
  for (
    const step of [
      () => mf?.dispose(),
      () => node?.close(),
      () => nc?.close(),
      () => ns?.[Symbol.asyncDispose](),
    ]
  ) {
    try {
      await step();
    } catch (err) {
      console.error("cleanup failed:", err);
    }
  }
});

/** A request to the worker, bounded by {@linkcode WAIT}, as parsed JSON. */
async function call<T>(
  target: Miniflare,
  path: string,
  method = "GET",
): Promise<T> {
  const res = await target.dispatchFetch(`http://worker${path}`, {
    method,
    signal: AbortSignal.timeout(WAIT),
  });
  const body = await res.text();
  assert.equal(res.status, 200, `${method} ${path}: ${body}`);
  return JSON.parse(body) as T;
}

/** One entry of the journal, as the worker and the Node holder append it. */
interface Entry {
  seq: number;
  /** The server's time of the append, in ms. */
  time: number;
  phase: "start" | "end";
  node: string;
  epoch: number;
}

/** The journal of `key` in stream order. */
async function journal(key: string): Promise<Entry[]> {
  const jsm = await jetstreamManager(nc);
  const { state } = await jsm.streams.info("LEASE_JOURNAL");
  const out: Entry[] = [];
  for (let seq = state.first_seq; seq <= state.last_seq; seq++) {
    const m = await jsm.streams.getMessage("LEASE_JOURNAL", { seq });
    if (!m || m.subject !== `lease-journal.${key}`) continue;
    const { phase, node, epoch } = m.json<Omit<Entry, "seq" | "time">>();
    out.push({ seq, time: m.time.getTime(), phase, node, epoch });
  }
  return out;
}

/** The Node holder's write: the worker's own, over this TCP connection. */
function nodeWrite(lease: Lease): Promise<WriteRecord> {
  return journaledWrite(nc, lease);
}

/**
 * The writes in a journal, checked: each `start` is followed by its own
 * `end` (same node and epoch) before anything else, so no two writes
 * overlapped; epochs never decrease, and grow when the writer changes.
 */
function checkWrites(entries: Entry[]) {
  const writes: { node: string; epoch: number; start: number; end: number }[] =
    [];
  for (let i = 0; i < entries.length; i += 2) {
    const [s, e] = [entries[i]!, entries[i + 1]];
    assert.equal(s.phase, "start", `seq ${s.seq} opens a write`);
    assert.ok(e, `the write opened at seq ${s.seq} ends`);
    assert.deepEqual(
      [e.phase, e.node, e.epoch],
      ["end", s.node, s.epoch],
      `seq ${e.seq} ends the write of ${s.node} at epoch ${s.epoch} (no overlap)`,
    );
    const prev = writes.at(-1);
    if (prev) {
      assert.ok(
        s.time >= prev.end,
        `write at seq ${s.seq} starts after the last ended`,
      );
      assert.ok(
        s.epoch > prev.epoch ||
          (s.epoch === prev.epoch && s.node === prev.node),
        `epoch ${s.epoch} of ${s.node} after ${prev.epoch} of ${prev.node}`,
      );
    }
    writes.push({ node: s.node, epoch: s.epoch, start: s.time, end: e.time });
  }
  return writes;
}

describe("workerd (miniflare " + COMPATIBILITY_DATE + ")", () => {
  test("concurrent Worker requests and a Node holder write one at a time, at growing epochs", async () => {
    const key = "journaled";
    // Uncontended first: what one request costs (connect, set-up, a
    // guarded write of 20 ms, release, close), for docs/runtimes.md.
    const alone: number[] = [];
    for (let i = 0; i < 3; i++) {
      const t0 = performance.now();
      await call<WriteRecord>(mf, `/write/${key}-alone`, "POST");
      alone.push(Math.round(performance.now() - t0));
    }
    console.log(`uncontended requests took ${alone.join(", ")} ms`);

    const requests = Array.from(
      { length: 6 },
      () => call<WriteRecord>(mf, `/write/${key}`, "POST"),
    );
    // The Node holder writes three times meanwhile, releasing after each so
    // the waiting requests get in between.
    const nodeWrites: WriteRecord[] = [];
    for (let i = 0; i < 3; i++) {
      nodeWrites.push(
        await node.guard(key, nodeWrite, {
          wait: true,
          signal: AbortSignal.timeout(WAIT),
        }),
      );
      await node.release(key);
      await sleep(30);
    }
    const workerWrites = await Promise.all(requests);

    const writes = checkWrites(await journal(key));
    assert.equal(writes.length, 9, "six worker writes and three Node writes");
    assert.equal(new Set(workerWrites.map((w) => w.node)).size, 6);
    assert.ok(workerWrites.every((w) => w.node.startsWith("worker-")));
    for (const w of [...workerWrites, ...nodeWrites]) {
      assert.equal(w.endSeq, w.startSeq + 1, `${w.node}'s write is one pair`);
    }
    console.log(
      "writes (server ms from the first start):",
      writes.map((w) =>
        `${w.node}@${w.epoch} ${w.start - writes[0]!.start}-${
          w.end - writes[0]!.start
        }`
      ).join(", "),
    );
  });

  test("a Durable Object keeps its lease for 3 TTLs with no request in flight", async () => {
    const key = "leader";
    interface Status {
      node: string;
      leading: boolean;
      epoch: number;
      tenures: number[];
      renewals: number;
      lost: string[];
      ticks: number;
      connectionClosed: boolean;
    }
    const started = await call<Status>(mf, `/holder/a/start?key=${key}`);
    assert.equal(started.leading, true, JSON.stringify(started));

    // Whoever holds the key, as the Node side sees it, while nobody calls
    // the object.
    const idle = new AbortController();
    const seen: (Holder | null)[] = [];
    const watching = (async () => {
      for await (const h of node.watch(key, { signal: idle.signal })) {
        seen.push(h);
      }
    })();
    const t0 = performance.now();
    await sleep(3 * TTL + 500);
    idle.abort();
    await watching;
    const idleMs = performance.now() - t0;

    // Still held by the object, at the same epoch: nobody else got in.
    assert.deepEqual(
      seen.map((h) => h && [h.node, h.epoch]),
      [[started.node, started.epoch]],
      "the holder never changed while the object was idle",
    );
    await assert.rejects(
      node.guard(key, () => assert.fail("the Node holder wrote")),
      (err) => err instanceof NotHolderError && err.holder === started.node,
    );
    const status = await call<Status>(mf, "/holder/a/status");
    console.log(
      `after ${Math.round(idleMs)} ms idle (TTL ${TTL}):`,
      JSON.stringify(status),
    );
    assert.equal(status.leading, true);
    assert.equal(status.epoch, started.epoch);
    assert.deepEqual(status.lost, []);
    assert.equal(status.connectionClosed, false, "the WebSocket stayed open");
    // The manager renews every TTL/3 on its own timers: about 10 in 3.5
    // TTLs; at least 6 allows for a loaded machine.
    assert.ok(status.renewals >= 6, `${status.renewals} renewals while idle`);
    // A 100 ms interval ticked while no request was in flight.
    assert.ok(
      status.ticks - started.ticks >= idleMs / 100 / 2,
      `${status.ticks - started.ticks} ticks of a 100 ms interval in ${
        Math.round(idleMs)
      } ms`,
    );

    // A write by the object under the lease it kept, journaled like the
    // others; then a Node guard waits, and the object's stop hands over.
    const write = await call<WriteRecord>(mf, "/holder/a/write");
    assert.deepEqual([write.node, write.epoch], [started.node, started.epoch]);
    const waiting = node.guard(key, nodeWrite, {
      wait: true,
      signal: AbortSignal.timeout(WAIT),
    });
    await sleep(100);
    const stopped = await call<{ closed: { released: string[] } }>(
      mf,
      "/holder/a/stop",
    );
    assert.deepEqual(stopped.closed.released, [key]);
    const taken = await waiting;
    assert.ok(
      taken.epoch > started.epoch,
      "the Node holder's epoch is greater",
    );
    await node.release(key);
    checkWrites(await journal(key));
  });

  test("a stateless request: its timers stop when it answers, unless a WebSocket stays open; no other request can use its connection", async () => {
    // The probe does on purpose what examples/workerd/worker.ts avoids.
    const probe = await startWorker({
      natsWsUrl: ns.wsUrl!,
      bucket: BUCKET,
      ttl: TTL,
      entry: new URL("./test_util/workerd_probe.ts", import.meta.url),
      durableObjects: {},
    });
    try {
      // An interval whose request answered at once never fires.
      await call(probe, "/tick");
      await sleep(500);
      assert.deepEqual(await call(probe, "/ticks"), { ticks: 0 });
      // The same with a WebSocket left open keeps firing: the open socket
      // keeps the request's context (and its timers) alive.
      await call(probe, "/tick-ws");
      await sleep(500);
      const { ticks } = await call<{ ticks: number }>(probe, "/ticks");
      assert.ok(ticks >= 3, `${ticks} ticks of a 50 ms interval in 500 ms`);

      // A request that leaves its connection and manager open keeps
      // running after it answered: its manager renews from its timers, and
      // the lease stays held for 2 TTLs with no request in flight.
      const kv = await new Kvm(nc).open(BUCKET);
      const { epoch } = await call<{ epoch: number }>(probe, "/open");
      await sleep(2 * TTL);
      const entry = await kv.get("leaked");
      assert.equal(entry?.string(), "leaked", "the probe still holds the key");
      assert.ok(
        entry!.revision > epoch,
        `renewed after answering (revision ${entry!.revision} > ${epoch})`,
      );
      assert.equal((await node.holder("leaked"))?.epoch, epoch);

      // But another request cannot use that connection or manager: a
      // synchronous call throws, and I/O on the WebSocket never settles.
      const reuse = await call<Record<string, unknown>>(probe, "/reuse");
      console.log("another request using the first one's manager:", reuse);
      assert.ok((reuse.renewals as number) >= 3, `${reuse.renewals} renewals`);
      assert.equal(reuse.closed, false);
      assert.match(
        reuse.health as string,
        /^Error: Cannot perform I\/O on behalf of a different request\. .*\(I\/O type: RefcountedCanceler\)$/,
      );
      assert.equal(reuse.guard, "pending", "a guard from another request");
      assert.equal(reuse.flush, "pending", "a flush from another request");
    } finally {
      await probe.dispose();
    }
  });

  test("plain workerd refuses a WebSocket to 127.0.0.1 until its internet service allows private addresses (miniflare's does)", () => {
    // `workerd test` runs the module's `test` handler once and exits: no
    // port, no miniflare. The worker opens a bare WebSocket to the server.
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "workerd-net-"));
    try {
      fs.writeFileSync(
        path.join(dir, "probe.js"),
        `export default {
  async test(ctrl, env) {
    const ws = new WebSocket(env.URL);
    const r = await new Promise((resolve) => {
      ws.addEventListener("open", () => resolve("open"));
      ws.addEventListener("error", (e) => resolve("error: " + e.message));
    });
    if (r === "open") ws.close();
    console.log("RESULT " + r);
  },
};
`,
      );
      const run = (internet: string) => {
        const file = path.join(dir, "config.capnp");
        fs.writeFileSync(
          file,
          `using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [ (name = "main", worker = .w) ${internet} ],
);
const w :Workerd.Worker = (
  modules = [ (name = "probe.js", esModule = embed "probe.js") ],
  compatibilityDate = "${COMPATIBILITY_DATE}",
  bindings = [ (name = "URL", text = "${ns.wsUrl}") ],
);
`,
        );
        // workerd logs to stderr, the worker's console.log included.
        const out = spawnSync(WORKERD, ["test", file], {
          encoding: "utf8",
          timeout: WAIT,
        });
        return `${out.stdout}${out.stderr}`;
      };
      // No "internet" service: workerd's default allows public addresses
      // only, and the connect to 127.0.0.1 is refused.
      const refused = run("");
      assert.match(refused, /connect\(\) blocked by restrictPeers\(\)/);
      assert.match(
        refused,
        /RESULT error: Uncaught Error: internal error; reference = \w+/,
      );
      // An internet service that allows private addresses, as miniflare
      // declares (allow = ["public", "private", "240.0.0.0/4"]): it opens.
      const allowed = run(
        `, (name = "internet", network = (allow = ["public", "private"]))`,
      );
      assert.match(allowed, /RESULT open/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("workerd, a fenced bucket", () => {
  /**
   * The stream's session subjects (`_lease.s.<id>`), each with its last
   * message's sequence, operation and value (the node, while it lives).
   */
  async function sessions(): Promise<
    Map<string, { seq: number; op: string; node: string }>
  > {
    const jsm = await jetstreamManager(nc);
    const stream = `KV_${FENCED_BUCKET}`;
    const si = await jsm.streams.info(stream, {
      subjects_filter: `$KV.${FENCED_BUCKET}._lease.s.>`,
    });
    const out = new Map<string, { seq: number; op: string; node: string }>();
    for (const subject of Object.keys(si.state.subjects ?? {})) {
      const m = await jsm.streams.getMessage(stream, {
        last_by_subj: subject,
      });
      if (!m) continue;
      out.set(subject, {
        seq: m.seq,
        op: m.header?.get("KV-Operation") || "PUT",
        node: m.string(),
      });
    }
    return out;
  }

  /** What a request to a session's probe subject gets. */
  async function probe(subject: string): Promise<string> {
    const id = subject.slice(subject.lastIndexOf(".") + 1);
    try {
      await nc.request(`$LEASE.${FENCED_BUCKET}.probe.${id}`, undefined, {
        timeout: 500,
      });
      return "answered";
    } catch (err) {
      return /no responders/i.test(String(err)) ? "no responders" : String(err);
    }
  }

  /** The names of the server's open connections. */
  async function openConnections(): Promise<string[]> {
    const res = await fetch(`${ns.httpUrl}/connz?limit=1024`, {
      signal: AbortSignal.timeout(WAIT),
    });
    const body = await res.json() as { connections?: { name?: string }[] };
    return (body.connections ?? []).map((c) => c.name ?? "");
  }

  test(
    "stateless requests and Node holders put under one lease: epochs never go down, a cut-off holder's late put is refused by the server, and nothing a request opened outlives it",
    {
      skip: NO_FENCED,
    },
    async () => {
      const key = "fenced";
      const dataKey = "fenced.value";
      const fencedPath = (puts: number) =>
        `/fenced/${key}?data=${dataKey}&puts=${puts}`;
      // This Node holder creates the bucket (TTL 2 s); a second one is cut
      // off later, through a proxy that holds its frames.
      const holder = await createLeaseManager({
        nc,
        node: "node-fenced",
        bucket: FENCED_BUCKET,
        ttl: TTL,
        fenced: true,
      });
      await using proxy = await NatsProxy.start(ns.port);
      const pnc = await conn(proxy.url);
      const cutOff = await createLeaseManager({
        nc: pnc,
        node: "node-cut-off",
        bucket: FENCED_BUCKET,
        ttl: TTL,
        fenced: true,
      });
      try {
        const kv = await new Kvm(nc).open(FENCED_BUCKET);
        const before = await sessions();

        // 1. Four requests (three puts each) and the Node holder (three
        // tenures, two puts each, released after each) contend for the key.
        const requests = Array.from(
          { length: 4 },
          () => call<FencedRecord>(mf, fencedPath(3), "POST"),
        );
        type Put = {
          node: string;
          epoch: number;
          value: string;
          revision: number;
        };
        const nodePuts: Put[] = [];
        for (let i = 0; i < 3; i++) {
          await holder.guard(key, async (lease) => {
            for (let j = 0; j < 2; j++) {
              const value = `${lease.node}:${lease.epoch}`;
              const revision = await lease.put(dataKey, value);
              nodePuts.push({
                node: lease.node,
                epoch: lease.epoch,
                value,
                revision,
              });
            }
          }, { wait: true, signal: AbortSignal.timeout(WAIT) });
          await holder.release(key);
          await sleep(30);
        }
        const records = await Promise.all(requests);
        const puts = [
          ...records.flatMap((r) =>
            r.puts.map((p) => ({ node: r.node, epoch: r.epoch, ...p }))
          ),
          ...nodePuts,
        ].sort((a, b) => a.revision - b.revision);
        assert.equal(puts.length, 18, "twelve worker puts and six Node puts");
        for (const p of puts) assert.equal(p.value, `${p.node}:${p.epoch}`);
        for (let i = 1; i < puts.length; i++) {
          const [a, b] = [puts[i - 1]!, puts[i]!];
          assert.ok(b.revision > a.revision, `revision ${b.revision} once`);
          assert.ok(
            b.epoch > a.epoch || (b.epoch === a.epoch && b.node === a.node),
            `${b.value} stored at ${b.revision}, after ${a.value} at ${a.revision}`,
          );
        }
        for (const r of records) {
          assert.ok(
            r.found === "fresh" || r.found === "released",
            `${r.node} found the key ${r.found}`,
          );
        }
        assert.equal((await kv.get(dataKey))?.string(), puts.at(-1)!.value);
        console.log(
          "fenced puts by revision:",
          puts.map((p) => `${p.revision}=${p.value}`).join(", "),
        );

        // Every request's session ended with its close(): its entry deleted,
        // its probe unanswered, its connection closed.
        const mid = await sessions();
        const ended = [...mid].filter(([s]) => !before.has(s));
        assert.equal(ended.length, 4, "one session per request");
        for (const [subject, last] of ended) {
          assert.equal(last.op, "DEL", `${subject} deleted by its close()`);
          assert.equal(await probe(subject), "no responders", subject);
        }
        // The checks see a live session: the Node holder's answers.
        const live = [...mid].find(([, l]) => l.node === "node-fenced");
        assert.ok(live, "the Node holder's session");
        assert.equal(await probe(live[0]), "answered");
        const workers = async () =>
          (await openConnections()).filter((n) => n.startsWith("worker-"));
        assert.deepEqual(await workers(), [], "no worker connection is open");

        // 2. The cut-off holder takes the key and puts; then its frames to
        // the server are held: its renewals, its responder's answers and a
        // put sent under the tenure it still believes current. A request
        // waits for the key and takes it once that session expired.
        const taken = await cutOff.guard(key, async (lease) => {
          await lease.put(dataKey, `${lease.node}:${lease.epoch}`);
          return lease;
        }, { wait: true, signal: AbortSignal.timeout(WAIT) });
        const dataSubject = `$KV.${FENCED_BUCKET}.${dataKey}`;
        let replyTo: string | undefined;
        const answer = Promise.withResolvers<string>();
        proxy.onFrame = (f: Frame, dir) => {
          if (dir === "up" && f.subject === dataSubject) {
            replyTo = f.line.split(" ")[2];
          } else if (dir === "down" && replyTo && f.subject === replyTo) {
            answer.resolve(new TextDecoder().decode(f.bytes));
          }
        };
        proxy.hold("up");
        const heldAt = performance.now();
        const late = taken.put(dataKey, `${taken.node}:${taken.epoch}:late`)
          .then(() => "stored", (err: Error) => `${err.name}: ${err.message}`);
        const requested = call<FencedRecord>(mf, fencedPath(1), "POST");
        // While it waits, its connection is seen (by its name).
        await sleep(300);
        assert.equal((await workers()).length, 1, "the waiting request's");
        const request = await requested;
        const waited = performance.now() - heldAt;
        console.log(
          `the request took the cut-off holder's key ${
            Math.round(waited)
          } ms after its frames were held (TTL ${TTL} ms), found ${request.found}`,
        );
        assert.equal(request.found, "session-ended");
        assert.ok(request.epoch > taken.epoch);
        assert.ok(waited >= TTL / 2, `taken ${waited} ms after the hold`);
        assert.ok(replyTo, "the late put was sent to the proxy");
        proxy.release("up");
        const refusal = (await answer.promise).trim();
        assert.match(refusal, /wrong last sequence/, refusal);
        console.log(
          `the late put: the server answered ${
            refusal.slice(refusal.indexOf("{"))
          }; the holder saw ${await late}`,
        );
        assert.notEqual(await late, "stored");
        const last = await kv.get(dataKey);
        assert.equal(last?.string(), request.puts[0]!.value);
        assert.equal(last?.revision, request.puts[0]!.revision);

        // More than a TTL later: no ended session was renewed or came back.
        const end = await sessions();
        for (const [subject, last] of ended) {
          assert.deepEqual(end.get(subject), last, `${subject} untouched`);
        }
        // (The cut-off holder opens a new session once its own ended.)
        const mine = [...end].filter(([s, l]) =>
          !mid.has(s) && !(l.op === "PUT" && l.node === "node-cut-off")
        );
        assert.equal(mine.length, 1, "the last request's session");
        assert.equal(mine[0]![1].op, "DEL");
        assert.equal(await probe(mine[0]![0]), "no responders");
        assert.deepEqual(await workers(), [], "no worker connection is open");
      } finally {
        proxy.onFrame = undefined;
        proxy.release("up");
        await cutOff.close();
        await pnc.close();
        await holder.close();
      }
    },
  );
});

describe("workerd, a stream of the user's", () => {
  /** The application's stream; the leases live under `<prefix>.lease`. */
  const STREAM = "WORKERD_ORDERS";
  const PREFIX = "workerd-orders";
  const LEASES = `${PREFIX}.lease`;
  /** The worker of test_util/workerd_stream.ts, started by the first test. */
  let smf: Miniflare | undefined;

  after(async () => {
    await smf?.dispose();
  });

  /** Every message on `subject` of the stream, in order. */
  async function messagesOn(
    subject: string,
  ): Promise<{ seq: number; data: string }[]> {
    const jsm = await jetstreamManager(nc);
    const out: { seq: number; data: string }[] = [];
    for (let seq = 1;;) {
      // STREAM.MSG.GET's next_by_subj (nats.js's type leaves it out).
      const m = await jsm.streams.getMessage(
        STREAM,
        { seq, next_by_subj: subject } as unknown as { seq: number },
      );
      if (m === null) return out;
      out.push({ seq: m.seq, data: m.string() });
      seq = m.seq + 1;
    }
  }

  /**
   * The stream's session subjects (`<LEASES>.s.<id>`), each with its last
   * message's sequence, operation and value (the node, while it lives).
   */
  async function sessions(): Promise<
    Map<string, { seq: number; op: string; node: string }>
  > {
    const jsm = await jetstreamManager(nc);
    const si = await jsm.streams.info(STREAM, {
      subjects_filter: `${LEASES}.s.>`,
    });
    const out = new Map<string, { seq: number; op: string; node: string }>();
    for (const subject of Object.keys(si.state.subjects ?? {})) {
      const m = await jsm.streams.getMessage(STREAM, {
        last_by_subj: subject,
      });
      if (!m) continue;
      out.set(subject, {
        seq: m.seq,
        op: m.header?.get("KV-Operation") || "PUT",
        node: m.string(),
      });
    }
    return out;
  }

  /** The names of the server's open connections from a worker request. */
  async function workers(): Promise<string[]> {
    const res = await fetch(`${ns.httpUrl}/connz?limit=1024`, {
      signal: AbortSignal.timeout(WAIT),
    });
    const body = await res.json() as { connections?: { name?: string }[] };
    return (body.connections ?? []).map((c) => c.name ?? "")
      .filter((n) => n.startsWith("worker-"));
  }

  test(
    "stateless requests and Node holders append under one lease with lease.publish: epochs never go down, and a cut-off holder's late append is refused by the server",
    {
      skip: NO_STREAM,
    },
    async () => {
      const key = "orders";
      const subject = `${PREFIX}.created`;
      const streamPath = (appends: number) =>
        `/stream/${key}?stream=${STREAM}&lease=${LEASES}&subject=${subject}&appends=${appends}`;
      // The application's stream, made here: the library never creates or
      // changes it (lease_stream_test.ts's goodConfig).
      const jsm = await jetstreamManager(nc);
      await jsm.streams.add(
        {
          name: STREAM,
          subjects: [`${PREFIX}.>`],
          allow_msg_ttl: true,
          subject_delete_marker_ttl: 2_000_000_000,
          allow_rollup_hdrs: true,
          allow_direct: true,
        } as Parameters<typeof jsm.streams.add>[0],
      );
      smf = await startWorker({
        natsWsUrl: ns.wsUrl!,
        ttl: TTL,
        entry: new URL("./test_util/workerd_stream.ts", import.meta.url),
        durableObjects: {},
      });
      const options = {
        stream: STREAM,
        leaseSubjects: LEASES,
        ttl: TTL,
      };
      // This Node holder appends between the requests; a second one is cut
      // off later, through a proxy that holds its frames.
      const holder = await createLeaseManager({
        nc,
        node: "node-stream",
        ...options,
      });
      await using proxy = await NatsProxy.start(ns.port);
      const pnc = await conn(proxy.url);
      const cutOff = await createLeaseManager({
        nc: pnc,
        node: "node-cut-off",
        ...options,
      });
      try {
        const before = await sessions();

        // 1. Four requests (three appends each) and the Node holder (three
        // tenures, two appends each, released after each) contend.
        const requests = Array.from(
          { length: 4 },
          () => call<StreamRecord>(smf!, streamPath(3), "POST"),
        );
        type Append = {
          node: string;
          epoch: number;
          value: string;
          seq: number;
        };
        const nodeAppends: Append[] = [];
        for (let i = 0; i < 3; i++) {
          await holder.guard(key, async (lease) => {
            for (let j = 0; j < 2; j++) {
              const value = `${lease.node}:${lease.epoch}`;
              const seq = await lease.publish(subject, value);
              nodeAppends.push({
                node: lease.node,
                epoch: lease.epoch,
                value,
                seq,
              });
            }
          }, { wait: true, signal: AbortSignal.timeout(WAIT) });
          await holder.release(key);
          await sleep(30);
        }
        const records = await Promise.all(requests);
        const appends = [
          ...records.flatMap((r) =>
            r.appends.map((a) => ({ node: r.node, epoch: r.epoch, ...a }))
          ),
          ...nodeAppends,
        ].sort((a, b) => a.seq - b.seq);
        assert.equal(
          appends.length,
          18,
          "twelve worker appends and six Node appends",
        );
        for (const a of appends) assert.equal(a.value, `${a.node}:${a.epoch}`);
        for (let i = 1; i < appends.length; i++) {
          const [a, b] = [appends[i - 1]!, appends[i]!];
          assert.ok(b.seq > a.seq, `sequence ${b.seq} once`);
          assert.ok(
            b.epoch > a.epoch || (b.epoch === a.epoch && b.node === a.node),
            `${b.value} appended at ${b.seq}, after ${a.value} at ${a.seq}`,
          );
        }
        for (const r of records) {
          assert.ok(
            r.found === "fresh" || r.found === "released",
            `${r.node} found the key ${r.found}`,
          );
        }
        // The stream holds exactly these, as plain messages.
        assert.deepEqual(
          await messagesOn(subject),
          appends.map((a) => ({ seq: a.seq, data: a.value })),
        );
        console.log(
          "stream appends by sequence:",
          appends.map((a) => `${a.seq}=${a.value}`).join(", "),
        );
        // Every request's session ended with its close(), and its
        // connection is closed.
        const mid = await sessions();
        const ended = [...mid].filter(([s]) => !before.has(s));
        assert.equal(ended.length, 4, "one session per request");
        for (const [s, last] of ended) {
          assert.equal(last.op, "DEL", `${s} deleted by its close()`);
        }
        assert.deepEqual(await workers(), [], "no worker connection is open");

        // 2. The cut-off holder takes the key and appends; then its frames
        // to the server are held: its renewals, its responder's answers and
        // an append sent under the tenure it still believes current. A
        // request waits for the key and takes it once that session expired.
        const taken = await cutOff.guard(key, async (lease) => {
          await lease.publish(subject, `${lease.node}:${lease.epoch}`);
          return lease;
        }, { wait: true, signal: AbortSignal.timeout(WAIT) });
        let replyTo: string | undefined;
        const answer = Promise.withResolvers<string>();
        proxy.onFrame = (f: Frame, dir) => {
          if (dir === "up" && f.subject === subject) {
            replyTo = f.line.split(" ")[2];
          } else if (dir === "down" && replyTo && f.subject === replyTo) {
            answer.resolve(new TextDecoder().decode(f.bytes));
          }
        };
        proxy.hold("up");
        const heldAt = performance.now();
        const late = taken.publish(subject, `${taken.node}:${taken.epoch}:late`)
          .then(() => "stored", (err: Error) => `${err.name}: ${err.message}`);
        const requested = call<StreamRecord>(smf, streamPath(1), "POST");
        // While it waits, its connection is seen (by its name).
        await sleep(300);
        assert.equal((await workers()).length, 1, "the waiting request's");
        const request = await requested;
        const waited = performance.now() - heldAt;
        console.log(
          `the request took the cut-off holder's key ${
            Math.round(waited)
          } ms after its frames were held (TTL ${TTL} ms), found ${request.found}`,
        );
        assert.equal(request.found, "session-ended");
        assert.ok(request.epoch > taken.epoch);
        assert.ok(waited >= TTL / 2, `taken ${waited} ms after the hold`);
        assert.ok(replyTo, "the late append was sent to the proxy");
        proxy.release("up");
        const refusal = (await answer.promise).trim();
        assert.match(refusal, /wrong last sequence/, refusal);
        console.log(
          `the late append: the server answered ${
            refusal.slice(refusal.indexOf("{"))
          }; the holder saw ${await late}`,
        );
        assert.notEqual(await late, "stored");
        // The subject ends with the cut-off holder's append under its
        // tenure, then the request's: nothing late.
        const all = await messagesOn(subject);
        assert.deepEqual(all.slice(appends.length).map((m) => m.data), [
          `${taken.node}:${taken.epoch}`,
          request.appends[0]!.value,
        ]);
        assert.equal(all.at(-1)!.seq, request.appends[0]!.seq);
        assert.deepEqual(await workers(), [], "no worker connection is open");
      } finally {
        proxy.onFrame = undefined;
        proxy.release("up");
        await cutOff.close();
        await pnc.close();
        await holder.close();
      }
    },
  );
});
