//! A zone's key directory shared through the store (`Store::dnssec_keys`), so that several
//! authorities sign with one DNSSEC key set and any of them may roll it, with no copy of a
//! directory to keep in step by hand.
//!
//! Each authority keeps its own key directory (`dnssec_keys::KeyDir`: what it signs with, read
//! at start even while the store is away), and the store keeps a record of it: `keys.toml` as
//! it is, and each private key sealed with AES-256-GCM under a key-encryption key (`Kek`) that
//! every authority of the zone holds in a file of its own (mode 0600). The store, its backups
//! and whoever reads etcd see the schedule and the public keys' tags, never a private key.
//!
//! The directory remembers which version of the record it is (`.shared.toml`: the version and
//! a digest of `keys.toml` as it was then). At each look an authority:
//! 1. takes the store's record when its version is another than the directory's (written by
//!    another authority, or by this one's `dnsplan zone key` on another machine), replacing
//!    the directory whole;
//! 2. makes the rolls the schedule calls for, as with a directory of its own;
//! 3. writes the directory back to the store when it changed since that version (a roll, or
//!    `dnsplan zone key roll` run on this machine), compared with the version it read: of two
//!    authorities rolling at once, one writes and the other takes its keys at the next look.

use crate::dnssec_keys::{At, KEYS_FILE, KeyDir, KeyDirError};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Where a key directory remembers the version of the store's record it holds.
pub const SHARED_FILE: &str = ".shared.toml";
/// The record's format.
const FORMAT: u32 = 1;

#[derive(Debug, Error)]
pub enum ShareError {
    #[error("key-encryption key {path}: {detail}")]
    Kek { path: PathBuf, detail: String },
    #[error("key directory {path}: {detail}")]
    Dir { path: PathBuf, detail: String },
    #[error("the DNSSEC keys in the store: {0}")]
    Record(String),
    #[error(transparent)]
    Keys(#[from] KeyDirError),
}

/// The key-encryption key: 32 random bytes, in a file as 64 hex digits, read by its owner
/// only. Every authority of a zone whose keys the store holds has the same one.
pub struct Kek {
    key: LessSafeKey,
    /// The first 8 bytes of the key's SHA-256, in hex: named in the record, so that an
    /// authority with another key says so instead of failing to open every key.
    id: String,
}

impl std::fmt::Debug for Kek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kek({})", self.id)
    }
}

impl Kek {
    fn from_bytes(bytes: &[u8; 32]) -> Kek {
        let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
        let id = data_encoding::HEXLOWER.encode(&digest.as_ref()[..8]);
        Kek { key: LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("32 bytes is an AES-256 key")), id }
    }

    /// Writes a new key to `path` (mode 0600; never over a file).
    pub fn create(path: &Path) -> Result<Kek, ShareError> {
        let mut bytes = [0u8; 32];
        SystemRandom::new().fill(&mut bytes).map_err(|_| ShareError::Kek { path: path.to_owned(), detail: "no randomness".into() })?;
        let text = format!("{}\n", data_encoding::HEXLOWER.encode(&bytes));
        crate::dnssec::write_private(path, &text).map_err(|e| ShareError::Kek { path: path.to_owned(), detail: e.to_string() })?;
        Ok(Kek::from_bytes(&bytes))
    }

    /// Reads the key at `path`: refused when others may read it, or when it is not 64 hex
    /// digits.
    pub fn load(path: &Path) -> Result<Kek, ShareError> {
        let refused = |detail: String| ShareError::Kek { path: path.to_owned(), detail };
        let text = crate::signing::read_owner_only(path).map_err(|e| match e {
            crate::signing::OwnerOnly::Read(error) => refused(format!("cannot read it: {error}")),
            crate::signing::OwnerOnly::Exposed(mode) => refused(format!("may be read by others (mode {mode:o}): chmod 600 it")),
        })?;
        let text = String::from_utf8_lossy(&text);
        let bytes = data_encoding::HEXLOWER_PERMISSIVE
            .decode(text.trim().as_bytes())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| refused("is not 64 hex digits (make one with `dnsplan zone key kek FILE`)".into()))?;
        Ok(Kek::from_bytes(&bytes))
    }

    /// The key's short fingerprint (not secret).
    pub fn id(&self) -> &str {
        &self.id
    }

    fn seal(&self, aad: &str, plain: &[u8]) -> Result<String, ShareError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).map_err(|_| ShareError::Record("no randomness".into()))?;
        let mut out = plain.to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad.as_bytes()), &mut out)
            .map_err(|_| ShareError::Record("sealing failed".into()))?;
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&out);
        Ok(data_encoding::BASE64.encode(&sealed))
    }

    fn open(&self, aad: &str, sealed: &str) -> Result<Vec<u8>, ShareError> {
        let bad = || ShareError::Record(format!("{aad} could not be opened with key-encryption key {}: altered in the store", self.id));
        let mut bytes = data_encoding::BASE64.decode(sealed.as_bytes()).map_err(|_| bad())?;
        if bytes.len() < NONCE_LEN {
            return Err(bad());
        }
        let mut body = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| bad())?;
        let plain = self.key.open_in_place(nonce, Aad::from(aad.as_bytes()), &mut body).map_err(|_| bad())?;
        Ok(plain.to_vec())
    }
}

