//! TSIG (RFC 8945): shared-secret keys and thin wrappers around hickory-proto's TSIG, for the
//! authority's zone transfers and for RFC 2136 updates signed by an enactor.
//!
//! A key is a name, an algorithm (hmac-sha256 only, the one RFC 8945 §6 makes mandatory) and a
//! secret given inline in base64 or read from a file (`TsigKeyConfig`, from TOML). No error,
//! `Debug` or `Display` here ever prints a secret or any part of one.
//!
//! Client side: `TsigKey::sign_query` signs a message and returns a `ResponseVerifier` for
//! the answer (or the chain of answers of a transfer). Server side: `verify_request` checks a
//! signed request against the keys a client may use (`RequestError` says which RFC 8945 §5.2
//! check failed: BADKEY, BADSIG or BADTIME), `ResponseSigner` signs each message of the
//! answer (the first with the request's MAC and every TSIG variable, later ones with the
//! prior MAC and the timers only, RFC 8945 §5.3.1), and `error_response` builds the NOTAUTH
//! answer a failed check gets. The MAC itself, and its constant-time check, are hickory's.
//!
//! Who may use which key (an ACL) is not this module's business.

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::tsig::{TSIG, TsigAlgorithm, TsigError, make_tsig_record};
use hickory_proto::rr::{Name, Record, TSigVerifier, TSigner};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};
use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};
use thiserror::Error;

/// Seconds a signature's time may differ from ours (RFC 8945 §10 recommends 300): wide enough
/// for clocks kept by NTP, narrow enough that a captured request cannot be replayed for long.
pub const FUDGE_SECS: u16 = 300;
/// Shortest secret accepted: half of hmac-sha256's output, the least RFC 8945 §6 allows
/// ("at least half the length of the hash output"). `tsig-keygen` and `keymgr` make 32.
pub const SECRET_BYTES_MIN: usize = 16;
/// Largest secret file read. A base64 secret of any sensible key fits many times over; the
/// limit keeps a wrong path (a disk image, a device) from being read into memory.
pub const SECRET_FILE_BYTES_MAX: u64 = 4_096;

/// The one TSIG algorithm supported, by its RFC 8945 name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum Algorithm {
    #[default]
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::HmacSha256 => "hmac-sha256",
        }
    }

    fn hickory(self) -> TsigAlgorithm {
        match self {
            Algorithm::HmacSha256 => TsigAlgorithm::HmacSha256,
        }
    }
}

/// A secret as read from a config file. Its `Debug` prints nothing of it.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct SecretText(String);

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

/// One key as written in TOML:
///
/// ```toml
/// name = "transfer.example.test."
/// algorithm = "hmac-sha256"          # the default and the only one
/// secret = "base64..."               # or: secret_file = "transfer.key" (base64 inside)
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TsigKeyConfig {
    /// The key's name, as the other side knows it (a DNS name).
    pub name: String,
    #[serde(default)]
    pub algorithm: Algorithm,
    /// The secret in base64 (RFC 4648), as `tsig-keygen`, `keymgr` and `dig -y` write it.
    pub secret: Option<SecretText>,
    /// A file holding the secret in base64; relative to the config file's directory.
    pub secret_file: Option<PathBuf>,
}

/// Why a key could not be built. Names the key and what to change, never the secret.
#[derive(Debug, Error)]
pub enum TsigKeyError {
    #[error("TSIG key {name:?}: the name is not a valid DNS name: {detail}")]
    BadName { name: String, detail: String },
    #[error("TSIG key {name}: no secret; set secret (base64) or secret_file")]
    NoSecret { name: String },
    #[error("TSIG key {name}: both secret and secret_file are set; keep one")]
    TwoSecrets { name: String },
    #[error("TSIG key {name}: the secret{where_} is not valid base64 (RFC 4648, as tsig-keygen writes it)")]
    NotBase64 { name: String, where_: String },
    #[error(
        "TSIG key {name}: the secret{where_} is {bytes} bytes; give at least {min} (e.g. `tsig-keygen -a hmac-sha256 {name}` \
         or `openssl rand -base64 32`)"
    )]
    TooShort { name: String, where_: String, bytes: usize, min: usize },
    #[error("TSIG key {name}: cannot read secret_file {path}")]
    ReadFile { name: String, path: PathBuf, source: std::io::Error },
    #[error("TSIG key {name}: secret_file {path} is larger than {max} bytes; it should hold one base64 secret")]
    FileTooLarge { name: String, path: PathBuf, max: u64 },
    #[error("TSIG key {name}: two keys have this name; key names must be unique")]
    Duplicate { name: String },
}

