//! The static zones of the config file as loaded, saved beside the zones (`zones-image` in
//! `data_dir/zones/`), so that a restart reads their records from wire form instead of parsing every
//! master file again (hickory's reader is most of a start at 10,000 zones).
//!
//! Format: a sequence of records, each a little-endian u32 length and a codec envelope (kind
//! [`KIND`], checksummed) around one zone: its fingerprint, origin, SOA, serial base, apex NS
//! and records, each record its owner and its type, TTL and RDATA in wire form (`Statics`).
//!
//! A zone is read back only when its fingerprint is the one computed now: a digest of its
//! config table, its master file's text and the running binary (its size and modification
//! time, so a build that reads master files differently never uses an image of an older one).
//! Anything else (another file, a damaged record, a torn end) is parsed from its master file
//! as on a first start. The image is written again at a start that parsed any zone.

use crate::zone::dns_zone::{DnsZoneConfig, StaticZone};
use crate::zone::snapshot::{Statics, wire_key};
use dnsplan_common::codec;
use hickory_proto::rr::{Name, RData, Record};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The file's name in `data_dir`.
pub const FILE_NAME: &str = "zones-image";
/// The envelope kind of one zone (`local_state` 64, the serving image 66, the IXFR journal 67).
pub const KIND: u8 = 68;

pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// One zone as saved.
#[derive(Serialize, Deserialize)]
struct Saved {
    fingerprint: u64,
    origin: String,
    serial_base: u32,
    soa_ttl_secs: u32,
    /// The SOA record (serial 0), as `Statics` bytes.
    soa: Vec<u8>,
    /// Each record: its owner in wire form, then as `Statics` bytes (type, TTL, RDATA length,
    /// RDATA), one after the other: one allocation a zone, not two a record.
    ns: Vec<u8>,
    records: Vec<u8>,
}

/// The records of `blob` (see `Saved::records`), or `None` if it does not frame.
fn decode_records(blob: &[u8]) -> Option<Vec<Record>> {
    let mut out = Vec::new();
    let mut decoder = BinDecoder::new(blob);
    while !decoder.is_empty() {
        let name = Name::read(&mut decoder).ok()?;
        let head = decoder.read_slice(8).ok()?.unverified();
        let rdlen = usize::from(u16::from_be_bytes([head[6], head[7]]));
        let rdata = decoder.read_slice(rdlen).ok()?.unverified();
        let mut one = head.to_vec();
        one.extend_from_slice(rdata);
        out.push(Statics::from_bytes(one)?.records(&name).pop()?);
    }
    Some(out)
}

/// `records` as `decode_records` reads them.
fn encode_records(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        let mut one = Statics::default();
        one.push(r);
        out.extend_from_slice(&wire_key(&r.name));
        out.extend_from_slice(one.bytes());
    }
    out
}

impl codec::Record for Saved {
    const KIND: u8 = KIND;
    const KIND_NAME: &'static str = "static zone image";
    const BODY_BYTES_MAX: usize = codec::BODY_BYTES_MAX;
}

/// An image read back: its bytes, and where each zone's record is in them, by origin (each
/// zone is decoded when it is asked for, so the whole image is never held decoded).
#[derive(Default)]
pub struct ZoneImage {
    bytes: Vec<u8>,
    zones: HashMap<String, (usize, usize)>,
    path: PathBuf,
}

/// The running binary as the fingerprint names it: its size and modification time, read once
/// (ten thousand zones asked for it ten thousand times, a path lookup and a `stat` each).
static BINARY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    std::env::current_exe().and_then(std::fs::metadata).map(|m| format!("{} {:?}", m.len(), m.modified().ok())).unwrap_or_default()
});

/// What makes a zone's image valid: its config table, its master file's text (when it has
/// one) and the running binary. FNV-1a, 64 bits.
pub fn fingerprint(config: &DnsZoneConfig, config_dir: &Path) -> std::io::Result<u64> {
    let text = match &config.master_file {
        Some(file) => std::fs::read(config_dir.join(file))?,
        None => Vec::new(),
    };
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    // The records written in the config go in as they are: printed with `Debug`, every
    // character escaped, they were most of a restart's time in the fingerprint.
    let DnsZoneConfig { origin, soa, ns, ns_ttl_secs, master_file, records, dnssec } = config;
    let table = format!("{origin:?} {soa:?} {ns:?} {ns_ttl_secs} {master_file:?} {dnssec:?}");
    let records = records.as_deref().map(str::as_bytes);
    let parts: [&[u8]; 6] = [
        table.as_bytes(),
        &[u8::from(records.is_some())],
        records.unwrap_or_default(),
        config_dir.as_os_str().as_encoded_bytes(),
        &text,
        BINARY.as_bytes(),
    ];
    for byte in parts.iter().flat_map(|p| p.iter().copied().chain([0xff])) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    Ok(hash)
}

