// test.sh: node only: what is tested runs in Chromium (pages and a Web Worker), which this process drives with playwright-core
// The lease module in a real browser: Debian's Chromium (/usr/bin/chromium,
// installed by scripts/setup.sh), driven by playwright-core, loads the
// module as a browser user does, as an esbuild bundle (platform "browser",
// ES module, no Node or Deno shim) of examples/browser/lease.ts, served over
// HTTP from a loopback port, and connects with `wsconnect` to a real
// nats-server's WebSocket listener. This process takes part as a Node
// client (`connect` from @nats-io/transport-node). It proves:
// - two pages and this process campaign for one key, one leader at a time,
//   epochs growing;
// - a leading page's close() hands the key on well within TTL/2;
// - a leading page's renderer crashed (CDP Page.crash) is replaced by this
//   process after the TTL and the grace;
// - a guard with check: "lease" on a held key sends no WebSocket frame and
//   no message;
// - the module runs in a dedicated Web Worker of a page;
// - on a fenced bucket (nats-server 2.11.2+), a page's guarded put is
//   stored (read back with plain @nats-io/kv), and when its renderer
//   crashes, this process, waiting with a fenced manager, takes the key
//   within TTL/2 because the server answers the page's session probe "no
//   responders" (found "crashed"), and its own fenced put lands;
// - with the leases in a stream of the user's (`stream`, `leaseSubjects`,
//   nats-server 2.11.2+), a page's lease.publish (and, on 2.12+, its
//   lease.commit) appends to the stream; when its renderer crashes, this
//   process, waiting with a manager on the same stream, takes the key
//   within TTL/2 (found "crashed"), its own append lands, and the stream
//   holds nothing of the page's after it;
// - examples/browser/ shows the leader, and a closed leading tab hands over
//   at once (LEASE_SCREENSHOT=1 saves docs/img/browser-leader.png);
// - docs/runtimes.md's browser quick start, built and served by its esbuild
//   command, shows a leader, and hands over when the leading tab closes;
// - no page logs an uncaught error or a console.error (a worker's errors
//   reach its page's events too).
// Every wait has a timeout, and everything started here is stopped in
// `after`, so that a failure reports instead of hanging.
import { after } from "node:test";
// A failed test (or `before`) names the server's last log lines.
import { before, test } from "./test_util/server_logs.ts";
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as http from "node:http";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";
import {
  type Browser,
  type BrowserContext,
  chromium,
  type Page,
} from "playwright-core";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";
import {
  createLeaseManager,
  type LeaseAcquiredEvent,
  type LeaseManager,
} from "./mod.ts";
import { atomicVersion, markersVersion } from "./lease/servers.ts";
import { versionOf } from "./test_util/lease_helpers.ts";
import { NatsServer, natsServerBinary } from "./test_util/nats_server.ts";

const root = fileURLToPath(new URL(".", import.meta.url));
const CHROMIUM = "/usr/bin/chromium";
// The flags that keep Chromium quiet on a closed network and runnable as
// root in a container; playwright-core adds headless mode and a new, empty
// user-data-dir of its own (deleted on close).
const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];
/** TTL of the campaign's bucket: short, so the crash case ends in seconds. */
const TTL = 2_000;
/** Upper bound of any single wait on the browser or a page. */
const WAIT = 10_000;
/** Why the fenced-bucket test is skipped: a server before 2.11.2. */
const NO_FENCED = markersVersion(versionOf(natsServerBinary()))
  ? false
  : "fenced buckets need nats-server 2.11.2 or later";
/** Why the stream-layout test is skipped: a server before 2.11.2. */
const NO_STREAM = NO_FENCED &&
  "leases in a stream need nats-server 2.11.2 or later";

/** Rejects with a message naming `what` unless `p` settles within `ms`. */
async function within<T>(ms: number, p: Promise<T>, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`Timed out after ${ms} ms: ${what}`)),
      ms,
    );
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `check` every 25 ms until it returns a value, or throws after `ms`. */
async function until<T>(
  ms: number,
  what: string,
  check: () => T | undefined,
): Promise<T> {
  const end = performance.now() + ms;
  for (;;) {
    const v = check();
    if (v !== undefined) return v;
    if (performance.now() > end) {
      throw new Error(`Timed out after ${ms} ms: ${what}`);
    }
    await sleep(25);
  }
}

// ---------------------------------------------------------------------------
// The pages. The harness page loads the bundle and defines, in plain JS,
// the few calls the tests make into it (`h.*`, called with page.evaluate);
// its campaign reports each tenure's start and end through `report`, a
// function this process exposes to the page, with the page's own
// Date.now(): the pages and this process read one system clock.

