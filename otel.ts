/**
 * OpenTelemetry metrics for a {@linkcode LeaseManager}: holder changes,
 * guard outcomes and durations, renewals and their failures, and the
 * leases held.
 *
 * {@linkcode instrument} wraps a manager in one with the same interface
 * whose guards are measured, and listens to the manager's events. It is
 * built on the public interface only and imports nothing but
 * `@opentelemetry/api`: without an SDK registered, every instrument is a
 * no-op. Attributes are bounded by default (no store keys); see
 * {@linkcode InstrumentOptions.perKey}.
 *
 * @example Export to Prometheus
 * ```ts ignore
 * import { metrics } from "@opentelemetry/api";
 * import { MeterProvider } from "@opentelemetry/sdk-metrics";
 * import { PrometheusExporter } from "@opentelemetry/exporter-prometheus";
 * import { createLeaseManager } from "@nats-lease/lease";
 * import { instrument } from "@nats-lease/lease/otel";
 *
 * metrics.setGlobalMeterProvider(
 *   new MeterProvider({ readers: [new PrometheusExporter({ port: 9464 })] }),
 * );
 * using leases = instrument(await createLeaseManager({ nc, node: "node-a" }));
 * await leases.guard("orders", (lease) => store.append(lease.epoch, record));
 * ```
 *
 * @module
 */

import { metrics } from "@opentelemetry/api";
import type {
  CloseResult,
  GuardCheck,
  GuardOptions,
  HealthOptions,
  Holder,
  Lease,
  LeaseAcquiredEvent,
  LeaseEventMap,
  LeaseHealth,
  LeaseLostEvent,
  LeaseManager,
  LeaseReleasedEvent,
  LeaseRenewedEvent,
  RenewalFailedEvent,
  WatchOptions,
} from "./mod.ts";

/** Attributes of a measurement, as OpenTelemetry takes them. */
export type MetricAttributes = Record<string, string | number | boolean>;

/** Options of an instrument, as {@linkcode Meter} takes them. */
export interface MetricOptions {
  /** What the instrument measures. */
  description?: string;
  /** The unit, in UCUM (`"s"`, `"{lease}"`). */
  unit?: string;
  /** Hints for the SDK's aggregation. */
  advice?: { explicitBucketBoundaries?: number[] };
}

/** A histogram, as {@linkcode Meter} makes it. */
export interface MetricHistogram {
  /**
   * Records a measurement.
   *
   * @param value The value.
   * @param attributes Its attributes.
   */
  record(value: number, attributes?: MetricAttributes): void;
}

/** A counter, as {@linkcode Meter} makes it. */
export interface MetricCounter {
  /**
   * Adds to the counter.
   *
   * @param value The increment.
   * @param attributes Its attributes.
   */
  add(value: number, attributes?: MetricAttributes): void;
}

/** What a batch observable callback reports through. */
export interface BatchResult {
  /**
   * Reports one observable's value.
   *
   * @param observable The observable, as {@linkcode Meter} made it.
   * @param value The value.
   * @param attributes Its attributes.
   */
  observe(
    observable: object,
    value: number,
    attributes?: MetricAttributes,
  ): void;
}

/**
 * The members of an OpenTelemetry `Meter` (of `@opentelemetry/api`) that
 * {@linkcode instrument} uses: any `Meter` is one. Declared here so the
 * published types stand on their own.
 *
 * @example A meter of a provider
 * ```ts ignore
 * import { MeterProvider } from "@opentelemetry/sdk-metrics";
 * const meter: Meter = new MeterProvider().getMeter("orders");
 * ```
 */
