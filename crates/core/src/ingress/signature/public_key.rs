//! Public-key signatures (docs/configuration.md, `signature = "ed25519"` and
//! `"ecdsa-p256"`): the publisher signs with a private key and the source lists
//! only public keys (`public_keys`), so nothing the receiver holds can forge a
//! delivery. Discord signs with Ed25519, SendGrid with ECDSA P-256.
//!
//! Parsing keys and checking signatures is pure: text and bytes in, a verdict
//! out. The key parsers read configuration and command-line input, and are fuzzed
//! (fuzz/fuzz_targets/public_keys.rs).

use base64::Engine;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use ring::signature::{EcdsaKeyPair, KeyPair, UnparsedPublicKey};

use super::{Secret, BASE64};

/// The DER prefix of every P-256 SubjectPublicKeyInfo with an uncompressed point
/// (id-ecPublicKey, prime256v1, a 66-byte bit string): DER is canonical, so a P-256
/// SPKI is exactly these bytes then the 65-byte point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The longest DER ECDSA P-256 signature (two 33-byte integers in a sequence).
pub const MAX_DER_SIGNATURE: usize = 72;

/// More text than any key in any form (a PEM block of a P-256 SPKI is under 200 bytes).
const MAX_KEY_CHARS: usize = 4096;

/// The algorithm of a source's public keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Ed25519 (Discord): 32-byte keys, 64-byte signatures.
    Ed25519,
    /// ECDSA over P-256 with SHA-256 (SendGrid): SPKI keys, DER signatures.
    EcdsaP256,
}

impl Algorithm {
    /// What one entry of `public_keys` must be, for config errors.
    pub fn key_format(self) -> &'static str {
        match self {
            Algorithm::Ed25519 => "32 bytes in hex (64 digits) or base64",
            Algorithm::EcdsaP256 => {
                "a P-256 public key as base64 DER SubjectPublicKeyInfo (\"MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE…\") or a PEM PUBLIC KEY block"
            }
        }
    }

    /// The length a decoded signature must have: exact for Ed25519, at most
    /// [`MAX_DER_SIGNATURE`] for DER.
    pub fn signature_len(self) -> SignatureLen {
        match self {
            Algorithm::Ed25519 => SignatureLen::Exact(64),
            Algorithm::EcdsaP256 => SignatureLen::AtMost(MAX_DER_SIGNATURE),
        }
    }

    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ed25519 => "ed25519",
            Algorithm::EcdsaP256 => "ecdsa-p256",
        }
    }

    /// What the signature header holds, for explanations.
    pub fn signature_name(self) -> &'static str {
        match self {
            Algorithm::Ed25519 => "Ed25519 signature",
            Algorithm::EcdsaP256 => "DER ECDSA P-256 signature",
        }
    }
}

/// Why an entry of `public_keys` is refused. Public keys are not secrets, but the
/// message still does not echo the entry: a private key pasted by mistake would be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry #{index} {problem}")]
pub struct KeyProblem {
    /// The entry's position in the list.
    pub index: usize,
    /// What is wrong with it.
    pub problem: String,
}

/// Parses every entry of `public_keys` for `algorithm` into the bytes the source keeps
/// with its secrets (the 32-byte Ed25519 key, the 65-byte uncompressed P-256 point), so
/// public keys rotate by reload like secrets. An empty list verifies nothing.
pub fn parse_keys(algorithm: Algorithm, entries: &[String]) -> Result<Vec<Secret>, KeyProblem> {
    if entries.is_empty() {
        return Err(KeyProblem {
            index: 0,
            problem: format!(
                "is missing: list at least one key ({})",
                algorithm.key_format()
            ),
        });
    }
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let parsed = match algorithm {
                Algorithm::Ed25519 => parse_ed25519(entry).map(|k| k.to_vec()),
                Algorithm::EcdsaP256 => parse_p256_spki(entry).map(|k| k.to_vec()),
            };
            parsed
                .map(Secret::new)
                .map_err(|problem| KeyProblem { index, problem })
        })
        .collect()
}

