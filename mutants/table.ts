/**
 * Hand-made mutants of the code the simulator does not drive: the `lease`
 * command and its watchdog, the recipes, events, `health()`, `./otel`,
 * `lease ls` and `lease watch`, and input checks. Each is one small,
 * plausible bug (a search text replaced once) and names the test that must
 * catch it; `run.ts` puts each into a copy of the tree and runs that test.
 * The simulator's own mutants of the lease module are in `sim/mutants.ts`.
 *
 * A mutant's `find` must occur exactly once in its file: when the code
 * changes, the runner reports the mutant as stale rather than testing the
 * unmutated code. `name` narrows the run to the tests whose names match
 * (a regular expression, as `node --test --test-name-pattern` takes it).
 *
 * @module
 */

/** One bug, and the test that must catch it. */
export interface Mutant {
  /** Short id, unique in the table. */
  readonly id: string;
  /** The file changed, relative to the repository's root. */
  readonly file: string;
  /** The text replaced; occurs exactly once in `file`. */
  readonly find: string;
  /** What it is replaced with. */
  readonly replace: string;
  /** The test file that must fail with the mutant in place. */
  readonly test: string;
  /** Which of its tests to run (a name pattern); all when omitted. */
  readonly name?: string;
  /** The bug, in words. */
  readonly what: string;
}

/**
 * The table: the command and its watchdog first, then the recipes, the
 * manager's events and `health()`, `./otel`, `lease ls` and `lease watch`,
 * the input checks, and the production port's fenced write.
 */
