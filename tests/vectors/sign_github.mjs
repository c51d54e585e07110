// Signs deliveries with GitHub's official library, @octokit/webhooks-methods.
// stdin: a JSON list of {"secret", "body"}; stdout: a JSON list of
// X-Hub-Signature-256 values. Called by sign.py; see there.
import { sign } from "@octokit/webhooks-methods";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const out = [];
for (const { secret, body } of JSON.parse(input)) out.push(await sign(secret, body));
process.stdout.write(JSON.stringify(out));
