//! DNSSEC key rollovers as shipped: `dnsplan zone key init` makes a key directory for the
//! managed zone and one for a static zone of the config, the `dnsplan-authority` daemon serves
//! both from its config file (`key_dir`, read every second here), and its clock, and every
//! tool's that reads signature times, is moved by libfaketime through a file (Debian package
//! libfaketime). The ZSK is rolled by the authority itself at the end of its lifetime; the KSK
//! by `dnsplan zone key roll --ksk` and `dnsplan zone key ds-seen`, as an operator does.
//!
//! At each step the whole zone is read by AXFR and checked with the rules of a rollover that
//! keeps every resolver validating (RFC 7583), against the state before it:
//! - pre-publication: every key that signs now was in the DNSKEY RRset before (a resolver that
//!   cached that RRset validates the new signatures);
//! - a key that signed before is still in the DNSKEY RRset (a cached signature still
//!   validates);
//! - the KSK whose DS the parent holds signs the DNSKEY RRset;
//! - the serial moved with every change.
//!
//! And Knot's `kzonecheck`, told the fake time, validates every signature of the AXFR with its
//! DNSKEY RRset (BIND's tools cannot run under libfaketime), the KSK whose DS the parent holds
//! among the DNSKEY RRset's signers. Teeth, checked once: with a ZSK active as soon as it is
//! published, the pre-publication rule fails at the roll.

use dnsplan_common::dnssec_keys::{At, KeyDir, KeyEntry, KeyRole};
use dnsplan_tests::daemon::Killed;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

const MANAGED: &str = "example.test.";
const STATIC: &str = "static.test.";

/// libfaketime's preload library, or a failure saying what to install.
fn libfaketime() -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(format!("/usr/lib/{}-linux-gnu/faketime/libfaketime.so.1", std::env::consts::ARCH));
    anyhow::ensure!(path.is_file(), "{} is missing; install it with `apt-get install -y libfaketime` (./test does)", path.display());
    Ok(path)
}

/// `program`, installed: a missing one fails, naming its package.
fn installed(program: &str, package: &str) -> anyhow::Result<PathBuf> {
    ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
        .iter()
        .map(|dir| Path::new(dir).join(program))
        .find(|path| path.is_file())
        .ok_or_else(|| anyhow::anyhow!("`{program}` is not installed; install it with `apt-get install -y {package}` (./test does)"))
}

/// The fake clock every process of the test reads: an offset from the real one in a file.
struct Clock {
    file: PathBuf,
    preload: PathBuf,
}

impl Clock {
    /// Moves the clock so that it reads `at` now.
    fn set(&self, at: u64) -> anyhow::Result<()> {
        let real = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
        std::fs::write(&self.file, format!("{:+}\n", at as i64 - real as i64))?;
        Ok(())
    }

    fn now(&self) -> anyhow::Result<u64> {
        let real = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
        let offset: i64 = std::fs::read_to_string(&self.file)?.trim().parse()?;
        Ok((real as i64 + offset) as u64)
    }

    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        command
            .env("LD_PRELOAD", &self.preload)
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            // Timers keep the real pace; only the wall clock moves.
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        command
    }

    /// Runs `program` on the fake clock: its success and everything it printed.
    fn run(&self, program: &Path, args: &[&str]) -> anyhow::Result<(bool, String)> {
        let out = self.command(program).args(args).output()?;
        Ok((out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))))
    }
}

/// What a zone serves, as far as its keys go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct KeyState {
    serial: u32,
    /// Key tags of the DNSKEY RRset, and of its KSKs.
    dnskey: BTreeSet<u16>,
    ksk: BTreeSet<u16>,
    /// Key tags of the RRSIGs over the DNSKEY RRset, and over every other RRset.
    dnskey_signers: BTreeSet<u16>,
    data_signers: BTreeSet<u16>,
    /// Key tags CDS names.
    cds: BTreeSet<u16>,
}

struct Zone {
    origin: &'static str,
    keys: PathBuf,
}

struct Lab {
    clock: Clock,
    dnsplan: PathBuf,
    dig: PathBuf,
    kzonecheck: PathBuf,
    dns: SocketAddr,
    control: SocketAddr,
    dir: PathBuf,
}

