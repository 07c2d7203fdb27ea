//! `dnsplan zone key new` and `dnsplan zone ds`: a zone's DNSSEC signing key, made and shown on
//! this machine (`dnsplan_common::dnssec`). No control API is asked, and the private key is
//! never printed: only its key tag, DS, DNSKEY and public key.

use crate::commands::{ZoneCommand, ZoneKeyCommand};
use crate::output::Format;
use anyhow::Context;
use dnsplan_common::DnsName;
use dnsplan_common::dnssec::{ZoneAlgorithm, ZoneKey};
use hickory_proto::rr::Name;
use std::path::Path;

/// The TTL of the DS record line printed for the parent zone.
pub const DS_TTL: u32 = 3600;

/// Runs `zone key new` or `zone ds` (any other zone command asks a control API: an error here),
/// printing on stdout. `format` is `--output`.
pub fn run(command: ZoneCommand, format: Format) -> anyhow::Result<()> {
    let json = match format {
        Format::Json => true,
        Format::Text => false,
        Format::Toml => anyhow::bail!("--output toml is for `dnsplan plans show` (the file `plans publish` reads); use text or json"),
    };
    let text = match command {
        ZoneCommand::Key { command: ZoneKeyCommand::New { file, origin, algorithm } } => new_key(&file, &origin, algorithm, json)?,
        ZoneCommand::Ds { key, origin, json: json_flag } => {
            let key = ZoneKey::load(&key)?;
            let facts = KeyFacts::of(&key, &origin)?;
            if json || json_flag { facts.json()? } else { format!("{}\n", facts.ds_line) }
        }
        _ => anyhow::bail!("this zone command asks the control API; it is not one of `zone key new` or `zone ds`"),
    };
    crate::out_raw!("{text}");
    Ok(())
}

/// Writes a new key of `algorithm` for `origin` to `file`; what to print for the operator.
fn new_key(file: &Path, origin: &DnsName, algorithm: ZoneAlgorithm, json: bool) -> anyhow::Result<String> {
    // Before the key is written: a path the config cannot name is refused with nothing made.
    let absolute = std::path::absolute(file).with_context(|| format!("cannot resolve {}", file.display()))?;
    let absolute = absolute
        .to_str()
        .with_context(|| format!("{} is not UTF-8: authority.toml could not name it; choose another file", file.display()))?
        .to_owned();
    let key = ZoneKey::create(file, algorithm)?;
    let facts = KeyFacts::of(&key, origin)?;
    if json {
        let mut value = facts.value();
        value["file"] = serde_json::Value::String(absolute);
        value["trust_anchor"] = serde_json::Value::String(facts.trust_anchor());
        return Ok(serde_json::to_string_pretty(&value)? + "\n");
    }
    let origin = &facts.origin;
    Ok(format!(
        "zone key     {absolute} (mode 0600; the private key is never printed: keep it on the authorities)\n\
         key tag      {tag}, algorithm {number} ({name})\n\
         \n\
         # authority.toml: sign the zone {origin} with it (a relative path is read from the config's directory)\n\
         [dns_zone.dnssec]\n\
         key_file = {key_file}\n\
         \n\
         # the DS record for the parent zone, once the signed zone is served everywhere\n\
         # (`dnsplan zone ds --key FILE --dns-zone {origin}` prints it again):\n\
         {ds_line}\n\
         \n\
         # a trust anchor to test with before the DS is in place, in a file for delv:\n\
         #   delv -a FILE +root={origin} @AUTHORITY {origin} SOA\n\
         {anchor}\n",
        tag = facts.key_tag,
        number = facts.algorithm,
        name = algorithm_name(algorithm),
        key_file = toml_string(&absolute),
        ds_line = facts.ds_line,
        anchor = facts.trust_anchor(),
    ))
}

fn algorithm_name(algorithm: ZoneAlgorithm) -> &'static str {
    match algorithm {
        ZoneAlgorithm::EcdsaP256Sha256 => "ECDSAP256SHA256",
        ZoneAlgorithm::Ed25519 => "ED25519",
    }
}

