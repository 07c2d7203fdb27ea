//! A signed zone (`[dns_zone.dnssec]`), validated by a resolver we did not write: the shipped
//! `dnsplan-authority` serves a zone of every kind of name, and BIND's `delv`, given the
//! zone's key as its only trust anchor, resolves each name from it and must say "fully
//! validated": positive answers, CNAME chains, NXDOMAIN (also at the end of a chain), NODATA,
//! an empty non-terminal, wildcard answers and wildcard NODATA, the DS at a secure delegation
//! and its absence at an insecure one, the apex's DNSKEY, CDS and CDNSKEY, and a managed
//! endpoint's addresses. Then the plan changes (other addresses, a name added):
//! the names it touched, and the names beside them in the NSEC chain, still validate, signed
//! again when the state was swapped in. A trust anchor of another key fails (the check
//! bites). `delv` exits 0 either way: its first line says whether it validated.
//!
//! `delv` (bind9-dnsutils) must be installed (`.ci/run` installs it): a missing binary fails.

mod support;

use dnsplan_common::dnssec::{ZoneAlgorithm, ZoneKey};
use dnsplan_common::store::remote::RemoteStore;
use hickory_proto::rr::RecordType;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::{AuthorityProcess, TOKEN, config_text, endpoint, plan, publish_and_apply, target, until};

const ZONE: &str = "\
$ORIGIN example.test.
$TTL 300
ns1 IN A 192.0.2.1
www IN A 192.0.2.80
www IN AAAA 2001:db8::80
alias IN CNAME www
c1 IN CNAME c2
c2 IN CNAME www
gone IN CNAME missing
mx IN MX 10 mail
mail IN A 192.0.2.25
txt IN TXT \"hello\" \"world\"
MiXeD IN A 192.0.2.77
a.b.ent IN A 192.0.2.88
*.wild IN A 192.0.2.7
*.wild IN TXT \"wild\"
x.wild IN MX 10 mail
sub 3600 IN NS ns.sub
sub 3600 IN DS 12345 13 2 49FD46E6C4B45C55D4AC69CBD3CD34AC1AFE51DE8B1A9E1D7E3F0F3B5E6C7D8A
ns.sub 3600 IN A 192.0.2.53
sub2 3600 IN NS ns.elsewhere.test.
";

