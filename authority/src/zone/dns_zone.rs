//! The static part of the managed DNS zone: origin, SOA, NS and any static records, from the
//! config file and optionally an RFC 1035 master file. Managed endpoints come from the store
//! and are merged in by `snapshot`. NS records below the apex are refused: delegations (a
//! referral instead of an answer) are not built.

use crate::zone::zone_text;
use dnsplan_common::dnssec_keys::{At, KeyDir, Policy, SigningKeys};
use hickory_proto::rr::rdata::{NS, SOA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::txt::Parser;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The `[dns_zone]` table of the authority's config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsZoneConfig {
    /// The DNS zone's origin, e.g. `example.test.`.
    pub origin: String,
    /// SOA fields; required unless `master_file` holds the SOA.
    pub soa: Option<SoaConfig>,
    /// Name servers at the apex; required unless `master_file` holds NS records.
    #[serde(default)]
    pub ns: Vec<String>,
    #[serde(default = "default_ns_ttl")]
    pub ns_ttl_secs: u32,
    /// An RFC 1035 master file with static records (relative paths are relative to the config
    /// file). `$ORIGIN` defaults to `origin`.
    pub master_file: Option<PathBuf>,
    /// The same records written in the config itself, as master-file text (a config that
    /// carries its whole zone, as `dnsplan up`'s built-in one does); not with `master_file`.
    #[serde(default)]
    pub records: Option<String>,
    /// Signs the zone (DNSSEC), with the key in this table's `key_file`.
    #[serde(default)]
    pub dnssec: Option<DnssecConfig>,
}

/// The `[dns_zone.dnssec]` table: the zone is served signed.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnssecConfig {
    /// The zone's one combined key (signs everything, never rolled), PEM PKCS#8 (ECDSA P-256
    /// or Ed25519, as `dnsplan zone key new` writes it), readable by its owner only; relative
    /// to the config file. Not with `key_dir`.
    pub key_file: Option<PathBuf>,
    /// The zone's key directory (`dnsplan zone key init`): a KSK and ZSKs with their schedule,
    /// the ZSK rolled automatically. Not with `key_file`.
    pub key_dir: Option<PathBuf>,
    /// With `key_dir`: this authority makes the ZSK rolls the schedule calls for (writing the
    /// directory). `false` on an authority that serves a copy of another's directory.
    #[serde(default = "default_rolls_keys")]
    pub rolls_keys: bool,
    /// With `key_dir`: how often the directory is read again (its schedule followed, a roll
    /// made by `dnsplan zone key roll` taken).
    #[serde(default = "default_key_check")]
    pub key_check_secs: u32,
    /// With `key_dir`, on the zone the store manages: the directory is shared through the
    /// store, its private keys sealed with this key-encryption key (`dnsplan zone key kek
    /// FILE`; the same file on every authority of the zone, readable by its owner only;
    /// relative to the config file). Any authority may roll; a missing directory is made
    /// from the store's keys at start.
    pub kek_file: Option<PathBuf>,
    /// How long a signature is valid from when it is made.
    #[serde(default = "default_signature_validity")]
    pub signature_validity_days: u32,
    /// Signatures with less than this left are made again, the zone changed or not.
    #[serde(default = "default_signature_refresh")]
    pub signature_refresh_days: u32,
    /// TTL of the DNSKEY, CDS and CDNSKEY records at the apex, with `key_file` (default 3600);
    /// a key directory's is its policy's.
    pub dnskey_ttl_secs: Option<u32>,
}

impl DnssecConfig {
    /// Signed with the one combined key at `key_file`, every other field its default.
    pub fn with_key_file(key_file: impl Into<PathBuf>) -> DnssecConfig {
        DnssecConfig {
            key_file: Some(key_file.into()),
            key_dir: None,
            rolls_keys: default_rolls_keys(),
            key_check_secs: default_key_check(),
            kek_file: None,
            signature_validity_days: default_signature_validity(),
            signature_refresh_days: default_signature_refresh(),
            dnskey_ttl_secs: None,
        }
    }
}

fn default_rolls_keys() -> bool {
    true
}
fn default_key_check() -> u32 {
    30
}
fn default_signature_validity() -> u32 {
    14
}
fn default_signature_refresh() -> u32 {
    7
}
/// The DNSKEY TTL of a zone signed with `key_file`.
const DNSKEY_TTL_SECS: u32 = 3_600;

