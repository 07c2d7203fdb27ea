//! The `dnsplan-authority` binary: starts from its config, serves, and exits 0 on SIGTERM;
//! a bad config is a clear error naming the key and line, not a panic.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

#[test]
fn sigterm_stops_cleanly() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("zone.db"), support::ZONE_FILE)?;
    let config = dir.path().join("authority.toml");
    std::fs::write(&config, support::config_text(&dir.path().join("data"), 8))?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_dnsplan-authority"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut saw_control = false;
    for line in lines.by_ref() {
        if line?.starts_with("control") {
            saw_control = true;
            break;
        }
    }
    assert!(saw_control, "the authority did not report where it listens");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    assert!(status.success());
    let exit = child.wait()?;
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    Ok(())
}

#[test]
fn bad_config_is_a_clear_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("authority.toml");
    let cases = [
        ("data_dir = \"d\"\n[control]\ntoken = \"0123456789abcdef0\"\n[dns_zone]\norigin = \"example.test.\"\nbogus = 1\n", "bogus"),
        ("data_dir = \"d\"\n[control]\ntoken = \"short\"\n[dns_zone]\norigin = \"example.test.\"\n", "shorter than 16 bytes"),
        ("data_dir = \"d\"\n[dns]\nlisten = [\"nope\"]\n", "line 3"),
        (
            "data_dir = \"d\"\n[control]\ntoken = \"0123456789abcdef0\"\n[dns_zone]\norigin = \"example.test.\"\nns = [\"ns1.example.test.\"]\n",
            "no SOA",
        ),
        (
            "data_dir = \"d\"\n[dns]\nlisten = [\"127.0.0.1:0\"]\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"0123456789abcdef0\"\n\
             [dns_zone]\norigin = \"example.test.\"\nns = [\"ns1.example.test.\"]\nmaster_file = \"delegation.db\"\n\
             [dns_zone.soa]\nmname = \"ns1.example.test.\"\nrname = \"hostmaster.example.test.\"\n",
            "sub.example.test. has a DS record but no NS records: a DS belongs at a delegation",
        ),
    ];
    std::fs::write(dir.path().join("delegation.db"), "$TTL 3600\nsub.example.test. DS 1 13 2 abcd\n")?;
    // DNSSEC: a key others may read, a missing key, a refresh not below the validity, a
    // static zone of [[zones]] with a key others may read, a zone with a DNSKEY of its own;
    // both a key file and a key directory, neither, a key directory of another zone, one with
    // a key others may read, none at all, a DNSKEY TTL that is the directory's.
    let key = dir.path().join("open.key");
    dnsplan_common::dnssec::ZoneKey::create(&key, dnsplan_common::dnssec::ZoneAlgorithm::Ed25519)?;
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    dnsplan_common::dnssec::ZoneKey::create(&dir.path().join("ok.key"), dnsplan_common::dnssec::ZoneAlgorithm::Ed25519)?;
    std::fs::write(
        dir.path().join("dnskey.db"),
        "$TTL 3600\nexample.test. DNSKEY 257 3 15 f1qAQftgVKHL0j4148YDaIpwuYqQU+icgIdUEgTEP2Q=\n",
    )?;
    // Key directories: one of another zone, one whose key others may read.
    // And one whose longest TTL is below the zone's (NS records of 3600 s).
    for (name, origin) in [("other-keys", "other.test."), ("open-keys", "example.test."), ("short-keys", "example.test.")] {
        let keys = dir.path().join(name);
        let now = dnsplan_common::dnssec_keys::At(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs());
        let max_ttl_secs = if name == "short-keys" { 600 } else { 86_400 };
        let policy = dnsplan_common::dnssec_keys::Policy { max_ttl_secs, ..Default::default() };
        let made =
            dnsplan_common::dnssec_keys::KeyDir::init(&keys, origin, dnsplan_common::dnssec::ZoneAlgorithm::Ed25519, None, policy, now)?;
        if name == "open-keys" {
            let file = keys.join(&made.entries()[0].file);
            std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        }
    }
    // Key-encryption keys: one others may read, one good.
    dnsplan_common::dnssec_share::Kek::create(&dir.path().join("open.kek"))?;
    std::fs::set_permissions(dir.path().join("open.kek"), std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    dnsplan_common::dnssec_share::Kek::create(&dir.path().join("ok.kek"))?;
    let zone = "data_dir = \"d\"\n[dns]\nlisten = [\"127.0.0.1:0\"]\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"0123456789abcdef0\"\n\
                [dns_zone]\norigin = \"example.test.\"\nns = [\"ns1.example.test.\"]\n\
                [dns_zone.soa]\nmname = \"ns1.example.test.\"\nrname = \"hostmaster.example.test.\"\n";
    let dnssec_cases = [
        (format!("{zone}[dns_zone.dnssec]\nkey_file = \"open.key\"\n"), "chmod 600"),
        (format!("{zone}[dns_zone.dnssec]\nkey_file = \"none.key\"\n"), "DNSSEC key"),
        (
            format!("{zone}[dns_zone.dnssec]\nkey_file = \"ok.key\"\nsignature_validity_days = 7\nsignature_refresh_days = 7\n"),
            "signature_refresh_days",
        ),
        (
            format!("{zone}[[zones]]\norigin = \"other.test.\"\nns = [\"ns1.other.test.\"]\n[zones.dnssec]\nkey_file = \"open.key\"\n"),
            "other.test.",
        ),
        (
            format!("{zone}master_file = \"dnskey.db\"\n[dns_zone.dnssec]\nkey_file = \"ok.key\"\n").replacen(
                "[dns_zone.soa]\nmname = \"ns1.example.test.\"\nrname = \"hostmaster.example.test.\"\nmaster_file = \"dnskey.db\"\n",
                "master_file = \"dnskey.db\"\n[dns_zone.soa]\nmname = \"ns1.example.test.\"\nrname = \"hostmaster.example.test.\"\n",
                1,
            ),
            "dnsplan signs the zone itself",
        ),
        (format!("{zone}[dns_zone.dnssec]\nkey_file = \"ok.key\"\nkey_dir = \"other-keys\"\n"), "give one of key_file"),
        (format!("{zone}[dns_zone.dnssec]\n"), "give one of key_file"),
        (format!("{zone}[dns_zone.dnssec]\nkey_dir = \"other-keys\"\n"), "its keys sign other.test., not example.test."),
        (format!("{zone}[dns_zone.dnssec]\nkey_dir = \"open-keys\"\n"), "chmod 600"),
        (format!("{zone}[dns_zone.dnssec]\nkey_dir = \"no-keys\"\n"), "keys.toml"),
        (format!("{zone}[dns_zone.dnssec]\nkey_dir = \"short-keys\"\n"), "has a TTL of 3600 s, above max_ttl_secs (600)"),
        (format!("{zone}[dns_zone.dnssec]\nkey_dir = \"open-keys\"\ndnskey_ttl_secs = 60\n"), "[policy]"),
        (format!("{zone}[added_zones.dnssec]\nkey_root = \"k\"\nalgorithm = \"rsasha256\"\n"), "added_zones.dnssec.algorithm"),
        (format!("{zone}[added_zones.dnssec]\nkey_root = \"k\"\nkey_check_secs = 0\n"), "added_zones.dnssec.key_check_secs"),
        (format!("{zone}[added_zones.dnssec]\nalgorithm = \"ed25519\"\n"), "key_root"),
        (format!("{zone}[dns_zone.dnssec]\nkey_file = \"ok.key\"\nkek_file = \"ok.kek\"\n"), "give key_dir too"),
        (
            format!(
                "{zone}[[zones]]\norigin = \"other.test.\"\nns = [\"ns1.other.test.\"]\n[zones.dnssec]\nkey_dir = \"other-keys\"\nkek_file = \"ok.kek\"\n"
            ),
            "a zone of the config file is not in the store",
        ),
        (format!("{zone}[dns_zone.dnssec]\nkey_dir = \"other-keys\"\nkek_file = \"open.kek\"\n"), "chmod 600 it"),
        (format!("{zone}[dns_zone.dnssec]\nkey_dir = \"no-keys\"\nkek_file = \"ok.kek\"\n"), "the store holds no keys of the zone yet"),
        (format!("{zone}[added_zones.dnssec]\nkey_root = \"k\"\nkek_file = \"open.kek\"\n"), "added_zones.dnssec.kek_file"),
    ];
    let cases = cases.iter().map(|(t, w)| (t.to_string(), *w)).chain(dnssec_cases);
    for (text, want) in cases {
        std::fs::write(&config, text)?;
        let (status, stderr) = exit_of(Command::new(env!("CARGO_BIN_EXE_dnsplan-authority")).arg("--config").arg(&config))?;
        let Some(status) = status else { panic!("{want}: the authority started and was still running after {EXIT_WAIT:?}: {stderr}") };
        assert!(!status.success(), "{want}: the authority started");
        assert!(stderr.contains(want), "{want:?} not in: {stderr}");
        assert!(!stderr.contains("panicked"), "panic: {stderr}");
    }
    Ok(())
}