export interface Meter {
  /**
   * Makes a histogram.
   *
   * @param name The instrument's name.
   * @param options Its description, unit and advice.
   * @returns The histogram.
   */
  createHistogram(name: string, options?: MetricOptions): MetricHistogram;
  /**
   * Makes a counter.
   *
   * @param name The instrument's name.
   * @param options Its description and unit.
   * @returns The counter.
   */
  createCounter(name: string, options?: MetricOptions): MetricCounter;
  /**
   * Makes an observable up-down counter.
   *
   * @param name The instrument's name.
   * @param options Its description and unit.
   * @returns The observable.
   */
  createObservableUpDownCounter(name: string, options?: MetricOptions): object;
  /**
   * Makes an observable counter.
   *
   * @param name The instrument's name.
   * @param options Its description and unit.
   * @returns The observable.
   */
  createObservableCounter(name: string, options?: MetricOptions): object;
  /**
   * Calls `callback` at each collection, for `observables`.
   *
   * @param callback The callback.
   * @param observables The observables it reports.
   */
  addBatchObservableCallback(
    callback: (result: BatchResult) => void,
    observables: object[],
  ): void;
  /**
   * Removes a callback added by {@linkcode Meter.addBatchObservableCallback}.
   *
   * @param callback The callback.
   * @param observables The observables it reports.
   */
  removeBatchObservableCallback(
    callback: (result: BatchResult) => void,
    observables: object[],
  ): void;
}

/** The instrumentation scope name of the default meter. */
export const METER_NAME = "@nats-lease/lease";

/**
 * Bucket boundaries, in seconds, advised for `lease.guard.duration`: from
 * 5 µs (a lease-checked guard) to 10 s (a guard that waited its turn). A
 * view in the SDK overrides them.
 */
export const GUARD_DURATION_BUCKETS: readonly number[] = Object.freeze([
  0.000005,
  0.00001,
  0.000025,
  0.00005,
  0.0001,
  0.00025,
  0.0005,
  0.001,
  0.0025,
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
]);

/** Options of {@linkcode instrument}. */
export interface InstrumentOptions {
  /**
   * The meter the instruments are made on.
   * @default {metrics.getMeter("@nats-lease/lease")}
   */
  meter?: Meter;
  /**
   * Add the store key as the `lease.key` attribute to guard, transition
   * and renewal measurements.
   *
   * **Warning:** every key becomes a time series of each instrument, kept
   * by the SDK (and the backend) for as long as the process lives, also
   * after the key is released. Use it only with a small, fixed set of keys;
   * with keys made per tenant, job or shard, the series grow without
   * bound. A per-key guard also costs more (its attributes are built and
   * hashed per call).
   * @default {false}
   */
  perKey?: boolean;
  /**
   * Also time guards that prove the lease by its deadline
   * (`check: "lease"`) in `lease.guard.duration`; they are always counted
   * in `lease.guards`. Such a guard costs about 0.3 µs, so its duration is
   * the write's own, and timing it (two clock reads and a histogram record)
   * costs more than the guard.
   * @default {false}
   */
  leaseDurations?: boolean;
  /**
   * The manager's own `check` option, for the `lease.check` attribute of
   * guards that name none (the manager does not expose it).
   * @default {"cas"}
   */
  check?: GuardCheck;
  /**
   * Attributes added to every measurement, `lease.held` included: what
   * tells apart several managers measured on one meter, e.g.
   * `{ "lease.bucket": leases.bucket }`. Without them their series share
   * one attribute set and the SDK keeps one manager's value of each
   * observed instrument, not their sum. Keep them to a few fixed values
   * per process: each value is a series of every instrument. Names this
   * module sets (`lease.check`, `lease.guard.outcome`, `lease.key`,
   * `lease.transition`, `lease.lost.reason`, `error.type`) are refused.
   * @default {{}}
   */
  attributes?: Readonly<MetricAttributes>;
}

/** Attribute names {@linkcode InstrumentedLeaseManager} sets itself. */
const OWN_ATTRIBUTES: ReadonlySet<string> = new Set([
  "lease.check",
  "lease.guard.outcome",
  "lease.key",
  "lease.transition",
  "lease.lost.reason",
  "error.type",
]);

