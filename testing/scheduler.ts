/**
 * Virtual time: a priority queue of events, run one at a time, with every
 * microtask drained between two events. The protocol under test is async
 * code; after an event resolves one of its promises, all the continuations
 * that follow must run before the next event, exactly as in a real event
 * loop, or a history would depend on how fast the host runs. Draining is a
 * macrotask turn ({@linkcode macrotasks}): the host runs every queued
 * microtask (and the ones they queue) before any macrotask. No `node:*`
 * import: the testing kit (`../testing.ts`) runs this file wherever the
 * library runs. Events that only touch the simulator's own state (`pure`)
 * skip the drain.
 *
 * Events can belong to a {@linkcode Target} (a simulated process): while it
 * is paused they are held, and they are dropped once it is dead.
 *
 * @module
 */

/** What an event is to its process, for the order in which a resumed process sees them. */
export type EventKind = "timer" | "io";

/** A process that owns events: paused ones hold them, dead ones drop them. */
export interface Target {
  /** The process runs nothing now. */
  readonly paused: boolean;
  /** The process runs nothing ever again. */
  readonly dead: boolean;
  /** Keeps an event that came due while paused. */
  hold(ev: SimEvent): void;
}

/** A scheduled event. */
export interface SimEvent {
  /** True (virtual) time in ms at which it runs. */
  time: number;
  /** Tie-break: order of scheduling. */
  seq: number;
  /** The time it first came due (kept when a paused process re-queues it). */
  readonly due: number;
  readonly fn: () => void;
  readonly target: Target | undefined;
  readonly kind: EventKind;
  /** Touches no promise, so needs no microtask drain after it. */
  readonly pure: boolean;
  cancelled: boolean;
}

/** Options of {@linkcode Scheduler.at}. */
export interface EventOptions {
  /** The process the event belongs to. */
  target?: Target | undefined;
  /** @default {"io"} */
  kind?: EventKind;
  /** @default {false} */
  pure?: boolean;
}

function before(a: SimEvent, b: SimEvent): boolean {
  return a.time < b.time || (a.time === b.time && a.seq < b.seq);
}

/** A source of macrotask turns, closed when its owner is done with it. */
export interface Turns {
  /** Resolves in a later macrotask, once every queued microtask has run. */
  next(): Promise<void>;
  /** Frees what it holds (an open message channel keeps a process alive). */
  close(): void;
}

/** The host's `setImmediate`, found by a feature check (never imported). */
const immediate = (globalThis as {
  setImmediate?: (fn: () => void) => unknown;
}).setImmediate;

/**
 * Macrotask turns, by feature check: the host's global `setImmediate`
 * where there is one (Deno 2, Bun, Node: about 2 µs a turn), else posts on
 * one `MessageChannel` (browsers, workerd), else `setTimeout(0)` (a
 * millisecond or more a turn). Not a `MessageChannel` everywhere: Deno's
 * delivers a message posted on a channel whose previous message was just
 * received before the microtasks queued meanwhile have all run (measured
 * on Deno 2: from the second post on, a chain of 100 `then`s was not
 * done), which would make a history depend on the host's speed.
 *
 * @returns The turns; close them when done.
 */
export function macrotasks(): Turns {
  if (typeof immediate === "function") {
    return {
      next: () => new Promise<void>((resolve) => void immediate(resolve)),
      close: () => {},
    };
  }
  if (typeof MessageChannel !== "function") {
    return {
      next: () => new Promise<void>((resolve) => setTimeout(resolve, 0)),
      close: () => {},
    };
  }
  const channel = new MessageChannel();
  let waiting: (() => void) | undefined;
  channel.port1.onmessage = () => {
    const resolve = waiting;
    waiting = undefined;
    resolve?.();
  };
  return {
    next: () =>
      new Promise<void>((resolve) => {
        waiting = resolve;
        channel.port2.postMessage(null);
      }),
    close: () => {
      channel.port1.onmessage = null;
      channel.port1.close();
      channel.port2.close();
    },
  };
}

