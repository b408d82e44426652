/**
 * The holder of `bench/peers.ts` rows 4 to 6, a child process the bench can
 * SIGKILL or SIGSTOP. It takes one key in one system and prints
 * `held <token>`, then obeys lines on stdin:
 *
 * - `write <value>`: the guarded write; prints `checked` once the system's
 *   check has passed and the write is about to go out, waits `window` ms
 *   (where the bench pauses it), writes, and prints `wrote <landed>`;
 * - `send <value>` (fenced buckets): sends the message a fenced put of
 *   `value` would send, by a bare publish past the lease's own check, and
 *   prints `sent <stored> <the server's answer>`;
 * - `release`: gives the key up and prints `released`.
 *
 * Usage: `<runtime> bench/_peers_child.ts <system> <endpoints-json> <key> <ttl> <window>`
 *
 * @module
 */

import process from "node:process";
import { createInterface } from "node:readline";
import { type Endpoints, openPeer, type SystemName } from "./_peers_systems.ts";

const [system, endpoints, key, ttl, window] = process.argv.slice(2);
if (!system || !endpoints || !key || !ttl || !window) {
  throw new TypeError(
    `Cannot start the peers holder as it needs <system> <endpoints-json> <key> <ttl> <window>: received ${
      JSON.stringify(process.argv.slice(2))
    }`,
  );
}
const say = (line: string): void => {
  process.stdout.write(`${line}\n`);
};
const peer = await openPeer(
  system as SystemName,
  JSON.parse(endpoints) as Endpoints,
  "holder",
);
const held = await peer.acquire(key, Number(ttl));
say(`held ${held.token ?? "-"}`);

for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, value] = line.trim().split(" ");
  if (cmd === "write") {
    let landed: boolean;
    try {
      landed = await held.write(value ?? "", async () => {
        say(`checked ${held.token ?? "-"}`);
        await new Promise((r) => setTimeout(r, Number(window)));
      });
    } catch (err) {
      say(`refused ${String(err).split("\n")[0]}`);
      continue;
    }
    say(`wrote ${landed}`);
  } else if (cmd === "send" && held.sendFenced !== undefined) {
    const { stored, answer } = await held.sendFenced(value ?? "");
    say(`sent ${stored} ${answer}`);
  } else if (cmd === "release") {
    await held.release();
    say("released");
  }
}
await peer.close();
process.exit(0);
