//! DNSSEC keys and signatures of a DNS zone: a zone's signing key (ECDSA P-256 SHA-256,
//! algorithm 13, or Ed25519, algorithm 15) loaded from a PEM file only its owner may read, its
//! DNSKEY, DS, CDS and CDNSKEY, and RRSIGs over RRsets in canonical form (RFC 4034 §6).
//!
//! The data signed is built here rather than by hickory's `TBS::from_input`, which orders an
//! RRset by its records' encoding without lowering the names inside RDATA, and compares TTLs
//! before RDATA: an RRset such as `NS ns1.` and `NS NS2.` would be signed in an order no
//! validator uses. Here each RDATA is written in canonical form (names in it lowercased where
//! RFC 4034 §6.2 as amended by RFC 6840 §5.1 says so, uncompressed), sorted as octet strings
//! and deduplicated (§6.3).
//!
//! One key signs everything (a combined signing key, flags 257): what `dnsplan zone ds`
//! prints goes to the parent zone. The private key is never printed: `ZoneKey`'s `Debug`
//! shows the algorithm and the key tag, and no error carries key material.

use hickory_proto::dnssec::crypto::{EcdsaSigningKey, Ed25519SigningKey};
use hickory_proto::dnssec::rdata::{CDNSKEY, CDS, DNSKEY, DNSSECRData, DS, SigInput};
use hickory_proto::dnssec::{Algorithm, DigestType, PublicKey, SigningKey, TBS};
use hickory_proto::rr::{Name, RData, RecordType, SerialNumber};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder, NameEncoding};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Flags of a zone key that is also a secure entry point (RFC 4034 §2.1.1): the one key of a
/// zone signed with a combined signing key, or a key-signing key (KSK) whose DS is at the
/// parent.
pub const CSK_FLAGS: u16 = 257;
/// Flags of a zone-signing key (ZSK): a zone key, not a secure entry point.
pub const ZSK_FLAGS: u16 = 256;

/// The algorithms a zone can be signed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneAlgorithm {
    /// ECDSA P-256 with SHA-256 (RFC 6605), algorithm 13: the most deployed.
    EcdsaP256Sha256,
    /// Ed25519 (RFC 8080), algorithm 15.
    Ed25519,
}

impl ZoneAlgorithm {
    pub fn parse(text: &str) -> Result<ZoneAlgorithm, String> {
        match text.to_ascii_lowercase().as_str() {
            "13" | "ecdsap256sha256" | "ecdsa" => Ok(ZoneAlgorithm::EcdsaP256Sha256),
            "15" | "ed25519" => Ok(ZoneAlgorithm::Ed25519),
            _ => Err(format!("{text:?} is not a DNSSEC algorithm dnsplan signs with: 13 (ecdsap256sha256) or 15 (ed25519)")),
        }
    }

    pub fn hickory(self) -> Algorithm {
        match self {
            ZoneAlgorithm::EcdsaP256Sha256 => Algorithm::ECDSAP256SHA256,
            ZoneAlgorithm::Ed25519 => Algorithm::ED25519,
        }
    }

    pub fn number(self) -> u8 {
        match self {
            ZoneAlgorithm::EcdsaP256Sha256 => 13,
            ZoneAlgorithm::Ed25519 => 15,
        }
    }
}

#[derive(Debug, Error)]
pub enum ZoneKeyError {
    #[error("DNSSEC key {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error(
        "DNSSEC key {path} may be read by others (mode {mode:o}); a zone's private key must be readable by its owner only: chmod 600 {path}"
    )]
    Exposed { path: PathBuf, mode: u32 },
    #[error("DNSSEC key {path} is not a PEM private key (PKCS#8, as `dnsplan zone key new` and `openssl genpkey` write)")]
    NotPem { path: PathBuf },
    #[error("DNSSEC key {path} is neither an ECDSA P-256 nor an Ed25519 private key")]
    Algorithm { path: PathBuf },
    #[error("DNSSEC key {path} exists already; choose another file (a key is never written over)")]
    Exists { path: PathBuf },
    #[error("DNSSEC key {path}: {error}")]
    Write { path: PathBuf, error: std::io::Error },
    #[error("DNSSEC key: {0}")]
    Crypto(String),
}

/// A zone's signing key with its DNSKEY.
pub struct ZoneKey {
    signer: Box<dyn SigningKey>,
    flags: u16,
    algorithm: ZoneAlgorithm,
    dnskey: DNSKEY,
    tag: u16,
}

