/**
 * A script of `test_util/` run as a child process that reports in JSON
 * lines (see `child_preamble.ts`), so that a test can SIGSTOP, SIGCONT and
 * SIGKILL a real lease holder and read what it saw.
 *
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import process from "node:process";
import type { Readable } from "node:stream";

/** One line a child printed: its `ev`, and whatever else it sent. */
export interface ChildEvent {
  /** What happened. */
  ev: string;
}

/** Options of {@linkcode startChild}. */
export interface StartChildOptions {
  /**
   * What becomes of the child's stderr: kept for {@linkcode Child.stderr}
   * (and the message of a timed-out `until()`), or passed through to this
   * process's stderr.
   *
   * @default {"pipe"}
   */
  stderr?: "pipe" | "inherit";
  /**
   * How long `until()` waits when it is not told, in milliseconds.
   *
   * @default {10000}
   */
  untilMs?: number;
  /**
   * Whether each event gets `at`: this process's `performance.now()` when
   * its line arrived, to time the child on this process's clock.
   *
   * @default {false}
   */
  arrival?: boolean;
}

/** A running child and what it has printed so far. */
export interface Child<E extends ChildEvent> {
  /** The process. */
  readonly child: ChildProcess;
  /** Its pid. */
  readonly pid: number;
  /** Every JSON line it printed, parsed, in order; appended as they come. */
  readonly events: E[];
  /** Resolves with its exit code, or the signal that ended it. */
  readonly exited: Promise<number | NodeJS.Signals | null>;
  /** Its stderr so far, with any stdout line that was not JSON. */
  stderr(): string;
  /**
   * The first event that `pred` accepts, waiting for it.
   *
   * @param pred Which event.
   * @param ms How long to wait (default: the `untilMs` option).
   * @returns The event.
   * @throws {Error} When none came in time: the message holds every event
   * and the stderr.
   */
  until(pred: (e: E) => boolean, ms?: number): Promise<E>;
  /**
   * Kills it, frozen or not (SIGCONT, then SIGKILL), and waits for its exit.
   *
   * @returns When it exited.
   */
  stop(): Promise<void>;
}

/**
 * The command that runs `script` under this process's runtime. Feature
 * checks, not name sniffing: Deno needs `run -A`, Bun and Node take the file.
 *
 * @param script The script's path.
 * @returns The executable and its arguments.
 */
export function runtimeArgs(script: string): [string, string[]] {
  if ("Deno" in globalThis) return [process.execPath, ["run", "-A", script]];
  return [process.execPath, [script]];
}

/**
 * Reads `stream` as lines of JSON, each handed to `onEvent` as it comes.
 *
 * @param stream A child's stdout.
 * @param onEvent Called with each line, parsed.
 * @param onOther Called with each line that is not JSON, or that `onEvent`
 * threw on.
 */
export function readJsonLines(
  stream: Readable,
  onEvent: (e: unknown) => void,
  onOther: (line: string) => void = () => {},
): void {
  let buf = "";
  stream.setEncoding("utf8");
  stream.on("data", (d: string) => {
    buf += d;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      try {
        onEvent(JSON.parse(line));
      } catch {
        onOther(line);
      }
    }
  });
}

/**
 * Sends a signal by pid, and ignores a process that is already gone.
 * Deno's `ChildProcess.kill()` refuses a second signal; this does not.
 *
 * @param pid The process.
 * @param sig The signal.
 */
export function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}

/**
 * Runs `script` as a child process under this process's runtime, with
 * `env` over this process's environment, and reads its stdout as JSON lines.
 *
 * @typeParam E The events the script prints.
 * @param script The script's path.
 * @param env Variables to set for it.
 * @param options What to do with its stderr, how long `until()` waits.
 * @returns The child, its events so far, and ways to wait for one or stop it.
 * @example Wait for a holder's first write
 * ```ts ignore
 * const c = startChild<{ ev: string; epoch?: number }>(CHILD, { LEASE_KEY: "k" });
 * try {
 *   const { epoch } = await c.until((e) => e.ev === "start");
 * } finally {
 *   await c.stop();
 * }
 * ```
 */
export function startChild<E extends ChildEvent = ChildEvent>(
  script: string,
  env: Record<string, string>,
  options: StartChildOptions = {},
): Child<E> {
  const { stderr: stderrMode = "pipe", untilMs = 10_000, arrival = false } =
    options;
  const [cmd, args] = runtimeArgs(script);
  const child = spawn(cmd, args, {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", stderrMode],
  });
  const events: E[] = [];
  // Woken at each line, so that until() sees an event as soon as it came.
  const waiters: (() => void)[] = [];
  let stderr = "";
  readJsonLines(child.stdout!, (e) => {
    events.push(
      arrival ? { ...e as E, at: performance.now() } : e as E,
    );
    waiters.splice(0).forEach((w) => w());
  }, (line) => {
    stderr += line + "\n";
    waiters.splice(0).forEach((w) => w());
  });
  if (stderrMode === "pipe") {
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (d: string) => stderr += d);
  }
  const exited = new Promise<number | NodeJS.Signals | null>((r) =>
    child.on("exit", (code, sig) => r(code ?? sig))
  );
  return {
    child,
    pid: child.pid!,
    events,
    exited,
    stderr: () => stderr,
    async until(pred, ms = untilMs) {
      const end = performance.now() + ms;
      for (;;) {
        const hit = events.find(pred);
        if (hit) return hit;
        if (performance.now() > end) {
          throw new Error(
            `child: no such event in ${
              JSON.stringify(events)
            }; stderr: ${stderr}`,
          );
        }
        await new Promise<void>((r) => {
          waiters.push(r);
          setTimeout(r, 100);
        });
      }
    },
    async stop() {
      signal(child.pid!, "SIGCONT");
      signal(child.pid!, "SIGKILL");
      await exited;
    },
  };
}