/// How long a refused config may take to end the process; far more than it needs.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// Runs `command` without the token variable and returns its exit status and stderr, or
/// `None` for the status when it still runs after `EXIT_WAIT` (then it is killed): a config
/// that should be refused and is not must fail the test, not hang it.
fn exit_of(command: &mut Command) -> anyhow::Result<(Option<ExitStatus>, String)> {
    let mut child = command.env_remove("DNSPLAN_TOKEN").stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let mut stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    // stderr ends when the process does (or closes it); the reader reports then.
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    match rx.recv_timeout(EXIT_WAIT) {
        Ok(text) => Ok((Some(child.wait()?), text)),
        Err(_) => {
            child.kill()?;
            child.wait()?;
            Ok((None, rx.recv().unwrap_or_default()))
        }
    }
}

/// Log lines on a pipe: `text` (the default) carries no ANSI colour codes, since stderr is
/// not a terminal, and `--log-format json` is one JSON object a line. Before colours
/// followed the stream, the text lines came with escapes (`\x1b[2m`); checked once.
#[test]
fn logs_on_a_pipe_are_plain_text_or_json_lines() -> anyhow::Result<()> {
    use dnsplan_tests::daemon::{assert_json_lines, assert_plain_text, log_lines_until};
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("zone.db"), support::ZONE_FILE)?;
    let config = dir.path().join("authority.toml");
    std::fs::write(&config, support::config_text(&dir.path().join("data"), 8))?;
    let authority = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan-authority"));
        command.arg("--config").arg(&config);
        command
    };
    assert_plain_text(&log_lines_until(&mut authority(), "authority serving", EXIT_WAIT)?);
    assert_json_lines(&log_lines_until(authority().args(["--log-format", "json"]), "authority serving", EXIT_WAIT)?);
    Ok(())
}

