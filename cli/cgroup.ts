/**
 * The cgroup of `lease run --contain` (cli/run.ts) and its watchdog: a Linux
 * cgroup v2 made for the command, which every descendant stays in, even one
 * that leaves the process group with `setsid` or a double fork. Stopping the
 * cgroup reaches them all. Uses `node:fs` only.
 *
 * @example
 * ```ts ignore
 * const dir = makeCgroup("lease-42");
 * // spawn: sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' DIR CMD ARGS...
 * signalCgroup(dir, "SIGKILL");
 * await removeCgroup(dir);
 * ```
 *
 * @module
 */

import * as fs from "node:fs";
import * as path from "node:path";
import process from "node:process";

/**
 * Makes a cgroup named `name` below this process's own cgroup on the
 * machine's cgroup v2 hierarchy.
 *
 * @param name The new cgroup's name.
 * @returns Its directory.
 * @throws {Error} Saying why, when the machine has no cgroup v2 hierarchy
 * or does not let this process make a cgroup there.
 *
 * @example
 * ```ts ignore
 * const dir = makeCgroup(`lease-${process.pid}`);
 * ```
 */
export function makeCgroup(name: string): string {
  const dir = path.join(ownCgroup(), name);
  try {
    fs.mkdirSync(dir);
  } catch (err) {
    throw new Error(`cannot make the cgroup ${dir}: ${(err as Error).message}`);
  }
  return dir;
}

/**
 * The directory of this process's own cgroup on the machine's cgroup v2
 * hierarchy, where {@linkcode makeCgroup} makes its cgroups.
 *
 * @returns The directory.
 * @throws {Error} Saying why, when the machine has no cgroup v2 hierarchy.
 *
 * @example
 * ```ts ignore
 * console.log(ownCgroup()); // e.g. /sys/fs/cgroup/unified
 * ```
 */
export function ownCgroup(): string {
  let mount: string | undefined;
  let own: string | undefined;
  try {
    // mountinfo: "... MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE ..."
    for (
      const line of fs.readFileSync("/proc/self/mountinfo", "utf8").split("\n")
    ) {
      const [left, right] = line.split(" - ");
      if (right?.startsWith("cgroup2 ")) mount = left!.split(" ")[4];
    }
    own = /^0::(.*)$/m.exec(fs.readFileSync("/proc/self/cgroup", "utf8"))?.[1];
  } catch (err) {
    throw new Error(
      `this machine has no /proc to find cgroups in: ${(err as Error).message}`,
    );
  }
  if (mount === undefined || own === undefined) {
    throw new Error("this machine has no cgroup v2 hierarchy");
  }
  return path.join(mount, own);
}

/**
 * The processes in a cgroup; none when it is gone.
 *
 * @param dir The cgroup's directory.
 * @returns Their pids.
 *
 * @example
 * ```ts ignore
 * if (cgroupProcs(dir).length === 0) console.log("empty");
 * ```
 */
export function cgroupProcs(dir: string): number[] {
  try {
    return fs.readFileSync(path.join(dir, "cgroup.procs"), "utf8").split("\n")
      .filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/**
 * Sends `signal` to every process in a cgroup (SIGKILL through
 * `cgroup.kill` where the kernel has it, which also reaches processes forked
 * meanwhile).
 *
 * @param dir The cgroup's directory.
 * @param signal The signal.
 *
 * @example
 * ```ts ignore
 * signalCgroup(dir, "SIGTERM");
 * ```
 */
export function signalCgroup(
  dir: string,
  signal: "SIGTERM" | "SIGKILL" | "SIGINT",
): void {
  if (signal === "SIGKILL") {
    try {
      fs.writeFileSync(path.join(dir, "cgroup.kill"), "1");
      return;
    } catch {
      // an older kernel: one by one
    }
  }
  for (const pid of cgroupProcs(dir)) {
    try {
      process.kill(pid, signal);
    } catch {
      // gone meanwhile
    }
  }
}

/**
 * Freezes or thaws every process in a cgroup at once (cgroup v2's
 * `cgroup.freeze`): a frozen process runs nothing until thawed, and a
 * SIGKILL still ends it. Processes forked meanwhile are frozen too, which
 * a SIGSTOP sent one by one cannot promise.
 *
 * @param dir The cgroup's directory.
 * @param on True to freeze, false to thaw.
 * @returns Whether the kernel took it (false where the freezer is missing).
 *
 * @example
 * ```ts ignore
 * freezeCgroup(dir, true);
 * ```
 */
export function freezeCgroup(dir: string, on: boolean): boolean {
  try {
    fs.writeFileSync(path.join(dir, "cgroup.freeze"), on ? "1" : "0");
    return true;
  } catch {
    return false;
  }
}

/**
 * Removes a cgroup once it is empty, waiting up to `ms` for killed
 * processes to leave it; leaves it behind when they do not.
 *
 * @param dir The cgroup's directory.
 * @param ms How long to wait for it to empty.
 * @returns Whether it is gone.
 *
 * @example
 * ```ts ignore
 * if (!(await removeCgroup(dir))) console.warn(`${dir} is left behind`);
 * ```
 */
export async function removeCgroup(dir: string, ms = 1_000): Promise<boolean> {
  const end = performance.now() + ms;
  for (;;) {
    try {
      fs.rmdirSync(dir);
      return true;
    } catch (err) {
      if ((err as { code?: string }).code === "ENOENT") return true;
      if (performance.now() >= end) return false;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}
