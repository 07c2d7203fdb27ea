//! The store's settings (`EtcdConfig`) and what `connect` reports.

use crate::client::{self, EtcdTls};
use dnsplan_common::store_config::EtcdStoreConfig;
use std::time::Duration;
use thiserror::Error;

/// How long one etcd request may take before the store reports etcd unavailable. A healthy
/// cluster answers in milliseconds; a leader election takes about one election timeout (1 s by
/// default), so 5 s rides out an election and still fails fast enough for an operator.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// etcd's default `--max-request-bytes` (1.5 MiB). A larger request is refused by etcd.
pub const REQUEST_BYTES_DEFAULT: usize = 1_572_864;

/// etcd's default `--max-txn-ops`: the most operations in one branch of a transaction.
pub const TXN_OPS_DEFAULT: usize = 128;

/// Smallest request limit the store accepts: a chunk must still hold a useful share of a plan.
pub const REQUEST_BYTES_MIN: usize = 16 * 1024;

/// Where and how to reach etcd. Its `Debug` shows the user but never the password.
#[derive(Clone)]
pub struct EtcdConfig {
    /// Client URLs of the cluster's members (`http://host:2379`).
    pub endpoints: Vec<String>,
    /// Every key of this store starts with it (for example `/dnsplan/`); stores with
    /// different prefixes in one cluster are independent.
    pub prefix: String,
    pub request_timeout: Duration,
    /// A member not connected to within this long is skipped for the next (see `client`);
    /// never more than `request_timeout`.
    pub connect_timeout: Duration,
    /// The cluster's `--max-request-bytes`: plans larger than a quarter of it are written in
    /// chunks of half of it.
    pub request_bytes_max: usize,
    /// The cluster's `--max-txn-ops`: batches are split to fit.
    pub txn_ops_max: usize,
    /// User and password, when the cluster has authentication on.
    pub user: Option<(String, String)>,
    /// TLS, for `https://` endpoints; `None` for `http://` ones.
    pub tls: Option<EtcdTls>,
    /// The keys trusted to author plans: a publish of a plan it does not trust is refused
    /// (`StoreError::Untrusted`). `None` trusts every plan.
    pub keyring: Option<std::sync::Arc<dnsplan_common::signing::Keyring>>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_bytes_max", &self.request_bytes_max)
            .field("txn_ops_max", &self.txn_ops_max)
            .field("user", &self.user.as_ref().map(|(user, _)| (user, "<hidden>")))
            .field("tls", &self.tls)
            .field("keyring", &self.keyring.is_some())
            .finish()
    }
}

impl EtcdConfig {
    pub fn new(endpoints: Vec<String>, prefix: impl Into<String>) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            prefix: prefix.into(),
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            connect_timeout: client::CONNECT_TIMEOUT_DEFAULT,
            request_bytes_max: REQUEST_BYTES_DEFAULT,
            txn_ops_max: TXN_OPS_DEFAULT,
            user: None,
            tls: None,
            keyring: None,
        }
    }

    /// The client settings of a daemon's `[store] kind = "etcd"`, once resolved (password and
    /// TLS files read): endpoints, prefix, user and TLS; the limits keep their defaults.
    pub fn from_settings(settings: &EtcdStoreConfig) -> EtcdConfig {
        let mut config = EtcdConfig::new(settings.endpoints.clone(), settings.prefix.clone());
        config.user = settings.credentials().map(|(user, password)| (user, password.expose().to_string()));
        config.tls = settings.tls.as_ref().map(|tls| EtcdTls { ca_pem: tls.ca.clone(), identity: tls.identity.clone() });
        config
    }

    pub(crate) fn check(&self) -> Result<(), ConnectError> {
        let bad = |what: String| Err(ConnectError::Config(what));
        if self.endpoints.is_empty() {
            return bad("no etcd endpoints; give the client URLs of the cluster's members".into());
        }
        // One scheme for all: TLS is set up per client, not per endpoint.
        for endpoint in &self.endpoints {
            match (endpoint.starts_with("https://"), &self.tls) {
                (true, None) => return bad(format!("{endpoint:?} is https:// but no TLS is set up (the CA of the members)")),
                (false, Some(_)) => return bad(format!("{endpoint:?} is not https:// but TLS is set up; give every member as https://")),
                _ => {}
            }
        }
        if !self.prefix.starts_with('/') || !self.prefix.ends_with('/') || self.prefix.len() < 2 {
            return bad(format!("key prefix {:?} must start and end with '/' and name something (for example /dnsplan/)", self.prefix));
        }
        if self.request_bytes_max < REQUEST_BYTES_MIN {
            return bad(format!("request_bytes_max {} is below {REQUEST_BYTES_MIN}", self.request_bytes_max));
        }
        if self.txn_ops_max < 8 {
            return bad(format!("txn_ops_max {} is below 8; etcd's default is {TXN_OPS_DEFAULT}", self.txn_ops_max));
        }
        if self.request_timeout.is_zero() || self.request_timeout > Duration::from_secs(60) {
            return bad(format!("request_timeout {:?} must be in (0, 60 s]", self.request_timeout));
        }
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout must be above 0".into());
        }
        Ok(())
    }

    pub(crate) fn chunk_bytes(&self) -> usize {
        self.request_bytes_max / 2
    }

    pub(crate) fn inline_bytes_max(&self) -> usize {
        self.request_bytes_max / 4
    }

    /// Endpoints one apply transaction switches: a switch is up to four operations (record,
    /// fence, old and new index entries) and the counter's slot is one more; and the records must fit
    /// half a request.
    pub(crate) fn switches_per_txn(&self) -> usize {
        (self.txn_ops_max - 1) / 4
    }
}

#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("etcd store configuration: {0}")]
    Config(String),
    #[error("cannot set up the etcd client")]
    Client(#[source] client::Error),
}
