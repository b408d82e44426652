/**
 * The entry of the single-file `lease` binary that scripts/binary.sh builds
 * with `bun build --compile`: the command, and its watchdog.
 *
 * `lease run` starts its watchdog as `<process.execPath> <cli/watchdog.ts's
 * path> KILL_AFTER_MS` (cli/run.ts). In the binary, process.execPath is the
 * binary itself and that path names a file inside it, so the binary is run
 * again with those two arguments: here it becomes the watchdog instead of
 * reading them as a subcommand. Without this, `lease run` would refuse to
 * start any command (exit 70, the watchdog did not start).
 *
 * @module
 */

import process from "node:process";

const [script, killAfter] = process.argv.slice(2);
if (
  process.argv.length === 4 && /\/watchdog\.[jt]s$/.test(script ?? "") &&
  /^-?\d+$/.test(killAfter ?? "")
) {
  // cli/watchdog.ts reads KILL_AFTER_MS as its only argument.
  process.argv.splice(2, 1);
  await import("../cli/watchdog.ts");
} else {
  const { main } = await import("../cli/main.ts");
  process.exit(await main(process.argv.slice(2)));
}
