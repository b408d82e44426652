// test.sh: node only: it starts its own servers (2.15.2 and 2.10.22) and holds the simulated server to them; what runs the test does not matter
// Holds the simulator's model of the server's fencing features (sim/kv.ts:
// a check on another subject, per-message TTL with markers, atomic
// batches, and what a server below 2.11 or 2.12 does with them) to real
// nats-server processes: each scenario below runs once against a real
// server (a stream laid out as design/fenced.md's, `KV_<bucket>` with
// subjects `$KV.<bucket>.>`, `allow_msg_ttl`, a 1 s marker TTL,
// `max_msgs_per_subject: 1`, max age 0, and `allow_atomic` on 2.12+) and
// once against SimKv configured as that server, and the two must answer
// alike: each reply normalized (the acknowledged sequence, a conflict with
// the sequence the server names, a refusal's code) and what a direct get
// returns (sequence, KV operation, marker reason).
//
// Where the model cannot match: the moment of an expiry. A real one is
// 0-250 ms late and the polls that wait for it run on the real clock; the
// simulated one is a fixed 100 ms late on virtual time. So a scenario waits
// for a marker by polling (both sides, the same code) and compares what is
// stored then, never when; it compares "not yet expired" only half a TTL
// after the write. Batches are sent as nats.js's batch publisher would,
// first message and commit as requests, the rest without a reply, and
// only those replies are compared.
//
// Each model mutant of sim/kv.ts (KV_FLAWS) is also run against the real
// servers' answers and must differ from them in some scenario.
//
// Runs under node --test (also deno test -A, bun test); about 9 s, most
// of it waiting for expiries.
// PRINT_OUTCOMES=1 prints each real server's outcomes, step by step.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import { headers, type NatsConnection, nuid } from "@nats-io/nats-core";
import {
  jetstream,
  JetStreamApiError,
  type JetStreamClient,
  type JetStreamManager,
  jetstreamManager,
} from "@nats-io/jetstream";
import { NatsServer } from "./test_util/nats_server.ts";
import { versionOf } from "./test_util/lease_helpers.ts";
import {
  KV_FLAWS,
  type KvFlaw,
  type KvPublishResult,
  SimKv,
  type Stored,
} from "./testing/kv.ts";
import { Scheduler } from "./testing/scheduler.ts";
import { Trace } from "./testing/trace.ts";

const bin = (name: string) =>
  fileURLToPath(new URL(`./.tools/bin/${name}`, import.meta.url));
/** The servers, built by scripts/setup.sh. */
const SERVERS = [bin("nats-server"), bin("nats-server-2.10.22")].map((b) => ({
  binary: b,
  version: fs.existsSync(b) ? versionOf(b) : undefined,
}));

/** The marker TTL and the per-message TTL of the scenarios, ms. */
const MARKER_TTL = 1000;
const TTL = 1000;
/** How often a scenario polls while it waits, ms. */
const POLL = 25;

/** A reply as the client reads it. */
type Reply =
  | { ack: number; duplicate?: true; count?: number }
  | { conflict: number }
  | { refused: number };

/** A direct get's answer: the subject's last message, or none. */
type Got = { seq: number; op: string | null; marker: string | null } | null;

/** One message of a scenario. */
interface Msg {
  /** The subject's tail: `$KV.<bucket>.<key>`. */
  readonly key: string;
  /** `Nats-Expected-Last-Subject-Sequence`. */
  readonly expect?: number;
  /** The key whose subject `-Subject` names. */
  readonly on?: string;
  /** `Nats-TTL`, ms. */
  readonly ttl?: number;
  readonly msgId?: string;
  /** A KV delete (`KV-Operation: DEL`): a release. */
  readonly del?: true;
}

/** What a scenario can do, on a real server or on SimKv. */
interface Side {
  readonly version: string;
  pub(m: Msg): Promise<Reply>;
  /** The replies the client gets: the first message's when not empty, then the commit's. */
  batch(ms: readonly Msg[]): Promise<Reply[]>;
  get(key: string): Promise<Got>;
  sleep(ms: number): Promise<void>;
}