/// The public facts of a zone's key: nothing here is private.
struct KeyFacts {
    origin: DnsName,
    key_tag: u16,
    algorithm: u8,
    digest_type: u8,
    /// The DS digest, upper-case hex as zone files write it.
    digest: String,
    /// The DNSKEY's flags, protocol, algorithm and public key, as a zone file writes them.
    dnskey: String,
    /// The public key in base64.
    public_key: String,
    /// `ORIGIN TTL IN DS TAG ALG 2 HEX`.
    ds_line: String,
}

impl KeyFacts {
    fn of(key: &ZoneKey, origin: &DnsName) -> anyhow::Result<KeyFacts> {
        let name = Name::from_ascii(origin.as_str()).with_context(|| format!("zone {origin}"))?;
        let ds = key.ds(&name)?;
        let dnskey = key.dnskey().to_string();
        // "FLAGS 3 ALG BASE64": the last field is the public key.
        let public_key = dnskey.rsplit_once(' ').map(|(_, k)| k.to_owned()).context("a DNSKEY without its public key")?;
        Ok(KeyFacts {
            origin: origin.clone(),
            key_tag: ds.key_tag(),
            algorithm: key.algorithm().number(),
            digest_type: u8::from(ds.digest_type()),
            digest: ds.digest().iter().map(|b| format!("{b:02X}")).collect(),
            dnskey,
            public_key,
            ds_line: format!("{origin} {DS_TTL} IN DS {ds}"),
        })
    }

    /// BIND's `trust-anchors` statement of the key, as delv's `-a` file reads it.
    fn trust_anchor(&self) -> String {
        let (fields, key) = self.dnskey.rsplit_once(' ').unwrap_or((&self.dnskey, ""));
        format!("trust-anchors {{ {} static-key {fields} \"{key}\"; }};", self.origin)
    }

    fn value(&self) -> serde_json::Value {
        serde_json::json!({
            "origin": self.origin.as_str(),
            "key_tag": self.key_tag,
            "algorithm": self.algorithm,
            "digest_type": self.digest_type,
            "digest": self.digest,
            "public_key": self.public_key,
            "ds": self.ds_line,
        })
    }

    fn json(&self) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(&self.value())? + "\n")
    }
}

fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| format!("{text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The printed TOML loads and names the key's file; the printed DS and trust anchor are the
    /// key's; nothing of the PEM file is printed.
    #[test]
    fn new_key_prints_public_facts_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("example.key");
        let origin = DnsName::parse("Example.ORG").unwrap();
        let text = new_key(&file, &origin, ZoneAlgorithm::Ed25519, false).unwrap();
        let pem = std::fs::read_to_string(&file).unwrap();
        for line in pem.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!text.contains(line), "private key material printed: {text}");
        }
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        let toml_part: String = text.lines().skip_while(|l| *l != "[dns_zone.dnssec]").take(2).map(|l| format!("{l}\n")).collect();
        let parsed: toml::Value = toml::from_str(&toml_part).unwrap();
        assert_eq!(parsed["dns_zone"]["dnssec"]["key_file"].as_str(), Some(file.to_str().unwrap()));
        let key = ZoneKey::load(&file).unwrap();
        let facts = KeyFacts::of(&key, &origin).unwrap();
        assert!(text.contains(&format!("\nexample.org. 3600 IN DS {} 15 2 {}\n", key.tag(), facts.digest)), "{text}");
        assert!(text.contains(&format!("trust-anchors {{ example.org. static-key 257 3 15 \"{}\"; }};", facts.public_key)), "{text}");
        let err = new_key(&file, &origin, ZoneAlgorithm::Ed25519, false).unwrap_err();
        assert!(err.to_string().contains("exists already"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), pem);
    }

    #[test]
    fn ds_json_holds_the_public_facts() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.pem");
        let origin = DnsName::parse("example.org.").unwrap();
        let key = ZoneKey::create(&file, ZoneAlgorithm::EcdsaP256Sha256).unwrap();
        let value: serde_json::Value = serde_json::from_str(&KeyFacts::of(&key, &origin).unwrap().json().unwrap()).unwrap();
        assert_eq!(value["origin"], "example.org.");
        assert_eq!(value["key_tag"], key.tag());
        assert_eq!((value["algorithm"].as_u64(), value["digest_type"].as_u64()), (Some(13), Some(2)));
        assert_eq!(value["digest"].as_str().map(str::len), Some(64));
        assert_eq!(value["public_key"].as_str().map(str::len), Some(88), "64 bytes of P-256 public key in base64");
    }
}
