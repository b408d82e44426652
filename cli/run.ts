/**
 * `lease run`: runs a command only while holding its key. The command is
 * stopped when the lease is lost, frozen while the connection is down (point
 * 10 of the safety argument: a server it comes back to may have lost our
 * writes), and watched by a watchdog process (cli/watchdog.ts) that stops it
 * when `lease` itself cannot: killed, paused or frozen.
 *
 * @module
 */

import process from "node:process";
import { type ChildProcess, spawn } from "node:child_process";
import * as os from "node:os";
import { fileURLToPath } from "node:url";
import {
  cgroupProcs,
  freezeCgroup,
  makeCgroup,
  removeCgroup,
  signalCgroup,
} from "./cgroup.ts";
import {
  type GuardOptions,
  type Holder,
  type Lease,
  type LeaseAcquiredEvent,
  type LeaseManager,
  NotHolderError,
  UnavailableError,
} from "../lease.ts";
import { semaphore } from "../semaphore.ts";
import { type Args, UsageError } from "./args.ts";
import { open } from "./connect.ts";
import { EXIT, say } from "./exit.ts";

type Sig = "SIGINT" | "SIGTERM" | "SIGKILL";

/** Kills a process group; false when it is gone. */
function killGroup(
  pid: number,
  signal: Sig | "SIGSTOP" | "SIGCONT",
): boolean {
  try {
    process.kill(-pid, signal);
    return true;
  } catch {
    return false;
  }
}