impl Lab {
    /// The zone's whole AXFR, written to a file, and its key state.
    fn state(&self, zone: &Zone) -> anyhow::Result<(KeyState, PathBuf)> {
        let port = self.dns.port().to_string();
        let out = Command::new(&self.dig).args(["-p", &port, "@127.0.0.1", zone.origin, "AXFR", "+noall", "+answer"]).output()?;
        let axfr: String = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with(';') && !l.is_empty())
            .map(|l| format!("{l}\n"))
            .collect();
        anyhow::ensure!(axfr.contains(" SOA "), "no AXFR of {}: {}", zone.origin, String::from_utf8_lossy(&out.stderr));
        let file = self.dir.join(format!("{}axfr", zone.origin));
        std::fs::write(&file, &axfr)?;
        let mut state = KeyState::default();
        for line in axfr.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.get(3).copied() {
                Some("SOA") => state.serial = fields.get(6).and_then(|s| s.parse().ok()).unwrap_or_default(),
                Some("RRSIG") => {
                    let tag: u16 = fields.get(10).and_then(|t| t.parse().ok()).unwrap_or_default();
                    if fields.get(4) == Some(&"DNSKEY") {
                        state.dnskey_signers.insert(tag);
                    } else if !matches!(fields.get(4).copied(), Some("CDS" | "CDNSKEY")) {
                        state.data_signers.insert(tag);
                    }
                }
                // From the same AXFR as the rest: a second query could see another state.
                Some("DNSKEY") => {
                    let tag = key_tag_of_line(line).ok_or_else(|| anyhow::anyhow!("a DNSKEY that does not read: {line}"))?;
                    state.dnskey.insert(tag);
                    if fields.get(4) == Some(&"257") {
                        state.ksk.insert(tag);
                    }
                }
                Some("CDS") => {
                    state.cds.insert(fields.get(4).and_then(|t| t.parse().ok()).unwrap_or_default());
                }
                _ => {}
            }
        }
        Ok((state, file))
    }

    /// Waits until `want` holds of the zone's state, then checks it against `before` (the
    /// rollover rules above), with `kzonecheck`, and that each key of `anchors` signs the
    /// DNSKEY RRset.
    async fn step(
        &self,
        zone: &Zone,
        what: &str,
        before: &KeyState,
        anchors: &[u16],
        want: impl Fn(&KeyState) -> bool,
    ) -> anyhow::Result<KeyState> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let (state, file) = loop {
            let last = match self.state(zone) {
                Ok((state, file)) if want(&state) => break (state, file),
                Ok((state, _)) => format!("serving {state:?}"),
                // Not listening yet.
                Err(err) => err.to_string(),
            };
            anyhow::ensure!(Instant::now() < deadline, "{} {what}: not within 15 s; {last}", zone.origin);
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let origin = zone.origin;
        if before != &KeyState::default() {
            anyhow::ensure!(
                state.data_signers.is_subset(&before.dnskey),
                "{origin} {what}: signed by {:?}, not all of them in the DNSKEY RRset before ({:?}): a resolver that cached it fails",
                state.data_signers,
                before.dnskey
            );
            anyhow::ensure!(
                before.data_signers.is_subset(&state.dnskey),
                "{origin} {what}: a key that signed before is gone ({:?} then, DNSKEY {:?} now): a cached signature fails",
                before.data_signers,
                state.dnskey
            );
            anyhow::ensure!(state.serial != before.serial, "{origin} {what}: the keys changed, the serial stayed {}", state.serial);
        }
        // Knot's checker validates every signature with the zone's DNSKEY RRset at the fake
        // time (BIND's tools do not run under libfaketime: their allocator's clock calls clash).
        let now = self.clock.now()?.to_string();
        let out = Command::new(&self.kzonecheck).args(["-o", origin, "-d", "on", "-t", &now]).arg(&file).output()?;
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        anyhow::ensure!(out.status.success(), "{origin} {what}: kzonecheck refuses the AXFR at {now}:\n{said}");
        for tag in anchors {
            anyhow::ensure!(
                state.dnskey_signers.contains(tag),
                "{origin} {what}: the KSK {tag} (its DS at the parent) does not sign the DNSKEY RRset: {state:?}"
            );
        }
        Ok(state)
    }
}

