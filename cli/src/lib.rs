//! dnsplan's operator CLI and the one-process stack.
//!
//! `args` is the command line; `up` runs the whole stack on one embedded store; `commands`
//! are the operator commands over the control API; `workflow` the rollback and verify logic
//! they run, as library functions over any store; `demo` the demo backends; `output` the
//! tables, diffs and JSON.

pub mod args;
pub mod commands;
pub mod demo;
pub mod output;
pub mod up;
pub mod workflow;