/// `delv`'s verdict on `name` `qtype` asked of `server` with `anchor`: its first line, and
/// everything it printed.
fn delv(anchor: &Path, server: SocketAddr, name: &str, qtype: &str) -> (String, String) {
    let out = Command::new("delv")
        .arg("-a")
        .arg(anchor)
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), name, qtype, "+root=example.test"])
        .output()
        .unwrap_or_else(|err| panic!("delv (Debian package bind9-dnsutils) is needed: {err}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (stdout.lines().next().unwrap_or_default().to_owned(), all)
}

/// Every question validates with `anchor`: `(name, type, negative)`.
fn all_validate(anchor: &Path, server: SocketAddr, questions: &[(&str, &str, bool)]) {
    let mut failed = Vec::new();
    for &(name, qtype, negative) in questions {
        let (verdict, all) = delv(anchor, server, name, qtype);
        let want = if negative { "; negative response, fully validated" } else { "; fully validated" };
        if verdict != want {
            failed.push(format!("{name} {qtype}: {verdict:?}, not {want:?}\n{all}"));
        }
    }
    assert!(failed.is_empty(), "{} of {} not validated:\n{}", failed.len(), questions.len(), failed.join("\n"));
}

fn anchor_file(dir: &Path, file: &str, key: &ZoneKey) -> std::path::PathBuf {
    let path = dir.join(file);
    let text = format!(
        "trust-anchors {{ example.test. static-key 257 3 {} \"{}\"; }};\n",
        key.algorithm().number(),
        data_encoding::BASE64.encode(key.public_key())
    );
    std::fs::write(&path, text).expect("anchor");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_zone_validates_in_bind_and_stays_valid_as_the_plan_changes() -> anyhow::Result<()> {
    for algorithm in [ZoneAlgorithm::EcdsaP256Sha256, ZoneAlgorithm::Ed25519] {
        signed_zone_validates(algorithm).await?;
    }
    Ok(())
}

async fn signed_zone_validates(algorithm: ZoneAlgorithm) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let key = ZoneKey::create(&dir.path().join("zone.key"), algorithm)?;
    let port = dnsplan_tests::knot::free_port()?;
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let text = config_text(&dir.path().join("data"), 2).replacen("listen = [\"127.0.0.1:0\"]", &format!("listen = [\"{server}\"]"), 1)
        + "[dns_zone.dnssec]\nkey_file = \"zone.key\"\n";
    let authority = AuthorityProcess::start_zone(dir.path(), &text, ZONE)?;
    let store = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let api = endpoint(
        30,
        vec![target("10.0.0.1", "a", 3), target("10.0.0.2", "a", 1), target("10.0.0.3", "b", 1), target("2001:db8::1", "a", 1)],
    );
    publish_and_apply(&store, &plan(1, &[("api.example.test.", api)])).await?;
    until(server, "api.example.test.", RecordType::A, Duration::from_secs(20), |m| !m.answers.is_empty()).await?;

    let anchor = anchor_file(dir.path(), "anchor.conf", &key);
    all_validate(
        &anchor,
        server,
        &[
            ("example.test.", "SOA", false),
            ("example.test.", "NS", false),
            ("example.test.", "DNSKEY", false),
            ("example.test.", "CDS", false),
            ("example.test.", "CDNSKEY", false),
            ("example.test.", "TXT", true),
            ("www.example.test.", "A", false),
            ("WWW.Example.TEST.", "AAAA", false),
            ("www.example.test.", "MX", true),
            ("alias.example.test.", "A", false),
            ("c1.example.test.", "AAAA", false),
            // delv validates the CNAME (its first line) and then caches the target's
            // NXDOMAIN, the NSEC proofs printed after it.
            ("gone.example.test.", "A", false),
            ("nope.example.test.", "A", true),
            ("deep.nope.example.test.", "AAAA", true),
            ("zzz.example.test.", "A", true),
            ("mx.example.test.", "MX", false),
            ("mx.example.test.", "A", true),
            ("txt.example.test.", "TXT", false),
            ("mixed.example.test.", "A", false),
            ("b.ent.example.test.", "A", true),
            ("ent.example.test.", "TXT", true),
            ("a.b.ent.example.test.", "A", false),
            ("x.b.ent.example.test.", "A", true),
            ("anything.wild.example.test.", "A", false),
            ("a.b.wild.example.test.", "TXT", false),
            ("anything.wild.example.test.", "AAAA", true),
            ("x.wild.example.test.", "MX", false),
            ("x.wild.example.test.", "A", true),
            ("wild.example.test.", "A", true),
            ("sub.example.test.", "DS", false),
            ("sub2.example.test.", "DS", true),
            ("api.example.test.", "A", false),
            ("api.example.test.", "AAAA", false),
            ("api.example.test.", "TXT", true),
        ],
    );

    // The plan changes: api's addresses, and a name added (`apz`, after `api` in the chain):
    // the swap signs what it changed and its neighbour's NSEC.
    let api = endpoint(30, vec![target("10.0.0.9", "a", 1)]);
    let apz = endpoint(60, vec![target("10.0.1.1", "a", 1), target("2001:db8::2", "a", 1)]);
    publish_and_apply(&store, &plan(2, &[("api.example.test.", api), ("apz.example.test.", apz)])).await?;
    until(server, "apz.example.test.", RecordType::A, Duration::from_secs(20), |m| !m.answers.is_empty()).await?;
    until(server, "api.example.test.", RecordType::A, Duration::from_secs(20), |m| support::addresses(m).len() == 1).await?;
    all_validate(
        &anchor,
        server,
        &[
            ("api.example.test.", "A", false),
            ("apz.example.test.", "A", false),
            ("apz.example.test.", "AAAA", false),
            ("apy.example.test.", "A", true),
            ("aq.example.test.", "A", true),
            ("example.test.", "SOA", false),
        ],
    );

    let wrong = ZoneKey::generate(algorithm)?.0;
    let other = anchor_file(dir.path(), "other.conf", &wrong);
    let (verdict, all) = delv(&other, server, "www.example.test.", "A");
    assert_ne!(verdict, "; fully validated", "a trust anchor of another key must not validate: {all}");
    Ok(())
}
