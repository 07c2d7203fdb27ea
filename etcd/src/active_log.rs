//! A store's own log of the writes to the active records, fed by one etcd watch, so that
//! `active_since` learns what switched from memory instead of from etcd.
//!
//! Why not ask etcd each time: a watch from a past revision gets its history only from
//! etcd's unsynced-watcher loop, every 100 ms; a range read filtered by `min_mod_revision`
//! answers at once but makes etcd read every active record of the zone at each call (15-40
//! ms at 10,000 endpoints on a busy machine). A watch opened at the current revision is
//! synced: etcd sends each write as it commits.
//!
//! The log is an optimisation only. It answers for a stretch of revisions only when it holds
//! every write of that stretch: it started before it, dropped none of it (it keeps at most
//! [`WRITES_MAX`]), and the watch has delivered through its end. Otherwise `active_since`
//! asks etcd, as before.

use crate::client::{Client, EventType, WatchOptions};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// Writes kept; a follower further behind than this asks etcd.
pub(crate) const WRITES_MAX: usize = 32_768;

/// What the watch has delivered.
struct Log {
    /// Every write with a revision above `start` is in `writes`.
    start: i64,
    /// Revision, key and value of each write, oldest first.
    writes: VecDeque<(i64, Vec<u8>, Vec<u8>)>,
    /// The watch ended (etcd away, the watch cancelled, a delete seen): the log answers no more.
    broken: bool,
}

pub(crate) struct ActiveLog {
    log: Arc<Mutex<Log>>,
    /// The revision of the last write delivered: every write up to it is in the log.
    through: watch::Receiver<i64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ActiveLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(log: &Mutex<Log>) -> MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ActiveLog {
    /// Watches the keys under `prefix` for every write after revision `after`. Opened at the
    /// current revision (or near it), the watch is synced at once.
    pub(crate) fn start(client: Client, prefix: Vec<u8>, after: i64) -> ActiveLog {
        let log = Arc::new(Mutex::new(Log { start: after, writes: VecDeque::new(), broken: false }));
        let (tx, through) = watch::channel(after);
        let task = tokio::spawn(follow(client, prefix, after, log.clone(), tx));
        ActiveLog { log, through, task }
    }

    /// Whether the log stopped answering: its watch ended, or its task is gone (the runtime
    /// that ran it shut down, which drops the sender).
    pub(crate) fn broken(&self) -> bool {
        lock(&self.log).broken || self.through.has_changed().is_err()
    }

    /// The last value of each key written after revision `from` up to and including `to`,
    /// once the watch has delivered `to` (waiting at most `wait`); `None` when the log does not
    /// hold that whole stretch.
    pub(crate) async fn written(&self, from: i64, to: i64, wait: Duration) -> Option<BTreeMap<Vec<u8>, Vec<u8>>> {
        if lock(&self.log).start > from {
            return None;
        }
        let mut through = self.through.clone();
        match tokio::time::timeout(wait, through.wait_for(|t| *t >= to)).await {
            Ok(Ok(_)) => {}
            _ => return None,
        }
        let log = lock(&self.log);
        if log.broken || log.start > from {
            return None;
        }
        let mut out = BTreeMap::new();
        // Newest last, so a later write of a key replaces an earlier one.
        for (revision, key, value) in &log.writes {
            if *revision > from && *revision <= to {
                out.insert(key.clone(), value.clone());
            }
        }
        Some(out)
    }
}

async fn follow(client: Client, prefix: Vec<u8>, after: i64, log: Arc<Mutex<Log>>, through: watch::Sender<i64>) {
    let broken = |why: &str| {
        tracing::debug!(why, "the log of active writes stopped; active_since reads from etcd");
        lock(&log).broken = true;
    };
    let options = WatchOptions::new().with_prefix().with_start_revision(after + 1);
    let mut stream = match client.watch(prefix, Some(options)).await {
        Ok(stream) => stream,
        Err(err) => return broken(&err.to_string()),
    };
    loop {
        let message = match stream.message().await {
            Ok(Some(message)) => message,
            Ok(None) => return broken("etcd closed the watch"),
            Err(err) => return broken(&err.to_string()),
        };
        if message.canceled() || message.compact_revision() > 0 {
            return broken("etcd cancelled the watch");
        }
        let mut last = None;
        {
            let mut log = lock(&log);
            for event in message.events() {
                let Some(kv) = event.kv() else { continue };
                if event.event_type() == EventType::Delete {
                    // Active records are never deleted; a log that cannot say so stops.
                    drop(log);
                    return broken("an active record was deleted");
                }
                log.writes.push_back((kv.mod_revision(), kv.key().to_vec(), kv.value().to_vec()));
                last = Some(kv.mod_revision());
            }
            while log.writes.len() > WRITES_MAX {
                if let Some((revision, _, _)) = log.writes.pop_front() {
                    log.start = revision;
                }
            }
        }
        // Events come in revision order, and all of one revision in one message.
        if let Some(last) = last {
            through.send_replace(last);
        }
    }
}
