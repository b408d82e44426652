/**
 * The mutant table's runner: puts each hand-made bug of `table.ts` (or of
 * `independent.ts`, `independent2.ts`, `independent3.ts` or
 * `independent4.ts`, sets made without sight of the table) into a copy of
 * the work tree, runs the test that must catch it, and prints the score. A
 * mutant is killed when its test fails; it survived when the test passes.
 * Before any mutant, every test named by the set must pass on the unmutated
 * copy: a test that already fails would kill every mutant and prove
 * nothing.
 *
 * The copy lives in a temp folder (tracked and untracked files of the work
 * tree, with `node_modules` and `.tools` linked in), so nothing in the work
 * tree changes and a killed run leaves it intact. Each test run gets a
 * process group of its own, killed whole when it ends: a test that fails
 * under a mutant may leave a command or a server behind.
 *
 * Usage (Node 24):
 *   node mutants/run.ts
 *     [--set table|independent|independent2|independent3|independent4|all]
 *     [--only ID,ID...] [--part K/N] [--min PERCENT]
 *
 *   --set     which mutants: `table.ts`'s (default), `independent.ts`'s,
 *             `independent2.ts`'s (a second set made without sight of the
 *             others), `independent3.ts`'s (a third), `independent4.ts`'s
 *             (a fourth), or all five
 *   --only    run these mutants only
 *   --part    run the K-th of N slices of the table (1-based), for a CI that
 *             rotates through it
 *   --min     exit 1 when fewer than PERCENT of the mutants run are killed
 *             (default 90)
 *
 * Prints one line per mutant, `mutant ID: killed|SURVIVED ...`, and last
 * `mutants: K of N killed (P %)`. A mutant whose search text does not occur
 * exactly once in its file is reported as stale and counts as survived:
 * the table must follow the code.
 *
 * @module
 */

import { execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { type Mutant, MUTANTS } from "./table.ts";
import { ownCgroup } from "../cli/cgroup.ts";
import { INDEPENDENT } from "./independent.ts";
import { INDEPENDENT2 } from "./independent2.ts";
import { INDEPENDENT3 } from "./independent3.ts";
import { INDEPENDENT4 } from "./independent4.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
/** How long one test run may take before it counts as a failure (killed). */
const RUN_TIMEOUT_MS = 240_000;

/** The sets `--set` picks from. */
const SETS: Record<string, readonly Mutant[]> = {
  table: MUTANTS,
  independent: INDEPENDENT,
  independent2: INDEPENDENT2,
  independent3: INDEPENDENT3,
  independent4: INDEPENDENT4,
  all: [
    ...MUTANTS,
    ...INDEPENDENT,
    ...INDEPENDENT2,
    ...INDEPENDENT3,
    ...INDEPENDENT4,
  ],
};

interface Args {
  set: readonly Mutant[];
  only: Set<string> | undefined;
  part: [number, number] | undefined;
  min: number;
}

function parseArgs(argv: string[]): Args {
  const args: Args = {
    set: MUTANTS,
    only: undefined,
    part: undefined,
    min: 90,
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const value = argv[i + 1];
    if (a === "--set" && value !== undefined) {
      const set = Object.hasOwn(SETS, value) ? SETS[value] : undefined;
      if (set === undefined) {
        throw new RangeError(
          `Cannot run mutants as --set must be table, independent, independent2, independent3, independent4 or all: received '${value}'`,
        );
      }
      args.set = set;
      i++;
    } else if (a === "--only" && value !== undefined) {
      args.only = new Set(value.split(","));
      i++;
    } else if (a === "--part" && value !== undefined) {
      const m = /^(\d+)\/(\d+)$/.exec(value);
      if (!m || Number(m[1]) < 1 || Number(m[1]) > Number(m[2])) {
        throw new RangeError(
          `Cannot run mutants as --part must be K/N with 1 <= K <= N: received '${value}'`,
        );
      }
      args.part = [Number(m[1]), Number(m[2])];
      i++;
    } else if (a === "--min" && value !== undefined) {
      args.min = Number(value);
      if (!Number.isFinite(args.min) || args.min < 0 || args.min > 100) {
        throw new RangeError(
          `Cannot run mutants as --min must be a percentage: received '${value}'`,
        );
      }
      i++;
    } else {
      throw new TypeError(
        `Cannot run mutants: unknown argument '${a}' (use --set, --only, --part, --min)`,
      );
    }
  }
  return args;
}

/** Copies the work tree's tracked and untracked files into a temp folder. */
function copyTree(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "lease-mutants-"));
  const files = execFileSync(
    "git",
    ["ls-files", "-z", "--cached", "--others", "--exclude-standard"],
    { cwd: ROOT, encoding: "utf8", maxBuffer: 64 << 20 },
  ).split("\0").filter(Boolean);
  for (const f of files) {
    const from = path.join(ROOT, f);
    if (!fs.existsSync(from) || fs.statSync(from).isDirectory()) continue;
    fs.mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
    fs.copyFileSync(from, path.join(dir, f));
  }
  for (const link of ["node_modules", ".tools"]) {
    fs.symlinkSync(path.join(ROOT, link), path.join(dir, link));
  }
  return dir;
}