/// A TSIG key ready to sign and verify. `Debug` shows the name and algorithm only.
#[derive(Clone)]
pub struct TsigKey {
    /// Lower case, fully qualified.
    name: Name,
    algorithm: Algorithm,
    signer: TSigner,
}

impl fmt::Debug for TsigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TsigKey").field("name", &self.name.to_string()).field("algorithm", &self.algorithm.as_str()).finish()
    }
}

impl TsigKey {
    /// Builds a key from its TOML form; `config_dir` resolves a relative `secret_file`.
    pub fn from_config(config: &TsigKeyConfig, config_dir: &Path) -> Result<TsigKey, TsigKeyError> {
        let display = config.name.clone();
        let (text, where_) = match (&config.secret, &config.secret_file) {
            (Some(_), Some(_)) => return Err(TsigKeyError::TwoSecrets { name: display }),
            (None, None) => return Err(TsigKeyError::NoSecret { name: display }),
            (Some(SecretText(text)), None) => (text.clone(), String::new()),
            (None, Some(file)) => {
                let path = config_dir.join(file);
                let read_error = |source| TsigKeyError::ReadFile { name: display.clone(), path: path.clone(), source };
                let size = std::fs::metadata(&path).map_err(read_error)?.len();
                if size > SECRET_FILE_BYTES_MAX {
                    return Err(TsigKeyError::FileTooLarge { name: display, path, max: SECRET_FILE_BYTES_MAX });
                }
                let text = std::fs::read_to_string(&path).map_err(read_error)?;
                (text, format!(" in {}", path.display()))
            }
        };
        TsigKey::from_base64_at(&config.name, config.algorithm, &text, &where_)
    }

    /// A key from its secret in base64 (as `dig -y` and `tsig-keygen` write it).
    pub fn from_base64(name: &str, algorithm: Algorithm, secret_base64: &str) -> Result<TsigKey, TsigKeyError> {
        TsigKey::from_base64_at(name, algorithm, secret_base64, "")
    }

    fn from_base64_at(name: &str, algorithm: Algorithm, text: &str, where_: &str) -> Result<TsigKey, TsigKeyError> {
        let secret = data_encoding::BASE64
            .decode(text.trim().as_bytes())
            .map_err(|_| TsigKeyError::NotBase64 { name: name.into(), where_: where_.into() })?;
        if secret.len() < SECRET_BYTES_MIN {
            return Err(TsigKeyError::TooShort { name: name.into(), where_: where_.into(), bytes: secret.len(), min: SECRET_BYTES_MIN });
        }
        TsigKey::new(name, algorithm, secret)
    }

    /// A key from its parts (`secret` in raw bytes).
    pub fn new(name: &str, algorithm: Algorithm, secret: Vec<u8>) -> Result<TsigKey, TsigKeyError> {
        let bad_name = |detail: String| TsigKeyError::BadName { name: name.into(), detail };
        let mut parsed = Name::from_ascii(name).map_err(|e| bad_name(e.to_string()))?;
        if parsed.is_root() {
            return Err(bad_name("the root is not a key name".into()));
        }
        parsed.set_fqdn(true);
        let parsed = parsed.to_lowercase();
        let signer = TSigner::new(secret, algorithm.hickory(), parsed.clone(), FUDGE_SECS).map_err(|e| bad_name(e.to_string()))?;
        Ok(TsigKey { name: parsed, algorithm, signer })
    }

