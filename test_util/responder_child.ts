/**
 * A session's responder in a process of its own (issue 33, step 2), so that
 * `fenced_port_test.ts` can SIGSTOP and SIGKILL it: connects to NATS_URL,
 * serves PROBE_SUBJECT through the production port's `serve`, and prints
 * `{"ev":"serving"}` once the server has the subscription. It then waits to
 * be killed.
 *
 * @module
 */

import { connect } from "@nats-io/transport-node";
import { env, say } from "./child_preamble.ts";
import { portOn } from "./port.ts";

const nc = await connect({ servers: env.NATS_URL!.split(",") });
// `serve` needs only the connection: a bare port.
const port = await portOn(nc);
await port.serve!(env.PROBE_SUBJECT!);
say("serving");
// Kept alive by the subscription; the parent kills it.
await nc.closed();