/// Whether `key` (as [`parse_keys`] keeps it) is a usable key of `algorithm`.
pub fn check_key(algorithm: Algorithm, key: &Secret) -> Result<(), &'static str> {
    let ok = match algorithm {
        Algorithm::Ed25519 => {
            <[u8; 32]>::try_from(key.expose()).is_ok_and(|k| VerifyingKey::from_bytes(&k).is_ok())
        }
        Algorithm::EcdsaP256 => key.expose().len() == 65 && key.expose()[0] == 0x04,
    };
    if ok {
        Ok(())
    } else {
        Err("is not a public key of the source's algorithm")
    }
}

/// The position of the first key under which one of `signatures` signs `message`.
pub fn find(
    algorithm: Algorithm,
    keys: &[Secret],
    message: &[u8],
    signatures: &[Vec<u8>],
) -> Option<usize> {
    keys.iter().position(|key| match algorithm {
        Algorithm::Ed25519 => {
            let Some(key) = <[u8; 32]>::try_from(key.expose())
                .ok()
                .and_then(|k| VerifyingKey::from_bytes(&k).ok())
            else {
                return false;
            };
            signatures.iter().any(|sig| {
                <[u8; 64]>::try_from(sig.as_slice()).is_ok_and(|sig| {
                    key.verify_strict(message, &ed25519_dalek::Signature::from_bytes(&sig))
                        .is_ok()
                })
            })
        }
        Algorithm::EcdsaP256 => {
            let key =
                UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_ASN1, key.expose());
            signatures
                .iter()
                .any(|sig| key.verify(message, sig).is_ok())
        }
    })
}

/// How long a decoded signature may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureLen {
    /// Exactly this many bytes.
    Exact(usize),
    /// One to this many bytes.
    AtMost(usize),
}

impl SignatureLen {
    /// The most bytes a signature may have.
    pub fn max(self) -> usize {
        match self {
            SignatureLen::Exact(n) | SignatureLen::AtMost(n) => n,
        }
    }

    /// Whether `len` bytes fit.
    pub fn fits(self, len: usize) -> bool {
        match self {
            SignatureLen::Exact(n) => len == n,
            SignatureLen::AtMost(n) => (1..=n).contains(&len),
        }
    }
}

/// Decodes hex (exactly `2 * len` digits) or base64 (standard or URL-safe, padded or not).
fn hex_or_base64(raw: &str, len: usize) -> Option<Vec<u8>> {
    if raw.len() == 2 * len {
        if let Ok(bytes) = hex::decode(raw) {
            return Some(bytes);
        }
    }
    if raw.len() > len.div_ceil(3) * 4 {
        return None;
    }
    let url_safe = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    BASE64
        .decode(raw)
        .or_else(|_| url_safe.decode(raw))
        .ok()
        .filter(|b| b.len() == len)
}

/// Parses one Ed25519 public key: 32 bytes in hex or base64 that decompress to a point.
pub fn parse_ed25519(raw: &str) -> Result<[u8; 32], String> {
    let raw = raw.trim();
    let bytes = hex_or_base64(raw, 32)
        .ok_or_else(|| format!("is not {}", Algorithm::Ed25519.key_format()))?;
    let key: [u8; 32] = bytes.try_into().map_err(|_| "is not 32 bytes".to_owned())?;
    VerifyingKey::from_bytes(&key)
        .map_err(|_| "is not an Ed25519 public key (not a point of the curve)".to_owned())?;
    Ok(key)
}

/// Parses one P-256 public key: base64 DER SubjectPublicKeyInfo, bare or in a PEM
/// `PUBLIC KEY` block; returns its uncompressed point.
pub fn parse_p256_spki(raw: &str) -> Result<[u8; 65], String> {
    let not = || format!("is not {}", Algorithm::EcdsaP256.key_format());
    if raw.len() > MAX_KEY_CHARS {
        return Err(not());
    }
    let raw = raw.trim();
    let text: String = match raw.strip_prefix("-----BEGIN PUBLIC KEY-----") {
        Some(rest) => rest
            .trim_end()
            .strip_suffix("-----END PUBLIC KEY-----")
            .ok_or_else(not)?
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect(),
        None => raw.to_owned(),
    };
    let der = BASE64.decode(text).map_err(|_| not())?;
    let point = der
        .strip_prefix(&P256_SPKI_PREFIX[..])
        .filter(|p| p.len() == 65 && p[0] == 0x04)
        .ok_or_else(|| {
            "is not a P-256 SubjectPublicKeyInfo with an uncompressed point (id-ecPublicKey, prime256v1)"
                .to_owned()
        })?;
    Ok(point.try_into().expect("65 bytes checked"))
}