/** The event queue and the virtual clock. */
export class Scheduler {
  /** Events run so far. */
  steps = 0;
  #now = 0;
  #seq = 0;
  readonly #heap: SimEvent[] = [];
  #halted = false;
  readonly #clock: (() => number) | undefined;
  /** Called with every event scheduled or put back (a driver's wake-up). */
  onSchedule: ((ev: SimEvent) => void) | undefined;

  /**
   * @param clock Ties true time to a real clock (ms): time never reads
   *   less than it, and an event that runs late runs at it. Without it
   *   (the simulator) time is only what the events say.
   */
  constructor(clock?: () => number) {
    this.#clock = clock;
  }

  /** True time of the event running now, in ms. */
  get now(): number {
    return this.#clock === undefined
      ? this.#now
      : Math.max(this.#now, this.#clock());
  }

  /**
   * Schedules `fn` at true time `time` (not before now).
   *
   * @param time When.
   * @param fn What.
   * @param options Owner, kind, purity.
   * @returns The event, for {@linkcode Scheduler.cancel}.
   */
  at(time: number, fn: () => void, options: EventOptions = {}): SimEvent {
    const t = Math.max(time, this.now);
    const ev: SimEvent = {
      time: t,
      seq: this.#seq++,
      due: t,
      fn,
      target: options.target,
      kind: options.kind ?? "io",
      pure: options.pure ?? false,
      cancelled: false,
    };
    this.#push(ev);
    this.onSchedule?.(ev);
    return ev;
  }

  /** Cancels an event (a no-op once it ran). */
  cancel(ev: SimEvent): void {
    ev.cancelled = true;
  }

  /** Puts a held event back, to run now, after the events already due now. */
  requeue(ev: SimEvent): void {
    ev.time = this.now;
    ev.seq = this.#seq++;
    this.#push(ev);
    this.onSchedule?.(ev);
  }

  /**
   * The next event that may run (a cancelled one, or one of a dead process,
   * is dropped on the way), or `undefined` when none is left.
   */
  peek(): SimEvent | undefined {
    const heap = this.#heap;
    while (heap.length > 0) {
      const ev = heap[0]!;
      if (!ev.cancelled && !ev.target?.dead) return ev;
      this.#pop();
    }
    return undefined;
  }

  /** Stops {@linkcode Scheduler.run} after the current event. */
  halt(): void {
    this.#halted = true;
  }

  /**
   * Runs events in (time, seq) order up to true time `until`.
   *
   * @param until The end of the history, in ms.
   */
  async run(until: number): Promise<void> {
    const heap = this.#heap;
    let turns: Turns | undefined;
    try {
      while (heap.length > 0 && !this.#halted) {
        const ev = heap[0]!;
        if (ev.time > until) break;
        this.#pop();
        if (ev.cancelled) continue;
        const target = ev.target;
        if (target !== undefined) {
          if (target.dead) continue;
          if (target.paused) {
            target.hold(ev);
            continue;
          }
        }
        this.#now = Math.max(this.#now, ev.time);
        this.steps++;
        ev.cancelled = true; // ran: a later cancel is a no-op
        ev.fn();
        if (!ev.pure) await (turns ??= macrotasks()).next();
      }
    } finally {
      turns?.close();
    }
    if (!this.#halted) this.#now = Math.max(this.#now, until);
  }

  #push(ev: SimEvent): void {
    const heap = this.#heap;
    let i = heap.push(ev) - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const p = heap[parent]!;
      if (!before(ev, p)) break;
      heap[i] = p;
      i = parent;
    }
    heap[i] = ev;
  }

  #pop(): void {
    const heap = this.#heap;
    const last = heap.pop()!;
    if (heap.length === 0) return;
    let i = 0;
    const n = heap.length;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && before(heap[r]!, heap[l]!) ? r : l;
      if (!before(heap[c]!, last)) break;
      heap[i] = heap[c]!;
      i = c;
    }
    heap[i] = last;
  }
}
