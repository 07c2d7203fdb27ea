//! The etcd scenarios, one function each: the storm beside a leader kill, a member down, a crash
//! during an outage, a partition, and the 2025 race on a naive store.

use super::*;

/// The storm: plans as fast as etcd acknowledges them (a short backoff after a refusal), until
/// `stop` or `PLANS_MAX`.
pub(super) async fn storm_loop(mut storm: Storm, seed: u64, stop: channel::Receiver<bool>) -> anyhow::Result<Storm> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5707);
    while !*stop.borrow() && (storm.attempted.len() as u64) < PLANS_MAX {
        let pause = match storm.publish_next().await? {
            Some(_) => Duration::from_millis(rng.random_range(0..10)),
            None => Duration::from_millis(20),
        };
        // Pace (not synchronise): leaves the two cores to the daemons now and then.
        tokio::time::sleep(pause).await;
    }
    Ok(storm)
}

/// `etcd-leader-kill`: see the module documentation.
pub async fn run_leader_kill(bins: Bins, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let report = Report { scenario: "etcd-leader-kill".into(), seed, ..Report::default() };
    let names = names();
    let (mut stack, storm) = EtcdStack::start(&bins, &names, false).await?;
    let judges = Judges::start(&stack, &storm, &names).await?;
    let acked = storm.acked_max.clone();
    let (storm_stop, storm_stopped) = channel::channel(false);
    let storm_task = tokio::spawn(storm_loop(storm, seed, storm_stopped));

    let mut report = report;
    let end = Instant::now() + duration;
    let mut kills = 0;
    let mut result = Ok(());
    while (Instant::now() < end || kills < KILLS_MIN) && kills < FAULTS_MAX {
        let step = async {
            // The storm is on: a few plans acknowledged since the last fault.
            until_acked(&acked, acked.load(Ordering::SeqCst) + rng.random_range(3..=10), "before the kill").await?;
            let (i, id) = leader(&stack.cluster).await?;
            stack.cluster.kill(i)?;
            report.fault("etcd leader SIGKILL");
            let (_, new) = leader(&stack.cluster).await?;
            anyhow::ensure!(new != id, "the killed leader {id} is still named leader");
            report.fault("new etcd leader elected");
            // Writes go on with two members of three.
            until_acked(&acked, acked.load(Ordering::SeqCst) + 1, "with the leader killed").await?;
            stack.cluster.restart_killed().await?;
            report.fault("etcd member restarted");
            anyhow::Ok(())
        };
        kills += 1;
        if let Err(e) = step.await {
            result = Err(e);
            break;
        }
    }
    let _ = storm_stop.send(true);
    let storm = storm_task.await??;
    if let Err(e) = result {
        report.violations.push(format!("the storm stalled: {e:#}"));
    }
    finish(report, stack, storm, judges, &names, started).await
}

/// Control API calls made on each authority per fault, while the member is down.
pub(super) const CONTROL_CALLS_PER_FAULT: usize = 40;