const HARNESS_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>harness</title>
<link rel="icon" href="data:,"></head><body>
<script type="module">
import { createLeaseManager, wsconnect } from "/dist/lease.js";
const h = {};
h.start = async ({ ws, node, bucket, ttl, key }) => {
  h.nc = await wsconnect({ servers: ws, name: node });
  h.leases = await createLeaseManager({ nc: h.nc, node, bucket, ttl });
  if (key === undefined) return;
  (async () => {
    for await (const lease of h.leases.campaign(key)) {
      const epoch = lease.epoch;
      globalThis.report({ node, epoch, kind: "lead", at: Date.now() });
      await new Promise((resolve) => {
        const end = () => {
          globalThis.report({ node, epoch, kind: "end", at: Date.now() });
          resolve();
        };
        if (lease.signal.aborted) end();
        else lease.signal.addEventListener("abort", end, { once: true });
      });
    }
  })().catch((err) => console.error("campaign failed", err));
};
h.close = async () => {
  const at = Date.now();
  const result = await h.leases.close();
  await h.nc.close();
  return { at, result };
};
h.guard = async (key) => h.leases.guard(key, (lease) => lease.epoch);
// Runs n lease-checked guards; 'inside' says each write ran inside its
// guard call, before the call returned: no round trip can have happened.
h.guardLease = async (key, n) => {
  const epochs = [];
  let inside = true;
  for (let i = 0; i < n; i++) {
    let ran = false;
    const p = h.leases.guard(key, (lease) => { ran = true; return lease.epoch; }, { check: "lease" });
    inside &&= ran;
    epochs.push(await p);
  }
  return { epochs, inside };
};
// A fenced manager of its own (a fenced bucket), which takes a key and
// puts "<node>:<epoch>" to a data key of the bucket under it, and keeps
// the key.
h.fenced = async ({ ws, node, bucket, ttl, key, dataKey }) => {
  h.fnc = await wsconnect({ servers: ws, name: node });
  h.fleases = await createLeaseManager({ nc: h.fnc, node, bucket, ttl, fenced: true });
  return await h.fleases.guard(key, async (lease) => {
    const value = node + ":" + lease.epoch;
    return { epoch: lease.epoch, value, revision: await lease.put(dataKey, value) };
  });
};
// A manager of its own on a stream of the user's (stream and
// leaseSubjects), which takes a key, appends "<node>:<epoch>" to a subject
// of the stream with lease.publish (and, where the stream allows atomic
// batches, two more with one lease.commit), and keeps the key.
h.stream = async ({ ws, node, stream, leaseSubjects, ttl, key, subject, atomic }) => {
  h.snc = await wsconnect({ servers: ws, name: node });
  h.sleases = await createLeaseManager({ nc: h.snc, node, stream, leaseSubjects, ttl });
  return await h.sleases.guard(key, async (lease) => {
    const value = node + ":" + lease.epoch;
    const seq = await lease.publish(subject, value);
    const commit = atomic
      ? await lease.commit([
        { publish: subject, data: value + ":commit-1" },
        { publish: subject, data: value + ":commit-2" },
      ])
      : null;
    return { epoch: lease.epoch, value, seq, commit };
  });
};
h.worker = (msg) => {
  h.w ??= new Worker("/harness_worker.js", { type: "module" });
  return new Promise((resolve, reject) => {
    h.w.onmessage = ({ data }) => resolve(data);
    h.w.onerror = (e) => reject(new Error("worker: " + e.message));
    h.w.postMessage(msg);
  });
};
globalThis.h = h;
</script></body></html>
`;

// The dedicated worker imports the same bundle: it takes a lease with a CAS
// guard, guards again with check "lease", and waits to be told to close.
const HARNESS_WORKER =
  `import { createLeaseManager, wsconnect } from "/dist/lease.js";