/** What a scenario saw, step by step, labelled. */
type Outcome = [string, unknown][];

interface Scenario {
  readonly name: string;
  run(s: Side, out: Outcome): Promise<void>;
}

/** The key's tenure subject and a data key, as design/fenced.md lays them out. */
const LK = "_lease.k.k";
const fenced = (key: string, epoch: number): Msg => ({
  key,
  expect: epoch,
  on: LK,
});

/** Polls `key` until `done` holds or `max` ms (of the side's clock) pass. */
async function waitFor(
  s: Side,
  key: string,
  done: (g: Got) => boolean,
  max: number,
): Promise<Got> {
  let g = await s.get(key);
  for (let waited = 0; !done(g) && waited < max; waited += POLL) {
    await s.sleep(POLL);
    g = await s.get(key);
  }
  return g;
}

const SCENARIOS: readonly Scenario[] = [
  {
    // nats-kv-facts.md §12's A/B example.
    name: "a takeover refuses the old holder's checked write",
    async run(s, out) {
      out.push(["A takes", await s.pub({ key: LK, expect: 0 })]);
      out.push(["A writes", await s.pub(fenced("data.k", 1))]);
      out.push(["A writes again", await s.pub(fenced("data.k", 1))]);
      out.push(["B takes", await s.pub({ key: LK, expect: 1 })]);
      const b = (await s.get(LK))?.seq ?? 0;
      out.push(["A's late write", await s.pub(fenced("data.k", 1))]);
      out.push(["B writes", await s.pub(fenced("data.k", b))]);
      out.push(["data", await s.get("data.k")]);
      out.push(["tenure", await s.get(LK)]);
      // B releases: its tenure entry deleted; its writes stop landing.
      out.push(["B releases", await s.pub({ key: LK, expect: b, del: true })]);
      const released = await s.get(LK);
      out.push(["released", released]);
      out.push(["B's late write", await s.pub(fenced("data.k", b))]);
      const c = { key: LK, expect: released?.seq ?? 0 };
      out.push(["C takes", await s.pub(c)]);
    },
  },
  {
    // A session (design/fenced.md): renewed by compare-and-set with its
    // TTL, which restarts the clock; once it expired, a renewal meets the
    // marker (F3).
    name:
      "a renewal with a TTL restarts its clock, and a renewal after the expiry meets the marker",
    async run(s, out) {
      const LS = "_lease.s.s1";
      out.push(["starts", await s.pub({ key: LS, expect: 0, ttl: TTL })]);
      await s.sleep(0.6 * TTL);
      out.push(["renews", await s.pub({ key: LS, expect: 1, ttl: TTL })]);
      await s.sleep(0.6 * TTL);
      out.push(["1.2 TTL after it started", await s.get(LS)]);
      const m = await waitFor(s, LS, (g) => g?.marker != null, 2 * TTL);
      out.push(["expired", m]);
      out.push(["renews late", await s.pub({ key: LS, expect: 2, ttl: TTL })]);
    },
  },
  {
    name:
      "a check against a subject with no message: expect 0 passes, others name 0",
    async run(s, out) {
      out.push(["expect 0", await s.pub(fenced("data.z", 0))]);
      out.push(["expect 0 again", await s.pub(fenced("data.z", 0))]);
      out.push(["expect 3", await s.pub(fenced("data.y", 3))]);
      out.push(["-Subject alone", await s.pub({ key: "data.x", on: LK })]);
      out.push(["a tenure begins", await s.pub({ key: LK, expect: 0 })]);
      out.push(["expect 0 now", await s.pub(fenced("data.z", 0))]);
      out.push(["data.z", await s.get("data.z")]);
      out.push(["data.y", await s.get("data.y")]);
      out.push(["data.x", await s.get("data.x")]);
    },
  },
  {
    name:
      "a per-message TTL tenure expires into a marker, the data stays, and a CAS on the marker shuts the old holder out",
    async run(s, out) {
      out.push(["TTL below 1 s", await s.pub({ key: "s.x", ttl: 500 })]);
      out.push(["A takes", await s.pub({ key: LK, expect: 0, ttl: TTL })]);
      out.push(["A writes", await s.pub(fenced("data.k", 1))]);
      await s.sleep(TTL / 2);
      out.push(["half a TTL on", await s.get(LK)]);
      // Expiry plus its lateness, well inside the marker's own life.
      const m = await waitFor(s, LK, (g) => g?.marker != null, 2 * TTL);
      out.push(["expired", m]);
      out.push(["B takes", await s.pub({ key: LK, expect: m?.seq ?? 0 })]);
      out.push(["A's late write", await s.pub(fenced("data.k", 1))]);
      out.push(["data", await s.get("data.k")]);
      out.push(["tenure", await s.get(LK)]);
    },
  },
  {
    name:
      "a batch with a fenced first message commits whole; the displaced holder's same batch is refused whole",
    async run(s, out) {
      const batch = (epoch: number) => [
        fenced("data.a", epoch),
        { key: "data.b" },
        { key: "data.c" },
      ];
      out.push(["A takes", await s.pub({ key: LK, expect: 0 })]);
      out.push(["A commits", await s.batch(batch(1))]);
      out.push(["B takes", await s.pub({ key: LK, expect: 1 })]);
      out.push(["A commits late", await s.batch(batch(1))]);
      for (const k of ["data.a", "data.b", "data.c"]) {
        out.push([k, await s.get(k)]);
      }
      // The fence on every message: one commit on 2.12+ (checks on the
      // same other subject may repeat); each message refused on its own
      // below 2.11, instead of the unfenced ones landing.
      const b = (await s.get(LK))?.seq ?? 0;
      out.push([
        "B commits, every message fenced",
        await s.batch(["data.a", "data.b", "data.c"].map((k) => fenced(k, b))),
      ]);
      for (const k of ["data.a", "data.b", "data.c"]) {
        out.push([k, await s.get(k)]);
      }
      // A check against a subject the batch wrote before it.
      out.push([
        "check on its own earlier write",
        await s.batch([{ key: "data.d" }, {
          key: "data.e",
          expect: 0,
          on: "data.d",
        }]),
      ]);
      out.push(["data.d", await s.get("data.d")]);
      out.push(["msg id seen", await s.pub({ key: "data.f", msgId: "m1" })]);
      out.push([
        "batch repeating it",
        await s.batch([{ key: "data.g" }, { key: "data.h", msgId: "m1" }]),
      ]);
      out.push(["data.g", await s.get("data.g")]);
      out.push(["one-message batch", await s.batch([{ key: "data.i" }])]);
    },
  },
];

