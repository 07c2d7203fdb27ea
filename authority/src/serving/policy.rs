//! Who may transfer the zone and with which TSIG keys (`TransferPolicy`, built from
//! `[dns.transfer]`, `TransferConfig`), and the secondaries to NOTIFY. It sits below the
//! listeners and the transfers because `Serving` holds it: every signed query, transfer or not,
//! is checked against its keys.
//!
//! A client whose address is in no allowed prefix, or that does not sign when a key is required, is
//! REFUSED; nothing about keys is said to it. A client that signs with a key it may not use, with a
//! wrong MAC or at a time outside the fudge gets NOTAUTH with the TSIG error (BADKEY, BADSIG,
//! BADTIME), as RFC 8945 §5.2 requires; BADKEY echoes the client's own key name, nothing of ours.
//! Every message of an allowed, signed transfer is signed (RFC 8945 §5.3.1).

use crate::query::rrl::IpPrefix;
use dnsplan_common::tsig::{self, RequestError, TsigKey, TsigKeyConfig, TsigKeyError, VerifiedRequest};
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Changed names the IXFR history keeps by default (`dns.transfer.ixfr_history_names_max`).
pub const IXFR_HISTORY_NAMES_DEFAULT: usize = 100_000;

/// A secondary to notify: where it takes NOTIFY, with its key.
#[derive(Clone, Debug)]
pub struct NotifyTarget {
    pub addr: SocketAddr,
    pub key: Option<TsigKey>,
}

/// Who may transfer the zone, with which keys.
pub struct TransferPolicy {
    keys: Vec<TsigKey>,
    /// Each allowed prefix and the index of its key in `keys` (`None`: unsigned, only when
    /// `tsig_required` is off).
    secondaries: Vec<(IpPrefix, Option<usize>)>,
    tsig_required: bool,
    /// Transfers being encoded (`dns.transfer.transfers_max`).
    permits: Arc<Semaphore>,
    /// The secondaries to NOTIFY after each change, with their keys.
    notify: Vec<NotifyTarget>,
    ixfr_history_names_max: usize,
    ixfr_journal_bytes_max: u64,
}

/// What a transfer request may do.
#[derive(Debug)]
pub enum Access {
    /// Not from an allowed address, or unsigned where a signature is required.
    Refused,
    /// Signed, and the signature failed a check: NOTAUTH with the TSIG error.
    Failed(RequestError),
    /// Allowed; signed with this key when `Some`.
    Allowed(Option<VerifiedRequest>),
}

impl TransferPolicy {
    /// Nobody may transfer; signed queries are checked against no key (BADKEY).
    pub fn closed() -> TransferPolicy {
        TransferPolicy {
            keys: Vec::new(),
            secondaries: Vec::new(),
            tsig_required: true,
            permits: Arc::new(Semaphore::new(1)),
            notify: Vec::new(),
            ixfr_history_names_max: IXFR_HISTORY_NAMES_DEFAULT,
            ixfr_journal_bytes_max: 0,
        }
    }

    /// The policy of `[dns.transfer]` (checked by `TransferConfig::check`); reads secret files
    /// relative to `config_dir`.
    pub fn from_config(config: &TransferConfig, config_dir: &Path) -> Result<TransferPolicy, TsigKeyError> {
        let keys = tsig::keys_from_config(&config.keys, config_dir)?;
        let secondaries: Vec<(IpPrefix, Option<usize>)> = config
            .secondaries
            .iter()
            .map(|s| {
                let key = s.key.as_ref().and_then(|name| {
                    let wanted = normal_key_name(name);
                    keys.iter().position(|k| k.name().to_string() == wanted)
                });
                (s.address, key)
            })
            .collect();
        let notify = config
            .secondaries
            .iter()
            .zip(&secondaries)
            .filter_map(|(s, (_, key))| s.notify.map(|addr| NotifyTarget { addr, key: key.map(|i| keys[i].clone()) }))
            .collect();
        Ok(TransferPolicy {
            keys,
            secondaries,
            tsig_required: config.tsig_required,
            permits: Arc::new(Semaphore::new(config.transfers_max.max(1))),
            notify,
            ixfr_history_names_max: config.ixfr_history_names_max,
            ixfr_journal_bytes_max: config.ixfr_journal_bytes_max,
        })
    }

    /// Transfers being encoded at once (`dns.transfer.transfers_max`): `xfr::transfer` takes a
    /// permit for each.
    pub(crate) fn permits(&self) -> &Arc<Semaphore> {
        &self.permits
    }

    /// Changed names the IXFR history keeps.
    pub fn ixfr_history_names_max(&self) -> usize {
        self.ixfr_history_names_max
    }

    /// Most bytes of the IXFR history on disk; 0: in memory only.
    pub fn ixfr_journal_bytes_max(&self) -> u64 {
        self.ixfr_journal_bytes_max
    }

    /// Whether any secondary may transfer the zone.
    pub fn has_secondaries(&self) -> bool {
        !self.secondaries.is_empty()
    }

    /// The secondaries to NOTIFY after each change.
    pub fn notify_targets(&self) -> &[NotifyTarget] {
        &self.notify
    }

    /// Every configured key.
    pub fn keys(&self) -> &[TsigKey] {
        &self.keys
    }

