// "Leader among tabs": every tab that opens this page campaigns for one
// key, and the page shows, live, which tab leads and under which epoch.
// Open it in several tabs and close the leading one: another takes over at
// once, because the leaving tab releases its lease on `pagehide`.
//
// It loads the lease module from the esbuild bundle of ./lease.ts
// (README.md says how to build it). The WebSocket URL and the key come from
// the page's query string: ?ws=ws://127.0.0.1:8080&key=tab-leader.
import { createLeaseManager, wsconnect } from "./dist/lease.js";

const params = new URLSearchParams(location.search);
const servers = params.get("ws") ?? "ws://127.0.0.1:8080";
const key = params.get("key") ?? "tab-leader";
// A tab has no name of its own: make one up, short enough to read.
const node = `tab-${crypto.randomUUID().slice(0, 4)}`;

const $ = (id) => document.getElementById(id);
$("me").textContent = node;

/** Adds a line to the page's log of leader changes, newest first. */
function log(text) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  $("log").prepend(li);
  while ($("log").children.length > 8) $("log").lastChild.remove();
}

/** Shows who leads; `null` while nobody does (between two tenures). */
function show(holder) {
  const status = $("status");
  if (holder === null) {
    status.textContent = "No tab leads right now.";
    status.className = "none";
    return;
  }
  const who = holder.node === node ? "This tab" : `Tab ${holder.node}`;
  status.textContent = `${who} leads, under epoch ${holder.epoch}.`;
  status.className = holder.node === node ? "me" : "other";
  document.title = holder.node === node ? "Leader: this tab" : "Follower";
}

// Reconnects forever: a tab leads (or waits) again after an outage of any
// length, where the default gives up after 10 tries.
const nc = await wsconnect({ servers, maxReconnectAttempts: -1 });
// A short TTL, so that a tab that dies without releasing (a crash, a killed
// process) is replaced within seconds: after the TTL and the failover grace.
const leases = await createLeaseManager({
  nc,
  node,
  bucket: "tabs",
  ttl: 5_000,
});

// Closing the tab hands the key on at once, instead of after TTL + grace.
// Best effort: the browser may end the page before the release is sent.
addEventListener("pagehide", () => {
  void leases.close().then(() => nc.close());
});

// The display follows the watch (a hint, as any reader sees it) ...
(async () => {
  for await (const holder of leases.watch(key)) {
    show(holder);
    log(
      holder === null
        ? "nobody leads"
        : `${holder.node} leads (epoch ${holder.epoch})`,
    );
  }
})();

// ... while the campaign decides: each yielded lease is one tenure of this
// tab, which lasts until its signal aborts.
for await (const lease of leases.campaign(key)) {
  $("role").textContent = `leader since ${new Date().toLocaleTimeString()}`;
  await new Promise((resolve) =>
    lease.signal.addEventListener("abort", resolve, { once: true })
  );
  $("role").textContent = "follower";
}
