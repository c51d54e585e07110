#!/usr/bin/env python3
"""Signs webhook deliveries with each publisher's OFFICIAL library, so the
Rust integration tests (tests/integration/signatures.rs) check inhook against
the publishers' own code rather than against inhook's signer.

    standard-webhooks  standardwebhooks (PyPI), Webhook.sign            -> v1
    standard-webhooks  cryptography Ed25519 when the key is whsk_ (no   -> v1a
                       official Python or JS signer exists for v1a; the
                       format is checked against the reference Go
                       library's vector in src/signature unit tests)
    svix               svix (PyPI), Webhook.sign, sent as svix-id/-timestamp/
                       -signature (the resend and clerk presets)
    stripe             stripe (PyPI), WebhookSignature.generate_signature_header
    slack              slack_sdk (PyPI), SignatureVerifier.generate_signature
    github             @octokit/webhooks-methods (npm) sign(), via sign_github.mjs
    shopify            Python's hmac + base64, following Shopify's docs
                       (Shopify publishes no signing library)
    hmac-hex           Python's hmac, as a team's own service would sign
                       (docs/examples/plain-hmac.toml; no publisher library)
    ed25519            PyNaCl SigningKey.sign, as Discord signs (discord-interactions
                       verifies with PyNaCl); secret = the 32-byte seed in hex
    ecdsa-p256         cryptography signs with the PKCS#8 key (base64) in secret;
                       sendgrid (PyPI) EventWebhook.verify_signature must accept it
                       before it is returned (SendGrid publishes no signer)
    twilio             twilio (PyPI), RequestValidator.compute_signature, checked
                       with RequestValidator.validate; "id" is the URL Twilio called;
                       a JSON body gets bodySHA256 from RequestValidator.compute_hash

The presets' Node libraries (Paddle, Square, WorkOS, Mux, Linear) sign or verify in
presets.mjs, called by tests/integration/preset_vectors.rs; `--check` loads them too.

Install:  pip install -r tests/vectors/requirements.txt
          npm ci --prefix tests/vectors
Check:    python3 tests/vectors/sign.py --check
Use:      echo '[{"scheme":"stripe","secret":"whsec_x","body":"{}","timestamp":1800000000}]' \
              | python3 tests/vectors/sign.py
stdin is a JSON list of {"scheme", "secret", "body" (UTF-8 text), "timestamp"
(unix seconds), "id" (delivery id, for standard-webhooks and github)};
stdout is a JSON list of {"headers": {name: value}, "library": "..."}.
"""

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))


def standard_webhooks(req):
    ts = req["timestamp"]
    secret = req["secret"]
    if secret.startswith("whsk_"):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        seed = base64.b64decode(secret[len("whsk_"):])
        content = f'{req["id"]}.{ts}.{req["body"]}'.encode()
        sig = Ed25519PrivateKey.from_private_bytes(seed).sign(content)
        signature = "v1a," + base64.b64encode(sig).decode()
        library = "cryptography Ed25519 (spec v1a; no official signer)"
    else:
        from standardwebhooks import Webhook

        at = datetime.fromtimestamp(ts, tz=timezone.utc)
        signature = Webhook(secret).sign(req["id"], at, req["body"])
        library = "standardwebhooks"
    headers = {
        "webhook-id": req["id"],
        "webhook-timestamp": str(ts),
        "webhook-signature": signature,
    }
    return headers, library


def svix_(req):
    from svix.webhooks import Webhook

    ts = req["timestamp"]
    at = datetime.fromtimestamp(ts, tz=timezone.utc)
    signature = Webhook(req["secret"]).sign(req["id"], at, req["body"])
    headers = {"svix-id": req["id"], "svix-timestamp": str(ts), "svix-signature": signature}
    return headers, "svix"


def stripe_(req):
    import stripe

    header = stripe.WebhookSignature.generate_signature_header(
        req["body"], req["secret"], timestamp=req["timestamp"]
    )
    return {"stripe-signature": header}, "stripe"


def slack(req):
    from slack_sdk.signature import SignatureVerifier

    ts = str(req["timestamp"])
    signature = SignatureVerifier(req["secret"]).generate_signature(timestamp=ts, body=req["body"])
    return {"x-slack-request-timestamp": ts, "x-slack-signature": signature}, "slack_sdk"