/// Where a signed zone's keys come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// `key_file`: one combined key.
    File,
    /// `key_dir`, read again every `check_secs`; `rolls`: this authority makes the rolls.
    Dir { path: PathBuf, rolls: bool, check_secs: u32 },
}

/// A signed zone's keys at one time and how long its signatures last.
#[derive(Debug)]
pub struct ZoneSigner {
    pub keys: SigningKeys,
    pub source: KeySource,
    pub validity_secs: u32,
    pub refresh_secs: u32,
    pub dnskey_ttl_secs: u32,
}

impl ZoneSigner {
    /// Signatures are made again whole at each multiple of this (seconds since the epoch):
    /// validity minus refresh (`Snapshot::resign_due`).
    pub fn period_secs(&self) -> u32 {
        self.validity_secs - self.refresh_secs
    }

    /// How often its key directory is read again; `None` with a key file.
    pub fn key_check(&self) -> Option<std::time::Duration> {
        match self.source {
            KeySource::Dir { check_secs, .. } => Some(std::time::Duration::from_secs(u64::from(check_secs))),
            KeySource::File => None,
        }
    }

    /// This signer with `keys` (read from its directory again).
    pub fn with_keys(&self, keys: SigningKeys, dnskey_ttl_secs: u32) -> ZoneSigner {
        ZoneSigner {
            keys,
            source: self.source.clone(),
            validity_secs: self.validity_secs,
            refresh_secs: self.refresh_secs,
            dnskey_ttl_secs,
        }
    }

    /// The keys of `dir` at `now`, after the rolls the schedule calls for when this authority
    /// makes them (the directory locked while it is read and written): keys it serves for the
    /// first time marked served (`KeyDir::mark_served`), entries removed long ago dropped, the
    /// automatic ZSK roll made. Blocking: file I/O.
    pub fn read_dir(path: &Path, origin: &Name, rolls: bool, now: u32) -> Result<(SigningKeys, Policy), String> {
        let _lock = if rolls { Some(KeyDir::lock(path).map_err(|e| e.to_string())?) } else { None };
        ZoneSigner::read_dir_locked(path, origin, rolls, now)
    }

    /// `read_dir` with the directory locked by the caller when `rolls`.
    pub fn read_dir_locked(path: &Path, origin: &Name, rolls: bool, now: u32) -> Result<(SigningKeys, Policy), String> {
        let now = At(u64::from(now));
        let mut dir = KeyDir::load(path, now).map_err(|e| e.to_string())?;
        if !dir.zone().eq_ignore_ascii_case(&origin.to_ascii()) {
            return Err(format!("key directory {}: its keys sign {}, not {origin}", path.display(), dir.zone()));
        }
        if rolls {
            // What this authority is about to serve for the first time counts as served now:
            // its wait for caches starts here, whenever the schedule was written.
            let mut changed = dir.mark_served(now) | dir.prune(now);
            if let Some(done) = dir.advance(now).map_err(|e| e.to_string())? {
                tracing::info!(key_dir = %path.display(), "{done}");
                dir.mark_served(now);
                changed = true;
            }
            if changed {
                dir.save().map_err(|e| e.to_string())?;
            }
        }
        Ok((dir.view(now).map_err(|e| e.to_string())?, dir.policy().clone()))
    }
}