impl std::fmt::Debug for ZoneKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZoneKey(algorithm {}, tag {}, flags {})", self.algorithm.number(), self.tag, self.flags)
    }
}

impl ZoneKey {
    /// Loads the key at `path` as a combined signing key (flags 257), refusing a file that
    /// others may read (mode bits 077 set).
    pub fn load(path: &Path) -> Result<ZoneKey, ZoneKeyError> {
        ZoneKey::load_with(path, CSK_FLAGS)
    }

    /// Loads the key at `path` with DNSKEY `flags` (`CSK_FLAGS` or `ZSK_FLAGS`), as `load`.
    pub fn load_with(path: &Path, flags: u16) -> Result<ZoneKey, ZoneKeyError> {
        let pem = crate::signing::read_owner_only(path).map_err(|err| match err {
            crate::signing::OwnerOnly::Read(error) => ZoneKeyError::Read { path: path.to_owned(), error },
            crate::signing::OwnerOnly::Exposed(mode) => ZoneKeyError::Exposed { path: path.to_owned(), mode },
        })?;
        let der = PrivatePkcs8KeyDer::from_pem_slice(&pem).map_err(|_| ZoneKeyError::NotPem { path: path.to_owned() })?;
        ZoneKey::from_pkcs8_with(&der, flags).ok_or_else(|| ZoneKeyError::Algorithm { path: path.to_owned() })
    }

    /// The key in PKCS#8 `der`, a combined signing key: ECDSA P-256, else Ed25519 (version 1,
    /// as OpenSSL writes, or 2).
    pub fn from_pkcs8(der: &PrivatePkcs8KeyDer<'_>) -> Option<ZoneKey> {
        ZoneKey::from_pkcs8_with(der, CSK_FLAGS)
    }