def shopify(req):
    digest = hmac.new(req["secret"].encode(), req["body"].encode(), hashlib.sha256).digest()
    return {"x-shopify-hmac-sha256": base64.b64encode(digest).decode()}, "python hmac (no official library)"


def hmac_hex(req):
    digest = hmac.new(req["secret"].encode(), req["body"].encode(), hashlib.sha256).hexdigest()
    return {"x-signature": digest}, "python hmac (a team's own service)"


def github_all(reqs):
    if not reqs:
        return []
    node = subprocess.run(
        ["node", os.path.join(HERE, "sign_github.mjs")],
        input=json.dumps([{"secret": r["secret"], "body": r["body"]} for r in reqs]),
        capture_output=True,
        text=True,
        check=True,
    )
    out = []
    for req, signature in zip(reqs, json.loads(node.stdout)):
        headers = {"x-hub-signature-256": signature}
        if req.get("id"):
            headers["x-github-delivery"] = req["id"]
        out.append((headers, "@octokit/webhooks-methods"))
    return out


def ed25519(req):
    from nacl.signing import SigningKey

    ts = str(req["timestamp"])
    signed = SigningKey(bytes.fromhex(req["secret"])).sign((ts + req["body"]).encode())
    headers = {"x-signature-ed25519": signed.signature.hex(), "x-signature-timestamp": ts}
    return headers, "PyNaCl"


def ecdsa_p256(req):
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from sendgrid.helpers.eventwebhook import EventWebhook

    ts = str(req["timestamp"])
    key = serialization.load_der_private_key(base64.b64decode(req["secret"]), password=None)
    signature = base64.b64encode(key.sign((ts + req["body"]).encode(), ec.ECDSA(hashes.SHA256()))).decode()
    public = base64.b64encode(
        key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    ).decode()
    if not EventWebhook(public).verify_signature(req["body"], signature, ts):
        raise SystemExit("sendgrid EventWebhook.verify_signature refused the signature")
    headers = {
        "x-twilio-email-event-webhook-signature": signature,
        "x-twilio-email-event-webhook-timestamp": ts,
    }
    return headers, "cryptography signs, sendgrid EventWebhook.verify_signature accepts"


def twilio_(req):
    from urllib.parse import parse_qs

    from twilio.request_validator import RequestValidator

    validator = RequestValidator(req["secret"])
    url, body = req["id"], req["body"]
    try:
        json.loads(body)
        is_json = True
    except ValueError:
        is_json = False
    if is_json:
        url += ("&" if "?" in url else "?") + "bodySHA256=" + validator.compute_hash(body)
        signature = validator.compute_signature(url, {})
        params = body
    else:
        params = {k: v if len(v) > 1 else v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}
        signature = validator.compute_signature(url, params)
    if not validator.validate(url, params, signature):
        raise SystemExit("twilio RequestValidator.validate refused its own signature")
    return {"x-twilio-signature": signature}, "twilio RequestValidator"


SIGNERS = {
    "ed25519": ed25519,
    "ecdsa-p256": ecdsa_p256,
    "twilio": twilio_,
    "standard-webhooks": standard_webhooks,
    "svix": svix_,
    "stripe": stripe_,
    "slack": slack,
    "shopify": shopify,
    "hmac-hex": hmac_hex,
}


def check():
    import cryptography  # noqa: F401
    import nacl  # noqa: F401
    import sendgrid  # noqa: F401
    import twilio  # noqa: F401
    import slack_sdk  # noqa: F401
    import standardwebhooks  # noqa: F401
    import stripe  # noqa: F401
    import svix  # noqa: F401

    github_all([{"secret": "s", "body": "{}"}])
    node = subprocess.run(["node", os.path.join(HERE, "presets.mjs"), "--check"], capture_output=True, text=True)
    if node.returncode != 0:
        sys.exit(f"tests/vectors/presets.mjs cannot load its libraries:\n{node.stderr}")


def main():
    if sys.argv[1:] == ["--check"]:
        check()
        return
    reqs = json.load(sys.stdin)
    github = iter(github_all([r for r in reqs if r["scheme"] == "github"]))
    out = []
    for req in reqs:
        headers, library = next(github) if req["scheme"] == "github" else SIGNERS[req["scheme"]](req)
        out.append({"headers": headers, "library": library})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