let nc, leases;
onmessage = async ({ data }) => {
  try {
    if (data.op === "take") {
      nc = await wsconnect({ servers: data.ws, name: data.node });
      leases = await createLeaseManager({ nc, node: data.node, bucket: data.bucket, ttl: data.ttl });
      const epoch = await leases.guard(data.key, (lease) => lease.epoch);
      const again = await leases.guard(data.key, (lease) => lease.epoch, { check: "lease" });
      postMessage({ ok: true, epoch, again, isWorker: typeof WorkerGlobalScope === "function" && self instanceof WorkerGlobalScope });
    } else {
      const closed = await leases.close();
      await nc.close();
      postMessage({ ok: true, closed });
    }
  } catch (err) {
    postMessage({ ok: false, error: String(err && err.stack || err) });
  }
};
`;

// ---------------------------------------------------------------------------
// Shared state, set up once: one server, one bundle, one HTTP server, one
// browser.

let ns: NatsServer | undefined;
let dist: string | undefined;
let web: http.Server | undefined;
let base = "";
let browser: Browser | undefined;
let context: BrowserContext | undefined;
let nc: NatsConnection | undefined;
let leases: LeaseManager | undefined;
/** esbuild serving the quick start of docs/runtimes.md. */
let quickstart: ChildProcess | undefined;
/** Every page's uncaught errors and console.error lines, by page name. */
const problems: string[] = [];
/** Tenure starts and ends, from the pages (via report) and from this process. */
interface Tenure {
  node: string;
  epoch: number;
  kind: "lead" | "end";
  at: number;
}
const tenures: Tenure[] = [];

before(async () => {
  assert.ok(
    fs.existsSync(CHROMIUM),
    `${CHROMIUM} is missing: run 'bash scripts/setup.sh', which installs Debian's chromium`,
  );
  ns = await NatsServer.start({ websocket: true });
  dist = fs.mkdtempSync(path.join(os.tmpdir(), "lease-browser-"));
  await esbuild.build({
    entryPoints: [path.join(root, "examples/browser/lease.ts")],
    bundle: true,
    format: "esm",
    platform: "browser",
    outdir: dist,
    logLevel: "warning",
  });
  // esbuild keeps a service process until told to stop.
  await esbuild.stop();
  web = http.createServer(serve);
  await new Promise<void>((resolve) => web!.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(web.address() as net.AddressInfo).port}`;
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: CHROMIUM_ARGS,
    timeout: WAIT,
  });
  context = await browser.newContext({ viewport: { width: 560, height: 340 } });
  context.setDefaultTimeout(WAIT);
  nc = await connect({ servers: ns.url });
  leases = await createLeaseManager({
    nc,
    node: "node-process",
    bucket: "browser",
    ttl: TTL,
  });
  console.log(
    `  [figures] Chromium ${browser.version()}, bundle ${
      fs.statSync(path.join(dist, "lease.js")).size
    } bytes, nats-server ${ns.version}`,
  );
});

after(async () => {
  // Each step is bounded and runs even when one before it failed.
  const steps: [string, () => Promise<unknown> | undefined][] = [
    ["close the lease manager", () => leases?.close()],
    ["close the connection", () => nc?.close()],
    ["close the browser", () => browser?.close()],
    ["close the HTTP server", () => {
      web?.closeAllConnections();
      return new Promise((r) => web ? web.close(r) : r(undefined));
    }],
    ["stop esbuild's server", () => stopQuickstart()],
    ["stop the server", () => ns?.[Symbol.asyncDispose]()],
  ];
  for (const [what, step] of steps) {
    try {
      await within(WAIT, Promise.resolve(step()), what);
    } catch (err) {
      console.error(`  after: ${(err as Error).message}`);
      if (what === "close the browser") killChromium();
    }
  }
  if (dist !== undefined) fs.rmSync(dist, { recursive: true, force: true });
});

/** Last resort when browser.close() hangs: SIGKILL our own Chromium children, by pid. */
function killChromium(): void {
  for (const pid of fs.readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      if (
        ppid === process.pid &&
        fs.readlinkSync(`/proc/${pid}/exe`).includes("chromium")
      ) process.kill(Number(pid), "SIGKILL");
    } catch {
      // Gone already, or not ours to read.
    }
  }
}

/** The static server: the harness, the example's files, and the bundle. */
function serve(req: http.IncomingMessage, res: http.ServerResponse): void {
  const url = new URL(req.url ?? "/", base);
  const types: Record<string, string> = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
  };
  let body: string | Buffer | undefined;
  if (url.pathname === "/harness.html") body = HARNESS_HTML;
  else if (url.pathname === "/harness_worker.js") body = HARNESS_WORKER;
  else {
    // The example's directory, with dist/ taken from the fresh build.
    const rel = url.pathname === "/" ? "index.html" : url.pathname.slice(1);
    const file = rel.startsWith("dist/")
      ? path.join(dist!, rel.slice("dist/".length))
      : path.join(root, "examples/browser", rel);
    if (!rel.includes("..") && fs.existsSync(file)) {
      body = fs.readFileSync(file);
    }
  }
  if (body === undefined) {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, {
    "content-type": types[path.extname(url.pathname) || ".html"] ??
      "application/octet-stream",
  });
  res.end(body);
}

/** Opens a page named `name`, collecting its errors, with `report` exposed. */
async function open(name: string, url: string): Promise<Page> {
  const page = await context!.newPage();
  page.on(
    "pageerror",
    (err) => problems.push(`${name}: uncaught ${err.stack ?? err}`),
  );
  page.on("console", (msg) => {
    if (msg.type() === "error") {
      problems.push(`${name}: console.error ${msg.text()}`);
    }
  });
  await page.exposeFunction("report", (t: Tenure) => {
    tenures.push(t);
  });
  await page.goto(url.startsWith("http") ? url : `${base}${url}`, {
    timeout: WAIT,
  });
  return page;
}

/** Opens the harness page and waits until its module has loaded. */
async function harness(name: string): Promise<Page> {
  const page = await open(name, "/harness.html");
  await page.waitForFunction("globalThis.h !== undefined", null, {
    timeout: WAIT,
  });
  return page;
}

/** Calls `h.<fn>(...args)` in the page, bounded by WAIT. */
function call<T>(page: Page, fn: string, ...args: unknown[]): Promise<T> {
  const list = args.map((a) => JSON.stringify(a)).join(", ");
  return within(
    WAIT,
    page.evaluate(`h.${fn}(${list})`) as Promise<T>,
    `h.${fn} in the page`,
  );
}

/** This process's campaign on `key`, recording its tenures, until `signal`. */
async function campaign(key: string, signal: AbortSignal): Promise<void> {
  for await (const lease of leases!.campaign(key, { signal })) {
    const epoch = lease.epoch;
    tenures.push({ node: leases!.node, epoch, kind: "lead", at: Date.now() });
    await new Promise<void>((resolve) => {
      const end = () => {
        tenures.push({
          node: leases!.node,
          epoch,
          kind: "end",
          at: Date.now(),
        });
        resolve();
      };
      if (lease.signal.aborted) end();
      else lease.signal.addEventListener("abort", end, { once: true });
      // Leaving the loop releases the key, which ends the tenure above.
      signal.addEventListener("abort", () => resolve(), { once: true });
    });
    if (signal.aborted) break;
  }
}

/** The tenure that started last, once it is by someone other than `not`. */
function leaderOtherThan(not: string[]): Tenure | undefined {
  const starts = tenures.filter((t) => t.kind === "lead");
  const last = starts.at(-1);
  return last !== undefined && !not.includes(last.node) ? last : undefined;
}

// ---------------------------------------------------------------------------
// The campaign: pages A and B and this process, on one key.

const KEY = "browser-leader";
let pageA: Page | undefined;
let pageB: Page | undefined;
let nodeCampaign: { stop: AbortController; done: Promise<void> } | undefined;

function startNodeCampaign(): void {
  const stop = new AbortController();
  nodeCampaign = { stop, done: campaign(KEY, stop.signal) };
}

test(
  "two pages and a Node process campaign for one key: page A leads, B and Node wait",
  {
    timeout: 20_000,
  },
  async () => {
    pageA = await harness("page A");
    pageB = await harness("page B");
    const opts = { ws: ns!.wsUrl, bucket: "browser", ttl: TTL, key: KEY };
    await call(pageA, "start", { ...opts, node: "page-A" });
    const a = await until(WAIT, "page A leads", () => leaderOtherThan([]));
    assert.equal(a.node, "page-A");
    await call(pageB, "start", { ...opts, node: "page-B" });
    startNodeCampaign();
    // Both wait: nobody else leads while A holds the key.
    await sleep(300);
    assert.deepEqual(
      tenures.filter((t) => t.kind === "lead").map((t) => t.node),
      ["page-A"],
    );
    const holder = await leases!.holder(KEY);
    assert.deepEqual(holder, { node: "page-A", epoch: a.epoch });
  },
);

test(
  `the leading page's close() hands the key on well before the TTL (${TTL} ms) would`,
  {
    timeout: 20_000,
  },
  async () => {
    const { at, result } = await call<{ at: number; result: unknown }>(
      pageA!,
      "close",
    );
    assert.deepEqual(result, { released: [KEY], unreleased: [] });
    const next = await until(
      WAIT,
      "a new leader after A's close",
      () => leaderOtherThan(["page-A"]),
    );
    const ms = next.at - at;
    console.log(
      `  [figures] handover after page A's close(): ${ms} ms, to ${next.node}`,
    );
    assert.ok(ms < TTL / 2, `handover took ${ms} ms, not under TTL/2`);
    if (next.node === leases!.node) {
      // This process took it: step down, so that page B leads and can be
      // crashed, then campaign again.
      const t0 = Date.now();
      nodeCampaign!.stop.abort();
      await within(WAIT, nodeCampaign!.done, "the Node campaign to end");
      const b = await until(
        WAIT,
        "page B leads",
        () => leaderOtherThan([leases!.node]),
      );
      console.log(
        `  [figures] handover after Node's step-down: ${b.at - t0} ms`,
      );
      assert.ok(b.at - t0 < TTL / 2);
      startNodeCampaign();
    }
    assert.equal(leaderOtherThan([])?.node, "page-B");
  },
);