    pub fn name(&self) -> &Name {
        &self.name
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Signs `message` (a query, an update or a NOTIFY) as of `now_unix_secs`, adding its
    /// TSIG record. The returned verifier checks the answer, or each message of a transfer.
    pub fn sign_query(&self, message: &mut Message, now_unix_secs: u64) -> Result<ResponseVerifier, TsigFailure> {
        let verifier = message.finalize(&self.signer, now_unix_secs).map_err(|e| TsigFailure::Encode(e.to_string()))?;
        let verifier = verifier.ok_or_else(|| TsigFailure::Encode("hickory returned no verifier".into()))?;
        Ok(ResponseVerifier { verifier, key_name: self.name.clone() })
    }
}

/// Builds every key of `configs`, refusing two with one name.
pub fn keys_from_config(configs: &[TsigKeyConfig], config_dir: &Path) -> Result<Vec<TsigKey>, TsigKeyError> {
    let mut keys: Vec<TsigKey> = Vec::with_capacity(configs.len());
    for config in configs {
        let key = TsigKey::from_config(config, config_dir)?;
        if keys.iter().any(|k| k.name == key.name) {
            return Err(TsigKeyError::Duplicate { name: key.name.to_string() });
        }
        keys.push(key);
    }
    Ok(keys)
}

/// The current time in seconds since the epoch, as TSIG counts it.
pub fn now_unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A signed exchange that failed on the client's side: the answer, as a client reads it.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TsigFailure {
    #[error("the server does not know the TSIG key {key} (BADKEY); configure the same key name and secret on both sides")]
    BadKey { key: String },
    #[error("the server found the TSIG signature wrong (BADSIG); check that both sides have the same secret for key {key}")]
    BadSig { key: String },
    #[error("the server's clock and ours differ by more than {FUDGE_SECS} s (BADTIME); synchronise the clocks (NTP)")]
    BadTime,
    #[error("the answer's TSIG signature does not verify with key {key}: {detail}")]
    Unverified { key: String, detail: String },
    #[error("encoding the signed message: {0}")]
    Encode(String),
}

/// Checks the answers to a signed query, in order (a transfer's messages chain their MACs).
pub struct ResponseVerifier {
    verifier: TSigVerifier,
    key_name: Name,
}

impl ResponseVerifier {
    /// Verifies one answer and returns it decoded. An unsigned error answer (BADKEY, BADSIG)
    /// is reported as what the server said.
    pub fn verify(&mut self, answer: &[u8]) -> Result<Message, TsigFailure> {
        let key = self.key_name.to_string();
        if let Ok(message) = Message::from_vec(answer)
            && let Some(sig) = message.signature()
        {
            match sig.data.error {
                Some(TsigError::BadKey) => return Err(TsigFailure::BadKey { key }),
                Some(TsigError::BadSig) => return Err(TsigFailure::BadSig { key }),
                Some(TsigError::BadTime) => return Err(TsigFailure::BadTime),
                _ => {}
            }
        }
        let response = self.verifier.verify(answer).map_err(|e| TsigFailure::Unverified { key, detail: e.to_string() })?;
        Ok(response.into_message())
    }
}

/// Why a signed request was refused (RFC 8945 §5.2), in the order the checks run.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RequestError {
    /// The request carries no TSIG record.
    #[error("the request is not signed")]
    Unsigned,
    /// The message or its TSIG record does not decode.
    #[error("the request does not decode")]
    Malformed,
    /// No key the client may use has the request's key name and algorithm.
    #[error("unknown TSIG key (BADKEY)")]
    BadKey,
    /// The MAC does not verify.
    #[error("wrong TSIG signature (BADSIG)")]
    BadSig,
    /// The signature's time is more than its fudge away from ours.
    #[error("TSIG time outside the fudge (BADTIME)")]
    BadTime,
}

/// A request whose signature verified: what its answer is signed with.
#[derive(Clone, Debug)]
pub struct VerifiedRequest {
    pub key: TsigKey,
    /// The request's MAC, which the first answer's MAC covers.
    mac: Vec<u8>,
    id: u16,
}

/// Checks the TSIG of `packet` against `keys` (those this client may use), as of
/// `now_unix_secs`: the key (name and algorithm), then the MAC, then the time.
pub fn verify_request<'k>(
    keys: impl IntoIterator<Item = &'k TsigKey>,
    packet: &[u8],
    now_unix_secs: u64,
) -> Result<VerifiedRequest, RequestError> {
    let message = Message::from_vec(packet).map_err(|_| RequestError::Malformed)?;
    let Some(sig) = message.signature() else { return Err(RequestError::Unsigned) };
    let name = sig.name.to_lowercase();
    let key = keys.into_iter().find(|k| k.name == name && k.algorithm.hickory() == sig.data.algorithm).ok_or(RequestError::BadKey)?;
    let (mac, time, valid) = key.signer.verify_message_byte(packet, None, true).map_err(|_| RequestError::BadSig)?;
    if !(valid.start..=valid.end).contains(&now_unix_secs) {
        return Err(RequestError::BadTime);
    }
    let _ = time;
    Ok(VerifiedRequest { key: key.clone(), mac, id: message.metadata.id })
}

impl VerifiedRequest {
    /// The signer of the answer's messages, stamped `now_unix_secs`.
    pub fn signer(&self, now_unix_secs: u64) -> ResponseSigner {
        ResponseSigner { key: self.key.clone(), prior_mac: self.mac.clone(), first: true, id: self.id, time: now_unix_secs }
    }
}

