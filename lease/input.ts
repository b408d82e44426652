import { KEY_RE } from "./entry.ts";

// ---------------------------------------------------------------------------
// Input checks: every one runs before anything is sent to the server.

export const BUCKET_RE: RegExp = /^[-\w]+$/;
/** A JetStream domain: one subject token. */
export const DOMAIN_RE: RegExp = /^[^\s.*>]+$/;

export function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number" || typeof value === "boolean") {
    return String(value);
  }
  return value === null ? "null" : typeof value;
}

export function checkKey(verb: string, key: unknown): asserts key is string {
  if (typeof key !== "string" || !KEY_RE.test(key)) {
    throw new TypeError(
      `Cannot ${verb} as 'key' must be ASCII letters, digits, '-', '_', '/' or '=' in non-empty '.'-separated tokens: received ${
        describe(key)
      }`,
    );
  }
}

/** `signal` of a call on `key`: an AbortSignal or undefined. */
export function checkSignal(verb: string, key: string, signal: unknown): void {
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `Cannot ${verb} on '${key}' as 'signal' must be an AbortSignal: received ${
        describe(signal)
      }`,
    );
  }
}

export function checkDuration(
  name: string,
  value: unknown,
  min: number,
  max: number,
): number {
  if (
    typeof value !== "number" || !Number.isFinite(value) || value < min ||
    value > max
  ) {
    throw new RangeError(
      `Cannot create lease manager as '${name}' must be a finite number of milliseconds from ${min} to ${max}: received ${
        describe(value)
      }`,
    );
  }
  return value;
}
