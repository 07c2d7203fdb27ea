//! Signed plans: authors sign, a keyring says whom to trust.
//!
//! An author (a planner, an operator) signs each plan with its Ed25519 key
//! ([`SigningKey::sign`]); the signature covers the plan's codec body, every field of the
//! plan, prefixed by [`SIGNATURE_DOMAIN`] so that no other dnsplan value signed with the key
//! can pass for a plan. A [`Keyring`] (`[[keyring.key]]` in a daemon's config) names the keys
//! trusted to author plans, each for some DNS zones and some authors.
//!
//! Where a keyring is configured, every step refuses what it does not trust: the store at
//! publish (`StoreError::Untrusted`), enactors before applying, the authority before serving
//! an active record (the record must be what a trusted plan of its generation says). So a
//! stolen `enact` or `plan` credential, or write access to etcd, cannot make DNS serve
//! records no trusted author signed.
//!
//! Private keys never leave [`SigningKey`]: its `Debug` shows the public key only, and no
//! error carries key material (ring's errors hold none).

use crate::names::DnsName;
use crate::plan::{Author, PlanSignature, ValidatedPlan};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// What is signed is this, then the plan's codec body: 16 bytes, the size of the codec's
/// header, which it replaces in the encoded plan (no copy of a large plan to sign it).
pub const SIGNATURE_DOMAIN: [u8; crate::codec::HEADER_BYTES] = *b"dnsplan plan v1\0";
/// Most keys in one keyring.
pub const KEYRING_KEYS_MAX: usize = 256;

/// `dnsplan up`'s demo key, as public as its demo token: `dnsplan up` trusts it (and signs
/// with it) only with the demo token on loopback, the CLI signs with it when it sends the demo
/// token, and every daemon's config refuses it in a keyring.
const DEMO_KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----
MFECAQEwBQYDK2VwBCIEIC8NeslIZy6EjTNazWFV9BPNF4ByQuMLKCllw2Ak1EvA
gSEA8cvLLqpObQJl8US6zchX0ZVqNftUf1afgofhB+N6T0A=
-----END PRIVATE KEY-----
";

/// The bytes a plan's signature covers.
fn message(plan: &ValidatedPlan) -> Vec<u8> {
    let mut bytes = crate::codec::encode(plan.plan());
    bytes[..SIGNATURE_DOMAIN.len()].copy_from_slice(&SIGNATURE_DOMAIN);
    bytes
}

/// A public key as the keyring and `dnsplan key` write it: the 32 bytes in base64.
pub fn public_key_text(key: &[u8; 32]) -> String {
    data_encoding::BASE64.encode(key)
}

/// Why a private key file was not read (`read_owner_only`).
#[derive(Debug)]
pub enum OwnerOnly {
    Read(std::io::Error),
    /// Group or others may read it: its mode.
    Exposed(u32),
}

/// The bytes of a private key file, refused when any group or other mode bit (077) is set:
/// plan signing keys and DNSSEC zone keys (`dnssec`) are read through here.
pub fn read_owner_only(path: &Path) -> Result<Vec<u8>, OwnerOnly> {
    let metadata = std::fs::metadata(path).map_err(OwnerOnly::Read)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(OwnerOnly::Exposed(mode));
        }
    }
    let _ = metadata;
    std::fs::read(path).map_err(OwnerOnly::Read)
}

/// An author's private key, loaded from a PEM file (PKCS#8, as `dnsplan key new` and
/// `openssl genpkey -algorithm ed25519` write it) that only its owner may read.
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey(public {})", public_key_text(&self.public_key()))
    }
}

#[derive(Debug, Error)]
pub enum KeyFileError {
    #[error("signing key {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error(
        "signing key {path} may be read by others (mode {mode:o}); a plan signing key must be readable by its owner only: chmod 600 {path}"
    )]
    Exposed { path: PathBuf, mode: u32 },
    #[error("signing key {path} is not a PEM private key (PKCS#8 Ed25519, as `dnsplan key new` writes)")]
    NotPem { path: PathBuf },
    #[error("signing key {path} is not an Ed25519 key: {reason}")]
    NotEd25519 { path: PathBuf, reason: String },
}