/// `etcd-member-down`: see the module documentation.
pub async fn run_member_down(bins: Bins, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut report = Report { scenario: "etcd-member-down".into(), seed, ..Report::default() };
    let names = names();
    let (mut stack, mut storm) = EtcdStack::start(&bins, &names, false).await?;
    let judges = Judges::start(&stack, &storm, &names).await?;
    let controls =
        stack.authorities.iter().map(|a| Ok((a.who.clone(), RemoteStore::new(&a.control, None)?))).collect::<anyhow::Result<Vec<_>>>()?;
    // How long each member stays down (the fault's length, not a synchronisation).
    let hold = (duration / 4).clamp(Duration::from_millis(500), Duration::from_secs(5));
    let end = Instant::now() + duration;
    let mut faults = 0;
    let mut result = Ok(());
    while (Instant::now() < end || faults < KILLS_MIN) && faults < FAULTS_MAX {
        faults += 1;
        let step = async {
            let (leader_index, _) = leader(&stack.cluster).await?;
            // A follower, chosen by the seed.
            let follower = (leader_index + rng.random_range(1..stack.cluster.members.len())) % stack.cluster.members.len();
            stack.cluster.kill(follower)?;
            report.fault("etcd follower SIGKILL");
            // The first call after the kill is a read, as a daemon's is (the planner and the
            // enactors read before they write): a read on the killed member's connection moves
            // to a live member and marks that one failed. A write already sent on that
            // connection is ambiguous (it may have reached etcd), and is not moved to another
            // member, as etcd's own client does not; the store settles its outcome instead.
            storm
                .store
                .list(Generation::NONE, 1)
                .await
                .map_err(|e| anyhow::anyhow!("a read with etcd member {follower} of 3 down: {e}"))?;
            let down_until = Instant::now() + hold;
            let refused_before = storm.refused;
            let mut published = 0;
            let mut calls = 0;
            while Instant::now() < down_until || published < 3 {
                anyhow::ensure!((storm.attempted.len() as u64) < PLANS_MAX, "the storm ran out of plans");
                // With two members of three up, a publish is acknowledged at the first try.
                match storm.publish_next().await? {
                    Some(_) => published += 1,
                    None => anyhow::bail!("a publish failed with etcd member {follower} of 3 down"),
                }
                for (who, control) in &controls {
                    if calls >= CONTROL_CALLS_PER_FAULT * controls.len() {
                        break;
                    }
                    calls += 2;
                    control.version().await.map_err(|e| anyhow::anyhow!("{who}'s control API: GET /v1/version failed: {e}"))?;
                    control.list(Generation(0), 8).await.map_err(|e| anyhow::anyhow!("{who}'s control API: GET /v1/plans failed: {e}"))?;
                }
                // Pace (not synchronise): leaves the two cores to the daemons now and then.
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..10))).await;
            }
            anyhow::ensure!(storm.refused == refused_before, "{} publishes refused with one member down", storm.refused - refused_before);
            report.fault("calls kept succeeding with a member down");
            // Enactors and both authorities' followers go on too.
            let newest = Generation(storm.acked_max.load(Ordering::SeqCst));
            converge_store(&stack.store, &names, newest).await?;
            for a in &stack.authorities {
                until_serves(a.dns, &stack.store, &names, newest, STEP_WITHIN)
                    .await
                    .map_err(|e| anyhow::anyhow!("{}: {e}", a.described()))?;
            }
            report.fault("authorities served the newest plan with a member down");
            stack.cluster.restart_killed().await?;
            report.fault("etcd member restarted");
            anyhow::Ok(())
        };
        if let Err(e) = step.await {
            result = Err(e);
            break;
        }
    }
    if let Err(e) = result {
        report.violations.push(format!("with one etcd member down: {e:#}"));
    }
    finish(report, stack, storm, judges, &names, started).await
}

/// How long etcd stays down after the authority's restart in `etcd-crash-in-outage` (the
/// fault's length, not a synchronisation).
pub(super) const OUTAGE_AFTER_RESTART: Duration = Duration::from_millis(500);

/// `etcd-crash-in-outage`: see the module documentation.
pub async fn run_crash_in_outage(bins: Bins, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut report = Report { scenario: "etcd-crash-in-outage".into(), seed, ..Report::default() };
    let names = names();
    let (mut stack, storm) = EtcdStack::start(&bins, &names, false).await?;
    let judges = Judges::start(&stack, &storm, &names).await?;
    let acked = storm.acked_max.clone();
    let (storm_stop, storm_stopped) = channel::channel(false);
    let storm_task = tokio::spawn(storm_loop(storm, seed, storm_stopped));
    let end = Instant::now() + duration;
    let mut crashes = 0;
    let mut result = Ok(());
    while (Instant::now() < end || crashes < KILLS_MIN) && crashes < FAULTS_MAX {
        crashes += 1;
        let step = async {
            until_acked(&acked, acked.load(Ordering::SeqCst) + rng.random_range(3..=10), "before the outage").await?;
            let a = &stack.authorities[0];
            let (_, before) = served(a.dns, &names).await?;
            let before = before.ok_or_else(|| anyhow::anyhow!("{} answered no SOA serial before the outage", a.who))?;
            for member in 0..stack.cluster.members.len() {
                stack.cluster.kill(member)?;
            }
            report.fault("every etcd member SIGKILL");
            // When the crash lands in the outage, chosen by the seed (the fault's timing).
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..=50))).await;
            stack.restart_authority(0)?;
            report.fault("authority SIGKILL+restart in the outage");
            let a = &stack.authorities[0];
            let (addresses, after) = served(a.dns, &names).await?;
            let after = after.ok_or_else(|| anyhow::anyhow!("{} answered no SOA serial after its restart", a.who))?;
            anyhow::ensure!(addresses.iter().all(|a| !a.is_empty()), "{} answered a name with no address after its restart", a.who);
            // RFC 1982: `after` is at or past `before`.
            anyhow::ensure!(
                after.wrapping_sub(before) < 1 << 31,
                "{} restarted in the outage older than it answered before: serial {after} after, {before} before",
                a.who
            );
            report.fault("restarted in the outage, not older");
            tokio::time::sleep(OUTAGE_AFTER_RESTART).await;
            stack.cluster.restart_killed().await?;
            report.fault("etcd restarted");
            // The storm goes on: each authority must reach the store's state as read now.
            for a in &stack.authorities {
                until_caught_up(a.dns, &stack.store, &names, CATCH_UP_WITHIN)
                    .await
                    .map_err(|e| anyhow::anyhow!("{}: {e}", a.described()))?;
            }
            report.fault("authorities caught up after the outage");
            anyhow::Ok(())
        };
        if let Err(e) = step.await {
            result = Err(e);
            break;
        }
    }
    let _ = storm_stop.send(true);
    let storm = storm_task.await??;
    if let Err(e) = result {
        report.violations.push(format!("a crash in an etcd outage: {e:#}"));
        // A step that failed in the outage left etcd down; the end needs it.
        if let Err(e) = stack.cluster.restart_killed().await {
            report.violations.push(format!("etcd did not come back: {e:#}"));
        }
    }
    finish(report, stack, storm, judges, &names, started).await
}

