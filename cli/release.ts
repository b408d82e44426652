/**
 * `lease release KEY --node ID`: an operator's eviction of a stuck holder.
 *
 * @module
 */

import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";
import { UnavailableError } from "../lease.ts";
import { type Args, RELEASE_BOUND_MS } from "./args.ts";
import { dial, isStreamNotFound, kvm, noBucket } from "./connect.ts";
import { EXIT, say } from "./exit.ts";
import { bucketLayout, TENURE_PREFIX } from "./fenced.ts";

/**
 * Deletes KEY's entry only while `--node` holds it, by compare-and-delete on
 * the entry's revision; resolves 0, or {@linkcode EXIT}'s `NOT_HOLDER` or
 * `UNAVAILABLE`.
 *
 * On a fenced bucket the entry is KEY's tenure entry (`_lease.k.KEY`),
 * which the holder never renews: the delete frees KEY for a successor at
 * once (no grace: the server refuses the evicted holder's fenced writes
 * from then on, F1), and the holder's `lease run` sees it within TTL/3.
 */
export async function release(a: Args): Promise<number> {
  const nc = await dial(a);
  try {
    const layout = await bucketLayout(nc, a).catch((err) => {
      throw new UnavailableError(a.key, (err as Error).message, { cause: err });
    });
    if (layout === undefined) throw noBucket(a);
    const entry = layout.fenced ? `${TENURE_PREFIX}${a.key}` : a.key;
    const kv = await kvm(nc, a).open(a.bucket).catch((err) => {
      throw new UnavailableError(a.key, (err as Error).message, { cause: err });
    });
    // The holder renews by compare-and-set, so its entry's revision moves
    // every TTL/3 (and on every CAS-checked guard). A renewal that lands
    // between our read and our compare-and-delete makes the server refuse
    // the delete ("wrong last sequence"). That refusal deleted nothing, so
    // reading again and deleting the new revision is safe, provided the
    // node named still holds the key: an eviction must never remove a
    // successor's entry.
    const until = Date.now() + RELEASE_BOUND_MS;
    for (let attempt = 1;; attempt++) {
      const e = await kv.get(entry);
      const node = e?.operation === "PUT" ? e.string() : undefined;
      if (node !== a.node) {
        say(
          `'${a.key}' is ${
            node === undefined ? "not held by anyone" : `held by ${node}`
          }, not by ${a.node}: nothing evicted`,
        );
        return EXIT.NOT_HOLDER;
      }
      try {
        // An untagged delete on exactly that entry: a successor treats it
        // as an operator's delete and waits the holder's TTL and the grace.
        await kv.delete(entry, { previousSeq: e!.revision });
      } catch (err) {
        const raced = err instanceof JetStreamApiError &&
          (err.code === JetStreamApiCodes.StreamWrongLastSequence ||
            err.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown);
        if (!raced) throw err;
        if (Date.now() < until) continue;
        say(
          `'${a.key}' changed under each of ${attempt} attempts in ${RELEASE_BOUND_MS} ms ` +
            `(${a.node} keeps writing it): nothing evicted; try again`,
        );
        return EXIT.UNAVAILABLE;
      }
      say(
        `evicted ${a.node} from '${a.key}' (revision ${e!.revision}` +
          (attempt > 1 ? `, attempt ${attempt})` : ")"),
      );
      return 0;
    }
  } catch (err) {
    if (isStreamNotFound(err)) throw noBucket(a);
    if (err instanceof JetStreamApiError) {
      // An answer the server gave, not a crash of ours: say it plainly.
      throw new UnavailableError(a.key, err.message, { cause: err });
    }
    throw err;
  } finally {
    await nc.close();
  }
}