fn default_ns_ttl() -> u32 {
    3_600
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoaConfig {
    pub mname: String,
    /// The responsible person's mailbox in DNS form, e.g. `hostmaster.example.test.`.
    pub rname: String,
    #[serde(default = "default_soa_ttl")]
    pub ttl_secs: u32,
    #[serde(default = "default_refresh")]
    pub refresh_secs: i32,
    #[serde(default = "default_retry")]
    pub retry_secs: i32,
    #[serde(default = "default_expire")]
    pub expire_secs: i32,
    /// Negative-caching TTL (RFC 2308). Short, because health-steered names change.
    #[serde(default = "default_minimum")]
    pub minimum_secs: u32,
    /// Added (mod 2^32) to the store's applied-change count to make the SOA serial. 0 unless
    /// the store was replaced by an empty one while secondaries hold a higher serial: then
    /// set it to their serial + 1, so the new serials are newer to them (RFC 1982).
    #[serde(default)]
    pub serial_base: u32,
}

fn default_soa_ttl() -> u32 {
    300
}
fn default_refresh() -> i32 {
    3_600
}
fn default_retry() -> i32 {
    600
}
fn default_expire() -> i32 {
    604_800
}
fn default_minimum() -> u32 {
    30
}

#[derive(Debug, Error)]
pub enum DnsZoneError {
    #[error("dns_zone.{field}: {value:?} is not a valid DNS name: {detail}")]
    BadName { field: &'static str, value: String, detail: String },
    #[error("dns_zone: no SOA; set [dns_zone.soa] or put an SOA in the master file")]
    NoSoa,
    #[error("dns_zone: the SOA is set both in [dns_zone.soa] and in the master file; keep one")]
    TwoSoas,
    #[error("dns_zone: no NS records; set dns_zone.ns or put NS records at the apex of the master file")]
    NoNs,
    #[error("dns_zone: set master_file or records, not both")]
    TwoSources,
    #[error("dns_zone.master_file {path}: cannot read it")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("dns_zone.master_file {path}: {detail}")]
    Parse { path: PathBuf, detail: String },
    #[error("dns_zone.master_file {path}: record {name} is outside the DNS zone {origin}")]
    Outside { path: PathBuf, name: String, origin: String },
    #[error(
        "dns_zone.master_file {path}: {name} is a wildcard with NS records; a wildcard cannot delegate (RFC 4592 §4.2): \
         delegate the names themselves"
    )]
    WildcardDelegation { path: PathBuf, name: String },
    #[error(
        "dns_zone.master_file {path}: {name} has a DS record but no NS records: a DS belongs at a delegation (RFC 4035 §2.4); \
         add the delegation's NS records or drop the DS"
    )]
    DsWithoutDelegation { path: PathBuf, name: String },
    #[error(
        "dns_zone.master_file {path}: {name} has NS records (a delegation) and a CNAME; a name with a CNAME has no other \
         data (RFC 1034 §3.6.2): keep one"
    )]
    CnameAtDelegation { path: PathBuf, name: String },
    #[error(
        "dns_zone.master_file {path}, line {line}: the escape \\{digits} is not supported: only decimal escapes of printable \
         ASCII (\\032 to \\126) are taken; write the character itself or drop it"
    )]
    Escape { path: PathBuf, line: usize, digits: String },
    #[error("dns_zone.master_file {path}, line {line}: {detail}")]
    Record { path: PathBuf, line: usize, detail: String },
    #[error("dns_zone.dnssec: {0}")]
    Dnssec(String),
}

/// The static records of the DNS zone, checked and ready to serve.
#[derive(Clone, Debug)]
pub struct StaticZone {
    pub origin: Name,
    /// The SOA with serial 0; the served serial comes from the store's change counter.
    pub soa: SOA,
    /// The serial of content-change count 0: `dns_zone.soa.serial_base`, or the master file's
    /// SOA serial. The served serial is `serial_base + content_changes` mod 2^32.
    pub serial_base: u32,
    pub soa_ttl_secs: u32,
    pub ns: Vec<Record>,
    /// Every other static record (not SOA, not apex NS), class IN: delegations' NS and DS
    /// records, glue and wildcards included.
    pub records: Vec<Record>,
    /// The delegation points below the apex (names with NS records).
    pub cuts: BTreeSet<Name>,
    /// The owners of static CNAME records.
    pub aliases: BTreeSet<Name>,
    /// Whether any owner is a wildcard (`*.x`).
    pub wildcards: bool,
    /// The key the zone is signed with (`[dns_zone.dnssec]`); its DNSKEY, CDS and CDNSKEY are
    /// among `records`.
    pub signer: Option<std::sync::Arc<ZoneSigner>>,
}

fn parse_name(field: &'static str, value: &str) -> Result<Name, DnsZoneError> {
    let mut name = Name::from_ascii(value).map_err(|e| DnsZoneError::BadName { field, value: value.into(), detail: e.to_string() })?;
    name.set_fqdn(true);
    Ok(name.to_lowercase())
}

