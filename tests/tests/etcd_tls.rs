//! TLS to etcd: a real etcd member (Debian's etcd-server) serving its clients over `https://`
//! with a certificate signed by a CA made here with the `openssl` CLI, and checking client
//! certificates (`--client-cert-auth`). The store with the CA and a client certificate
//! publishes and reads; without the client certificate, or trusting another CA, every call
//! fails; an `https://` endpoint without TLS set up, or TLS with an `http://` endpoint, is a
//! configuration error before any connection.
//!
//! A missing `etcd` or `openssl` binary fails the test with what to install. Every wait is a
//! poll with a deadline.

use dnsplan_authority::config::AuthorityConfig;
use dnsplan_authority::run::{Bound, run};
use dnsplan_common::dns_probe::{RecordType, query};
use dnsplan_common::store::ApplyItem;
use dnsplan_common::store_config::StoreConfig;
use dnsplan_common::{Generation, Store};
use dnsplan_etcd::{ConnectError, EtcdConfig, EtcdStore, EtcdTls};
use dnsplan_tests::certs::{make_ca, make_leaf};
use dnsplan_tests::fixtures::{self, name, planner};
use dnsplan_tests::stack::authority_config_text;
use std::collections::BTreeSet;
use std::net::{IpAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the member may take to start and elect itself.
const START: Duration = Duration::from_secs(30);
/// Timeout of one store call in the failing cases: a refused handshake fails at once.
const CALL: Duration = Duration::from_secs(3);

/// One etcd member, killed when dropped.
struct Member(Child);

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn read(dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn config(client_url: &str, tls: Option<EtcdTls>) -> EtcdConfig {
    let mut config = EtcdConfig::new(vec![client_url.to_owned()], "/tls/");
    config.tls = tls;
    config.request_timeout = CALL;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_talks_tls_to_etcd_and_refuses_what_the_members_would_not_trust() -> anyhow::Result<()> {
    dnsplan_tests::etcd::check_etcd_installed()?;
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    make_ca(d, "ca")?;
    make_leaf(d, "ca", "server", "IP:127.0.0.1")?;
    make_leaf(d, "ca", "client", "IP:127.0.0.1")?;
    make_ca(d, "other-ca")?;

    let ports: Vec<u16> = {
        let listeners = (0..2).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<Vec<_>, _>>()?;
        listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<Result<_, _>>()?
    };
    let client_url = format!("https://127.0.0.1:{}", ports[0]);
    let peer_url = format!("http://127.0.0.1:{}", ports[1]);
    let path = |f: &str| d.join(f).display().to_string();
    let log = std::fs::File::create(d.join("etcd.log"))?;
    let child = Command::new("etcd")
        .args(["--name", "tls", "--data-dir", &path("data")])
        .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("tls={peer_url}")])
        .args(["--cert-file", &path("server.crt"), "--key-file", &path("server.key")])
        .args(["--trusted-ca-file", &path("ca.crt"), "--client-cert-auth"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let mut member = Member(child);

    let trusted = EtcdTls { ca_pem: read(d, "ca.crt"), identity: Some((read(d, "client.crt"), read(d, "client.key"))) };
    let store = EtcdStore::connect(config(&client_url, Some(trusted.clone()))).await?;
    let deadline = Instant::now() + START;
    loop {
        match store.latest().await {
            Ok(_) => break,
            Err(err) => {
                let log = std::fs::read_to_string(d.join("etcd.log")).unwrap_or_default();
                anyhow::ensure!(member.0.try_wait()?.is_none(), "etcd exited:\n{log}");
                anyhow::ensure!(Instant::now() < deadline, "no answer over TLS within {START:?}: {err}\n{log}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let names = [name("api"), name("www")];
    store.publish(&fixtures::plan(1, &names, planner())).await?;
    assert_eq!(store.latest().await?, Generation(1), "the plan published over TLS");
    assert_eq!(store.plan(Generation(1)).await?.generation(), Generation(1));

    // An enactor's config with the files, loaded (and resolved) by its loader, and the
    // client's settings made from its `[store]`.
    let path = d.join("enactor.toml");
    std::fs::write(
        &path,
        format!(
            "id = \"enactor-a\"\nzone = \"a\"\n[store]\nkind = \"etcd\"\nendpoints = [\"{client_url}\"]\nprefix = \"/tls/\"\n\
             ca_file = \"ca.crt\"\ncert_file = \"client.crt\"\nkey_file = \"client.key\"\n"
        ),
    )?;
    let settings = dnsplan_enactor::EnactorConfig::load(&path, None, None)?.store;
    let StoreConfig::Etcd(settings) = &settings else { anyhow::bail!("not etcd") };
    let from_config = EtcdStore::connect(EtcdConfig::from_settings(settings)).await?;
    assert_eq!(from_config.latest().await?, Generation(1), "the store of a [store] table with TLS files");

    // An authority on the cluster over TLS, with the same table in its config: it answers DNS
    // only once it has read etcd, then serves what was applied there.
    let items: Vec<ApplyItem> =
        names.iter().map(|n| ApplyItem { endpoint: n.clone(), records: fixtures::endpoint_for(Generation(1)) }).collect();
    for result in store.apply_many(Generation(1), &items).await? {
        result?;
    }
    let tls_table = "ca_file = \"ca.crt\"\ncert_file = \"client.crt\"\nkey_file = \"client.key\"\n";
    let text = format!(
        "{}\n[store]\nkind = \"etcd\"\nendpoints = [\"{client_url}\"]\nprefix = \"/tls/\"\n{tls_table}",
        authority_config_text(&d.join("authority-data"))
    );
    std::fs::write(d.join("authority.toml"), text)?;
    let authority_config = AuthorityConfig::load(&d.join("authority.toml"))?;
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<Bound>();
    let config_dir = d.to_path_buf();
    let authority = tokio::spawn(async move {
        run(authority_config, &config_dir, async move { stop_rx.await.unwrap_or(()) }, move |b| {
            let _ = bound_tx.send(b);
        })
        .await
    });
    let bound =
        tokio::time::timeout(START, bound_rx).await.map_err(|_| anyhow::anyhow!("the authority did not answer DNS over TLS etcd"))??;
    let answer = query(bound.dns[0], "api.example.test.", RecordType::A, Duration::from_millis(500)).await?;
    let want: BTreeSet<IpAddr> = fixtures::endpoint_for(Generation(1)).targets.iter().map(|t| t.address).collect();
    assert_eq!(answer.addresses, want, "the authority serves what was applied in etcd over TLS");
    let _ = stop.send(());
    authority.await??;

    // The members check client certificates: none, or one they did not sign, is refused.
    let anonymous = EtcdStore::connect(config(&client_url, Some(EtcdTls { identity: None, ..trusted.clone() }))).await?;
    assert!(anonymous.latest().await.is_err(), "served a client without a certificate");
    // The client checks the members: a CA that did not sign theirs is refused.
    let elsewhere = EtcdTls { ca_pem: read(d, "other-ca.crt"), ..trusted.clone() };
    let doubting = EtcdStore::connect(config(&client_url, Some(elsewhere))).await?;
    assert!(doubting.latest().await.is_err(), "trusted a member whose CA it was not given");

    // One scheme for all endpoints, checked before any connection.
    let plain = EtcdStore::connect(config(&client_url, None)).await.err();
    assert!(matches!(&plain, Some(ConnectError::Config(m)) if m.contains("https://")), "{plain:?}");
    let mismatched = EtcdStore::connect(config(&peer_url, Some(trusted))).await.err();
    assert!(matches!(&mismatched, Some(ConnectError::Config(m)) if m.contains("not https://")), "{mismatched:?}");
    Ok(())
}
