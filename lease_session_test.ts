// A manager's session on a fenced bucket (issue 33, step 3 of
// design/fenced.md; `lease/session.ts`), on a
// real nats-server: its entry carries its own TTL and is renewed by
// compare-and-set; a renewal whose reply was lost is recognised by its tag;
// an entry replaced behind its back, or renewals nobody confirms, end it,
// and then its responder stops answering; the server's marker keeps it
// ended; a server before 2.11.2 is refused before anything is sent.
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary.
// test.sh: fenced servers too
import { test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { Port, WriteRequest } from "./lease/port.ts";
import { markersVersion } from "./lease/servers.ts";
import { Session } from "./lease/session.ts";
import { sleep, uniq, versionOf } from "./test_util/lease_helpers.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";
import { portOn } from "./test_util/port.ts";

/** Sessions need markers for per-message TTL expiries (2.11.2+). */
const SESSIONS = markersVersion(versionOf(natsServerBinary()))
  ? false
  : "sessions need nats-server 2.11.2 or later";

/**
 * A bucket with per-message TTLs and markers (ignored before 2.11), the
 * production port on it, and a way to open sessions there.
 */
async function sessionBucket(nc: NatsConnection) {
  const bucket = uniq("ss");
  await new Kvm(nc).create(bucket, { history: 1, markerTTL: 1000 });
  const jsm = await jetstreamManager(nc);
  const stream = `KV_${bucket}`;
  const port = await portOn(nc, stream);

  const open = (ttl: number, p: Port = port) =>
    Session.open({
      port: p,
      subject: (id) => `$KV.${bucket}._lease.s.${id}`,
      probe: (id) => `$LEASE.${bucket}.probe.${id}`,
      node: "n1",
      ttl,
    });
  const raw = (subject: string) =>
    jsm.streams.getMessage(stream, { last_by_subj: subject }).catch(() => null);
  return { bucket, port, open, raw };
}

/** Resolves once `s` is lost, with why and when (port clock). */
function lost(s: Session, port: Port): Promise<{ why: string; at: number }> {
  return new Promise((r) => s.onLost((why) => r({ why, at: port.now() })));
}

test("a session: created with its own TTL, renewed by compare-and-set every TTL/3, answering probes; closed, its entry is deleted and probes get 'gone'; a server before 2.11.2 is refused before sending", async () => {
  await using ns = await NatsServer.start();
  const nc = await connect({ servers: ns.url });
  try {
    const { port, open, raw } = await sessionBucket(nc);
    if (!markersVersion(ns.version)) {
      await assert.rejects(open(3000), (err: Error) => {
        assert.ok(err instanceof RangeError, String(err));
        assert.match(err.message, /needs 2\.11\.2 or later/);
        return true;
      });
      return;
    }
    await assert.rejects(open(999), RangeError);
    const s = await open(2000);
    const first = await raw(s.subject);
    assert.equal(first?.header.get("Nats-TTL"), "2s");
    assert.equal(first?.string(), "n1");
    assert.equal(first?.seq, s.revision);
    assert.equal(await port.probe!(s.probeSubject, 2000), "alive");
    // Two renewals in 1.6 s (one each 667 ms): the entry moved, by our CAS.
    const r0 = s.revision;
    await sleep(1600);
    assert.ok(s.revision >= r0 + 2, `revision ${r0} → ${s.revision}`);
    assert.equal((await raw(s.subject))?.seq, s.revision);
    assert.ok(s.deadline > port.now(), "still vouched for");
    assert.equal(s.ended, undefined);
    await s.close();
    assert.equal((await raw(s.subject))?.header.get("KV-Operation"), "DEL");
    assert.equal(await port.probe!(s.probeSubject, 2000), "gone");
    assert.equal(s.deadline, -Infinity);
  } finally {
    await nc.close();
  }
});

test(
  "a session whose entry is replaced behind its back is lost at its next renewal and its responder stops; one whose renewals go unconfirmed is lost at its deadline, and the server's marker keeps it ended",
  { skip: SESSIONS },
  async () => {
    await using ns = await NatsServer.start();
    const nc = await connect({ servers: ns.url });
    try {
      const { bucket, port, open, raw } = await sessionBucket(nc);

      // An operator's delete, out of band.
      const a = await open(3000);
      const aLost = lost(a, port);
      const kv = await new Kvm(nc).open(bucket);
      await kv.delete(`_lease.s.${a.id}`);
      const del = await raw(a.subject);
      const { why } = await aLost;
      assert.match(why, new RegExp(`replaced at revision ${del!.seq}`));
      assert.equal(await port.probe!(a.probeSubject, 2000), "gone");
      await a.close();

      // Renewals that never reach the server: lost at the deadline, not before.
      let cut = false;
      const quiet: Port = {
        ...port,
        write: (req: WriteRequest) =>
          cut ? Promise.reject(new Error("timeout")) : port.write(req),
      };
      const b = await open(2000, quiet);
      const bLost = lost(b, port);
      const deadline = b.deadline;
      cut = true;
      const gone = await bLost;
      assert.match(gone.why, /no renewal of session .* was confirmed/);
      assert.ok(
        gone.at >= deadline,
        `lost at ${gone.at}, deadline ${deadline}`,
      );
      assert.equal(await port.probe!(b.probeSubject, 2000), "gone");
      // The server expires its entry into a marker within its TTL (2 s) and
      // a late tick: a renewal of it can never succeed again.
      const last = b.revision;
      let m;
      for (let i = 0; i < 40; i++) {
        m = await raw(b.subject);
        if (m?.header.get("Nats-Marker-Reason")) break;
        await sleep(100);
      }
      assert.equal(m?.header.get("Nats-Marker-Reason"), "MaxAge");
      const again = await port.write({
        subject: b.subject,
        op: "PUT",
        value: new TextEncoder().encode("n1"),
        expect: last,
        msgId: uniq("late"),
        timeout: 2000,
        ttl: 2,
      });
      assert.deepEqual(again, { conflict: m!.seq });
      await b.close();
    } finally {
      await nc.close();
    }
  },
);

test(
  "a session's renewal whose reply was lost is recognised by its tag at the next renewal: the session lives on at the server's revision",
  { skip: SESSIONS },
  async () => {
    await using ns = await NatsServer.start();
    const nc = await connect({ servers: ns.url });
    try {
      const { port, open, raw } = await sessionBucket(nc);
      let drops = 0;
      const lossy: Port = {
        ...port,
        // The first renewal is applied, and its reply lost.
        write: async (req: WriteRequest) => {
          const res = await port.write(req);
          if (req.expect > 0 && drops++ === 0) throw new Error("timeout");
          return res;
        },
      };
      const s = await open(3000, lossy);
      let why: string | undefined;
      s.onLost((w) => why = w);
      await sleep(2500);
      assert.ok(drops >= 2, `renewals: ${drops}`);
      assert.equal(why, undefined, "not lost");
      assert.equal(s.ended, undefined);
      assert.equal((await raw(s.subject))?.seq, s.revision);
      await s.close();
    } finally {
      await nc.close();
    }
  },
);
