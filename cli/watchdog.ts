/**
 * The watchdog of `lease run` (cli/run.ts): a process of its own that stops
 * the command's process group when `lease` can no longer vouch for the lease,
 * even if `lease` itself cannot act.
 *
 * `lease` starts us before the command, and starts the command only after we
 * print "ready" on stdout: a watchdog that cannot load (a module path that
 * does not resolve, a runtime that cannot start it) never says so, and the
 * command is never started unprotected. `lease` then writes "cgroup DIR"
 * (with `--contain`: stopping reaches every process in it), "pgid N" (the
 * command's process group) and, at every tick, how many milliseconds its
 * lease is still vouched for. We stop the group (SIGTERM, then SIGKILL after
 * `killAfter` ms) when that time is up without a newer line (`lease` paused
 * by SIGSTOP, or frozen), or at once when our stdin closes without "done"
 * (`lease` killed by SIGKILL). "done" means `lease` stopped the command
 * itself: we exit.
 *
 * `lease` in turn watches that we stay alive and awake: we answer every tick
 * with "ok", and a watchdog that stops answering (exited, or stopped by
 * SIGSTOP) makes `lease` stop the command itself. Once `lease` is gone our
 * stdout is a broken pipe: a failed write must never keep us from the
 * SIGKILL that a command ignoring SIGTERM needs, so every write is allowed
 * to fail, and the SIGKILL is armed before anything is written.
 *
 * Usage (started by cli/run.ts): `<runtime> cli/watchdog.ts KILL_AFTER_MS`
 *
 * @module
 */

import process from "node:process";
import { createInterface } from "node:readline";
import { cgroupProcs, removeCgroup, signalCgroup } from "./cgroup.ts";

const killAfter = Number(process.argv[2]);
if (process.argv.length !== 3 || !Number.isFinite(killAfter)) {
  throw new TypeError(
    `Cannot watch as cli/watchdog.ts needs KILL_AFTER_MS: received ${
      JSON.stringify(process.argv.slice(2))
    }`,
  );
}
/** The command's process group, once `lease` has started it. */
let pgid: number | undefined;
/** With `lease run --contain`: the command's cgroup. */
let cgroup: string | undefined;

function alive(): boolean {
  if (pgid === undefined) return false;
  if (cgroup !== undefined && cgroupProcs(cgroup).length > 0) return true;
  try {
    process.kill(-pgid!, 0);
    return true;
  } catch {
    return false;
  }
}

function kill(signal: "SIGTERM" | "SIGKILL"): void {
  if (cgroup !== undefined) signalCgroup(cgroup, signal);
  try {
    process.kill(-pgid!, signal);
  } catch {
    // gone
  }
}

// Writes to a pipe whose reader is gone fail (EPIPE), synchronously or as
// an error event depending on the runtime: neither may end us.
process.stdout.on("error", () => {});
function tell(line: string): void {
  try {
    process.stdout.write(`${line}\n`);
  } catch {
    // `lease` is gone: nobody to tell
  }
}

/** Exits, after removing the command's (empty) cgroup: `lease` is gone. */
async function end(): Promise<never> {
  if (cgroup !== undefined) await removeCgroup(cgroup);
  process.exit(0);
}

let stopping = false;
let deadline: ReturnType<typeof setTimeout> | undefined;

function stop(): void {
  if (stopping) return;
  stopping = true;
  clearTimeout(deadline);
  if (pgid === undefined) process.exit(0); // no command was started
  if (!alive()) {
    void end(); // already gone
    return;
  }
  // The SIGKILL is armed first: what follows must not be able to prevent it.
  const killAt = performance.now() + killAfter;
  const poll = setInterval(() => {
    if (alive() && performance.now() < killAt) return;
    clearInterval(poll);
    if (alive()) kill("SIGKILL");
    void end();
  }, 20);
  // Said before the signal, so that `lease` can tell our stop from the
  // command's own exit even if our timer ran a hair before its own.
  tell("stopping");
  kill("SIGTERM");
}

const lines = createInterface({ input: process.stdin });
lines.on("line", (line) => {
  if (line === "done") process.exit(0);
  if (line.startsWith("cgroup ")) {
    cgroup = line.slice("cgroup ".length);
    return;
  }
  const group = /^pgid (\d+)$/.exec(line);
  if (group) {
    pgid = Number(group[1]);
    if (pgid <= 1) process.exit(2);
    return;
  }
  const ms = Number(line);
  if (stopping || !Number.isFinite(ms)) return;
  clearTimeout(deadline);
  deadline = setTimeout(stop, Math.max(0, ms));
  tell("ok");
});
lines.on("close", stop);
tell("ready");
