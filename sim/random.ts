/**
 * Seeded randomness for the simulator: the sfc32 generator the chaos checker
 * also draws from (`../test_util/prng.ts`), plus the few distributions a
 * history needs. Each concern of a history (faults, network, workload) draws
 * from its own stream, derived from the seed and a label, so turning one
 * fault off does not reshuffle the others: that keeps a reduced trace close
 * to the original.
 *
 * @module
 */

import { seeded } from "../test_util/prng.ts";

/** A seeded random source. */
export interface Rng {
  /** A float in [0, 1). */
  next(): number;
  /** A float in [min, max). */
  between(min: number, max: number): number;
  /** An integer in [0, n). */
  int(n: number): number;
  /** One element of a non-empty list. */
  pick<T>(items: readonly T[]): T;
  /** `true` with probability `p`. */
  chance(p: number): boolean;
  /** An exponentially distributed float with the given mean (the same bits on every engine). */
  exp(mean: number): number;
}

/**
 * Makes the random stream `label` of history `seed`.
 *
 * @param seed The history's seed.
 * @param label The concern drawing from it.
 * @returns The stream; equal arguments give equal sequences.
 */
export function stream(seed: number, label: string): Rng {
  const r = seeded(`${seed}/${label}`);
  const next = r.next;
  return {
    next,
    between: r.between,
    int: r.int,
    pick: r.pick,
    chance: (p) => p > 0 && next() < p,
    exp: (mean) => -mean * ln(1 - next()),
  };
}

const LN2 = 0.6931471805599453;

/**
 * The natural logarithm of `x` in (0, 1], from IEEE-exact operations only.
 * `Math.log` may differ in the last bit between engines (Node's V8 and
 * Deno's did), and one bit is enough to make a history differ.
 *
 * @param x The argument.
 * @returns ln(x).
 */
export function ln(x: number): number {
  let k = 0;
  let m = x;
  while (m < 1) {
    m *= 2;
    k--;
  }
  while (m >= 2) {
    m /= 2;
    k++;
  }
  // ln(m) = 2 atanh(z), z = (m - 1) / (m + 1) <= 1/3.
  const z = (m - 1) / (m + 1);
  const z2 = z * z;
  let term = z;
  let sum = 0;
  for (let i = 1; i < 60; i += 2) {
    sum += term / i;
    term *= z2;
  }
  return 2 * sum + k * LN2;
}