test(
  "a leading page's renderer crashes (CDP Page.crash): Node takes over after the TTL and the grace",
  {
    timeout: 20_000,
  },
  async () => {
    const b = leaderOtherThan([])!;
    assert.equal(b.node, "page-B");
    const cdp = await context!.newCDPSession(pageB!);
    const crashed = new Promise<void>((r) => pageB!.once("crash", () => r()));
    const killedAt = Date.now();
    // The command gets no answer from a renderer that is gone.
    void cdp.send("Page.crash").catch(() => {});
    await within(WAIT, crashed, "page B to crash");
    const n = await until(
      3 * TTL + WAIT,
      "Node leads after the crash",
      () => leaderOtherThan(["page-B"]),
    );
    const ms = n.at - killedAt;
    console.log(
      `  [figures] failover after page B's crash: ${ms} ms (TTL ${TTL} ms + grace)`,
    );
    assert.equal(n.node, leases!.node);
    assert.ok(n.epoch > b.epoch);
    // The entry lives on until its TTL runs out (renewed at most TTL/3
    // before the crash), then the grace of one TTL follows.
    assert.ok(
      ms >= TTL,
      `took over ${ms} ms after the crash, before the grace`,
    );
    assert.ok(ms < 3 * TTL + 2_000, `took ${ms} ms`);
    // The crashed page's tenure ended when it crashed: nothing ran after.
    tenures.push({ node: "page-B", epoch: b.epoch, kind: "end", at: killedAt });
    await within(WAIT, pageB!.close(), "closing the crashed page");
  },
);