/// The base64 DER SubjectPublicKeyInfo of an uncompressed P-256 point, as SendGrid shows it.
pub fn p256_spki_base64(point: &[u8]) -> String {
    let mut der = P256_SPKI_PREFIX.to_vec();
    der.extend_from_slice(point);
    super::base64_encode(&der)
}

/// A private key that signs for a public-key source (`inhook send --private-key`).
pub enum PrivateKey {
    /// An Ed25519 key from its 32-byte seed.
    Ed25519(Box<SigningKey>),
    /// A P-256 key from its PKCS#8 document.
    EcdsaP256(Box<EcdsaKeyPair>),
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

impl PrivateKey {
    /// Parses a private key for `algorithm`: for Ed25519 the 32-byte seed in hex or
    /// base64; for ECDSA P-256 a PKCS#8 document in base64 (or a PEM `PRIVATE KEY`
    /// block), as `inhook keygen` prints them. The error never echoes the key.
    pub fn parse(algorithm: Algorithm, raw: &str) -> Result<Self, &'static str> {
        match algorithm {
            Algorithm::Ed25519 => {
                let seed = hex_or_base64(raw.trim(), 32)
                    .ok_or("the ed25519 private key is not a 32-byte seed in hex or base64")?;
                let seed: [u8; 32] = seed.try_into().map_err(|_| "not 32 bytes")?;
                Ok(PrivateKey::Ed25519(Box::new(SigningKey::from_bytes(&seed))))
            }
            Algorithm::EcdsaP256 => {
                let raw = raw.trim();
                let text: String = raw
                    .strip_prefix("-----BEGIN PRIVATE KEY-----")
                    .and_then(|r| r.trim_end().strip_suffix("-----END PRIVATE KEY-----"))
                    .unwrap_or(raw)
                    .chars()
                    .filter(|c| !c.is_ascii_whitespace())
                    .collect();
                let pkcs8 = BASE64
                    .decode(text)
                    .map_err(|_| "the ecdsa-p256 private key is not base64 PKCS#8")?;
                EcdsaKeyPair::from_pkcs8(
                    &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
                    &pkcs8,
                    &ring::rand::SystemRandom::new(),
                )
                .map(|pair| PrivateKey::EcdsaP256(Box::new(pair)))
                .map_err(|_| "the ecdsa-p256 private key is not a P-256 PKCS#8 document")
            }
        }
    }

    /// The matching public key, as `public_keys` lists it (hex for Ed25519, base64
    /// SPKI for P-256).
    pub fn public_key(&self) -> String {
        match self {
            PrivateKey::Ed25519(key) => hex::encode(key.verifying_key().as_bytes()),
            PrivateKey::EcdsaP256(pair) => p256_spki_base64(pair.public_key().as_ref()),
        }
    }

    /// Signs `message`: 64 bytes for Ed25519, DER for P-256.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        match self {
            PrivateKey::Ed25519(key) => key.sign(message).to_bytes().to_vec(),
            PrivateKey::EcdsaP256(pair) => pair
                .sign(&ring::rand::SystemRandom::new(), message)
                .map(|sig| sig.as_ref().to_vec())
                // Only a failing system RNG makes ring refuse; no signature then.
                .unwrap_or_default(),
        }
    }
}

