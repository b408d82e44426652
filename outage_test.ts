// The README's leader.js through a 60 s server outage, as the machine's own
// Node runs it (Debian 12's Node 20 when there is one, as readme_test.ts
// does). nats.js gives up reconnecting after 10 tries by default: a campaign
// over a connection closed for good then ends with an UnavailableError,
// which the example does not catch. So the example keeps reconnecting
// (`maxReconnectAttempts: -1`), and this test holds it to that: alive
// through the whole outage, no stack trace, leading again once the server
// is back on the same port and store.
//
// About 90 s: the outage alone is 60 s (issue 34 asks for that), so it runs
// in one leg.
// test.sh: node only
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { DEFAULT_TTL } from "./lease.ts";
import { NatsServer } from "./test_util/nats_server.ts";

const root = fileURLToPath(new URL(".", import.meta.url));
// Issue 34's 60 s: longer than nats.js's default reconnect budget (10 tries
// 2 s apart, given up about 23 s in) and than two TTLs, so the lease is
// lost in it.
const OUTAGE_MS = 60_000;

/** Observes leader.js's manager and connection, into trace.log. */
const TRACE = `
const { appendFileSync } = await import("node:fs");
const t0 = performance.now();
const trace = (...a) => appendFileSync("trace.log",
  ((performance.now() - t0) / 1000).toFixed(2) + " " + a.join(" ") + "\\n");
for (const type of ["acquired", "lost", "released", "renewal-failed", "renewed", "defunct"]) {
  leases.addEventListener(type, (e) => trace(type, JSON.stringify({
    epoch: e.epoch, found: e.found, grace: e.grace, reason: e.reason,
    error: e.error ? String(e.error) : undefined,
  })));
}
(async () => {
  for await (const s of nc.status()) trace("status", s.type);
})();
let health = "";
setInterval(() => {
  const now = JSON.stringify(leases.health());
  if (now !== health) trace("health", health = now);
}, 1000).unref();
`;

/** The README's block named `name`, as pasted. */
function readmeBlock(name: string): string {
  const readme = fs.readFileSync(path.join(root, "README.md"), "utf8");
  const m = new RegExp(
    `<!-- block: ${name} -->\\s*\`\`\`\\w*\\n([\\s\\S]*?)\\n\`\`\`\\n`,
  ).exec(readme);
  assert.ok(m, `no block named '${name}' in README.md`);
  return m[1]! + "\n";
}

/**
 * What the server holds for leader.js's key, for a failure's message: the
 * key's last message (sequence, headers, age) and the stream's state.
 */
async function serverView(url: string): Promise<string> {
  let nc: NatsConnection | undefined;
  try {
    nc = await connect({ servers: url, timeout: 2000 });
    const jsm = await jetstreamManager(nc);
    const info = await jsm.streams.info("KV_leases");
    let last = "no message";
    try {
      const m = await jsm.streams.getMessage("KV_leases", {
        last_by_subj: "$KV.leases.scheduler",
      });
      last = m === null
        ? "none"
        : `seq ${m.seq}, ${
          Math.round(Date.now() - m.time.getTime())
        } ms old, headers ${
          JSON.stringify(
            m.header
              ? [...m.header.keys()].map((k) => [k, m.header.get(k)])
              : [],
          )
        }, value ${JSON.stringify(new TextDecoder().decode(m.data))}`;
    } catch (err) {
      last = String(err);
    }
    return `last message of the key: ${last}; stream state ${
      JSON.stringify(info.state)
    }`;
  } catch (err) {
    return `(not read: ${err})`;
  } finally {
    await nc?.close();
  }
}

/** The machine's own Node (older than 24) when there is one, else ours. */
function machineNode(): string {
  for (const bin of ["/usr/bin/node", "/usr/local/bin/node"]) {
    if (!fs.existsSync(bin)) continue;
    const v = execFileSync(bin, ["--version"], { encoding: "utf8" });
    if (Number(/^v(\d+)/.exec(v)?.[1]) < 24) return bin;
  }
  return process.execPath;
}