/** `options.attributes`, checked and frozen. */
function baseAttributes(value: unknown): Readonly<MetricAttributes> {
  if (value === undefined) return Object.freeze({});
  if (
    typeof value !== "object" || value === null || Array.isArray(value)
  ) {
    throw new TypeError(
      `Cannot instrument lease manager as 'attributes' must be an object: received ${
        Array.isArray(value) ? "an array" : String(value)
      }`,
    );
  }
  const out: MetricAttributes = {};
  for (const [name, v] of Object.entries(value)) {
    if (OWN_ATTRIBUTES.has(name)) {
      throw new TypeError(
        `Cannot instrument lease manager as attribute '${name}' is set by the instrumentation itself: use another name`,
      );
    }
    if (
      typeof v !== "string" && typeof v !== "boolean" &&
      !(typeof v === "number" && Number.isFinite(v))
    ) {
      throw new TypeError(
        `Cannot instrument lease manager as attribute '${name}' must be a string, a finite number or a boolean: received ${
          typeof v === "object" ? JSON.stringify(v) : String(v)
        }`,
      );
    }
    out[name] = v;
  }
  return Object.freeze(out);
}

/** `lease.guard.outcome`, by index into the local counts. */
const OUTCOMES = ["ok", "not_holder", "unavailable", "error"] as const;
const OK = 0;
const NOT_HOLDER = 1;
const UNAVAILABLE = 2;
const ERROR = 3;
const CHECKS = ["cas", "lease"] as const;
/**
 * Durations waiting to be recorded: a histogram record costs the SDK
 * 0.3–2 µs (attributes hashed, storage looked up), a few per cent of a CAS
 * guard, so guards only append to a buffer, and the records are made off
 * the guard's path: in a timer once `FLUSH_AT` wait, at each collection
 * (the observable callback runs before the SDK reads the histogram), and
 * at `stop()`. At `MAX_PENDING` (an event loop that never reaches the
 * timer) the guard records them itself.
 */
const FLUSH_AT = 64;
const MAX_PENDING = 4096;

/** The outcome of a guard that rejected before its write ran. */
function rejection(err: unknown): number {
  const name = errorType(err);
  return name === "NotHolderError"
    ? NOT_HOLDER
    : name === "UnavailableError"
    ? UNAVAILABLE
    : ERROR;
}

/** `error.type`: the error's class name (`Error.name`), as semantic conventions advise. */
function errorType(err: unknown): string {
  return err instanceof Error ? err.name : "_OTHER";
}

/**
 * A {@linkcode LeaseManager} whose guards and events are measured, made by
 * {@linkcode instrument}. Everything but the measurements is the wrapped
 * manager's: the same leases, events and errors.
 *
 * `using` it stops the metrics (the manager keeps running);
 * `await using` it closes the manager, then stops the metrics.
 *
 * @example Stop measuring, keep the manager
 * ```ts ignore
 * const measured = instrument(leases);
 * await measured.guard("orders", write);
 * measured.stop(); // leases goes on, unmeasured
 * ```
 */
