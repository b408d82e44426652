/**
 * Loads the lease module under test: `../lease.ts` and its `lease/` folder,
 * another copy given by the path of its `lease.ts` (a mutant), or the path in
 * the `SIM_LEASE` environment variable. The simulator plugs in at the seam
 * only: the core from `lease/manager.ts`, `BucketGone` from `lease/port.ts`,
 * and the reply gate its port shares with production from `lease/trust.ts`.
 *
 * @module
 */

import process from "node:process";
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { LeaseModule } from "./world.ts";

/** The repository root (the folder above `sim/`). */
export const ROOT: string = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  "..",
);

/**
 * Imports a lease module.
 *
 * @param file The path of a copy's `lease.ts` (relative to the current
 *   directory; its `lease/` folder beside it), or `undefined` for
 *   `SIM_LEASE` or else `../lease.ts`.
 * @returns The module's simulator entry points.
 * @throws {TypeError} The copy has no `lease/` folder, or its files lack
 *   `managerOnPort`, `BucketGone` or `ReplyTrust`.
 */
export async function loadLease(file?: string): Promise<LeaseModule> {
  const chosen = file ?? process.env.SIM_LEASE;
  const full = chosen === undefined || chosen === ""
    ? path.join(ROOT, "lease.ts")
    : path.resolve(chosen);
  const dir = path.join(path.dirname(full), "lease");
  if (!fs.existsSync(dir)) {
    throw new TypeError(
      `Cannot simulate '${full}' as it has no 'lease' folder beside it`,
    );
  }
  const load = (name: string) =>
    import(pathToFileURL(path.join(dir, name)).href);
  const [manager, port, trust] = await Promise.all([
    load("manager.ts"),
    load("port.ts"),
    load("trust.ts"),
  ]);
  const mod: Partial<LeaseModule> = {
    managerOnPort: manager.managerOnPort,
    BucketGone: port.BucketGone,
    ReplyTrust: trust.ReplyTrust,
  };
  if (
    typeof mod.managerOnPort !== "function" ||
    typeof mod.BucketGone !== "function" ||
    typeof mod.ReplyTrust !== "function"
  ) {
    throw new TypeError(
      `Cannot simulate '${full}' as its lease/ files do not export managerOnPort, BucketGone and ReplyTrust`,
    );
  }
  return mod as LeaseModule;
}
