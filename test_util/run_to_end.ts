/**
 * Runs a program to its end for a test that reads its exit code and output
 * afterwards: the tests of what a user types (the README's blocks, the
 * packed tarball, the set-up scripts). Never rejects, so a test's assertion
 * shows the output of a program that failed or hung instead of a bare
 * rejection.
 *
 * @module
 */
import { execFile } from "node:child_process";

/** A finished program. */
export interface Done {
  /** The exit code; -1 when it was killed (its timeout) or never started. */
  code: number;
  stdout: string;
  /** Its stderr, and, when `code` is -1, why it ended in parentheses. */
  stderr: string;
  /** Wall time, ms. */
  ms: number;
}

/**
 * Runs `file` with `args` in `cwd` with exactly `env` (nothing inherited),
 * killed with SIGKILL after `timeout` ms.
 */
export function runToEnd(
  file: string,
  args: readonly string[],
  options: {
    cwd: string;
    env: Record<string, string | undefined>;
    timeout: number;
  },
): Promise<Done> {
  const t0 = performance.now();
  return new Promise((resolve) => {
    execFile(file, args, {
      cwd: options.cwd,
      env: options.env,
      timeout: options.timeout,
      killSignal: "SIGKILL",
      encoding: "utf8",
    }, (error, stdout, stderr) => {
      const code = error === null
        ? 0
        : typeof error.code === "number"
        ? error.code
        : -1;
      resolve({
        code,
        stdout,
        stderr: error !== null && code === -1
          ? `${stderr}\n(${error.message})`
          : stderr,
        ms: performance.now() - t0,
      });
    });
  });
}

/** A finished program's code and output, for an assertion's message. */
export function show(what: string, done: Done): string {
  return `${what} exited with ${done.code}\n--- stdout ---\n${done.stdout}\n--- stderr ---\n${done.stderr}`;
}