export class InstrumentedLeaseManager implements LeaseManager, Disposable {
  readonly #inner: LeaseManager;
  readonly #meter: Meter;
  readonly #perKey: boolean;
  readonly #leaseDurations: boolean;
  readonly #check: GuardCheck;
  /** `options.attributes`: the start of every attribute set made here. */
  readonly #base: Readonly<MetricAttributes>;
  readonly #duration: MetricHistogram;
  readonly #transitions: MetricCounter;
  readonly #rejections: MetricCounter;
  readonly #renewalFailures: MetricCounter;
  readonly #renewalDuration: MetricHistogram;
  readonly #held: object;
  readonly #guards: object;
  readonly #observe: (result: BatchResult) => void;
  /** Guards by check × outcome, observed by `lease.guards` (no per-call SDK work). */
  readonly #counts = new Float64Array(CHECKS.length * OUTCOMES.length);
  /** The same, per key, with `perKey`. */
  readonly #keyCounts = new Map<string, Float64Array>();
  /** Attributes of each check × outcome (and error type), made once. */
  readonly #attrs: MetricAttributes[] = [];
  readonly #errorAttrs = new Map<string, MetricAttributes>();
  readonly #listeners: [keyof LeaseEventMap, (e: Event) => void][];
  readonly #pendingSeconds: number[] = [];
  readonly #pendingAttrs: MetricAttributes[] = [];
  #flushTimer: ReturnType<typeof setTimeout> | undefined;
  readonly #flushLater = (): void => {
    this.#flushTimer = undefined;
    this.#flush();
  };
  #stopped = false;

  /**
   * Made by {@linkcode instrument}.
   *
   * @param inner The manager to measure.
   * @param options The meter and attributes.
   */
  constructor(inner: LeaseManager, options: InstrumentOptions = {}) {
    this.#inner = inner;
    this.#meter = options.meter ?? metrics.getMeter(METER_NAME);
    this.#perKey = options.perKey ?? false;
    this.#leaseDurations = options.leaseDurations ?? false;
    this.#check = options.check ?? "cas";
    if (this.#check !== "cas" && this.#check !== "lease") {
      throw new TypeError(
        `Cannot instrument lease manager as 'check' must be "cas" or "lease": received ${
          JSON.stringify(this.#check)
        }`,
      );
    }
    for (const name of ["perKey", "leaseDurations"] as const) {
      const value: unknown = options[name];
      if (value !== undefined && typeof value !== "boolean") {
        throw new TypeError(
          `Cannot instrument lease manager as '${name}' must be a boolean: received ${
            JSON.stringify(value)
          }`,
        );
      }
    }
    this.#base = baseAttributes(options.attributes);
    const meter = this.#meter;
    this.#duration = meter.createHistogram("lease.guard.duration", {
      description:
        "Duration of guards, from the call until it settles (the write included).",
      unit: "s",
      advice: { explicitBucketBoundaries: [...GUARD_DURATION_BUCKETS] },
    });
    this.#transitions = meter.createCounter("lease.transitions", {
      description: "Tenures begun (acquired) and ended (lost, released).",
      unit: "{transition}",
    });
    this.#rejections = meter.createCounter("lease.guard.rejections", {
      description: "Guards that rejected before their write ran.",
      unit: "{guard}",
    });
    this.#renewalFailures = meter.createCounter("lease.renewal.failures", {
      description:
        "Renewals of held keys that got no answer or could not be sent.",
      unit: "{renewal}",
    });
    this.#renewalDuration = meter.createHistogram("lease.renewal.duration", {
      description:
        "Duration of the renewals the manager makes on its timer, until the server confirmed them.",
      unit: "s",
      advice: { explicitBucketBoundaries: [...GUARD_DURATION_BUCKETS] },
    });
    this.#held = meter.createObservableUpDownCounter("lease.held", {
      description: "Keys this manager holds.",
      unit: "{lease}",
    });
    this.#guards = meter.createObservableCounter("lease.guards", {
      description: "Guards settled, by check and outcome.",
      unit: "{guard}",
    });
    for (const check of CHECKS) {
      for (const outcome of OUTCOMES) {
        this.#attrs.push(
          Object.freeze({
            ...this.#base,
            "lease.check": check,
            "lease.guard.outcome": outcome,
          }),
        );
      }
    }
    this.#observe = (result) => {
      this.#flush();
      result.observe(this.#held, this.#inner.health().held, this.#base);
      this.#observeCounts(result, this.#counts, undefined);
      for (const [key, counts] of this.#keyCounts) {
        this.#observeCounts(result, counts, key);
      }
    };
    meter.addBatchObservableCallback(this.#observe, [this.#held, this.#guards]);
    this.#listeners = [
      ["acquired", (e) => this.#transition(e as LeaseAcquiredEvent)],
      ["lost", (e) => this.#transition(e as LeaseLostEvent)],
      ["released", (e) => this.#transition(e as LeaseReleasedEvent)],
      ["renewal-failed", (e) => this.#renewalFailed(e as RenewalFailedEvent)],
      ["renewed", (e) => this.#renewed(e as LeaseRenewedEvent)],
    ];
    for (const [type, listener] of this.#listeners) {
      inner.addEventListener(type, listener);
    }
  }

  #observeCounts(
    result: BatchResult,
    counts: Float64Array,
    key: string | undefined,
  ): void {
    for (let i = 0; i < counts.length; i++) {
      if (counts[i] === 0) continue;
      const attrs = this.#attrs[i]!;
      result.observe(
        this.#guards,
        counts[i]!,
        key === undefined ? attrs : { ...attrs, "lease.key": key },
      );
    }
  }

  #transition(
    e: LeaseAcquiredEvent | LeaseLostEvent | LeaseReleasedEvent,
  ): void {
    const attrs: MetricAttributes = {
      ...this.#base,
      "lease.transition": e.type,
    };
    if (e.type === "lost") {
      attrs["lease.lost.reason"] = (e as LeaseLostEvent).reason;
    }
    if (this.#perKey) attrs["lease.key"] = e.key;
    this.#transitions.add(1, attrs);
  }

  #renewalFailed(e: RenewalFailedEvent): void {
    const attrs: MetricAttributes = {
      ...this.#base,
      "error.type": errorType(e.error),
    };
    if (this.#perKey) attrs["lease.key"] = e.key;
    this.#renewalFailures.add(1, attrs);
  }

  #renewed(e: LeaseRenewedEvent): void {
    this.#renewalDuration.record(
      e.duration / 1000,
      this.#perKey ? { ...this.#base, "lease.key": e.key } : this.#base,
    );
  }

  /** Counts, and with `timed`, records a settled guard. */
  #settle(
    key: string,
    check: number,
    outcome: number,
    t0: number,
    err: unknown,
  ): void {
    if (this.#stopped) return;
    const i = check * OUTCOMES.length + outcome;
    let attrs = this.#attrs[i]!;
    if (this.#perKey) {
      let counts = this.#keyCounts.get(key);
      if (counts === undefined) {
        counts = new Float64Array(this.#counts.length);
        this.#keyCounts.set(key, counts);
      }
      counts[i]!++;
      attrs = { ...attrs, "lease.key": key };
    } else {
      this.#counts[i]!++;
    }
    if (outcome !== OK) {
      const type = errorType(err);
      if (this.#perKey) {
        attrs = { ...attrs, "error.type": type };
      } else {
        let cached = this.#errorAttrs.get(`${i} ${type}`);
        if (cached === undefined) {
          cached = Object.freeze({ ...attrs, "error.type": type });
          this.#errorAttrs.set(`${i} ${type}`, cached);
        }
        attrs = cached;
      }
    }
    if (t0 < 0) return;
    const n = this.#pendingSeconds.push((performance.now() - t0) / 1000);
    this.#pendingAttrs.push(attrs);
    if (n >= MAX_PENDING) this.#flush();
    else if (n >= FLUSH_AT && this.#flushTimer === undefined) {
      this.#flushTimer = setTimeout(this.#flushLater, 0);
    }
  }

  #flush(): void {
    if (this.#flushTimer !== undefined) {
      clearTimeout(this.#flushTimer);
      this.#flushTimer = undefined;
    }
    const seconds = this.#pendingSeconds;
    const attrs = this.#pendingAttrs;
    for (let i = 0; i < seconds.length; i++) {
      this.#duration.record(seconds[i]!, attrs[i]);
    }
    seconds.length = 0;
    attrs.length = 0;
  }

  #rejected(key: string, err: unknown): void {
    if (this.#stopped) return;
    const type = errorType(err);
    let attrs: MetricAttributes | undefined = this.#perKey
      ? undefined
      : this.#errorAttrs.get(type);
    if (attrs === undefined) {
      attrs = { ...this.#base, "error.type": type };
      if (this.#perKey) attrs["lease.key"] = key;
      else this.#errorAttrs.set(type, Object.freeze(attrs));
    }
    this.#rejections.add(1, attrs);
  }

  /** The wrapped manager's node id. */
  get node(): string {
    return this.#inner.node;
  }

  /** The wrapped manager's TTL in milliseconds. */
  get ttl(): number {
    return this.#inner.ttl;
  }

  /** The wrapped manager's bucket. */
  get bucket(): string {
    return this.#inner.bucket;
  }

  /** Whether {@linkcode InstrumentedLeaseManager.stop} was called. */
  get stopped(): boolean {
    return this.#stopped;
  }

  /**
   * {@linkcode LeaseManager.guard}, counted in `lease.guards` by check and
   * outcome, timed in `lease.guard.duration` (a lease-checked guard only
   * with `leaseDurations`), and counted in `lease.guard.rejections` when it
   * rejects before its write ran. The `lease.check` attribute is the check
   * asked for: a lease-checked guard on a key whose deadline is too close
   * takes the CAS path but is still counted as `"lease"`.
   *
   * @typeParam T What `write` returns.
   * @param key The store key.
   * @param write The write.
   * @param options As for {@linkcode LeaseManager.guard}.
   * @returns What `write` returns.
   * @throws {NotHolderError} As {@linkcode LeaseManager.guard}.
   * @throws {UnavailableError} As {@linkcode LeaseManager.guard}.
   * @throws {TypeError} As {@linkcode LeaseManager.guard}.
   *
   * @example A measured guard
   * ```ts ignore
   * await measured.guard("orders", (lease) => store.append(lease.epoch, record));
   * ```
   */
  guard<T>(
    key: string,
    write: (lease: Lease) => T | Promise<T>,
    options?: GuardOptions,
  ): Promise<T> {
    if (this.#stopped) return this.#inner.guard(key, write, options);
    const check = (options?.check ?? this.#check) === "lease" ? 1 : 0;
    const t0 = check === 0 || this.#leaseDurations ? performance.now() : -1;
    let ran = false;
    return this.#inner.guard(key, (lease) => {
      ran = true;
      return write(lease);
    }, options).then((value) => {
      this.#settle(key, check, OK, t0, undefined);
      return value;
    }, (err) => {
      if (ran) {
        this.#settle(key, check, ERROR, t0, err);
      } else {
        this.#settle(key, check, rejection(err), t0, err);
        this.#rejected(key, err);
      }
      throw err;
    });
  }

  /**
   * {@linkcode LeaseManager.held}, unmeasured.
   *
   * @param key The store key.
   * @returns `true` when this node holds the key.
   *
   * @example Check a lease
   * ```ts ignore
   * if (await measured.held("orders")) console.log("this node writes orders");
   * ```
   */
  held(key: string): Promise<boolean> {
    return this.#inner.held(key);
  }

  /**
   * {@linkcode LeaseManager.holder}, unmeasured.
   *
   * @param key The store key.
   * @returns The holder, or `null`.
   *
   * @example Route a write
   * ```ts ignore
   * const h = await measured.holder("orders");
   * ```
   */
  holder(key: string): Promise<Holder | null> {
    return this.#inner.holder(key);
  }

  /**
   * {@linkcode LeaseManager.holders}, unmeasured.
   *
   * @param prefix A valid key.
   * @returns Each held key under `prefix`, with its holder.
   *
   * @example List a family of leases
   * ```ts ignore
   * const held = await measured.holders("reports");
   * ```
   */
  holders(prefix: string): Promise<Map<string, Holder>> {
    return this.#inner.holders(prefix);
  }

  /**
   * {@linkcode LeaseManager.release}; the release shows in
   * `lease.transitions`.
   *
   * @param key The store key.
   * @returns A promise that resolves when the key is released or left to expire.
   *
   * @example Release a key
   * ```ts ignore
   * await measured.release("import-2026-12");
   * ```
   */
  release(key: string): Promise<void> {
    return this.#inner.release(key);
  }

  /**
   * {@linkcode LeaseManager.campaign}; its tenures show in
   * `lease.transitions`.
   *
   * @param key The store key.
   * @param options A signal that ends the campaign.
   * @returns The tenures won.
   *
   * @example Lead
   * ```ts ignore
   * for await (const lease of measured.campaign("scheduler", { signal })) await lead(lease);
   * ```
   */
  campaign(key: string, options?: WatchOptions): AsyncIterable<Lease> {
    return this.#inner.campaign(key, options);
  }

  /**
   * {@linkcode LeaseManager.watch}, unmeasured.
   *
   * @param key The store key.
   * @param options A signal that ends the iteration.
   * @returns The holder, then each change of holder.
   *
   * @example Follow a key
   * ```ts ignore
   * for await (const h of measured.watch("orders", { signal })) route(h?.node);
   * ```
   */
  watch(key: string, options?: WatchOptions): AsyncIterable<Holder | null> {
    return this.#inner.watch(key, options);
  }

  /**
   * {@linkcode LeaseManager.close}: closes the wrapped manager; its
   * releases show in `lease.transitions`. The metrics go on until
   * {@linkcode InstrumentedLeaseManager.stop}.
   *
   * @returns Which keys were released and which were left to expire.
   *
   * @example Close, then stop measuring
   * ```ts ignore
   * await measured.close();
   * measured.stop();
   * ```
   */
  close(): Promise<CloseResult> {
    return this.#inner.close();
  }

  /**
   * {@linkcode LeaseManager.health} of the wrapped manager.
   *
   * @param options The margin.
   * @returns The wrapped manager's health.
   *
   * @example A probe
   * ```ts ignore
   * const ok = measured.health().ok;
   * ```
   */
  health(options?: HealthOptions): LeaseHealth {
    return this.#inner.health(options);
  }

  /**
   * Stops measuring: removes the listeners from the manager and the
   * observable callback from the meter; guards made afterwards are the
   * manager's own, unmeasured. The manager keeps running. Safe to call twice.
   *
   * @example Stop measuring
   * ```ts ignore
   * measured.stop();
   * ```
   */
  stop(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#flush();
    for (const [type, listener] of this.#listeners) {
      this.#inner.removeEventListener(type, listener);
    }
    this.#meter.removeBatchObservableCallback(this.#observe, [
      this.#held,
      this.#guards,
    ]);
  }

  /**
   * Stops measuring, as {@linkcode InstrumentedLeaseManager.stop} does.
   *
   * @example Measure within a block
   * ```ts ignore
   * {
   *   using measured = instrument(leases);
   *   await measured.guard("orders", write);
   * } // measured.stop()
   * ```
   */
  [Symbol.dispose](): void {
    this.stop();
  }

  /**
   * Closes the wrapped manager, then stops measuring.
   *
   * @example Close and stop at the end of a block
   * ```ts ignore
   * await using leases = instrument(await createLeaseManager({ nc, node: "a" }));
   * ```
   */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.#inner[Symbol.asyncDispose]();
    } finally {
      this.stop();
    }
  }

  /**
   * Listens on the wrapped manager, as {@linkcode LeaseManager.addEventListener}.
   *
   * @example Log losses
   * ```ts ignore
   * measured.addEventListener("lost", (e) => console.warn(e.key, e.reason));
   * ```
   */
  addEventListener<K extends keyof LeaseEventMap>(
    type: K,
    listener: (event: LeaseEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions,
  ): void;
  /**
   * Listens on the wrapped manager by event name.
   *
   * @example Listen once
   * ```ts ignore
   * measured.addEventListener("defunct", () => process.exit(1), { once: true });
   * ```
   */
  addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  addEventListener(
    type: string,
    // deno-lint-ignore no-explicit-any
    listener: any,
    options?: boolean | AddEventListenerOptions,
  ): void {
    this.#inner.addEventListener(type, listener, options);
  }

  /**
   * Removes a listener from the wrapped manager.
   *
   * @example Stop logging
   * ```ts ignore
   * measured.removeEventListener("lost", log);
   * ```
   */
  removeEventListener<K extends keyof LeaseEventMap>(
    type: K,
    listener: (event: LeaseEventMap[K]) => void,
    options?: boolean | EventListenerOptions,
  ): void;
  /**
   * Removes a listener from the wrapped manager by event name.
   *
   * @example Remove a listener object
   * ```ts ignore
   * measured.removeEventListener("released", handler);
   * ```
   */
  removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
  removeEventListener(
    type: string,
    // deno-lint-ignore no-explicit-any
    listener: any,
    options?: boolean | EventListenerOptions,
  ): void {
    this.#inner.removeEventListener(type, listener, options);
  }

  /**
   * Dispatches an event on the wrapped manager.
   *
   * @param event The event.
   * @returns `false` if a listener cancelled it.
   *
   * @example Dispatch a test event
   * ```ts ignore
   * measured.dispatchEvent(new Event("custom"));
   * ```
   */
  dispatchEvent(event: Event): boolean {
    return this.#inner.dispatchEvent(event);
  }
}