impl StaticZone {
    /// Builds the static zone; `config_dir` resolves a relative `master_file`.
    pub fn load(config: &DnsZoneConfig, config_dir: &Path) -> Result<StaticZone, DnsZoneError> {
        let origin = parse_name("origin", &config.origin)?;
        let mut soa = None;
        let mut soa_ttl = 0;
        let mut ns = Vec::new();
        let mut records = Vec::new();
        let source = match (&config.master_file, &config.records) {
            (Some(_), Some(_)) => return Err(DnsZoneError::TwoSources),
            (Some(file), None) => {
                let path = config_dir.join(file);
                let text = std::fs::read_to_string(&path).map_err(|source| DnsZoneError::Read { path: path.clone(), source })?;
                Some((path, text))
            }
            // Errors name it as a path would be named.
            (None, Some(text)) => Some((PathBuf::from("(dns_zone.records)"), text.clone())),
            (None, None) => None,
        };
        let source_path = source.as_ref().map(|(path, _)| path.clone());
        if let Some((path, text)) = source {
            let text =
                zone_text::decimal_escapes(&text).map_err(|(line, digits)| DnsZoneError::Escape { path: path.clone(), line, digits })?;
            let rewritten = zone_text::records_it_cannot_read(&text, &origin).map_err(|(line, detail)| DnsZoneError::Record {
                path: path.clone(),
                line,
                detail,
            })?;
            let (_, sets) = Parser::new(rewritten.text.as_ref(), Some(path.clone()), Some(origin.clone()))
                .parse()
                .map_err(|e| DnsZoneError::Parse { path: path.clone(), detail: e.to_string() })?;
            for set in sets.values() {
                for record in set.records_without_rrsigs() {
                    let name = record.name.to_lowercase();
                    if !origin.zone_of(&name) {
                        return Err(DnsZoneError::Outside { path, name: name.to_string(), origin: origin.to_string() });
                    }
                    if record.dns_class != DNSClass::IN {
                        continue;
                    }
                    let mut record = record.clone();
                    record.name = name.clone();
                    if let Some(data) = rewritten.replacement(&record.data) {
                        record.data = data.clone();
                    }
                    complete_relative_targets(&mut record.data, &origin);
                    match &record.data {
                        RData::SOA(s) if name == origin => {
                            soa = Some(s.clone());
                            soa_ttl = record.ttl;
                        }
                        RData::NS(_) if name == origin => ns.push(record),
                        RData::NS(_) if name.is_wildcard() => {
                            return Err(DnsZoneError::WildcardDelegation { path, name: name.to_string() });
                        }
                        _ => records.push(record),
                    }
                }
            }
        }
        let (cuts, wildcards) = match &source_path {
            Some(path) => delegations(&records, path)?,
            None => (BTreeSet::new(), false),
        };
        let aliases = records.iter().filter(|r| r.record_type() == RecordType::CNAME).map(|r| r.name.clone()).collect();
        let (soa, serial_base) = match (&config.soa, soa) {
            (Some(_), Some(_)) => return Err(DnsZoneError::TwoSoas),
            (None, None) => return Err(DnsZoneError::NoSoa),
            (None, Some(s)) => (SOA::new(s.mname, s.rname, 0, s.refresh, s.retry, s.expire, s.minimum), s.serial),
            (Some(c), None) => {
                soa_ttl = c.ttl_secs;
                let soa = SOA::new(
                    parse_name("soa.mname", &c.mname)?,
                    parse_name("soa.rname", &c.rname)?,
                    0,
                    c.refresh_secs,
                    c.retry_secs,
                    c.expire_secs,
                    c.minimum_secs,
                );
                (soa, c.serial_base)
            }
        };
        for n in &config.ns {
            ns.push(Record::from_rdata(origin.clone(), config.ns_ttl_secs, RData::NS(NS(parse_name("ns", n)?))));
        }
        if ns.is_empty() {
            return Err(DnsZoneError::NoNs);
        }
        let mut zone = StaticZone { origin, soa, serial_base, soa_ttl_secs: soa_ttl, ns, records, cuts, aliases, wildcards, signer: None };
        if let Some(dnssec) = &config.dnssec {
            zone.sign_with(dnssec, config_dir)?;
        }
        Ok(zone)
    }

