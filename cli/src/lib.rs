//! dnsplan's operator CLI and the one-process stack.
//!
//! `args` is the command line; `up` runs the whole stack on one embedded store; `commands`
//! are the operator commands over the control API; `workflow` the rollback and verify logic
//! they run, as library functions over any store; `plan_file` plans as TOML files (`plans show
//! --output toml`, `plans publish`); `demo` the demo backends; `output` the
//! tables, diffs and JSON; `zone_key` a zone's DNSSEC key (`zone key new`, `zone ds`), made and
//! shown without a control API.

pub mod args;
pub mod commands;
pub mod credential;
pub mod demo;
pub mod output;
pub mod plan_file;
pub mod up;
pub mod workflow;
pub mod zone_key;
