// Tests of the `lease` command on a fenced bucket (cli/fenced.ts, and the
// fenced paths of cli/ls.ts, cli/views.ts, cli/run.ts, cli/release.ts) as
// users run it: real processes of this test's runtime (`deno run -A cli.ts`,
// `bun cli.ts`, `node cli.ts`) against a real nats-server, their commands
// real shells that call `lease put`. What the server stores is read back
// with plain KV, not with the command's word. Fenced buckets need
// nats-server 2.11.2 or later: on an older one only the refusals run.
// Runs under `deno test -A`, `bun test` and `node --test`; NATS_SERVER_BIN
// picks the server binary.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { markersVersion } from "./lease/servers.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";
import { sleep, uniq, versionOf } from "./test_util/lease_helpers.ts";

const CLI = fileURLToPath(new URL("./cli.ts", import.meta.url));
const TTL = 1000;
const FENCED = markersVersion(versionOf(natsServerBinary()))
  ? false
  : "fenced buckets need nats-server 2.11.2 or later";

/** `lease` as a shell command line, under this test's runtime. */
const LEASE =
  ("Deno" in globalThis
    ? [process.execPath, "run", "-A", CLI]
    : [process.execPath, CLI]).map((w) => `'${w}'`).join(" ");

interface Run {
  child: ChildProcess;
  out: () => string;
  err: () => string;
  exited: Promise<number>;
}

const started: Run[] = [];

/** Starts `lease ARGS` with `env` added to (or, undefined, removed from) ours. */
function lease(
  args: string[],
  env: Record<string, string | undefined> = {},
): Run {
  const [cmd, pre] = "Deno" in globalThis
    ? [process.execPath, ["run", "-A", CLI]]
    : [process.execPath, [CLI]];
  const all: Record<string, string | undefined> = { ...process.env };
  // Set by `node --test`: a child node process that sees it reports as a
  // test file. The LEASE_ variables of an outer `lease run` would leak in.
  for (const k of Object.keys(all)) {
    if (k === "NODE_TEST_CONTEXT" || k.startsWith("LEASE_")) delete all[k];
  }
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) delete all[k];
    else all[k] = v;
  }
  const child = spawn(cmd, [...pre, ...args], {
    env: all,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => out += d);
  child.stderr!.setEncoding("utf8").on("data", (d: string) => err += d);
  const exited = new Promise<number>((r) =>
    child.on("exit", (code, signal) => r(code ?? (signal ? 128 + 9 : -1)))
  );
  const run = { child, out: () => out, err: () => err, exited };
  started.push(run);
  return run;
}

async function until(pred: () => boolean, ms: number, what: string) {
  const end = performance.now() + ms;
  while (!pred()) {
    assert.ok(
      performance.now() < end,
      `timed out waiting for ${what}; lease said:\n${
        started.map((r) => r.out() + r.err()).join("\n").trimEnd()
          .split("\n").slice(-20).join("\n")
      }`,
    );
    await sleep(20);
  }
}

/** `lease ls --json`'s rows. */
function rows(out: string): Record<string, unknown>[] {
  return out.trim().split("\n").filter(Boolean).map((l) => JSON.parse(l));
}

