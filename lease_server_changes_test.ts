// What a running manager does when the server changes underneath it
// (nats-kv-facts.md section 11): the bucket's subject delete markers
// removed or shortened by a stream edit, or the server rolled back to a
// release without markers. A manager proves markers at start-up, and a key
// with no entry is taken with a grace shortened by the markers' life; these
// tests check that the life counts only as proven when the grace is
// decided. Each one cuts a holder off (a proxy that holds every frame)
// while it writes, changes the markers, and checks that a manager created
// before the change starts its write no earlier than the holder's deadline
// plus the grace (one TTL), on the clock both share (one process).
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary, NATS_ROLLBACK_BIN the release to roll back to
// (default .tools/bin/nats-server-2.10.22, built by scripts/setup.sh).
import { after, describe } from "node:test";
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { before, test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  createLeaseManager,
  type LeaseManager,
  UnavailableError,
} from "./mod.ts";
import {
  conn,
  eventually,
  guardUntil,
  markersSupported,
  sleep,
  uniq,
  versionOf,
} from "./test_util/lease_helpers.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";
import { NatsProxy } from "./test_util/proxy.ts";

/** Long enough that a lowered marker TTL (1 s) leaves a gap to see. */
const TTL = 2000;

const SERVER_VERSION = versionOf(natsServerBinary());
const MARKERS = markersSupported(SERVER_VERSION);

const ROLLBACK_BIN = process.env.NATS_ROLLBACK_BIN ??
  fileURLToPath(
    new URL("./.tools/bin/nats-server-2.10.22", import.meta.url),
  );
const ROLLBACK_VERSION = fs.existsSync(ROLLBACK_BIN)
  ? versionOf(ROLLBACK_BIN)
  : undefined;

/** Prints measured figures (ms). */
function report(what: string, figures: Record<string, number>): void {
  const text = Object.entries(figures).map(([k, v]) =>
    `${k}=${Math.round(v)} ms`
  ).join(", ");
  console.log(`  [figures] ${what}: ${text}`);
}

/** The stream's marker TTL in ns (0: none), as the server reports it now. */
async function markerTtl(
  jsm: JetStreamManager,
  stream: string,
): Promise<number> {
  const si = await jsm.streams.info(stream);
  return (si.config as { subject_delete_marker_ttl?: number })
    .subject_delete_marker_ttl ?? 0;
}

/** Whether the key's subject has no message at all (no entry, no marker). */
async function empty(
  jsm: JetStreamManager,
  bucket: string,
  key: string,
): Promise<boolean> {
  try {
    const sm = await jsm.streams.getMessage(`KV_${bucket}`, {
      last_by_subj: `$KV.${bucket}.${key}`,
    });
    return sm === null;
  } catch {
    return false; // the server is not answering yet
  }
}

/** What {@linkcode holderCutOff} measured, on the clock `m1` and `h` share. */
interface Scenario {
  /** `h`'s lease deadline as `h` saw it. */
  deadline: number;
  /** When `h`'s write ended. */
  hEnd: number;
  /** When `m1`'s write started. */
  mStart: number;
  /** When the change was done. */
  changedAt: number;
  /** When the key was first seen with neither entry nor marker. */
  emptyAt: number;
}

/**
 * The scenario of every test: `m1` is a running manager, created before
 * the change; holder `h`, on a proxied connection, holds key `k`. Inside a
 * write, `h` is cut off (the proxy holds every frame both ways), `change`
 * starts, `h` passes `throwIfLost()` 50 ms before its deadline and goes on
 * writing until 0.85 TTL past it (inside the grace a successor owes it).
 * Once the key has neither entry nor marker, `m1` guards it until its
 * write runs. Returns when `m1`'s write started and `h`'s deadline (as
 * `h` saw it), on the clock both share.
 */