/**
 * Measures a lease manager with OpenTelemetry: returns a manager with the
 * same interface whose guards are counted and timed, and listens to the
 * manager's events for holder changes and renewals. Use the
 * returned manager for the guards to be measured; events and `lease.held`
 * are measured whichever one the guards go through.
 *
 * | instrument               | kind                    | unit           | attributes                                                         |
 * | ------------------------ | ----------------------- | -------------- | ------------------------------------------------------------------ |
 * | `lease.held`             | ObservableUpDownCounter | `{lease}`      | none                                                               |
 * | `lease.transitions`      | Counter                 | `{transition}` | `lease.transition` (acquired, lost, released), `lease.lost.reason` |
 * | `lease.guards`           | ObservableCounter       | `{guard}`      | `lease.check` (cas, lease), `lease.guard.outcome`                  |
 * | `lease.guard.duration`   | Histogram               | `s`            | `lease.check`, `lease.guard.outcome`, `error.type`                 |
 * | `lease.guard.rejections` | Counter                 | `{guard}`      | `error.type`                                                       |
 * | `lease.renewal.failures` | Counter                 | `{renewal}`    | `error.type`                                                       |
 * | `lease.renewal.duration` | Histogram               | `s`            | none                                                               |
 *
 * `lease.guard.outcome` is `ok`, `not_holder` or `unavailable` (rejected
 * with `NotHolderError` or `UnavailableError` before
 * the write), or `error` (the write threw, or another rejection). With
 * `perKey`, `lease.key` is added to all but `lease.held`. The `attributes`
 * option is added to all: give each manager measured on one meter its own.
 *
 * `lease.renewal.duration` times the renewals the manager makes on its
 * timer (its `renewed` events). A key kept busy by CAS-checked guards is
 * renewed by them instead, and their round trip is in
 * `lease.guard.duration`.
 *
 * @param leases The manager to measure.
 * @param options The meter, `perKey`, `leaseDurations`, the manager's `check` and the `attributes` of every measurement.
 * @returns The measuring manager; `stop()` (or `using`) ends the measuring.
 * @throws {TypeError} `check` is neither `"cas"` nor `"lease"`, `perKey` or `leaseDurations` is not a boolean, or `attributes` is not an object of strings, finite numbers and booleans, or names an attribute the instrumentation sets.
 *
 * @example Measure the guards of a manager
 * ```ts ignore
 * import { instrument } from "@nats-lease/lease/otel";
 *
 * const measured = instrument(leases, { meter: provider.getMeter("orders") });
 * await measured.guard("orders", (lease) => store.append(lease.epoch, record));
 * measured.stop();
 * ```
 */
export function instrument(
  leases: LeaseManager,
  options?: InstrumentOptions,
): InstrumentedLeaseManager {
  return new InstrumentedLeaseManager(leases, options);
}
