/**
 * A fourth independent mutant set: 25 small, plausible bugs made by an
 * auditor who read the code under test but none of table.ts and the earlier
 * independent sets. Each names, chosen before any run, the test a
 * maintainer would expect to catch it.
 *
 * Areas: the `lease` command (Q1-Q7), the recipes (Q8-Q12), the manager's
 * events and health() (Q13-Q17), ./otel (Q18-Q21), input validation
 * (Q22-Q25).
 *
 * First measurement, 2026-12-07, of commit 48ee90a, the rows as written
 * (none changed after the run):
 * `node_modules/.bin/node mutants/run.ts --set independent4`, 23 of 25
 * killed (92.0 %). By area: the command 6 of 7 (Q2 survived), the recipes
 * 5 of 5, events and health() 5 of 5, ./otel 3 of 4 (Q20 survived), input
 * validation 4 of 4. Every kill was rerun by hand in a copy of the tree and
 * failed the same way, on an assertion about the bug; no flake. Q9 was
 * killed by the runner's 240 s limit: the hang is the bug itself (a guard
 * that never releases its slot, renewed, leaves the other 15 waiters
 * waiting for ever), shown apart in a two-node, limit-1 run where the
 * second waiter still waited 5 s after the first's write ended. The two
 * survivors are test gaps, not equivalent mutants; see their rows.
 *
 * @module
 */

import type { Mutant } from "./table.ts";

