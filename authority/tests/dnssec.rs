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
//! Then the checkers a registry runs: `dnssec-verify` (bind9-utils) and Knot's `kzonecheck`
//! (knot-dnssecutils) accept the zone's whole AXFR, and a BIND `named` running as a validating
//! resolver (the zone's key its only trust anchor, forwarding to the authority) answers every
//! kind of name with the AD bit. One signature changed in the AXFR: both checkers refuse it.
//!
//! `delv`, `dig` (bind9-dnsutils), `dnssec-verify`, `named` and `kzonecheck` must be installed
//! (`./test` installs them): a missing binary fails.

mod support;

use dnsplan_common::dnssec::{ZoneAlgorithm, ZoneKey};
use dnsplan_common::store::remote::RemoteStore;
use hickory_proto::rr::RecordType;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::{AuthorityProcess, TOKEN, config_text, endpoint, plan, publish_and_apply, target, until};

const KEY_NAME: &str = "dnsplan-xfr.";
/// 32 bytes, base64.
const SECRET: &str = "ZG5zcGxhbi10cmFuc2Zlci10ZXN0LXNlY3JldC0zMmI=";

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
    delv_in("example.test.", anchor, server, name, qtype)
}

/// As `delv`, for a name of the zone `origin`.
fn delv_in(origin: &str, anchor: &Path, server: SocketAddr, name: &str, qtype: &str) -> (String, String) {
    let out = Command::new("delv")
        .arg("-a")
        .arg(anchor)
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), name, qtype, &format!("+root={}", origin.trim_end_matches('.'))])
        .output()
        .unwrap_or_else(|err| panic!("delv (Debian package bind9-dnsutils) is needed: {err}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (stdout.lines().next().unwrap_or_default().to_owned(), all)
}

/// Every question validates with `anchor`: `(name, type, negative)`.
fn all_validate(anchor: &Path, server: SocketAddr, questions: &[(&str, &str, bool)]) {
    all_validate_in("example.test.", anchor, server, questions)
}

/// As `all_validate`, for names of the zone `origin`.
fn all_validate_in(origin: &str, anchor: &Path, server: SocketAddr, questions: &[(&str, &str, bool)]) {
    let mut failed = Vec::new();
    for &(name, qtype, negative) in questions {
        let (verdict, all) = delv_in(origin, anchor, server, name, qtype);
        let want = if negative { "; negative response, fully validated" } else { "; fully validated" };
        if verdict != want {
            failed.push(format!("{name} {qtype}: {verdict:?}, not {want:?}\n{all}"));
        }
    }
    assert!(failed.is_empty(), "{} of {} not validated:\n{}", failed.len(), questions.len(), failed.join("\n"));
}

fn anchor_file(dir: &Path, file: &str, key: &ZoneKey) -> std::path::PathBuf {
    anchor_file_for("example.test.", dir, file, key)
}

/// As `anchor_file`, for the zone `origin`.
fn anchor_file_for(origin: &str, dir: &Path, file: &str, key: &ZoneKey) -> std::path::PathBuf {
    let path = dir.join(file);
    let text = format!(
        "trust-anchors {{ {origin} static-key 257 3 {} \"{}\"; }};\n",
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
    let port = dnsplan_tests::ports::free_port()?;
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

    // The metric the expiry alert reads: 14 days (the default validity) from the start of the
    // signing's period (7 days: validity minus refresh, counted from the epoch).
    until_expiry(&authority.control, period_start(7)? + 14.0 * 86_400.0, Duration::ZERO).await?;

    let wrong = ZoneKey::generate(algorithm)?.0;
    let other = anchor_file(dir.path(), "other.conf", &wrong);
    let (verdict, all) = delv(&other, server, "www.example.test.", "A");
    assert_ne!(verdict, "; fully validated", "a trust anchor of another key must not validate: {all}");
    Ok(())
}

/// A static zone of the config (`[[zones]]` with `[zones.dnssec]`), beside a signed managed
/// zone, each with its own key: its answers validate in `delv` with its key alone, its whole
/// AXFR passes `dnssec-verify`, and the expiry gauge covers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_zone_of_the_config_is_signed_and_validates() -> anyhow::Result<()> {
    let (dig, verify) = (installed("dig", "bind9-dnsutils"), installed("dnssec-verify", "bind9-utils"));
    let dir = tempfile::tempdir()?;
    ZoneKey::create(&dir.path().join("zone.key"), ZoneAlgorithm::EcdsaP256Sha256)?;
    let key = ZoneKey::create(&dir.path().join("static.key"), ZoneAlgorithm::Ed25519)?;
    std::fs::write(
        dir.path().join("static.db"),
        "$ORIGIN static.test.\n$TTL 300\n@ SOA ns1 hostmaster 2026120701 3600 600 86400 60\n@ NS ns1\nns1 A 192.0.2.1\n\
         www A 192.0.2.80\nwww AAAA 2001:db8::80\nalias CNAME www\na.b.ent TXT \"deep\"\n*.wild A 192.0.2.7\n\
         sub NS ns.sub\nns.sub A 192.0.2.53\nsub DS 12345 13 2 49FD46E6C4B45C55D4AC69CBD3CD34AC1AFE51DE8B1A9E1D7E3F0F3B5E6C7D8A\n",
    )?;
    let port = dnsplan_tests::ports::free_port()?;
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let text = config_text(&dir.path().join("data"), 2).replacen("listen = [\"127.0.0.1:0\"]", &format!("listen = [\"{server}\"]"), 1)
        + &format!("[[dns.transfer.keys]]\nname = \"{KEY_NAME}\"\nsecret = \"{SECRET}\"\n")
        + &format!("[[dns.transfer.secondaries]]\naddress = \"127.0.0.1/32\"\nkey = \"{KEY_NAME}\"\n")
        + "[dns_zone.dnssec]\nkey_file = \"zone.key\"\n"
        + "[[zones]]\norigin = \"static.test.\"\nmaster_file = \"static.db\"\n[zones.dnssec]\nkey_file = \"static.key\"\nsignature_validity_days = 10\nsignature_refresh_days = 4\n";
    let authority = AuthorityProcess::start_zone(dir.path(), &text, ZONE)?;
    until(server, "www.static.test.", RecordType::A, Duration::from_secs(20), |m| !m.answers.is_empty()).await?;

    let anchor = anchor_file_for("static.test.", dir.path(), "static.conf", &key);
    all_validate_in(
        "static.test.",
        &anchor,
        server,
        &[
            ("static.test.", "SOA", false),
            ("static.test.", "DNSKEY", false),
            ("static.test.", "CDS", false),
            ("www.static.test.", "A", false),
            ("www.static.test.", "AAAA", false),
            ("www.static.test.", "MX", true),
            ("alias.static.test.", "AAAA", false),
            ("nope.static.test.", "A", true),
            ("b.ent.static.test.", "TXT", true),
            ("a.b.ent.static.test.", "TXT", false),
            ("x.wild.static.test.", "A", false),
            ("x.wild.static.test.", "TXT", true),
            ("sub.static.test.", "DS", false),
        ],
    );
    // The managed zone's key does not validate the static zone.
    let other = anchor_file_for("static.test.", dir.path(), "other.conf", &ZoneKey::load(&dir.path().join("zone.key"))?);
    let (verdict, all) = delv_in("static.test.", &other, server, "www.static.test.", "A");
    assert_ne!(verdict, "; fully validated", "another zone's key must not validate: {all}");

    // The whole zone, as a secondary gets it, passes BIND's checker.
    let (_, file) = signed_axfr(&dig, port, "static.test.", &dir.path().join("static.axfr"))?;
    let (ok, out) = run(&verify, &["-z", "-o", "static.test.", &file.to_string_lossy()]);
    assert!(ok && out.contains("fully signed"), "dnssec-verify refuses the static zone's AXFR:\n{out}");

    // The expiry gauge is the earliest of both zones: the static zone's 10 days from the start
    // of its period (6 days: 10 minus 4), not the managed zone's (its task looks at once, then
    // every 30 s).
    let in_10_days = (period_start(6)? + 10.0 * 86_400.0).min(period_start(7)? + 14.0 * 86_400.0);
    until_expiry(&authority.control, in_10_days, Duration::from_secs(20)).await
}

/// Polls the authority's `/metrics` at `control` until the expiry gauge
/// (`dnsplan_dnssec_signatures_expire_timestamp_seconds`) is within ten minutes of `want`
/// (seconds since the epoch); fails after `within`, with what it last read.
async fn until_expiry(control: &str, want: f64, within: Duration) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let metrics = reqwest::get(format!("{control}/metrics")).await?.text().await?;
        let expires = metrics
            .lines()
            .find_map(|l| l.strip_prefix("dnsplan_dnssec_signatures_expire_timestamp_seconds "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if expires.is_some_and(|e| (e - want).abs() < 600.0) {
            return Ok(());
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "signatures expire at {expires:?}, not about {want}:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The start of the signing period of `days` days now is in (seconds since the epoch).
fn period_start(days: u64) -> anyhow::Result<f64> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    Ok((now - now % (days * 86_400)) as f64)
}

/// The whole zone `origin` by AXFR from 127.0.0.1@`port` (TSIG-signed), written to `file`
/// without dig's comments and the TSIG record: its text and the file. It must carry RRSIG
/// and NSEC records.
fn signed_axfr(dig: &Path, port: u16, origin: &str, file: &Path) -> anyhow::Result<(String, std::path::PathBuf)> {
    let tsig = format!("hmac-sha256:{KEY_NAME}:{SECRET}");
    let (ok, axfr) = run(dig, &["-p", &port.to_string(), "@127.0.0.1", origin, "AXFR", "+noall", "+answer", "-y", &tsig]);
    anyhow::ensure!(ok && axfr.contains("RRSIG") && axfr.contains("NSEC"), "the AXFR of {origin}:\n{axfr}");
    let zone: String = axfr.lines().filter(|l| !l.starts_with(';') && !l.contains("TSIG")).map(|l| format!("{l}\n")).collect();
    std::fs::write(file, &zone)?;
    Ok((zone, file.to_owned()))
}

/// `program`, installed: a missing one fails, naming its package.
fn installed(program: &str, package: &str) -> std::path::PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/bin", "/sbin"] {
        let path = Path::new(dir).join(program);
        if path.is_file() {
            return path;
        }
    }
    panic!("`{program}` is not installed; install it with `apt-get install -y {package}` (./test does)")
}

/// Runs `program` with `args`: its exit status and everything it printed.
fn run(program: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|err| panic!("{}: {err}", program.display()));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// A BIND `named` as a validating resolver on `port`, forwarding `example.test.` to `server`
/// with `anchor`'s trust anchor; killed when dropped.
struct Resolver(std::process::Child);

impl Drop for Resolver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn resolver(dir: &Path, port: u16, server: SocketAddr, anchor: &Path) -> Resolver {
    let d = dir.display();
    let conf = dir.join("named.conf");
    let anchor = std::fs::read_to_string(anchor).expect("anchor");
    std::fs::write(
        &conf,
        format!(
            "options {{\n  directory \"{d}\";\n  pid-file \"{d}/named.pid\";\n  session-keyfile \"{d}/session.key\";\n  \
             managed-keys-directory \"{d}\";\n  listen-on port {port} {{ 127.0.0.1; }};\n  listen-on-v6 {{ none; }};\n  \
             recursion yes;\n  allow-recursion {{ 127.0.0.1; }};\n  dnssec-validation yes;\n  notify no;\n}};\ncontrols {{ }};\n\
             {anchor}zone \"example.test\" {{ type forward; forward only; forwarders {{ {} port {}; }}; }};\n",
            server.ip(),
            server.port()
        ),
    )
    .expect("named.conf");
    let named = installed("named", "bind9");
    let child = Command::new(named)
        .args(["-g", "-n", "1", "-c"])
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("named.log")).map(std::process::Stdio::from).expect("log"))
        .spawn()
        .expect("named starts");
    Resolver(child)
}

