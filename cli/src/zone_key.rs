//! `dnsplan zone key new|init|list|roll|ds-seen` and `dnsplan zone ds`: a zone's DNSSEC keys, a
//! key file or a key directory with its rollover schedule, made and shown on this machine
//! (`dnsplan_common::dnssec`, `dnssec_keys`). No control API is asked: the authority reads its
//! key directory again every 30 s. The private key is never printed: only key tags, DS,
//! DNSKEY and public keys.

use crate::commands::{ZoneCommand, ZoneKeyCommand};
use crate::output::Format;
use anyhow::Context;
use dnsplan_common::DnsName;
use dnsplan_common::dnssec::{ZoneAlgorithm, ZoneKey};
use dnsplan_common::dnssec_keys::{At, KeyDir, KeyEntry, KeyRole, Policy, SigningKeys};
use hickory_proto::rr::Name;
use std::path::Path;

/// The TTL of the DS record line printed for the parent zone.
pub const DS_TTL: u32 = 3600;

/// Runs `zone key ...` or `zone ds` (any other zone command asks a control API: an error here),
/// printing on stdout. `format` is `--output`.
pub async fn run(command: ZoneCommand, format: Format) -> anyhow::Result<()> {
    let json = match format {
        Format::Json => true,
        Format::Text => false,
        Format::Toml => anyhow::bail!("--output toml is for `dnsplan plans show` (the file `plans publish` reads); use text or json"),
    };
    let text = match command {
        ZoneCommand::Key { command: ZoneKeyCommand::New { file, origin, algorithm } } => new_key(&file, &origin, algorithm, json)?,
        ZoneCommand::Key {
            command:
                ZoneKeyCommand::Init {
                    dir,
                    origin,
                    algorithm,
                    from_key,
                    zsk_lifetime_days,
                    dnskey_ttl_secs,
                    propagation_delay_secs,
                    max_ttl_secs,
                    parent_ds_ttl_secs,
                },
        } => {
            let policy = Policy { zsk_lifetime_days, dnskey_ttl_secs, propagation_delay_secs, max_ttl_secs, parent_ds_ttl_secs };
            init(&dir, &origin, algorithm, from_key.as_deref(), policy, json)?
        }
        ZoneCommand::Key { command: ZoneKeyCommand::Kek { file } } => {
            let kek = dnsplan_common::dnssec_share::Kek::create(&file)?;
            if json {
                serde_json::to_string_pretty(&serde_json::json!({ "file": file, "kek_id": kek.id() }))? + "\n"
            } else {
                format!(
                    "key-encryption key {} (id {}, mode 0600): copy it to every authority of the zone, then\n\n\
                     # authority.toml: the key directory shared through the store\n\
                     [dns_zone.dnssec]\n\
                     key_dir = \"keys\"\n\
                     kek_file = {}\n",
                    file.display(),
                    kek.id(),
                    toml_string(&std::path::absolute(&file).unwrap_or(file.clone()).to_string_lossy())
                )
            }
        }
        ZoneCommand::Key { command: ZoneKeyCommand::List { dir } } => list(&dir, json)?,
        ZoneCommand::Key { command: ZoneKeyCommand::Roll { dir, zsk: _, ksk } } => {
            same_owner(&dir)?;
            let _lock = KeyDir::lock(&dir)?;
            let now = now();
            let mut keys = KeyDir::load(&dir, now)?;
            let done = if ksk { keys.roll_ksk(now)? } else { keys.roll_zsk(now)? };
            keys.save()?;
            format!(
                "{done}\n(the authorities serving {} read the directory again within their key_check_secs, 30 s by default)\n",
                keys.zone()
            )
        }
        ZoneCommand::Key { command: ZoneKeyCommand::DsSeen { dir, parent } } => ds_seen(&dir, parent.as_deref()).await?,
        ZoneCommand::Ds { key, key_dir, origin, json: json_flag } => {
            let json = json || json_flag;
            let all = match (key, key_dir) {
                (Some(key), _) => {
                    let origin = origin.context("--dns-zone names the zone of --key")?;
                    vec![KeyFacts::of(&ZoneKey::load(&key)?, &origin)?]
                }
                (None, Some(dir)) => {
                    let now = now();
                    let keys = KeyDir::load(&dir, now)?;
                    let origin = DnsName::parse(keys.zone()).with_context(|| format!("zone {}", keys.zone()))?;
                    keys.view(now)?.cds.iter().map(|k| KeyFacts::of(k, &origin)).collect::<anyhow::Result<Vec<_>>>()?
                }
                (None, None) => anyhow::bail!("give --key FILE or --key-dir DIR"),
            };
            if json {
                match all.as_slice() {
                    [one] => one.json()?,
                    _ => serde_json::to_string_pretty(&all.iter().map(KeyFacts::value).collect::<Vec<_>>())? + "\n",
                }
            } else {
                all.iter().map(|f| format!("{}\n", f.ds_line)).collect()
            }
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

/// Now, in seconds since the epoch.
fn now() -> At {
    At(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

/// `zone key init`: the directory made; what to print.
fn init(
    dir: &Path,
    origin: &DnsName,
    algorithm: ZoneAlgorithm,
    from_key: Option<&Path>,
    policy: Policy,
    json: bool,
) -> anyhow::Result<String> {
    let absolute = std::path::absolute(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    let absolute = absolute
        .to_str()
        .with_context(|| format!("{} is not UTF-8: authority.toml could not name it; choose another directory", dir.display()))?
        .to_owned();
    let now = now();
    let keys = KeyDir::init(dir, origin.as_str(), algorithm, from_key, policy, now)?;
    let view = keys.view(now)?;
    let ksk = KeyFacts::of(&view.cds[0], origin)?;
    let zsk = keys.entries().iter().find(|e| e.role == KeyRole::Zsk).context("a ZSK was made")?;
    if json {
        let mut value = ksk.value();
        value["key_dir"] = serde_json::Value::String(absolute);
        value["zsk_key_tag"] = serde_json::json!(zsk.tag);
        value["zsk_signs_from"] = serde_json::Value::String(zsk.active.text());
        value["trust_anchor"] = serde_json::Value::String(ksk.trust_anchor());
        return Ok(serde_json::to_string_pretty(&value)? + "\n");
    }
    let zsk_signs = if zsk.active <= now { "now".to_string() } else { format!("from {} (once every cache has it)", zsk.active.text()) };
    let lifetime = match keys.policy().zsk_lifetime_days {
        0 => "never rolled by itself (`dnsplan zone key roll --zsk DIR`)".to_string(),
        days => format!("{days} days, then rolled by the authority"),
    };
    let ds_note = if from_key.is_some() {
        "unchanged: the KSK is the key the parent has the DS of"
    } else {
        "for the parent zone, once the signed zone is served everywhere"
    };
    Ok(format!(
        "key directory {absolute} (mode 0700; private keys are never printed)\n\
         KSK           tag {ksk_tag}, algorithm {number} ({name}){from}\n\
         ZSK           tag {zsk_tag}, signs {zsk_signs}\n\
         ZSK lifetime  {lifetime}\n\
         \n\
         # authority.toml: sign the zone {origin} with these keys (`dnsplan zone key list DIR` shows them);\n\
         # for a zone of [[zones]], the same key under [zones.dnssec]\n\
         [dns_zone.dnssec]\n\
         key_dir = {key_dir}\n\
         \n\
         # the DS record, {ds_note}\n\
         # (`dnsplan zone ds --key-dir DIR` prints it again):\n\
         {ds_line}\n\
         \n\
         # a trust anchor to test with before the DS is in place, in a file for delv:\n\
         #   delv -a FILE +root={origin} @AUTHORITY {origin} SOA\n\
         {anchor}\n",
        ksk_tag = ksk.key_tag,
        number = ksk.algorithm,
        name = algorithm_name(view.cds[0].algorithm()),
        from = if from_key.is_some() { " (the zone's key file of today)" } else { "" },
        zsk_tag = zsk.tag,
        key_dir = toml_string(&absolute),
        ds_line = ksk.ds_line,
        anchor = ksk.trust_anchor(),
    ))
}

/// A key's state at `now`, as `zone key list` shows it.
fn state(entry: &KeyEntry, view: &SigningKeys, now: At) -> &'static str {
    let tag_in = |keys: &[std::sync::Arc<ZoneKey>]| keys.iter().any(|k| k.tag() == entry.tag);
    if entry.removed.is_some_and(|r| r <= now) {
        "removed"
    } else if entry.published > now {
        "scheduled"
    } else if entry.role == KeyRole::Ksk {
        if tag_in(&view.cds) { "signing, in CDS" } else { "signing" }
    } else if tag_in(&view.zsk) {
        "signing"
    } else if entry.served.is_none() {
        "not yet served"
    } else if entry.active > now {
        "published"
    } else {
        "retired"
    }
}

/// `zone key list`.
fn list(dir: &Path, json: bool) -> anyhow::Result<String> {
    let now = now();
    let keys = KeyDir::load(dir, now)?;
    let view = keys.view(now)?;
    let next = keys.next_event(now);
    if json {
        let entries: Vec<serde_json::Value> = keys
            .entries()
            .iter()
            .map(|e| {
                let mut value = serde_json::to_value(e).unwrap_or_default();
                value["state"] = serde_json::Value::String(state(e, &view, now).into());
                value
            })
            .collect();
        let value = serde_json::json!({
            "zone": keys.zone(),
            "policy": serde_json::to_value(keys.policy())?,
            "keys": entries,
            "next_event": next.map(At::text),
        });
        return Ok(serde_json::to_string_pretty(&value)? + "\n");
    }
    let p = keys.policy();
    let mut out = format!(
        "zone {}: ZSK lifetime {} days, DNSKEY TTL {} s, propagation delay {} s, max TTL {} s, parent DS TTL {} s\n",
        keys.zone(),
        p.zsk_lifetime_days,
        p.dnskey_ttl_secs,
        p.propagation_delay_secs,
        p.max_ttl_secs,
        p.parent_ds_ttl_secs
    );
    out += &format!(
        "{:<6} {:<4} {:<3} {:<16} {:<21} {:<21} {:<21} {:<21}\n",
        "TAG", "ROLE", "ALG", "STATE", "PUBLISHED", "ACTIVE", "RETIRED", "REMOVED"
    );
    let time = |t: Option<At>| t.map_or_else(|| "-".to_string(), At::text);
    for e in keys.entries() {
        let role = if e.role == KeyRole::Ksk { "KSK" } else { "ZSK" };
        out += &format!(
            "{:<6} {:<4} {:<3} {:<16} {:<21} {:<21} {:<21} {:<21}\n",
            e.tag,
            role,
            e.algorithm,
            state(e, &view, now),
            e.published.text(),
            e.active.text(),
            time(e.retired),
            time(e.removed)
        );
    }
    out += &match next {
        Some(at) => format!("next change of the keys served: {}\n", at.text()),
        None => "no change of the keys served is scheduled (the authority schedules the next ZSK roll)\n".to_string(),
    };
    Ok(out)
}

/// Refuses to write the key directory `dir` as another user than the owner of its
/// `keys.toml` (a command run with sudo would leave files the authority cannot read).
fn same_owner(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let schedule = dir.join(dnsplan_common::dnssec_keys::KEYS_FILE);
    let owner = std::fs::metadata(&schedule).with_context(|| format!("{}", schedule.display()))?.uid();
    // The owner of /proc/self is this process's effective user.
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).with_context(|| "cannot tell which user this is (/proc/self)")?;
    anyhow::ensure!(
        owner == me,
        "{} belongs to uid {owner}, and this runs as uid {me}: run it as the directory's owner (sudo -u ...), the user the authority reads the keys as, so that the files written stay readable to it",
        schedule.display()
    );
    Ok(())
}

/// `zone key ds-seen`: with `parent`, refused unless that server answers the new KSK's DS.
async fn ds_seen(dir: &Path, parent: Option<&str>) -> anyhow::Result<String> {
    same_owner(dir)?;
    let _lock = KeyDir::lock(dir)?;
    let now = now();
    let mut keys = KeyDir::load(dir, now)?;
    let origin = DnsName::parse(keys.zone()).with_context(|| format!("zone {}", keys.zone()))?;
    let named = keys.view(now)?.cds.first().cloned().context("no KSK is named by CDS")?;
    let mut checked = String::new();
    if let Some(parent) = parent {
        let server: std::net::SocketAddr = match parent.parse() {
            Ok(addr) => addr,
            Err(_) => std::net::SocketAddr::new(
                parent.parse().with_context(|| format!("--parent {parent:?}: not an ADDRESS or ADDRESS:PORT"))?,
                53,
            ),
        };
        let want = KeyFacts::of(&named, &origin)?;
        let reply = dnsplan_common::dns_probe::query_message(
            server,
            origin.as_str(),
            dnsplan_common::dns_probe::RecordType::DS,
            std::time::Duration::from_secs(3),
        )
        .await
        .with_context(|| format!("asking {server} for the DS of {origin}"))?;
        let served: Vec<(u16, u8, String)> = reply
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                hickory_proto::rr::RData::DNSSEC(hickory_proto::dnssec::rdata::DNSSECRData::DS(ds)) => {
                    Some((ds.key_tag(), u8::from(ds.algorithm()), ds.digest().iter().map(|b| format!("{b:02X}")).collect()))
                }
                _ => None,
            })
            .collect();
        if !served.iter().any(|(tag, algorithm, digest)| *tag == want.key_tag && *algorithm == want.algorithm && *digest == want.digest) {
            let tags: Vec<String> = served.iter().map(|(tag, _, _)| tag.to_string()).collect();
            anyhow::bail!(
                "the parent server {server} answers {} for the DS of {origin} ({}), not KSK {}'s: give the parent `{}` and run this again once it serves it",
                reply.metadata.response_code,
                if tags.is_empty() { "no DS".to_string() } else { format!("key tags {}", tags.join(", ")) },
                want.key_tag,
                want.ds_line
            );
        }
        checked = format!("the parent server {server} serves KSK {}'s DS\n", want.key_tag);
    }
    let (tag, done) = keys.ds_seen(now)?;
    anyhow::ensure!(tag == named.tag(), "the KSK CDS names ({}) is not the newest ({tag})", named.tag());
    keys.save()?;
    Ok(format!("{checked}{done}\n"))
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
