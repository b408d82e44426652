// A lease holder run as a child process by lease_safety_test.ts, so a test
// can freeze it with SIGSTOP in the middle of a guarded write and see what
// the write finds when it resumes. Prints one JSON line per event on
// stdout:
//   {"ev":"ready"}                       the manager is created
//   {"ev":"start","epoch":E}             a guarded write began
//   {"ev":"end","epoch":E,"aborted":..., "pastDeadline":..., "threw":...}
//                                        the write's last step, after its
//                                        sleep: what the lease said then
//   {"ev":"refused","error":NAME}        a guard was refused
//
// `threw` is the name of what `lease.throwIfLost()` threw, "none" when it
// returned, or "missing" when the Lease has no such method.
//
// Environment: NATS_URL, LEASE_BUCKET, LEASE_KEY, LEASE_NODE, LEASE_TTL,
// LEASE_WRITE_MS (how long each write sleeps), LEASE_WRITES (how many
// writes before the process exits; default: forever).
import process from "node:process";
import type { Lease } from "../mod.ts";
import { env, openLeases, say, sleep } from "./child_preamble.ts";

const { leases } = await openLeases({ manager: { restartGrace: false } });
const key = env.LEASE_KEY!;
const writeMs = Number(env.LEASE_WRITE_MS ?? 100);
let left = Number(env.LEASE_WRITES ?? Infinity);
say("ready");

/** What the lease says right now, read before anything else can run. */
function inspect(lease: Lease): Record<string, unknown> {
  const now = performance.now();
  const aborted = lease.signal.aborted;
  const deadline = (lease as { deadline?: unknown }).deadline;
  let threw: string;
  const check = (lease as { throwIfLost?: unknown }).throwIfLost;
  if (typeof check !== "function") {
    threw = "missing";
  } else {
    try {
      check.call(lease);
      threw = "none";
    } catch (err) {
      threw = (err as Error)?.name ?? String(err);
    }
  }
  return {
    aborted,
    deadline: typeof deadline === "number" ? deadline : null,
    pastDeadline: typeof deadline === "number" && now >= deadline,
    threw,
  };
}

while (left > 0) {
  try {
    await leases.guard(key, async (lease) => {
      say("start", { epoch: lease.epoch });
      await sleep(writeMs);
      // The commit point: the first thing the write does after its sleep.
      say("end", { epoch: lease.epoch, ...inspect(lease) });
    });
    left--;
  } catch (err) {
    say("refused", { error: (err as Error)?.name ?? String(err) });
    await sleep(50);
  }
}
// Leave without close(): the parent only needs the reports.
process.exit(0);
