//! The control API over TLS, from outside: the `dnsplan-authority` binary with `[control.tls]`,
//! its certificates made by a CA of the test's own (`openssl`), asked by `RemoteStore` (what
//! planners, enactors and the CLI use; the CLI and an enactor daemon over TLS are in the CLI's
//! `tls` test).
//!
//! - TLS is required off loopback: a plain listener on 0.0.0.0 refuses to start, naming the
//!   way out;
//! - over HTTPS with the CA: reads and writes work; plain HTTP, or a client that trusts
//!   another CA, gets nothing;
//! - a client certificate the CA signed for a `client_cert` name is that credential (its
//!   role's writes pass, the others are 403); one from another CA fails the handshake;
//! - the certificate is replaced without a restart (SIGHUP): new connections get the new one.

mod support;

use dnsplan_common::store::remote::{ClientTls, RemoteStore};
use dnsplan_common::{Generation, Store, StoreError};
use dnsplan_tests::certs::{make_ca, make_leaf};
use std::path::Path;
use std::process::Command;
use support::{AuthorityProcess, field, message};

const READ_TOKEN: &str = "read-token-over-tls-0123456789";

fn pem(dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The test config with TLS on loopback: the server's `server.crt`, clients signed by `ca`
/// taken as credentials; a read token, and `enactor-1.dnsplan.test`'s certificate with `enact`.
fn tls_config(dir: &Path) -> String {
    let tables = format!(
        "reload_check_secs = 0\n\
         [[control.credential]]\nname = \"reader\"\nroles = [\"read\"]\nsha256 = \"{}\"\n\
         [[control.credential]]\nname = \"enactor-1\"\nroles = [\"enact\"]\nclient_cert = \"enactor-1.dnsplan.test\"\n\
         [control.tls]\ncert_file = \"server.crt\"\nkey_file = \"server.key\"\nclient_ca_file = \"ca.crt\"\n",
        dnsplan_authority::control::access::token_sha256(READ_TOKEN)
    );
    let text = support::config_text(&dir.join("data"), 8).replace(&format!("token = \"{}\"\n", support::TOKEN), "");
    text.replace("[dns_zone]\n", &format!("{tables}[dns_zone]\n"))
}

fn store(url: &str, token: Option<&str>, ca: &[u8], identity: Option<(&[u8], &[u8])>) -> anyhow::Result<RemoteStore> {
    Ok(RemoteStore::with_tls(url, token.map(str::to_owned), Some(&ClientTls { ca, identity }))?)
}

#[test]
fn a_plain_listener_off_loopback_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("zone.db"), support::ZONE_FILE)?;
    let text =
        support::config_text(&dir.path().join("data"), 8).replace("listen = \"127.0.0.1:0\"\ntoken", "listen = \"0.0.0.0:0\"\ntoken");
    assert!(text.contains("0.0.0.0:0"), "the control listener was not changed");
    let path = dir.path().join("authority.toml");
    std::fs::write(&path, &text)?;
    let out = Command::new(env!("CARGO_BIN_EXE_dnsplan-authority")).arg("--config").arg(&path).env_remove("DNSPLAN_TOKEN").output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {stderr}");
    assert!(stderr.contains("0.0.0.0:0 is not a loopback address") && stderr.contains("[control.tls]"), "{stderr}");
    // Said explicitly, it starts (behind a proxy or mesh that encrypts).
    std::fs::write(&path, text.replace("listen = \"0.0.0.0:0\"\n", "listen = \"0.0.0.0:0\"\ninsecure_plaintext = true\n"))?;
    let authority = AuthorityProcess::start(dir.path(), &std::fs::read_to_string(&path)?)?;
    assert!(authority.control.starts_with("http://0.0.0.0:"), "{}", authority.control);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_api_speaks_tls_takes_client_certificates_and_reloads_its_own() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    make_ca(d, "ca")?;
    make_ca(d, "other-ca")?;
    make_leaf(d, "ca", "server", "IP:127.0.0.1")?;
    make_leaf(d, "ca", "enactor", "DNS:enactor-1.dnsplan.test")?;
    make_leaf(d, "ca", "stranger", "DNS:someone-else.dnsplan.test")?;
    make_leaf(d, "other-ca", "forged", "DNS:enactor-1.dnsplan.test")?;
    let authority = AuthorityProcess::start(d, &tls_config(d))?;
    let url = authority.control.clone();
    assert!(url.starts_with("https://127.0.0.1:"), "the binary announces {url}");
    let ca = pem(d, "ca.crt");

    // Over HTTPS with the CA: a read with the token; nothing without a credential.
    let reader = store(&url, Some(READ_TOKEN), &ca, None)?;
    assert_eq!(reader.latest().await?, Generation(0));
    assert!(matches!(store(&url, None, &ca, None)?.latest().await, Err(StoreError::Unauthorized)));
    // Plain HTTP on the TLS port, or trusting another CA: no answer at all.
    let plain = RemoteStore::new(&url.replace("https://", "http://"), Some(READ_TOKEN.into()))?;
    assert!(matches!(plain.latest().await, Err(StoreError::Unavailable(_))), "plain HTTP was answered");
    let wrong_ca = store(&url, Some(READ_TOKEN), &pem(d, "other-ca.crt"), None)?;
    assert!(matches!(wrong_ca.latest().await, Err(StoreError::Unavailable(_))), "a client trusting another CA was answered");

    // The enactor's certificate is the `enactor-1` credential: enact passes, operate is 403.
    let (cert, key) = (pem(d, "enactor.crt"), pem(d, "enactor.key"));
    let enactor = store(&url, None, &ca, Some((&cert, &key)))?;
    let beat = dnsplan_common::store::Heartbeat {
        enactor_id: "enactor-1".into(),
        zone: dnsplan_common::ZoneId::parse("az1")?,
        last_applied: Generation(0),
        latest_seen: Generation(0),
        at_unix_ms: 1,
        state: "idle".into(),
    };
    enactor.heartbeat(beat.clone()).await?;
    match enactor.resume().await {
        Err(StoreError::Forbidden(why)) => assert!(why.contains("enactor-1") && why.contains("operate"), "{why}"),
        other => panic!("the enact certificate resumed automation: {other:?}"),
    }
    let audit = authority.log_until("auditing the heartbeat's credential", |l| {
        message(l).starts_with("write refused") && field(l, "credential") == "enactor-1"
    })?;
    assert_eq!(field(&audit, "method"), "DELETE", "{audit}");
    // A certificate of the CA for another name is no credential; one of another CA for the
    // right name fails the handshake.
    let (cert, key) = (pem(d, "stranger.crt"), pem(d, "stranger.key"));
    assert!(matches!(store(&url, None, &ca, Some((&cert, &key)))?.heartbeat(beat.clone()).await, Err(StoreError::Unauthorized)));
    let (cert, key) = (pem(d, "forged.crt"), pem(d, "forged.key"));
    assert!(matches!(store(&url, None, &ca, Some((&cert, &key)))?.heartbeat(beat).await, Err(StoreError::Unavailable(_))));

    // A new certificate from another CA, put in place and reloaded: new connections get it.
    make_leaf(d, "other-ca", "renewed", "IP:127.0.0.1")?;
    std::fs::copy(d.join("renewed.crt"), d.join("server.crt"))?;
    std::fs::copy(d.join("renewed.key"), d.join("server.key"))?;
    authority.signal("-HUP")?;
    let reloaded = authority.log_until("of the reload", |l| message(l) == "control credentials reloaded")?;
    assert_eq!(field(&reloaded, "reason"), "SIGHUP");
    let renewed = store(&url, Some(READ_TOKEN), &pem(d, "other-ca.crt"), None)?;
    assert_eq!(renewed.latest().await?, Generation(0), "the renewed certificate is not served");
    assert!(matches!(store(&url, Some(READ_TOKEN), &ca, None)?.latest().await, Err(StoreError::Unavailable(_))), "still the old one");
    Ok(())
}