describe("the lease command on a fenced bucket", () => {
  let ns: NatsServer;
  let nc: NatsConnection;
  const base = (bucket: string) => ["--servers", ns.url, "--bucket", bucket];
  /** A bucket's value at `key` as plain KV reads it (null: none or deleted). */
  const read = async (bucket: string, key: string) => {
    const e = await (await new Kvm(nc).open(bucket)).get(key);
    return e?.operation === "PUT" ? e.string() : null;
  };

  before(async () => {
    ns = await NatsServer.start();
    nc = await connect({ servers: ns.url });
  });
  after(async () => {
    for (const r of started) r.child.kill("SIGKILL");
    await nc?.close();
    await ns?.[Symbol.asyncDispose]();
  });

  test("lease put and delete refuse bad input before connecting: no tenure in the environment, an invalid or reserved key, a bad LEASE_EPOCH, another --bucket, a missing VALUE", async () => {
    const nowhere = ["--servers", "127.0.0.1:1"];
    const tenure = { LEASE_BUCKET: "fb", LEASE_KEY: "k", LEASE_EPOCH: "7" };
    for (
      const [args, env, code, why] of [
        [
          ["put", "a", "1"],
          {},
          64,
          /LEASE_BUCKET, LEASE_KEY, LEASE_EPOCH are not set/,
        ],
        [
          ["delete", "a"],
          { ...tenure, LEASE_EPOCH: undefined },
          64,
          /LEASE_EPOCH is not set/,
        ],
        [["put", "bad key", "1"], tenure, 65, /invalid key "bad key"/],
        [
          ["put", "_lease.k.k", "1"],
          tenure,
          65,
          /keys under '_lease\.' hold the leases/,
        ],
        [["delete", "_lease.s.x"], tenure, 65, /keys under '_lease\.'/],
        [
          ["put", "a", "1"],
          { ...tenure, LEASE_EPOCH: "0" },
          64,
          /LEASE_EPOCH must be/,
        ],
        [
          ["put", "a", "1"],
          { ...tenure, LEASE_EPOCH: "x7" },
          64,
          /LEASE_EPOCH must be/,
        ],
        [
          ["put", "a", "1", "--bucket", "other"],
          tenure,
          64,
          /is not LEASE_BUCKET \(fb\)/,
        ],
        [["put", "a"], tenure, 64, /needs KEY and VALUE/],
      ] as const
    ) {
      const r = lease([...args, ...nowhere], env);
      assert.equal(await r.exited, code, `${args.join(" ")}: ${r.err()}`);
      assert.match(r.err(), why);
      assert.doesNotMatch(r.err(), /cannot connect/);
    }
  });

  test("on a classic bucket (any server), lease put is refused before sending and stores nothing, and lease run --fenced is refused", async () => {
    const classic = uniq("cl");
    // A TTL of 1 s: before 2.11.2 a never-used key waits one TTL.
    const held = lease([
      "run",
      "k",
      ...base(classic),
      "--ttl",
      String(TTL),
      "--",
      "true",
    ]);
    assert.equal(await held.exited, 0, held.err());
    const put = lease(["put", "data.a", "1", "--servers", ns.url], {
      LEASE_BUCKET: classic,
      LEASE_KEY: "k",
      LEASE_EPOCH: "1",
    });
    assert.equal(await put.exited, 64, put.err());
    assert.match(put.err(), new RegExp(`bucket '${classic}' is a classic`));
    assert.equal(await read(classic, "data.a"), null);
    const fenced = lease([
      "run",
      "--fenced",
      "k",
      ...base(classic),
      "--",
      "true",
    ]);
    assert.equal(await fenced.exited, 64, fenced.err());
    assert.match(fenced.err(), /--fenced: .* is a classic lease bucket/);
  });

  test(
    "lease run --fenced on a server before 2.11.2 exits 69 and creates no bucket",
    {
      skip: FENCED === false ? "the server is 2.11.2 or later" : false,
    },
    async () => {
      const bucket = uniq("old");
      const r = lease(["run", "--fenced", "k", ...base(bucket), "--", "true"]);
      assert.equal(await r.exited, 69, r.err());
      assert.match(r.err(), /a fenced bucket needs 2\.11\.2 or later/);
      const jsm = await jetstreamManager(nc);
      await assert.rejects(
        jsm.streams.info(`KV_${bucket}`),
        /stream not found/,
      );
    },
  );

  test(
    "lease run --fenced: the command's lease put is stored (plain KV reads it); lease ls --json and lease holder show the tenure only, never the session or the data",
    {
      skip: FENCED,
    },
    async () => {
      const bucket = uniq("fb");
      const r = lease([
        "run",
        "--fenced",
        "jobs.nightly",
        ...base(bucket),
        "--ttl",
        String(TTL),
        "--node",
        "node-a",
        "--",
        "sh",
        "-c",
        `echo "epoch $LEASE_EPOCH bucket $LEASE_BUCKET"; ${LEASE} put report.day1 "done by $LEASE_NODE"`,
      ]);
      assert.equal(await r.exited, 0, r.out() + r.err());
      const [first, revision] = r.out().trim().split("\n");
      const epoch = Number(/^epoch (\d+) bucket (\S+)$/.exec(first!)?.[1]);
      assert.match(first!, new RegExp(`bucket ${bucket}$`));
      assert.ok(epoch > 0, r.out());
      // The put printed its revision: the data key's, after the tenure's.
      assert.ok(Number(revision) > epoch, r.out());
      assert.equal(await read(bucket, "report.day1"), "done by node-a");
      const kv = await new Kvm(nc).open(bucket);
      assert.equal((await kv.get("report.day1"))!.revision, Number(revision));
      const ls = lease(["ls", "--json", ...base(bucket)]);
      assert.equal(await ls.exited, 0, ls.err());
      assert.deepEqual(rows(ls.out()).map((row) => [row.key, row.state]), [
        ["jobs.nightly", "released"],
      ]);
      // While held, from inside the command: the tenure, with its session.
      const inside = '--servers "$LEASE_SERVERS" --bucket "$LEASE_BUCKET"';
      const held = lease([
        "run",
        "jobs.nightly",
        ...base(bucket),
        "--node",
        "node-b",
        "--",
        "sh",
        "-c",
        `${LEASE} ls --json ${inside}; ${LEASE} holder "$LEASE_KEY" ${inside} --json; echo "epoch $LEASE_EPOCH"`,
      ]);
      assert.equal(await held.exited, 0, held.out() + held.err());
      const lines = held.out().trim().split("\n");
      const own = Number(/^epoch (\d+)$/.exec(lines.at(-1)!)?.[1]);
      const [row, ...more] = rows(lines.slice(0, -2).join("\n"));
      assert.deepEqual(more, [], held.out());
      assert.deepEqual(
        [row!.key, row!.state, row!.holder, row!.epoch, row!.revision],
        ["jobs.nightly", "held", "node-b", own, own],
      );
      assert.equal(typeof row!.session, "string");
      assert.ok((row!.expiresInMs as number) > 0, JSON.stringify(row));
      assert.deepEqual(JSON.parse(lines.at(-2)!), {
        key: "jobs.nightly",
        holder: { node: "node-b", epoch: own },
      });
    },
  );

  test(
    "a killed lease run's tenure shows as orphaned once its session expires (ls, holder, watch --all), and the next run takes it",
    {
      skip: FENCED,
    },
    async () => {
      const bucket = uniq("fb");
      const r = lease([
        "run",
        "--fenced",
        "crash",
        ...base(bucket),
        "--ttl",
        String(TTL),
        "--node",
        "node-a",
        "--",
        "sh",
        "-c",
        `${LEASE} put data.x 1 && echo "epoch $LEASE_EPOCH" && sleep 30`,
      ]);
      await until(() => /^epoch \d+$/m.test(r.out()), 10_000, "the command");
      const epoch = Number(/^epoch (\d+)$/m.exec(r.out())![1]);
      const w = lease(["watch", "--all", "--json", ...base(bucket)]);
      await until(() => /"state":"held"/.test(w.out()), 5_000, "the watch");
      r.child.kill("SIGKILL"); // no release: the session is left to expire
      const ls = async () => {
        const l = lease(["ls", "--json", ...base(bucket)]);
        assert.equal(await l.exited, 0, l.err());
        return rows(l.out());
      };
      await until(
        () => /"state":"orphaned"/.test(w.out()),
        4 * TTL,
        "orphaned",
      );
      const [row, ...more] = await ls();
      assert.deepEqual(more, []);
      assert.deepEqual(
        [row!.key, row!.state, row!.holder, row!.epoch, row!.expiresInMs],
        ["crash", "orphaned", "node-a", epoch, null],
      );
      const h = lease(["holder", "crash", "--json", ...base(bucket)]);
      assert.equal(await h.exited, 0, h.err());
      assert.deepEqual(JSON.parse(h.out()), {
        key: "crash",
        holder: null,
        orphaned: { node: "node-a", epoch },
      });
      // The watch's lines: held, then orphaned; never the session or data.
      const seen = rows(w.out());
      assert.deepEqual(seen.map((s) => s.key), ["crash", "crash"], w.out());
      assert.deepEqual(seen.map((s) => s.state), ["held", "orphaned"]);
      const next = lease([
        "run",
        "crash",
        ...base(bucket),
        "--node",
        "node-b",
        "--",
        "sh",
        "-c",
        'echo "epoch $LEASE_EPOCH"',
      ]);
      assert.equal(await next.exited, 0, next.err());
      assert.ok(Number(/^epoch (\d+)$/m.exec(next.out())?.[1]) > epoch);
      assert.doesNotMatch(next.err(), /grace/);
    },
  );

  test(
    "a lease put with a stale LEASE_EPOCH, after another node took the key, is refused by the server (exit 1, naming the current revision) and stores nothing",
    {
      skip: FENCED,
    },
    async () => {
      const bucket = uniq("fb");
      const first = lease([
        "run",
        "--fenced",
        "orders",
        ...base(bucket),
        "--ttl",
        String(TTL),
        "--node",
        "node-a",
        "--",
        "sh",
        "-c",
        'echo "$LEASE_EPOCH"',
      ]);
      assert.equal(await first.exited, 0, first.err());
      const stale = first.out().trim();
      // node-b holds orders now; its command writes once under node-a's
      // epoch (as a node-a command that outlived its lease run would), then
      // under its own.
      const second = lease([
        "run",
        "orders",
        ...base(bucket),
        "--node",
        "node-b",
        "--",
        "sh",
        "-c",
        `LEASE_EPOCH=${stale} ${LEASE} put orders.total stale; echo "status $?"; ${LEASE} delete orders.old; ${LEASE} put orders.total "$LEASE_EPOCH"`,
      ]);
      assert.equal(await second.exited, 0, second.err());
      assert.match(second.out(), /^status 1$/m);
      const now = /tenure entry is at revision (\d+) now/.exec(second.err());
      assert.ok(now, second.err());
      assert.ok(Number(now[1]) > Number(stale), second.err());
      assert.match(second.err(), /not stored: the tenure of 'orders' at epoch/);
      const own = /holding 'orders' as node-b, epoch (\d+)/.exec(second.err());
      assert.equal(Number(now[1]), Number(own?.[1]), second.err());
      // Only node-b's own put is stored: one message on the data key.
      const kv = await new Kvm(nc).open(bucket);
      const e = await kv.get("orders.total");
      assert.equal(e?.string(), own![1]);
      const jsm = await jetstreamManager(nc);
      const si = await jsm.streams.info(`KV_${bucket}`, {
        subjects_filter: `$KV.${bucket}.orders.total`,
      });
      assert.equal(si.state.subjects?.[`$KV.${bucket}.orders.total`], 1);
      assert.equal((await kv.get("orders.old"))?.operation, "DEL");
    },
  );

  test(
    "lease release evicts a fenced holder: its lease run stops the command within TTL/3 (exit 75), a successor takes the key at once, and the evicted command's put is refused",
    {
      skip: FENCED,
    },
    async () => {
      const bucket = uniq("fb");
      const r = lease([
        "run",
        "--fenced",
        "evict",
        ...base(bucket),
        "--ttl",
        String(2 * TTL),
        "--node",
        "node-a",
        "--kill-after",
        "200",
        "--",
        "sh",
        "-c",
        "sleep 30",
      ]);
      await until(() => /holding 'evict'/.test(r.err()), 10_000, "the holder");
      const epoch = /epoch (\d+)/.exec(r.err())![1]!;
      const t0 = performance.now();
      const ev = lease([
        "release",
        "evict",
        "--node",
        "node-a",
        ...base(bucket),
      ]);
      assert.equal(await ev.exited, 0, ev.err());
      assert.equal(await r.exited, 75, r.err());
      const stoppedIn = performance.now() - t0;
      assert.ok(stoppedIn < 2 * TTL, `stopped after ${stoppedIn} ms`);
      assert.match(r.err(), /lost 'evict'/);
      const late = lease(["put", "evict.data", "late", "--servers", ns.url], {
        LEASE_BUCKET: bucket,
        LEASE_KEY: "evict",
        LEASE_EPOCH: epoch,
      });
      assert.equal(await late.exited, 1, late.err());
      assert.equal(await read(bucket, "evict.data"), null);
      const next = lease(["run", "evict", ...base(bucket), "--", "true"]);
      assert.equal(await next.exited, 0, next.err());
      assert.doesNotMatch(next.err(), /grace/);
    },
  );
});
