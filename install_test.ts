// What a newcomer installs, as built here (issue 34), on a machine without
// this clone: scripts/pack.sh's tarball, installed with `npm install -g` by
// the machine's own npm and Node 20 (and with `bun add -g`), puts a `lease`
// on PATH that runs from an empty folder; scripts/binary.sh's single file,
// alone on PATH, runs every subcommand and is its own watchdog; and
// `npm publish --dry-run` takes the tarball as it is. Against a real
// nats-server; prints the binary's size and start-up time.
// Runs under `deno test -A`, `bun test` and `node --test`.
// test.sh: node only: what it tests runs outside the test's runtime (npm,
// Node 20, the compiled binary); about 20 s, most of it the two builds.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { NatsServer } from "./test_util/nats_server.ts";
import { type Done, runToEnd, show } from "./test_util/run_to_end.ts";

const root = fileURLToPath(new URL(".", import.meta.url));
const TEST_TIMEOUT = 120_000;

/**
 * Runs a program to its end with exactly `env` (nothing inherited), killed
 * after `timeout` ms; never rejects.
 */
function run(
  file: string,
  args: string[],
  cwd: string,
  env: Record<string, string>,
  timeout = 60_000,
): Promise<Done> {
  return runToEnd(file, args, { cwd, env, timeout });
}

/** The environment a shell on a bare machine gives: a PATH and a HOME. */
function bare(pathDirs: string[]): Record<string, string> {
  return {
    PATH: pathDirs.join(":"),
    HOME: process.env.HOME ?? os.homedir(),
    NO_COLOR: "1",
  };
}

/**
 * For npm and bun themselves: this machine's environment (its registry
 * settings and CA certificates, which a user's shell has too) with PATH
 * set.
 */
function installer(pathDirs: string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    // NODE_TEST_CONTEXT: a child node that sees it reports as a test file.
    if (v !== undefined && k !== "NODE_TEST_CONTEXT") env[k] = v;
  }
  return { ...env, PATH: pathDirs.join(":"), NO_COLOR: "1" };
}

/** Whether `pid` runs (a zombie, reaped by nobody in a container, does not). */
function running(pid: number): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch {
    return false;
  }
}

