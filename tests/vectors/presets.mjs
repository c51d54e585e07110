// Runs publishers' OFFICIAL Node libraries against deliveries for inhook's presets
// (tests/integration/preset_vectors.rs): "sign" asks a library that signs for the
// headers of a body; "verify" asks a library that verifies whether it accepts exactly
// the headers and body the test sends to inhook.
//
//   paddle  @paddle/paddle-node-sdk  Webhooks.isSignatureValid       verify
//   square  square                   WebhooksHelper.verifySignature  verify
//   workos  @workos-inc/node         webhooks.computeSignature       sign
//                                    webhooks.verifyHeader           verify
//   mux     @mux/mux-node            webhooks.computeSignature       sign
//                                    webhooks.verifySignature        verify
//   linear  @linear/sdk              LinearWebhookClient.verify      verify
//   hubspot @hubspot/api-client      Signature.getSignature (v3)     sign
//                                    Signature.isValid (v3)          verify
//
// stdin: a JSON list of {"op": "sign" | "verify", "preset", "secret", "body" (UTF-8
// text), "timestamp" (unix s, sign), "headers" ({lower-case name: value}, verify),
// "url" (the URL the publisher called, square)}; stdout: a JSON list of
// {"headers"} (sign) or {"ok": bool, "error"} (verify), each with "library", after a
// first line "ready" written once the libraries are loaded.
// `node presets.mjs --check` only loads the libraries.
import { Paddle } from "@paddle/paddle-node-sdk";
import { WebhooksHelper } from "square";
import { WorkOS } from "@workos-inc/node";
import Mux from "@mux/mux-node";
import { LinearWebhookClient } from "@linear/sdk/webhooks";
import hubspotClient from "@hubspot/api-client";
import { readFileSync } from "node:fs";

// The exact versions pinned in package.json (some packages export no package.json).
const pins = JSON.parse(readFileSync(new URL("package.json", import.meta.url))).dependencies;
const version = (pkg) => `${pkg}@${pins[pkg]}`;

const paddle = new Paddle("pdl_test_apikey_not_used");
const workos = new WorkOS("sk_test_not_used", { clientId: "client_not_used" });
const mux = new Mux({ tokenId: "not-used", tokenSecret: "not-used" });

const { Signature } = hubspotClient;

const signers = {
  async workos({ secret, body, timestamp }) {
    const ms = timestamp * 1000;
    const sig = await workos.webhooks.computeSignature(ms, JSON.parse(body), secret);
    return { "workos-signature": `t=${ms}, v1=${sig}` };
  },
  async mux({ secret, body, timestamp }) {
    const sig = await mux.webhooks.computeSignature(`${timestamp}.${body}`, secret);
    return { "mux-signature": `t=${timestamp},v1=${sig}` };
  },
  async hubspot({ secret, body, timestamp, url }) {
    const ms = String(timestamp * 1000);
    const options = { clientSecret: secret, requestBody: body, url, timestamp: ms };
    const sig = Signature.getSignature("POST", "v3", options);
    return { "x-hubspot-signature-v3": sig, "x-hubspot-request-timestamp": ms };
  },
};

const verifiers = {
  paddle: ({ secret, body, headers }) =>
    paddle.webhooks.isSignatureValid(body, secret, headers["paddle-signature"]),
  square: ({ secret, body, headers, url }) =>
    WebhooksHelper.verifySignature({
      requestBody: body,
      signatureHeader: headers["x-square-hmacsha256-signature"],
      signatureKey: secret,
      notificationUrl: url,
    }),
  workos: ({ secret, body, headers }) =>
    workos.webhooks.verifyHeader({
      payload: JSON.parse(body),
      sigHeader: headers["workos-signature"],
      secret,
    }),
  mux: async ({ secret, body, headers }) => {
    await mux.webhooks.verifySignature(body, headers, secret);
    return true;
  },
  linear: ({ secret, body, headers }) =>
    new LinearWebhookClient(secret).verify(Buffer.from(body), headers["linear-signature"]),
  hubspot: ({ secret, body, headers, url }) =>
    Signature.isValid({
      signatureVersion: "v3",
      method: "POST",
      signature: headers["x-hubspot-signature-v3"],
      clientSecret: secret,
      requestBody: body,
      url,
      timestamp: Number(headers["x-hubspot-request-timestamp"]),
    }),
};

const libraries = {
  paddle: version("@paddle/paddle-node-sdk"),
  square: version("square"),
  workos: version("@workos-inc/node"),
  mux: version("@mux/mux-node"),
  linear: version("@linear/sdk"),
  hubspot: version("@hubspot/api-client"),
};

if (process.argv[2] === "--check") {
  process.stdout.write(JSON.stringify(libraries));
} else {
  // Loading the SDKs takes seconds on a busy machine; the caller signs only once
  // this line is out, so short tolerances (Paddle's 5 s) are not spent here.
  process.stdout.write("ready\n");
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const out = [];
  for (const req of JSON.parse(input)) {
    const library = libraries[req.preset];
    if (req.op === "sign") {
      out.push({ headers: await signers[req.preset](req), library });
    } else {
      try {
        out.push({ ok: (await verifiers[req.preset](req)) === true, library });
      } catch (err) {
        out.push({ ok: false, error: String(err?.message ?? err), library });
      }
    }
  }
  process.stdout.write(JSON.stringify(out));
}
