/**
 * A second independent mutant set: 24 small, plausible bugs made by an
 * auditor who read the code under test but neither `table.ts` nor
 * `independent.ts`. Each names, chosen before any run, the test a
 * maintainer would expect to catch it. Run with
 * `node mutants/run.ts --set independent2`.
 *
 * First run (2026-12-07, `node mutants/run.ts --set independent2`, every
 * baseline passing, nothing stale, under 90 s in all): 19 of 24 killed
 * (79.2 %). No mutant was changed or rerun after it. The survivors, with
 * why the named test misses each:
 *
 * - J1 (cli/run.ts, lease's own SIGKILL after --kill-after inverted): in the
 *   named eviction test the watchdog is awake, hears the lost lease's
 *   deadline and sends its own SIGTERM and SIGKILL, which covers for
 *   lease's. Tried once by hand afterwards (not by the runner, not
 *   counted): cli_test.ts's "an eviction while the watchdog is stopped"
 *   kills it, so the file catches it; my choice of test did not.
 * - J13 (semaphore.ts, the turnstile's "busy" inverted for another node's
 *   holder): near-equivalent. A newcomer that wrongly thinks the turnstile
 *   free tries it, is refused because another node holds it, and queues
 *   "like anyone" (`#enter`'s fallback); its own node's case is covered by
 *   the local lock. The cost is one refused attempt, not an order change.
 *   Tried once by hand afterwards (not counted): all 16 tests of
 *   semaphore_test.ts pass with it.
 * - J17 (shards.ts, leave() releases the count key before the slot key):
 *   equivalent on the paths the tests drive. By the time leave() reaches
 *   those two releases, the slot's and the count's holds have already
 *   released their keys in that order (each hold releases its key in its
 *   own `finally`, and leave() stops the slot's hold before the count's);
 *   the swapped calls release keys that are free already.
 * - J21 (otel.ts, lease.renewal.duration in ms under unit "s"): the test
 *   bounds the renewals only by "under a second each on average" (sum <
 *   count), which values in ms also meet while renewals to a local server
 *   average under a millisecond, as they evidently did here. A real gap:
 *   no lower bound, or comparison with a measured time, tells the units
 *   apart.
 * - J24 (cli/ls.ts, lease watch compares holders by node without epoch):
 *   the watch test's key goes a, none, b, none; no node takes it back in a
 *   new tenure without a release seen in between (a release the bucket's
 *   history-1 stream never delivered, or an overwrite), which is the only
 *   case where the epoch matters. A real gap.
 *
 * After two tests were written for the real gaps (J21, J24), with every
 * mutant and its named test left as it was (2026-12-07, `node
 * mutants/run.ts --set independent2`, every baseline passing, under 2 min
 * in all): 21 of 24 killed (87.5 %); survivors J1, J13, J17.
 *
 * - J21: otel_test.ts's renewal test now bounds the average renewal to
 *   50 ms in seconds (sum < 0.05 × count). Killed: with the mutant, two
 *   renewals averaged 0.99 "s" (milliseconds under the unit "s").
 * - J24: cli_ls_test.ts's "lease watch --prefix prints a holder change to
 *   a new epoch of the same node, with no release between; so does lease
 *   watch KEY" (matched by J24's name pattern): a second manager of node
 *   n with `restartGrace: false` adopts the first's entry at once, and
 *   both watches must print the new epoch. Killed: the --prefix watch
 *   never printed it.
 * - J1 stays alive under its named test, as judged above: that test does
 *   not reach lease's own SIGKILL, while "an eviction while the watchdog
 *   is stopped" in the same file does.
 * - J13 and J17 stay alive, as judged above: near-equivalent (J13) and
 *   equivalent (J17) on the paths the tests drive.
 *
 * @module
 */

import type { Mutant } from "./table.ts";

