//! A zone's DNSSEC keys in a directory (`key_dir`), with their rollover schedule: a key-signing
//! key (KSK) whose DS is at the parent and signs the DNSKEY RRset, and zone-signing keys (ZSK)
//! that sign everything else and are rolled automatically by pre-publication (RFC 6781 §4.1.1,
//! RFC 7583 §3.2).
//!
//! The directory holds each private key in a PEM file of its own (mode 0600) and `keys.toml`:
//! the policy and, for each key, its role and the times of its life, in RFC 3339. What a zone
//! serves at a time `t` follows from the file alone (`KeyDir::view`), so authorities given the
//! same directory serve the same DNSKEY set and sign with the same keys:
//!
//! - a key is in the DNSKEY RRset from `published` until `removed`;
//! - the ZSK with the latest `active` not yet `retired` signs the zone's data (the KSK does while
//!   there is none: a directory made from a combined key);
//! - every published KSK signs the DNSKEY, CDS and CDNSKEY RRsets (a KSK roll double-signs);
//! - CDS and CDNSKEY name the KSK with the latest `active`: the one the parent should hold.
//!
//! `KeyDir::advance` is the automation: once the signing ZSK is within a DNSKEY TTL plus the
//! propagation delay of its lifetime's end, a successor is made, published at once and active
//! after that wait (every resolver's cached DNSKEY RRset then holds it); the old ZSK is retired
//! when the successor signs, and removed after the zone's longest TTL plus the propagation delay
//! (no cached signature of it is left). A KSK roll is started by the operator (`roll_ksk`) and
//! ended when the parent holds the new DS (`ds_seen`): the old KSK is removed once the parent's
//! DS TTL has passed.
//!
//! Writers (the authority that rolls, the CLI) hold an exclusive lock on `.keys.lock` and replace
//! `keys.toml` whole (written beside it, synced, renamed), so a reader never sees half a file.

use crate::dnssec::{CSK_FLAGS, ZSK_FLAGS, ZoneAlgorithm, ZoneKey, ZoneKeyError};
use hickory_proto::rr::{Name, RData};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// The schedule's file in a key directory.
pub const KEYS_FILE: &str = "keys.toml";
/// What writers of the directory lock.
const LOCK_FILE: &str = ".keys.lock";
/// Most keys one directory lists (removed ones included); the authority that rolls drops
/// entries removed more than `PRUNE_AFTER_DAYS` ago.
pub const KEYS_MAX: usize = 1_000;
/// Entries removed this long ago are dropped, with their key files, by the authority that
/// rolls: longer than two signing periods (at most 364 days each), the times the serial
/// counts.
pub const PRUNE_AFTER_DAYS: u64 = 800;
/// How long a writer waits for the directory's lock before it gives up.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A key's role in the zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyRole {
    /// Key-signing key: signs the DNSKEY RRset; its DS is at the parent.
    Ksk,
    /// Zone-signing key: signs every other RRset.
    Zsk,
}

impl KeyRole {
    pub fn flags(self) -> u16 {
        match self {
            KeyRole::Ksk => CSK_FLAGS,
            KeyRole::Zsk => ZSK_FLAGS,
        }
    }
}

/// A point in time: seconds since the epoch, written in RFC 3339 (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct At(pub u64);

impl At {
    pub fn text(self) -> String {
        let time = i64::try_from(self.0).ok().and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok());
        time.and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok()).unwrap_or_else(|| self.0.to_string())
    }

    fn parse(text: &str) -> Result<At, String> {
        let time = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .map_err(|e| format!("{text:?} is not an RFC 3339 time (2026-12-07T18:00:00Z): {e}"))?;
        u64::try_from(time.unix_timestamp()).map(At).map_err(|_| format!("{text:?} is before 1970"))
    }
}

impl Serialize for At {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text())
    }
}

impl<'de> Deserialize<'de> for At {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<At, D::Error> {
        let text = String::deserialize(deserializer)?;
        At::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// `[policy]` of `keys.toml`: how keys are rolled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// How long a ZSK signs before its successor does; 0: never rolled automatically.
    pub zsk_lifetime_days: u32,
    /// TTL of the DNSKEY, CDS and CDNSKEY RRsets.
    pub dnskey_ttl_secs: u32,
    /// How long a change takes to be served by every secondary (NOTIFY, transfer, or at
    /// worst the SOA refresh).
    pub propagation_delay_secs: u32,
    /// The longest TTL in the zone: how long a resolver may keep a signature.
    pub max_ttl_secs: u32,
    /// The TTL of the DS RRset at the parent.
    pub parent_ds_ttl_secs: u32,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            zsk_lifetime_days: 30,
            dnskey_ttl_secs: 3_600,
            propagation_delay_secs: 3_600,
            max_ttl_secs: 86_400,
            parent_ds_ttl_secs: 86_400,
        }
    }
}

impl Policy {
    /// How long after it is published a key is in every cache that holds the DNSKEY RRset.
    pub fn lead_secs(&self) -> u64 {
        u64::from(self.dnskey_ttl_secs) + u64::from(self.propagation_delay_secs)
    }

