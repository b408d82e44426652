/**
 * The `lease` command: run a program only while this node holds a lease,
 * with its fencing epoch in the environment; show, watch or evict holders.
 *
 * ```sh
 * deno run -A cli.ts run nightly-report -- ./report.sh   # from a clone
 * bun cli.ts holder nightly-report --json
 * node cli.ts watch nightly-report
 * node cli.ts shards orders --count 32
 * ```
 *
 * Exit status of `lease run`: the command's own (128 + the signal number
 * when a signal ended it), or one of {@linkcode EXIT}.
 *
 * @module
 */

import process from "node:process";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { main } from "./cli/main.ts";

export { EXIT } from "./cli/exit.ts";
export { main };

// Run as a program (not imported): Deno and Bun say so; Node 24 by argv.
const meta = import.meta as { main?: boolean };
if (
  meta.main ??
    (process.argv[1] !== undefined &&
      path.resolve(process.argv[1]) === fileURLToPath(import.meta.url))
) {
  process.exit(await main(process.argv.slice(2)));
}
