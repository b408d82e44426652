/**
 * Loads the lease module under test: `../lease.ts`, another file given by
 * path (a mutant), or the path in the `SIM_LEASE` environment variable.
 *
 * @module
 */

import process from "node:process";
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
 * @param file A path (relative to the current directory), or `undefined`
 *   for `SIM_LEASE` or else `../lease.ts`.
 * @returns The module's simulator entry points.
 * @throws {TypeError} The module has no `managerOnPort`.
 */
export async function loadLease(file?: string): Promise<LeaseModule> {
  const chosen = file ?? process.env.SIM_LEASE;
  const full = chosen === undefined || chosen === ""
    ? path.join(ROOT, "lease.ts")
    : path.resolve(chosen);
  const mod = await import(pathToFileURL(full).href) as Partial<LeaseModule>;
  if (
    typeof mod.managerOnPort !== "function" ||
    typeof mod.BucketGone !== "function"
  ) {
    throw new TypeError(
      `Cannot simulate '${full}' as it does not export managerOnPort and BucketGone`,
    );
  }
  return mod as LeaseModule;
}
