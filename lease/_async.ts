// Promise helpers of the protocol core: no clock, no timer.

export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("aborted", "AbortError");
}

/** A signal's one listener, and the waits it calls. */
interface Shared {
  readonly fns: Set<() => void>;
  readonly fire: () => void;
}
const shared = new WeakMap<AbortSignal, Shared>();

/**
 * Calls `fn` once when `signal` aborts, unless the returned function is
 * called first. Every wait on one signal shares a single listener on it:
 * a long-lived signal (the manager's close, a caller's, a shards member's
 * stop) is waited on by every pending guard, watch and campaign at once,
 * and one listener each made Node warn of a leak
 * (`MaxListenersExceededWarning` past 10: a shards member watches 16
 * slots). The listener goes with the last wait.
 */
export function onAbort(signal: AbortSignal, fn: () => void): () => void {
  let s = shared.get(signal);
  if (!s) {
    const fns = new Set<() => void>();
    const fire = () => {
      shared.delete(signal);
      for (const f of [...fns]) f();
      fns.clear();
    };
    shared.set(signal, s = { fns, fire });
    signal.addEventListener("abort", fire, { once: true });
  }
  const own = s;
  // A wrapper per wait: the same function may wait twice.
  const once = () => {
    if (own.fns.delete(once)) fn();
  };
  own.fns.add(once);
  return () => {
    if (!own.fns.delete(once) || own.fns.size > 0) return;
    if (shared.get(signal) === own) shared.delete(signal);
    signal.removeEventListener("abort", own.fire);
  };
}

/** `p`, or the signal's reason if it aborts first. */
export function raceAbort<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(abortReason(signal));
  return new Promise<T>((resolve, reject) => {
    const off = onAbort(signal, () => reject(abortReason(signal)));
    p.then(resolve, reject).finally(off);
  });
}
