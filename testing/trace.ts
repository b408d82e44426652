/**
 * A history's readable trace: one line per thing that happened, with the
 * true time, the key it concerns and who did it. Recording is off in bulk
 * runs (a failing seed is simply run again with it on, which reproduces the
 * same history), so callers pass the text as a function.
 *
 * @module
 */

/** One line of a trace. */
export interface TraceLine {
  /** True time, ms. */
  readonly t: number;
  /** The store key, or `undefined` for what concerns a whole process or the bucket. */
  readonly key: string | undefined;
  /** Who: a manager label, `server`, `operator`, `sim`. */
  readonly who: string;
  readonly text: string;
}

/** Collects trace lines when enabled. */
export class Trace {
  readonly on: boolean;
  readonly lines: TraceLine[] = [];

  /** @param on Whether to record anything. */
  constructor(on: boolean) {
    this.on = on;
  }

  /**
   * Records a line (when enabled).
   *
   * @param t True time.
   * @param key The key, if any.
   * @param who Who.
   * @param text The text, made only when recording.
   */
  add(
    t: number,
    key: string | undefined,
    who: string,
    text: () => string,
  ): void {
    if (this.on) this.lines.push({ t, key, who, text: text() });
  }

  /**
   * Formats the last `n` lines about `key` (and those about no key) up to
   * true time `until`.
   *
   * @param key The key, or `undefined` for all.
   * @param n How many lines.
   * @param until The last time to show.
   * @returns The lines, one per row.
   */
  format(
    key: string | undefined,
    n: number = 40,
    until: number = Infinity,
  ): string {
    const rows = this.lines.filter((l) =>
      l.t <= until &&
      (key === undefined || l.key === undefined || l.key === key)
    );
    return rows.slice(-n).map((l) =>
      `${l.t.toFixed(3).padStart(10)}  ${l.who.padEnd(8)} ${
        l.key === undefined ? "" : `[${l.key}] `
      }${l.text}`
    ).join("\n");
  }
}