    /// The key in PKCS#8 `der` with DNSKEY `flags`.
    pub fn from_pkcs8_with(der: &PrivatePkcs8KeyDer<'_>, flags: u16) -> Option<ZoneKey> {
        let rng = ring::rand::SystemRandom::new();
        let signer: Box<dyn SigningKey> =
            if let Ok(pair) = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der.secret_pkcs8_der(), &rng) {
                Box::new(EcdsaSigningKey::from_ecdsa(pair, Algorithm::ECDSAP256SHA256))
            } else {
                let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der()).ok()?;
                Box::new(Ed25519SigningKey::from_ed25519(pair))
            };
        ZoneKey::new(signer, flags).ok()
    }

    fn new(signer: Box<dyn SigningKey>, flags: u16) -> Result<ZoneKey, ZoneKeyError> {
        let crypto = |e: &dyn std::fmt::Display| ZoneKeyError::Crypto(e.to_string());
        let algorithm = match signer.algorithm() {
            Algorithm::ECDSAP256SHA256 => ZoneAlgorithm::EcdsaP256Sha256,
            Algorithm::ED25519 => ZoneAlgorithm::Ed25519,
            other => return Err(ZoneKeyError::Crypto(format!("algorithm {other} is not one dnsplan signs with"))),
        };
        let public = signer.to_public_key().map_err(|e| crypto(&e))?;
        let dnskey = DNSKEY::with_flags(flags, public);
        let tag = dnskey.calculate_key_tag().map_err(|e| crypto(&e))?;
        Ok(ZoneKey { signer, flags, algorithm, dnskey, tag })
    }

    /// A new combined signing key of `algorithm`, and its PEM text (PKCS#8) to store.
    pub fn generate(algorithm: ZoneAlgorithm) -> Result<(ZoneKey, String), ZoneKeyError> {
        ZoneKey::generate_with(algorithm, CSK_FLAGS)
    }

    /// A new key of `algorithm` with DNSKEY `flags`, and its PEM text (PKCS#8) to store.
    pub fn generate_with(algorithm: ZoneAlgorithm, flags: u16) -> Result<(ZoneKey, String), ZoneKeyError> {
        let crypto = |e: &dyn std::fmt::Display| ZoneKeyError::Crypto(e.to_string());
        let der = match algorithm {
            ZoneAlgorithm::EcdsaP256Sha256 => EcdsaSigningKey::generate_pkcs8(Algorithm::ECDSAP256SHA256).map_err(|e| crypto(&e))?,
            ZoneAlgorithm::Ed25519 => Ed25519SigningKey::generate_pkcs8().map_err(|e| crypto(&e))?,
        };
        let key = ZoneKey::from_pkcs8_with(&der, flags).ok_or_else(|| ZoneKeyError::Crypto("a generated key does not load".into()))?;
        let base64 = data_encoding::BASE64.encode(der.secret_pkcs8_der());
        let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
        for line in base64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END PRIVATE KEY-----\n");
        Ok((key, pem))
    }

    /// Writes a new combined signing key of `algorithm` to `path` (mode 0600, never over an
    /// existing file).
    pub fn create(path: &Path, algorithm: ZoneAlgorithm) -> Result<ZoneKey, ZoneKeyError> {
        let (key, pem) = ZoneKey::generate(algorithm)?;
        write_private(path, &pem)?;
        Ok(key)
    }

    /// The DNSKEY flags: `CSK_FLAGS` (a combined key or a KSK) or `ZSK_FLAGS`.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    pub fn algorithm(&self) -> ZoneAlgorithm {
        self.algorithm
    }

    pub fn tag(&self) -> u16 {
        self.tag
    }

    pub fn dnskey(&self) -> &DNSKEY {
        &self.dnskey
    }

    /// The public key's bytes (the DNSKEY's last field).
    pub fn public_key(&self) -> &[u8] {
        self.dnskey.public_key().public_bytes()
    }

    /// The DS for the parent zone of `origin` (SHA-256, digest type 2).
    pub fn ds(&self, origin: &Name) -> Result<DS, ZoneKeyError> {
        let digest = self.dnskey.to_digest(origin, DigestType::SHA256).map_err(|e| ZoneKeyError::Crypto(e.to_string()))?;
        Ok(DS::new(self.tag, self.algorithm.hickory(), DigestType::SHA256, digest.as_ref().to_vec()))
    }

    /// The apex records that publish this key: DNSKEY, and CDS and CDNSKEY (RFC 7344) so a
    /// parent that scans for them can put the DS in place.
    pub fn apex_rdata(&self, origin: &Name) -> Result<Vec<RData>, ZoneKeyError> {
        let mut out = vec![RData::DNSSEC(DNSSECRData::DNSKEY(self.dnskey.clone()))];
        out.extend(self.cds_rdata(origin)?);
        Ok(out)
    }

    /// The CDS and CDNSKEY records (RFC 7344) that ask the parent for this key's DS.
    pub fn cds_rdata(&self, origin: &Name) -> Result<[RData; 2], ZoneKeyError> {
        let ds = self.ds(origin)?;
        Ok([
            RData::DNSSEC(DNSSECRData::CDS(CDS::new(ds.key_tag(), Some(ds.algorithm()), DigestType::SHA256, ds.digest().to_vec()))),
            RData::DNSSEC(DNSSECRData::CDNSKEY(CDNSKEY::with_flags(
                self.flags,
                Some(self.algorithm.hickory()),
                self.public_key().to_vec(),
            ))),
        ])
    }

    /// The RRSIG RDATA (wire form) over the RRset of type `rtype` at `owner` whose RDATA are
    /// `rdata` (each in wire form, names uncompressed, any case), signed by this key for the
    /// zone `signer` (lower case), valid from `inception` to `expiration` (seconds since the
    /// epoch, RFC 1982 arithmetic past 2106). `owner` is the RRset's owner as stored: a
    /// wildcard's (`*.x`) signature has its labels field one short, and is served as it is
    /// with each name it synthesises (RFC 4035 §5.3.2).
    #[allow(clippy::too_many_arguments)]
    pub fn sign_rrset(
        &self,
        signer: &Name,
        owner: &Name,
        rtype: RecordType,
        ttl: u32,
        rdata: &[&[u8]],
        inception: u32,
        expiration: u32,
    ) -> Result<Vec<u8>, ZoneKeyError> {
        let input = SigInput {
            type_covered: rtype,
            algorithm: self.algorithm.hickory(),
            num_labels: owner.num_labels(),
            original_ttl: ttl,
            sig_expiration: SerialNumber::new(expiration),
            sig_inception: SerialNumber::new(inception),
            key_tag: self.tag,
            signer_name: signer.to_lowercase(),
        };
        let mut rrsig = Vec::with_capacity(128);
        {
            let mut e = BinEncoder::new(&mut rrsig);
            e.set_canonical_form(true);
            e.set_name_encoding(NameEncoding::UncompressedLowercase);
            input.emit(&mut e).map_err(|err| ZoneKeyError::Crypto(err.to_string()))?;
        }
        let tbs = signed_data(&rrsig, owner, rtype, ttl, rdata)?;
        let signature = self.signer.sign(&TBS::from(tbs.as_slice())).map_err(|e| ZoneKeyError::Crypto(e.to_string()))?;
        rrsig.extend_from_slice(&signature);
        Ok(rrsig)
    }
}

