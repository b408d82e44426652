// Every input check of every entry point, both sides of each bound: the
// value just outside a bound (and a wrong type, NaN, Infinity, a fraction
// where a whole number is needed) is refused with the documented class and
// a message naming the option and the value, before anything is sent; the
// documented extremes just inside are accepted (the call gets past its
// checks). Entry points: createLeaseManager, the manager's methods,
// semaphore() and its guard and acquire, shards() and a shard lease's
// guard, assignShards, instrument() of ./otel, and the numbers and names
// of the `lease` command line (parse(), which runs before lease connects).
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import type { NatsConnection } from "@nats-io/nats-core";
import {
  assignShards,
  createLeaseManager,
  type LeaseManager,
  type LeaseManagerOptions,
  MAX_SEMAPHORE_LIMIT,
  MAX_SHARDS,
  MIN_TTL,
  semaphore,
  type SemaphoreOptions,
  type ShardLease,
  shards,
  type ShardsOptions,
} from "./mod.ts";
import { maxKeyLength } from "./lease.ts";
import { instrument, type InstrumentOptions } from "./otel.ts";
import { parse, UsageError } from "./cli/args.ts";
import { conn, uniq } from "./test_util/lease_helpers.ts";
import { NatsServer } from "./test_util/nats_server.ts";

const TTL = 1000;
/** The longest timer delay, the upper bound of every duration option. */
const LONGEST = 2 ** 31 - 1;
/** Not an AbortSignal, though shaped like one. */
const notSignal = { aborted: false, addEventListener() {} };

/** A value as a test's name shows it. */
function show(v: unknown): string {
  if (typeof v === "string") return JSON.stringify(v);
  if (v instanceof EventTarget) return "EventTarget";
  if (typeof v === "object" && v !== null) {
    return `{${Object.keys(v).join(", ")}}`;
  }
  return String(v);
}

type ErrorClass = typeof TypeError | typeof RangeError;

/**
 * An assert.rejects/throws check: an instance of `cls` whose message names
 * the option (`'name'`) and the value as received (`shown`).
 */
