/**
 * Runs the `lease` command (cli.ts) as a child process under the runtime
 * running the test, for the tests of the command line.
 *
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import process from "node:process";
import { fileURLToPath } from "node:url";

const CLI = fileURLToPath(new URL("../cli.ts", import.meta.url));

/** A `lease` process started by {@linkcode startLease}. */
export interface LeaseRun {
  readonly child: ChildProcess;
  /** What it printed on stdout so far. */
  out(): string;
  /** What it printed on stderr so far. */
  err(): string;
  /** Its exit status (-1 when a signal ended it). */
  readonly exited: Promise<number>;
}

/**
 * Starts `lease ARGS` under this test's runtime (`deno run -A cli.ts`, or
 * the runtime's own binary with cli.ts), stdin closed.
 *
 * @example
 * ```ts ignore
 * const r = startLease(["holder", "k", "--servers", ns.url]);
 * assert.equal(await r.exited, 0, r.err());
 * ```
 */
export function startLease(args: string[]): LeaseRun {
  const [cmd, pre] = "Deno" in globalThis
    ? [process.execPath, ["run", "-A", CLI]]
    : [process.execPath, [CLI]];
  const env: Record<string, string | undefined> = { ...process.env };
  // Set by `node --test`: a child node process that sees it reports as a
  // test file.
  delete env.NODE_TEST_CONTEXT;
  const child = spawn(cmd, [...pre, ...args], {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => out += d);
  child.stderr!.setEncoding("utf8").on("data", (d: string) => err += d);
  const exited = new Promise<number>((r) =>
    child.on("exit", (code) => r(code ?? -1))
  );
  return { child, out: () => out, err: () => err, exited };
}
