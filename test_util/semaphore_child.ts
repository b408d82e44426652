// A semaphore slot holder run as a child process by semaphore_test.ts, so a
// test can SIGKILL or SIGSTOP a real contender. Acquires one slot of
// LEASE_KEY (limit LEASE_LIMIT), prints {"ev":"held","key","slot","epoch","t"}
// and waits to be killed; prints {"ev":"refused","name","message","t"} when
// acquire() rejects.
//
// With LEASE_PAUSE=census it stops itself (SIGSTOP) right after the first
// census it reads while holding the turnstile, before its slot's
// compare-and-set, having printed {"ev":"census","keys"} (the keys it read); the test
// continues it (SIGCONT). The pause is made by a wrapper of the manager
// that semaphore() is given, as any caller may give it one (instrument()
// is one): semaphore.ts has no hook for it.
//
// Environment: NATS_URL, LEASE_BUCKET, LEASE_KEY, LEASE_NODE, LEASE_TTL,
// LEASE_LIMIT; LEASE_RESIZE=1 for `resize: true`; LEASE_PAUSE=census.
import process from "node:process";
import { type LeaseManager, semaphore } from "../mod.ts";
import { env, openLeases, say } from "./child_preamble.ts";

/**
 * `leases`, stopping this process after the first `holders()` it answers
 * once a guard on the turnstile (`<name>.next`) has resolved.
 */
function pausedAfterCensus(leases: LeaseManager): LeaseManager {
  let turnstile = false;
  let paused = false;
  return new Proxy(leases, {
    get(target, prop) {
      if (prop === "guard") {
        return async (...args: Parameters<LeaseManager["guard"]>) => {
          const value = await target.guard(...args);
          if (args[0].endsWith(".next")) turnstile = true;
          return value;
        };
      }
      if (prop === "holders") {
        return async (prefix: string) => {
          const held = await target.holders(prefix);
          if (turnstile && !paused) {
            paused = true;
            // Written synchronously (a pipe, on Linux) before the stop.
            console.log(
              JSON.stringify({ ev: "census", keys: [...held.keys()] }),
            );
            process.kill(process.pid, "SIGSTOP");
          }
          return held;
        };
      }
      const v = Reflect.get(target, prop, target);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
}

const { leases } = await openLeases({ manager: { restartGrace: false } });
const sem = semaphore(
  env.LEASE_PAUSE === "census" ? pausedAfterCensus(leases) : leases,
  env.LEASE_KEY!,
  { limit: Number(env.LEASE_LIMIT), resize: env.LEASE_RESIZE === "1" },
);
try {
  const slot = await sem.acquire();
  say("held", { key: slot.key, slot: slot.slot, epoch: slot.epoch });
} catch (err) {
  const e = err as Error;
  say("refused", { name: e.name, message: e.message });
}
setInterval(() => {}, 60_000); // held until killed