interface Outcome {
  passed: boolean;
  tests: number;
  ms: number;
  tail: string;
}

/**
 * Runs one test file in `dir`: the tests whose names match `name`, or any
 * of `names` (node takes the pattern flag more than once).
 */
function runTest(
  dir: string,
  m: Pick<Mutant, "test" | "name"> & { names?: readonly string[] },
): Promise<Outcome & { out: string }> {
  const node = path.join(ROOT, "node_modules/.bin/node");
  const patterns = m.names ?? (m.name === undefined ? [] : [m.name]);
  const args = [
    "--test",
    "--test-concurrency=1",
    `--test-timeout=${RUN_TIMEOUT_MS}`,
    ...patterns.map((n) => `--test-name-pattern=${n}`),
    m.test,
  ];
  const started = performance.now();
  return new Promise((resolve) => {
    const env: Record<string, string | undefined> = {
      ...process.env,
      NATS_SERVER_BIN: path.join(ROOT, ".tools/bin/nats-server"),
    };
    // Set when this runner itself runs under `node --test`.
    delete env.NODE_TEST_CONTEXT;
    const child = spawn(node, args, {
      cwd: dir,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env,
    });
    let out = "";
    const keep = (d: Buffer) => out = (out + d.toString()).slice(-20_000);
    child.stdout!.on("data", keep);
    child.stderr!.on("data", keep);
    const timer = setTimeout(
      () => killGroup(child.pid!),
      RUN_TIMEOUT_MS + 10_000,
    );
    child.on("close", (code) => {
      clearTimeout(timer);
      // Whatever the tests started and left behind goes with them.
      killGroup(child.pid!);
      // Node 24 counts a file none of whose tests matched the name pattern
      // as one passing test, reported under the file's own name: so only
      // results named otherwise count.
      const ran = out.split("\n").filter((l) =>
        /^\s*[✔✖] /.test(l) && !l.trimStart().slice(2).startsWith(`${m.test} `)
      ).length;
      const tests = ran === 0
        ? 0
        : Number(/^ℹ tests (\d+)$/m.exec(out)?.[1] ?? 0);
      resolve({
        passed: code === 0,
        tests,
        out,
        ms: performance.now() - started,
        tail: out.split("\n").filter((l) =>
          /✖|Error|assert/i.test(l)
        ).slice(
          0,
          6,
        )
          .join("\n"),
      });
    });
  });
}

/** A baseline outcome, and whether its line was printed yet. */
type Baseline = Outcome & { reported?: boolean; together?: number };

/**
 * The baselines of `chosen`, by test file and name pattern. Each file's
 * patterns run first in one process (one start-up, and one set of servers
 * its hooks start, instead of one per pattern); when that run passes, each
 * pattern counts as passing if some passing test's name matches it. When it
 * fails, or a pattern matched none, that file's patterns run one by one, so
 * a failing or empty pattern is named and the others still count.
 */
async function runBaselines(
  dir: string,
  chosen: readonly Mutant[],
): Promise<Map<string, Baseline>> {
  const byFile = new Map<string, string[]>();
  const whole = new Set<string>();
  for (const m of chosen) {
    if (m.name === undefined) whole.add(m.test);
    else {
      const names = byFile.get(m.test) ?? [];
      if (!names.includes(m.name)) names.push(m.name);
      byFile.set(m.test, names);
    }
  }
  const out = new Map<string, Baseline>();
  for (const test of whole) out.set(`${test}\0`, await runTest(dir, { test }));
  for (const [test, names] of byFile) {
    const group = await runTest(dir, { test, names });
    const passed = passedNames(group.out).filter(([n]) => !n.startsWith(test));
    for (const name of names) {
      const re = new RegExp(name);
      const matched = passed.filter((n) => n.some((x) => re.test(x))).length;
      out.set(
        `${test}\0${name}`,
        group.passed && matched > 0
          ? {
            passed: true,
            tests: matched,
            ms: group.ms,
            tail: "",
            together: names.length,
          }
          : await runTest(dir, { test, name }),
      );
    }
  }
  return out;
}

/**
 * The names of the tests that passed in node's spec output, each as it
 * stands and as its full name, its suites' names before it, space-separated
 * (`▶ suite` opens one, indented `✔ name (12.3ms)` passes): a name pattern
 * may match either.
 */
function passedNames(out: string): [string, string][] {
  const suites: { indent: number; name: string }[] = [];
  const names: [string, string][] = [];
  for (const line of out.split("\n")) {
    const m = /^(\s*)(▶|✔) (.*?)(?: \([\d.]+m?s\))?$/.exec(line);
    if (!m) continue;
    const indent = m[1]!.length;
    while (suites.length > 0 && suites.at(-1)!.indent >= indent) suites.pop();
    if (m[2] === "▶") suites.push({ indent, name: m[3]! });
    else names.push([m[3]!, [...suites.map((s) => s.name), m[3]!].join(" ")]);
  }
  return names;
}

