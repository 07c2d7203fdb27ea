//! Kill -9 while writing: a child process publishes and applies in a loop on a `SledStore`
//! and is killed with SIGKILL at arbitrary moments. After every kill the store reopens with
//! every acknowledged publish and apply present, nothing torn, and it accepts newer plans
//! (never wedged).

use dnsplan_common::store::ActiveState;
use dnsplan_common::{Generation, SledStore, Store};
use dnsplan_tests::fixtures::{endpoint_for, name, plan, planner};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const ENDPOINTS: usize = 4;
/// Acknowledgements to read before each kill; uneven so kills land at different points.
const KILL_AFTER_ACKS: [usize; 6] = [1, 23, 57, 101, 149, 211];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut acked: BTreeMap<String, Generation> = BTreeMap::new();
    let mut published = Generation::NONE;
    for (round, kill_after) in KILL_AFTER_ACKS.into_iter().enumerate() {
        let mut child = Command::new(env!("CARGO_BIN_EXE_store-crash-child"))
            .arg(dir.path())
            .arg(ENDPOINTS.to_string())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let mut acks = 0;
        while acks < kill_after {
            let Some(line) = lines.next() else { anyhow::bail!("child exited early in round {round}: {:?}", child.wait()?) };
            let line = line?;
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["published", g] => published = Generation(g.parse()?),
                ["ack", endpoint, g] => {
                    acked.insert(endpoint.to_string(), Generation(g.parse()?));
                    acks += 1;
                }
                _ => anyhow::bail!("unexpected child output {line:?}"),
            }
        }
        child.kill()?; // SIGKILL on Unix
        child.wait()?;

        let store = SledStore::open(dir.path())?;
        let latest = store.latest().await?;
        assert!(latest >= published, "round {round}: latest {latest} lost acknowledged publish {published}");
        let snapshot = store.active_all().await?; // decodes every record: nothing torn
        for (endpoint, g) in &acked {
            let active = snapshot.endpoints.get(&name(endpoint.trim_end_matches(".example.test."))).map(|a| a.generation);
            assert!(active >= Some(*g), "round {round}: {endpoint} is at {active:?} after acknowledged apply of {g}");
        }
        for (n, record) in &snapshot.endpoints {
            assert!(store.plan(record.generation).await.is_ok(), "round {round}: {n} is active at deleted plan {}", record.generation);
            assert!(matches!(&record.state, ActiveState::Serving(e) if !e.targets.is_empty()), "round {round}: {n} is not serving");
        }
        // Never wedged: a newer plan publishes and applies everywhere.
        let next = Generation(latest.0 + 1);
        let names: Vec<_> = (0..ENDPOINTS).map(|i| name(&format!("e{i}"))).collect();
        store.publish(&plan(next.0, &names, planner())).await?;
        for n in &names {
            store.apply(n, next, &endpoint_for(next)).await?;
            acked.insert(n.to_string(), next);
        }
        published = next;
    }
    Ok(())
}
