/**
 * The `lease` command's dispatch: parses the command line, runs the
 * subcommand, and turns each kind of failure into its exit status.
 *
 * @module
 */

import process from "node:process";
import { UnavailableError } from "../lease.ts";
import { LimitMismatchError } from "../semaphore.ts";
import { type Args, isSub, parse, usage, UsageError } from "./args.ts";
import { NoServerError } from "./connect.ts";
import { EXIT, say } from "./exit.ts";
import { fencedWrite } from "./fenced.ts";
import { release } from "./release.ts";
import { run } from "./run.ts";
import { streamPublish } from "./stream.ts";
import { holder, ls, shardsView, watch, watchMany } from "./views.ts";

/**
 * Runs the `lease` command with `argv` (without the runtime and script) and
 * resolves with its exit status. Prints to stdout and stderr.
 *
 * @param argv The arguments, e.g. `["holder", "orders", "--json"]`.
 * @returns The exit status.
 *
 * @example
 * ```ts ignore
 * process.exitCode = await main(process.argv.slice(2));
 * ```
 */
export async function main(argv: string[]): Promise<number> {
  let a: Args;
  try {
    a = parse(argv);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    say(err.message);
    if (err.usage !== null) {
      process.stderr.write(`${usage(err.usage, false)}\n`);
    }
    return err.code;
  }
  if (a.help) {
    process.stdout.write(`${usage(isSub(a.sub) ? a.sub : "", true)}\n`);
    return 0;
  }
  try {
    switch (a.sub) {
      case "run":
        return await run(a);
      case "holder":
        return await holder(a);
      case "watch":
        return a.prefix !== undefined || a.all
          ? await watchMany(a)
          : await watch(a);
      case "ls":
        return await ls(a);
      case "shards":
        return await shardsView(a);
      case "put":
      case "delete":
        return await fencedWrite(a);
      case "publish":
        return await streamPublish(a);
      default:
        return await release(a);
    }
  } catch (err) {
    if (err instanceof UsageError) {
      say(err.message);
      return err.code;
    }
    if (err instanceof NoServerError) {
      say(err.message);
      return EXIT.NO_SERVER;
    }
    if (err instanceof UnavailableError) {
      say(err.message);
      return EXIT.UNAVAILABLE;
    }
    if (err instanceof LimitMismatchError) {
      // Its own message names the API's option (`resize: true`): say what
      // the command line offers instead.
      say(
        `nothing run: slot '${err.key}' of '${err.semaphore}', held by ${err.holder}, was taken with -n ${err.recorded}, not -n ${err.asked}. Give every lease run of '${err.semaphore}' the same -n, or pass --resize with the new -n to change it while runs with -n ${err.recorded} go on`,
      );
      return EXIT.LIMIT_MISMATCH;
    }
    throw err;
  }
}
