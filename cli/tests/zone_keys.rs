//! `dnsplan zone key new` and `dnsplan zone ds` as an operator runs them, the built binary:
//! the key file is private and never written over, the DS printed is the one BIND's
//! `dnssec-dsfromkey` computes from the DNSKEY printed (for both algorithms), a key others may
//! read is refused, and no private key material is ever printed.

use dnsplan_common::dnssec::ZoneKey;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn dnsplan(args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_dnsplan")).args(args).output()?)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The DS that BIND's `dnssec-dsfromkey -2` computes for `origin` from the zone file `zone`
/// (which holds its DNSKEY), with our TTL; its words joined by one space.
fn bind_ds(zone: &Path, origin: &str) -> anyhow::Result<String> {
    let program = dnsplan_tests::counterpart::sbin_binary("dnssec-dsfromkey", "BIND `dnssec-dsfromkey`", "bind9-utils")?;
    let out = Command::new(program).args(["-2", "-T", "3600", "-f"]).arg(zone).arg(origin).output()?;
    anyhow::ensure!(out.status.success(), "dnssec-dsfromkey failed: {}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    anyhow::ensure!(lines.len() == 1, "dnssec-dsfromkey printed {} DS lines: {lines:?}", lines.len());
    Ok(lines[0].clone())
}

/// The one line of `output` that starts with `prefix`.
fn line_starting<'a>(output: &'a str, prefix: &str) -> anyhow::Result<&'a str> {
    let found: Vec<&str> = output.lines().filter(|l| l.starts_with(prefix)).collect();
    anyhow::ensure!(found.len() == 1, "{} lines start with {prefix:?} in:\n{output}", found.len());
    Ok(found[0])
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 of `bytes`, without padding (enough to look for it in text).
fn base64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(BASE64[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// The bytes of the PEM file at `file` (base64 between its BEGIN and END lines).
fn pem_der(file: &Path) -> anyhow::Result<Vec<u8>> {
    let body: Vec<u8> = std::fs::read_to_string(file)?
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .flat_map(|l| l.bytes().collect::<Vec<_>>())
        .filter(|b| *b != b'=')
        .collect();
    let sextets = body
        .iter()
        .map(|b| BASE64.iter().position(|c| c == b).map(|p| p as u32))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| anyhow::anyhow!("{} is not base64 PEM", file.display()))?;
    let mut der = Vec::new();
    for group in sextets.chunks(4) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, s)| n | s << (18 - 6 * i));
        der.extend((0..group.len() - 1).map(|i| (n >> (16 - 8 * i)) as u8));
    }
    Ok(der)
}

/// The private key in the PKCS#8 key file `file`: the 32 bytes of the first OCTET STRING of 32
/// (the Ed25519 seed; the P-256 scalar of the ECPrivateKey), both as ring writes them. The
/// public key that follows may be printed; these may not.
fn private_bytes(file: &Path) -> anyhow::Result<Vec<u8>> {
    let der = pem_der(file)?;
    let at = der.windows(2).position(|w| w == [0x04, 0x20]).ok_or_else(|| anyhow::anyhow!("no private key in {}", file.display()))?;
    der.get(at + 2..at + 34).map(<[u8]>::to_vec).ok_or_else(|| anyhow::anyhow!("{} is cut short", file.display()))
}

/// Nothing of the private key in `file` is in `printed`: not the PEM, and not its private
/// bytes in hex or in base64 at any alignment.
fn no_private_material(file: &Path, printed: &str) -> anyhow::Result<()> {
    anyhow::ensure!(!printed.contains("PRIVATE KEY"), "a PEM header printed:\n{printed}");
    let secret = private_bytes(file)?;
    let hex: String = secret[..16].iter().map(|b| format!("{b:02x}")).collect();
    anyhow::ensure!(!printed.to_ascii_lowercase().contains(&hex), "the private key printed in hex:\n{printed}");
    for offset in 0..3 {
        let encoded = base64(&secret[offset..offset + 12]);
        anyhow::ensure!(!printed.contains(&encoded), "the private key printed in base64 ({encoded}):\n{printed}");
    }
    Ok(())
}

