// When an answer from the server can be trusted (safety point 7 in
// `manager.ts`). Both ports run this one gate: the production port over
// nats.js (`nats_port.ts`) and the simulator's (`testing/node.ts`), each with its
// own clock and its own stream-identity request, so the simulator checks this
// code and not a copy of it.
//
// After a request went unanswered, the bucket may have been deleted and
// re-created meanwhile, and a new stream can number a key's revisions just as
// the old one did, so a CAS on our old revision may succeed there. A success
// that arrives while some unanswered request is not yet covered is trusted
// only once a stream-identity check sent after it shows the stream we started
// on. One such check runs at a time, shared by every success that arrived
// before it was sent; the successes that come while it runs share the next
// one (thousands of leases whose renewals timed out together must not send
// thousands of them).
//
// So may it during a silence: a process paused (or starved) for longer than a
// TTL sent nothing and timed nothing out, and the new stream may have passed
// our revision, so our renewal fails as if another node had taken over, and
// our next acquire would succeed there under a restarted epoch. An answer
// that comes more than `silence` ms after the previous one therefore counts
// as an unanswered request, once the manager has written anything (one that
// never did has no old epoch to go back on, so a waiter that only watched
// still takes a released key in one round trip). Holders renew every TTL/3,
// so this costs a busy manager nothing; an idle one pays one identity check
// after each silence.

import { BucketGone } from "./port.ts";

/**
 * The gate of one port: counts the requests that went unanswered and the
 * answers that came after a silence, and holds back a success until a stream
 * identity check sent after it covers them.
 */
export class ReplyTrust {
  readonly #now: () => number;
  readonly #silence: number;
  #unanswered = 0;
  #covered = 0;
  #lastAnswer: number;
  #wrote = false;
  #checking: Promise<void> | undefined;
  #queued: Promise<void> | undefined;

  /**
   * @param now The port's clock (ms).
   * @param silence A gap between two answers longer than this (ms; the TTL)
   *   counts as an unanswered request once this process has written.
   */
  constructor(now: () => number, silence: number) {
    this.#now = now;
    this.#silence = silence;
    this.#lastAnswer = now();
  }

  /** A request got no answer, or an answer that is not the server's own. */
  lost(): void {
    this.#unanswered++;
  }

  /**
   * An answer came; `applied` when it applied a write of this process.
   *
   * @param applied Whether the answer is a write of ours that was applied.
   */
  heard(applied: boolean): void {
    const now = this.#now();
    if (this.#wrote && now - this.#lastAnswer > this.#silence) {
      this.#unanswered++;
    }
    this.#lastAnswer = now;
    if (applied) this.#wrote = true;
  }

  /** Whether an answer now needs an identity check before it counts. */
  get suspect(): boolean {
    return this.#unanswered > this.#covered;
  }

  /**
   * Resolves once an identity check sent after this call shows the stream
   * the manager started on; rejects with that check's error (`BucketGone`
   * when the stream is gone or another one).
   *
   * @param check Sends one identity check: resolves when the stream is the
   *   one the manager started on, rejects otherwise.
   */
  confirm(check: () => Promise<void>): Promise<void> {
    if (this.#checking === undefined) {
      const covers = this.#unanswered;
      this.#checking = check().then(() => {
        this.#covered = Math.max(this.#covered, covers);
      }).finally(() => this.#checking = undefined);
      return this.#checking;
    }
    // The check running now may have been sent before this success came.
    return this.#queued ??= this.#checking.catch(() => {}).then(() => {
      this.#queued = undefined;
      return this.confirm(check);
    });
  }

  /**
   * Settles one request through the gate: a failure counts as unanswered
   * (unless the stream is known gone); an answer is heard, and one that
   * `needsCheck` marks waits for {@linkcode confirm} while the gate is
   * suspect. A failed check counts as unanswered too.
   *
   * @param reply The request's answer.
   * @param applied Whether an answer applied a write of this process.
   * @param needsCheck Whether an answer counts only once the stream is
   *   proven (a write's success; any read).
   * @param check Sends one identity check (see {@linkcode confirm}).
   * @returns The answer, once it can be trusted.
   */
  async settle<T>(
    reply: Promise<T>,
    applied: (res: T) => boolean,
    needsCheck: (res: T) => boolean,
    check: () => Promise<void>,
  ): Promise<T> {
    let res: T;
    try {
      res = await reply;
    } catch (err) {
      if (!(err instanceof BucketGone)) this.lost();
      throw err;
    }
    this.heard(applied(res));
    if (this.suspect && needsCheck(res)) {
      try {
        await this.confirm(check);
      } catch (err) {
        if (!(err instanceof BucketGone)) this.lost();
        throw err;
      }
    }
    return res;
  }
}
