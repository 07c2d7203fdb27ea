//! The tokens printed in the examples are refused wherever someone else could use them: by a
//! standalone authority always, and by `dnsplan up` unless its control API is on loopback.
//! Before, any of them was accepted as long as it was 16 bytes or more.

use dnsplan_authority::config::AuthorityConfig;
use dnsplan_cli::up::{Overrides, Stack};
use dnsplan_common::daemon::PLACEHOLDER_TOKENS;
use std::path::Path;

fn authority_config(token: &str) -> String {
    format!(
        "data_dir = \"data\"\n[dns]\nlisten = [\"127.0.0.1:0\"]\n[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n\
         [dns_zone]\norigin = \"example.test.\"\nns = [\"ns1.example.test.\"]\n[dns_zone.soa]\nmname = \"ns1.example.test.\"\n\
         rname = \"hostmaster.example.test.\"\n"
    )
}

#[test]
fn a_standalone_authority_refuses_the_placeholder_tokens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("authority.toml");
    for token in PLACEHOLDER_TOKENS {
        std::fs::write(&path, authority_config(token))?;
        let err = AuthorityConfig::load(&path).expect_err(token).to_string();
        assert!(err.contains("placeholder") && err.contains("openssl rand"), "{token}: {err}");
    }
    std::fs::write(&path, authority_config("a-real-token-0123456789abcdef"))?;
    AuthorityConfig::load(&path)?;
    Ok(())
}

#[test]
fn dnsplan_up_takes_the_demo_token_on_loopback_only() -> anyhow::Result<()> {
    let on = |addr: &str| Overrides { data_dir: None, dns: None, control: Some(addr.parse().expect("address")), accept_store_loss: false };
    // The built-in config carries the demo token (DNSPLAN_TOKEN unset in tests).
    assert!(std::env::var_os(dnsplan_common::daemon::TOKEN_ENV).is_none(), "run without {}", dnsplan_common::daemon::TOKEN_ENV);
    Stack::load(None, on("127.0.0.1:0"))?;
    Stack::load(None, on("[::1]:0"))?;
    let err = Stack::load(None, on("0.0.0.0:8053")).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("only with the control API on loopback"), "{err}");
    Ok(())
}

/// Off loopback, `dnsplan up` needs TLS too (with a token of its own): plain HTTP there is
/// refused, naming `[control.tls]`, unless `insecure_plaintext` says something else encrypts.
#[test]
fn dnsplan_up_off_loopback_needs_tls_or_says_why_not() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("dnsplan.toml");
    let example = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/dnsplan.toml"))?
        .replace("token = \"dnsplan-demo-token-change-me\"", "token = \"a-real-token-0123456789abcdef\"")
        .replace("[authority.control]\nlisten = \"127.0.0.1:8053\"\n", "[authority.control]\nlisten = \"0.0.0.0:8053\"\n");
    assert!(example.contains("0.0.0.0:8053"), "the example's [authority.control] changed");
    let none = || Overrides { data_dir: None, dns: None, control: None, accept_store_loss: false };
    std::fs::write(&path, &example)?;
    let err = Stack::load(Some(&path), none()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("not a loopback address") && err.contains("[control.tls]"), "{err}");
    std::fs::write(&path, example.replace("listen = \"0.0.0.0:8053\"\n", "listen = \"0.0.0.0:8053\"\ninsecure_plaintext = true\n"))?;
    Stack::load(Some(&path), none())?;
    Ok(())
}
