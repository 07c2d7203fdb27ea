//! The CLI, an enactor and a planner on an authority whose control API speaks only TLS, each
//! as shipped: the `dnsplan-authority` binary with `[control.tls]`, `dnsplan --ca-file`,
//! `dnsplan-enactor` with `store.url = "https://..."`, `ca_file` and a client certificate as
//! its credential (no token), and `dnsplan-planner` with `ca_file` and a `plan` token, which
//! takes the planner's lease. Certificates from a CA of the test's own (`openssl`).

mod support;

use dnsplan_common::Store;
use dnsplan_common::store::remote::{ClientTls, RemoteStore};
use dnsplan_tests::certs::{make_ca, make_leaf};
use dnsplan_tests::daemon::Killed;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{bin_dir, free_port};

const OPERATOR_TOKEN: &str = "operator-token-over-tls-0123456789";
const PLANNER_TOKEN: &str = "planner-token-over-tls-0123456789";
/// How long the daemons may take to start and the enactor to report; far more than they need.
const WITHIN: Duration = Duration::from_secs(30);

fn authority_config(dir: &Path, dns_port: u16) -> String {
    format!(
        "data_dir = \"data\"\n[dns]\nlisten = [\"127.0.0.1:{dns_port}\"]\n[control]\nlisten = \"127.0.0.1:0\"\n\
         [[control.credential]]\nname = \"alice\"\nroles = [\"operate\"]\nsha256 = \"{}\"\n\
         [[control.credential]]\nname = \"enactor-a\"\nroles = [\"enact\"]\nclient_cert = \"enactor-a.dnsplan.test\"\n\
         [[control.credential]]\nname = \"planner-1\"\nroles = [\"plan\"]\nsha256 = \"{}\"\n\
         [control.tls]\ncert_file = \"server.crt\"\nkey_file = \"server.key\"\nclient_ca_file = \"ca.crt\"\n\
         [dns_zone]\norigin = \"example.test.\"\nns = [\"ns1.example.test.\"]\nrecords = \"ns1 3600 IN A 127.0.0.1\"\n\
         [dns_zone.soa]\nmname = \"ns1.example.test.\"\nrname = \"hostmaster.example.test.\"\n",
        dnsplan_authority::control::access::token_sha256(OPERATOR_TOKEN),
        dnsplan_authority::control::access::token_sha256(PLANNER_TOKEN)
    )
    .replace("data_dir = \"data\"", &format!("data_dir = \"{}\"", dir.join("data").display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_an_enactor_and_a_planner_speak_tls_to_the_control_api() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    make_ca(d, "ca")?;
    make_leaf(d, "ca", "server", "IP:127.0.0.1")?;
    make_leaf(d, "ca", "enactor", "DNS:enactor-a.dnsplan.test")?;
    std::fs::write(d.join("authority.toml"), authority_config(d, free_port()?))?;
    let mut child = Command::new(bin_dir().join("dnsplan-authority"))
        .arg("--config")
        .arg(d.join("authority.toml"))
        .env_remove("DNSPLAN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(d.join("authority.log"))?)
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let _authority = Killed(child);
    let url = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("control").map(|u| u.trim().to_owned()))
        .ok_or_else(|| {
            let log = std::fs::read_to_string(d.join("authority.log")).unwrap_or_default();
            anyhow::anyhow!("the authority did not say where its control API is; its log:\n{log}")
        })?;
    anyhow::ensure!(url.starts_with("https://"), "the authority announces {url}");

    let dnsplan = |args: &[&str]| {
        Command::new(bin_dir().join("dnsplan"))
            .args(["--control", &url, "--token", OPERATOR_TOKEN])
            .args(args)
            .env_remove("DNSPLAN_TOKEN")
            .output()
    };
    let ca_file = d.join("ca.crt").display().to_string();
    let out = dnsplan(&["--ca-file", &ca_file, "pause", "--reason", "over TLS"])?;
    assert!(out.status.success(), "dnsplan pause over TLS: {}", String::from_utf8_lossy(&out.stderr));
    let out = dnsplan(&["--ca-file", &ca_file, "status"])?;
    assert!(out.status.success(), "dnsplan status over TLS: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("over TLS"), "status: {}", String::from_utf8_lossy(&out.stdout));
    let out = dnsplan(&["status"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && stderr.contains("CA file"), "without --ca-file: {:?} {stderr}", out.status);

    // The enactor's only credential is its certificate.
    let config = format!(
        "id = \"enactor-a\"\nzone = \"a\"\n[store]\nkind = \"control\"\nurl = \"{url}\"\nca_file = \"ca.crt\"\n\
         cert_file = \"enactor.crt\"\nkey_file = \"enactor.key\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n[verify]\nenabled = false\n\
         [apply]\nheartbeat_interval_secs = 1\n"
    );
    std::fs::write(d.join("enactor.toml"), config)?;
    let log = std::fs::File::create(d.join("enactor.log"))?;
    let _enactor = Killed(
        Command::new(bin_dir().join("dnsplan-enactor"))
            .arg("--config")
            .arg(d.join("enactor.toml"))
            .env_remove("DNSPLAN_TOKEN")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?,
    );
    // The planner with a `plan` token: it takes the lease.
    let config = format!(
        "id = \"planner-1\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"{url}\"\nca_file = \"ca.crt\"\ntoken = \"{PLANNER_TOKEN}\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n[[endpoint]]\nname = \"api.example.test.\"\nttl_secs = 30\n\
         check = {{ kind = \"tcp\", port = 1, timeout_ms = 300 }}\n[[endpoint.target]]\naddress = \"127.0.0.11\"\nzone = \"a\"\n"
    );
    std::fs::write(d.join("planner.toml"), config)?;
    let log = std::fs::File::create(d.join("planner.log"))?;
    let _planner = Killed(
        Command::new(bin_dir().join("dnsplan-planner"))
            .arg("--config")
            .arg(d.join("planner.toml"))
            .env_remove("DNSPLAN_TOKEN")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?,
    );
    let ca = std::fs::read(d.join("ca.crt"))?;
    let operator = RemoteStore::with_tls(&url, Some(OPERATOR_TOKEN.into()), Some(&ClientTls { ca: &ca, identity: None }))?;
    let start = Instant::now();
    loop {
        let beat = operator.heartbeats().await?.iter().any(|h| h.enactor_id == "enactor-a");
        let lease = operator.lease().await?.is_some_and(|l| l.holder == "planner-1");
        if beat && lease {
            break;
        }
        let logs = ["enactor.log", "planner.log"].map(|f| std::fs::read_to_string(d.join(f)).unwrap_or_default());
        anyhow::ensure!(
            start.elapsed() < WITHIN,
            "within {WITHIN:?}: enactor heartbeat {beat}, planner lease {lease}; logs:\n{}\n{}",
            logs[0],
            logs[1]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