/// The record the store keeps, in TOML (readable with `etcdctl get`: the schedule and the
/// key tags, the private keys sealed).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    format: u32,
    zone: String,
    /// `Kek::id` of the key the private keys are sealed with.
    kek: String,
    /// `keys.toml`, as the directory holds it.
    schedule: String,
    #[serde(default)]
    keys: Vec<SealedKey>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SealedKey {
    file: String,
    /// Nonce then AES-256-GCM ciphertext and tag, in base64; the data authenticated with it
    /// is the zone and the file name, so a key cannot be moved to another zone or role.
    sealed: String,
}

/// What the directory holds of the store's record (`SHARED_FILE`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shared {
    /// The store's version of the record the directory was read from or written to.
    pub version: Option<u64>,
    /// SHA-256 of `keys.toml` then, in hex: another digest now means changed since.
    pub schedule_sha256: String,
}

fn digest(text: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(ring::digest::digest(&ring::digest::SHA256, text).as_ref())
}

fn dir_error(path: &Path, detail: impl Into<String>) -> ShareError {
    ShareError::Dir { path: path.to_owned(), detail: detail.into() }
}

/// The directory's `SHARED_FILE` (default: never shared).
pub fn shared(path: &Path) -> Result<Shared, ShareError> {
    match std::fs::read_to_string(path.join(SHARED_FILE)) {
        Ok(text) => toml::from_str(&text).map_err(|e| dir_error(path, format!("{SHARED_FILE}: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Shared::default()),
        Err(e) => Err(dir_error(path, format!("{SHARED_FILE}: {e}"))),
    }
}

/// Writes the directory's `SHARED_FILE` whole (beside it, renamed over it).
pub fn set_shared(path: &Path, shared: &Shared) -> Result<(), ShareError> {
    let text = toml::to_string(shared).map_err(|e| dir_error(path, e.to_string()))?;
    let text = format!("# The version of the store's record of these keys this directory holds (written by dnsplan).\n{text}");
    replace(path, SHARED_FILE, text.as_bytes(), false)
}

/// Writes `name` in `dir` whole: a file beside it, synced, renamed over it.
fn replace(dir: &Path, name: &str, bytes: &[u8], private: bool) -> Result<(), ShareError> {
    use std::io::Write;
    let temp = dir.join(format!(".{name}.new"));
    let _ = std::fs::remove_file(&temp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, if private { 0o600 } else { 0o644 });
    let _ = private;
    let io = |e: std::io::Error| dir_error(dir, format!("{name}: {e}"));
    let mut file = options.open(&temp).map_err(io)?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(io)?;
    std::fs::rename(&temp, dir.join(name)).map_err(io)
}

/// The digest of the directory's `keys.toml` now (`None`: there is none).
pub fn schedule_digest(path: &Path) -> Result<Option<String>, ShareError> {
    match std::fs::read(path.join(KEYS_FILE)) {
        Ok(text) => Ok(Some(digest(&text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(dir_error(path, format!("{KEYS_FILE}: {e}"))),
    }
}

/// The record of directory `path` (every key file it holds, sealed with `kek`; a key removed
/// by `now` may have none), and the digest of the `keys.toml` it holds. The caller holds the directory's lock.
pub fn export(path: &Path, kek: &Kek, now: At) -> Result<(Vec<u8>, String), ShareError> {
    let dir = KeyDir::load(path, now)?;
    let schedule = std::fs::read_to_string(path.join(KEYS_FILE)).map_err(|e| dir_error(path, format!("{KEYS_FILE}: {e}")))?;
    let mut keys = Vec::new();
    for entry in dir.entries() {
        // A removed key's file goes too while it is there (until `prune`): an authority whose
        // clock lags this one's may still need it.
        let pem = match crate::signing::read_owner_only(&path.join(&entry.file)) {
            Ok(pem) => pem,
            Err(crate::signing::OwnerOnly::Read(error))
                if error.kind() == std::io::ErrorKind::NotFound && entry.removed.is_some_and(|r| r <= now) =>
            {
                continue;
            }
            Err(crate::signing::OwnerOnly::Read(error)) => return Err(dir_error(path, format!("{}: {error}", entry.file))),
            Err(crate::signing::OwnerOnly::Exposed(mode)) => {
                return Err(dir_error(path, format!("{} may be read by others (mode {mode:o})", entry.file)));
            }
        };
        keys.push(SealedKey { sealed: kek.seal(&aad(dir.zone(), &entry.file), &pem)?, file: entry.file.clone() });
    }
    let record = Record { format: FORMAT, zone: dir.zone().to_owned(), kek: kek.id.clone(), schedule: schedule.clone(), keys };
    let text = toml::to_string(&record).map_err(|e| ShareError::Record(e.to_string()))?;
    Ok((text.into_bytes(), digest(schedule.as_bytes())))
}

fn aad(zone: &str, file: &str) -> String {
    format!("{zone} {file}")
}

/// Replaces directory `path`'s keys with the store's record `bytes` (made with its parents
/// when missing, mode 0700): every key file it lists written (0600), `keys.toml` last, key files it no longer
/// lists deleted; then read back as a key directory of `zone` at `now`. Returns the digest of
/// the `keys.toml` written. The caller holds the directory's lock, or is the only writer.
pub fn import(path: &Path, bytes: &[u8], kek: &Kek, zone: &str, now: At) -> Result<String, ShareError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ShareError::Record("is not UTF-8 text".into()))?;
    let record: Record = toml::from_str(text).map_err(|e| ShareError::Record(e.to_string()))?;
    if record.format != FORMAT {
        return Err(ShareError::Record(format!("format {} is not {FORMAT}: written by another version of dnsplan", record.format)));
    }
    if !record.zone.eq_ignore_ascii_case(zone) {
        return Err(ShareError::Record(format!("its keys sign {}, not {zone}", record.zone)));
    }
    if record.kek != kek.id {
        return Err(ShareError::Record(format!(
            "sealed with key-encryption key {}, and this authority's is {}: give every authority of the zone the same kek_file",
            record.kek, kek.id
        )));
    }
    crate::dnssec_keys::check_schedule(&record.schedule).map_err(|e| ShareError::Record(format!("keys.toml: {e}")))?;
    // Every key opened before anything is written: a bad record changes nothing.
    let mut opened = Vec::new();
    for key in &record.keys {
        if key.file.contains('/') || key.file.starts_with('.') || key.file.is_empty() || !key.file.ends_with(".pem") {
            return Err(ShareError::Record(format!("file {:?} is not a key file name", key.file)));
        }
        opened.push((key.file.as_str(), kek.open(&aad(&record.zone, &key.file), &key.sealed)?));
    }
    match std::fs::metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // With its parents (an added zone's `key_root`), each its owner's only.
            let mut builder = std::fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            builder.create(path).map_err(|e| dir_error(path, e.to_string()))?;
        }
        Err(e) => return Err(dir_error(path, e.to_string())),
    }
    for (file, pem) in &opened {
        if std::fs::read(path.join(file)).is_ok_and(|old| &old == pem) {
            continue;
        }
        replace(path, file, pem, true)?;
    }
    replace(path, KEYS_FILE, record.schedule.as_bytes(), false)?;
    let listed: std::collections::BTreeSet<&str> = opened.iter().map(|(f, _)| *f).collect();
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".pem") && !name.starts_with('.') && !listed.contains(name.as_ref()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    std::fs::File::open(path).and_then(|d| d.sync_all()).map_err(|e| dir_error(path, e.to_string()))?;
    KeyDir::load(path, now)?;
    Ok(digest(record.schedule.as_bytes()))
}

/// The zone a record's keys sign, without opening them (for messages).
pub fn record_zone(bytes: &[u8]) -> Option<String> {
    toml::from_str::<Record>(std::str::from_utf8(bytes).ok()?).ok().map(|r| r.zone)
}

/// The digest of the `keys.toml` a record holds (`schedule_digest`'s of a directory made from
/// it), without opening its keys.
pub fn record_digest(bytes: &[u8]) -> Option<String> {
    toml::from_str::<Record>(std::str::from_utf8(bytes).ok()?).ok().map(|r| digest(r.schedule.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dnssec::ZoneAlgorithm;
    use crate::dnssec_keys::Policy;

    const T0: u64 = 1_800_000_000;

    /// A directory written to a record and read back into another is the same directory:
    /// the same schedule and the same private keys; a record is refused with another
    /// key-encryption key, for another zone, or with one bit of a sealed key changed, and
    /// nothing is written then. No private key appears in the record.
    #[test]
    fn a_directory_goes_through_a_record_whole_and_only_with_its_key() {
        let tmp = tempfile::tempdir().expect("dir");
        let kek = Kek::create(&tmp.path().join("kek")).expect("kek");
        let source = tmp.path().join("a");
        KeyDir::init(&source, "example.test.", ZoneAlgorithm::Ed25519, None, Policy::default(), At(T0)).expect("init");
        let (record, digest_out) = export(&source, &kek, At(T0)).expect("export");
        let text = String::from_utf8(record.clone()).expect("text");
        let source_dir = KeyDir::load(&source, At(T0)).expect("load");
        for entry in source_dir.entries() {
            let pem = std::fs::read_to_string(source.join(&entry.file)).expect("pem");
            let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
            assert!(!text.contains(&body), "a private key is in the record in the clear");
        }

        let copy = tmp.path().join("b");
        let digest_in = import(&copy, &record, &kek, "example.test.", At(T0)).expect("import");
        assert_eq!(digest_in, digest_out);
        for entry in source_dir.entries() {
            assert_eq!(std::fs::read(source.join(&entry.file)).ok(), std::fs::read(copy.join(&entry.file)).ok(), "{}", entry.file);
        }
        assert_eq!(std::fs::read(source.join(KEYS_FILE)).ok(), std::fs::read(copy.join(KEYS_FILE)).ok());
        let copied = KeyDir::load(&copy, At(T0)).expect("load copy");
        assert!(copied.view(At(T0)).expect("view").same_keys(&source_dir.view(At(T0)).expect("view")));

        let other_kek = Kek::create(&tmp.path().join("kek2")).expect("kek");
        let err = import(&tmp.path().join("c"), &record, &other_kek, "example.test.", At(T0)).expect_err("another kek");
        assert!(err.to_string().contains("give every authority of the zone the same kek_file"), "{err}");
        let err = import(&tmp.path().join("c"), &record, &kek, "other.test.", At(T0)).expect_err("another zone");
        assert!(err.to_string().contains("not other.test."), "{err}");
        // One character of a sealed key changed.
        let at = text.find("sealed = \"").expect("sealed") + 20;
        let mut bad = text.into_bytes();
        bad[at] = if bad[at] == b'A' { b'B' } else { b'A' };
        let err = import(&tmp.path().join("c"), &bad, &kek, "example.test.", At(T0)).expect_err("altered");
        assert!(err.to_string().contains("altered in the store"), "{err}");
        assert!(!tmp.path().join("c").exists(), "a refused record writes nothing");
    }

    #[test]
    fn a_kek_file_others_may_read_or_not_hex_is_refused() {
        let tmp = tempfile::tempdir().expect("dir");
        let path = tmp.path().join("kek");
        let kek = Kek::create(&path).expect("kek");
        assert_eq!(Kek::load(&path).expect("load").id(), kek.id());
        assert!(Kek::create(&path).is_err(), "never over a file");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
            assert!(Kek::load(&path).expect_err("exposed").to_string().contains("chmod 600"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        std::fs::write(&path, "not hex\n").expect("write");
        assert!(Kek::load(&path).expect_err("bad").to_string().contains("64 hex digits"));
    }
}