impl ZoneImage {
    /// The image at `path`, or an empty one (none yet, or it does not read: each zone is then
    /// parsed). Reading stops at the first record that does not decode.
    pub fn read(path: &Path) -> ZoneImage {
        let mut image = ZoneImage { bytes: Vec::new(), zones: HashMap::new(), path: path.to_path_buf() };
        let Ok(bytes) = std::fs::read(path) else { return image };
        let mut at = 0usize;
        while let Some(len) = bytes.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize) {
            let Some(body) = bytes.get(at + 4..at + 4 + len) else { break };
            let Ok(saved) = codec::decode::<Saved>(body) else {
                tracing::info!(path = %path.display(), offset = at, "a zone of the zones' image does not decode; the zones after it are parsed from their files");
                break;
            };
            image.zones.insert(saved.origin, (at + 4, len));
            at += 4 + len;
        }
        image.bytes = bytes;
        image
    }

    /// The zone of `config` from the image, when its fingerprint is `fingerprint` and it reads.
    pub fn zone(&self, config: &DnsZoneConfig, fingerprint: u64) -> Option<StaticZone> {
        let mut origin = Name::from_ascii(&config.origin).ok()?;
        origin.set_fqdn(true);
        let &(at, len) = self.zones.get(&origin.to_lowercase().to_string())?;
        let saved = codec::decode::<Saved>(self.bytes.get(at..at + len)?).ok().filter(|s| s.fingerprint == fingerprint)?;
        let soa = match Statics::from_bytes(saved.soa)?.records(&Name::root()).pop()?.data {
            RData::SOA(soa) => soa,
            _ => return None,
        };
        let origin = Name::from_ascii(&saved.origin).ok()?;
        let (ns, records) = (decode_records(&saved.ns)?, decode_records(&saved.records)?);
        StaticZone::from_parts(origin, soa, saved.serial_base, saved.soa_ttl_secs, ns, records, &self.path).ok()
    }

    /// Writes the image of `zones` (with their fingerprints) to `path`, through a file beside
    /// it renamed over it; fsynced when `sync` (an image left torn by a crash without it only
    /// fails its checksums, and its zones are parsed).
    pub fn write(path: &Path, zones: &[(u64, &StaticZone)], sync: bool) -> std::io::Result<()> {
        use std::io::Write;
        let tmp = path.with_extension("tmp");
        let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        for (fingerprint, zone) in zones {
            // A zone too large for one envelope is parsed at each start instead.
            let estimate: usize = zone.records.iter().map(|r| r.name.len() + 16 + 64).sum();
            if estimate > codec::BODY_BYTES_MAX / 4 {
                continue;
            }
            let mut soa = Statics::default();
            soa.push(&zone.soa_record(0, zone.soa_ttl_secs));
            let saved = Saved {
                fingerprint: *fingerprint,
                origin: zone.origin.to_string(),
                serial_base: zone.serial_base,
                soa_ttl_secs: zone.soa_ttl_secs,
                soa: soa.bytes().to_vec(),
                ns: encode_records(&zone.ns),
                records: encode_records(&zone.records),
            };
            let body = codec::encode(&saved);
            file.write_all(&u32::try_from(body.len()).map_err(std::io::Error::other)?.to_le_bytes())?;
            file.write_all(&body)?;
        }
        let file = file.into_inner().map_err(|e| e.into_error())?;
        if sync {
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(zone: &StaticZone) -> Vec<String> {
        let mut out: Vec<String> = zone.ns.iter().chain(&zone.records).map(|r| format!("{r} ttl {}", r.ttl)).collect();
        out.push(format!("{} {:?} {} {}", zone.soa_record(0, zone.soa_ttl_secs), zone.cuts, zone.serial_base, zone.wildcards));
        out.push(format!("{:?}", zone.aliases));
        out
    }

    /// A zone read back from the image is the zone parsed from its file (records, TTLs, SOA,
    /// delegations, CNAME owners, wildcards); another fingerprint, a changed file or a damaged
    /// image is not read back.
    #[test]
    fn a_zone_reads_back_as_parsed_and_only_when_it_is_the_same() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let text = "$TTL 3600\n@ SOA ns1 hostmaster 42 3600 600 604800 30\n@ NS ns1\nns1 A 192.0.2.1\nsub NS ns.sub\nns.sub A 192.0.2.2\n\
                    sub DS 1 13 2 abcd\n*.w 60 TXT \"w\"\nc CNAME ns1\nx SVCB 1 svc port=8443\nx MX 10 ns1\nx TYPE65000 \\# 2 beef\n";
        std::fs::write(dir.path().join("z.zone"), text)?;
        let config = DnsZoneConfig {
            origin: "z.example.".into(),
            soa: None,
            ns: Vec::new(),
            ns_ttl_secs: 3600,
            master_file: Some("z.zone".into()),
            records: None,
            dnssec: None,
        };
        let parsed = StaticZone::load(&config, dir.path())?;
        let fp = fingerprint(&config, dir.path())?;
        let path = path_in(dir.path());
        ZoneImage::write(&path, &[(fp, &parsed)], true)?;
        let image = ZoneImage::read(&path);
        let back = image.zone(&config, fp).expect("read back");
        assert_eq!(described(&back), described(&parsed));
        assert!(image.zone(&config, fp ^ 1).is_none(), "another fingerprint");
        std::fs::write(dir.path().join("z.zone"), text.replace(" 42 ", " 43 "))?;
        assert_ne!(fingerprint(&config, dir.path())?, fp, "a changed file changes the fingerprint");
        let mut bytes = std::fs::read(&path)?;
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        std::fs::write(&path, &bytes)?;
        assert!(ZoneImage::read(&path).zone(&config, fp).is_none(), "a damaged image");
        Ok(())
    }
}
