//! An authority running in-process on real sockets (port 0) over a store the caller chose, for
//! tests that need the whole serving path: DNS over UDP and TCP, and the control API.

use dnsplan_authority::config::AuthorityConfig;
use dnsplan_authority::run::{Bound, run_with_store};
use dnsplan_authority::zone::dns_zone::{DnsZoneConfig, SoaConfig};
use std::net::SocketAddr;
use std::path::Path;

pub const TOKEN: &str = "stack-test-token-0123456789";

/// The `[dns_zone]` of the fixtures' DNS zone (`example.test.`), with `master_file` for
/// static records (relative to the directory given to `StaticZone::load`).
pub fn dns_zone_config(master_file: Option<&str>) -> DnsZoneConfig {
    DnsZoneConfig {
        origin: "example.test.".into(),
        soa: Some(SoaConfig {
            mname: "ns1.example.test.".into(),
            rname: "hostmaster.example.test.".into(),
            ttl_secs: 300,
            refresh_secs: 3600,
            retry_secs: 600,
            expire_secs: 604_800,
            minimum_secs: 30,
            serial_base: 0,
        }),
        ns: vec!["ns1.example.test.".into()],
        ns_ttl_secs: 3600,
        master_file: master_file.map(Into::into),
        records: None,
        dnssec: None,
    }
}

/// The authority config the tests use: the fixtures' DNS zone, ports chosen by the system.
pub fn authority_config_text(data_dir: &Path) -> String {
    format!(
        r#"
data_dir = "{data}"
[dns]
listen = ["127.0.0.1:0"]
[control]
listen = "127.0.0.1:0"
token = "{TOKEN}"
[dns_zone]
origin = "{zone}"
ns = ["ns1.{zone}"]
[dns_zone.soa]
mname = "ns1.{zone}"
rname = "hostmaster.{zone}"
ttl_secs = 300
minimum_secs = 30
"#,
        data = data_dir.display(),
        zone = crate::fixtures::DNS_ZONE,
    )
}

/// What [`Authority::start_with`] changes in the tests' config.
#[derive(Clone, Debug, Default)]
pub struct AuthorityOptions {
    /// The DNS port on 127.0.0.1; 0 lets the system choose. A secondary configured before
    /// the authority starts (it must name its primary) needs it known in advance.
    pub dns_port: u16,
    /// TOML appended to the config as it is, such as `[dns.transfer]` with its keys and
    /// secondaries.
    pub extra_config: String,
}

pub struct Authority {
    pub dns: SocketAddr,
    /// The control API's base URL.
    pub control: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Authority {
    /// Serves `store` with a config written into `dir`.
    pub async fn start<S: dnsplan_common::store::zones::ManagedZones>(store: S, dir: &Path) -> anyhow::Result<Authority> {
        Authority::start_with(store, dir, &AuthorityOptions::default()).await
    }

    /// As `start`, with the tests' config changed by `options`.
    pub async fn start_with<S: dnsplan_common::store::zones::ManagedZones>(
        store: S,
        dir: &Path,
        options: &AuthorityOptions,
    ) -> anyhow::Result<Authority> {
        let mut text = authority_config_text(&dir.join("data"));
        if options.dns_port != 0 {
            let listen = "listen = [\"127.0.0.1:0\"]";
            assert!(text.contains(listen), "the tests' config has one DNS listen line to change");
            text = text.replacen(listen, &format!("listen = [\"127.0.0.1:{}\"]", options.dns_port), 1);
        }
        text.push_str(&options.extra_config);
        let config_path = dir.join("authority.toml");
        std::fs::write(&config_path, text)?;
        let config = AuthorityConfig::load(&config_path)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<Bound>();
        let dir = dir.to_path_buf();
        let task = tokio::spawn(async move {
            run_with_store(store, config, &dir, async move { stop_rx.await.unwrap_or(()) }, move |b| {
                let _ = bound_tx.send(b);
            })
            .await
        });
        let bound = match bound_rx.await {
            Ok(bound) => bound,
            // Say why: the task has ended, with the authority's own error.
            Err(_) => {
                let why = match task.await {
                    Ok(Err(err)) => format!("{err:#}"),
                    Ok(Ok(())) => "it returned".into(),
                    Err(err) => err.to_string(),
                };
                anyhow::bail!("authority stopped before binding: {why}");
            }
        };
        Ok(Authority { dns: bound.dns[0], control: format!("http://{}", bound.control), stop: Some(stop_tx), task })
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await??;
        Ok(())
    }
}