export const INDEPENDENT4: readonly Mutant[] = [
  // --- the `lease` command -------------------------------------------------
  {
    id: "Q1",
    file: "cli/watchdog.ts",
    find: 'if (alive()) kill("SIGKILL");',
    replace: 'if (alive()) kill("SIGTERM");',
    test: "cli_test.ts",
    name: "kill -9 of lease under a command that ignores SIGTERM",
    what:
      "the watchdog's escalation after --kill-after sends SIGTERM again instead of SIGKILL: a command that ignores SIGTERM outlives a killed lease",
  },
  // Survived (test gap): on a lost lease, run.ts sets the deadline to the
  // loss and its next tick (every TTL/10 here) sends the watchdog 0 ms, and
  // the watchdog's own stop signals the cgroup: the setsid worker dies
  // within ~100 ms, before lease's kill-after is over. (With the watchdog's
  // cgroup signal removed as well, the test fails: "the worker outlived
  // lease".) Missed where only lease's own stop reaches the cgroup: a
  // --contain command that exits by itself, or that lease passes a SIGTERM
  // or SIGINT to, leaving a setsid worker behind; a test of that, asserting
  // the worker gone and the cgroup removed when lease exits, would kill it.
  {
    id: "Q2",
    file: "cli/run.ts",
    find: "if (cgroup !== undefined) signalCgroup(cgroup, sig);",
    replace: "",
    test: "cli_test.ts",
    name: "--contain: a worker that escaped the process group",
    what:
      "lease run --contain stops only the command's process group on a lost lease, never its cgroup: a worker that left the group (setsid) runs on",
  },
  {
    id: "Q3",
    file: "cli/release.ts",
    find: "if (Date.now() < until) continue;",
    replace: "",
    test: "cli_test.ts",
    name: "lease release --node wins against a holder whose revision moves",
    what:
      "lease release gives up (exit 69) at the first compare-and-delete refused because the holder renewed in between, instead of reading again and retrying for 5 s",
  },
  {
    id: "Q4",
    file: "cli/main.ts",
    find: "return EXIT.LIMIT_MISMATCH;",
    replace: "return EXIT.UNAVAILABLE;",
    test: "cli_test.ts",
    name: "lease run -n 2: four runs on one key",
    what:
      "a LimitMismatchError (lease run -n with another N than the held slots) exits 69 instead of the documented 76",
  },
  {
    id: "Q5",
    file: "cli/run.ts",
    find: "code = a.lostStatus;",
    replace: "code = EXIT.LOST;",
    test: "cli_test.ts",
    name: "--lost-status tells a lost lease",
    what: "a lost lease always exits 75: --lost-status is parsed but ignored",
  },
  {
    id: "Q6",
    file: "cli/ls.ts",
    find: "`$KV.${bucket}.${prefix}.>`",
    replace: "`$KV.${bucket}.${prefix}.*`",
    test: "cli_ls_test.ts",
    name: "any number of tokens below --prefix P",
    what:
      "lease ls/watch --prefix P filters on P.* instead of P.>: keys two or more tokens below P are not listed or followed",
  },
  {
    id: "Q7",
    file: "cli/args.ts",
    find: "a.ttl = duration(flag, inline ?? own[++i], fail);",
    replace: "a.ttl = duration(flag, own[++i], fail);",
    test: "cli_test.ts",
    name: "--opt=value works as --opt value",
    what:
      "--ttl=MS ignores its inline value and takes the next word as the TTL (exit 66), unlike every other option",
  },
  // --- the recipes ---------------------------------------------------------
  {
    id: "Q8",
    file: "semaphore.ts",
    find: "if (!s.resize && s.limit !== this.limit) {",
    replace: "if (s.limit !== this.limit) {",
    test: "semaphore_test.ts",
    name: "resize: true changes the limit",
    what:
      "a strict contender refuses a slot taken with resize (r<limit>) with LimitMismatchError instead of counting it against its own limit: resizing blocks the old contenders",
  },
  {
    id: "Q9",
    file: "semaphore.ts",
    find: "await Promise.all([turn.leave(), this.#leases.release(key)]);",
    replace: "await turn.leave();",
    test: "semaphore_test.ts",
    name: "never runs more than `limit` writes at once",
    what:
      "a semaphore guard does not release its slot when its write ends: the slot stays held (renewed) and waiters never get it",
  },
  {
    id: "Q10",
    file: "semaphore.ts",
    find: "const busy = c.tickets.size > 0 || this.#lock.busy ||",
    replace: "const busy = this.#lock.busy ||",
    test: "semaphore_test.ts",
    name: "newcomer that arrives while the turnstile is free",
    what:
      "a newcomer goes straight to a free turnstile although tickets wait in line: it barges ahead of the waiters (not first come, first served)",
  },
  {
    id: "Q11",
    file: "shards.ts",
    find: "if (l < q || (l === q && atCeil < r)) {",
    replace: "if (l < q || (l === q && atCeil <= r)) {",
    test: "shards_test.ts",
    name: "gives every shard to one member, floor or ceil each",
    what:
      "assignShards lets one member too many reach ceil(count/n): another member ends below floor(count/n), the assignment unbalanced",
  },
  {
    id: "Q12",
    file: "shards.ts",
    find:
      "else if (count === null || count === this.#count) members.add(h.node);",
    replace: "else members.add(h.node);",
    test: "shards_test.ts",
    name: "fails a member whose count differs",
    what:
      "a member in a slot under another count is counted as a member by the others: shards are targeted at a node that will never take them",
  },
  // --- the manager's events and health() ------------------------------------
  {
    id: "Q13",
    file: "lease/manager.ts",
    find: 'if (why === "released") return;',
    replace: "",
    test: "lease_events_test.ts",
    name: "a holder change: acquired \\(fresh\\), released \\(clean\\)",
    what:
      "a release is also reported as a 'lost' event (reason 'released'), besides 'released'",
  },
  {
    id: "Q14",
    file: "lease/manager.ts",
    find: "new LeaseAcquiredEvent(st.key, seq, t.id, grace, found)",
    replace: "new LeaseAcquiredEvent(st.key, seq, t.id, 0, found)",
    test: "lease_events_test.ts",
    name: "a key deleted behind its holder",
    what:
      "the 'acquired' event always says grace 0, also when the new holder owes a failover grace before its first write",
  },
  {
    id: "Q15",
    file: "lease/manager.ts",
    find: "if (timed && this.#renewedHeard && st.held && st.tenure === t) {",
    replace: "if (this.#renewedHeard && st.held && st.tenure === t) {",
    test: "lease_events_test.ts",
    name: "renewed: each renewal of the timer",
    what:
      "'renewed' is dispatched for the renewals CAS guards make too, with a duration timed from 0 (untimed)",
  },
  {
    id: "Q16",
    file: "lease/manager.ts",
    find: "if (now - st.renewAt > this.ttl / 3) overdue.push(st.key);",
    replace: "if (now - st.renewAt > this.ttl) overdue.push(st.key);",
    test: "lease_test.ts",
    name: "renewal overdue by more than TTL/3",
    what:
      "health() calls a renewal overdue only a whole TTL after it was due instead of TTL/3: a stalled renewal shows as healthy until the lease is gone",
  },
  {
    id: "Q17",
    file: "lease/manager.ts",
    find:
      "if (t.suspended || t.validUntil - now < margin) expiring.push(st.key);",
    replace: "if (t.validUntil - now < margin) expiring.push(st.key);",
    test: "lease_events_test.ts",
    name: "while the connection is down",
    what:
      "health() does not list a suspended lease (connection down, not vouched for) as expiring while its deadline is still beyond the margin",
  },
  // --- ./otel ---------------------------------------------------------------
  {
    id: "Q18",
    file: "otel.ts",
    find: "e.duration / 1000,",
    replace: "e.duration,",
    test: "otel_test.ts",
    name: "lease.renewal.duration times the renewals",
    what:
      "lease.renewal.duration records milliseconds in a histogram whose unit is seconds",
  },
  {
    id: "Q19",
    file: "otel.ts",
    find:
      'if (this.#perKey) attrs["lease.key"] = e.key;\n    this.#transitions.add(1, attrs);',
    replace: "this.#transitions.add(1, attrs);",
    test: "otel_test.ts",
    name: "perKey adds lease.key to guards and transitions",
    what: "perKey: true leaves lease.key off lease.transitions",
  },
  // Survived (test gap): the named test, like every otel test, never gives
  // instrument() a valid `check`; its guards carry their own check or use
  // the default "cas", which the mutant gets right. A test that instruments
  // a manager made with check: "lease" with instrument(m, { check: "lease" })
  // and guards without a check, asserting lease.guards under lease.check
  // "lease" and no lease.guard.duration point, would kill it.
  {
    id: "Q20",
    file: "otel.ts",
    find: 'const check = (options?.check ?? this.#check) === "lease" ? 1 : 0;',
    replace: 'const check = options?.check === "lease" ? 1 : 0;',
    test: "otel_test.ts",
    // Named after the first measurement: the test written for it.
    name: "instrument\\(\\)'s check names the manager's default",
    what:
      "instrument()'s check option (the manager's default check) is ignored: guards without their own check are counted and timed as cas",
  },
  {
    id: "Q21",
    file: "otel.ts",
    find: "result.observe(this.#held, this.#inner.health().held, this.#base);",
    replace: "result.observe(this.#held, this.#inner.health().held);",
    test: "otel_test.ts",
    name: "attributes tell apart two managers measured on one meter",
    what:
      "lease.held is observed without the instrument's attributes: two managers on one meter report one series",
  },
  // --- input validation -----------------------------------------------------
  {
    id: "Q22",
    file: "lease.ts",
    find: 'typeof node !== "string" || node.trim() === ""',
    replace: 'typeof node !== "string" || node === ""',
    test: "lease_test.ts",
    name: "rejects blank node",
    what:
      "createLeaseManager() accepts a node id of spaces only, which the docs call invalid (a blank holder id)",
  },
  {
    id: "Q23",
    file: "lease/input.ts",
    find:
      'typeof value !== "number" || !Number.isFinite(value) || value < min ||',
    replace: 'typeof value !== "number" || value < min ||',
    test: "lease_test.ts",
    name: "rejects NaN ttl",
    what:
      "checkDuration lets NaN through (it compares false with both bounds): ttl, timeout, settleTimeout or idleRelease NaN is accepted",
  },
  {
    id: "Q24",
    file: "lease/input.ts",
    find: "/^[^\\s.*>]+$/",
    replace: "/^[^\\s.*>]*$/",
    test: "lease_test.ts",
    name: "rejects empty domain",
    what:
      "an empty JetStream domain is accepted: requests go to $JS..API, which no server answers",
  },
  {
    id: "Q25",
    file: "semaphore.ts",
    find: "!Number.isInteger(limit) || limit < 1 ||",
    replace: "!Number.isInteger(limit) || limit < 0 ||",
    test: "semaphore_test.ts",
    name: "throws TypeError or RangeError on bad input",
    what:
      "semaphore() accepts limit 0: a semaphore with no slot, whose waiters wait forever",
  },
];
