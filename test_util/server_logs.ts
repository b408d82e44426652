/**
 * `test` and `before` from `node:test`, but a failing test's (or hook's)
 * error also carries the last log lines of every nats-server still running
 * in this process, or stopped during the test: a CI log then says what the
 * servers saw (an election, a port taken, a restart) next to the assertion
 * that failed. Import them in place of `node:test`'s in files whose tests
 * run clusters or restart servers.
 *
 * @example
 * ```ts ignore
 * import { test } from "./test_util/server_logs.ts";
 * test("R3: handover", async () => { ... });
 * ```
 *
 * @module
 */
import {
  before as nodeBefore,
  test as nodeTest,
  type TestOptions,
} from "node:test";
import { serverLogMark, serverLogs } from "./nats_server.ts";

type Body = () => void | Promise<void>;
type Options = TestOptions;

/** Appends the live servers' log tails to `err`'s message and stack. */
function withLogs(err: unknown, since: number): unknown {
  const logs = serverLogs(since);
  if (!(err instanceof Error) || logs === "") return err;
  const extra = `\n----- last log lines of the servers -----\n${logs}`;
  const old = err.message;
  try {
    err.message = old + extra;
    if (typeof err.stack === "string" && err.stack.includes(old)) {
      err.stack = err.stack.replace(old, err.message);
    }
  } catch {
    // A frozen error keeps its message; the test still fails with it.
  }
  return err;
}

function wrap(fn: Body): Body {
  return async () => {
    const since = serverLogMark();
    try {
      await fn();
    } catch (err) {
      throw withLogs(err, since);
    }
  };
}

/**
 * Declares a test, as `node:test`'s `test(name, fn)` or
 * `test(name, options, fn)` does.
 *
 * @param name The test's name.
 * @param a The body, or the options.
 * @param b The body, when `a` is the options.
 */
export function test(name: string, a: Body | Options, b?: Body): void {
  if (typeof a === "function") {
    nodeTest(name, wrap(a));
  } else {
    nodeTest(name, a, wrap(b ?? (() => {})));
  }
}

/**
 * Declares a `before` hook, as `node:test`'s `before(fn)` does; its error,
 * too, carries the servers' last log lines (a cluster that would not settle).
 *
 * @param fn The hook.
 */
export function before(fn: Body): void {
  nodeBefore(wrap(fn));
}