#[test]
fn the_ds_printed_is_the_one_bind_computes_for_both_algorithms() -> anyhow::Result<()> {
    for (algorithm, number) in [("ecdsap256sha256", 13), ("ed25519", 15)] {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join(format!("{algorithm}.key"));
        let path = file.to_str().expect("a UTF-8 temporary path");
        // The origin as typed: normalised to lower case with its trailing dot.
        let out = dnsplan(&["zone", "key", "new", path, "--dns-zone", "Example.ORG", "--algorithm", algorithm])?;
        anyhow::ensure!(out.status.success(), "zone key new: {}", text(&out.stderr));
        let printed = text(&out.stdout);

        let mode = std::fs::metadata(&file)?.permissions().mode() & 0o777;
        anyhow::ensure!(mode == 0o600, "{algorithm}: the key file has mode {mode:o}");
        let pem = std::fs::read_to_string(&file)?;
        anyhow::ensure!(
            base64(&pem_der(&file)?) == pem.lines().filter(|l| !l.starts_with("-----")).collect::<String>().trim_end_matches('=')
        );
        anyhow::ensure!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n") && pem.ends_with("-----END PRIVATE KEY-----\n"), "{pem:.40}");
        no_private_material(&file, &printed)?;

        let key = ZoneKey::load(&file)?;
        anyhow::ensure!(key.algorithm().number() == number, "{algorithm}: made a key of algorithm {}", key.algorithm().number());
        let tag_line = line_starting(&printed, "key tag")?;
        anyhow::ensure!(tag_line.contains(&format!("{}, algorithm {number} ", key.tag())), "{tag_line}");

        // The TOML for authority.toml loads and names the file.
        let toml_part: String = printed.lines().skip_while(|l| *l != "[dns_zone.dnssec]").take(2).map(|l| format!("{l}\n")).collect();
        let table: toml::Value = toml::from_str(&toml_part)?;
        anyhow::ensure!(table["dns_zone"]["dnssec"]["key_file"].as_str() == Some(path), "{toml_part}");

        // The trust anchor is the key's DNSKEY; from it, a zone file for BIND.
        let anchor = line_starting(&printed, "trust-anchors {")?;
        let want_anchor = {
            let dnskey = key.dnskey().to_string();
            let (fields, public) = dnskey.rsplit_once(' ').expect("FLAGS 3 ALG KEY");
            format!("trust-anchors {{ example.org. static-key {fields} \"{public}\"; }};")
        };
        anyhow::ensure!(anchor == want_anchor, "{anchor}\nis not\n{want_anchor}");
        let rdata = anchor
            .strip_prefix("trust-anchors { example.org. static-key ")
            .and_then(|r| r.strip_suffix("; };"))
            .map(|r| r.replace('"', ""))
            .ok_or_else(|| anyhow::anyhow!("the trust anchor does not read: {anchor}"))?;
        anyhow::ensure!(rdata.starts_with(&format!("257 3 {number} ")), "{rdata}");
        let zone = dir.path().join("example.org.zone");
        std::fs::write(&zone, format!("example.org. 3600 IN DNSKEY {rdata}\n"))?;
        let bind = bind_ds(&zone, "example.org.")?;

        let new_ds = line_starting(&printed, "example.org. ")?;
        anyhow::ensure!(new_ds == bind, "{algorithm}: zone key new printed\n{new_ds}\nBIND computes\n{bind}");

        let out = dnsplan(&["zone", "ds", "--key", path, "--dns-zone", "example.org"])?;
        anyhow::ensure!(out.status.success(), "zone ds: {}", text(&out.stderr));
        let ds = text(&out.stdout);
        anyhow::ensure!(ds == format!("{bind}\n"), "{algorithm}: zone ds printed\n{ds}BIND computes\n{bind}");
        no_private_material(&file, &ds)?;

        let out = dnsplan(&["zone", "ds", "--key", path, "--dns-zone", "example.org.", "--json"])?;
        anyhow::ensure!(out.status.success(), "zone ds --json: {}", text(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        no_private_material(&file, &text(&out.stdout))?;
        let words: Vec<&str> = bind.split(' ').collect(); // ORIGIN TTL IN DS TAG ALG 2 DIGEST
        anyhow::ensure!(json["origin"] == "example.org." && json["ds"] == bind.as_str(), "{json}");
        anyhow::ensure!(json["key_tag"].as_u64() == words[4].parse().ok() && json["algorithm"].as_u64() == words[5].parse().ok(), "{json}");
        anyhow::ensure!(json["digest_type"] == 2 && json["digest"] == words[7], "{json}");
        anyhow::ensure!(Some(json["public_key"].as_str().unwrap_or("?")) == rdata.split(' ').nth(3), "{json}\n{rdata}");
    }
    Ok(())
}

#[test]
fn an_existing_file_is_never_written_over() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("zone.key");
    let path = file.to_str().expect("a UTF-8 temporary path");
    std::fs::write(&file, "precious, not a key\n")?;
    for algorithm in ["ecdsap256sha256", "ed25519"] {
        let out = dnsplan(&["zone", "key", "new", path, "--dns-zone", "example.org.", "--algorithm", algorithm])?;
        let stderr = text(&out.stderr);
        anyhow::ensure!(out.status.code() == Some(2), "exit {:?}: {stderr}", out.status.code());
        anyhow::ensure!(stderr.contains("exists already") && stderr.contains(path), "{stderr}");
        anyhow::ensure!(out.stdout.is_empty(), "printed: {}", text(&out.stdout));
        anyhow::ensure!(std::fs::read_to_string(&file)? == "precious, not a key\n", "the file changed");
    }
    // Nor a key made before.
    let key = dir.path().join("made.key");
    let key_path = key.to_str().expect("a UTF-8 temporary path");
    let out = dnsplan(&["zone", "key", "new", key_path, "--dns-zone", "example.org."])?;
    anyhow::ensure!(out.status.success(), "zone key new: {}", text(&out.stderr));
    let before = std::fs::read(&key)?;
    let out = dnsplan(&["zone", "key", "new", key_path, "--dns-zone", "example.org."])?;
    anyhow::ensure!(out.status.code() == Some(2), "a second key new: exit {:?}", out.status.code());
    anyhow::ensure!(std::fs::read(&key)? == before, "the key changed");
    Ok(())
}

#[test]
fn a_key_others_may_read_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("zone.key");
    let path = file.to_str().expect("a UTF-8 temporary path");
    let out = dnsplan(&["zone", "key", "new", path, "--dns-zone", "example.org.", "--algorithm", "ed25519"])?;
    anyhow::ensure!(out.status.success(), "zone key new: {}", text(&out.stderr));
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))?;
    for json in [false, true] {
        let mut args = vec!["zone", "ds", "--key", path, "--dns-zone", "example.org."];
        if json {
            args.push("--json");
        }
        let out = dnsplan(&args)?;
        let stderr = text(&out.stderr);
        anyhow::ensure!(out.status.code() == Some(2), "exit {:?}: {stderr}", out.status.code());
        anyhow::ensure!(stderr.contains(&format!("chmod 600 {path}")), "{stderr}");
        anyhow::ensure!(out.stdout.is_empty(), "printed: {}", text(&out.stdout));
    }
    Ok(())
}