/// Writes `pem` to `path`, mode 0600 and synced, never over an existing file: a zone's private
/// key (`ZoneKey::create`, `dnssec_keys`).
pub fn write_private(path: &Path, pem: &str) -> Result<(), ZoneKeyError> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|error| match error.kind() {
        std::io::ErrorKind::AlreadyExists => ZoneKeyError::Exists { path: path.to_owned() },
        _ => ZoneKeyError::Write { path: path.to_owned(), error },
    })?;
    file.write_all(pem.as_bytes()).and_then(|()| file.sync_all()).map_err(|error| ZoneKeyError::Write { path: path.to_owned(), error })
}

/// The RDATA of type `rtype` in canonical form (RFC 4034 §6.2): names in it uncompressed, and
/// lowercased for the types §6.2 lists (RFC 6840 §5.1 took NSEC off the list; hickory's
/// canonical encoder follows both). From RDATA in wire form with uncompressed names, as the
/// snapshot keeps it.
pub fn canonical_rdata(rtype: RecordType, rdata: &[u8]) -> Result<Vec<u8>, ZoneKeyError> {
    let mut decoder = hickory_proto::serialize::binary::BinDecoder::new(rdata);
    let length = hickory_proto::serialize::binary::Restrict::new(rdata.len() as u16);
    let data = RData::read(&mut decoder, rtype, length).map_err(|e| ZoneKeyError::Crypto(e.to_string()))?;
    let mut out = Vec::with_capacity(rdata.len());
    let mut e = BinEncoder::new(&mut out);
    e.set_canonical_form(true);
    e.set_name_encoding(NameEncoding::Uncompressed);
    data.emit(&mut e).map_err(|err| ZoneKeyError::Crypto(err.to_string()))?;
    Ok(out)
}