impl SigningKey {
    /// Loads the key at `path`, refusing a file that others may read (mode bits 077 set).
    pub fn load(path: &Path) -> Result<SigningKey, KeyFileError> {
        let pem = read_owner_only(path).map_err(|err| match err {
            OwnerOnly::Read(error) => KeyFileError::Read { path: path.to_owned(), error },
            OwnerOnly::Exposed(mode) => KeyFileError::Exposed { path: path.to_owned(), mode },
        })?;
        let der = PrivatePkcs8KeyDer::from_pem_slice(&pem).map_err(|_| KeyFileError::NotPem { path: path.to_owned() })?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map_err(|e| KeyFileError::NotEd25519 { path: path.to_owned(), reason: e.to_string() })?;
        Ok(SigningKey { pair })
    }

    /// A new random key, and its PEM text (PKCS#8 v2) to write to a key file.
    pub fn generate() -> Result<(SigningKey, String), String> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| "the system's random source failed".to_string())?;
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|e| format!("a key ring just made is refused: {e}"))?;
        let body = data_encoding::BASE64.encode(pkcs8.as_ref());
        let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
        for line in body.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END PRIVATE KEY-----\n");
        Ok((SigningKey { pair }, pem))
    }

    /// `dnsplan up`'s demo key (see `DEMO_KEY_PEM`).
    pub fn demo() -> SigningKey {
        let pair = PrivatePkcs8KeyDer::from_pem_slice(DEMO_KEY_PEM.as_bytes())
            .ok()
            .and_then(|der| Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der()).ok());
        // Invariant: the constant is a valid key (a unit test loads it).
        SigningKey { pair: pair.expect("the demo key is a valid Ed25519 key") }
    }

    pub fn public_key(&self) -> [u8; 32] {
        let mut key = [0u8; 32];
        key.copy_from_slice(self.pair.public_key().as_ref());
        key
    }

    /// `plan`, signed by this key (any signature it had is replaced).
    pub fn sign(&self, plan: ValidatedPlan) -> ValidatedPlan {
        let signature = self.pair.sign(&message(&plan));
        let signature = PlanSignature { public_key: self.public_key(), signature: signature.as_ref().to_vec() };
        plan.with_signature(Some(signature))
    }
}

/// Signs `plan` when a key is given, else returns it as it is.
pub fn sign_with(key: Option<&SigningKey>, plan: ValidatedPlan) -> ValidatedPlan {
    match key {
        Some(key) => key.sign(plan),
        None => plan,
    }
}

/// The `[keyring]` table of a daemon's config: the keys trusted to author plans. Empty (the
/// default) trusts every plan, signed or not, as before keyrings existed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyringConfig {
    #[serde(default)]
    pub key: Vec<TrustedKeyConfig>,
}

/// One `[[keyring.key]]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedKeyConfig {
    /// For logs and errors: whose key this is.
    pub name: String,
    /// The Ed25519 public key in base64 (`dnsplan key new` prints it).
    pub public_key: String,
    /// The DNS zones it may author plans for; `"*"` for every zone.
    pub zones: Vec<String>,
    /// The authors it may sign as: `planner:ID`, `operator:NAME`, `planner:*`, `operator:*`,
    /// or `"*"`.
    pub authors: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ZoneRule {
    Any,
    Zone(DnsName),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum AuthorRule {
    Any,
    AnyPlanner,
    AnyOperator,
    Exactly(Author),
}

impl AuthorRule {
    fn parse(text: &str) -> Result<AuthorRule, String> {
        Ok(match text {
            "*" => AuthorRule::Any,
            "planner:*" => AuthorRule::AnyPlanner,
            "operator:*" => AuthorRule::AnyOperator,
            _ if text.starts_with("planner:") || text.starts_with("operator:") => {
                let author = Author::parse(text);
                if author.name().is_empty() {
                    return Err(format!("author {text:?} names nobody"));
                }
                AuthorRule::Exactly(author)
            }
            _ => {
                return Err(format!("author {text:?} is not `planner:ID`, `operator:NAME`, `planner:*`, `operator:*` or `*`"));
            }
        })
    }

    fn allows(&self, author: &Author) -> bool {
        match self {
            AuthorRule::Any => true,
            AuthorRule::AnyPlanner => !author.is_operator(),
            AuthorRule::AnyOperator => author.is_operator(),
            AuthorRule::Exactly(allowed) => allowed == author,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct TrustedKey {
    name: String,
    public_key: [u8; 32],
    zones: Vec<ZoneRule>,
    authors: Vec<AuthorRule>,
}

/// The keys trusted to author plans, checked once when the config loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keyring {
    keys: Vec<TrustedKey>,
}

/// Why a plan is not trusted. Names the plan, its author and the key's name; never key
/// material beyond a public key.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SignatureError {
    #[error(
        "plan {generation} by {author} is not signed, and only plans signed by a key of the keyring are trusted; sign it \
         with its author's key (a planner's `signing.key_file`, the CLI's --signing-key)"
    )]
    Unsigned { generation: u64, author: String },
    #[error("plan {generation} by {author} is signed by a key the keyring does not hold (public key {public_key})")]
    UnknownKey { generation: u64, author: String, public_key: String },
    #[error("plan {generation} is for the DNS zone {zone}, which key {key} may not author plans for (its `zones`)")]
    NotForZone { generation: u64, zone: String, key: String },
    #[error("plan {generation} is by {author}, whom key {key} may not sign as (its `authors`)")]
    NotForAuthor { generation: u64, author: String, key: String },
    #[error(
        "plan {generation}'s signature by key {key} does not verify: the plan was changed after it was signed, or the \
         signature was made by another key"
    )]
    BadSignature { generation: u64, key: String },
}

