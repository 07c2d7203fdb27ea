//! What signed plans cost: a plan of N endpoints (default 1,000,000, two targets each) encoded
//! and decoded as every store and follower does (the baseline), signed as a planner signs it,
//! and verified as enactors and authorities with a keyring verify it. Medians of a few runs,
//! printed as milliseconds and as ratios to the baseline from the same run, because only
//! ratios travel between machines. Run it through `bench/signing.sh`.
//!
//! Usage: sign-bench [ENDPOINTS]

use dnsplan_common::codec::{decode_plan, encode_plan};
use dnsplan_common::signing::{Keyring, KeyringConfig, SigningKey, TrustedKeyConfig, public_key_text};
use dnsplan_tests::fixtures::{name, plan, planner};
use std::time::Instant;

const RUNS: usize = 5;

/// The median time of `RUNS` runs of `f`, in milliseconds.
fn median_ms<T>(mut f: impl FnMut() -> T) -> f64 {
    let mut times: Vec<f64> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed().as_secs_f64() * 1_000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[RUNS / 2]
}

fn main() -> anyhow::Result<()> {
    let endpoints: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().map_err(|e| anyhow::anyhow!("ENDPOINTS {n:?}: {e}"))?,
        None => 1_000_000,
    };
    let names: Vec<_> = (0..endpoints).map(|i| name(&format!("e{i}"))).collect();
    let unsigned = plan(1, &names, planner());
    let (key, _) = SigningKey::generate().map_err(anyhow::Error::msg)?;
    let keyring = Keyring::from_config(&KeyringConfig {
        key: vec![TrustedKeyConfig {
            name: "bench".into(),
            public_key: public_key_text(&key.public_key()),
            zones: vec!["*".into()],
            authors: vec!["*".into()],
        }],
    })
    .map_err(anyhow::Error::msg)?
    .ok_or_else(|| anyhow::anyhow!("no keyring"))?;
    let signed = key.sign(unsigned.clone());
    let envelope = encode_plan(&signed);
    anyhow::ensure!(keyring.verify(&decode_plan(&envelope)?).is_ok(), "the signed plan does not verify");

    let encode = median_ms(|| encode_plan(&unsigned));
    let decode = median_ms(|| decode_plan(&envelope));
    let sign = median_ms(|| key.sign(unsigned.clone()));
    let clone = median_ms(|| unsigned.clone());
    let verify = median_ms(|| keyring.verify(&signed).is_ok());
    println!("plan of {endpoints} endpoints, {} bytes signed ({RUNS} runs, medians)", envelope.len());
    println!("  encode (baseline)     {encode:>9.1} ms");
    println!("  decode (baseline)     {decode:>9.1} ms");
    println!("  sign                  {:>9.1} ms  {:.2}x encode", sign - clone, (sign - clone) / encode);
    println!("  verify                {verify:>9.1} ms  {:.2}x encode, {:.2}x decode", verify / encode, verify / decode);
    Ok(())
}