test("the leader transitions: one leader at a time, epochs growing", () => {
  nodeCampaign!.stop.abort();
  const starts = tenures.filter((t) => t.kind === "lead")
    .sort((x, y) => x.at - y.at);
  console.log(
    `  [figures] leaders: ${
      starts.map((t) => `${t.node}@${t.epoch}`).join(" -> ")
    }`,
  );
  assert.ok(starts.length >= 3, "A, then B or Node, then Node");
  for (let i = 1; i < starts.length; i++) {
    const prev = starts[i - 1]!;
    assert.ok(starts[i]!.epoch > prev.epoch, "epochs grow");
    const end = tenures.find((t) =>
      t.kind === "end" && t.node === prev.node && t.epoch === prev.epoch
    );
    assert.ok(end, `${prev.node}@${prev.epoch} ended`);
    assert.ok(
      end.at <= starts[i]!.at,
      `${prev.node}@${prev.epoch} ended at ${end.at}, after ${
        starts[i]!.node
      } began at ${starts[i]!.at}`,
    );
  }
});

// ---------------------------------------------------------------------------

test(
  'a page\'s guard with check: "lease" on a held key sends no WebSocket frame and no message',
  {
    timeout: 20_000,
  },
  async () => {
    const page = await harness("page G");
    let framesSent = 0;
    page.on("websocket", (ws) => ws.on("framesent", () => framesSent++));
    const node = "page-G";
    const key = "guarded";
    // A long TTL: no renewal (every TTL/3) falls inside the measured window.
    await call(page, "start", {
      ws: ns!.wsUrl,
      node,
      bucket: "browser-guard",
      ttl: 30_000,
    });
    const epoch = await call<number>(page, "guard", key);
    await sleep(300); // let the CAS's frames reach this process
    const frames0 = framesSent;
    const msgs0 = await inMsgs(node);
    const { epochs, inside } = await call<
      { epochs: number[]; inside: boolean }
    >(
      page,
      "guardLease",
      key,
      100,
    );
    await sleep(300);
    const frames1 = framesSent;
    const msgs1 = await inMsgs(node);
    console.log(
      `  [figures] 100 lease-checked guards: ${frames1 - frames0} frames, ${
        msgs1 - msgs0
      } messages sent (${frames0} frames before)`,
    );
    assert.ok(inside, "every write ran inside its guard call");
    assert.deepEqual(new Set(epochs), new Set([epoch]));
    assert.equal(frames1 - frames0, 0, "WebSocket frames sent by the page");
    assert.equal(msgs1 - msgs0, 0, "messages the server got from the page");
    // The counters do see this page: a CAS-checked guard sends its CAS.
    await call(page, "guard", key);
    await until(
      WAIT,
      "a frame from the CAS guard",
      () => framesSent > frames1 ? true : undefined,
    );
    assert.ok((await inMsgs(node)) > msgs1);
    await call(page, "close");
    await within(WAIT, page.close(), "closing page G");
  },
);

/** The messages the server received from the client named `name` (connz). */
async function inMsgs(name: string): Promise<number> {
  const res = await fetch(`${ns!.httpUrl}/connz?limit=1024`, {
    signal: AbortSignal.timeout(WAIT),
  });
  const body = await res.json() as {
    connections?: { name?: string; in_msgs: number }[];
  };
  const c = body.connections?.find((c) => c.name === name);
  assert.ok(c, `no connection named ${name} in connz`);
  return c.in_msgs;
}

test("a dedicated Web Worker loads the bundle, takes a lease and guards it", {
  timeout: 20_000,
}, async () => {
  const page = await harness("page W");
  const node = "worker-W";
  const key = "in-worker";
  const took = await call<
    {
      ok: boolean;
      epoch: number;
      again: number;
      isWorker: boolean;
      error?: string;
    }
  >(page, "worker", {
    op: "take",
    ws: ns!.wsUrl,
    node,
    bucket: "browser",
    ttl: TTL,
    key,
  });
  assert.ok(took.ok, took.error);
  assert.ok(took.isWorker, "ran in a WorkerGlobalScope");
  assert.equal(took.again, took.epoch);
  // Seen from this process, the worker holds the key.
  assert.deepEqual(await leases!.holder(key), { node, epoch: took.epoch });
  const closed = await call<{ ok: boolean; closed: unknown }>(page, "worker", {
    op: "close",
  });
  assert.deepEqual(closed.closed, { released: [key], unreleased: [] });
  assert.equal(await leases!.holder(key), null);
  await within(WAIT, page.close(), "closing page W");
});