// ---- The real side.

/** The normalized reply in a JetStream publish acknowledgement or error. */
function replyOf(
  ack: {
    seq?: number;
    duplicate?: boolean;
    count?: number;
    error?: { err_code: number; description: string };
  },
): Reply {
  if (ack.error) return errorReply(ack.error.err_code, ack.error.description);
  return {
    ack: ack.seq!,
    ...(ack.duplicate ? { duplicate: true as const } : {}),
    ...(ack.count !== undefined ? { count: ack.count } : {}),
  };
}

function errorReply(code: number, description: string): Reply {
  // "wrong last sequence: N" names the checked subject's last sequence.
  const m = /^wrong last sequence: (\d+)$/.exec(description);
  return code === 10071 && m ? { conflict: Number(m[1]) } : { refused: code };
}

function headersOf(m: Msg, subject: (key: string) => string) {
  const h = headers();
  if (m.expect !== undefined) {
    h.set("Nats-Expected-Last-Subject-Sequence", String(m.expect));
  }
  if (m.on !== undefined) {
    h.set("Nats-Expected-Last-Subject-Sequence-Subject", subject(m.on));
  }
  if (m.ttl !== undefined) {
    h.set("Nats-TTL", m.ttl % 1000 === 0 ? `${m.ttl / 1000}s` : `${m.ttl}ms`);
  }
  if (m.msgId !== undefined) h.set("Nats-Msg-Id", m.msgId);
  if (m.del) h.set("KV-Operation", "DEL");
  return h;
}

