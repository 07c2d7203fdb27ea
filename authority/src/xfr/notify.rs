//! NOTIFY (RFC 1996) to the secondaries that asked for it (`notify` in
//! `[[dns.transfer.secondaries]]`), after every change of the served serial, and what each
//! secondary is known to serve.
//!
//! One task per secondary waits for the served serial to move (`Serving::served_serial`, sent
//! by the follower after each swap), lets a burst of swaps settle for `COALESCE`, then sends
//! one NOTIFY for the serial served then, signed with the secondary's key when it has one,
//! and waits `NOTIFY_TIMEOUT` for the acknowledgement. Unacknowledged, it tries again after a
//! backoff that doubles up to `RETRY_MAX`, for as long as it takes, always for the serial
//! served at the time (a newer change replaces the one being retried). Once acknowledged, it
//! asks the secondary's SOA (signed) until the secondary serves that serial or
//! `CONVERGE_WATCH` passes, so `/v1/status` says which serial each secondary serves and
//! whether it is behind. Once it serves ours, and every `secondary_check::CHECK_INTERVAL`
//! while nothing changes, its whole zone is read back and compared with ours
//! (`secondary_check`): a secondary is current only when that found it equal at the serial
//! served here, not on its serial alone. No NOTIFY is sent for the serial served at start: a secondary asks
//! on its own refresh schedule, and a restart changes nothing it holds.
//!
//! Answering transfers is `transfer`'s business; a secondary's reaction to a NOTIFY is its own.

use crate::serving::policy::NotifyTarget;
use crate::serving::{SecondaryStatus, Serving, Statuses};
use crate::xfr::secondary_check::{self, Found};
use crate::zone::serial::serial_newer;
use dnsplan_common::tsig;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;

/// How long one NOTIFY or SOA query waits for its answer. Secondaries answer a NOTIFY at once
/// (they transfer afterwards); one that takes a second is busy or gone, and is asked again.
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest wait between two tries for one secondary: RFC 1996 §3.6 leaves the schedule to the
/// primary; a minute keeps a dead secondary cheap and a recovered one current soon.
pub const RETRY_MAX: Duration = Duration::from_secs(60);
/// Swaps this close together go out as one NOTIFY. The follower already merges what changed
/// during a merge; this catches swaps a few milliseconds apart under a burst of applies.
pub const COALESCE: Duration = Duration::from_millis(20);
/// How long after an acknowledgement the secondary's SOA is watched for the new serial, and
/// how often it is asked meanwhile.
pub const CONVERGE_WATCH: Duration = Duration::from_secs(10);
const CONVERGE_POLL: Duration = Duration::from_millis(100);
/// Largest answer read: a UDP datagram.
const DATAGRAM_BYTES_MAX: usize = 65_535;

/// Starts one task per secondary of `serving.transfer` with a `notify` address, on `tasks`,
/// and lists them in `serving.secondaries`.
pub fn spawn(tasks: &mut tokio::task::JoinSet<()>, serving: &Arc<Serving>) {
    let targets = serving.transfer.notify_targets().to_vec();
    {
        let mut statuses = serving.secondaries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *statuses = targets
            .iter()
            .map(|t| SecondaryStatus {
                address: t.addr,
                notified_serial: None,
                serial: None,
                behind: true,
                last_error: None,
                content_equal_serial: None,
                content_differs: None,
                content_error: None,
            })
            .collect();
    }
    for (index, target) in targets.into_iter().enumerate() {
        tasks.spawn(notify_loop(index, target, serving.clone(), serving.secondaries.clone()));
    }
}

fn update(statuses: &Statuses, index: usize, change: impl FnOnce(&mut SecondaryStatus)) {
    // A poisoned lock means a task panicked mid-update; the status is still worth showing.
    let mut all = statuses.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(status) = all.get_mut(index) {
        change(status);
    }
}

/// Most NOTIFYs sent for one change of a static zone (`spawn_static`), the wait doubling from
/// `NOTIFY_TIMEOUT`: about a minute in all.
pub const STATIC_ATTEMPTS: u32 = 6;

