// Tests of the `lease` command with the leases in a stream of the user's
// (`--stream NAME --lease-subjects PREFIX`: cli/stream.ts, and the stream
// paths of cli/args.ts, cli/connect.ts, cli/run.ts, cli/ls.ts, cli/views.ts)
// as users run it: real processes of this test's runtime (`deno run -A
// cli.ts`, `bun cli.ts`, `node cli.ts`) against a real nats-server, their
// commands real shells that call `lease publish`. What the server stored is
// read back from the stream with a plain JetStream client, not taken from
// the command's word. Leases in a stream need nats-server 2.11.2 or later:
// on an older one only the refusals run. Runs under `deno test -A`,
// `bun test` and `node --test`; NATS_SERVER_BIN picks the server binary.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";
import { createLeaseManager } from "./mod.ts";
import { markersVersion } from "./lease/servers.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";
import { sleep, uniq, versionOf } from "./test_util/lease_helpers.ts";

const CLI = fileURLToPath(new URL("./cli.ts", import.meta.url));
const TTL = 1000;
const VERSION = versionOf(natsServerBinary());
const OLD = markersVersion(VERSION)
  ? false
  : `nats-server ${VERSION} is before 2.11.2: it cannot hold leases in a stream`;

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

/** `lease ls --json`'s (or `watch --json`'s) rows. */
function rows(out: string): Record<string, unknown>[] {
  return out.trim().split("\n").filter(Boolean).map((l) => JSON.parse(l));
}

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

describe("lease run --stream, lease publish: refusals before anything is sent (any server)", () => {
  test("bad flags, environments and subjects exit 64-66 before connecting, each naming the mistake", async () => {
    const nowhere = ["--servers", "127.0.0.1:1"];
    const stream = ["--stream", "ORDERS", "--lease-subjects", "ORDERS.lease"];
    const tenure = {
      LEASE_STREAM: "ORDERS",
      LEASE_SUBJECTS: "ORDERS.lease",
      LEASE_KEY: "k",
      LEASE_EPOCH: "7",
    };
    for (
      const [args, env, code, why] of [
        [
          ["run", "k", "--stream", "ORDERS", "--", "true"],
          {},
          64,
          /--stream needs --lease-subjects PREFIX/,
        ],
        [
          ["run", "k", "--lease-subjects", "ORDERS.lease", "--", "true"],
          {},
          64,
          /give the stream with --stream NAME/,
        ],
        [
          ["run", "k", ...stream, "--bucket", "leases", "--", "true"],
          {},
          64,
          /--bucket does not apply with --stream/,
        ],
        [
          ["run", "k", ...stream, "--domain", "hub", "--", "true"],
          {},
          64,
          /--domain does not apply with --stream/,
        ],
        [
          ["run", "k", ...stream, "--fenced", "--", "true"],
          {},
          64,
          /--fenced does not apply with --stream/,
        ],
        [
          ["ls", ...stream, "--bucket", "leases"],
          {},
          64,
          /--bucket does not apply with --stream/,
        ],
        [
          [
            "run",
            "k",
            "--stream",
            "OR.DERS",
            "--lease-subjects",
            "o.l",
            "--",
            "true",
          ],
          {},
          64,
          /--stream needs a stream name/,
        ],
        [
          [
            "run",
            "k",
            "--stream",
            "ORDERS",
            "--lease-subjects",
            "ORDERS.lease.>",
            "--",
            "true",
          ],
          {},
          64,
          /a prefix, not a pattern: --lease-subjects ORDERS\.lease\)/,
        ],
        [
          ["run", "k", ...stream, "--ttl", "999", "--", "true"],
          {},
          66,
          /--ttl must be at least 1000 ms for leases in a stream/,
        ],
        [
          ["release", "k", "--node", "a", ...stream],
          {},
          64,
          /lease release does not support leases in a stream \(--stream\) yet/,
        ],
        [
          ["shards", "g", "--count", "2", ...stream],
          {},
          64,
          /lease shards does not support leases in a stream/,
        ],
        [
          ["publish", "ORDERS.created", "1"],
          {},
          64,
          /LEASE_STREAM, LEASE_SUBJECTS, LEASE_KEY, LEASE_EPOCH are not set/,
        ],
        [
          ["publish", "ORDERS.created", "1"],
          { LEASE_BUCKET: "ledger", LEASE_KEY: "k", LEASE_EPOCH: "7" },
          64,
          /runs under lease run on bucket "ledger" .*use lease put KEY VALUE/,
        ],
        [
          ["put", "totals", "1"],
          tenure,
          64,
          /runs under lease run --stream .*use lease publish SUBJECT DATA/,
        ],
        [
          ["delete", "totals"],
          tenure,
          64,
          /use lease publish SUBJECT DATA/,
        ],
        [
          ["publish", "ORDERS.created", "1"],
          { ...tenure, LEASE_EPOCH: "x7" },
          64,
          /LEASE_EPOCH must be/,
        ],
        [["publish", "ORDERS.created"], tenure, 64, /needs SUBJECT and DATA/],
        [
          ["publish", "ORDERS.*", "1"],
          tenure,
          65,
          /invalid subject "ORDERS\.\*": .*not a pattern/,
        ],
        [["publish", "ORDERS.>", "1"], tenure, 65, /not a pattern/],
        [["publish", "ORDERS..x", "1"], tenure, 65, /invalid subject/],
        [
          ["publish", "ORDERS.lease.k.k", "1"],
          tenure,
          65,
          /subjects under 'ORDERS\.lease' \(LEASE_SUBJECTS\) hold the leases/,
        ],
        [["publish", "ORDERS.lease", "1"], tenure, 65, /hold the leases/],
        [
          ["publish", "ORDERS.created", "1", "--bucket", "b"],
          tenure,
          64,
          /lease publish has no option --bucket/,
        ],
      ] as const
    ) {
      const r = lease([...args, ...nowhere], env);
      assert.equal(await r.exited, code, `${args.join(" ")}: ${r.err()}`);
      assert.match(r.err(), why, args.join(" "));
      assert.doesNotMatch(r.err(), /cannot connect/, args.join(" "));
    }
  });
});