/// The key tag (RFC 4034 appendix B) of a DNSKEY line `NAME TTL IN DNSKEY FLAGS 3 ALG BASE64...`.
fn key_tag_of_line(line: &str) -> Option<u16> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let flags: u16 = fields.get(4)?.parse().ok()?;
    let algorithm: u8 = fields.get(6)?.parse().ok()?;
    let mut rdata = flags.to_be_bytes().to_vec();
    rdata.extend([3, algorithm]);
    rdata.extend(base64_decode(&fields.get(7..)?.concat())?);
    let mut sum: u32 = 0;
    for (i, byte) in rdata.iter().enumerate() {
        sum += if i % 2 == 0 { u32::from(*byte) << 8 } else { u32::from(*byte) };
    }
    sum += (sum >> 16) & 0xffff;
    Some((sum & 0xffff) as u16)
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        acc = acc << 6 | ALPHABET.iter().position(|a| *a == c)? as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// Every entry of the directory `keys`.
fn entries(keys: &Path) -> anyhow::Result<Vec<KeyEntry>> {
    let text = std::fs::read_to_string(keys.join("keys.toml"))?;
    #[derive(serde::Deserialize)]
    struct File {
        key: Vec<KeyEntry>,
    }
    Ok(toml::from_str::<File>(&text)?.key)
}

