// Review 2's faults on fenced buckets (issue 33), on real servers: what
// F1-F6 of lease/manager.ts's head promise when the server loses writes it
// acknowledged, when it keeps them (`sync_interval: always`), when the
// stream's marker configuration is edited under running managers, and on
// an R3 bucket that loses a server. A server rolled back below 2.11 is
// lease_fenced_test.ts's.
//
// 1. A lost acknowledged tail (the server's store put back to a copy taken
//    before holder A took key `k`, as lease_lost_tail_test.ts does for the
//    classic layout): a fresh manager B takes `k` at the very revision A's
//    tenure had (the residue of F6), yet A sends no fenced write from the
//    drop on (point 10's suspension), so nothing of A's is stored beside
//    B's writes; only a put of A's sent before the loss and delivered after
//    it (replayed here byte for byte) lands under B's tenure.
// 2. A server with `jetstream { sync_interval: always }`, SIGKILLed and
//    restarted on its own store: A's tenure survives, A keeps `k` and
//    writes on while B waits. Killed again while A's way back is held, B
//    reaches the restarted server first and takes `k` at once (A's
//    connection is gone, F5), at a new revision; A's put replayed then is
//    refused, and none of A's acknowledged puts is lost. (A SIGKILL alone
//    lost nothing without the setting either, 0 of 17,000 writes in a
//    one-off run: what it adds, surviving an OS crash or a power failure,
//    cannot be shown without one.)
// 3. The marker TTL removed or lowered by a stream edit while A holds `k`
//    and B waits: B takes nothing while A's session lives, takes `k` only
//    once A (cut off) let its session expire, and none of A's fenced puts,
//    held in the network meanwhile, is stored after B's tenure began; a
//    manager opened after markers were removed is refused. The edits the
//    server refuses are asserted as refused; with atomic batches turned
//    off, a commit stores nothing.
// 4. An R3 bucket (replicas: 3) whose server is brought back on a copy of
//    its store from before the holder's tenure: a follower, while a holder
//    in a process of its own puts every 50 ms (the puts keep landing
//    through the quorum; SIGKILLed, the holder's key is taken far inside
//    the TTL, at a higher revision); then the stream leader (a new leader
//    has every acknowledged write, the holder keeps its key).
//
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary (fenced buckets need 2.11.2 or later: older ones
// skip every test).
// test.sh: node only: what it tests is the server under faults (a lost tail, fsync, stream edits, an R3 bucket losing a server); the runtimes meet fenced buckets in lease_fenced_test.ts, and this file passed on 2.11.2 too when it was written
import { after, describe } from "node:test";
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { before, test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { headers, type NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import {
  createLeaseManager,
  type Lease,
  type LeaseAcquiredEvent,
  type LeaseManager,
  NotHolderError,
  UnavailableError,
} from "./mod.ts";
import { signal, startChild } from "./test_util/child.ts";
import {
  conn,
  eventually,
  markersSupported,
  sleep,
  uniq,
  versionOf,
} from "./test_util/lease_helpers.ts";
import {
  NatsCluster,
  NatsServer,
  natsServerBinary,
} from "./test_util/nats_server.ts";
import {
  type Frame,
  NatsProxy,
  type ProxiedConnection,
} from "./test_util/proxy.ts";

const VERSION = versionOf(natsServerBinary());
const SKIP = markersSupported(VERSION)
  ? false
  : `fenced buckets need nats-server 2.11.2 or later: this is ${VERSION}`;
const CHILD = new URL("./test_util/fenced_child.ts", import.meta.url)
  .pathname;

/** What test_util/fenced_child.ts prints. */
interface ChildEv {
  ev: string;
  epoch?: number;
  n?: number;
  name?: string;
}

/** Prints measured figures: numbers as ms unless named otherwise. */
function report(what: string, figures: Record<string, number | string>) {
  const text = Object.entries(figures).map(([k, v]) =>
    typeof v === "number" ? `${k}=${Math.round(v)} ms` : `${k}=${v}`
  ).join(", ");
  console.log(`  [figures] ${what} (nats-server ${VERSION}): ${text}`);
}

/** A data key's last message on the stream. */
interface Stored {
  seq: number;
  value: string;
}

/**
 * Every data key of `bucket` on the stream (keys under `_lease.` left
 * out), with its last message: each test writes a data key once, so this
 * is every data write the stream kept.
 */
async function dataOnStream(
  jsm: JetStreamManager,
  bucket: string,
): Promise<Map<string, Stored>> {
  const stream = `KV_${bucket}`;
  const prefix = `$KV.${bucket}.`;
  const si = await jsm.streams.info(stream, { subjects_filter: `${prefix}>` });
  const out = new Map<string, Stored>();
  for (const subject of Object.keys(si.state.subjects ?? {}).sort()) {
    const key = subject.slice(prefix.length);
    if (key.startsWith("_lease.")) continue;
    const sm = await jsm.streams.getMessage(stream, { last_by_subj: subject });
    if (sm) out.set(key, { seq: sm.seq, value: sm.string() });
  }
  return out;
}

/** A fenced put as the client sent it: subject, headers and payload. */
interface SentPut {
  at: number;
  conn: ProxiedConnection;
  subject: string;
  header: [string, string][];
  payload: Uint8Array;
}

/** Parses an `HPUB subject [reply] hdrLen totalLen` frame. */
function parseHpub(f: Frame, conn: ProxiedConnection): SentPut | undefined {
  if (f.op !== "HPUB" || f.subject === undefined) return undefined;
  const tokens = f.line.trim().split(/\s+/);
  const hdrLen = Number(tokens.at(-2));
  const total = Number(tokens.at(-1));
  const start = f.line.length + 2;
  const text = new TextDecoder().decode(
    f.bytes.subarray(start, start + hdrLen),
  );
  const header: [string, string][] = [];
  for (const line of text.split("\r\n").slice(1)) {
    const i = line.indexOf(":");
    if (i > 0) header.push([line.slice(0, i), line.slice(i + 1).trim()]);
  }
  return {
    at: performance.now(),
    conn,
    subject: f.subject,
    header,
    payload: f.bytes.slice(start + hdrLen, start + total),
  };
}

/**
 * Sends `put` again, exactly as its client sent it, from `nc`: what a
 * client that held the message across the drop would deliver. Returns the
 * stored revision, or the server's refusal.
 */
async function replay(
  nc: NatsConnection,
  put: SentPut,
): Promise<{ seq: number } | { error: string }> {
  const h = headers();
  for (const [k, v] of put.header) h.append(k, v);
  const msg = await nc.request(put.subject, put.payload, {
    headers: h,
    timeout: 2000,
  });
  const ack = msg.json<
    { seq?: number; error?: { description?: string } }
  >();
  if (ack.error !== undefined || typeof ack.seq !== "number") {
    return { error: ack.error?.description ?? JSON.stringify(ack) };
  }
  return { seq: ack.seq };
}

/** The stream's marker TTL in ns (0: none), as the server reports it. */
async function markerTtl(
  jsm: JetStreamManager,
  bucket: string,
): Promise<number> {
  const si = await jsm.streams.info(`KV_${bucket}`);
  return (si.config as { subject_delete_marker_ttl?: number })
    .subject_delete_marker_ttl ?? 0;
}

/**
 * A holder's writer: inside one guard on `key`, a fenced put of
 * `<prefix>.<n>` sent every `every` ms, each without waiting for the one
 * before (so puts are tried all through an outage), going on through
 * refusals of any kind (the worst a caller can do) until the tenure ends
 * or `stop()`. Each put is recorded with its send time and outcome.
 */
function writer(m: LeaseManager, key: string, prefix: string, every = 20) {
  const acked = new Map<string, { at: number; rev: number }>();
  const failed: { at: number; name: string; message: string }[] = [];
  let stopped = false;
  let lease: Lease | undefined;
  let holding!: () => void;
  let never!: (err: unknown) => void;
  const held = new Promise<void>((r, j) => [holding, never] = [r, j]);
  const done = m.guard(key, async (l) => {
    lease = l;
    holding();
    const inFlight: Promise<unknown>[] = [];
    for (let n = 1; !stopped && !l.signal.aborted; n++) {
      const k = `${prefix}.${n}`;
      const at = performance.now();
      inFlight.push(
        l.put(k, `${prefix}-${n}`).then(
          (rev) => acked.set(k, { at, rev }),
          (err: Error) =>
            failed.push({ at, name: err.name, message: err.message }),
        ),
      );
      await sleep(every);
    }
    await Promise.all(inFlight);
  }, { wait: true }).catch((e) => e);
  // A guard refused before its write ran: nothing to wait for.
  void done.then((r) => lease ?? never(r));
  return {
    acked,
    failed,
    held,
    get lease(): Lease {
      return lease!;
    },
    done,
    stop() {
      stopped = true;
      return done;
    },
  };
}

describe("a fenced bucket whose server lost acknowledged writes", () => {
  let ns: NatsServer;
  let snapshots: string;

  before(async () => {
    if (SKIP) return;
    ns = await NatsServer.start();
    snapshots = fs.mkdtempSync(path.join(os.tmpdir(), "lease-ftail-"));
  });

  after(async () => {
    await ns?.[Symbol.asyncDispose]();
    if (snapshots) fs.rmSync(snapshots, { recursive: true, force: true });
  });

  test(
    "a fresh manager takes the key at the revision of the holder's lost tenure, yet the holder sends no fenced write from the drop on: the stream keeps what came before the loss and the successor's writes, and nothing of the holder's beside them",
    { timeout: 60_000, skip: SKIP },
    async () => {
      const bucket = uniq("ftail");
      const ttl = 3000;
      const op = await conn(ns.url);
      // P makes the bucket, writes under `k` and hands it on: what the
      // server keeps.
      const p = await createLeaseManager({
        nc: op,
        node: "p",
        bucket,
        fenced: true,
        ttl,
      });
      const pRev = await p.guard("k", (l) => l.put("p.1", "p"));
      await p.close();
      const dir = path.join(snapshots, uniq("snap"));
      await ns.pause();
      try {
        fs.cpSync(ns.storeDir, dir, { recursive: true });
      } finally {
        await ns.resume();
      }
      // A, through a proxy that records every fenced put it sends.
      const proxy = await NatsProxy.start(ns.port);
      const sent: SentPut[] = [];
      proxy.onFrame = (f, d, c) => {
        if (d !== "up" || !f.subject?.startsWith(`$KV.${bucket}.a.`)) return;
        const put = parseHpub(f, c);
        if (put) sent.push(put);
      };
      const ncA = await conn(proxy.url);
      let ncB: NatsConnection | undefined;
      const managers: LeaseManager[] = [];
      try {
        const a = await createLeaseManager({
          nc: ncA,
          node: "a",
          bucket,
          fenced: true,
          ttl,
          timeout: 500,
        });
        managers.push(a);
        const w = writer(a, "k", "a");
        await w.held;
        const epochA = w.lease.epoch;
        const tenureA = w.lease.tenure;
        await eventually(() => w.acked.size >= 5, 5000, "A's first puts");
        const firstConn = sent[0]!.conn;
        // The server dies with A's tenure, session and puts unsynced, and
        // comes back from the copy.
        // A's way back is held until B has written: whatever A sends from
        // the drop on reaches the server after B's tenure began.
        const killed = performance.now();
        await ns.kill();
        proxy.hold("up");
        fs.rmSync(ns.storeDir, { recursive: true, force: true });
        fs.cpSync(dir, ns.storeDir, { recursive: true });
        await ns.restart();
        const restarted = performance.now();
        ncB = await conn(ns.url);
        const b = await createLeaseManager({
          nc: ncB,
          node: "b",
          bucket,
          fenced: true,
          ttl,
        });
        managers.push(b);
        // B's connection reads the stream: it is the one sure to be up.
        const jsm = await jetstreamManager(ncB);
        const bw = await b.guard("k", async (l) => {
          const first = performance.now();
          const revs: number[] = [];
          for (let n = 1; n <= 5; n++) {
            revs.push(await l.put(`b.${n}`, `b-${n}`));
            await sleep(20);
          }
          return { first, revs, epoch: l.epoch, tenure: l.tenure };
        }, { wait: true, signal: AbortSignal.timeout(3 * ttl) });
        await sleep(200); // A tries to put meanwhile
        proxy.release("up");
        await eventually(
          () => w.lease.signal.aborted,
          3 * ttl,
          "A's tenure ended",
        );
        await w.done;
        const reason = w.lease.signal.reason as Error;
        const defunct = a.health().defunct;
        const stored = await dataOnStream(jsm, bucket);
        const afterDrop = sent.filter((s) => s.at >= killed);
        const onNewServer = sent.filter((s) => s.conn !== firstConn);
        const ackedAfterDrop = [...w.acked.values()].filter((v) =>
          v.at >= killed
        );
        report("lost tail, default sync", {
          epochs: `A ${epochA}, B ${bw.epoch}`,
          aPutsAcknowledged: String(w.acked.size),
          aPutsSentAfterKill: String(afterDrop.length),
          aPutsReachingRestartedServer: String(onNewServer.length),
          aPutsRefused: `${w.failed.length} (${
            [...new Set(w.failed.map((f) => f.name))].join(", ")
          })`,
          bFirstWriteAfterRestart: bw.first - restarted,
          aReason: `${reason?.name}: ${reason?.message?.slice(0, 80)}`,
          aDefunct: String(defunct?.slice(0, 60)),
          stream: [...stored.keys()].join(" "),
        });
        // The residue this test is built to show: the lost tail handed B
        // A's revision (A's session and tenure, lost, were the first two
        // writes after the copy, as B's are after the restart).
        assert.equal(
          bw.epoch,
          epochA,
          "B was to take k at the revision A's lost tenure had",
        );
        assert.notEqual(bw.tenure, tenureA);
        // F6 / point 10: nothing of A's reached the restarted server, and
        // no put of A's was acknowledged from the drop on.
        assert.deepEqual(
          onNewServer.map((s) => `${s.subject} ${Math.round(s.at - killed)}`),
          [],
          "A sent fenced puts to the restarted server (ms after the kill)",
        );
        assert.deepEqual(ackedAfterDrop, [], "A's puts acknowledged after it");
        // The stream: P's write from before the copy, and B's; A's
        // acknowledged puts went with the tail.
        assert.ok(w.acked.size >= 5);
        assert.deepEqual(
          [...stored].map(([k, v]) => [k, v.seq, v.value]),
          [
            ["b.1", bw.revs[0], "b-1"],
            ["b.2", bw.revs[1], "b-2"],
            ["b.3", bw.revs[2], "b-3"],
            ["b.4", bw.revs[3], "b-4"],
            ["b.5", bw.revs[4], "b-5"],
            ["p.1", pRev, "p"],
          ],
        );
        // A found out, and stopped for good: its key was B's at its own
        // revision, or gone, both proof of a lost tail.
        assert.ok(
          reason instanceof UnavailableError ||
            reason instanceof NotHolderError,
          String(reason),
        );
        assert.match(String(defunct), /lost writes it had acknowledged/);
        assert.ok(await b.held("k"), "B holds k");
        // What F6 leaves: a put of A's sent before the loss and delivered
        // after it (a client that held it across the drop) expects
        // revision E, which B's tenure entry now has: it is stored.
        const late = sent.at(-1)!;
        const got = await replay(ncB, late);
        report("lost tail, default sync: A's last put replayed", {
          put: late.subject.slice(`$KV.${bucket}.`.length),
          result: JSON.stringify(got),
        });
        assert.ok("seq" in got, `refused: ${JSON.stringify(got)}`);
        assert.ok(got.seq > bw.revs[4]!);
      } finally {
        proxy.onFrame = undefined;
        proxy.release("both");
        await Promise.allSettled(managers.map((m) => m.close()));
        await Promise.allSettled([ncA.close(), ncB?.close(), op.close()]);
        await proxy.close();
      }
    },
  );
});

describe("a fenced bucket on a server that syncs every write", () => {
  test(
    "sync_interval: always, the server SIGKILLed and restarted on its own store: the holder's tenure survives and it writes on while a fresh manager waits; killed again while the holder's way back is held, the waiter takes the key at once, at a new revision, and nothing the holder acknowledged is lost",
    { timeout: 60_000, skip: SKIP },
    async () => {
      const storeDir = fs.mkdtempSync(path.join(os.tmpdir(), "lease-fsync-"));
      const ns = await NatsServer.start({
        jetstream: false,
        storeDir,
        extraConfig: `jetstream { store_dir: ${
          JSON.stringify(storeDir)
        }, sync_interval: always }`,
      });
      const bucket = uniq("fsync");
      const ttl = 3000;
      const proxy = await NatsProxy.start(ns.port);
      const sent: SentPut[] = [];
      proxy.onFrame = (f, d, c) => {
        if (d !== "up" || !f.subject?.startsWith(`$KV.${bucket}.a.`)) return;
        const put = parseHpub(f, c);
        if (put) sent.push(put);
      };
      const ncA = await conn(proxy.url);
      let ncB: NatsConnection | undefined;
      const managers: LeaseManager[] = [];
      try {
        const varz = await (await fetch(`${ns.httpUrl}/varz`)).json() as {
          jetstream?: { config?: { sync_always?: boolean } };
        };
        assert.equal(varz.jetstream?.config?.sync_always, true, "the setting");
        const a = await createLeaseManager({
          nc: ncA,
          node: "a",
          bucket,
          fenced: true,
          ttl,
          timeout: 500,
        });
        managers.push(a);
        const w = writer(a, "k", "a");
        await w.held;
        const lease = w.lease;
        await eventually(() => w.acked.size >= 5, 5000, "A's first puts");
        const ackedSince = (t: number) =>
          [...w.acked.values()].filter((v) => v.at > t).map((v) => v.at);

        // 1. SIGKILL, and back on the same store: no restored copy.
        const killed1 = performance.now();
        await ns.kill();
        await ns.restart();
        const restarted1 = performance.now();
        await eventually(
          () => ackedSince(restarted1).length > 0,
          3 * ttl,
          "a put of A's acknowledged after the restart",
        );
        const resumed = Math.min(...ackedSince(restarted1));
        assert.equal(lease.signal.aborted, false, String(lease.signal.reason));
        assert.equal(a.health().defunct, undefined);
        ncB = await conn(ns.url);
        const jsm = await jetstreamManager(ncB);
        // The tenure entry A wrote is still the key's, at A's epoch.
        const entry = await jsm.streams.getMessage(`KV_${bucket}`, {
          last_by_subj: `$KV.${bucket}._lease.k.k`,
        });
        assert.equal(entry?.seq, lease.epoch);

        // B starts now, and waits while A's session lives (A answers
        // its probes).
        const b = await createLeaseManager({
          nc: ncB,
          node: "b",
          bucket,
          fenced: true,
          ttl,
        });
        managers.push(b);
        const found: string[] = [];
        b.addEventListener("acquired", (e) => {
          found.push((e as LeaseAcquiredEvent).found);
        });
        let bFirst: number | undefined;
        const taking = b.guard("k", async (l) => {
          bFirst = performance.now();
          return { epoch: l.epoch, rev: await l.put("b.1", "b-1") };
        }, { wait: true, signal: AbortSignal.timeout(10 * ttl) });
        await sleep(ttl / 2);
        assert.equal(bFirst, undefined, "B took k while A held it");
        const ackedWhileBWaited = ackedSince(restarted1).length;

        // 2. SIGKILL again, and A's way back is held: the restarted
        // server answers B's probe of A's session "no responders".
        const killed2 = performance.now();
        await ns.kill();
        proxy.hold("up");
        await ns.restart();
        const restarted2 = performance.now();
        const bw = await taking;
        proxy.release("up");
        await eventually(() => lease.signal.aborted, 3 * ttl, "A's tenure end");
        await w.done;
        const reason = lease.signal.reason as Error;
        const stored = await dataOnStream(jsm, bucket);
        const lost = [...w.acked].filter(([k, v]) =>
          stored.get(k)?.seq !== v.rev
        );
        const beforeKill = sent.filter((s) => s.at < killed2).at(-1)!;
        const got = await replay(ncB, beforeKill);
        report("SIGKILL with sync_interval: always", {
          epochs: `A ${lease.epoch}, B ${bw.epoch}`,
          restart1: restarted1 - killed1,
          aWritingAgainAfterRestart1: resumed - restarted1,
          aPutsAckedWhileBWaited: String(ackedWhileBWaited),
          bTookAfterRestart2: bFirst! - restarted2,
          bFound: found.join(" "),
          aPutsAcknowledged: String(w.acked.size),
          aPutsAcknowledgedAndLost: String(lost.length),
          aPutsRefused: `${w.failed.length} (${
            [...new Set(w.failed.map((f) => f.name))].join(", ")
          })`,
          aReason: `${reason?.name}: ${reason?.message?.slice(0, 60)}`,
          replayOfAPutBeforeKill2: JSON.stringify(got),
        });
        assert.ok(ackedWhileBWaited > 0, "A wrote on while B waited");
        // Every put the server acknowledged is on the stream, across both
        // kills: A's tenure entry among them, so B got a revision of its
        // own, and took k as F5 allows, from a holder whose connection
        // the server did not have.
        assert.deepEqual(lost.map(([k]) => k), [], "acknowledged, then lost");
        assert.ok(bw.epoch > lease.epoch, `B ${bw.epoch}, A ${lease.epoch}`);
        assert.deepEqual(found, ["crashed"]);
        assert.ok(reason instanceof NotHolderError, String(reason));
        for (const [k, v] of stored) {
          if (k.startsWith("a.")) {
            assert.ok(v.seq < bw.epoch, `${k} at ${v.seq}`);
          }
        }
        assert.equal(stored.get("b.1")?.seq, bw.rev);
        // A put of A's tenure delivered now is refused: B's tenure entry
        // moved on from A's revision.
        assert.ok("error" in got, `stored: ${JSON.stringify(got)}`);
        assert.match(got.error, /wrong last sequence/);
      } finally {
        proxy.onFrame = undefined;
        proxy.release("both");
        await Promise.allSettled(managers.map((m) => m.close()));
        await Promise.allSettled([ncA.close(), ncB?.close()]);
        await proxy.close();
        await ns[Symbol.asyncDispose]();
        fs.rmSync(storeDir, { recursive: true, force: true });
      }
    },
  );
});

describe("a fenced bucket's marker configuration edited while managers run", () => {
  let ns: NatsServer;
  let op: NatsConnection;
  let jsm: JetStreamManager;

  before(async () => {
    if (SKIP) return;
    ns = await NatsServer.start();
    op = await conn(ns.url);
    jsm = await jetstreamManager(op);
  });

  after(async () => {
    await op?.close();
    await ns?.[Symbol.asyncDispose]();
  });

  for (
    const [what, markerNs] of [
      ["removed", 0],
      ["lowered to 1 s", 1e9],
    ] as const
  ) {
    test(
      `the marker TTL ${what} while A holds k and B waits: B takes nothing while A's session lives, takes k only once A, cut off, let its session expire, and none of A's puts held in the network meanwhile is stored after B's tenure began`,
      { timeout: 60_000, skip: SKIP },
      async () => {
        const bucket = uniq("fedit");
        const ttl = 2000;
        const proxy = await NatsProxy.start(ns.port);
        const sent: SentPut[] = [];
        proxy.onFrame = (f, d, c) => {
          if (d !== "up" || !f.subject?.startsWith(`$KV.${bucket}.a.`)) {
            return;
          }
          const put = parseHpub(f, c);
          if (put) sent.push(put);
        };
        const ncA = await conn(proxy.url);
        const ncB = await conn(ns.url);
        const managers: LeaseManager[] = [];
        try {
          const a = await createLeaseManager({
            nc: ncA,
            node: "a",
            bucket,
            fenced: true,
            ttl,
            timeout: 500,
          });
          managers.push(a);
          const b = await createLeaseManager({
            nc: ncB,
            node: "b",
            bucket,
            fenced: true,
          });
          managers.push(b);
          const found: string[] = [];
          b.addEventListener("acquired", (e) => {
            found.push((e as LeaseAcquiredEvent).found);
          });
          const w = writer(a, "k", "a", 25);
          await w.held;
          const lease = w.lease;
          let bFirst: number | undefined;
          const taking = b.guard("k", async (l) => {
            bFirst = performance.now();
            return { epoch: l.epoch, rev: await l.put("b.1", "b-1") };
          }, { wait: true, signal: AbortSignal.timeout(10 * ttl) });
          await sleep(200);
          const before = await markerTtl(jsm, bucket);
          await jsm.streams.update(`KV_${bucket}`, {
            subject_delete_marker_ttl: markerNs,
          });
          const edited = performance.now();
          assert.equal(await markerTtl(jsm, bucket), markerNs, "the edit");
          // A's session is renewed three times a TTL: B must go on waiting.
          await sleep(1.5 * ttl);
          assert.equal(bFirst, undefined, "B took k while A's session lived");
          const ackedAfterEdit = [...w.acked.values()].filter((v) =>
            v.at > edited
          ).length;
          assert.ok(ackedAfterEdit > 0, "A wrote on after the edit");
          // A manager opened now proves the markers afresh: none is refused.
          const fresh = await createLeaseManager({
            nc: ncB,
            node: "c",
            bucket,
            fenced: true,
          }).then((m) => {
            managers.push(m);
            return "opened";
          }, (err: Error) => err);
          // A is cut off: its renewals and puts wait in the network.
          const deadline = lease.deadline;
          const cut = performance.now();
          proxy.hold("both");
          const bw = await taking;
          const bAt = bFirst!;
          proxy.release("both");
          await eventually(() => lease.signal.aborted, 3 * ttl, "A's end");
          await w.done;
          const reason = lease.signal.reason as Error;
          const stored = await dataOnStream(jsm, bucket);
          const heldPuts = sent.filter((s) => s.at >= cut);
          const heldStored = heldPuts.filter((s) =>
            stored.has(s.subject.slice(`$KV.${bucket}.`.length))
          );
          const late = [...stored].filter(([k, v]) =>
            k.startsWith("a.") && v.seq > bw.epoch
          );
          report(`marker TTL ${what}`, {
            markerTtl: `${before / 1e6} ms -> ${markerNs / 1e6} ms`,
            newManager: typeof fresh === "string"
              ? fresh
              : `${fresh.name}: ${fresh.message.slice(0, 90)}`,
            aPutsAckedAfterEdit: String(ackedAfterEdit),
            bTookAfterCut: bAt - cut,
            bTookAfterADeadline: bAt - deadline,
            bFound: found.join(" "),
            aPutsHeldInNetwork: String(heldPuts.length),
            heldPutsStored: String(heldStored.length),
            epochs: `A ${lease.epoch}, B ${bw.epoch}`,
            aReason: `${reason?.name}: ${reason?.message?.slice(0, 60)}`,
          });
          // F5 with the edit: B took k no sooner than A's session could
          // have expired (A's own deadline comes before that), and F1:
          // nothing of A's tenure stored after B's began.
          assert.ok(
            bAt >= deadline,
            `B wrote ${Math.round(deadline - bAt)} ms before A's deadline`,
          );
          assert.deepEqual(found, ["session-ended"]);
          assert.ok(heldPuts.length > 0, "A sent puts while cut off");
          assert.deepEqual(heldStored.map((s) => s.subject), []);
          assert.deepEqual(late, [], "A's writes stored after B's tenure");
          assert.equal(stored.get("b.1")?.seq, bw.rev);
          assert.ok(bw.epoch > lease.epoch);
          if (markerNs === 0) {
            assert.ok(fresh instanceof RangeError, String(fresh));
            assert.match(fresh.message, /has no subject delete markers/);
          } else assert.equal(fresh, "opened");
          assert.ok(
            reason instanceof UnavailableError ||
              reason instanceof NotHolderError,
            String(reason),
          );
        } finally {
          proxy.onFrame = undefined;
          proxy.release("both");
          await Promise.allSettled(managers.map((m) => m.close()));
          await Promise.allSettled([ncA.close(), ncB.close()]);
          await proxy.close();
        }
      },
    );
  }

  test(
    "the edits the server refuses or ignores: message TTLs cannot be turned off (sessions always expire), a marker TTL under 1 s is refused, and with atomic batches turned off a commit stores nothing",
    { timeout: 30_000, skip: SKIP },
    async () => {
      const bucket = uniq("fref");
      const stream = `KV_${bucket}`;
      const nc = await conn(ns.url);
      try {
        const m = await createLeaseManager({
          nc,
          node: "a",
          bucket,
          fenced: true,
          ttl: 2000,
        });
        type Config = {
          allow_msg_ttl?: boolean;
          subject_delete_marker_ttl?: number;
          allow_atomic?: boolean;
        };
        const config = async () =>
          (await jsm.streams.info(stream)).config as Config;
        const was = await config();
        const refusals: string[] = [];
        for (
          const [edit, re] of [
            [
              { allow_msg_ttl: false, subject_delete_marker_ttl: 0 },
              /message TTL status can not be disabled/,
            ],
            [{ subject_delete_marker_ttl: 5e8 }, /at least 1 second/],
          ] as const
        ) {
          await assert.rejects(
            jsm.streams.update(stream, edit),
            (err: Error) => {
              refusals.push(err.message);
              assert.match(err.message, re);
              return true;
            },
          );
        }
        // Taken without an error, but the server keeps message TTLs on
        // while the stream has markers.
        await jsm.streams.update(stream, { allow_msg_ttl: false });
        const now = await config();
        report("refused edits", { refusals: refusals.join("; ") });
        assert.equal(now.allow_msg_ttl, true);
        assert.equal(
          now.subject_delete_marker_ttl,
          was.subject_delete_marker_ttl,
        );
        if (was.allow_atomic === true) {
          const first = await m.guard(
            "k",
            (l) =>
              l.commit([{ put: "x", value: "1" }, { put: "y", value: "1" }]),
          );
          await jsm.streams.update(stream, { allow_atomic: false });
          assert.notEqual((await config()).allow_atomic, true);
          let error: unknown;
          await m.guard(
            "k",
            (l) =>
              l.commit([{ put: "x", value: "2" }, { put: "y", value: "2" }]),
          ).catch((e) => error = e);
          const stored = await dataOnStream(jsm, bucket);
          report("commit with atomic batches turned off", {
            error: `${(error as Error)?.name}: ${(error as Error)?.message}`,
          });
          // The server's answer, not a lost reply: said so, nothing stored.
          assert.ok(error instanceof TypeError, String(error));
          assert.match((error as Error).message, /allow_atomic/);
          assert.deepEqual(
            [...stored].map(([k, v]) => [k, v.seq, v.value]),
            [["x", first.seq - 1, "1"], ["y", first.seq, "1"]],
          );
          // The lease itself is untouched: a fenced put still lands.
          assert.ok((await m.guard("k", (l) => l.put("z", "z"))) > first.seq);
        }
        await m.close();
      } finally {
        await nc.close();
      }
    },
  );
});

/** The index of `stream`'s leader, once the cluster names one. */
async function leaderOf(cluster: NatsCluster, stream: string): Promise<number> {
  let leader: number | undefined;
  await eventually(
    async () => (leader = await cluster.streamLeader(stream)) !== undefined,
    30_000,
    `a leader of ${stream}`,
    100,
  );
  return leader!;
}

/** The last sequence of `stream` on server `s`, from its `/jsz`. */
async function lastSeqOn(s: NatsServer, stream: string): Promise<number> {
  try {
    const res = await fetch(`${s.httpUrl}/jsz?streams=true`, {
      signal: AbortSignal.timeout(2000),
    });
    const jsz = await res.json() as {
      account_details?: {
        stream_detail?: { name: string; state?: { last_seq?: number } }[];
      }[];
    };
    for (const acc of jsz.account_details ?? []) {
      for (const sd of acc.stream_detail ?? []) {
        if (sd.name === stream) return sd.state?.last_seq ?? -1;
      }
    }
  } catch {
    // not answering yet
  }
  return -1;
}

describe("an R3 fenced bucket that loses a server", () => {
  let cluster: NatsCluster;
  let copies: string;

  before(async () => {
    if (SKIP) return;
    cluster = await NatsCluster.start(3);
    copies = fs.mkdtempSync(path.join(os.tmpdir(), "lease-fr3-"));
  });

  after(async () => {
    await cluster?.[Symbol.asyncDispose]();
    if (copies) fs.rmSync(copies, { recursive: true, force: true });
  });

  /** Copies server `i`'s store while it is paused; returns the copy. */
  async function copyOf(i: number): Promise<string> {
    const dir = path.join(copies, uniq(`n${i}`));
    await cluster.pause(i);
    try {
      fs.cpSync(cluster.servers[i]!.storeDir, dir, { recursive: true });
    } finally {
      await cluster.resume(i);
    }
    return dir;
  }

  /** Kills server `i`, puts `dir` back as its store, and restarts it. */
  async function restore(i: number, dir: string): Promise<void> {
    const s = cluster.servers[i]!;
    await cluster.kill(i);
    fs.rmSync(s.storeDir, { recursive: true, force: true });
    fs.cpSync(dir, s.storeDir, { recursive: true });
    await cluster.restart(i);
  }

  const clusterConn = () =>
    connect({
      servers: cluster.urls,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 100,
    });

  test(
    "a follower restarted on a copy of its store from before the holder's tenure: the holder's puts keep landing through the quorum, the follower catches up, and the holder's SIGKILLed process's key is taken far inside the TTL at a higher revision",
    { timeout: 60_000, skip: SKIP },
    async () => {
      const bucket = uniq("fr3");
      const stream = `KV_${bucket}`;
      const ttl = 5000;
      const ncB = await clusterConn();
      let child: ReturnType<typeof startChild<ChildEv>> | undefined;
      const managers: LeaseManager[] = [];
      try {
        // Right after the stream is created, its first write may meet a server
        // that does not route it yet: createLeaseManager asks again itself.
        const b = await createLeaseManager({
          nc: ncB,
          node: "b",
          bucket,
          fenced: true,
          ttl,
          replicas: 3,
          timeout: 2000,
        });
        managers.push(b);
        const leader = await leaderOf(cluster, stream);
        const [f, c] = [0, 1, 2].filter((i) => i !== leader) as [
          number,
          number,
        ];
        const follower = cluster.servers[f]!;
        // Every server has the new stream (a publish through one that does
        // not yet is answered "no responders").
        await eventually(
          async () =>
            (await Promise.all(
              cluster.servers.map((s) => lastSeqOn(s, stream)),
            )).every((n) => n >= 1),
          20_000,
          "the stream on every server",
          100,
        );
        const copy = await copyOf(f); // before the holder takes k
        // The holder, in a process of its own, on the third server.
        child = startChild<ChildEv>(CHILD, {
          NATS_URL: cluster.servers[c]!.url,
          LEASE_BUCKET: bucket,
          LEASE_NODE: "child",
          LEASE_TTL: String(ttl),
          LEASE_KEY: "k",
          DATA_KEY: "x",
        }, { untilMs: 20_000 });
        const { epoch } = await child.until((e) => e.ev === "holding");
        const kv = await new Kvm(ncB).open(bucket);
        const xRev = async () => (await kv.get("x"))?.revision ?? 0;
        // f dies, and comes back without the tail: the tenure entry and
        // the holder's puts are gone from its store.
        const before = await xRev();
        await restore(f, copy);
        const restarted = performance.now();
        await eventually(
          async () => {
            const [mine, theirs] = await Promise.all([
              lastSeqOn(follower, stream),
              lastSeqOn(cluster.servers[leader]!, stream),
            ]);
            return mine > epoch! && mine >= theirs - 5;
          },
          20_000,
          "the restored follower caught up",
          100,
        );
        const caughtUp = performance.now();
        const afterCatchUp = await xRev();
        await sleep(300);
        const later = await xRev();
        assert.deepEqual(
          child.events.filter((e) => e.ev === "refused"),
          [],
          "a put of the holder's was refused",
        );
        // The waiter, then the holder's crash.
        const found: string[] = [];
        b.addEventListener("acquired", (e) => {
          found.push((e as LeaseAcquiredEvent).found);
        });
        let t0 = 0;
        const taking = b.guard("k", async (l) => {
          const took = performance.now() - t0;
          return { took, epoch: l.epoch, rev: await l.put("x", "b") };
        }, { wait: true, signal: AbortSignal.timeout(4 * ttl) });
        await sleep(200);
        t0 = performance.now();
        signal(child.pid, "SIGKILL");
        const got = await taking;
        report("R3, a follower restored from an older copy", {
          leader: `n${leader}`,
          restored: `n${f}`,
          holderOn: `n${c}`,
          followerCaughtUp: caughtUp - restarted,
          xRevisions:
            `${before} before, ${afterCatchUp} caught up, ${later} 300 ms on`,
          takenAfterSigkill: got.took,
          epochs: `holder ${epoch}, B ${got.epoch}`,
          found: found.join(" "),
        });
        // The holder's puts went on landing, through f's loss and return.
        assert.ok(afterCatchUp > before, "no put landed while f was away");
        assert.ok(later > afterCatchUp, "no put landed after f caught up");
        // The quorum kept the tenure entry: B took k at a later revision,
        // once the holder's connection was gone.
        assert.deepEqual(found, ["crashed"]);
        assert.ok(got.epoch > epoch!, `B ${got.epoch}, holder ${epoch}`);
        assert.ok(got.took < ttl / 2, `taken ${got.took} ms after SIGKILL`);
        assert.equal((await kv.get("x"))?.string(), "b");
      } finally {
        await child?.stop();
        await Promise.allSettled(managers.map((m) => m.close()));
        await ncB.close();
      }
    },
  );

  test(
    "the stream leader restarted on a copy of its store from before the holder's tenure: a new leader has every acknowledged write, the holder (on another server) keeps its key and writes on while a waiter waits, and the waiter takes the key at a higher revision once the holder's connection is gone",
    { timeout: 60_000, skip: SKIP },
    async () => {
      const bucket = uniq("fr3l");
      const stream = `KV_${bucket}`;
      // Far longer than an election takes here (6.4 s once): the
      // holder's session must outlive it.
      const ttl = 20_000;
      const ncB = await clusterConn();
      let ncA: NatsConnection | undefined;
      const managers: LeaseManager[] = [];
      try {
        // Right after the stream is created, its first write may meet a server
        // that does not route it yet: createLeaseManager asks again itself.
        const b = await createLeaseManager({
          nc: ncB,
          node: "b",
          bucket,
          fenced: true,
          ttl,
          replicas: 3,
          timeout: 2000,
        });
        managers.push(b);
        const jsm = await jetstreamManager(ncB, { timeout: 2000 });
        const leader = await leaderOf(cluster, stream);
        const c = [0, 1, 2].find((i) => i !== leader)!;
        const copy = await copyOf(leader); // before A takes k
        ncA = await conn(cluster.servers[c]!.url);
        const a = await createLeaseManager({
          nc: ncA,
          node: "a",
          bucket,
          fenced: true,
          timeout: 1000,
        });
        managers.push(a);
        const w = writer(a, "k", "a", 50);
        await w.held;
        const lease = w.lease;
        await eventually(() => w.acked.size >= 5, 10_000, "A's first puts");
        const found: string[] = [];
        b.addEventListener("acquired", (e) => {
          found.push((e as LeaseAcquiredEvent).found);
        });
        let bFirst: number | undefined;
        const taking = b.guard("k", async (l) => {
          bFirst = performance.now();
          return { epoch: l.epoch, rev: await l.put("b.1", "b-1") };
        }, { wait: true, signal: AbortSignal.timeout(50_000) });
        // The leader loses its tail and comes back; the other two elect
        // one of themselves, which has every write a quorum acknowledged.
        const killed = performance.now();
        await restore(leader, copy);
        const restarted = performance.now();
        const ackedSince = (t: number) =>
          [...w.acked.values()].filter((v) => v.at > t).map((v) => v.at);
        await eventually(
          () => ackedSince(restarted).length >= 5,
          ttl,
          "A's puts landing again",
        );
        const resumed = Math.min(...ackedSince(killed));
        const newLeader = await leaderOf(cluster, stream);
        assert.equal(bFirst, undefined, "B took k while A held it");
        assert.equal(lease.signal.aborted, false, String(lease.signal.reason));
        await w.stop();
        const stored = await dataOnStream(jsm, bucket);
        const lost = [...w.acked].filter(([k, v]) =>
          stored.get(k)?.seq !== v.rev
        );
        // A's process ends: its connection is gone, and B takes k.
        const closed = performance.now();
        await ncA.close();
        const bw = await taking;
        report("R3, the stream leader restored from an older copy", {
          leader: `n${leader} then n${newLeader}`,
          holderOn: `n${c}`,
          aWritingAgain: resumed - killed,
          aPutsAcknowledged: String(w.acked.size),
          aPutsAcknowledgedAndLost: String(lost.length),
          aPutsRefused: `${w.failed.length} (${
            [...new Set(w.failed.map((f) => f.name))].join(", ")
          })`,
          bTookAfterClose: bFirst! - closed,
          epochs: `A ${lease.epoch}, B ${bw.epoch}`,
          found: found.join(" "),
        });
        assert.deepEqual(lost.map(([k]) => k), [], "acknowledged, then lost");
        assert.ok(bw.epoch > lease.epoch, `B ${bw.epoch}, A ${lease.epoch}`);
        assert.deepEqual(found, ["crashed"]);
      } finally {
        await Promise.allSettled(managers.map((m) => m.close()));
        await Promise.allSettled([ncA?.close(), ncB.close()]);
      }
    },
  );
});