async function holderCutOff(
  url: string,
  port: number,
  jsm: JetStreamManager,
  change: (bucket: string) => Promise<void>,
): Promise<Scenario> {
  const bucket = uniq("sc");
  const ncM = await conn(url);
  const proxy = await NatsProxy.start(port);
  const ncH = await conn(proxy.url);
  const managers: LeaseManager[] = [];
  try {
    const m1 = await createLeaseManager({
      nc: ncM,
      node: "m1",
      bucket,
      ttl: TTL,
    });
    managers.push(m1);
    // Made by m1 with markers that outlive the max age: m1's start-up
    // proved a marker life of one TTL.
    assert.ok(
      (await markerTtl(jsm, `KV_${bucket}`)) / 1e6 > TTL,
      "the bucket was made with markers",
    );
    // m1 runs: it holds another key.
    await m1.guard("other", () => {});
    const h = await createLeaseManager({
      nc: ncH,
      node: "h",
      bucket,
      ttl: TTL,
      timeout: 300,
    });
    managers.push(h);
    await h.guard("k", () => {});
    let deadline = 0;
    let hEnd = 0;
    let changed!: Promise<void>;
    let cut!: () => void;
    const isCut = new Promise<void>((r) => cut = r);
    const writing = h.guard("k", async (lease) => {
      proxy.hold("both"); // h is cut off from here on
      // A restart may take longer than h's lease has left: not awaited.
      changed = change(bucket);
      cut();
      await sleep(lease.deadline - 50 - performance.now());
      deadline = lease.deadline;
      // h's commit check passes: it cannot know of an edit yet. A restart
      // (the rollback) drops h's connection, and its lease is then
      // suspended (point 10), but a holder whose server vanished without
      // closing the connection would pass: the test keeps writing as one.
      try {
        lease.throwIfLost();
      } catch (err) {
        const dropped = err instanceof UnavailableError &&
          /the connection to the server was lost/.test(err.message);
        if (!dropped) throw err;
      }
      await sleep(deadline + 0.85 * TTL - performance.now());
      hEnd = performance.now();
    });
    await isCut;
    await changed;
    const changedAt = performance.now();
    // h's entry expires; whatever marker it leaves (none, or a short one)
    // goes too. m1 has never looked at `k`; h may still be writing.
    await eventually(() => empty(jsm, bucket, "k"), 6 * TTL, "an empty key");
    const emptyAt = performance.now();
    const mStart = await guardUntil(
      m1,
      "k",
      () => performance.now(),
      6 * TTL,
      10,
    );
    await writing;
    return { deadline, hEnd, mStart, changedAt, emptyAt };
  } finally {
    proxy.release("both");
    await Promise.allSettled(managers.map((m) => m.close()));
    await Promise.allSettled([ncM.close(), ncH.close()]);
    await proxy.close();
  }
}

/** m1's write must start no earlier than h's deadline plus the grace. */
function checkGrace(what: string, r: Scenario): void {
  const afterDeadline = r.mStart - r.deadline;
  // Times after h's deadline (negative: before it).
  report(what, {
    changed: r.changedAt - r.deadline,
    keyEmpty: r.emptyAt - r.deadline,
    m1Wrote: afterDeadline,
    hWroteUntil: r.hEnd - r.deadline,
  });
  assert.ok(
    afterDeadline >= TTL,
    `m1 started its write ${
      afterDeadline.toFixed(0)
    } ms after h's deadline, inside the grace of ${TTL} ms (h, cut off, wrote until ${
      (r.hEnd - r.deadline).toFixed(0)
    } ms after it)`,
  );
}