/// The latest of `pick` over both zones' keys of `role` made last.
fn latest(zones: &[Zone], role: KeyRole, pick: impl Fn(&KeyEntry) -> Option<At>) -> anyhow::Result<u64> {
    let mut at = 0;
    for zone in zones {
        let newest = entries(&zone.keys)?.into_iter().filter(|e| e.role == role).max_by_key(|e| e.created);
        at = at.max(newest.and_then(|e| pick(&e)).map_or(0, |a| a.0));
    }
    Ok(at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zsk_and_ksk_rolls_keep_every_cache_validating() -> anyhow::Result<()> {
    let bin = support::bin_dir();
    let dir = tempfile::tempdir()?;
    let clock = Clock { file: dir.path().join("clock"), preload: libfaketime()? };
    std::fs::write(&clock.file, "+0\n")?;
    let lab = Lab {
        dnsplan: PathBuf::from(env!("CARGO_BIN_EXE_dnsplan")),
        dig: installed("dig", "bind9-dnsutils")?,
        kzonecheck: installed("kzonecheck", "knot-dnssecutils")?,
        dns: SocketAddr::from(([127, 0, 0, 1], dnsplan_tests::ports::free_port()?)),
        control: SocketAddr::from(([127, 0, 0, 1], dnsplan_tests::ports::free_port()?)),
        dir: dir.path().to_owned(),
        clock,
    };
    let zones =
        [Zone { origin: MANAGED, keys: dir.path().join("managed-keys") }, Zone { origin: STATIC, keys: dir.path().join("static-keys") }];
    for zone in &zones {
        let (ok, out) = lab.clock.run(
            &lab.dnsplan,
            &[
                "zone",
                "key",
                "init",
                &zone.keys.to_string_lossy(),
                "--dns-zone",
                zone.origin,
                "--algorithm",
                "ed25519",
                "--zsk-lifetime-days",
                "2",
                "--dnskey-ttl-secs",
                "300",
                "--propagation-delay-secs",
                "300",
                "--max-ttl-secs",
                "3600",
                "--parent-ds-ttl-secs",
                "900",
            ],
        )?;
        anyhow::ensure!(ok && out.contains("key_dir = "), "zone key init:\n{out}");
    }
    std::fs::write(
        dir.path().join("managed.db"),
        format!("$ORIGIN {MANAGED}\n$TTL 300\nns1 A 192.0.2.1\nwww A 192.0.2.80\nmail MX 10 www\n"),
    )?;
    std::fs::write(
        dir.path().join("static.db"),
        format!(
            "$ORIGIN {STATIC}\n$TTL 300\n@ SOA ns1.{MANAGED} hostmaster 7 3600 600 86400 60\n@ NS ns1.{MANAGED}\nwww A 192.0.2.81\nwww AAAA 2001:db8::81\n"
        ),
    )?;
    let config = format!(
        "data_dir = \"{data}\"\n[dns]\nlisten = [\"{dns}\"]\n[dns.transfer]\ntsig_required = false\n[[dns.transfer.secondaries]]\naddress = \"127.0.0.1/32\"\n\
         [control]\nlisten = \"{control}\"\ntoken = \"rollover-test-token-0123456789\"\n\
         [dns_zone]\norigin = \"{MANAGED}\"\nns = [\"ns1.{MANAGED}\"]\nmaster_file = \"managed.db\"\n[dns_zone.soa]\nmname = \"ns1.{MANAGED}\"\nrname = \"hostmaster.{MANAGED}\"\n\
         [dns_zone.dnssec]\nkey_dir = \"managed-keys\"\nkey_check_secs = 1\n\
         [[zones]]\norigin = \"{STATIC}\"\nmaster_file = \"static.db\"\n[zones.dnssec]\nkey_dir = \"static-keys\"\nkey_check_secs = 1\n",
        data = dir.path().join("data").display(),
        dns = lab.dns,
        control = lab.control,
    );
    std::fs::write(dir.path().join("authority.toml"), &config)?;
    let log = std::fs::File::create(dir.path().join("authority.log"))?;
    let _authority = Killed(
        lab.clock
            .command(&bin.join("dnsplan-authority"))
            .arg("--config")
            .arg(dir.path().join("authority.toml"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?,
    );
    let logs = || std::fs::read_to_string(dir.path().join("authority.log")).unwrap_or_default();
    let result = rollovers(&lab, &zones).await;
    result.map_err(|err| anyhow::anyhow!("{err:#}\nthe authority's log:\n{}", logs()))
}

async fn rollovers(lab: &Lab, zones: &[Zone]) -> anyhow::Result<()> {
    let mut states = Vec::new();
    for zone in zones {
        let first = KeyDir::load(&zone.keys, At(lab.clock.now()?))?;
        let ksk = first.entries().iter().find(|e| e.role == KeyRole::Ksk).map(|e| e.tag).unwrap_or_default();
        let state = lab.step(zone, "served", &KeyState::default(), &[ksk], |s| s.dnskey.len() == 2).await?;
        anyhow::ensure!(state.ksk == BTreeSet::from([ksk]) && state.cds == state.ksk, "{}: {state:?}", zone.origin);
        states.push((ksk, state));
    }

    // The ZSK's lifetime (2 days) ends within the lead: the authority makes its successor and
    // publishes it; the old ZSK still signs.
    let due = latest(zones, KeyRole::Zsk, |e| Some(At(e.active.0 + 2 * 86_400 - 500)))?;
    lab.clock.set(due)?;
    for (zone, (ksk, state)) in zones.iter().zip(&mut states) {
        let signers = state.data_signers.clone();
        *state = lab.step(zone, "a new ZSK published", state, &[*ksk], |s| s.dnskey.len() == 3).await?;
        anyhow::ensure!(state.data_signers == signers, "{}: the old ZSK signs until the new one is in every cache: {state:?}", zone.origin);
    }
    // The new ZSK signs every name; the old one stays published.
    lab.clock.set(latest(zones, KeyRole::Zsk, |e| Some(e.active))? + 5)?;
    for (zone, (ksk, state)) in zones.iter().zip(&mut states) {
        let old = state.data_signers.clone();
        *state =
            lab.step(zone, "the new ZSK signs", state, &[*ksk], |s| !s.data_signers.is_empty() && s.data_signers.is_disjoint(&old)).await?;
        anyhow::ensure!(state.dnskey.len() == 3 && state.data_signers.len() == 1, "{}: {state:?}", zone.origin);
    }
    // The old ZSK is removed once no cache holds its signatures.
    let removed = zones.iter().map(|z| entries(&z.keys)).collect::<anyhow::Result<Vec<_>>>()?;
    let removed = removed.iter().flatten().filter_map(|e| e.removed).map(|a| a.0).max().unwrap_or_default();
    lab.clock.set(removed + 5)?;
    for (zone, (ksk, state)) in zones.iter().zip(&mut states) {
        *state = lab.step(zone, "the old ZSK removed", state, &[*ksk], |s| s.dnskey.len() == 2).await?;
    }

    // The KSK roll, by the operator: a new KSK signs the DNSKEY RRset beside the old one.
    for zone in zones {
        let (ok, out) = lab.clock.run(&lab.dnsplan, &["zone", "key", "roll", "--ksk", &zone.keys.to_string_lossy()])?;
        anyhow::ensure!(ok && out.contains("KSK"), "zone key roll --ksk:\n{out}");
    }
    let mut new_ksks = Vec::new();
    for (zone, (ksk, state)) in zones.iter().zip(&mut states) {
        *state = lab.step(zone, "a new KSK published", state, &[*ksk], |s| s.ksk.len() == 2 && s.dnskey_signers.len() == 2).await?;
        anyhow::ensure!(
            state.cds == BTreeSet::from([*ksk]),
            "{}: CDS names the old KSK until the new one is in every cache: {state:?}",
            zone.origin
        );
        let new = state.ksk.iter().copied().find(|k| k != ksk).unwrap_or_default();
        new_ksks.push(new);
        // Too early: the parent cannot hold the new DS yet.
        let (ok, out) = lab.clock.run(&lab.dnsplan, &["zone", "key", "ds-seen", &zone.keys.to_string_lossy()])?;
        anyhow::ensure!(!ok && out.contains("every resolver"), "ds-seen before CDS names the new KSK:\n{out}");
    }
    // CDS names the new KSK once every cache has it; both validate.
    lab.clock.set(latest(zones, KeyRole::Ksk, |e| Some(e.active))? + 5)?;
    for ((zone, (ksk, state)), new) in zones.iter().zip(&mut states).zip(&new_ksks) {
        let new = *new;
        *state = lab.step(zone, "CDS names the new KSK", state, &[*ksk, new], |s| s.cds == BTreeSet::from([new])).await?;
        // A parent that serves no DS for it: ds-seen with --parent refuses (the authority
        // itself answers as the parent here: it has no DS at its own apex).
        let parent = lab.dns.to_string();
        let (ok, out) = lab.clock.run(&lab.dnsplan, &["zone", "key", "ds-seen", &zone.keys.to_string_lossy(), "--parent", &parent])?;
        anyhow::ensure!(!ok && out.contains("no DS"), "ds-seen with a parent that has not the DS:\n{out}");
        let (ok, out) = lab.clock.run(&lab.dnsplan, &["zone", "key", "ds-seen", &zone.keys.to_string_lossy()])?;
        anyhow::ensure!(ok && out.contains("removed at"), "ds-seen:\n{out}");
    }
    // The old KSK goes once the parent's DS TTL has passed.
    let removed = zones.iter().map(|z| entries(&z.keys)).collect::<anyhow::Result<Vec<_>>>()?;
    let removed =
        removed.iter().flatten().filter(|e| e.role == KeyRole::Ksk).filter_map(|e| e.removed).map(|a| a.0).max().unwrap_or_default();
    lab.clock.set(removed + 5)?;
    for ((zone, (_, state)), new) in zones.iter().zip(&mut states).zip(&new_ksks) {
        let new = *new;
        *state = lab.step(zone, "the old KSK removed", state, &[new], |s| s.ksk == BTreeSet::from([new])).await?;
        anyhow::ensure!(state.dnskey_signers == BTreeSet::from([new]) && state.dnskey.len() == 2, "{}: {state:?}", zone.origin);
        let (ok, out) = lab.clock.run(&lab.dnsplan, &["zone", "key", "list", &zone.keys.to_string_lossy()])?;
        anyhow::ensure!(ok && out.contains("removed") && out.contains("signing, in CDS"), "zone key list:\n{out}");
    }

    // A key file others may read: every read of the directory fails and is counted, and the
    // zone stays served and signed with the keys it has.
    let zone = &zones[0];
    let open = entries(&zone.keys)?.into_iter().find(|e| e.removed.is_none()).map(|e| zone.keys.join(e.file)).unwrap_or_default();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    let failures = loop {
        let metrics = reqwest::get(format!("http://{}/metrics", lab.control)).await?.text().await?;
        let failures = metrics
            .lines()
            .find_map(|l| l.strip_prefix("dnsplan_dnssec_key_dir_failures_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_default();
        if failures >= 2.0 {
            break failures;
        }
        anyhow::ensure!(Instant::now() < deadline, "no key directory failure counted within 15 s:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (_, state) = &states[0];
    lab.step(zone, &format!("its key directory failing ({failures} reads)"), &KeyState::default(), &[], |s| s == state).await?;
    Ok(())
}