    fn check(&self) -> Result<(), String> {
        if self.zsk_lifetime_days > 3_650 {
            return Err(format!("zsk_lifetime_days: {} is above 3650", self.zsk_lifetime_days));
        }
        let lifetime = u64::from(self.zsk_lifetime_days) * 86_400;
        if self.zsk_lifetime_days > 0 && lifetime <= 2 * self.lead_secs() + u64::from(self.max_ttl_secs) {
            return Err(format!(
                "zsk_lifetime_days: {} is not longer than a roll takes (twice dnskey_ttl_secs + propagation_delay_secs, plus max_ttl_secs)",
                self.zsk_lifetime_days
            ));
        }
        for (field, value) in [
            ("dnskey_ttl_secs", self.dnskey_ttl_secs),
            ("propagation_delay_secs", self.propagation_delay_secs),
            ("max_ttl_secs", self.max_ttl_secs),
            ("parent_ds_ttl_secs", self.parent_ds_ttl_secs),
        ] {
            if value > 30 * 86_400 {
                return Err(format!("{field}: {value} is above 30 days"));
            }
        }
        Ok(())
    }
}

/// One `[[key]]` of `keys.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    /// The private key's file in the directory (a name, no path).
    pub file: String,
    pub role: KeyRole,
    pub algorithm: u8,
    pub tag: u16,
    pub created: At,
    /// In the DNSKEY RRset from then.
    pub published: At,
    /// A ZSK: signs the zone's data from then. A KSK: named by CDS and CDNSKEY from then.
    pub active: At,
    /// A ZSK: signs no more from then (its successor does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired: Option<At>,
    /// Out of the DNSKEY RRset from then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<At>,
    /// A KSK: when the operator said the parent holds its DS (`ds_seen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ds_seen: Option<At>,
    /// When the authority that rolls the keys first served it (`mark_served`), or, for a new
    /// zone's first keys, when they were made. A key signs (a ZSK), or is named by CDS (a KSK),
    /// only once it is served, and `active` is never less than this plus the lead: the wait
    /// for caches counts from when resolvers could first see the key, not from when it was
    /// written down (an authority down meanwhile, a directory copied late).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served: Option<At>,
}

impl KeyEntry {
    fn published_at(&self, t: At) -> bool {
        self.published <= t && self.removed.is_none_or(|r| t < r)
    }

    fn signs_data_at(&self, t: At) -> bool {
        self.role == KeyRole::Zsk && self.published_at(t) && self.active_at(t) && self.retired.is_none_or(|r| t < r)
    }

    /// Active (see `active`) at `t`, and served.
    fn active_at(&self, t: At) -> bool {
        self.active <= t && self.served.is_some()
    }

    /// Every time of the key's life.
    fn events(&self) -> impl Iterator<Item = At> {
        [Some(self.published), Some(self.active), self.retired, self.removed].into_iter().flatten()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    /// The zone the keys sign (lower case, with the final dot): an authority refuses the
    /// directory for another zone.
    zone: String,
    #[serde(default)]
    policy: Policy,
    #[serde(default, rename = "key")]
    keys: Vec<KeyEntry>,
}

#[derive(Debug, Error)]
pub enum KeyDirError {
    #[error("key directory {path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("key directory {path}: {KEYS_FILE}: {detail}")]
    Schedule { path: PathBuf, detail: String },
    #[error(transparent)]
    Key(#[from] ZoneKeyError),
    #[error("key directory {path}: {detail}")]
    Refused { path: PathBuf, detail: String },
}

/// The keys a zone is signed with at one time (`KeyDir::view`), or its one combined key.
#[derive(Clone, Debug)]
pub struct SigningKeys {
    /// The DNSKEY RRset: KSKs first, then ZSKs, each in the order they were made.
    pub dnskeys: Vec<Arc<ZoneKey>>,
    /// What signs the DNSKEY, CDS and CDNSKEY RRsets.
    pub ksks: Vec<Arc<ZoneKey>>,
    /// What signs everything else (one key).
    pub zsk: Vec<Arc<ZoneKey>>,
    /// The KSKs CDS and CDNSKEY name.
    pub cds: Vec<Arc<ZoneKey>>,
    /// Every time of the schedule at or before the view's, in order, each once (none for a
    /// combined key): counted in the serial, so a change of keys moves it.
    pub events: Vec<u64>,
}

impl SigningKeys {
    /// One combined key signs everything (`key_file`).
    pub fn combined(key: ZoneKey) -> SigningKeys {
        let key = Arc::new(key);
        SigningKeys { dnskeys: vec![key.clone()], ksks: vec![key.clone()], zsk: vec![key.clone()], cds: vec![key], events: Vec::new() }
    }

    /// The apex records that publish the keys: a DNSKEY each, and CDS and CDNSKEY for `cds`.
    pub fn apex_rdata(&self, origin: &Name) -> Result<Vec<RData>, ZoneKeyError> {
        let mut out: Vec<RData> =
            self.dnskeys.iter().map(|k| RData::DNSSEC(hickory_proto::dnssec::rdata::DNSSECRData::DNSKEY(k.dnskey().clone()))).collect();
        for key in &self.cds {
            out.extend(key.cds_rdata(origin)?);
        }
        Ok(out)
    }