function refusal(cls: ErrorClass, name: string, shown: string) {
  return (e: unknown): true => {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${String(e)}`);
    assert.ok(
      e.message.includes(`'${name}'`),
      `the message names '${name}': ${e.message}`,
    );
    assert.ok(
      e.message.includes(shown),
      `the message shows ${shown}: ${e.message}`,
    );
    return true;
  };
}

/** Runs `call` as a promise, whether it throws or rejects. */
function settle(call: () => unknown): Promise<unknown> {
  try {
    return Promise.resolve(call());
  } catch (err) {
    return Promise.reject(err);
  }
}

/**
 * A manager whose every method call is recorded and fails: a check that
 * lets bad input through to the manager is seen.
 */
function fakeManager(): { leases: LeaseManager; calls: string[] } {
  const calls: string[] = [];
  const leases = new Proxy({}, {
    get: (_t, p) => (..._args: unknown[]) => {
      calls.push(String(p));
      throw new Error(`called ${String(p)}`);
    },
  }) as LeaseManager;
  return { leases, calls };
}

describe("input checks", () => {
  let ns: NatsServer;
  /** For createLeaseManager: no manager of this file renews on it. */
  let nc: NatsConnection;
  /** The connection of `idle`, a manager that never holds a key. */
  let idleNc: NatsConnection;
  let idle: LeaseManager;
  /** A manager for the calls that are accepted and hold keys. */
  let busy: LeaseManager;
  const bucket = uniq("input");
  const conns: NatsConnection[] = [];

  before(async () => {
    ns = await NatsServer.start();
    nc = await conn(ns.url);
    idleNc = await conn(ns.url);
    const busyNc = await conn(ns.url);
    conns.push(nc, idleNc, busyNc);
    idle = await createLeaseManager({
      nc: idleNc,
      node: "idle",
      ttl: TTL,
      bucket,
    });
    busy = await createLeaseManager({
      nc: busyNc,
      node: "busy",
      ttl: TTL,
      bucket,
      restartGrace: false,
    });
  });

  after(async () => {
    await Promise.allSettled([idle?.close(), busy?.close()]);
    await Promise.allSettled(conns.map((c) => c.close()));
    await ns?.[Symbol.asyncDispose]();
  });

  /** `call` on `idle` is refused as `check` says, and sends nothing. */
  async function refusedOnIdle(
    call: () => unknown,
    check: (e: unknown) => true,
  ): Promise<void> {
    const out = idleNc.stats().outMsgs;
    await assert.rejects(settle(call), check);
    assert.equal(idleNc.stats().outMsgs, out, "nothing was sent");
  }

  describe("createLeaseManager()", () => {
    // [option, value, class, the value as the message shows it]
    const refused: [string, unknown, ErrorClass, string][] = [
      ["nc", undefined, TypeError, "undefined"],
      ["nc", {}, TypeError, "object"],
      ["nc", { request() {} }, TypeError, "object"],
      ["node", undefined, TypeError, "undefined"],
      ["node", "", TypeError, '""'],
      ["node", " \t", TypeError, '" \\t"'],
      ["node", 7, TypeError, "7"],
      ["bucket", "", TypeError, '""'],
      ["bucket", "a.b", TypeError, '"a.b"'],
      ["bucket", "a b", TypeError, '"a b"'],
      ["bucket", "a*", TypeError, '"a*"'],
      ["bucket", 7, TypeError, "7"],
      ["domain", "", TypeError, '""'],
      ["domain", "a.b", TypeError, '"a.b"'],
      ["domain", "a b", TypeError, '"a b"'],
      ["domain", "a*", TypeError, '"a*"'],
      ["domain", "a>", TypeError, '"a>"'],
      ["domain", 7, TypeError, "7"],
      ["ttl", MIN_TTL - 1, RangeError, `received ${MIN_TTL - 1}`],
      ["ttl", 0, RangeError, "received 0"],
      ["ttl", -1, RangeError, "received -1"],
      ["ttl", LONGEST + 1, RangeError, `received ${LONGEST + 1}`],
      ["ttl", NaN, RangeError, "NaN"],
      ["ttl", Infinity, RangeError, "Infinity"],
      ["ttl", "1000", RangeError, '"1000"'],
      ["replicas", 0, RangeError, "received 0"],
      ["replicas", 6, RangeError, "received 6"],
      ["replicas", -1, RangeError, "received -1"],
      ["replicas", 1.5, RangeError, "received 1.5"],
      ["replicas", NaN, RangeError, "NaN"],
      ["replicas", Infinity, RangeError, "Infinity"],
      ["replicas", "3", RangeError, '"3"'],
      ["timeout", 0, RangeError, "received 0"],
      ["timeout", 0.5, RangeError, "received 0.5"],
      ["timeout", TTL + 1, RangeError, `received ${TTL + 1}`],
      ["timeout", NaN, RangeError, "NaN"],
      ["timeout", "100", RangeError, '"100"'],
      ["settleTimeout", -1, RangeError, "received -1"],
      ["settleTimeout", LONGEST + 1, RangeError, `received ${LONGEST + 1}`],
      ["settleTimeout", NaN, RangeError, "NaN"],
      ["settleTimeout", Infinity, RangeError, "Infinity"],
      ["settleTimeout", "0", RangeError, '"0"'],
      ["idleRelease", 0, RangeError, "received 0"],
      ["idleRelease", 0.5, RangeError, "received 0.5"],
      ["idleRelease", LONGEST + 1, RangeError, `received ${LONGEST + 1}`],
      ["idleRelease", NaN, RangeError, "NaN"],
      ["idleRelease", "1", RangeError, '"1"'],
      ["restartGrace", "yes", TypeError, '"yes"'],
      ["restartGrace", 1, TypeError, "1"],
      ["restartGrace", null, TypeError, "null"],
      ["createBucket", "no", TypeError, '"no"'],
      ["createBucket", 0, TypeError, "0"],
      ["allowUnverifiedReplicas", "yes", TypeError, '"yes"'],
      ["allowUnverifiedReplicas", 1, TypeError, "1"],
      ["markers", "no", TypeError, '"no"'],
      ["markers", null, TypeError, "null"],
      ["check", "fast", TypeError, '"fast"'],
      ["check", "", TypeError, '""'],
      ["check", null, TypeError, "null"],
      ["check", 1, TypeError, "1"],
      ["signal", {}, TypeError, "object"],
      ["signal", notSignal, TypeError, "object"],
      ["signal", new EventTarget(), TypeError, "object"],
      ["signal", "abort", TypeError, '"abort"'],
    ];
    for (const [name, value, cls, shown] of refused) {
      test(
        `createLeaseManager() refuses ${name} ${
          show(value)
        } with ${cls.name} naming it, before anything is sent`,
        async () => {
          const out = nc.stats().outMsgs;
          await assert.rejects(
            createLeaseManager(
              {
                nc,
                node: "a",
                ttl: TTL,
                bucket,
                [name]: value,
              } as LeaseManagerOptions,
            ),
            refusal(cls, name, shown),
          );
          assert.equal(nc.stats().outMsgs, out, "nothing was sent");
        },
      );
    }

    test("createLeaseManager() refuses options that are not an object with TypeError naming them", async () => {
      for (const [value, shown] of [[null, "null"], ["x", '"x"']] as const) {
        await assert.rejects(
          createLeaseManager(value as unknown as LeaseManagerOptions),
          refusal(TypeError, "options", shown),
        );
      }
    });

    // [what, options, on a bucket of its own]: each passes the checks and
    // makes a manager.
    const accepted: [string, Partial<LeaseManagerOptions>, boolean][] = [
      ["node of one character", { node: "n" }, false],
      ["bucket of every allowed character", {
        bucket: `Az09-_${uniq("")}`,
      }, true],
      [`ttl ${MIN_TTL} (the least)`, { ttl: MIN_TTL }, true],
      [`ttl ${LONGEST} (the most)`, { ttl: LONGEST }, true],
      ["replicas 1", { replicas: 1 }, true],
      ["timeout 1 (the least)", { timeout: 1 }, false],
      [`timeout ${TTL} (the ttl, the most)`, { timeout: TTL }, false],
      ["settleTimeout 0 (the least)", { settleTimeout: 0 }, false],
      [`settleTimeout ${LONGEST} (the most)`, {
        settleTimeout: LONGEST,
      }, false],
      ["idleRelease 1 (the least)", { idleRelease: 1 }, false],
      [`idleRelease ${LONGEST} (the most)`, { idleRelease: LONGEST }, false],
      ["restartGrace false", { restartGrace: false }, false],
      ["restartGrace true", { restartGrace: true }, false],
      ["createBucket false on a bucket that exists", {
        createBucket: false,
      }, false],
      ["createBucket true", { createBucket: true }, true],
      [
        "allowUnverifiedReplicas true",
        { allowUnverifiedReplicas: true },
        false,
      ],
      ["allowUnverifiedReplicas false", {
        allowUnverifiedReplicas: false,
      }, false],
      ["markers false", { markers: false }, true],
      ["markers true", { markers: true }, false],
      ['check "cas"', { check: "cas" }, false],
      ['check "lease"', { check: "lease" }, false],
      ["an AbortSignal", { signal: new AbortController().signal }, false],
    ];
    for (const [what, opts, own] of accepted) {
      test(`createLeaseManager() accepts ${what}`, async () => {
        const m = await createLeaseManager({
          nc,
          node: "a",
          ttl: TTL,
          bucket: own ? uniq("acc") : bucket,
          ...opts,
        });
        try {
          if (opts.ttl !== undefined) assert.equal(m.ttl, opts.ttl);
          if (opts.bucket !== undefined) assert.equal(m.bucket, opts.bucket);
        } finally {
          await m.close();
        }
      });
    }

    test("createLeaseManager() takes replicas 5 (the most) past its checks: a single server then refuses the stream, not with the RangeError of 'replicas'", async () => {
      const out = nc.stats().outMsgs;
      await assert.rejects(
        createLeaseManager({
          nc,
          node: "a",
          ttl: TTL,
          bucket: uniq("r5"),
          replicas: 5,
        }),
        (e) => {
          assert.ok(e instanceof Error);
          assert.ok(
            !(e instanceof RangeError && /'replicas'/.test(e.message)),
            `refused by the option check: ${e.message}`,
          );
          return true;
        },
      );
      assert.ok(nc.stats().outMsgs > out, "it asked the server");
    });

    test("createLeaseManager() takes a domain with every character a subject token allows past its checks: no server answers for it", async () => {
      const out = nc.stats().outMsgs;
      await assert.rejects(
        createLeaseManager({ nc, node: "a", ttl: TTL, domain: "hub-1_9" }),
        (e) => {
          assert.ok(!(e instanceof TypeError), String(e));
          assert.match((e as Error).message, /domain 'hub-1_9'/);
          return true;
        },
      );
      assert.ok(nc.stats().outMsgs > out, "it asked the server");
    });
  });

  describe("the manager's methods", () => {
    // [call, option, class, the value as shown]: each on the idle manager.
    const refused: [
      string,
      (m: LeaseManager) => unknown,
      string,
      ErrorClass,
      string,
    ][] = [];
    const write = () => {
      throw new Error("the write ran");
    };
    for (const key of ["", "a.", ".a", "a..b", "a b", "a*", "a>", 42]) {
      const shown = typeof key === "string" ? JSON.stringify(key) : "42";
      const k = key as string;
      refused.push(
        [
          `guard() key ${shown}`,
          (m) => m.guard(k, write),
          "key",
          TypeError,
          shown,
        ],
        [`held() key ${shown}`, (m) => m.held(k), "key", TypeError, shown],
        [`holder() key ${shown}`, (m) => m.holder(k), "key", TypeError, shown],
        [
          `holders() prefix ${shown}`,
          (m) => m.holders(k),
          "key",
          TypeError,
          shown,
        ],
        [
          `release() key ${shown}`,
          (m) => m.release(k),
          "key",
          TypeError,
          shown,
        ],
        [
          `campaign() key ${shown}`,
          (m) => m.campaign(k),
          "key",
          TypeError,
          shown,
        ],
        [`watch() key ${shown}`, (m) => m.watch(k), "key", TypeError, shown],
      );
    }
    const bad = <T>(v: unknown) => v as T;
    refused.push(
      [
        'guard() write "nope"',
        (m) => m.guard("k", bad("nope")),
        "write",
        TypeError,
        '"nope"',
      ],
      [
        "guard() write undefined",
        (m) => m.guard("k", bad(undefined)),
        "write",
        TypeError,
        "undefined",
      ],
      [
        'guard() wait "yes"',
        (m) => m.guard("k", write, { wait: bad("yes") }),
        "wait",
        TypeError,
        '"yes"',
      ],
      [
        "guard() wait 1",
        (m) => m.guard("k", write, { wait: bad(1) }),
        "wait",
        TypeError,
        "1",
      ],
      [
        "guard() wait null",
        (m) => m.guard("k", write, { wait: bad(null) }),
        "wait",
        TypeError,
        "null",
      ],
      [
        'guard() check "fast"',
        (m) => m.guard("k", write, { check: bad("fast") }),
        "check",
        TypeError,
        '"fast"',
      ],
      [
        "guard() check null",
        (m) => m.guard("k", write, { check: bad(null) }),
        "check",
        TypeError,
        "null",
      ],
      [
        "guard() signal {}",
        (m) => m.guard("k", write, { signal: bad({}) }),
        "signal",
        TypeError,
        "object",
      ],
      [
        "guard() signal shaped like one",
        (m) => m.guard("k", write, { signal: bad(notSignal) }),
        "signal",
        TypeError,
        "object",
      ],
      [
        "guard() signal {} with wait",
        (m) => m.guard("k", write, { wait: true, signal: bad({}) }),
        "signal",
        TypeError,
        "object",
      ],
      [
        'guard() signal {} with check "lease"',
        (m) => m.guard("k", write, { check: "lease", signal: bad({}) }),
        "signal",
        TypeError,
        "object",
      ],
      [
        "campaign() signal {}",
        (m) => m.campaign("k", { signal: bad({}) }),
        "signal",
        TypeError,
        "object",
      ],
      [
        "campaign() signal shaped like one",
        (m) => m.campaign("k", { signal: bad(notSignal) }),
        "signal",
        TypeError,
        "object",
      ],
      [
        "watch() signal {}",
        (m) => m.watch("k", { signal: bad({}) }),
        "signal",
        TypeError,
        "object",
      ],
      [
        "watch() signal shaped like one",
        (m) => m.watch("k", { signal: bad(notSignal) }),
        "signal",
        TypeError,
        "object",
      ],
      [
        "health() margin -1",
        (m) => m.health({ margin: -1 }),
        "margin",
        RangeError,
        "-1",
      ],
      [
        "health() margin -0.5",
        (m) => m.health({ margin: -0.5 }),
        "margin",
        RangeError,
        "-0.5",
      ],
      [
        "health() margin NaN",
        (m) => m.health({ margin: NaN }),
        "margin",
        RangeError,
        "NaN",
      ],
      [
        "health() margin -Infinity",
        (m) => m.health({ margin: -Infinity }),
        "margin",
        RangeError,
        "-Infinity",
      ],
      [
        'health() margin "10"',
        (m) => m.health({ margin: bad("10") }),
        "margin",
        RangeError,
        "10",
      ],
    );
    for (const [what, call, name, cls, shown] of refused) {
      test(`LeaseManager.${what} is refused with ${cls.name} naming '${name}', before anything is sent`, async () => {
        await refusedOnIdle(() => call(idle), refusal(cls, name, shown));
      });
    }

    test('LeaseManager.guard() refuses a signal that is not an AbortSignal on a key it holds, also with check "lease", and sends nothing', async () => {
      // A held key takes the no-regex path (and, with "lease", no round trip).
      await busy.guard("held-k", () => {});
      for (const check of ["cas", "lease"] as const) {
        let ran = false;
        await assert.rejects(
          busy.guard("held-k", () => {
            ran = true;
          }, { check, signal: {} as AbortSignal }),
          refusal(TypeError, "signal", "object"),
        );
        assert.equal(ran, false);
      }
      await busy.release("held-k");
    });

    test('LeaseManager.guard() accepts keys of one character and of every allowed character, wait true and false, check "cas" and "lease", and an AbortSignal', async () => {
      const signal = new AbortController().signal;
      for (const key of ["a", "Az09-_/=.b-_/="]) {
        for (
          const options of [
            undefined,
            { wait: false },
            { wait: true },
            { check: "cas" as const },
            { check: "lease" as const },
            { signal },
            { wait: true, signal, check: "lease" as const },
          ]
        ) {
          assert.equal(await busy.guard(key, () => key, options), key);
        }
        assert.equal(await busy.held(key), true);
        assert.equal((await busy.holder(key))?.node, "busy");
        await busy.release(key);
      }
      assert.ok((await busy.holders("Az09-_/=")) instanceof Map);
    });

    test("LeaseManager.campaign() and watch() accept an AbortSignal", async () => {
      const c = new AbortController();
      for await (const lease of busy.campaign("camp", { signal: c.signal })) {
        assert.equal(lease.key, "camp");
        break;
      }
      for await (const h of busy.watch("camp", { signal: c.signal })) {
        assert.ok(h === null || h.node === "busy");
        break;
      }
      c.abort();
    });

    test("LeaseManager.health() accepts margin 0 (the least) and one past the longest timer", () => {
      for (const margin of [0, LONGEST + 1]) {
        assert.equal(typeof idle.health({ margin }).ok, "boolean");
      }
    });
  });

  describe("key length", () => {
    // Bucket `leases`, whose figure the docs give: keys of up to 3967
    // characters. nats-server closes the connection on a control line over
    // 4096 bytes; the longest a key goes into is the request that creates a
    // watch's consumer (see maxKeyLength in lease/input.ts). Measured on
    // 2.15.2 and 2.9.10 with the check taken out: a watch works up to 3982
    // characters (its consumer's first serial, 1, one digit), and from 3983
    // the server drops the connection and the watch never hears of a
    // change; 3967 leaves the room of 2^53 re-creations of the consumer.
    const MAX = 3967;
    let keyNc: NatsConnection;
    let long: LeaseManager;
    before(async () => {
      keyNc = await conn(ns.url);
      conns.push(keyNc);
      long = await createLeaseManager({
        nc: keyNc,
        node: "long",
        ttl: TTL,
        bucket: "leases",
        restartGrace: false,
      });
    });
    after(async () => {
      await long?.close();
    });

    /** `call` on `long` is refused as `check` says, and sends nothing. */
    async function refusedOnLong(
      call: () => unknown,
      check: (e: unknown) => true,
    ): Promise<void> {
      const out = keyNc.stats().outMsgs;
      await assert.rejects(settle(call), check);
      assert.equal(keyNc.stats().outMsgs, out, "nothing was sent");
    }

    /** A TypeError naming the option, the limit and the length. */
    const tooLong = (name: string, max: number, length: number) =>
    (
      e: unknown,
    ): true => {
      assert.ok(e instanceof TypeError, String(e));
      assert.match(e.message, new RegExp(`'${name}' must be at most ${max} `));
      assert.match(e.message, new RegExp(`\\(${length} characters\\)`));
      assert.match(e.message, /4096-byte control line/);
      return true;
    };

    /** The next value of `it`, or a failure after 5 s. */
    async function next<T>(it: AsyncIterator<T>, what: string): Promise<T> {
      let timer: ReturnType<typeof setTimeout> | undefined;
      try {
        const r = await Promise.race([
          it.next(),
          new Promise<never>((_, reject) => {
            timer = setTimeout(
              () => reject(new Error(`no ${what} within 5 s`)),
              5_000,
            );
          }),
        ]);
        assert.ok(!r.done, `${what}: the iteration ended`);
        return r.value;
      } finally {
        clearTimeout(timer);
      }
    }

    test(`maxKeyLength() is ${MAX} on bucket 'leases'; each character of the bucket takes two, a domain its length plus one, a longer inbox prefix its extra length`, () => {
      assert.equal(maxKeyLength("leases"), MAX);
      assert.equal(maxKeyLength("leases", "$JS.API", "_INBOX"), MAX);
      assert.equal(maxKeyLength("b"), MAX + 10);
      assert.equal(maxKeyLength("leases", "$JS.hub.API"), MAX - 4);
      assert.equal(maxKeyLength("leases", "$JS.API", "_LEASE_INBOX"), MAX - 6);
    });

    test(`LeaseManager: a key of ${MAX} characters, the longest on bucket 'leases', works end to end: a watch sees guard() take it, held(), holder(), holders(), release(), then campaign() wins it; the connection never drops`, async () => {
      const key = "k".repeat(MAX);
      const drops: string[] = [];
      const status = keyNc.status();
      void (async () => {
        for await (const s of status) {
          if (s.type === "disconnect" || s.type === "error") drops.push(s.type);
        }
      })();
      const stop = new AbortController();
      try {
        const watch = long.watch(key, { signal: stop.signal })[
          Symbol.asyncIterator
        ]();
        assert.equal(await next(watch, "first holder"), null);
        // The consumer behind the watch is created (its request holds the
        // key) before the guard, whose entry it then reports.
        const epoch = await long.guard(key, (l) => l.epoch, { wait: true });
        assert.deepEqual(await next(watch, "change of holder"), {
          node: "long",
          epoch,
        });
        assert.equal(await long.held(key), true);
        assert.deepEqual(await long.holder(key), { node: "long", epoch });
        assert.equal((await long.holders(key)).size, 0);
        await long.release(key);
        for await (const lease of long.campaign(key, { signal: stop.signal })) {
          assert.equal(lease.key, key);
          assert.ok(lease.epoch > epoch);
          break;
        }
        await long.release(key);
      } finally {
        stop.abort();
        (status as { stop?: () => void }).stop?.();
      }
      assert.deepEqual(drops, [], "the connection dropped");
    });

    for (
      const [what, call] of [
        ["guard()", (k: string) => long.guard(k, () => {})],
        [
          "guard() with wait",
          (k: string) => long.guard(k, () => {}, { wait: true }),
        ],
        ["held()", (k: string) => long.held(k)],
        ["holder()", (k: string) => long.holder(k)],
        ["holders()", (k: string) => long.holders(k)],
        ["release()", (k: string) => long.release(k)],
        ["campaign()", (k: string) => long.campaign(k)],
        ["watch()", (k: string) => long.watch(k)],
      ] as const
    ) {
      test(
        `LeaseManager.${what} refuses a key of ${
          MAX + 1
        } characters on bucket 'leases' with TypeError naming the limit and the length, before anything is sent`,
        async () => {
          await refusedOnLong(
            () => call("k".repeat(MAX + 1)),
            tooLong("key", MAX, MAX + 1),
          );
        },
      );
    }

    test(
      `semaphore() takes a name of ${
        MAX - 36
      } characters (its keys add up to 36) and guards a slot under it; one of ${
        MAX - 35
      } is refused with TypeError naming 'name', also through instrument(), before anything is sent`,
      async () => {
        const name = "s".repeat(MAX - 36);
        const sem = semaphore(long, name, { limit: 2 });
        assert.equal(
          await sem.guard(({ key }) => key),
          `${name}.n2.0`,
        );
        await refusedOnLong(
          () => semaphore(long, `${name}s`, { limit: 2 }),
          tooLong("name", MAX - 36, MAX - 35),
        );
        await refusedOnLong(
          () => semaphore(instrument(long), `${name}s`, { limit: 2 }),
          tooLong("name", MAX - 36, MAX - 35),
        );
      },
    );

    test(
      `shards() takes a group as long as its longest key allows (${
        MAX - 14
      } characters with count 4 and 16 member slots: '.members.15.n4' adds 14) and assigns its shards; one character more is refused with TypeError naming 'group' when iterating starts, before anything is sent`,
      async () => {
        const group = "g".repeat(MAX - 14);
        const stop = new AbortController();
        try {
          const it = shards(long, group, { count: 4, signal: stop.signal })[
            Symbol.asyncIterator
          ]();
          // The only member: every shard comes to it, in one or more steps.
          while ((await next(it, "assignment")).owned.size < 4);
        } finally {
          stop.abort();
        }
        await refusedOnLong(
          () => shards(long, `${group}g`, { count: 4 })[Symbol.asyncIterator](),
          tooLong("group", MAX - 14, MAX - 13),
        );
        await refusedOnLong(
          () =>
            shards(instrument(long), `${group}g`, { count: 4 })[
              Symbol.asyncIterator
            ](),
          tooLong("group", MAX - 14, MAX - 13),
        );
      },
    );
  });

  describe("semaphore()", () => {
    // [what, arguments, option, class, the value as shown]
    const okLeases = () => fakeManager().leases;
    const refused: [
      string,
      () => [unknown, unknown, unknown],
      string,
      ErrorClass,
      string,
    ][] = [
      [
        "leases null",
        () => [null, "s", { limit: 1 }],
        "leases",
        TypeError,
        "null",
      ],
      [
        "leases {}",
        () => [{}, "s", { limit: 1 }],
        "leases",
        TypeError,
        "object",
      ],
      [
        "leases without holders()",
        () => [{ guard() {} }, "s", { limit: 1 }],
        "leases",
        TypeError,
        "object",
      ],
      [
        'name ""',
        () => [okLeases(), "", { limit: 1 }],
        "name",
        TypeError,
        '""',
      ],
      [
        'name "a."',
        () => [okLeases(), "a.", { limit: 1 }],
        "name",
        TypeError,
        '"a."',
      ],
      [
        'name "a b"',
        () => [okLeases(), "a b", { limit: 1 }],
        "name",
        TypeError,
        '"a b"',
      ],
      ["name 7", () => [okLeases(), 7, { limit: 1 }], "name", TypeError, "7"],
      [
        "options undefined",
        () => [okLeases(), "s", undefined],
        "options",
        TypeError,
        "undefined",
      ],
      [
        "options null",
        () => [okLeases(), "s", null],
        "options",
        TypeError,
        "null",
      ],
      ["options 3", () => [okLeases(), "s", 3], "options", TypeError, "3"],
      [
        "limit 0",
        () => [okLeases(), "s", { limit: 0 }],
        "limit",
        RangeError,
        "received 0",
      ],
      [
        `limit ${MAX_SEMAPHORE_LIMIT + 1}`,
        () => [okLeases(), "s", { limit: MAX_SEMAPHORE_LIMIT + 1 }],
        "limit",
        RangeError,
        `received ${MAX_SEMAPHORE_LIMIT + 1}`,
      ],
      [
        "limit -1",
        () => [okLeases(), "s", { limit: -1 }],
        "limit",
        RangeError,
        "received -1",
      ],
      [
        "limit 1.5",
        () => [okLeases(), "s", { limit: 1.5 }],
        "limit",
        RangeError,
        "received 1.5",
      ],
      [
        "limit NaN",
        () => [okLeases(), "s", { limit: NaN }],
        "limit",
        RangeError,
        "NaN",
      ],
      [
        "limit Infinity",
        () => [okLeases(), "s", { limit: Infinity }],
        "limit",
        RangeError,
        "Infinity",
      ],
      [
        'limit "3"',
        () => [okLeases(), "s", { limit: "3" }],
        "limit",
        RangeError,
        '"3"',
      ],
      [
        "limit missing",
        () => [okLeases(), "s", {}],
        "limit",
        RangeError,
        "undefined",
      ],
      [
        'resize "yes"',
        () => [okLeases(), "s", { limit: 1, resize: "yes" }],
        "resize",
        TypeError,
        '"yes"',
      ],
      [
        "resize null",
        () => [okLeases(), "s", { limit: 1, resize: null }],
        "resize",
        TypeError,
        "null",
      ],
    ];
    for (const [what, args, name, cls, shown] of refused) {
      test(`semaphore() refuses ${what} with ${cls.name} naming '${name}'`, () => {
        const [leases, sName, options] = args();
        assert.throws(
          () =>
            semaphore(
              leases as LeaseManager,
              sName as string,
              options as SemaphoreOptions,
            ),
          refusal(cls, name, shown),
        );
      });
    }

    test(`semaphore() accepts limit 1 and ${MAX_SEMAPHORE_LIMIT} (the bounds), resize true and false, a name of one character, and sends nothing`, () => {
      const out = idleNc.stats().outMsgs;
      for (
        const options of [
          { limit: 1 },
          { limit: MAX_SEMAPHORE_LIMIT },
          { limit: 2, resize: true },
          { limit: 2, resize: false },
        ]
      ) {
        assert.equal(semaphore(idle, "s", options).limit, options.limit);
      }
      assert.equal(semaphore(idle, "a", { limit: 1 }).name, "a");
      assert.equal(idleNc.stats().outMsgs, out, "nothing was sent");
    });

    const write = () => {
      throw new Error("the write ran");
    };
    const bad = <T>(v: unknown) => v as T;
    const calls: [
      string,
      (s: ReturnType<typeof semaphore>) => Promise<unknown>,
      string,
      string,
    ][] = [
      ['guard() write "nope"', (s) => s.guard(bad("nope")), "write", '"nope"'],
      [
        "guard() options null",
        (s) => s.guard(write, bad(null)),
        "options",
        "null",
      ],
      [
        'guard() options "x"',
        (s) => s.guard(write, bad("x")),
        "options",
        '"x"',
      ],
      [
        'guard() wait "yes"',
        (s) => s.guard(write, { wait: bad("yes") }),
        "wait",
        '"yes"',
      ],
      ["guard() wait 1", (s) => s.guard(write, { wait: bad(1) }), "wait", "1"],
      [
        "guard() signal {}",
        (s) => s.guard(write, { signal: bad({}) }),
        "signal",
        "object",
      ],
      [
        "guard() signal shaped like one",
        (s) => s.guard(write, { signal: bad(notSignal) }),
        "signal",
        "object",
      ],
      [
        "guard() signal EventTarget",
        (s) => s.guard(write, { signal: bad(new EventTarget()) }),
        "signal",
        "object",
      ],
      [
        "guard() signal {} with wait",
        (s) => s.guard(write, { wait: true, signal: bad({}) }),
        "signal",
        "object",
      ],
      [
        'guard() check "fast"',
        (s) => s.guard(write, { check: bad("fast") }),
        "check",
        '"fast"',
      ],
      [
        "guard() check null",
        (s) => s.guard(write, { check: bad(null) }),
        "check",
        "null",
      ],
      [
        "acquire() options null",
        (s) => s.acquire(bad(null)),
        "options",
        "null",
      ],
      [
        "acquire() signal {}",
        (s) => s.acquire({ signal: bad({}) }),
        "signal",
        "object",
      ],
      [
        "acquire() signal shaped like one",
        (s) => s.acquire({ signal: bad(notSignal) }),
        "signal",
        "object",
      ],
    ];
    for (const [what, call, name, shown] of calls) {
      test(`Semaphore.${what} is refused with TypeError naming '${name}', before anything is sent`, async () => {
        const sem = semaphore(idle, uniq("sem"), { limit: 2 });
        await refusedOnIdle(() => call(sem), refusal(TypeError, name, shown));
      });
    }

    test('Semaphore.guard() accepts wait true and false, check "cas" and "lease" and an AbortSignal; acquire() an AbortSignal', async () => {
      const sem = semaphore(busy, uniq("sem"), { limit: 1 });
      const signal = new AbortController().signal;
      for (
        const options of [
          {},
          { wait: false },
          { wait: true },
          { check: "cas" as const },
          { check: "lease" as const },
          { signal },
          { wait: true, signal, check: "lease" as const },
        ]
      ) {
        assert.equal(await sem.guard((l) => l.slot, options), 0);
      }
      const slot = await sem.acquire({ signal });
      assert.equal(slot.slot, 0);
      await slot.release();
    });
  });

  describe("shards()", () => {
    const bad = <T>(v: unknown) => v as T;
    // [what, arguments, option, class, the value as shown]
    const refused: [
      string,
      (l: LeaseManager) => [unknown, unknown, unknown],
      string,
      ErrorClass,
      string,
    ][] = [
      [
        "leases null",
        () => [null, "g", { count: 4 }],
        "leases",
        TypeError,
        "null",
      ],
      [
        "leases {}",
        () => [{}, "g", { count: 4 }],
        "leases",
        TypeError,
        "object",
      ],
      ['group ""', (l) => [l, "", { count: 4 }], "group", TypeError, '""'],
      [
        'group "a."',
        (l) => [l, "a.", { count: 4 }],
        "group",
        TypeError,
        '"a."',
      ],
      [
        'group "a b"',
        (l) => [l, "a b", { count: 4 }],
        "group",
        TypeError,
        '"a b"',
      ],
      ["group 7", (l) => [l, 7, { count: 4 }], "group", TypeError, "7"],
      [
        "options undefined",
        (l) => [l, "g", undefined],
        "options",
        TypeError,
        "undefined",
      ],
      ["options null", (l) => [l, "g", null], "options", TypeError, "null"],
      ['count "4"', (l) => [l, "g", { count: "4" }], "count", TypeError, '"4"'],
      ["count missing", (l) => [l, "g", {}], "count", TypeError, "undefined"],
      [
        "count 0",
        (l) => [l, "g", { count: 0 }],
        "count",
        RangeError,
        "received 0",
      ],
      [
        `count ${MAX_SHARDS + 1}`,
        (l) => [l, "g", { count: MAX_SHARDS + 1 }],
        "count",
        RangeError,
        `received ${MAX_SHARDS + 1}`,
      ],
      [
        "count 2.5",
        (l) => [l, "g", { count: 2.5 }],
        "count",
        RangeError,
        "received 2.5",
      ],
      [
        "count NaN",
        (l) => [l, "g", { count: NaN }],
        "count",
        RangeError,
        "NaN",
      ],
      [
        "count Infinity",
        (l) => [l, "g", { count: Infinity }],
        "count",
        RangeError,
        "Infinity",
      ],
      [
        'maxMembers "16"',
        (l) => [l, "g", { count: 4, maxMembers: "16" }],
        "maxMembers",
        TypeError,
        '"16"',
      ],
      [
        "maxMembers 0",
        (l) => [l, "g", { count: 4, maxMembers: 0 }],
        "maxMembers",
        RangeError,
        "received 0",
      ],
      [
        "maxMembers 257",
        (l) => [l, "g", { count: 4, maxMembers: 257 }],
        "maxMembers",
        RangeError,
        "received 257",
      ],
      [
        "maxMembers 1.5",
        (l) => [l, "g", { count: 4, maxMembers: 1.5 }],
        "maxMembers",
        RangeError,
        "received 1.5",
      ],
      [
        "maxMembers NaN",
        (l) => [l, "g", { count: 4, maxMembers: NaN }],
        "maxMembers",
        RangeError,
        "NaN",
      ],
      [
        "signal {}",
        (l) => [l, "g", { count: 4, signal: {} }],
        "signal",
        TypeError,
        "object",
      ],
      [
        "signal shaped like one",
        (l) => [l, "g", { count: 4, signal: notSignal }],
        "signal",
        TypeError,
        "object",
      ],
    ];
    for (const [what, args, name, cls, shown] of refused) {
      test(`shards() refuses ${what} with ${cls.name} naming '${name}', calling nothing on the manager`, () => {
        const { leases, calls } = fakeManager();
        const [l, group, options] = args(leases);
        assert.throws(
          () =>
            shards(
              l as LeaseManager,
              group as string,
              bad<ShardsOptions>(options),
            ),
          refusal(cls, name, shown),
        );
        assert.deepEqual(calls, []);
      });
    }

    test(`shards() accepts count 1 and ${MAX_SHARDS}, maxMembers 1 and 256 (the bounds), an AbortSignal and a group of one character, calling nothing on the manager`, () => {
      const { leases, calls } = fakeManager();
      for (
        const options of [
          { count: 1 },
          { count: MAX_SHARDS },
          { count: 4, maxMembers: 1 },
          { count: 4, maxMembers: 256 },
          { count: MAX_SHARDS, maxMembers: 256 },
          { count: 4, signal: new AbortController().signal },
        ]
      ) {
        const it = shards(leases, "g", options);
        assert.equal(typeof it[Symbol.asyncIterator], "function");
      }
      shards(leases, "a", { count: 1 });
      assert.deepEqual(calls, []);
    });

    describe("ShardLease.guard()", () => {
      const stop = new AbortController();
      let lease: ShardLease;
      let iterating: Promise<void>;
      before(async () => {
        const it = shards(busy, uniq("grp"), {
          count: 1,
          maxMembers: 1,
          signal: stop.signal,
        })[Symbol.asyncIterator]();
        for (;;) {
          const { value, done } = await it.next();
          assert.ok(!done, "the iteration ended");
          const l = value.owned.get(0);
          if (l !== undefined) {
            lease = l;
            break;
          }
        }
        // Keep the member iterating (and its shard owned) until after().
        iterating = (async () => {
          while (!(await it.next()).done);
        })().catch(() => {});
      });
      after(async () => {
        stop.abort();
        await iterating;
      });

      const write = () => {
        throw new Error("the write ran");
      };
      const calls: [
        string,
        (l: ShardLease) => Promise<unknown>,
        string,
        string,
      ][] = [
        ['write "nope"', (l) => l.guard(bad("nope")), "write", '"nope"'],
        ["options null", (l) => l.guard(write, bad(null)), "options", "null"],
        [
          "signal {}",
          (l) => l.guard(write, { signal: bad({}) }),
          "signal",
          "object",
        ],
        [
          "signal shaped like one",
          (l) => l.guard(write, { signal: bad(notSignal) }),
          "signal",
          "object",
        ],
        [
          'check "fast"',
          (l) => l.guard(write, { check: bad("fast") }),
          "check",
          '"fast"',
        ],
      ];
      for (const [what, call, name, shown] of calls) {
        test(`ShardLease.guard() refuses ${what} with TypeError naming '${name}'`, async () => {
          await assert.rejects(
            settle(() => call(lease)),
            refusal(TypeError, name, shown),
          );
        });
      }

      test('ShardLease.guard() accepts an AbortSignal and check "cas" and "lease"', async () => {
        const signal = new AbortController().signal;
        for (
          const options of [
            undefined,
            { signal },
            { check: "cas" as const },
            { signal, check: "lease" as const },
          ]
        ) {
          assert.equal(await lease.guard((l) => l.epoch, options), lease.epoch);
        }
      });
    });
  });

  describe("assignShards()", () => {
    const members257 = Array.from({ length: 257 }, (_, i) => `m${i}`);
    const refused: [string, unknown, unknown, string, ErrorClass, string][] = [
      ['count "4"', "4", ["a"], "count", TypeError, '"4"'],
      ["count missing", undefined, ["a"], "count", TypeError, "undefined"],
      ["count 0", 0, ["a"], "count", RangeError, "received 0"],
      [
        `count ${MAX_SHARDS + 1}`,
        MAX_SHARDS + 1,
        ["a"],
        "count",
        RangeError,
        `received ${MAX_SHARDS + 1}`,
      ],
      ["count 2.5", 2.5, ["a"], "count", RangeError, "received 2.5"],
      ["count NaN", NaN, ["a"], "count", RangeError, "NaN"],
      ["count Infinity", Infinity, ["a"], "count", RangeError, "Infinity"],
      ['members "a"', 4, "a", "members", TypeError, '"a"'],
      ["members null", 4, null, "members", TypeError, "null"],
      ['members [""]', 4, [""], "members", TypeError, '[""]'],
      ['members ["a", 7]', 4, ["a", 7], "members", TypeError, '["a", 7]'],
      [
        `count ${MAX_SHARDS} with 257 members`,
        MAX_SHARDS,
        members257,
        "count",
        RangeError,
        `${MAX_SHARDS} × 257`,
      ],
    ];
    for (const [what, count, members, name, cls, shown] of refused) {
      test(`assignShards() refuses ${what} with ${cls.name} naming '${name}'`, () => {
        assert.throws(
          () => assignShards(count as number, members as string[]),
          refusal(cls, name, shown),
        );
      });
    }

    test(`assignShards() accepts count 1 and ${MAX_SHARDS}, no members, and ${MAX_SHARDS} shards over 256 members (the most pairs)`, () => {
      const one = assignShards(1, ["a", "b"]);
      assert.deepEqual([...one.values()].flat(), [0]);
      assert.equal(
        assignShards(MAX_SHARDS, ["a"]).get("a")!.length,
        MAX_SHARDS,
      );
      assert.equal(assignShards(4, []).size, 0);
      const members = Array.from({ length: 256 }, (_, i) => `m${i}`);
      const out = assignShards(MAX_SHARDS, members);
      assert.equal(out.size, 256);
      for (const s of out.values()) assert.equal(s.length, MAX_SHARDS / 256);
    });
  });

  describe("instrument()", () => {
    const refused: [string, InstrumentOptions, string, string][] = [
      ['check "fast"', { check: "fast" as "cas" }, "check", '"fast"'],
      [
        'perKey "yes"',
        { perKey: "yes" as unknown as boolean },
        "perKey",
        '"yes"',
      ],
      ["perKey 1", { perKey: 1 as unknown as boolean }, "perKey", "1"],
      [
        "leaseDurations 0",
        { leaseDurations: 0 as unknown as boolean },
        "leaseDurations",
        "0",
      ],
      [
        'attributes "x"',
        { attributes: "x" as unknown as Record<string, string> },
        "attributes",
        "x",
      ],
      [
        "attributes []",
        { attributes: [] as unknown as Record<string, string> },
        "attributes",
        "an array",
      ],
      [
        "attributes null",
        { attributes: null as unknown as Record<string, string> },
        "attributes",
        "null",
      ],
      ["an attribute NaN", { attributes: { a: NaN } }, "a", "NaN"],
      [
        "an attribute Infinity",
        { attributes: { a: Infinity } },
        "a",
        "Infinity",
      ],
      ["an attribute {}", { attributes: { a: {} as string } }, "a", "{}"],
      [
        "an attribute null",
        { attributes: { a: null as unknown as string } },
        "a",
        "null",
      ],
      [
        "an attribute of its own",
        { attributes: { "lease.key": "x" } },
        "lease.key",
        "instrumentation",
      ],
    ];
    for (const [what, options, name, shown] of refused) {
      test(`instrument() refuses ${what} with TypeError naming '${name}'`, async () => {
        await refusedOnIdle(
          () => instrument(idle, options),
          refusal(TypeError, name, shown),
        );
      });
    }

    test('instrument() accepts check "cas" and "lease", perKey and leaseDurations true and false, and string, finite number and boolean attributes', () => {
      for (
        const options of [
          undefined,
          {},
          { check: "cas" as const },
          { check: "lease" as const },
          { perKey: true, leaseDurations: true },
          { perKey: false, leaseDurations: false },
          { attributes: {} },
          { attributes: { s: "", n: -Number.MAX_VALUE, z: 0, b: false } },
        ]
      ) {
        instrument(idle, options).stop();
      }
    });
  });

  describe("lease command line", () => {
    const EXIT_USAGE = 64;
    const EXIT_BAD_DURATION = 66;
    const run = (...opts: string[]) => ["run", "k", ...opts, "--", "true"];
    const sh = (...opts: string[]) => ["shards", "g", "--count", "4", ...opts];
    // [arguments, exit status, the message]
    const refused: [string[], number, RegExp][] = [
      [
        run("--ttl", String(MIN_TTL - 1)),
        EXIT_BAD_DURATION,
        /--ttl .*received 499$/,
      ],
      [
        run("--ttl", String(LONGEST + 1)),
        EXIT_BAD_DURATION,
        /--ttl .*received 2147483648$/,
      ],
      [run("--ttl", "1.5"), EXIT_BAD_DURATION, /--ttl .*"1\.5"/],
      [run("--ttl", "-1"), EXIT_BAD_DURATION, /--ttl .*"-1"/],
      [run("--ttl", "1e3"), EXIT_BAD_DURATION, /--ttl .*"1e3"/],
      [run("--ttl", "soon"), EXIT_BAD_DURATION, /--ttl .*"soon"/],
      [run("--ttl="), EXIT_BAD_DURATION, /--ttl .*""/],
      [
        run("--ttl", "1000", "--kill-after", "1000"),
        EXIT_BAD_DURATION,
        /--kill-after .*received 1000$/,
      ],
      [run("--kill-after", "1.5"), EXIT_BAD_DURATION, /--kill-after .*"1\.5"/],
      [run("--kill-after", "x"), EXIT_BAD_DURATION, /--kill-after .*"x"/],
      [run("-n", "0"), EXIT_USAGE, /-n .*"0"/],
      [run("-n", String(MAX_SEMAPHORE_LIMIT + 1)), EXIT_USAGE, /-n .*"10001"/],
      [run("--limit", "1.5"), EXIT_USAGE, /--limit .*"1\.5"/],
      [run("--limit", "x"), EXIT_USAGE, /--limit .*"x"/],
      [run("--lost-status", "0"), EXIT_USAGE, /--lost-status .*"0"/],
      [run("--lost-status", "256"), EXIT_USAGE, /--lost-status .*"256"/],
      [run("--lost-status", "1.5"), EXIT_USAGE, /--lost-status .*"1\.5"/],
      [["shards", "g", "--count", "0"], EXIT_USAGE, /--count .*"0"/],
      [
        ["shards", "g", "--count", String(MAX_SHARDS + 1)],
        EXIT_USAGE,
        /--count .*"4097"/,
      ],
      [["shards", "g", "--count", "2.5"], EXIT_USAGE, /--count .*"2\.5"/],
      [sh("--max-members", "0"), EXIT_USAGE, /--max-members .*"0"/],
      [sh("--max-members", "257"), EXIT_USAGE, /--max-members .*"257"/],
      [sh("--max-members", "x"), EXIT_USAGE, /--max-members .*"x"/],
      [["holder", "k", "--domain", "a.b"], EXIT_USAGE, /--domain .*"a\.b"/],
      [["holder", "k", "--domain", "a b"], EXIT_USAGE, /--domain .*"a b"/],
      [["ls", "--prefix", "a.>"], EXIT_USAGE, /--prefix "a\.>"/],
      [["ls", "--prefix", "a..b"], EXIT_USAGE, /--prefix "a\.\.b"/],
    ];
    for (const [args, code, why] of refused) {
      test(`lease ${args.join(" ")} is refused with exit ${code} before connecting`, () => {
        assert.throws(() => parse(args), (e) => {
          assert.ok(e instanceof UsageError, String(e));
          assert.equal(e.code, code, e.message);
          assert.match(e.message, why);
          return true;
        });
      });
    }

    // [arguments, what parse() gives]
    const accepted: [string[], Record<string, unknown>][] = [
      [run("--ttl", String(MIN_TTL)), { ttl: MIN_TTL }],
      [run("--ttl", String(LONGEST)), { ttl: LONGEST }],
      [run("--ttl", "1000", "--kill-after", "999"), {
        ttl: 1000,
        killAfter: 999,
      }],
      [run("--kill-after", "0"), { killAfter: 0 }],
      [run("-n", "1"), { limit: 1 }],
      [run("-n", String(MAX_SEMAPHORE_LIMIT)), { limit: MAX_SEMAPHORE_LIMIT }],
      [run("--lost-status", "1"), { lostStatus: 1 }],
      [run("--lost-status", "255"), { lostStatus: 255 }],
      [["shards", "g", "--count", "1"], { count: 1 }],
      [["shards", "g", "--count", String(MAX_SHARDS)], { count: MAX_SHARDS }],
      [sh("--max-members", "1"), { maxMembers: 1 }],
      [sh("--max-members", "256"), { maxMembers: 256 }],
      [["holder", "k", "--domain", "hub-1_9"], { domain: "hub-1_9" }],
      [["ls", "--prefix", "a.b"], { prefix: "a.b" }],
    ];
    for (const [args, want] of accepted) {
      test(`lease ${args.join(" ")} is accepted`, () => {
        const a = parse(args) as unknown as Record<string, unknown>;
        for (const [k, v] of Object.entries(want)) assert.equal(a[k], v, k);
      });
    }
  });
});