test(
  "examples/browser/ shows the leading tab and its epoch, and the other tab leads once it is closed",
  {
    timeout: 20_000,
  },
  async () => {
    const url = `/index.html?ws=${
      encodeURIComponent(ns!.wsUrl!)
    }&key=tabs-demo`;
    const first = await open("example tab 1", url);
    await first.waitForFunction(
      "document.getElementById('status').textContent.startsWith('This tab leads')",
      null,
      { timeout: WAIT },
    );
    const second = await open("example tab 2", url);
    await second.waitForFunction(
      "/^Tab tab-\\w+ leads, under epoch \\d+/.test(document.getElementById('status').textContent)",
      null,
      { timeout: WAIT },
    );
    const leader = await first.textContent("#me");
    const seen = await second.textContent("#status");
    assert.ok(seen?.startsWith(`Tab ${leader} leads`), seen ?? "");
    // Closing the leading tab: its pagehide handler releases the key, so the
    // other tab leads long before the example's TTL (5 s) would let it.
    const t0 = performance.now();
    await within(WAIT, first.close(), "closing the leading tab");
    await second.waitForFunction(
      "document.getElementById('status').textContent.startsWith('This tab leads')",
      null,
      { timeout: 4_000 },
    );
    console.log(
      `  [figures] example: the second tab leads ${
        Math.round(performance.now() - t0)
      } ms after the leading tab was closed`,
    );
    // The screenshot goes to the temp dir, so a test run leaves the clone
    // unchanged; LEASE_SCREENSHOT=1 writes it to docs/img/ instead.
    const shot = process.env.LEASE_SCREENSHOT === "1"
      ? path.join(root, "docs/img/browser-leader.png")
      : path.join(dist!, "browser-leader.png");
    await second.screenshot({ path: shot });
    const png = fs.readFileSync(shot);
    assert.equal(png.subarray(1, 4).toString(), "PNG");
    console.log(`  [figures] screenshot: ${shot}, ${png.length} bytes`);
    await within(WAIT, second.close(), "closing the second tab");
  },
);

// ---------------------------------------------------------------------------
// docs/runtimes.md's browser quick start, run as written, with the changes
// readme_test.ts makes too: free ports in place of 8000 and 8080, a temp
// folder in place of the quick start's. That folder has the packages
// installed; here the clone's node_modules and, for @nats-lease/lease, an
// esbuild alias to mod.ts stand in for them.

/** The code of the block named `name` (the fence after `<!-- block: NAME -->`). */
function block(file: string, name: string): string {
  const text = fs.readFileSync(path.join(root, file), "utf8");
  const m = new RegExp(
    `<!-- block: ${name} -->\\n+\`\`\`\\w*\\n([\\s\\S]*?)\\n\`\`\`\\n`,
  ).exec(text);
  assert.ok(m, `no block named ${name} in ${file}`);
  return m[1]! + "\n";
}

/** A port that was free a moment ago. */
async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const { port } = srv.address() as net.AddressInfo;
  await new Promise((r) => srv.close(r));
  return port;
}

/** Stops esbuild's server by its pid, and waits (bounded) for it to exit. */
async function stopQuickstart(): Promise<void> {
  const child = quickstart;
  if (
    child === undefined || child.exitCode !== null || child.signalCode !== null
  ) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGKILL");
  await within(WAIT, exited, "esbuild to exit");
}

test(
  "docs/runtimes.md's browser quick start, built and served by its esbuild command: a tab leads, and the other once it is closed",
  { timeout: 25_000 },
  async () => {
    const doc = "docs/runtimes.md";
    const dir = fs.mkdtempSync(path.join(dist!, "quickstart-"));
    fs.writeFileSync(path.join(dir, "index.html"), block(doc, "browser-html"));
    const app = block(doc, "browser-app");
    assert.ok(app.includes("ws://127.0.0.1:8080"));
    // The file the page loads (dist/tabs.js) is built from tabs.js, the
    // name the doc gives the block: not app.js, which would overwrite the
    // quick start's own app.js in the same folder.
    fs.writeFileSync(
      path.join(dir, "tabs.js"),
      app.replace("ws://127.0.0.1:8080", ns!.wsUrl!),
    );
    fs.symlinkSync(
      path.join(root, "node_modules"),
      path.join(dir, "node_modules"),
    );
    // `npx --yes esbuild@VERSION`: the clone's esbuild stands in for what
    // npx fetches, so the doc must name that version.
    const npx = /^npx --yes esbuild@(\S+) (.*)$/m.exec(
      block(doc, "browser-run"),
    );
    assert.ok(npx, "the block runs npx --yes esbuild@VERSION");
    const [command, version, rest] = npx;
    const esbuildPkg = JSON.parse(
      fs.readFileSync(
        path.join(root, "node_modules/esbuild/package.json"),
        "utf8",
      ),
    );
    assert.equal(version, esbuildPkg.version, command);
    const port = await freePort();
    const args = rest!.split(" ")
      .map((a) =>
        a === "--serve=127.0.0.1:8000" ? `--serve=127.0.0.1:${port}` : a
      );
    assert.ok(args.includes(`--serve=127.0.0.1:${port}`), command);
    args.push(`--alias:@nats-lease/lease=${path.join(root, "mod.ts")}`);
    // esbuild serves until its stdin closes, so stdin stays an open pipe.
    quickstart = spawn(path.join(root, "node_modules/.bin/esbuild"), args, {
      cwd: dir,
      stdio: ["pipe", "ignore", "pipe"],
    });
    let stderr = "";
    quickstart.stderr!.on("data", (d) => stderr += d);
    const url = `http://127.0.0.1:${port}/`;
    const end = performance.now() + WAIT;
    for (;;) {
      const ok = await fetch(url, { signal: AbortSignal.timeout(1_000) })
        .then((r) => r.ok, () => false);
      if (ok) break;
      assert.ok(
        performance.now() < end,
        `esbuild did not serve ${url}:\n${stderr}`,
      );
      assert.equal(quickstart.exitCode, null, `esbuild exited:\n${stderr}`);
      await sleep(100);
    }
    const out = (page: Page, re: RegExp) =>
      page.waitForFunction(
        `${re}.test(document.getElementById("out").textContent)`,
        null,
        { timeout: WAIT },
      );
    const tab1 = await open("quick start tab 1", url);
    await out(tab1, /^tab-\w+ leads, under epoch \d+\.$/);
    const tab2 = await open("quick start tab 2", url);
    await out(tab2, /^tab-\w+ waits for the lease\.$/);
    const t0 = performance.now();
    await within(WAIT, tab1.close(), "closing the leading tab");
    // Within 4 s, where a lease left to expire would take the TTL (15 s)
    // and the grace.
    await tab2.waitForFunction(
      `/ leads, under epoch \\d+\\.$/.test(document.getElementById("out").textContent)`,
      null,
      { timeout: 4_000 },
    );
    console.log(
      `  [figures] quick start: the second tab leads ${
        Math.round(performance.now() - t0)
      } ms after the leading tab was closed`,
    );
    await within(WAIT, tab2.close(), "closing the second tab");
    await stopQuickstart();
  },
);