#[test]
fn a_zone_that_is_not_a_dns_name_is_refused_before_a_key_is_made() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("zone.key");
    let path = file.to_str().expect("a UTF-8 temporary path");
    for origin in ["exa mple.org", "a..b", "."] {
        let out = dnsplan(&["zone", "key", "new", path, "--dns-zone", origin])?;
        anyhow::ensure!(out.status.code() == Some(2), "{origin:?}: exit {:?}", out.status.code());
        anyhow::ensure!(text(&out.stderr).contains("--dns-zone"), "{origin:?}: {}", text(&out.stderr));
        anyhow::ensure!(!file.exists(), "{origin:?}: a key was made");
    }
    let out = dnsplan(&["zone", "key", "new", path, "--dns-zone", "example.org.", "--algorithm", "rsasha256"])?;
    anyhow::ensure!(out.status.code() == Some(2) && !file.exists(), "rsasha256: exit {:?}", out.status.code());
    Ok(())
}

/// The check above finds the key wherever it would be printed: the PEM file, its DER in base64
/// at another alignment, the private bytes in hex.
#[test]
fn the_check_for_private_material_finds_it() -> anyhow::Result<()> {
    for algorithm in ["ecdsap256sha256", "ed25519"] {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("zone.key");
        let out = dnsplan(&["zone", "key", "new", file.to_str().expect("UTF-8"), "--dns-zone", "example.org.", "--algorithm", algorithm])?;
        anyhow::ensure!(out.status.success(), "zone key new: {}", text(&out.stderr));
        let der = pem_der(&file)?;
        let secret = private_bytes(&file)?;
        let hex: String = secret.iter().map(|b| format!("{b:02X}")).collect();
        let mut shifted = vec![0u8];
        shifted.extend(&der);
        for leak in [std::fs::read_to_string(&file)?, base64(&der), base64(&shifted), base64(&secret), format!("key {hex}")] {
            anyhow::ensure!(no_private_material(&file, &leak).is_err(), "{algorithm}: not found in {leak}");
        }
    }
    Ok(())
}