    /// Signs this (unsigned) zone with the keys `dnssec` names (relative to `config_dir`): its
    /// signer set, the apex's DNSKEY, CDS and CDNSKEY records added. Refused when a record's
    /// TTL is above a key directory's `max_ttl_secs`.
    pub fn sign_with(&mut self, dnssec: &DnssecConfig, config_dir: &Path) -> Result<(), DnsZoneError> {
        // The master file has no DNSKEY, CDS or CDNSKEY of its own: `zone_text` refuses every
        // DNSSEC type.
        let (signer, max_ttl) = load_signer(dnssec, config_dir, &self.origin)?;
        // A ZSK is removed the policy's longest TTL after it stops signing: a record cached
        // longer would outlive its key.
        let longest = self
            .ns
            .iter()
            .chain(&self.records)
            .map(|r| (r.ttl, r.name.clone()))
            .chain([(self.soa_ttl_secs, self.origin.clone())])
            .max_by_key(|(ttl, _)| *ttl);
        if let (Some((max, file)), Some((ttl, name))) = (max_ttl, longest)
            && ttl > max
        {
            return Err(DnsZoneError::Dnssec(format!(
                "{name} has a TTL of {ttl} s, above max_ttl_secs ({max}) in {}'s [policy]: a removed ZSK's signatures could outlive it in caches; raise max_ttl_secs, or lower the TTL",
                file.display()
            )));
        }
        let apex = signer.keys.apex_rdata(&self.origin).map_err(|e| DnsZoneError::Dnssec(e.to_string()))?;
        self.records.extend(apex.into_iter().map(|data| Record::from_rdata(self.origin.clone(), signer.dnskey_ttl_secs, data)));
        self.signer = Some(std::sync::Arc::new(signer));
        Ok(())
    }

    /// The zone of these parts, as `load` makes it from a config and a master file (the
    /// delegation points, CNAME owners and wildcards worked out again): for a zone read back
    /// from the zones' image on disk. `path` names the image in errors.
    pub fn from_parts(
        origin: Name,
        soa: SOA,
        serial_base: u32,
        soa_ttl_secs: u32,
        ns: Vec<Record>,
        records: Vec<Record>,
        path: &Path,
    ) -> Result<StaticZone, DnsZoneError> {
        let (cuts, wildcards) = delegations(&records, path)?;
        let aliases = records.iter().filter(|r| r.record_type() == RecordType::CNAME).map(|r| r.name.clone()).collect();
        Ok(StaticZone { origin, soa, serial_base, soa_ttl_secs, ns, records, cuts, aliases, wildcards, signer: None })
    }

    /// This zone without its static records (`records`), for a snapshot already built from
    /// them: they are then held once, in the snapshot (in wire form), not twice.
    pub fn without_records(&self) -> StaticZone {
        StaticZone {
            origin: self.origin.clone(),
            soa: self.soa.clone(),
            serial_base: self.serial_base,
            soa_ttl_secs: self.soa_ttl_secs,
            ns: self.ns.clone(),
            records: Vec::new(),
            cuts: self.cuts.clone(),
            aliases: self.aliases.clone(),
            wildcards: self.wildcards,
            signer: self.signer.clone(),
        }
    }

    /// Why a managed endpoint at `name` could not be served beside the static records, if it
    /// could not: at or below a delegation (the child zone answers for it), or at a name with
    /// a CNAME (which has no other data, RFC 1034 §3.6.2). A publish of such a plan is
    /// refused with this text; the query path never serves one (`snapshot`).
    pub fn endpoint_conflict(&self, name: &Name) -> Option<String> {
        let name = name.to_lowercase();
        if self.aliases.contains(&name) {
            return Some(format!(
                "{name} has a static CNAME in the DNS zone, and a name with a CNAME has no other data (RFC 1034 §3.6.2): \
                 remove the CNAME from the master file or the endpoint from the plan"
            ));
        }
        let mut at = name.clone();
        while at.num_labels() > self.origin.num_labels() {
            if self.cuts.contains(&at) {
                return Some(format!(
                    "{name} is at or below the delegation {at} in the DNS zone: the child zone answers for it, so it would \
                     never be served; move the endpoint out of {at} or remove the delegation"
                ));
            }
            at = at.base_name();
        }
        None
    }

    /// Whether the query path must walk a name from the apex down (for a zone cut above it or
    /// a wildcard that covers it) rather than answer from its own entry alone.
    pub fn has_cuts_or_wildcards(&self) -> bool {
        !self.cuts.is_empty() || self.wildcards
    }