/// `etcd-partition`: see the module documentation.
pub async fn run_partition(bins: Bins, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut report = Report { scenario: "etcd-partition".into(), seed, ..Report::default() };
    let names = names();
    let (stack, mut storm) = EtcdStack::start(&bins, &names, true).await?;
    let judges = Judges::start(&stack, &storm, &names).await?;
    // How long each fault lasts (its length, not a synchronisation).
    let hold = (duration / 8).clamp(Duration::from_millis(300), Duration::from_secs(3));
    let b = &stack.authorities[1];
    let mut current = Generation(storm.acked_max.load(Ordering::SeqCst));
    let end = Instant::now() + duration;
    let mut faults = 0;
    // At least one of each fault, then until the duration is over.
    while (Instant::now() < end || faults < 4) && faults < FAULTS_MAX {
        let mode = match faults % 4 {
            0 => Mode::Partition,
            1 => Mode::OneWay,
            2 => Mode::Reset,
            _ => Mode::Delay(Duration::from_millis(rng.random_range(10..300))),
        };
        faults += 1;
        // b serves the store's state, then is cut off.
        let before = until_serves(b.dns, &stack.store, &names, current, CATCH_UP_WITHIN).await?;
        stack.set_proxies(mode);
        report.fault(match mode {
            Mode::Partition => "partition authority b from etcd",
            Mode::OneWay => "one-way partition of authority b (etcd's answers lost)",
            Mode::Reset => "reset authority b's etcd connections",
            _ => "delay authority b's etcd connections",
        });
        // etcd moves on without b.
        let had = current;
        for _ in 0..rng.random_range(1..=3) {
            current = storm.publish_one(STEP_WITHIN).await?;
        }
        converge_store(&stack.store, &names, current).await?;
        tokio::time::sleep(hold).await;
        if !matches!(mode, Mode::Delay(_)) {
            // Cut off, b serves its last state: the same serial, the same addresses.
            match served(b.dns, &names).await {
                Ok((addresses, serial)) if serial == Some(before) && addresses.iter().all(|a| *a == addresses_of(had)) => {
                    report.fault("authority b kept its last state while etcd moved on");
                }
                Ok((addresses, serial)) => report.violations.push(format!(
                    "authority b, cut off from etcd ({mode:?}), served serial {serial:?} and {addresses:?}, not its last state \
                     (serial {before}, plan {had}): the fault did not cut it off, or it lost its state"
                )),
                Err(e) => report.violations.push(format!("authority b, cut off from etcd ({mode:?}), got no answer: {e}")),
            }
        }
        stack.set_proxies(Mode::Pass);
        report.fault("heal");
        match until_serves(b.dns, &stack.store, &names, current, CATCH_UP_WITHIN).await {
            Ok(_) => report.fault(&format!("authority b caught up after {}", label(mode))),
            Err(e) => {
                report.violations.push(format!("authority b did not catch up after the heal ({mode:?}): {e}"));
                break;
            }
        }
    }
    finish(report, stack, storm, judges, &names, started).await
}

pub(super) fn label(mode: Mode) -> &'static str {
    match mode {
        Mode::Partition => "partition",
        Mode::OneWay => "one-way",
        Mode::Reset => "reset",
        Mode::Delay(_) => "delay",
        Mode::Pass => "pass",
    }
}

/// `aws-2025-race-etcd`: the 2025 race of [`race`] on a three-member etcd cluster: the fenced
/// enactors on `EtcdStore`, or, with `naive`, the 2025 enactor on [`NaiveEtcdStore`].
pub async fn run_race(naive: Option<Behaviour>) -> anyhow::Result<race::Outcome> {
    let cluster = EtcdCluster::start(3, &[]).await?;
    let store = cluster.store("/race/").await?;
    let outcome = match naive {
        Some(naive) => race::race_with(NaiveEtcdStore::new(store), naive, race::Secondaries::None).await?,
        None => race::race_with(store, Behaviour::Fenced, race::Secondaries::None).await?,
    };
    drop(cluster);
    Ok(outcome)
}