    /// The key tags of each role, for comparing two views and for logs.
    pub fn summary(&self) -> String {
        let tags = |keys: &[Arc<ZoneKey>]| keys.iter().map(|k| k.tag().to_string()).collect::<Vec<_>>().join(",");
        format!("dnskey [{}] ksk [{}] zsk [{}] cds [{}]", tags(&self.dnskeys), tags(&self.ksks), tags(&self.zsk), tags(&self.cds))
    }

    /// Whether `other` publishes and signs with the same keys at the same point of the
    /// schedule.
    pub fn same_keys(&self, other: &SigningKeys) -> bool {
        self.summary() == other.summary() && self.events == other.events
    }

    /// How many times of the schedule are at or after `start` (seconds since the epoch).
    pub fn events_since(&self, start: u64) -> usize {
        self.events.len() - self.events.partition_point(|e| *e < start)
    }

    /// Whether the zone's data is signed by the same key in `other`.
    pub fn same_zsk(&self, other: &SigningKeys) -> bool {
        self.zsk.iter().map(|k| k.tag()).eq(other.zsk.iter().map(|k| k.tag()))
    }
}

/// Checks the text of a `keys.toml` (its fields, times and policy) without its key files.
pub fn check_schedule(text: &str) -> Result<(), String> {
    let file: KeysFile = toml::from_str(text).map_err(|e| e.to_string())?;
    file.policy.check().map_err(|e| format!("[policy] {e}"))
}

/// A key directory read (`load`), its keys loaded.
pub struct KeyDir {
    path: PathBuf,
    file: KeysFile,
    keys: Vec<(String, Arc<ZoneKey>)>,
}

/// The exclusive lock of a key directory's writers, held while this lives.
pub struct DirLock(#[allow(dead_code)] std::fs::File);

impl KeyDir {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn policy(&self) -> &Policy {
        &self.file.policy
    }

    /// The zone the keys sign, as `init` wrote it (lower case, final dot).
    pub fn zone(&self) -> &str {
        &self.file.zone
    }

    pub fn entries(&self) -> &[KeyEntry] {
        &self.file.keys
    }

    fn io(&self, error: std::io::Error) -> KeyDirError {
        KeyDirError::Io { path: self.path.clone(), error }
    }

    fn refused(&self, detail: impl Into<String>) -> KeyDirError {
        KeyDirError::Refused { path: self.path.clone(), detail: detail.into() }
    }

    /// Locks the directory at `path` for a writer (waits for another).
    pub fn lock(path: &Path) -> Result<DirLock, KeyDirError> {
        use fs2::FileExt;
        let io = |error: std::io::Error| match error.kind() {
            std::io::ErrorKind::NotFound => KeyDirError::Refused {
                path: path.to_owned(),
                detail: format!("no such directory, so no {KEYS_FILE}: make it with `dnsplan zone key init DIR --dns-zone ZONE`"),
            },
            _ => KeyDirError::Io { path: path.to_owned(), error },
        };
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path.join(LOCK_FILE)).map_err(io)?;
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        while let Err(error) = file.try_lock_exclusive() {
            if error.kind() != std::io::ErrorKind::WouldBlock && error.raw_os_error() != fs2::lock_contended_error().raw_os_error() {
                return Err(io(error));
            }
            if std::time::Instant::now() >= deadline {
                return Err(KeyDirError::Refused {
                    path: path.to_owned(),
                    detail: format!(
                        "{LOCK_FILE} is held by another process for more than {LOCK_WAIT:?} (an authority or a `dnsplan zone key` command)"
                    ),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(DirLock(file))
    }

    /// Reads `keys.toml` at `path` and loads every key not yet removed (files only their owner
    /// reads, each the algorithm and key tag the schedule says).
    pub fn load(path: &Path, now: At) -> Result<KeyDir, KeyDirError> {
        let schedule = |detail: String| KeyDirError::Schedule { path: path.to_owned(), detail };
        let text = std::fs::read_to_string(path.join(KEYS_FILE)).map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => KeyDirError::Refused {
                path: path.to_owned(),
                detail: format!("no {KEYS_FILE}: make the directory with `dnsplan zone key init DIR --dns-zone ZONE`"),
            },
            _ => KeyDirError::Io { path: path.join(KEYS_FILE), error },
        })?;
        let file: KeysFile = toml::from_str(&text).map_err(|e| schedule(e.to_string()))?;
        file.policy.check().map_err(|e| schedule(format!("[policy] {e}")))?;
        if file.keys.len() > KEYS_MAX {
            return Err(schedule(format!("{} keys, more than {KEYS_MAX}: delete removed ones", file.keys.len())));
        }
        let mut keys = Vec::new();
        for entry in &file.keys {
            if entry.file.contains('/') || entry.file.starts_with('.') || entry.file.is_empty() {
                return Err(schedule(format!("file {:?} is not a file name in the directory", entry.file)));
            }
            if entry.removed.is_some_and(|r| r <= now) {
                continue;
            }
            let key = ZoneKey::load_with(&path.join(&entry.file), entry.role.flags())?;
            if key.tag() != entry.tag || key.algorithm().number() != entry.algorithm {
                return Err(schedule(format!(
                    "{} is key tag {} algorithm {}, the schedule says tag {} algorithm {}",
                    entry.file,
                    key.tag(),
                    key.algorithm().number(),
                    entry.tag,
                    entry.algorithm
                )));
            }
            keys.push((entry.file.clone(), Arc::new(key)));
        }
        let dir = KeyDir { path: path.to_owned(), file, keys };
        dir.view(now)?;
        Ok(dir)
    }

    /// Makes the directory `path` (mode 0700; it may exist empty) with a KSK and a ZSK for a
    /// zone signed with `algorithm`. `from_key`: the KSK is that combined key (its DS stays
    /// what the parent holds), and the ZSK, published now, signs once it is in every cache;
    /// else both are new and sign now.
    pub fn init(
        path: &Path,
        zone: &str,
        algorithm: ZoneAlgorithm,
        from_key: Option<&Path>,
        policy: Policy,
        now: At,
    ) -> Result<KeyDir, KeyDirError> {
        let refused = |detail: String| KeyDirError::Refused { path: path.to_owned(), detail };
        policy.check().map_err(refused)?;
        let io = |error| KeyDirError::Io { path: path.to_owned(), error };
        match std::fs::read_dir(path) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(refused("is not empty: a key directory is made in a new or empty directory".into()));
                }
                #[cfg(unix)]
                std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(io)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut builder = std::fs::DirBuilder::new();
                #[cfg(unix)]
                std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
                builder.create(path).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
        }
        let _lock = KeyDir::lock(path)?;
        let zone = zone.to_ascii_lowercase();
        let zone = if zone.ends_with('.') { zone } else { format!("{zone}.") };
        let mut dir = KeyDir { path: path.to_owned(), file: KeysFile { zone, policy, keys: Vec::new() }, keys: Vec::new() };
        match from_key {
            Some(from) => {
                let key = ZoneKey::load_with(from, CSK_FLAGS)?;
                let pem = crate::signing::read_owner_only(from).map_err(|e| match e {
                    crate::signing::OwnerOnly::Read(error) => KeyDirError::Io { path: from.to_owned(), error },
                    crate::signing::OwnerOnly::Exposed(mode) => {
                        refused(format!("{} may be read by others (mode {mode:o})", from.display()))
                    }
                })?;
                let file = format!("ksk-{}-{}.pem", key.algorithm().number(), key.tag());
                crate::dnssec::write_private(&path.join(&file), &String::from_utf8_lossy(&pem))?;
                dir.push(file, KeyRole::Ksk, key, now, now);
                // Served already, as the zone's combined key; the ZSK is marked served by the
                // authority that rolls, when it first serves it.
                dir.file.keys[0].served = Some(now);
                let lead = dir.file.policy.lead_secs();
                dir.make(KeyRole::Zsk, algorithm_of(&dir, KeyRole::Ksk).unwrap_or(algorithm), now, At(now.0 + lead))?;
            }
            None => {
                // A new zone: no cache holds any key of it, so both sign at once.
                dir.make(KeyRole::Ksk, algorithm, now, now)?;
                dir.make(KeyRole::Zsk, algorithm, now, now)?;
                for entry in &mut dir.file.keys {
                    entry.served = Some(now);
                }
            }
        }
        dir.save()?;
        Ok(dir)
    }

    fn push(&mut self, file: String, role: KeyRole, key: ZoneKey, published: At, active: At) {
        self.file.keys.push(KeyEntry {
            file: file.clone(),
            role,
            algorithm: key.algorithm().number(),
            tag: key.tag(),
            created: published,
            published,
            active,
            retired: None,
            removed: None,
            ds_seen: None,
            served: None,
        });
        self.keys.push((file, Arc::new(key)));
    }

    /// A new key of `role`, written to the directory, published at `published`, active at
    /// `active`. Its key tag is none the directory lists (RFC 6781 §3.1.3's advice).
    fn make(&mut self, role: KeyRole, algorithm: ZoneAlgorithm, published: At, active: At) -> Result<Arc<ZoneKey>, KeyDirError> {
        for _ in 0..16 {
            let (key, pem) = ZoneKey::generate_with(algorithm, role.flags())?;
            if self.file.keys.iter().any(|e| e.tag == key.tag()) {
                continue;
            }
            let role_name = if role == KeyRole::Ksk { "ksk" } else { "zsk" };
            let file = format!("{role_name}-{}-{}.pem", algorithm.number(), key.tag());
            crate::dnssec::write_private(&self.path.join(&file), &pem)?;
            self.push(file, role, key, published, active);
            return Ok(self.keys.last().map(|(_, k)| k.clone()).expect("just pushed"));
        }
        Err(self.refused("sixteen keys made in a row had a key tag the directory lists already"))
    }

    /// Writes `keys.toml` whole: beside it, synced, renamed over it, the directory synced.
    pub fn save(&self) -> Result<(), KeyDirError> {
        use std::io::Write;
        let text = toml::to_string_pretty(&self.file).map_err(|e| self.refused(format!("{KEYS_FILE} could not be written: {e}")))?;
        let text = format!(
            "# The DNSSEC keys of this zone and their schedule (written by dnsplan; times in UTC).\n# `dnsplan zone key list DIR` shows them.\n\n{text}"
        );
        let temp = self.path.join(format!(".{KEYS_FILE}.new"));
        let mut file = std::fs::File::create(&temp).map_err(|e| self.io(e))?;
        file.write_all(text.as_bytes()).and_then(|()| file.sync_all()).map_err(|e| self.io(e))?;
        std::fs::rename(&temp, self.path.join(KEYS_FILE)).map_err(|e| self.io(e))?;
        std::fs::File::open(&self.path).and_then(|d| d.sync_all()).map_err(|e| self.io(e))
    }

    fn key(&self, file: &str) -> Option<&Arc<ZoneKey>> {
        self.keys.iter().find(|(f, _)| f == file).map(|(_, k)| k)
    }

    /// What the zone serves and signs with at `t`.
    pub fn view(&self, t: At) -> Result<SigningKeys, KeyDirError> {
        let published: Vec<&KeyEntry> = self.file.keys.iter().filter(|e| e.published_at(t)).collect();
        let keys = |entries: Vec<&KeyEntry>| -> Result<Vec<Arc<ZoneKey>>, KeyDirError> {
            entries
                .into_iter()
                .map(|e| self.key(&e.file).cloned().ok_or_else(|| self.refused(format!("{} is not loaded", e.file))))
                .collect()
        };
        let mut ordered: Vec<&KeyEntry> = published.iter().copied().filter(|e| e.role == KeyRole::Ksk).collect();
        ordered.extend(published.iter().copied().filter(|e| e.role == KeyRole::Zsk));
        let ksk_entries: Vec<&KeyEntry> = published.iter().copied().filter(|e| e.role == KeyRole::Ksk).collect();
        if ksk_entries.is_empty() {
            return Err(self.refused(format!("no KSK is published at {}: the zone cannot be signed", t.text())));
        }
        let zsk_entry = published.iter().copied().filter(|e| e.signs_data_at(t)).max_by_key(|e| e.active);
        let cds_entry = ksk_entries.iter().copied().filter(|e| e.active_at(t)).max_by_key(|e| e.active).unwrap_or(ksk_entries[0]);
        // No ZSK signing: the KSK signs everything (a directory made from a combined key).
        let data_signer = zsk_entry.unwrap_or(cds_entry);
        let mut events: Vec<u64> = self.file.keys.iter().flat_map(KeyEntry::events).filter(|e| *e <= t).map(|e| e.0).collect();
        events.sort_unstable();
        events.dedup();
        Ok(SigningKeys {
            dnskeys: keys(ordered)?,
            ksks: keys(ksk_entries)?,
            zsk: keys(vec![data_signer])?,
            cds: keys(vec![cds_entry])?,
            events,
        })
    }

    /// The next time of the schedule after `t`, if any (for `list`).
    pub fn next_event(&self, t: At) -> Option<At> {
        self.file.keys.iter().flat_map(KeyEntry::events).filter(|e| *e > t).min()
    }

    /// The ZSK signing at `t`, its index.
    fn signing_zsk(&self, t: At) -> Option<usize> {
        self.file.keys.iter().enumerate().filter(|(_, e)| e.signs_data_at(t)).max_by_key(|(_, e)| e.active).map(|(i, _)| i)
    }

    /// A ZSK made after the one signing at `t`, not yet active (or not yet served): a roll
    /// under way.
    fn zsk_successor(&self, t: At) -> Option<usize> {
        let current = self.signing_zsk(t).map(|i| self.file.keys[i].active);
        self.file.keys.iter().position(|e| {
            e.role == KeyRole::Zsk && (e.active > t || e.served.is_none()) && e.removed.is_none() && current.is_none_or(|c| e.active > c)
        })
    }

    /// Marks every key published by `now` and not yet served as served now: the authority
    /// that rolls calls this before it serves what it read. A key's activation is moved to
    /// at least a lead (`Policy::lead_secs`) after, and a ZSK's predecessor retires then and
    /// is removed a longest TTL plus the propagation delay later. Returns whether anything
    /// changed.
    pub fn mark_served(&mut self, now: At) -> bool {
        let policy = self.file.policy.clone();
        let lead = policy.lead_secs();
        let mut changed = false;
        for i in 0..self.file.keys.len() {
            let entry = &self.file.keys[i];
            if entry.served.is_some() || entry.published > now || entry.removed.is_some_and(|r| r <= now) {
                continue;
            }
            let (role, was) = (entry.role, entry.active);
            let active = At(was.0.max(now.0 + lead));
            self.file.keys[i].served = Some(now);
            self.file.keys[i].active = active;
            changed = true;
            if role == KeyRole::Zsk && active != was {
                for old in self.file.keys.iter_mut().filter(|e| e.role == KeyRole::Zsk && e.retired == Some(was)) {
                    old.retired = Some(active);
                    old.removed = Some(At(active.0 + u64::from(policy.max_ttl_secs) + u64::from(policy.propagation_delay_secs)));
                }
            }
        }
        changed
    }

    /// Drops the entries removed more than `PRUNE_AFTER_DAYS` before `now`, and their key
    /// files. Returns whether any was dropped.
    pub fn prune(&mut self, now: At) -> bool {
        let before = self.file.keys.len();
        let cutoff = now.0.saturating_sub(PRUNE_AFTER_DAYS * 86_400);
        let (gone, kept): (Vec<KeyEntry>, Vec<KeyEntry>) =
            std::mem::take(&mut self.file.keys).into_iter().partition(|e| e.removed.is_some_and(|r| r.0 < cutoff));
        self.file.keys = kept;
        for entry in &gone {
            let _ = std::fs::remove_file(self.path.join(&entry.file));
        }
        self.file.keys.len() != before
    }

    /// The automatic ZSK roll: a successor made when the signing ZSK's lifetime ends within
    /// the lead (`Policy::lead_secs`). Returns what it did, for the log; `save` it.
    pub fn advance(&mut self, now: At) -> Result<Option<String>, KeyDirError> {
        let lifetime = u64::from(self.file.policy.zsk_lifetime_days) * 86_400;
        if lifetime == 0 || self.zsk_successor(now).is_some() {
            return Ok(None);
        }
        let Some(current) = self.signing_zsk(now) else { return Ok(None) };
        let ends = self.file.keys[current].active.0 + lifetime;
        if now.0 + self.file.policy.lead_secs() < ends {
            return Ok(None);
        }
        self.roll(current, now, At(ends.max(now.0 + self.file.policy.lead_secs()))).map(Some)
    }

    /// Rolls the signing ZSK now (the successor signs after the lead). Refused while a roll
    /// is under way.
    pub fn roll_zsk(&mut self, now: At) -> Result<String, KeyDirError> {
        if let Some(next) = self.zsk_successor(now) {
            let e = &self.file.keys[next];
            return Err(self.refused(format!("a ZSK roll is under way: key {} signs from {}", e.tag, e.active.text())));
        }
        let Some(current) = self.signing_zsk(now) else {
            // A directory whose KSK signs everything: a first ZSK, pre-published.
            let algorithm = algorithm_of(self, KeyRole::Ksk).ok_or_else(|| self.refused("no key to take the algorithm from"))?;
            let lead = self.file.policy.lead_secs();
            let key = self.make(KeyRole::Zsk, algorithm, now, At(now.0 + lead))?;
            return Ok(format!("ZSK {} published; it signs from {}", key.tag(), At(now.0 + lead).text()));
        };
        let active = At(now.0 + self.file.policy.lead_secs());
        self.roll(current, now, active)
    }

    fn roll(&mut self, current: usize, now: At, active: At) -> Result<String, KeyDirError> {
        let algorithm = ZoneAlgorithm::parse(&self.file.keys[current].algorithm.to_string()).map_err(|e| self.refused(e))?;
        let key = self.make(KeyRole::Zsk, algorithm, now, active)?;
        let policy = &self.file.policy;
        let removed = At(active.0 + u64::from(policy.max_ttl_secs) + u64::from(policy.propagation_delay_secs));
        let old = &mut self.file.keys[current];
        old.retired = Some(active);
        old.removed = Some(removed);
        Ok(format!(
            "ZSK {} published; it signs from {}, when ZSK {} retires (removed at {})",
            key.tag(),
            active.text(),
            old.tag,
            removed.text()
        ))
    }

    /// Starts a KSK roll (double signature): a new KSK published and signing the DNSKEY RRset
    /// now, named by CDS and CDNSKEY once it is in every cache. Refused while one is under way.
    pub fn roll_ksk(&mut self, now: At) -> Result<String, KeyDirError> {
        let live: Vec<&KeyEntry> = self.file.keys.iter().filter(|e| e.role == KeyRole::Ksk && e.removed.is_none()).collect();
        if live.len() > 1 {
            return Err(self.refused(format!(
                "a KSK roll is under way (keys {}): end it with `dnsplan zone key ds-seen` once the parent holds the new DS",
                live.iter().map(|e| e.tag.to_string()).collect::<Vec<_>>().join(", ")
            )));
        }
        let algorithm = algorithm_of(self, KeyRole::Ksk).ok_or_else(|| self.refused("no KSK to roll"))?;
        let active = At(now.0 + self.file.policy.lead_secs());
        let key = self.make(KeyRole::Ksk, algorithm, now, active)?;
        Ok(format!(
            "KSK {} published and signing the DNSKEY RRset; from {} CDS and CDNSKEY name it: give the parent its DS then, and run `dnsplan zone key ds-seen` once the parent serves it",
            key.tag(),
            active.text()
        ))
    }

    /// Ends a KSK roll once the parent serves the new KSK's DS: the older KSKs are removed
    /// after the parent's DS TTL plus the propagation delay. Returns the new KSK's tag and what
    /// was done.
    pub fn ds_seen(&mut self, now: At) -> Result<(u16, String), KeyDirError> {
        let live: Vec<usize> =
            (0..self.file.keys.len()).filter(|&i| self.file.keys[i].role == KeyRole::Ksk && self.file.keys[i].removed.is_none()).collect();
        let Some(&newest) = live.iter().max_by_key(|&&i| self.file.keys[i].active) else { return Err(self.refused("no KSK")) };
        if live.len() < 2 {
            return Err(self.refused("no KSK roll is under way (`dnsplan zone key roll --ksk` starts one)"));
        }
        let new = &self.file.keys[newest];
        if !new.active_at(now) {
            return Err(self.refused(format!(
                "KSK {} is named by CDS only from {}: its DS cannot be at the parent before every resolver has the key",
                new.tag,
                new.active.text()
            )));
        }
        let tag = new.tag;
        let policy = &self.file.policy;
        let removed = At(now.0 + u64::from(policy.parent_ds_ttl_secs) + u64::from(policy.propagation_delay_secs));
        self.file.keys[newest].ds_seen = Some(now);
        let mut old = Vec::new();
        for &i in &live {
            if i != newest {
                self.file.keys[i].removed = Some(removed);
                old.push(self.file.keys[i].tag.to_string());
            }
        }
        Ok((tag, format!("KSK {} removed at {} (the parent's DS TTL and the propagation delay from now)", old.join(", "), removed.text())))
    }
}

/// The algorithm of the directory's newest key of `role`.
fn algorithm_of(dir: &KeyDir, role: KeyRole) -> Option<ZoneAlgorithm> {
    let entry = dir.file.keys.iter().filter(|e| e.role == role).max_by_key(|e| e.created)?;
    ZoneAlgorithm::parse(&entry.algorithm.to_string()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;
    const T0: u64 = 1_800_000_000;

    fn tags(keys: &[Arc<ZoneKey>]) -> Vec<u16> {
        keys.iter().map(|k| k.tag()).collect()
    }

    /// The pre-publication rules (RFC 7583 §3.2), checked at every hour of a year of automatic
    /// ZSK rolls: a key signs only after it has been published for a DNSKEY TTL plus the
    /// propagation delay (every cached DNSKEY RRset has it), and a key that signed stays
    /// published for the longest TTL plus the propagation delay after (no cached signature
    /// outlives it). The file read back gives the same views.
    #[test]
    fn automatic_zsk_rolls_keep_every_cache_able_to_validate() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("keys");
        let policy = Policy::default();
        let mut keys = KeyDir::init(&path, "example.test.", ZoneAlgorithm::Ed25519, None, policy.clone(), At(T0)).expect("init");
        let mut signed_by: std::collections::BTreeMap<u16, (u64, u64)> = Default::default();
        let mut published_since: std::collections::BTreeMap<u16, u64> = Default::default();
        let mut rolls = 0;
        let mut t = T0;
        while t < T0 + 365 * DAY {
            if keys.advance(At(t)).expect("advance").is_some() {
                rolls += 1;
                assert!(keys.mark_served(At(t)), "the successor is served from now");
                keys.save().expect("save");
                keys = KeyDir::load(&path, At(t)).expect("load");
            }
            let view = keys.view(At(t)).expect("view");
            for k in &view.dnskeys {
                published_since.entry(k.tag()).or_insert(t);
            }
            let zsk = view.zsk[0].tag();
            let since = published_since[&zsk];
            assert!(
                zsk == keys.entries()[1].tag || t - since >= policy.lead_secs(),
                "ZSK {zsk} signs {}s after it was published",
                t - since
            );
            signed_by.entry(zsk).or_insert((t, t)).1 = t;
            for (tag, (_, last)) in &signed_by {
                if t - last < u64::from(policy.max_ttl_secs) + u64::from(policy.propagation_delay_secs) {
                    assert!(tags(&view.dnskeys).contains(tag), "ZSK {tag} removed {}s after it last signed", t - last);
                }
            }
            assert_eq!(view.dnskeys.len(), view.ksks.len() + view.dnskeys.iter().filter(|k| k.flags() == ZSK_FLAGS).count());
            assert!(view.dnskeys.len() <= 3, "at most the KSK and two ZSKs: {}", view.summary());
            t += 3_600;
        }
        assert_eq!(rolls, 12, "a 30-day lifetime rolls twelve times in a year");
    }

    /// A KSK roll: the new KSK signs the DNSKEY RRset at once beside the old, CDS names it only
    /// after the lead, `ds-seen` is refused before that, and the old KSK goes after the
    /// parent's DS TTL.
    #[test]
    fn a_ksk_roll_double_signs_then_moves_cds_then_removes_the_old_key() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("keys");
        let policy = Policy::default();
        let mut keys = KeyDir::init(&path, "example.test.", ZoneAlgorithm::EcdsaP256Sha256, None, policy.clone(), At(T0)).expect("init");
        let old = keys.view(At(T0)).expect("view").ksks[0].tag();
        keys.roll_ksk(At(T0 + 10)).expect("roll");
        assert!(keys.roll_ksk(At(T0 + 20)).is_err(), "one KSK roll at a time");
        assert!(keys.mark_served(At(T0 + 10)), "served by the authority that rolls");
        let during = keys.view(At(T0 + 20)).expect("view");
        assert_eq!(during.ksks.len(), 2, "both KSKs sign the DNSKEY RRset: {}", during.summary());
        assert_eq!(tags(&during.cds), vec![old], "CDS still names the old KSK");
        assert!(keys.ds_seen(At(T0 + 20)).is_err(), "the new DS cannot be at the parent yet");
        let ready = T0 + 10 + policy.lead_secs();
        let new = keys.view(At(ready)).expect("view").cds[0].tag();
        assert_ne!(new, old, "CDS names the new KSK after the lead");
        let (seen, _) = keys.ds_seen(At(ready + 100)).expect("ds seen");
        assert_eq!(seen, new);
        keys.save().expect("save");
        let keys = KeyDir::load(&path, At(ready + 100)).expect("load");
        let gone = ready + 100 + u64::from(policy.parent_ds_ttl_secs) + u64::from(policy.propagation_delay_secs);
        assert_eq!(keys.view(At(gone - 1)).expect("view").ksks.len(), 2);
        assert_eq!(tags(&keys.view(At(gone)).expect("view").ksks), vec![new], "the old KSK is removed");
        let after = KeyDir::load(&path, At(gone)).expect("a removed key's file is not needed");
        assert_eq!(after.view(At(gone)).expect("view").dnskeys.len(), 2);
    }