impl KeyringConfig {
    /// `dnsplan up`'s keyring with the demo token: the demo key, for every zone and author.
    pub fn demo() -> KeyringConfig {
        KeyringConfig {
            key: vec![TrustedKeyConfig {
                name: "demo".into(),
                public_key: public_key_text(&SigningKey::demo().public_key()),
                zones: vec!["*".into()],
                authors: vec!["*".into()],
            }],
        }
    }

    /// A daemon's check of its keyring: it loads, and does not trust the demo key, whose
    /// private half is in every copy of dnsplan.
    pub fn check(&self) -> Result<(), String> {
        Keyring::from_config(self)?;
        let demo = public_key_text(&SigningKey::demo().public_key());
        match self.key.iter().find(|k| k.public_key.trim() == demo) {
            Some(key) => Err(format!(
                "keyring.key {:?}: this is `dnsplan up`'s demo key, whose private key ships with dnsplan; make one with `dnsplan key new`",
                key.name
            )),
            None => Ok(()),
        }
    }
}

impl Keyring {
    /// The keyring of `config`; `None` when it names no key (every plan is trusted).
    pub fn from_config(config: &KeyringConfig) -> Result<Option<Keyring>, String> {
        if config.key.is_empty() {
            return Ok(None);
        }
        if config.key.len() > KEYRING_KEYS_MAX {
            return Err(format!("keyring: {} keys; the limit is {KEYRING_KEYS_MAX}", config.key.len()));
        }
        let mut keys: Vec<TrustedKey> = Vec::with_capacity(config.key.len());
        for key in &config.key {
            let at = |what: String| format!("keyring.key {:?}: {what}", key.name);
            if key.name.trim().is_empty() {
                return Err("keyring.key: a key has an empty name".into());
            }
            let bytes = data_encoding::BASE64
                .decode(key.public_key.trim().as_bytes())
                .map_err(|_| at("public_key is not base64 (`dnsplan key new` prints it)".into()))?;
            let public_key: [u8; 32] =
                bytes.try_into().map_err(|b: Vec<u8>| at(format!("public_key is {} bytes; an Ed25519 public key is 32", b.len())))?;
            if keys.iter().any(|k| k.name == key.name) {
                return Err(at("the name is used twice".into()));
            }
            if keys.iter().any(|k| k.public_key == public_key) {
                return Err(at("the public key is listed twice".into()));
            }
            if key.zones.is_empty() {
                return Err(at("zones is empty: list the DNS zones it may author plans for, or \"*\"".into()));
            }
            if key.authors.is_empty() {
                return Err(at("authors is empty: list whom it may sign as (`planner:*`, `operator:NAME`, ...)".into()));
            }
            let zones = key
                .zones
                .iter()
                .map(|z| match z.as_str() {
                    "*" => Ok(ZoneRule::Any),
                    _ => DnsName::parse(z).map(ZoneRule::Zone).map_err(|e| at(format!("zone {z:?}: {e}"))),
                })
                .collect::<Result<_, _>>()?;
            let authors = key.authors.iter().map(|a| AuthorRule::parse(a).map_err(at)).collect::<Result<_, _>>()?;
            keys.push(TrustedKey { name: key.name.clone(), public_key, zones, authors });
        }
        Ok(Some(Keyring { keys }))
    }

