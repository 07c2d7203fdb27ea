//! Accepting TCP connections without spinning, for every TCP listener of the daemons: the
//! authority's DNS TCP listener and every HTTP server (`http_server`).
//!
//! An accept that fails for want of a resource (EMFILE, ENFILE, ENOBUFS, ENOMEM) fails again
//! at once until something is closed, so a loop that simply tries again burns a core and
//! writes a log line per try. `Acceptor` waits instead: `BACKOFF_MIN` after the first
//! failure, doubling up to `BACKOFF_MAX`, back to the start after a success. An error about
//! one connection (the peer reset or aborted it before we took it) is no such condition and
//! is retried at once: otherwise a client could slow every accept by resetting its own.
//! Every failure is counted in a metric; `LogLimiter` lets at most one WARN line through per
//! `LOG_INTERVAL` and says how many it left out. Deciding what to do with a connection is the
//! caller's.

use prometheus_client::metrics::counter::Counter;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// First wait after a failed accept: long enough for the loop to give up the CPU, short enough
/// that a connection closed meanwhile frees its slot for the next client at once.
pub const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest wait between accepts while they keep failing: a client waits at most this long
/// after descriptors are free again.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one WARN line per listener and kind of event in this time; the rest are counted.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Exponential backoff between failed attempts, `BACKOFF_MIN` doubling to `BACKOFF_MAX`.
#[derive(Debug)]
pub struct Backoff {
    // Invariant: BACKOFF_MIN <= next <= BACKOFF_MAX.
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: BACKOFF_MIN }
    }
}

impl Backoff {
    /// The wait after one more failure.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        wait
    }

    pub fn succeeded(&mut self) {
        self.next = BACKOFF_MIN;
    }
}

/// Lets one event a `LOG_INTERVAL` through to the log and counts the others.
#[derive(Debug, Default)]
pub struct LogLimiter {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    /// `Some(n)` when this event is to be logged, `n` being how many were left out since the
    /// last one logged; `None` when it is to be left out.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now.saturating_duration_since(last) < LOG_INTERVAL) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Whether an accept error concerns only the connection being accepted, which is gone: the
/// next accept may well succeed at once.
pub fn is_connection_error(err: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(err.kind(), ConnectionAborted | ConnectionReset | ConnectionRefused)
}

/// Something that accepts connections; `TcpListener`, or a test's stand-in.
pub trait Accept {
    type Conn;
    fn accept(&mut self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send;
}

impl Accept for TcpListener {
    type Conn = (TcpStream, SocketAddr);
    async fn accept(&mut self) -> std::io::Result<(TcpStream, SocketAddr)> {
        TcpListener::accept(self).await
    }
}

/// A listener whose `accept` never fails: it waits out failures (see the module docs).
pub struct Acceptor<L> {
    listener: L,
    /// Names the listener in log lines, e.g. "DNS TCP".
    what: &'static str,
    errors: Counter,
    backoff: Backoff,
    log: LogLimiter,
}

impl<L: Accept> Acceptor<L> {
    /// `errors` counts every failed accept.
    pub fn new(listener: L, what: &'static str, errors: Counter) -> Acceptor<L> {
        Acceptor { listener, what, errors, backoff: Backoff::default(), log: LogLimiter::default() }
    }

    /// The next connection, however many accepts fail first.
    pub async fn accept(&mut self) -> L::Conn {
        loop {
            let err = match self.listener.accept().await {
                Ok(conn) => {
                    self.backoff.succeeded();
                    return conn;
                }
                Err(err) => err,
            };
            self.errors.inc();
            let wait = if is_connection_error(&err) { Duration::ZERO } else { self.backoff.failed() };
            if let Some(suppressed) = self.log.allow(Instant::now()) {
                tracing::warn!(
                    listener = self.what,
                    %err,
                    retry_in_ms = wait.as_millis() as u64,
                    suppressed,
                    "accepting a connection failed; waiting before the next accept (suppressed: like lines left out since the last one)"
                );
            }
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn backoff_doubles_to_its_maximum_and_starts_again_after_a_success() {
        let mut backoff = Backoff::default();
        let waits: Vec<u64> = (0..9).map(|_| backoff.failed().as_millis() as u64).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1_000, 1_000]);
        backoff.succeeded();
        assert_eq!(backoff.failed(), BACKOFF_MIN);
    }

    #[test]
    fn log_limiter_lets_one_line_a_second_through_and_counts_the_rest() {
        let mut log = LogLimiter::default();
        let start = Instant::now();
        assert_eq!(log.allow(start), Some(0));
        for ms in 1..1_000 {
            assert_eq!(log.allow(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(log.allow(start + LOG_INTERVAL), Some(999));
        assert_eq!(log.allow(start + LOG_INTERVAL + Duration::from_millis(1)), None);
    }

    /// Fails every accept with EMFILE, as a listener does while the process is out of
    /// descriptors, and records when it was asked. After `CALLS_MAX` calls it never answers,
    /// so a loop without backoff ends (with all its calls at one instant) instead of spinning.
    struct OutOfDescriptors {
        calls: Arc<AtomicU64>,
        kind: std::io::Error,
    }

    const CALLS_MAX: u64 = 10_000;

    impl Accept for OutOfDescriptors {
        type Conn = ();
        async fn accept(&mut self) -> std::io::Result<()> {
            if self.calls.fetch_add(1, Ordering::Relaxed) >= CALLS_MAX {
                std::future::pending::<()>().await;
            }
            Err(std::io::Error::new(self.kind.kind(), self.kind.to_string()))
        }
    }

    /// Accept failures for lack of descriptors are retried at most about once a second
    /// after the first few, and every one is counted. Without the backoff (a plain `continue`,
    /// as the DNS listener had) all `CALLS_MAX` calls happen in the first instant: checked
    /// once by removing the sleep.
    #[tokio::test(start_paused = true)]
    async fn failing_accepts_back_off_and_are_counted() {
        let calls = Arc::new(AtomicU64::new(0));
        let errors = Counter::default();
        let emfile = std::io::Error::from_raw_os_error(24);
        let mut acceptor = Acceptor::new(OutOfDescriptors { calls: calls.clone(), kind: emfile }, "test", errors.clone());
        let window = Duration::from_secs(10);
        assert!(tokio::time::timeout(window, acceptor.accept()).await.is_err(), "an accept succeeded");
        let n = calls.load(Ordering::Relaxed);
        // 10 + 20 + ... + 640 ms is 1.27 s in 7 tries, then one a second: 16 in 10 s.
        assert!((15..=17).contains(&n), "{n} accepts in {window:?}");
        assert_eq!(errors.get(), n);
    }

    /// A peer that resets its connection before we take it does not slow the next accept.
    #[tokio::test(start_paused = true)]
    async fn connection_errors_are_retried_at_once() {
        let calls = Arc::new(AtomicU64::new(0));
        let errors = Counter::default();
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionAborted);
        let mut acceptor = Acceptor::new(OutOfDescriptors { calls: calls.clone(), kind: reset }, "test", errors.clone());
        let start = Instant::now();
        assert!(tokio::time::timeout(Duration::from_millis(1), acceptor.accept()).await.is_err());
        assert_eq!(calls.load(Ordering::Relaxed), CALLS_MAX + 1);
        assert_eq!(errors.get(), CALLS_MAX);
        assert!(start.elapsed() <= Duration::from_millis(1));
    }
}