/// Signs the messages of one answer in order: the first covers the request's MAC and every
/// TSIG variable, each later one the prior message's MAC and the timers (RFC 8945 §5.3.1).
pub struct ResponseSigner {
    key: TsigKey,
    prior_mac: Vec<u8>,
    first: bool,
    id: u16,
    time: u64,
}

/// Most bytes a TSIG record of ours adds to a message: the key name (at most 255), type,
/// class, TTL, RDLENGTH, the algorithm name, time, fudge, MAC size, a 64-byte MAC (room for
/// any HMAC), original id, error, other length and 6 bytes of other data (BADTIME's time).
pub const TSIG_RECORD_BYTES_MAX: usize = 255 + 10 + 13 + 6 + 2 + 2 + 64 + 2 + 2 + 2 + 6;

impl ResponseSigner {
    /// `message` (encoded, unsigned) with its TSIG record appended and counted in ARCOUNT.
    pub fn sign(&mut self, message: &[u8]) -> Result<Vec<u8>, TsigFailure> {
        if message.len() < 12 {
            return Err(TsigFailure::Encode("a message shorter than a header".into()));
        }
        let stub = TSIG::new(self.key.algorithm.hickory(), self.time, FUDGE_SECS, Vec::new(), self.id, None, Vec::new());
        let mut tbs = Vec::with_capacity(2 + self.prior_mac.len() + message.len() + 128);
        tbs.extend_from_slice(&(self.prior_mac.len() as u16).to_be_bytes());
        tbs.extend_from_slice(&self.prior_mac);
        tbs.extend_from_slice(message);
        if self.first {
            let mut encoder = BinEncoder::new(&mut tbs);
            encoder.set_offset(encoder.len());
            stub.emit_tsig_for_mac(&mut encoder, &self.key.name).map_err(|e| TsigFailure::Encode(e.to_string()))?;
        } else {
            tbs.extend_from_slice(&((self.time >> 32) as u16).to_be_bytes());
            tbs.extend_from_slice(&(self.time as u32).to_be_bytes());
            tbs.extend_from_slice(&FUDGE_SECS.to_be_bytes());
        }
        let mac = self.key.signer.sign(&tbs).map_err(|e| TsigFailure::Encode(e.to_string()))?;
        let record = make_tsig_record(self.key.name.clone(), stub.set_mac(mac.clone()));
        let signed = append_tsig(message, &record)?;
        self.prior_mac = mac;
        self.first = false;
        Ok(signed)
    }
}

/// `message` with `record` appended to its additional section.
fn append_tsig(message: &[u8], record: &Record<TSIG>) -> Result<Vec<u8>, TsigFailure> {
    let additional = u16::from_be_bytes([message[10], message[11]]);
    let additional = additional.checked_add(1).ok_or_else(|| TsigFailure::Encode("ARCOUNT is full".into()))?;
    let mut tail = Vec::with_capacity(TSIG_RECORD_BYTES_MAX);
    {
        let mut encoder = BinEncoder::new(&mut tail);
        record.emit(&mut encoder).map_err(|e| TsigFailure::Encode(e.to_string()))?;
    }
    let mut out = Vec::with_capacity(message.len() + tail.len());
    out.extend_from_slice(message);
    out[10..12].copy_from_slice(&additional.to_be_bytes());
    out.extend_from_slice(&tail);
    Ok(out)
}