    /// The name of the trusted key whose valid signature `plan` carries, or why it has none.
    pub fn verify(&self, plan: &ValidatedPlan) -> Result<&str, SignatureError> {
        let p = plan.plan();
        let (generation, author) = (p.generation.0, p.author.to_string());
        let Some(signature) = plan.signature() else {
            return Err(SignatureError::Unsigned { generation, author });
        };
        let Some(key) = self.keys.iter().find(|k| k.public_key == signature.public_key) else {
            return Err(SignatureError::UnknownKey { generation, author, public_key: public_key_text(&signature.public_key) });
        };
        if !key.zones.iter().any(|z| matches!(z, ZoneRule::Any) || matches!(z, ZoneRule::Zone(zone) if *zone == p.dns_zone)) {
            return Err(SignatureError::NotForZone { generation, zone: p.dns_zone.to_string(), key: key.name.clone() });
        }
        if !key.authors.iter().any(|a| a.allows(&p.author)) {
            return Err(SignatureError::NotForAuthor { generation, author, key: key.name.clone() });
        }
        UnparsedPublicKey::new(&ED25519, &key.public_key)
            .verify(&message(plan), &signature.signature)
            .map_err(|_| SignatureError::BadSignature { generation, key: key.name.clone() })?;
        Ok(&key.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_plan, encode_plan};
    use crate::generation::Generation;
    use crate::names::ZoneId;
    use crate::plan::{Endpoint, Plan, Target};
    use std::collections::{BTreeMap, BTreeSet};

    fn plan(author: Author, zone: &str) -> ValidatedPlan {
        let dns_zone = DnsName::parse(zone).unwrap();
        let name = DnsName::parse(&format!("db.{zone}")).unwrap();
        let target = Target { address: "10.0.0.1".parse().unwrap(), zone: ZoneId::parse("a").unwrap(), weight: 1 };
        let endpoints = BTreeMap::from([(name, Endpoint { ttl_secs: 30, targets: vec![target] })]);
        ValidatedPlan::new(Plan {
            generation: Generation(3),
            parent_generation: Generation(2),
            created_at_unix_ms: 1_700_000_000_000,
            author,
            reason: "test".into(),
            dns_zone,
            endpoints,
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: Vec::new(),
        })
        .unwrap()
    }

    fn planner() -> Author {
        Author::Planner { id: "p1".into() }
    }

    fn keyring(key: &SigningKey, zones: &[&str], authors: &[&str]) -> Keyring {
        let config = KeyringConfig {
            key: vec![TrustedKeyConfig {
                name: "k1".into(),
                public_key: public_key_text(&key.public_key()),
                zones: zones.iter().map(|z| z.to_string()).collect(),
                authors: authors.iter().map(|a| a.to_string()).collect(),
            }],
        };
        Keyring::from_config(&config).unwrap().unwrap()
    }

    #[test]
    fn a_signed_plan_survives_its_envelope_and_verifies() {
        let (key, _) = SigningKey::generate().unwrap();
        let signed = key.sign(plan(planner(), "example.test"));
        let decoded = decode_plan(&encode_plan(&signed)).unwrap();
        assert_eq!(decoded, signed);
        assert_eq!(keyring(&key, &["example.test"], &["planner:*"]).verify(&decoded), Ok("k1"));
    }

    /// Every byte of a signed plan's envelope, flipped and the envelope's CRC made right
    /// again (what a writer with access to the store can do), is refused: the plan does not
    /// decode, or its signature does not verify.
    #[test]
    fn one_byte_changed_anywhere_is_refused() {
        let (key, _) = SigningKey::generate().unwrap();
        let ring = keyring(&key, &["*"], &["*"]);
        let bytes = encode_plan(&key.sign(plan(planner(), "example.test")));
        let header = crate::codec::HEADER_BYTES;
        for at in header..bytes.len() {
            let mut tampered = bytes.clone();
            tampered[at] ^= 0x01;
            let crc = crc32fast::hash(&tampered[header..]);
            tampered[12..16].copy_from_slice(&crc.to_le_bytes());
            if let Ok(plan) = decode_plan(&tampered) {
                assert!(ring.verify(&plan).is_err(), "byte {at} changed and the plan still verifies: {:?}", plan.plan());
            }
        }
    }

    #[test]
    fn each_refusal_says_why() {
        let (key, _) = SigningKey::generate().unwrap();
        let (other, _) = SigningKey::generate().unwrap();
        let ring = keyring(&key, &["example.test"], &["planner:p1", "operator:*"]);
        let unsigned = plan(planner(), "example.test");
        assert!(matches!(ring.verify(&unsigned), Err(SignatureError::Unsigned { .. })));
        assert!(matches!(ring.verify(&other.sign(unsigned.clone())), Err(SignatureError::UnknownKey { .. })));
        assert!(matches!(ring.verify(&key.sign(plan(planner(), "other.test"))), Err(SignatureError::NotForZone { .. })));
        let p2 = Author::Planner { id: "p2".into() };
        assert!(matches!(ring.verify(&key.sign(plan(p2, "example.test"))), Err(SignatureError::NotForAuthor { .. })));
        assert_eq!(ring.verify(&key.sign(plan(Author::Operator { name: "alice".into() }, "example.test"))), Ok("k1"));
        // Another key's signature presented under this key's public key.
        let mut forged = other.sign(unsigned.clone()).signature().cloned().unwrap();
        forged.public_key = key.public_key();
        assert!(matches!(ring.verify(&unsigned.with_signature(Some(forged))), Err(SignatureError::BadSignature { .. })));
    }

    #[test]
    fn keys_load_only_from_private_files_and_never_show_in_debug() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("planner.key");
        let (key, pem) = SigningKey::generate().unwrap();
        std::fs::write(&path, &pem).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = SigningKey::load(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let loaded = SigningKey::load(&path).unwrap();
        assert_eq!(loaded.public_key(), key.public_key());
        let shown = format!("{loaded:?}");
        let secret_line = pem.lines().nth(1).unwrap();
        assert!(!shown.contains(secret_line) && shown.contains(&public_key_text(&key.public_key())), "{shown}");
        std::fs::write(&path, "not a key").unwrap();
        assert!(matches!(SigningKey::load(&path), Err(KeyFileError::NotPem { .. })));
    }

    #[test]
    fn the_demo_key_loads_and_daemons_refuse_to_trust_it() {
        let signed = SigningKey::demo().sign(plan(planner(), "example.test"));
        let demo = KeyringConfig::demo();
        assert_eq!(Keyring::from_config(&demo).unwrap().unwrap().verify(&signed), Ok("demo"));
        let err = demo.check().unwrap_err();
        assert!(err.contains("demo key") && err.contains("dnsplan key new"), "{err}");
    }

    #[test]
    fn bad_keyrings_are_refused_with_the_key_named() {
        let good = |name: &str, public_key: &str| TrustedKeyConfig {
            name: name.into(),
            public_key: public_key.into(),
            zones: vec!["*".into()],
            authors: vec!["*".into()],
        };
        let (key, _) = SigningKey::generate().unwrap();
        let text = public_key_text(&key.public_key());
        let cases = [
            (vec![good("a", "not base64!")], "not base64"),
            (vec![good("a", "AAAA")], "3 bytes"),
            (vec![good("a", &text), good("a", &text)], "used twice"),
            (vec![TrustedKeyConfig { zones: vec![], ..good("a", &text) }], "zones is empty"),
            (vec![TrustedKeyConfig { authors: vec!["root".into()], ..good("a", &text) }], "is not `planner:ID`"),
        ];
        for (keys, want) in cases {
            let err = Keyring::from_config(&KeyringConfig { key: keys }).unwrap_err();
            assert!(err.contains(want) && err.contains("\"a\""), "{err}");
        }
        assert_eq!(Keyring::from_config(&KeyringConfig::default()), Ok(None));
    }
}
