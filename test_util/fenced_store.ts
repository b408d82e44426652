/**
 * The store that tests write to through their guards, in-process: it
 * fences by epoch, as a store behind leases should, and records what the
 * leases promise never happens. `chaos/store.ts` is the same idea for the
 * chaos harness, out of process, with a history for its checker.
 *
 * @module
 */

import { sleep } from "./lease_helpers.ts";

/**
 * A store that refuses a write older than the newest epoch it accepted for
 * the key, or under that epoch from another tenure, and records each such
 * write and each time two writes to one key were in progress at once. A
 * write takes a moment (1 ms), so that overlapping ones are seen.
 */
export class FencedStore {
  /** Two writers inside one key at once. */
  readonly overlaps: string[] = [];
  /** One writer inside one key twice at once (say, two of its tenures). */
  readonly selfOverlaps: string[] = [];
  /** Writes refused: their epoch is older than the newest accepted. */
  readonly regressions: string[] = [];
  /** Writes refused: the newest epoch again, from another tenure. */
  readonly sameEpochTwoTenures: string[] = [];
  /** How many writes were accepted. */
  accepted = 0;
  readonly #newest = new Map<
    string | number,
    { epoch: number; tenure: string | undefined }
  >();
  readonly #inside = new Map<string | number, string[]>();

  /**
   * What a store shared by the writers of several nodes must never see:
   * another node's write in progress, or a refused write.
   *
   * @returns The overlaps of two writers, then the refused writes.
   */
  get violations(): string[] {
    return [
      ...this.overlaps,
      ...this.regressions,
      ...this.sameEpochTwoTenures,
    ];
  }

  /**
   * Writes `key` as `writer` under `epoch`, unless the fence refuses it.
   *
   * @param key The key (a lease key, a shard).
   * @param writer Who writes (a node, a manager).
   * @param epoch The lease's epoch.
   * @param tenure The lease's tenure, when the writer has one to give.
   * @returns When the write is over.
   */
  async write(
    key: string | number,
    writer: string,
    epoch: number,
    tenure?: string,
  ): Promise<void> {
    const inside = this.#inside.get(key) ?? [];
    this.#inside.set(key, inside);
    const other = inside.find((w) => w !== writer);
    if (other !== undefined) {
      this.overlaps.push(`${key}: ${writer} while ${other}`);
    } else if (inside.length > 0) {
      this.selfOverlaps.push(`${key}: ${writer} twice`);
    }
    inside.push(writer);
    const last = this.#newest.get(key);
    if (last !== undefined && epoch < last.epoch) {
      this.regressions.push(
        `${key}: ${writer} wrote epoch ${epoch} after ${last.epoch}`,
      );
    } else if (
      last !== undefined && epoch === last.epoch && tenure !== last.tenure
    ) {
      this.sameEpochTwoTenures.push(`${key}: ${writer} epoch ${epoch}`);
    } else {
      this.#newest.set(key, { epoch, tenure });
      this.accepted++;
    }
    await sleep(1);
    inside.splice(inside.indexOf(writer), 1);
  }
}
