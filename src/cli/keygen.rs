//! `inhook keygen` (docs/api.md, command line): mint secrets in each scheme's format.

use anyhow::bail;
use rand::RngCore;

use inhook::ingress::signature::{standard_webhooks, Scheme};

/// Arguments of `inhook keygen`.
#[derive(Debug, clap::Args)]
pub struct KeygenArgs {
    /// The scheme whose secret format to print.
    #[arg(long, default_value = "standard-webhooks")]
    pub scheme: Scheme,
    /// Standard Webhooks only: an ed25519 key pair (`v1a`) instead of a shared secret (`v1`).
    #[arg(long)]
    pub ed25519: bool,
}

/// Runs `inhook keygen`: prints a new random secret in the scheme's format.
pub fn keygen(args: KeygenArgs) -> anyhow::Result<()> {
    if args.ed25519 && args.scheme != Scheme::StandardWebhooks {
        bail!("--ed25519 is only for --scheme standard-webhooks");
    }
    if args.scheme == Scheme::AwsSns {
        // AWS signs with its certificate's private key: there is nothing to mint.
        bail!(
            "aws-sns needs no secret: AWS signs with the key of the certificate at SigningCertURL"
        );
    }
    for line in generate(args.scheme, args.ed25519, &mut rand::rngs::OsRng) {
        println!("{line}");
    }
    let note = match args.scheme {
        Scheme::StandardWebhooks if args.ed25519 => Some(
            "list the public key in the receiving source's `secrets`; the publisher signs with the \
             private key (e.g. `inhook send --secret whsk_…`), which the receiver never needs",
        ),
        Scheme::Ed25519 | Scheme::EcdsaP256 => Some(
            "list the public key in the receiving source's `public_keys`; `inhook send \
             --private-key` signs with the private key, which the receiver never needs. The \
             publisher's real key pair is its own: configure the public key it shows",
        ),
        Scheme::Stripe
        | Scheme::Slack
        | Scheme::Shopify
        | Scheme::Hmac
        | Scheme::Token
        | Scheme::Twilio => Some(
            "this publisher issues the real secret in its dashboard; a generated one suits tests \
             and `inhook send`",
        ),
        _ => None,
    };
    if let Some(note) = note {
        eprintln!("note: {note}");
    }
    Ok(())
}

/// The lines `keygen` prints, from `rng` (pure, for tests).
fn generate(scheme: Scheme, ed25519: bool, rng: &mut impl RngCore) -> Vec<String> {
    let mut key = [0u8; 32];
    rng.fill_bytes(&mut key);
    match scheme {
        Scheme::Ed25519 | Scheme::EcdsaP256 => {
            let algorithm = scheme.public_key().expect("a public-key scheme");
            match inhook::ingress::signature::public_key::generate(algorithm, key) {
                Ok((public, private)) => {
                    vec![format!("public:  {public}"), format!("private: {private}")]
                }
                Err(problem) => vec![format!("error: {problem}")],
            }
        }
        Scheme::StandardWebhooks if ed25519 => {
            let (public, private) = standard_webhooks::format_keypair(&key);
            vec![format!("public:  {public}"), format!("private: {private}")]
        }
        Scheme::StandardWebhooks => vec![standard_webhooks::format_secret(&key)],
        // Stripe's endpoint secrets read `whsec_…`; the whole text is the HMAC key.
        Scheme::Stripe => vec![format!("whsec_{}", hex::encode(&key[..16]))],
        // HTTP Basic secrets are user:password.
        Scheme::Basic => vec![format!("webhook:{}", hex::encode(key))],
        _ => vec![hex::encode(key)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inhook::ingress::signature::{self, try_sign, Secret};

    /// The header map of signed `pairs`.
    fn headers_of(pairs: &[(&'static str, String)]) -> axum::http::HeaderMap {
        let mut headers = axum::http::HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, axum::http::HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn generated_keys_sign_and_verify_in_every_scheme() {
        let mut rng = rand::rngs::mock::StepRng::new(7, 11);
        for scheme in Scheme::ALL {
            let lines = generate(scheme, false, &mut rng);
            let secret = Secret::new(lines[0].clone());
            assert!(scheme.check_secret(&secret).is_ok(), "{scheme}");
            let headers = try_sign(scheme, b"{}", &secret, 1_000, None).unwrap();
            let map = headers_of(&headers);
            assert!(signature::verify(scheme, &map, b"{}", &[secret], 1_000, 5).is_ok());
        }
        for scheme in Scheme::CONFIGURABLE
            .into_iter()
            .filter(|s| s.public_key().is_none())
        {
            let lines = generate(scheme, false, &mut rng);
            assert!(
                scheme.check_secret(&Secret::new(lines[0].clone())).is_ok(),
                "{scheme}"
            );
        }
        for scheme in [Scheme::Ed25519, Scheme::EcdsaP256] {
            let algorithm = scheme.public_key().unwrap();
            let lines = generate(scheme, false, &mut rng);
            let public = lines[0].strip_prefix("public:  ").unwrap();
            let private = lines[1].strip_prefix("private: ").unwrap();
            let keys = signature::public_key::parse_keys(algorithm, &[public.into()]).unwrap();
            let signer = signature::public_key::PrivateKey::parse(algorithm, private).unwrap();
            let sig = signer.sign(b"{}");
            assert_eq!(
                signature::public_key::find(algorithm, &keys, b"{}", &[sig]),
                Some(0)
            );
        }
        let lines = generate(Scheme::StandardWebhooks, true, &mut rng);
        let public = lines[0].strip_prefix("public:  ").unwrap();
        let private = lines[1].strip_prefix("private: ").unwrap();
        assert!(public.starts_with("whpk_") && private.starts_with("whsk_"));
        let headers = try_sign(
            Scheme::StandardWebhooks,
            b"{}",
            &Secret::new(private),
            1_000,
            None,
        )
        .unwrap();
        let map = headers_of(&headers);
        let secrets = [Secret::new(public)];
        assert!(
            signature::verify(Scheme::StandardWebhooks, &map, b"{}", &secrets, 1_000, 5).is_ok()
        );
    }
}