/// `dig` at the resolver on `port`: the flags line's flags and the status.
fn resolve(dig: &Path, port: u16, name: &str, qtype: &str) -> (String, String) {
    let (_, out) = run(dig, &["-p", &port.to_string(), "@127.0.0.1", name, qtype, "+dnssec", "+time=5", "+tries=2"]);
    let header = out.lines().find(|l| l.contains("status:")).unwrap_or_default();
    let status = header.split("status: ").nth(1).and_then(|s| s.split(',').next()).unwrap_or_default().to_owned();
    let flags = out.lines().find(|l| l.contains(";; flags:")).unwrap_or_default();
    let flags = flags.split(";; flags: ").nth(1).and_then(|f| f.split(';').next()).unwrap_or_default().to_owned();
    (flags, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registries_checkers_accept_the_zone_and_a_validating_resolver_sets_ad() -> anyhow::Result<()> {
    let (dig, verify, kzonecheck) =
        (installed("dig", "bind9-dnsutils"), installed("dnssec-verify", "bind9-utils"), installed("kzonecheck", "knot-dnssecutils"));
    let dir = tempfile::tempdir()?;
    let key = ZoneKey::create(&dir.path().join("zone.key"), ZoneAlgorithm::EcdsaP256Sha256)?;
    let port = dnsplan_tests::ports::free_port()?;
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let text = config_text(&dir.path().join("data"), 2).replacen("listen = [\"127.0.0.1:0\"]", &format!("listen = [\"{server}\"]"), 1)
        + &format!("[[dns.transfer.keys]]\nname = \"{KEY_NAME}\"\nsecret = \"{SECRET}\"\n")
        + &format!("[[dns.transfer.secondaries]]\naddress = \"127.0.0.1/32\"\nkey = \"{KEY_NAME}\"\n")
        + "[dns_zone.dnssec]\nkey_file = \"zone.key\"\n";
    let authority = AuthorityProcess::start_zone(dir.path(), &text, ZONE)?;
    let store = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let api = endpoint(30, vec![target("10.0.0.1", "a", 3), target("10.0.0.2", "a", 1), target("2001:db8::1", "a", 1)]);
    publish_and_apply(&store, &plan(1, &[("api.example.test.", api)])).await?;
    until(server, "api.example.test.", RecordType::A, Duration::from_secs(20), |m| !m.answers.is_empty()).await?;

    // The whole zone, as a secondary gets it.
    let (zone, file) = signed_axfr(&dig, port, "example.test.", &dir.path().join("axfr.zone"))?;
    let file_arg = file.to_string_lossy().into_owned();
    let (ok, out) = run(&verify, &["-z", "-o", "example.test.", &file_arg]);
    assert!(ok && out.contains("fully signed"), "dnssec-verify refuses the AXFR:\n{out}");
    let (ok, out) = run(&kzonecheck, &["-o", "example.test.", "-d", "on", &file_arg]);
    assert!(ok, "kzonecheck refuses the AXFR:\n{out}");

    // One signature changed (a byte of www's RRSIG over A): both refuse it.
    let broken: String = zone
        .lines()
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            if fields.first() == Some(&"www.example.test.") && fields.get(3) == Some(&"RRSIG") && fields.get(4) == Some(&"A") {
                let mut line = l.to_owned();
                let at = line.len() - 4;
                let flipped = if &line[at..at + 1] == "A" { "B" } else { "A" };
                line.replace_range(at..at + 1, flipped);
                format!("{line}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_ne!(broken, zone, "a signature was changed");
    let bad = dir.path().join("broken.zone");
    std::fs::write(&bad, &broken)?;
    let bad_arg = bad.to_string_lossy().into_owned();
    let (ok, out) = run(&verify, &["-z", "-o", "example.test.", &bad_arg]);
    assert!(!ok, "dnssec-verify takes a broken signature:\n{out}");
    let (ok, out) = run(&kzonecheck, &["-o", "example.test.", "-d", "on", &bad_arg]);
    assert!(!ok, "kzonecheck takes a broken signature:\n{out}");

    // A validating resolver: AD on every kind of answer.
    let resolver_dir = tempfile::tempdir()?;
    let anchor = anchor_file(dir.path(), "anchor.conf", &key);
    let resolver_port = dnsplan_tests::ports::free_port()?;
    let _resolver = resolver(resolver_dir.path(), resolver_port, server, &anchor);
    let started = std::time::Instant::now();
    while resolve(&dig, resolver_port, "example.test.", "SOA").1.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "named did not answer: {}",
            std::fs::read_to_string(resolver_dir.path().join("named.log"))?
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut wrong = Vec::new();
    for (name, qtype, status) in [
        ("www.example.test.", "A", "NOERROR"),
        ("alias.example.test.", "AAAA", "NOERROR"),
        ("nope.example.test.", "A", "NXDOMAIN"),
        ("gone.example.test.", "A", "NXDOMAIN"),
        ("mx.example.test.", "AAAA", "NOERROR"),
        ("b.ent.example.test.", "A", "NOERROR"),
        ("x.wild.example.test.", "MX", "NOERROR"),
        ("y.wild.example.test.", "TXT", "NOERROR"),
        ("y.wild.example.test.", "AAAA", "NOERROR"),
        ("sub.example.test.", "DS", "NOERROR"),
        ("sub2.example.test.", "DS", "NOERROR"),
        ("api.example.test.", "A", "NOERROR"),
        ("example.test.", "DNSKEY", "NOERROR"),
    ] {
        let (flags, got) = resolve(&dig, resolver_port, name, qtype);
        if got != status || !flags.split(' ').any(|f| f == "ad") {
            wrong.push(format!("{name} {qtype}: {got} (flags {flags}), not {status} with ad"));
        }
    }
    assert!(
        wrong.is_empty(),
        "the validating resolver:\n{}\n{}",
        wrong.join("\n"),
        std::fs::read_to_string(resolver_dir.path().join("named.log"))?
    );
    Ok(())
}

/// A zone added to the store at run time (`PUT /v1/managed/{zone}`) by an authority with
/// `[added_zones.dnssec]`: its key directory is made under `key_root` (0700, a KSK and a ZSK),
/// and the zone is served signed: `delv`, with the directory's KSK as its only trust anchor,
/// validates positive and negative answers and a managed endpoint's addresses once a plan of
/// the zone serves them, and `dnssec-verify` accepts its whole AXFR. Restarted, the authority
/// signs with the same keys (the DNSKEY RRset unchanged, the anchor still validating). With
/// `create_keys = false` and no directory for a zone added then, the zone is not served and
/// its status says why. Its signatures' expiry is in
/// `dnsplan_dnssec_signatures_expire_timestamp_seconds` (checked once: without it, the gauge
/// stayed 0).
///
/// Teeth, checked once: without the signing of added zones, no key directory is made and
/// nothing is signed ("No such file or directory", reading it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_added_at_run_time_is_signed_with_a_key_directory_made_for_it() -> anyhow::Result<()> {
    use dnsplan_common::store::zones::ManagedZones;
    use std::os::unix::fs::PermissionsExt;
    let (dig, verify) = (installed("dig", "bind9-dnsutils"), installed("dnssec-verify", "bind9-utils"));
    let dir = tempfile::tempdir()?;
    let port = dnsplan_tests::ports::free_port()?;
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let base = config_text(&dir.path().join("data"), 2).replacen("listen = [\"127.0.0.1:0\"]", &format!("listen = [\"{server}\"]"), 1)
        + &format!("[[dns.transfer.keys]]\nname = \"{KEY_NAME}\"\nsecret = \"{SECRET}\"\n")
        + &format!("[[dns.transfer.secondaries]]\naddress = \"127.0.0.1/32\"\nkey = \"{KEY_NAME}\"\n");
    let text = base.clone() + "[added_zones.dnssec]\nkey_root = \"keys\"\nalgorithm = \"ed25519\"\n";
    let authority = AuthorityProcess::start_zone(dir.path(), &text, ZONE)?;
    let root = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let shop = dnsplan_common::DnsName::parse("shop.test.")?;
    let master = "$ORIGIN shop.test.\n$TTL 300\n@ SOA ns1 hostmaster 1 3600 600 86400 60\n@ NS ns1\nns1 A 192.0.2.1\n\
                  www A 192.0.2.80\nalias CNAME www\n";
    assert!(root.add_zone(&shop, master).await?);
    until(server, "www.shop.test.", RecordType::A, Duration::from_secs(20), |m| !m.answers.is_empty()).await?;

    let keys = dir.path().join("keys").join("shop.test.");
    assert_eq!(std::fs::metadata(&keys)?.permissions().mode() & 0o777, 0o700, "the key directory is its owner's only");
    let now = dnsplan_common::dnssec_keys::At(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs());
    let view = dnsplan_common::dnssec_keys::KeyDir::load(&keys, now)?.view(now)?;
    assert_eq!(view.ksks[0].algorithm(), ZoneAlgorithm::Ed25519, "the keys are made with added_zones.dnssec.algorithm");
    let anchor = anchor_file_for("shop.test.", dir.path(), "shop.conf", &view.ksks[0]);
    let questions = [
        ("shop.test.", "SOA", false),
        ("shop.test.", "DNSKEY", false),
        ("shop.test.", "CDS", false),
        ("www.shop.test.", "A", false),
        ("www.shop.test.", "AAAA", true),
        ("alias.shop.test.", "A", false),
        ("nope.shop.test.", "A", true),
    ];
    all_validate_in("shop.test.", &anchor, server, &questions);

    // A plan of the zone: its endpoint's addresses are signed as they are swapped in.
    let zone = root.zone(&shop).await?;
    let mut api = plan(1, &[("www.example.test.", endpoint(60, vec![target("192.0.2.10", "a", 1)]))]).into_plan();
    api.dns_zone = shop.clone();
    api.endpoints = [(
        dnsplan_common::DnsName::parse("api.shop.test.")?,
        endpoint(60, vec![target("192.0.2.10", "a", 1), target("192.0.2.11", "b", 1)]),
    )]
    .into_iter()
    .collect();
    publish_and_apply(&zone, &dnsplan_common::ValidatedPlan::new(api)?).await?;
    until(server, "api.shop.test.", RecordType::A, Duration::from_secs(20), |m| m.answers.len() == 2).await?;
    all_validate_in("shop.test.", &anchor, server, &[("api.shop.test.", "A", false), ("api.shop.test.", "AAAA", true)]);
    let (axfr, file) = signed_axfr(&dig, port, "shop.test.", &dir.path().join("shop.axfr"))?;
    let (ok, out) = run(&verify, &["-z", "-o", "shop.test.", &file.to_string_lossy()]);
    assert!(ok && out.contains("fully signed"), "dnssec-verify refuses the added zone's AXFR:\n{out}");
    let dnskeys = |axfr: &str| -> Vec<String> { axfr.lines().filter(|l| l.contains("\tDNSKEY\t")).map(str::to_owned).collect() };
    let before = dnskeys(&axfr);
    assert_eq!(before.len(), 2, "a KSK and a ZSK:\n{axfr}");
    // Its expiry is the one alerted on (the first zone is unsigned here): 14 days from the
    // start of its 7-day period. The static zones' task looks every 30 s.
    until_expiry(&authority.control, period_start(7)? + 14.0 * 86_400.0, Duration::from_secs(45)).await?;

    // Restarted: the same keys, no new directory made.
    drop(authority);
    let authority = AuthorityProcess::start_zone(dir.path(), &text, ZONE)?;
    until(server, "www.shop.test.", RecordType::A, Duration::from_secs(20), |m| !m.answers.is_empty()).await?;
    let (axfr, _) = signed_axfr(&dig, port, "shop.test.", &dir.path().join("shop2.axfr"))?;
    assert_eq!(dnskeys(&axfr), before, "the restarted authority serves other keys");
    all_validate_in("shop.test.", &anchor, server, &[("www.shop.test.", "A", false)]);
    drop(authority);

    // An authority that makes no keys: a zone added with no directory is not served, and says why.
    let text = base + "[added_zones.dnssec]\nkey_root = \"keys\"\ncreate_keys = false\n";
    let authority = AuthorityProcess::start_zone(dir.path(), &text, ZONE)?;
    let root = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let blog = dnsplan_common::DnsName::parse("blog.test.")?;
    assert!(root.add_zone(&blog, &master.replace("shop", "blog")).await?);
    let log = authority.log_until("the zone without keys refused", |line| {
        line.to_string().contains("blog.test.") && line.to_string().contains("create_keys = false")
    })?;
    assert!(!dir.path().join("keys").join("blog.test.").exists(), "a directory was made: {log}");
    until(server, "www.shop.test.", RecordType::A, Duration::from_secs(20), |m| !m.answers.is_empty()).await?;
    Ok(())
}
