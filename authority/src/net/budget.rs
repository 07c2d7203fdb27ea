//! How many connections the authority holds open at once, from its open-file limit.
//!
//! Every DNS TCP and control API connection holds a descriptor. When their caps together
//! exceed what the process has left, enough clients make every accept fail with EMFILE, and
//! with it anything else that needs a descriptor (the store's files). `fit` keeps the caps
//! under the limit, less the descriptors open when the listeners are bound (store, UDP
//! sockets, listeners), less a spare share (`spare`) for what the process opens later: the
//! store's files as it grows, the DNS connection over the cap that is accepted only to be
//! closed, the sockets of an embedding process (`dnsplan up`'s planner probes and demo
//! backends). Caps that do not fit are lowered: the control API's in proportion to what was
//! asked, the DNS listeners' to the rest. `fit` is pure; `fit_to_process` reads the limit
//! and logs what it lowered, once.

use dnsplan_common::open_files;

/// Fewest descriptors kept spare, whatever the limit.
pub const SPARE_MIN: u64 = 64;
/// Above `SPARE_MIN * SPARE_DIVISOR`, one descriptor in this many is kept spare, so an
/// embedding process with a large limit keeps room in proportion.
pub const SPARE_DIVISOR: u64 = 8;
/// Descriptors assumed open when the system cannot list them: the store, one UDP socket per
/// core on a large machine, the listeners.
pub const IN_USE_UNKNOWN: u64 = 256;

/// Most connections held open at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// DNS TCP connections per listen address (`dns.tcp_connections_max`).
    pub dns_tcp_per_listener: usize,
    /// Control API connections (`control.connections_max`).
    pub control: usize,
}

/// Caps that fit, and the figures they were fitted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    // Invariant: caps.dns_tcp_per_listener * listeners + caps.control <= available, both
    // caps at least 1 and at most what was asked.
    pub caps: Caps,
    pub lowered: bool,
    /// Descriptors left for connections: limit - in_use - spare.
    pub available: u64,
    pub spare: u64,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "the open-file limit (RLIMIT_NOFILE) of {limit} leaves {available} descriptors for connections ({in_use} open, {spare} kept \
     spare), too few for one connection per listener; raise the limit (ulimit -n, systemd's LimitNOFILE=)"
)]
pub struct TooFewDescriptors {
    pub limit: u64,
    pub in_use: u64,
    pub spare: u64,
    pub available: u64,
}

/// Descriptors kept spare under `limit`.
pub fn spare(limit: u64) -> u64 {
    SPARE_MIN.max(limit / SPARE_DIVISOR)
}

/// The caps of `wanted` that fit under `limit` with `in_use` descriptors open, for
/// `dns_listeners` DNS TCP listeners and one control API listener.
pub fn fit(limit: u64, in_use: u64, dns_listeners: usize, wanted: Caps) -> Result<Fit, TooFewDescriptors> {
    assert!(dns_listeners >= 1);
    assert!(wanted.dns_tcp_per_listener >= 1 && wanted.control >= 1);
    let spare = spare(limit);
    let available = limit.saturating_sub(in_use).saturating_sub(spare);
    let listeners = dns_listeners as u128;
    let (dns, control, room) = (wanted.dns_tcp_per_listener as u128, wanted.control as u128, u128::from(available));
    if room < listeners + 1 {
        return Err(TooFewDescriptors { limit, in_use, spare, available });
    }
    let asked = dns * listeners + control;
    if asked <= room {
        return Ok(Fit { caps: wanted, lowered: false, available, spare });
    }
    // room < asked, so both quotients are below what was asked.
    let control = (control * room / asked).clamp(1, room - listeners);
    let dns = ((room - control) / listeners).min(dns);
    let caps = Caps { dns_tcp_per_listener: dns as usize, control: control as usize };
    assert!(caps.dns_tcp_per_listener >= 1 && caps.control >= 1);
    assert!(dns * listeners + control <= room);
    Ok(Fit { caps, lowered: true, available, spare })
}

/// `fit` for this process now: its soft limit and the descriptors it has open. Logs one
/// WARN line when the caps were lowered, naming the values and what to do.
pub fn fit_to_process(dns_listeners: usize, wanted: Caps) -> Result<Caps, TooFewDescriptors> {
    let limit = match open_files::limit() {
        Ok(limit) => limit.soft,
        Err(err) => {
            tracing::warn!(%err, "cannot read the open-file limit; keeping the configured connection caps");
            return Ok(wanted);
        }
    };
    let in_use = open_files::in_use().unwrap_or(IN_USE_UNKNOWN);
    let fit = fit(limit, in_use, dns_listeners, wanted)?;
    if fit.lowered {
        tracing::warn!(
            open_files_limit = limit,
            open_files_in_use = in_use,
            open_files_spare = fit.spare,
            "connection caps lowered to fit the open-file limit: dns.tcp_connections_max {} -> {} (per listen address, {} of them), \
             control.connections_max {} -> {}; {} descriptors are left for connections once the {} open and {} kept spare are \
             counted; raise the limit (ulimit -n, systemd's LimitNOFILE=) to keep the configured caps",
            wanted.dns_tcp_per_listener,
            fit.caps.dns_tcp_per_listener,
            dns_listeners,
            wanted.control,
            fit.caps.control,
            fit.available,
            in_use,
            fit.spare,
        );
    }
    Ok(fit.caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: Caps = Caps { dns_tcp_per_listener: 1_024, control: 512 };

    #[test]
    fn caps_are_kept_when_they_fit() {
        let fit = fit(20_000, 30, 1, DEFAULTS).expect("fits");
        assert_eq!(fit, Fit { caps: DEFAULTS, lowered: false, available: 20_000 - 30 - 2_500, spare: 2_500 });
    }

    /// The case of the report: 1,024 descriptors and 1,024 DNS connections allowed.
    #[test]
    fn caps_are_lowered_under_a_small_limit() {
        let fit = fit(1_024, 30, 1, DEFAULTS).expect("fits");
        assert!(fit.lowered);
        assert_eq!(fit.spare, 128);
        assert_eq!(fit.available, 1_024 - 30 - 128);
        assert_eq!(fit.caps, Caps { dns_tcp_per_listener: 578, control: 288 });
    }

    #[test]
    fn every_combination_stays_under_the_limit() {
        for limit in [0, 64, 100, 130, 256, 1_024, 4_096, 65_536, u64::MAX] {
            for in_use in [0, 10, 100, 1_000] {
                for listeners in 1..=4 {
                    for wanted in
                        [DEFAULTS, Caps { dns_tcp_per_listener: 1, control: 1 }, Caps { dns_tcp_per_listener: 1, control: 10_000 }]
                    {
                        match fit(limit, in_use, listeners, wanted) {
                            Ok(fit) => {
                                let used = fit.caps.dns_tcp_per_listener as u128 * listeners as u128 + fit.caps.control as u128;
                                assert!(used <= u128::from(fit.available), "{limit} {in_use} {listeners} {wanted:?}: {fit:?}");
                                assert!(fit.caps.dns_tcp_per_listener >= 1 && fit.caps.control >= 1);
                                assert!(fit.caps.dns_tcp_per_listener <= wanted.dns_tcp_per_listener);
                                assert!(fit.caps.control <= wanted.control);
                                assert_eq!(fit.lowered, fit.caps != wanted);
                            }
                            Err(err) => assert!(err.available < listeners as u64 + 1, "{err}"),
                        }
                    }
                }
            }
        }
    }
}