    /// Whether `packet`, a transfer request from `peer`, may be answered, as of
    /// `now_unix_secs`. The address is checked first, so a client outside every prefix
    /// learns nothing about keys.
    pub fn access(&self, peer: IpAddr, packet: &[u8], now_unix_secs: u64) -> Access {
        let allowed: Vec<Option<usize>> = self.secondaries.iter().filter(|(p, _)| p.contains(peer)).map(|(_, k)| *k).collect();
        if allowed.is_empty() {
            return Access::Refused;
        }
        let keys = allowed.iter().flatten().map(|&i| &self.keys[i]);
        match quiet(|| tsig::verify_request(keys, packet, now_unix_secs)) {
            Ok(verified) => Access::Allowed(Some(verified)),
            Err(RequestError::Unsigned) if !self.tsig_required && allowed.contains(&None) => Access::Allowed(None),
            Err(RequestError::Unsigned | RequestError::Malformed) => Access::Refused,
            Err(failed) => Access::Failed(failed),
        }
    }
}

/// Runs `f` with no tracing subscriber: hickory's decoder logs client-chosen text at WARN for
/// some malformed options (see `answer`), and every TSIG check decodes the client's message.
pub(crate) fn quiet<T>(f: impl FnOnce() -> T) -> T {
    tracing::dispatcher::with_default(&tracing::Dispatch::none(), f)
}

/// `[dns.transfer]`: who may transfer the zone (AXFR, IXFR) and with which TSIG key. Nobody
/// by default. A client outside every `secondaries` prefix, or without a signature when one
/// is required, is REFUSED; see `xfr::respond` and `xfr::transfer`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferConfig {
    /// Every secondary must sign its requests with its key (RFC 8945). Off only on a network
    /// where an address cannot be spoofed and nothing else can reach the port.
    #[serde(default = "default_tsig_required")]
    pub tsig_required: bool,
    /// The TSIG keys (`[[dns.transfer.keys]]`: name, algorithm, secret or secret_file).
    #[serde(default)]
    pub keys: Vec<TsigKeyConfig>,
    /// The secondaries allowed (`[[dns.transfer.secondaries]]`: address, key).
    #[serde(default)]
    pub secondaries: Vec<SecondaryConfig>,
    /// Zone transfers encoded at once; more wait (up to `dns.tcp_idle_timeout_secs`, then
    /// REFUSED). Each takes a core while it encodes.
    #[serde(default = "default_transfers_max")]
    pub transfers_max: usize,
    /// Changed names kept in memory for IXFR, over all changes; a secondary further behind
    /// gets the whole zone.
    #[serde(default = "default_ixfr_history_names_max")]
    pub ixfr_history_names_max: usize,
    /// Most bytes of the IXFR history kept on disk (`ixfr-journal` in `data_dir`), so a
    /// restarted primary answers IXFR from where each secondary is; past it the older half is
    /// dropped. 0 keeps it in memory only.
    #[serde(default = "default_ixfr_journal_bytes_max")]
    pub ixfr_journal_bytes_max: u64,
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            tsig_required: true,
            keys: Vec::new(),
            secondaries: Vec::new(),
            transfers_max: default_transfers_max(),
            ixfr_history_names_max: default_ixfr_history_names_max(),
            ixfr_journal_bytes_max: default_ixfr_journal_bytes_max(),
        }
    }
}

fn default_tsig_required() -> bool {
    true
}
/// Two: a secondary or two refreshing at once transfer at full speed, and a fleet told by
/// NOTIFY takes turns instead of taking every core from the control API.
fn default_transfers_max() -> usize {
    2
}
/// 100,000 changed names: two entry pointers each, and the replaced entries they keep alive
/// (a few hundred bytes each), tens of MB at most; a day of changes at a change a second.
fn default_ixfr_history_names_max() -> usize {
    IXFR_HISTORY_NAMES_DEFAULT
}
/// 64 MiB: the default in-memory history's changes (100,000 names) at about 300 bytes each,
/// twice over.
fn default_ixfr_journal_bytes_max() -> u64 {
    64 << 20
}

/// One allowed secondary: an address or prefix, and the name of the key it signs with.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecondaryConfig {
    /// An address (`192.0.2.53`) or a prefix (`192.0.2.0/24`).
    pub address: IpPrefix,
    /// The name of one of `dns.transfer.keys`; required while `tsig_required`.
    pub key: Option<String>,
    /// Where this secondary takes NOTIFY (address and port), sent after every change and
    /// signed with `key`; none when unset (it then refreshes on the SOA's schedule).
    pub notify: Option<SocketAddr>,
}

impl TransferConfig {
    /// Every value in range, with a message naming the key (below `dns.transfer`). Keys are
    /// built (and their secrets read) by `TransferPolicy::from_config`.
    pub fn check(&self) -> Result<(), String> {
        if self.transfers_max == 0 {
            return Err("dns.transfer.transfers_max must be above 0".into());
        }
        let key_names: Vec<String> = self.keys.iter().map(|k| normal_key_name(&k.name)).collect();
        for (i, secondary) in self.secondaries.iter().enumerate() {
            match &secondary.key {
                None if self.tsig_required => {
                    return Err(format!(
                        "dns.transfer.secondaries[{i}] ({}): no key, and dns.transfer.tsig_required is true; give the name of one \
                         of dns.transfer.keys, or set tsig_required = false",
                        secondary.address
                    ));
                }
                None => {}
                Some(name) if !key_names.contains(&normal_key_name(name)) => {
                    return Err(format!(
                        "dns.transfer.secondaries[{i}] ({}): key {name:?} is not one of dns.transfer.keys (by name)",
                        secondary.address
                    ));
                }
                Some(_) => {}
            }
            if let Some(notify) = secondary.notify
                && !secondary.address.contains(notify.ip())
            {
                return Err(format!(
                    "dns.transfer.secondaries[{i}]: notify {notify} is outside its address {}; a secondary is told to transfer \
                     from where it may",
                    secondary.address
                ));
            }
        }
        Ok(())
    }
}

/// A key name as compared: lower case, with the final dot.
pub fn normal_key_name(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    if lower.ends_with('.') { lower } else { format!("{lower}.") }
}