/// NOTIFYs each secondary with a `notify` address of a static zone just added or replaced
/// (`serving::zones`) until it acknowledges, at most `STATIC_ATTEMPTS` times; one WARN line
/// when none is acknowledged (the secondary then finds the change at its SOA refresh). Static
/// zones change only this way, so no task waits on them between changes.
pub fn spawn_static(serving: Arc<Serving>) {
    for target in serving.transfer.notify_targets().to_vec() {
        let origin = serving.zone.origin.clone();
        let serial = serving.snapshot.load().serial;
        tokio::spawn(async move {
            let mut backoff = NOTIFY_TIMEOUT;
            let mut last = String::new();
            for _ in 0..STATIC_ATTEMPTS {
                match notify(&target, &origin).await {
                    Ok(()) => {
                        tracing::debug!(secondary = %target.addr, zone = %origin, serial, "NOTIFY acknowledged");
                        return;
                    }
                    Err(err) => last = err,
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
            tracing::warn!(secondary = %target.addr, zone = %origin, serial, error = %last, "NOTIFY of a static zone not acknowledged; the secondary finds the change at its SOA refresh");
        });
    }
}

async fn notify_loop(index: usize, target: NotifyTarget, serving: Arc<Serving>, statuses: Statuses) {
    let origin = serving.zone.origin.clone();
    let mut changes = serving.served_serial.subscribe();
    let mut acked = Some(*changes.borrow_and_update()); // nothing to say about the start
    let mut backoff = NOTIFY_TIMEOUT;
    let mut warned = false;
    // What it holds from before this start is read back after `FIRST_CHECK_AFTER`, unless a
    // change comes first (its own check then says it).
    let mut checks = Pacing::default();
    loop {
        let serial = serving.snapshot.load().serial;
        if acked == Some(serial) {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return; // the serving state is gone: shutting down
                    }
                    tokio::time::sleep(COALESCE).await;
                    changes.borrow_and_update();
                }
                // A check put off, or nothing changed for a while: is its zone still ours?
                () = tokio::time::sleep_until(checks.next) => {
                    if let Some(reached) = watch_serial(index, &target, &origin, &serving, &statuses).await {
                        checks.run(index, &target, &serving, &statuses, reached).await;
                    } else {
                        checks.next = tokio::time::Instant::now() + secondary_check::CHECK_INTERVAL;
                    }
                }
            }
            continue;
        }
        match notify(&target, &origin).await {
            Ok(()) => {
                acked = Some(serial);
                backoff = NOTIFY_TIMEOUT;
                warned = false;
                update(&statuses, index, |s| {
                    s.notified_serial = Some(serial);
                    s.last_error = None;
                });
                tracing::debug!(secondary = %target.addr, serial, "NOTIFY acknowledged");
                if let Some(reached) = watch_serial(index, &target, &origin, &serving, &statuses).await {
                    checks.run_when_due(index, &target, &serving, &statuses, reached).await;
                }
            }
            Err(err) => {
                if !warned {
                    tracing::warn!(secondary = %target.addr, serial, error = %err, "NOTIFY not acknowledged; trying again until it is");
                    warned = true;
                }
                update(&statuses, index, |s| s.last_error = Some(err));
                serving.metrics.observe_notify_failed();
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    changed = changes.changed() => if changed.is_err() { return },
                }
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// When a secondary's zone is read back: after each change it converged on, but no sooner than
/// `CHECK_PACING` times the last check's duration after it ended (a check of a large zone is
/// a whole AXFR: under a stream of changes it gets at most about a tenth of the time), and
/// every `CHECK_INTERVAL` while nothing changes.
struct Pacing {
    /// When the next check is due while nothing changes.
    next: tokio::time::Instant,
    /// The earliest a check may start after a change.
    earliest: tokio::time::Instant,
}

/// A check starts no sooner than this many times the last one's duration after it ended.
const CHECK_PACING: u32 = 10;

/// When the first check after a start runs if no change comes first. Not at once: the
/// changes that follow a start would meet it, and NSD applies a transfer it received while it
/// sends an AXFR up to a second late (its reload waits), which delays what secondaries serve.
const FIRST_CHECK_AFTER: Duration = Duration::from_secs(10);

impl Default for Pacing {
    fn default() -> Pacing {
        let now = tokio::time::Instant::now();
        Pacing { next: now + FIRST_CHECK_AFTER, earliest: now }
    }
}

impl Pacing {
    async fn run(&mut self, index: usize, target: &NotifyTarget, serving: &Serving, statuses: &Statuses, serial: u32) {
        let started = tokio::time::Instant::now();
        check_content(index, target, serving, statuses, serial).await;
        let ended = tokio::time::Instant::now();
        self.earliest = ended + (ended - started) * CHECK_PACING;
        self.next = ended + secondary_check::CHECK_INTERVAL;
    }

    /// Checks now if the pacing allows it, else puts the check off until it does.
    async fn run_when_due(&mut self, index: usize, target: &NotifyTarget, serving: &Serving, statuses: &Statuses, serial: u32) {
        if tokio::time::Instant::now() >= self.earliest {
            self.run(index, target, serving, statuses, serial).await;
        } else {
            self.next = self.earliest;
        }
    }
}

/// Reads the secondary's zone back and records whether it is ours at `serial`
/// (`secondary_check`). A check of a serial no longer served says nothing: it is not started,
/// or given up as soon as the served serial moves (the NOTIFY of the new one must not wait).
async fn check_content(index: usize, target: &NotifyTarget, serving: &Serving, statuses: &Statuses, serial: u32) {
    let snapshot = serving.snapshot.load_full();
    if snapshot.serial != serial {
        return;
    }
    let mut served = serving.served_serial.subscribe();
    let moved = async {
        while served.changed().await.is_ok() {
            if *served.borrow_and_update() != serial {
                return;
            }
        }
    };
    let found = tokio::select! {
        found = secondary_check::check(target, snapshot) => found,
        () = moved => return,
    };
    match found {
        Ok(Found::Equal { serial, .. }) => update(statuses, index, |s| {
            s.content_equal_serial = Some(serial);
            s.content_differs = None;
            s.content_error = None;
        }),
        Ok(Found::Differs { serial, missing, extra, shown }) => {
            let what = format!("at serial {serial}: {missing} of our records missing, {extra} not ours, e.g. {}", shown.join(" | "));
            tracing::warn!(secondary = %target.addr, serial, "a secondary serves our serial with other records: {what}");
            update(statuses, index, |s| {
                s.content_equal_serial = None;
                s.content_differs = Some(what);
                s.content_error = None;
            });
        }
        Err(err) => {
            tracing::debug!(secondary = %target.addr, error = %err, "the secondary's zone could not be read back");
            update(statuses, index, |s| s.content_error = Some(err));
        }
    }
}

/// Asks the secondary's SOA until it serves the serial served here (`Some` of it), the served
/// serial moves on (the caller notifies the new one), or `CONVERGE_WATCH` passes.
async fn watch_serial(index: usize, target: &NotifyTarget, origin: &Name, serving: &Serving, statuses: &Statuses) -> Option<u32> {
    let deadline = tokio::time::Instant::now() + CONVERGE_WATCH;
    let ours = serving.snapshot.load().serial;
    loop {
        let mut query = Message::query();
        query.add_query(Query::query(origin.clone(), RecordType::SOA));
        match exchange(target, query).await {
            Ok(answer) => {
                let theirs = answer.answers.iter().find_map(|r| match &r.data {
                    RData::SOA(soa) => Some(soa.serial),
                    _ => None,
                });
                let behind = theirs.is_none_or(|t| serial_newer(ours, t));
                // It answered: an earlier failure (a SERVFAIL while its first copy of the zone
                // was still loading) no longer says where it stands.
                update(statuses, index, |s| {
                    s.serial = theirs;
                    s.behind = behind;
                    s.last_error = None;
                });
                if !behind {
                    return (theirs == Some(ours)).then_some(ours);
                }
            }
            Err(err) => update(statuses, index, |s| s.last_error = Some(err)),
        }
        if tokio::time::Instant::now() >= deadline || serving.snapshot.load().serial != ours {
            return None;
        }
        tokio::time::sleep(CONVERGE_POLL).await;
    }
}

/// One NOTIFY for the zone, acknowledged. (No SOA in the answer section: RFC 1996 §3.7 makes
/// it optional, and secondaries ask the SOA themselves.)
async fn notify(target: &NotifyTarget, origin: &Name) -> Result<(), String> {
    let mut message = Message::new(rand::random(), MessageType::Query, OpCode::Notify);
    message.metadata.authoritative = true;
    message.add_query(Query::query(origin.clone(), RecordType::SOA));
    let answer = exchange(target, message).await?;
    if answer.metadata.op_code != OpCode::Notify {
        return Err(format!("the answer's opcode is {:?}, not NOTIFY", answer.metadata.op_code));
    }
    Ok(())
}

/// Sends `message` (signed with the target's key, if any) over UDP and returns the answer
/// that matches it, verified; NOERROR only.
async fn exchange(target: &NotifyTarget, mut message: Message) -> Result<Message, String> {
    let mut verifier = match &target.key {
        Some(key) => Some(key.sign_query(&mut message, tsig::now_unix_secs()).map_err(|e| e.to_string())?),
        None => None,
    };
    let bytes = message.to_vec().map_err(|e| format!("encoding: {e}"))?;
    let local: IpAddr = if target.addr.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let socket = UdpSocket::bind((local, 0)).await.map_err(|e| format!("binding a UDP socket: {e}"))?;
    socket.send_to(&bytes, target.addr).await.map_err(|e| format!("sending: {e}"))?;
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    let deadline = tokio::time::Instant::now() + NOTIFY_TIMEOUT;
    loop {
        let received = tokio::time::timeout_at(deadline, socket.recv_from(&mut buf)).await;
        let (len, from) = match received {
            Err(_) => return Err(format!("no answer within {NOTIFY_TIMEOUT:?}")),
            Ok(Err(e)) => return Err(format!("receiving: {e}")),
            Ok(Ok(got)) => got,
        };
        let answer = &buf[..len];
        // Only the target's answer to this message: same id, a response.
        if from != target.addr || answer.len() < 12 || answer[0..2] != message.metadata.id.to_be_bytes() || answer[2] & 0x80 == 0 {
            continue;
        }
        let decoded = match verifier.as_mut() {
            Some(v) => v.verify(answer).map_err(|e| e.to_string())?,
            None => Message::from_vec(answer).map_err(|e| format!("the answer does not decode: {e}"))?,
        };
        if decoded.metadata.response_code != ResponseCode::NoError {
            return Err(format!("answered {}", decoded.metadata.response_code));
        }
        return Ok(decoded);
    }
}
