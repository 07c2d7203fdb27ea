//! The process's open-file limit (`RLIMIT_NOFILE`, feature `daemon`).
//!
//! Every daemon calls `raise_to_hard` at start, as NSD and Knot do: the soft limit (often
//! 1,024 from a login shell) is what runs out when many clients connect, and only the hard
//! limit is the administrator's decision. What a daemon then keeps open is its own business:
//! the authority sizes its connection caps from `limit` and `in_use` (see
//! `dnsplan_authority::net::budget`).

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The soft and hard `RLIMIT_NOFILE` of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub soft: u64,
    pub hard: u64,
}

/// The current limit.
pub fn limit() -> std::io::Result<Limit> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    Ok(Limit { soft, hard })
}

/// Raises the soft limit to the hard one and says so in one log line (INFO when raised, WARN
/// when the system refused). Returns the limit in force afterwards, `None` if it cannot be
/// read. A failure leaves the soft limit as it was, which a daemon can live with; call it
/// once at start, after logging is set up.
pub fn raise_to_hard() -> Option<Limit> {
    let before = match limit() {
        Ok(limit) => limit,
        Err(err) => {
            tracing::warn!(%err, "cannot read the open-file limit (RLIMIT_NOFILE); leaving it as it is");
            return None;
        }
    };
    if before.soft >= before.hard {
        return Some(before);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, before.hard, before.hard) {
        Ok(()) => {
            tracing::info!(from = before.soft, to = before.hard, "raised the open-file limit (RLIMIT_NOFILE) to its hard limit");
        }
        Err(err) => {
            tracing::warn!(%err, soft = before.soft, hard = before.hard, "cannot raise the open-file limit (RLIMIT_NOFILE); keeping the soft limit");
        }
    }
    limit().ok()
}

/// Descriptors this process has open now, from `/proc/self/fd` (or `/dev/fd`), or `None`
/// where neither can be listed.
pub fn in_use() -> Option<u64> {
    ["/proc/self/fd", "/dev/fd"].iter().find_map(|dir| {
        // The directory being listed holds one descriptor itself while it is read.
        let count = std::fs::read_dir(dir).ok()?.count() as u64;
        Some(count.saturating_sub(1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_reaches_the_hard_limit_and_counting_sees_new_descriptors() {
        let after = raise_to_hard().expect("the limit can be read");
        assert_eq!(after.soft, after.hard);
        let files: Vec<_> = (0..3).map(|_| std::fs::File::open("/dev/null").expect("open /dev/null")).collect();
        // Other test threads may open or close descriptors meanwhile; ours are there at least.
        let during = in_use().expect("this system lists open descriptors");
        assert!(during >= files.len() as u64, "{during} open");
    }
}