/// `listen = ["0.0.0.0:P", "[::]:P"]`, the usual way to serve every address: the authority
/// starts and answers over UDP and TCP on IPv4 and IPv6. (A dual-stack `[::]` took IPv4's port
/// too, and the second address failed with "address in use".) In a network namespace of the
/// test's own, so that the wildcard addresses reach no other interface. Needs root and `ip`.
#[test]
fn every_ipv4_and_every_ipv6_address_are_served_at_once() -> anyhow::Result<()> {
    use hickory_proto::op::Message;
    use hickory_proto::rr::RecordType;
    use std::io::Write;
    let ns = support::Netns::new("dual");
    support::ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
    let dir = tempfile::tempdir()?;
    let text = support::config_text(&dir.path().join("data"), 8).replacen(
        "[dns]\nlisten = [\"127.0.0.1:0\"]",
        "[dns]\nlisten = [\"0.0.0.0:5300\", \"[::]:5300\"]",
        1,
    );
    assert!(text.contains("[::]:5300"), "{text}");
    let path = dir.path().to_path_buf();
    let authority = ns.run(move || support::AuthorityProcess::start(&path, &text))?;
    let query = support::build_query("sip.example.test.", RecordType::A, support::Ask::default());
    let answers = ns.run(move || {
        let mut answers = Vec::new();
        for server in ["127.0.0.1:5300", "[::1]:5300"] {
            let server: std::net::SocketAddr = server.parse().expect("address");
            let local = if server.is_ipv4() { "127.0.0.1:0" } else { "[::1]:0" };
            let udp = std::net::UdpSocket::bind(local).expect("socket");
            udp.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
            udp.send_to(&query, server).expect("send");
            let mut buf = [0u8; 4096];
            let len = udp.recv(&mut buf).unwrap_or_else(|err| panic!("no UDP answer from {server}: {err}"));
            answers.push((server, "udp", buf[..len].to_vec()));
            let mut tcp = std::net::TcpStream::connect_timeout(&server, Duration::from_secs(5)).expect("a TCP connection");
            tcp.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
            tcp.write_all(&(query.len() as u16).to_be_bytes()).expect("write");
            tcp.write_all(&query).expect("write");
            let mut len = [0u8; 2];
            tcp.read_exact(&mut len).unwrap_or_else(|err| panic!("no TCP answer from {server}: {err}"));
            let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
            tcp.read_exact(&mut answer).expect("the TCP answer");
            answers.push((server, "tcp", answer));
        }
        answers
    });
    for (server, transport, answer) in answers {
        let msg = Message::from_vec(&answer)?;
        assert_eq!(support::addresses(&msg).len(), 1, "{server} over {transport}: {msg:?}");
    }
    drop(authority);
    Ok(())
}
