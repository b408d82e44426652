// The layering of the lease module, read from its import lines (deno lint
// cannot enforce it): the protocol core is sans-I/O, the transport stays
// below the core, the simulator and the testing kit plug in at the seam
// only, the testing kit imports no runtime module, and the package's main
// entry never reaches the testing kit. Each rule is also shown failing on a
// tree that breaks it.

import { describe, test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.dirname(fileURLToPath(import.meta.url));

/** Source files by path relative to the root, with `/` separators. */
type Tree = Map<string, string>;

/**
 * The package's entries and what they import (the lease module, the
 * recipes), the simulator and the testing kit, as they are on disk.
 */
function readTree(): Tree {
  const tree: Tree = new Map();
  const add = (rel: string) =>
    tree.set(rel, fs.readFileSync(path.join(ROOT, rel), "utf8"));
  for (
    const name of fs.readdirSync(ROOT).filter((n) =>
      n.endsWith(".ts") && !n.endsWith("_test.ts")
    ).sort()
  ) add(name);
  for (const dir of ["lease", "sim", "testing"]) {
    for (const name of fs.readdirSync(path.join(ROOT, dir)).sort()) {
      if (name.endsWith(".ts")) add(`${dir}/${name}`);
    }
  }
  return tree;
}

/**
 * The code of a source file with comments removed, and with every string and
 * template literal's text blanked unless `keepStrings` (a `${}` inside a
 * template is kept): neither a JSDoc example nor an error message counts.
 */
function codeOf(source: string, keepStrings = false): string {
  let out = "";
  let i = 0;
  const n = source.length;
  // Template nesting: each entry counts the braces open inside a `${`.
  const templates: number[] = [];
  const inTemplate = () =>
    templates.length > 0 && templates[templates.length - 1] === 0;
  while (i < n) {
    const c = source[i]!;
    const next = source[i + 1];
    if (inTemplate()) {
      if (c === "\\") {
        if (keepStrings) out += source.slice(i, i + 2);
        i += 2;
      } else if (c === "`") {
        templates.pop();
        out += "`";
        i++;
      } else if (c === "$" && next === "{") {
        templates[templates.length - 1] = 1;
        out += "${";
        i += 2;
      } else {
        if (keepStrings) out += c;
        i++;
      }
      continue;
    }
    if (c === "/" && next === "*") {
      const end = source.indexOf("*/", i + 2);
      i = end < 0 ? n : end + 2;
      out += " ";
    } else if (c === "/" && next === "/") {
      const end = source.indexOf("\n", i);
      i = end < 0 ? n : end;
    } else if (c === '"' || c === "'") {
      let j = i + 1;
      while (j < n && source[j] !== c && source[j] !== "\n") {
        j += source[j] === "\\" ? 2 : 1;
      }
      out += c + (keepStrings ? source.slice(i + 1, j) : "") + c;
      i = j + 1;
    } else if (c === "`") {
      templates.push(0);
      out += "`";
      i++;
    } else {
      if (templates.length > 0) {
        if (c === "{") templates[templates.length - 1]!++;
        else if (c === "}") {
          templates[templates.length - 1]!--;
          if (templates[templates.length - 1] === 0) {
            out += "}";
            i++;
            continue;
          }
        }
      }
      out += c;
      i++;
    }
  }
  return out;
}

/** The specifiers a file imports or re-exports from, static and dynamic. */
function importsOf(source: string): string[] {
  const code = codeOf(source, true);
  const found: string[] = [];
  const patterns = [
    /\b(?:import|export)\s[^;]*?\bfrom\s*["']([^"']+)["']/g,
    /\bimport\s*["']([^"']+)["']/g,
    /\bimport\s*\(\s*["']([^"']+)["']/g,
  ];
  for (const re of patterns) {
    for (const m of code.matchAll(re)) found.push(m[1]!);
  }
  return found;
}

/** A relative specifier resolved against its file, or undefined. */
function resolve(from: string, spec: string): string | undefined {
  if (!spec.startsWith(".")) return undefined;
  return path.posix.normalize(path.posix.join(path.posix.dirname(from), spec));
}

/** Every file of the tree that `start` reaches through relative imports. */
function closure(tree: Tree, start: string): Set<string> {
  const seen = new Set<string>();
  const todo = [start];
  while (todo.length > 0) {
    const file = todo.pop()!;
    if (seen.has(file) || !tree.has(file)) continue;
    seen.add(file);
    for (const spec of importsOf(tree.get(file)!)) {
      const target = resolve(file, spec);
      if (target !== undefined) todo.push(target);
    }
  }
  return seen;
}

/** Globals that read the clock, set a timer or draw randomness. */
const WORLD_RE =
  /\b(?:Date|performance|setTimeout|setInterval|clearTimeout|clearInterval|crypto|Math\.random|Deno|Bun|process)\b/g;

/** Where the simulator and the testing kit may plug in (see rule 3). */
const SIM_SEAM = new Set([
  "lease/port.ts",
  "lease/manager.ts",
  // The manager on the fenced layout, its session opened first: core code
  // over a port, as managerOnPort is (issue 33).
  "lease/fenced.ts",
  "lease/types.ts",
  "lease/trust.ts",
  "lease/servers.ts",
]);

/**
 * The testing kit's entry checks `t.manager()`'s options with the checks
 * `createLeaseManager` runs: it may also import those.
 */
const KIT_ENTRY_SEAM = new Set([...SIM_SEAM, "lease/input.ts"]);

/** The testing kit's own files: its entry and the world it shares with the simulator. */
function isKit(file: string): boolean {
  return file === "testing.ts" || file.startsWith("testing/");
}

/** Every broken rule of the tree, one sentence each. */
function violations(tree: Tree): string[] {
  const out: string[] = [];
  // 1. The core is sans-I/O: `lease/manager.ts` and all it imports use no
  // runtime or transport module and read no clock, timer or random source
  // (everything of the world comes through its Port).
  const core = new Set([
    ...closure(tree, "lease/manager.ts"),
    ...closure(tree, "lease/fenced.ts"),
  ]);
  for (const file of core) {
    const source = tree.get(file)!;
    for (const spec of importsOf(source)) {
      if (!spec.startsWith(".")) {
        out.push(`core file ${file} imports '${spec}'`);
      }
    }
    for (const m of codeOf(source).matchAll(WORLD_RE)) {
      out.push(`core file ${file} uses '${m[0]}'`);
    }
  }
  // 2. The transport stays below the core: the production port and the
  // server checks never reach the manager.
  for (const low of ["lease/nats_port.ts", "lease/servers.ts"]) {
    for (const file of closure(tree, low)) {
      if (file === "lease/manager.ts" || file === "lease/state.ts") {
        out.push(`${low} reaches ${file}`);
      }
    }
  }
  // 3. The simulator and the testing kit plug in at the seam only: the
  // core and its port, the public types, and the two modules both ports
  // share (the reply gate and the marker-life rule); the kit's entry also
  // the option checks. Never the face or the production port. The
  // simulator's in-memory server, processes and scheduler are the kit's
  // (testing/), one copy, held to the same rule. The simulator's loader
  // names the files it imports at run time as strings.
  for (const [file, source] of tree) {
    if (!file.startsWith("sim/") && !isKit(file)) continue;
    const seam = file === "testing.ts" ? KIT_ENTRY_SEAM : SIM_SEAM;
    for (const spec of importsOf(source)) {
      const target = resolve(file, spec);
      if (
        target !== undefined && (target === "lease.ts" ||
          target.startsWith("lease/")) &&
        !seam.has(target)
      ) {
        out.push(`${file} imports ${target}`);
      }
    }
  }
  const loader = tree.get("sim/load.ts") ?? "";
  for (const m of loader.matchAll(/load\("([^"]+)"\)/g)) {
    if (!SIM_SEAM.has(`lease/${m[1]}`)) {
      out.push(`sim/load.ts loads lease/${m[1]}`);
    }
  }
  // 4. The testing kit runs wherever the library runs (Deno, Bun, Node,
  // browsers, workerd): its own files import no runtime or transport
  // module, only relative ones (what they reach of lease/ is rule 3's).
  for (const [file, source] of tree) {
    if (!isKit(file)) continue;
    for (const spec of importsOf(source)) {
      if (!spec.startsWith(".")) out.push(`kit file ${file} imports '${spec}'`);
    }
  }
  // 5. The package's main entry never reaches the testing kit: an
  // application that imports the library loads no in-memory server.
  for (const file of closure(tree, "mod.ts")) {
    if (isKit(file)) out.push(`mod.ts reaches ${file}`);
  }
  return out;
}

/** The tree with `text` added to the end of `file`. */
function withLine(tree: Tree, file: string, text: string): Tree {
  const copy = new Map(tree);
  assert.ok(copy.has(file), file);
  copy.set(file, `${copy.get(file)}\n${text}\n`);
  return copy;
}

describe("the lease module's layering", () => {
  const tree = readTree();

  test("the tree keeps every rule", () => {
    assert.deepEqual(violations(tree), []);
  });

  test("the core is what the rules say it is", () => {
    const core = closure(tree, "lease/manager.ts");
    for (const file of ["lease/port.ts", "lease/state.ts", "lease/types.ts"]) {
      assert.ok(core.has(file), file);
    }
    for (const file of ["lease/nats_port.ts", "lease/servers.ts", "lease.ts"]) {
      assert.ok(!core.has(file), file);
    }
  });

  test("a core file that imports nats.js or a runtime module breaks rule 1", () => {
    assert.deepEqual(
      violations(
        withLine(tree, "lease/state.ts", 'import { Kvm } from "@nats-io/kv";'),
      ),
      ["core file lease/state.ts imports '@nats-io/kv'"],
    );
    assert.deepEqual(
      violations(withLine(tree, "lease/entry.ts", 'import "node:fs";')),
      ["core file lease/entry.ts imports 'node:fs'"],
    );
  });

  test("the core reaching the production port breaks rule 1 through it", () => {
    const broken = violations(
      withLine(
        tree,
        "lease/manager.ts",
        'export { natsPort } from "./nats_port.ts";',
      ),
    );
    assert.ok(
      broken.some((v) => v.startsWith("core file lease/nats_port.ts imports")),
      broken.join("\n"),
    );
  });

  test("a core file that reads the clock, sets a timer or draws randomness breaks rule 1", () => {
    for (
      const [file, line, used] of [
        ["lease/manager.ts", "const t0 = performance.now();", "performance"],
        ["lease/state.ts", "setTimeout(() => {}, 1);", "setTimeout"],
        ["lease/_async.ts", "export const r = Math.random();", "Math.random"],
        ["lease/entry.ts", "export const d = Date.now();", "Date"],
      ] as const
    ) {
      assert.deepEqual(violations(withLine(tree, file, line)), [
        `core file ${file} uses '${used}'`,
      ]);
    }
  });

  test("the words in a comment or a message break no rule", () => {
    assert.deepEqual(
      violations(
        withLine(
          tree,
          "lease/manager.ts",
          '// performance.now() and setTimeout live in the port\nexport const m = "setTimeout(Date.now())";\nexport const t = `${"x"} performance`;',
        ),
      ),
      [],
    );
  });

  test("the production port or the server checks importing the manager breaks rule 2", () => {
    assert.deepEqual(
      violations(
        withLine(
          tree,
          "lease/servers.ts",
          'import type { ManagerSettings } from "./manager.ts";',
        ),
      ),
      // The production port imports the server checks, so it reaches the
      // manager through them.
      [
        "lease/nats_port.ts reaches lease/manager.ts",
        "lease/nats_port.ts reaches lease/state.ts",
        "lease/servers.ts reaches lease/manager.ts",
        "lease/servers.ts reaches lease/state.ts",
      ],
    );
    assert.deepEqual(
      violations(
        withLine(
          tree,
          "lease/nats_port.ts",
          'import { KeyState } from "./state.ts";',
        ),
      ),
      ["lease/nats_port.ts reaches lease/state.ts"],
    );
  });

  test("the simulator importing the face or the production port breaks rule 3", () => {
    assert.deepEqual(
      violations(
        withLine(
          tree,
          "sim/world.ts",
          'import { natsPort } from "../lease/nats_port.ts";',
        ),
      ),
      ["sim/world.ts imports lease/nats_port.ts"],
    );
    assert.deepEqual(
      violations(
        withLine(
          tree,
          "sim/world.ts",
          'import type { Lease } from "../lease.ts";',
        ),
      ),
      ["sim/world.ts imports lease.ts"],
    );
    assert.deepEqual(
      violations(withLine(tree, "sim/load.ts", 'await load("nats_port.ts");')),
      ["sim/load.ts loads lease/nats_port.ts"],
    );
  });

  test("the testing kit importing the face, the production port or more than its seam breaks rule 3", () => {
    assert.deepEqual(
      violations(
        withLine(
          tree,
          "testing/node.ts",
          'import { natsPort } from "../lease/nats_port.ts";',
        ),
      ),
      ["testing/node.ts imports lease/nats_port.ts"],
    );
    assert.deepEqual(
      violations(
        withLine(tree, "testing.ts", 'import "./lease.ts";'),
      ),
      ["testing.ts imports lease.ts"],
    );
    // The option checks are the entry's alone.
    assert.deepEqual(
      violations(
        withLine(
          tree,
          "testing/kv.ts",
          'import { describe } from "../lease/input.ts";',
        ),
      ),
      ["testing/kv.ts imports lease/input.ts"],
    );
  });

  test("the simulator shares the testing kit's world, one copy", () => {
    for (const file of ["sim/world.ts", "sim/fenced.ts"]) {
      const reached = closure(tree, file);
      for (
        const kit of [
          "testing/kv.ts",
          "testing/node.ts",
          "testing/scheduler.ts",
          "testing/trace.ts",
        ]
      ) assert.ok(reached.has(kit), `${file} reaches ${kit}`);
    }
  });

  test("a testing kit file that imports a runtime or transport module breaks rule 4", () => {
    assert.deepEqual(
      violations(
        withLine(
          tree,
          "testing/scheduler.ts",
          'import { setImmediate } from "node:timers";',
        ),
      ),
      ["kit file testing/scheduler.ts imports 'node:timers'"],
    );
    assert.deepEqual(
      violations(
        withLine(tree, "testing.ts", 'import { Kvm } from "@nats-io/kv";'),
      ),
      ["kit file testing.ts imports '@nats-io/kv'"],
    );
  });

  test("the main entry reaching the testing kit breaks rule 5", () => {
    assert.deepEqual(
      violations(
        withLine(tree, "mod.ts", 'export * from "./testing.ts";'),
      ).filter((v) => !v.startsWith("mod.ts reaches testing/")),
      ["mod.ts reaches testing.ts"],
    );
    // Through any file the entry reaches, here a recipe, by a type alone.
    const broken = violations(
      withLine(
        tree,
        "shards.ts",
        'import type { SimKv } from "./testing/kv.ts";',
      ),
    );
    assert.ok(
      broken.includes("mod.ts reaches testing/kv.ts"),
      broken.join("\n"),
    );
    assert.ok(
      broken.every((v) => v.startsWith("mod.ts reaches testing/")),
      broken.join("\n"),
    );
  });
});