    /// The TTL of the SOA in negative answers: min(SOA TTL, SOA MINIMUM) (RFC 2308 §3).
    pub fn negative_ttl_secs(&self) -> u32 {
        self.soa_ttl_secs.min(self.soa.minimum)
    }

    pub fn soa_record(&self, serial: u32, ttl: u32) -> Record {
        let s = &self.soa;
        let soa = SOA::new(s.mname.clone(), s.rname.clone(), serial, s.refresh, s.retry, s.expire, s.minimum);
        Record::from_rdata(self.origin.clone(), ttl, RData::SOA(soa))
    }
}

/// The keys of `[dns_zone.dnssec]` (a file or a directory relative to `config_dir`), and the
/// signatures' validity, checked.
/// With a key directory, also its policy's longest TTL and where it is written.
fn load_signer(config: &DnssecConfig, config_dir: &Path, origin: &Name) -> Result<(ZoneSigner, Option<(u32, PathBuf)>), DnsZoneError> {
    const DAY: u32 = 86_400;
    if !(1..=365).contains(&config.signature_validity_days) {
        return Err(DnsZoneError::Dnssec(format!("signature_validity_days: {} is outside 1..=365", config.signature_validity_days)));
    }
    if config.signature_refresh_days == 0 || config.signature_refresh_days >= config.signature_validity_days {
        return Err(DnsZoneError::Dnssec(format!(
            "signature_refresh_days: {} must be above 0 and below signature_validity_days ({})",
            config.signature_refresh_days, config.signature_validity_days
        )));
    }
    let (validity_secs, refresh_secs) = (config.signature_validity_days * DAY, config.signature_refresh_days * DAY);
    let mut max_ttl = None;
    let (keys, source, dnskey_ttl_secs) = match (&config.key_file, &config.key_dir) {
        (Some(file), None) => {
            let key = dnsplan_common::dnssec::ZoneKey::load(&config_dir.join(file)).map_err(|e| DnsZoneError::Dnssec(e.to_string()))?;
            (SigningKeys::combined(key), KeySource::File, config.dnskey_ttl_secs.unwrap_or(DNSKEY_TTL_SECS))
        }
        (None, Some(dir)) => {
            if config.dnskey_ttl_secs.is_some() {
                return Err(DnsZoneError::Dnssec(format!(
                    "dnskey_ttl_secs: with key_dir the DNSKEY TTL is the directory's (dnskey_ttl_secs in {}'s [policy])",
                    dir.join(dnsplan_common::dnssec_keys::KEYS_FILE).display()
                )));
            }
            let path = config_dir.join(dir);
            let (keys, policy) =
                ZoneSigner::read_dir(&path, origin, config.rolls_keys, crate::zone::signed::unix_now()).map_err(DnsZoneError::Dnssec)?;
            max_ttl = Some((policy.max_ttl_secs, path.join(dnsplan_common::dnssec_keys::KEYS_FILE)));
            let ttl = policy.dnskey_ttl_secs;
            if !(1..=3_600).contains(&config.key_check_secs) {
                return Err(DnsZoneError::Dnssec(format!("key_check_secs: {} is outside 1..=3600", config.key_check_secs)));
            }
            (keys, KeySource::Dir { path, rolls: config.rolls_keys, check_secs: config.key_check_secs }, ttl)
        }
        _ => return Err(DnsZoneError::Dnssec("give one of key_file (one combined key) or key_dir (a KSK and rolled ZSKs)".into())),
    };
    Ok((ZoneSigner { keys, source, validity_secs, refresh_secs, dnskey_ttl_secs }, max_ttl))
}

/// SVCB and HTTPS targets written relative (`SVCB 1 svc port=8443`): hickory's reader keeps
/// them as they are written, not completed with the origin as it completes every other name,
/// so `svc` would be served as the top-level name `svc.`. Completed here with the zone's
/// origin (a `$ORIGIN` changed inside the file is not seen: write such targets in full).
fn complete_relative_targets(data: &mut RData, origin: &Name) {
    let svcb = match data {
        RData::SVCB(svcb) => svcb,
        RData::HTTPS(https) => &mut https.0,
        _ => return,
    };
    if !svcb.target_name.is_fqdn()
        && let Ok(full) = svcb.target_name.clone().append_domain(origin)
    {
        svcb.target_name = full;
    }
}