/// The answer to a request that failed its TSIG check (RFC 8945 §5.2): NOTAUTH with the
/// question, and a TSIG record with the error, unsigned for BADKEY and BADSIG (the client's
/// key name echoed, nothing of ours), signed for BADTIME with our time in Other Data.
/// `None` when the request does not decode or is unsigned: those get REFUSED or FORMERR from
/// the caller.
pub fn error_response(packet: &[u8], error: &RequestError, keys: &[TsigKey], now_unix_secs: u64) -> Option<Vec<u8>> {
    let request = Message::from_vec(packet).ok()?;
    let sig = request.signature()?;
    let tsig_error = match error {
        RequestError::BadKey => TsigError::BadKey,
        RequestError::BadSig => TsigError::BadSig,
        RequestError::BadTime => TsigError::BadTime,
        RequestError::Unsigned | RequestError::Malformed => return None,
    };
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.message_type = MessageType::Response;
    response.metadata.response_code = ResponseCode::NotAuth;
    response.add_queries(request.queries.iter().cloned());
    let unsigned = response.to_vec().ok()?;
    if tsig_error == TsigError::BadTime {
        // The key verified: sign with it, our time in Other Data (RFC 8945 §5.2.3).
        let name = sig.name.to_lowercase();
        let key = keys.iter().find(|k| k.name == name)?;
        let (mac, _, _) = key.signer.verify_message_byte(packet, None, true).ok()?;
        let time = now_unix_secs.to_be_bytes();
        let stub = TSIG::new(
            key.algorithm.hickory(),
            sig.data.time,
            FUDGE_SECS,
            Vec::new(),
            request.metadata.id,
            Some(TsigError::BadTime),
            time[2..].to_vec(),
        );
        let mut tbs = Vec::new();
        tbs.extend_from_slice(&(mac.len() as u16).to_be_bytes());
        tbs.extend_from_slice(&mac);
        tbs.extend_from_slice(&unsigned);
        let mut encoder = BinEncoder::new(&mut tbs);
        encoder.set_offset(encoder.len());
        stub.emit_tsig_for_mac(&mut encoder, &key.name).ok()?;
        let mac = key.signer.sign(&tbs).ok()?;
        return append_tsig(&unsigned, &make_tsig_record(key.name.clone(), stub.set_mac(mac))).ok();
    }
    let stub =
        TSIG::new(sig.data.algorithm.clone(), now_unix_secs, FUDGE_SECS, Vec::new(), request.metadata.id, Some(tsig_error), Vec::new());
    append_tsig(&unsigned, &make_tsig_record(sig.name.clone(), stub)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::RecordType;

    const SECRET_B64: &str = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTEyMzQ="; // 32 bytes

    fn key(name: &str, secret: &[u8]) -> TsigKey {
        TsigKey::new(name, Algorithm::HmacSha256, secret.to_vec()).expect("key")
    }

    fn parse(toml_text: &str) -> Result<TsigKey, String> {
        let config: TsigKeyConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        TsigKey::from_config(&config, Path::new(".")).map_err(|e| e.to_string())
    }

    fn axfr_query() -> Message {
        let mut query = Message::query();
        query.add_query(Query::query(Name::from_ascii("example.test.").expect("name"), RecordType::AXFR));
        query
    }

    #[test]
    fn keys_parse_from_toml_and_errors_never_show_the_secret() {
        let ok = parse(&format!("name = \"Transfer.Example.\"\nsecret = \"{SECRET_B64}\"\n")).expect("parses");
        assert_eq!(ok.name().to_string(), "transfer.example.");
        assert_eq!(ok.algorithm(), Algorithm::HmacSha256);
        assert!(!format!("{ok:?}").contains(SECRET_B64));
        let short = "c2hvcnQ="; // "short"
        for (text, want) in [
            ("name = \"k.\"\n".to_string(), "no secret"),
            (format!("name = \"k.\"\nsecret = \"{short}\"\n"), "5 bytes; give at least 16"),
            ("name = \"k.\"\nsecret = \"not base64!!\"\n".to_string(), "not valid base64"),
            (format!("name = \"k.\"\nsecret = \"{SECRET_B64}\"\nsecret_file = \"x\"\n"), "keep one"),
            (format!("name = \"k.\"\nalgorithm = \"hmac-md5\"\nsecret = \"{SECRET_B64}\"\n"), "hmac-md5"),
            (format!("name = \"k.\"\nsecret = \"{SECRET_B64}\"\nextra = 1\n"), "extra"),
            ("name = \"k.\"\nsecret_file = \"/nonexistent/secret\"\n".to_string(), "cannot read secret_file"),
        ] {
            let err = parse(&text).expect_err(&text);
            assert!(err.contains(want), "{text:?}: want {want:?} in {err}");
            for secret in [SECRET_B64, short, "not base64"] {
                assert!(!err.contains(secret), "{err} shows the secret");
            }
        }
    }

    #[test]
    fn a_secret_file_is_read_relative_to_the_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("k.key"), format!("{SECRET_B64}\n")).expect("write");
        let config: TsigKeyConfig = toml::from_str("name = \"k.\"\nsecret_file = \"k.key\"\n").expect("toml");
        let from_file = TsigKey::from_config(&config, dir.path()).expect("reads");
        let inline = parse(&format!("name = \"k.\"\nsecret = \"{SECRET_B64}\"\n")).expect("parses");
        // Same secret: a query signed with one verifies with the other.
        let mut query = axfr_query();
        from_file.sign_query(&mut query, 1_000_000).expect("signs");
        verify_request([&inline], &query.to_vec().expect("encodes"), 1_000_000).expect("verifies");
    }

    #[test]
    fn requests_verify_and_each_failure_is_told_apart() {
        let right = key("transfer.", b"0123456789abcdef0123456789abcdef");
        let other_secret = key("transfer.", b"fedcba9876543210fedcba9876543210");
        let other_name = key("other.", b"0123456789abcdef0123456789abcdef");
        let now = 1_700_000_000;
        let mut query = axfr_query();
        right.sign_query(&mut query, now).expect("signs");
        let packet = query.to_vec().expect("encodes");
        assert!(verify_request([&right], &packet, now).is_ok());
        assert!(verify_request([&right], &packet, now + u64::from(FUDGE_SECS)).is_ok());
        assert_eq!(verify_request([&right], &packet, now + u64::from(FUDGE_SECS) + 1).map(|_| ()), Err(RequestError::BadTime));
        assert_eq!(verify_request([&other_secret], &packet, now).map(|_| ()), Err(RequestError::BadSig));
        assert_eq!(verify_request([&other_name], &packet, now).map(|_| ()), Err(RequestError::BadKey));
        assert_eq!(verify_request([&right], &axfr_query().to_vec().expect("encodes"), now).map(|_| ()), Err(RequestError::Unsigned));
        assert_eq!(verify_request([&right], &packet[..20], now).map(|_| ()), Err(RequestError::Malformed));
        let mut tampered = packet.clone();
        tampered[2] ^= 0x01; // RD flipped after signing
        assert_eq!(verify_request([&right], &tampered, now).map(|_| ()), Err(RequestError::BadSig));
    }

    /// A chain of three signed answers verifies with hickory's own verifier, which checks the
    /// first against the request's MAC and every later one against the prior MAC and timers.
    #[test]
    fn a_chain_of_answers_verifies_in_order_and_not_out_of_order() {
        let k = key("transfer.", b"0123456789abcdef0123456789abcdef");
        let now = 1_700_000_000;
        let mut query = axfr_query();
        let mut verifier = k.sign_query(&mut query, now).expect("signs");
        let packet = query.to_vec().expect("encodes");
        let verified = verify_request([&k], &packet, now).expect("verifies");
        let mut signer = verified.signer(now);
        let messages: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                let mut answer = Message::response(query.metadata.id, query.metadata.op_code);
                answer.add_queries(query.queries.iter().cloned());
                answer.metadata.authoritative = i == 0;
                signer.sign(&answer.to_vec().expect("encodes")).expect("signs")
            })
            .collect();
        for m in &messages {
            verifier.verify(m).expect("each message verifies in order");
        }
        let mut query = axfr_query();
        let mut verifier = k.sign_query(&mut query, now).expect("signs");
        let mut signer = verify_request([&k], &query.to_vec().expect("encodes"), now).expect("verifies").signer(now);
        let mut answer = Message::response(query.metadata.id, query.metadata.op_code);
        answer.add_queries(query.queries.iter().cloned());
        let bytes = answer.to_vec().expect("encodes");
        let (first, second) = (signer.sign(&bytes).expect("signs"), signer.sign(&bytes).expect("signs"));
        assert!(verifier.verify(&second).is_err(), "a later message does not verify as the first");
        let _ = first;
    }

    #[test]
    fn error_answers_carry_the_tsig_error_and_the_client_reads_it() {
        let k = key("transfer.", b"0123456789abcdef0123456789abcdef");
        let wrong = key("transfer.", b"fedcba9876543210fedcba9876543210");
        let now = 1_700_000_000;
        for (error, signed_with, want) in [
            (RequestError::BadKey, &wrong, TsigFailure::BadKey { key: "transfer.".into() }),
            (RequestError::BadSig, &wrong, TsigFailure::BadSig { key: "transfer.".into() }),
            (RequestError::BadTime, &k, TsigFailure::BadTime),
        ] {
            let mut query = axfr_query();
            let mut verifier = signed_with.sign_query(&mut query, now).expect("signs");
            let packet = query.to_vec().expect("encodes");
            let answer = error_response(&packet, &error, std::slice::from_ref(&k), now).expect("an answer");
            let decoded = Message::from_vec(&answer).expect("decodes");
            assert_eq!(decoded.metadata.response_code, ResponseCode::NotAuth);
            assert_eq!(verifier.verify(&answer).map(|_| ()), Err(want));
        }
        assert!(error_response(&axfr_query().to_vec().expect("encodes"), &RequestError::Unsigned, &[k], now).is_none());
    }
}
