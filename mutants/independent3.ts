/**
 * A third independent mutant set: 25 small, plausible bugs made by an
 * auditor who read the code under test but none of `table.ts`,
 * `independent.ts`, `independent2.ts`. Each names, chosen before any run,
 * the test a maintainer would expect to catch it.
 *
 * Spread over the code users rely on outside the simulator: the `lease`
 * command (K1-K8: arguments, `run`, its watchdog, `--contain`'s cgroup,
 * `release`, the `ls` and `shards` views, exit statuses), the recipes
 * (K9-K12: semaphore, shards), the manager's events and `health()`
 * (K13-K16), `./otel` (K17-K20) and input validation (K21-K25: `lease.ts`'s
 * options, `lease/input.ts`, the key pattern, the semaphore's and shards'
 * option checks).
 *
 * First measurement, 2026-12-07, of the set as first written (commit
 * e6767b3), with `node_modules/.bin/node mutants/run.ts --set independent3`:
 * 21 of 25 killed (84.0 %). Every baseline passed. By area: the command
 * 8 of 8, the recipes 3 of 4 (K12 survived), events and health() 4 of 4,
 * ./otel 4 of 4, input validation 2 of 5 (K23, K24, K25 survived). Each
 * kill was rerun by hand in a copy and its failing assertion read: every
 * one is the mutated behaviour itself (a wrong exit status, LEASE_KEY, a
 * 776 ms stop instead of an immediate one, a missing metric point, ...),
 * none a timeout or a flake. The survivors are explained beside their
 * rows; none of the rows was changed after the measurement.
 *
 * @module
 */

import type { Mutant } from "./table.ts";

