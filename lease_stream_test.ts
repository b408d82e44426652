// Leases kept in a stream of the user's (`createLeaseManager({ stream,
// leaseSubjects })`, issue 33's stream layout), on a real nats-server: bad
// options refused before anything is sent; a stream that cannot hold leases
// refused, naming each setting, and left as it was; appends that land while
// the lease is held, as plain messages; lease subjects rolled up to one
// message each however often they are renewed; appends to subjects outside
// the stream or under the leases refused before sending; a stale holder's
// append and commit refused by the server itself, with nothing stored; a
// SIGKILLed holder's key taken in milliseconds; and a server before 2.11.2
// refused before anything is written. Runs under `deno test -A`, `bun test`
// and `node --test`; NATS_SERVER_BIN picks the server binary.
// test.sh: fenced servers too
import { after, before, describe } from "node:test";
import { test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  type JetStreamManager,
  jetstreamManager,
  type StreamConfig,
} from "@nats-io/jetstream";
import {
  createLeaseManager,
  type LeaseAcquiredEvent,
  type LeaseManager,
  type LeaseManagerOptions,
  NotHolderError,
  semaphore,
  type ShardLease,
  shards,
  UnavailableError,
} from "./mod.ts";
import { atomicVersion, markersVersion } from "./lease/servers.ts";
import { streamRefusals } from "./lease/stream.ts";
import { signal, startChild } from "./test_util/child.ts";
import { uniq, versionOf } from "./test_util/lease_helpers.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";

const TTL = 2000;
const VERSION = versionOf(natsServerBinary());
const OLD = markersVersion(VERSION)
  ? false
  : `nats-server ${VERSION} is before 2.11.2`;
const NEW = OLD ? false : `nats-server ${VERSION} can hold leases in a stream`;
const NO_ATOMIC = atomicVersion(VERSION)
  ? false
  : `nats-server ${VERSION} has no atomic batches`;
const CHILD = new URL("./test_util/fenced_child.ts", import.meta.url)
  .pathname;

/** A stream's settings that can hold leases under `<name>.lease`. */
function goodConfig(name: string, extra: Record<string, unknown> = {}) {
  return {
    name,
    subjects: [`${name}.>`],
    allow_msg_ttl: true,
    subject_delete_marker_ttl: 2_000_000_000,
    allow_rollup_hdrs: true,
    allow_direct: true,
    ...extra,
  };
}

/** The number of messages on each subject of `stream`. */
async function counts(
  jsm: JetStreamManager,
  stream: string,
): Promise<Record<string, number>> {
  const si = await jsm.streams.info(stream, { subjects_filter: ">" });
  return si.state.subjects ?? {};
}

test("a stream whose settings nats-server forces with markers is still checked for them", () => {
  // With markers, nats-server 2.11+ turns roll-ups on and refuses
  // `deny_purge`, so no real stream reaches these; the check stays for
  // a server that would not.
  const good = goodConfig("S") as unknown as StreamConfig;
  assert.deepEqual(streamRefusals(good, "S.lease"), []);
  for (const change of [{ allow_rollup_hdrs: false }, { deny_purge: true }]) {
    const refusals = streamRefusals({ ...good, ...change }, "S.lease");
    assert.equal(refusals.length, 1, JSON.stringify(refusals));
    assert.match(refusals[0]!, /allow_rollup_hdrs/);
  }
  assert.match(
    streamRefusals(
      { ...good, subjects: ["S.lease.k.*", "S.lease.s.>"] },
      "S.lease",
    )
      .join(),
    /do not cover 'S\.lease\.k\.>'/,
  );
  assert.deepEqual(
    streamRefusals(
      { ...good, subjects: ["S.lease.k.>", "S.lease.s.>"] },
      "S.lease",
    ),
    [],
  );
});

