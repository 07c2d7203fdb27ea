//! The `dnsplan-planner` command line, in the library so that deployment files can be checked
//! against the real flags.

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "dnsplan's planner: health checks, static-stability decisions, fenced publishing")]
pub struct Args {
    /// Path to planner.toml.
    #[arg(long, short)]
    pub config: PathBuf,
    /// This planner's id (overrides `id` in the config); two planners need different ids.
    #[arg(long)]
    pub id: Option<String>,
    #[command(flatten)]
    pub log: dnsplan_common::daemon::LogArgs,
}