function groupAlive(pid: number): boolean {
  try {
    process.kill(-pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * What `lease run` sets, or leaves unset, to say where its tenure is:
 * never inherited from an outer `lease run`.
 */
const WHERE_VARS: readonly string[] = [
  "LEASE_BUCKET",
  "LEASE_DOMAIN",
  "LEASE_STREAM",
  "LEASE_SUBJECTS",
  "LEASE_SLOT",
];

/**
 * How long to wait for the watchdog's "stopping" after the command ended by
 * a signal we did not send: its line is written before its signal.
 */
const WATCHDOG_WORD_MS = 100;

/** How long the watchdog may take to load and say "ready". */
const WATCHDOG_READY_MS = 15_000;

/**
 * How long the watchdog may leave our ticks unanswered before we stop the
 * command ourselves: a watchdog stopped by SIGSTOP (or starved) could not
 * stop the command if `lease` were then killed. Long enough for a loaded
 * machine's scheduling delays (its answer is one line), short enough that
 * `lease` and its watchdog must both fail within one second of each other
 * for the command to outlive them.
 */
const WATCHDOG_SILENCE_MS = 1_000;

interface Watchdog {
  /** Sends a line (a deadline, "pgid N" or "done"). */
  send(line: string): void;
  /** True until the watchdog process has exited. */
  alive(): boolean;
  /** Ends it with SIGKILL (one that stopped answering). */
  kill(): void;
  /**
   * Milliseconds since the oldest tick it has not answered was sent (0 when
   * every tick is answered).
   */
  silence(): number;
  /** Resolves when it exits, with how it ended. */
  exited: Promise<string>;
  /**
   * Resolves true once it says it is stopping the command (its deadline
   * passed, or our pipe closed), or false after `ms` without that.
   */
  stopping(ms: number): Promise<boolean>;
}

/**
 * Starts cli/watchdog.ts under this runtime, in a process group of its own
 * (so a signal to ours or to the command's does not reach it), and resolves
 * once it says "ready": a watchdog that cannot load its module (a path that
 * does not resolve offline, a compiled binary without it) would otherwise
 * leave the command unprotected with no notice. It stops the command's group
 * when our lease runs out without news from us (we are paused) or our pipe
 * to it closes (we were killed).
 */
async function startWatchdog(
  killAfter: number,
  contain: boolean,
): Promise<Watchdog> {
  // Compiled to JavaScript (the npm package's cli/*.js) the watchdog is the
  // .js file beside this one: a .ts path would not load under Node 20.
  const file = import.meta.resolve(
    import.meta.url.endsWith(".js") ? "./watchdog.js" : "./watchdog.ts",
  );
  const script = file.startsWith("file:") ? fileURLToPath(file) : file;
  // Deno lets a program touch /sys (the cgroup of --contain) only with
  // every permission.
  const args = "Deno" in globalThis
    ? ["run", contain ? "--allow-all" : "--allow-run", script]
    : [script];
  const w = spawn(process.execPath, [...args, String(killAfter)], {
    stdio: ["pipe", "pipe", "pipe"],
    detached: true,
  });
  let running = true;
  let err = "";
  const exited = new Promise<string>((resolve) => {
    w.once("error", (e) => {
      running = false;
      resolve(`it could not be started: ${e.message}`);
    });
    w.once("exit", (code, signal) => {
      running = false;
      resolve(signal ? `it was killed by ${signal}` : `it exited ${code}`);
    });
  });
  w.stdin!.on("error", () => {});
  w.stderr!.setEncoding("utf8").on("data", (d: string) => {
    err = (err + d).slice(-2000);
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  let partial = "";
  let stopping = false;
  /** When the oldest tick not yet answered with "ok" was sent. */
  let unanswered: number | undefined;
  const onStopping = new Set<() => void>();
  try {
    await Promise.race([
      new Promise<void>((resolve) => {
        w.stdout!.setEncoding("utf8").on("data", (d: string) => {
          const lines = (partial + d).split("\n");
          partial = lines.pop()!.slice(-100);
          for (const line of lines) {
            if (line === "ready") resolve();
            else if (line === "ok") unanswered = undefined;
            else if (line === "stopping" && !stopping) {
              stopping = true;
              for (const f of onStopping) f();
            }
          }
        });
      }),
      exited.then((how) => {
        // The runtime's own report, e.g. "Error: Cannot find module ...".
        const lines = err.split("\n").map((l) => l.trim()).filter(Boolean);
        const why = lines.find((l) => /error/i.test(l)) ?? lines.at(-1);
        throw new Error(`${how}${why ? `: ${why}` : ""}`);
      }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () =>
            reject(new Error(`it did not start in ${WATCHDOG_READY_MS} ms`)),
          WATCHDOG_READY_MS,
        );
      }),
    ]);
  } catch (e) {
    w.kill("SIGKILL");
    throw e;
  } finally {
    clearTimeout(timer);
  }
  // Its stderr now goes to ours, as before; its pipes no longer keep us up.
  w.stderr!.removeAllListeners("data");
  w.stderr!.on("data", (d: string) => process.stderr.write(d));
  w.unref();
  (w.stdout as unknown as { unref?: () => void }).unref?.();
  (w.stderr as unknown as { unref?: () => void }).unref?.();
  return {
    send: (line) => {
      if (/^-?\d+$/.test(line)) unanswered ??= performance.now();
      w.stdin?.write(`${line}\n`);
    },
    alive: () => running,
    kill: () => void w.kill("SIGKILL"),
    silence: () =>
      unanswered === undefined ? 0 : performance.now() - unanswered,
    exited,
    stopping: (ms) =>
      stopping ? Promise.resolve(true) : new Promise<boolean>((resolve) => {
        const t = setTimeout(() => {
          onStopping.delete(done);
          resolve(false);
        }, ms);
        const done = () => {
          clearTimeout(t);
          resolve(true);
        };
        onStopping.add(done);
      }),
  };
}

/**
 * `lease run KEY -- CMD`: waits for KEY (or a slot of it, with `-n`), runs
 * CMD while it holds it, and resolves with CMD's exit status or one of
 * {@linkcode EXIT}.
 */
export async function run(a: Args): Promise<number> {
  const { nc, leases, fenced } = await open(a, { createBucket: true });
  const killAfter = a.killAfter ?? Math.floor(leases.ttl / 4);
  if (killAfter >= leases.ttl) {
    await leases.close();
    await nc.close();
    throw new UsageError(
      `--kill-after must be below the TTL (${leases.ttl} ms), so that the command is gone before a successor starts: received ${killAfter}`,
      EXIT.BAD_DURATION,
    );
  }
  // The watchdog first, while nothing is held: no command runs without one.
  let watchdog: Watchdog;
  try {
    watchdog = await startWatchdog(killAfter, a.contain);
  } catch (err) {
    say(
      `the watchdog did not start (${
        (err as Error).message
      }): not running the command`,
    );
    await leases.close();
    await nc.close();
    return EXIT.NO_WATCHDOG;
  }
  let cgroup: string | undefined;
  if (a.contain) {
    try {
      cgroup = makeCgroup(`lease-${process.pid}-${Date.now()}`);
    } catch (err) {
      say(`--contain: ${(err as Error).message}: not running the command`);
      watchdog.send("done");
      await leases.close();
      await nc.close();
      return EXIT.NO_CONTAIN;
    }
  }
  // Set while the command runs: what to do the moment nats.js reports the
  // connection lost.
  let onDrop: (() => void) | undefined;
  const link = nc.status();
  void (async () => {
    try {
      for await (const s of link) if (s.type === "disconnect") onDrop?.();
    } catch {
      // ends with the connection
    }
  })();
  const waiting = new AbortController();
  let forwarded: Sig | undefined;
  let child: ChildProcess | undefined;
  const onSignal = (sig: Sig) => {
    forwarded ??= sig;
    if (child?.pid !== undefined) killGroup(child.pid, sig);
    else waiting.abort(new Error(`interrupted by ${sig}`));
  };
  const onInt = () => onSignal("SIGINT");
  const onTerm = () => onSignal("SIGTERM");
  process.on("SIGINT", onInt);
  process.on("SIGTERM", onTerm);
  // The command's environment, but for what an outer `lease run` gave
  // ours and this one may not set: its bucket or stream (and domain,
  // slot) would have `lease put` or `lease publish` in the command write
  // there under this tenure's epoch, which means nothing in it.
  const inherited: Record<string, string | undefined> = { ...process.env };
  for (const k of WHERE_VARS) delete inherited[k];
  // Until the command starts, say who it waits for.
  const untilStarted = new AbortController();
  const reported = a.limit === undefined
    ? reportWaiting(leases, a, untilStarted.signal)
    : reportSlots(leases, a, untilStarted.signal);
  // With -n, one of the semaphore's slots: the lease is the slot's.
  const sem = a.limit === undefined
    ? undefined
    : semaphore(leases, a.key, { limit: a.limit, resize: a.resize });
  const guard = <T>(
    write: (lease: Lease & { readonly slot?: number }) => Promise<T>,
    options: GuardOptions,
  ): Promise<T> =>
    sem === undefined
      ? leases.guard(a.key, write, options)
      : sem.guard(write, options);
  let status: number;
  try {
    status = await guard(async (lease) => {
      untilStarted.abort();
      if (!watchdog.alive()) {
        say(
          `the watchdog died while waiting (${await watchdog
            .exited}): not running the command`,
        );
        return EXIT.NO_WATCHDOG;
      }
      say(
        lease.slot === undefined
          ? `holding '${a.key}' as ${a.node}, epoch ${lease.epoch}`
          : `holding slot ${lease.slot} of '${a.key}' ('${lease.key}') as ${a.node}, epoch ${lease.epoch}`,
      );
      // With --contain the command enters its cgroup before it execs, so
      // everything it starts is born inside.
      const [file, args] = cgroup === undefined
        ? [a.command[0]!, a.command.slice(1)]
        : ["sh", [
          "-c",
          'echo $$ > "$0/cgroup.procs" && exec "$@"',
          cgroup,
          ...a.command,
        ]];
      child = spawn(file, args, {
        stdio: "inherit",
        detached: true, // a process group of its own, to stop as a whole
        env: {
          ...inherited,
          LEASE_KEY: lease.key,
          LEASE_NODE: a.node,
          LEASE_EPOCH: String(lease.epoch),
          LEASE_TENURE: lease.tenure,
          // Where the tenure is: what `lease put` and `lease delete`
          // (cli/fenced.ts), or with --stream `lease publish`
          // (cli/stream.ts), in the command need to write under it.
          ...(a.stream === undefined ? { LEASE_BUCKET: a.bucket } : {
            LEASE_STREAM: a.stream,
            LEASE_SUBJECTS: a.leaseSubjects!,
          }),
          LEASE_SERVERS: a.servers.join(","),
          ...(a.domain === undefined ? {} : { LEASE_DOMAIN: a.domain }),
          ...(lease.slot === undefined
            ? {}
            : { LEASE_SLOT: String(lease.slot) }),
        },
      });
      const exited = new Promise<number>((resolve) => {
        child!.once("error", (err) => {
          say(`cannot run ${a.command[0]}: ${err.message}`);
          resolve(127);
        });
        child!.once("exit", (code, signal) => {
          resolve(
            code ?? 128 + (signal ? osSignal(signal) : 0),
          );
        });
      });
      const pid = child.pid;
      let tick: ReturnType<typeof setInterval> | undefined;
      let stopped:
        | "lost"
        | "deadline"
        | "watchdog"
        | "silent watchdog"
        | undefined;
      // The last deadline seen while the lease was vouched for: a lease
      // that ends before it cannot have lost its entry to expiry.
      let vouched = lease.deadline;
      // The command's process group, and with --contain its cgroup.
      const kill = (sig: Sig) => {
        killGroup(pid!, sig);
        if (cgroup !== undefined) signalCgroup(cgroup, sig);
      };
      const running = () =>
        groupAlive(pid!) ||
        (cgroup !== undefined && cgroupProcs(cgroup).length > 0);
      const stop = () => {
        if (frozen) {
          // Frozen since the connection dropped: the server it comes back
          // to may have lost our writes and given the key to another holder
          // at once (point 10), so the command must not run again, not even
          // to handle a SIGTERM.
          kill("SIGKILL");
          return;
        }
        kill("SIGTERM");
        setTimeout(() => {
          if (running()) kill("SIGKILL");
        }, killAfter).unref?.();
      };
      // Point 10 of the safety argument, applied to the command: from the
      // moment the connection drops, the lease is not vouched for until the
      // manager proves it again, so the command is frozen (SIGSTOP, and with
      // --contain its cgroup's freezer) and thawed only once the lease
      // counts again; a lease that does not come back kills it frozen.
      let frozen = false;
      const freeze = (on: boolean, why: string) => {
        if (frozen === on || pid === undefined) return;
        frozen = on;
        if (on) {
          if (cgroup !== undefined) freezeCgroup(cgroup, true);
          killGroup(pid, "SIGSTOP");
        } else {
          killGroup(pid, "SIGCONT");
          if (cgroup !== undefined) freezeCgroup(cgroup, false);
        }
        say(why);
      };
      const suspended = () => {
        if (lease.signal.aborted || performance.now() >= lease.deadline) {
          return false;
        }
        try {
          lease.throwIfLost();
          return false;
        } catch {
          return true;
        }
      };
      const frozenWhy =
        `the connection to the server was lost: '${lease.key}' is not vouched for until the server proves it kept it, and the command is frozen (SIGSTOP) until then`;
      if (pid !== undefined) {
        // Sent in the tick the command was spawned in, before any await: a
        // lease killed from here on leaves a watchdog that knows the group.
        if (cgroup !== undefined) watchdog.send(`cgroup ${cgroup}`);
        watchdog.send(`pgid ${pid}`);
        // How long the lease is still vouched for, every tick: if we stop
        // sending (paused), the watchdog stops the command at the deadline.
        const every = Math.min(250, leases.ttl / 10);
        let lastTick = performance.now();
        const tell = () => {
          const now = performance.now();
          // A tick much later than due means we were paused: the watchdog's
          // answers may be waiting unread behind this timer, so its silence
          // is judged at the next tick.
          const onTime = now - lastTick < 2 * every + 100;
          lastTick = now;
          if (
            onTime && stopped === undefined &&
            watchdog.silence() > WATCHDOG_SILENCE_MS && running()
          ) {
            stopped = "silent watchdog";
            say(
              `the watchdog has not answered for ${
                Math.round(watchdog.silence())
              } ms (stopped by SIGSTOP, or starved): it could not stop the command if lease were killed, so lease stops it now`,
            );
            stop();
          }
          if (!lease.signal.aborted) vouched = lease.deadline;
          if (stopped === undefined) {
            if (suspended()) freeze(true, frozenWhy);
            else if (frozen && !lease.signal.aborted) {
              freeze(
                false,
                `'${lease.key}' is proven again (epoch ${lease.epoch}): the command continues (SIGCONT)`,
              );
            }
          }
          watchdog.send(`${Math.floor(lease.deadline - now)}`);
        };
        tell();
        tick = setInterval(tell, every);
        // The drop is acted on at once, not at the next tick: the manager
        // suspends the lease when nats.js reports it, and so do we.
        onDrop = () => {
          if (stopped === undefined && running()) freeze(true, frozenWhy);
        };
        // A dead watchdog can no longer stop the command if we freeze: stop
        // it now rather than run unprotected.
        void watchdog.exited.then((how) => {
          if (stopped !== undefined || !running()) {
            return;
          }
          stopped = "watchdog";
          say(`the watchdog died (${how}): stopping the command`);
          stop();
        });
      }
      // On a fenced bucket nothing renews the key's own entry (the
      // session's renewals keep it), so an eviction or a takeover would go
      // unseen while the command runs: the server would refuse its fenced
      // writes, but not stop it. Each TTL/3 the manager reads the tenure
      // entry from the stream leader (`held()`, F4's commit-point check),
      // and ends the lease when it is no longer ours; onLost then stops
      // the command, as a failed renewal does on a classic bucket. Asked
      // only while the lease lasts: on a key no longer held, held() would
      // take it again.
      const check = fenced
        ? setInterval(() => {
          if (!lease.signal.aborted && stopped === undefined) {
            void leases.held(lease.key).catch(() => {});
          }
        }, leases.ttl / 3)
        : undefined;
      const onLost = () => {
        if (pid === undefined || stopped !== undefined) return;
        // A signal passed on lets the command end by itself, unless it is
        // frozen: it cannot act on the signal, and must not run again.
        if (forwarded !== undefined && !frozen) return;
        stopped = "lost";
        say(
          `lost '${lease.key}': ${
            whyLost(
              lease.signal.reason,
              performance.now() < vouched,
              leases.ttl,
              a.stream === undefined
                ? "an eviction with lease release --node, or the bucket was purged"
                : `its tenure subject was purged from stream '${a.stream}'`,
            )
          }; ${
            frozen
              ? "killing the command, frozen since the connection dropped (SIGKILL: it must not run again)"
              : "stopping the command"
          }`,
        );
        stop();
      };
      lease.signal.addEventListener("abort", onLost, { once: true });
      let code = await exited;
      clearInterval(check);
      // Ended by a signal we did not send: the watchdog may have stopped it
      // at the lease's deadline a moment before our own timer saw it pass
      // (timers may fire a millisecond early). It says so on its stdout
      // before it signals, so its word is on the way if it did.
      if (
        stopped === undefined && forwarded === undefined && code > 128 &&
        await watchdog.stopping(WATCHDOG_WORD_MS)
      ) {
        stopped = "deadline";
        say(
          `lost '${lease.key}': its deadline passed; the watchdog stopped the command`,
        );
      }
      const own = stopped === undefined ? code : undefined;
      lease.signal.removeEventListener("abort", onLost);
      onDrop = undefined;
      // What it started may outlive it: stop the rest of its group (and
      // of its cgroup).
      if (pid !== undefined && running()) {
        kill("SIGTERM");
        const end = performance.now() + killAfter;
        while (running() && performance.now() < end) {
          await new Promise((r) => setTimeout(r, 20));
        }
        if (running()) kill("SIGKILL");
      }
      clearInterval(tick);
      watchdog.send("done");
      // One that does not answer may never read it.
      if (stopped === "silent watchdog") watchdog.kill();
      // The watchdog may have stopped the command at the deadline a moment
      // before our own abort handler ran: the lease ended either way.
      if (
        stopped === "lost" || stopped === "deadline" ||
        (forwarded === undefined && stopped === undefined &&
          (lease.signal.aborted || performance.now() >= lease.deadline))
      ) {
        code = a.lostStatus;
      } else if (stopped === "watchdog" || stopped === "silent watchdog") {
        code = EXIT.NO_WATCHDOG;
      } else if (own === a.lostStatus) {
        say(
          `the command itself exited ${own}, the --lost-status; the lease was held until it ended`,
        );
      }
      return code;
    }, { wait: true, signal: waiting.signal });
  } catch (err) {
    if (waiting.signal.aborted) {
      status = 128 + osSignal(forwarded ?? "SIGINT");
    } else {
      watchdog.send("done");
      await leases.close().catch(() => {});
      await nc.close().catch(() => {});
      throw err;
    }
  } finally {
    process.off("SIGINT", onInt);
    process.off("SIGTERM", onTerm);
    untilStarted.abort();
    await reported;
  }
  watchdog.send("done");
  if (cgroup !== undefined && !(await removeCgroup(cgroup))) {
    say(
      `could not remove the cgroup ${cgroup}: a process in it would not exit`,
    );
  }
  const { unreleased } = await leases.close();
  if (unreleased.length > 0) {
    say(`'${a.key}' could not be released cleanly: it expires after the TTL`);
  }
  await nc.close();
  return status;
}

/** With -n: once the wait has lasted a moment, says who holds the slots. */
async function reportSlots(
  leases: LeaseManager,
  a: Args,
  signal: AbortSignal,
): Promise<void> {
  await new Promise((r) => {
    const t = setTimeout(r, 250);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      r(undefined);
    }, { once: true });
  });
  if (signal.aborted) return;
  try {
    const held = await semaphore(leases, a.key, {
      limit: a.limit!,
      resize: a.resize,
    }).holders();
    if (signal.aborted) return;
    say(
      `waiting for one of ${a.limit} slots of '${a.key}', held by ${
        [...held].map(([k, h]) => `${h.node} (${k}, epoch ${h.epoch})`)
          .join(", ") || "nobody (others wait in line)"
      }`,
    );
  } catch {
    // A hint only: the guard reports what stops the run.
  }
}

/**
 * How long an entry under our own node id may show in the watch before the
 * manager's "acquired" event says it is ours: the event follows the
 * compare-and-set's reply, which may arrive after the watch's news of it.
 * Past that, it is another process run with the same `--node`.
 */
const OWN_ENTRY_SETTLE_MS = 250;

/**
 * Says on stderr who `lease run` waits for: once, then at each change of
 * holder, and once when it took the key but waits out the failover grace.
 * A hint from the manager's watch until `signal` aborts (the command
 * starts); the guard alone decides when that is.
 */
async function reportWaiting(
  leases: LeaseManager,
  a: Args,
  signal: AbortSignal,
): Promise<void> {
  let last: Holder | undefined;
  let took = false;
  // The epoch of our own tenure, from the manager's event: an entry under
  // our node id is ours only with it (another process may share the id).
  let ours: number | undefined;
  let onOurs: (() => void) | undefined;
  const onAcquired = (e: LeaseAcquiredEvent) => {
    if (e.key !== a.key) return;
    ours = e.epoch;
    onOurs?.();
  };
  leases.addEventListener("acquired", onAcquired);
  try {
    for await (const h of leases.watch(a.key, { signal })) {
      if (h === null || signal.aborted) continue;
      if (h.node === a.node && ours !== h.epoch) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, OWN_ENTRY_SETTLE_MS);
          onOurs = () => {
            clearTimeout(t);
            resolve();
          };
        });
        onOurs = undefined;
        if (signal.aborted) continue;
      }
      if (h.node === a.node && ours === h.epoch) {
        if (took) continue;
        took = true;
        const grace = await graceLeft(leases, a.key);
        if (grace !== undefined && !signal.aborted) {
          say(
            `took '${a.key}' (epoch ${h.epoch}), waiting out the failover grace (${grace} ms) before starting the command`,
          );
        }
        continue;
      }
      if (last?.node === h.node && last.epoch === h.epoch) continue;
      const same = h.node === a.node
        ? ", another process run with the same --node"
        : "";
      say(
        last === undefined
          ? `waiting for '${a.key}', held by ${h.node} (epoch ${h.epoch})${same}`
          : `still waiting for '${a.key}', now held by ${h.node} (epoch ${h.epoch})${same}`,
      );
      last = h;
    }
  } catch {
    // A hint only: the guard reports what stops the run.
  } finally {
    leases.removeEventListener("acquired", onAcquired);
  }
}