function killGroup(pid: number): void {
  try {
    process.kill(-pid, "SIGKILL");
  } catch {
    // gone
  }
  sweepCgroups();
}

/** The `lease-*` cgroups there were before any test ran: not ours to touch. */
const cgroupsBefore = new Set(leaseCgroups());

function leaseCgroups(): string[] {
  try {
    const base = ownCgroup();
    return fs.readdirSync(base).filter((n) => n.startsWith("lease-")).map((
      n,
    ) => path.join(base, n));
  } catch {
    return [];
  }
}

/**
 * Removes the cgroups that `lease run --contain` made during the runs and
 * left behind: a mutant that breaks its clean-up, or the group kill above
 * taking `lease` and its watchdog before they removed theirs. Whatever is
 * still in one is killed first (`cgroup.kill`).
 */
function sweepCgroups(): void {
  for (const dir of leaseCgroups()) {
    if (cgroupsBefore.has(dir)) continue;
    try {
      fs.writeFileSync(path.join(dir, "cgroup.kill"), "1");
    } catch {
      // An old kernel without cgroup.kill, or gone already.
    }
    for (let i = 0; i < 50; i++) {
      try {
        fs.rmdirSync(dir);
        break;
      } catch {
        execFileSync("sleep", ["0.02"]);
      }
    }
  }
}

function slice(all: readonly Mutant[], args: Args): Mutant[] {
  let chosen = all.filter((m) => !args.only || args.only.has(m.id));
  if (args.part) {
    const [k, n] = args.part;
    chosen = chosen.filter((_, i) => i % n === k - 1);
  }
  return chosen;
}

async function main(): Promise<number> {
  const args = parseArgs(process.argv.slice(2));
  const ids = new Set<string>();
  for (const m of args.set) {
    if (ids.has(m.id)) {
      throw new Error(`mutants: duplicate id ${m.id}`);
    }
    ids.add(m.id);
  }
  const chosen = slice(args.set, args);
  if (chosen.length === 0) {
    console.log("mutants: none chosen");
    return 1;
  }
  const dir = copyTree();
  try {
    // The baseline: each test that must kill a mutant passes without one.
    const baselines = await runBaselines(dir, chosen);
    for (const m of chosen) {
      const o = baselines.get(`${m.test}\0${m.name ?? ""}`)!;
      if (o.reported) continue;
      o.reported = true;
      const what = `${m.test}${m.name ? ` /${m.name}/` : ""}`;
      if (!o.passed || o.tests === 0) {
        console.log(
          `baseline ${what}: FAILED (${
            o.tests === 0 ? "no test matched" : "fails without a mutant"
          }, ${Math.round(o.ms / 1000)} s)\n${o.tail}`,
        );
      } else {
        console.log(
          `baseline ${what}: passes (${o.tests} tests, ${
            Math.round(o.ms / 1000)
          } s${
            o.together
              ? `, in one run with the file's ${o.together} patterns`
              : ""
          })`,
        );
      }
    }
    let killed = 0;
    const survivors: string[] = [];
    for (const m of chosen) {
      const file = path.join(dir, m.file);
      const original = fs.readFileSync(file, "utf8");
      const at = original.indexOf(m.find);
      const stale = at < 0 || original.indexOf(m.find, at + 1) >= 0;
      const base = baselines.get(`${m.test}\0${m.name ?? ""}`)!;
      if (stale) {
        console.log(
          `mutant ${m.id}: SURVIVED (stale: its text occurs ${
            at < 0 ? "nowhere" : "more than once"
          } in ${m.file})`,
        );
        survivors.push(m.id);
        continue;
      }
      if (!base.passed || base.tests === 0) {
        console.log(`mutant ${m.id}: SURVIVED (its test fails without it)`);
        survivors.push(m.id);
        continue;
      }
      fs.writeFileSync(
        file,
        original.slice(0, at) + m.replace + original.slice(at + m.find.length),
      );
      let o: Outcome;
      try {
        o = await runTest(dir, m);
      } finally {
        fs.writeFileSync(file, original);
      }
      if (!o.passed) {
        killed++;
        console.log(
          `mutant ${m.id}: killed by ${m.test} (${
            Math.round(o.ms / 1000)
          } s): ${m.what}`,
        );
      } else {
        survivors.push(m.id);
        console.log(`mutant ${m.id}: SURVIVED ${m.test}: ${m.what}`);
      }
    }
    const pct = (100 * killed) / chosen.length;
    if (survivors.length > 0) console.log(`survivors: ${survivors.join(", ")}`);
    console.log(
      `mutants: ${killed} of ${chosen.length} killed (${pct.toFixed(1)} %)`,
    );
    return pct >= args.min ? 0 : 1;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

process.exitCode = await main();
