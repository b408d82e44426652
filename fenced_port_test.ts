// The production port's fenced write (issue 33, step 2 of design/fenced.md): `publish` stores a write only while the
// tenure entry it names is still at the tenure's revision, the check made by
// the server itself (Nats-Expected-Last-Subject-Sequence-Subject, 2.11+).
// A takeover's compare-and-set moves the entry, and the old holder's next
// fenced write is refused with the revision that displaced it; the new
// holder's lands. On a server that ignores the header (before 2.11) the port
// refuses to send it at all. The simulator's port is held to the same in
// sim_test.ts.
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary.
// test.sh: fenced servers too
import { test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { createLeaseManager } from "./mod.ts";
import { MAX_BATCH } from "./lease/port.ts";
import { atomicVersion, fenceVersion } from "./lease/servers.ts";
import { signal, startChild } from "./test_util/child.ts";
import { uniq } from "./test_util/lease_helpers.ts";
import { portOn } from "./test_util/port.ts";
import {
  NatsCluster,
  NatsServer,
  pauseProcess,
  resumeProcess,
} from "./test_util/nats_server.ts";

const enc = new TextEncoder();
const RESPONDER = new URL("./test_util/responder_child.ts", import.meta.url)
  .pathname;

test("fenceVersion() and atomicVersion(): the check on another subject from 2.11.0, atomic batches from 2.12.0, neither in a pre-release of that first release", () => {
  for (
    const [v, fence, atomic] of [
      ["2.9.10", false, false],
      ["2.10.22", false, false],
      ["2.11.0-RC.1", false, false],
      ["2.11.0", true, false],
      ["2.11.9", true, false],
      ["2.12.0-beta.2", true, false],
      ["2.12.0", true, true],
      ["2.15.2", true, true],
      ["3.0.0", true, true],
      ["", false, false],
    ] as const
  ) {
    assert.equal(fenceVersion(v), fence, `fence ${v}`);
    assert.equal(atomicVersion(v), atomic, `atomic ${v}`);
  }
});

/**
 * A lease bucket made by the manager (with `allow_atomic` when `atomic`),
 * the production port on it, its tenure entry `k`, and a compare-and-set
 * that takes `k` for `value` over revision `expect`.
 */
async function fencedBucket(nc: NatsConnection, atomic: boolean) {
  const bucket = uniq("fp");
  await (await createLeaseManager({ nc, node: "maker", bucket, ttl: 5000 }))
    .close();
  const jsm = await jetstreamManager(nc);
  const stream = `KV_${bucket}`;
  let si = await jsm.streams.info(stream);
  if (atomic) {
    // Atomic batches are off by default; a fenced bucket turns them on.
    si = await jsm.streams.update(
      stream,
      {
        ...si.config,
        allow_atomic: true,
      } as Parameters<typeof jsm.streams.update>[1],
    );
  }
  const port = await portOn(nc, stream);
  const tenure = `$KV.${bucket}.k`;
  const take = (value: string, expect: number) =>
    port.write({
      subject: tenure,
      op: "PUT",
      value: enc.encode(value),
      expect,
      msgId: uniq("m"),
      timeout: 5000,
    });
  const last = async (subject: string) =>
    (await port.read(subject, { leader: true }, 5000))?.value;
  return { bucket, port, tenure, take, last };
}

test("a fenced write is stored under its tenure and refused, by the server, once a takeover moved the tenure's entry; a server before 2.11 gets none", async () => {
  await using ns = await NatsServer.start();
  const nc = await connect({ servers: ns.url });
  try {
    const { bucket, port, tenure, take, last: lastOf } = await fencedBucket(
      nc,
      false,
    );
    const data = `$KV.${bucket}.data.x`;
    const last = () => lastOf(data);
    const write = (text: string, seq: number) =>
      port.publish!({
        subject: data,
        data: enc.encode(text),
        fence: { subject: tenure, seq },
        timeout: 5000,
      });
    const a = await take("a", 0);
    assert.ok("seq" in a, JSON.stringify(a));

    if (!fenceVersion(ns.version)) {
      await assert.rejects(write("a1", a.seq), (err: Error) => {
        assert.ok(err instanceof RangeError);
        assert.match(err.message, /needs 2\.11 or later/);
        assert.match(
          err.message,
          new RegExp(ns.version.replaceAll(".", "\\.")),
        );
        return true;
      });
      assert.equal(await last(), undefined, "nothing was sent");
      return;
    }

    // Stored under A's tenure: checked against the tenure's entry, not the
    // data subject (which has no message yet).
    const a1 = await write("a1", a.seq);
    assert.ok("seq" in a1, JSON.stringify(a1));
    assert.equal(await last(), "a1");
    // B takes the key over A's entry: A's tenure is over at the server.
    const b = await take("b", a.seq);
    assert.ok("seq" in b, JSON.stringify(b));
    // A's late write is refused by the server, which names B's revision.
    assert.deepEqual(await write("a2", a.seq), { conflict: b.seq });
    assert.equal(await last(), "a1", "A's late write was not stored");
    const b1 = await write("b1", b.seq);
    assert.ok("seq" in b1, JSON.stringify(b1));
    assert.equal(await last(), "b1");
    port.close?.();
  } finally {
    await nc.close();
  }
});

test("a fenced commit is stored whole under its tenure and refused whole once a takeover moved the tenure's entry; an empty or oversized batch, or a server before 2.12, gets none", async () => {
  await using ns = await NatsServer.start();
  const nc = await connect({ servers: ns.url });
  try {
    const { bucket, port, tenure, take, last } = await fencedBucket(nc, true);
    const keys = ["a", "b", "c"].map((k) => `$KV.${bucket}.data.${k}`);
    const values = () => Promise.all(keys.map(last));
    const commit = (text: string, seq: number, n = keys.length) =>
      port.commit!({
        writes: Array.from({ length: n }, (_, i) => ({
          subject: keys[i % keys.length]!,
          data: enc.encode(text),
        })),
        fence: { subject: tenure, seq },
        timeout: 5000,
      });
    const a = await take("a", 0);
    assert.ok("seq" in a, JSON.stringify(a));
    for (const n of [0, MAX_BATCH + 1]) {
      await assert.rejects(commit("x", a.seq, n), RangeError);
    }
    if (!atomicVersion(ns.version)) {
      await assert.rejects(commit("a1", a.seq), (err: Error) => {
        assert.ok(err instanceof RangeError);
        assert.match(err.message, /need 2\.12 or later/);
        return true;
      });
      assert.deepEqual(await values(), [undefined, undefined, undefined]);
      return;
    }
    const a1 = await commit("a1", a.seq);
    assert.ok("seq" in a1 && a1.count === 3, JSON.stringify(a1));
    assert.deepEqual(await values(), ["a1", "a1", "a1"]);
    const b = await take("b", a.seq);
    assert.ok("seq" in b, JSON.stringify(b));
    // A's late batch: refused whole, by the server.
    assert.deepEqual(await commit("a2", a.seq), { conflict: b.seq });
    assert.deepEqual(await values(), ["a1", "a1", "a1"]);
    // One message is a batch too (first and commit at once).
    const b1 = await commit("b1", b.seq, 1);
    assert.ok("seq" in b1 && b1.count === 1, JSON.stringify(b1));
    assert.deepEqual(await values(), ["b1", "a1", "a1"]);
    port.close?.();
  } finally {
    await nc.close();
  }
});

/** The production port on `nc`, for `serve` and `probe` (no stream used). */
const barePort = (nc: NatsConnection) => portOn(nc);

/**
 * Probes `subject` every few milliseconds (20 ms timeouts) until `want`,
 * for at most `ms`; returns how long that took and what came before.
 */
async function probeUntil(
  port: Awaited<ReturnType<typeof barePort>>,
  subject: string,
  want: string,
  ms = 3000,
) {
  const t0 = performance.now();
  const before: string[] = [];
  for (;;) {
    const r = await port.probe!(subject, 20);
    if (r === want) return { ms: performance.now() - t0, before };
    before.push(r);
    if (performance.now() - t0 > ms) {
      assert.fail(`no '${want}' within ${ms} ms: ${before.join(", ")}`);
    }
    await new Promise((r) => setTimeout(r, 2));
  }
}

test("a session's probe: 'alive' while its responder's connection lasts, 'unknown' and never 'gone' while that process is paused, 'gone' within milliseconds of a SIGKILL, a close or a stop", async () => {
  await using ns = await NatsServer.start();
  const nc = await connect({ servers: ns.url });
  const nc2 = await connect({ servers: ns.url });
  const subject = "$LEASE.fp.probe.child";
  const child = startChild(RESPONDER, {
    NATS_URL: ns.url,
    PROBE_SUBJECT: subject,
  });
  try {
    const port = await barePort(nc);
    assert.equal(await port.probe!("$LEASE.fp.probe.nobody", 2000), "gone");
    await child.until((e) => e.ev === "serving");
    assert.equal(await port.probe!(subject, 2000), "alive");

    // Paused: the server still has its connection and delivers the
    // request, which nobody answers. A timeout proves nothing: "unknown".
    await pauseProcess(child.pid);
    for (let i = 0; i < 3; i++) {
      assert.equal(await port.probe!(subject, 200), "unknown");
    }
    await resumeProcess(child.pid);
    assert.equal(await port.probe!(subject, 2000), "alive");

    // In this process: a stop, then a close, each seen by the server.
    const port2 = await barePort(nc2);
    const own = "$LEASE.fp.probe.own";
    const r = await port2.serve!(own);
    assert.equal(await port.probe!(own, 2000), "alive");
    r.stop();
    await nc2.flush();
    assert.equal(await port.probe!(own, 2000), "gone");
    await port2.serve!(own);
    assert.equal(await port.probe!(own, 2000), "alive");
    await nc2.close();
    await probeUntil(port, own, "gone");
    await assert.rejects(port2.serve!(own));

    // Killed: its socket closes, and the server answers "no responders".
    signal(child.pid, "SIGKILL");
    const { ms, before } = await probeUntil(port, subject, "gone");
    console.log(
      `first 'gone' ${ms.toFixed(1)} ms after the SIGKILL (before it: ${
        before.join(", ") || "nothing"
      })`,
    );
  } finally {
    await child.stop();
    await nc.close();
    if (!nc2.isClosed()) await nc2.close();
  }
});

test("a session's probe across a cluster's route: 'alive' through another server once the interest crossed, 'gone' soon after the holder's SIGKILL", async () => {
  await using cluster = await NatsCluster.start(3);
  const [a, , c] = cluster.servers;
  const nc = await connect({ servers: c!.url });
  const subject = `$LEASE.${uniq("fp")}.probe.s`;
  const child = startChild(RESPONDER, {
    NATS_URL: a!.url,
    PROBE_SUBJECT: subject,
  });
  try {
    const port = await barePort(nc);
    await child.until((e) => e.ev === "serving");
    // The interest crosses the route after the responder's server has it:
    // a probe through another server may see "gone" for that moment.
    const up = await probeUntil(port, subject, "alive");
    console.log(
      `'alive' through another server ${
        up.ms.toFixed(1)
      } ms after the responder's server had it (before: ${
        up.before.join(", ") || "nothing"
      })`,
    );
    signal(child.pid, "SIGKILL");
    const down = await probeUntil(port, subject, "gone");
    console.log(
      `first 'gone' through another server ${
        down.ms.toFixed(1)
      } ms after the SIGKILL`,
    );
  } finally {
    await child.stop();
    await nc.close();
  }
});
