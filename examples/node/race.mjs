// A holder for tests/test_api_node.py: CYCLES times, lease KIND over HTTP, then run a critical
// section that is not atomic (read a counter file, pause, write it back plus one) and append
// "<name> <fence> <who>" to a ledger. With --no-lease (the negative control) it skips the lease.
//   node race.mjs URL KIND CYCLES COUNTER LEDGER WHO [--no-lease]
import fs from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { LeaseClient } from "./lease_client.mjs";

const [url, kind, cycles, counter, ledger, who, flag] = process.argv.slice(2);
const client = new LeaseClient(url, process.env.RESOURCE_LEASE_TOKEN);

async function critical(lease) {
  const value = Number(fs.readFileSync(counter, "utf8"));
  await sleep(5);
  fs.writeFileSync(counter, String(value + 1));
  fs.appendFileSync(ledger, `${lease.name} ${lease.fence} ${who}\n`);
}

// RACE_GO: start together with the other holders, once that file exists (the test makes it
// when every holder has written RACE_GO.<who>).
if (process.env.RACE_GO) {
  fs.writeFileSync(`${process.env.RACE_GO}.${who}`, "");
  while (!fs.existsSync(process.env.RACE_GO)) await sleep(2);
}

for (let i = 0; i < Number(cycles); i++) {
  if (flag === "--no-lease") {
    await critical({ name: "none", fence: 0 });
  } else {
    await client.withLease(kind, { ttl: 10, wait: 60, holder: who }, critical);
  }
}