async function realSide(
  nc: NatsConnection,
  js: JetStreamClient,
  jsm: JetStreamManager,
  version: string,
  bucket: string,
): Promise<Side> {
  const stream = `KV_${bucket}`;
  const subject = (key: string) => `$KV.${bucket}.${key}`;
  await jsm.streams.add(
    {
      name: stream,
      subjects: [`$KV.${bucket}.>`],
      max_msgs_per_subject: 1,
      max_age: 0,
      allow_direct: true,
      allow_rollup_hdrs: true,
      allow_msg_ttl: true,
      subject_delete_marker_ttl: MARKER_TTL * 1e6,
      // A server drops the settings it does not know: 2.10.22 keeps none of
      // these three, as SimKv's configuration for it says.
      allow_atomic: true,
    } as Parameters<JetStreamManager["streams"]["add"]>[0],
  );
  const request = async (m: Msg, h: ReturnType<typeof headers>) => {
    const r = await nc.request(subject(m.key), "v", {
      headers: h,
      timeout: 5000,
    });
    return r.data.length === 0 ? undefined : replyOf(r.json());
  };
  return {
    version,
    async pub(m) {
      try {
        return replyOf(
          await js.publish(subject(m.key), "v", {
            headers: headersOf(m, subject),
          }),
        );
      } catch (err) {
        if (!(err instanceof JetStreamApiError)) throw err;
        return errorReply(err.code, err.message);
      }
    },
    async batch(ms) {
      // As nats.js's batch publisher sends one, with the headers set here:
      // its add() ignores `expect` (nats-kv-facts.md §12).
      const id = nuid.next();
      const replies: Reply[] = [];
      for (const [i, m] of ms.entries()) {
        const h = headersOf(m, subject);
        h.set("Nats-Batch-Id", id);
        h.set("Nats-Batch-Sequence", String(i + 1));
        const last = i === ms.length - 1;
        if (last) h.set("Nats-Batch-Commit", "1");
        if (i === 0 || last) {
          const r = await request(m, h);
          if (r !== undefined) replies.push(r);
        } else nc.publish(subject(m.key), "v", { headers: h });
      }
      return replies;
    },
    async get(key) {
      const m = await jsm.direct.getMessage(stream, {
        last_by_subj: subject(key),
      });
      if (!m) return null;
      return {
        seq: m.seq,
        op: m.header?.get("KV-Operation") || null,
        marker: m.header?.get("Nats-Marker-Reason") || null,
      };
    },
    sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
  };
}

// ---- The simulated side.

function simReply(r: KvPublishResult): Reply {
  if (r === "gone") throw new Error("the simulated stream is gone");
  if ("refused" in r) return { refused: r.refused };
  if ("conflict" in r) return { conflict: r.conflict };
  return { ack: r.seq, ...(r.duplicate ? { duplicate: true as const } : {}) };
}

/** Whether `version` is 2.`minor` or later. */
function since(version: string, minor: number): boolean {
  const [major = 0, min = 0] = version.split(".").map(Number);
  return major > 2 || (major === 2 && min >= minor);
}