/// What an RRSIG signs (RFC 4034 §3.1.8.1): its RDATA without the signature, then each RR of
/// the RRset in canonical form (owner lower case, uncompressed; class IN; the original TTL),
/// in canonical order, duplicates once. A wildcard owner is written as it is (`*.x`).
fn signed_data(rrsig: &[u8], owner: &Name, rtype: RecordType, ttl: u32, rdata: &[&[u8]]) -> Result<Vec<u8>, ZoneKeyError> {
    let mut canonical: Vec<Vec<u8>> = rdata.iter().map(|r| canonical_rdata(rtype, r)).collect::<Result<_, _>>()?;
    canonical.sort();
    canonical.dedup();
    let mut owner_wire = Vec::with_capacity(owner.len() + 2);
    {
        let mut e = BinEncoder::new(&mut owner_wire);
        e.set_canonical_form(true);
        e.set_name_encoding(NameEncoding::UncompressedLowercase);
        owner.emit(&mut e).map_err(|err| ZoneKeyError::Crypto(err.to_string()))?;
    }
    let mut out = Vec::with_capacity(rrsig.len() + canonical.iter().map(|r| owner_wire.len() + 10 + r.len()).sum::<usize>());
    out.extend_from_slice(rrsig);
    for r in &canonical {
        out.extend_from_slice(&owner_wire);
        out.extend_from_slice(&u16::from(rtype).to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&(r.len() as u16).to_be_bytes());
        out.extend_from_slice(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::dnssec::Verifier;
    use hickory_proto::dnssec::rdata::RRSIG;
    use hickory_proto::rr::rdata::{A, NS};
    use hickory_proto::rr::{DNSClass, Record};
    use hickory_proto::serialize::binary::BinDecoder;

    fn wire(data: &RData) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = BinEncoder::new(&mut out);
        e.set_name_encoding(NameEncoding::Uncompressed);
        data.emit(&mut e).expect("encode");
        out
    }

    fn rrsig(bytes: &[u8]) -> RRSIG {
        let mut d = BinDecoder::new(bytes);
        match RData::read(&mut d, RecordType::RRSIG, hickory_proto::serialize::binary::Restrict::new(bytes.len() as u16)) {
            Ok(RData::DNSSEC(DNSSECRData::RRSIG(sig))) => sig,
            other => panic!("not an RRSIG: {other:?}"),
        }
    }

    /// hickory's verifier accepts our signatures over a lowercase RRset (where its own order
    /// and the canonical one agree), both algorithms; a changed record or TTL is refused.
    #[test]
    fn signatures_verify_and_changes_do_not() {
        for algorithm in [ZoneAlgorithm::EcdsaP256Sha256, ZoneAlgorithm::Ed25519] {
            let (key, pem) = ZoneKey::generate(algorithm).expect("a key");
            let again = ZoneKey::from_pkcs8(&PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).expect("pem")).expect("loads");
            assert_eq!(again.tag(), key.tag(), "the PEM text is the same key");
            let origin = Name::from_ascii("example.test.").expect("name");
            let owner = Name::from_ascii("www.example.test.").expect("name");
            let records: Vec<Record> = ["192.0.2.2", "192.0.2.1"]
                .iter()
                .map(|a| Record::from_rdata(owner.clone(), 300, RData::A(A(a.parse().expect("address")))))
                .collect();
            let rdata: Vec<Vec<u8>> = records.iter().map(|r| wire(&r.data)).collect();
            let refs: Vec<&[u8]> = rdata.iter().map(Vec::as_slice).collect();
            let sig = rrsig(&key.sign_rrset(&origin, &owner, RecordType::A, 300, &refs, 1_000, 2_000_000_000).expect("signs"));
            key.dnskey().verify_rrsig(&owner, DNSClass::IN, &sig, records.iter()).expect("verifies");
            let mut changed = records.clone();
            changed[0].data = RData::A(A("192.0.2.3".parse().expect("address")));
            assert!(key.dnskey().verify_rrsig(&owner, DNSClass::IN, &sig, changed.iter()).is_err(), "a changed record");
            let shorter = &records[..1];
            assert!(key.dnskey().verify_rrsig(&owner, DNSClass::IN, &sig, shorter.iter()).is_err(), "a record left out");
        }
    }

    /// Names in NS RDATA are signed lowercased, whatever their case in the zone.
    #[test]
    fn rdata_names_are_signed_in_lower_case() {
        let (key, _) = ZoneKey::generate(ZoneAlgorithm::Ed25519).expect("a key");
        let origin = Name::from_ascii("example.test.").expect("name");
        let sign = |names: [&str; 2]| {
            let rdata: Vec<Vec<u8>> = names.iter().map(|n| wire(&RData::NS(NS(Name::from_ascii(n).expect("name"))))).collect();
            let refs: Vec<&[u8]> = rdata.iter().map(Vec::as_slice).collect();
            key.sign_rrset(&origin, &origin, RecordType::NS, 3600, &refs, 1_000, 2_000_000_000).expect("signs")
        };
        // Ed25519 is deterministic: the same data signed gives the same signature.
        assert_eq!(sign(["ns1.example.test.", "NS2.example.test."]), sign(["ns2.example.test.", "ns1.example.test."]));
    }

    #[test]
    fn key_files_only_their_owner_reads_and_nothing_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("zone.key");
        let key = ZoneKey::create(&path, ZoneAlgorithm::EcdsaP256Sha256).expect("created");
        assert_eq!(std::fs::metadata(&path).expect("file").permissions().mode() & 0o777, 0o600);
        assert_eq!(ZoneKey::load(&path).expect("loads").tag(), key.tag());
        assert!(matches!(ZoneKey::create(&path, ZoneAlgorithm::Ed25519), Err(ZoneKeyError::Exists { .. })));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = ZoneKey::load(&path).expect_err("others may read it");
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(&path, "not a key").expect("write");
        assert!(matches!(ZoneKey::load(&path), Err(ZoneKeyError::NotPem { .. })));
        let debug = format!("{key:?}");
        assert!(debug.contains("tag") && !debug.contains("PRIVATE"), "{debug}");
    }

    /// The DS matches what BIND's `dnssec-dsfromkey -2` printed for the same DNSKEY: checked
    /// through its key tag and digest length here; the end-to-end test compares with BIND.
    #[test]
    fn ds_digest_is_sha256_of_the_dnskey() {
        let (key, _) = ZoneKey::generate(ZoneAlgorithm::EcdsaP256Sha256).expect("a key");
        let origin = Name::from_ascii("example.test.").expect("name");
        let ds = key.ds(&origin).expect("ds");
        assert_eq!((ds.key_tag(), ds.digest().len()), (key.tag(), 32));
        assert!(ds.covers(&origin, key.dnskey()).expect("compares"));
        assert_eq!(key.public_key().len(), 64, "P-256: X and Y, no 0x04 prefix");
    }
}