describe("markers changed while managers run", () => {
  let ns: NatsServer;
  let op: NatsConnection;
  let jsm: JetStreamManager;
  const skip = MARKERS
    ? false
    : `nats-server ${SERVER_VERSION} writes no markers`;

  before(async () => {
    ns = await NatsServer.start();
    op = await conn(ns.url);
    jsm = await jetstreamManager(op);
  });

  after(async () => {
    await op?.close();
    await ns?.[Symbol.asyncDispose]();
  });

  test(
    `the marker proof leaves with a never-used key's compare-and-set, before its answer: one round trip, no grace (nats-server ${SERVER_VERSION})`,
    { skip },
    async () => {
      const bucket = uniq("sp");
      const proxy = await NatsProxy.start(ns.port);
      const nc = await conn(proxy.url);
      try {
        const m = await createLeaseManager({ nc, node: "a", bucket, ttl: TTL });
        const up: string[] = [];
        let heldWhenProofSent: boolean | undefined;
        proxy.onFrame = (f, dir) => {
          if (dir !== "up" || f.subject === undefined) return;
          up.push(f.subject);
          if (f.subject === `$KV.${bucket}.fresh`) {
            // The answer to the compare-and-set waits 300 ms.
            proxy.holdFor("down", 300);
          } else if (f.subject.endsWith(`.STREAM.INFO.KV_${bucket}`)) {
            heldWhenProofSent ??= proxy.isHeld("down");
          }
        };
        const t0 = performance.now();
        const epoch = await m.guard("fresh", (l) => l.epoch);
        const took = performance.now() - t0;
        proxy.onFrame = undefined;
        report("never-used key through a proxy holding answers 300 ms", {
          guard: took,
        });
        assert.ok(epoch > 0);
        assert.deepEqual(
          up.slice(0, 2).map((s) => s.replace(/^\$JS\.API\./, "")),
          [`$KV.${bucket}.fresh`, `STREAM.INFO.KV_${bucket}`],
          `sent: ${up.join(", ")}`,
        );
        // Sent before the compare-and-set's answer came back.
        assert.equal(heldWhenProofSent, true);
        // One held round trip, and no grace (a TTL).
        assert.ok(took < TTL / 2, `${took} ms`);
        await m.close();
      } finally {
        proxy.onFrame = undefined;
        await nc.close();
        await proxy.close();
      }
    },
  );

  test(
    `a stream edit that removes the marker TTL: a manager started before it waits the whole grace on an empty key (nats-server ${SERVER_VERSION})`,
    { skip },
    async () => {
      const r = await holderCutOff(ns.url, ns.port, jsm, async (bucket) => {
        const stream = `KV_${bucket}`;
        // nats.js merges this into the config it reads first (everything
        // else stays); the server takes 0 for none.
        await jsm.streams.update(stream, { subject_delete_marker_ttl: 0 });
        assert.equal(await markerTtl(jsm, stream), 0, "the edit was taken");
      });
      checkGrace("marker TTL removed", r);
    },
  );

  test(
    `a stream edit that lowers the marker TTL to 1 s: a manager started before it waits all but that second of the grace (nats-server ${SERVER_VERSION})`,
    { skip },
    async () => {
      const r = await holderCutOff(ns.url, ns.port, jsm, async (bucket) => {
        const stream = `KV_${bucket}`;
        await jsm.streams.update(stream, { subject_delete_marker_ttl: 1e9 });
        assert.equal(await markerTtl(jsm, stream), 1e9, "the edit was taken");
      });
      checkGrace("marker TTL lowered to 1 s", r);
    },
  );
});

describe("the server rolled back to a release without markers", () => {
  const why = !MARKERS
    ? `nats-server ${SERVER_VERSION} writes no markers`
    : ROLLBACK_VERSION === undefined
    ? `no ${ROLLBACK_BIN} to roll back to (scripts/setup.sh builds it; NATS_ROLLBACK_BIN names another)`
    : markersSupported(ROLLBACK_VERSION)
    ? `${ROLLBACK_BIN} is ${ROLLBACK_VERSION}, which has markers`
    : undefined;

  test(
    `a single server restarted on ${
      ROLLBACK_VERSION ?? "2.10.22"
    } (same store and port): a manager started on ${SERVER_VERSION} waits the whole grace on an empty key`,
    { skip: why ?? false },
    async () => {
      await using ns = await NatsServer.start();
      const op = await conn(ns.url);
      try {
        // Short requests: one sent while the server restarts is not left
        // waiting for the default 5 s.
        const jsm = await jetstreamManager(op, { timeout: 500 });
        const r = await holderCutOff(ns.url, ns.port, jsm, async (bucket) => {
          await ns.stop(); // a clean shutdown, as for an upgrade
          await ns.restart({ binary: ROLLBACK_BIN });
          assert.equal(ns.version, ROLLBACK_VERSION);
          // The store is served again, and its configuration shows no
          // marker TTL.
          await eventually(
            async () =>
              (await markerTtl(jsm, `KV_${bucket}`).catch(() => -1)) === 0,
            10_000,
            `the stream on ${ROLLBACK_VERSION}`,
          );
        });
        checkGrace(`rolled back to ${ROLLBACK_VERSION}`, r);
      } finally {
        await op.close();
      }
    },
  );
});