/// The delegation points of `records` (the owners of NS records) and whether any owner is a
/// wildcard; a DS away from a delegation or a CNAME at one is refused, naming the master file
/// `path`.
fn delegations(records: &[Record], path: &Path) -> Result<(BTreeSet<Name>, bool), DnsZoneError> {
    let cuts: BTreeSet<Name> = records.iter().filter(|r| r.record_type() == RecordType::NS).map(|r| r.name.clone()).collect();
    for r in records {
        match r.record_type() {
            RecordType::DS if !cuts.contains(&r.name) => {
                return Err(DnsZoneError::DsWithoutDelegation { path: path.to_path_buf(), name: r.name.to_string() });
            }
            RecordType::CNAME if cuts.contains(&r.name) => {
                return Err(DnsZoneError::CnameAtDelegation { path: path.to_path_buf(), name: r.name.to_string() });
            }
            _ => {}
        }
    }
    Ok((cuts, records.iter().any(|r| r.name.is_wildcard())))
}

/// The DNS zone `origin` with its SOA and one name server, for unit tests.
#[cfg(test)]
pub(crate) fn test_zone(origin: &str) -> std::sync::Arc<StaticZone> {
    let soa = SoaConfig {
        mname: format!("ns1.{origin}"),
        rname: format!("hostmaster.{origin}"),
        ttl_secs: 300,
        refresh_secs: 3600,
        retry_secs: 600,
        expire_secs: 604_800,
        minimum_secs: 30,
        serial_base: 0,
    };
    let config = DnsZoneConfig {
        origin: origin.into(),
        soa: Some(soa),
        ns: vec![format!("ns1.{origin}")],
        ns_ttl_secs: 3600,
        master_file: None,
        records: None,
        dnssec: None,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    std::sync::Arc::new(StaticZone::load(&config, dir.path()).expect("zone"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::RecordType;

    fn config(master_file: &str) -> DnsZoneConfig {
        DnsZoneConfig {
            origin: "example.test.".into(),
            soa: Some(SoaConfig {
                mname: "ns1.example.test.".into(),
                rname: "hostmaster.example.test.".into(),
                ttl_secs: default_soa_ttl(),
                refresh_secs: default_refresh(),
                retry_secs: default_retry(),
                expire_secs: default_expire(),
                minimum_secs: default_minimum(),
                serial_base: 0,
            }),
            ns: vec!["ns1.example.test.".into()],
            ns_ttl_secs: default_ns_ttl(),
            master_file: Some(master_file.into()),
            records: None,
            dnssec: None,
        }
    }

    fn load(zone_file: &str) -> Result<StaticZone, DnsZoneError> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("zone.db"), zone_file).expect("write zone file");
        StaticZone::load(&config("zone.db"), dir.path())
    }

    /// NS records below the apex are a delegation: loaded as records, the cut named once; a
    /// DS away from a cut, a CNAME at one and a wildcard that delegates are refused.
    #[test]
    fn ns_below_the_apex_is_a_delegation() {
        let zone = load("$TTL 3600\nsub NS ns.other.\nsub NS ns.sub\nsub DS 1 13 2 abcd\nns.sub A 192.0.2.1\n").expect("loads");
        let sub = Name::from_ascii("sub.example.test.").expect("name");
        assert_eq!(zone.cuts, BTreeSet::from([sub.clone()]));
        assert_eq!(zone.records.len(), 4);
        assert!(!zone.wildcards);
        let named = |n: &str| Name::from_ascii(n).expect("name");
        assert!(zone.endpoint_conflict(&sub).is_some_and(|e| e.contains("at or below the delegation sub.example.test.")));
        assert!(zone.endpoint_conflict(&named("A.Deep.Sub.example.test.")).is_some(), "below the cut, in any case");
        assert_eq!(zone.endpoint_conflict(&named("subway.example.test.")), None);
        assert_eq!(zone.endpoint_conflict(&named("example.test.")), None);
        let aliased = load("$TTL 3600\nwww CNAME api\n").expect("loads");
        assert!(aliased.endpoint_conflict(&named("www.example.test.")).is_some_and(|e| e.contains("static CNAME")));
        for (file, want) in [
            ("$TTL 3600\nx DS 1 13 2 abcd\n", "x.example.test. has a DS record but no NS records"),
            ("$TTL 3600\nsub NS ns.other.\nsub CNAME api\n", "sub.example.test. has NS records (a delegation) and a CNAME"),
            ("$TTL 3600\n*.w NS ns.other.\n", "*.w.example.test. is a wildcard with NS records"),
        ] {
            let err = load(file).expect_err(file).to_string();
            assert!(err.contains(want) && err.contains("zone.db"), "{want:?} not in: {err}");
        }
    }

    /// A decimal escape in a TXT string is the byte it names; one the reader would get wrong
    /// is refused with its line. Fails without `decimal_escapes`: "dec\\065" was loaded as
    /// the bytes 0xd8 0x85.
    #[test]
    fn decimal_escapes_are_their_bytes_or_refused() {
        let zone = load("$TTL 3600\nt TXT \"dec\\065\" \"a\\\\b\\\"c\"\n").expect("loads");
        let txt: Vec<Vec<u8>> = zone
            .records
            .iter()
            .flat_map(|r| match &r.data {
                RData::TXT(t) => t.txt_data.iter().map(|s| s.to_vec()).collect(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(txt, vec![b"decA".to_vec(), b"a\\b\"c".to_vec()]);
        let err = load("$TTL 3600\n\nt TXT \"x\\200\"\n").expect_err("a byte above 127 was loaded");
        assert!(matches!(err, DnsZoneError::Escape { line: 3, .. }), "{err}");
        assert!(err.to_string().contains("\\200"), "{err}");
    }

    /// A record in RFC 3597's generic form is loaded as its type and passes the same checks:
    /// a generic NS below the apex is a delegation; a generic A is an A record at
    /// its owner and TTL (a blank owner, `$TTL`); a type nobody knows is its bytes; and the
    /// error of one that does not decode names its line.
    #[test]
    fn the_generic_form_is_loaded_as_its_type_and_checked_as_one() {
        let zone = load("$TTL 3600\nx TYPE65000 \\# 2 beef\n  TYPE1 \\# 4 c0000201\n").expect("loads");
        let mut got: Vec<(String, RecordType, u32)> = zone.records.iter().map(|r| (r.name.to_string(), r.record_type(), r.ttl)).collect();
        got.sort_by_key(|(_, t, _)| u16::from(*t));
        assert_eq!(
            got,
            vec![("x.example.test.".to_string(), RecordType::A, 3600), ("x.example.test.".to_string(), RecordType::Unknown(65000), 3600)]
        );
        // ns.other. in wire form: 2 "ns" 5 "other" 0.
        let zone = load("$TTL 3600\nsub TYPE2 \\# 10 026e73056f7468657200\n").expect("a delegation loads");
        assert_eq!(zone.cuts.len(), 1, "the generic NS is a delegation");
        let err = load("$TTL 3600\n\nbad TYPE1 \\# 2 0a00\n").expect_err("a torn A was loaded");
        assert!(matches!(err, DnsZoneError::Record { line: 3, .. }), "{err}");
    }

    /// A relative SVCB or HTTPS target is completed with the origin, as every other name is.
    /// Fails without `complete_relative_targets`: the target was `svc.`, a top-level name.
    #[test]
    fn relative_svcb_targets_are_in_the_zone() {
        let zone = load("$TTL 3600\nx SVCB 1 svc port=8443\ny HTTPS 1 . alpn=h2\nz HTTPS 1 full.example.org.\n").expect("loads");
        let mut targets: Vec<String> = zone
            .records
            .iter()
            .filter_map(|r| match &r.data {
                RData::SVCB(s) => Some(s.target_name.to_string()),
                RData::HTTPS(h) => Some(h.0.target_name.to_string()),
                _ => None,
            })
            .collect();
        targets.sort();
        assert_eq!(targets, [".", "full.example.org.", "svc.example.test."]);
    }

    #[test]
    fn wildcards_are_loaded_and_marked() {
        let zone = load("$TTL 3600\n*.wild A 192.0.2.1\n").expect("a wildcard loads");
        assert!(zone.wildcards && zone.cuts.is_empty());
        assert!(zone.has_cuts_or_wildcards());
    }

    #[test]
    fn ns_at_the_apex_is_served() {
        let zone = load("$TTL 3600\n@ NS ns2.other.\n").expect("apex NS loads");
        assert_eq!(zone.ns.len(), 2, "the master file's apex NS beside the config's");
        assert!(zone.records.is_empty());
    }
}