/**
 * Milliseconds of failover grace left on a key this manager has taken, or
 * `undefined` when there is none (or the key is not ours). A guard refuses
 * with the time left during the grace without a round trip; past it, with
 * `check: "lease"`, it writes nothing and costs none.
 */
async function graceLeft(
  leases: LeaseManager,
  key: string,
): Promise<number | undefined> {
  try {
    await leases.guard(key, () => {}, { check: "lease" });
    return undefined;
  } catch (err) {
    return err instanceof NotHolderError ? err.retryAfter : undefined;
  }
}

/**
 * Why a lease ended, for "lost 'K': ...". `early`: it ended before its
 * deadline, so its entry was still there unless something removed it (an
 * entry expires at the earliest at the holder's deadline).
 */
function whyLost(
  reason: unknown,
  early: boolean,
  ttl: number,
  /** How an entry is deleted, where it lives. */
  deleted: string,
): string {
  if (reason instanceof NotHolderError && reason.holder !== undefined) {
    return `it is now held by ${reason.holder}: its entry was written over, or deleted and then taken`;
  }
  if (reason instanceof NotHolderError) {
    return `its entry was deleted (${deleted})${early ? "" : " or expired"}`;
  }
  if (reason instanceof UnavailableError && !early) {
    return `no renewal was confirmed within the TTL (${ttl} ms): the server was unreachable or slow, or lease was paused`;
  }
  return reason instanceof Error ? reason.message : String(reason);
}

/** A signal's number, for the shell's 128 + N convention. */
function osSignal(name: string): number {
  return (os.constants.signals as Record<string, number>)[name] ?? 0;
}