describe("lease run --stream on a server before 2.11.2", {
  skip: OLD === false ? "the server is 2.11.2 or later" : false,
}, () => {
  test("exits 69 without running the command, naming the release it needs", async () => {
    await using ns = await NatsServer.start();
    const r = lease([
      "run",
      "k",
      "--servers",
      ns.url,
      "--stream",
      "ORDERS",
      "--lease-subjects",
      "ORDERS.lease",
      "--",
      "sh",
      "-c",
      "echo ran",
    ]);
    assert.equal(await r.exited, 69, r.err());
    assert.match(r.err(), /leases in a stream need 2\.11\.2 or later/);
    assert.equal(r.out(), "");
  });
});

describe("the lease command with the leases in a stream of the user's", {
  skip: OLD,
}, () => {
  let ns: NatsServer;
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  /** `--servers`, `--stream` and `--lease-subjects` of stream `name`. */
  const at = (name: string) => [
    "--servers",
    ns.url,
    "--stream",
    name,
    "--lease-subjects",
    `${name}.lease`,
  ];
  /** A new stream that can hold leases under `<name>.lease`. */
  const newStream = async (extra: Record<string, unknown> = {}) => {
    const name = uniq("S").replaceAll("-", "_");
    await jsm.streams.add(
      goodConfig(name, extra) as Parameters<typeof jsm.streams.add>[0],
    );
    return name;
  };
  /** The number of messages on each subject of `stream`. */
  const counts = async (stream: string): Promise<Record<string, number>> =>
    (await jsm.streams.info(stream, { subjects_filter: ">" })).state
      .subjects ?? {};

  before(async () => {
    ns = await NatsServer.start();
    nc = await connect({ servers: ns.url });
    jsm = await jetstreamManager(nc);
  });
  after(async () => {
    for (const r of started) r.child.kill("SIGKILL");
    await nc?.close();
    await ns?.[Symbol.asyncDispose]();
  });

  test("a command under lease run --stream appends with lease publish: each message is in the stream at the sequence printed, as published; its environment names the stream, never an inherited bucket; lease ls and lease holder show the tenure only", async () => {
    const name = await newStream();
    const inside = '--servers "$LEASE_SERVERS" --stream "$LEASE_STREAM" ' +
      '--lease-subjects "$LEASE_SUBJECTS"';
    const r = lease(
      [
        "run",
        "orders.daily",
        ...at(name),
        "--node",
        "node-a",
        "--",
        "sh",
        "-c",
        [
          'echo "env $LEASE_STREAM $LEASE_SUBJECTS ${LEASE_BUCKET-nobucket} ${LEASE_DOMAIN-nodomain} $LEASE_EPOCH"',
          `${LEASE} publish ${name}.created '{"id":1}'`,
          `printf 'from stdin' | ${LEASE} publish ${name}.created -`,
          `${LEASE} ls --json ${inside}`,
          `${LEASE} holder "$LEASE_KEY" --json ${inside}`,
        ].join(" && "),
      ],
      // An outer lease run's, which must not reach the command.
      { LEASE_BUCKET: "outer", LEASE_DOMAIN: "hub" },
    );
    assert.equal(await r.exited, 0, r.out() + r.err());
    const [first, seq1, seq2, ...rest] = r.out().trim().split("\n");
    const m = /^env (\S+) (\S+) (\S+) (\S+) (\d+)$/.exec(first!);
    assert.ok(m, r.out());
    assert.deepEqual(m.slice(1, 5), [
      name,
      `${name}.lease`,
      "nobucket",
      "nodomain",
    ]);
    const epoch = Number(m[5]);
    assert.ok(Number(seq1) > epoch && Number(seq2) > Number(seq1), r.out());
    for (const [seq, data] of [[seq1, '{"id":1}'], [seq2, "from stdin"]]) {
      const sm = (await jsm.streams.getMessage(name, { seq: Number(seq) }))!;
      assert.equal(sm.subject, `${name}.created`);
      assert.equal(sm.string(), data);
      // A plain append, as Lease.publish sends it.
      assert.equal(sm.header?.get("KV-Operation") ?? "", "");
    }
    assert.equal((await counts(name))[`${name}.created`], 2);
    // From inside the command: the tenure, held, with its session's
    // expiry (the session's own Nats-TTL: the default TTL, 15 s); never
    // the appends or the session.
    const [row, ...more] = rows(rest.slice(0, -1).join("\n"));
    assert.deepEqual(more, [], r.out());
    assert.deepEqual(
      [row!.key, row!.state, row!.holder, row!.epoch, row!.revision],
      ["orders.daily", "held", "node-a", epoch, epoch],
    );
    assert.equal(typeof row!.session, "string");
    const left = row!.expiresInMs as number;
    assert.ok(left > 0 && left <= 15_000, JSON.stringify(row));
    assert.deepEqual(JSON.parse(rest.at(-1)!), {
      key: "orders.daily",
      holder: { node: "node-a", epoch },
    });
    // Released once the command ended.
    const ls = lease(["ls", "--json", ...at(name)]);
    assert.equal(await ls.exited, 0, ls.err());
    assert.deepEqual(rows(ls.out()).map((x) => [x.key, x.state]), [
      ["orders.daily", "released"],
    ]);
  });

  test("once the key is taken from it (its tenure purged, another manager holding the key), an append under its tenure is refused by the server (exit 1, naming the new tenure's sequence) and nothing is stored; its lease run stops the command (exit 75)", async () => {
    const name = await newStream();
    const r = lease([
      "run",
      "orders",
      ...at(name),
      "--ttl",
      String(TTL),
      "--node",
      "node-a",
      "--kill-after",
      "200",
      "--",
      "sh",
      "-c",
      'echo "epoch $LEASE_EPOCH"; sleep 30',
    ]);
    await until(() => /^epoch \d+$/m.test(r.out()), 10_000, "the command");
    const epoch = /^epoch (\d+)$/m.exec(r.out())![1]!;
    // The environment lease run gave its command, as a command that
    // outlived its lease run (or was paused) would still have it.
    const env = {
      LEASE_STREAM: name,
      LEASE_SUBJECTS: `${name}.lease`,
      LEASE_KEY: "orders",
      LEASE_EPOCH: epoch,
      LEASE_SERVERS: ns.url,
    };
    const ok = lease(["publish", `${name}.created`, "while held"], env);
    assert.equal(await ok.exited, 0, ok.err());
    const m = await createLeaseManager({
      nc,
      node: "node-b",
      ttl: TTL,
      stream: name,
      leaseSubjects: `${name}.lease`,
    });
    try {
      // An operator's purge of the tenure entry frees the key at once.
      await jsm.streams.purge(name, { filter: `${name}.lease.k.orders` });
      await m.guard("orders", async (held) => {
        assert.ok(held.epoch > Number(epoch));
        const late = lease(["publish", `${name}.created`, "too late"], env);
        assert.equal(await late.exited, 1, late.err());
        assert.match(
          late.err(),
          new RegExp(
            `not stored: the tenure of 'orders' at epoch ${epoch} is over \\(its tenure entry is at sequence ${held.epoch} now`,
          ),
        );
      });
      assert.equal(await r.exited, 75, r.err());
      assert.match(r.err(), /lost 'orders'/);
    } finally {
      await m.close();
    }
    const c = await counts(name);
    assert.equal(c[`${name}.created`], 1, JSON.stringify(c));
    const last = await jsm.streams.getMessage(name, {
      last_by_subj: `${name}.created`,
    });
    assert.equal(last!.string(), "while held");
  });

  test("subjects that are no appendable subject of the stream are refused with nothing sent: a pattern, the leases' own, another stream's, no stream's; a LEASE_SUBJECTS the stream does not cover too", async () => {
    const name = await newStream();
    const other = await newStream();
    const seen: string[] = [];
    const subs: Subscription[] = [
      `${name}.lease.k.other`,
      `${name}.lease`,
      `${other}.>`,
      "nowhere.>",
    ].map((s) =>
      nc.subscribe(s, {
        callback: (_, msg) => {
          seen.push(msg.subject);
        },
      })
    );
    await nc.flush();
    const bad = [
      `${name}.*`,
      `${name}.>`,
      `${name}.lease.k.other`,
      `${name}.lease`,
      `${other}.created`,
      "nowhere.created",
    ];
    try {
      const r = lease([
        "run",
        "k",
        ...at(name),
        "--",
        "sh",
        "-c",
        [
          ...bad.map((s) =>
            `${LEASE} publish '${s}' bad; echo "status ${s} $?"`
          ),
          `LEASE_SUBJECTS=elsewhere.lease ${LEASE} publish ${name}.created bad; echo "status subjects $?"`,
          `${LEASE} publish ${name}.created good; echo "status good $?"`,
        ].join("; "),
      ]);
      assert.equal(await r.exited, 0, r.out() + r.err());
      const status = (what: string) =>
        new RegExp(`^status ${what.replace(/[.*>]/g, "\\$&")} (\\d+)$`, "m")
          .exec(r.out())?.[1];
      for (const s of bad) assert.equal(status(s), "65", `${s}: ${r.err()}`);
      assert.equal(status("subjects"), "64", r.err());
      assert.equal(status("good"), "0", r.err());
      assert.match(
        r.err(),
        new RegExp(`"${other}\\.created": not a subject of stream '${name}'`),
      );
      assert.match(r.err(), /"nowhere\.created": not a subject of stream/);
      assert.match(
        r.err(),
        new RegExp(
          `stream '${name}' keeps no leases under 'elsewhere\\.lease'`,
        ),
      );
      await nc.flush();
      assert.deepEqual(seen, [], "nothing was published");
      const c = await counts(name);
      assert.deepEqual(
        Object.keys(c).filter((s) => !s.startsWith(`${name}.lease.`)),
        [`${name}.created`],
      );
      assert.equal(c[`${name}.created`], 1);
      assert.equal(c[`${name}.lease.k.other`], undefined);
      assert.equal((await jsm.streams.info(other)).state.messages, 0);
    } finally {
      for (const s of subs) s.unsubscribe();
    }
  });

  test("a killed lease run's tenure shows as orphaned once its session expires (ls, holder, watch --all), appends and sessions are never listed, and the next run takes the key at once", async () => {
    const name = await newStream();
    const r = lease([
      "run",
      "crash",
      ...at(name),
      "--ttl",
      String(TTL),
      "--node",
      "node-a",
      "--",
      "sh",
      "-c",
      `${LEASE} publish ${name}.log x && echo "epoch $LEASE_EPOCH" && sleep 30`,
    ]);
    await until(() => /^epoch \d+$/m.test(r.out()), 10_000, "the command");
    const epoch = Number(/^epoch (\d+)$/m.exec(r.out())![1]);
    const w = lease(["watch", "--all", "--json", ...at(name)]);
    await until(() => /"state":"held"/.test(w.out()), 5_000, "the watch");
    r.child.kill("SIGKILL"); // no release: the session is left to expire
    await until(
      () => /"state":"orphaned"/.test(w.out()),
      4 * TTL + 5_000,
      "orphaned",
    );
    const ls = lease(["ls", "--json", ...at(name)]);
    assert.equal(await ls.exited, 0, ls.err());
    const [row, ...more] = rows(ls.out());
    assert.deepEqual(more, [], ls.out());
    assert.deepEqual(
      [row!.key, row!.state, row!.holder, row!.epoch],
      ["crash", "orphaned", "node-a", epoch],
    );
    // None left: null once the server replaced the session's entry with
    // its marker, or its age past the entry's Nats-TTL while the server
    // has yet to (2.11.2 expires it a moment late).
    const left = row!.expiresInMs as number | null;
    assert.ok(left === null || left <= 0, JSON.stringify(row));
    const h = lease(["holder", "crash", "--json", ...at(name)]);
    assert.equal(await h.exited, 0, h.err());
    assert.deepEqual(JSON.parse(h.out()), {
      key: "crash",
      holder: null,
      orphaned: { node: "node-a", epoch },
    });
    const seen = rows(w.out());
    assert.deepEqual(seen.map((s) => s.key), ["crash", "crash"], w.out());
    assert.deepEqual(seen.map((s) => s.state), ["held", "orphaned"]);
    const next = lease([
      "run",
      "crash",
      ...at(name),
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
    w.child.kill("SIGTERM");
  });

  test("a missing stream exits 69 for run, ls, holder and watch; a stream that cannot hold leases exits 69 naming the setting and is left as it was; a --lease-subjects it does not cover exits 64", async () => {
    for (
      const args of [
        ["run", "k", ...at("NO_SUCH_STREAM"), "--", "sh", "-c", "echo ran"],
        ["ls", ...at("NO_SUCH_STREAM")],
        ["holder", "k", ...at("NO_SUCH_STREAM")],
        ["watch", "k", ...at("NO_SUCH_STREAM")],
      ]
    ) {
      const r = lease(args);
      assert.equal(await r.exited, 69, `${args[0]}: ${r.err()}`);
      assert.match(r.err(), /stream 'NO_SUCH_STREAM' does not exist/);
      assert.equal(r.out(), "");
    }
    const aged = await newStream({ max_age: 3_600_000_000_000 });
    const was = (await jsm.streams.info(aged)).config;
    const r = lease(["run", "k", ...at(aged), "--", "sh", "-c", "echo ran"]);
    assert.equal(await r.exited, 69, r.err());
    assert.match(r.err(), /'max_age'/);
    assert.equal(r.out(), "");
    const si = await jsm.streams.info(aged);
    assert.equal(si.state.messages, 0, "nothing was written");
    assert.deepEqual(si.config, was, "the stream was not changed");
    const name = await newStream();
    const wrong = lease([
      "ls",
      "--servers",
      ns.url,
      "--stream",
      name,
      "--lease-subjects",
      "elsewhere.lease",
    ]);
    assert.equal(await wrong.exited, 64, wrong.err());
    assert.match(
      wrong.err(),
      new RegExp(
        `stream '${name}' keeps no leases under 'elsewhere\\.lease': its subjects \\(${name}\\.>\\)`,
      ),
    );
  });
});