export const INDEPENDENT3: readonly Mutant[] = [
  // --- the lease command -------------------------------------------------
  {
    id: "K1",
    file: "cli/args.ts",
    find:
      "a.ttl !== undefined && a.killAfter !== undefined && a.killAfter >= a.ttl",
    replace:
      "a.ttl !== undefined && a.killAfter !== undefined && a.killAfter > a.ttl",
    test: "cli_test.ts",
    name: "bad arguments exit 64-67",
    what:
      "--kill-after equal to --ttl is accepted: the command may still run when a successor starts",
  },
  {
    id: "K2",
    file: "cli/run.ts",
    find: "LEASE_KEY: lease.key,",
    replace: "LEASE_KEY: a.key,",
    test: "cli_test.ts",
    name: "lease run -n 2",
    what:
      "with -n, LEASE_KEY is the semaphore's name, not the slot's key the epoch belongs to",
  },
  {
    id: "K3",
    file: "cli/run.ts",
    find:
      '} else if (stopped === "watchdog" || stopped === "silent watchdog") {',
    replace: '} else if (stopped === "watchdog") {',
    test: "cli_test.ts",
    name: "a watchdog stopped by SIGSTOP",
    what:
      "a command stopped because the watchdog went silent exits with the command's signal status (137), not 70",
  },
  {
    id: "K4",
    file: "cli/watchdog.ts",
    find: 'lines.on("close", stop);',
    replace: "",
    test: "cli_test.ts",
    name: "kill -9 of lease: its watchdog stops the command's whole group",
    what:
      "the watchdog ignores its closed stdin (lease killed by SIGKILL): the command runs on to the lease's deadline",
  },
  {
    id: "K5",
    file: "cli/watchdog.ts",
    find: "if (cgroup !== undefined) signalCgroup(cgroup, signal);",
    replace: "",
    test: "cli_test.ts",
    name: "--contain: a worker that escaped the process group",
    what:
      "the watchdog signals the command's process group only, not its cgroup: a worker that left the group (setsid) outlives a killed lease",
  },
  {
    id: "K6",
    file: "cli/release.ts",
    find: "if (Date.now() < until) continue;",
    replace: "if (Date.now() > until) continue;",
    test: "cli_test.ts",
    name: "lease release --node wins against a holder whose revision moves",
    what:
      "lease release gives up (exit 69) at the first renewal that lands between its read and its delete, instead of retrying for 5 s",
  },
  {
    id: "K7",
    file: "cli/ls.ts",
    find: "`$KV.${bucket}.${prefix}.>`",
    replace: "`$KV.${bucket}.${prefix}.*`",
    test: "cli_ls_test.ts",
    name: "any number of tokens below --prefix",
    what:
      "lease ls / watch --prefix P see only the keys one token below P (P.*), not all below it (P.>)",
  },
  {
    id: "K8",
    file: "cli/views.ts",
    find: 'to !== undefined && to !== h?.node ? ` (moving to ${to})` : ""',
    replace: 'to !== undefined ? ` (moving to ${to})` : ""',
    test: "shards_test.ts",
    name: "lease shards GROUP --count N prints",
    what:
      "lease shards says every shard is '(moving to X)', also one already owned by its target",
  },
  // --- the recipes ---------------------------------------------------------
  {
    id: "K9",
    file: "semaphore.ts",
    find: "if (!s.resize && s.limit !== this.limit) {",
    replace: "if (s.limit !== this.limit) {",
    test: "semaphore_test.ts",
    name: "resize: true changes the limit",
    what:
      "a strict contender refuses a resizing contender's r<limit> slot with LimitMismatchError instead of counting it against its own limit",
  },
  {
    id: "K10",
    file: "semaphore.ts",
    find: "const busy = c.tickets.size > 0 || this.#lock.busy ||",
    replace: "const busy = this.#lock.busy ||",
    test: "semaphore_test.ts",
    name: "also by a newcomer that arrives while the turnstile is free",
    what:
      "a newcomer that finds the turnstile free goes straight to it even while others hold tickets in line: it jumps the queue",
  },
  {
    id: "K11",
    file: "shards.ts",
    find: "if (l < q || (l === q && atCeil < r)) {",
    replace: "if (l < q || (l === q && atCeil <= r)) {",
    test: "shards_test.ts",
    name: "floor or ceil each",
    what:
      "assignShards lets one member too many reach ceil(count/n), leaving another below floor(count/n)",
  },
  // SURVIVED: equivalent in practice. leave() stops the slot's hold and
  // awaits it, then stops the count key's hold; each hold releases its own
  // key in its `finally` (#hold), so slot then count are already deleted,
  // in the right order, before these two lines run, and the releases they
  // make (here swapped) find nothing held. They are a backstop only; no
  // test can tell the swap apart without first breaking the holds.
  {
    id: "K12",
    file: "shards.ts",
    find: "        await this.#graceOver(key);\n" +
      "        await this.#leases.release(key).catch(() => {});\n" +
      "        await this.#graceOver(ck);\n" +
      "        await this.#leases.release(ck).catch(() => {});",
    replace: "        await this.#graceOver(ck);\n" +
      "        await this.#leases.release(ck).catch(() => {});\n" +
      "        await this.#graceOver(key);\n" +
      "        await this.#leases.release(key).catch(() => {});",
    test: "shards_test.ts",
    name: "leaving releases the member's shards before its slot",
    what:
      "a leaving member releases its count key before its slot: a member that still sees it in its slot finds no count",
  },
  // --- the manager's events and health() ---------------------------------
  {
    id: "K13",
    file: "lease/manager.ts",
    find: 'why === "overwritten" ? st.foreign : undefined,',
    replace: "undefined,",
    test: "lease_events_test.ts",
    name: "another node's write over the key",
    what:
      "a lost (overwritten) event no longer names the node that wrote over the key",
  },
  {
    id: "K14",
    file: "lease/manager.ts",
    find: "if (timed && this.#renewedHeard && st.held && st.tenure === t) {",
    replace: "if (this.#renewedHeard && st.held && st.tenure === t) {",
    test: "lease_events_test.ts",
    name: "renewed: each renewal of the timer",
    what:
      "a CAS guard's renewal dispatches 'renewed' too, with a duration measured from time 0",
  },
  {
    id: "K15",
    file: "lease/manager.ts",
    find:
      "if (t.suspended || t.validUntil - now < margin) expiring.push(st.key);",
    replace: "if (t.validUntil - now < margin) expiring.push(st.key);",
    test: "lease_events_test.ts",
    name: "health\\(\\) while the connection is down",
    what:
      "health() lists a suspended lease (connection down, not vouched for) as expiring only once its deadline is near",
  },
  {
    id: "K16",
    file: "lease/manager.ts",
    find: "this.#guarded.get(listener) ?? listener,",
    replace: "listener,",
    test: "lease_events_test.ts",
    name: "a listener that throws breaks neither the manager",
    what:
      "removeEventListener removes the listener itself, not the guarded wrapper registered for it: the listener keeps being called",
  },
  // --- ./otel --------------------------------------------------------------
  {
    id: "K17",
    file: "otel.ts",
    find: "      if (ran) {\n",
    replace: "      if (!ran) {\n",
    test: "otel_test.ts",
    name: "a rejected guard is counted in lease.guard.rejections",
    what:
      "a guard refused before its write is counted as a write's error, and a write that threw as a rejection",
  },
  {
    id: "K18",
    file: "otel.ts",
    find: "const t0 = check === 0 || this.#leaseDurations",
    replace: "const t0 = check === 1 || this.#leaseDurations",
    test: "otel_test.ts",
    name: "guard\\(\\) counts every guard by check and outcome",
    what:
      "lease.guard.duration times lease-checked guards by default and CAS guards only with leaseDurations",
  },
  {
    id: "K19",
    file: "otel.ts",
    find: "result.observe(this.#held, this.#inner.health().held, this.#base);",
    replace: "result.observe(this.#held, this.#inner.health().held);",
    test: "otel_test.ts",
    name: "attributes tell apart two managers measured on one meter",
    what:
      "lease.held is reported without the instrument()'s attributes: two managers on one meter collide",
  },
  {
    id: "K20",
    file: "otel.ts",
    find: "    this.#stopped = true;\n    this.#flush();\n",
    replace: "    this.#stopped = true;\n",
    test: "otel_test.ts",
    name: "stop\\(\\) flushes what was measured",
    what:
      "stop() drops the guard durations still pending (below the flush batch) instead of recording them",
  },
  // --- input validation ----------------------------------------------------
  {
    id: "K21",
    file: "lease/input.ts",
    find:
      'typeof value !== "number" || !Number.isFinite(value) || value < min ||',
    replace: 'typeof value !== "number" || value < min ||',
    test: "lease_test.ts",
    name: "rejects NaN ttl",
    what:
      "a NaN duration (ttl, timeout, idleRelease, settleTimeout) passes the range check, every comparison with NaN being false",
  },
  {
    id: "K22",
    file: "lease/entry.ts",
    find: "export const KEY_RE: RegExp = /^[-/=\\w]+(\\.[-/=\\w]+)*$/;",
    replace: "export const KEY_RE: RegExp = /^[-/=\\w]+(\\.[-/=\\w]*)*$/;",
    test: "lease_test.ts",
    name: "reject key",
    what: "keys with an empty token after a dot ('a.', 'a..b') are accepted",
  },
  // SURVIVED: a real test gap, of small harm. The bad-option rows of
  // lease_test.ts test replicas 0 and 1.5 but no value above 5, so the upper
  // bound is never exercised; under the mutant replicas 6 gets past the
  // check and the server refuses the stream instead, after requests were
  // sent and with its own message rather than the documented RangeError.
  // A row ["replicas 6", { replicas: 6 }, /'replicas'.*6/] would kill it.
  {
    id: "K23",
    file: "lease.ts",
    find: "!Number.isInteger(replicas) || replicas < 1 || replicas > 5",
    replace: "!Number.isInteger(replicas) || replicas < 1",
    // Named after the first measurement: input_test.ts, written for this
    // survivor's kind (both sides of every input bound), kills it.
    test: "input_test.ts",
    what:
      "replicas above 5 pass the option check and go to the server, instead of a RangeError before anything is sent",
  },
  // SURVIVED: a real test gap. The bad-input test checks `wait` and
  // `check` of guard() and an aborted signal of acquire(), never a signal
  // that is not an AbortSignal; under the mutant `{ signal: {} }` passes
  // the check, the census is sent, and the TypeError comes later from the
  // manager's own guard (or AbortSignal.any): "before anything is sent"
  // is broken. A `sem.guard(f, { signal: {} })` rejecting TypeError with
  // no message out would kill it.
  {
    id: "K24",
    file: "semaphore.ts",
    find: "if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) {",
    replace: 'if (o.signal !== undefined && typeof o.signal !== "object") {',
    // Named after the first measurement: input_test.ts, written for this
    // survivor's kind (both sides of every input bound), kills it.
    test: "input_test.ts",
    what:
      "a semaphore guard or acquire takes any object as its signal, not only an AbortSignal",
  },
  // SURVIVED: a real test gap. "shards() rejects bad input" tests
  // maxMembers 0 but neither side of the upper bound (cli_test.ts tests
  // only --max-members 257, still refused here), unlike the semaphore's
  // test which takes MAX_SEMAPHORE_LIMIT itself. Under the mutant the
  // documented largest value, 256, throws RangeError. Accepting
  // `shards(fake, "g", { count: 4, maxMembers: 256 })` and refusing 257
  // would kill it.
  {
    id: "K25",
    file: "shards.ts",
    find:
      "if (!Number.isInteger(slots) || slots < 1 || slots > MAX_MEMBER_SLOTS) {",
    replace:
      "if (!Number.isInteger(slots) || slots < 1 || slots >= MAX_MEMBER_SLOTS) {",
    // Named after the first measurement: input_test.ts, written for this
    // survivor's kind (both sides of every input bound), kills it.
    test: "input_test.ts",
    what: "shards() refuses maxMembers 256, the documented largest value",
  },
];