async function until(
  what: string,
  ok: () => boolean,
  ms = 10_000,
): Promise<void> {
  const t0 = performance.now();
  while (!ok()) {
    assert.ok(performance.now() - t0 < ms, `${what}: not after ${ms} ms`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Long-running children, ended in `after` if a test failed midway. */
const children = new Set<ChildProcess>();

/** A long-running child's output so far, and its end. */
function start(
  file: string,
  args: string[],
  cwd: string,
  env: Record<string, string>,
): { child: ChildProcess; out: () => string; exited: Promise<number> } {
  let out = "";
  const child = spawn(file, args, { cwd, env, stdio: "pipe" });
  children.add(child);
  child.stdout!.setEncoding("utf8").on("data", (d: string) => out += d);
  child.stderr!.setEncoding("utf8").on("data", (d: string) => out += d);
  const exited = new Promise<number>((resolve) =>
    child.once("exit", (code, signal) => {
      children.delete(child);
      resolve(code ?? (signal ? -1 : -2));
    })
  );
  return { child, out: () => out, exited };
}

/**
 * The machine's own Node and npm (Debian's Node 20 in /usr/bin), what a
 * newcomer installs with; this repo's Node 24 and the npm on PATH where the
 * machine has none.
 */
function machineNode(): { dir: string; npm: string[] } {
  if (fs.existsSync("/usr/bin/node") && fs.existsSync("/usr/bin/npm")) {
    return { dir: "/usr/bin", npm: ["/usr/bin/npm"] };
  }
  const node = path.join(root, "node_modules", ".bin", "node");
  const which = (process.env.PATH ?? "").split(":")
    .map((d) => path.join(d, "npm")).find((f) => fs.existsSync(f));
  assert.ok(which, "no npm on PATH");
  return {
    dir: path.dirname(fs.realpathSync(node)),
    npm: [fs.realpathSync(node), fs.realpathSync(which)],
  };
}

describe("installing `lease` without a clone", () => {
  let tmp: string;
  let ns: NatsServer;
  let tarball = "";
  let binary = "";
  let packed: Done;
  let built: Done;
  let nodeDir = "";
  let npm: string[] = [];
  let nodeVersion = "";

  before(async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), "lease-install-"));
    const env = {
      ...bare([path.dirname(process.execPath), "/usr/bin", "/bin"]),
      LEASE_SKIP_SETUP: "1",
    };
    packed = await run(
      "bash",
      [path.join(root, "scripts", "pack.sh")],
      root,
      env,
      120_000,
    );
    tarball = packed.stdout.trim().split("\n").at(-1) ?? "";
    built = await run(
      "bash",
      [
        path.join(root, "scripts", "binary.sh"),
        "--out",
        path.join(tmp, "build", "lease"),
      ],
      root,
      env,
      120_000,
    );
    binary = built.stdout.trim().split("\n").at(-1) ?? "";
    ({ dir: nodeDir, npm } = machineNode());
    nodeVersion = (await run(
      path.join(nodeDir, "node"),
      ["--version"],
      tmp,
      bare([nodeDir]),
    )).stdout.trim();
    ns = await NatsServer.start();
  });

  after(async () => {
    // SIGKILL to a `lease run` leaves its watchdog to stop the command.
    for (const child of children) child.kill("SIGKILL");
    await ns?.[Symbol.asyncDispose]();
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  /**
   * `lease --help`, then one `lease run` on `key` from an empty folder, with
   * PATH = `binDir` and the system's folders (for `node`, `sh`): the command
   * prints its epoch and the Node that `#!/usr/bin/env node` found.
   */
  async function helpAndRun(binDir: string, key: string): Promise<void> {
    const cwd = fs.mkdtempSync(path.join(tmp, "empty-"));
    const env = {
      ...bare([binDir, nodeDir, "/usr/bin", "/bin"]),
      NATS_URL: ns.url,
    };
    const help = await run("bash", ["-c", "lease --help"], cwd, env);
    assert.equal(help.code, 0, show("lease --help", help));
    assert.match(
      help.stdout,
      /^usage: lease <run\|holder\|watch\|ls\|release\|shards>/,
    );
    const r = await run(
      "bash",
      [
        "-c",
        `lease run ${key} --ttl 3000 -- sh -c 'echo "epoch $LEASE_EPOCH under $(node --version)"'`,
      ],
      cwd,
      env,
    );
    assert.equal(r.code, 0, show("lease run", r));
    assert.match(
      r.stdout,
      new RegExp(`^epoch \\d+ under ${nodeVersion}\\n$`),
      show("lease run", r),
    );
    assert.match(
      r.stderr,
      new RegExp(`holding '${key}' as \\S+, epoch \\d+`),
      show("lease run", r),
    );
    assert.deepEqual(fs.readdirSync(cwd), [], "lease wrote into the folder");
  }

  test(
    "scripts/pack.sh's tarball, installed with `npm install -g` by the machine's npm, puts a `lease` on PATH that runs a command from an empty folder",
    { timeout: TEST_TIMEOUT },
    async () => {
      assert.equal(packed.code, 0, show("pack.sh", packed));
      const prefix = path.join(tmp, "npm-global");
      const installed = await run(
        npm[0]!,
        [
          ...npm.slice(1),
          "install",
          "-g",
          "--prefix",
          prefix,
          "--no-audit",
          "--no-fund",
          tarball,
        ],
        tmp,
        installer([nodeDir, "/usr/bin", "/bin"]),
        100_000,
      );
      assert.equal(installed.code, 0, show("npm install -g", installed));
      // The bin is the package's, linked: nothing of this clone is used.
      const link = fs.realpathSync(path.join(prefix, "bin", "lease"));
      assert.ok(link.startsWith(fs.realpathSync(prefix)), link);
      assert.match(fs.readFileSync(link, "utf8"), /^#!\/usr\/bin\/env node\n/);
      await helpAndRun(path.join(prefix, "bin"), "install-npm");
      console.log(
        `  [figures] npm install -g with Node ${nodeVersion} (${nodeDir}): ${
          Math.round(installed.ms)
        } ms`,
      );
    },
  );

  test(
    "scripts/pack.sh's tarball, installed with `bun add -g`, puts the same `lease` on PATH",
    { timeout: TEST_TIMEOUT },
    async () => {
      assert.equal(packed.code, 0, show("pack.sh", packed));
      const bunInstall = path.join(tmp, "bun-global");
      const added = await run(
        path.join(root, "node_modules", ".bin", "bun"),
        ["add", "-g", tarball],
        tmp,
        { ...installer(["/usr/bin", "/bin"]), BUN_INSTALL: bunInstall },
        100_000,
      );
      assert.equal(added.code, 0, show("bun add -g", added));
      await helpAndRun(path.join(bunInstall, "bin"), "install-bun");
    },
  );

  test(
    "scripts/binary.sh's single file, alone on PATH, runs run, holder, ls, watch, release and shards, and is its own watchdog",
    { timeout: TEST_TIMEOUT },
    async () => {
      assert.equal(built.code, 0, show("binary.sh", built));
      // A machine with neither Node nor the clone: the binary in a folder
      // of its own, `env -i PATH=<that folder>`.
      const dir = fs.mkdtempSync(path.join(tmp, "bin-only-"));
      fs.copyFileSync(binary, path.join(dir, "lease"));
      fs.chmodSync(path.join(dir, "lease"), 0o755);
      const work = fs.mkdtempSync(path.join(tmp, "work-"));
      const lease = (args: string[]) => ["-i", `PATH=${dir}`, "lease", ...args];
      const opts = ["--servers", ns.url, "--bucket", "install-bin"];
      const env = bare(["/usr/bin", "/bin"]);
      const leaseRun = (args: string[]) =>
        run("/usr/bin/env", lease(args), work, env);

      const help: number[] = [];
      for (let i = 0; i < 5; i++) {
        const h = await leaseRun(["--help"]);
        assert.equal(h.code, 0, show("lease --help", h));
        help.push(h.ms);
      }
      help.sort((a, b) => a - b);

      const key = "bin.job";
      const first = await leaseRun([
        "run",
        key,
        ...opts,
        "--ttl",
        "3000",
        "--node",
        "bin-a",
        "--",
        "/bin/sh",
        "-c",
        'echo "epoch $LEASE_EPOCH path $PATH"',
      ]);
      assert.equal(first.code, 0, show("lease run", first));
      assert.match(first.stdout, new RegExp(`^epoch \\d+ path ${dir}\\n$`));

      const shards = await leaseRun([
        "shards",
        "bin-group",
        "--count",
        "4",
        ...opts,
      ]);
      assert.equal(shards.code, 0, show("lease shards", shards));
      assert.deepEqual(
        shards.stdout.trim().split("\n"),
        ["members (0): none", ...[0, 1, 2, 3].map((i) => `shard ${i}: none`)],
      );

      const watch = start(
        "/usr/bin/env",
        lease(["watch", key, "--json", ...opts]),
        work,
        env,
      );
      // Its first line: the key as it is now, released by the first run.
      await until("lease watch's first line", () => watch.out().includes("\n"));

      // `lease run` of a command that runs until it is stopped, its pid in
      // a file: the run, and the command's pid once it started.
      const holdAs = async (node: string) => {
        const file = path.join(work, `${node}.pid`);
        const run = start(
          "/usr/bin/env",
          lease([
            "run",
            key,
            ...opts,
            "--ttl",
            "3000",
            "--node",
            node,
            "--",
            "/bin/sh",
            "-c",
            `echo $$ > ${node}.pid; exec /bin/sleep 60`,
          ]),
          work,
          env,
        );
        await until(
          `${node}'s command's pid file`,
          () =>
            fs.existsSync(file) && fs.readFileSync(file, "utf8").endsWith("\n"),
        );
        return { run, pid: Number(fs.readFileSync(file, "utf8")) };
      };
      const { run: holding, pid: b } = await holdAs("bin-b");

      const holder = await leaseRun(["holder", key, "--json", ...opts]);
      assert.equal(holder.code, 0, show("lease holder", holder));
      const held = JSON.parse(holder.stdout).holder;
      assert.equal(held?.node, "bin-b", holder.stdout);
      assert.ok(held.epoch > 0, holder.stdout);

      const ls = await leaseRun(["ls", "--json", ...opts]);
      assert.equal(ls.code, 0, show("lease ls", ls));
      const rows = ls.stdout.trim().split("\n").map((l) => JSON.parse(l));
      assert.deepEqual(
        rows.map((r) => [r.key, r.state, r.holder, r.epoch]),
        [[key, "held", "bin-b", held.epoch]],
      );

      // The eviction: `lease run` loses the lease at its next renewal and
      // stops its command (exit 75).
      const release = await leaseRun([
        "release",
        key,
        "--node",
        "bin-b",
        ...opts,
      ]);
      assert.equal(release.code, 0, show("lease release", release));
      assert.equal(await holding.exited, 75, holding.out());
      assert.ok(!running(b), "the evicted command still runs");
      await until(
        "lease watch's line for the eviction",
        () => watch.out().trim().split("\n").length >= 3,
      );
      watch.child.kill("SIGTERM");
      await watch.exited;
      const seen = watch.out().trim().split("\n").map((l) => JSON.parse(l));
      assert.deepEqual(
        seen.map((s) => s.holder?.node ?? null).slice(0, 3),
        [null, "bin-b", null],
        watch.out(),
      );

      // The watchdog is this same binary run again (scripts/lease_binary.ts):
      // `lease` killed by SIGKILL leaves it to stop the command at once.
      const { run: killed, pid: c } = await holdAs("bin-c");
      const t0 = performance.now();
      killed.child.kill("SIGKILL");
      await killed.exited;
      await until(
        "the watchdog's stop of the command",
        () => !running(c),
        2_000,
      );
      const stoppedMs = performance.now() - t0;

      const size = fs.statSync(binary).size / 1e6;
      const median = help[2]!;
      console.log(
        `  [figures] lease binary (bun ${
          (await run(
            path.join(root, "node_modules", ".bin", "bun"),
            ["--version"],
            tmp,
            env,
          )).stdout.trim()
        }, x64 Linux): ${size.toFixed(1)} MB; lease --help ${
          Math.round(median)
        } ms (median of 5, ${Math.round(help[0]!)}-${
          Math.round(help[4]!)
        } ms); a lease run of a one-line command ${
          Math.round(first.ms)
        } ms; command stopped ${
          Math.round(stoppedMs)
        } ms after lease's SIGKILL`,
      );
    },
  );

  test(
    "`npm publish --dry-run` takes pack.sh's tarball as it is: public, with its bin, and no warning but the missing login",
    { timeout: TEST_TIMEOUT },
    async () => {
      assert.equal(packed.code, 0, show("pack.sh", packed));
      const r = await run(
        npm[0]!,
        [...npm.slice(1), "publish", "--dry-run", tarball],
        tmp,
        installer([nodeDir, "/usr/bin", "/bin"]),
      );
      assert.equal(r.code, 0, show("npm publish --dry-run", r));
      const all = `${r.stdout}\n${r.stderr}`;
      assert.match(
        all,
        /with tag latest and public access \(dry-run\)/,
        show("npm publish --dry-run", r),
      );
      assert.match(all, /bin\/lease\.js/);
      assert.match(all, /cli\/watchdog\.js/);
      // No one is logged in here: that warning is the dry run's own.
      const warnings = all.split("\n").filter((l) =>
        /warn/i.test(l) && !/requires you to be logged in/.test(l)
      );
      assert.deepEqual(warnings, [], show("npm publish --dry-run", r));
    },
  );
});
