// A lease holder run as a child process by lease_test.ts, so tests can
// SIGSTOP, SIGCONT and SIGKILL a real holder. It prints one JSON line per
// event on stdout: {"ev":"start"|"end"|"refused"|"closed"|"ready", ...}.
//
// Environment: NATS_URL, LEASE_BUCKET, LEASE_KEY, LEASE_NODE, LEASE_TTL,
// LEASE_MARKERS ("0": create the bucket without subject delete markers),
// LEASE_MODE ("loop": guarded writes of LEASE_WRITE_MS each, forever;
// "once": one guarded write, then close() and exit; "drop": one guarded
// write, then close the connection without close(); "campaign": campaign
// for the key forever, printing "lead" and "unlead" with the epoch, and on
// SIGTERM close(), the connection, "closed" and exit;
// "waitclose": a waiting guard, a campaign and a watch on the key (held by
// someone else), then close() and the connection, printing "closed" and
// "settled": the process must then exit by itself).
import process from "node:process";
import { NotHolderError } from "../mod.ts";
import { env, openLeases, say, sleep } from "./child_preamble.ts";

const { nc, leases } = await openLeases({
  manager: { restartGrace: false, markers: env.LEASE_MARKERS !== "0" },
});
const key = env.LEASE_KEY!;
const writeMs = Number(env.LEASE_WRITE_MS ?? 100);
say("ready");

if (env.LEASE_MODE === "campaign") {
  // SIGTERM: a clean shutdown, which hands the key over at once.
  process.on("SIGTERM", () => {
    void leases.close().then(async (r) => {
      await nc.close();
      say("closed", { released: r.released, unreleased: r.unreleased });
      process.exit(0);
    });
  });
  for await (const lease of leases.campaign(key)) {
    say("lead", { epoch: lease.epoch });
    // The moment the leader is told to stop, taken in the abort event
    // itself: the manager aborts the signal before it sends the release,
    // so no successor can lead before it. A time taken later (after the
    // await) can come after the successor's, when this process is not
    // scheduled for a while on a loaded machine (a CI run saw that).
    const told = await new Promise<number>((r) =>
      lease.signal.addEventListener("abort", () => r(Date.now()), {
        once: true,
      })
    );
    say("unlead", { epoch: lease.epoch, t: told });
  }
} else if (env.LEASE_MODE === "waitclose") {
  const waiting = leases.guard(key, () => say("start"), { wait: true })
    .then(() => "wrote", (err) => (err as Error).name);
  const campaigning = (async () => {
    for await (const _ of leases.campaign(key)) say("lead");
    return "ended";
  })();
  const watching = (async () => {
    let n = 0;
    for await (const _ of leases.watch(key)) n++;
    return `ended after ${n}`;
  })();
  await sleep(500);
  say("waiting");
  await sleep(1000); // the test counts the consumers meanwhile
  await leases.close();
  await nc.close();
  say("closed");
  say("settled", {
    guard: await waiting,
    campaign: await campaigning,
    watch: await watching,
  });
} else if (env.LEASE_MODE === "once" || env.LEASE_MODE === "drop") {
  for (;;) {
    try {
      await leases.guard(key, ({ epoch }) => say("start", { epoch }));
      break;
    } catch (err) {
      if (!(err instanceof NotHolderError)) throw err;
      await sleep(20);
    }
  }
  if (env.LEASE_MODE === "once") await leases.close();
  await nc.close();
  say("closed");
} else {
  for (;;) {
    try {
      await leases.guard(key, async ({ epoch, signal }) => {
        say("start", { epoch });
        await sleep(writeMs);
        say("end", { epoch, aborted: signal.aborted });
      });
    } catch (err) {
      say("refused", { error: (err as Error).name });
      await sleep(50);
    }
  }
}