test(
  `the README's leader.js leads through a ${
    OUTAGE_MS / 1000
  } s server outage: still running, no stack trace, leading again once the server is back`,
  { timeout: OUTAGE_MS + 3 * DEFAULT_TTL + 120_000 },
  async () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "lease-outage-"));
    const qs = path.join(tmp, "qs");
    // restart() brings it back on the same port and store directory.
    await using ns = await NatsServer.start();
    let child: ReturnType<typeof spawn> | undefined;
    try {
      execFileSync("bash", ["scripts/pack.sh", "--install", qs], {
        cwd: root,
        env: { ...process.env, LEASE_SKIP_SETUP: "1" },
        stdio: "ignore",
      });
      // The block as pasted, plus listeners that only observe: its
      // manager's events, the connection's status changes and health() each
      // second (when it changed) go to trace.log, which a failure prints.
      const block = readmeBlock("leader-app").replace(
        /\b4222\b/g,
        String(ns.port),
      );
      const made = "const leases = await createLeaseManager({ nc, node });\n";
      assert.ok(block.includes(made), "the block's manager line moved");
      fs.writeFileSync(
        path.join(qs, "leader.js"),
        block.replace(made, made + TRACE),
      );
      const trace = () => {
        try {
          return fs.readFileSync(path.join(qs, "trace.log"), "utf8");
        } catch {
          return "(no trace.log)";
        }
      };
      const node = machineNode();
      child = spawn(node, ["leader.js"], {
        cwd: qs,
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      let err = "";
      child.stdout!.on("data", (d) => out += d);
      child.stderr!.on("data", (d) => err += d);
      let exit: number | null | undefined;
      const exited = new Promise<void>((r) =>
        child!.once("exit", (code, sig) => {
          exit = code ?? (sig ? -1 : null);
          r();
        })
      );
      const tenures = () => out.match(/ leads "scheduler" under epoch /g) ?? [];
      const until = async (what: string, ok: () => boolean, ms: number) => {
        const t0 = performance.now();
        while (!ok()) {
          assert.equal(
            exit,
            undefined,
            `leader.js exited (${exit}) waiting for ${what}:\n${out}\n${err}`,
          );
          assert.ok(
            performance.now() - t0 < ms,
            `no ${what} in ${ms} ms:\n${out}\n${err}\nits trace (s since start):\n${trace()}`,
          );
          await new Promise((r) => setTimeout(r, 50));
        }
        return performance.now() - t0;
      };

      await until("first tenure", () => tenures().length === 1, 30_000);
      await ns.kill();
      const down = performance.now();
      // Still running at the end of the outage, without a word on stderr:
      // nats.js's default gives up after 10 tries, about 23 s in.
      while (performance.now() - down < OUTAGE_MS) {
        assert.equal(
          exit,
          undefined,
          `leader.js exited ${
            Math.round((performance.now() - down) / 1000)
          } s into the outage:\n${out}\n${err}`,
        );
        await new Promise((r) => setTimeout(r, 250));
      }
      await ns.restart();
      // Its tenure ended in the outage; once reconnected it campaigns
      // again, and owes a grace for the tenure it lost. Measured: 15 s when
      // the restarted server had already expired the entry (a marker, one
      // TTL), 30 s when it had not and the manager's own renewal took the
      // key back (a lapsed tenure, two TTLs). At most 3 TTLs by design (a
      // TTL watching an entry not yet expired, then two), 45 s at the
      // default 15 s; the bound adds 15 s for the reconnect and a loaded
      // machine. Two CI runs saw no tenure within 60 and 90 s, which no
      // run here reproduced: a failure prints leader.js's trace.
      const back = await until(
        "tenure after the outage",
        () => tenures().length >= 2,
        3 * DEFAULT_TTL + 15_000,
      ).catch(async (err) => {
        throw new assert.AssertionError({
          message: `${err.message}\nthe server's view: ${await serverView(
            ns.url,
          )}`,
        });
      });
      assert.match(out, /stops leading\n[\s\S]* leads "scheduler"/);
      child.kill("SIGINT");
      await exited;
      assert.equal(exit, 0, `${out}\n${err}`);
      assert.match(out, / stopped\n$/);
      assert.equal(err, "", "no stack trace, no warning");
      console.log(
        `  [figures] leader.js under ${node} (${
          execFileSync(node, ["--version"], { encoding: "utf8" }).trim()
        }): ${OUTAGE_MS / 1000} s outage, leading again ${
          Math.round(back)
        } ms after the server came back`,
      );
    } finally {
      if (child && child.exitCode === null) child.kill("SIGKILL");
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  },
);