/// `zone key init --from-key`: the zone's key file of today becomes the KSK, so the DS the
/// parent holds is still the one printed (`zone ds --key-dir` equals `zone ds --key`); the
/// directory is 0700 and every key file in it 0600; nothing private is printed; the new ZSK is
/// not yet served (it signs a lead after an authority that rolls first serves it), as `zone key
/// list` says; a directory in use is
/// never made again.
#[test]
fn a_key_directory_made_from_a_key_file_keeps_its_ds() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("zone.key");
    let keys = dir.path().join("keys");
    let (file_path, keys_path) = (file.to_str().expect("UTF-8"), keys.to_str().expect("UTF-8"));
    let out = dnsplan(&["zone", "key", "new", file_path, "--dns-zone", "example.org."])?;
    anyhow::ensure!(out.status.success(), "zone key new: {}", text(&out.stderr));
    let ds_before = dnsplan(&["zone", "ds", "--key", file_path, "--dns-zone", "example.org."])?;
    let out = dnsplan(&["zone", "key", "init", keys_path, "--dns-zone", "example.org.", "--from-key", file_path])?;
    let printed = text(&out.stdout);
    anyhow::ensure!(out.status.success(), "zone key init: {}", text(&out.stderr));
    anyhow::ensure!(printed.contains(&format!("key_dir = \"{keys_path}\"")), "{printed}");
    let ds_after = dnsplan(&["zone", "ds", "--key-dir", keys_path])?;
    anyhow::ensure!(ds_after.status.success(), "zone ds --key-dir: {}", text(&ds_after.stderr));
    anyhow::ensure!(
        text(&ds_after.stdout) == text(&ds_before.stdout),
        "the DS changed:\n{}\n{}",
        text(&ds_before.stdout),
        text(&ds_after.stdout)
    );
    anyhow::ensure!(printed.contains(text(&ds_before.stdout).trim()), "init prints the DS:\n{printed}");
    anyhow::ensure!(std::fs::metadata(&keys)?.permissions().mode() & 0o777 == 0o700, "the directory's mode");
    for entry in std::fs::read_dir(&keys)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "pem") {
            anyhow::ensure!(std::fs::metadata(&path)?.permissions().mode() & 0o777 == 0o600, "{}'s mode", path.display());
            no_private_material(&path, &printed)?;
        }
    }
    let list = dnsplan(&["zone", "key", "list", keys_path])?;
    let listed = text(&list.stdout);
    anyhow::ensure!(list.status.success(), "zone key list: {}", text(&list.stderr));
    let rows: Vec<&str> = listed.lines().filter(|l| l.starts_with(|c: char| c.is_ascii_digit())).collect();
    anyhow::ensure!(rows.len() == 2, "{listed}");
    anyhow::ensure!(rows.iter().any(|r| r.contains("KSK") && r.contains("signing, in CDS")), "{listed}");
    anyhow::ensure!(rows.iter().any(|r| r.contains("ZSK") && r.contains("not yet served")), "the ZSK waits to be served:\n{listed}");
    let again = dnsplan(&["zone", "key", "init", keys_path, "--dns-zone", "example.org."])?;
    anyhow::ensure!(again.status.code() == Some(2) && text(&again.stderr).contains("not empty"), "{}", text(&again.stderr));
    Ok(())
}

/// `dnsplan zone key kek FILE`: a key-encryption key only its owner reads, never written over,
/// its bytes never printed, and the `[dns_zone.dnssec]` lines it prints name the file; the
/// authority reads it (`Kek::load`) with the id printed.
#[test]
fn a_key_encryption_key_is_private_never_written_over_and_never_printed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("zone.kek");
    let path = file.to_str().unwrap_or_default();
    let out = dnsplan(&["zone", "key", "kek", path])?;
    anyhow::ensure!(out.status.success(), "zone key kek failed: {}", text(&out.stderr));
    let printed = text(&out.stdout);
    assert_eq!(std::fs::metadata(&file)?.permissions().mode() & 0o777, 0o600);
    let secret = std::fs::read_to_string(&file)?;
    assert_eq!(secret.trim().len(), 64, "32 bytes in hex: {secret:?}");
    assert!(!printed.contains(secret.trim()), "the key is printed:\n{printed}");
    let kek = dnsplan_common::dnssec_share::Kek::load(&file)?;
    assert!(printed.contains(&format!("id {}", kek.id())), "{printed}");
    assert!(printed.contains(&format!("kek_file = \"{}\"", file.display())), "{printed}");
    let again = dnsplan(&["zone", "key", "kek", path])?;
    assert!(!again.status.success(), "written over an existing file");
    assert_eq!(std::fs::read_to_string(&file)?, secret, "the first key is kept");
    Ok(())
}