function simSide(version: string, flaw?: KvFlaw): Side {
  const sched = new Scheduler();
  const bucket = "b";
  const kv = new SimKv(sched, new Trace(false), bucket, {
    maxAge: 0,
    // A server below 2.11 drops the marker TTL and allow_msg_ttl.
    markers: since(version, 11),
    markerTTL: MARKER_TTL,
    late: () => 100,
    lags: [0],
    version,
    msgTTL: since(version, 11),
    atomic: since(version, 12),
    ...(flaw ? { flaw } : {}),
  });
  const write = (m: Msg) => ({
    subject: kv.subject(m.key),
    op: m.del ? "DEL" as const : "PUT" as const,
    value: "v",
    expect: m.expect,
    expectSubject: m.on === undefined ? undefined : kv.subject(m.on),
    ttl: m.ttl,
    msgId: m.msgId,
  });
  const read = (e: Stored | null | "gone"): Got => {
    if (e === "gone") throw new Error("the simulated stream is gone");
    return e && {
      seq: e.seq,
      op: e.operation ?? null,
      marker: e.marker ?? null,
    };
  };
  return {
    version,
    pub: (m) => Promise.resolve(simReply(kv.publish(write(m), "client", 0))),
    batch(ms) {
      const r = kv.batch(ms.map(write), "client", 0);
      if (r === "gone") throw new Error("the simulated stream is gone");
      if ("unbatched" in r) {
        // Each message was a publish of its own; the client asked for the
        // first message's reply and the commit's.
        const asked = r.unbatched.length === 1
          ? r.unbatched
          : [r.unbatched[0]!, r.unbatched.at(-1)!];
        return Promise.resolve(asked.map(simReply));
      }
      // An atomic batch's first message is staged without a reply.
      if ("count" in r) {
        return Promise.resolve([{ ack: r.seq, count: r.count }]);
      }
      return Promise.resolve([simReply(r)]);
    },
    get: (key) => Promise.resolve(read(kv.read(kv.subject(key), undefined, 0))),
    sleep: (ms) => sched.run(sched.now + ms),
  };
}

/** Plays `sc` on `side`: one line per step, so that a failure shows the steps that differ. */
async function play(side: Side, sc: Scenario): Promise<string[]> {
  const out: Outcome = [];
  await sc.run(side, out);
  return out.map(([what, got]) => `${what}: ${JSON.stringify(got)}`);
}

for (const { binary, version } of SERVERS) {
  describe(`SimKv against nats-server ${version ?? binary}`, () => {
    const skip = version === undefined
      ? `${binary} is missing: run scripts/setup.sh`
      : false;
    let ns: NatsServer | undefined;
    let nc: NatsConnection | undefined;
    const real = new Map<Scenario, Promise<string[]>>();
    /** The real server's outcome of `sc`, played once, on its own stream. */
    const onServer = (sc: Scenario) => {
      let p = real.get(sc);
      if (!p) {
        p = (async () => {
          const js = jetstream(nc!);
          const jsm = await jetstreamManager(nc!);
          const bucket = `c${SCENARIOS.indexOf(sc)}`;
          return play(await realSide(nc!, js, jsm, version!, bucket), sc);
        })();
        real.set(sc, p);
      }
      return p;
    };

    before(async () => {
      if (skip) return;
      ns = await NatsServer.start({ binary });
      nc = await connect({ servers: ns.url });
    });
    after(async () => {
      await nc?.close();
      await ns?.[Symbol.asyncDispose]();
    });

    for (const sc of SCENARIOS) {
      test(`SimKv answers as nats-server ${version}: ${sc.name}`, {
        skip,
      }, async () => {
        const want = await onServer(sc);
        if (process.env.PRINT_OUTCOMES) console.log(want.join("\n"));
        assert.deepEqual(await play(simSide(version!), sc), want);
      });
    }

    // The mutants break rules of 2.11+, which an older server ignores.
    if (version === undefined || since(version, 11)) {
      test(
        `each model mutant of SimKv answers otherwise than nats-server ${version} somewhere`,
        {
          skip,
        },
        async () => {
          for (const flaw of KV_FLAWS) {
            const caught: string[] = [];
            for (const sc of SCENARIOS) {
              const got = await play(simSide(version!, flaw), sc);
              try {
                assert.deepEqual(got, await onServer(sc));
              } catch {
                caught.push(sc.name);
              }
            }
            assert.ok(caught.length > 0, `${flaw}: no scenario tells it apart`);
            console.log(
              `  [mutant] ${flaw}: told apart by ${caught.length} scenario(s): ${
                caught.join("; ")
              }`,
            );
          }
        },
      );
    }
  });
}