    /// A directory made from a combined key keeps its DS (same tag), and the KSK signs
    /// everything until the new ZSK has been published for the lead.
    #[test]
    fn a_directory_from_a_combined_key_keeps_its_ds_and_pre_publishes_the_zsk() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("zone.key");
        let combined = ZoneKey::create(&file, ZoneAlgorithm::EcdsaP256Sha256).expect("key");
        let path = dir.path().join("keys");
        let policy = Policy::default();
        let keys = KeyDir::init(&path, "example.test.", ZoneAlgorithm::Ed25519, Some(&file), policy.clone(), At(T0)).expect("init");
        let mut keys = keys;
        let at_once = keys.view(At(T0)).expect("view");
        assert_eq!(tags(&at_once.cds), vec![combined.tag()], "the DS at the parent still matches");
        // Not served until the authority that rolls serves it: even past the lead, it does not
        // sign (the authority was down, say, when the directory was made).
        assert_eq!(tags(&keys.view(At(T0 + 3 * 3_600)).expect("view").zsk), vec![combined.tag()], "never served, never signing");
        let served = T0 + 3 * 3_600;
        assert!(keys.roll_zsk(At(served)).is_err(), "a ZSK waiting to be served is a roll under way");
        assert!(keys.mark_served(At(served)));
        assert_eq!(
            tags(&keys.view(At(served + policy.lead_secs() - 1)).expect("view").zsk),
            vec![combined.tag()],
            "the lead counts from then"
        );
        assert_eq!(tags(&at_once.zsk), vec![combined.tag()], "the old key signs until the ZSK is in every cache");
        assert_eq!(at_once.dnskeys.len(), 2, "the ZSK is published at once");
        let later = keys.view(At(served + policy.lead_secs())).expect("view");
        assert_ne!(tags(&later.zsk), vec![combined.tag()]);
        assert_eq!(later.zsk[0].algorithm(), ZoneAlgorithm::EcdsaP256Sha256, "the ZSK has the KSK's algorithm");
        assert!(
            KeyDir::init(&path, "example.test.", ZoneAlgorithm::Ed25519, None, policy, At(T0)).is_err(),
            "never over a directory in use"
        );
    }

    #[test]
    fn bad_schedules_are_refused_with_their_reason() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("keys");
        KeyDir::init(&path, "example.test.", ZoneAlgorithm::Ed25519, None, Policy::default(), At(T0)).expect("init");
        let text = std::fs::read_to_string(path.join(KEYS_FILE)).expect("read");
        let first_tag = text.lines().find(|l| l.starts_with("tag = ")).expect("a tag line").to_owned();
        let other_tag = if first_tag == "tag = 7" { "tag = 8" } else { "tag = 7" };
        for (from, to, says) in [
            (first_tag.as_str(), other_tag, "the schedule says tag"),
            ("zsk_lifetime_days = 30", "zsk_lifetime_days = 1", "not longer than a roll"),
            ("published = \"", "published = \"yesterday", "RFC 3339"),
            ("file = \"", "file = \"../", "not a file name"),
        ] {
            let bad = text.replacen(from, to, 1);
            std::fs::write(path.join(KEYS_FILE), &bad).expect("write");
            let err = KeyDir::load(&path, At(T0)).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(says), "{from:?} -> {to:?}: {err}");
        }
    }
}