describe("leases in a stream of the user's", { skip: OLD }, () => {
  let ns: NatsServer;
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  before(async () => {
    ns = await NatsServer.start();
    nc = await connect({ servers: ns.url });
    jsm = await jetstreamManager(nc);
  });
  after(async () => {
    await nc?.close();
    await ns?.stop();
  });

  /** A new stream that can hold leases, with optional settings. */
  async function stream(extra: Record<string, unknown> = {}) {
    const name = uniq("S").replaceAll("-", "_");
    await jsm.streams.add(
      goodConfig(name, extra) as Parameters<typeof jsm.streams.add>[0],
    );
    const open = async (node: string, on: NatsConnection = nc) => {
      const m = await createLeaseManager({
        nc: on,
        node,
        ttl: TTL,
        stream: name,
        leaseSubjects: `${name}.lease`,
      });
      const found: string[] = [];
      m.addEventListener("acquired", (e) => {
        found.push((e as LeaseAcquiredEvent).found);
      });
      return { m, found };
    };
    return { name, open };
  }

  test("options that do not fit the stream layout are refused before anything is sent", async () => {
    const base = { nc, node: "a", stream: "ORDERS", leaseSubjects: "o.lease" };
    const before = nc.stats().outMsgs;
    const cases: [Partial<LeaseManagerOptions>, RegExp][] = [
      [{ leaseSubjects: undefined! }, /'leaseSubjects' must be/],
      [{ leaseSubjects: "o.*" }, /'leaseSubjects' must be/],
      [{ leaseSubjects: "o..lease" }, /'leaseSubjects' must be/],
      [{ stream: "OR.DERS" }, /'stream' must be a stream name/],
      [{ stream: "" }, /'stream' must be a stream name/],
      [{ bucket: "leases" }, /'stream' and 'bucket'/],
      [{ createBucket: true }, /'stream' and 'createBucket'/],
      [{ replicas: 3 }, /'stream' and 'replicas'/],
      [{ markers: true }, /'stream' and 'markers'/],
      [{ restartGrace: false }, /'stream' and 'restartGrace'/],
      [{ domain: "hub" }, /'stream' and 'domain'/],
      [{ fenced: false }, /always fenced/],
      [{ stream: undefined! }, /'leaseSubjects' but no 'stream'/],
    ];
    for (const [change, message] of cases) {
      await assert.rejects(
        createLeaseManager({ ...base, ...change } as LeaseManagerOptions),
        (err: Error) => {
          assert.ok(err instanceof TypeError, `${message}: ${err}`);
          assert.match(err.message, message);
          return true;
        },
      );
    }
    await assert.rejects(
      createLeaseManager({ ...base, ttl: 999 }),
      (err: Error) => err instanceof RangeError && /1000 ms/.test(err.message),
    );
    assert.equal(nc.stats().outMsgs, before, "nothing was sent");
  });

  test("a stream that cannot hold leases is refused, naming each setting, and is left as it was", async () => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ allow_msg_ttl: false, subject_delete_marker_ttl: 0 }, /allow_msg_ttl/],
      [{ subject_delete_marker_ttl: 0 }, /subject_delete_marker_ttl/],
      [{ max_age: 3_600_000_000_000 }, /'max_age'/],
      [{ max_msgs: 1000 }, /'max_msgs'/],
      [{ max_bytes: 1_000_000 }, /'max_bytes'/],
      [{ subjects: ["elsewhere.>"] }, /do not cover/],
      [{ retention: "workqueue" }, /retention is 'workqueue'/],
      [{ retention: "interest" }, /retention is 'interest'/],
    ];
    for (const [extra, message] of cases) {
      const name = uniq("S").replaceAll("-", "_");
      const cfg = goodConfig(name, extra);
      await jsm.streams.add(cfg as Parameters<typeof jsm.streams.add>[0]);
      const was = (await jsm.streams.info(name)).config;
      await assert.rejects(
        createLeaseManager({
          nc,
          node: "a",
          stream: name,
          leaseSubjects: `${name}.lease`,
        }),
        (err: Error) => {
          assert.match(err.message, message, JSON.stringify(extra));
          return true;
        },
        JSON.stringify(extra),
      );
      const si = await jsm.streams.info(name);
      assert.equal(si.state.messages, 0, "nothing was written");
      assert.deepEqual(si.config, was, "the stream was not changed");
    }
    await assert.rejects(
      createLeaseManager({
        nc,
        node: "a",
        stream: "NO_SUCH_STREAM",
        leaseSubjects: "x.lease",
      }),
      /stream 'NO_SUCH_STREAM' does not exist/,
    );
    // A fenced bucket's stream is a lease bucket, not a stream of the user's.
    const bucket = uniq("fb");
    const m = await createLeaseManager({ nc, node: "b", bucket, fenced: true });
    await m.close();
    await assert.rejects(
      createLeaseManager({
        nc,
        node: "a",
        stream: `KV_${bucket}`,
        leaseSubjects: `$KV.${bucket}.x`,
      }),
      /lease bucket's stream/,
    );
  });

  test("appends land while the lease is held, as plain messages, and each lease subject keeps one message however often it is renewed", async () => {
    const s = await stream();
    const a = await s.open("a");
    const b = await s.open("b");
    try {
      const seqs = await a.m.guard("o1", async (lease) => {
        const out = [];
        for (let i = 0; i < 3; i++) {
          out.push(await lease.publish(`${s.name}.created`, `order-${i}`));
        }
        return out;
      });
      assert.equal(seqs.length, 3);
      assert.ok(seqs[0]! < seqs[1]! && seqs[1]! < seqs[2]!, String(seqs));
      const sm = (await jsm.streams.getMessage(s.name, { seq: seqs[2]! }))!;
      assert.equal(sm.subject, `${s.name}.created`);
      assert.equal(sm.string(), "order-2");
      assert.equal(sm.header?.get("KV-Operation") ?? "", "");
      // Three renewal periods of both sessions (TTL/3 each).
      await new Promise((r) => setTimeout(r, TTL * 1.2));
      const c = await counts(jsm, s.name);
      assert.equal(c[`${s.name}.created`], 3);
      const lease = Object.entries(c).filter(([k]) =>
        k.startsWith(`${s.name}.lease.`)
      );
      assert.equal(lease.length, 3, JSON.stringify(c)); // a tenure, 2 sessions
      for (const [subject, n] of lease) assert.equal(n, 1, subject);
      // Held: another manager is told so, and takes it once released.
      await assert.rejects(b.m.guard("o1", () => 1), NotHolderError);
      const taken = b.m.guard(
        "o1",
        (l) => l.publish(`${s.name}.created`, "b"),
        {
          wait: true,
        },
      );
      await a.m.release("o1");
      assert.ok((await taken) > seqs[2]!);
    } finally {
      await a.m.close();
      await b.m.close();
    }
  });

  test("appends outside the stream, under the leases or with wildcards, and puts, are refused before sending; a bucket's lease refuses publish", async () => {
    const s = await stream();
    const a = await s.open("a");
    try {
      await a.m.guard("o1", async (lease) => {
        const sent = nc.stats().outMsgs;
        for (
          const [subject, message] of [
            [`${s.name}.lease.k.o1`, /hold the leases themselves/],
            [`${s.name}.lease`, /hold the leases themselves/],
            ["elsewhere.x", /not a subject of stream/],
            [s.name, /not a subject of stream/], // '>' needs a token
            [`${s.name}.*`, /not a subject:/],
            ["", /not a subject:/],
            [42, /must be a string/],
          ] as const
        ) {
          await assert.rejects(
            lease.publish(subject as string, "x"),
            (err: Error) =>
              err instanceof TypeError && message.test(err.message),
          );
        }
        await assert.rejects(
          lease.publish(`${s.name}.created`, 7 as unknown as string),
          TypeError,
        );
        await assert.rejects(lease.put("x", "1"), /use publish/);
        await assert.rejects(lease.delete("x"), /use publish/);
        await assert.rejects(
          lease.commit([{ put: "x", value: "1" }]),
          /use publish/,
        );
        assert.equal(nc.stats().outMsgs, sent, "nothing was sent");
      });
      assert.deepEqual(
        Object.keys(await counts(jsm, s.name)).filter((k) =>
          !k.startsWith(`${s.name}.lease.`)
        ),
        [],
      );
    } finally {
      await a.m.close();
    }
    const bucket = uniq("fb");
    const f = await createLeaseManager({ nc, node: "a", bucket, fenced: true });
    try {
      await f.guard("k", async (lease) => {
        await assert.rejects(lease.publish("x", "1"), /use put/);
        await assert.rejects(
          lease.commit([{ publish: "x", data: "1" }]),
          /use put/,
        );
      });
    } finally {
      await f.close();
    }
  });

  test("a holder whose tenure was taken behind its back has its append refused by the server, naming the new tenure, and nothing of it is stored", async () => {
    const s = await stream();
    const a = await s.open("a");
    const nc2 = await connect({ servers: ns.url });
    const b = await s.open("b", nc2);
    try {
      await a.m.guard("o1", async (lease) => {
        await lease.publish(`${s.name}.created`, "a-1");
        // An operator's purge of the tenure entry frees the key at once
        // (F5's residue): B takes it while A still vouches for its lease.
        await jsm.streams.purge(s.name, { filter: `${s.name}.lease.k.o1` });
        const epochB = await b.m.guard("o1", async (l) => {
          await l.publish(`${s.name}.created`, "b-1");
          return l.epoch;
        });
        assert.ok(epochB > lease.epoch);
        lease.throwIfLost(); // A's own check still passes
        await assert.rejects(
          lease.publish(`${s.name}.created`, "a-2"),
          (err: Error) => {
            assert.ok(err instanceof NotHolderError, String(err));
            assert.match(err.message, new RegExp(`revision ${epochB}\\b`));
            return true;
          },
        );
        assert.throws(() => lease.throwIfLost(), "the refusal ended A's lease");
      }).catch((err) => {
        if (!(err instanceof NotHolderError)) throw err;
      });
      const c = await counts(jsm, s.name);
      assert.equal(c[`${s.name}.created`], 2, "a-1 and b-1 only");
      assert.equal(await a.m.held("o1"), false);
    } finally {
      await a.m.close();
      await b.m.close();
      await nc2.close();
    }
  });

  test("an append the server refuses for its own reason (a message over the stream's max_msg_size) says nothing was stored, and the lease goes on", async () => {
    const s = await stream({ max_msg_size: 1024 });
    const a = await s.open("a");
    try {
      await a.m.guard("o1", async (lease) => {
        await assert.rejects(
          lease.publish(`${s.name}.created`, "x".repeat(2000)),
          (err: Error) => {
            assert.ok(err instanceof UnavailableError, String(err));
            assert.match(err.message, /refused by the server, and nothing/);
            return true;
          },
        );
        lease.throwIfLost();
        assert.ok((await lease.publish(`${s.name}.created`, "small")) > 0);
      });
      assert.equal((await counts(jsm, s.name))[`${s.name}.created`], 1);
    } finally {
      await a.m.close();
    }
  });

  test(
    "a commit of appends lands whole, a stale one is refused whole, and a stream without allow_atomic refuses commits, storing nothing",
    {
      skip: NO_ATOMIC,
    },
    async () => {
      const s = await stream({ allow_atomic: true });
      const a = await s.open("a");
      const b = await s.open("b");
      try {
        await a.m.guard("o1", async (lease) => {
          const res = await lease.commit([
            { publish: `${s.name}.created`, data: "c-1" },
            { publish: `${s.name}.paid`, data: "c-2" },
            { publish: `${s.name}.created`, data: "c-3" },
          ]);
          assert.equal(res.count, 3);
          await jsm.streams.purge(s.name, { filter: `${s.name}.lease.k.o1` });
          await b.m.guard("o1", () => {});
          await assert.rejects(
            lease.commit([
              { publish: `${s.name}.created`, data: "late-1" },
              { publish: `${s.name}.paid`, data: "late-2" },
            ]),
            NotHolderError,
          );
        }).catch((err) => {
          if (!(err instanceof NotHolderError)) throw err;
        });
        const c = await counts(jsm, s.name);
        assert.equal(c[`${s.name}.created`], 2);
        assert.equal(c[`${s.name}.paid`], 1);
      } finally {
        await a.m.close();
        await b.m.close();
      }
      const plain = await stream();
      const p = await plain.open("a");
      try {
        await p.m.guard("o1", async (lease) => {
          await assert.rejects(
            lease.commit([{ publish: `${plain.name}.created`, data: "x" }]),
            (err: Error) =>
              err instanceof TypeError && /allow_atomic/.test(err.message),
          );
        });
        assert.equal(
          (await counts(jsm, plain.name))[`${plain.name}.created`],
          undefined,
        );
      } finally {
        await p.m.close();
      }
    },
  );

  test("a semaphore's slot lease and an owned shard's lease append to the stream, fenced by their tenure (shards)", async () => {
    const s = await stream();
    const a = await s.open("a");
    const stop = new AbortController();
    try {
      const sem = semaphore(a.m, "jobs", { limit: 2 });
      const seq = await sem.guard((slot) =>
        slot.publish(`${s.name}.jobs.${slot.slot}`, "done")
      );
      // The member runs until the end (leaving would hand its shards back).
      let owns!: (owned: ReadonlyMap<number, ShardLease>) => void;
      const all = new Promise<ReadonlyMap<number, ShardLease>>((r) => owns = r);
      const member = (async () => {
        for await (
          const got of shards(a.m, "ingest", { count: 2, signal: stop.signal })
        ) {
          if (got.owned.size === 2) owns(got.owned);
        }
      })().catch(() => {});
      const lease = (await all).get(1)!;
      const seq2 = await lease.publish(`${s.name}.ingest.1`, "x");
      const seq3 = await lease.guard((l) =>
        l.publish(`${s.name}.ingest.1`, "y")
      );
      assert.ok(seq < seq2 && seq2 < seq3, `${seq} ${seq2} ${seq3}`);
      const c = await counts(jsm, s.name);
      assert.equal(
        Object.entries(c).filter(([k]) => k.startsWith(`${s.name}.jobs.`))
          .length,
        1,
      );
      assert.equal(c[`${s.name}.ingest.1`], 2);
      stop.abort();
      await member;
    } finally {
      stop.abort();
      await a.m.close();
    }
  });

  test("a SIGKILLed holder's key is taken as soon as the server says its connection is gone, with no grace", async () => {
    const s = await stream();
    const child = startChild<{ ev: string; epoch?: number }>(CHILD, {
      NATS_URL: ns.url,
      LEASE_STREAM: s.name,
      LEASE_SUBJECTS: `${s.name}.lease`,
      LEASE_NODE: "child",
      LEASE_TTL: String(5000),
      LEASE_KEY: "k",
      DATA_KEY: `${s.name}.log`,
    });
    const nc2 = await connect({ servers: ns.url });
    const m: LeaseManager = await createLeaseManager({
      nc: nc2,
      node: "parent",
      ttl: 5000,
      stream: s.name,
      leaseSubjects: `${s.name}.lease`,
    });
    const found: string[] = [];
    m.addEventListener("acquired", (e) => {
      found.push((e as LeaseAcquiredEvent).found);
    });
    try {
      const { epoch } = await child.until((e) => e.ev === "holding");
      let t0 = 0;
      const taken = m.guard("k", async (lease) => {
        const took = performance.now() - t0;
        await lease.publish(`${s.name}.log`, "parent");
        return { took, epoch: lease.epoch };
      }, { wait: true });
      await new Promise((r) => setTimeout(r, 200));
      t0 = performance.now();
      signal(child.pid, "SIGKILL");
      const got = await taken;
      console.log(
        `taken ${got.took.toFixed(1)} ms after the SIGKILL (TTL 5000 ms)`,
      );
      assert.deepEqual(found, ["crashed"]);
      assert.ok(got.epoch > epoch!);
      assert.ok(got.took < 2500, `taken ${got.took} ms after the SIGKILL`);
      const last = (await jsm.streams.getMessage(s.name, {
        last_by_subj: `${s.name}.log`,
      }))!;
      assert.equal(last.string(), "parent");
    } finally {
      await child.stop();
      await m.close();
      await nc2.close();
    }
  });
});

test(
  "leases in a stream on a server before 2.11.2 are refused before anything is written",
  {
    skip: NEW,
  },
  async () => {
    await using ns = await NatsServer.start();
    const nc = await connect({ servers: ns.url });
    try {
      const jsm = await jetstreamManager(nc);
      await jsm.streams.add({ name: "OLD", subjects: ["old.>"] });
      await assert.rejects(
        createLeaseManager({
          nc,
          node: "a",
          stream: "OLD",
          leaseSubjects: "old.lease",
        }),
        (err: Error) => {
          assert.ok(err instanceof RangeError, String(err));
          assert.match(err.message, /2\.11\.2 or later/);
          return true;
        },
      );
      assert.equal((await jsm.streams.info("OLD")).state.messages, 0);
    } finally {
      await nc.close();
    }
  },
);