// ---------------------------------------------------------------------------
// A fenced bucket (createLeaseManager({ fenced: true })): no grace, and a
// holder whose connection is gone is replaced as soon as the server says so.

test(
  "fenced bucket: a page's fenced put is stored; when its renderer crashes, Node takes the key as soon as the page's connection is gone (found \"crashed\"), far inside the TTL, and its fenced put lands",
  { timeout: 20_000, skip: NO_FENCED },
  async () => {
    const bucket = "browser-fenced";
    const key = "fenced-leader";
    const dataKey = "fenced-leader.value";
    // This process's fenced manager creates the bucket (TTL 2 s).
    const fenced = await createLeaseManager({
      nc: nc!,
      node: "node-fenced",
      bucket,
      ttl: TTL,
      fenced: true,
    });
    const page = await harness("page F");
    try {
      const found: string[] = [];
      fenced.addEventListener("acquired", (e) => {
        const a = e as LeaseAcquiredEvent;
        found.push(`${a.key} ${a.found} ${a.grace}`);
      });
      const put = await call<
        { epoch: number; value: string; revision: number }
      >(page, "fenced", {
        ws: ns!.wsUrl,
        node: "page-F",
        bucket,
        ttl: TTL,
        key,
        dataKey,
      });
      assert.equal(put.value, `page-F:${put.epoch}`);
      // Plain KV reads what the page's fenced put stored.
      const kv = await new Kvm(nc!).open(bucket);
      const stored = await kv.get(dataKey);
      assert.equal(stored?.string(), put.value);
      assert.equal(stored?.revision, put.revision);
      assert.deepEqual(await fenced.holder(key), {
        node: "page-F",
        epoch: put.epoch,
      });

      // This process waits for the key; the page's session lives, so it
      // must not get it.
      let crashedAt = Infinity;
      const taking = fenced.guard(key, async (lease) => {
        const took = performance.now() - crashedAt;
        const value = `node-fenced:${lease.epoch}`;
        return {
          took,
          epoch: lease.epoch,
          value,
          revision: await lease.put(dataKey, value),
        };
      }, { wait: true, signal: AbortSignal.timeout(WAIT + TTL) });
      await sleep(300);
      assert.deepEqual(found, [], "taken while the page's session lived");

      const cdp = await context!.newCDPSession(page);
      const crashed = new Promise<void>((r) => page.once("crash", () => r()));
      crashedAt = performance.now();
      // The command gets no answer from a renderer that is gone.
      void cdp.send("Page.crash").catch(() => {});
      await within(WAIT, crashed, "page F to crash");
      const took = await taking;
      console.log(
        `  [figures] fenced: Node took the key ${
          took.took.toFixed(1)
        } ms after page F's crash (TTL ${TTL} ms), found ${found.join(", ")}`,
      );
      assert.deepEqual(found, [`${key} crashed 0`]);
      assert.ok(took.epoch > put.epoch, "a new tenure");
      assert.ok(took.took < TTL / 2, `taken ${took.took} ms after the crash`);
      const after = await kv.get(dataKey);
      assert.equal(after?.string(), took.value);
      assert.equal(after?.revision, took.revision);
    } finally {
      await fenced.close();
      await within(WAIT, page.close(), "closing page F");
    }
  },
);

// ---------------------------------------------------------------------------
// A stream of the user's (createLeaseManager({ stream, leaseSubjects })):
// the leases live under a prefix of an application's stream, and
// lease.publish appends to the same stream, fenced by the tenure.