/** The second independent set, in the form of `table.ts`. */
export const INDEPENDENT2: readonly Mutant[] = [
  // The command (cli/).
  {
    id: "J1",
    file: "cli/run.ts",
    find: 'if (running()) kill("SIGKILL");\n        }, killAfter)',
    replace: 'if (!running()) kill("SIGKILL");\n        }, killAfter)',
    test: "cli_test.ts",
    name: "lease release --node evicts the holder",
    what:
      "a lost lease's SIGKILL after --kill-after is sent only when the command is already gone (condition inverted)",
  },
  {
    id: "J2",
    file: "cli/run.ts",
    find: "LEASE_KEY: lease.key,",
    replace: "LEASE_KEY: a.key,",
    test: "cli_test.ts",
    name: "lease run -n 2: four runs on one key",
    what:
      "with -n the command's LEASE_KEY is the semaphore's name, not its slot's key",
  },
  {
    id: "J3",
    file: "cli/run.ts",
    find: "watchdog.send(`${Math.floor(lease.deadline - now)}`);",
    replace: "watchdog.send(`${Math.floor(lease.deadline)}`);",
    test: "cli_test.ts",
    name: "lease paused by SIGSTOP: its watchdog stops the command",
    what:
      "the watchdog is told the lease's absolute monotonic deadline instead of the milliseconds left, so a paused lease's command runs on past it",
  },
  // The command's watchdog (cli/watchdog.ts) and cgroup (cli/cgroup.ts).
  {
    id: "J4",
    file: "cli/watchdog.ts",
    find: 'lines.on("close", stop);\n',
    replace: "",
    test: "cli_test.ts",
    name: "kill -9 of lease: its watchdog stops",
    what:
      "the watchdog ignores its stdin closing (lease killed by SIGKILL): the command runs on unleased until the last deadline it heard",
  },
  {
    id: "J5",
    file: "cli/watchdog.ts",
    find: '    if (alive()) kill("SIGKILL");\n',
    replace: "",
    test: "cli_test.ts",
    name: "kill -9 of lease under a command that ignores SIGTERM",
    what:
      "the watchdog's SIGKILL after --kill-after is left out: a command that ignores SIGTERM survives",
  },
  {
    id: "J6",
    file: "cli/watchdog.ts",
    find: "deadline = setTimeout(stop, Math.max(0, ms));",
    replace: "deadline = setTimeout(stop, Math.max(0, ms) + killAfter);",
    test: "cli_test.ts",
    name: "lease paused by SIGSTOP: its watchdog stops the command",
    what:
      "the watchdog waits --kill-after past the lease's deadline before its SIGTERM, instead of stopping at the deadline",
  },
  {
    id: "J7",
    file: "cli/watchdog.ts",
    find: "  if (cgroup !== undefined) signalCgroup(cgroup, signal);\n",
    replace: "",
    test: "cli_test.ts",
    name: "a worker that escaped the process group is stopped",
    what:
      "with --contain the watchdog signals the process group only, never the cgroup: a worker that left the group survives lease's kill",
  },
  {
    id: "J8",
    file: "cli/cgroup.ts",
    find: '.split("\\n")\n      .filter(Boolean).map(Number);',
    replace: '.split("\\n")\n      .map(Number);',
    test: "cli_test.ts",
    name: "a worker that escaped the process group is stopped",
    what:
      "cgroupProcs keeps the empty string after the last newline: an empty cgroup lists pid 0, so it never looks empty and signals go to process group 0",
  },
  // Input checks.
  {
    id: "J9",
    file: "cli/args.ts",
    find: "a.lostStatus < 1 || a.lostStatus > 255",
    replace: "a.lostStatus < 1 || a.lostStatus > 256",
    test: "cli_test.ts",
    name: "numbers out of their range exit 64 or 66",
    what: "--lost-status 256 is accepted (an exit status is 0-255)",
  },
  {
    id: "J10",
    file: "cli/args.ts",
    find: 'const max = flag === "--count" ? MAX_SHARDS : 256;',
    replace: 'const max = flag === "--max-members" ? MAX_SHARDS : 256;',
    test: "cli_test.ts",
    name: "numbers out of their range exit 64 or 66",
    what:
      "the bounds of --count and --max-members are swapped: --count stops at 256, --max-members at 4096",
  },
  {
    id: "J11",
    file: "semaphore.ts",
    find:
      'typeof limit !== "number" || !Number.isInteger(limit) || limit < 1 ||',
    replace: 'typeof limit !== "number" || limit < 1 ||',
    test: "semaphore_test.ts",
    name: "semaphore\\(\\) throws TypeError or RangeError on bad input",
    what: "semaphore() accepts a fractional limit such as 1.5",
  },
  {
    id: "J12",
    file: "shards.ts",
    find: "!Number.isInteger(count) || count < 1 || count > MAX_SHARDS",
    replace: "!Number.isInteger(count) || count < 0 || count > MAX_SHARDS",
    test: "shards_test.ts",
    name: "rejects a bad count|rejects bad input before it sends anything",
    what: "assignShards() and shards() accept a count of 0",
  },
  // semaphore.ts.
  {
    id: "J13",
    file: "semaphore.ts",
    find: "c.turnstile.node !== leases.node",
    replace: "c.turnstile.node === leases.node",
    test: "semaphore_test.ts",
    name: "first come, first served",
    what:
      "a newcomer counts the turnstile as busy only when this node holds it (inverted): it jumps the line while another node's waiter holds the turnstile",
  },
  {
    id: "J14",
    file: "semaphore.ts",
    find: 'this.#resize ? "r" : "n"',
    replace: 'this.#resize ? "n" : "r"',
    test: "semaphore_test.ts",
    name: "another limit gets LimitMismatchError",
    what:
      "slot keys carry the resize letter swapped: fixed-limit slots read as resizable, so a contender with another limit is never refused",
  },
  {
    id: "J15",
    file: "semaphore.ts",
    find: "if (c.slots.size < this.limit) {",
    replace: "if (c.slots.size <= this.limit) {",
    test: "semaphore_test.ts",
    name: "resize: true changes the limit",
    what:
      "a free slot is looked for when the census already counts `limit` holders (off by one): with resize, old-limit holders plus a new slot exceed the limit",
  },
  // shards.ts.
  {
    id: "J16",
    file: "shards.ts",
    find: "      if (l === q) atCeil++;\n",
    replace: "",
    test: "shards_test.ts",
    name: "floor or ceil each",
    what:
      "assignShards() never counts members that reached ceil(count/n): every member may take ceil shards and the last ones get fewer than floor",
  },
  {
    id: "J17",
    file: "shards.ts",
    find: "        await this.#graceOver(key);\n" +
      "        await this.#leases.release(key).catch(() => {});\n" +
      "        await this.#graceOver(ck);\n" +
      "        await this.#leases.release(ck).catch(() => {});\n",
    replace: "        await this.#graceOver(ck);\n" +
      "        await this.#leases.release(ck).catch(() => {});\n" +
      "        await this.#graceOver(key);\n" +
      "        await this.#leases.release(key).catch(() => {});\n",
    test: "shards_test.ts",
    name: "leaving releases the member's shards before its slot",
    what:
      "a leaving member releases its count key before its slot key (order swapped)",
  },
  // Events and health() (lease.ts).
  {
    id: "J18",
    file: "lease/manager.ts",
    find: "if (t.suspended || t.validUntil - now < margin)",
    replace: "if (t.validUntil - now < margin)",
    test: "lease_events_test.ts",
    name: "health\\(\\) while the connection is down",
    what:
      "health() leaves a suspended lease (connection down, not vouched for) out of `expiring` while its deadline is still far",
  },
  {
    id: "J19",
    file: "lease/manager.ts",
    find: "new LeaseReleasedEvent(st.key, t!.epoch, t!.id, released)",
    replace: "new LeaseReleasedEvent(st.key, t!.epoch, t!.id, true)",
    test: "lease_events_test.ts",
    name: "a key deleted behind its holder",
    what:
      "every released event says clean, also a release whose delete did not land (left to expire)",
  },
  {
    id: "J20",
    file: "lease/manager.ts",
    find: "const left = Math.max(0, t.validUntil - this.#port.now());",
    replace: "const left = Math.max(0, this.#port.now() - t.validUntil);",
    test: "lease_events_test.ts",
    name: "a paused server: renewal-failed",
    what:
      "renewal-failed reports the time left with its operands swapped: 0 while the lease is still valid",
  },
  // otel.ts.
  {
    id: "J21",
    file: "otel.ts",
    find: "      e.duration / 1000,\n",
    replace: "      e.duration,\n",
    test: "otel_test.ts",
    name: "lease.renewal.duration times the renewals",
    what:
      "lease.renewal.duration records milliseconds under its unit of seconds",
  },
  {
    id: "J22",
    file: "otel.ts",
    find: "    this.#stopped = true;\n    this.#flush();\n",
    replace: "    this.#stopped = true;\n",
    test: "otel_test.ts",
    name: "stop\\(\\) flushes what was measured",
    what:
      "stop() drops the guard durations still pending instead of recording them",
  },
  // lease ls and lease watch (cli/ls.ts).
  {
    id: "J23",
    file: "cli/ls.ts",
    find: "`$KV.${bucket}.${prefix}.>`",
    replace: "`$KV.${bucket}.${prefix}.*`",
    test: "cli_ls_test.ts",
    name: "any number of tokens below --prefix",
    what:
      "--prefix P filters on P.* (one token) instead of P.>: keys deeper below P are missed by ls and watch",
  },
  {
    id: "J24",
    file: "cli/ls.ts",
    find:
      'const who = row.state === "held" ? `${row.holder}#${row.epoch}` : "";',
    replace: 'const who = row.state === "held" ? `${row.holder}` : "";',
    test: "cli_ls_test.ts",
    name: "lease watch --prefix prints a holder change",
    what:
      "lease watch tells holders apart by node only: a new tenure of the same node (new epoch) is not printed",
  },
];
