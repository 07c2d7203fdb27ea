//! The `dnsplan-enactor` command line, in the library so that deployment files can be checked
//! against the real flags.

use clap::Parser;
use dnsplan_common::ZoneId;
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "dnsplan's enactor: applies the newest plan through the store's generation fence")]
pub struct Args {
    /// Path to enactor.toml.
    #[arg(long, short)]
    pub config: PathBuf,
    /// This enactor's id (overrides `id` in the config).
    #[arg(long)]
    pub id: Option<String>,
    /// The availability zone it runs in (overrides `zone` in the config).
    #[arg(long, value_parser = parse_zone)]
    pub zone: Option<ZoneId>,
    #[command(flatten)]
    pub log: dnsplan_common::daemon::LogArgs,
}

fn parse_zone(text: &str) -> Result<ZoneId, String> {
    ZoneId::parse(text).map_err(|e| e.to_string())
}