/// A new key pair for tests (`inhook keygen --scheme ed25519|ecdsa-p256`): the public key
/// to list in `public_keys`, and the private key `inhook send --private-key` takes.
pub fn generate(algorithm: Algorithm, seed: [u8; 32]) -> Result<(String, String), &'static str> {
    match algorithm {
        Algorithm::Ed25519 => {
            let key = SigningKey::from_bytes(&seed);
            Ok((
                hex::encode(key.verifying_key().as_bytes()),
                hex::encode(seed),
            ))
        }
        Algorithm::EcdsaP256 => {
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(
                &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
                &ring::rand::SystemRandom::new(),
            )
            .map_err(|_| "the system random generator failed")?;
            let private = super::base64_encode(pkcs8.as_ref());
            let public = PrivateKey::parse(algorithm, &private)?.public_key();
            Ok((public, private))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8032 section 7.1, test 2: a one-byte message.
    const RFC8032_PUBLIC: &str = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";
    const RFC8032_SEED: &str = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb";
    const RFC8032_SIG: &str = "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00";

    #[test]
    fn rfc8032_vector_verifies_and_signs() {
        let keys = parse_keys(Algorithm::Ed25519, &[RFC8032_PUBLIC.into()]).unwrap();
        let sig = hex::decode(RFC8032_SIG).unwrap();
        let ed = Algorithm::Ed25519;
        assert_eq!(
            find(ed, &keys, &[0x72], std::slice::from_ref(&sig)),
            Some(0)
        );
        assert_eq!(find(ed, &keys, &[0x73], std::slice::from_ref(&sig)), None);
        let private = PrivateKey::parse(Algorithm::Ed25519, RFC8032_SEED).unwrap();
        assert_eq!(private.sign(&[0x72]), sig);
        assert_eq!(private.public_key(), RFC8032_PUBLIC);
    }

    #[test]
    fn ed25519_keys_read_hex_and_base64_and_refuse_the_rest() {
        let bytes = hex::decode(RFC8032_PUBLIC).unwrap();
        let b64 = super::super::base64_encode(&bytes);
        let parsed = parse_ed25519(&b64).unwrap();
        assert_eq!(parsed.to_vec(), bytes);
        assert_eq!(parse_ed25519(b64.trim_end_matches('=')).unwrap(), parsed);
        assert_eq!(
            parse_ed25519(&RFC8032_PUBLIC.to_uppercase()).unwrap(),
            parsed
        );
        for bad in ["", "zz", &RFC8032_PUBLIC[2..], "not base64 at all!!"] {
            assert!(parse_ed25519(bad).is_err(), "{bad}");
        }
        let err =
            parse_keys(Algorithm::Ed25519, &[RFC8032_PUBLIC.into(), "abc".into()]).unwrap_err();
        assert_eq!(err.index, 1);
        assert!(!err.to_string().contains("abc"));
    }

    #[test]
    fn p256_round_trip_rotation_tamper_and_pem() {
        let (public1, private1) = generate(Algorithm::EcdsaP256, [0; 32]).unwrap();
        let (public2, private2) = generate(Algorithm::EcdsaP256, [0; 32]).unwrap();
        assert!(public1.starts_with("MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE"));
        let p256 = Algorithm::EcdsaP256;
        let keys = parse_keys(p256, &[public1.clone(), public2]).unwrap();
        let signer2 = PrivateKey::parse(Algorithm::EcdsaP256, &private2).unwrap();
        let sig = signer2.sign(b"1800000000{}");
        assert!(sig.len() <= MAX_DER_SIGNATURE && sig[0] == 0x30);
        assert_eq!(
            find(p256, &keys, b"1800000000{}", std::slice::from_ref(&sig)),
            Some(1)
        );
        assert_eq!(
            find(p256, &keys, b"1800000000{ }", std::slice::from_ref(&sig)),
            None
        );
        let only1 = parse_keys(p256, std::slice::from_ref(&public1)).unwrap();
        assert_eq!(find(p256, &only1, b"1800000000{}", &[sig]), None);
        assert!(keys.iter().all(|k| check_key(p256, k).is_ok()));
        let signer1 = PrivateKey::parse(Algorithm::EcdsaP256, &private1).unwrap();
        assert_eq!(signer1.public_key(), public1);
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n{}\n-----END PUBLIC KEY-----\n",
            &public1[..64],
            &public1[64..]
        );
        assert_eq!(parse_p256_spki(&pem), parse_p256_spki(&public1));
        // An Ed25519 key or a truncated SPKI is not a P-256 key.
        assert!(parse_p256_spki(RFC8032_PUBLIC).is_err());
        assert!(parse_p256_spki(&public1[..80]).is_err());
        assert!(PrivateKey::parse(Algorithm::EcdsaP256, RFC8032_SEED).is_err());
    }

    #[test]
    fn private_keys_never_show_in_debug() {
        let key = PrivateKey::parse(Algorithm::Ed25519, RFC8032_SEED).unwrap();
        assert!(!format!("{key:?}").contains("4ccd"));
    }
}