test(
  "a stream of the user's: a page's lease.publish appends to the stream; when its renderer crashes, Node takes the key (found \"crashed\") far inside the TTL, its own append lands, and nothing of the page's follows",
  { timeout: 20_000, skip: NO_STREAM },
  async () => {
    const stream = "BROWSER_ORDERS";
    const leaseSubjects = "browser-orders.lease";
    const subject = "browser-orders.created";
    const key = "orders";
    // Where the server has atomic batches (2.12+), the page commits too.
    const atomic = atomicVersion(ns!.version);
    // The application's stream, made by this process: the library never
    // creates or changes it (lease_stream_test.ts's goodConfig).
    const jsm = await jetstreamManager(nc!);
    await jsm.streams.add(
      {
        name: stream,
        subjects: ["browser-orders.>"],
        allow_msg_ttl: true,
        subject_delete_marker_ttl: 2_000_000_000,
        allow_rollup_hdrs: true,
        allow_direct: true,
        ...(atomic ? { allow_atomic: true } : {}),
      } as Parameters<typeof jsm.streams.add>[0],
    );
    const streamed = await createLeaseManager({
      nc: nc!,
      node: "node-stream",
      stream,
      leaseSubjects,
      ttl: TTL,
    });
    const page = await harness("page S");
    try {
      const found: string[] = [];
      streamed.addEventListener("acquired", (e) => {
        const a = e as LeaseAcquiredEvent;
        found.push(`${a.key} ${a.found} ${a.grace}`);
      });
      const put = await call<{
        epoch: number;
        value: string;
        seq: number;
        commit: { seq: number; count: number } | null;
      }>(page, "stream", {
        ws: ns!.wsUrl,
        node: "page-S",
        stream,
        leaseSubjects,
        ttl: TTL,
        key,
        subject,
        atomic,
      });
      assert.equal(put.value, `page-S:${put.epoch}`);
      // The page's append is a plain message of the stream.
      const m = await jsm.streams.getMessage(stream, { seq: put.seq });
      assert.equal(m?.subject, subject);
      assert.equal(m?.string(), put.value);
      if (atomic) {
        assert.equal(put.commit?.count, 2);
        assert.ok(put.commit!.seq > put.seq);
      } else assert.equal(put.commit, null);
      assert.deepEqual(await streamed.holder(key), {
        node: "page-S",
        epoch: put.epoch,
      });

      // This process waits for the key; the page's session lives, so it
      // must not get it.
      let crashedAt = Infinity;
      const taking = streamed.guard(key, async (lease) => {
        const took = performance.now() - crashedAt;
        const value = `node-stream:${lease.epoch}`;
        return {
          took,
          epoch: lease.epoch,
          value,
          seq: await lease.publish(subject, value),
        };
      }, { wait: true, signal: AbortSignal.timeout(WAIT + TTL) });
      await sleep(300);
      assert.deepEqual(found, [], "taken while the page's session lived");

      const cdp = await context!.newCDPSession(page);
      const crashed = new Promise<void>((r) => page.once("crash", () => r()));
      crashedAt = performance.now();
      // The command gets no answer from a renderer that is gone.
      void cdp.send("Page.crash").catch(() => {});
      await within(WAIT, crashed, "page S to crash");
      const took = await taking;
      assert.deepEqual(found, [`${key} crashed 0`]);
      assert.ok(took.epoch > put.epoch, "a new tenure");
      assert.ok(took.took < TTL / 2, `taken ${took.took} ms after the crash`);
      // A TTL later: the subject holds the page's appends, then Node's, and
      // nothing of the page's after the takeover.
      await sleep(TTL);
      const appends = await messagesOn(jsm, stream, subject);
      console.log(
        `  [figures] stream layout: Node took the key ${
          took.took.toFixed(1)
        } ms after page S's crash (TTL ${TTL} ms), found ${
          found.join(", ")
        }; ${subject}: ${appends.map((a) => `${a.seq}=${a.data}`).join(", ")}`,
      );
      assert.deepEqual(appends.map((a) => a.data), [
        put.value,
        ...(atomic ? [`${put.value}:commit-1`, `${put.value}:commit-2`] : []),
        took.value,
      ]);
      assert.equal(appends[0]!.seq, put.seq);
      assert.equal(appends.at(-1)!.seq, took.seq);
      if (atomic) assert.equal(appends.at(-2)!.seq, put.commit!.seq);
    } finally {
      await streamed.close();
      await within(WAIT, page.close(), "closing page S");
    }
  },
);

/** Every message on `subject` of `stream`, in order: its sequence and data. */
async function messagesOn(
  jsm: JetStreamManager,
  stream: string,
  subject: string,
): Promise<{ seq: number; data: string }[]> {
  const out: { seq: number; data: string }[] = [];
  for (let seq = 1;;) {
    // STREAM.MSG.GET's next_by_subj (nats.js's type leaves it out).
    const m = await jsm.streams.getMessage(
      stream,
      { seq, next_by_subj: subject } as unknown as { seq: number },
    );
    if (m === null) return out;
    out.push({ seq: m.seq, data: m.string() });
    seq = m.seq + 1;
  }
}

test("no page logged an uncaught error or a console.error", () => {
  assert.deepEqual(problems, []);
});