export const MUTANTS: readonly Mutant[] = [
  // --- cli/watchdog.ts: what stops the command when lease cannot ---------
  {
    id: "W1",
    file: "cli/watchdog.ts",
    find: `    if (alive()) kill("SIGKILL");`,
    replace: `    if (alive() && false) kill("SIGKILL");`,
    test: "cli_test.ts",
    name: "kill -9 of lease under a command that ignores SIGTERM",
    what: "the watchdog never escalates to SIGKILL",
  },
  {
    id: "W2",
    file: "cli/watchdog.ts",
    find: `lines.on("close", stop);`,
    replace: `lines.on("close", () => {});`,
    test: "cli_test.ts",
    name: "^kill -9 of lease: its watchdog",
    what:
      "the watchdog ignores lease's death (its closed pipe) and waits for the deadline",
  },
  {
    id: "W3",
    file: "cli/watchdog.ts",
    find: `  tell("ok");`,
    replace: ``,
    test: "cli_test.ts",
    name: "a blip back to the same server",
    what: "the watchdog no longer answers ticks, so lease takes it for stopped",
  },
  {
    id: "W4",
    file: "cli/watchdog.ts",
    find: `deadline = setTimeout(stop, Math.max(0, ms));`,
    replace: `deadline = setTimeout(stop, Math.max(0, ms) + 60_000);`,
    test: "cli_test.ts",
    name: "lease paused by SIGSTOP",
    what: "the watchdog misses the lease's deadline when lease is paused",
  },
  {
    id: "W5",
    file: "cli/watchdog.ts",
    find: `process.stdout.on("error", () => {});`,
    replace: ``,
    test: "cli_test.ts",
    name: "kill -9 of lease under a command that ignores SIGTERM",
    what:
      "a failed write to the dead lease's pipe (EPIPE) ends the watchdog before its SIGKILL",
  },
  // --- cli/run.ts: lease run --------------------------------------------
  {
    id: "C1",
    file: "cli/run.ts",
    find: `        setTimeout(() => {
          if (running()) kill("SIGKILL");
        }, killAfter).unref?.();`,
    replace: `        setTimeout(() => {}, killAfter).unref?.();`,
    test: "cli_test.ts",
    name: "an eviction while the watchdog is stopped",
    what: "lease run never escalates a lost lease's SIGTERM to SIGKILL",
  },
  {
    id: "C2",
    file: "cli/run.ts",
    find: `        if (frozen === on || pid === undefined) return;`,
    replace: `        if (on || frozen === on || pid === undefined) return;`,
    test: "cli_test.ts",
    name: "lost acknowledged writes",
    what: "the command is not frozen when the connection drops",
  },
  {
    id: "C3",
    file: "cli/run.ts",
    find: `            else if (frozen && !lease.signal.aborted) {`,
    replace: `            else if (frozen && false) {`,
    test: "cli_test.ts",
    name: "a blip back to the same server",
    what: "a frozen command is never thawed once the lease is proven again",
  },
  {
    id: "C4",
    file: "cli/run.ts",
    find: `watchdog.silence() > WATCHDOG_SILENCE_MS && running()`,
    replace: `watchdog.silence() > 60 * WATCHDOG_SILENCE_MS && running()`,
    test: "cli_test.ts",
    name: "a watchdog stopped by SIGSTOP",
    what: "lease does not notice a watchdog that stopped answering",
  },
  {
    id: "C5",
    file: "cli/run.ts",
    find: `          if (stopped !== undefined || !running()) {`,
    replace: `          if (true) {`,
    test: "cli_test.ts",
    name: "a watchdog that dies while the command runs",
    what: "a dead watchdog leaves the command running unprotected",
  },
  {
    id: "C6",
    file: "cli/run.ts",
    find: `if (child?.pid !== undefined) killGroup(child.pid, sig);`,
    replace: `if (child?.pid !== undefined) killGroup(child.pid, "SIGTERM");`,
    test: "cli_test.ts",
    name: "SIGINT to lease is passed on",
    what: "SIGINT is passed on to the command as SIGTERM",
  },
  {
    id: "C7",
    file: "cli/run.ts",
    find: `        code = a.lostStatus;`,
    replace: `        code = EXIT.LOST;`,
    test: "cli_test.ts",
    name: "--lost-status tells a lost lease",
    what: "--lost-status is ignored",
  },
  {
    id: "C8",
    file: "cli/run.ts",
    find: `  if (killAfter >= leases.ttl) {`,
    replace: `  if (killAfter > leases.ttl) {`,
    test: "cli_test.ts",
    name: "a --kill-after not below the bucket's TTL",
    what: "--kill-after equal to the bucket's TTL is accepted",
  },
  {
    id: "C9",
    file: "cli/run.ts",
    find: `          LEASE_EPOCH: String(lease.epoch),`,
    replace: `          LEASE_EPOCH: "1",`,
    test: "cli_test.ts",
    name: "two lease run on one key",
    what: "the command gets a constant epoch",
  },
  {
    id: "C10",
    file: "cli/run.ts",
    find:
      `  if (reason instanceof NotHolderError && reason.holder !== undefined) {`,
    replace:
      `  if (reason instanceof NotHolderError && reason.holder === undefined) {`,
    test: "cli_test.ts",
    name: "a lease lost to a write over its entry",
    what: "a loss to another holder is reported as a delete",
  },
  {
    id: "C11",
    file: "cli/cgroup.ts",
    find: `  if (signal === "SIGKILL") {
    try {`,
    replace: `  if (signal === "SIGKILL") {
    return;
    try {`,
    test: "cli_test.ts",
    name: "kill -9 of lease under a command that ignores SIGTERM",
    what:
      "--contain's SIGKILL never reaches the cgroup (a setsid worker survives)",
  },
  // --- semaphore.ts -------------------------------------------------------
  {
    id: "S1",
    file: "semaphore.ts",
    find: `      if (!s.resize && s.limit !== this.limit) {`,
    replace: `      if (!s.resize && s.limit > this.limit) {`,
    test: "semaphore_test.ts",
    name: "LimitMismatchError",
    what: "a contender with a larger limit than the holders' is let in",
  },
  {
    id: "S2",
    file: "semaphore.ts",
    find: `  const manager = managerBehind(leases);`,
    replace: `  const manager = leases;`,
    test: "semaphore_test.ts",
    name: "instrument\\(\\) of it count as one manager",
    what: "the local lock is per object, not per manager",
  },
  {
    id: "S3",
    file: "semaphore.ts",
    find: `new HeldSlotImpl(leases, lease, slot, await pin(leases, lease)),`,
    replace: `new HeldSlotImpl(leases, lease, slot, () => Promise.resolve()),`,
    test: "semaphore_test.ts",
    name: "acquire\\(\\) keeps its slot held past the manager's idleRelease",
    what: "a slot held by acquire() is not pinned against idleRelease",
  },
  {
    id: "S4",
    file: "semaphore.ts",
    find: `    limit > MAX_SEMAPHORE_LIMIT`,
    replace: `    limit > MAX_SEMAPHORE_LIMIT + 1`,
    test: "semaphore_test.ts",
    name: "bad input",
    what: "a limit one above the largest is accepted",
  },
  {
    id: "S6",
    file: "semaphore.ts",
    find: `        turn.lease.throwIfLost();
        started();`,
    replace: `        started();`,
    test: "semaphore_test.ts",
    name: "a turnstile holder paused between its census",
    what: "a slot is taken without checking that the turnstile is still held",
  },
  // --- shards.ts -----------------------------------------------------------
  {
    id: "H1",
    file: "shards.ts",
    find: `    if (oldest && oldest.count !== this.#count) {`,
    replace: `    if (oldest && oldest.count < this.#count) {`,
    test: "shards_test.ts",
    name: "count differs from the group's",
    what: "a member with a smaller count than the group's is let in",
  },
  // Not in the table: the shard lease's guard follows the lease's signal
  // and checks the tenure its write runs under; each mutant removing one of
  // the two survived (the other refuses), so they guard each other and no
  // test tells them apart yet.
  // --- lease/manager.ts: events ---------------------------------------------
  {
    id: "EV1",
    file: "lease/manager.ts",
    find: `          why === "overwritten" ? st.foreign : undefined,`,
    replace: `          undefined,`,
    test: "lease_events_test.ts",
    name: "another node's write over the key",
    what: "a loss to another node's write does not name that node",
  },
  {
    id: "EV2",
    file: "lease/manager.ts",
    find: `    if (live) {
      this.#emit(new LeaseReleasedEvent(`,
    replace: `    if (released) {
      this.#emit(new LeaseReleasedEvent(`,
    test: "lease_events_test.ts",
    name: "a key deleted behind its holder",
    what: "a release that leaves its entry to expire dispatches no released",
  },
  {
    id: "EV3",
    file: "lease/manager.ts",
    find:
      `            if (timed && this.#renewedHeard && st.held && st.tenure === t) {`,
    replace:
      `            if (this.#renewedHeard && st.held && st.tenure === t) {`,
    test: "lease_events_test.ts",
    name: "^events and health\\(\\) renewed:",
    what: "a renewal made by a CAS guard's batch also dispatches renewed",
  },
  {
    id: "EV4",
    file: "lease/manager.ts",
    find: `    if (type === "renewed") this.#renewedHeard = true;`,
    replace: ``,
    test: "lease_events_test.ts",
    name: "^events and health\\(\\) renewed:",
    what: "a listener for renewed is not noted, so none is ever dispatched",
  },
  {
    id: "EV5",
    file: "lease/manager.ts",
    find: `    const left = Math.max(0, t.validUntil - this.#port.now());`,
    replace: `    const left = Math.max(0, this.#port.now() - t.validUntil);`,
    test: "lease_events_test.ts",
    name: "a paused server: renewal-failed",
    what:
      "renewal-failed reports the time past the deadline (0 while time is left)",
  },
  {
    id: "EV6",
    file: "lease/manager.ts",
    find: `      this.#guarded.set(listener, guarded);`,
    replace: ``,
    test: "lease_events_test.ts",
    name: "a listener that throws",
    what:
      "removeEventListener cannot find the wrapped listener: a removed listener is still called",
  },
  {
    id: "EV7",
    file: "lease/manager.ts",
    find: `    if (!this.#stopped) this.#emit(new LeaseDefunctEvent(why));`,
    replace: `    if (this.#stopped) this.#emit(new LeaseDefunctEvent(why));`,
    test: "lease_events_test.ts",
    name: "a deleted bucket: lost \\(defunct\\)",
    what: "a running manager that goes defunct dispatches no defunct",
  },
  {
    id: "EV8",
    file: "lease/manager.ts",
    find:
      `    this.#emit(new LeaseAcquiredEvent(st.key, seq, t.id, grace, found));`,
    replace:
      `    this.#emit(new LeaseAcquiredEvent(st.key, seq, t.id, 0, found));`,
    test: "lease_events_test.ts",
    name: "a key deleted behind its holder",
    what: "acquired reports no grace owed when one is",
  },
  {
    id: "EV9",
    file: "lease/manager.ts",
    find: `      if (why === "released") return;`,
    replace: ``,
    test: "lease_events_test.ts",
    name: "a holder change",
    what: "a release is also dispatched as a loss",
  },
  // --- lease/manager.ts: health() -------------------------------------------
  {
    id: "HL1",
    file: "lease/manager.ts",
    find: `      if (now - st.renewAt > this.ttl / 3) overdue.push(st.key);`,
    replace: `      if (now - st.renewAt > this.ttl) overdue.push(st.key);`,
    test: "lease_test.ts",
    name: "health\\(\\): a renewal overdue",
    what: "a renewal counts as overdue only a TTL after it was due",
  },
  {
    id: "HL2",
    file: "lease/manager.ts",
    find:
      `      if (t.suspended || t.validUntil - now < margin) expiring.push(st.key);`,
    replace: `      if (t.validUntil - now < margin) expiring.push(st.key);`,
    test: "lease_events_test.ts",
    name: "health\\(\\) while the connection is down",
    what: "a lease suspended by a lost connection is not reported as expiring",
  },
  {
    id: "HL3",
    file: "lease/manager.ts",
    find: `    const connected = this.#linkUp && !this.#port.isClosed();`,
    replace: `    const connected = !this.#port.isClosed();`,
    test: "lease_events_test.ts",
    name: "health\\(\\) while the connection is down",
    what: "a connection that is down but not closed is reported connected",
  },
  {
    id: "HL4",
    file: "lease/manager.ts",
    find: `      ok: !closed && this.#defunct === undefined && connected &&`,
    replace: `      ok: this.#defunct === undefined && connected &&`,
    test: "lease_events_test.ts",
    name: "a listener that throws",
    what: "a closed manager reports ok",
  },
  {
    id: "HL5",
    file: "lease/manager.ts",
    find: `    const closed = this.#closing !== undefined || this.#stopped;`,
    replace: `    const closed = this.#stopped;`,
    test: "lease_events_test.ts",
    name: "a listener that throws",
    what: "health() says ok, not closed, while close() is settling",
  },
  {
    id: "HL6",
    file: "lease/manager.ts",
    find: `    if (typeof margin !== "number" || !(margin >= 0)) {`,
    replace: `    if (typeof margin !== "number" || margin < 0) {`,
    test: "lease_events_test.ts",
    name: "a listener that throws",
    what: "health() takes a NaN margin, under which no key is ever expiring",
  },
  // --- otel.ts ----------------------------------------------------------------
  {
    id: "OT1",
    file: "otel.ts",
    find: `      attrs["lease.lost.reason"] = (e as LeaseLostEvent).reason;`,
    replace: ``,
    test: "otel_test.ts",
    name: "lease.transitions and lease.held follow",
    what: "a loss is counted without its reason",
  },
  {
    id: "OT2",
    file: "otel.ts",
    find: `  return name === "NotHolderError"
    ? NOT_HOLDER`,
    replace: `  return name === "NotHolderError"
    ? UNAVAILABLE`,
    test: "otel_test.ts",
    name: "a rejected guard is counted",
    what: "a guard refused by another holder is counted as unavailable",
  },
  {
    id: "OT3",
    file: "otel.ts",
    find:
      `    const t0 = check === 0 || this.#leaseDurations ? performance.now() : -1;`,
    replace: `    const t0 = performance.now();`,
    test: "otel_test.ts",
    name: "guard\\(\\) counts every guard",
    what: "lease-checked guards are timed without leaseDurations",
  },
  {
    id: "OT4",
    file: "otel.ts",
    find: `      attrs["lease.lost.reason"] = (e as LeaseLostEvent).reason;
    }
    if (this.#perKey) attrs["lease.key"] = e.key;`,
    replace: `      attrs["lease.lost.reason"] = (e as LeaseLostEvent).reason;
    }`,
    test: "otel_test.ts",
    name: "perKey adds lease.key",
    what: "perKey leaves the key out of lease.transitions",
  },
  {
    id: "OT5",
    file: "otel.ts",
    find: `    for (const [type, listener] of this.#listeners) {
      this.#inner.removeEventListener(type, listener);
    }`,
    replace: ``,
    test: "otel_test.ts",
    name: "stop\\(\\) flushes what was measured",
    what: "stop() leaves the event listeners: transitions are counted after it",
  },
  {
    id: "OT6",
    file: "otel.ts",
    find: `      !(typeof v === "number" && Number.isFinite(v))`,
    replace: `      typeof v !== "number"`,
    test: "otel_test.ts",
    name: "attributes tell apart two managers",
    what: "an attribute of NaN or Infinity is accepted",
  },
  {
    id: "OT7",
    file: "otel.ts",
    find:
      `      result.observe(this.#held, this.#inner.health().held, this.#base);`,
    replace: `      result.observe(this.#held, this.#inner.health().held);`,
    test: "otel_test.ts",
    name: "attributes tell apart two managers",
    what: "lease.held is reported without the caller's attributes",
  },
  {
    id: "OT8",
    file: "otel.ts",
    find:
      `    const n = this.#pendingSeconds.push((performance.now() - t0) / 1000);`,
    replace: `    const n = this.#pendingSeconds.push(performance.now() - t0);`,
    test: "otel_test.ts",
    name: "guard\\(\\) counts every guard",
    what: "guard durations are recorded in milliseconds, not seconds",
  },
  {
    id: "OT9",
    file: "otel.ts",
    find: `      if (ran) {
        this.#settle(key, check, ERROR, t0, err);`,
    replace: `      if (false) {
        this.#settle(key, check, ERROR, t0, err);`,
    test: "otel_test.ts",
    name: "guard\\(\\) counts every guard",
    what: "a write's own error is counted as a rejection",
  },
  // --- cli/ls.ts, cli/views.ts, cli/args.ts: lease ls and lease watch ------
  {
    id: "LS1",
    file: "lease/entry.ts",
    find: `    kind = e.marker === "MaxAge" ? "expired" : "removed";`,
    replace: `    kind = "expired";`,
    test: "cli_ls_test.ts",
    name: "^lease ls and lease watch --prefix rowOf:",
    what: "every server marker (a purge's too) is read as an expiry",
  },
  {
    id: "LS2",
    file: "lease/entry.ts",
    find:
      `  } else if (e.operation === "DEL") kind = tag ? "released" : "removed";`,
    replace: `  } else if (e.operation === "DEL") kind = "released";`,
    test: "cli_ls_test.ts",
    name: "^lease ls and lease watch --prefix rowOf:",
    what: "anyone's delete is read as a lease manager's clean release",
  },
  {
    id: "LS3",
    file: "cli/ls.ts",
    find: `    state: left !== null && left <= 0 ? "expired" : "held",`,
    replace: `    state: left !== null && left < 0 ? "expired" : "held",`,
    test: "cli_ls_test.ts",
    name: "^lease ls and lease watch --prefix rowOf:",
    what: "an entry exactly a TTL old is shown as held",
  },
  {
    id: "LS4",
    file: "lease/entry.ts",
    find: `    epoch: tagged > 0 ? tagged : e.seq,`,
    replace: `    epoch: e.seq,`,
    test: "cli_ls_test.ts",
    name: "^lease ls and lease watch --prefix rowOf:",
    what: "a renewed entry's epoch is its revision, not its tag's epoch",
  },
  {
    id: "LS5",
    file: "cli/ls.ts",
    find: "    : `${base}${scope.prefix}.>`;",
    replace: "    : `${base}>`;",
    test: "cli_ls_test.ts",
    name: "lease ls shows keys held",
    what: "--prefix is ignored: every key of the bucket is listed and watched",
  },
  {
    id: "LS6",
    file: "cli/views.ts",
    find: `    if (ended !== undefined) {
      throw new UnavailableError(`,
    replace: `    if (false) {
      throw new UnavailableError(`,
    test: "cli_ls_test.ts",
    name: "a deleted bucket ends lease watch",
    what: "lease watch --all/--prefix exits 0 when its bucket is deleted",
  },
  {
    id: "LS7",
    file: "cli/args.ts",
    find: `    if (rest.length > 1) {
      throw fail(
        \`lease ls takes no KEY`,
    replace: `    if (rest.length > 2) {
      throw fail(
        \`lease ls takes no KEY`,
    test: "cli_ls_test.ts",
    name: "bad input exits 64",
    what: "lease ls KEY is taken, the KEY ignored",
  },
  {
    id: "LS8",
    file: "cli/args.ts",
    find:
      `  if ((sub === "ls" || a.prefix !== undefined || a.all) && dash >= 0) {`,
    replace: `  if (sub === "ls" && dash >= 0) {`,
    test: "cli_ls_test.ts",
    name: "bad input exits 64",
    what: "lease watch --prefix P -- CMD is taken, the command ignored",
  },
  // A known survivor, out of reach of the runner's server (2.15.2): the
  // server's MaxAge marker reports the expiry a moment later, so the watch
  // shows it all the same. Against a server that writes no marker (2.9,
  // 2.10) the same test fails: checked by hand with
  // .tools/bin/nats-server-2.10.22 (w.ghost never shown expired; the test
  // passes there without the mutant).
  {
    id: "LS9",
    file: "cli/ls.ts",
    find: `    if (row.state === "held" && row.expiresInMs !== null) {
      // No event comes for an expiry without a marker (nor before a`,
    replace: `    if (false) {
      // No event comes for an expiry without a marker (nor before a`,
    test: "cli_ls_test.ts",
    name: "lease ls shows keys held",
    what:
      "lease watch --prefix/--all does not time an expiry itself: without a server marker, an expired holder is never reported",
  },
  // --- input checks -----------------------------------------------------------
  {
    id: "IN1",
    file: "lease/input.ts",
    find:
      `    typeof value !== "number" || !Number.isFinite(value) || value < min ||
    value > max`,
    replace:
      `    typeof value !== "number" || !Number.isFinite(value) || value < min ||
    value >= max`,
    test: "lease_test.ts",
    name: "rejects a TTL above the longest timer",
    what: "the longest duration (2^31 - 1 ms) is refused",
  },
  {
    id: "IN2",
    file: "lease/entry.ts",
    find: `const KEY_RE: RegExp = /^[-/=\\w]+(\\.[-/=\\w]+)*$/;`,
    replace: `const KEY_RE: RegExp = /^[-/=\\w]+(\\.[-/=\\w]*)*$/;`,
    test: "lease_test.ts",
    name: "reject key",
    what: "a key with an empty token ('a.', 'a..b') is taken",
  },
  {
    id: "IN3",
    file: "lease/input.ts",
    find: `const DOMAIN_RE: RegExp = /^[^\\s.*>]+$/;`,
    replace: `const DOMAIN_RE: RegExp = /^[^\\s*>]+$/;`,
    test: "lease_test.ts",
    name: "rejects domain with a dot",
    what: "a domain of two subject tokens is taken",
  },
  {
    id: "IN4",
    file: "lease/input.ts",
    find: `  checkBoolean("markers", options.markers);`,
    replace: ``,
    test: "lease_test.ts",
    name: "rejects markers not boolean",
    what: "'markers' is not checked (a string 'no' counts as true)",
  },
  {
    id: "IN5",
    file: "lease/input.ts",
    find:
      `    : checkDuration("idleRelease", options.idleRelease, 1, 2 ** 31 - 1);`,
    replace:
      `    : checkDuration("idleRelease", options.idleRelease, 0, 2 ** 31 - 1);`,
    test: "lease_test.ts",
    name: "rejects idleRelease 0",
    what: "an idleRelease of 0 is taken",
  },
  {
    id: "IN6",
    file: "lease.ts",
    find: `    : checkDuration("timeout", options.timeout, 1, o.ttl);`,
    replace: `    : checkDuration("timeout", options.timeout, 1, 2 ** 31 - 1);`,
    test: "lease_test.ts",
    name: "rejects timeout above ttl",
    what: "a timeout longer than the TTL is taken",
  },
  {
    id: "IN7",
    file: "lease/input.ts",
    find: `  if (typeof node !== "string" || node.trim() === "") {`,
    replace: `  if (typeof node !== "string" || node === "") {`,
    test: "lease_test.ts",
    name: "rejects blank node",
    what: "a node id of spaces is taken",
  },
  {
    id: "IN8",
    file: "semaphore.ts",
    find: `  if (typeof resize !== "boolean") {`,
    replace: `  if (false) {`,
    test: "semaphore_test.ts",
    name: "bad input",
    what: "'resize' is not checked",
  },
  {
    id: "IN9",
    file: "semaphore.ts",
    find:
      `  if (o.check !== undefined && o.check !== "cas" && o.check !== "lease") {`,
    replace: `  if (false) {`,
    test: "semaphore_test.ts",
    name: "bad input",
    what:
      "a semaphore guard's 'check' is not checked: the manager refuses it only after the turnstile was taken",
  },
  {
    id: "IN10",
    file: "cli/args.ts",
    find:
      `        if (!/^\\d+$/.test(v) || a.lostStatus < 1 || a.lostStatus > 255) {`,
    replace:
      `        if (!/^\\d+$/.test(v) || a.lostStatus < 1 || a.lostStatus > 256) {`,
    test: "cli_test.ts",
    name: "numbers out of their range",
    what: "--lost-status 256 is taken (an exit status wraps to 0)",
  },
  {
    id: "IN11",
    file: "cli/args.ts",
    find:
      `          !/^\\d+$/.test(v) || a.limit < 1 || a.limit > MAX_SEMAPHORE_LIMIT`,
    replace:
      `          !/^\\d+$/.test(v) || a.limit < 1 || a.limit > MAX_SEMAPHORE_LIMIT + 1`,
    test: "cli_test.ts",
    name: "numbers out of their range",
    what: "-n one above the largest limit is taken",
  },
  {
    id: "IN12",
    file: "cli/args.ts",
    find: `        if (!/^\\d+$/.test(v) || n < 1 || n > max) {`,
    replace: `        if (!/^\\d+$/.test(v) || n < 1 || n > max + 1) {`,
    test: "cli_test.ts",
    name: "numbers out of their range",
    what: "--count and --max-members one above their largest are taken",
  },
  {
    id: "IN13",
    file: "cli/args.ts",
    find: `  if (a.ttl !== undefined && a.ttl < MIN_TTL) {`,
    replace: `  if (a.ttl !== undefined && a.ttl < MIN_TTL - 1) {`,
    test: "cli_test.ts",
    name: "numbers out of their range",
    what: "--ttl one below the shortest is taken",
  },
  {
    id: "IN14",
    file: "cli/args.ts",
    find:
      `  if (value === undefined || !/^\\d+$/.test(value) || !Number.isSafeInteger(n)) {`,
    replace: `  if (value === undefined || !/^\\d+$/.test(value)) {`,
    test: "cli_test.ts",
    name: "numbers out of their range",
    what: "a duration beyond 2^53 is taken (and rounded)",
  },
  {
    id: "IN15",
    file: "cli/args.ts",
    find:
      `    a.ttl !== undefined && a.killAfter !== undefined && a.killAfter >= a.ttl`,
    replace:
      `    a.ttl !== undefined && a.killAfter !== undefined && a.killAfter > a.ttl`,
    test: "cli_test.ts",
    name: "bad arguments exit 64-67",
    what: "--kill-after equal to --ttl is taken",
  },
  // --- lease/nats_port.ts: the fenced write (issue 33, step 2) -----------
  {
    id: "FP1",
    file: "lease/nats_port.ts",
    find: `  h.headers.set(PubHeaders.ExpectedLastSubjectSequenceSubjectHdr, [
    fence.subject,
  ]);`,
    replace: ``,
    test: "fenced_port_test.ts",
    what:
      "the fence's subject is left out: the server checks the write's own subject, and refuses a write its tenure allows",
  },
  {
    id: "FP2",
    file: "lease/nats_port.ts",
    find: `  h.headers.set(PubHeaders.ExpectedLastSubjectSequenceHdr, [
    String(fence.seq),
  ]);`,
    replace: ``,
    test: "fenced_port_test.ts",
    what:
      "the fence's revision is left out: the subject header alone, an error to the server, so no fenced write lands",
  },
  {
    id: "FP3",
    file: "lease/nats_port.ts",
    find: `        if (i === n - 1) h.headers.set("Nats-Batch-Commit", ["1"]);`,
    replace: ``,
    test: "fenced_port_test.ts",
    what:
      "the last message of a batch does not commit it: the server keeps it staged, and the commit never lands",
  },
  {
    id: "FP4",
    file: "lease/servers.ts",
    find: `  return releaseAtLeast(version, ATOMIC_FIRST);`,
    replace: `  return releaseAtLeast(version, FENCE_FIRST);`,
    test: "fenced_port_test.ts",
    what:
      "atomic batches are taken for 2.11, which ignores the batch headers and stores each message on its own",
  },
  {
    id: "FP5",
    file: "lease/nats_port.ts",
    find: `        return isNoResponders(err) ? "gone" : "unknown";`,
    replace: `        return "gone";`,
    test: "fenced_port_test.ts",
    what:
      "a probe's timeout counts as 'gone': a paused holder, still connected, would be displaced as if it were dead",
  },
  {
    id: "FP6",
    file: "lease/nats_port.ts",
    find: `          if (err === null) msg.respond();`,
    replace: `          if (err !== null) msg.respond();`,
    test: "fenced_port_test.ts",
    what:
      "the responder never answers: a live holder looks paused to every probe",
  },
  {
    id: "SE1",
    file: "lease/nats_port.ts",
    find: `        h.headers.set(PubHeaders.MessageTTL, [\`\${req.ttl}s\`]);`,
    replace: ``,
    test: "lease_session_test.ts",
    name: "created with its own TTL",
    what:
      "a session's entry is written without its own TTL: a manager that died keeps it forever, and its keys are never freed by expiry",
  },
  {
    id: "SE2",
    file: "lease/session.ts",
    find: `      sent !== undefined && e.operation === undefined &&`,
    replace:
      `      false && sent !== undefined && e.operation === undefined &&`,
    test: "lease_session_test.ts",
    name: "reply was lost",
    what:
      "a renewal applied with its reply lost is not recognised: the session ends at the next renewal, and every key with it",
  },
  {
    id: "SE3",
    file: "lease/session.ts",
    find: `    this.#responder.stop();
    if (tell)`,
    replace: `    if (tell)`,
    test: "lease_session_test.ts",
    name: "replaced behind its back",
    what:
      "an ended session's responder keeps answering: waiters see a live holder and wait out the TTL instead of taking over",
  },
  {
    id: "SE4",
    file: "lease/session.ts",
    find: `        expect: this.#revision,
        msgId: tag,`,
    replace: `        expect: 0,
        msgId: tag,`,
    test: "lease_session_test.ts",
    name: "created with its own TTL",
    what:
      "a renewal expects no entry instead of the session's own revision: it is refused, and the session ends",
  },
  {
    id: "MF1",
    file: "lease/manager.ts",
    find: `      res = await send({ subject: f.subject, seq: this.epoch });`,
    replace:
      `      res = await send({ subject: f.data(this.key), seq: this.epoch });`,
    test: "sim_test.ts",
    name: "a manager on a fenced bucket",
    what:
      "a fenced write is checked against a data subject, not the key's tenure entry: the holder's writes are refused",
  },
  {
    id: "MF2",
    file: "lease/manager.ts",
    find: `        if (!st.held) continue;
        st.held = false;
        this.#clearExpiry(st);`,
    replace: `        if (st.held) continue;
        st.held = false;
        this.#clearExpiry(st);`,
    test: "sim_test.ts",
    name: "a manager on a fenced bucket",
    what:
      "a lost session leaves its keys vouched for until their own deadlines, while waiters elsewhere may take them",
  },
  {
    id: "MF3",
    file: "lease/manager.ts",
    find:
      `void answer.then((a) => done(a === "gone" ? "crashed" : undefined));`,
    replace: `void answer.then(() => done(undefined));`,
    test: "sim_test.ts",
    name: "a manager on a fenced bucket",
    what:
      "a probe's 'no responders' is ignored: a crashed holder's keys wait for its session to expire",
  },
  {
    id: "MF4",
    file: "lease/manager.ts",
    find: `          if (over === undefined) return;
          found = over;`,
    replace: `          found = over ?? "crashed";`,
    test: "sim_test.ts",
    name: "a manager on a fenced bucket",
    what:
      "a fenced key is taken from a holder whose session lives: two live tenures, the first one's writes refused",
  },
  {
    id: "MF5",
    file: "lease/manager.ts",
    find: `    if (seen?.kind === "put") {
      sw.live = true;
      return;
    }`,
    replace: `    if (true) {
      sw.live = true;
      return;
    }`,
    test: "sim_test.ts",
    name: "a manager on a fenced bucket",
    what:
      "a session watch takes the session's expiry for a renewal: waiters learn of it only from the entry's read each TTL/3, hundreds of ms late",
  },
  // --- lease.ts: createLeaseManager's fenced buckets -------------------
  {
    id: "FA1",
    file: "lease/fenced.ts",
    find: `  if (metadata?.[LAYOUT_KEY] !== "fenced") return undefined;`,
    replace: `  return undefined;`,
    test: "lease_fenced_api_test.ts",
    what:
      "the fenced mark is never read: a classic manager would open a fenced bucket, and a fenced one refuses its own",
  },
  {
    id: "FA2",
    file: "lease.ts",
    find: `                [TTL_KEY]: String(o.ttl),`,
    replace: ``,
    test: "lease_fenced_api_test.ts",
    name: "marked fenced",
    what:
      "a fenced bucket is created without its TTL in the metadata: no later manager can learn the sessions' TTL",
  },
  {
    id: "FA3",
    file: "lease.ts",
    find:
      `      if (atomicVersion(nc.info?.version ?? "") && !config.allow_atomic) {`,
    replace: `      if (false) {`,
    test: "lease_fenced_api_test.ts",
    name: "commit",
    what:
      "a fenced bucket created on 2.12+ gets no atomic batches: every lease.commit is refused by the server",
  },
  {
    id: "FA4",
    file: "lease.ts",
    find: `    for (const name of ["markers", "restartGrace"] as const) {`,
    replace: `    for (const name of ["markers"] as const) {`,
    test: "lease_fenced_api_test.ts",
    name: "bad options",
    what:
      "restartGrace is taken with fenced: true, where no grace applies: a user's setting silently does nothing",
  },
  {
    id: "FA5",
    file: "lease.ts",
    find: `      ? maxKey - TENURE_PREFIX.length`,
    replace: `      ? maxKey`,
    test: "lease_fenced_api_test.ts",
    name: "longest",
    what:
      "a fenced bucket takes a classic bucket's longest key: its longer tenure subject overflows the server's control line, which closes the connection",
  },
  {
    id: "FA6",
    file: "semaphore.ts",
    find: `    return this.#lease.put(key, value);`,
    replace: `    return Promise.resolve(0);`,
    test: "lease_fenced_api_test.ts",
    name: "semaphore",
    what: "a slot lease's put is not passed on: nothing is stored",
  },
  {
    id: "FA7",
    file: "shards.ts",
    find: `    return this.#lease.put(key, value);`,
    replace: `    return Promise.resolve(0);`,
    test: "lease_fenced_api_test.ts",
    name: "shards",
    what: "a shard lease's put is not passed on: nothing is stored",
  },
  // --- lease/stream.ts: leases in a stream of the user's ----------------
  {
    id: "FS1",
    file: "lease/nats_port.ts",
    find: `      if (rollup) h.headers.set("Nats-Rollup", ["sub"]);`,
    replace: ``,
    test: "lease_stream_test.ts",
    name: "one message however often",
    what:
      "lease entries in a user's stream are not rolled up: every session renewal stays in the stream forever",
  },
  {
    id: "FS2",
    file: "lease/fenced.ts",
    find: `      if (!streamSubjects.some((p) => subjectCovers(p, subject))) {`,
    replace: `      if (false) {`,
    test: "lease_stream_test.ts",
    name: "refused before sending",
    what:
      "an append to a subject outside the stream is sent: another stream's subject is checked against a tenure it never had",
  },
  {
    id: "FS3",
    file: "lease/stream.ts",
    find: `    ["max_age", c.max_age],`,
    replace: ``,
    test: "lease_stream_test.ts",
    name: "cannot hold leases",
    what:
      "a stream with a max age is taken: a key held longer than it loses its tenure entry and is taken from a live holder",
  },
  {
    id: "FS4",
    file: "lease/fenced.ts",
    find: `    if (p[i] === ">") return i < t.length || prefix;`,
    replace: `    if (p[i] === ">") return true;`,
    test: "lease_stream_test.ts",
    name: "refused before sending",
    what:
      "a '>' subject is taken to cover its own prefix: an append to 'orders' passes for 'orders.>' and is never stored",
  },
  {
    id: "FS5",
    file: "shards.ts",
    find: `    return this.#lease.publish(subject, data);`,
    replace: `    return Promise.resolve(0);`,
    test: "lease_stream_test.ts",
    name: "shards",
    what: "a shard lease's publish is not passed on: nothing is appended",
  },
  {
    id: "FS7",
    file: "cli/stream.ts",
    find: `    if (!subjects.some((p) => subjectCovers(p, subject))) {`,
    replace: `    if (false) {`,
    test: "cli_stream_test.ts",
    name: "no appendable subject",
    what:
      "lease publish sends an append to a subject outside the stream, where no tenure fences it",
  },
  {
    id: "FS8",
    file: "cli/stream.ts",
    find:
      `        lastSubjectSequenceSubject: \`\${t.leaseSubjects}.k.\${t.key}\`,`,
    replace:
      `        lastSubjectSequenceSubject: \`\${t.leaseSubjects}.s.\${t.key}\`,`,
    test: "cli_stream_test.ts",
    name: "appends with lease publish",
    what:
      "lease publish fences its append by a subject that is not the key's tenure entry: every append is refused",
  },
  {
    id: "FA9",
    file: "lease/manager.ts",
    find: `      const answered = err instanceof WriteRefused;`,
    replace: `      const answered = false;`,
    test: "lease_stream_test.ts",
    name: "refuses for its own reason",
    what:
      "a fenced write the server refused is reported as unanswered, 'it may have been stored', though nothing was",
  },
  {
    id: "FS6",
    file: "lease/stream.ts",
    find: `  if (c.retention !== undefined && c.retention !== "limits") {`,
    replace: `  if (false) {`,
    test: "lease_stream_test.ts",
    name: "cannot hold leases",
    what:
      "a work-queue stream is taken: a consumer's ack deletes a tenure entry, and another node takes the key from a live holder",
  },
  {
    id: "FA8",
    file: "lease/nats_port.ts",
    find:
      `        if (err instanceof JetStreamApiError && err.code === ATOMIC_DISABLED) {`,
    replace: `        if (false) {`,
    test: "lease_fenced_faults_test.ts",
    name: "atomic batches turned off",
    what:
      "a commit the server refused for want of allow_atomic is reported as unanswered, 'it may have been stored', though nothing was",
  },
];
