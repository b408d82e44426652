// Waiting across a server restart (issue 21): a waiting guard, a campaign
// and a watch() iterator follow a key through one shared watch (an ordered
// consumer). When the server is killed (SIGKILL) and restarted on the same
// port and store, that watch must be back on the stream as soon as the
// connection is: a release after the restart then reaches the waiter in
// milliseconds, as it does without a restart. Each test measures the
// handover with and without a restart, on one server, and prints both.
// The waiter has a connection (and a manager) of its own.
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary.
import { after, describe } from "node:test";
// A failed test names the servers' last log lines (test_util/server_logs.ts).
import { before, test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { createLeaseManager, type LeaseManager } from "./mod.ts";
import { eventually, sleep, uniq } from "./test_util/lease_helpers.ts";
import { NatsServer } from "./test_util/nats_server.ts";

/**
 * A waiter whose watch is dead learns of the release from its fallback
 * read, one TTL after the watch's last news (a renewal the holder already
 * made before it closed): with 5 s that is seconds late, far from a prompt
 * handover, whatever the timing of the restart.
 */
const TTL = 5000;

/** The holder guards this often, as in the report. */
const HOLDER_EVERY = 200;

/**
 * How late the follower may have the key after the holder's close().
 * Measured (node, deno, bun; 2.15.2 and 2.9.10): 1-11 ms with and without
 * the restart. A watch that did not come back after the restart (nats.js
 * 3.4's recreated ordered consumer asking for one message, then nothing)
 * made it 4.6 s on every run, in all three cases (the report: 989 and
 * 1,387 ms, with a shorter TTL). 1 s is 90 times the worst measured, for
 * a loaded 2-core CI machine, and well under the 2.4 s or more (TTL less
 * the time from the kill to the close) of a dead watch.
 */
const PROMPT = 1000;

async function conn(url: string): Promise<NatsConnection> {
  return await connect({
    servers: url,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
  });
}

/** Prints measured figures (ms). */
function report(what: string, figures: Record<string, number>): void {
  const text = Object.entries(figures).map(([k, v]) =>
    `${k}=${Math.round(v)} ms`
  ).join(", ");
  console.log(`  [figures] ${what}: ${text}`);
}

/** How the follower waits for the key; resolves when it has it (or sees it free). */
type Follow = (
  w: LeaseManager,
  key: string,
  signal: AbortSignal,
) => Promise<number>;

/** guard({ wait: true }): when its write starts. */
const waitingGuard: Follow = (w, key, signal) =>
  w.guard(key, () => performance.now(), { wait: true, signal });

/** campaign(): when it first leads. */
const campaign: Follow = async (w, key, signal) => {
  for await (const _ of w.campaign(key, { signal })) return performance.now();
  throw new Error("the campaign ended without leading");
};

/** watch(): when it reports the key free after a holder. */
const watchFree: Follow = async (w, key, signal) => {
  let held = false;
  for await (const h of w.watch(key, { signal })) {
    if (h !== null) held = true;
    else if (held) return performance.now();
  }
  throw new Error("the watch ended before it saw the release");
};

/** What one handover measured, in ms. */
interface Handover {
  /** From close() of the holder to the follower having the key. */
  gap: number;
  /** From the kill to the holder's first guarded write after the restart. */
  reconfirmed?: number;
}

/**
 * Holder `h` guards `key` every {@linkcode HOLDER_EVERY} ms; follower `w`
 * (another connection) starts waiting through `follow`. With `restart`,
 * the server is killed and restarted on its port and store, and once `h`
 * has guarded a write again and `w`'s connection is back, `h` closes
 * (which releases the key). Returns how long after `h.close()` began the
 * follower had the key.
 */
async function handover(
  ns: NatsServer,
  follow: Follow,
  restart: boolean,
): Promise<Handover> {
  const bucket = uniq("rs");
  const key = "k";
  const ncH = await conn(ns.url);
  const ncW = await conn(ns.url);
  const ctl = new AbortController();
  let running = true;
  let lastWrite = 0;
  let holding: Promise<void> | undefined;
  let h: LeaseManager | undefined;
  let w: LeaseManager | undefined;
  try {
    h = await createLeaseManager({
      nc: ncH,
      node: "h",
      bucket,
      ttl: TTL,
      // Without markers (before 2.11) a new key is taken after a grace of
      // one TTL; the holder's first write is not what is measured.
      restartGrace: false,
    });
    w = await createLeaseManager({ nc: ncW, node: "w", bucket, ttl: TTL });
    const holder = h;
    await holder.guard(key, () => {});
    holding = (async () => {
      while (running) {
        try {
          await holder.guard(key, () => {
            lastWrite = performance.now();
          });
        } catch {
          // The server is down or not yet back: guard again.
        }
        await sleep(HOLDER_EVERY);
      }
    })();
    let got: number | undefined;
    const following = follow(w, key, ctl.signal).then((t) => got = t);
    following.catch(() => {}); // judged below
    await sleep(500); // the follower is waiting on its watch
    let reconfirmed: number | undefined;
    if (restart) {
      let back = false;
      void (async () => {
        for await (const s of ncW.status()) {
          if (s.type === "reconnect") {
            back = true;
            return;
          }
        }
      })();
      const killedAt = performance.now();
      await ns.kill();
      await ns.restart();
      await eventually(
        () => lastWrite > killedAt,
        6 * TTL,
        "the holder's write after the restart",
      );
      reconfirmed = lastWrite - killedAt;
      await eventually(() => back, 6 * TTL, "the follower's reconnect");
      // A few more of the holder's writes, as in the report.
      await sleep(3 * HOLDER_EVERY);
      // The follower's watch is one consumer again: the one nats.js
      // recreated after the restart was not left behind.
      const jsm = await jetstreamManager(ncH);
      let n = -1;
      await eventually(
        async () =>
          (n = (await jsm.consumers.list(`KV_${bucket}`).next()).length) ===
            1,
        TTL,
        "one consumer on the stream",
      ).catch((err) => {
        throw new Error(`${n} consumers on the stream`, { cause: err });
      });
    }
    assert.equal(got, undefined, "the follower waits while the key is held");
    running = false;
    await holding;
    const released = performance.now();
    const closing = holder.close();
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      await Promise.race([
        following,
        new Promise((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`no handover ${3 * TTL} ms after close()`)),
            3 * TTL,
          );
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
    await closing;
    const gap = got! - released;
    return reconfirmed === undefined ? { gap } : { gap, reconfirmed };
  } finally {
    running = false;
    ctl.abort();
    await holding;
    await Promise.allSettled([h?.close(), w?.close()]);
    await Promise.allSettled([ncH.close(), ncW.close()]);
  }
}

describe("waiting across a server restart", () => {
  let ns: NatsServer;

  before(async () => {
    ns = await NatsServer.start();
  });

  after(async () => {
    await ns?.[Symbol.asyncDispose]();
  });

  test(
    `guard({ wait: true }) begun while the server is down writes within ${PROMPT} ms of a holder's close() once the server is back, not at the end of its TTL/3 backoff`,
    async () => {
      // TTL 9 s: each UnavailableError doubles the waiter's pause, from 50
      // ms up to TTL/3 = 3 s.
      const ttl = 9000;
      const bucket = uniq("rb");
      const ncH = await conn(ns.url);
      const ncW = await conn(ns.url);
      let running = true;
      let lastWrite = 0;
      let holding: Promise<void> | undefined;
      let h: LeaseManager | undefined;
      let w: LeaseManager | undefined;
      try {
        h = await createLeaseManager({
          nc: ncH,
          node: "h",
          bucket,
          ttl,
          restartGrace: false,
        });
        // A short timeout: while the server is down each attempt fails
        // after 100 ms, so the pauses set the waiter's pace.
        w = await createLeaseManager({
          nc: ncW,
          node: "w",
          bucket,
          ttl,
          timeout: 100,
        });
        const holder = h;
        await holder.guard("k", () => {});
        holding = (async () => {
          while (running) {
            await holder.guard("k", () => {
              lastWrite = performance.now();
            }).catch(() => {}); // down, or not proven again yet
            await sleep(HOLDER_EVERY);
          }
        })();
        const killedAt = performance.now();
        await ns.kill();
        await sleep(200);
        let wrote: number | undefined;
        const waiting = w.guard("k", () => wrote = performance.now(), {
          wait: true,
        });
        waiting.catch(() => {}); // judged below
        // Attempts of 100 ms and pauses of 50, 100, ... 1600 ms: from about
        // 3.75 s on, the waiter sleeps 3 s. The server comes back inside
        // that pause.
        await sleep(4000);
        await ns.restart();
        await eventually(
          () => lastWrite > killedAt,
          3 * ttl,
          "the holder's write after the restart",
        );
        running = false;
        await holding;
        const released = performance.now();
        await holder.close();
        await Promise.race([waiting, sleep(ttl)]);
        assert.ok(wrote !== undefined, `no write ${ttl} ms after close()`);
        const gap = wrote - released;
        report("guard({ wait: true }) begun during the outage, after close()", {
          gap,
          holderReconfirmed: lastWrite - killedAt,
        });
        // Woken when its connection came back, the waiter finds the key
        // held and waits on the key's watch, which sees the clean release
        // (no grace) at once. One that slept out its pause would write
        // about 2 s after the close(), at the end of the pause (6.75 s
        // after it began to wait).
        assert.ok(gap < PROMPT, `wrote ${gap.toFixed(0)} ms after close()`);
      } finally {
        running = false;
        await holding;
        await Promise.allSettled([h?.close(), w?.close()]);
        await Promise.allSettled([ncH.close(), ncW.close()]);
      }
    },
  );

  const cases: [string, string, Follow][] = [
    ["guard({ wait: true })", "writes", waitingGuard],
    ["campaign()", "leads", campaign],
    ["watch()", "reports the key free", watchFree],
  ];
  for (const [name, does, follow] of cases) {
    test(
      `${name} ${does} within ${PROMPT} ms of a holder's close() after the server was killed and restarted`,
      async () => {
        const base = await handover(ns, follow, false);
        const after = await handover(ns, follow, true);
        report(`${name} after close()`, {
          noRestart: base.gap,
          afterRestart: after.gap,
          holderReconfirmed: after.reconfirmed ?? NaN,
        });
        assert.ok(
          base.gap < PROMPT,
          `without a restart: ${base.gap.toFixed(0)} ms`,
        );
        assert.ok(
          after.gap < PROMPT,
          `after a restart: ${after.gap.toFixed(0)} ms (without: ${
            base.gap.toFixed(0)
          } ms)`,
        );
      },
    );
  }
});

test(
  "campaign() through an outage longer than the TTL leads again once the server is back: after the grace of the tenure its manager's renewal takes back, or of a fresh one",
  async () => {
    // The README's leader.js through its outage (outage_test.ts), at a 1 s
    // TTL and under every runtime. The lease is lost in the outage, but the
    // key's state keeps its claim. Once reconnected, the campaign (woken by
    // the reconnect) and a renewal planned at once go through the key's
    // queue: when the restarted server still holds the entry (2.15.2: it
    // expires it about 230 ms after start), the renewal takes the key back
    // (a lapsed tenure, two TTLs of grace); when it does not (2.9.10), the
    // lease is over, and the campaign takes the key afresh. A CI run on
    // 2.9.10 under load once saw the key taken ("fresh") and the campaign
    // lead no more: its waiter was asleep on the key's watch, which takes
    // our new entry for a renewal of our old one. The manager now wakes its
    // waiters whenever it takes a key, and a renewal never takes one.
    const ttl = 1000;
    await using ns = await NatsServer.start();
    const nc = await conn(ns.url);
    const m = await createLeaseManager({
      nc,
      node: "solo",
      bucket: uniq("rv"),
      ttl,
    });
    const found: string[] = [];
    m.addEventListener("acquired", (e) => found.push(e.found));
    const ctl = new AbortController();
    try {
      let led = 0;
      let first!: () => void;
      const firstLed = new Promise<void>((r) => first = r);
      const leading = (async () => {
        for await (const lease of m.campaign("k", { signal: ctl.signal })) {
          led = performance.now();
          first();
          // Leads until the tenure ends, then campaigns again.
          await new Promise<void>((r) =>
            lease.signal.addEventListener("abort", () => r(), { once: true })
          );
        }
      })();
      leading.catch(() => {}); // judged below
      await firstLed;
      const firstAt = led;
      const lost = new Promise((r) =>
        m.addEventListener("lost", r, { once: true })
      );
      await ns.kill();
      await lost;
      await sleep(ttl / 2);
      await ns.restart();
      const back = performance.now();
      // Two TTLs of grace at most; the reconnect (100 ms apart) and the
      // reads around it take the rest.
      await eventually(
        () => led > firstAt,
        2 * ttl + 3000,
        "a tenure after the server came back",
      ).catch((err) => {
        throw new Error(
          `${err.message} (tenures begun: ${
            found.join(", ")
          }; holding: ${m.health().held})`,
        );
      });
      report("campaign() after an outage longer than the TTL", {
        afterRestart: led - back,
      });
      console.log(`  tenures begun: ${found.join(", ")}`);
    } finally {
      ctl.abort();
      await m.close();
      await nc.close();
    }
  },
);
